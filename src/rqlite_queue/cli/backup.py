"""`backup` and `restore`: the queue's whole database to a SQLite file and back."""

from __future__ import annotations

import os

import click

from .. import backup as backups
from ._base import Config, cli

_SHARD = click.option(
    "--shard",
    metavar="NAME",
    help="On a sharded queue, only this shard (its file: FILE with the shard's name inserted).",
)


@cli.command("backup")
@click.argument("file", type=click.Path(dir_okay=False, writable=True))
@click.option(
    "--vacuum",
    is_flag=True,
    help="rqlite: a compacted copy (smaller; the leader builds it in a scratch file first).",
)
@_SHARD
@click.pass_obj
def backup_command(config: Config, file: str, vacuum: bool, shard: str | None) -> int:
    """Copy the queue's whole database to the SQLite file FILE, while workers go on.

    The whole database: every queue in it (not only --queue) and any other table. On rqlite,
    the leader's copy with every committed write (GET /db/backup, asked of any node); on the
    embedded file, SQLite's online backup. FILE is replaced, whole or not at all. A sharded
    queue writes one file per shard, the shard's name before the suffix (queue.db ->
    queue.a.db, queue.b.db). A large database may need a larger --timeout."""
    written = backups.backup(
        config.backend(),
        file,
        vacuum=vacuum,
        shard=shard,
        timeout=config.timeout,
        **config.options_without_connect(),
    )
    for path in written:
        click.echo(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return 0


@cli.command("restore")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--force",
    is_flag=True,
    help="Replace a database that holds data (by default only an empty one is replaced).",
)
@_SHARD
@click.pass_obj
def restore_command(config: Config, file: str, force: bool, shard: str | None) -> int:
    """Replace the queue's WHOLE database with the backup FILE.

    Everything in the database is replaced: every queue in it (not only --queue) and any
    other table; what is not in FILE is gone. Stop every worker, publisher and dashboard of
    the database first (an embedded file still open elsewhere is refused). The restored
    queues are the ones backed up: messages in order, leases, parks, dead letters,
    schedules, dedup ids, tenants, shard epochs.

    FILE is checked first: a SQLite file holding a queue, none newer than this version of
    rqlite-queue (an older one is upgraded by the first command after the restore). Refused
    when the target holds data (anything but empty queues) unless --force. A sharded queue
    restores each shard from its own file (FILE with the shard's name inserted), all checked
    before any is loaded. A large database may need a larger --timeout."""
    restored = backups.restore(
        config.backend(),
        file,
        force=force,
        shard=shard,
        timeout=config.timeout,
        **config.options_without_connect(),
    )
    for path in restored:
        click.echo(f"restored {path}")
    return 0
