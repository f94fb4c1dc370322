"""Every SQL statement of the queue, and every reading of what comes back: pure functions.

Nothing here does I/O. An operation is a `Batch` (statements sent in one round trip, in one
transaction) built by a function below; the backend runs it and hands back one `Result` per
statement; a `read_*` function below turns those into values. The same text runs on the
embedded SQLite and on rqlite (which replicates the SQL text and re-executes it on every
node), so:

- times and tokens are parameters from the client, never `julianday('now')` or `random()`;
- group ids and payloads are always bound parameters;
- rows come back from plain `SELECT`s placed inside the write transaction (rqlite's
  `/db/request` runs them as queries within the transaction), not from `RETURNING`, which rqlite
  only honours when its own SQL parser accepts the statement and silently drops otherwise;
- every statement is driven by an index, so its cost does not grow with the backlog (each one
  says which index it uses; `tests/test_query_plans.py` checks the plans).

Tables, per queue (`rq_<queue>_` prefix):

- `meta`: key/value integers: the schema version, and `turn`, the claim counter.
- `messages`: one row per queued message; `seq` is the FIFO order and the lease's handle.
- `groups`: one row per group that has messages. It carries the group's whole in-flight state,
  so that claim never has to look at the messages of groups it does not take:
  `ready` (1: claimable; 0: leased or parked until `until`), `token` and `head` (the lease
  that holds, or last held, the group, and the seq it was given: the fencing check),
  `attempts` (claims of the current head),
  `turn` (the claim counter at its last claim; 0 = never claimed: the round-robin key).
- `dead`: dead-lettered messages.
- `dedup`: publish ids seen within the dedup window.
- `retired`: the last turn of groups that emptied within `RETIRE_WINDOW`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
RETIRE_WINDOW = 300.0
MAX_PRIORITY = 4
QUEUE_NAME = re.compile(r"[a-z0-9_]{1,40}")
# SQLite's default limit on bound variables is 32766; stay well under it per statement.
_ROWS_PER_INSERT = 300

Params = Mapping[str, Any] | Sequence[Any]


@dataclass(frozen=True, slots=True)
class Statement:
    sql: str
    params: Params = ()


@dataclass(frozen=True, slots=True)
class Batch:
    """Statements sent together. `write=True`: one transaction through the leader (rqlite
    `/db/request?transaction`, SQLite `BEGIN IMMEDIATE`); `write=False`: a fresh read
    (rqlite `/db/query?level=linearizable`)."""

    statements: tuple[Statement, ...]
    write: bool = True


@dataclass(frozen=True, slots=True)
class Result:
    """One statement's outcome, the same shape from every backend."""

    rows: list[list[Any]] = field(default_factory=list)
    rows_affected: int = 0
    last_insert_id: int | None = None


@dataclass(frozen=True, slots=True)
class Names:
    """The table and index names of one named queue."""

    queue: str

    @property
    def prefix(self) -> str:
        return f"rq_{self.queue}_"

    def __getattr__(self, item: str) -> str:
        # meta, messages, groups, dead, dedup and index names: all the same prefix.
        if item.startswith("_"):
            raise AttributeError(item)
        return self.prefix + item


# --------------------------------------------------------------------------------- schema


def schema(n: Names) -> Batch:
    """Create the queue's tables if missing, then read the schema version back (last row)."""
    ddl = f"""
    CREATE TABLE IF NOT EXISTS {n.meta} (
      key   TEXT PRIMARY KEY,
      value INTEGER NOT NULL
    );
    CREATE TABLE IF NOT EXISTS {n.messages} (
      seq          INTEGER PRIMARY KEY AUTOINCREMENT,
      group_id     TEXT NOT NULL,
      event        TEXT NOT NULL,
      published_at REAL NOT NULL
    );
    -- A group's head is min(seq) for its group_id: one index probe.
    CREATE INDEX IF NOT EXISTS {n.messages_by_group} ON {n.messages} (group_id, seq);
    CREATE TABLE IF NOT EXISTS {n.groups} (
      group_id TEXT PRIMARY KEY,
      priority INTEGER NOT NULL,
      turn     INTEGER NOT NULL DEFAULT 0,
      ready    INTEGER NOT NULL DEFAULT 1,
      until    REAL    NOT NULL DEFAULT 0,
      parked   INTEGER NOT NULL DEFAULT 0,
      attempts INTEGER NOT NULL DEFAULT 0,
      token    TEXT,
      head     INTEGER
    );
    -- Claim: the claimable groups, least recently claimed first (ties: the rowid, i.e.
    -- creation order); all of them (no priority floor), or those of one priority (one probe
    -- per level >= min_priority). Two small indexes rather than one statement long enough
    -- (>= 1 KiB) for rqlite to gzip every claim on every node.
    CREATE INDEX IF NOT EXISTS {n.groups_ready} ON {n.groups} (turn) WHERE ready = 1;
    CREATE INDEX IF NOT EXISTS {n.groups_ready_by_priority} ON {n.groups} (priority, turn)
      WHERE ready = 1;
    -- Claim: leases and parks whose deadline passed; and the groups a claim just took.
    CREATE INDEX IF NOT EXISTS {n.groups_busy} ON {n.groups} (until) WHERE ready = 0;
    CREATE TABLE IF NOT EXISTS {n.dead} (
      seq          INTEGER PRIMARY KEY,
      group_id     TEXT NOT NULL,
      event        TEXT NOT NULL,
      priority     INTEGER NOT NULL,
      attempts     INTEGER NOT NULL,
      reason       TEXT NOT NULL,
      published_at REAL NOT NULL,
      dead_at      REAL NOT NULL
    );
    -- The turn of groups that emptied lately: a group id published again soon after joins the
    -- round robin where it left it, not as a never-claimed group (which would go first and
    -- let a group that is refilled after each ack starve the others).
    CREATE TABLE IF NOT EXISTS {n.retired} (
      group_id   TEXT PRIMARY KEY,
      turn       INTEGER NOT NULL,
      expires_at REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS {n.retired_expiry} ON {n.retired} (expires_at);
    CREATE TABLE IF NOT EXISTS {n.dedup} (
      dedup_id   TEXT PRIMARY KEY,
      seq        INTEGER NOT NULL,
      expires_at REAL NOT NULL
    );
    -- Pruning expired publish ids touches only those.
    CREATE INDEX IF NOT EXISTS {n.dedup_expiry} ON {n.dedup} (expires_at);
    """
    statements = [Statement(s.strip()) for s in _split(ddl)]
    statements += [
        Statement(
            f"INSERT OR IGNORE INTO {n.meta} (key, value) VALUES ('schema_version', :v)",
            {"v": SCHEMA_VERSION},
        ),
        Statement(f"INSERT OR IGNORE INTO {n.meta} (key, value) VALUES ('turn', 0)"),
        Statement(f"SELECT value FROM {n.meta} WHERE key = 'schema_version'"),
    ]
    return Batch(tuple(statements))


def read_schema_version(results: Sequence[Result]) -> int:
    rows = results[-1].rows
    if not rows:
        raise ValueError("schema version missing")
    return int(rows[0][0])


def _split(ddl: str) -> list[str]:
    lines = [line for line in ddl.splitlines() if not line.strip().startswith("--")]
    return [s for s in "\n".join(lines).split(";") if s.strip()]


# -------------------------------------------------------------------------------- publish


@dataclass(frozen=True, slots=True)
class NewMessage:
    group_id: str
    event: str
    priority: int
    dedup_id: str | None = None


@dataclass(frozen=True, slots=True)
class PublishBatch:
    batch: Batch
    seq_sources: tuple[tuple[int, int], ...]
    """Where each message's seq comes from, in publish order: (statement index, rows), with
    rows > 0 for a multi-row INSERT and rows == 0 for a `SELECT seq` read-back."""


def publish(
    n: Names, messages: Sequence[NewMessage], now: float, dedup_until: float
) -> PublishBatch:
    """Append messages in order; a group's priority is set by the publish that creates its
    row and kept while it has messages. With a dedup id, a message is inserted only if the id
    was not seen within the window, and its seq (new or earlier) is read back."""
    statements: list[Statement] = []
    sources: list[tuple[int, int]] = []
    if any(m.dedup_id is not None for m in messages):
        # Prune as we go: uses the expiry index, touches only expired ids.
        statements.append(Statement(f"DELETE FROM {n.dedup} WHERE expires_at < :now", {"now": now}))

    def flush(run: list[NewMessage]) -> None:
        for start in range(0, len(run), _ROWS_PER_INSERT):
            chunk = run[start : start + _ROWS_PER_INSERT]
            sources.append((len(statements), len(chunk)))
            statements.extend(_insert_plain(n, chunk, now))
        run.clear()

    run: list[NewMessage] = []
    for message in messages:
        if message.dedup_id is None:
            run.append(message)
            continue
        flush(run)
        statements.extend(_insert_deduplicated(n, message, now, dedup_until))
        sources.append((len(statements) - 1, 0))
    flush(run)
    return PublishBatch(Batch(tuple(statements)), tuple(sources))


# A new group row's turn: where the group left the round robin if it emptied lately, else 0
# (never claimed).
_RETIRED_TURN = (
    "coalesce((SELECT turn FROM {n.retired} WHERE group_id = {g} AND expires_at >= {now}), 0)"
)


def _insert_plain(n: Names, chunk: Sequence[NewMessage], now: float) -> list[Statement]:
    # A non-empty chunk of at most _ROWS_PER_INSERT messages.
    out: list[Statement] = []
    values = ", ".join("(?, ?, ?)" for _ in chunk)
    params: list[Any] = []
    for m in chunk:
        params += [m.group_id, m.event, now]
    out.append(
        Statement(
            f"INSERT INTO {n.messages} (group_id, event, published_at) VALUES {values}",
            params,
        )
    )
    group_values = ", ".join(f"(?, ?, {_RETIRED_TURN.format(n=n, g='?', now='?')})" for _ in chunk)
    group_params: list[Any] = []
    for m in chunk:
        group_params += [m.group_id, m.priority, m.group_id, now]
    # First row for a group wins: that publish fixes the group's priority.
    out.append(
        Statement(
            f"INSERT OR IGNORE INTO {n.groups} (group_id, priority, turn) VALUES {group_values}",
            group_params,
        )
    )
    return out


def _insert_deduplicated(
    n: Names, m: NewMessage, now: float, dedup_until: float
) -> list[Statement]:
    p = {"g": m.group_id, "e": m.event, "now": now, "d": m.dedup_id, "p": m.priority}
    return [
        Statement(
            f"INSERT INTO {n.messages} (group_id, event, published_at) "
            f"SELECT :g, :e, :now WHERE NOT EXISTS "
            f"(SELECT 1 FROM {n.dedup} WHERE dedup_id = :d)",
            p,
        ),
        # Records the seq just inserted; a repeated id keeps the first seq (IGNORE).
        Statement(
            f"INSERT OR IGNORE INTO {n.dedup} (dedup_id, seq, expires_at) "
            f"VALUES (:d, last_insert_rowid(), :until)",
            {"d": m.dedup_id, "until": dedup_until},
        ),
        # A duplicate must not recreate the row of a group that has since emptied.
        Statement(
            f"INSERT OR IGNORE INTO {n.groups} (group_id, priority, turn) "
            f"SELECT :g, :p, {_RETIRED_TURN.format(n=n, g=':g', now=':now')} "
            f"WHERE EXISTS (SELECT 1 FROM {n.messages} WHERE group_id = :g)",
            {"g": m.group_id, "p": m.priority, "now": now},
        ),
        Statement(f"SELECT seq FROM {n.dedup} WHERE dedup_id = :d", {"d": m.dedup_id}),
    ]


def read_published_seqs(plan: PublishBatch, results: Sequence[Result]) -> list[int]:
    """The seq of each published message, in order (for a deduplicated one, the seq of the
    message its id first published)."""
    seqs: list[int] = []
    for index, rows in plan.seq_sources:
        result = results[index]
        if rows:
            # A multi-row INSERT numbers its rows consecutively (AUTOINCREMENT, one writer).
            last = _require_int(result.last_insert_id)
            seqs += range(last - rows + 1, last + 1)
        else:
            seqs.append(int(result.rows[0][0]))
    return seqs


def _require_int(value: int | None) -> int:
    if value is None:
        raise ValueError("missing last_insert_id")
    return value


# ---------------------------------------------------------------------------------- claim


def claim(
    n: Names, *, token: str, now: float, until: float, count: int, min_priority: int
) -> Batch:
    """Lease the heads of up to `count` groups: the claimable ones with priority >=
    `min_priority` that were claimed least recently (never-claimed first, then creation order).

    Safe to retry with the same token and `until`: a retry that finds the groups this token
    already took returns them instead of taking more."""
    mine = {"until": until, "token": token}
    if min_priority == 0:
        # Every claimable group, in round-robin order: one probe of the all-ready index.
        pick = f"SELECT rowid FROM {n.groups} WHERE ready = 1 ORDER BY turn, rowid LIMIT :count"
    else:
        # One probe of the per-priority index for each level >= the floor, each already in
        # round-robin order; the union of those few rows is then ordered.
        per_level = " UNION ALL ".join(
            f"SELECT * FROM (SELECT rowid r, turn t FROM {n.groups} "
            f"WHERE ready = 1 AND priority = {level} ORDER BY t, r LIMIT :count)"
            for level in range(MAX_PRIORITY, min_priority - 1, -1)
        )
        pick = f"SELECT r FROM ({per_level}) ORDER BY t, r LIMIT :count"
    return Batch(
        (
            # Lapsed leases and ended parks rejoin the ready index (token kept: a lapsed
            # lease that nobody takes over may still be acked).
            Statement(
                f"UPDATE {n.groups} SET ready = 1, parked = 0 WHERE ready = 0 AND until <= :now",
                {"now": now},
            ),
            Statement(f"UPDATE {n.meta} SET value = value + 1 WHERE key = 'turn'"),
            Statement(
                f"UPDATE {n.groups} SET ready = 0, parked = 0, until = :until, token = :token, "
                f"attempts = attempts + 1, "
                f"head = (SELECT min(seq) FROM {n.messages} m "
                f"WHERE m.group_id = {n.groups}.group_id), "
                f"turn = (SELECT value FROM {n.meta} WHERE key = 'turn') "
                f"WHERE rowid IN ({pick}) "
                f"AND NOT EXISTS (SELECT 1 FROM {n.groups} "
                f"WHERE ready = 0 AND until = :until AND token = :token)",
                {**mine, "count": count},
            ),
            Statement(_HELD_HEADS.format(n=n), mine),
        )
    )


# The heads of the groups one claim took (found through the busy index on `until`).
_HELD_HEADS = (
    "SELECT m.seq, m.group_id, m.event, g.attempts, g.until "
    "FROM {n.groups} g JOIN {n.messages} m "
    "ON m.seq = g.head "
    "WHERE g.ready = 0 AND g.until = :until AND g.token = :token "
    "ORDER BY g.rowid"
)


@dataclass(frozen=True, slots=True)
class LeasedRow:
    seq: int
    group_id: str
    event: str
    attempts: int
    expires_at: float


def read_leased(results: Sequence[Result]) -> list[LeasedRow]:
    return [
        LeasedRow(int(r[0]), str(r[1]), str(r[2]), int(r[3]), float(r[4])) for r in results[-1].rows
    ]


# ------------------------------------------------------------------- ack, nack, and others


@dataclass(frozen=True, slots=True)
class Held:
    """What identifies a lease on the server: its group, its message and its token."""

    seq: int
    group_id: str
    token: str


# The lease (group, token, seq) still holds its group. Every call on a lease checks this, so
# a stale lease, or a hand-made one naming another message, changes nothing.
_HOLDS = "group_id = :g AND token = :token AND head = :seq"


def _holds(n: Names) -> str:
    return f"EXISTS (SELECT 1 FROM {n.groups} WHERE {_HOLDS})"


def _finish_head(n: Names, held: Held, now: float) -> list[Statement]:
    """Remove the head this lease holds and free its group (dropping the group's row when it
    has no message left, remembering its turn). Every statement checks that the lease holds,
    so a stale lease changes nothing; the first one's rows_affected says whether it held."""
    p = {"g": held.group_id, "token": held.token, "seq": held.seq}
    emptied = f"NOT EXISTS (SELECT 1 FROM {n.messages} WHERE group_id = :g)"
    return [
        Statement(f"DELETE FROM {n.messages} WHERE seq = :seq AND {_holds(n)}", p),
        Statement(
            f"INSERT OR REPLACE INTO {n.retired} (group_id, turn, expires_at) "
            f"SELECT group_id, turn, :until FROM {n.groups} "
            f"WHERE {_HOLDS} AND turn > 0 AND {emptied}",
            {**p, "until": now + RETIRE_WINDOW},
        ),
        Statement(f"DELETE FROM {n.groups} WHERE {_HOLDS} AND {emptied}", p),
        Statement(
            f"UPDATE {n.groups} SET ready = 1, parked = 0, until = 0, attempts = 0, "
            f"token = NULL, head = NULL WHERE {_HOLDS}",
            p,
        ),
    ]


_FINISH = 4  # statements per lease in `_finish_head`


def ack(n: Names, leases: Sequence[Held], *, now: float, prune: bool = True) -> Batch:
    """Finish each lease's head. With `prune`, first forget retired turns past the window
    (expiry index: touches only those); the caller prunes on a fraction of its acks."""
    statements = [_prune_retired(n, now)] if prune else []
    for held in leases:
        statements += _finish_head(n, held, now)
    return Batch(tuple(statements))


def _prune_retired(n: Names, now: float) -> Statement:
    return Statement(f"DELETE FROM {n.retired} WHERE expires_at < :now", {"now": now})


def read_ack(results: Sequence[Result]) -> list[bool]:
    """Per lease: did it hold (and so was its message removed)?"""
    first = len(results) % _FINISH  # 1 when the batch began with the prune, else 0
    return [results[i].rows_affected == 1 for i in range(first, len(results), _FINISH)]


def nack(n: Names, held: Held, *, now: float, delay: float) -> Batch:
    """Give the group back: claimable now (delay 0) or parked until now + delay. Either way
    the head stays the head, so order is kept through retries."""
    p: dict[str, Any] = {"g": held.group_id, "token": held.token, "seq": held.seq}
    if delay > 0:
        sql = (
            f"UPDATE {n.groups} SET ready = 0, parked = 1, until = :until, token = NULL "
            f"WHERE {_HOLDS}"
        )
        p["until"] = now + delay
    else:
        sql = f"UPDATE {n.groups} SET ready = 1, parked = 0, until = 0, token = NULL WHERE {_HOLDS}"
    return Batch((Statement(sql, p),))


def extend(n: Names, held: Held, *, until: float) -> Batch:
    """Push the lease's deadline (also revives a lapsed lease nobody took over)."""
    return Batch(
        (
            Statement(
                f"UPDATE {n.groups} SET ready = 0, parked = 0, until = :until WHERE {_HOLDS}",
                {"g": held.group_id, "token": held.token, "seq": held.seq, "until": until},
            ),
        )
    )


def read_changed(results: Sequence[Result]) -> bool:
    """nack, extend: did the lease hold?"""
    return results[-1].rows_affected == 1


def read_dead_lettered(results: Sequence[Result]) -> bool:
    """Did the lease hold (its message was copied, then removed)?"""
    return results[1].rows_affected == 1


def dead_letter(n: Names, held: Held, *, reason: str, now: float) -> Batch:
    """Move the held head to the dead-letter table and free the group."""
    p = {"g": held.group_id, "token": held.token, "seq": held.seq, "reason": reason, "now": now}
    copy = Statement(
        f"INSERT INTO {n.dead} "
        f"(seq, group_id, event, priority, attempts, reason, published_at, dead_at) "
        f"SELECT m.seq, m.group_id, m.event, g.priority, g.attempts, :reason, "
        f"m.published_at, :now FROM {n.messages} m JOIN {n.groups} g "
        f"ON g.group_id = m.group_id WHERE m.seq = :seq AND g.group_id = :g "
        f"AND g.token = :token AND g.head = :seq",
        p,
    )
    return Batch((copy, *_finish_head(n, held, now)))


# --------------------------------------------------------------------------- dead letters


def _seq_filter(seqs: Sequence[int] | None) -> tuple[str, list[Any]]:
    if seqs is None:
        return "", []
    return f"WHERE seq IN ({', '.join('?' for _ in seqs)})", list(seqs)


def list_dead(n: Names, *, limit: int, group_id: str | None) -> Batch:
    where, params = ("WHERE group_id = ?", [group_id]) if group_id is not None else ("", [])
    return Batch(
        (
            Statement(
                f"SELECT seq, group_id, event, priority, attempts, reason, published_at, "
                f"dead_at FROM {n.dead} {where} ORDER BY seq LIMIT ?",
                [*params, limit],
            ),
        ),
        write=False,
    )


def requeue_dead(n: Names, seqs: Sequence[int] | None, *, now: float) -> Batch:
    """Put dead letters back at the tail of their groups (new seqs, original priority when
    the group has to be created again)."""
    where, params = _seq_filter(seqs)
    return Batch(
        (
            Statement(
                f"INSERT INTO {n.messages} (group_id, event, published_at) "
                f"SELECT group_id, event, ? FROM {n.dead} {where} ORDER BY seq",
                [now, *params],
            ),
            Statement(
                f"INSERT OR IGNORE INTO {n.groups} (group_id, priority, turn) "
                f"SELECT group_id, max(priority), "
                f"{_RETIRED_TURN.format(n=n, g=n.dead + '.group_id', now='?')} "
                f"FROM {n.dead} {where} GROUP BY group_id",
                [now, *params],
            ),
            Statement(f"DELETE FROM {n.dead} {where}", params),
        )
    )


def purge_dead(n: Names, seqs: Sequence[int] | None) -> Batch:
    where, params = _seq_filter(seqs)
    return Batch((Statement(f"DELETE FROM {n.dead} {where}", params),))


# ------------------------------------------------------------------------ reads and stats


def stats(n: Names, *, now: float) -> Batch:
    return Batch(
        (
            Statement(
                f"SELECT (SELECT count(*) FROM {n.messages}), (SELECT count(*) FROM {n.groups}), "
                f"(SELECT count(*) FROM {n.groups} WHERE ready = 0 AND parked = 0 "
                f"AND until > :now), "
                f"(SELECT count(*) FROM {n.groups} WHERE ready = 0 AND parked = 1 "
                f"AND until > :now), "
                f"(SELECT count(*) FROM {n.dead}), (SELECT min(published_at) FROM {n.messages})",
                {"now": now},
            ),
            Statement(
                f"SELECT g.priority, count(*) FROM {n.messages} m JOIN {n.groups} g "
                f"ON g.group_id = m.group_id GROUP BY g.priority ORDER BY g.priority"
            ),
        ),
        write=False,
    )


def peek(n: Names, group_id: str, *, limit: int) -> Batch:
    return Batch(
        (
            Statement(
                f"SELECT seq, event, published_at FROM {n.messages} WHERE group_id = ? "
                f"ORDER BY seq LIMIT ?",
                [group_id, limit],
            ),
        ),
        write=False,
    )
