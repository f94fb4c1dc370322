"""`schedule add/list/remove` and the `scheduler` process."""

from __future__ import annotations

import dataclasses
import signal
import threading

import click

from ..timefmt import utc
from ._base import (
    Config,
    _json,
    _parse_event,
    _stdout,
    cli,
    log,
)
from ._tables import Cell, Listing

# ------------------------------------------------------------------------------ schedules


@cli.group()
def schedule() -> None:
    """Periodic jobs: add, list or remove them (workers, or 'rqlite-queue scheduler',
    publish their ticks)."""


@schedule.command("add")
@click.argument("name")
@click.argument("group")
@click.argument("event_json")
@click.option("--every", type=float, metavar="SECONDS", help="Tick every SECONDS.")
@click.option("--cron", metavar="EXPRESSION", help="Tick at the times of a cron expression (UTC).")
@click.option("--priority", type=click.IntRange(0, 4), default=0, show_default=True)
@click.option(
    "--catch-up",
    is_flag=True,
    help="After a stretch with no worker running, one message per missed tick (default: one "
    "for them all).",
)
@click.pass_obj
def schedule_add(
    config: Config,
    name: str,
    group: str,
    event_json: str,
    every: float | None,
    cron: str | None,
    priority: int,
    catch_up: bool,
) -> int:
    """Publish EVENT_JSON into GROUP every SECONDS or at the cron times; NAME again replaces
    it."""
    event = _parse_event(event_json)
    with config.transport() as queue:
        made = queue.schedule(
            name, group, event, every=every, cron=cron, priority=priority, catch_up=catch_up
        )
    _stdout().print(f"scheduled {made.name}: next tick {utc(made.next_at)}")
    return 0


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.pass_obj
def schedule_list(config: Config, as_json: bool) -> int:
    """The schedules, by name."""
    with config.transport() as queue:
        schedules = queue.schedules()
    if as_json:
        for s in schedules:
            click.echo(_json({**dataclasses.asdict(s)}))
        return 0
    table = Listing(
        ("name", Cell.KEEP),
        ("group", Cell.KEEP),
        ("every / cron", Cell.KEEP),
        ("priority", Cell.KEEP, "right"),
        ("next tick", Cell.KEEP),
        ("event", Cell.SHORT),
    )
    for s in schedules:
        cadence = f"{s.every:g} s" if s.every is not None else str(s.cron)
        table.add_row(s.name, s.group_id, cadence, str(s.priority), utc(s.next_at),
                      _json(s.event))  # fmt: skip
    table.print()
    return 0


@schedule.command("remove")
@click.argument("name")
@click.pass_obj
def schedule_remove(config: Config, name: str) -> int:
    """Remove the schedule NAME."""
    with config.transport() as queue:
        removed = queue.unschedule(name)
    _stdout().print(f"removed {name}" if removed else f"no schedule named {name}")
    return 0


@cli.command()
@click.option(
    "--burst", is_flag=True, help="Publish what is due once, then exit (a cron job, a test)."
)
@click.pass_obj
def scheduler(config: Config, burst: bool) -> int:
    """Publish the schedules' ticks as they fall due, until SIGINT/SIGTERM: a process that only
    schedules (workers do it too, between claims). Each tick goes out once, however many
    schedulers and workers run."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with config.transport() as queue:
        while True:
            published = queue.fire_schedules()
            if published:
                log.info("published %d scheduled messages", published)
            if burst:
                return 0
            tick = queue.probe().next_tick
            wait = SCHEDULER_CHECK if tick is None else tick - queue.clock()
            if stop.wait(min(SCHEDULER_CHECK, max(0.01, wait))):
                return 0


SCHEDULER_CHECK = 1.0
"""How often the scheduler looks for new or changed schedules."""
