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
delays the count, never loses or doubles it."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import InvalidArgument
from ..types import (
    BATCH_HEADER,
    BATCH_STATES,
    DEFAULT_BATCH_KEEP,
    MAX_BATCH,
    MAX_BATCH_DEPTH,
    MAX_BATCH_FAILURES,
    MAX_BATCH_REASON,
    BatchFailure,
    BatchStatus,
    batch_shard,
)
from .batch_ids import check_batch_id, depth_of
from .batch_joins import TRIPWIRE, count_joins, joins
from .checks import MAX_SECONDS, check_id, check_int, check_seconds, show
from .core import QueueCore
from .messages import GivenMessage, Message, NewMessage, TraceHeaders, checked_message
from .names import Fields, Names, Sql, as_json
from .plan import Builder, Plan, Reply
from .publish import insert_messages
from .tenants import turn_on

BACK, ACKED, FAILED, CANCELLED = 0, 1, 2, 3
"""How a lease on a message of a batch settled (the `kind` of a settlement's count): BACK, given
back (it counts only if its message was cancelled while leased: then it is gone), acked,
dead-lettered (or expired). A message cancelled while leased counts as cancelled however its
lease settles (its row's `cancel`: the lease's word is not taken for it)."""

# ------------------------------------------------------------------------- the arguments

CALLBACK_KEYS = frozenset({"group_id", "event", "priority", "delay", "ttl", "tenant", "headers"})
"""What a callback item may say (a mapping; or `(group_id, event[, priority])`)."""


class Callback(NamedTuple):
    """A callback, checked and encoded, as its batch's row keeps it (a JSON array): published
    when the batch is done, `due` and `expires` (a delay and a ttl, seconds) from then."""

    group_id: str
    event: str
    priority: int
    due: float
    expires: float | None
    tenant: str | None
    headers: str | None


def check_keep(keep: object) -> float:
    """How long a done batch is kept for `batch_status()`: seconds, > 0, at most a year."""
    check_seconds(keep, "keep", allow_zero=False, high=MAX_SECONDS)
    return float(keep)  # type: ignore[arg-type]


def check_state(state: object) -> str | None:
    if state is None:
        return None
    if not isinstance(state, str) or state not in BATCH_STATES:
        raise InvalidArgument(f"state must be one of {', '.join(BATCH_STATES)}, got {show(state)}")
    return state


def _callback(core: QueueCore, item: object, what: str) -> Callback | None:
    """A callback as `batch(on_complete=..., on_success=...)` takes it: `(group_id, event)`,
    `(group_id, event, priority)` or a mapping of CALLBACK_KEYS (None: none). A callback is
    published once: it takes no dedup id, debounce key or batch."""
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
        m = checked_message(Message.parse(item), 0.0, core.encode, None)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{what}: {exc}") from None
    return Callback(m.group_id, m.event, m.priority, m.due, m.expires, m.tenant, m.headers)


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


# ------------------------------------------------------------------------------ the tables

# `depth`: 1 for a batch within none (also in its id). `open`: 1 until its block's last write.
# `writes`: its block's writes applied; `written`: the seqs of the last one's messages here
# ([first, count]: one INSERT numbers them in a row). `failures`: the first
# MAX_BATCH_FAILURES, as [group, seq, reason, shard ('': its own), batch within]. `local`: its
# callbacks are published here (one cluster), else into the outbox (shards). `stamp`: the time
# of the last statement that changed its counts (a trigger's clock).
_BATCHES = Sql(
    """
    CREATE TABLE {batches} (
      id         TEXT PRIMARY KEY,
      parent     TEXT,
      depth      INTEGER NOT NULL,
      open       INTEGER NOT NULL,
      writes     INTEGER NOT NULL DEFAULT 0,
      written    TEXT,
      total      INTEGER NOT NULL DEFAULT 0,
      pending    INTEGER NOT NULL DEFAULT 0,
      succeeded  INTEGER NOT NULL DEFAULT 0,
      failed     INTEGER NOT NULL DEFAULT 0,
      cancelled  INTEGER NOT NULL DEFAULT 0,
      failures   TEXT NOT NULL DEFAULT '[]',
      aborted    TEXT,
      local      INTEGER NOT NULL,
      keep       REAL NOT NULL,
      created_at REAL NOT NULL,
      done_at    REAL,
      expires_at REAL,
      stamp      REAL NOT NULL
    )
    """
)
# A batch's callbacks (`k` 0: on_complete, 1: on_success), as published when it is done:
# `delay` and `ttl` from then; `tenant` as given, `resolved` the one its group gets here (the
# queue's tenant rule applied when the batch was made).
_CALLBACK_TABLE = Sql(
    """
    CREATE TABLE {batch_callbacks} (
      batch    TEXT NOT NULL,
      k        INTEGER NOT NULL,
      group_id TEXT NOT NULL,
      event    TEXT NOT NULL,
      priority INTEGER NOT NULL,
      delay    REAL NOT NULL,
      ttl      REAL,
      tenant   TEXT,
      resolved TEXT NOT NULL,
      headers  TEXT,
      PRIMARY KEY (batch, k)
    ) WITHOUT ROWID
    """
)
# The source shards whose counts this one applied: the last outbox row of each (a forward
# applies those after it, in order).
_SOURCES = Sql("CREATE TABLE {batch_sources} (source TEXT PRIMARY KEY, last_id INTEGER NOT NULL)")

# The callbacks of a batch done (`NEW`): on_complete, then on_success if none failed; the
# header says what the batch was (BATCH_HEADER). Plain columns, no JSON to read: every
# statement that counts in batches compiles these.
_ITS_CALLBACKS = Sql(
    """
    FROM {batch_callbacks} c WHERE c.batch = NEW.id
      AND (c.k = 0 OR (NEW.failed = 0 AND NEW.aborted IS NULL))
    """
)
_HEADERS = Sql(
    """
    json_patch(coalesce(c.headers, '{{{{}}}}'), json_object('{header}', json_object(
      'id', NEW.id, 'succeeded', NEW.succeeded, 'failed', NEW.failed,
      'cancelled', NEW.cancelled, 'failures', json(NEW.failures), 'parent', NEW.parent,
      'aborted', NEW.aborted, 'created_at', NEW.created_at, 'done_at', NEW.stamp,
      'kept_until', NEW.stamp + NEW.keep) || ''))
    """,
    header=BATCH_HEADER,
)
_DUE = "iif(c.delay > 0, NEW.stamp + c.delay, 0)"
_PUBLISHED_HERE = Sql(
    """
    INSERT INTO {messages} (group_id, event, published_at, due, expires, headers)
    SELECT c.group_id, c.event, NEW.stamp, {due}, NEW.stamp + c.ttl, {headers}
    {callbacks} ORDER BY c.k;
    DELETE FROM {groups} WHERE group_id IN (SELECT c.group_id {callbacks})
      AND {empty} AND {free} AND until < NEW.stamp;
    INSERT INTO {groups} (group_id, priority, ready, until, parked, tenant)
    SELECT c.group_id, c.priority, iif(c.delay > 0, {DELAYED.ready}, {READY.ready}),
      iif(c.delay > 0, NEW.stamp + c.delay, 0),
      iif(c.delay > 0, {DELAYED.parked}, {READY.parked}), c.resolved
    {callbacks} ORDER BY c.k
    ON CONFLICT (group_id) DO UPDATE SET ready = excluded.ready, until = excluded.until,
      parked = excluded.parked, priority = excluded.priority, tenant = excluded.tenant
    WHERE {empty};
    """,
    callbacks=_ITS_CALLBACKS,
    due=_DUE,
    headers=_HEADERS,
)
_PUBLISHED_ELSEWHERE = Sql(
    """
    INSERT INTO {outbox} (group_id, event, priority, due, expires, tenant, created_at, headers)
    SELECT c.group_id, c.event, c.priority, {due}, NEW.stamp + c.ttl, c.tenant, NEW.stamp,
      {headers}
    {callbacks} ORDER BY c.k;
    """,
    callbacks=_ITS_CALLBACKS,
    due=_DUE,
    headers=_HEADERS,
)
# A batch done, settled in its parent: succeeded if none of its messages failed.
_SETTLED_IN_PARENT = Sql(
    """
    UPDATE {batches} SET pending = pending - 1, succeeded = succeeded + (NEW.failed = 0),
      failed = failed + (NEW.failed > 0),
      failures = iif(NEW.failed > 0 AND json_array_length(failures) < {most},
        json_insert(failures, '$[#]', json_array('', 0,
          'batch ' || NEW.id || ': ' || NEW.failed || ' of ' || NEW.total || ' failed', '',
          NEW.id)),
        failures),
      stamp = NEW.stamp
    WHERE id = NEW.parent;
    """,
    most=str(MAX_BATCH_FAILURES),
)


def _done_trigger(depth: int) -> Sql:
    """The batches of `depth`: done once none is left and their block is over (in the
    statement that made it so), settled in their parent (whose trigger, of the depth above,
    may finish it in turn: SQLite fires no trigger inside itself). Small: every statement
    that changes batches' counts compiles all of them."""
    return Sql(
        f"""
        CREATE TRIGGER IF NOT EXISTS {{batches_done_{depth}}}
        AFTER UPDATE OF pending, open ON {{batches}}
        WHEN NEW.depth = {depth} AND NEW.pending <= 0 AND NEW.open = 0 AND NEW.writes > 0
          AND NEW.done_at IS NULL
        BEGIN
          UPDATE {{batches}} SET done_at = NEW.stamp, expires_at = NEW.stamp + NEW.keep
          WHERE id = NEW.id;
          {{parent}}
        END
        """,
        parent=_SETTLED_IN_PARENT if depth > 1 else "",
    )


# A batch done: its callbacks published, here (one cluster) or into the outbox (shards):
# compiled once into a statement, whatever the depth of the batches it finishes.
_FINISHED = (
    "AFTER UPDATE OF done_at ON {batches} WHEN OLD.done_at IS NULL AND NEW.done_at IS NOT NULL"
)
_FINISHED_HERE = Sql(
    "CREATE TRIGGER IF NOT EXISTS {batches_finished_here} " + _FINISHED + " BEGIN {here} END",
    here=_PUBLISHED_HERE,
)
_FINISHED_ELSEWHERE = Sql(
    "CREATE TRIGGER IF NOT EXISTS {batches_finished_elsewhere} "
    + _FINISHED
    + " BEGIN {elsewhere} END",
    elsewhere=_PUBLISHED_ELSEWHERE,
)
_DEPTH_TRIGGERS = {depth: _done_trigger(depth) for depth in range(1, MAX_BATCH_DEPTH + 1)}


def _triggers(b: Builder, n: Names, parts: Sequence[BatchPart], *, local: bool) -> None:
    """The triggers the batches of a write need, made with their first write (if missing):
    those of their depth and above, and the one that publishes their callbacks where they
    go. So a statement that counts in batches compiles only the triggers of the batches a
    queue has: those of batches within batches only where it nests, those of another
    topology's callbacks never."""
    deepest = max((part.spec.depth for part in parts if part.create), default=0)
    if not deepest:
        return
    b.add((_FINISHED_HERE if local else _FINISHED_ELSEWHERE)(n))
    for depth in range(1, deepest + 1):
        b.add(_DEPTH_TRIGGERS[depth](n))


TABLES: tuple[Sql, ...] = (
    _BATCHES,
    # Those not done (stats: the open batches; and each trigger's own row).
    Sql("CREATE INDEX {batches_open} ON {batches} (id) WHERE done_at IS NULL"),
    # Those done, to be forgotten after their keep.
    Sql("CREATE INDEX {batches_expiry} ON {batches} (expires_at) WHERE expires_at IS NOT NULL"),
    # The listing, in creation order whatever the shard (an id's last 32 characters).
    Sql("CREATE INDEX {batches_order} ON {batches} (substr(id, -32))"),
    _SOURCES,
    _CALLBACK_TABLE,
    Sql("ALTER TABLE {messages} ADD COLUMN batch TEXT"),
    # The outbox: a message's batch (counted already, on the batch's shard), and the counts
    # of settlements sent to the shard of their batch (`counts`: then the row is no message).
    Sql("ALTER TABLE {outbox} ADD COLUMN batch TEXT"),
    Sql("ALTER TABLE {outbox} ADD COLUMN counts TEXT"),
)
"""The tables and indexes of batches (a step of schema.MIGRATIONS; their triggers are made
with the first batch that needs them: `_triggers`)."""
SHAPE = {
    "batches": frozenset(
        {"id", "parent", "depth", "open", "writes", "written", "total", "pending", "succeeded"}
        | {"failed", "cancelled", "failures", "aborted", "local", "keep", "created_at"}
        | {"done_at", "expires_at", "stamp"}
    ),
    "batch_callbacks": frozenset(
        {"batch", "k", "group_id", "event", "priority", "delay", "ttl", "tenant", "resolved"}
        | {"headers"}
    ),
    "batch_sources": frozenset({"source", "last_id"}),
}
"""The columns of the batches' own tables (schema.SHAPE)."""

PRUNE = (
    Sql(
        """
        DELETE FROM {batch_callbacks} WHERE batch IN (
          SELECT id FROM {batches} WHERE expires_at < :now)
        """
    ),
    Sql("DELETE FROM {batches} WHERE expires_at < :now"),
)
"""Forget the batches done longer ago than their keep (with the rounds' other pruning)."""
OPEN_COUNT = Sql("(SELECT count(*) FROM {batches} WHERE done_at IS NULL)")
"""The batches not done (a column of `stats`)."""

# ------------------------------------------------------------------------ settlements


class Settled(NamedTuple):
    """A settlement of a message of a batch: its lease (seq, group, token, as `Held`: it
    counts only if the lease holds), how (BACK, ACKED, FAILED), why (a failure's reason), and
    how many of its follow-ups join its batch."""

    seq: int
    group_id: str
    token: str
    kind: int
    reason: str | None
    joined: int


SETTLED = Fields("j", Settled._fields)


# Each batch of the settled messages (read from their rows: the lease's word is not taken for
# it) and what it gains and loses, from the settlements whose lease holds: a message
# cancelled while leased counts as cancelled (and a lease given back counts only then). The
# simpler statement where no settlement of the round failed or gave back and none of their
# follow-ups joins.
@functools.cache
def _settled_counts(failures: bool, joins: bool) -> Sql:
    failed = Sql(
        """
        sum({j.kind} = {acked} AND m.cancel IS NULL) ok,
        sum({j.kind} = {failed} AND m.cancel IS NULL) bad,
        json_group_array(json_array(m.group_id, m.seq, substr({j.reason}, 1, {reason}), '',
          NULL)) FILTER (WHERE {j.kind} = {failed} AND m.cancel IS NULL) f
        """,
        j=SETTLED,
        acked=str(ACKED),
        failed=str(FAILED),
        reason=str(MAX_BATCH_REASON),
    )
    return Sql(
        """
        SELECT m.batch i, count(*) n, {failed}, sum(m.cancel IS NOT NULL) gone, {added} added
        FROM json_each(:settled) j
        JOIN {groups} g ON g.group_id = {j.group_id} AND g.token = {j.token} AND g.head = {j.seq}
        JOIN {messages} m ON m.seq = g.head
        WHERE m.batch IS NOT NULL AND ({j.kind} <> {back} OR m.cancel IS NOT NULL)
        GROUP BY m.batch
        """,
        j=SETTLED,
        back=str(BACK),
        failed=failed if failures else "sum(m.cancel IS NULL) ok, 0 bad, '[]' f",
        added=Sql("sum({j.joined})", j=SETTLED) if joins else "0",
    )


# A batch's first failures, then the new ones, the first MAX_BATCH_FAILURES kept.
_FAILURES = Sql(
    """
    iif(x.bad > 0 AND json_array_length(b.failures) < {most}, (
      SELECT json_group_array(json(value)) FROM (
        SELECT value FROM json_each(b.failures) UNION ALL SELECT value FROM json_each(x.f)
        LIMIT {most})),
      b.failures)
    """,
    most=str(MAX_BATCH_FAILURES),
)
_COUNTED = """
    UPDATE {batches} AS b SET pending = b.pending - x.n + x.added, total = b.total + x.added,
      succeeded = b.succeeded + x.ok, failed = b.failed + x.bad,
      cancelled = b.cancelled + x.gone, failures = {failures}, stamp = :now
    FROM ({counts}) x WHERE b.id = x.i
    """
# Only what an ack changes (the round's common case: the cheapest statement to compile).
_ACKED = """
    UPDATE {batches} AS b SET pending = b.pending - x.n, succeeded = b.succeeded + x.ok,
      cancelled = b.cancelled + x.n - x.ok, stamp = :now
    FROM ({counts}) x WHERE b.id = x.i
    """
# The same counts of batches that do not live here, to their shard through the outbox.
_SENT = """
    INSERT INTO {outbox} (group_id, event, priority, due, created_at, counts)
    SELECT '', '', 0, 0, :now, json_array(x.i, x.added - x.n, x.added, x.ok, x.bad, x.gone,
      json(x.f))
    FROM ({counts}) x WHERE NOT EXISTS (SELECT 1 FROM {batches} WHERE id = x.i) ORDER BY x.i
    """


# The batches of acked messages alone (the round's common case), from their leases grouped
# by token (`{token: [seq, ...]}`: each value a plain number, which SQLite reads without
# parsing an item per field: 2.4x cheaper than the items' form for 128 leases).
_ACKED_COUNTS = Sql(
    """
    SELECT m.batch i, count(*) n, sum(m.cancel IS NULL) ok
    FROM json_each(:held) t, json_each(t.value) s
    JOIN {messages} m ON m.seq = s.value
    JOIN {groups} g ON g.group_id = m.group_id AND g.head = m.seq AND g.token = t.key
    WHERE m.batch IS NOT NULL GROUP BY m.batch
    """
)


@functools.cache
def _settled_here(failures: bool, joins: bool) -> Sql:
    if not failures and not joins:
        return Sql(_ACKED, counts=_ACKED_COUNTS)
    counts = _settled_counts(failures, joins)
    return Sql(_COUNTED, counts=counts, failures=_FAILURES if failures else "b.failures")


@functools.cache
def _settled_elsewhere(failures: bool, joins: bool) -> Sql:
    return Sql(_SENT, counts=_settled_counts(failures, joins))


def count_settled(
    b: Builder, n: Names, settled: Sequence[Settled], now: float, *, sharded: bool
) -> None:
    """Count settlements in their batches, in their own transaction (placed before the
    settlements change the leases: a resend after the first send applied finds the leases
    gone and counts nothing again). On shards, the counts of batches that live elsewhere go to
    the outbox."""
    if not settled:
        return
    failures = any(s.kind != ACKED for s in settled)  # (or given back)
    joins = any(s.joined for s in settled)
    params = {"settled": as_json(settled), "now": now}
    if not failures and not joins:
        held: dict[str, list[int]] = {}
        for seq, _, token, *_rest in settled:
            held.setdefault(token, []).append(seq)
        b.add(_settled_here(False, False)(n), {"held": as_json(held), "now": now})
    else:
        b.add(_settled_here(failures, joins)(n), params)
    if sharded:
        b.add(_settled_elsewhere(failures, joins)(n), params, slot="batches_sent")


# A group's messages cancelled (`cancel_group`): each batch of theirs loses them, cancelled.
_GROUP_COUNTS = Sql(
    """
    SELECT batch i, count(*) n, 0 ok, 0 bad, count(*) gone, 0 added, '[]' f
    FROM {messages} WHERE group_id = {text.g} AND batch IS NOT NULL GROUP BY batch
    """
)
_GROUP_HERE = Sql(_COUNTED, counts=_GROUP_COUNTS, failures="b.failures")
_GROUP_ELSEWHERE = Sql(_SENT, counts=_GROUP_COUNTS)


def count_cancelled_group(
    b: Builder, n: Names, group_id: str, now: float, *, sharded: bool
) -> None:
    """Before a group's messages are cancelled: counted so in their batches."""
    params = {"g": json.dumps(group_id), "now": now}
    b.add(_GROUP_HERE(n), params)
    if sharded:
        b.add(_GROUP_ELSEWHERE(n), params, slot="batches_sent")


# A queued message cancelled (`cancel()`, jobs.py: `queued`, its condition): its batch loses
# it, cancelled.
@functools.cache
def _cancelled_queued(queued: Sql) -> tuple[Sql, Sql]:
    counts = Sql(
        """
        SELECT batch i, count(*) n, 0 ok, 0 bad, count(*) gone, 0 added, '[]' f
        FROM {messages} m WHERE {queued} AND batch IS NOT NULL GROUP BY batch
        """,
        queued=queued,
    )
    return Sql(_COUNTED, counts=counts, failures="b.failures"), Sql(_SENT, counts=counts)


def count_cancelled_message(
    b: Builder, n: Names, queued: Sql, params: Mapping[str, Any], *, sharded: bool
) -> None:
    """Before a queued message is removed (`queued`: the condition, over `m`, that picks it):
    counted so in its batch (on shards, one of a batch elsewhere through the outbox). A resend
    finds it gone and counts nothing again."""
    here, elsewhere = _cancelled_queued(queued)
    b.add(here(n), params)
    if sharded:
        b.add(elsewhere(n), params, slot="batches_sent")


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
      tenant, resolved, headers)
    SELECT {text.b}, k, g, event, priority, delay, ttl, tenant,
      coalesce(tenant, iif(i > 1, substr(g, 1, i - 1), '')), headers
    FROM (
      SELECT {j.k} k, {j.group_id} g, {j.event} event, {j.priority} priority, {j.due} delay,
        {j.expires} ttl, {j.tenant} tenant, {j.headers} headers,
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
    _triggers(b, n, write.parts, local=local)
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


# --------------------------------------------------------------- counts from other shards


@dataclass(frozen=True, slots=True)
class Counts:
    """A settlement's counts for a batch of another shard, as its outbox row carries them."""

    batch: str
    pending: int
    total: int
    succeeded: int
    failed: int
    cancelled: int
    failures: list[list[Any]]

    @classmethod
    def stored(cls, text: str) -> Counts:
        b, pending, total, ok, bad, gone, failures = json.loads(text)
        return cls(str(b), int(pending), int(total), int(ok), int(bad), int(gone), failures or [])


DELTA = Fields("j", ("id", "batch", "pending", "total", "succeeded", "failed", "cancelled", "f"))
# The counts of `:source`'s outbox rows after the last one applied from it, by batch, each
# failure with its shard; then the last row applied.
_APPLIED = Sql(
    """
    UPDATE {batches} AS b SET pending = b.pending + x.p, total = b.total + x.t,
      succeeded = b.succeeded + x.ok, failed = b.failed + x.bad,
      cancelled = b.cancelled + x.gone, failures = {failures}, stamp = :now
    FROM (
      SELECT {j.batch} i, sum({j.pending}) p, sum({j.total}) t, sum({j.succeeded}) ok,
        sum({j.failed}) bad, sum({j.cancelled}) gone, (
          SELECT json_group_array(json_set(e.value, '$[3]', :source))
          FROM json_each(:counts) k, json_each(json_extract(k.value, '$[7]')) e
          WHERE json_extract(k.value, '$[1]') = {j.batch} AND json_extract(k.value, '$[0]') > (
            SELECT coalesce(max(last_id), 0) FROM {batch_sources} WHERE source = :source)) f
      FROM json_each(:counts) j
      WHERE {j.id} > (
        SELECT coalesce(max(last_id), 0) FROM {batch_sources} WHERE source = :source)
      GROUP BY {j.batch}) x
    WHERE b.id = x.i
    """,
    j=DELTA,
    failures=_FAILURES,
)
_LAST_APPLIED = Sql(
    """
    INSERT INTO {batch_sources} (source, last_id) VALUES (:source, :last)
    ON CONFLICT (source) DO UPDATE SET last_id = max(last_id, excluded.last_id)
    """
)


def apply_plan(core: QueueCore, source: str, rows: Sequence[tuple[int, Counts]]) -> Plan[None]:
    """Apply the counts that shard `source`'s outbox rows carry (in id order) to their
    batches here: those after the last row applied from it, once each."""
    n = core.names
    b = Builder()
    counts = [
        [row_id, c.batch, c.pending, c.total, c.succeeded, c.failed, c.cancelled, c.failures]
        for row_id, c in rows
    ]
    params = {"counts": as_json(counts), "source": source, "now": core.now()}
    b.add(_APPLIED(n), params)
    b.add(_LAST_APPLIED(n), {"source": source, "last": max(row_id for row_id, _ in rows)})
    return Plan(b.build(), lambda reply: None, resend_safe=True)


# ------------------------------------------------------------------------------ reading

_COLUMNS = """
    id, open, done_at, total, pending, succeeded, failed, cancelled, failures, parent,
    aborted, created_at, expires_at
    """
_STATUS = Sql("SELECT " + _COLUMNS + " FROM {batches} WHERE id = {text.b}")


@functools.cache
def _listing(state: str | None) -> Sql:
    where = {
        None: "",
        "open": "AND open = 1 AND done_at IS NULL",
        "closed": "AND open = 0 AND done_at IS NULL",
        "done": "AND done_at IS NOT NULL",
    }[state]
    return Sql(
        "SELECT "
        + _COLUMNS
        + " FROM {batches} WHERE substr(id, -32) > :after {where} ORDER BY substr(id, -32) "
        "LIMIT :n",
        where=where,
    )


def _status(row: Sequence[Any], shard: str = "") -> BatchStatus:
    (
        batch_id,
        open_,
        done_at,
        total,
        pending,
        ok,
        bad,
        gone,
        failures,
        parent,
        aborted,
        created_at,
        expires_at,
    ) = row
    batch_id = str(batch_id)
    home = batch_shard(batch_id)
    return BatchStatus(
        id=batch_id,
        open=bool(open_) and done_at is None,
        done=done_at is not None,
        total=int(total),
        pending=int(pending),
        succeeded=int(ok),
        failed=int(bad),
        cancelled=int(gone),
        failures=tuple(
            BatchFailure(str(f[0]), int(f[1]), str(f[2]), str(f[3] or home), f[4] or None)
            for f in json.loads(failures or "[]")
        ),
        parent=None if parent is None else str(parent),
        aborted=None if aborted is None else str(aborted),
        created_at=float(created_at),
        done_at=None if done_at is None else float(done_at),
        kept_until=None if expires_at is None else float(expires_at),
        shard=home,
    )


def status_plan(core: QueueCore, batch_id: object, *, sharded: bool) -> Plan[BatchStatus | None]:
    """One batch (a read)."""
    checked = check_batch_id(batch_id, sharded=sharded)
    core.now()
    b = Builder(write=False)
    b.add(_STATUS(core.names), {"b": json.dumps(checked)}, slot="batch")

    def read(reply: Reply) -> BatchStatus | None:
        rows = reply["batch"].rows
        return _status(rows[0]) if rows else None

    return Plan(b.build(), read, resend_safe=True)


def list_plan(
    core: QueueCore, *, state: object, limit: object, after: object
) -> Plan[list[BatchStatus]]:
    """A page of the batches, oldest first (a read)."""
    chosen = check_state(state)
    check_int(limit, "limit", 1, MAX_BATCH)
    cursor = ""
    if after is not None:
        check_id(after, "after")
        cursor = str(after)[-32:]
    core.now()
    b = Builder(write=False)
    b.add(_listing(chosen)(core.names), {"after": cursor, "n": limit}, slot="batches")

    def read(reply: Reply) -> list[BatchStatus]:
        return [_status(row) for row in reply["batches"].rows]

    return Plan(b.build(), read, resend_safe=True)
