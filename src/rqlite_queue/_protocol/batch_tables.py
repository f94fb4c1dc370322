"""The tables of batches (a step of `schema.MIGRATIONS`), the triggers that finish a batch in
the statement that settles its last message (publishing its callbacks, settling it in its
parent), and the statements that forget done batches and count the open ones."""

from __future__ import annotations

from ..types import BATCH_HEADER, MAX_BATCH_DEPTH, MAX_BATCH_FAILURES
from .names import Names, Sql
from .plan import Builder

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
# queue's tenant rule applied when the batch was made); since v9 (schema.py), `keep`: how long
# its outcome is kept (NULL: not kept).
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
    INSERT INTO {messages} (group_id, event, published_at, due, expires, headers, keep)
    SELECT c.group_id, c.event, NEW.stamp, {due}, NEW.stamp + c.ttl, {headers}, c.keep
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
    INSERT INTO {outbox} (group_id, event, priority, due, expires, tenant, created_at, headers,
      keep)
    SELECT c.group_id, c.event, c.priority, {due}, NEW.stamp + c.ttl, c.tenant, NEW.stamp,
      {headers}, c.keep
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
FINISHING = {
    "batches_finished_here": _FINISHED_HERE,
    "batches_finished_elsewhere": _FINISHED_ELSEWHERE,
}
"""The triggers that publish a done batch's callbacks, by their names' fields in `Names` (a
database has the one of its topology, once it has had a batch): what an upgrade that changes
their text makes again (schema.py)."""


def triggers(b: Builder, n: Names, deepest: int, *, local: bool) -> None:
    """The triggers the batches a write makes need (`deepest`: the depth of the deepest of
    them; 0: it makes none), made with their first write (if missing): those of their depth
    and above, and the one that publishes their callbacks where they go. So a statement that
    counts in batches compiles only the triggers of the batches a queue has: those of batches
    within batches only where it nests, those of another topology's callbacks never."""
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
with the first batch that needs them: `triggers`)."""
SHAPE = {
    "batches": frozenset(
        {"id", "parent", "depth", "open", "writes", "written", "total", "pending", "succeeded"}
        | {"failed", "cancelled", "failures", "aborted", "local", "keep", "created_at"}
        | {"done_at", "expires_at", "stamp"}
    ),
    "batch_callbacks": frozenset(
        {"batch", "k", "group_id", "event", "priority", "delay", "ttl", "tenant", "resolved"}
        | {"headers", "keep"}
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
