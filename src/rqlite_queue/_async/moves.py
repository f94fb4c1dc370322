"""A change of a sharded queue's shard list, under way: which shard a moving group's messages
are on, the hold that keeps its new messages waiting on its new shard until its old shard has
delivered what it had, the release of that hold, and the operator's view of the change. This
file is the source; `_sync/moves.py` is generated from it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable

from .._protocol import admin, schedules, shard_tables
from .._protocol.core import QueueCore
from .._protocol.sharding import ShardList, status_of, status_unknown
from ..errors import BackendError, StaleShardList
from ..types import Lease, ShardStatus
from .cluster import AsyncBackend
from .shard_calls import NOT_ANSWERED, AsyncShardCalls

RELEASE_SWEEP = 1.0
"""While the shard list changes, how often workers look for moved groups still held on their
new shard after their old one emptied (after a crash)."""


class AsyncMoves:
    """The change of `shard_list` under way, on the shards `calls` reaches."""

    def __init__(self, calls: AsyncShardCalls, shard_list: ShardList, core: QueueCore) -> None:
        self.calls = calls
        self.shard_list = shard_list
        self.core = core
        self._next_release_sweep = 0.0

    async def locate(self, group_id: str, deadline: float) -> str:
        """The shard that has the group's messages now: its previous shard while it still
        has messages there during a change of the list, else its target."""
        target, previous = self.shard_list.placement(group_id)
        if target == previous:
            return target
        here = await self.calls.on(previous, admin.peek(self.core, group_id, 1), deadline)
        return previous if here else target

    async def still_on_old_shards(self, group_ids: Iterable[str], deadline: float) -> set[str]:
        """Of these groups, the moving ones that still have messages on their old shard. The
        question is a write there, which gives the old shard this client's epoch: from then
        on no client with an older list can add to them."""
        asked: dict[str, list[str]] = {}
        for group_id in group_ids:
            target, previous = self.shard_list.placement(group_id)
            if target != previous:
                asked.setdefault(previous, []).append(group_id)
        for name in asked:
            self.calls.check_up(name)

        async def ask(name: str, backend: AsyncBackend) -> set[str]:
            try:
                plan = shard_tables.groups_present(self.core, asked[name], self.shard_list.epoch)
                return await backend.run(plan, deadline)
            except BackendError as exc:
                raise self.stale(name, exc) from exc

        present: set[str] = set()
        for result in (await self.calls.on_many(list(asked), ask)).values():
            if isinstance(result, BaseException):
                raise result  # where the group is cannot be known: nothing is published
            present |= result
        return present

    def stale(self, name: str, exc: BackendError) -> BaseException:
        """What a failed guarded batch means: StaleShardList, or the error itself."""
        if not shard_tables.is_stale_epoch(self.core, exc):
            return exc
        return StaleShardList(
            f"shard {name!r} has been given a newer shard list than this client's (epoch "
            f"{self.shard_list.epoch}): nothing was published; give this client the new list"
        )

    async def release_moved(self, leases: Iterable[Lease], deadline: float) -> None:
        """After messages left a moving group's old shard (acked, dead-lettered): if it has
        none left there, its new shard may serve it."""
        if self.shard_list.changing and (groups := self.shard_list.left_old_shard(leases)):
            await self.release_if_gone(groups, deadline)

    async def release_if_delivered(self, held: Iterable[str], deadline: float) -> None:
        """After a publish held these moving groups on their new shard: release those whose
        old shard has delivered its last message of them meanwhile. (That message's ack
        looked for the hold to release before this publish had written it, and nothing else
        would release it but a Worker's periodic sweep.) The publish is written: a failure
        here is left to the next settlement's release or the sweep, never raised."""
        if groups := set(held):
            with contextlib.suppress(*NOT_ANSWERED, StaleShardList):
                await self.release_if_gone(groups, deadline)

    async def release_if_gone(self, groups: set[str], deadline: float) -> None:
        by_target: dict[str, list[str]] = {}
        for group_id in groups - await self.still_on_old_shards(groups, deadline):
            by_target.setdefault(self.shard_list.shard_of(group_id), []).append(group_id)

        async def release(name: str, backend: AsyncBackend) -> None:
            await backend.run(
                shard_tables.release_waits(self.core, sorted(by_target[name])), deadline
            )

        await self.calls.on_many(list(by_target), release)

    async def sweep(self, deadline: float) -> None:
        """The workers' sweep (every `RELEASE_SWEEP` seconds while the list changes) of the
        moved groups a crash left held."""
        if self.shard_list.changing and time.monotonic() >= self._next_release_sweep:
            self._next_release_sweep = time.monotonic() + RELEASE_SWEEP
            await self.release_moved_groups(deadline)

    async def release_moved_groups(self, deadline: float) -> int:
        """Let the new shards serve the moving groups whose old shard has delivered all of
        theirs. Returns how many were still held."""
        if not self.shard_list.changing:
            return 0
        plan = shard_tables.waiting_groups(self.core, 10_000)
        results = await self.calls.answering(lambda _, backend: backend.run(plan, deadline))
        waiting = {group_id for found in results.values() for group_id in found}
        if waiting:
            await self.release_if_gone(waiting, deadline)
        return len(waiting)

    async def shard_status(self, deadline: float) -> list[ShardStatus]:
        """Each shard as a change of the shard list sees it (see `ShardStatus`). Pages
        through every group: an operator's call."""
        core = self.core

        async def one(name: str, backend: AsyncBackend) -> ShardStatus:
            leaving, after = 0, None
            while True:
                plan = admin.groups(
                    core, state=None, prefix=None, min_priority=0, limit=1000, after=after
                )
                page = await backend.run(plan, deadline)
                leaving += self.shard_list.leaving(name, page)
                if len(page) < 1000:
                    break
                after = page[-1].group_id
            stats = await backend.run(admin.stats(core), deadline)
            epoch = await backend.run(shard_tables.shard_epoch(core), deadline)
            stored = await backend.run(schedules.schedules(core), deadline)
            waiting = await backend.run(shard_tables.waiting_groups(core, 1_000_000), deadline)
            return status_of(name, self.shard_list, stats, epoch, leaving, stored, len(waiting))

        results = await self.calls.on_many(self.calls.names, one)
        return [
            r if not isinstance(r, BaseException) else status_unknown(n, self.shard_list)
            for n, r in results.items()
        ]
