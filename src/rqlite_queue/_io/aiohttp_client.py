"""The asyncio HTTP requests to rqlite, with aiohttp: keep-alive pools, TLS, timeouts, and the
least client CPU per request of the async clients measured in `bench/http_clients.py`."""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from .._async.rqlite_client import AsyncRqliteClient
from .._protocol.backup import Transfer
from .._protocol.http import (
    POOL_SIZE,
    STATUS_RAFT,
    Endpoints,
    HttpReply,
    NoReply,
    NotSent,
    Outcome,
    Send,
    Statuses,
    framed,
    leader_term,
    request_headers,
)
from .sockets import connect_failure, open_socket

CONNECT_SHARE = 0.9


class AiohttpClient(AsyncRqliteClient):
    def __init__(
        self,
        endpoints: Endpoints,
        *,
        timeout: float = 10.0,
        verify: bool | str = True,  # or the path of a CA file
        skew_warning: float = 1.0,
        clock: Callable[[], float] = time.time,
        refused_timeout: float | None = None,
    ) -> None:
        super().__init__(
            endpoints,
            timeout=timeout,
            skew_warning=skew_warning,
            clock=clock,
            monotonic=time.monotonic,
            random=random.random,
            refused_timeout=refused_timeout,
        )
        self._ssl: ssl.SSLContext | bool = True
        if isinstance(verify, str):
            self._ssl = ssl.create_default_context(cafile=verify)
        elif verify is False:
            self._ssl = False
        self._headers = request_headers(endpoints)
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Made on first use: a session belongs to the event loop that runs it.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=POOL_SIZE, ssl=self._ssl, socket_factory=open_socket
                ),
                headers=self._headers,
                skip_auto_headers=("User-Agent",),
            )
        return self._session

    async def _post(self, send: Send, path: str, body: bytes) -> Outcome:
        return await self._exchange(send, "POST", path, body, {})

    async def _send_file(self, send: Send, request: Transfer) -> Outcome:
        """A backup or a load: the file as the body, or the reply's (read whole)."""
        headers = {"Content-Type": "application/octet-stream"} if request.body is not None else {}
        return await self._exchange(send, request.method, request.path, request.body, headers)

    async def _exchange(
        self, send: Send, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> Outcome:
        session = self._open()
        sent_at = self.clock()
        # The connection must be made within most of the attempt, so that running out of time
        # before the request left is a connection timeout (not sent), never a total one.
        timeout = aiohttp.ClientTimeout(total=send.timeout, connect=send.timeout * CONNECT_SHARE)
        try:
            async with session.request(
                method,
                self.endpoints.urls[send.node] + path,
                data=body,
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            ) as response:
                content = await response.read()
        except aiohttp.ClientConnectorCertificateError as exc:
            return NotSent(str(exc), connect_failure(exc.certificate_error))
        except aiohttp.ClientConnectorError as exc:
            return NotSent(str(exc), connect_failure(exc.os_error))
        except aiohttp.ConnectionTimeoutError as exc:
            return NotSent(str(exc), connect_failure(TimeoutError()))
        except (aiohttp.ServerTimeoutError, TimeoutError) as exc:
            return NoReply(repr(exc), f"no reply within {send.timeout:.1f}s")
        except (aiohttp.ClientError, OSError) as exc:
            return NoReply(repr(exc), "connection dropped")
        if not framed(
            response.status,
            response.headers.get("Content-Length"),
            response.headers.get("Transfer-Encoding"),
        ):
            return NoReply(
                f"the reply (HTTP {response.status}) was cut off in its headers", "reply cut off"
            )
        return HttpReply(
            response.status, content, response.headers.get("Date"), sent_at, self.clock()
        )

    async def _statuses(self, timeout: float) -> Statuses:
        urls = self.endpoints.urls
        asks = {
            asyncio.ensure_future(self.get_json(url, STATUS_RAFT, timeout)): i
            for i, url in enumerate(urls)
        }
        found: list[Any] = [None] * len(urls)
        pending = set(asks)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for ask in done:
                    found[asks[ask]] = ask.result()
                if any(leader_term(raft) is not None for raft in found):
                    break
        finally:
            for ask in pending:
                ask.cancel()
        return Statuses(tuple(found))

    async def get_json(self, base_url: str, path: str, timeout: float) -> Any:
        """GET an rqlite node's JSON endpoint (`/status`, `/nodes`) with this client's
        credentials and TLS settings; None if the node does not answer with JSON."""
        session = self._open()
        try:
            async with session.get(
                base_url + path, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                if response.status != 200:
                    return None
                return json.loads(await response.read())
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
