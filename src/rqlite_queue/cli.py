"""The `rqlite-queue` command: publish, inspect, work and dead-letter from a shell.

Uses click and rich (dependencies of the package, for this module alone). Every command takes
the queue from `--url` (or `$RQLITE_QUEUE_URL`) and `--queue`; payloads are JSON (the default
codec). Errors print one `error: ...` line on stderr; the exit status is 1 for a queue error
and 2 for bad usage."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ._async.transport import AsyncTransport
from ._sync.transport import Transport
from .core import QueueCore
from .errors import InvalidArgument, QueueError
from .lease import DeadLetter, Stats
from .timefmt import duration, utc

DEFAULT_URL = "sqlite:///rqlite-queue.db"
"""The embedded queue in `./rqlite-queue.db` when neither `--url` nor `$RQLITE_QUEUE_URL`
is given."""
URL_ENV = "RQLITE_QUEUE_URL"
PUBLISH_BATCH = 500

log = logging.getLogger("rqlite_queue.cli")


@dataclass
class _State:
    verbose: bool = False
    exit_hard: bool = False
    """Set by `worker`: leave with `os._exit` (see `main`)."""


_state = _State()


@dataclass(frozen=True)
class Config:
    url: str
    queue: str
    timeout: float

    def options(self) -> dict[str, Any]:
        """`from_url` options: wait `timeout` for the backend, and on rqlite let each
        operation retry (failover, lost replies) for as long."""
        options: dict[str, Any] = {"queue": self.queue, "connect_timeout": self.timeout}
        if self.url.startswith(("http://", "https://")):
            options["deadline"] = self.timeout
        return options

    @contextlib.contextmanager
    def transport(self) -> Iterator[Transport]:
        """A connected sync transport, closed afterwards."""
        transport = Transport.from_url(self.url, **self.options())
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


def _stats_table(stats: Stats) -> Table:
    table = Table()
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("messages (depth)", str(stats.depth))
    table.add_row("groups", str(stats.groups))
    table.add_row("in flight (leased)", str(stats.in_flight))
    table.add_row("parked", str(stats.parked))
    table.add_row("held", str(stats.held))
    table.add_row("delayed", str(stats.delayed))
    table.add_row("dead letters", str(stats.dead))
    table.add_row("expired", str(stats.expired))
    table.add_row("oldest message", "-" if stats.oldest_age is None else duration(stats.oldest_age))
    for priority in range(5):
        table.add_row(f"priority {priority}", str(stats.by_priority.get(priority, 0)))
    if stats.paused:
        table.add_row("claims", "[bold red]paused[/] ('rqlite-queue resume')")
    return table


def _stats_dict(stats: Stats) -> dict[str, Any]:
    data = dataclasses.asdict(stats)
    data["by_priority"] = {str(p): stats.by_priority.get(p, 0) for p in range(5)}
    return data


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
    "after about this long; on rqlite, also how long an operation retries through a failover.",
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
        logging.getLogger("httpx").setLevel(logging.WARNING)
    _state.verbose = verbose
    ctx.obj = Config(url=url, queue=queue, timeout=timeout)


# ------------------------------------------------------------------------------ publish


def _parse_event(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint="'EVENT_JSON'") from exc


def _read_lines(stream: Any, default_priority: int, queue: str) -> list[dict[str, Any]]:
    """Every JSON line of stdin, each checked as `publish_many` would check it (nothing is
    published if any line is bad)."""
    checker = QueueCore(queue=queue, clock=time.time, token=str, chance=lambda: 1.0)
    items: list[dict[str, Any]] = []
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
        try:
            checker.publish_many([item])
        except InvalidArgument as exc:
            raise InvalidArgument(f"stdin line {number}: {exc}") from None
        items.append(item)
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
    batch_size: int,
) -> int:
    """Publish EVENT_JSON into GROUP, or JSON lines from stdin.

    With GROUP and EVENT_JSON, publishes one message and prints its seq. With no arguments
    (or GROUP '-'), reads one JSON object per line from stdin,
    {"group_id": ..., "event": ..., "priority": ..., "dedup_id": ..., "delay": ...,
    "not_before": ..., "ttl": ...} (all but group_id and event optional), checks every line,
    then publishes them in batches with a progress bar on stderr. A bad line publishes
    nothing."""
    if group is None or group == "-":
        if event_json is not None:
            raise click.UsageError("EVENT_JSON cannot be given with stdin input ('-')")
        if dedup_id is not None or delay is not None or ttl is not None:
            raise click.UsageError(
                "--dedup-id, --delay and --ttl apply to one message; put them in the lines"
            )
        if sys.stdin.isatty():
            raise click.UsageError("give GROUP and EVENT_JSON, or pipe JSON lines to stdin")
        items = _read_lines(sys.stdin, priority, config.queue)
        _publish_batches(config, items, batch_size)
        return 0
    if event_json is None:
        raise click.UsageError("missing EVENT_JSON (or use '-' to read JSON lines from stdin)")
    event = _parse_event(event_json)
    with config.transport() as queue:
        seq = queue.publish(group, event, priority, dedup_id=dedup_id, delay=delay, ttl=ttl)
    click.echo(seq)
    return 0


def _publish_batches(config: Config, items: list[dict[str, Any]], batch_size: int) -> None:
    err = _stderr()
    done = 0
    with config.transport() as queue:
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
@click.option(
    "--watch",
    type=click.FloatRange(min=0.1),
    is_flag=False,
    flag_value=2.0,
    default=None,
    metavar="[SECONDS]",
    help="Refresh every SECONDS (2 if not given) until Ctrl-C.",
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
                _stdout().print(f"queue {config.queue!r}", _stats_table(snapshot), sep="\n")
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
    table = Table()
    table.add_column("seq", justify="right")
    table.add_column("event", overflow="fold")
    for seq, event in messages:
        table.add_row(str(seq), _json(event))
    _stdout().print(f"group {group!r}: next {len(messages)} messages", table, sep="\n")
    return 0


# ------------------------------------------------------------------------------ worker


class HandlerParam(click.ParamType):  # type: ignore[type-arg]
    """`module:function` (or `module:object.attribute`), imported with the current directory
    first on `sys.path`."""

    name = "module:function"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if callable(value):
            return value
        module_name, _, attribute = str(value).partition(":")
        if not module_name or not attribute:
            self.fail(f"{value!r} is not module:function", param, ctx)
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and module_name.startswith(exc.name):
                self.fail(f"no module named {module_name!r} (looked in {cwd} too)", param, ctx)
            raise HandlerError(f"importing {module_name!r} failed: {exc!r}") from exc
        except Exception as exc:
            raise HandlerError(f"importing {module_name!r} failed: {exc!r}") from exc
        target: Any = module
        for part in attribute.split("."):
            try:
                target = getattr(target, part)
            except AttributeError:
                self.fail(f"{module_name!r} has no attribute {attribute!r}", param, ctx)
        if not callable(target):
            self.fail(f"{value!r} is not callable", param, ctx)
        return target


def _is_async(handler: Callable[..., Any]) -> bool:
    call = getattr(handler, "__call__", None)  # noqa: B004 (a callable object's __call__)
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


@cli.command()
@click.argument("handler", type=HandlerParam())
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True)
@click.option(
    "--visibility",
    type=click.FloatRange(min=0, min_open=True),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="Lease length; running handlers are extended every third of it.",
)
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="A message that failed this many times is dead-lettered.",
)
@click.option(
    "--backoff",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="First retry delay (the group is parked), doubling up to 300 s.",
)
@click.option(
    "--min-priority-share",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Share of claim rounds that claim only groups of priority >= --priority-floor.",
)
@click.option("--priority-floor", type=click.IntRange(0, 4), default=3, show_default=True)
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="On SIGINT/SIGTERM, how long running handlers may finish before they are nacked.",
)
@click.option("--worker-id", help="Default: host-pid-random.")
@click.option(
    "--poll-interval",
    type=click.FloatRange(min=0, min_open=True),
    default=0.05,
    show_default=True,
    metavar="SECONDS",
    help="Idle, how often to look for new messages (a read, no write).",
)
@click.option(
    "--non-retryable",
    "non_retryable",
    type=HandlerParam(),
    multiple=True,
    metavar="module:Exception",
    help="An exception class (repeatable) whose messages are dead-lettered at once.",
)
@click.option(
    "--hold-on-dead-letter",
    is_flag=True,
    help="A dead letter also holds its group: its later messages wait for "
    "'rqlite-queue group release'.",
)
@click.option(
    "--burst",
    is_flag=True,
    help="Stop (exit 0) once a claim finds nothing and every handler has finished.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    metavar="PORT",
    help="Serve Prometheus metrics on http://HOST:PORT/metrics (needs the metrics extra; "
    "0: any free port, logged).",
)
@click.option("--metrics-host", default="0.0.0.0", show_default=True, metavar="HOST")
@click.pass_obj
def worker(
    config: Config,
    handler: Callable[..., Any],
    concurrency: int,
    visibility: float,
    max_attempts: int,
    backoff: float,
    min_priority_share: float,
    priority_floor: int,
    grace: float,
    worker_id: str | None,
    poll_interval: float,
    non_retryable: tuple[Any, ...],
    hold_on_dead_letter: bool,
    burst: bool,
    metrics_port: int | None,
    metrics_host: str,
) -> int:
    """Run HANDLER (module:function) on every message until SIGINT/SIGTERM.

    The handler is called with a Lease (lease.event is the decoded JSON; also lease.group_id,
    lease.seq, lease.attempts); returning acks the message, raising retries it after a
    backoff and dead-letters it after --max-attempts. An 'async def' handler runs on
    asyncio (AsyncWorker), any other in threads (Worker). The current directory is searched
    first for the module. On a signal the worker stops claiming, lets handlers finish within
    --grace, nacks the rest and exits 0. Errors no retry can mend (wrong credentials, a
    newer schema) stop it with exit status 1."""
    from .worker import Backoff

    for exc_type in non_retryable:
        if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
            raise click.BadParameter(
                f"{exc_type!r} is not an exception class", param_hint="'--non-retryable'"
            )

    options: dict[str, Any] = {
        "concurrency": concurrency,
        "visibility": visibility,
        "max_attempts": max_attempts,
        "backoff": Backoff(base=backoff, cap=max(300.0, backoff)),
        "worker_id": worker_id,
        "priority_share": min_priority_share,
        "priority_floor": priority_floor,
        "grace": grace,
        "poll_interval": poll_interval,
        "non_retryable": non_retryable,
        "hold_group_on_dead_letter": hold_on_dead_letter,
    }
    _state.exit_hard = True
    run = {"until_empty": burst}
    if _is_async(handler):
        asyncio.run(_run_async_worker(config, handler, options, run, metrics_port, metrics_host))
    else:
        _run_sync_worker(config, handler, options, run, metrics_port, metrics_host)
    return 0


def _run_sync_worker(
    config: Config,
    handler: Callable[..., Any],
    options: dict[str, Any],
    run: dict[str, Any],
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    from .worker import Worker

    with config.transport() as queue:
        runner = Worker(queue, handler, **options)
        server = None
        if metrics_port is not None:
            from .metrics import serve_metrics

            server = serve_metrics(runner, metrics_port, host=metrics_host)
            log.info("metrics on http://%s:%d/metrics", metrics_host, server.port)
        try:
            runner.run(**run)
        finally:
            if server is not None:
                server.stop()


async def _run_async_worker(
    config: Config,
    handler: Callable[..., Any],
    options: dict[str, Any],
    run: dict[str, Any],
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    from .worker import AsyncWorker

    queue = await AsyncTransport.from_url(config.url, **config.options())
    async with queue:
        runner = AsyncWorker(queue, handler, **options)
        server = None
        if metrics_port is not None:
            from .metrics import serve_metrics

            server = serve_metrics(runner, metrics_port, host=metrics_host)
            log.info("metrics on http://%s:%d/metrics", metrics_host, server.port)
        try:
            await runner.run(**run)
        finally:
            if server is not None:
                server.stop()


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
    table = Table()
    for column in ("group", "prio", "state", "depth", "head", "tries", "until", "holder", "age"):
        table.add_column(
            column, justify="left" if column in ("group", "state", "holder") else "right"
        )
    for info in infos:
        table.add_row(
            info.group_id,
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
    _stdout().print(title, table, sep="\n")
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
    table = Table()
    for column in ("name", "group", "every / cron", "priority", "next tick", "event"):
        table.add_column(column, overflow="fold")
    for s in schedules:
        cadence = f"{s.every:g} s" if s.every is not None else str(s.cron)
        table.add_row(s.name, s.group_id, cadence, str(s.priority), utc(s.next_at),
                      _json(s.event))  # fmt: skip
    _stdout().print(table)
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


# ------------------------------------------------------------------------------ dlq


@cli.group()
def dlq() -> None:
    """Dead letters: list, requeue or purge them."""


def _dead_table(letters: Sequence[DeadLetter]) -> Table:
    table = Table()
    table.add_column("seq", justify="right")
    table.add_column("group", overflow="fold")
    table.add_column("prio", justify="right")
    table.add_column("attempts", justify="right")
    table.add_column("dead")
    table.add_column("reason", overflow="fold")
    table.add_column("event", overflow="fold")
    for letter in letters:
        table.add_row(
            str(letter.seq),
            letter.group_id,
            str(letter.priority),
            str(letter.attempts),
            _ago(letter.dead_at),
            letter.reason,
            _json(letter.event),
        )
    return table


@dlq.command("list")
@click.option(
    "--limit", type=click.IntRange(min=1), default=100, show_default=True, help="At most this many."
)
@click.option("--group", "group_id", help="Only this group's dead letters.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
@click.pass_obj
def dlq_list(config: Config, limit: int, group_id: str | None, as_json: bool) -> int:
    """List dead letters (in seq order) with their reasons."""
    with config.transport() as queue:
        letters = queue.dead_letters(limit, group_id=group_id)
    if as_json:
        for letter in letters:
            click.echo(_json(dataclasses.asdict(letter)))
    elif not letters:
        click.echo("no dead letters")
    else:
        title = f"{len(letters)} dead letters"
        if len(letters) == limit:
            title += " (--limit reached: there may be more)"
        _stdout().print(title, _dead_table(letters), sep="\n")
    return 0


@dlq.command()
@click.argument("seqs", nargs=-1, type=int, metavar="[SEQ...]")
@click.pass_obj
def requeue(config: Config, seqs: tuple[int, ...]) -> int:
    """Put dead letters (all, or those SEQs) back at the tail of their groups."""
    with config.transport() as queue:
        count = queue.requeue_dead(list(seqs) if seqs else None)
    click.echo(f"requeued {count} dead letters")
    return 0


@dlq.command()
@click.argument("seqs", nargs=-1, type=int, metavar="[SEQ...]")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def purge(config: Config, seqs: tuple[int, ...], yes: bool) -> int:
    """Delete dead letters (all, or those SEQs) for good."""
    what = f"dead letters {', '.join(map(str, seqs))}" if seqs else "ALL dead letters"
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("purge deletes for good: pass --yes to confirm")
        click.confirm(f"Delete {what} of queue {config.queue!r} for good?", abort=True)
    with config.transport() as queue:
        count = queue.purge_dead(list(seqs) if seqs else None)
    click.echo(f"purged {count} dead letters")
    return 0


# ------------------------------------------------------------------------------ dashboard


def _quiet_server() -> type[Any]:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """uvicorn's server without its own signal handling (which re-raises the signal once
        stopped): the command sets its own handlers, and exits 0 on SIGINT or SIGTERM."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietServer


def _credentials(value: str | None) -> tuple[str, str] | None:
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise click.BadParameter("expected USER:PASSWORD", param_hint="--basic-auth")
    return user, password


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8321, show_default=True)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Let the dashboard change the queue (hold, cancel, requeue, purge, pause...).",
)
@click.option(
    "--basic-auth",
    envvar="RQLITE_QUEUE_DASHBOARD_AUTH",
    metavar="USER:PASSWORD",
    help="Ask for these credentials (also $RQLITE_QUEUE_DASHBOARD_AUTH).",
)
@click.option(
    "--token",
    envvar="RQLITE_QUEUE_DASHBOARD_TOKEN",
    help="Accept this bearer token (also $RQLITE_QUEUE_DASHBOARD_TOKEN).",
)
@click.option(
    "--refresh",
    type=click.FloatRange(min=0.2),
    default=2.0,
    show_default=True,
    help="Seconds between live refreshes of a page.",
)
@click.pass_obj
def dashboard(
    config: Config,
    host: str,
    port: int,
    allow_actions: bool,
    basic_auth: str | None,
    token: str | None,
    refresh: float,
) -> int:
    """Serve the web dashboard (read-only unless --allow-actions) until Ctrl-C."""
    try:
        import uvicorn

        from .dashboard import create_app
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs the 'dashboard' extra: pip install 'rqlite-queue[dashboard]' "
            f"({exc.name} is missing)"
        ) from None
    credentials = _credentials(basic_auth)
    quiet_server = _quiet_server()

    async def serve() -> None:
        transport = await AsyncTransport.from_url(config.url, **config.options())
        try:
            app = create_app(
                transport,
                allow_actions=allow_actions,
                basic_auth=credentials,
                bearer_token=token or None,
                refresh=refresh,
            )
            server = quiet_server(
                uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
            )
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, setattr, server, "should_exit", True)
            serving = asyncio.create_task(server.serve())
            while not server.started and not serving.done():
                await asyncio.sleep(0.02)
            if not server.started:  # the port could not be bound: uvicorn logged why
                await serving
                raise click.ClickException(f"could not listen on {host}:{port}")
            bound = server.servers[0].sockets[0].getsockname()[1]
            mode = "actions allowed" if allow_actions else "read-only"
            click.echo(f"dashboard of queue {config.queue!r} on http://{host}:{bound}/ ({mode})")
            sys.stdout.flush()
            await serving
        finally:
            await transport.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


# ------------------------------------------------------------------------------ cluster


@cli.group()
def cluster() -> None:
    """Local rqlite clusters for development."""


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@cluster.command()
@click.argument("n", type=click.IntRange(min=1), default=3)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Keep the nodes' data here (started again on it: the same cluster and queue).",
)
@click.option(
    "--http-port",
    type=click.IntRange(1, 65533),
    help="Node 1's HTTP port; node i's is this + 2(i-1), its Raft port the one above.",
)
def up(n: int, data_dir: Path | None, http_port: int | None) -> int:
    """Start a local cluster of N rqlited nodes (default 3) until Ctrl-C.

    Uses the pinned rqlited binary ($RQLITED, or the one 'make rqlited' builds). The nodes
    listen on 127.0.0.1, on free ports unless --http-port, and keep their data in a temporary
    directory removed when the cluster stops, unless --data-dir; prints the --url to give the
    other commands."""
    from .cluster import RQLITED_VERSION, Cluster, ClusterError, RqlitedNotFound, find_rqlited

    try:
        binary = find_rqlited()
    except RqlitedNotFound as exc:
        raise click.ClickException(str(exc)) from exc
    # Explicit, so that Ctrl-C works even when a script started us with SIGINT ignored.
    previous = {
        sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    local = Cluster(n, binary=binary, data_dir=data_dir, http_port=http_port)
    ready = False
    try:
        try:
            try:
                local.start()
            except ClusterError as exc:  # a port taken, a data dir of another size...
                raise click.ClickException(str(exc)) from exc
            leader = local.leader()
            ready = True
            kept = "kept" if data_dir is not None else "removed on stop"
            click.echo(
                f"rqlite {RQLITED_VERSION}: {n}-node cluster up (data in {local.dir}, {kept})"
            )
            for node in local.nodes:
                role = "leader" if node is leader else "follower"
                click.echo(f"  {node.node_id}  {node.http_url}  {role}  pid {node.pid}")
            click.echo(f"use: --url {local.url}")
            click.echo(f"  or: export {URL_ENV}={local.url}")
            click.echo("Ctrl-C stops it.")
            while True:
                time.sleep(0.5)
                crashed = [node.node_id for node in local.nodes if node.crashed]
                if crashed:
                    raise click.ClickException(f"node(s) {', '.join(crashed)} exited")
        except KeyboardInterrupt:
            if not ready:
                return 130
            click.echo("stopping...", err=True)
    finally:
        for sig in previous:  # a second Ctrl-C must not interrupt the stop
            signal.signal(sig, signal.SIG_IGN)
        local.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo("stopped", err=True)
    return 0


# ------------------------------------------------------------------------------ demo, bench

_PASSTHROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


@cli.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def demo(ctx: click.Context, args: tuple[str, ...]) -> int:
    """Run the demo workload (python -m rqlite_queue.demo; 'demo --help' for its options).

    By default it starts its own local 3-node cluster; a --url given to rqlite-queue (or
    $RQLITE_QUEUE_URL) is passed on to it."""
    from . import demo as demo_module

    argv = list(args)
    source = ctx.parent.get_parameter_source("url") if ctx.parent is not None else None
    if source is not None and source is not click.core.ParameterSource.DEFAULT:
        argv = ["--url", ctx.obj.url, *argv]
    return demo_module.main(argv)


def _bench_script() -> Path | None:
    script = Path(__file__).resolve().parents[2] / "bench" / "run.py"
    return script if script.is_file() else None


@cli.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench(args: tuple[str, ...]) -> int:
    """Run the benchmarks (bench/run.py of a source checkout; 'bench --help' for options)."""
    script = _bench_script()
    if script is None:
        raise click.ClickException(
            "the benchmarks are not installed with the package: run them from a source "
            "checkout (bench/run.py, or `make bench`)"
        )
    proc = subprocess.Popen([sys.executable, str(script), *args])
    try:
        return proc.wait()
    except KeyboardInterrupt:
        return proc.wait()


# ------------------------------------------------------------------------------ entry point


def _error(message: str) -> None:
    """One `error: ...` line on stderr (with --verbose, any further lines of the message)."""
    lines = [line for line in message.strip().splitlines() if line.strip()] or ["(no message)"]
    more = "" if len(lines) == 1 or _state.verbose else " (-v for details)"
    click.echo(f"error: {lines[0]}{more}", err=True)
    if _state.verbose:
        for line in lines[1:]:
            click.echo(f"  {line}", err=True)


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
        _error(str(exc))
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
