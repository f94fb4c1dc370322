"""The router of a queue over several clusters (shards); `_sync/shards.py` is generated from it.
A group lives on one shard (`_protocol/sharding.py`), so within a group all holds as on one
cluster. Only what is cross-shard lives here: publishes split by shard behind the shard list's
epoch, claim rounds gathered across shards, answers merged; the calls on the shards and the
probes of one that stopped answering (`shard_calls.py`), changes of the shard list
(`moves.py`), follow-ups to other shards (`outbox.py`) and schedules (`shard_schedules.py`) in
modules of their own, each given what it needs (never this router)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from .._protocol import batches, publish, shard_tables
from .._protocol.batches import BatchWrite
from .._protocol.core import QueueCore
from .._protocol.messages import NewMessage
from .._protocol.plan import Plan, Statement
from .._protocol.round_spec import CheckedRound, Settlement
from .._protocol.sharding import (
    ShardList,
    finished_on,
    merge_rounds,
    rotation,
    route_follow_ups,
    shares,
    split_by_shard,
    split_round,
)
from .._runtime import LOCAL_PUBLISHES
from ..errors import (
    BackendError,
    CrossShard,
    ForwardPending,
    InvalidArgument,
    PartialRound,
    QueueFull,
    Unavailable,
)
from ..types import Lease, NodeView, Round, ShardStatus, batch_shard
from .cluster import AsyncBackend, Merge
from .moves import AsyncMoves
from .outbox import AsyncOutbox
from .shard_calls import NOT_ANSWERED, AsyncShardCalls
from .shard_schedules import AsyncShardSchedules

T = TypeVar("T")

DEFAULT_CLAIM_DEADLINE = 2.0
"""How long a claim round waits for one shard: one that does not answer in time is skipped by
claims (the others' leases are returned) until it answers a background probe."""


class AsyncShardRouter:
    """Routes a queue's calls to its shards (`backends`, by name, in the list's order): an
    `AsyncRouter` (`router.py`)."""

    scoped_dedup = True
    """Dedup ids are scoped to their group: the same id in two groups is two messages."""
    cluster: AsyncBackend | None = None
    """Not on one cluster (a shard's backend is `backend(name)`)."""

    def __init__(
        self,
        backends: Mapping[str, AsyncBackend],
        shard_list: ShardList,
        core: QueueCore,
        *,
        claim_deadline: float,
    ) -> None:
        self.shard_list = shard_list
        self.core = core
        self.calls = AsyncShardCalls(backends, core, claim_deadline=claim_deadline)
        """The shards, which of them answer, and the calls on them."""
        for backend in backends.values():
            backend.known.sharded = True
        self._turn = 0
        self.moves = AsyncMoves(self.calls, shard_list, core)
        self.outbox = AsyncOutbox(
            self.calls, shard_list, core, functools.partial(self.publish, bounded=False)
        )
        self.schedules = AsyncShardSchedules(self.calls, shard_list, core)

    @property
    def names(self) -> list[str]:
        return self.calls.names

    @property
    def claim_deadline(self) -> float:
        return self.calls.claim_deadline

    @property
    def resent(self) -> int:
        return self.calls.resent

    @property
    def tenants_on(self) -> bool:
        return any(backend.known.tenants_on for backend in self.calls.backends.values())

    def backend(self, name: str) -> AsyncBackend:
        return self.calls.backend(name)

    async def setup(self, deadline: float) -> None:
        await self.calls.setup(deadline)

    def down(self) -> list[str]:
        """The shards that did not answer, probed in the background (down, or skipped by
        claims)."""
        return self.calls.down()

    # ------------------------------------------------------------------------ routes

    async def on_group(
        self, group_id: str, plan: Plan[T], deadline: float, *, merge: Merge[T] | None = None
    ) -> T:
        """On the shard that has the group's messages. A plan that `empties_group` may leave a
        moving group with none on its old shard, which then lets its new shard serve it."""
        name = await self.moves.locate(group_id, deadline)
        result = await self.calls.on(name, plan, deadline)
        if "batches_sent" in plan.batch.slots:  # (counts for batches elsewhere: cancels)
            self.outbox.written.add(name)
            await self.outbox.forward_soon(deadline)
        if (
            plan.empties_group
            and self.shard_list.changing
            and name != self.shard_list.shard_of(group_id)
        ):
            await self.moves.release_if_gone({group_id}, deadline)
        return merge({name: result}, []) if merge is not None else result

    async def everywhere(self, plan: Plan[T], deadline: float, what: str) -> list[T]:
        return list((await self.calls.on_names(plan, deadline, what)).values())

    async def gather(
        self, plan: Plan[T], deadline: float, merge: Merge[T], *, workers: bool = False
    ) -> T:
        """From every shard that answers, merged; `workers`: as claims do (`answering`)."""
        by = self.calls.claim_by(deadline) if workers else deadline
        results = await self.calls.answering(lambda _, b: b.run(plan, by), workers)
        return merge(results, [name for name in self.names if name not in results])

    async def publish(
        self, messages: Sequence[NewMessage], deadline: float, *, bounded: bool = True
    ) -> list[int]:
        """Per target shard, atomically (not across shards); the moving groups that still
        have messages on their old shard held on the new one until those are delivered.
        `bounded`: False for follow-ups forwarded from an outbox (never bounded; those that
        join batches were counted there). A message that joins a batch living on another
        shard than its group's is written on the batch's shard (counted there, in its outbox)
        and forwarded from there: `ForwardPending` if that could not be done in time."""
        through = [
            i
            for i, m in enumerate(messages)
            if bounded and m.batch is not None and not self._lives_with(m.group_id, m.batch)
        ]
        if not through:
            return await self._publish_here(messages, deadline, bounded=bounded)
        seqs: list[int | None] = [None] * len(messages)
        by_home: dict[str, list[int]] = {}
        for i in through:
            by_home.setdefault(batch_shard(messages[i].batch or ""), []).append(i)
        for home, indexes in by_home.items():
            plan = batches.through_plan(self.core, [messages[i] for i in indexes])
            rows = await self._on_guarded(home, plan, deadline)
            forwarded: dict[int, int | None] = {}
            with contextlib.suppress(*NOT_ANSWERED):
                forwarded = await self.outbox.forward_from(home, deadline)
            for i, row in zip(indexes, rows, strict=True):
                seqs[i] = forwarded.get(row)
        # Then the others (a batch done refuses the first part: nothing is written).
        direct = [i for i in range(len(messages)) if i not in set(through)]
        if direct:
            part = await self._publish_here([messages[i] for i in direct], deadline)
            for i, seq in zip(direct, part, strict=True):
                seqs[i] = seq
        LOCAL_PUBLISHES.wake([self.core.names.queue])
        return _all_known(seqs)

    def _lives_with(self, group_id: str, batch_id: str) -> bool:
        """Whether a group's messages are published on the shard of a batch (it lives there
        and does not move)."""
        target, previous = self.shard_list.placement(group_id)
        return target == previous == batch_shard(batch_id)

    async def _on_guarded(self, name: str, plan: Plan[T], deadline: float) -> T:
        """A plan that publishes on shard `name`, behind the shard list's epoch."""
        self.calls.check_up(name)
        try:
            guarded = shard_tables.guarded(self.core, plan, self.shard_list.epoch)
            return await self.calls.on(name, guarded, deadline)
        except BackendError as exc:
            raise self.moves.stale(name, exc) from exc

    async def _publish_here(
        self, messages: Sequence[NewMessage], deadline: float, *, bounded: bool = True
    ) -> list[int]:
        """`publish` of messages that go where their group lives."""
        parts = split_by_shard(messages, lambda m: self.shard_list.shard_of(m.group_id))
        for name in parts:
            self.calls.check_up(name)
        waiting = await self.moves.still_on_old_shards({m.group_id for m in messages}, deadline)

        async def part(name: str, backend: AsyncBackend) -> list[int] | QueueFull:
            held = sorted({messages[i].group_id for i in parts[name]} & waiting)
            tenants_on = backend.known.tenants_on if bounded else None
            mine = publish.plan(
                self.core,
                [messages[i] for i in parts[name]],
                tenants_on=tenants_on,
                bind_rows=backend.binds_rows,
                counted=not bounded,
            )
            try:
                plan = shard_tables.guarded(self.core, mine, self.shard_list.epoch, held)
                return await backend.run(plan, deadline)
            except QueueFull as exc:  # this shard's part only: the others may be written
                return exc
            except BackendError as exc:
                raise self.moves.stale(name, exc) from exc

        results = await self.calls.on_many(list(parts), part)
        published = {n: r for n, r in results.items() if isinstance(r, list)}
        if published:
            LOCAL_PUBLISHES.wake([self.core.names.queue])
            held = {messages[i].group_id for n in published for i in parts[n]} & waiting
            await self.moves.release_if_delivered(held, deadline)
        failed = [(n, r) for n, r in results.items() if isinstance(r, BaseException)]
        if failed and (len(parts) == 1 or (not published and _all_full(failed))):
            raise failed[0][1]  # nothing was written
        if failed:
            raise Unavailable(
                f"publish_many: not published on shard(s) "
                f"{'; '.join(f'{name}: {exc}' for name, exc in failed)}"
                + (f" (published on {', '.join(published)})" if published else "")
            )
        seqs = [0] * len(messages)
        for name, indexes in parts.items():
            for index, seq in zip(indexes, published[name], strict=True):
                seqs[index] = seq
        return seqs

    async def round(
        self, checked: CheckedRound, deadline: float, *, probe_when_idle: bool
    ) -> Round:
        """Each shard's part of the round in one round trip to it (the shards in parallel, each
        given `claim_deadline`): all of `n` from the first shard of a rotating order, then what
        it lacked from the others at once (an even split of `n` measured 1.8x the leader CPU
        per message at 3 shards: bench/results/sharding.md). A shard asked only to claim, after
        one that found nothing, first asks with a read. Settlements on a shard that does not
        answer come back in `Round.unsettled` (`PartialRound`), to be sent again."""
        parts = split_round(checked, self.shard_list.shard_of_lease)
        live = self.calls.claimable()
        self._turn += 1
        order = rotation(live, self._turn) if live else []
        want = {order[0]: checked.n} if order and checked.n else {}
        first = [name for name in order if want.get(name) or name in parts]
        first += [name for name in parts if name not in first]  # a down shard's settlements

        async def part(
            want: Mapping[str, int], settling: bool, name: str, backend: AsyncBackend
        ) -> Round:
            settle = settling and name in parts
            if settle:
                self.calls.check_up(name, leases=True)
            mine = parts[name] if settle else []
            n, by = want.get(name, 0), self.calls.claim_by(deadline)
            return await self._part(name, backend, checked, mine, n, by, probe=not settle)

        results = await self.calls.on_many(first, functools.partial(part, want, True), claims=True)
        forwarded = await self.outbox.forward_soon(deadline)
        rounds = {n: r for n, r in results.items() if not isinstance(r, BaseException)}
        unsettled = [s for n in results if n not in rounds for s in parts.get(n, ())]
        exhausted = {
            n for n in results if n not in rounds or len(rounds[n].leases) < want.get(n, 0)
        }
        remaining = checked.n - sum(len(r.leases) for r in rounds.values())
        while remaining > 0:  # the shards not asked yet, or that filled their share, for more
            ask = [n for n in order if n not in exhausted and n in self.calls.claimable()]
            more_want = shares(remaining, ask) if ask else {}
            ask = [name for name in ask if more_want[name]]
            if not ask:
                break
            more = await self.calls.on_many(
                ask, functools.partial(part, more_want, False), claims=True
            )
            for name, extra in more.items():
                if isinstance(extra, BaseException) or len(extra.leases) < more_want[name]:
                    exhausted.add(name)
                if not isinstance(extra, BaseException):
                    remaining -= len(extra.leases)
                    old = rounds.get(name, Round())
                    rounds[name] = Round([*old.leases, *extra.leases], old.lost, old.extended)
        if self.outbox.written:  # (the claims for more settled expired or cancelled leases)
            forwarded += await self.outbox.forward_soon(deadline)
        if checked.n and not rounds and not self.calls.claimable():
            raise Unavailable(f"queue {self.core.names.queue!r}: no shard answers")
        if self.shard_list.changing:
            # On failure left held: the next settlement or release_moved_groups() frees them.
            with contextlib.suppress(*NOT_ANSWERED):
                finished = finished_on(checked, self.shard_list.shard_of_lease, rounds)
                await self.moves.release_moved(finished, deadline)
        done = dataclasses.replace(merge_rounds(checked, rounds, unsettled), forwarded=forwarded)
        if unsettled:
            down = sorted({self.shard_list.shard_of_lease(s.lease) for s in unsettled})
            raise PartialRound(
                f"settlements on shard(s) {', '.join(down)} were not applied (they did not "
                f"answer); the rest of the round was: see .round",
                done,
            )
        return done

    async def on_leases(
        self, leases: Sequence[Lease], plan: Callable[[Sequence[Lease]], Plan[T]], deadline: float
    ) -> list[T]:
        """`plan` of each shard's leases, on that shard, at once; a shard that is down or
        does not answer is left out."""
        by_shard: dict[str, list[Lease]] = {}
        for lease in leases:
            by_shard.setdefault(self.shard_list.shard_of_lease(lease), []).append(lease)
        live = [name for name in by_shard if name in self.calls.live()]
        results = await self.calls.on_many(
            live, lambda name, backend: backend.run(plan(by_shard[name]), deadline)
        )
        return [r for r in results.values() if not isinstance(r, BaseException)]

    async def settle(self, checked: CheckedRound, deadline: float, what: str) -> Round:
        """Settlements alone (`ack`, `nack`, `extend`, `dead_letter`, `ack_many`), each on its
        lease's shard; when only one shard is concerned, its error is raised as it is."""
        parts = split_round(checked, self.shard_list.shard_of_lease)
        for name in parts:
            self.calls.check_up(name, leases=True)

        async def part(name: str, backend: AsyncBackend) -> Round:
            return await self._part(name, backend, checked, parts[name], 0, deadline, False)

        if len(parts) == 1:  # its error as it is
            [name] = parts
            rounds = {name: await self.calls.on_one(name, part)}
        else:
            results = await self.calls.on_many(list(parts), part)
            rounds = {n: r for n, r in results.items() if not isinstance(r, BaseException)}
            if failed := [name for name in results if name not in rounds]:
                raise Unavailable(f"{what}: shard(s) {', '.join(failed)} did not answer")
        finished = finished_on(checked, self.shard_list.shard_of_lease, rounds)
        await self.moves.release_moved(finished, deadline)
        forwarded = await self.outbox.forward_soon(deadline)
        return dataclasses.replace(merge_rounds(checked, rounds, ()), forwarded=forwarded)

    async def _part(
        self,
        name: str,
        backend: AsyncBackend,
        checked: CheckedRound,
        settlements: Sequence[Settlement],
        n: int,
        deadline: float,
        probe: bool,
    ) -> Round:
        """One shard's part of a round: its settlements' follow-ups published with them when
        their group lives here (behind the shard list's epoch, as publishes are), else written
        to its outbox."""
        routed = route_follow_ups(settlements, name, self.shard_list)
        guard = None
        if any(s.follow_ups for s in routed):
            epoch = self.shard_list.epoch

            def guard(plan: Plan[Round]) -> Plan[Round]:
                return shard_tables.guarded(self.core, plan, epoch)

        try:
            result = await backend.round(
                checked.part(routed, n), deadline, probe_when_idle=probe, guard=guard
            )
        except BackendError as exc:
            raise self.moves.stale(name, exc) from exc
        batched = any(s.lease.batch for s in settlements) or any(
            e.batch for e in (*result.expired, *result.cancelled)
        )
        if any(s.outboxed for s in routed) or batched:
            self.outbox.written.add(name)  # (and a batch's counts, or callbacks, it may have)
        return result

    async def transaction(
        self, statements: Sequence[Statement], messages: Sequence[NewMessage], deadline: float
    ) -> list[int]:
        """On the one shard of its publishes' groups (refused if they span shards, or if it
        publishes nothing: its shard would be unknown), behind the epoch, as a publish. Its
        messages that join batches are counted there, so their batches must live there too
        (a publish outside a transaction goes through the batch's shard instead: it has no
        statements of the caller's to keep with it)."""
        targets = {self.shard_list.shard_of(m.group_id) for m in messages}
        if len(targets) != 1:
            raise CrossShard(
                "a transaction on a sharded queue publishes to groups of one shard (and at "
                f"least one): these are on {sorted(targets) or 'none'}"
            )
        [name] = targets
        for m in messages:
            if m.batch is not None and (home := batch_shard(m.batch)) != name:
                self.backend(home)  # (a batch of no shard of this queue: refused as such)
                raise CrossShard(
                    f"a transaction on shard {name!r} (its groups') cannot join batch "
                    f"{m.batch!r}, which lives on shard {home!r}: the message and its count "
                    f"in the batch would be writes on two shards. Publish it outside the "
                    f"transaction (`publish(batch=...)`, forwarded exactly once), or in a "
                    f"transaction whose groups live on {home!r}"
                )
        self.calls.check_up(name)
        held = await self.moves.still_on_old_shards({m.group_id for m in messages}, deadline)
        plan = shard_tables.guarded(
            self.core,
            publish.transaction(self.core, statements, messages),
            self.shard_list.epoch,
            sorted(held),
        )
        try:
            seqs = await self.calls.on(name, plan, deadline)
        except BackendError as exc:
            raise self.moves.stale(name, exc) from exc
        await self.moves.release_if_delivered(held, deadline)
        return seqs

    async def schedule(self, plan: Plan[T], name: str, group_id: str, deadline: float) -> T:
        return await self.schedules.store(plan, name, group_id, deadline)

    async def fire_schedules(self, deadline: float) -> int:
        """Each shard fires its own schedules. Also the workers' sweep of the moved groups a
        crash left held, and of what a crashed worker left in the outboxes."""
        await self.moves.sweep(deadline)
        fired = await self.schedules.fire(deadline)
        with contextlib.suppress(*NOT_ANSWERED):  # what a crashed forwarder left behind
            await self.outbox.forward(deadline)
        return fired

    async def release_moved_groups(self, deadline: float) -> int:
        return await self.moves.release_moved_groups(deadline)

    async def shard_status(self, deadline: float) -> list[ShardStatus]:
        return await self.moves.shard_status(deadline)

    async def dead(
        self, plan: Plan[int], deadline: float, *, seqs: object, shard: str | None, what: str
    ) -> int:
        """Dead letters: those seqs of `shard` (seqs are per shard), or all of them."""
        if what == "requeue_dead" and self.shard_list.changing:
            # A requeue puts messages back on the dead letter's shard, unguarded: for a group
            # that has moved on, that would be a second shard.
            raise InvalidArgument(
                "requeue_dead waits for the change of the shard list to finish "
                "(`rqlite-queue shards status`)"
            )
        if shard is None and seqs is not None and len(self.names) > 1:
            raise InvalidArgument(f"{what}: seqs are per shard: give shard= (DeadLetter.shard)")
        if shard is None and seqs is None:
            return sum((await self.calls.on_names(plan, deadline, what)).values())
        name = self.names[0] if shard is None else shard
        self.backend(name)  # an unknown name is refused
        return await self.calls.on(name, plan, deadline)

    def batch_shard(self, parent: str | None) -> str:
        """A nested batch lives on its parent's shard (its completion counts there, in its
        own transaction); another, on a shard that takes new groups, chosen by chance."""
        if parent is not None:
            name = batch_shard(parent)
            self.backend(name)  # an unknown name is refused
            return name
        return self.shard_list.shard_of(self.core.token())

    async def write_batch(self, write: BatchWrite, deadline: float) -> list[int | None]:
        """On the batch's shard: the messages of its groups published there, the others
        written to its outbox (counted there) and forwarded at once."""
        home = batch_shard(write.parts[0].spec.id)
        plan = batches.write_plan(
            self.core, write, here=lambda group_id: self._lives_in(group_id, home)
        )
        written = await self._on_guarded(home, plan, deadline)
        seqs = list(written.seqs)
        # Its messages of other shards' groups, and the callbacks of a batch it finished (one
        # left empty, say), wait in its outbox.
        if written.outboxed or any(part.close for part in write.parts):
            forwarded: dict[int, int | None] = {}
            with contextlib.suppress(*NOT_ANSWERED):
                forwarded = await self.outbox.forward_from(home, deadline)
            rows = iter(written.outboxed)
            for i, seq in enumerate(seqs):
                if seq is None:
                    row = next(rows, None)
                    seqs[i] = None if row is None else forwarded.get(row)
        LOCAL_PUBLISHES.wake([self.core.names.queue])
        return seqs if None not in seqs else list(_all_known(seqs))

    def _lives_in(self, group_id: str, name: str) -> bool:
        target, previous = self.shard_list.placement(group_id)
        return target == previous == name

    async def on_batch(self, batch_id: str, plan: Plan[T], deadline: float) -> T:
        """On the shard the batch's id names."""
        return await self.calls.on(batch_shard(batch_id), plan, deadline)

    async def nodes(self) -> list[NodeView]:
        """Each shard's nodes, named `shard/node`."""
        return await self.calls.nodes()

    async def close(self) -> None:
        await self.calls.close()


def _all_known(seqs: Sequence[int | None]) -> list[int]:
    """The seqs, all known; else `ForwardPending` with those known."""
    if any(seq is None for seq in seqs):
        on_way = sum(seq is None for seq in seqs)
        raise ForwardPending(
            f"{on_way} message(s) of batches are written (counted in their batch, in its "
            f"shard's outbox) but not yet on their group's shard, which did not answer in time: "
            f"they will be forwarded when it does; do not publish them again",
            seqs,
        )
    return [seq for seq in seqs if seq is not None]


def _all_full(failed: Sequence[tuple[str, BaseException]]) -> bool:
    return all(isinstance(exc, QueueFull) for _, exc in failed)
