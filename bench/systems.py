"""What the benchmarks drive: the floor (bare rqlite / bare SQLite), raw SQL access for building
backlogs, and the resetting of the seed's and our tables between points.

Backlogs are built on the server with one generated `INSERT ... WITH RECURSIVE ... SELECT` per
table (rqlite replicates the statement text, so every node generates the same rows): a million
messages cost one request and no client memory. The build is never measured."""

from __future__ import annotations

import re
import sqlite3
import time
from typing import Any, Protocol

import httpx
import seed_transport as seed

from rqlite_queue import sql as qsql

SEED_TABLES = ("messages", "groups")


def our_tables(queue: str) -> list[str]:
    """Every table of the library's schema for this queue (read from its DDL)."""
    schema = qsql.schema(qsql.Names(queue))
    found = (re.match(r"CREATE TABLE IF NOT EXISTS (\S+)", s.sql) for s in schema.statements)
    return [m.group(1) for m in found if m]


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

    def checkpoint(self) -> None:
        """rqlite manages its own WAL."""

    def close(self) -> None:
        self._http.close()


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


# ---------------------------------------------------------------------------------- backlogs


def _series() -> str:
    """A CTE of the integers from the first bound parameter to the second, inclusive."""
    return "WITH RECURSIVE c(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM c WHERE i < ?) "


# Rows per generated INSERT: keeps each request well inside rqlite's Raft apply timeout.
_CHUNK = 200_000


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(start, min(n, start + _CHUNK) - 1) for start in range(0, n, _CHUNK)]


def reset_seed(admin: Admin) -> None:
    admin.execute([[s] for s in seed.DROP] + [[s] for s in seed.SCHEMA])


def reset_ours(admin: Admin, queue: str) -> None:
    drops: list[list[Any]] = [[f"DROP TABLE IF EXISTS {t}"] for t in our_tables(queue)]
    schema = qsql.schema(qsql.Names(queue))
    admin.execute(
        drops + [[s.sql, dict(s.params)] if s.params else [s.sql] for s in schema.statements]
    )


def build_seed(
    admin: Admin, messages: int, groups: int, priority: int = 0, prefix: str = "g"
) -> None:
    """`messages` messages round-robin over `groups` new groups (message i in group i % groups),
    appended after whatever is queued."""
    for lo, hi in _chunks(groups):
        admin.execute(
            [
                [
                    "INSERT OR IGNORE INTO groups (group_id, priority) "
                    + _series()
                    + "SELECT ? || i, ? FROM c",
                    lo,
                    hi,
                    prefix,
                    priority,
                ]
            ]
        )
    for lo, hi in _chunks(messages):
        admin.execute(
            [
                [
                    "INSERT INTO messages (group_id, event) "
                    + _series()
                    + "SELECT ? || (i % ?), '{\"i\":' || i || '}' FROM c",
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
    n = qsql.Names(queue)
    for lo, hi in _chunks(groups):
        admin.execute(
            [
                [
                    f"INSERT OR IGNORE INTO {n.groups} (group_id, priority) "
                    + _series()
                    + "SELECT ? || i, ? FROM c",
                    lo,
                    hi,
                    prefix,
                    priority,
                ]
            ]
        )
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


def setup_floor(admin: Admin) -> None:
    admin.execute([[FLOOR_SCHEMA[0]], [FLOOR_SCHEMA[1], 0, 63]])


class FloorRqlite:
    """Bare rqlite: one trivial single-row UPDATE per request (`/db/execute`): one Raft round
    trip, the least any replicated write can cost."""

    def __init__(self, url: str, row: int = 0) -> None:
        self.url = url + "/db/execute"
        self.row = row % 64
        self._http = httpx.Client(timeout=60.0, trust_env=False)

    def write(self) -> None:
        r = self._http.post(self.url, json=[[FLOOR_UPDATE, self.row]])
        r.raise_for_status()
        if "error" in r.json()["results"][0]:
            raise RuntimeError(r.text)

    def close(self) -> None:
        self._http.close()


class AsyncFloorRqlite:
    def __init__(self, client: httpx.AsyncClient, url: str, row: int = 0) -> None:
        self.url = url + "/db/execute"
        self.row = row % 64
        self._http = client

    async def write(self) -> None:
        r = await self._http.post(self.url, json=[[FLOOR_UPDATE, self.row]])
        r.raise_for_status()
        if "error" in r.json()["results"][0]:
            raise RuntimeError(r.text)


class FloorSqlite:
    """Bare SQLite: one trivial single-row UPDATE per write transaction."""

    def __init__(self, path: str, row: int = 0) -> None:
        self.row = row % 64
        self._conn = sqlite3.connect(
            path, timeout=60.0, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")

    def write(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        self._conn.execute(FLOOR_UPDATE, (self.row,))
        self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()
