"""The sync HTTP requests to rqlite, with urllib3: keep-alive pools, TLS, timeouts, and the least
client CPU per request of the sync clients measured in `bench/http_clients.py`."""

from __future__ import annotations

import json
import queue
import random
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

import urllib3
from urllib3.connection import HTTPConnection
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    ReadTimeoutError,
    SSLError,
)

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
from .._sync.rqlite_client import RqliteClient
from .sockets import connect_failure
from .sockets import options as sockets_options


class Urllib3Client(RqliteClient):
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
        self._headers = request_headers(endpoints)
        tls: dict[str, ssl.SSLContext] = {}
        if any(url.startswith("https") for url in endpoints.urls):
            context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
            if verify is False:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            tls["ssl_context"] = context
        self._manager = urllib3.PoolManager(
            num_pools=4, maxsize=2, ssl_context=tls.get("ssl_context")
        )
        sockets = HTTPConnection.default_socket_options + sockets_options()
        self._pools = [
            urllib3.connection_from_url(
                url, maxsize=POOL_SIZE, block=False, retries=False, socket_options=sockets, **tls
            )
            for url in endpoints.urls
        ]

    def _post(self, send: Send, path: str, body: bytes) -> Outcome:
        return self._exchange(send, "POST", path, body, self._headers)

    def _send_file(self, send: Send, request: Transfer) -> Outcome:
        """A backup or a load: the file as the body, or the reply's (read whole)."""
        headers = dict(self._headers)
        if request.body is not None:
            headers["Content-Type"] = "application/octet-stream"
        return self._exchange(send, request.method, request.path, request.body, headers)

    def _exchange(
        self, send: Send, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> Outcome:
        sent_at = self.clock()
        try:
            response = self._pools[send.node].urlopen(
                method,
                path,
                body=body,
                headers=headers,
                timeout=urllib3.Timeout(connect=send.timeout, read=send.timeout),
                retries=False,
                redirect=False,
            )
        except (NewConnectionError, ConnectTimeoutError) as exc:
            why = exc.__cause__ if exc.__cause__ is not None else TimeoutError()
            return NotSent(str(exc), connect_failure(why))
        except SSLError as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, ssl.SSLCertVerificationError):
                # the handshake failed: nothing was sent
                return NotSent(repr(exc), connect_failure(error))
            return NoReply(
                repr(exc), connect_failure(error if isinstance(error, ssl.SSLError) else exc)
            )
        except ReadTimeoutError as exc:
            return NoReply(repr(exc), f"no reply within {send.timeout:.1f}s")
        except (HTTPError, OSError) as exc:
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
            response.status, response.data, response.headers.get("Date"), sent_at, self.clock()
        )

    def _statuses(self, timeout: float) -> Statuses:
        # A thread per node (daemons: one still waiting on a silent node ends by `timeout`
        # on its own), so that a node that does not answer costs no more than one that does.
        urls = self.endpoints.urls
        answers: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()

        def ask(i: int) -> None:
            answers.put((i, self.get_json(urls[i], STATUS_RAFT, timeout)))

        for i in range(len(urls)):
            threading.Thread(target=ask, args=(i,), name="rqlite-queue-status", daemon=True).start()
        found: list[Any] = [None] * len(urls)
        until = time.monotonic() + timeout
        for _ in urls:
            try:
                i, raft = answers.get(timeout=max(0.0, until - time.monotonic()))
            except queue.Empty:
                break
            found[i] = raft
            if leader_term(raft) is not None:
                break
        return Statuses(tuple(found))

    def get_json(self, base_url: str, path: str, timeout: float) -> Any:
        """GET an rqlite node's JSON endpoint (`/status`, `/nodes`) with this client's
        credentials and TLS settings; None if the node does not answer with JSON."""
        try:
            response = self._manager.request(
                "GET",
                base_url + path,
                headers=self._headers,
                timeout=urllib3.Timeout(total=timeout),
                retries=False,
                redirect=False,
            )
            if response.status != 200:
                return None
            return json.loads(response.data)
        except (HTTPError, OSError, ValueError):
            return None

    def close(self) -> None:
        self._manager.clear()
        for pool in self._pools:
            pool.close()
