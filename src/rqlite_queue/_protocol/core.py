"""The queue's logic without I/O: each operation checks its input, then returns a `Plan`: the
`Batch` to run (built in `sql`) and how to read its results. The backends run plans and
nothing else; routers decide which cluster runs them.

Deterministic, like h11: the clock, the lease tokens and the coin that decides when to prune
are given to it (`QueueCore(clock=..., token=..., chance=...)`); nothing here reads the time,
draws a random number or touches a socket, so every plan can be tested on canned results."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from ..codec import Codec, as_codec
from ..errors import (
    ClockSkew,
    DecodeError,
    EncodeError,
    InvalidArgument,
    PayloadTooLarge,
    QueueError,
    TransportClosed,
)
from ..types import (
    GROUP_STATES,
    MAX_BATCH,
    MAX_PRIORITY,
    DeadLetter,
    GroupInfo,
    Headers,
    Schedule,
    Stats,
)
from . import sql
from .cadence import missed
from .checks import (
    check_id,
    check_int,
    check_seconds,
    show,
)
from .names import Names
from .params import ScheduleSpec
from .plan import NOTHING, Plan, Reply, nothing
from .round_spec import check_reason

T = TypeVar("T")


DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_DEDUP_WINDOW = 300.0
DEFAULT_MAX_SKEW = 0.25
"""A lease (claim or extend) is refused when this client's clock is proven to be further
than this fraction of the lease's visibility from the cluster's (None: never; for a clock of
the caller's own, such as a test's fake clock)."""
PRUNE_CHANCE = 1 / 16
"""Pruning forgotten rows on a sixteenth of the calls that could leave some keeps the tables
small at a sixteenth of the cost (every statement costs rqlite a parse on each node)."""


class QueueCore:
    """The pure half of a queue: names, codec, clock, token source, limits."""

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
        if max_skew is not None and (
            isinstance(max_skew, bool)
            or not isinstance(max_skew, int | float)
            or not 0 <= max_skew <= 1
        ):
            raise InvalidArgument(
                f"max_skew must be a fraction of visibility in [0, 1], or None; got "
                f"{show(max_skew)}"
            )
        self.names = Names.of(queue)
        self.clock = clock
        self.token = token
        self.chance = chance
        self.max_payload_bytes = max_payload_bytes
        self.dedup_window = float(dedup_window)
        self.dedup_key = dedup_key
        self.max_skew = max_skew
        self.closed = False
        self.trace_headers: Callable[[], Mapping[str, str] | None] | None = None
        """What every message checked now carries besides its own headers: the trace context
        in force (OpenTelemetry's, set by the transport when it is installed; None: nothing)."""

    def now(self) -> float:
        if self.closed:
            raise TransportClosed(f"queue {self.names.queue!r}: the transport is closed")
        return self.clock()

    def check_open(self) -> None:
        self.now()

    def check_skew(self, skew: float, visibility: float) -> None:
        """`ClockSkew` if a cluster whose clock is `skew` seconds from this client's (signed:
        theirs minus ours) would see a lease of `visibility` lapse too early or too late."""
        if self.max_skew is None or abs(skew) <= self.max_skew * visibility:
            return
        raise ClockSkew(
            f"this client's clock is {abs(skew):.1f} s {'behind' if skew > 0 else 'ahead of'} "
            f"the rqlite node's: a {visibility:g} s lease would look "
            f"{'lapsed early' if skew > 0 else 'held too long'} to other clients; refusing "
            f"to lease (the limit is {self.max_skew:g} of the visibility, max_skew). "
            f"Keep clocks in sync (NTP)"
        )

    # ---------------------------------------------------------------------- publish

    def dedup_id(self, event: Any) -> str | None:
        if self.dedup_key is None:
            return None
        try:
            return self.dedup_key(event)
        except Exception as exc:
            raise InvalidArgument(f"dedup_key failed on this event: {exc!r}") from exc

    def encode(self, event: Any) -> str:
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
        if text.isascii():  # (the common case: its size is its length, nothing to check)
            size = len(text)
        else:
            try:
                size = len(text.encode("utf-8"))
            except UnicodeEncodeError as exc:
                raise EncodeError(f"payload is not valid Unicode text: {exc.reason}") from None
        if size > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload is {size} bytes encoded; the limit is {self.max_payload_bytes}"
            )
        return text

    def decode(self, text: str) -> Any:
        try:
            return self.codec.decode(text)
        except QueueError:
            raise
        except Exception as exc:  # a codec's own bug
            raise DecodeError(f"the codec could not decode a stored payload: {show(exc)}") from exc

    # ------------------------------------------------------------------ holds

    def hold(self, group_id: str) -> Plan[None]:
        check_id(group_id, "group_id")
        return Plan(sql.hold(self.names, group_id, now=self.now()), nothing, resend_safe=True)

    def release(self, group_id: str) -> Plan[bool]:
        check_id(group_id, "group_id")
        self.now()

        def read(reply: Reply) -> bool:
            return reply["released"].rows_affected == 1

        return Plan(
            sql.release(self.names, group_id), read, resend_safe=True, read_resent=lambda r: True
        )

    def groups(
        self,
        *,
        state: str | None,
        prefix: str | None,
        min_priority: int,
        limit: int,
        after: str | None,
    ) -> Plan[list[GroupInfo]]:
        if state is not None and state not in GROUP_STATES:
            raise InvalidArgument(f"state must be one of {', '.join(GROUP_STATES)} or None")
        if prefix is not None:
            check_id(prefix, "prefix")
        if after is not None:
            check_id(after, "after")
        check_int(min_priority, "min_priority", 0, MAX_PRIORITY)
        check_int(limit, "limit", 1, MAX_BATCH)
        now = self.now()
        batch = sql.list_groups(
            self.names,
            now=now,
            limit=limit,
            after=after,
            prefix=None if prefix is None else (prefix, _prefix_end(prefix)),
            state=state,
            min_priority=min_priority,
        )

        def read(reply: Reply) -> list[GroupInfo]:
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
        reason = check_reason(reason)
        batch = sql.cancel_group(self.names, group_id, reason, now=self.now())
        # Not resent: a second application would also cancel what was published since.
        return Plan(batch, lambda reply: reply["cancelled"].rows_affected)

    def set_priority(self, group_id: str, priority: int) -> Plan[bool]:
        check_id(group_id, "group_id")
        check_int(priority, "priority", 0, MAX_PRIORITY)
        self.now()

        def read(reply: Reply) -> bool:
            return reply["changed"].rows_affected == 1

        return Plan(sql.set_priority(self.names, group_id, priority), read, resend_safe=True)

    def set_paused(self, paused: bool) -> Plan[None]:
        self.now()
        return Plan(sql.set_paused(self.names, paused), nothing, resend_safe=True)

    # ------------------------------------------------------------------ tenants

    # ------------------------------------------------------------------ schedules

    def schedule(self, spec: ScheduleSpec) -> Plan[Schedule]:
        now = self.now()
        row = spec.checked(now, self.encode)
        schedule = self._schedule(row)
        return Plan(
            sql.put_schedule(self.names, row, now=now), lambda r: schedule, resend_safe=True
        )

    def put_row(self, row: sql.ScheduleRow) -> Plan[None]:
        """Store a schedule row as it is (a sharded queue moving it to its group's shard)."""
        return Plan(sql.put_schedule(self.names, row, now=self.now()), nothing, resend_safe=True)

    def _schedule(self, row: sql.ScheduleRow) -> Schedule:
        return Schedule(
            row.name,
            row.group_id,
            self.decode(row.event),
            row.priority,
            row.every,
            row.cron,
            row.catch_up,
            row.next_at,
        )

    def unschedule(self, name: str) -> Plan[bool]:
        check_id(name, "name")
        self.now()

        def read(reply: Reply) -> bool:
            return reply["removed"].rows_affected == 1

        return Plan(
            sql.drop_schedule(self.names, name), read, resend_safe=True, read_resent=lambda r: True
        )

    def schedules(self) -> Plan[list[Schedule]]:
        self.now()
        return Plan(
            sql.list_schedules(self.names),
            lambda reply: [self._schedule(row) for row in sql.read_schedules(reply)],
        )

    def due_schedules(self) -> Plan[list[sql.ScheduleRow]]:
        """The schedules due now (a leader-local read)."""
        now = self.now()
        return Plan(sql.list_schedules(self.names, due_by=now), sql.read_schedules)

    def fire(self, due: Sequence[sql.ScheduleRow]) -> Plan[int]:
        """Publish the due ticks of these schedules and move each on (one message for all the
        ticks missed, or one per tick with `catch_up`); returns how many messages went out.
        Safe to resend: a resend finds each schedule moved on and does nothing."""
        now = self.now()
        fires = []
        for row in due:
            if row.next_at <= now:
                count, next_at = missed(row.next_at, now, every=row.every, cron=row.cron)
                fires.append(sql.Fire(row.name, row.next_at, next_at, count if row.catch_up else 1))

        def read(reply: Reply) -> int:
            return reply["published"].rows_affected if "published" in reply else 0

        return Plan(
            sql.fire(self.names, fires, now=now) if fires else NOTHING, read, resend_safe=True
        )

    # ------------------------------------------------------------------ dead letters

    def dead_letters(
        self, limit: int, group_id: str | None, after: tuple[int, str] | None = None
    ) -> Plan[list[DeadLetter]]:
        """A page from after the cursor `after` (`sharding.parse_dead_cursor`). A sharded
        cursor's seq is read again on every shard (it comes after the cursor on the shards
        named after the cursor's; `sharding.dead_letters_of` drops it from the others)."""
        check_int(limit, "limit", 1, MAX_BATCH)
        if group_id is not None:
            check_id(group_id, "group_id")
        self.now()
        seq, shard = after if after is not None else (0, "")
        if shard:
            seq, limit = seq - 1, limit + 1

        def read(reply: Reply) -> list[DeadLetter]:
            return [
                DeadLetter(
                    int(r[0]),
                    str(r[1]),
                    self.decode(str(r[2])),
                    int(r[3]),
                    int(r[4]),
                    str(r[5]),
                    float(r[6]),
                    float(r[7]),
                    headers=Headers.stored(r[8]),
                )
                for r in reply["dead"].rows
            ]

        return Plan(sql.list_dead(self.names, limit=limit, group_id=group_id, after=seq), read)

    def requeue_dead(self, seqs: Sequence[int] | None) -> Plan[int]:
        batch = sql.requeue_dead(self.names, check_seqs(seqs), now=self.now())
        return Plan(batch, lambda reply: reply["requeued"].rows_affected)

    def purge_dead(self, seqs: Sequence[int] | None) -> Plan[int]:
        checked = check_seqs(seqs)
        self.now()
        return Plan(sql.purge_dead(self.names, checked), lambda r: r["purged"].rows_affected)

    # ------------------------------------------------------------------------- reads

    def stats(self) -> Plan[Stats]:
        now = self.now()

        def read(reply: Reply) -> Stats:
            depth, groups, in_flight, parked, dead, oldest, held, delayed = reply["counts"].rows[0]
            expired, paused, last_seq, outbox, tenants_on = reply["counters"].rows[0]
            return Stats(
                depth=int(depth),
                groups=int(groups),
                in_flight=int(in_flight),
                parked=int(parked),
                dead=int(dead),
                oldest_age=None if oldest is None else max(0.0, now - float(oldest)),
                by_priority={int(p): int(c) for p, c, _ in reply["by_priority"].rows},
                held=int(held),
                delayed=int(delayed),
                expired=int(expired or 0),
                paused=bool(paused),
                last_seq=int(last_seq or 0),
                outbox=int(outbox or 0),
                tenants_on=bool(tenants_on),
                delayed_groups=int(reply["delayed_groups"].rows[0][0]),
                oldest_by_priority={
                    int(p): max(0.0, now - float(at))
                    for p, _, at in reply["by_priority"].rows
                    if at is not None
                },
            )

        return Plan(sql.stats(self.names, now=now), read)

    def peek(self, group_id: str, limit: int) -> Plan[list[tuple[int, Any]]]:
        check_id(group_id, "group_id")
        check_int(limit, "limit", 1, MAX_BATCH)
        self.now()
        return Plan(
            sql.peek(self.names, group_id, limit=limit),
            lambda reply: [(int(r[0]), self.decode(str(r[1]))) for r in reply["messages"].rows],
        )

    # ------------------------------------------------------------ a sharded queue's

    def shard_epoch(self) -> Plan[int]:
        return Plan(sql.shard_epoch(self.names), sql.read_shard_epoch)

    def groups_present(self, group_ids: Sequence[str], epoch: int) -> Plan[set[str]]:
        batch = sql.groups_present(self.names, group_ids, epoch=epoch)
        return Plan(batch, sql.read_present, resend_safe=True)

    def release_waits(self, group_ids: Sequence[str]) -> Plan[None]:
        return Plan(sql.release_waits(self.names, group_ids), nothing)

    def read_outbox(self, limit: int) -> Plan[list[sql.OutboxRow]]:
        self.now()
        return Plan(sql.read_outbox(self.names, limit=limit), sql.outbox_rows)

    def forwarded(self, ids: Sequence[int]) -> Plan[int]:
        """Forget forwarded follow-ups (safe to resend: a second delete finds none)."""

        def read(reply: Reply) -> int:
            return reply["forwarded"].rows_affected

        return Plan(sql.forwarded(self.names, ids), read, resend_safe=True)

    def waiting_groups(self, limit: int) -> Plan[list[str]]:
        return Plan(sql.waiting_groups(self.names, limit=limit), sql.read_waiting)

    def guarded(self, plan: Plan[T], epoch: int, held: Sequence[str] = ()) -> Plan[T]:
        """`plan` behind the shard list's epoch (`sql.epoch_guards`); the groups in `held`
        wait on this shard until their old shard has delivered their messages. (A read goes
        as it is: it changes nothing a stale list could get wrong.)"""
        if not plan.batch.write:
            return plan
        guards = [*sql.epoch_guards(self.names, epoch=epoch)]
        if held:
            guards.append(sql.wait_for_old_shard(self.names, held))
        resend, instead = plan.resend, plan.instead

        def guarded_instead(error: QueueError) -> Plan[T] | None:
            alternative = None if instead is None else instead(error)
            return None if alternative is None else self.guarded(alternative, epoch, held)

        return dataclasses.replace(
            plan,
            batch=plan.batch.first(guards),
            resend=None if resend is None else lambda: resend().first(guards),
            instead=None if instead is None else guarded_instead,
        )

    def is_stale_epoch(self, error: QueueError) -> bool:
        """Whether a guarded batch failed because its shard has a newer shard list."""
        return sql.STALE_EPOCH_ERROR.format(meta=self.names.meta) in str(error)


# ------------------------------------------------------------------------ checks


def check_seqs(seqs: Sequence[int] | None) -> list[int] | None:
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
