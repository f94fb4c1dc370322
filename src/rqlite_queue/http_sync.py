"""The sync HTTP requests to rqlite, with urllib3: keep-alive pools, TLS, timeouts, and the least
client CPU per request of the sync clients measured in `bench/http_clients.py`."""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable

import urllib3
from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError

from ._sync.rqlite_client import RqliteClient
from .rqlite_http import Endpoints, NoReply, NotSent, Outcome, Reply, Send, request_headers

POOL_SIZE = 32


class Urllib3Client(RqliteClient):
    def __init__(
        self,
        endpoints: Endpoints,
        *,
        timeout: float = 10.0,
        verify: bool | str = True,  # or the path of a CA file
        skew_warning: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(endpoints, timeout=timeout, skew_warning=skew_warning, clock=clock)
        self._headers = request_headers(endpoints)
        tls: dict[str, ssl.SSLContext] = {}
        if any(url.startswith("https") for url in endpoints.urls):
            context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
            if verify is False:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            tls["ssl_context"] = context
        self._pools = [
            urllib3.connection_from_url(url, maxsize=POOL_SIZE, block=False, retries=False, **tls)
            for url in endpoints.urls
        ]

    def _post(self, send: Send, path: str, body: bytes) -> Outcome:
        sent_at = self.clock()
        try:
            response = self._pools[send.node].urlopen(
                "POST",
                path,
                body=body,
                headers=self._headers,
                timeout=urllib3.Timeout(connect=send.timeout, read=send.timeout),
                retries=False,
                redirect=False,
            )
        except (NewConnectionError, ConnectTimeoutError) as exc:
            return NotSent(str(exc))
        except (HTTPError, OSError) as exc:
            return NoReply(repr(exc))
        return Reply(
            response.status, response.data, response.headers.get("Date"), sent_at, self.clock()
        )

    def close(self) -> None:
        for pool in self._pools:
            pool.close()
