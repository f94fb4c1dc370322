"""The calls of a sharded queue on its shards, as one client reaches them: on one shard, on
several at once, or on every one that answers, with each shard's health kept on the way (one
whose call fails as unavailable is marked down and probed in the background until it answers
again). The shard router (`shards.py`) and its helpers (`moves.py`, `outbox.py`,
`shard_schedules.py`) are given this, not the router. This file is the source;
`_sync/shard_calls.py` is generated from it."""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from .._protocol import probes
from .._protocol.core import QueueCore
from .._protocol.plan import Plan
from .._protocol.sharding import ShardHealth
from .._runtime import AsyncFanOut, Awaitable
from ..errors import (
    InvalidArgument,
    OutcomeUnknown,
    QueueError,
    ShardDown,
    Unavailable,
    no_cluster_answered,
)
from ..types import NodeView
from .cluster import AsyncBackend

T = TypeVar("T")

PROBE_DEADLINE = 2.0  # for a background probe of a down shard
NOT_ANSWERED = (Unavailable, OutcomeUnknown)


class AsyncShardCalls:
    """A queue's shards (`backends`, by name, in the list's order): which answer, and calls on
    them. `claim_deadline`: how long a claim round waits for one shard."""

    def __init__(
        self, backends: Mapping[str, AsyncBackend], core: QueueCore, *, claim_deadline: float
    ) -> None:
        self.backends = dict(backends)
        self.names = list(backends)
        self.claim_deadline = claim_deadline
        self._core = core
        self._health = ShardHealth(self.names, random.random)
        self._fan = AsyncFanOut(len(self.backends))

    @property
    def resent(self) -> int:
        return sum(backend.resent for backend in self.backends.values())

    def backend(self, name: str) -> AsyncBackend:
        if name not in self.backends:
            raise InvalidArgument(f"no shard named {name!r} (shards: {self.names})")
        return self.backends[name]

    # ------------------------------------------------------------------------ health

    def live(self) -> list[str]:
        """The shards not refused (publishes and other calls go to them)."""
        return self._health.live()

    def claimable(self) -> list[str]:
        """The live shards not skipped by claims."""
        return self._health.claimable()

    def down(self) -> list[str]:
        """The shards being probed in the background (down, or skipped by claims)."""
        return self._health.down()

    async def setup(self, deadline: float) -> None:
        """Set every shard up; one that does not answer by `deadline` is marked down (and
        probed in the background), unless none answers."""
        results = await self.on_many(self.names, lambda _, b: b.setup(deadline))
        failed = {n: r for n, r in results.items() if isinstance(r, BaseException)}
        if len(failed) == len(self.names):
            raise no_cluster_answered("no shard answered", failed)

    def _mark_down(self, name: str, *, claims: bool = False) -> None:
        self._health.failed(name, time.monotonic(), claims=claims)
        self._fan.background(self._watch)

    async def _watch(self) -> None:
        """The background job: probe the down shards when due, until all answer again."""
        while self._health.down() and not self._core.closed:
            for name in self._health.due(time.monotonic()):
                try:
                    plan = probes.plan(self._core, 0)
                    await self.backends[name].run(plan, time.monotonic() + PROBE_DEADLINE)
                except QueueError:
                    self._health.probed(name, time.monotonic(), answered=False)
                else:
                    self._health.probed(name, time.monotonic(), answered=True)
            retry = self._health.next_probe()
            if retry is None or await self._fan.pause(max(0.01, retry - time.monotonic())):
                return

    def check_up(self, name: str, leases: bool = False) -> None:
        self._health.check_up(name, time.monotonic(), leases)

    def claim_by(self, deadline: float) -> float:
        return min(deadline, time.monotonic() + self.claim_deadline)

    # ------------------------------------------------------------------------ calls

    async def on(self, name: str, plan: Plan[T], deadline: float) -> T:
        """Run `plan` on one shard (refused at once if it is down; marked down if it does
        not answer)."""
        return await self.on_one(name, lambda _, backend: backend.run(plan, deadline))

    async def on_one(self, name: str, call: Callable[[str, AsyncBackend], Awaitable[T]]) -> T:
        self.check_up(name)
        result = (await self.on_many([name], call))[name]
        if isinstance(result, BaseException):
            raise result
        return result

    async def on_many(
        self,
        names: Sequence[str],
        call: Callable[[str, AsyncBackend], Awaitable[T]],
        *,
        claims: bool = False,
    ) -> dict[str, T | BaseException]:
        """Run `call` on several shards at once; unavailable ones are marked down (`claims`:
        only skipped by claims) and given as their exception. Any other error is raised."""
        calls = [functools.partial(call, name, self.backends[name]) for name in names]
        out: dict[str, T | BaseException] = {}
        for name, result in zip(names, await self._fan.all(calls), strict=True):
            if isinstance(result, NOT_ANSWERED):
                if not isinstance(result, ShardDown):  # refused at once: not a new failure
                    self._mark_down(name, claims=claims)
            elif isinstance(result, BaseException):
                raise result
            out[name] = result
        return out

    async def answering(
        self, call: Callable[[str, AsyncBackend], Awaitable[T]], workers: bool = False
    ) -> dict[str, T]:
        """Run `call` on every shard that answers. `workers`: a call of the workers' loop: on
        the shards claims go to, skipping (like claims) one that failed to answer it."""
        names = self._health.claimable() if workers else self._health.live()
        results = await self.on_many(names, call, claims=workers)
        if answered := {n: r for n, r in results.items() if not isinstance(r, BaseException)}:
            return answered
        failed = {n: r for n, r in results.items() if isinstance(r, BaseException)}
        raise no_cluster_answered(f"queue {self._core.names.queue!r}: no shard answered", failed)

    async def on_names(
        self, plan: Plan[T], deadline: float, what: str, names: Sequence[str] | None = None
    ) -> dict[str, T]:
        """Run `plan` on every shard (or on `names`); Unavailable naming those that are down
        or did not answer."""
        targets = self.names if names is None else names
        live = [name for name in targets if name in self._health.live()]
        results = await self.on_many(live, lambda _, backend: backend.run(plan, deadline))
        answered = {n: r for n, r in results.items() if not isinstance(r, BaseException)}
        if missing := [name for name in targets if name not in answered]:
            raise Unavailable(f"{what}: shard(s) {', '.join(missing)} did not answer")
        return answered

    async def nodes(self) -> list[NodeView]:
        """Each shard's nodes, named `shard/node`."""
        results = await self._fan.all([self.backends[name].nodes for name in self.names])
        return [
            NodeView(f"{name}/{n.node_id}", n.api_addr, n.reachable, n.leader, n.applied_index)
            for name, found in zip(self.names, results, strict=True)
            if not isinstance(found, BaseException)
            for n in found
        ]

    async def close(self) -> None:
        await self._fan.close()
        for name in self.names:
            await self.backends[name].close()
