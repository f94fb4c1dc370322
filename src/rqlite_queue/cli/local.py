"""Local rqlite for development: `rqlited`, `cluster up`, `demo`."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from ..rqlited import RqlitedNotFound, find_rqlited
from ..toxiproxy import ToxiproxyNotFound, find_toxiproxy
from ._base import (
    URL_ENV,
    cli,
)

if TYPE_CHECKING:
    from ..local_cluster import PortInUse

# ------------------------------------------------------------------------------ rqlited


@cli.command("rqlited")
@click.option(
    "--build/--no-build",
    default=True,
    show_default=True,
    help="Build one from rqlite's Go module when none is found and Go is installed.",
)
def rqlited_command(build: bool) -> int:
    """Print the path of a usable rqlited (v8), building it first if need be.

    Looks at $RQLITED (only there, when set), then the cache (~/.cache/rqlite-queue), then PATH.
    None usable and Go installed: builds the tested release into the cache (a few minutes the
    first time). Otherwise says how else to get one. Any v8 release from 8.32.2 on is accepted
    (untested ones with a warning); v9 and later are refused. `cluster up`, the demo and the
    pytest fixtures use what this finds."""
    try:
        info = find_rqlited(build=build, log=lambda line: click.echo(line, err=True))
    except RqlitedNotFound as exc:
        # All of it: the ways to get one are the point of the message.
        click.echo(f"error: {exc}", err=True)
        return 1
    if info.warning:
        click.echo(f"warning: {info.path}: {info.warning}", err=True)
    click.echo(info.path)
    return 0


@cli.command("toxiproxy")
@click.option(
    "--build/--no-build",
    default=True,
    show_default=True,
    help="Build it from toxiproxy's Go module when the cache has none and Go is installed.",
)
def toxiproxy_command(build: bool) -> int:
    """Print the path of the toxiproxy server that local clusters' links run, building it first
    if need be.

    Toxiproxy v2.5.0 with a few toxics of this package's (microsecond latency, counters): looks
    at $TOXIPROXY (only there, when set), then the cache beside rqlited's; none there and Go
    installed: builds it into the cache (a minute the first time). `Cluster(links=...)` and
    the pytest fixtures use what this finds."""
    try:
        path = find_toxiproxy(build=build, log=lambda line: click.echo(line, err=True))
    except ToxiproxyNotFound as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    click.echo(path)
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

    Uses the rqlited that 'rqlite-queue rqlited' finds; it never builds one (run
    'rqlite-queue rqlited' first for that). The nodes listen on 127.0.0.1, on free ports
    unless --http-port, and keep their data in a temporary directory removed when the
    cluster stops, unless --data-dir; prints the --url to give the other commands."""
    from ..local_cluster import Cluster, ClusterError, PortInUse

    try:
        rqlited = find_rqlited()
    except RqlitedNotFound as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    if rqlited.warning:
        click.echo(f"warning: {rqlited.path}: {rqlited.warning}", err=True)
    # Explicit, so that Ctrl-C works even when a script started us with SIGINT ignored.
    previous = {
        sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    local = Cluster(n, binary=rqlited.path, data_dir=data_dir, http_port=http_port)
    ready = False
    try:
        try:
            try:
                local.start()
            except PortInUse as exc:
                raise click.ClickException(_taken(exc, data_dir, http_port)) from exc
            except ClusterError as exc:  # a data dir of another size, a bad flag...
                raise click.ClickException(str(exc)) from exc
            leader = local.leader()
            ready = True
            kept = "kept" if data_dir is not None else "removed on stop"
            click.echo(f"rqlite {rqlited.label}: {n}-node cluster up (data in {local.dir}, {kept})")
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


def _taken(exc: PortInUse, data_dir: Path | None, http_port: int | None) -> str:
    """The error's first line, then what to do about a taken port."""
    first, _, rest = str(exc).partition("\n")
    holder = f"what holds {exc.address}" if exc.address else "what holds the port"
    if data_dir is not None and http_port is None:
        fix = f"stop {holder} (the cluster in {data_dir} keeps its ports)"
    elif http_port is not None:
        fix = f"stop {holder}, or give another --http-port (or none, for free ports)"
    else:
        fix = f"stop {holder}, or run it again"
    return f"{first}; {fix}\n{rest}"


# ------------------------------------------------------------------------------ demo

_PASSTHROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


@cli.command(context_settings=_PASSTHROUGH, add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def demo(ctx: click.Context, args: tuple[str, ...]) -> int:
    """Run the demo workload ('demo --help' for its options).

    By default it starts its own local 3-node cluster; a --url given to rqlite-queue (or
    $RQLITE_QUEUE_URL) is passed on to it."""
    from . import demo as demo_module

    argv = list(args)
    source = ctx.parent.get_parameter_source("url") if ctx.parent is not None else None
    if source is not None and source is not click.core.ParameterSource.DEFAULT:
        argv = ["--url", ctx.obj.url, *argv]
    return demo_module.main(argv)
