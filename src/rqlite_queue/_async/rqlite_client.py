"""The HTTP client for an rqlite cluster: sends one batch per request, fails over between
nodes. This file is the source; `_sync/rqlite_client.py` is generated from it
(`scripts/gen_sync.py`)."""

from __future__ import annotations

import asyncio
import random
import ssl
import time
from typing import Any

import httpx

from ..errors import NoLeader, Unavailable
from ..rqlite_http import Endpoints, parse_reply, request_for
from ..sql import Batch, Result

_FIRST_BACKOFF = 0.05
_MAX_BACKOFF = 1.0


class AsyncRqliteClient:
    """Sends each batch to one node; moves to the next node when the request certainly did
    not apply (the node is unreachable, or has no leader to forward to). Reads are retried on
    any transport failure; a write whose outcome is unknown raises `Unavailable`."""

    def __init__(
        self,
        endpoints: Endpoints,
        *,
        timeout: float = 10.0,
        deadline: float = 15.0,
        verify: bool | str = True,  # or the path of a CA file
        event_hooks: dict[str, list[Any]] | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.deadline = deadline
        self._current = 0
        self._http = httpx.AsyncClient(
            timeout=timeout,
            verify=ssl.create_default_context(cafile=verify) if isinstance(verify, str) else verify,
            auth=endpoints.auth,
            event_hooks=event_hooks,
        )

    @property
    def url(self) -> str:
        """The node requests go to now."""
        return self.endpoints.urls[self._current]

    async def execute(self, batch: Batch) -> list[Result]:
        request = request_for(batch)
        give_up = time.monotonic() + self.deadline
        backoff = _FIRST_BACKOFF
        while True:
            try:
                response = await self._http.post(
                    self.url + request.path, params=request.params, json=request.body
                )
                return parse_reply(response.status_code, response.content, len(request.body))
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure: Exception = Unavailable(f"cannot reach rqlite at {self.url}: {exc}")
            except NoLeader as exc:
                failure = exc
            except (httpx.TransportError, Unavailable) as exc:
                if batch.write:
                    # The write may have applied: the transport decides whether to resend;
                    # if it does, it should not wait on the same (perhaps frozen) node.
                    url = self.url
                    self._rotate()
                    if isinstance(exc, Unavailable):
                        raise
                    raise Unavailable(f"rqlite at {url}: outcome unknown: {exc!r}") from exc
                failure = exc
            self._rotate()
            if time.monotonic() + backoff > give_up:
                if isinstance(failure, Unavailable):
                    raise failure
                raise Unavailable(f"rqlite: {failure}") from failure
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            backoff = min(backoff * 2, _MAX_BACKOFF)

    def _rotate(self) -> None:
        self._current = (self._current + 1) % len(self.endpoints.urls)

    async def close(self) -> None:
        await self._http.aclose()
