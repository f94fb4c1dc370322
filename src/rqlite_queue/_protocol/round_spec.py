"""A round's arguments: settlements and a claim in one round trip, as given to
`settle_and_claim()` (the single calls on a lease are rounds with one settlement; a claim, one
with none) in a `RoundSpec`, and checked once into a `CheckedRound`, which a sharded queue's
router splits between its shards (`CheckedRound.part`) and `rounds.plan` makes a plan of. A
new round keyword is a field here with its check, and its use in rounds.py. What a
settlement keeps with its message's outcome (a result, an error, a progress) is checked here
in the same one pass over the settlements."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import InvalidArgument, LeaseLost
from ..types import MAX_BATCH, MAX_PRIORITY, CheckedResult, FollowUps, JobError, Lease
from . import messages
from .checks import MAX_ID_BYTES, check_bool, check_id, check_int, check_seconds, check_text, show
from .core import QueueCore
from .messages import MAX_PUBLISH, NewMessage
from .outcomes import check_error, check_progress

MAX_REASON_BYTES = 64 * 1024
TOKEN_SUFFIX_BYTES = 64
"""A lease token is its worker id, ':' and a random part of at most this many bytes."""
EXPIRED = "expired"
"""The reason of the dead letters of messages whose ttl passed before they were delivered."""


class Held(NamedTuple):
    """What identifies a lease on the server: its message, its group and its token (in this
    order, the first fields of every settlement's JSON item: `settlements.HELD`)."""

    seq: int
    group_id: str
    token: str


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
    results: Sequence[tuple[Lease, Any]] = ()
    """(a lease acked in this round, the result kept with its outcome: a value for the
    queue's codec, or as `check_result` returned it)."""
    errors: Sequence[tuple[Lease, Any]] = ()
    """(a lease nacked or dead-lettered in this round, the `JobError` of its attempt: kept with
    the message's outcome)."""
    progress: Sequence[tuple[Lease, Any]] = ()
    """(a lease extended in this round, its handler's progress: a small JSON value)."""

    def checked(
        self,
        messages: Callable[[object], Sequence[NewMessage]],
        result: Callable[[object], str | None] = lambda value: None,
    ) -> CheckedRound:
        """Every argument checked, once, before anything is sent anywhere (`messages`
        checks and encodes a lease's follow-ups, `result` a result)."""
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
        results = _by_lease(self.results, "results")
        errors = _by_lease(self.errors, "errors")
        progress = _by_lease(self.progress, "progress")
        seen: set[tuple[str, str, int]] = set()
        settlements = []
        for index, (lease, kind, reason, delay, expired) in enumerate(given):
            held = _held(lease)
            key = (held.group_id, held.token, held.seq)
            first = key not in seen
            mine = follow_ups.pop(key, ()) if kind == FINISH and first else ()
            kept: tuple[Any, ...] = ()
            if (results or errors or progress) and first:
                kept = _kept(kind, reason, lease, key, results, errors, progress, result)
            settlements.append(
                Settlement(
                    index, lease, held, kind, reason, delay, not first, expired, mine, (), *kept
                )
            )
            seen.add(key)
        if follow_ups:
            raise InvalidArgument(
                "publish= names a lease that is not acked or dead-lettered in this round: "
                "follow-ups go with their lease's settlement"
            )
        for what, verb, left in (
            ("results", "acked", results),
            ("errors", "nacked or dead-lettered", errors),
            ("progress", "extended", progress),
        ):
            if left:
                raise InvalidArgument(
                    f"{what}= names a lease that is not {verb} in this round: what an outcome "
                    f"keeps goes with its lease's settlement"
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
    held: Held
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
    result: str | None = None
    """An ack's result, encoded, kept with the message's outcome."""
    error: JobError | None = None
    """A nack's or a dead letter's error, kept with the message's outcome."""
    progress: str | None = None
    """An extension's progress (JSON), kept with the message."""


def _by_lease(given: object, what: str) -> dict[tuple[str, str, int], Any]:
    """(lease, value) pairs by their lease's key (each lease once)."""
    found: dict[tuple[str, str, int], Any] = {}
    for pair in _items(given, what):
        lease, value = _pair(pair, what)
        if not isinstance(lease, Lease):
            raise InvalidArgument(f"{what}: not a lease: {show(lease)}")
        key = (lease.group_id, lease.token, lease.seq)
        if key in found:
            raise InvalidArgument(f"{what}= names a lease twice")
        found[key] = value
    return found


def _kept(
    kind: str,
    reason: str | None,
    lease: Lease,
    key: tuple[str, str, int],
    results: dict[tuple[str, str, int], Any],
    errors: dict[tuple[str, str, int], Any],
    progress: dict[tuple[str, str, int], Any],
    encode: Callable[[object], str | None],
) -> tuple[str | None, JobError | None, str | None]:
    """What the message's outcome keeps of this settlement, given for its lease (popped: what
    is left names a lease not settled so): the result of an ack, the error of a nack or a dead
    letter, the progress of an extension."""
    result = error = text = None
    if kind == FINISH and reason is None and key in results:
        result = encode(results.pop(key))
    if kind in (FINISH, GIVE_BACK) and key in errors:
        error = check_error(errors.pop(key), lease.attempts)
    if kind == EXTEND and key in progress:
        text = check_progress(progress.pop(key))
    return result, error, text


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
            if m.batch is not None and m.batch != lease.batch:
                raise InvalidArgument(
                    f"a follow-up joins only its own lease's batch (counted with its "
                    f"settlement): {show(m.batch)} is not the batch of this lease "
                    f"({show(lease.batch)})"
                )
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


def _held(lease: Lease) -> Held:
    if not isinstance(lease, Lease):
        raise InvalidArgument(f"not a lease: {show(lease)}")
    if not isinstance(lease.token, str) or not lease.token:
        raise InvalidArgument("this lease has no token: it was not made by claim")
    check_int(lease.seq, "lease.seq", 1, 2**63 - 1)
    check_id(lease.group_id, "lease.group_id")
    check_id(lease.token, "lease.token", MAX_ID_BYTES + TOKEN_SUFFIX_BYTES)
    return Held(lease.seq, lease.group_id, lease.token)


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


def check(core: QueueCore, spec: RoundSpec, *, scoped: bool = False) -> CheckedRound:
    """Every argument of a round, checked once, before anything is sent anywhere. `scoped`:
    the follow-ups' dedup ids are scoped to their group (a sharded queue's)."""
    checked = spec.checked(
        lambda given: messages.follow_ups(core, given, scoped=scoped),
        lambda value: result_text(core, value),
    )
    core.now()
    return checked


def lease_lost(leases: Sequence[Lease], call: str) -> LeaseLost:
    """The `LeaseLost` of a call whose settlements of these leases no longer held."""
    which = ", ".join(f"{show(lease.group_id)}#{lease.seq}" for lease in leases[:10])
    if len(leases) > 10:
        which += f" and {len(leases) - 10} more"
    return LeaseLost(
        f"{call}: lease no longer holds its group ({which}): it lapsed and was claimed by "
        f"another worker, or was already acked, nacked or dead-lettered, or its group was "
        f"cancelled",
        leases,
    )


def check_result(core: QueueCore, value: Any) -> CheckedResult:
    """A result, encoded (and checked against the payload limit) once."""
    return CheckedResult(core.encode(value) if value is not None else None, core)


def result_text(core: QueueCore, value: object) -> str | None:
    """A result as its settlement's record carries it (encoded; None: none)."""
    if isinstance(value, CheckedResult):
        if value.origin is not core:
            raise InvalidArgument("this result was checked by another queue")
        return value.text
    return None if value is None else core.encode(value)
