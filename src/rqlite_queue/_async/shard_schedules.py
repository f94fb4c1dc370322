"""The schedules of a sharded queue: each stored on its group's shard (its ticks are publishes
to that group) and fired there; one left behind on another shard by a change of the shard list
is moved to its group's shard first. This file is the source; `_sync/shard_schedules.py` is
generated from it."""

from __future__ import annotations

import contextlib
import functools
import time
from typing import TYPE_CHECKING, TypeVar

from .._protocol.core import Plan
from .._protocol.sql import ScheduleRow
from ..errors import OutcomeUnknown, Unavailable
from .cluster import AsyncBackend

if TYPE_CHECKING:
    from .shards import AsyncShardRouter

T = TypeVar("T")

NOT_ANSWERED = (Unavailable, OutcomeUnknown)
RELEASE_SWEEP = 1.0
"""While the shard list changes, how often workers look for moved groups still held on their
new shard after their old one emptied (after a crash)."""


class AsyncShardSchedules:
    """The schedules of a sharded queue, for its router."""

    def __init__(self, router: AsyncShardRouter) -> None:
        self.router = router
        self._next_release_sweep = 0.0

    async def store(self, plan: Plan[T], name: str, group_id: str, deadline: float) -> T:
        """Stored on the group's shard; a schedule of the same name on another shard is
        removed first (none may be down)."""
        router = self.router
        target = router.shard_list.shard_of(group_id)
        others = [n for n in router.names if n != target]
        for other in others:
            router.check_up(other)
        if others:
            unschedule = router.core.unschedule(name)
            await router.on_names(unschedule, deadline, f"schedule {name!r}", others)
        return await router.on(target, plan, deadline)

    async def fire(self, deadline: float) -> int:
        """Each shard fires its own schedules. While the list changes, the schedules of groups
        that move wait (their ticks are then caught up). Also the workers' sweep of what a
        crashed worker left in the outboxes, and of moved groups left held."""
        router = self.router
        if router.shard_list.changing and time.monotonic() >= self._next_release_sweep:
            self._next_release_sweep = time.monotonic() + RELEASE_SWEEP
            await router.moves.release_moved_groups(deadline)
        results = await router.answering(functools.partial(self._fire_on, deadline), True)
        with contextlib.suppress(*NOT_ANSWERED):  # what a crashed forwarder left behind
            await router.outbox.forward(deadline)
        return sum(results.values())

    async def _fire_on(self, deadline: float, name: str, backend: AsyncBackend) -> int:
        router, core = self.router, self.router.core
        due = await backend.run(core.due_schedules(), router.claim_by(deadline))
        fire: list[ScheduleRow] = []
        for row in due:
            target, previous = router.shard_list.placement(row.group_id)
            if target == previous == name:
                fire.append(row)
            elif target == previous:  # on the group's shard first, then gone from here
                router.check_up(target)
                await router.backends[target].run(core.put_row(row), deadline)
                await backend.run(core.unschedule(row.name), deadline)
        return await backend.run(core.fire(fire), router.claim_by(deadline)) if fire else 0
