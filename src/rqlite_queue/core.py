"""The queue's logic without I/O: each operation checks its input, then returns a `Plan`: the
`Batch` to run (built in `sql`) and how to read its results. The sync, async and embedded
transports run plans and nothing else."""

from __future__ import annotations

import random
import re
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from . import sql
from .codec import Codec, as_codec
from .errors import EncodeError, InvalidArgument, LeaseLost, PayloadTooLarge
from .lease import DeadLetter, Lease, Stats

T = TypeVar("T")

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_DEDUP_WINDOW = 300.0


@dataclass(frozen=True, slots=True)
class Plan(Generic[T]):
    batch: sql.Batch
    read: Callable[[Sequence[sql.Result]], T]
    replay: Callable[[Sequence[sql.Result]], T] | None = None
    """How to read the results of this batch sent once more after a first attempt whose
    outcome is unknown (the reply was lost); None when a second application could do harm,
    so the batch is not sent again."""


PublishItem = tuple[str, Any] | tuple[str, Any, int] | Mapping[str, Any]
"""`(group_id, event)`, `(group_id, event, priority)`, or a mapping with those keys (and
optionally `dedup_id`)."""


class QueueCore:
    """The pure half of a transport: names, codec, clock, limits."""

    def __init__(
        self,
        *,
        queue: str = "default",
        codec: Codec | type[Any] | None = None,
        clock: Callable[[], float] = time.time,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
    ) -> None:
        if not isinstance(queue, str) or not sql.QUEUE_NAME.fullmatch(queue):
            raise InvalidArgument(
                f"queue name {queue!r}: use 1-40 lower-case letters, digits or '_'"
            )
        if dedup_window <= 0:
            raise InvalidArgument("dedup_window must be > 0")
        self.names = sql.Names(queue)
        self.codec = as_codec(codec)
        self.clock = clock
        self.max_payload_bytes = max_payload_bytes
        self.dedup_window = dedup_window

    # ------------------------------------------------------------------------ setup

    def setup(self) -> Plan[int]:
        return Plan(sql.schema(self.names), sql.read_schema_version, sql.read_schema_version)

    # ---------------------------------------------------------------------- publish

    def publish(
        self, group_id: str, event: Any, priority: int = 0, dedup_id: str | None = None
    ) -> Plan[int]:
        message = self._message(group_id, event, priority, dedup_id)
        return self._publish([message], lambda seqs: seqs[0])

    def publish_many(self, items: Iterable[PublishItem]) -> Plan[list[int]]:
        messages = [self._message(*_unpack(item)) for item in items]
        return self._publish(messages, lambda seqs: seqs)

    def _publish(self, messages: list[sql.NewMessage], pick: Callable[[list[int]], T]) -> Plan[T]:
        now = self.clock()
        plan = sql.publish(self.names, messages, now, now + self.dedup_window)

        def read(results: Sequence[sql.Result]) -> T:
            return pick(sql.read_published_seqs(plan, results))

        # Only dedup ids make a second send harmless: it then finds the ids and inserts nothing.
        every_message_deduplicated = all(m.dedup_id is not None for m in messages)
        return Plan(plan.batch, read, read if every_message_deduplicated else None)

    def _message(
        self, group_id: str, event: Any, priority: int, dedup_id: str | None
    ) -> sql.NewMessage:
        _check_group(group_id)
        _check_int(priority, "priority", 0, sql.MAX_PRIORITY)
        if dedup_id is not None:
            if not isinstance(dedup_id, str) or not dedup_id:
                raise InvalidArgument("dedup_id must be a non-empty string")
            _check_text(dedup_id, "dedup_id")
        text = self.codec.encode(event)
        if not isinstance(text, str) or _HEX_LITERAL.fullmatch(text):
            raise EncodeError(f"codec {self.codec!r} must encode to text not shaped x'..'")
        size = len(text.encode("utf-8"))
        if size > self.max_payload_bytes:
            raise PayloadTooLarge(
                f"payload is {size} bytes encoded; the limit is {self.max_payload_bytes}"
            )
        return sql.NewMessage(group_id, text, priority, dedup_id)

    # ------------------------------------------------------------------------ claim

    def claim(
        self, worker_id: str, visibility: float, count: int, min_priority: int
    ) -> Plan[list[Lease]]:
        if not isinstance(worker_id, str) or not worker_id:
            raise InvalidArgument("worker_id must be a non-empty string")
        _check_visibility(visibility)
        _check_int(count, "n", 1)
        _check_int(min_priority, "min_priority", 0, sql.MAX_PRIORITY)
        now = self.clock()
        token = f"{worker_id}:{uuid.uuid4().hex}"
        batch = sql.claim(
            self.names,
            token=token,
            now=now,
            until=now + visibility,
            count=count,
            min_priority=min_priority,
        )

        def read(results: Sequence[sql.Result]) -> list[Lease]:
            return self._leases(results, token)

        # A second send with the same token finds the groups the first one took and returns
        # them, instead of taking more (and stranding those for a whole visibility period).
        return Plan(batch, read, read)

    def _leases(self, results: Sequence[sql.Result], token: str) -> list[Lease]:
        return [
            Lease(
                row.seq,
                row.group_id,
                self.codec.decode(row.event),
                token,
                row.attempts,
                row.expires_at,
            )
            for row in sql.read_leased(results)
        ]

    # ------------------------------------------------------- calls on a lease (fenced)

    def ack(self, leases: Sequence[Lease]) -> Plan[None]:
        held = [_held(lease) for lease in leases]

        def read(results: Sequence[sql.Result]) -> None:
            lost = [
                lease for lease, ok in zip(leases, sql.read_ack(results), strict=True) if not ok
            ]
            if lost:
                raise LeaseLost(_lost_message(lost, "ack"), lost)

        # Pruning the retired turns on one ack in 16 keeps that table small at a sixteenth
        # of the cost (every statement costs rqlite a parse on each node).
        prune = random.random() < 1 / 16
        batch = sql.ack(self.names, held, now=self.clock(), prune=prune)
        return Plan(batch, read, _done)

    def nack(self, lease: Lease, delay: float) -> Plan[None]:
        if isinstance(delay, bool) or not isinstance(delay, int | float) or delay < 0:
            raise InvalidArgument(f"delay must be a number >= 0, got {delay!r}")
        batch = sql.nack(self.names, _held(lease), now=self.clock(), delay=float(delay))
        return Plan(batch, _fenced(lease, "nack", sql.read_changed, None), _done)

    def extend(self, lease: Lease, visibility: float) -> Plan[Lease]:
        _check_visibility(visibility)
        until = self.clock() + visibility
        batch = sql.extend(self.names, _held(lease), until=until)
        extended = Lease(lease.seq, lease.group_id, lease.event, lease.token, lease.attempts, until)
        read = _fenced(lease, "extend", sql.read_changed, extended)
        return Plan(batch, read, read)

    def dead_letter(self, lease: Lease, reason: str) -> Plan[None]:
        if not isinstance(reason, str):
            raise InvalidArgument("reason must be a string")
        if _HEX_LITERAL.fullmatch(reason):
            reason = f"reason: {reason}"  # free text: keep it readable rather than refuse it
        batch = sql.dead_letter(self.names, _held(lease), reason=reason, now=self.clock())
        return Plan(batch, _fenced(lease, "dead_letter", sql.read_dead_lettered, None), _done)

    # ------------------------------------------------------------------ dead letters

    def dead_letters(self, limit: int, group_id: str | None) -> Plan[list[DeadLetter]]:
        _check_int(limit, "limit", 1)
        if group_id is not None:
            _check_group(group_id)

        def read(results: Sequence[sql.Result]) -> list[DeadLetter]:
            return [
                DeadLetter(
                    int(r[0]),
                    str(r[1]),
                    self.codec.decode(str(r[2])),
                    int(r[3]),
                    int(r[4]),
                    str(r[5]),
                    float(r[6]),
                    float(r[7]),
                )
                for r in results[0].rows
            ]

        return Plan(sql.list_dead(self.names, limit=limit, group_id=group_id), read)

    def requeue_dead(self, seqs: Sequence[int] | None) -> Plan[int]:
        batch = sql.requeue_dead(self.names, _check_seqs(seqs), now=self.clock())
        return Plan(batch, lambda results: results[-1].rows_affected)

    def purge_dead(self, seqs: Sequence[int] | None) -> Plan[int]:
        batch = sql.purge_dead(self.names, _check_seqs(seqs))
        return Plan(batch, lambda results: results[-1].rows_affected)

    # ------------------------------------------------------------------------- reads

    def stats(self) -> Plan[Stats]:
        now = self.clock()

        def read(results: Sequence[sql.Result]) -> Stats:
            depth, groups, in_flight, parked, dead, oldest = results[0].rows[0]
            return Stats(
                depth=int(depth),
                groups=int(groups),
                in_flight=int(in_flight),
                parked=int(parked),
                dead=int(dead),
                oldest_age=None if oldest is None else max(0.0, now - float(oldest)),
                by_priority={int(p): int(c) for p, c in results[1].rows},
            )

        return Plan(sql.stats(self.names, now=now), read)

    def peek(self, group_id: str, limit: int) -> Plan[list[tuple[int, Any]]]:
        _check_group(group_id)
        _check_int(limit, "limit", 1)
        return Plan(
            sql.peek(self.names, group_id, limit=limit),
            lambda results: [(int(r[0]), self.codec.decode(str(r[1]))) for r in results[0].rows],
        )


def _check_group(group_id: object) -> None:
    if not isinstance(group_id, str) or not group_id:
        raise InvalidArgument(f"group_id must be a non-empty string, got {group_id!r}")
    _check_text(group_id, "group_id")


# rqlite turns a string parameter shaped like an SQL hex literal (x'00ff') into a BLOB
# (its http/request_parser.go), so such a string would not come back as the same text.
_HEX_LITERAL = re.compile(r"\s*[xX]'(?:[0-9a-fA-F]{2})*'\s*")


def _check_text(value: str, what: str) -> None:
    if _HEX_LITERAL.fullmatch(value):
        raise InvalidArgument(
            f"{what} {value!r} is shaped like an SQL hex literal, which rqlite would store "
            f"as a BLOB: choose another"
        )


def _check_int(value: object, name: str, low: int, high: int | None = None) -> None:
    """An int (not a bool) in [low, high]."""
    bounds = f"in {low}-{high}" if high is not None else f">= {low}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int {bounds}, got {value!r}")
    if value < low or (high is not None and value > high):
        raise InvalidArgument(f"{name} must be {bounds}, got {value}")


def _check_visibility(visibility: object) -> None:
    if isinstance(visibility, bool) or not isinstance(visibility, int | float):
        raise InvalidArgument(f"visibility must be a number of seconds, got {visibility!r}")
    if not visibility > 0:
        raise InvalidArgument(f"visibility must be > 0, got {visibility!r}")


def _check_seqs(seqs: Sequence[int] | None) -> Sequence[int] | None:
    if seqs is None:
        return None
    seqs = list(seqs)
    if not seqs or not all(isinstance(s, int) and not isinstance(s, bool) for s in seqs):
        raise InvalidArgument("seqs must be a non-empty list of ints, or None for all")
    return seqs


def _held(lease: Lease) -> sql.Held:
    if not isinstance(lease, Lease) and not (
        hasattr(lease, "seq") and hasattr(lease, "group_id") and hasattr(lease, "token")
    ):
        raise InvalidArgument(f"not a lease: {lease!r}")
    if not lease.token:
        raise InvalidArgument("this lease has no token: it was not made by claim")
    return sql.Held(int(lease.seq), str(lease.group_id), str(lease.token))


def _done(results: Sequence[sql.Result]) -> None:
    """Reading a resent ack, nack or dead_letter: if the lease no longer holds, the likeliest
    cause is that the first send did apply; if it did not, the group was taken over and its
    message will be handled by the new holder. Either way the caller's part is over
    (at-least-once), so this does not raise `LeaseLost`."""


def _fenced(
    lease: Lease, call: str, held: Callable[[Sequence[sql.Result]], bool], value: T
) -> Callable[[Sequence[sql.Result]], T]:
    def read(results: Sequence[sql.Result]) -> T:
        if not held(results):
            raise LeaseLost(_lost_message([lease], call), [lease])
        return value

    return read


def _lost_message(leases: Sequence[Lease], call: str) -> str:
    which = ", ".join(f"{lease.group_id}#{lease.seq}" for lease in leases)
    return (
        f"{call}: lease no longer holds its group ({which}): it lapsed and was claimed by "
        f"another worker, or was already acked, nacked or dead-lettered"
    )


def _unpack(item: PublishItem) -> tuple[str, Any, int, str | None]:
    if isinstance(item, Mapping):
        unknown = set(item) - {"group_id", "event", "priority", "dedup_id"}
        if unknown or "group_id" not in item or "event" not in item:
            raise InvalidArgument(f"publish item needs group_id and event, got keys {set(item)}")
        return item["group_id"], item["event"], item.get("priority", 0), item.get("dedup_id")
    if isinstance(item, tuple) and len(item) in (2, 3):
        priority = item[2] if len(item) == 3 else 0
        return item[0], item[1], priority, None
    raise InvalidArgument(f"publish item must be (group_id, event[, priority]), got {item!r}")
