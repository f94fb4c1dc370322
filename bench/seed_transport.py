"""The seed's algorithm, kept as the benchmarks' reference (never part of the library).

This is `shared/seed/` taken literally: its schema, its exact SQL, and its round trips:

- `publish`: two statements in one request (`/db/execute?transaction`);
- `claim`: three requests: the leasing `UPDATE` with its subquery (`/db/execute`), the read-back
  by token (`/db/query?level=strong`), then the `groups` `UPDATE` (`/db/execute`);
- `ack`: two statements in one request (`/db/execute?transaction`).

`SeedRqliteTransport` speaks rqlite's HTTP API with urllib3, the library's own sync client (the
seed used httpx; the same client on both sides keeps the comparison about the SQL and the round
trips);
`SeedSqliteTransport` runs the same statements on the standard `sqlite3` module, one
transaction per request of the rqlite version (WAL and a busy timeout, as the library's
embedded backend does, so that the comparison is about the SQL and the round trips)."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from dataclasses import dataclass
from typing import Any

import urllib3

_HEADERS = {"Content-Type": "application/json"}

# --------------------------------------------------------------------------- the seed's SQL

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS messages ("
    " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
    " group_id TEXT NOT NULL,"
    " event TEXT NOT NULL,"
    " locked_by TEXT,"
    " lock_expiry REAL)",
    "CREATE TABLE IF NOT EXISTS groups ("
    " group_id TEXT PRIMARY KEY,"
    " last_claimed_at REAL NOT NULL DEFAULT 0.0,"
    " priority INT NOT NULL DEFAULT 0)",
)
DROP = ("DROP TABLE IF EXISTS messages", "DROP TABLE IF EXISTS groups")

PUBLISH_MESSAGE = "INSERT INTO messages (group_id, event) VALUES (?, ?)"
PUBLISH_GROUP = "INSERT OR IGNORE INTO groups (group_id, priority) VALUES (?, ?)"

# params: token, now + visibility, now, now, min_priority
CLAIM = """UPDATE messages SET locked_by = ?, lock_expiry = ?
  WHERE seq = (
    SELECT m.seq FROM messages m JOIN groups g ON g.group_id = m.group_id
    WHERE (m.locked_by IS NULL OR m.lock_expiry < ?)
      AND m.group_id NOT IN (
        SELECT group_id FROM messages WHERE locked_by IS NOT NULL AND lock_expiry >= ?)
      AND g.priority >= ?
    ORDER BY g.last_claimed_at ASC, m.seq ASC LIMIT 1)"""
READ_BACK = "SELECT seq, group_id, event FROM messages WHERE locked_by = ?"
MARK_GROUP = "UPDATE groups SET last_claimed_at = ? WHERE group_id = ?"

ACK_MESSAGE = "DELETE FROM messages WHERE seq = ?"
ACK_GROUP = (
    "DELETE FROM groups WHERE group_id=? AND NOT EXISTS (SELECT 1 FROM messages WHERE group_id=?)"
)

PARKED = "__parked__"
NACK_PARK = "UPDATE messages SET locked_by = ?, lock_expiry = ? WHERE seq = ?"
NACK_NOW = "UPDATE messages SET locked_by = NULL, lock_expiry = 0 WHERE seq = ?"


@dataclass(frozen=True, slots=True)
class SeedLease:
    seq: int
    group_id: str
    event: Any
    token: str


Statement = list[Any]  # [sql, *params], as the seed sends it


def _publish(group_id: str, event: Any, priority: int) -> list[Statement]:
    return [
        [PUBLISH_MESSAGE, group_id, json.dumps(event)],
        [PUBLISH_GROUP, group_id, priority],
    ]


def _ack(lease: SeedLease) -> list[Statement]:
    return [[ACK_MESSAGE, lease.seq], [ACK_GROUP, lease.group_id, lease.group_id]]


def _nack(lease: SeedLease, delay: float) -> list[Statement]:
    if delay > 0:
        return [[NACK_PARK, PARKED, time.time() + delay, lease.seq]]
    return [[NACK_NOW, lease.seq]]


# ---------------------------------------------------------------------------------- rqlite


class SeedError(RuntimeError):
    pass


class SeedRqliteTransport:
    """The seed on rqlite: `_execute` -> POST /db/execute, `_query` -> POST
    /db/query?level=strong."""

    def __init__(self, url: str, timeout: float = 600.0) -> None:
        self._pool = urllib3.connection_from_url(
            url.rstrip("/"), maxsize=4, retries=False, timeout=timeout
        )

    def _post(self, path: str, body: Any) -> Any:
        response = self._pool.urlopen(
            "POST", path, body=json.dumps(body).encode(), headers=_HEADERS, retries=False
        )
        if response.status != 200:
            raise SeedError(f"HTTP {response.status}: {response.data[:200]!r}")
        return json.loads(response.data)

    def _execute(self, statements: list[Statement], transaction: bool = False) -> list[Any]:
        path = "/db/execute" + ("?transaction" if transaction else "")
        results: list[Any] = self._post(path, statements)["results"]
        for result in results:
            if "error" in result:
                raise SeedError(result["error"])
        return results

    def _query(self, sql: str, *params: Any) -> list[list[Any]]:
        result = self._post("/db/query?level=strong", [[sql, *params]])["results"][0]
        if "error" in result:
            raise SeedError(result["error"])
        rows: list[list[Any]] = result.get("values") or []
        return rows

    def setup(self) -> None:
        self._execute([[s] for s in SCHEMA], transaction=True)

    def publish(self, group_id: str, event: Any, priority: int = 0) -> None:
        self._execute(_publish(group_id, event, priority), transaction=True)

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> SeedLease | None:
        token = f"{worker_id}:{uuid.uuid4()}"
        now = time.time()
        [result] = self._execute([[CLAIM, token, now + visibility, now, now, min_priority]])
        if result.get("rows_affected", 0) == 0:
            return None
        rows = self._query(READ_BACK, token)
        if not rows:
            return None
        seq, group_id, event = rows[0]
        self._execute([[MARK_GROUP, time.time(), group_id]])
        return SeedLease(int(seq), str(group_id), json.loads(event), token)

    def ack(self, lease: SeedLease) -> None:
        self._execute(_ack(lease), transaction=True)

    def nack(self, lease: SeedLease, delay: float = 0.0) -> None:
        self._execute(_nack(lease, delay))

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> SeedRqliteTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------- sqlite


class SeedSqliteTransport:
    """The seed's statements on a local SQLite file: each request of the rqlite version is one
    transaction here (a write takes the lock up front: `BEGIN IMMEDIATE`)."""

    def __init__(self, path: str, busy_timeout: float = 60.0) -> None:
        self._conn = sqlite3.connect(
            path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")

    def _execute(self, statements: list[Statement]) -> list[int]:
        """One write transaction; the rows affected by each statement."""
        cursor = self._conn.cursor()
        try:
            cursor.execute("BEGIN IMMEDIATE")
            counts = []
            for sql, *params in statements:
                cursor.execute(sql, params)
                counts.append(cursor.rowcount)
            cursor.execute("COMMIT")
            return counts
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise
        finally:
            cursor.close()

    def setup(self) -> None:
        self._execute([[s] for s in SCHEMA])

    def publish(self, group_id: str, event: Any, priority: int = 0) -> None:
        self._execute(_publish(group_id, event, priority))

    def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> SeedLease | None:
        token = f"{worker_id}:{uuid.uuid4()}"
        now = time.time()
        [affected] = self._execute([[CLAIM, token, now + visibility, now, now, min_priority]])
        if affected == 0:
            return None
        rows = self._conn.execute(READ_BACK, (token,)).fetchall()
        if not rows:
            return None
        seq, group_id, event = rows[0]
        self._execute([[MARK_GROUP, time.time(), group_id]])
        return SeedLease(int(seq), str(group_id), json.loads(event), token)

    def ack(self, lease: SeedLease) -> None:
        self._execute(_ack(lease))

    def nack(self, lease: SeedLease, delay: float = 0.0) -> None:
        self._execute(_nack(lease, delay))

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> SeedSqliteTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
