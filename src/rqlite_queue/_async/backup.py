"""Backup and restore of a queue's database: rqlite's backup and load endpoints, SQLite's online
backup for the embedded file, one file per shard for a sharded queue. This file is the source;
`_sync/backup.py` is generated from it. The public names are in `rqlite_queue.backup`.

A backup is of the whole database the queue lives in (every queue in it, and any other
table), and a restore replaces the whole database, as rqlite's load does."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from .._io.backup_files import AsyncFiles, BackupFile
from .._io.sqlite import AsyncSqliteExecutor
from .._protocol import backup as protocol
from .._protocol.backup import LOAD_PATH, Transfer, backup_path, shard_file
from .._protocol.checks import check_seconds
from .._protocol.http import unknown_scheme
from .._protocol.sharding import is_sharded_url
from ..errors import InvalidArgument, TargetNotEmpty, TransportClosed
from .cluster import AsyncBackend
from .queue import (
    AsyncRqliteTransport,
    AsyncShardedTransport,
    AsyncSqliteTransport,
    AsyncTransport,
    _sqlite_path,
)
from .rqlite_client import AsyncRqliteClient


@dataclass(frozen=True, slots=True)
class _Part:
    shard: str | None
    backend: AsyncBackend
    path: str

    @property
    def where(self) -> str:
        return f"shard {self.shard!r}" if self.shard is not None else "the queue's database"


async def backup(
    queue: AsyncTransport | str,
    path: str | os.PathLike[str],
    /,
    *,
    vacuum: bool = False,
    shard: str | None = None,
    timeout: float | None = None,
    **options: Any,
) -> list[str]:
    """Copy the whole database `queue` lives in to the SQLite file `path` (replaced if it
    exists; written whole or not at all), while workers and publishers go on. On rqlite, the
    leader's copy with every committed write (`GET /db/backup`; `vacuum`: a compacted copy,
    which costs the leader a scratch copy); on the embedded file, SQLite's online backup. A
    sharded queue writes one file per shard, its name before the suffix (`queue.db` ->
    `queue.a.db`; see `shard_file`), or only `shard`'s. `timeout`: seconds for each file
    (default: the transport's `deadline`). `queue` may be a URL (as `from_url`'s, with the
    transport's `options`): its transport is made for the call, never connected (no table
    is created), and closed. Returns the files written."""
    if isinstance(queue, str):
        async with _unconnected(queue, options) as transport:
            return await backup(transport, path, vacuum=vacuum, shard=shard, timeout=timeout)
    _no_options(options)
    parts = _parts(queue, path, shard)
    written = []
    for part in parts:
        deadline = _deadline(queue, timeout)
        executor = part.backend.executor
        if isinstance(executor, AsyncRqliteClient):
            data = await executor.transfer(Transfer("GET", backup_path(vacuum)), deadline)
            protocol.check_header(data[:16], f"{part.where}: rqlite's backup")
            await AsyncFiles.write(part.path, data)
        elif isinstance(executor, AsyncSqliteExecutor):
            await executor.backup_to(part.path)
        else:
            raise InvalidArgument(f"{part.where}: no backup for this backend ({executor!r})")
        written.append(part.path)
    return written


async def restore(
    queue: AsyncTransport | str,
    path: str | os.PathLike[str],
    /,
    *,
    force: bool = False,
    shard: str | None = None,
    timeout: float | None = None,
    **options: Any,
) -> list[str]:
    """Replace the whole database `queue` lives in with the backup `path` (every queue in it,
    and any other table: what is not in the file is gone), then the queue is the one that was
    backed up: its messages in order, leases, parks, dead letters, schedules, dedup ids,
    tenants, a shard's epoch. Stop every worker and client of the queue's database first (an
    embedded file open elsewhere is refused: `Unavailable`).

    Every file is checked before anything is replaced: a SQLite file holding a queue
    (`InvalidArgument`), none of its queues at a schema newer than this library's
    (`SchemaError`; an older one is upgraded by the first call after the restore). Refused
    with `TargetNotEmpty` when the target holds anything but empty queues, unless `force`.
    A sharded queue restores each shard from its own file (`shard_file`), or only `shard`.
    `timeout`: seconds for each file (default: the transport's `deadline`). `queue` may be a
    URL, as for `backup`. Returns the files restored."""
    if isinstance(queue, str):
        async with _unconnected(queue, options) as transport:
            return await restore(transport, path, force=force, shard=shard, timeout=timeout)
    _no_options(options)
    parts = _parts(queue, path, shard)
    files: list[BackupFile] = [await AsyncFiles.read(part.path) for part in parts]
    if not force:
        for part in parts:
            held = await _holding(part.backend, _deadline(queue, timeout))
            if held:
                more = f" and {len(held) - 5} more" if len(held) > 5 else ""
                shown = ", ".join(held[:5]) + more
                raise TargetNotEmpty(
                    f"{part.where} holds data a restore would replace ({shown}): a restore "
                    "replaces the whole database; restore with force (--force) to replace it"
                )
    for part, file in zip(parts, files, strict=True):
        executor = part.backend.executor
        part.backend.schema_checked = False  # the next call checks the restored tables
        if isinstance(executor, AsyncRqliteClient):
            reply = await executor.transfer(
                Transfer("POST", LOAD_PATH, file.data), _deadline(queue, timeout)
            )
            protocol.check_load_reply(reply)
        elif isinstance(executor, AsyncSqliteExecutor):
            await executor.restore_from(part.path)
        else:
            raise InvalidArgument(f"{part.where}: no restore for this backend ({executor!r})")
    return [part.path for part in parts]


async def _holding(backend: AsyncBackend, deadline: float) -> list[str]:
    """The tables of a target that hold something (`protocol.holding`); read as they are,
    without creating or upgrading the queue's tables."""
    executor = backend.executor
    names = [row[0] for row in (await executor.execute(protocol.tables(), deadline))[0].rows]
    if not names:
        return []
    rows = [
        row
        for result in await executor.execute(protocol.with_rows(names), deadline)
        for row in result.rows
    ]
    return protocol.holding(names, rows)


def _unconnected(url: str, options: dict[str, Any]) -> AsyncTransport:
    """The transport of `url`, as `from_url` makes it, without connecting."""
    if is_sharded_url(url):
        return AsyncShardedTransport(url, **options)
    if url.startswith("sqlite://"):
        return AsyncSqliteTransport(_sqlite_path(url), **options)
    if url.startswith(("http://", "https://")):
        return AsyncRqliteTransport(url, **options)
    raise unknown_scheme(url)


def _no_options(options: dict[str, Any]) -> None:
    if options:
        raise TypeError(f"options ({', '.join(sorted(options))}) are for a URL, not a transport")


def _parts(queue: AsyncTransport, path: str | os.PathLike[str], shard: str | None) -> list[_Part]:
    if queue.closed:
        raise TransportClosed(f"queue {queue.queue!r}: closed")
    file = os.fspath(path)
    if isinstance(queue, AsyncShardedTransport):
        names = queue.names if shard is None else [shard]
        return [_Part(name, _backend(queue.shard(name)), shard_file(file, name)) for name in names]
    if shard is not None:
        raise InvalidArgument(f"shard={shard!r}: the queue is not sharded")
    return [_Part(None, _backend(queue), file)]


def _backend(queue: AsyncTransport) -> AsyncBackend:
    backend = queue.router.cluster
    if backend is None:
        raise InvalidArgument(f"queue {queue.queue!r}: not on one cluster")
    return backend


def _deadline(queue: AsyncTransport, timeout: float | None) -> float:
    if timeout is not None:
        check_seconds(timeout, "timeout", allow_zero=False)
    return time.monotonic() + (queue.deadline if timeout is None else timeout)
