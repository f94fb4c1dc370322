"""A batch being built: `async with queue.batch(on_complete=...) as b:` collects the block's
publishes (`b.publish`, `b.publish_many`) and the batches made within it (`b.batch(...)`),
and writes them with the batch when the block ends, all at once (an exception writes
nothing); `b.flush()` writes what it has so far and keeps the batch open until the block
ends. This file is the source; `_sync/batch.py` is generated from it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from .._protocol import batches
from .._protocol.batches import BatchPart, BatchSpec, BatchWrite, aborted_reason
from .._protocol.core import QueueCore
from .._protocol.messages import GivenMessage, Message
from ..errors import ForwardPending, InvalidArgument
from ..types import DEFAULT_BATCH_KEEP, MessageOptions, PublishItem, batch_shard
from .router import AsyncRouter
from .transaction import Published


@dataclass
class _Part:
    """A batch's part of a write not sent yet, and the publishes whose seqs it gives."""

    part: BatchPart
    published: list[tuple[Published, int, int]]


class AsyncBatch:
    """A batch: messages in any groups (each group's FIFO and exclusivity as ever) whose
    settlements are counted, and whose callbacks are published once, in the transaction of
    the last settlement: `on_complete` in any case, `on_success` only if none failed. Made by
    `queue.batch()` (or, within another's block, by its `batch()`); its `id` is known at once
    (`batch_status(id)`, `publish(batch=id)`).

    In its block (`async with` on an async queue, `with` on a sync one), `publish` and
    `publish_many` collect messages, and `batch()` makes batches within this one; the block's
    end writes them all with the batch, in one transaction on the batch's cluster (on a
    sharded queue, its shard; messages of other shards' groups go through its outbox, exactly
    once): all or none. An exception in the block writes nothing. `flush()` writes what the
    block has so far (for a batch too big for one write): the batch is then `open` until the
    block ends, and an exception after it closes the batch with what was written (`aborted`,
    and no `on_success`). A batch with no message is done at once. A write that fails raises
    its error, and the batch takes nothing more (nothing was written if it was the first:
    `Unavailable`; a lost reply the transport could not resolve: `OutcomeUnknown`)."""

    def __init__(
        self,
        core: QueueCore,
        router: AsyncRouter,
        spec: BatchSpec,
        deadline: float,
        *,
        within: AsyncBatch | None = None,
    ) -> None:
        self._core = core
        self._router = router
        self._spec = spec
        self._deadline = deadline
        self._within = within
        self._given: list[Any] = []
        """The messages collected, checked and encoded."""
        self._published: list[tuple[Published, int, int]] = []
        self._inner: list[_Part] = []
        """The parts of the batches made within this block, for its next write."""
        self._writes = 0
        self._done = False

    @property
    def id(self) -> str:
        """The batch's id (made by the client: known before anything is written)."""
        return self._spec.id

    @property
    def parent(self) -> str | None:
        """The batch this one is a message of (`batch(parent=...)`), or None."""
        return self._spec.parent

    def publish(
        self, group_id: str, event: Any, priority: int = 0, **options: Unpack[MessageOptions]
    ) -> Published:
        """As `queue.publish` (its keywords: `MessageOptions`), written with the batch
        (checked now; its seq is known once written). A batch's messages take no dedup id
        (none is made for them by the transport's `dedup_key` either) and no debounce key:
        each one given is a message of the batch. `keep`: how long the message's outcome is
        kept (as `queue.publish` takes it; the batch's own `keep` is how long its status
        is)."""
        return self._add([Message(group_id, event, priority, **options)])

    def publish_many(self, items: Iterable[PublishItem]) -> Published:
        """As `queue.publish_many`, written with the batch (checked now; no `dedup_id`,
        `debounce` or `batch` in the items)."""
        return self._add(Message.parse_many(items))

    def batch(
        self,
        on_complete: PublishItem | None = None,
        on_success: PublishItem | None = None,
        *,
        keep: float = DEFAULT_BATCH_KEEP,
    ) -> AsyncBatch:
        """A batch within this one (one of its messages: see `queue.batch(parent=...)`),
        written with this one: its block's end hands what it collected to this block's next
        write."""
        self._open()
        shard = batch_shard(self.id)
        spec = batches.spec(
            self._core,
            on_complete,
            on_success,
            parent=self.id,
            keep=keep,
            shard=shard,
            sharded=bool(shard),
        )
        return AsyncBatch(self._core, self._router, spec, self._deadline, within=self)

    def take_inner(self, parts: Sequence[_Part]) -> None:
        """The write of a batch made within this block, for this block's next write."""
        self._open()
        self._inner += parts

    def _add(self, given: Sequence[GivenMessage]) -> Published:
        self._open()
        checked = batches.members(self._core, given, self._spec.id)
        published = Published()
        self._published.append((published, len(self._given), len(checked)))
        self._given += checked
        return published

    def _open(self) -> None:
        if self._done:
            raise InvalidArgument(
                "this batch's block has ended (or a write of it failed): add to it with "
                "publish(batch=id)"
            )

    async def flush(self) -> None:
        """Write what the block has collected so far; the batch stays open (it cannot be done)
        until the block ends."""
        self._open()
        if self._within is not None:
            raise InvalidArgument(
                "a batch made within another's block is written with it: flush that one"
            )
        await self._write(close=False)

    def _take(self, *, close: bool, aborted: str | None = None) -> list[_Part]:
        """This batch's part of its next write, then those of the batches made within."""
        self._writes += 1
        part = BatchPart(self._spec, self._given, self._writes == 1, close, self._writes, aborted)
        parts = [_Part(part, self._published), *self._inner]
        self._given, self._published, self._inner = [], [], []
        return parts

    async def _write(self, *, close: bool, aborted: str | None = None) -> None:
        parts = self._take(close=close, aborted=aborted)
        deadline = time.monotonic() + self._deadline
        try:
            seqs = await self._router.write_batch(BatchWrite([p.part for p in parts]), deadline)
        except ForwardPending as exc:
            _fill(parts, exc.seqs)
            raise
        except BaseException:
            self._done = True  # what it wrote, if anything, is unknown here: take no more
            raise
        _fill(parts, seqs)

    async def __aenter__(self) -> AsyncBatch:
        self._open()
        return self

    async def __aexit__(self, exc_type: object, exc: BaseException | None, *rest: object) -> None:
        if self._done:
            return
        if self._within is not None:
            self._done = True
            if exc is None:
                self._within.take_inner(self._take(close=True))
            return
        if exc is None:
            self._done = True
            await self._write(close=True)
        elif self._writes:
            self._done = True
            self._given, self._published, self._inner = [], [], []
            await self._write(close=True, aborted=aborted_reason(exc))
        else:
            self._done = True


def _fill(parts: Sequence[_Part], seqs: Sequence[int | None]) -> None:
    """Each publish's seqs (the write's are its parts' messages in order), once all of them
    are known (a message still on its way to its group's shard has none yet:
    `ForwardPending`)."""
    at = 0
    for part in parts:
        for handle, start, count in part.published:
            mine = seqs[at + start : at + start + count]
            if len(mine) == count and all(seq is not None for seq in mine):
                handle.seqs = [seq for seq in mine if seq is not None]
        at += len(part.part.messages)
