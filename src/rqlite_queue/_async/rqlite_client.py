"""The HTTP client for an rqlite cluster: drives `_protocol.http.exchange` (the retry policy, no
I/O) with real requests and sleeps. This file is the source; `_sync/rqlite_client.py` is
generated from it (`scripts/gen_sync.py`). The request itself is the HTTP library's:
`_io.aiohttp_client.AiohttpClient` and `_io.urllib3_client.Urllib3Client` implement `_post`."""

from __future__ import annotations

import asyncio
from typing import Any

from .._protocol.backup import Transfer, transfer
from .._protocol.http import ClientState, Discover, Outcome, Send, Statuses
from .._protocol.plan import Batch, Result


class AsyncRqliteClient(ClientState):
    """Sends each batch to one node of the cluster, moving on when a node fails, with the
    clocks and the jitter that the HTTP library's client gives `ClientState` (the protocol has
    none of its own)."""

    async def execute(
        self,
        batch: Batch,
        deadline: float,
        *,
        lease_for: float | None = None,
        resend: int = 0,
        final: bool = False,
        idempotent: bool = False,
    ) -> list[Result]:
        """Run `batch`, giving up at `deadline` (a `time.monotonic()` time). `lease_for`: the
        visibility of the leases it takes or extends; `resend`: how many times the call sent
        it already; `final`: the call cannot send it again after a lost reply (all three
        bound how long one node is waited for: `ClientState.patience`); `idempotent`: a
        write whose lost reply is sent again here, as a read's (`Plan.idempotent`)."""
        request, steps = self.steps(batch, deadline, lease_for, resend, final, idempotent)
        action = next(steps)
        while True:
            outcome: Outcome | Statuses | None
            if isinstance(action, Send):
                self.requests += 1
                outcome = await self._post(action, request.path, request.body)
            elif isinstance(action, Discover):
                outcome = await self._statuses(action.timeout)
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

    async def _statuses(self, timeout: float) -> Statuses:
        """Every node's Raft status (`_protocol.http.STATUS_RAFT`), asked at once, each within
        `timeout`; those not had when one says it leads are None."""
        raise NotImplementedError

    async def transfer(self, request: Transfer, deadline: float) -> bytes:
        """A backup or a load (`_protocol.backup.transfer`: moves on from node to node until
        one answers, or `deadline`); returns the reply's body."""
        steps = transfer(
            request,
            nodes=self.nodes,
            deadline=deadline,
            monotonic=self.monotonic,
            jitter=self.random,
            names=self.endpoints.urls,
            refused_patience=self.refused_timeout,
        )
        action = next(steps)
        while True:
            if isinstance(action, Send):
                self.requests += 1
                outcome: Outcome | None = await self._send_file(action, request)
            else:
                await asyncio.sleep(action.seconds)
                outcome = None
            try:
                action = steps.send(outcome)
            except StopIteration as done:
                body: bytes = done.value
                return body

    async def _send_file(self, send: Send, request: Transfer) -> Outcome:
        raise NotImplementedError

    async def get_json(self, base_url: str, path: str, timeout: float) -> Any:
        """GET a node's JSON endpoint (`/status`, `/nodes`); None if it does not answer."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError
