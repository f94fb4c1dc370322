"""Group commit: calls that arrive while one is being sent wait for it, then go together in the
next send, each getting its own outcome. A call alone is sent at once (no added wait); under
concurrency, a call waits at most for the send in flight. This file is the source;
`_sync/coalesce.py` (threads) is generated from it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from .._runtime import AsyncHandoff, AsyncMutex, Awaitable
from ..errors import OutcomeUnknown

A = TypeVar("A")
R = TypeVar("R")


@dataclass(eq=False)
class _Call(Generic[A]):
    item: A
    handoff: AsyncHandoff


class AsyncCoalescer(Generic[A, R]):
    """`submit(item)` returns what `send` gave for it. `send(items)` returns one outcome per
    item, in order: a result, or the exception that call raises. Items go together up to
    `limit` (each weighs `size(item)`)."""

    def __init__(
        self,
        send: Callable[[list[A]], Awaitable[Sequence[R | BaseException]]],
        size: Callable[[A], int],
        limit: int,
    ) -> None:
        self._send = send
        self._size = size
        self._limit = limit
        self._mutex = AsyncMutex()
        self._busy = False
        """Whether a send is in flight (or about to be, by the call handed the lead)."""
        self._queue: list[_Call[A]] = []
        self.enabled = True
        """Off: each call is sent on its own, at once (for side-by-side benchmarks)."""
        self.sends = 0
        self.coalesced = 0
        """Sends made, and calls that went in a send with others (for tests and metrics)."""

    async def submit(self, item: A) -> R:
        if not self.enabled:
            return _outcome((await self._send([item]))[0])
        me = _Call(item, AsyncHandoff())
        with self._mutex:
            lead = not self._busy
            if lead:
                self._busy = True
            else:
                self._queue.append(me)
        if lead:
            batch = [me]
        else:
            try:
                kind, value = await me.handoff.get()
            except BaseException:
                self._abandon(me)
                raise
            if kind == "done":
                outcome: R | BaseException = value
                return _outcome(outcome)
            batch = value
        return _outcome(await self._lead(batch))

    async def _lead(self, batch: list[_Call[A]]) -> R | BaseException:
        """Send the batch (its first call leads), hand the others their outcomes, and the
        lead to the first call that waits."""
        self.sends += 1
        if len(batch) > 1:
            self.coalesced += len(batch)
        try:
            outcomes = await self._send([call.item for call in batch])
        except BaseException as exc:  # the send itself broke, or the leader was cancelled
            if not isinstance(exc, Exception):
                exc = OutcomeUnknown(f"sent with other calls by one that was stopped: {exc!r}")
            for call in batch[1:]:
                call.handoff.put(("done", exc))
            self._pass_on()
            raise
        for call, outcome in zip(batch[1:], outcomes[1:], strict=True):
            call.handoff.put(("done", outcome))
        self._pass_on()
        return outcomes[0]

    def _pass_on(self) -> None:
        with self._mutex:
            if not self._queue:
                self._busy = False
                return
            batch: list[_Call[A]] = []
            size = 0
            while self._queue and (
                not batch or size + self._size(self._queue[0].item) <= self._limit
            ):
                call = self._queue.pop(0)
                batch.append(call)
                size += self._size(call.item)
        batch[0].handoff.put(("lead", batch))

    def _abandon(self, me: _Call[A]) -> None:
        """A waiting call was cancelled: out of the queue, or, if it was handed the lead,
        the lead goes to the next call of its batch."""
        with self._mutex:
            if me in self._queue:
                self._queue.remove(me)
                return
        got = me.handoff.peek()
        if got is not None and got[0] == "lead":
            rest = [call for call in got[1] if call is not me]
            if rest:
                rest[0].handoff.put(("lead", rest))
            else:
                self._pass_on()


def _outcome(value: R | BaseException) -> R:
    if isinstance(value, BaseException):
        raise copy.copy(value)  # one instance per caller: tracebacks are per raise
    return value
