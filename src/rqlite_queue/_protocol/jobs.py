"""Messages as jobs: cancel one message (`cancel`), read one as a job (`job`: queued, running,
or its kept outcome), what a worker's leases became (`lease_news`: cancelled, or lost), and
a result checked once (`check_result`).

A message that keeps its outcome (`publish(keep=)`) gets it written by its settlement's own
statement (the trigger `messages_kept`, schema.py): the round that acks, dead-letters or
expires it carries the result and error in its record (`settled`), so keeping outcomes
costs no statement and no Raft entry of its own. Outcomes are pruned with the claim tokens,
by the rounds that settle (`rounds._PRUNE`): an idle queue writes nothing."""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument
from ..types import MAX_BATCH, Headers, JobResult, Lease, LeaseCheck
from .batch_counts import count_cancelled_message
from .checks import check_id, check_int, show
from .core import QueueCore
from .names import Fields, Names, Sql, as_json
from .outcomes import read_errors, read_progress, worker_ids
from .plan import NOTHING, Batch, Builder, Plan, Reply
from .round_spec import Held, check_reason
from .schema import CANCELLED, OUTCOME_STATUSES, RETIRE_WINDOW
from .settlements import FREED

HELD = Fields("j", Held._fields)

# ----------------------------------------------------------------------------- cancel

# The message is its group's head with a token: a lease in force, or one that lapsed and that
# nobody took over (it may still be settled).
_LEASED = Sql(
    """
    EXISTS (SELECT 1 FROM {groups} WHERE group_id = {text.g} AND head = :q
      AND token IS NOT NULL)
    """
)
# Leased: flagged with the reason; any of its settlements then settles it as cancelled, and a
# claim that takes it again settles it so at once (rounds).
_FLAG = Sql(
    "UPDATE {messages} SET cancel = :r WHERE seq = :q AND group_id = {text.g} AND {leased}",
    leased=_LEASED,
)
_QUEUED = Sql("m.seq = :q AND m.group_id = {text.g} AND NOT {leased}", leased=_LEASED)
# Queued: the record of the cancel (with the reason its outcome takes: `messages_kept`; a
# resend after a lost reply finds it), then the message gone.
_RECORD = Sql(
    """
    INSERT INTO {settled} (token, seq, kind, expires_at, reason)
    SELECT '', :q, {cancelled}, :e, :r WHERE EXISTS (SELECT 1 FROM {messages} m WHERE {queued})
    ON CONFLICT (token, seq) DO UPDATE SET expires_at = excluded.expires_at
    """,
    cancelled=str(CANCELLED),
    queued=_QUEUED,
)
_REMOVE = Sql("DELETE FROM {messages} AS m WHERE {queued}", queued=_QUEUED)
# If it was its group's head (nothing older left; no lease: a claim gave it none, or a nack
# took it back), its group goes on with its next message, or waits for it, or empties
# (`d`: the due time of its new head).
_GOES_ON = Sql(
    """
    UPDATE {groups} SET {freed}
    FROM (SELECT (SELECT due FROM {messages} WHERE group_id = {text.g} ORDER BY seq LIMIT 1) d)
    WHERE group_id = {text.g} AND token IS NULL AND changes() > 0
      AND NOT EXISTS (SELECT 1 FROM {messages} WHERE group_id = {text.g} AND seq < :q)
    """,
    freed=FREED,
)
_WAS = Sql(
    "SELECT 1 FROM {settled} WHERE token = '' AND seq = :q AND kind = {cancelled}",
    cancelled=str(CANCELLED),
)


def cancel_batch(
    n: Names, group_id: str, seq: int, reason: str, *, now: float, sharded: bool = False
) -> Batch:
    """Flag a leased message (slot "flagged"); or remove a queued one (slot "removed"; slot
    "was": the record of a removal, an earlier send's too), counted as cancelled in its batch
    if it has one, and let its group go on."""
    here = {"g": as_json(group_id), "q": seq}
    b = Builder()
    b.add(_FLAG(n), {**here, "r": reason}, slot="flagged")
    b.add(_RECORD(n), {**here, "e": now + RETIRE_WINDOW, "r": reason})
    count_cancelled_message(b, n, _QUEUED, {**here, "now": now}, sharded=sharded)
    b.add(_REMOVE(n), here, slot="removed")
    b.add(_GOES_ON(n), {**here, "retire": now + RETIRE_WINDOW, "now": now})
    b.add(_WAS(n), {"q": seq}, slot="was")
    return b.build()


def read_cancel(reply: Reply) -> str | None:
    if reply["flagged"].rows_affected:
        return "cancelling"
    if reply["removed"].rows_affected or reply["was"].rows:
        return "cancelled"
    return None


def cancel(
    core: QueueCore, group_id: str, seq: int, reason: str, *, sharded: bool = False
) -> Plan[str | None]:
    """Cancel message `seq` of `group_id`: "cancelled" (it was queued: removed), "cancelling"
    (leased: flagged), or None (not in the queue). Safe to resend: it flags or removes once,
    and a resend finds the record of a removal (or flags again)."""
    check_id(group_id, "group_id")
    check_int(seq, "seq", 1, 2**63 - 1)
    reason = check_reason(reason)
    batch = cancel_batch(core.names, group_id, seq, reason, now=core.now(), sharded=sharded)
    return Plan(batch, read_cancel, resend_safe=True, empties_group=True)


# -------------------------------------------------------------------------------- job

# Its outcome, kept and not past its time (the primary key), or the message as it is with
# its group's row and its lease's start (the claims' primary key).
_OUTCOME = Sql(
    """
    SELECT status, event, headers, result, reason, errors, progress, attempts, workers,
      published_at, started_at, finished_at, expires_at, holder
    FROM {outcomes} WHERE seq = :q AND group_id = {text.g} AND expires_at > :now
    """
)
_MESSAGE = Sql(
    """
    SELECT m.event, m.headers, m.published_at, m.cancel, m.progress, m.errors, m.workers,
      g.head = m.seq, g.attempts, g.token, (SELECT at FROM {claims} WHERE token = g.token)
    FROM {messages} m JOIN {groups} g ON g.group_id = m.group_id
    WHERE m.seq = :q AND m.group_id = {text.g}
    """
)


def job_batch(n: Names, group_id: str, seq: int, *, now: float, local: bool = False) -> Batch:
    here = {"g": as_json(group_id), "q": seq}
    b = Builder(write=False, local=local)
    b.add(_OUTCOME(n), {**here, "now": now}, slot="outcome")
    b.add(_MESSAGE(n), here, slot="message")
    return b.build()


def job(core: QueueCore, group_id: str, seq: int, *, local: bool = False) -> Plan[JobResult | None]:
    """Message `seq` of `group_id` as a job (None: not in the queue, and no outcome kept);
    `local`: a read of the leader's own copy (a waiter's polls: no Raft round)."""
    check_id(group_id, "group_id")
    check_int(seq, "seq", 1, 2**63 - 1)
    batch = job_batch(core.names, group_id, seq, now=core.now(), local=local)

    def read(reply: Reply) -> JobResult | None:
        rows = reply["outcome"].rows
        if rows:
            return _outcome(core, group_id, seq, rows[0])
        rows = reply["message"].rows
        return _pending(core, group_id, seq, rows[0]) if rows else None

    return Plan(batch, read)


def _outcome(core: QueueCore, group_id: str, seq: int, row: list[Any]) -> JobResult:
    (status, event, headers, result, reason, errors, progress, attempts, workers) = row[:9]
    published, started, finished, expires, holder = row[9:]
    holders = json.loads(workers) if workers else []
    if holder is not None:
        holders.append(str(holder))
    return JobResult(
        group_id,
        seq,
        OUTCOME_STATUSES[int(status)],
        event=core.decode(str(event)),
        headers=Headers.stored(headers),
        result=None if result is None else core.decode(str(result)),
        reason=None if reason is None else str(reason),
        errors=read_errors(errors),
        progress=read_progress(progress),
        attempts=int(attempts),
        workers=worker_ids(holders),
        enqueued_at=float(published),
        started_at=None if started is None else float(started),
        finished_at=float(finished),
        kept_until=float(expires),
    )


def _pending(core: QueueCore, group_id: str, seq: int, row: list[Any]) -> JobResult:
    event, headers, published, cancel, progress, errors, workers, head = row[:8]
    attempts, token, claimed_at = row[8:]
    is_head = bool(head)
    running = is_head and token is not None
    holders = json.loads(workers) if workers else []
    if running:
        holders.append(str(token))
    return JobResult(
        group_id,
        seq,
        "running" if running else "queued",
        event=core.decode(str(event)),
        headers=Headers.stored(headers),
        errors=read_errors(errors),
        progress=read_progress(progress),
        attempts=int(attempts) if is_head else 0,
        workers=worker_ids(holders),
        enqueued_at=float(published),
        started_at=float(claimed_at) if is_head and claimed_at is not None else None,
        cancelling=None if cancel is None else str(cancel),
    )


# ------------------------------------------------------------------------- lease news

# Of each lease: whether it still holds its group, its message's cancel, and if its message
# was dead-lettered (its group cancelled), why. Three primary-key lookups an item.
_NEWS = Sql(
    """
    SELECT j.key,
      EXISTS (SELECT 1 FROM {groups} g WHERE g.group_id = {j.group_id} AND g.token = {j.token}
        AND g.head = {j.seq}),
      (SELECT cancel FROM {messages} WHERE seq = {j.seq}),
      (SELECT reason FROM {dead} WHERE seq = {j.seq} AND group_id = {j.group_id})
    FROM json_each(:l) j
    """,
    j=HELD,
)


def lease_news_batch(n: Names, leases: Sequence[Held]) -> Batch:
    """A read of the leader's own copy (no Raft round)."""
    b = Builder(write=False, local=True)
    b.add(_NEWS(n), {"l": as_json(leases)}, slot="news")
    return b.build()


def lease_news(core: QueueCore, leases: Sequence[Lease]) -> Plan[LeaseCheck]:
    """Which of these leases' messages were cancelled, and which leases no longer hold."""
    if not isinstance(leases, list | tuple):
        raise InvalidArgument(f"leases must be a list, got {show(leases)}")
    if len(leases) > MAX_BATCH:
        raise InvalidArgument(f"at most {MAX_BATCH} leases per call")
    held = [_held(lease) for lease in leases]
    core.now()
    if not held:
        return Plan(NOTHING, lambda reply: LeaseCheck())

    def read(reply: Reply) -> LeaseCheck:
        cancelled: list[tuple[Lease, str]] = []
        lost: list[tuple[Lease, str]] = []
        for index, holds, cancel, dead in reply["news"].rows:
            lease = leases[int(index)]
            if not holds:
                why = (
                    f"lease lost: its message was dead-lettered ({dead})"
                    if dead is not None
                    else "lease lost: another worker took its group over, or it was settled"
                )
                lost.append((lease, why))
            elif cancel is not None:
                cancelled.append((lease, str(cancel)))
        return LeaseCheck(cancelled, lost)

    return Plan(lease_news_batch(core.names, held), read)


def in_given_order(leases: Sequence[Lease], found: Sequence[LeaseCheck]) -> LeaseCheck:
    """The checks of each cluster's leases (a sharded queue asks each shard of its own), as
    one, in the order the leases were given (a lease named twice: twice)."""
    news: dict[int, collections.deque[tuple[bool, Lease, str]]] = {}
    for check in found:
        for cancelled, pairs in ((True, check.cancelled), (False, check.lost)):
            for lease, why in pairs:
                news.setdefault(id(lease), collections.deque()).append((cancelled, lease, why))
    merged = LeaseCheck()
    for lease in leases:
        waiting = news.get(id(lease))
        if waiting:
            cancelled, found_lease, why = waiting.popleft()
            (merged.cancelled if cancelled else merged.lost).append((found_lease, why))
    return merged


def _held(lease: object) -> Held:
    if not isinstance(lease, Lease) or not isinstance(lease.token, str) or not lease.token:
        raise InvalidArgument(f"not a lease: {show(lease)}")
    check_int(lease.seq, "lease.seq", 1, 2**63 - 1)
    check_id(lease.group_id, "lease.group_id")
    return Held(lease.seq, lease.group_id, lease.token)
