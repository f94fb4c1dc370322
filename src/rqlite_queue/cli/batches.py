"""`batch`, `batches`: a batch's state and counts, waiting for it; the batches not done."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import click
from rich.table import Table

from ..timefmt import duration, utc
from ..types import BATCH_STATES, BatchStatus
from ._base import Config, _error, _json, _stdout, cli, optional_seconds

WAIT_TIMED_OUT = 124
"""The exit status of `batch --wait` when the time ran out first (as `timeout`'s)."""
LONGEST_POLL = 1.0


@cli.command("batch")
@click.argument("batch_id", metavar="ID")
@optional_seconds(
    "--wait",
    3600.0,
    "Wait until the batch is done (or SECONDS pass; an hour if not given). Exit status: 0 "
    f"done and none failed, 1 done with failures, {WAIT_TIMED_OUT} not done yet.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
@click.pass_obj
def batch_command(config: Config, batch_id: str, wait: float | None, as_json: bool) -> int:
    """Show batch ID: open, closed or done, its counts (pending, succeeded, failed, cancelled)
    and its first failures with their reasons."""
    with config.transport() as queue:
        found = queue.batch_status(batch_id)
        if wait is not None:
            give_up, delay = time.monotonic() + wait, 0.05
            while found is not None and not found.done and time.monotonic() < give_up:
                time.sleep(min(delay, max(0.0, give_up - time.monotonic())))
                delay = min(LONGEST_POLL, delay * 2)
                found = queue.batch_status(batch_id)
    if found is None:
        _error(f"batch {batch_id}: not known (never made, or forgotten after its keep)")
        return 1
    if as_json:
        click.echo(_json(batch_dict(found)))
    else:
        _stdout().print(batch_table(found))
    if wait is None:
        return 0
    if not found.done:
        return WAIT_TIMED_OUT
    return 0 if found.failed == 0 and found.aborted is None else 1


@cli.command("batches")
@click.option(
    "--state",
    type=click.Choice(BATCH_STATES),
    default=None,
    help="Only the batches in this state (default: all that are kept).",
)
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--after", metavar="ID", help="The page after this batch id (oldest first).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line instead.")
@click.pass_obj
def batches_command(
    config: Config, state: str | None, limit: int, after: str | None, as_json: bool
) -> int:
    """List the batches, oldest first: their state and counts."""
    with config.transport() as queue:
        found = queue.batches(state=state, limit=limit, after=after)
    if as_json:
        for batch in found:
            click.echo(_json(batch_dict(batch)))
        return 0
    if not found:
        click.echo("no batches" + (" after that" if after else ""))
        return 0
    table = Table(title=f"{len(found)} batch{'es' * (len(found) != 1)}", title_justify="left")
    for column in ("id", "state", "total", "pending", "succeeded", "failed", "cancelled", "made"):
        table.add_column(column, justify="right" if column not in ("id", "state") else "left")
    for b in found:
        table.add_row(
            b.id,
            b.state,
            *(str(n) for n in (b.total, b.pending, b.succeeded, b.failed, b.cancelled)),
            utc(b.created_at),
        )
    _stdout().print(table)
    return 0


def batch_dict(batch: BatchStatus) -> dict[str, Any]:
    """A batch as JSON."""
    data = dataclasses.asdict(batch)
    data["state"] = batch.state
    return data


def batch_table(batch: BatchStatus) -> Table:
    table = Table(title=f"batch {batch.id}", title_justify="left")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    rows: list[tuple[str, str]] = [("state", batch.state)]
    if batch.shard:
        rows.append(("shard", batch.shard))
    if batch.parent is not None:
        rows.append(("within", batch.parent))
    rows += [
        ("total", str(batch.total)),
        ("pending", str(batch.pending)),
        ("succeeded", str(batch.succeeded)),
        ("failed", str(batch.failed)),
        ("cancelled", str(batch.cancelled)),
    ]
    if batch.aborted is not None:
        rows.append(("aborted", batch.aborted))
    for failure in batch.failures:
        where = f"batch {failure.batch}" if failure.batch else f"{failure.group_id}#{failure.seq}"
        if failure.shard and not failure.batch:
            where += f" ({failure.shard})"
        rows.append((f"failed: {where}", failure.reason))
    if batch.failed > len(batch.failures):
        rows.append(("", f"(and {batch.failed - len(batch.failures)} more failed)"))
    rows.append(("made", utc(batch.created_at)))
    if batch.done_at is not None:
        rows.append(
            ("done", f"{utc(batch.done_at)} ({duration(batch.done_at - batch.created_at)})")
        )
    if batch.kept_until is not None:
        rows.append(("kept until", utc(batch.kept_until)))
    for name, value in rows:
        table.add_row(name, value)
    return table
