"""The files of a backup: written whole or not at all, and read back with their checks (a
SQLite file, sound, with the schema version of each queue in it), for the sync and the async
code (`SyncFiles`, `AsyncFiles`: the same calls, the async ones in a worker thread)."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from dataclasses import dataclass

from .._protocol import backup
from ..errors import BackendError, InvalidArgument
from .sqlite import _run, read_only_uri


@dataclass(frozen=True, slots=True)
class BackupFile:
    path: str
    data: bytes
    versions: dict[str, int | None]
    """Each queue in the file, and its schema version."""


def write_whole(path: str, data: bytes) -> None:
    """A backup's `data` into `path`: written beside it, synced, checked (SQLite's
    `quick_check`: rqlite streams a backup after its 200, so one cut short by a failure on
    the leader still reads as a success), then renamed onto it: a bad copy never replaces
    a good one."""
    scratch = f"{path}.partial-{os.getpid()}"
    try:
        with open(scratch, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        _check_sound(scratch, path)
        os.replace(scratch, path)
    finally:
        if os.path.exists(scratch):
            os.remove(scratch)


def _check_sound(file: str, shown: str) -> None:
    try:
        conn = sqlite3.connect(read_only_uri(file), uri=True)
        try:
            check = conn.execute("PRAGMA quick_check").fetchall()
        finally:
            conn.close()
    except sqlite3.Error as exc:
        check = [(str(exc),)]
    if check != [("ok",)]:
        raise BackendError(f"{shown}: the backup received is not a sound database: {check[0][0]}")


def read_backup(path: str) -> BackupFile:
    """The file at `path`, checked: `InvalidArgument` unless it is a sound SQLite database
    that holds at least one queue; `SchemaError` if a queue in it is newer than this library."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as exc:
        raise InvalidArgument(f"{path}: {exc.strerror or exc}") from exc
    backup.check_header(data[:16], path)
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True)
        try:
            check = conn.execute("PRAGMA quick_check").fetchall()
            if check != [("ok",)]:
                raise InvalidArgument(f"{path}: damaged SQLite file: {check[0][0]}")
            cursor = conn.cursor()
            names = [row[0] for row in _run(cursor, backup.tables())[0].rows]
            metas = [name for name in names if backup.queue_of_meta(name) is not None]
            found: dict[str, int | None] = {}
            if metas:
                for result in _run(cursor, backup.versions(metas)):
                    for index, version in result.rows:
                        queue = backup.queue_of_meta(metas[int(index)])
                        assert queue is not None
                        found[queue] = None if version is None else int(version)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise InvalidArgument(f"{path}: not a readable SQLite database: {exc}") from exc
    backup.check_versions(found, path)
    return BackupFile(path, data, found)


class SyncFiles:
    @staticmethod
    def write(path: str, data: bytes) -> None:
        write_whole(path, data)

    @staticmethod
    def read(path: str) -> BackupFile:
        return read_backup(path)


class AsyncFiles:
    @staticmethod
    async def write(path: str, data: bytes) -> None:
        await asyncio.to_thread(write_whole, path, data)

    @staticmethod
    async def read(path: str) -> BackupFile:
        return await asyncio.to_thread(read_backup, path)
