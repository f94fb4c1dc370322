"""The `rqlite-queue` command: publish, inspect, work and dead-letter from a shell.

Uses click and rich (dependencies of the package, for this module alone). Every command takes
the queue from `--url` (or `$RQLITE_QUEUE_URL`) and `--queue`; payloads are JSON (the default
codec). Errors print one `error: ...` line on stderr; the exit status is 1 for a queue error
and 2 for bad usage."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from rich.console import Console

from .. import Transport
from ..timefmt import duration
from ..types import Stats
from ._tables import Cell, Listing

FC = TypeVar("FC", bound=Callable[..., Any])

DEFAULT_URL = "sqlite:///rqlite-queue.db"
"""The embedded queue in `./rqlite-queue.db` when neither `--url` nor `$RQLITE_QUEUE_URL`
is given."""
URL_ENV = "RQLITE_QUEUE_URL"
PUBLISH_BATCH = 500
REFUSED_TIMEOUT = 0.5
"""How long every node of a cluster never reached may refuse connections before a command
says that nothing listens there."""

log = logging.getLogger("rqlite_queue.cli")


@dataclass
class _State:
    verbose: bool = False
    exit_hard: bool = False
    """Set by `worker`: leave with `os._exit` (see `main`)."""
    announced: bool = False
    """Whether this command said already that it uses the default backend."""


_state = _State()


@dataclass(frozen=True)
class Config:
    url: str
    queue: str
    timeout: float
    defaulted: bool = False
    """Neither --url nor $RQLITE_QUEUE_URL was given: `url` is `DEFAULT_URL`."""

    def backend(self) -> str:
        """The URL to open. The default's is said on stderr, once per command: a message
        published into the local file is easily taken for one lost (a new terminal without
        the `export` of the others)."""
        if self.defaulted and not _state.announced:
            _state.announced = True
            path = os.path.abspath(self.url.removeprefix("sqlite:///"))
            click.echo(
                f"using the local file {path} (no --url, no ${URL_ENV}: give one for rqlite)",
                err=True,
            )
        return self.url

    def options(self) -> dict[str, Any]:
        """`from_url` options: wait `timeout` for the backend, and on rqlite let each
        operation retry (failover, lost replies) for as long."""
        options: dict[str, Any] = {"queue": self.queue, "connect_timeout": self.timeout}
        if "http://" in self.url or "https://" in self.url:  # one cluster, or several
            options["deadline"] = self.timeout
            # A refused connection is an answer: nothing listens there. Said at once (a
            # cluster that was never reached is not waited for, as it is by a library user).
            options["refused_timeout"] = min(REFUSED_TIMEOUT, self.timeout)
        return options

    def options_without_connect(self) -> dict[str, Any]:
        """The options of a transport built directly (not through `from_url`)."""
        return {k: v for k, v in self.options().items() if k != "connect_timeout"}

    @contextlib.contextmanager
    def transport(self) -> Iterator[Transport]:
        """A connected sync transport, closed afterwards."""
        transport = Transport.from_url(self.backend(), **self.options())
        try:
            yield transport
        finally:
            transport.close()


class HandlerError(click.ClickException):
    """The handler module was found but failed to import (exit 1, not a usage error)."""


# ------------------------------------------------------------------------------ output helpers


def _stdout() -> Console:
    return Console(highlight=False, soft_wrap=False)


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def _ago(epoch: float) -> str:
    return duration(max(0.0, time.time() - epoch)) + " ago"


def _stats_table(stats: Stats) -> Listing:
    table = Listing(("metric", Cell.KEEP), ("value", Cell.KEEP, "right"))
    table.add_row("messages (depth)", str(stats.depth))
    table.add_row("groups", str(stats.groups))
    table.add_row("in flight (leased)", str(stats.in_flight))
    table.add_row("parked", str(stats.parked))
    table.add_row("held", str(stats.held))
    table.add_row("delayed", str(stats.delayed))
    table.add_row("delayed groups", str(stats.delayed_groups))
    table.add_row("dead letters", str(stats.dead))
    table.add_row("expired", str(stats.expired))
    table.add_row("outcomes kept", str(stats.outcomes))
    table.add_row("oldest message", "-" if stats.oldest_age is None else duration(stats.oldest_age))
    for priority in range(5):
        count = str(stats.by_priority.get(priority, 0))
        if (age := stats.oldest_by_priority.get(priority)) is not None:
            count += f" (oldest {duration(age)})"
        table.add_row(f"priority {priority}", count)
    if stats.paused:
        table.add_row("claims", "[bold red]paused[/] ('rqlite-queue resume')")
    return table


def _stats_dict(stats: Stats) -> dict[str, Any]:
    data = dataclasses.asdict(stats)
    data["by_priority"] = {str(p): stats.by_priority.get(p, 0) for p in range(5)}
    return data


def optional_seconds(
    name: str, given_alone: float, text: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An option that takes SECONDS, or none (then `given_alone`), or is left out (None)."""
    return click.option(
        name,
        type=click.FloatRange(min=0),
        is_flag=False,
        flag_value=given_alone,
        default=None,
        metavar="[SECONDS]",
        help=text,
    )


def _error(message: str) -> None:
    """One `error: ...` line on stderr (with --verbose, any further lines of the message)."""
    lines = [line for line in message.strip().splitlines() if line.strip()] or ["(no message)"]
    more = "" if len(lines) == 1 or _state.verbose else " (-v for details)"
    click.echo(f"error: {lines[0]}{more}", err=True)
    if _state.verbose:
        for line in lines[1:]:
            click.echo(f"  {line}", err=True)


def seconds_option(name: str, *, least: float, if_bare: float, help: str) -> Callable[[FC], FC]:
    """An option of seconds that may be given bare (`--wait`: `if_bare`) or with its value
    (`--wait 30`); absent, None."""
    return click.option(
        name,
        type=click.FloatRange(min=least),
        is_flag=False,
        flag_value=if_bare,
        default=None,
        metavar="[SECONDS]",
        help=help,
    )


def _parse_event(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="'EVENT_JSON'") from exc


# ------------------------------------------------------------------------------ the group


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--url",
    envvar=URL_ENV,
    show_envvar=True,
    default=DEFAULT_URL,
    show_default=True,
    metavar="URL",
    help=(
        "The queue's backend: http(s)://host:port[,host:port...] (rqlite, any nodes of the "
        "cluster) or sqlite:///path.db (embedded). Default: the embedded SQLite file "
        "rqlite-queue.db in the current directory."
    ),
)
@click.option(
    "--queue",
    default="default",
    show_default=True,
    help="Queue name (lower-case letters, digits, _; several queues share one database).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=15.0,
    show_default=True,
    metavar="SECONDS",
    help="Give up on a backend that does not answer (or an rqlite cluster without a leader) "
    "after about this long (a URL where nothing listens at all is said at once); on rqlite, "
    "also how long an operation retries through a failover.",
)
@click.option("-v", "--verbose", is_flag=True, help="Debug logging and full error details.")
@click.pass_context
def cli(ctx: click.Context, url: str, queue: str, timeout: float, verbose: bool) -> None:
    """A per-group FIFO work queue on rqlite (or embedded SQLite).

    Messages published into a group are delivered in order, one at a time; groups are worked
    on in parallel and served round-robin."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not verbose:
        logging.getLogger("urllib3").setLevel(logging.WARNING)
    _state.verbose = verbose
    _state.announced = False
    defaulted = ctx.get_parameter_source("url") is click.core.ParameterSource.DEFAULT
    ctx.obj = Config(url=url, queue=queue, timeout=timeout, defaulted=defaulted)
