"""`shards status` and `shards drain`: changing the shard list of a live sharded queue."""

from __future__ import annotations

import dataclasses
import time

import click

from .. import ShardedTransport
from ..types import ShardStatus
from ._base import Config, _json, cli
from ._tables import Cell, Listing


@cli.group()
def shards() -> None:
    """A sharded queue's shards (--url 'a=...;b=...'): status, drain."""


def _sharded(config: Config) -> ShardedTransport:
    transport = ShardedTransport(config.backend(), **config.options_without_connect())
    transport.setup()
    return transport


def _table(statuses: list[ShardStatus]) -> Listing:
    columns = ("shard", "state", "up", "epoch", "depth", "groups", "leaving", "waiting", "dead")
    table = Listing(
        *((c, Cell.KEEP, "left" if c in ("shard", "state") else "right") for c in columns),
        ("schedules elsewhere", Cell.KEEP, "right"),
    )

    def cell(value: object) -> str:
        return "?" if value is None else str(value)

    for s in statuses:
        table.add_row(
            s.name,
            s.state,
            "yes" if s.up else "[bold red]no[/]",
            cell(s.epoch),
            cell(s.depth),
            cell(s.groups),
            cell(s.leaving),
            cell(s.waiting),
            cell(s.dead),
            cell(s.schedules_elsewhere),
        )
    return table


def _verdict(queue: ShardedTransport, statuses: list[ShardStatus]) -> str:
    if not queue.shard_list.changing:
        return "no change under way"
    if any(not s.up for s in statuses):
        return "a shard does not answer: the change cannot be judged"
    # A moving group is counted twice in the table: leaving its old shard, and waiting on its
    # new one once it has new messages there. Once released (above), every waiting group
    # still has messages to deliver on its old shard: the leaving ones are all of them.
    leaving = sum(s.leaving or 0 for s in statuses)
    waiting = sum(s.waiting or 0 for s in statuses)
    if leaving or waiting:
        moving = max(leaving, waiting)
        return (
            f"change under way: {moving} groups still moving "
            f"({waiting} of them with new messages waiting on their new shard)"
        )
    draining = [s.name for s in statuses if s.state == "draining"]
    busy = [s.name for s in statuses if s.state == "draining" and (s.depth or s.dead)]
    if busy:
        return f"moved; shard(s) {', '.join(busy)} still hold messages or dead letters"
    gone = f"remove {', '.join(draining)} and " if draining else ""
    return (
        f"change done: {gone}drop the +/- marks from the list (keep epoch={queue.shard_list.epoch})"
    )


@shards.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.pass_obj
def status(config: Config, as_json: bool) -> int:
    """Each shard: its part in a change of the list (+joining, -draining), the list epoch it
    has been given, depth, groups still leaving it, moved groups waiting on it, dead letters,
    schedules that belong elsewhere; then whether the change is done."""
    with _sharded(config) as queue:
        queue.release_moved_groups()
        statuses = queue.shard_status()
        verdict = _verdict(queue, statuses)
    if as_json:
        for s in statuses:
            click.echo(_json(dataclasses.asdict(s)))
        return 0
    _table(statuses).print()
    click.echo(verdict)
    return 0


@shards.command("drain")
@click.argument("name")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between looks.",
)
@click.option("--timeout", "give_up", type=click.FloatRange(min=0), help="Give up after this long.")
@click.pass_obj
def drain(config: Config, name: str, interval: float, give_up: float | None) -> int:
    """Wait until shard NAME, marked draining in --url ('-NAME=...', with a higher epoch, given
    to every client first), holds no message; then say it can be removed. Workers drain it:
    this command only watches (and frees moved groups whose old shard emptied)."""
    with _sharded(config) as queue:
        queue.shard(name)
        state = next(s.state for s in queue.shard_list.specs if s.name == name)
        if state != "draining":
            raise click.ClickException(
                f"shard {name!r} is not marked draining in --url: list it as '-{name}=URL' "
                "with a higher epoch=N, and give that list to every client first"
            )
        started = time.monotonic()
        while True:
            queue.release_moved_groups()
            mine = next(s for s in queue.shard_status() if s.name == name)
            if mine.up and mine.depth == 0:
                dead = (
                    f"; {mine.dead} dead letters stay on it (purge them or keep it)"
                    if mine.dead
                    else ""
                )
                click.echo(f"shard {name} is empty: remove it from the list{dead}")
                return 0
            click.echo(
                f"shard {name}: depth {'?' if mine.depth is None else mine.depth}, "
                f"groups {'?' if mine.groups is None else mine.groups}",
                err=True,
            )
            if give_up is not None and time.monotonic() - started > give_up:
                click.echo(f"shard {name} still holds messages after {give_up:g}s", err=True)
                return 1
            time.sleep(interval)
