"""`publish`, `stats`, `peek`: putting messages in and looking at them."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any

import click
from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from ..errors import InvalidArgument, QueueError
from ._base import (
    PUBLISH_BATCH,
    Config,
    _json,
    _parse_event,
    _stats_dict,
    _stats_table,
    _stderr,
    _stdout,
    cli,
    seconds_option,
)
from ._tables import Cell, Listing

# ------------------------------------------------------------------------------ publish


def _read_lines(stream: Any, default_priority: int) -> list[tuple[int, dict[str, Any]]]:
    """Every JSON line of stdin, with its line number."""
    items: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise InvalidArgument(f"stdin line {number}: not valid JSON: {exc}") from None
        if not isinstance(item, dict):
            raise InvalidArgument(
                f'stdin line {number}: expected an object {{"group_id": ..., "event": ...}}'
            )
        item.setdefault("priority", default_priority)
        items.append((number, item))
    return items


@cli.command()
@click.argument("group", required=False)
@click.argument("event_json", required=False)
@click.option(
    "--priority",
    type=click.IntRange(0, 4),
    default=0,
    show_default=True,
    help="The group's priority (fixed by the publish that creates the group); with stdin, "
    "the default for lines without one.",
)
@click.option("--dedup-id", help="Publish at most once per id within the dedup window (300 s).")
@click.option(
    "--delay",
    type=float,
    metavar="SECONDS",
    help="Not delivered before SECONDS from now (the group's later messages wait too).",
)
@click.option(
    "--ttl",
    type=float,
    metavar="SECONDS",
    help="Dead-lettered (reason 'expired') instead of delivered after SECONDS.",
)
@click.option(
    "--tenant", help="The tenant of the group, if this publish creates it (docs/fairness.md)."
)
@click.option(
    "--debounce",
    metavar="KEY",
    help="Replace the group's pending message with this key instead of adding one.",
)
@click.option(
    "--max-wait",
    type=float,
    metavar="SECONDS",
    help="With --debounce and --delay: delivered at the latest SECONDS after the run's first.",
)
@click.option(
    "--keep",
    type=float,
    metavar="SECONDS",
    help="Keep the message's outcome (result or error) for SECONDS after it settles "
    "('rqlite-queue job GROUP SEQ' shows it).",
)
@click.option(
    "--batch",
    "batch_id",
    metavar="ID",
    help="Join this batch (not done yet): counted in it (docs/batches.md).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=PUBLISH_BATCH,
    show_default=True,
    help="Messages per round trip when reading stdin.",
)
@click.pass_obj
def publish(
    config: Config,
    group: str | None,
    event_json: str | None,
    priority: int,
    dedup_id: str | None,
    delay: float | None,
    ttl: float | None,
    tenant: str | None,
    debounce: str | None,
    max_wait: float | None,
    keep: float | None,
    batch_id: str | None,
    batch_size: int,
) -> int:
    """Publish EVENT_JSON into GROUP, or JSON lines from stdin.

    With GROUP and EVENT_JSON, publishes one message and prints its seq. With no arguments
    (or GROUP '-'), reads one JSON object per line from stdin,
    {"group_id": ..., "event": ..., "priority": ..., "dedup_id": ..., "delay": ...,
    "not_before": ..., "ttl": ..., "tenant": ..., "debounce": ..., "max_wait": ...,
    "keep": ..., "batch": ...} (all but group_id and event optional),
    checks every line, then publishes them in batches with a progress bar on stderr. A bad
    line publishes nothing."""
    if group is None or group == "-":
        if event_json is not None:
            raise click.UsageError("EVENT_JSON cannot be given with stdin input ('-')")
        given = (dedup_id, delay, ttl, tenant, debounce, max_wait, keep, batch_id)
        if any(v is not None for v in given):
            raise click.UsageError(
                "--dedup-id, --delay, --ttl, --tenant, --debounce, --max-wait, --keep and --batch "
                "apply to one message; put them in the lines"
            )
        if sys.stdin.isatty():
            raise click.UsageError("give GROUP and EVENT_JSON, or pipe JSON lines to stdin")
        _publish_batches(config, _read_lines(sys.stdin, priority), batch_size)
        return 0
    if event_json is None:
        raise click.UsageError("missing EVENT_JSON (or use '-' to read JSON lines from stdin)")
    event = _parse_event(event_json)
    with config.transport() as queue:
        seq = queue.publish(
            group,
            event,
            priority,
            dedup_id=dedup_id,
            delay=delay,
            ttl=ttl,
            tenant=tenant,
            debounce=debounce,
            max_wait=max_wait,
            keep=keep,
            batch=batch_id,
        )
    click.echo(seq)
    return 0


def _publish_batches(
    config: Config, lines: list[tuple[int, dict[str, Any]]], batch_size: int
) -> None:
    err = _stderr()
    done = 0
    items = [item for _, item in lines]
    with config.transport() as queue:
        try:  # every line checked before any is sent: a bad line publishes nothing
            queue.check_publish_many(items)
        except InvalidArgument as exc:
            where = f"stdin line {lines[exc.index][0]}: " if exc.index is not None else ""
            raise InvalidArgument(f"{where}{exc}") from None
        progress = Progress(
            TextColumn("publishing"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            disable=not err.is_terminal,
        )
        with progress:
            task = progress.add_task("publish", total=len(items))
            for start in range(0, len(items), batch_size):
                batch = items[start : start + batch_size]
                try:
                    queue.publish_many(batch)
                except QueueError as exc:
                    raise type(exc)(
                        f"{exc} ({done} of {len(items)} messages were published before this "
                        f"batch of {len(batch)}; lines {start + 1}-{start + len(batch)})"
                    ) from exc
                done += len(batch)
                progress.update(task, completed=done)
    err.print(f"published {done} messages")


# ------------------------------------------------------------------------------ stats, peek


@cli.command()
@seconds_option(
    "--watch", least=0.1, if_bare=2.0, help="Refresh every SECONDS (2 if not given) until Ctrl-C."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
@click.pass_obj
def stats(config: Config, watch: float | None, as_json: bool) -> int:
    """Show the queue's depth, groups, in-flight, parked and dead counts."""
    with config.transport() as queue:
        if watch is None:
            snapshot = queue.stats()
            if as_json:
                click.echo(_json(_stats_dict(snapshot)))
            else:
                _stats_table(snapshot).print(f"queue {config.queue!r}")
            return 0
        if as_json:
            raise click.UsageError("--json and --watch do not go together")

        def render() -> RenderableType:
            title = f"queue {config.queue!r} at {time.strftime('%H:%M:%S')}"
            try:
                return Group(Text(title), _stats_table(queue.stats()))
            except QueueError as exc:
                return Group(Text(title), Text(f"error: {exc}", style="red"))

        console = _stdout()
        with contextlib.suppress(KeyboardInterrupt):
            if not console.is_terminal:  # a log or a pipe: one snapshot after another
                while True:
                    console.print(render())
                    sys.stdout.flush()
                    time.sleep(watch)
            with Live(render(), console=console) as live:
                while True:
                    time.sleep(watch)
                    live.update(render())
    return 0


@cli.command()
@click.argument("group")
@click.option(
    "--limit", type=click.IntRange(min=1), default=10, show_default=True, help="At most this many."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines {seq, event}.")
@click.pass_obj
def peek(config: Config, group: str, limit: int, as_json: bool) -> int:
    """Show GROUP's next messages, without leasing them."""
    with config.transport() as queue:
        messages = queue.peek(group, limit)
    if as_json:
        for seq, event in messages:
            click.echo(_json({"seq": seq, "event": event}))
        return 0
    if not messages:
        click.echo(f"group {group!r} has no messages")
        return 0
    table = Listing(("seq", Cell.KEEP, "right"), ("event", Cell.SHORT))
    for seq, event in messages:
        table.add_row(str(seq), _json(event))
    table.print(f"group {group!r}: next {len(messages)} messages")
    return 0
