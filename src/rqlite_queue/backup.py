"""Backup and restore of a queue's database (`rqlite-queue backup` / `restore` are built on
these): `backup(queue, path)` and `restore(queue, path)` on a `Transport`, `backup_async` and
`restore_async` on an `AsyncTransport`; `shard_file` names a shard's file of a sharded queue's
backup.

Both act on the whole database the queue lives in: every queue in it and any other table. A
restore replaces all of it (rqlite's `/db/load` swaps every node's database for the file), so
it refuses a target that holds data unless `force=True`, and wants every worker and client of
that database stopped first."""

from ._async.backup import backup as backup_async
from ._async.backup import restore as restore_async
from ._protocol.backup import shard_file
from ._sync.backup import backup, restore

__all__ = ["backup", "backup_async", "restore", "restore_async", "shard_file"]
