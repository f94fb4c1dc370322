"""What the benchmarks drive: the floor (bare rqlite / bare SQLite), raw SQL access for building
backlogs, the resetting of the seed's, harel's and our tables between points, and the Raft
log index and CPU of the rqlited processes.

Backlogs are built on the server with one generated `INSERT ... WITH RECURSIVE ... SELECT` per
table (rqlite replicates the statement text, so every node generates the same rows): a million
messages cost one request and no client memory. The build is never measured.

The floor speaks HTTP with the library's own client libraries (urllib3 for sync, aiohttp for
asyncio), to the same endpoint as the library's writes (`/db/request?transaction`), so that a
ratio to it measures the queue, not the HTTP client."""

from __future__ import annotations

import json
import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import httpx
import seed_transport as seed
import urllib3

from rqlite_queue._protocol import schema
from rqlite_queue._protocol.names import Names
from rqlite_queue._protocol.plan import Statement

SEED_TABLES = ("messages", "groups")
WRITE_PATH = "/db/request?transaction"
HEADERS = {"Content-Type": "application/json"}
POOL_SIZE = 32  # as the library's (rqlite_queue._io.urllib3_client.POOL_SIZE)
_CLK_TCK = float(os.sysconf("SC_CLK_TCK"))


def names(queue: str) -> Names:
    return Names.of(queue)


def our_tables(queue: str) -> list[str]:
    return list(names(queue).tables)


# -------------------------------------------------------------------------------- raw access


class Admin(Protocol):
    """Raw SQL on one backend, for setting up points (not measured)."""

    def execute(self, statements: list[list[Any]]) -> None: ...

    def scalar(self, sql: str, *params: Any) -> Any: ...

    def checkpoint(self) -> None: ...

    def close(self) -> None: ...


class RqliteAdmin:
    def __init__(self, url: str) -> None:
        self.url = url
        self._http = httpx.Client(timeout=900.0, trust_env=False)

    def execute(self, statements: list[list[Any]]) -> None:
        r = self._http.post(self.url + "/db/execute", params={"transaction": ""}, json=statements)
        r.raise_for_status()
        for result in r.json()["results"]:
            if "error" in result:
                raise RuntimeError(f"rqlite: {result['error']}")

    def scalar(self, sql: str, *params: Any) -> Any:
        r = self._http.post(
            self.url + "/db/query", params={"level": "linearizable"}, json=[[sql, *params]]
        )
        r.raise_for_status()
        result = r.json()["results"][0]
        if "error" in result:
            raise RuntimeError(f"rqlite: {result['error']}")
        return result["values"][0][0]

    def raft(self) -> RaftState:
        """The Raft state of the node this admin talks to (the leader)."""
        r = self._http.get(self.url + "/status")
        r.raise_for_status()
        raft = r.json()["store"]["raft"]
        return RaftState(int(raft["last_log_index"]), int(raft["term"]), str(raft["state"]))

    def checkpoint(self) -> None:
        """rqlite manages its own WAL."""

    def close(self) -> None:
        self._http.close()


@dataclass(frozen=True)
class RaftState:
    index: int
    term: int
    state: str


class SqliteAdmin:
    def __init__(self, path: str) -> None:
        self._conn = sqlite3.connect(path, timeout=60.0, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")

    def execute(self, statements: list[list[Any]]) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            for sql, *params in statements:
                named = len(params) == 1 and isinstance(params[0], dict)
                self._conn.execute(sql, params[0] if named else params)
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

    def scalar(self, sql: str, *params: Any) -> Any:
        return self._conn.execute(sql, params).fetchone()[0]

    def checkpoint(self) -> None:
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        self._conn.close()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / _CLK_TCK


# ---------------------------------------------------------------------------------- backlogs


def _series() -> str:
    """A CTE of the integers from the first bound parameter to the second, inclusive."""
    return "WITH RECURSIVE c(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM c WHERE i < ?) "


# The payload of message i: {"i": i} (harel's transport needs one of its events instead).
EVENT_SQL = "'{\"i\":' || i || '}'"
HAREL_EVENT_SQL = '\'{"kind":"m","data":{"i":\' || i || \'}}\''

# Rows per generated INSERT: keeps each request well inside rqlite's Raft apply timeout.
_CHUNK = 200_000


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(start, min(n, start + _CHUNK) - 1) for start in range(0, n, _CHUNK)]


def _statement(s: Statement) -> list[Any]:
    if isinstance(s.params, dict):
        return [s.sql, dict(s.params)] if s.params else [s.sql]
    return [s.sql, *s.params]


def reset_seed(admin: Admin) -> None:
    admin.execute([[s] for s in seed.DROP] + [[s] for s in seed.SCHEMA])


def reset_ours(admin: Admin, queue: str) -> None:
    """Drop the queue's tables and create them afresh, as `setup` would (schema v2)."""
    n = names(queue)
    drops: list[list[Any]] = [[f"DROP TABLE IF EXISTS {t}"] for t in n.tables]
    admin.execute(drops)
    admin.execute([_statement(s) for s in schema.bootstrap_batch(n).statements])
    admin.execute([_statement(s) for s in schema.create(n).statements])


def _build_groups(admin: Admin, table: str, groups: int, priority: int, prefix: str) -> None:
    for lo, hi in _chunks(groups):
        admin.execute(
            [
                [
                    f"INSERT OR IGNORE INTO {table} (group_id, priority) "
                    + _series()
                    + "SELECT ? || i, ? FROM c",
                    lo,
                    hi,
                    prefix,
                    priority,
                ]
            ]
        )


def build_seed(
    admin: Admin,
    messages: int,
    groups: int,
    priority: int = 0,
    prefix: str = "g",
    tables: tuple[str, str] = SEED_TABLES,
    event_sql: str = EVENT_SQL,
) -> None:
    """`messages` messages round-robin over `groups` new groups (message i in group i % groups),
    appended after whatever is queued. `tables`: (messages, groups) of the seed's schema (also
    harel's transport, whose tables are the seed's under a prefix)."""
    _build_groups(admin, tables[1], groups, priority, prefix)
    for lo, hi in _chunks(messages):
        admin.execute(
            [
                [
                    f"INSERT INTO {tables[0]} (group_id, event) "
                    + _series()
                    + f"SELECT ? || (i % ?), {event_sql} FROM c",
                    lo,
                    hi,
                    prefix,
                    groups,
                ]
            ]
        )


def build_ours(
    admin: Admin, queue: str, messages: int, groups: int, priority: int = 0, prefix: str = "g"
) -> None:
    """The same backlog in our schema (groups created in order, as publishes would)."""
    n = names(queue)
    _build_groups(admin, n.groups, groups, priority, prefix)
    now = time.time()
    for lo, hi in _chunks(messages):
        admin.execute(
            [
                [
                    f"INSERT INTO {n.messages} (group_id, event, published_at) "
                    + _series()
                    + "SELECT ? || (i % ?), '{\"i\":' || i || '}', ? FROM c",
                    lo,
                    hi,
                    prefix,
                    groups,
                    now,
                ]
            ]
        )


def drop_all(admin: Admin, queue: str) -> None:
    """Free the space of a point's tables."""
    admin.execute(
        [[f"DROP TABLE IF EXISTS {t}"] for t in our_tables(queue)] + [[s] for s in seed.DROP]
    )


# ------------------------------------------------------------------------------------ floor

FLOOR_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO floor (id, n) " + _series() + "SELECT i, 0 FROM c",
)
FLOOR_UPDATE = "UPDATE floor SET n = n + 1 WHERE id = ?"
# The bare many-row insert publish_many is compared with: the same columns and index as our
# messages table, the rows as plain bound parameters of one multi-row VALUES.
FLOOR_ROWS_SCHEMA = (
    "DROP TABLE IF EXISTS floor_rows",
    "CREATE TABLE floor_rows (seq INTEGER PRIMARY KEY AUTOINCREMENT, group_id TEXT NOT NULL, "
    "event TEXT NOT NULL, published_at REAL NOT NULL)",
    "CREATE INDEX floor_rows_by_group ON floor_rows (group_id, seq)",
)


def setup_floor(admin: Admin) -> None:
    admin.execute([[FLOOR_SCHEMA[0]], [FLOOR_SCHEMA[1], 0, 255]])


def setup_floor_rows(admin: Admin) -> None:
    admin.execute([[s] for s in FLOOR_ROWS_SCHEMA])


def floor_rows_insert(rows: list[tuple[str, str]], now: float) -> list[Any]:
    """One INSERT of these (group_id, event) rows, as [sql, *params]."""
    values = ", ".join(["(?, ?, ?)"] * len(rows))
    params: list[Any] = []
    for group_id, event in rows:
        params += [group_id, event, now]
    return [f"INSERT INTO floor_rows (group_id, event, published_at) VALUES {values}", *params]


def _check(status: int, content: bytes) -> None:
    if status != 200:
        raise RuntimeError(f"rqlite HTTP {status}: {content[:200]!r}")
    reply = json.loads(content)
    if "error" in reply or "error" in reply["results"][0]:
        raise RuntimeError(f"rqlite: {content[:200]!r}")


class FloorRqlite:
    """Bare rqlite over urllib3 (the library's sync client): one trivial single-row UPDATE per
    request: one Raft round trip, the least any replicated write can cost."""

    def __init__(self, url: str, row: int = 0) -> None:
        self.row = row % 256
        self._pool = urllib3.connection_from_url(url, maxsize=POOL_SIZE, retries=False)
        self._body = json.dumps([[FLOOR_UPDATE, self.row]]).encode()

    def write(self) -> None:
        self.post(self._body)

    def post(self, body: bytes) -> None:
        r = self._pool.urlopen("POST", WRITE_PATH, body=body, headers=HEADERS, retries=False)
        _check(r.status, r.data)

    def close(self) -> None:
        self._pool.close()


class AsyncFloorRqlite:
    """The same over aiohttp (the library's asyncio client), one session shared by tasks."""

    def __init__(self, session: aiohttp.ClientSession, url: str, row: int = 0) -> None:
        self.url = url + WRITE_PATH
        self._session = session
        self._body = json.dumps([[FLOOR_UPDATE, row % 256]]).encode()

    async def write(self) -> None:
        async with self._session.post(self.url, data=self._body, headers=HEADERS) as r:
            _check(r.status, await r.read())


def floor_session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=POOL_SIZE), skip_auto_headers=("User-Agent",)
    )


class FloorSqlite:
    """Bare SQLite: one trivial single-row UPDATE per write transaction."""

    def __init__(self, path: str, row: int = 0) -> None:
        self.row = row % 256
        self._conn = sqlite3.connect(
            path, timeout=60.0, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")

    def write(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        self._conn.execute(FLOOR_UPDATE, (self.row,))
        self._conn.execute("COMMIT")

    def post_rows(self, statement: list[Any]) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        self._conn.execute(statement[0], statement[1:])
        self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()
