"""The HTTP client for an rqlite cluster: drives `rqlite_http.exchange` (the retry policy, no
I/O) with real requests and sleeps. This file is the source; `_sync/rqlite_client.py` is
generated from it (`scripts/gen_sync.py`). The request itself is the HTTP library's:
`http_async.AiohttpClient` and `http_sync.Urllib3Client` implement `_post`."""

from __future__ import annotations

import asyncio

from ..rqlite_http import ClientState, Outcome, Send
from ..sql import Batch, Result


class AsyncRqliteClient(ClientState):
    """Sends each batch to one node of the cluster, moving on when a node fails."""

    async def execute(self, batch: Batch, deadline: float) -> list[Result]:
        """Run `batch`, giving up at `deadline` (a `time.monotonic()` time)."""
        request, steps = self.steps(batch, deadline)
        action = next(steps)
        while True:
            if isinstance(action, Send):
                self.requests += 1
                outcome: Outcome | None = await self._post(action, request.path, request.body)
            else:
                await asyncio.sleep(action.seconds)
                outcome = None
            try:
                action = steps.send(outcome)
            except StopIteration as done:
                results: list[Result] = done.value
                return results

    async def _post(self, send: Send, path: str, body: bytes) -> Outcome:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError
