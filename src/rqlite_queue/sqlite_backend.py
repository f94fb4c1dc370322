"""The embedded backend: runs the queue's batches on a local SQLite file (standard `sqlite3`).

WAL lets readers work beside the one writer; every write batch takes the write lock up front
(`BEGIN IMMEDIATE`), so two processes sharing the file serialise their claims exactly as
rqlite's Raft log serialises them, and a busy timeout makes them wait instead of fail."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

from .errors import BackendError, Unavailable
from .sql import Batch, Result


class SqliteExecutor:
    def __init__(self, path: str, *, busy_timeout: float = 30.0) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")

    def execute(self, batch: Batch) -> list[Result]:
        with self._lock:
            cursor = self._conn.cursor()
            try:
                cursor.execute("BEGIN IMMEDIATE" if batch.write else "BEGIN")
                results = []
                for statement in batch.statements:
                    cursor.execute(statement.sql, statement.params)
                    rows = [list(row) for row in cursor.fetchall()]
                    results.append(Result(rows, max(cursor.rowcount, 0), cursor.lastrowid or None))
                cursor.execute("COMMIT")
                return results
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                    raise Unavailable(f"sqlite: {exc}") from exc
                raise BackendError(f"sqlite: {exc}") from exc
            finally:
                cursor.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class AsyncSqliteExecutor:
    """The same executor, run in a worker thread so the event loop never blocks on a lock."""

    def __init__(self, path: str, *, busy_timeout: float = 30.0) -> None:
        self._sync = SqliteExecutor(path, busy_timeout=busy_timeout)
        self.path = path

    async def execute(self, batch: Batch) -> list[Result]:
        return await asyncio.to_thread(self._sync.execute, batch)

    async def close(self) -> None:
        await asyncio.to_thread(self._sync.close)
