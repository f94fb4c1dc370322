"""`dashboard`: the web UI (the `dashboard` extra)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import os
import signal
import socket
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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


AUTH_ENV = "RQLITE_QUEUE_DASHBOARD_AUTH"
TOKEN_ENV = "RQLITE_QUEUE_DASHBOARD_TOKEN"
WILDCARDS = ("", "0.0.0.0", "::")


def _empty_env(name: str) -> None:
    """click reads an empty environment variable as unset: a dashboard meant to be protected
    would start open. Refused instead."""
    if name in os.environ and not os.environ[name].strip():
        raise click.UsageError(
            f"${name} is set but empty: give it a value, or unset it for no "
            f"{'credentials' if name == AUTH_ENV else 'token'}"
        )


def _credentials(value: str | None) -> tuple[str, str] | None:
    if value is None:
        _empty_env(AUTH_ENV)
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise click.BadParameter(
            "expected USER:PASSWORD (empty: the dashboard would be open)",
            param_hint=f"--basic-auth (or ${AUTH_ENV})",
        )
    return user, password


def _token(value: str | None, token_file: Path | None) -> str | None:
    if value is None and token_file is None:
        _empty_env(TOKEN_ENV)
    if token_file is not None:
        if value is not None:
            raise click.UsageError(f"--token-file, --token and ${TOKEN_ENV}: one at most")
        try:
            value = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise click.BadParameter(str(exc), param_hint="--token-file") from None
        if not value:
            raise click.BadParameter(f"{token_file} is empty", param_hint="--token-file")
        return value
    if value is not None and not value.strip():
        raise click.BadParameter(
            "empty (the dashboard would be open)", param_hint=f"--token (or ${TOKEN_ENV})"
        )
    return value.strip() if value is not None else None


def _loopback(host: str) -> bool:
    if host.lower().removesuffix(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _own_addresses(host: str) -> list[str]:
    """The machine's addresses a wildcard `host` listens on, as a `Host` names them (`[v6]`),
    loopback first: its IPv4 ones for 0.0.0.0, IPv6 for :: (asyncio makes that socket IPv6
    only), both for ''. Not IPv6 link-local ones: no browser opens an address with a zone."""
    import psutil

    families = {"0.0.0.0": (4,), "::": (6,)}.get(host, (4, 6))
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            ip = ipaddress.ip_address(address.address.partition("%")[0])
            if ip.version in families and not (ip.version == 6 and ip.is_link_local):
                found.add(ip)
    ordered = sorted(found, key=lambda ip: (not ip.is_loopback, ip.version, int(ip)))
    return [f"[{ip}]" if ip.version == 6 else str(ip) for ip in ordered]


def _allowed_hosts(
    host: str, own: list[str], public_url: str | None, extra: tuple[str, ...]
) -> list[str]:
    """The Host names the dashboard answers to: the address it listens on (on every address:
    each of the machine's, `own`, and its host name), localhost's names when that is loopback
    or every address, the public URL's host, and `--allowed-host`."""
    hosts = list(extra)
    if host not in WILDCARDS:
        hosts.append(host)
    if _loopback(host) or host in WILDCARDS:
        hosts.extend(["localhost", "127.0.0.1", "[::1]"])
    if host in WILDCARDS:
        hosts.extend([*own, socket.gethostname()])
    if public_url is not None:
        hosts.append(str(urlsplit(public_url).hostname))
    return hosts


def _open_warning(host: str, trusted_proxies: list[str]) -> str | None:
    """What to say when a dashboard without auth shows the queue's payloads to more than this
    machine."""
    if not _loopback(host):
        where = "every address of this machine" if host in WILDCARDS else host
        return (
            f"warning: no --basic-auth or token, on {where}: anyone who reaches it sees the "
            f"queue's messages, payloads included"
        )
    if trusted_proxies:
        return (
            "warning: no --basic-auth or token, behind a --trusted-proxy: anyone the proxy "
            "lets through sees the queue's messages, payloads included (unless the proxy "
            "authenticates users itself)"
        )
    return None


def _public_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise click.BadParameter("expected http[s]://HOST[:PORT][/PATH]")
    return value


def _trusted_proxies(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[str]:
    """Each an IP address or network, as uvicorn matches it: a network written with host bits
    (`10.0.0.5/8`) is the network they are in (uvicorn would take it for a name, and match
    nothing)."""
    networks = []
    for value in values:
        try:
            network = ipaddress.ip_network(value.strip(), strict=False)
        except ValueError:
            raise click.BadParameter(
                f"{value!r} is not an IP address or network (ADDRESS or ADDRESS/BITS)"
            ) from None
        networks.append(
            str(network.network_address) if network.num_addresses == 1 else str(network)
        )
    return networks


def _listen(host: str, port: int) -> list[socket.socket]:
    """The dashboard's sockets, bound (uvicorn serves on them): one for each address `host`
    resolves to (`localhost`: 127.0.0.1 and ::1 where it names both, as a browser may try
    either), all on one port (`--port 0`: the first one's). A port already taken is one error
    line that says what to do, not uvicorn's exit and its traceback."""
    try:
        found = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise click.BadParameter(f"{host!r}: {exc.strerror}", param_hint="'--host'") from None
    addresses = list(dict.fromkeys((family, address) for family, _, _, _, address in found))
    tries = 0
    while True:
        tries += 1
        sockets: list[socket.socket] = []
        try:
            for family, (ip, _, *scope) in addresses:
                at = port or (sockets[0].getsockname()[1] if sockets else 0)
                sockets.append(_bound(family, (ip, at, *scope), dual_stack=host == "::"))
            return sockets
        except OSError as exc:
            for sock in sockets:
                sock.close()
            # --port 0: the free port of the first address may be taken on another: again
            if exc.errno == errno.EADDRINUSE and port == 0 and sockets and tries < 10:
                continue
            shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            if exc.errno == errno.EADDRINUSE:
                raise click.ClickException(
                    f"cannot listen on {shown}: the port is taken (another dashboard?): give "
                    "another --port, or --port 0 for a free one"
                ) from None
            raise click.ClickException(f"cannot listen on {shown}: {exc.strerror}") from None


def _bound(family: int, address: tuple[Any, ...], *, dual_stack: bool) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            # IPv6 only beside its IPv4 twin (`localhost`, ''); both on '::' alone
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


@cli.command()
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="The address to listen on (not loopback with --allow-actions: needs auth).",
)
@click.option("--port", type=click.IntRange(0, 65535), default=8321, show_default=True)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Let the dashboard change the queue (hold, cancel, requeue, purge, pause...).",
)
@click.option(
    "--basic-auth",
    envvar=AUTH_ENV,
    metavar="USER:PASSWORD",
    help=f"Ask for these credentials (better: ${AUTH_ENV}, which `ps` does not show).",
)
@click.option(
    "--token",
    envvar=TOKEN_ENV,
    help=f"Accept this bearer token (better: --token-file or ${TOKEN_ENV}, not shown by `ps`).",
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path),
    help="Accept the bearer token in this file (its first and last blanks dropped).",
)
@click.option(
    "--public-url",
    callback=_public_url,
    metavar="URL",
    help="The address users open (behind a proxy): its host is answered to, its origin may "
    "post actions.",
)
@click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="HOST[:PORT]",
    help="Also answer to this Host name (repeatable); any other Host gets 400.",
)
@click.option(
    "--trusted-proxy",
    "trusted_proxies",
    multiple=True,
    callback=_trusted_proxies,
    metavar="ADDRESS[/BITS]",
    help="A reverse proxy in front (repeatable): its X-Forwarded-For and X-Forwarded-Proto are "
    "believed (the client they name is throttled); nobody else's, by default no one's.",
)
@click.option(
    "--cert",
    type=click.Path(exists=True, dir_okay=False, readable=True),
    help="Serve HTTPS with this certificate (PEM; with --key).",
)
@click.option(
    "--key",
    type=click.Path(exists=True, dir_okay=False, readable=True),
    help="The private key of --cert (PEM).",
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
    token_file: Path | None,
    public_url: str | None,
    allowed_hosts: tuple[str, ...],
    trusted_proxies: list[str],
    cert: str | None,
    key: str | None,
    refresh: float,
) -> int:
    """Serve the web dashboard (read-only unless --allow-actions) until Ctrl-C."""
    credentials = _credentials(basic_auth)
    bearer = _token(token, token_file)
    if (cert is None) != (key is None):
        raise click.UsageError("--cert and --key go together")
    if allow_actions and not _loopback(host) and credentials is None and bearer is None:
        raise click.UsageError(
            f"--allow-actions on {host or 'every address'}, which is not loopback, needs auth "
            f"(--basic-auth or a token): anyone who reaches it could change the queue"
        )
    try:
        import uvicorn

        from ..dashboard import create_app

        own = _own_addresses(host) if host in WILDCARDS else []
    except ImportError as exc:
        raise click.ClickException(
            f"the dashboard needs the 'dashboard' extra: pip install 'rqlite-queue[dashboard]' "
            f"({exc.name} is missing)"
        ) from None
    quiet_server = _quiet_server()
    scheme = "https" if cert is not None else "http"

    listening = _listen(host, port)  # first: a taken port is known before any connection

    async def serve() -> None:
        try:
            transport = await AsyncTransport.from_url(config.backend(), **config.options())
        except BaseException:
            for sock in listening:
                sock.close()
            raise
        try:
            app = create_app(
                transport,
                allow_actions=allow_actions,
                basic_auth=credentials,
                bearer_token=bearer,
                refresh=refresh,
                allowed_hosts=_allowed_hosts(host, own, public_url, allowed_hosts),
                allowed_origins=[public_url] if public_url is not None else [],
            )
            server = quiet_server(
                uvicorn.Config(
                    app,
                    host=host,
                    port=port,
                    log_level="warning",
                    lifespan="off",
                    # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise:
                    # any local process could name the address the login throttle counts.
                    proxy_headers=bool(trusted_proxies),
                    forwarded_allow_ips=trusted_proxies or None,
                    ssl_certfile=cert,
                    ssl_keyfile=key,
                )
            )
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, setattr, server, "should_exit", True)
            serving = asyncio.create_task(server.serve(sockets=listening))
            while not server.started and not serving.done():
                await asyncio.sleep(0.02)
            if not server.started:
                try:
                    await serving
                except (ssl.SSLError, OSError) as exc:
                    raise click.ClickException(f"could not load --cert/--key: {exc}") from None
                except SystemExit:  # uvicorn's own startup failure, logged above
                    pass
                raise click.ClickException(f"could not serve on {host}:{port}")
            bound = server.servers[0].sockets[0].getsockname()[1]
            mode = "actions allowed" if allow_actions else "read-only"
            names = own or [f"[{host}]" if ":" in host else host]
            urls = ", ".join(f"{scheme}://{name}:{bound}/" for name in names)
            click.echo(f"dashboard of queue {config.queue!r} on {urls} ({mode})")
            sys.stdout.flush()
            if credentials is None and bearer is None:
                warning = _open_warning(host, trusted_proxies)
                if warning is not None:
                    click.echo(warning, err=True)
            await serving
        finally:
            await transport.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0
