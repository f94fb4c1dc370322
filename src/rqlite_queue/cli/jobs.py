"""`job`: one message as a job: its state and outcome, waiting for it, cancelling it."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import click
from rich.table import Table

from ..timefmt import duration, utc
from ..types import JobResult
from ._base import Config, _error, _json, _stdout, cli, seconds_option

WAIT_TIMED_OUT = 124
"""The exit status of `job --wait` when the time ran out first (as `timeout`'s)."""


@cli.command("job")
@click.argument("group_id", metavar="GROUP")
@click.argument("seq", type=click.IntRange(min=1))
@seconds_option(
    "--wait",
    least=0,
    if_bare=3600.0,
    help="Wait until the job is over (or SECONDS pass; an hour if not given). Exit status: 0 "
    f"succeeded, 1 failed, cancelled or expired, {WAIT_TIMED_OUT} still not over.",
)
@click.option(
    "--cancel",
    is_flag=True,
    help="Cancel it: a queued message is removed at once; a running one's worker is told, and "
    "it settles as cancelled.",
)
@click.option("--reason", default="cancelled", show_default=True, help="The cancel's reason.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation (with --cancel).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
@click.pass_obj
def job_command(
    config: Config,
    group_id: str,
    seq: int,
    wait: float | None,
    cancel: bool,
    reason: str,
    yes: bool,
    as_json: bool,
) -> int:
    """Show message SEQ of GROUP as a job: queued, running (its progress, attempt and worker),
    or its outcome (result or error, kept for its publish's --keep seconds)."""
    if cancel and wait is not None:
        raise click.UsageError("--cancel and --wait do not go together")
    if cancel and not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("--cancel removes or stops the job: pass --yes to confirm")
        click.confirm(f"Cancel message {seq} of group {group_id!r}?", abort=True)
    with config.transport() as queue:
        if cancel:
            done = queue.cancel(group_id, seq, reason)
            if done is None:
                _error(f"{group_id}#{seq}: nothing to cancel (it is over, or was never queued)")
                return 1
            click.echo(
                f"{group_id}#{seq}: "
                + ("cancelled" if done == "cancelled" else "cancelling: its worker is told")
            )
        found = queue.result(group_id, seq, wait=wait or 0.0)
    if found is None:
        _error(
            f"{group_id}#{seq}: no such job (never published, or settled without keeping "
            f"its outcome, or kept and pruned since)"
        )
        return 1
    if as_json:
        click.echo(_json(job_dict(found)))
    else:
        _stdout().print(job_table(found))
    if wait is None:
        return 0
    if not found.final:
        return WAIT_TIMED_OUT
    return 0 if found.status == "succeeded" else 1


def job_dict(job: JobResult) -> dict[str, Any]:
    """A job as JSON."""
    data = dataclasses.asdict(job)
    data["headers"] = dict(job.headers)
    data["final"] = job.final
    return data


def job_table(job: JobResult) -> Table:
    table = Table(title=f"{job.group_id}#{job.seq}", title_justify="left")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    status = job.status if job.cancelling is None else f"{job.status} (cancelling)"
    rows: list[tuple[str, str]] = [("status", status)]
    rows.append(("attempts", str(job.attempts)))
    if job.workers:
        rows.append(("workers", ", ".join(job.workers)))
    if job.progress is not None:
        rows.append(("progress", _json(job.progress)))
    if job.result is not None:
        rows.append(("result", _json(job.result)))
    if job.reason is not None:
        rows.append(("reason", job.reason))
    if job.cancelling is not None:
        rows.append(("cancel", job.cancelling))
    for error in job.errors:
        rows.append((f"error (attempt {error.attempt})", f"{error.type}: {error.message}"))
    if job.error is not None and job.error.traceback:
        rows.append(("traceback", job.error.traceback.rstrip()))
    rows.append(("event", _json(job.event)))
    if job.headers:
        rows.append(("headers", _json(dict(job.headers))))
    rows.append(("enqueued", utc(job.enqueued_at)))
    if job.started_at is not None:
        rows.append(("started", utc(job.started_at)))
    if job.finished_at is not None:
        took = "" if job.started_at is None else f" ({duration(job.finished_at - job.started_at)})"
        rows.append(("finished", utc(job.finished_at) + took))
    if job.kept_until is not None:
        rows.append(("kept until", utc(job.kept_until)))
    for name, value in rows:
        table.add_row(name, value)
    return table
