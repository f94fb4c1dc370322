"""The queue's logic without I/O: each operation checks its input, then returns a `Plan`: the
`Batch` to run (built in `sql`) and how to read its results. The sync, async and embedded
transports run plans and nothing else.

Deterministic, like h11: the clock, the lease tokens and the coin that decides when to prune
are given to it (`QueueCore(clock=..., token=..., chance=...)`); nothing here reads the time,
draws a random number or touches a socket, so every plan can be tested on canned results."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from . import sql
from .cadence import check_cadence, missed, next_after
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
from .codec import Codec, as_codec
from .errors import (
    ClockSkew,
    DecodeError,
    EncodeError,
    InvalidArgument,
    LeaseLost,
    OutcomeUnknown,
    PayloadTooLarge,
    QueueError,
    SchemaError,
    TransportClosed,
)
from .lease import DeadLetter, GroupInfo, Lease, Schedule, Stats

T = TypeVar("T")

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_DEDUP_WINDOW = 300.0
DEFAULT_MAX_SKEW = 0.25
"""A lease (claim or extend) is refused when this client's clock is proven to be further
than this fraction of the lease's visibility from the cluster's (None: never; for a clock of
the caller's own, such as a test's fake clock)."""
MAX_REASON_BYTES = 64 * 1024
MAX_BATCH = 10_000
"""Most messages claimed, settled, listed, or named by seq in one call."""
MAX_PUBLISH = 100_000
"""Most messages in one publish_many."""
TOKEN_SUFFIX_BYTES = 64
"""A lease token is its worker id, ':' and a random part of at most this many bytes."""
EXPIRED = "expired"
"""The reason of the dead letters of messages whose ttl passed before they were delivered."""
PRUNE_CHANCE = 1 / 16
"""Pruning forgotten rows on a sixteenth of the calls that could leave some keeps the tables
small at a sixteenth of the cost (every statement costs rqlite a parse on each node)."""


@dataclass(frozen=True, slots=True)
class Plan(Generic[T]):
    batch: sql.Batch
    read: Callable[[sql.Reply], T]
    replay: Callable[[sql.Reply], T] | None = None
    """How to read the results of this batch sent once more after a first attempt whose
    outcome is unknown (the reply was lost); None when a second application could do harm,
    so the batch is not sent again."""
    replay_batch: sql.Batch | None = None
    """What to send again, if not `batch` itself."""


PublishItem = tuple[str, Any] | tuple[str, Any, int] | Mapping[str, Any]
"""`(group_id, event)`, `(group_id, event, priority)`, or a mapping with those keys (and
optionally `dedup_id`, `delay`, `not_before`, `ttl`)."""


@dataclass(frozen=True, slots=True)
class Round:
    """What `settle_and_claim` did: the new leases, the settlements whose lease no longer held
    (they changed nothing), and the extended leases (with their new deadline)."""

    leases: list[Lease] = field(default_factory=list)
    lost: list[Lease] = field(default_factory=list)
    extended: list[Lease] = field(default_factory=list)
    expired: list[Lease] = field(default_factory=list)
    """Leases taken on messages whose ttl had passed: not to be handled, but dead-lettered
    (the transport does that before it returns)."""
    unsettled: list[Lease] = field(default_factory=list)
    """Settlements and extensions whose shard did not answer (a sharded transport's; on one
    cluster the call raises instead): not known to be applied, to be sent again."""


@dataclass(frozen=True, slots=True)
class Probe:
    """A look at the queue without a Raft round: is a group claimable now, when does the
    earliest lease, park or delayed head end (None: none), when is the next schedule due."""

    claimable: bool
    next_due: float | None
    next_tick: float | None = None
    """When the earliest schedule is due (None: no schedule)."""


class QueueCore:
    """The pure half of a transport: names, codec, clock, token source, limits."""

    def __init__(
        self,
        *,
        queue: str = "default",
        codec: Codec | type[Any] | None = None,
        clock: Callable[[], float],
        token: Callable[[], str],
        chance: Callable[[], float],
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
        dedup_key: Callable[[Any], str | None] | None = None,
        clock_skew: Callable[[], float] = lambda: 0.0,
        max_skew: float | None = DEFAULT_MAX_SKEW,
    ) -> None:
        if not isinstance(queue, str) or not sql.QUEUE_NAME.fullmatch(queue):
            raise InvalidArgument(
                f"queue name {queue!r}: use 1-40 lower-case letters, digits or '_'"
            )
        check_seconds(dedup_window, "dedup_window", allow_zero=False)
        check_int(max_payload_bytes, "max_payload_bytes", 1)
        if dedup_key is not None and not callable(dedup_key):
            raise InvalidArgument(
                f"dedup_key must be a function of the event, got {show(dedup_key)}"
            )
        try:
            self.codec = as_codec(codec)
        except TypeError as exc:
            raise InvalidArgument(str(exc)) from None
        self.names = sql.Names.of(queue)
        self.clock = clock
        self.token = token
        self.chance = chance
        self.max_payload_bytes = max_payload_bytes
        self.dedup_window = float(dedup_window)
        self.dedup_key = dedup_key
        if max_skew is not None and (
            isinstance(max_skew, bool)
            or not isinstance(max_skew, int | float)
            or not 0 <= max_skew <= 1
        ):
            raise InvalidArgument(
                f"max_skew must be a fraction of visibility in [0, 1], or None; got "
                f"{show(max_skew)}"
            )
        self.clock_skew = clock_skew
        self.max_skew = max_skew
        self.closed = False

    def _now(self) -> float:
        if self.closed:
            raise TransportClosed(f"queue {self.names.queue!r}: the transport is closed")
        return self.clock()

    # ------------------------------------------------------------------------ setup

    def bootstrap(self) -> Plan[int]:
        """Create the version record if missing and read it (0: a new database)."""
        self._now()
        return Plan(sql.bootstrap(self.names), sql.read_version, sql.read_version)

    def upgrade(self, version: int) -> Plan[int] | None:
        """The plan that brings a database at `version` to this code's (None: it is)."""
        if version > sql.SCHEMA_VERSION:
            raise SchemaError(
                f"queue {self.names.queue!r} has schema version {version}; this library knows "
                f"{sql.SCHEMA_VERSION}: upgrade rqlite-queue"
            )
        if version == sql.SCHEMA_VERSION:
            return None
        batch = sql.create(self.names) if version == 0 else sql.migrate(self.names, version)
        return Plan(batch, lambda reply: sql.SCHEMA_VERSION)

    # ---------------------------------------------------------------------- publish

    def publish(
        self,
        group_id: str,
        event: Any,
        priority: int = 0,
        dedup_id: str | None = None,
        delay: float | None = None,
        not_before: float | None = None,
        ttl: float | None = None,
    ) -> Plan[int]:
        message = self._message(group_id, event, priority, dedup_id, delay, not_before, ttl)
        return self._publish([message], lambda seqs: seqs[0])

    def publish_many(self, items: Iterable[PublishItem]) -> Plan[list[int]]:
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise InvalidArgument(f"publish_many takes a list of items, got {show(items)}")
        items = list(items)
        if len(items) > MAX_PUBLISH:
            raise InvalidArgument(f"at most {MAX_PUBLISH} messages per publish_many")
        messages = [self._item(_unpack(item)) for item in items]
        return self._publish(messages, lambda seqs: seqs)

    def _item(self, item: dict[str, Any]) -> sql.NewMessage:
        return self._message(
            item["group_id"],
            item["event"],
            item.get("priority", 0),
            item.get("dedup_id"),
            item.get("delay"),
            item.get("not_before"),
            item.get("ttl"),
        )

    def _publish(self, messages: list[sql.NewMessage], pick: Callable[[list[int]], T]) -> Plan[T]:
        now = self._now()
        # A dedup id repeated within one batch is one message: its repeats get its seq.
        unique: list[sql.NewMessage] = []
        seen: set[str] = set()
        for m in messages:
            if m.dedup_id is not None:
                if m.dedup_id in seen:
                    continue
                seen.add(m.dedup_id)
            unique.append(m)
        # Forget ids a whole window after they expired: a publisher whose clock runs ahead of
        # another's by up to the window cannot prune ids the other still relies on.
        prune = bool(seen) and self.chance() < PRUNE_CHANCE
        batch = sql.publish(
            self.names,
            unique,
            now=now,
            dedup_until=now + self.dedup_window,
            prune_before=now - self.dedup_window if prune else None,
        )

        def read(reply: sql.Reply) -> T:
            seqs = dict(zip(map(id, unique), sql.read_published(reply, unique), strict=True))
            by_dedup = {m.dedup_id: seqs[id(m)] for m in unique if m.dedup_id is not None}
            return pick(
                [seqs[id(m)] if m.dedup_id is None else by_dedup[m.dedup_id] for m in messages]
            )

        # Only dedup ids make a second send harmless: it then finds the ids and inserts nothing.
        every_message_deduplicated = all(m.dedup_id is not None for m in messages)
        return Plan(batch, read, read if every_message_deduplicated else None)

    def _message(
        self,
        group_id: str,
        event: Any,
        priority: int,
        dedup_id: str | None,
        delay: float | None = None,
        not_before: float | None = None,
        ttl: float | None = None,
    ) -> sql.NewMessage:
        check_id(group_id, "group_id")
        check_int(priority, "priority", 0, sql.MAX_PRIORITY)
        now = self._now()
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
        try:
            text = self.codec.encode(event)
        except QueueError:
            raise
        except Exception as exc:  # a codec's own bug, or json's RecursionError
            raise EncodeError(f"the codec could not encode this payload: {show(exc)}") from exc
        if not isinstance(text, str):
            raise EncodeError(f"the codec must encode to str, got {type(text).__name__}")
        if "\x00" in text:
            raise EncodeError("the encoded payload holds a NUL, which SQLite cuts text at")
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise EncodeError(f"payload is not valid Unicode text: {exc.reason}") from None
        if size > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload is {size} bytes encoded; the limit is {self.max_payload_bytes}"
            )
        if dedup_id is None and self.dedup_key is not None:
            try:
                dedup_id = self.dedup_key(event)
            except Exception as exc:
                raise InvalidArgument(f"dedup_key failed on this event: {exc!r}") from exc
        if dedup_id is not None:
            check_id(dedup_id, "dedup_id")
        return sql.NewMessage(group_id, text, priority, dedup_id, due, expires)

    # ------------------------------------------------------------- settle, then claim

    def round(
        self,
        *,
        worker_id: str | None = None,
        visibility: float = 30.0,
        n: int = 0,
        min_priority: int = 0,
        ack: Sequence[Lease] = (),
        nack: Sequence[tuple[Lease, float]] = (),
        extend: Sequence[Lease] = (),
        dead: Sequence[tuple[Lease, str]] = (),
        hold_dead: bool = False,
        expired: Sequence[Lease] = (),
    ) -> Plan[Round]:
        """Settle leases and claim up to `n` new ones, in one transaction (see `sql.round_trip`).
        `expired`: leases on messages whose ttl passed, dead-lettered with reason `expired`.

        Resending after an unknown outcome is safe: the claim returns what the first send took
        (same token); settlements are at-least-once (a resend that finds its lease gone, most
        likely because the first send applied, does not report it lost)."""
        check_int(n, "n", 0, MAX_BATCH)
        check_int(min_priority, "min_priority", 0, sql.MAX_PRIORITY)
        check_seconds(visibility, "visibility", allow_zero=False)
        check_bool(hold_dead, "hold_dead")
        if worker_id is not None or n:
            check_id(worker_id, "worker_id")
        plan = _Settlements()
        for lease in _items(ack, "ack"):
            plan.add(lease, "finish")
        for pair in _items(dead, "dead"):
            lease, reason = _pair(pair, "dead")
            plan.add(lease, "finish", reason=_reason(reason))
        for nack_pair in _items(nack, "nack"):
            lease, delay = _pair(nack_pair, "nack")
            check_seconds(delay, "delay", allow_zero=True)
            plan.add(lease, "give_back", delay=float(delay))
        for lease in _items(extend, "extend"):
            plan.add(lease, "extend")
        for lease in _items(expired, "expired"):
            plan.add(lease, "finish", reason=EXPIRED)
        plan.expired = len(expired)
        if plan.count > MAX_BATCH:
            raise InvalidArgument(f"at most {MAX_BATCH} leases settled per call")
        now = self._now()
        if n or plan.extend:
            self._check_skew(visibility)
        until = now + visibility
        token = f"{worker_id}:{self.token()}" if n else ""
        claim = sql.Claim(token, until, n, min_priority) if n else None
        settle = plan.settle(now, until, hold_dead)
        prune = bool(settle.finish) and self.chance() < PRUNE_CHANCE
        batch, resend = (
            sql.round_trip(
                self.names, now=now, settle=settle, claim=claim, prune=prune, returning=returning
            )
            for returning in (True, False)
        )

        def read(reply: sql.Reply, *, replayed: bool = False) -> Round:
            lost = plan.lost([] if replayed else sql.read_lost(reply, settle))
            lost_ids = {id(lease) for lease in lost}
            if sql.returned_nothing(reply):
                # rqlite ran the claim but kept none of its RETURNING rows (its SQL parser did
                # not take the statement): the resend form reads what the token took.
                raise OutcomeUnknown("rqlite dropped the rows of a claim's RETURNING")
            leases: list[Lease] = []
            expired: list[Lease] = []
            read_at = self.clock()
            for r in sql.read_leased(reply):
                lease = Lease(
                    r.seq, r.group_id, self._decode(r.event), token, r.attempts, r.expires_at
                )
                gone = r.message_expires is not None and r.message_expires <= read_at
                (expired if gone else leases).append(lease)
            return Round(
                leases=leases,
                expired=expired,
                lost=lost,
                extended=[
                    _with_deadline(plan.lease_of(h), until)
                    for h in settle.extend
                    if id(plan.lease_of(h)) not in lost_ids
                ],
            )

        return Plan(batch, read, lambda reply: read(reply, replayed=True), resend)

    def _decode(self, text: str) -> Any:
        try:
            return self.codec.decode(text)
        except QueueError:
            raise
        except Exception as exc:  # a codec's own bug
            raise DecodeError(f"the codec could not decode a stored payload: {show(exc)}") from exc

    def _check_skew(self, visibility: float) -> None:
        if self.max_skew is None:
            return
        skew = self.clock_skew()
        if abs(skew) > self.max_skew * visibility:
            raise ClockSkew(
                f"this client's clock is {abs(skew):.1f} s {'behind' if skew > 0 else 'ahead of'} "
                f"the rqlite node's: a {visibility:g} s lease would look "
                f"{'lapsed early' if skew > 0 else 'held too long'} to other clients; refusing "
                f"to lease (the limit is {self.max_skew:g} of the visibility, max_skew). "
                f"Keep clocks in sync (NTP)"
            )

    def claim(self, worker_id: str, visibility: float, n: int, min_priority: int) -> Plan[Round]:
        check_int(n, "n", 1, MAX_BATCH)
        return self.round(
            worker_id=worker_id, visibility=visibility, n=n, min_priority=min_priority
        )

    def probe(self, min_priority: int) -> Plan[Probe]:
        check_int(min_priority, "min_priority", 0, sql.MAX_PRIORITY)
        self._now()
        return Plan(
            sql.probe(self.names, min_priority=min_priority),
            lambda reply: Probe(*sql.read_probe(reply)),
        )

    # ------------------------------------------------------- calls on a lease (fenced)

    def ack(self, leases: Sequence[Lease]) -> Plan[None]:
        return _fenced(self.round(ack=_leases(leases)), "ack")

    def nack(self, lease: Lease, delay: float) -> Plan[None]:
        return _fenced(self.round(nack=[(lease, delay)]), "nack")

    def extend(self, lease: Lease, visibility: float) -> Plan[Lease]:
        plan = self.round(extend=[lease], visibility=visibility)
        fenced = _fenced(plan, "extend")

        def read(reply: sql.Reply) -> Lease:
            fenced.read(reply)
            return plan.read(reply).extended[0]

        # A resend that finds the lease gone means it was taken over (an extend never
        # releases it): that is reported, as on a first send.
        return Plan(plan.batch, read, read)

    def dead_letter(self, lease: Lease, reason: str, hold: bool = False) -> Plan[None]:
        return _fenced(
            self.round(dead=[(lease, reason)], hold_dead=check_bool(hold, "hold")), "dead_letter"
        )

    # ------------------------------------------------------------------ holds

    def hold(self, group_id: str) -> Plan[None]:
        check_id(group_id, "group_id")
        return Plan(sql.hold(self.names, group_id, now=self._now()), _nothing, _nothing)

    def release(self, group_id: str) -> Plan[bool]:
        check_id(group_id, "group_id")
        self._now()

        def read(reply: sql.Reply) -> bool:
            return reply["released"].rows_affected == 1

        return Plan(sql.release(self.names, group_id), read, lambda reply: True)

    def groups(
        self,
        *,
        state: str | None,
        prefix: str | None,
        min_priority: int,
        limit: int,
        after: str | None,
    ) -> Plan[list[GroupInfo]]:
        if state is not None and state not in sql.GROUP_STATES:
            raise InvalidArgument(f"state must be one of {', '.join(sql.GROUP_STATES)} or None")
        if prefix is not None:
            check_id(prefix, "prefix")
        if after is not None:
            check_id(after, "after")
        check_int(min_priority, "min_priority", 0, sql.MAX_PRIORITY)
        check_int(limit, "limit", 1, MAX_BATCH)
        now = self._now()
        batch = sql.list_groups(
            self.names,
            now=now,
            limit=limit,
            after=after,
            prefix=None if prefix is None else (prefix, _prefix_end(prefix)),
            state=state,
            min_priority=min_priority,
        )

        def read(reply: sql.Reply) -> list[GroupInfo]:
            return [
                GroupInfo(
                    group_id=str(r[0]),
                    priority=int(r[1]),
                    state=str(r[2]),
                    depth=int(r[3]),
                    head_seq=None if r[4] is None else int(r[4]),
                    attempts=int(r[5]),
                    until=None if r[6] is None else float(r[6]),
                    holder=None if r[7] is None else str(r[7]).rpartition(":")[0],
                    head_age=None if r[8] is None else max(0.0, now - float(r[8])),
                )
                for r in reply["groups"].rows
            ]

        return Plan(batch, read)

    def cancel_group(self, group_id: str, reason: str) -> Plan[int]:
        check_id(group_id, "group_id")
        reason = _reason(reason)
        batch = sql.cancel_group(self.names, group_id, reason, now=self._now())
        # Not resent: a second application would also cancel what was published since.
        return Plan(batch, lambda reply: reply["cancelled"].rows_affected)

    def set_priority(self, group_id: str, priority: int) -> Plan[bool]:
        check_id(group_id, "group_id")
        check_int(priority, "priority", 0, sql.MAX_PRIORITY)
        self._now()

        def read(reply: sql.Reply) -> bool:
            return reply["changed"].rows_affected == 1

        return Plan(sql.set_priority(self.names, group_id, priority), read, read)

    def set_paused(self, paused: bool) -> Plan[None]:
        self._now()
        return Plan(sql.set_paused(self.names, paused), _nothing, _nothing)

    # ------------------------------------------------------------------ schedules

    def schedule(
        self,
        name: str,
        group_id: str,
        event: Any,
        *,
        every: float | None = None,
        cron: str | None = None,
        priority: int = 0,
        catch_up: bool = False,
        start_at: float | None = None,
    ) -> Plan[Schedule]:
        check_id(name, "name")
        check_cadence(every, cron)
        check_bool(catch_up, "catch_up")
        message = self._message(group_id, event, priority, None)
        now = self._now()
        if start_at is None:
            first = next_after(now, every=every, cron=cron, anchor=now)
        else:
            check_seconds(start_at, "start_at", allow_zero=True, high=now + MAX_SECONDS)
            first = float(start_at)
        row = sql.ScheduleRow(name, group_id, message.event, priority, every, cron, catch_up, first)
        schedule = self._schedule(row)
        return Plan(
            sql.put_schedule(self.names, row, now=now), lambda r: schedule, lambda r: schedule
        )

    def put_row(self, row: sql.ScheduleRow) -> Plan[None]:
        """Store a schedule row as it is (a sharded queue moving it to its group's shard)."""
        return Plan(sql.put_schedule(self.names, row, now=self._now()), _nothing, _nothing)

    def _schedule(self, row: sql.ScheduleRow) -> Schedule:
        return Schedule(
            row.name,
            row.group_id,
            self._decode(row.event),
            row.priority,
            row.every,
            row.cron,
            row.catch_up,
            row.next_at,
        )

    def unschedule(self, name: str) -> Plan[bool]:
        check_id(name, "name")
        self._now()

        def read(reply: sql.Reply) -> bool:
            return reply["removed"].rows_affected == 1

        return Plan(sql.drop_schedule(self.names, name), read, lambda reply: True)

    def schedules(self) -> Plan[list[Schedule]]:
        self._now()
        return Plan(
            sql.list_schedules(self.names),
            lambda reply: [self._schedule(row) for row in sql.read_schedules(reply)],
        )

    def due_schedules(self) -> Plan[list[sql.ScheduleRow]]:
        """The schedules due now (a leader-local read)."""
        now = self._now()
        return Plan(sql.list_schedules(self.names, due_by=now), sql.read_schedules)

    def fire(self, due: Sequence[sql.ScheduleRow]) -> Plan[int]:
        """Publish the due ticks of these schedules and move each on (one message for all the
        ticks missed, or one per tick with `catch_up`); returns how many messages went out.
        Safe to resend: a resend finds each schedule moved on and does nothing."""
        now = self._now()
        fires = []
        for row in due:
            if row.next_at <= now:
                count, next_at = missed(row.next_at, now, every=row.every, cron=row.cron)
                fires.append(sql.Fire(row.name, row.next_at, next_at, count if row.catch_up else 1))

        def read(reply: sql.Reply) -> int:
            return reply["published"].rows_affected if "published" in reply else 0

        return Plan(sql.fire(self.names, fires, now=now) if fires else sql.Batch(()), read, read)

    # ------------------------------------------------------------------ dead letters

    def dead_letters(self, limit: int, group_id: str | None) -> Plan[list[DeadLetter]]:
        check_int(limit, "limit", 1, MAX_BATCH)
        if group_id is not None:
            check_id(group_id, "group_id")
        self._now()

        def read(reply: sql.Reply) -> list[DeadLetter]:
            return [
                DeadLetter(
                    int(r[0]),
                    str(r[1]),
                    self._decode(str(r[2])),
                    int(r[3]),
                    int(r[4]),
                    str(r[5]),
                    float(r[6]),
                    float(r[7]),
                )
                for r in reply["dead"].rows
            ]

        return Plan(sql.list_dead(self.names, limit=limit, group_id=group_id), read)

    def requeue_dead(self, seqs: Sequence[int] | None) -> Plan[int]:
        batch = sql.requeue_dead(self.names, _check_seqs(seqs), now=self._now())
        return Plan(batch, lambda reply: reply["requeued"].rows_affected)

    def purge_dead(self, seqs: Sequence[int] | None) -> Plan[int]:
        checked = _check_seqs(seqs)
        self._now()
        return Plan(sql.purge_dead(self.names, checked), lambda r: r["purged"].rows_affected)

    # ------------------------------------------------------------------------- reads

    def stats(self) -> Plan[Stats]:
        now = self._now()

        def read(reply: sql.Reply) -> Stats:
            depth, groups, in_flight, parked, dead, oldest, held, delayed = reply["counts"].rows[0]
            expired, paused, last_seq = reply["counters"].rows[0]
            return Stats(
                depth=int(depth),
                groups=int(groups),
                in_flight=int(in_flight),
                parked=int(parked),
                dead=int(dead),
                oldest_age=None if oldest is None else max(0.0, now - float(oldest)),
                by_priority={int(p): int(c) for p, c in reply["by_priority"].rows},
                held=int(held),
                delayed=int(delayed),
                expired=int(expired or 0),
                paused=bool(paused),
                last_seq=int(last_seq or 0),
            )

        return Plan(sql.stats(self.names, now=now), read)

    def peek(self, group_id: str, limit: int) -> Plan[list[tuple[int, Any]]]:
        check_id(group_id, "group_id")
        check_int(limit, "limit", 1, MAX_BATCH)
        self._now()
        return Plan(
            sql.peek(self.names, group_id, limit=limit),
            lambda reply: [(int(r[0]), self._decode(str(r[1]))) for r in reply["messages"].rows],
        )


class _Settlements:
    """The leases a round settles, checked, each named once: a lease named again in the same
    round is settled the first time and reported lost the others (by then it no longer holds)."""

    def __init__(self) -> None:
        self.finish: list[sql.Held] = []
        self.reasons: dict[int, str] = {}
        self.give_back: list[tuple[sql.Held, float]] = []
        self.extend: list[sql.Held] = []
        self._repeats: list[tuple[int, Lease]] = []
        self._leases: dict[int, tuple[int, Lease]] = {}
        self._seen: set[tuple[str, str, int]] = set()
        self._count = 0
        self.expired = 0

    @property
    def count(self) -> int:
        return self._count

    def add(self, lease: Lease, kind: str, *, reason: str | None = None, delay: float = 0) -> None:
        held = _held(lease)
        key = (held.group_id, held.token, held.seq)
        self._count += 1
        if key in self._seen:
            self._repeats.append((self._count, lease))
            return
        self._seen.add(key)
        self._leases[id(held)] = (self._count, lease)
        if kind == "finish":
            self.finish.append(held)
            if reason is not None:
                self.reasons[held.seq] = reason
        elif kind == "give_back":
            self.give_back.append((held, delay))
        else:
            self.extend.append(held)

    def lease_of(self, held: sql.Held) -> Lease:
        return self._leases[id(held)][1]

    def lost(self, held: Sequence[sql.Held]) -> list[Lease]:
        """The leases of these settlements, and the repeats, in the order they were given."""
        found = [self._leases[id(h)] for h in held] + self._repeats
        return [lease for _, lease in sorted(found, key=lambda pair: pair[0])]

    def settle(self, now: float, until: float, hold_dead: bool) -> sql.Settle:
        return sql.Settle(
            finish=self.finish,
            dead=self.reasons,
            hold=frozenset(self.reasons) if hold_dead else frozenset(),
            give_back=[(h, now + delay if delay > 0 else 0.0) for h, delay in self.give_back],
            extend=self.extend,
            extend_until=until,
            expired=self.expired,
        )


# ------------------------------------------------------------------------ checks


def _check_seqs(seqs: Sequence[int] | None) -> list[int] | None:
    if seqs is None:
        return None
    if not isinstance(seqs, list | tuple | range):
        raise InvalidArgument(f"seqs must be a list of ints, or None for all; got {show(seqs)}")
    seqs = list(seqs)
    if not seqs or len(seqs) > MAX_BATCH:
        raise InvalidArgument(f"seqs must name 1-{MAX_BATCH} dead letters, or be None for all")
    for s in seqs:
        check_int(s, "seq", 1, 2**63 - 1)
    return seqs


def _prefix_end(prefix: str) -> str | None:
    """The least text above every text that starts with `prefix` (SQLite compares text as
    UTF-8 bytes, i.e. by code point): its last code point raised by one (None: no bound)."""
    while prefix:
        last = ord(prefix[-1]) + 1
        if last == 0xD800:
            last = 0xE000  # surrogates are not text
        if last <= 0x10FFFF:
            return prefix[:-1] + chr(last)
        prefix = prefix[:-1]
    return None


def _reason(reason: object) -> str:
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


def _leases(leases: Iterable[Lease]) -> list[Lease]:
    return _items(leases, "leases")


def _pair(pair: object, what: str) -> tuple[Lease, Any]:
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise InvalidArgument(f"{what} items are (lease, value) pairs, got {show(pair)}")
    return pair[0], pair[1]


def _with_deadline(lease: Lease, until: float) -> Lease:
    return Lease(lease.seq, lease.group_id, lease.event, lease.token, lease.attempts, until)


def _nothing(reply: sql.Reply) -> None:
    return None


def _fenced(plan: Plan[Round], call: str) -> Plan[None]:
    """A settle-only round that raises `LeaseLost` for the leases that no longer held. A
    resend reports success: if the lease no longer holds, the likeliest cause is that the
    first send did apply; if it did not, the group was taken over and its message will be
    handled by the new holder. Either way the caller's part is over (at-least-once)."""

    def read(reply: sql.Reply) -> None:
        lost = plan.read(reply).lost
        if lost:
            raise LeaseLost(_lost_message(lost, call), lost)

    return Plan(plan.batch, read, _nothing)


def _lost_message(leases: Sequence[Lease], call: str) -> str:
    which = ", ".join(f"{show(lease.group_id)}#{lease.seq}" for lease in leases[:10])
    if len(leases) > 10:
        which += f" and {len(leases) - 10} more"
    return (
        f"{call}: lease no longer holds its group ({which}): it lapsed and was claimed by "
        f"another worker, or was already acked, nacked or dead-lettered, or its group was "
        f"cancelled"
    )


_ITEM_KEYS = {"group_id", "event", "priority", "dedup_id", "delay", "not_before", "ttl"}


def _unpack(item: PublishItem) -> dict[str, Any]:
    if isinstance(item, Mapping):
        unknown = set(item) - _ITEM_KEYS
        if unknown or "group_id" not in item or "event" not in item:
            raise InvalidArgument(
                f"publish item needs group_id and event (and optionally "
                f"{', '.join(sorted(_ITEM_KEYS - {'group_id', 'event'}))}), got keys "
                f"{show(sorted(map(str, item)))}"
            )
        return dict(item)
    if isinstance(item, tuple) and len(item) in (2, 3):
        return {"group_id": item[0], "event": item[1], "priority": item[2] if len(item) == 3 else 0}
    raise InvalidArgument(f"publish item must be (group_id, event[, priority]), got {show(item)}")
