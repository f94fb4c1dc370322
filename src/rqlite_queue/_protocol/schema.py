"""The queue's tables: their creation, their migrations, the schema fence, and the setup that
opens a queue (`setup`).

Tables, per queue (`rq_<queue>_` prefix):

- `meta`: key/value integers: `schema_version`; `turn`, the claim counter; `mark`, the last
  seq given before the publish under way (so the publish finds its own rows by a key range);
  `expired`, how many messages expired; `vtime`, `tenant_sep`, `tenants` (tenants.py);
  `shard_epoch` (a sharded queue's shard list, shard_tables.py).
- `messages`: one row per queued message; `seq` is the FIFO order and the lease's handle;
  `due`: not delivered before (0: at once); `expires`: dead-lettered instead of delivered
  after (NULL: never); `debounce` and `due_by` (a debounced publish's key and bound);
  `headers`.
- `groups`: one row per group. It carries the group's whole state, so that claim never looks at
  the messages of groups it does not take: `ready`, `parked`, `held` and `until` encode its
  state (`group_states`: ready, leased, parked, delayed, empty; held, waiting). An empty
  group's row is kept until `until`, so a group refilled soon after rejoins the round robin
  where it left it, instead of going first as a never-claimed group would. `token` and
  `head`: the lease that holds, or last held, the group, and the seq it was given (the
  fencing check); `attempts`: claims of the current head; `turn`: the claim counter at its
  last claim (0 = never claimed: the round-robin key); `tenant`.
- `dead`: dead-lettered messages.
- `dedup`: publish ids seen within the dedup window.
- `claims`: the tokens of recent claims (a claim applies at most once, however late); and
  marks that every claim finds with the lookup of its own token: while an operator has
  paused the queue, the row of the empty token (a real token is never empty); once tenants
  are on, the row of token '*'.
- `schedules`: periodic jobs: what to publish, how often, and when next.
- `settled`: the leases settled recently (token, seq, and how: acked, dead-lettered or given
  back), written in the transaction of the settlement itself: a settlement sent again after
  its reply was lost finds its own record, and so tells "this lease's settlement applied" from
  "the lease went to another holder". Kept RETIRE_WINDOW, pruned like the claim tokens.
- `outbox`: on a sharded queue, the follow-ups of a settlement (messages published with it)
  whose group lives on another shard: written in the settlement's transaction, forwarded to
  their shard with a dedup id made from their id, then deleted.
- `tenants`: each tenant's weight, virtual time, limits and claimable groups (tenants.py).
- `outcomes`: the outcome of each settled message that keeps it (`messages.keep`: seconds),
  written in its settlement's own statement by the trigger `messages_kept` (an ack, a dead
  letter, an expiry, a cancel: the deletion of the message), kept until `expires_at`, pruned
  with the claim tokens (jobs.py). While queued, a message that keeps its outcome keeps what
  the outcome will carry: the errors and holders of its earlier attempts (`errors`,
  `workers`: the trigger `groups_holders` adds a holder whose lease ends otherwise than by
  its settlement), its last progress. `messages.cancel`: a cancel's reason, for a message
  cancelled while leased (its settlement then settles it as cancelled).

`setup` runs `bootstrap` (creates `meta` if missing and reads the version: 0 for a new
database), then, if the version is older than this code's, `create` (version 0) or `migrate`
(1 .. SCHEMA_VERSION - 1): one write transaction that first checks the version is still the
one it read, so of several clients racing, exactly one upgrades and the others' batches fail
and roll back; they read the version again and find it current. A schema change is a new
step in MIGRATIONS (and SCHEMA_VERSION raised, SHAPE told), tested from a real older database
(tests/migration)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import BackendError, OutcomeUnknown, SchemaError
from .batch_tables import FINISHING, TABLES
from .batch_tables import SHAPE as BATCH_TABLES
from .core import QueueCore
from .names import Names, Sql, as_json
from .plan import Batch, Builder, Plan, Reply, Statement, Steps
from .tenants import BOUNDED, MARK, turn_on

SCHEMA_VERSION = 9
RETIRE_WINDOW = 300.0
"""How long the row of a group that emptied is kept (its place in the round robin), and how
long claim tokens and settlement records are remembered."""
UPGRADE_ATTEMPTS = 5

_MESSAGES = Sql(
    """
    CREATE TABLE {messages} (
      seq          INTEGER PRIMARY KEY AUTOINCREMENT,
      group_id     TEXT NOT NULL,
      event        TEXT NOT NULL,
      published_at REAL NOT NULL,
      dedup_id     TEXT,
      due          REAL NOT NULL DEFAULT 0,
      expires      REAL
    )
    """
)
# A group's head is min(seq) for its group_id: one index probe.
_MESSAGES_BY_GROUP = Sql("CREATE INDEX {messages_by_group} ON {messages} (group_id, seq)")
_GROUPS = Sql(
    """
    CREATE TABLE {groups} (
      group_id TEXT PRIMARY KEY,
      priority INTEGER NOT NULL,
      turn     INTEGER NOT NULL DEFAULT 0,
      ready    INTEGER NOT NULL DEFAULT 1,
      until    REAL    NOT NULL DEFAULT 0,
      parked   INTEGER NOT NULL DEFAULT 0,
      attempts INTEGER NOT NULL DEFAULT 0,
      token    TEXT,
      head     INTEGER,
      held     INTEGER NOT NULL DEFAULT 0
    )
    """
)
_DEAD = Sql(
    """
    CREATE TABLE {dead} (
      seq          INTEGER PRIMARY KEY,
      group_id     TEXT NOT NULL,
      event        TEXT NOT NULL,
      priority     INTEGER NOT NULL,
      attempts     INTEGER NOT NULL,
      reason       TEXT NOT NULL,
      published_at REAL NOT NULL,
      dead_at      REAL NOT NULL
    )
    """
)
_DEDUP = (
    Sql(
        """
        CREATE TABLE {dedup} (dedup_id TEXT PRIMARY KEY, seq INTEGER NOT NULL,
          expires_at REAL NOT NULL)
        """
    ),
    # Pruning expired publish ids touches only those.
    Sql("CREATE INDEX {dedup_expiry} ON {dedup} (expires_at)"),
)
_GROUPS_INDEXES = (
    # Claim: the claimable groups, least recently claimed first (ties: the rowid, i.e.
    # creation order); all of them (no priority floor), or those of one priority (one probe
    # per level >= min_priority). Two small indexes rather than one statement long enough
    # (>= 1 KiB) for rqlite to gzip every claim on every node.
    Sql("CREATE INDEX {groups_ready} ON {groups} (turn) WHERE {claimable}"),
    Sql("CREATE INDEX {groups_ready_by_priority} ON {groups} (priority, turn) WHERE {claimable}"),
    # Claim: leases and parks whose deadline passed; and the groups a claim just took.
    Sql("CREATE INDEX {groups_busy} ON {groups} (until) WHERE {busy}"),
    # Pruning the rows of groups that emptied more than RETIRE_WINDOW ago.
    Sql("CREATE INDEX {groups_empty} ON {groups} (until) WHERE {empty}"),
)
# The tokens of recent claims: a claim whose first send was held up (by a frozen node, say) and
# applies after its resend must not take groups for a token nobody holds any more.
_CLAIMS = (
    Sql("CREATE TABLE {claims} (token TEXT PRIMARY KEY, expires_at REAL NOT NULL)"),
    Sql("CREATE INDEX {claims_expiry} ON {claims} (expires_at)"),
)
# `every` (seconds) or `cron` (an expression, UTC): one of them. `next_at`: the tick to publish
# next; firing it moves `next_at` on with a compare-and-set, so a tick is published once
# however many clients race for it.
_SCHEDULES = (
    Sql(
        """
        CREATE TABLE {schedules} (name TEXT PRIMARY KEY, group_id TEXT NOT NULL,
          event TEXT NOT NULL, priority INTEGER NOT NULL, every REAL, cron TEXT,
          catch_up INTEGER NOT NULL, next_at REAL NOT NULL, created_at REAL NOT NULL)
        """
    ),
    Sql("CREATE INDEX {schedules_due} ON {schedules} (next_at)"),
)
ACKED, DEAD_LETTERED, GIVEN_BACK, CANCELLED, EXPIRED = 1, 2, 3, 4, 5
"""How a lease was settled (`settled.kind`; a settlement sent again must be the same one to
find its record: an ack does not succeed on a lease that was nacked). CANCELLED: a queued
message removed by a cancel (recorded with the empty token); EXPIRED: a lease taken on a
message whose ttl had passed, dead-lettered as expired."""
# `kind`: ACKED ... EXPIRED (since v7; before, the first three); `result`, `reason`, `error`:
# what the outcome of a message that keeps it takes from its settlement (v7).
_SETTLED = (
    Sql(
        """
        CREATE TABLE {settled} (token TEXT NOT NULL, seq INTEGER NOT NULL,
          kind INTEGER NOT NULL, expires_at REAL NOT NULL, PRIMARY KEY (token, seq))
        WITHOUT ROWID
        """
    ),
    Sql("CREATE INDEX {settled_expiry} ON {settled} (expires_at)"),
)
# Forwarded in id order (the primary key: no other index), so a group's follow-ups reach their
# shard in the order they were written.
_OUTBOX = Sql(
    """
    CREATE TABLE {outbox} (id INTEGER PRIMARY KEY AUTOINCREMENT, group_id TEXT NOT NULL,
      event TEXT NOT NULL, priority INTEGER NOT NULL, dedup_id TEXT, due REAL NOT NULL,
      expires REAL, created_at REAL NOT NULL)
    """
)

SUCCEEDED, FAILED, OUTCOME_CANCELLED, OUTCOME_EXPIRED = 1, 2, 3, 4
OUTCOME_STATUSES = {
    SUCCEEDED: "succeeded",
    FAILED: "failed",
    OUTCOME_CANCELLED: "cancelled",
    OUTCOME_EXPIRED: "expired",
}
"""`outcomes.status`, and what `JobResult.status` calls it."""
MAX_KEPT_ERRORS = 16
"""Most errors a message keeps (its last attempts'): `types.MAX_ERRORS`."""


def errors_after(errors: str, error: str | Sql) -> Sql:
    """The JSON array of errors `errors` (NULL: none) with `error` (a JSON object, or NULL:
    none) after them, the last MAX_KEPT_ERRORS."""
    return Sql(
        """
        CASE WHEN {error} IS NULL THEN {errors}
        WHEN json_array_length(coalesce({errors}, '[]')) >= {most}
        THEN json_insert(json_remove({errors}, '$[0]'), '$[#]', json({error}))
        ELSE json_insert(coalesce({errors}, '[]'), '$[#]', json({error})) END
        """,
        errors=errors,
        error=error,
        most=str(MAX_KEPT_ERRORS),
    )


# The outcomes of settled messages that keep theirs (`messages.keep`), pruned through the
# index on `expires_at`.
_OUTCOMES = (
    Sql(
        """
        CREATE TABLE {outcomes} (
          seq          INTEGER PRIMARY KEY,
          group_id     TEXT NOT NULL,
          status       INTEGER NOT NULL,
          event        TEXT NOT NULL,
          headers      TEXT,
          result       TEXT,
          reason       TEXT,
          errors       TEXT,
          progress     TEXT,
          attempts     INTEGER NOT NULL,
          workers      TEXT,
          holder       TEXT,
          published_at REAL NOT NULL,
          started_at   REAL,
          finished_at  REAL NOT NULL,
          expires_at   REAL NOT NULL
        )
        """
    ),
    Sql("CREATE INDEX {outcomes_expiry} ON {outcomes} (expires_at)"),
)
# The deletion of a message that keeps its outcome (by the settlement that removes it: an ack,
# a dead letter, an expiry, a cancel) writes its outcome, in that very statement: no statement
# of its own, no Raft entry of its own. Its status comes from the settlement's record, found
# by the lease's token (`s`), or by the empty token of a cancel of a queued message (`c`; two
# joins by the whole key: `token IN (g.token, '')` made the trigger twice as slow); no record:
# its group was cancelled (`cancel_group`: its dead letter has the reason). A message cancelled
# while leased (`cancel`) is cancelled whatever its settlement. The lease's end (`finished_at`)
# is its record's time (`expires_at` less RETIRE_WINDOW) or its dead letter's.
_FINISHED_AT = Sql(
    "coalesce(coalesce(s.expires_at, c.expires_at) - {retire}, d.dead_at, old.published_at)",
    retire=repr(RETIRE_WINDOW),
)
_KEPT = Sql(
    """
    CREATE TRIGGER {messages_kept} AFTER DELETE ON {messages} WHEN old.keep IS NOT NULL BEGIN
    INSERT INTO {outcomes} (seq, group_id, status, event, headers, result, reason, errors,
      progress, attempts, workers, holder, published_at, started_at, finished_at, expires_at)
    SELECT old.seq, old.group_id,
      CASE WHEN old.cancel IS NOT NULL THEN {cancelled} WHEN s.kind = {acked} THEN {succeeded}
        WHEN s.kind = {dead_lettered} THEN {failed} WHEN s.kind = {expired} THEN {outcome_expired}
        ELSE {cancelled} END,
      old.event, old.headers, iif(s.kind = {acked}, s.result, NULL),
      coalesce(old.cancel, s.reason, c.reason, d.reason), {errors}, old.progress,
      iif(g.head = old.seq, g.attempts, 0), old.workers, iif(g.head = old.seq, g.token, NULL),
      old.published_at,
      iif(g.head = old.seq, (SELECT at FROM {claims} WHERE token = g.token), NULL),
      {finished_at}, {finished_at} + old.keep
    FROM {groups} g
      LEFT JOIN {settled} s ON s.token = g.token AND s.seq = old.seq
      LEFT JOIN {settled} c ON c.token = '' AND c.seq = old.seq
      LEFT JOIN {dead} d ON d.seq = old.seq
    WHERE g.group_id = old.group_id;
    END
    """,
    cancelled=str(OUTCOME_CANCELLED),
    acked=str(ACKED),
    succeeded=str(SUCCEEDED),
    dead_lettered=str(DEAD_LETTERED),
    failed=str(FAILED),
    expired=str(EXPIRED),
    outcome_expired=str(OUTCOME_EXPIRED),
    errors=errors_after("old.errors", "s.error"),
    finished_at=_FINISHED_AT,
)
# A lease of a kept message that ends otherwise than by a settlement that removes it (a nack,
# a lapse taken over by another claim: its token replaced while its group keeps its head)
# adds its token to the message's holders.
_HOLDERS = Sql(
    """
    CREATE TRIGGER {groups_holders} AFTER UPDATE OF token ON {groups}
    WHEN old.token IS NOT NULL AND new.head IS NOT NULL AND new.token IS NOT old.token BEGIN
    UPDATE {messages} SET workers = json_insert(coalesce(workers, '[]'), '$[#]', old.token)
    WHERE seq = new.head AND keep IS NOT NULL;
    END
    """
)
OUTCOMES_TABLES = (*_OUTCOMES, _KEPT, _HOLDERS)

# Each step takes a database from the version before it to its own: its statements, in order.
MIGRATIONS: dict[int, tuple[Sql, ...]] = {
    # v1 -> v2: the `retired` table becomes empty rows of `groups`; `held` (operators' holds);
    # `dedup_id` on messages and the `mark` (a publish of many deduplicated messages in a
    # fixed number of statements); `claims` (a claim applies at most once, even late); `due`
    # and `expires` on messages (delayed messages, expiry); `schedules` (periodic jobs).
    2: (
        Sql("ALTER TABLE {messages} ADD COLUMN dedup_id TEXT"),
        Sql("ALTER TABLE {messages} ADD COLUMN due REAL NOT NULL DEFAULT 0"),
        Sql("ALTER TABLE {messages} ADD COLUMN expires REAL"),
        Sql("ALTER TABLE {groups} ADD COLUMN held INTEGER NOT NULL DEFAULT 0"),
        Sql(
            """
            INSERT OR IGNORE INTO {groups} (group_id, priority, turn, ready, until)
            SELECT group_id, 0, turn, {EMPTY.ready}, expires_at FROM {retired}
            """
        ),
        Sql("DROP TABLE {retired}"),
        Sql("DROP INDEX {groups_ready}"),
        Sql("DROP INDEX {groups_ready_by_priority}"),
        Sql("DROP INDEX {groups_busy}"),
        *_GROUPS_INDEXES,
        Sql("INSERT OR IGNORE INTO {meta} (key, value) VALUES ('mark', 0), ('expired', 0)"),
        *_CLAIMS,
        *_SCHEDULES,
    ),
    # v2 -> v3: `settled` (a settlement's outcome known exactly after a lost reply) and
    # `outbox` (a sharded settlement's follow-ups to other shards). v2 clients keep working
    # on a v3 queue: they write no records and need none, and publish no follow-ups.
    3: (*_SETTLED, _OUTBOX),
    # v3 -> v4: tenants (tenants.py). Each group belongs to a tenant (`groups.tenant`, '' the
    # default); `tenants` holds each tenant's weight, its virtual time `vt` and, once tenants
    # are on, `ready`. `meta.vtime`: the queue's virtual time (the latest due time served);
    # `meta.tenant_sep`: the code point of the character whose first occurrence ends a group
    # id's tenant part (0: none). Also a `tenant` column on the outbox.
    4: (
        Sql("ALTER TABLE {groups} ADD COLUMN tenant TEXT NOT NULL DEFAULT ''"),
        Sql("ALTER TABLE {outbox} ADD COLUMN tenant TEXT"),
        Sql(
            """
            CREATE TABLE {tenants} (name TEXT PRIMARY KEY, weight REAL NOT NULL DEFAULT 1,
              vt REAL NOT NULL DEFAULT 0, ready INTEGER NOT NULL DEFAULT 0)
            """
        ),
        Sql("CREATE INDEX {tenants_ready} ON {tenants} (vt) WHERE ready > 0"),
        Sql("INSERT INTO {tenants} (name) VALUES ('')"),
        Sql(
            """
            INSERT OR IGNORE INTO {meta} (key, value) VALUES ('vtime', 0), ('tenant_sep', 0),
              ('tenants', 0)
            """
        ),
    ),
    # v4 -> v5: limits per tenant and debounce. A tenant's cap on groups in flight (`cap`,
    # NULL: none), its rate limit, a token bucket (`rate` per second, NULL: none; `burst`;
    # `tokens` left at time `stamp`), its bounds on queued messages (`max_queued` in all,
    # `max_group_queued` in each of its groups; NULL: none). A message's `debounce` key (a
    # publish with the same key replaces it while it is unclaimed) and `due_by`, the latest
    # its due time may move to (the first publish of the run plus its `max_wait`).
    5: (
        *(
            Sql(f"ALTER TABLE {{tenants}} ADD COLUMN {column}")
            for column in (
                "cap INTEGER",
                "rate REAL",
                "burst REAL",
                "tokens REAL NOT NULL DEFAULT 0",
                "stamp REAL NOT NULL DEFAULT 0",
                "max_queued INTEGER",
                "max_group_queued INTEGER",
            )
        ),
        # The rate-limited tenants (the probe looks there for the next token due).
        Sql("CREATE INDEX {tenants_rated} ON {tenants} (stamp) WHERE rate IS NOT NULL"),
        # The tenants with a bound on queued messages (a publish checks them only if there are).
        Sql("CREATE INDEX {tenants_bounded} ON {tenants} (name) WHERE {bounded}", bounded=BOUNDED),
        Sql("ALTER TABLE {messages} ADD COLUMN debounce TEXT"),
        Sql("ALTER TABLE {messages} ADD COLUMN due_by REAL"),
        Sql(
            "CREATE INDEX {messages_debounced} ON {messages} (group_id, debounce) "
            "WHERE debounce IS NOT NULL"
        ),
        MARK,
    ),
    # v5 -> v6: message headers (`headers`: a JSON object of str to str; NULL: none) on
    # messages, dead letters and the outbox. v5 clients keep working on a v6 queue: they
    # write no headers and read none.
    6: tuple(
        Sql(f"ALTER TABLE {{{table}}} ADD COLUMN headers TEXT")
        for table in ("messages", "dead", "outbox")
    ),
    # v6 -> v7: jobs. How long a message's outcome is kept (`keep`, seconds; NULL: not kept)
    # on messages, dead letters (a requeue keeps it), the outbox and schedules (their ticks);
    # a cancel's reason while it runs (`cancel`), its last progress, the errors and holders
    # of its earlier attempts (`errors`, `workers`: JSON arrays); when a claim was made
    # (`claims.at`: a lease's start, found by its token); what a settlement's record carries
    # to the outcome (`settled`: an ack's result, an attempt's error, a cancel's reason); the
    # `outcomes` and their two triggers. v6 clients are fenced out of a v7 queue (a v6
    # settlement would not write its outcome).
    7: (
        *(
            Sql(f"ALTER TABLE {{messages}} ADD COLUMN {column}")
            for column in (
                "keep REAL",
                "cancel TEXT",
                "progress TEXT",
                "errors TEXT",
                "workers TEXT",
            )
        ),
        *(
            Sql(f"ALTER TABLE {{{table}}} ADD COLUMN keep REAL")
            for table in ("dead", "outbox", "schedules")
        ),
        Sql("ALTER TABLE {claims} ADD COLUMN at REAL"),
        *(
            Sql(f"ALTER TABLE {{settled}} ADD COLUMN {column}")
            for column in ("result TEXT", "reason TEXT", "error TEXT")
        ),
        *OUTCOMES_TABLES,
    ),
    # v7 -> v8: batches (batch_tables.py): their rows (the triggers that finish them are made
    # with the first batch that needs them); a message's batch; on the outbox, a message's
    # batch and the counts sent to another shard. v7 clients are fenced out of a v8 queue (a
    # v7 settlement would not count in its message's batch).
    8: TABLES,
    # v8 -> v9: a batch's callbacks keep their outcomes (`keep`, as a publish's); the trigger
    # that publishes them is made again with the column, if the queue has one (`migrate`:
    # its text is what a database keeps). v8 clients are fenced out of a v9 queue (a v8
    # batch would publish its callbacks without their keep).
    9: (Sql("ALTER TABLE {batch_callbacks} ADD COLUMN keep REAL"),),
}

# A new queue: the tables of version 3, then the later steps (`_create`).
_CREATE_V3 = (
    _MESSAGES,
    _MESSAGES_BY_GROUP,
    _GROUPS,
    _DEAD,
    *_DEDUP,
    *_CLAIMS,
    *_SCHEDULES,
    *_GROUPS_INDEXES,
    *_SETTLED,
    _OUTBOX,
    Sql(
        "INSERT OR IGNORE INTO {meta} (key, value) VALUES ('turn', 0), ('mark', 0), ('expired', 0)"
    ),
)


def _steps(first: int) -> list[Sql]:
    """The statements of the migrations from step `first` to SCHEMA_VERSION."""
    return [sql for step in range(first, SCHEMA_VERSION + 1) for sql in MIGRATIONS[step]]


SHAPE = {
    "meta": frozenset({"key", "value"}),
    "messages": frozenset(
        {"seq", "group_id", "event", "published_at", "dedup_id", "due", "expires", "debounce"}
        | {"due_by", "headers", "keep", "cancel", "progress", "errors", "workers", "batch"}
    ),
    "groups": frozenset(
        {"group_id", "priority", "turn", "ready", "until", "parked", "attempts", "token"}
        | {"head", "held", "tenant"}
    ),
    "dead": frozenset(
        {"seq", "group_id", "event", "priority", "attempts", "reason", "published_at"}
        | {"dead_at", "headers", "keep"}
    ),
    "dedup": frozenset({"dedup_id", "seq", "expires_at"}),
    "claims": frozenset({"token", "expires_at", "at"}),
    "schedules": frozenset(
        {"name", "group_id", "event", "priority", "every", "cron", "catch_up", "next_at"}
        | {"created_at", "keep"}
    ),
    "settled": frozenset({"token", "seq", "kind", "expires_at", "result", "reason", "error"}),
    "outbox": frozenset(
        {"id", "group_id", "event", "priority", "dedup_id", "due", "expires", "created_at"}
        | {"tenant", "headers", "keep", "batch", "counts"}
    ),
    "tenants": frozenset(
        {"name", "weight", "vt", "ready", "cap", "rate", "burst", "tokens", "stamp"}
        | {"max_queued", "max_group_queued"}
    ),
    "outcomes": frozenset(
        {"seq", "group_id", "status", "event", "headers", "result", "reason", "errors"}
        | {"progress", "attempts", "workers", "holder", "published_at", "started_at"}
        | {"finished_at", "expires_at"}
    ),
    **BATCH_TABLES,
}
"""The columns of each table at SCHEMA_VERSION, by the table's name less the queue's prefix
(what `create` and `migrate` make: tests/migration checks it)."""


# ---------------------------------------------------------------------------- bootstrap

_META = Sql("CREATE TABLE IF NOT EXISTS {meta} (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
_FIRST_VERSION = Sql("INSERT OR IGNORE INTO {meta} (key, value) VALUES ('schema_version', 0)")
_VERSION = Sql("""SELECT value FROM {meta} WHERE "key" = 'schema_version'""")
_TENANTS_ON = Sql("""SELECT value FROM {meta} WHERE "key" = 'tenants'""")
# The columns of the queue's tables that exist (their names bound: `_` is a wildcard of LIKE,
# and one queue's prefix may begin another's), and whether tenants were ever turned on (their
# trigger): what a queue whose meta table lost its rows is made of.
_COLUMNS = Sql(
    """
    SELECT m.name, p.name FROM sqlite_master m JOIN pragma_table_info(m.name) p
    WHERE m.type = 'table' AND m.name IN (SELECT value FROM json_each(:tables))
    """
)
_COUNTED = Sql("SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name = :trigger")
_TRIGGERS = Sql(
    "SELECT name FROM sqlite_master WHERE type = 'trigger' "
    "AND name IN (SELECT value FROM json_each(:names))"
)


@dataclass(frozen=True, slots=True)
class Found:
    """What `bootstrap` read: the stored version (0: none), and, for a version 0, the
    columns of the queue's tables that exist and whether tenants had been turned on; the
    triggers of batch_tables.FINISHING it has (their fields' names)."""

    version: int
    columns: dict[str, frozenset[str]]
    tenants_were_on: bool
    finishing: frozenset[str] = frozenset()


def bootstrap_batch(n: Names) -> Batch:
    """Create the version record if missing and read it, and what the tables are."""
    prefix = f"rq_{n.queue}_"
    b = Builder()
    b.add(_META(n))
    b.add(_FIRST_VERSION(n))
    b.add(_VERSION(n), slot="version")
    b.add(_TENANTS_ON(n), slot="tenants_on")
    b.add(_COLUMNS(n), {"tables": as_json([prefix + table for table in SHAPE])}, slot="columns")
    b.add(_COUNTED(n), {"trigger": n.groups_in}, slot="counted")
    b.add(_TRIGGERS(n), {"names": as_json(_finishing_names(n))}, slot="finishing")
    return b.build()


def _finishing_names(n: Names) -> list[str]:
    return [getattr(n, field) for field in FINISHING]


def bootstrap(core: QueueCore, learn: Callable[[bool], None] | None = None) -> Plan[Found]:
    """`bootstrap_batch`, and what it found; `learn` is told whether the queue's tenants are
    on."""
    core.now()
    prefix = f"rq_{core.names.queue}_"

    def read(reply: Reply) -> Found:
        on = reply["tenants_on"].rows
        if learn is not None and on:
            learn(bool(on[0][0]))
        columns: dict[str, set[str]] = {}
        for table, column in reply["columns"].rows:
            columns.setdefault(str(table).removeprefix(prefix), set()).add(str(column))
        present = {str(row[0]) for row in reply["finishing"].rows}
        return Found(
            read_version(reply),
            {table: frozenset(names) for table, names in columns.items()},
            bool(reply["counted"].rows[0][0]),
            frozenset(f for f in FINISHING if getattr(core.names, f) in present),
        )

    return Plan(bootstrap_batch(core.names), read, resend_safe=True, idempotent=True)


def schema_version(core: QueueCore) -> Plan[int]:
    """The stored schema version, read only (in a transaction of the caller's own)."""
    core.now()
    b = Builder(write=False)
    b.add(_VERSION(core.names), slot="version")
    return Plan(b.build(), read_version)


def read_version(reply: Reply) -> int:
    rows = reply["version"].rows
    if not rows:
        raise ValueError("schema version missing")
    return int(rows[0][0])


# Fails the transaction (a duplicate key) unless the stored version is `:v`.
_STILL_AT = Sql(
    """
    INSERT INTO {meta} (key, value) SELECT 'schema_version', 0 WHERE NOT EXISTS (
      SELECT 1 FROM {meta} WHERE "key" = 'schema_version' AND value = :v)
    """
)
_SET_VERSION = Sql("""UPDATE {meta} SET value = :v WHERE "key" = 'schema_version'""")


def _newer(core: QueueCore, version: int) -> SchemaError:
    return SchemaError(
        f"queue {core.names.queue!r} has schema version {version}; this library knows "
        f"{SCHEMA_VERSION}: upgrade rqlite-queue"
    )


def require_current(core: QueueCore, version: int) -> None:
    """`SchemaError` unless the stored version is this code's (a publish in the caller's own
    transaction: it cannot set the tables up)."""
    if version > SCHEMA_VERSION:
        raise _newer(core, version)
    if version < SCHEMA_VERSION:
        raise SchemaError(
            f"queue {core.names.queue!r}: its tables are not set up (version {version}): "
            f"call setup() before publishing in your own transaction"
        )


def upgrade(core: QueueCore, found: Found) -> Plan[int] | None:
    """The plan that brings the tables `bootstrap` found to this code's version (None: they
    are at it)."""
    version = found.version
    if version > SCHEMA_VERSION:
        raise _newer(core, version)
    if version == SCHEMA_VERSION:
        return None
    if version > 0:
        batch = migrate(core.names, version, finishing=found.finishing)
    elif not set(found.columns) - {"meta"}:
        batch = create(core.names)
    else:
        _check_shape(core.names, found)
        batch = reopen(core.names, tenants_were_on=found.tenants_were_on)
    return Plan(batch, lambda reply: SCHEMA_VERSION)


def create(n: Names) -> Batch:
    """The tables of a new queue, at this code's version."""
    return _upgrade(n, 0, [*_CREATE_V3, *_steps(4)])


def migrate(n: Names, version: int, *, finishing: frozenset[str] = frozenset()) -> Batch:
    """Upgrade from `version` to this code's, in one transaction. `finishing`: the triggers
    of batch_tables.FINISHING the database has (bootstrap's `Found`): from v8, each is made again
    with this code's text, and the upgrade fails (to be read and tried again) if another
    client made one since bootstrap read them."""
    again = _finishing_again(n, finishing) if version < 9 else []
    return _upgrade(n, version, _steps(version + 1), again)


# Fails the transaction (a duplicate key) unless the database has `:count` of the triggers
# named: none made since bootstrap read them (one made by an older client meanwhile would
# keep its old text).
_TRIGGERS_STILL = Sql(
    """
    INSERT INTO {meta} (key, value) SELECT 'schema_version', 0 WHERE (
      SELECT count(*) FROM sqlite_master WHERE type = 'trigger'
      AND name IN (SELECT value FROM json_each(:names))) != :count
    """
)


def _finishing_again(n: Names, finishing: frozenset[str]) -> list[Statement]:
    made = [
        Statement(
            _TRIGGERS_STILL(n), {"names": as_json(_finishing_names(n)), "count": len(finishing)}
        )
    ]
    for field in sorted(finishing):
        made.append(Statement(Sql("DROP TRIGGER {" + field + "}")(n)))
        made.append(Statement(FINISHING[field](n)))
    return made


def _upgrade(
    n: Names, version: int, statements: list[Sql], then: Sequence[Statement] = ()
) -> Batch:
    b = Builder()
    b.add(_STILL_AT(n), {"v": version})
    for statement in statements:
        b.add(statement(n))
    for made in then:
        b.add(made.sql, made.params)
    b.add(_SET_VERSION(n), {"v": SCHEMA_VERSION}, slot="upgraded")
    return b.build()


# The counters of a queue whose meta table lost its rows (the claim counter from its groups,
# so that the round robin goes on as it was), and the default tenant's row, which the
# publish's guards update.
_REOPENED_META = Sql(
    """
    INSERT OR IGNORE INTO {meta} (key, value) VALUES
      ('turn', (SELECT coalesce(max(turn), 0) FROM {groups})), ('mark', 0), ('expired', 0),
      ('vtime', 0), ('tenant_sep', 0), ('tenants', 0)
    """
)
_DEFAULT_TENANT = Sql("INSERT OR IGNORE INTO {tenants} (name) VALUES ('')")


def reopen(n: Names, *, tenants_were_on: bool) -> Batch:
    """A queue whose tables are there but whose version record is not (every table emptied
    with `DELETE FROM`, as test suites reset a database), its tables this code's: opened as
    it is, its counters made anew, and its tenants turned on again if they had been (their
    triggers are there, keeping counts)."""
    b = Builder()
    b.add(_STILL_AT(n), {"v": 0})
    b.add(_REOPENED_META(n))
    b.add(_DEFAULT_TENANT(n))
    if tenants_were_on:
        turn_on(b, n)
    b.add(_SET_VERSION(n), {"v": SCHEMA_VERSION}, slot="upgraded")
    return b.build()


def _check_shape(n: Names, found: Found) -> None:
    """`SchemaError` naming what repairs them, unless the tables found are this code's."""
    if found.columns == SHAPE:
        return
    prefix = f"rq_{n.queue}_"
    differ = sorted(t for t in {*SHAPE, *found.columns} if found.columns.get(t) != SHAPE.get(t))
    drops = "; ".join(f"DROP TABLE {prefix}{t}" for t in sorted(found.columns))
    raise SchemaError(
        f"queue {n.queue!r}: its tables are there but their version record is not (was its "
        f"meta table emptied?), and they are not the tables of schema version {SCHEMA_VERSION} "
        f"that this library makes (they differ in {', '.join(prefix + t for t in differ)}): "
        f"restore the queue from a backup (`rqlite-queue restore FILE`), or, to start it "
        f"afresh, drop its tables ({drops}) and open it again"
    )


def setup(core: QueueCore, learn: Callable[[bool], None] | None = None) -> Steps[None]:
    """Create the queue's tables if missing, or upgrade them, and check their version (the
    steps a backend drives, each plan sent as it is: no fence yet). The bootstrap is
    idempotent: its lost reply (a leader that lost its place while committing it, say) is
    sent again within the deadline, and a cluster that never takes it raises `Unavailable`
    with what each node did; an upgrade's lost reply is followed by a new bootstrap."""
    failure: Exception | None = None
    for _ in range(UPGRADE_ATTEMPTS):
        plan = upgrade(core, (yield bootstrap(core, learn)))
        if plan is None:
            return
        try:
            yield plan
        except (BackendError, OutcomeUnknown) as exc:
            # Another client upgraded first (its version check failed ours), or the reply
            # was lost: read the version again.
            failure = exc
    raise BackendError(f"queue {core.names.queue!r}: could not upgrade the schema: {failure}")


# ------------------------------------------------------------------------- the fence

FENCE_ERROR = "UNIQUE constraint failed: {meta}.key"
"""How a write fails when the stored schema version is not this code's (see `fenced`): not
the NOT NULL failure on `meta.value` of a shard's stale epoch, so the two are told apart."""

_WRITE_FENCE = Sql(
    """
    INSERT INTO {meta} (key, value) SELECT 'schema_version', 0 FROM {meta}
    WHERE "key" = 'schema_version' AND value != :schema
    """
)


class SchemaChanged(SchemaError):
    """A fenced batch found the stored schema version other than this code's (it changed
    nothing): the tables were migrated (or restored) since this client checked them. The
    backend checks the version again: a newer one is refused (`SchemaError`), an older one
    upgraded."""


def fence(n: Names, write: bool) -> tuple[Statement, str | None]:
    """The schema fence, to put at the end of a batch (`Batch.last`): a write fails, in its
    own transaction, with FENCE_ERROR unless the stored schema version is this code's (a
    newer library migrated the tables while this client ran, or an older copy of the data
    was restored): nothing of it applies. A read gets the stored version (slot
    "schema_fence", with `check_fence`). One lookup of the meta table's primary key."""
    if write:
        return Statement(_WRITE_FENCE(n), {"schema": SCHEMA_VERSION}), None
    return Statement(_VERSION(n)), "schema_fence"


def check_fence(core: QueueCore, reply: Reply) -> None:
    """Raise `SchemaChanged` if a fenced read found another schema version."""
    rows = reply["schema_fence"].rows
    version = int(rows[0][0]) if rows else 0
    if version != SCHEMA_VERSION:
        raise SchemaChanged(changed(core, version))


def changed(core: QueueCore, found: int | None) -> str:
    now = "" if found is None else f" (now {found})"
    return (
        f"queue {core.names.queue!r}: its schema version changed since this client checked "
        f"it{now}; this library knows {SCHEMA_VERSION}"
    )
