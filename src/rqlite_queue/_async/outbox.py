"""The follow-ups a settlement on one shard publishes to groups of other shards: written to
its outbox in the settlement's transaction (`shards.py`), then forwarded here to their shards,
in the order they were written, each with a dedup id made from its row, and deleted. A shard
that does not answer delays its forwarding; nothing is lost or published twice (within the
dedup window). This file is the source; `_sync/outbox.py` is generated from it."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence

from .._protocol import shard_tables
from .._protocol.core import QueueCore
from .._protocol.messages import NewMessage
from .._protocol.shard_tables import OutboxRow
from .._protocol.sharding import ShardList, outbox_message
from .._runtime import Awaitable
from ..errors import StaleShardList
from .cluster import AsyncBackend
from .shard_calls import NOT_ANSWERED, AsyncShardCalls

OUTBOX_BATCH = 1000
"""Follow-ups forwarded from one outbox per request."""

Publish = Callable[[Sequence[NewMessage], float], Awaitable[list[int]]]
"""How forwarded follow-ups are published (by deadline): as the queue's publishes are, each
part on its group's shard behind the shard list's epoch, and never bounded."""


class AsyncOutbox:
    """The outboxes of a sharded queue's shards (reached by `calls`), forwarded by
    `publish`."""

    def __init__(
        self, calls: AsyncShardCalls, shard_list: ShardList, core: QueueCore, publish: Publish
    ) -> None:
        self.calls = calls
        self.shard_list = shard_list
        self.core = core
        self.publish = publish
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
        chosen = self.calls.live() if names is None else names
        results = await self.calls.on_many(
            chosen, functools.partial(self._forward_from, deadline), claims=names is None
        )
        return sum(r for r in results.values() if not isinstance(r, BaseException))

    async def _forward_from(self, deadline: float, name: str, backend: AsyncBackend) -> int:
        rows = await backend.run(shard_tables.read_outbox(self.core, OUTBOX_BATCH), deadline)
        if not rows:
            return 0
        by_target: dict[str, list[OutboxRow]] = {}
        for row in rows:
            target = self.shard_list.shard_of(row.message.group_id)
            by_target.setdefault(target, []).append(row)
        done: list[int] = []
        for part in by_target.values():
            messages = [outbox_message(name, row) for row in part]
            try:
                await self.publish(messages, deadline)
            except (*NOT_ANSWERED, StaleShardList):
                continue  # stays in the outbox; its group's later rows wait behind it
            done += [row.id for row in part]
        if done:
            await backend.run(shard_tables.forwarded(self.core, done), deadline)
        return len(done)
