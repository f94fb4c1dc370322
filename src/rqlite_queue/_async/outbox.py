"""The follow-ups a settlement on one shard publishes to groups of other shards: written to
its outbox in the settlement's transaction (`shards.py`), then forwarded here to their shards,
in the order they were written, each with a dedup id made from its row, and deleted. A shard
that does not answer delays its forwarding; nothing is lost or published twice (within the
dedup window). This file is the source; `_sync/outbox.py` is generated from it."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence

from .._protocol import batch_counts, shard_tables
from .._protocol.batch_counts import Counts
from .._protocol.core import QueueCore
from .._protocol.messages import NewMessage
from .._protocol.shard_tables import OutboxRow
from .._protocol.sharding import ShardList, outbox_message
from .._runtime import Awaitable
from ..errors import StaleShardList
from ..types import batch_shard
from .cluster import AsyncBackend
from .shard_calls import NOT_ANSWERED, AsyncShardCalls

OUTBOX_BATCH = 1000
"""Follow-ups forwarded from one outbox per request."""
FORWARD_ROUNDS = 3
"""Outboxes forwarded one after the other at the end of a call: those written, then the
batches' shards where their counts were applied (callbacks of the batches they finished)."""

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
        round, or to the periodic sweep of `fire_schedules`); how many were forwarded. Counts
        applied on a batch's shard may finish it there, and its callbacks then wait in that
        shard's outbox: forwarded too, in the same call."""
        forwarded = 0
        for _ in range(FORWARD_ROUNDS):
            if not self.written:
                break
            names, self.written = sorted(self.written), set()
            with contextlib.suppress(*NOT_ANSWERED):
                forwarded += await self.forward(deadline, names)
        return forwarded

    async def forward(self, deadline: float, names: Sequence[str] | None = None) -> int:
        """Forward the follow-ups waiting in the outboxes of these shards (default: all that
        answer) to the shards of their groups, in the order they were written; each with a
        dedup id made from its outbox row (or its own), so a forward repeated after a lost
        reply publishes nothing twice; and the batches' counts to their batches' shards,
        first. Returns how many rows were forwarded."""
        chosen = self.calls.live() if names is None else names
        results = await self.calls.on_many(
            chosen, functools.partial(self._forward_from, deadline), claims=names is None
        )
        return sum(len(r) for r in results.values() if not isinstance(r, BaseException))

    async def forward_from(self, name: str, deadline: float) -> dict[int, int | None]:
        """Forward shard `name`'s outbox now: its rows forwarded, each with the seq its message
        got (None: a batch's counts)."""
        return await self._forward_from(deadline, name, self.calls.backend(name))

    async def _forward_from(
        self, deadline: float, name: str, backend: AsyncBackend
    ) -> dict[int, int | None]:
        rows = await backend.run(shard_tables.read_outbox(self.core, OUTBOX_BATCH), deadline)
        if not rows:
            return {}
        done: dict[int, int | None] = {}
        # The counts first, on their batches' shards, in the order they were written: a
        # message written after counts that could not be applied waits behind them (its
        # batch must not look done on its own shard before they are).
        counts: dict[str, list[OutboxRow]] = {}
        for row in rows:
            if row.counts is not None:
                counts.setdefault(batch_shard(row.counts_batch), []).append(row)
        barrier: int | None = None
        for home, part in counts.items():
            try:
                plan = batch_counts.apply_plan(
                    self.core, name, [(row.id, Counts.stored(row.counts or "")) for row in part]
                )
                await self.calls.on(home, plan, deadline)
            except NOT_ANSWERED:
                first = part[0].id
                barrier = first if barrier is None else min(barrier, first)
                continue
            done.update((row.id, None) for row in part)
            self.written.add(home)  # a batch it finished: its callbacks in that outbox
        by_target: dict[str, list[OutboxRow]] = {}
        for row in rows:
            if row.counts is None and (barrier is None or row.id < barrier):
                target = self.shard_list.shard_of(row.message.group_id)
                by_target.setdefault(target, []).append(row)
        for part in by_target.values():
            messages = [outbox_message(name, row) for row in part]
            try:
                seqs = await self.publish(messages, deadline)
            except (*NOT_ANSWERED, StaleShardList):
                continue  # stays in the outbox; its group's later rows wait behind it
            done.update((row.id, seq) for row, seq in zip(part, seqs, strict=True))
        if done:
            await backend.run(shard_tables.forwarded(self.core, list(done)), deadline)
        return done
