"""Each operation whose arguments travel through several layers, as one typed value with its
checks beside it: a publish (`Message`, with the one parser of `publish_many` items), a
schedule (`ScheduleSpec`) and a round (`RoundSpec`, checked into a `CheckedRound`). The queue
builds one from its method's arguments; the core turns the checked value into a plan; routers
pass it on untouched. So a new keyword is two edits: the public method's signature, and a
field here with its check and meaning (plus the SQL, if it is stored)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from ..errors import InvalidArgument, InvalidHeaders
from ..types import (
    MAX_BATCH,
    MAX_HEADERS,
    MAX_HEADERS_BYTES,
    MAX_PRIORITY,
    FollowUps,
    Lease,
    PublishItem,
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
    check_tenant,
    check_text,
    show,
)

T = TypeVar("T")
R = TypeVar("R", bound=tuple[Any, ...])


class _MakeRow(Protocol):
    def __call__(self, cls: type[R], fields: tuple[Any, ...], /) -> R: ...


_new_row: _MakeRow = tuple.__new__
"""Makes a named tuple from a tuple of all its fields, without its `__new__`'s call."""

MAX_PUBLISH = 100_000
"""Most messages in one publish_many."""
MAX_REASON_BYTES = 64 * 1024
TOKEN_SUFFIX_BYTES = 64
"""A lease token is its worker id, ':' and a random part of at most this many bytes."""
EXPIRED = "expired"
"""The reason of the dead letters of messages whose ttl passed before they were delivered."""


class Message(NamedTuple):
    """One message to publish, as given. (A named tuple: made for half of what a dataclass's
    `__init__` costs. A `(group_id, event)` item of `publish_many` is not made into one at all:
    `GivenMessage`.)"""

    group_id: Any
    event: Any
    priority: Any = 0
    dedup_id: Any = None
    delay: Any = None
    not_before: Any = None
    ttl: Any = None
    tenant: Any = None
    debounce: Any = None
    max_wait: Any = None
    headers: Any = None

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
            return cls(item[0], item[1], item[2] if len(item) == 3 else 0)
        raise InvalidArgument(
            f"publish item must be (group_id, event[, priority]) or a mapping, got {show(item)}"
        )

    @classmethod
    def parse_many(cls, items: Iterable[PublishItem]) -> list[GivenMessage]:
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise InvalidArgument(f"publish_many takes a list of items, got {show(items)}")
        items = list(items)
        if len(items) > MAX_PUBLISH:
            raise InvalidArgument(f"at most {MAX_PUBLISH} messages per publish_many")
        parsed: list[GivenMessage] = []
        try:  # (one try for the list: a call per item to mark its index costs more)
            for item in items:
                if type(item) is tuple and len(item) == 2:  # the common case, kept as it is
                    parsed.append(item)
                else:
                    parsed.append(cls.parse(item))
        except InvalidArgument as exc:
            exc.index = len(parsed)
            raise
        return parsed


ITEM_KEYS = frozenset(Message._fields)
_DEFAULTS = tuple(Message._field_defaults[name] for name in Message._fields[2:])
"""A message's fields after group_id and event, when not given."""

GivenMessage = Message | tuple[Any, Any]
"""A message to publish as given: a `Message`, or a `(group_id, event)` item of
`publish_many` kept as it came (the common case: a `Message` made of it would cost more than
the rest of its checks)."""


def checked_message(
    given: GivenMessage,
    now: float,
    encode: Callable[[Any], str],
    dedup_id: Callable[[Any], str | None] | None,
    trace: TraceHeaders | None = None,
) -> sql.NewMessage:
    """The row to insert: every field checked, the event encoded, the dedup id (given, or
    `dedup_id(event)`; None: no such function) checked, the headers checked and encoded (with
    `trace`'s, the trace context of the publish, over the given ones)."""
    if len(given) == 2:
        group_id, event = given
        priority, given_dedup, delay, not_before, ttl, tenant, debounce, wait, head = _DEFAULTS
    else:
        (
            group_id,
            event,
            priority,
            given_dedup,
            delay,
            not_before,
            ttl,
            tenant,
            debounce,
            wait,
            head,
        ) = given  # (one unpacking: cheaper than eleven attribute reads)
    check_id(group_id, "group_id")
    check_int(priority, "priority", 0, MAX_PRIORITY)
    if delay is None and not_before is None and ttl is None and debounce is wait is None:
        due, expires, due_by = 0.0, None, None
        if tenant is not None:
            check_tenant(tenant)
    else:
        due, expires, due_by = _timed(
            now, delay, not_before, ttl, tenant, debounce, wait, given_dedup
        )
    text = encode(event)
    dedup = None
    if debounce is None:
        dedup = given_dedup if given_dedup is not None or dedup_id is None else dedup_id(event)
    if dedup is not None:
        check_id(dedup, "dedup_id")
    if head is not None:
        headers = check_headers(head, trace)
    else:
        headers = None if trace is None else trace.text
    return _new_row(  # (`tuple.__new__`: a third of what the named tuple's own costs)
        sql.NewMessage,
        (group_id, text, priority, dedup, due, expires, tenant, debounce, due_by, headers),
    )


def _timed(
    now: float,
    delay: Any,
    not_before: Any,
    ttl: Any,
    tenant: Any,
    debounce: Any,
    wait: Any,
    given_dedup: Any,
) -> tuple[float, float | None, float | None]:
    """A message's due time, expiry and due-by bound (debounce's max_wait), checked (and its
    tenant, in between, as ever)."""
    due = 0.0
    if delay is not None and not_before is not None:
        raise InvalidArgument("give delay= or not_before=, not both")
    if delay is not None:
        check_seconds(delay, "delay", allow_zero=True)
        due = now + delay if delay > 0 else 0.0
    if not_before is not None:
        check_seconds(not_before, "not_before", allow_zero=True, high=now + MAX_SECONDS)
        due = float(not_before) if not_before > now else 0.0
    expires = None
    if ttl is not None:
        check_seconds(ttl, "ttl", allow_zero=False)
        expires = now + ttl
    if tenant is not None:
        check_tenant(tenant)
    due_by = None
    if debounce is not None:
        check_id(debounce, "debounce")
        if given_dedup is not None:
            raise InvalidArgument(
                "give dedup_id= or debounce=, not both (a debounced publish replaces its "
                "pending message: sent again, it replaces it again)"
            )
        if wait is not None:
            check_seconds(wait, "max_wait", allow_zero=True)
            due_by = now + wait
            due = min(due, due_by)
    elif wait is not None:
        raise InvalidArgument("max_wait= goes with debounce=")
    return due, expires, due_by


@dataclass(frozen=True, slots=True)
class TraceHeaders:
    """The headers a publish adds to each of its messages (OpenTelemetry's trace context), as
    given and encoded once for all of them."""

    given: Mapping[str, str]
    text: str

    @classmethod
    def of(cls, given: Mapping[str, str] | None) -> TraceHeaders | None:
        return cls(dict(given), _encoded(given)) if given else None


def check_headers(given: object, trace: TraceHeaders | None = None) -> str | None:
    """A message's headers as stored (compact JSON; None: none): a mapping of non-empty str
    keys to str values, neither holding a NUL, at most MAX_HEADERS of them and
    MAX_HEADERS_BYTES encoded (`InvalidHeaders` otherwise). `trace`'s headers are added over
    them after the check (they are not counted against the limits)."""
    if not isinstance(given, Mapping):
        raise InvalidHeaders(f"headers must be a mapping of str to str, got {show(given)}")
    if len(given) > MAX_HEADERS:
        raise InvalidHeaders(f"at most {MAX_HEADERS} headers per message, got {len(given)}")
    for key, value in given.items():
        if not isinstance(key, str) or not key:
            raise InvalidHeaders(f"header names must be non-empty strings, got {show(key)}")
        if not isinstance(value, str):
            raise InvalidHeaders(f"header {show(key)}: values must be strings, got {show(value)}")
        if "\x00" in key or "\x00" in value:
            raise InvalidHeaders(f"header {show(key)} holds a NUL character")
    if not given:
        return None if trace is None else trace.text
    text = _encoded(given)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidHeaders(f"headers are not valid Unicode text: {exc.reason}") from None
    if size > MAX_HEADERS_BYTES:
        raise InvalidHeaders(f"headers are {size} bytes encoded; the limit is {MAX_HEADERS_BYTES}")
    return text if trace is None else _encoded({**given, **trace.given})


def _encoded(headers: Mapping[str, str]) -> str:
    return json.dumps(dict(headers), ensure_ascii=False, separators=(",", ":"))


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

    def checked(self, messages: Callable[[object], Sequence[sql.NewMessage]]) -> CheckedRound:
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
    follow_ups: tuple[sql.NewMessage, ...] = ()
    """Published with this settlement, only if it applies."""
    outboxed: tuple[sql.NewMessage, ...] = ()
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
    given: object, messages: Callable[[object], Sequence[sql.NewMessage]]
) -> dict[tuple[str, str, int], tuple[sql.NewMessage, ...]]:
    """The follow-ups of each lease (by key), checked and encoded. A dedup id repeated within
    one lease's follow-ups is one message; across two leases' it is refused (which one of them
    holds is only known when the round applies)."""
    pairs = _items(given, "publish")
    checked: dict[tuple[str, str, int], tuple[sql.NewMessage, ...]] = {}
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
        unique: list[sql.NewMessage] = []
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
