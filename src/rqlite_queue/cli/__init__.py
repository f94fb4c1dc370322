"""The `rqlite-queue` command: publish, inspect, work, operate and run local clusters.

Uses click and rich (dependencies of the package, for the command alone: the library never
imports them). Every queue command takes the queue from `--url` (or `$RQLITE_QUEUE_URL`) and
`--queue`; payloads are JSON (the default codec). Errors print one `error: ...` line on stderr;
the exit status is 1 for a queue error and 2 for bad usage. One module per command group; each
registers its commands on the `cli` group of `_base`."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import click

from ..errors import QueueError, Unavailable
from . import (
    admin,
    backup,
    batches,
    dashboard,
    jobs,
    local,
    messages,
    schedules,
    shards,
    tenants,
    work,
)
from ._base import _error, _state, cli

__all__ = ["cli", "main"]
_COMMAND_MODULES = (
    messages,
    jobs,
    batches,
    work,
    admin,
    tenants,
    schedules,
    shards,
    backup,
    dashboard,
    local,
)


def main(argv: Sequence[str] | None = None) -> int:
    """The `rqlite-queue` console script: runs the command, returns the exit status.

    After `worker`, the process leaves at once (`os._exit`, output flushed): Python joins
    executor threads at exit, so a handler thread still running after the grace period (its
    lease already nacked, its result to be dropped) would otherwise hold the process."""
    status = _run(argv)
    if _state.exit_hard:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(status)
    return status


class _NeverRaised(click.UsageError):
    pass


# click >= 8.2 raises this for a group run without a command (8.1 prints the help itself).
_NoArgsIsHelp: type[click.UsageError] = getattr(click.exceptions, "NoArgsIsHelpError", _NeverRaised)


def _next_step(exc: QueueError) -> str:
    """What to do next, for the errors whose message leaves it to the caller."""
    if isinstance(exc, Unavailable) and exc.refused:
        return " ('rqlite-queue cluster up' starts a local one)"
    return ""


def _run(argv: Sequence[str] | None) -> int:
    try:
        result = cli.main(
            args=list(argv) if argv is not None else None,
            prog_name="rqlite-queue",
            standalone_mode=False,
        )
    except _NoArgsIsHelp as exc:
        click.echo(exc.ctx.get_help() if exc.ctx is not None else str(exc))
        return 0
    except click.UsageError as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        _error(exc.format_message() + hint)
        return 2
    except click.ClickException as exc:
        _error(exc.format_message())
        return exc.exit_code
    except click.exceptions.Abort:
        _error("interrupted")
        return 130
    except QueueError as exc:
        _error(str(exc) + _next_step(exc))
        return 1
    except Exception as exc:
        if _state.verbose:
            import traceback

            traceback.print_exc()
        _error(f"{type(exc).__name__}: {exc}")
        return 1
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
