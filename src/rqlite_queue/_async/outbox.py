"""The follow-ups a settlement on one shard publishes to groups of other shards: written to
its outbox in the settlement's transaction (`shards.py`), then forwarded here to their shards,
in the order they were written, each with a dedup id made from its row, and deleted. A shard
that does not answer delays its forwarding; nothing is lost or published twice (within the
dedup window). This file is the source; `_sync/outbox.py` is generated from it."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .._protocol.sharding import outbox_message
from .._protocol.sql import OutboxRow
from ..errors import OutcomeUnknown, StaleShardList, Unavailable
from .cluster import AsyncBackend

if TYPE_CHECKING:
    from .shards import AsyncShardRouter

NOT_ANSWERED = (Unavailable, OutcomeUnknown)
OUTBOX_BATCH = 1000
"""Follow-ups forwarded from one outbox per request."""


class AsyncOutbox:
    """The outboxes of a sharded queue, for its router."""

    def __init__(self, router: AsyncShardRouter) -> None:
        self.router = router
        self.written: set[str] = set()
        """Shards whose outbox a round just wrote to: forwarded at its end."""

    async def forward_soon(self, deadline: float) -> int:
        """Forward the outboxes a round just wrote to (their failure is left to the next
        round, or to the periodic sweep of `fire_schedules`); how many were forwarded."""
        if not self.written:
            return 0
        names, self.written = sorted(self.written), set()
        with contextlib.suppress(*NOT_ANSWERED):
            return await self.forward(deadline, names)
        return 0

    async def forward(self, deadline: float, names: Sequence[str] | None = None) -> int:
        """Forward the follow-ups waiting in the outboxes of these shards (default: all that
        answer) to the shards of their groups, in the order they were written; each with a
        dedup id made from its outbox row (or its own), so a forward repeated after a lost
        reply publishes nothing twice. Returns how many were forwarded."""
        chosen = self.router.health.live() if names is None else names
        results = await self.router.on_many(
            chosen, functools.partial(self._forward_from, deadline), claims=names is None
        )
        return sum(r for r in results.values() if not isinstance(r, BaseException))

    async def _forward_from(self, deadline: float, name: str, backend: AsyncBackend) -> int:
        rows = await backend.run(self.router.core.read_outbox(OUTBOX_BATCH), deadline)
        if not rows:
            return 0
        by_target: dict[str, list[OutboxRow]] = {}
        for row in rows:
            target = self.router.shard_list.shard_of(row.message.group_id)
            by_target.setdefault(target, []).append(row)
        done: list[int] = []
        for part in by_target.values():
            messages = [outbox_message(name, row) for row in part]
            try:
                await self.router.publish(messages, deadline, bounded=False)
            except (*NOT_ANSWERED, StaleShardList):
                continue  # stays in the outbox; its group's later rows wait behind it
            done += [row.id for row in part]
        if done:
            await backend.run(self.router.core.forwarded(done), deadline)
        return len(done)
