"""Each operation whose arguments travel through several layers, as one typed value with its
checks beside it: a publish (`Message`, with the one parser of `publish_many` items), a
schedule (`ScheduleSpec`) and a round (`RoundSpec`, checked into a `CheckedRound`). The queue
builds one from its method's arguments; the core turns the checked value into a plan; routers
pass it on untouched. So a new keyword is two edits: the public method's signature, and a
field here with its check and meaning (plus the SQL, if it is stored)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import InvalidArgument
from ..types import (
    MAX_BATCH,
    MAX_PRIORITY,
    FollowUps,
    Lease,
)
from . import sql
from .cadence import check_cadence, next_after
from .checks import (
    MAX_ID_BYTES,
    MAX_SECONDS,
    check_bool,
    check_id,
    check_int,
    check_seconds,
    check_text,
    show,
)
from .messages import MAX_PUBLISH, Message, NewMessage, checked_message

T = TypeVar("T")
R = TypeVar("R", bound=tuple[Any, ...])


MAX_REASON_BYTES = 64 * 1024
TOKEN_SUFFIX_BYTES = 64
"""A lease token is its worker id, ':' and a random part of at most this many bytes."""
EXPIRED = "expired"
"""The reason of the dead letters of messages whose ttl passed before they were delivered."""


def at_index(index: int, check: Callable[[Any], T], item: Any) -> T:
    """`check(item)`, its `InvalidArgument` marked with the item's position in its list."""
    try:
        return check(item)
    except InvalidArgument as exc:
        exc.index = index
        raise


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """A periodic publish, as given to `schedule()`."""

    name: Any
    group_id: Any
    event: Any
    every: Any = None
    cron: Any = None
    priority: Any = 0
    catch_up: Any = False
    start_at: Any = None

    def checked(self, now: float, encode: Callable[[Any], str]) -> sql.ScheduleRow:
        """The row to store: every field checked, the event encoded, the first tick set."""
        check_id(self.name, "name")
        check_cadence(self.every, self.cron)
        check_bool(self.catch_up, "catch_up")
        message = Message(group_id=self.group_id, event=self.event, priority=self.priority)
        event = checked_message(message, now, encode, None).event
        if self.start_at is None:
            first = next_after(now, every=self.every, cron=self.cron, anchor=now)
        else:
            check_seconds(self.start_at, "start_at", allow_zero=True, high=now + MAX_SECONDS)
            first = float(self.start_at)
        return sql.ScheduleRow(
            self.name,
            self.group_id,
            event,
            self.priority,
            self.every,
            self.cron,
            self.catch_up,
            first,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundSpec:
    """Settlements and a claim in one round trip, as given to `settle_and_claim()` (the
    single calls on a lease are rounds with one settlement; a claim, one with none)."""

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
    publish: Sequence[tuple[Lease, FollowUps]] = ()
    """Follow-ups: (a lease acked or dead-lettered in this round, the messages published with
    its settlement, as `publish_many` takes them or as `check_publish_many` returned them)."""

    def checked(self, messages: Callable[[object], Sequence[NewMessage]]) -> CheckedRound:
        """Every argument checked, once, before anything is sent anywhere (`messages`
        checks and encodes a lease's follow-ups)."""
        check_int(self.n, "n", 0, MAX_BATCH)
        check_int(self.min_priority, "min_priority", 0, MAX_PRIORITY)
        check_seconds(self.visibility, "visibility", allow_zero=False)
        check_bool(self.hold_dead, "hold_dead")
        if self.worker_id is not None or self.n:
            check_id(self.worker_id, "worker_id")
        given: list[tuple[Lease, str, str | None, float, bool]] = []
        given += [(lease, FINISH, None, 0.0, False) for lease in _items(self.ack, "ack")]
        for pair in _items(self.dead, "dead"):
            lease, reason = _pair(pair, "dead")
            given.append((lease, FINISH, check_reason(reason), 0.0, False))
        for nack_pair in _items(self.nack, "nack"):
            lease, delay = _pair(nack_pair, "nack")
            check_seconds(delay, "delay", allow_zero=True)
            given.append((lease, GIVE_BACK, None, float(delay), False))
        given += [(lease, EXTEND, None, 0.0, False) for lease in _items(self.extend, "extend")]
        given += [(lease, FINISH, EXPIRED, 0.0, True) for lease in _items(self.expired, "expired")]
        if len(given) > MAX_BATCH:
            raise InvalidArgument(f"at most {MAX_BATCH} leases settled per call")
        follow_ups = _follow_ups(self.publish, messages)
        seen: set[tuple[str, str, int]] = set()
        settlements = []
        for index, (lease, kind, reason, delay, expired) in enumerate(given):
            held = _held(lease)
            key = (held.group_id, held.token, held.seq)
            mine = follow_ups.pop(key, ()) if kind == FINISH and key not in seen else ()
            settlements.append(
                Settlement(index, lease, held, kind, reason, delay, key in seen, expired, mine)
            )
            seen.add(key)
        if follow_ups:
            raise InvalidArgument(
                "publish= names a lease that is not acked or dead-lettered in this round: "
                "follow-ups go with their lease's settlement"
            )
        return CheckedRound(
            self.worker_id,
            float(self.visibility),
            self.n,
            self.min_priority,
            self.hold_dead,
            tuple(settlements),
        )


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
    follow_ups: tuple[NewMessage, ...] = ()
    """Published with this settlement, only if it applies."""
    outboxed: tuple[NewMessage, ...] = ()
    """Follow-ups to groups of other shards: written to this shard's outbox."""


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


def _follow_ups(
    given: object, messages: Callable[[object], Sequence[NewMessage]]
) -> dict[tuple[str, str, int], tuple[NewMessage, ...]]:
    """The follow-ups of each lease (by key), checked and encoded. A dedup id repeated within
    one lease's follow-ups is one message; across two leases' it is refused (which one of them
    holds is only known when the round applies)."""
    pairs = _items(given, "publish")
    checked: dict[tuple[str, str, int], tuple[NewMessage, ...]] = {}
    owner: dict[str, tuple[str, str, int]] = {}
    total = 0
    for pair in pairs:
        lease, items = _pair(pair, "publish")
        held = _held(lease)
        key = (held.group_id, held.token, held.seq)
        if key in checked:
            raise InvalidArgument("publish= names a lease twice: give its follow-ups once")
        rows = messages(items)
        total += len(rows)
        if total > MAX_PUBLISH:
            raise InvalidArgument(f"at most {MAX_PUBLISH} follow-ups per round")
        unique: list[NewMessage] = []
        for m in rows:
            if m.dedup_id is not None:
                if owner.setdefault(m.dedup_id, key) != key:
                    raise InvalidArgument(
                        f"dedup id {show(m.dedup_id)} is in the follow-ups of two leases"
                    )
                if any(u.dedup_id == m.dedup_id for u in unique):
                    continue
            unique.append(m)
        checked[key] = tuple(unique)
    return checked


def check_reason(reason: object) -> str:
    if not isinstance(reason, str):
        raise InvalidArgument(f"reason must be a string, got {show(reason)}")
    check_text(reason, "reason", MAX_REASON_BYTES)
    return reason


def _held(lease: Lease) -> sql.Held:
    if not isinstance(lease, Lease):
        raise InvalidArgument(f"not a lease: {show(lease)}")
    if not isinstance(lease.token, str) or not lease.token:
        raise InvalidArgument("this lease has no token: it was not made by claim")
    check_int(lease.seq, "lease.seq", 1, 2**63 - 1)
    check_id(lease.group_id, "lease.group_id")
    check_id(lease.token, "lease.token", MAX_ID_BYTES + TOKEN_SUFFIX_BYTES)
    return sql.Held(lease.seq, lease.group_id, lease.token)


def _items(value: object, what: str) -> list[Any]:
    """A list or tuple of at most MAX_BATCH items (a mapping would be read as its keys, a
    string or bytes as its characters)."""
    if not isinstance(value, list | tuple):
        raise InvalidArgument(f"{what} must be a list, got {show(value)}")
    if len(value) > MAX_BATCH:
        raise InvalidArgument(f"{what}: at most {MAX_BATCH} per call, got {len(value)}")
    return list(value)


def _pair(pair: object, what: str) -> tuple[Lease, Any]:
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise InvalidArgument(f"{what} items are (lease, value) pairs, got {show(pair)}")
    return pair[0], pair[1]
