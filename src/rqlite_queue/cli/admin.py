"""Operators' commands: `groups`, `group ...`, `pause`, `resume`, `dlq ...`."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

import click
from rich.text import Text

from .. import Transport
from ..timefmt import duration, utc
from ..types import DeadLetter
from ._base import (
    Config,
    _ago,
    _error,
    _json,
    _stdout,
    cli,
)
from ._tables import Cell, Listing

# ------------------------------------------------------------------------------ groups


_STATES = click.Choice(["ready", "leased", "parked", "delayed", "held"])


@cli.command("groups")
@click.option("--state", type=_STATES, help="Only groups in this state.")
@click.option("--prefix", help="Only groups whose id starts with this.")
@click.option(
    "--min-priority", type=click.IntRange(0, 4), default=0, help="Only from this priority."
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=50, show_default=True, help="At most this many."
)
@click.option("--after", metavar="GROUP", help="Start after this group id (the next page).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.pass_obj
def groups_command(
    config: Config,
    state: str | None,
    prefix: str | None,
    min_priority: int,
    limit: int,
    after: str | None,
    as_json: bool,
) -> int:
    """List groups (with messages, or held) in id order: state, depth, head, lease."""
    with config.transport() as queue:
        infos = queue.groups(
            state=state, prefix=prefix, min_priority=min_priority, limit=limit, after=after
        )
    if as_json:
        for info in infos:
            click.echo(_json(dataclasses.asdict(info)))
        return 0
    if not infos:
        click.echo("no groups")
        return 0
    sharded = any(info.shard for info in infos)
    columns = ("group", *(("shard",) if sharded else ()), "prio", "state", "depth", "head")
    left = ("group", "shard", "state", "holder")
    table = Listing(
        *(
            (column, Cell.KEEP, "left" if column in left else "right")
            for column in (*columns, "tries", "until", "holder", "age")
        )
    )
    for info in infos:
        table.add_row(
            info.group_id,
            *((info.shard,) if sharded else ()),
            str(info.priority),
            info.state,
            str(info.depth),
            "" if info.head_seq is None else str(info.head_seq),
            str(info.attempts),
            "" if info.until is None else utc(info.until),
            info.holder or "",
            "" if info.head_age is None else duration(info.head_age),
        )
    title = f"{len(infos)} groups"
    if len(infos) == limit:
        title += f" (more after: --after {infos[-1].group_id!r})"
    table.print(title)
    return 0


@cli.command()
@click.pass_obj
def pause(config: Config) -> int:
    """Pause the queue: claims take nothing (publishes go on) until 'resume'."""
    with config.transport() as queue:
        queue.pause()
    _stdout().print(f"queue {config.queue!r} paused")
    return 0


@cli.command()
@click.pass_obj
def resume(config: Config) -> int:
    """Resume a paused queue."""
    with config.transport() as queue:
        queue.resume()
    _stdout().print(f"queue {config.queue!r} resumed")
    return 0


@cli.group()
def group() -> None:
    """One group: hold, release, cancel, or change its priority."""


@group.command()
@click.argument("group_id", metavar="GROUP")
@click.pass_obj
def hold(config: Config, group_id: str) -> int:
    """Hold GROUP: no claim takes it until released (a lease in flight finishes normally)."""
    with config.transport() as queue:
        queue.hold_group(group_id)
    _stdout().print(f"held {group_id}")
    return 0


@group.command()
@click.argument("group_id", metavar="GROUP")
@click.pass_obj
def release(config: Config, group_id: str) -> int:
    """Release GROUP (held by 'group hold' or by a dead letter with --hold-on-dead-letter)."""
    with config.transport() as queue:
        released = queue.release_group(group_id)
    _stdout().print(f"released {group_id}" if released else f"{group_id} was not held")
    return 0


@group.command()
@click.argument("group_id", metavar="GROUP")
@click.option("--reason", default="cancelled", show_default=True, help="The dead letters' reason.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def cancel(config: Config, group_id: str, reason: str, yes: bool) -> int:
    """Move every message of GROUP to the dead letters (a lease in flight on it is fenced)."""
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("cancel dead-letters the whole group: pass --yes to confirm")
        click.confirm(f"Dead-letter every message of group {group_id!r}?", abort=True)
    with config.transport() as queue:
        count = queue.cancel_group(group_id, reason)
    _stdout().print(f"cancelled {group_id}: {count} messages dead-lettered")
    return 0


@group.command()
@click.argument("group_id", metavar="GROUP")
@click.argument("priority", type=click.IntRange(0, 4))
@click.pass_obj
def priority(config: Config, group_id: str, priority: int) -> int:
    """Set GROUP's priority (0-4) while it has messages."""
    with config.transport() as queue:
        changed = queue.set_priority(group_id, priority)
    if not changed:
        _error(f"group {group_id!r} has no messages: its next publish sets its priority")
        return 1
    _stdout().print(f"{group_id}: priority {priority}")
    return 0


# ------------------------------------------------------------------------------ dlq


@cli.group()
def dlq() -> None:
    """Dead letters: list, requeue or purge them."""


def _dead_table(letters: Sequence[DeadLetter]) -> Listing:
    sharded = any(letter.shard for letter in letters)
    with_headers = any(letter.headers for letter in letters)
    table = Listing(
        # seqs are per shard: `dlq requeue SEQ --shard NAME`
        *([("shard", Cell.KEEP)] if sharded else []),
        ("seq", Cell.KEEP, "right"),
        ("group", Cell.KEEP),
        ("prio", Cell.KEEP, "right"),
        ("attempts", Cell.KEEP, "right"),
        ("dead", Cell.KEEP),
        ("reason", Cell.WRAP),
        ("event", Cell.SHORT),
        *([("headers", Cell.SHORT)] if with_headers else []),
    )
    for letter in letters:
        table.add_row(
            *([letter.shard] if sharded else []),
            str(letter.seq),
            letter.group_id,
            str(letter.priority),
            str(letter.attempts),
            _ago(letter.dead_at),
            letter.reason,
            _json(letter.event),
            # (as text: a header's "[...]" is not rich's markup)
            *([Text(_json(dict(letter.headers)))] if with_headers else []),
        )
    return table


@dlq.command("list")
@click.option(
    "--limit", type=click.IntRange(min=1), default=100, show_default=True, help="At most this many."
)
@click.option("--group", "group_id", help="Only this group's dead letters.")
@click.option(
    "--after",
    metavar="CURSOR",
    help="Start after this dead letter (the next page: the title of a full page says which).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.pass_obj
def dlq_list(
    config: Config, limit: int, group_id: str | None, after: str | None, as_json: bool
) -> int:
    """List dead letters (in seq order) with their reasons."""
    with config.transport() as queue:
        letters = queue.dead_letters(limit, group_id=group_id, after=after)
    if as_json:
        for letter in letters:
            listed = {**dataclasses.asdict(letter), "headers": dict(letter.headers)}
            click.echo(_json({**listed, "cursor": letter.cursor}))
    elif not letters:
        click.echo("no dead letters" + (" after that" if after else ""))
    else:
        title = f"{len(letters)} dead letters"
        if len(letters) == limit:
            title += f" (more after: --after {letters[-1].cursor})"
        _dead_table(letters).print(title)
    return 0


_SHARD = click.option(
    "--shard",
    metavar="NAME",
    help="On a sharded queue, the shard of the SEQs (seqs are per shard: 'dlq list' shows it).",
)


def _check_shard(queue: Transport, seqs: tuple[int, ...], shard: str | None) -> None:
    """Seqs of a sharded queue need their shard (the library says `shard=`; say `--shard`)."""
    names: list[str] = getattr(queue, "names", [""])
    if seqs and shard is None and len(names) > 1:
        raise click.UsageError(
            f"seqs are per shard: give --shard NAME (one of {', '.join(names)}; "
            "'dlq list' shows each dead letter's shard)"
        )


@dlq.command()
@click.argument("seqs", nargs=-1, type=int, metavar="[SEQ...]")
@_SHARD
@click.pass_obj
def requeue(config: Config, seqs: tuple[int, ...], shard: str | None) -> int:
    """Put dead letters (all, or those SEQs) back at the tail of their groups."""
    with config.transport() as queue:
        _check_shard(queue, seqs, shard)
        count = queue.requeue_dead(list(seqs) if seqs else None, shard=shard)
    click.echo(f"requeued {count} dead letters")
    return 0


@dlq.command()
@click.argument("seqs", nargs=-1, type=int, metavar="[SEQ...]")
@_SHARD
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def purge(config: Config, seqs: tuple[int, ...], shard: str | None, yes: bool) -> int:
    """Delete dead letters (all, or those SEQs) for good."""
    what = f"dead letters {', '.join(map(str, seqs))}" if seqs else "ALL dead letters"
    if shard is not None:
        what += f" of shard {shard!r}"
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("purge deletes for good: pass --yes to confirm")
        click.confirm(f"Delete {what} of queue {config.queue!r} for good?", abort=True)
    with config.transport() as queue:
        _check_shard(queue, seqs, shard)
        count = queue.purge_dead(list(seqs) if seqs else None, shard=shard)
    click.echo(f"purged {count} dead letters")
    return 0
