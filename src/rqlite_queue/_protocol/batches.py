"""Batches: messages whose settlements are counted, and whose callbacks are published once, by
the transaction of the last settlement (docs/batches.md).

A batch is a row of `batches` on one cluster (on a sharded queue, the shard its id names; a
batch within another lives on its parent's). The row counts its messages: each one that joins
it adds one in the transaction that writes it (a block's write, a publish naming the batch, a
settlement's follow-up that joins its lease's batch), each settlement of one (acked,
dead-lettered, cancelled) takes one off in the settlement's own transaction. A statement that
changes a batch's `pending` or `open` sets its `stamp` (the time: a trigger takes no
parameter), and a trigger of the batch's depth does the rest in that same statement: when
none is left and its block is over, the batch is done, its callbacks are published (on one
cluster as messages; on shards into the outbox, forwarded to their group's shard), and it is
settled in its parent, whose trigger (of the depth above: SQLite fires no trigger inside
itself) may finish it in turn. So a callback is published exactly once, never before the last
settlement, and costs no statement of its own.

A settlement on a shard where its batch does not live writes its count to its outbox in its
own transaction (a `counts` row); the forwarder applies the counts of one shard's outbox on the
batch's shard in the order they were written, and remembers the last one applied per shard
(`batch_sources`): a forward sent again applies nothing twice, and a shard that does not answer
delays the count, never loses or doubles it.

Here: a batch's arguments and its writes (`write_plan`, `through_plan`). Beside it: the tables
and triggers (`batch_tables`), the counts of settlements and cancels, and those forwarded
from other shards (`batch_counts`), the status of batches (`batch_status`), the ids
(`batch_ids`) and the publishes that join a batch (`batch_joins`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import InvalidArgument
from ..types import DEFAULT_BATCH_KEEP, MAX_BATCH_DEPTH, batch_shard
from .batch_ids import check_batch_id, depth_of
from .batch_joins import TRIPWIRE, count_joins, joins
from .batch_tables import triggers
from .checks import MAX_SECONDS, check_seconds, show
from .core import QueueCore
from .messages import GivenMessage, Message, NewMessage, TraceHeaders, checked_message
from .names import Fields, Sql, as_json
from .plan import Builder, Plan, Reply
from .publish import insert_messages
from .tenants import turn_on

# ------------------------------------------------------------------------- the arguments

CALLBACK_KEYS = frozenset(
    {"group_id", "event", "priority", "delay", "ttl", "tenant", "headers", "keep"}
)
"""What a callback item may say (a mapping; or `(group_id, event[, priority])`)."""


class Callback(NamedTuple):
    """A callback, checked and encoded, as its batch's row keeps it (a JSON array): published
    when the batch is done, `due` and `expires` (a delay and a ttl, seconds) from then;
    `keep`: how long its outcome is kept after it settles (as a publish's `keep`)."""

    group_id: str
    event: str
    priority: int
    due: float
    expires: float | None
    tenant: str | None
    headers: str | None
    keep: float | None


def check_keep(keep: object) -> float:
    """How long a done batch is kept for `batch_status()`: seconds, > 0, at most a year."""
    check_seconds(keep, "keep", allow_zero=False, high=MAX_SECONDS)
    return float(keep)  # type: ignore[arg-type]


def _callback(core: QueueCore, item: object, what: str) -> Callback | None:
    """A callback as `batch(on_complete=..., on_success=...)` takes it: `(group_id, event)`,
    `(group_id, event, priority)` or a mapping of CALLBACK_KEYS (None: none). A callback is
    published once: it takes no dedup id, debounce key or batch. Its outcome is kept as a
    publish's is: for its `keep`, else the transport's."""
    if item is None:
        return None
    if isinstance(item, Mapping):
        unknown = set(item) - CALLBACK_KEYS
        if unknown:
            raise InvalidArgument(
                f"{what}: a callback takes {', '.join(sorted(CALLBACK_KEYS))}, not "
                f"{', '.join(sorted(map(str, unknown)))}"
            )
        if "group_id" not in item or "event" not in item:
            raise InvalidArgument(f"{what}: a callback needs group_id and event")
    elif not (isinstance(item, tuple) and len(item) in (2, 3)):
        raise InvalidArgument(
            f"{what} must be (group_id, event[, priority]) or a mapping, got {show(item)}"
        )
    try:
        # Checked at time 0: its delay and ttl stay seconds, counted from when it is published.
        m = checked_message(Message.parse(item), 0.0, core.encode, None, keep_default=core.keep)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{what}: {exc}") from None
    return Callback(m.group_id, m.event, m.priority, m.due, m.expires, m.tenant, m.headers, m.keep)


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """A batch as `batch()` was given it, checked (its callbacks encoded)."""

    id: str
    parent: str | None
    keep: float = DEFAULT_BATCH_KEEP
    on_complete: Callback | None = None
    on_success: Callback | None = None

    @property
    def depth(self) -> int:
        return depth_of(self.id)

    @property
    def sharded(self) -> bool:
        return bool(batch_shard(self.id))


@dataclass(frozen=True, slots=True)
class BatchPart:
    """What one write does to one batch: its row made (`create`, its first write), its
    messages added, and (`close`, its last write) closed: done at once if none of them is left
    unsettled. `aborted`: the block that built it raised (after a write): why. `write`: the
    count of this batch's writes, this one included (a write sent again after a lost reply
    finds it done, and does nothing twice)."""

    spec: BatchSpec
    messages: Sequence[NewMessage]
    create: bool
    close: bool
    write: int = 1
    aborted: str | None = None


@dataclass(frozen=True, slots=True)
class BatchWrite:
    """One transaction of batches: a batch's write, with the writes of the batches made
    within its block (`AsyncBatch.batch`), parents before their children."""

    parts: Sequence[BatchPart]

    @property
    def messages(self) -> list[NewMessage]:
        return [m for part in self.parts for m in part.messages]


def spec(
    core: QueueCore,
    on_complete: object,
    on_success: object,
    *,
    parent: object,
    keep: object,
    shard: str,
    sharded: bool,
) -> BatchSpec:
    """A new batch's arguments, checked (its callbacks encoded), and its id."""
    depth = 1
    if parent is not None:
        parent = check_batch_id(parent, sharded=sharded)
        depth = depth_of(str(parent)) + 1
        if depth > MAX_BATCH_DEPTH:
            raise InvalidArgument(
                f"batches nest at most {MAX_BATCH_DEPTH} deep: {show(parent)} is as deep as "
                f"that already"
            )
    complete = _callback(core, on_complete, "on_complete")
    success = _callback(core, on_success, "on_success")
    return BatchSpec(
        id=core.batch_ids.next(core.now(), core.token(), shard=shard, depth=depth),
        parent=None if parent is None else str(parent),
        keep=check_keep(keep),
        on_complete=complete,
        on_success=success,
    )


def members(core: QueueCore, given: Sequence[GivenMessage], batch_id: str) -> list[NewMessage]:
    """A batch's messages, checked and encoded: no dedup id (the transport's `dedup_key` is
    not asked either), debounce key or batch of their own: each one given counts once, in
    this batch."""
    now = core.now()
    hook = core.trace_headers
    trace = None if hook is None else TraceHeaders.of(hook())
    rows: list[NewMessage] = []
    try:
        for m in given:
            if len(m) != 2:
                for name in ("dedup_id", "debounce", "max_wait", "batch"):
                    if getattr(m, name) is not None:
                        raise InvalidArgument(f"a batch's messages take no {name}")
            row = checked_message(m, now, core.encode, None, trace, core.keep)
            rows.append(row._replace(batch=batch_id))
    except InvalidArgument as exc:
        exc.index = len(rows)
        raise
    return rows


def aborted_reason(exc: BaseException) -> str:
    """Why a batch's block ended early, as its status keeps it."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:500]


# ---------------------------------------------------------------------------- a write

_CREATE = Sql(
    """
    INSERT OR IGNORE INTO {batches} (id, parent, depth, open, local, keep, created_at, stamp)
    VALUES ({text.b}, {text.parent}, :depth, 1, :local, :keep, :now, :now)
    """
)
CALLBACK = Fields("j", ("k", *Callback._fields))
# Its callbacks, their tenant resolved as a publish's would be now (the tenant given, else
# the part of the group id before the queue's tenant separator, else the default one).
_CALLBACKS = Sql(
    """
    INSERT OR IGNORE INTO {batch_callbacks} (batch, k, group_id, event, priority, delay, ttl,
      tenant, resolved, headers, keep)
    SELECT {text.b}, k, g, event, priority, delay, ttl, tenant,
      coalesce(tenant, iif(i > 1, substr(g, 1, i - 1), '')), headers, keep
    FROM (
      SELECT {j.k} k, {j.group_id} g, {j.event} event, {j.priority} priority, {j.due} delay,
        {j.expires} ttl, {j.tenant} tenant, {j.headers} headers, {j.keep} keep,
        instr({j.group_id}, (SELECT char(value) FROM {meta} WHERE "key" = 'tenant_sep')) i
      FROM json_each(:callbacks) j)
    """,
    j=CALLBACK,
)
_UNWRITTEN = "(SELECT writes FROM {batches} WHERE id = {text.b}) = 0"
# A batch made within a batch done, or unknown here: the write fails (BatchDone).
_PARENT_TRIPWIRE = Sql(
    TRIPWIRE
    + " WHERE "
    + _UNWRITTEN
    + """
    AND NOT EXISTS (SELECT 1 FROM {batches} WHERE id = {text.parent} AND done_at IS NULL)
    """
)
_IN_PARENT = Sql(
    """
    UPDATE {batches} SET pending = pending + 1, total = total + 1, stamp = :now
    WHERE id = {text.parent} AND """
    + _UNWRITTEN
)
# The part's messages go in only if this write of the batch has not applied yet.
_NOT_YET = Sql("(SELECT writes FROM {batches} WHERE id = {text.b}) = :before")
_MEMBER = Fields("j", NewMessage._fields)
_OUTBOXED = Sql(
    """
    INSERT INTO {outbox} (group_id, event, priority, dedup_id, due, expires, tenant,
      created_at, headers, keep, batch)
    SELECT {j.group_id}, {j.event}, {j.priority}, NULL, {j.due}, {j.expires}, {j.tenant}, :now,
      {j.headers}, {j.keep}, {j.batch}
    FROM json_each(:items) j WHERE {not_yet} ORDER BY j.key
    """,
    j=_MEMBER,
    not_yet=_NOT_YET,
)
# This write's messages in the outbox (a resend finds the first send's: the same time).
_OUTBOX_ROWS = Sql(
    "SELECT id FROM {outbox} WHERE batch = {text.b} AND created_at = :now ORDER BY id"
)
_WRITTEN = Sql(
    """
    UPDATE {batches} SET writes = :write, pending = pending + :n, total = total + :n,
      open = :open, aborted = coalesce(:aborted, aborted), stamp = :now,
      written = json_array(
        coalesce((SELECT seq FROM sqlite_sequence WHERE name = '{messages}'), 0) - :here + 1,
        :here)
    WHERE id = {text.b} AND writes = :write - 1
    """
)
_WRITES = Sql("SELECT id, written FROM {batches} WHERE id IN (SELECT value FROM json_each(:ids))")


@dataclass(frozen=True, slots=True)
class Written:
    """What a write gave: each message's seq (None for those written to the outbox, on their
    way to their group's shard), and the outbox rows of those, in order."""

    seqs: list[int | None]
    outboxed: list[int]


def write_plan(
    core: QueueCore, write: BatchWrite, *, here: Callable[[str], bool] | None = None
) -> Plan[Written]:
    """A batch's write, in one transaction on its cluster: the rows of the batches it makes
    (a batch within another counted in its parent, which must not be done: BatchDone), then
    each batch's messages and its counts (closed by its last write). `here`: on a sharded
    queue, whether a group lives on this shard (the others' messages go to the outbox,
    counted here). Sent again after a lost reply, it changes nothing twice: each batch's
    write carries its number."""
    n, now = core.names, core.now()
    b = Builder()
    local = here is None
    if any(m.tenant is not None for part in write.parts for m in part.messages) or any(
        c is not None and c.tenant is not None
        for part in write.parts
        for c in (part.spec.on_complete, part.spec.on_success)
    ):
        turn_on(b, n)
    deepest = max((part.spec.depth for part in write.parts if part.create), default=0)
    triggers(b, n, deepest, local=local)
    for part in write.parts:
        if not part.create:
            continue
        s = part.spec
        ids = {"b": json.dumps(s.id), "parent": json.dumps(s.parent)}
        b.add(
            _CREATE(n),
            {**ids, "depth": s.depth, "local": int(local), "keep": s.keep, "now": now},
        )
        callbacks = [[k, *c] for k, c in enumerate((s.on_complete, s.on_success)) if c is not None]
        if callbacks:
            b.add(_CALLBACKS(n), {"b": ids["b"], "callbacks": as_json(callbacks)})
        if s.parent is not None:
            b.add(_PARENT_TRIPWIRE(n), ids)
            b.add(_IN_PARENT(n), {**ids, "now": now})
    homes: list[list[bool]] = []  # each part's messages: whether each is published here
    for part in write.parts:
        s = part.spec
        mine = {"b": json.dumps(s.id), "before": part.write - 1}
        home = [here is None or here(m.group_id) for m in part.messages]
        homes.append(home)
        at_home = [m for m, at in zip(part.messages, home, strict=True) if at]
        away = [m for m, at in zip(part.messages, home, strict=True) if not at]
        if at_home:
            insert_messages(
                b,
                n,
                at_home,
                as_json(at_home),
                now=now,
                dedup_until=now,
                condition=_NOT_YET,
                params=mine,
            )
        if away:
            b.add(_OUTBOXED(n), {**mine, "items": as_json(away), "now": now})
            b.add(_OUTBOX_ROWS(n), {"b": json.dumps(s.id), "now": now}, slot=f"out{s.id}")
        b.add(
            _WRITTEN(n),
            {
                "b": json.dumps(s.id),
                "write": part.write,
                "n": len(part.messages),
                "open": int(not part.close),
                "aborted": part.aborted,
                "now": now,
                "here": len(at_home),
            },
        )
    b.add(_WRITES(n), {"ids": as_json([p.spec.id for p in write.parts])}, slot="writes")

    def read(reply: Reply) -> Written:
        firsts = {
            str(i): json.loads(w) if w is not None else [0, 0] for i, w in reply["writes"].rows
        }
        seqs: list[int | None] = []
        outboxed: list[int] = []
        for part, home in zip(write.parts, homes, strict=True):
            next_seq = int(firsts.get(part.spec.id, [0, 0])[0])
            slot = f"out{part.spec.id}"
            rows = iter([int(r[0]) for r in reply[slot].rows] if slot in reply else [])
            for at in home:
                if at:
                    seqs.append(next_seq)
                    next_seq += 1
                else:
                    seqs.append(None)
                    row = next(rows, None)
                    if row is not None:
                        outboxed.append(row)
        return Written(seqs, outboxed)

    return Plan(b.build(), read, resend_safe=True)


_THROUGH = Sql(
    """
    INSERT INTO {outbox} (group_id, event, priority, dedup_id, due, expires, tenant,
      created_at, headers, keep, batch)
    SELECT {j.group_id}, {j.event}, {j.priority}, NULL, {j.due}, {j.expires}, {j.tenant}, :now,
      {j.headers}, {j.keep}, {j.batch}
    FROM json_each(:items) j ORDER BY j.key
    """,
    j=_MEMBER,
)


def through_plan(core: QueueCore, messages: Sequence[NewMessage]) -> Plan[list[int]]:
    """On a batch's shard, messages that join its batches but whose groups live on other
    shards: counted in their batches and written to the outbox, to be forwarded; the plan
    reads their outbox rows. Not sent again after a lost reply (it would count them twice)."""
    n, now = core.names, core.now()
    b = Builder()
    if any(m.tenant is not None for m in messages):
        turn_on(b, n)
    count_joins(b, n, joins(messages), now)
    b.add(_THROUGH(n), {"items": as_json(messages), "now": now}, slot="outboxed")

    def read(reply: Reply) -> list[int]:
        out = reply["outboxed"]
        first = int(out.last_insert_id or 0) - out.rows_affected + 1
        return list(range(first, first + out.rows_affected))

    return Plan(b.build(), read)
