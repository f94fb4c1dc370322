"""`dashboard`: the web UI (the `dashboard` extra)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import Any

import click

from .. import AsyncTransport
from ._base import (
    Config,
    cli,
)

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

        from ..dashboard import create_app
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
