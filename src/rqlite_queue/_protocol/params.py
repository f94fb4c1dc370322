"""Each operation whose arguments travel through several layers, as one typed value: a publish
(`Message`, with the one parser of `publish_many` items), a schedule (`ScheduleSpec`) and a
round (`RoundSpec`). The queue builds one from its method's arguments; the core checks it and
builds the plan; routers pass it on untouched. A new keyword is a field here and its use in
the core, plus the public method's signature."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from ..errors import InvalidArgument
from ..types import Lease, PublishItem
from . import sql
from .checks import show

T = TypeVar("T")

MAX_PUBLISH = 100_000
"""Most messages in one publish_many."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One message to publish, as given (checked and encoded by `QueueCore.messages`)."""

    group_id: Any
    event: Any
    priority: Any = 0
    dedup_id: Any = None
    delay: Any = None
    not_before: Any = None
    ttl: Any = None

    @classmethod
    def parse(cls, item: PublishItem) -> Message:
        """A `publish_many` item: `(group_id, event)`, `(group_id, event, priority)`, or a
        mapping with the keys of this class's fields (group_id and event required)."""
        if isinstance(item, Mapping):
            unknown = set(item) - ITEM_KEYS
            if unknown or "group_id" not in item or "event" not in item:
                raise InvalidArgument(
                    f"publish item needs group_id and event (and optionally "
                    f"{', '.join(sorted(ITEM_KEYS - {'group_id', 'event'}))}), got keys "
                    f"{show(sorted(map(str, item)))}"
                )
            return cls(**item)
        if isinstance(item, tuple) and len(item) in (2, 3):
            return cls(group_id=item[0], event=item[1], priority=item[2] if len(item) == 3 else 0)
        raise InvalidArgument(
            f"publish item must be (group_id, event[, priority]) or a mapping, got {show(item)}"
        )

    @classmethod
    def parse_many(cls, items: Iterable[PublishItem]) -> list[Message]:
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise InvalidArgument(f"publish_many takes a list of items, got {show(items)}")
        items = list(items)
        if len(items) > MAX_PUBLISH:
            raise InvalidArgument(f"at most {MAX_PUBLISH} messages per publish_many")
        return [at_index(index, cls.parse, item) for index, item in enumerate(items)]


ITEM_KEYS = frozenset(f.name for f in fields(Message))


def at_index(index: int, check: Callable[[Any], T], item: Any) -> T:
    """`check(item)`, its `InvalidArgument` marked with the item's position in its list."""
    try:
        return check(item)
    except InvalidArgument as exc:
        exc.index = index
        raise


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """A periodic publish, as given to `schedule()` (checked by `QueueCore.schedule`)."""

    name: Any
    group_id: Any
    event: Any
    every: Any = None
    cron: Any = None
    priority: Any = 0
    catch_up: Any = False
    start_at: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundSpec:
    """Settlements and a claim in one round trip, as given to `settle_and_claim()` (the
    single calls on a lease are rounds with one settlement; a claim, one with none).
    Checked by `QueueCore.check_round`."""

    worker_id: Any = None
    visibility: Any = 30.0
    n: Any = 0
    min_priority: Any = 0
    ack: Sequence[Lease] = ()
    nack: Sequence[tuple[Lease, float]] = ()
    extend: Sequence[Lease] = ()
    dead: Sequence[tuple[Lease, str]] = ()
    hold_dead: Any = False
    expired: Sequence[Lease] = ()
    """Leases taken on messages whose ttl had passed: dead-lettered with reason `expired`."""


FINISH, GIVE_BACK, EXTEND = "finish", "give_back", "extend"


@dataclass(frozen=True, slots=True)
class Settlement:
    """One settlement of a round, checked: what to do with which lease, and its place among
    the round's settlements (the order leases that no longer held are reported in)."""

    index: int
    lease: Lease
    held: sql.Held
    kind: str
    reason: str | None = None
    """Why it is dead-lettered (a finish that is not an ack)."""
    delay: float = 0.0
    """How long its group is parked (a give back)."""
    repeat: bool = False
    """The lease was named earlier in this round: settled then, reported lost here."""
    expired: bool = False
    """A lease on a message whose ttl passed: dead-lettered as `expired`."""


@dataclass(frozen=True, slots=True)
class CheckedRound:
    """A `RoundSpec` whose every argument was checked: what a router splits between shards
    (`part`) and the core turns into a plan (`QueueCore.round`)."""

    worker_id: str | None
    visibility: float
    n: int
    min_priority: int
    hold_dead: bool
    settlements: tuple[Settlement, ...] = ()

    @property
    def leases(self) -> list[Lease]:
        return [s.lease for s in self.settlements]

    def part(self, settlements: Sequence[Settlement], n: int) -> CheckedRound:
        """The same round with only `settlements`, claiming `n`."""
        return dataclasses.replace(self, settlements=tuple(settlements), n=n)
