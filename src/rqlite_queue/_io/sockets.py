"""The options of every socket the clients open to rqlite: TCP keepalive, so an idle pooled
connection to a node that vanished (killed, cut off) is found dead within seconds, and a user
timeout, so that data a node does not acknowledge (a partition) fails the connection instead of
being retransmitted for minutes. How long one request may wait for its answer is the
transport's business (`_protocol.http.ClientState.patience`), not the socket's."""

from __future__ import annotations

import socket
import ssl

from ..errors import REFUSED

KEEPALIVE_IDLE = 5
KEEPALIVE_INTERVAL = 2
KEEPALIVE_PROBES = 3
USER_TIMEOUT_MS = 5_000


def options() -> list[tuple[int, int, int]]:
    """(level, option, value) for `setsockopt`, those this platform has."""
    chosen = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            chosen.append((socket.IPPROTO_TCP, option, value))
    return chosen


def open_socket(addr_info: tuple[object, ...]) -> socket.socket:
    """A socket for aiohttp's connector (`socket_factory`), with `options()` set."""
    family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family, kind, proto)  # type: ignore[arg-type]
    for level, option, value in options():
        sock.setsockopt(level, option, value)
    return sock


def connect_failure(error: BaseException | None) -> str:
    """Why a connection could not be made, in a few words (for the give-up errors, which say
    what each node did)."""
    if isinstance(error, ConnectionRefusedError):
        return REFUSED
    if isinstance(error, socket.gaierror):
        return "cannot resolve the host name"
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS: {error.verify_message or error.reason or 'certificate verify failed'}"
    if isinstance(error, ssl.SSLError):
        return f"TLS: {error.reason or error}"
    if isinstance(error, TimeoutError):
        return "timed out connecting"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror[:1].lower() + error.strerror[1:]  # "no route to host"
    return "cannot connect"
