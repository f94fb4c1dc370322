"""`worker`: run a handler on the queue's messages."""

from __future__ import annotations

import asyncio
import errno
import importlib
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from .. import AsyncTransport
from ..worker import is_async_handler
from ._base import (
    Config,
    HandlerError,
    _state,
    cli,
    log,
)

if TYPE_CHECKING:
    from ..metrics import MetricsServer

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
    help="First retry delay (the group is parked), doubling up to 300 s, with jitter: each "
    "wait is 50-100% of its step (the first 0.5-1 x SECONDS, the next 1-2 x...).",
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
    "--follow-ups",
    is_flag=True,
    help="The handler returns the messages its work produced (as publish_many takes them, or "
    "None): published with its ack, in the same transaction, exactly once.",
)
@click.option(
    "--schedules/--no-schedules",
    default=True,
    show_default=True,
    help="Publish the queue's due schedule ticks between claims (--no-schedules: leave them "
    "to other workers or 'rqlite-queue scheduler').",
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
    follow_ups: bool,
    schedules: bool,
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
    from ..worker import Backoff

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
        "follow_ups": follow_ups,
        "schedules": schedules,
    }
    _state.exit_hard = True
    run = {"until_empty": burst}
    if is_async_handler(handler):
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
    from ..worker import Worker

    with config.transport() as queue:
        runner = Worker(queue, handler, **options)
        server = None
        if metrics_port is not None:
            server = _serve_metrics(runner, metrics_port, metrics_host)
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
    from ..worker import AsyncWorker

    queue = await AsyncTransport.from_url(config.backend(), **config.options())
    async with queue:
        runner = AsyncWorker(queue, handler, **options)
        server = None
        if metrics_port is not None:
            server = _serve_metrics(runner, metrics_port, metrics_host)
        try:
            await runner.run(**run)
        finally:
            if server is not None:
                server.stop()


def _serve_metrics(runner: Any, port: int, host: str) -> MetricsServer:
    from ..metrics import serve_metrics

    try:
        server = serve_metrics(runner, port, host=host)
    except OSError as exc:
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if exc.errno == errno.EADDRINUSE:
            raise click.ClickException(
                f"cannot serve metrics on {shown}: the port is taken: give another "
                "--metrics-port, or 0 for a free one"
            ) from None
        raise click.ClickException(f"cannot serve metrics on {shown}: {exc.strerror}") from None
    log.info("metrics on http://%s:%d/metrics", host, server.port)
    return server
