"""The embedded backend: runs the queue's batches on a local SQLite file (standard `sqlite3`).

WAL lets readers work beside the one writer; every write batch takes the write lock up front
(`BEGIN IMMEDIATE`), so two processes sharing the file serialise their claims exactly as
rqlite's Raft log serialises them, and a busy timeout (never past the operation's deadline)
makes them wait instead of fail. Whatever goes wrong inside a batch, the transaction is rolled
back before the error leaves, so no failure can leave the file locked for other processes."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
from urllib.request import pathname2url

from .._protocol.plan import Batch, Result
from ..errors import BackendError, InvalidArgument, TransportClosed, Unavailable

MIN_SQLITE = (3, 35, 0)
"""UPDATE ... FROM (3.33), the JSON functions, and a planner that uses the partial indexes."""


class SqliteExecutor:
    def __init__(self, path: str, *, busy_timeout: float = 30.0) -> None:
        if sqlite3.sqlite_version_info < MIN_SQLITE:
            raise BackendError(
                f"the embedded backend needs SQLite >= {'.'.join(map(str, MIN_SQLITE))}; "
                f"this Python has {sqlite3.sqlite_version}"
            )
        self.path = path
        self.busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")

    def execute(self, batch: Batch, deadline: float, **hints: object) -> list[Result]:
        """Run `batch` in one transaction, waiting for the write lock until `deadline` (a
        `time.monotonic()` time) at most. (The hints of the rqlite client's waits do not apply
        to one file.)"""
        with self._lock:
            conn = self._conn
            if conn is None:
                raise TransportClosed(f"sqlite: {self.path}: closed")
            wait = min(self.busy_timeout, deadline - time.monotonic())
            if wait <= 0:
                raise Unavailable("sqlite: the deadline passed before the batch could start")
            conn.execute(f"PRAGMA busy_timeout = {max(1, int(wait * 1000))}")
            cursor = conn.cursor()
            try:
                cursor.execute("BEGIN IMMEDIATE" if batch.write else "BEGIN")
                results = _run(cursor, batch)
                cursor.execute("COMMIT")
                return results
            except BaseException as exc:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError) and _busy(exc):
                    raise Unavailable(f"sqlite: {exc}") from exc
                if isinstance(exc, Exception):
                    raise BackendError(f"sqlite: {exc!r}") from exc
                raise
            finally:
                cursor.close()

    def run_in(self, connection: object, batch: Batch) -> list[Result]:
        """Run `batch` on the caller's own connection to this file, inside its transaction (a
        savepoint: a failure takes back only the batch, and the caller's transaction goes
        on). A connection in Python's default transaction mode with none open yet gets one
        begun, as an INSERT of the caller's would begin it (the publish is a write of the
        caller's transaction, which the caller commits or rolls back). Refused for a
        connection to another file, or one in autocommit mode with no transaction open (the
        batch would commit on its own)."""
        if not isinstance(connection, sqlite3.Connection):
            raise InvalidArgument(f"connection must be a sqlite3.Connection, got {connection!r}")
        files = {row[1]: row[2] for row in connection.execute("PRAGMA database_list")}
        if _same_file(files.get("main", ""), self.path) is False:
            raise InvalidArgument(
                f"the connection is to {files.get('main') or 'an in-memory database'}, not to "
                f"the queue's file {self.path}"
            )
        if not connection.in_transaction:
            begin = _implicit_begin(connection)
            if begin is None:
                raise InvalidArgument(
                    "the connection is in autocommit mode and has no open transaction: begin "
                    "one (BEGIN), so that the publish commits with your writes"
                )
            try:
                connection.execute(begin)
            except sqlite3.Error as exc:
                raise BackendError(f"sqlite: {exc!r}") from exc
        cursor = connection.cursor()
        try:
            cursor.execute("SAVEPOINT rqlite_queue")
            try:
                results = _run(cursor, batch)
            except BaseException:
                cursor.execute("ROLLBACK TO rqlite_queue")
                raise
            finally:
                cursor.execute("RELEASE rqlite_queue")
        except sqlite3.Error as exc:
            raise BackendError(f"sqlite: {exc!r}") from exc
        finally:
            cursor.close()
        return results

    def backup_to(self, path: str) -> None:
        """A consistent copy of the whole file into `path`, while other connections go on
        writing (SQLite's online backup; the copy is made beside `path`, then renamed onto
        it, so a failure never leaves half a file there). The copy is a plain file (rollback
        journal, not WAL): one file, whole."""
        with self._lock:
            conn = self._open_connection()
            scratch = f"{path}.partial-{os.getpid()}"
            try:
                copy = sqlite3.connect(scratch, isolation_level=None)
                try:
                    conn.backup(copy)
                    copy.execute("PRAGMA journal_mode=DELETE")
                finally:
                    copy.close()
                os.replace(scratch, path)
            except sqlite3.Error as exc:
                raise BackendError(f"sqlite: backup of {self.path} into {path}: {exc}") from exc
            finally:
                if os.path.exists(scratch):
                    os.remove(scratch)

    def restore_from(self, path: str) -> None:
        """Replace the whole file with the database in `path` (SQLite's backup API the other
        way: one write transaction). Refused (`Unavailable`) while another connection has the
        file open, in this process or another: restoring under running clients would leave
        them with leases and state the restore took away. (The check: leaving WAL mode needs
        the only connection; the file goes back to WAL afterwards.)"""
        with self._lock:
            conn = self._open_connection()
            conn.execute("PRAGMA busy_timeout = 200")
            try:
                mode = conn.execute("PRAGMA journal_mode=DELETE").fetchone()[0]
            except sqlite3.OperationalError as exc:
                mode = str(exc)
            if mode != "delete":
                raise Unavailable(
                    f"sqlite: {self.path} is open in another connection (a worker, a "
                    "dashboard?): stop every client of the file, then restore"
                )
            try:
                source = sqlite3.connect(read_only_uri(path), uri=True)
                try:
                    source.backup(conn)
                finally:
                    source.close()
            except sqlite3.Error as exc:
                raise BackendError(f"sqlite: restore of {self.path} from {path}: {exc}") from exc
            finally:
                conn.execute("PRAGMA journal_mode=WAL")

    def _open_connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise TransportClosed(f"sqlite: {self.path}: closed")
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def read_only_uri(path: str) -> str:
    """The URI that opens `path` read-only, without locks or a WAL (a backup file)."""
    return "file:" + pathname2url(os.path.abspath(path)) + "?mode=ro&immutable=1"


def _run(cursor: sqlite3.Cursor, batch: Batch) -> list[Result]:
    results = []
    for statement in batch.statements:
        cursor.execute(statement.sql, statement.params)
        rows = [list(row) for row in cursor.fetchall()]
        results.append(Result(rows, max(cursor.rowcount, 0), cursor.lastrowid or None))
    return results


def _implicit_begin(connection: sqlite3.Connection) -> str | None:
    """The statement with which Python's sqlite3 begins a transaction before a write of the
    caller's (its default, legacy transaction control: `isolation_level` "" or "DEFERRED",
    "IMMEDIATE", "EXCLUSIVE"), or None for a connection in autocommit mode (`isolation_level`
    None, or Python 3.12's `autocommit=True`; with `autocommit=False` a transaction is always
    open)."""
    legacy = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)
    if getattr(connection, "autocommit", legacy) != legacy:
        return None
    level = connection.isolation_level
    return None if level is None else f"BEGIN {level}".strip()


def _same_file(main: str, path: str) -> bool:
    """Whether a connection's main database file (`PRAGMA database_list`) is `path`."""
    if not main or path == ":memory:":
        return False
    try:
        return os.path.samefile(main, path)
    except OSError:
        return False


def _busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


class AsyncSqliteExecutor:
    """The same executor, run in a worker thread so the event loop never blocks on a lock."""

    def __init__(self, path: str, *, busy_timeout: float = 30.0) -> None:
        self._sync = SqliteExecutor(path, busy_timeout=busy_timeout)
        self.path = path

    async def execute(self, batch: Batch, deadline: float, **hints: object) -> list[Result]:
        return await asyncio.to_thread(self._sync.execute, batch, deadline)

    def run_in(self, connection: object, batch: Batch) -> list[Result]:
        """As `SqliteExecutor.run_in`: on the caller's thread, the connection being its own."""
        return self._sync.run_in(connection, batch)

    async def backup_to(self, path: str) -> None:
        await asyncio.to_thread(self._sync.backup_to, path)

    async def restore_from(self, path: str) -> None:
        await asyncio.to_thread(self._sync.restore_from, path)

    async def close(self) -> None:
        await asyncio.to_thread(self._sync.close)
