"""The schedules of a sharded queue: each stored on its group's shard (its ticks are publishes
to that group) and fired there; one left behind on another shard by a change of the shard list
is moved to its group's shard first. This file is the source; `_sync/shard_schedules.py` is
generated from it."""

from __future__ import annotations

import functools
from typing import TypeVar

from .._protocol import schedules
from .._protocol.core import QueueCore
from .._protocol.plan import Plan
from .._protocol.schedules import ScheduleRow
from .._protocol.sharding import ShardList
from .cluster import AsyncBackend
from .shard_calls import AsyncShardCalls

T = TypeVar("T")


class AsyncShardSchedules:
    """The schedules of a sharded queue's shards (reached by `calls`), placed by
    `shard_list`."""

    def __init__(self, calls: AsyncShardCalls, shard_list: ShardList, core: QueueCore) -> None:
        self.calls = calls
        self.shard_list = shard_list
        self.core = core

    async def store(self, plan: Plan[T], name: str, group_id: str, deadline: float) -> T:
        """Stored on the group's shard; a schedule of the same name on another shard is
        removed first (none may be down)."""
        calls = self.calls
        target = self.shard_list.shard_of(group_id)
        others = [n for n in calls.names if n != target]
        for other in others:
            calls.check_up(other)
        if others:
            unschedule = schedules.unschedule(self.core, name)
            await calls.on_names(unschedule, deadline, f"schedule {name!r}", others)
        return await calls.on(target, plan, deadline)

    async def fire(self, deadline: float) -> int:
        """Each shard fires its own schedules. While the list changes, the schedules of groups
        that move wait (their ticks are then caught up)."""
        results = await self.calls.answering(functools.partial(self._fire_on, deadline), True)
        return sum(results.values())

    async def _fire_on(self, deadline: float, name: str, backend: AsyncBackend) -> int:
        calls, core = self.calls, self.core
        due = await backend.run(schedules.due_schedules(core), calls.claim_by(deadline))
        fire: list[ScheduleRow] = []
        for row in due:
            target, previous = self.shard_list.placement(row.group_id)
            if target == previous == name:
                fire.append(row)
            elif target == previous:  # on the group's shard first, then gone from here
                calls.check_up(target)
                await calls.backend(target).run(schedules.put_row(core, row), deadline)
                await backend.run(schedules.unschedule(core, row.name), deadline)
        return (
            await backend.run(schedules.fire(core, fire), calls.claim_by(deadline)) if fire else 0
        )
