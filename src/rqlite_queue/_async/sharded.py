"""The queue over several clusters: each group lives on one shard (rendezvous hashing of its id
over the shards' names, `sharding.py`), and this transport routes every call to the shards it
concerns. This file is the source; `_sync/sharded.py` is generated from it.

Within a group everything holds exactly as on one cluster (FIFO, exclusivity, fencing, parks,
dedup), since a group's messages, lease and dedup ids are all on its one shard. Across shards:
claims start from a rotating shard and spread `n` over them; round-robin is exact within a
shard and interleaved across shards; `publish_many` is atomic per shard, not across shards.
A shard that does not answer is skipped by claims and refused at once for its groups'
publishes, and probed in the background until it answers again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from .. import sql
from .._runtime import AsyncFanOut, Awaitable
from ..checks import check_id, show
from ..codec import Codec
from ..core import Plan, Probe, PublishItem, QueueCore, Round
from ..errors import (
    BackendError,
    InvalidArgument,
    LeaseLost,
    PartialRound,
    QueueError,
    ShardDown,
    StaleShardList,
    TransportClosed,
    Unavailable,
)
from ..lease import DeadLetter, GroupInfo, Lease, Schedule, Stats
from ..sharding import (
    Health,
    ShardList,
    ShardSpec,
    ShardStatus,
    check_shard_name,
    in_given_order,
    merge_probes,
    merge_sorted,
    merge_stats,
    parse_shard_list,
    rotation,
    scoped_dedup_id,
    shares,
    split_by_shard,
    unpack_item,
)
from ..sql import STALE_EPOCH_ERROR, Batch, Result, ScheduleRow
from .transport import (
    DEFAULT_DEADLINE,
    AsyncRqliteTransport,
    AsyncSqliteTransport,
    AsyncTransport,
    _sqlite_path,
    _token,
)

T = TypeVar("T")

_RQLITE_ONLY = frozenset({"auth", "verify", "timeout", "max_skew", "skew_warning"})
PROBE_DEADLINE = 2.0
DEFAULT_CLAIM_DEADLINE = 2.0
"""How long a claim round waits for one shard: a shard that does not answer in time is
skipped by claims (the others' leases are returned) until it answers a background probe."""
RELEASE_SWEEP = 1.0
"""While the shard list changes, how often `fire_schedules` (called by workers) looks for
moved groups still held on their new shard after their old one emptied (after a crash)."""
"""How long a background probe of a down shard may take."""


class _Routed:
    """The executor of a sharded transport: it has none of its own (every call goes to a
    shard's transport), so a call that reached it is a bug, said so."""

    async def execute(self, batch: Batch, deadline: float) -> list[Result]:
        raise AssertionError("a sharded transport sends nothing itself: calls go to its shards")

    async def close(self) -> None:
        return None


class AsyncShardedTransport(AsyncTransport):
    """One queue over several rqlite clusters (shards), with the methods of a single-cluster
    transport: code that takes an `AsyncTransport` works unchanged.

    `shards`: a URL such as `a=http://h1:4001,http://h2:4001;b=http://h3:4001` (clusters
    separated by `;`, each optionally named; SQLite files too, named), or a mapping of shard
    name to an open transport (all on the same queue). Options (`queue`, `clock`, `deadline`,
    `auth`, `timeout`...) are given to every shard's transport.

    Seqs are per shard: `Lease.shard`, `DeadLetter.shard` and `GroupInfo.shard` say which, and
    `requeue_dead` / `purge_dead` take `shard=` with seqs. Dedup ids are scoped to their group
    (the same id in two groups is two messages)."""

    def __init__(
        self,
        shards: str | Mapping[str, AsyncTransport],
        *,
        queue: str = "default",
        codec: Codec | type[Any] | None = None,
        clock: Callable[[], float] = time.time,
        deadline: float = DEFAULT_DEADLINE,
        dedup_key: Callable[[Any], str | None] | None = None,
        claim_deadline: float = DEFAULT_CLAIM_DEADLINE,
        **options: Any,
    ) -> None:
        core = QueueCore(queue=queue, codec=codec, clock=clock, token=_token, chance=random.random)
        super().__init__(_Routed(), core, deadline=deadline)
        if (
            isinstance(claim_deadline, bool)
            or not isinstance(claim_deadline, int | float)
            or not claim_deadline > 0
        ):
            raise InvalidArgument(
                f"claim_deadline must be a number of seconds > 0, got {claim_deadline!r}"
            )
        self.claim_deadline = min(self.deadline, float(claim_deadline))
        self._dedup_key = dedup_key
        self._shards: dict[str, AsyncTransport] = {}
        specs: list[ShardSpec] = []
        epoch = 0
        if isinstance(shards, Mapping):
            for name, transport in shards.items():
                if not isinstance(transport, AsyncTransport):
                    raise InvalidArgument(f"shard {name!r}: not a transport: {show(transport)}")
                if transport.queue != queue:
                    raise InvalidArgument(
                        f"shard {name!r} is on queue {transport.queue!r}, not {queue!r}"
                    )
                self._shards[check_shard_name(name)] = transport
                specs.append(ShardSpec(name, ""))
        else:
            parsed = parse_shard_list(shards)
            specs, epoch = list(parsed.specs), parsed.epoch
            try:
                for spec in specs:
                    self._shards[spec.name] = _open_shard(
                        spec,
                        queue=queue,
                        codec=codec,
                        clock=clock,
                        deadline=deadline,
                        options=options,
                    )
            except BaseException:
                for opened in self._shards.values():
                    opened._core.closed = True
                raise
        if not self._shards:
            raise InvalidArgument("a sharded transport needs at least one shard")
        self.shard_list = ShardList(tuple(specs), epoch)
        """The shards, their part in a change of the list, and the list's epoch."""
        self.names: list[str] = list(self._shards)
        """The shards' names, in the order given."""
        self.health = Health()
        """Shards that did not answer within the deadline: their groups' calls are refused."""
        self.claim_health = Health()
        """Shards whose claim round did not answer within `claim_deadline`: claims skip them
        (publishes still try them) until the background probe finds them answering."""
        self._fan = AsyncFanOut(len(self._shards))
        self._turn = 0
        self._next_release_sweep = 0.0

    @property
    def resent(self) -> int:
        """Batches the shards sent again after an unknown outcome."""
        return sum(shard.resent for shard in getattr(self, "_shards", {}).values())

    @resent.setter
    def resent(self, value: int) -> None:
        """The base class starts the count at 0; the shards keep their own."""

    def shard(self, name: str) -> AsyncTransport:
        """The transport of one shard."""
        try:
            return self._shards[name]
        except KeyError:
            raise InvalidArgument(f"no shard named {name!r} (shards: {self.names})") from None

    def shard_of(self, group_id: str) -> str:
        """The name of the shard `group_id` lives on (while the shard list changes: the shard
        that takes its new messages once its old shard has none left)."""
        check_id(group_id, "group_id")
        return self.shard_list.placement(group_id)[0]

    def placement(self, group_id: str) -> tuple[str, str]:
        """(target, previous) of `ShardList.placement`: the same shard twice unless the group
        moves in the change of the shard list under way."""
        check_id(group_id, "group_id")
        return self.shard_list.placement(group_id)

    async def _locate(self, group_id: str) -> str:
        """The shard that has the group's messages now: its previous shard while it still
        has messages there during a change of the list, else its target."""
        target, previous = self.placement(group_id)
        if target == previous:
            return target
        here = await self._on(previous, lambda shard: shard.peek(group_id, 1))
        return previous if here else target

    def down_shards(self) -> list[str]:
        """The shards that did not answer and are being probed in the background (down, or
        skipped by claims)."""
        return sorted({*self.health.down(), *self.claim_health.down()})

    # ------------------------------------------------------------------------ plumbing

    async def _setup(self, deadline: float) -> None:
        """Set every shard up; one that does not answer by `deadline` is marked down (and
        probed in the background), unless none answers."""
        names = self.names
        results = await self._fan.all(
            [functools.partial(self._shards[name]._setup, deadline) for name in names]
        )
        failed = []
        for name, result in zip(names, results, strict=True):
            if isinstance(result, Unavailable):
                failed.append((name, result))
            elif isinstance(result, BaseException):
                raise result
        if len(failed) == len(names):
            raise Unavailable(f"no shard answered: {failed[0][0]}: {failed[0][1]}")
        for name, _ in failed:
            self._mark_down(name)
        self._schema_checked = True

    def _mark_down(self, name: str, health: Health | None = None) -> None:
        (health or self.health).failed(name, time.monotonic())
        self._fan.background(self._watch)

    async def _watch(self) -> None:
        """The background job: probe the down shards when due, until all answer again."""
        healths = (self.health, self.claim_health)
        while any(h.down() for h in healths) and not self.closed:
            now = time.monotonic()
            for name in sorted({name for h in healths for name in h.due(now)}):
                shard = self._shards[name]
                try:
                    if not shard._schema_checked:
                        await shard._setup(time.monotonic() + PROBE_DEADLINE)
                    await shard._run(shard._core.probe(0), PROBE_DEADLINE)
                except QueueError:
                    for health in healths:
                        if health.is_down(name):
                            health.failed(name, time.monotonic())
                else:
                    for health in healths:
                        health.recovered(name)
            retries = [r for h in healths if (r := h.next_retry()) is not None]
            if not retries:
                return
            if await self._fan.pause(max(0.01, min(retries) - time.monotonic())):
                return

    def _live(self) -> list[str]:
        return [name for name in self.names if not self.health.is_down(name)]

    def _claimable(self) -> list[str]:
        """The shards claims go to: neither down nor skipped after a failed claim."""
        return [n for n in self._live() if not self.claim_health.is_down(n)]

    def _check_up(self, name: str, leases: bool = False) -> None:
        """ShardDown if the shard is down; with `leases` (calls on leases, settlements) also
        if it is skipped by claims: a lease call must not hold its caller for a deadline."""
        since = self.health.since(name)
        if since is None and leases:
            since = self.claim_health.since(name)
        if since is not None:
            raise ShardDown(
                f"shard {name!r} has not answered for {time.monotonic() - since:.1f}s "
                "(probed in the background); its groups are unavailable until it answers"
            )

    async def _on(
        self, name: str, call: Callable[[AsyncTransport], Awaitable[T]], leases: bool = False
    ) -> T:
        """Run `call` on one shard; a shard found unavailable is marked down."""
        self._check_up(name, leases)
        try:
            return await call(self._shards[name])
        except ShardDown:
            raise
        except Unavailable:
            self._mark_down(name)
            raise

    async def _on_many(
        self,
        names: Sequence[str],
        call: Callable[[str, AsyncTransport], Awaitable[T]],
        health: Health | None = None,
    ) -> dict[str, T | BaseException]:
        """Run `call` on several shards at once; unavailable ones are marked down (in
        `health`, default the one that refuses publishes) and given as their exception. Any
        other error is raised."""
        results = await self._fan.all(
            [functools.partial(call, name, self._shards[name]) for name in names]
        )
        out: dict[str, T | BaseException] = {}
        for name, result in zip(names, results, strict=True):
            if isinstance(result, Unavailable):
                if not isinstance(result, ShardDown):  # refused at once: not a new failure
                    self._mark_down(name, health)
            elif isinstance(result, BaseException):
                raise result
            out[name] = result
        return out

    async def _everywhere(
        self,
        call: Callable[[str, AsyncTransport], Awaitable[T]],
        what: str,
        names: Sequence[str] | None = None,
    ) -> dict[str, T]:
        """Run `call` on every shard (or on `names`) that is not down; Unavailable, naming
        them, if some did not answer."""
        targets = self.names if names is None else names
        results = await self._on_many([n for n in targets if not self.health.is_down(n)], call)
        answered = {n: r for n, r in results.items() if not isinstance(r, BaseException)}
        missing = [n for n in targets if n not in answered]
        if missing:
            raise Unavailable(f"{what}: shard(s) {', '.join(missing)} did not answer")
        return answered

    async def _answering(
        self, call: Callable[[str, AsyncTransport], Awaitable[T]], workers: bool = False
    ) -> dict[str, T]:
        """Run `call` on every shard that answers (reads that may leave a down shard out).
        `workers`: a call of the workers' loop: on the shards claims go to, skipping (like
        claims) one that failed to answer it."""
        if workers:
            results = await self._on_many(self._claimable(), call, self.claim_health)
        else:
            results = await self._on_many(self._live(), call)
        answered = {n: r for n, r in results.items() if not isinstance(r, BaseException)}
        if not answered:
            raise Unavailable(f"queue {self.queue!r}: no shard answered")
        return answered

    def _lease_shard(self, lease: object) -> str:
        if not isinstance(lease, Lease):
            raise InvalidArgument(f"expected a Lease, got {show(lease)}")
        if lease.shard:
            if lease.shard not in self._shards:
                raise InvalidArgument(f"the lease is from shard {lease.shard!r}, not one of these")
            return lease.shard
        return self.shard_of(lease.group_id)

    def _by_shard(self, leases: Iterable[Any]) -> dict[str, list[Any]]:
        parts: dict[str, list[Any]] = {}
        for item in leases:
            lease = item[0] if isinstance(item, tuple) else item
            parts.setdefault(self._lease_shard(lease), []).append(item)
        return parts

    def _check_open(self) -> None:
        if self._core.closed:
            raise TransportClosed(f"queue {self.queue!r}: the transport is closed")

    def _dedup(self, group_id: str, event: Any, dedup_id: str | None) -> str | None:
        if dedup_id is None and self._dedup_key is not None:
            try:
                dedup_id = self._dedup_key(event)
            except Exception as exc:
                raise InvalidArgument(f"dedup_key failed on this event: {exc!r}") from exc
        if dedup_id is None:
            return None
        check_id(dedup_id, "dedup_id")
        return scoped_dedup_id(group_id, dedup_id)

    # ------------------------------------------------------------------------ publish

    async def publish(
        self,
        group_id: str,
        event: Any,
        priority: int = 0,
        *,
        dedup_id: str | None = None,
        delay: float | None = None,
        not_before: float | None = None,
        ttl: float | None = None,
    ) -> int:
        """As on one cluster, on the group's shard. While the shard list changes, a group
        that moves is published on its new shard, held there while its old shard still has
        its messages (one request to the old shard first)."""
        self._check_open()
        check_id(group_id, "group_id")  # before it is hashed to find its shard
        item = {
            "group_id": group_id,
            "event": event,
            "priority": priority,
            "dedup_id": self._dedup(group_id, event, dedup_id),
            "delay": delay,
            "not_before": not_before,
            "ttl": ttl,
        }
        return (await self._publish_items([item]))[0]

    async def _publish_items(self, items: list[dict[str, Any]]) -> list[int]:
        """Publish checked items: per target shard, atomically; the moving groups that still
        have messages on their old shard held on the new one until those are delivered."""
        parts = split_by_shard(items, lambda group: self.shard_list.placement(group)[0])
        plans = {  # every part checked (and encoded, once) before anything is sent
            name: self._shards[name]._core.publish_many([items[i] for i in indexes])
            for name, indexes in parts.items()
        }
        for name in parts:
            self._check_up(name)
        waiting = await self._still_on_old_shards({item["group_id"] for item in items})

        async def part(name: str, shard: AsyncTransport) -> list[int]:
            held = sorted({items[i]["group_id"] for i in parts[name]} & waiting)
            extra = [sql.wait_for_old_shard(shard._core.names, held)] if held else []
            plan = _guarded(plans[name], shard, self.shard_list.epoch, extra)
            try:
                return await shard._run(plan)
            except BackendError as exc:
                raise self._stale(name, shard, exc) from exc

        results = await self._on_many(list(parts), part)
        seqs = [0] * len(items)
        failed: list[tuple[str, BaseException]] = []
        for name, indexes in parts.items():
            result = results[name]
            if isinstance(result, BaseException):
                failed.append((name, result))
                continue
            for index, seq in zip(indexes, result, strict=True):
                seqs[index] = seq
        if failed:
            if len(parts) == 1:
                raise failed[0][1]
            applied = [name for name in parts if not isinstance(results[name], BaseException)]
            raise Unavailable(
                f"publish_many: not published on shard(s) "
                f"{'; '.join(f'{name}: {exc}' for name, exc in failed)}"
                + (f" (published on {', '.join(applied)})" if applied else "")
            )
        return seqs

    async def _still_on_old_shards(self, group_ids: Iterable[str]) -> set[str]:
        """Of these groups, the moving ones that still have messages on their old shard. The
        question is a write there, which gives the old shard this client's epoch: from then
        on no client with an older list can add to them."""
        asked: dict[str, list[str]] = {}
        for group_id in group_ids:
            target, previous = self.shard_list.placement(group_id)
            if target != previous:
                asked.setdefault(previous, []).append(group_id)
        if not asked:
            return set()
        for name in asked:
            self._check_up(name)

        async def ask(name: str, shard: AsyncTransport) -> set[str]:
            batch = sql.groups_present(shard._core.names, asked[name], epoch=self.shard_list.epoch)
            try:
                return await shard._run(Plan(batch, sql.read_present, sql.read_present))
            except BackendError as exc:
                raise self._stale(name, shard, exc) from exc

        results = await self._on_many(list(asked), ask)
        present: set[str] = set()
        for result in results.values():
            if isinstance(result, BaseException):
                raise result  # where the group is cannot be known: nothing is published
            present |= result
        return present

    def _stale(self, name: str, shard: AsyncTransport, exc: BackendError) -> BaseException:
        """What a failed guarded batch means: StaleShardList, or the error itself."""
        if STALE_EPOCH_ERROR.format(meta=shard._core.names.meta) in str(exc):
            return StaleShardList(
                f"shard {name!r} has been given a newer shard list than this client's "
                f"(epoch {self.shard_list.epoch}): nothing was published; give this client "
                "the new list"
            )
        return exc

    async def _release_moved(self, leases: Iterable[Lease]) -> None:
        """After messages left a moving group's old shard (acked, dead-lettered): if it has
        none left there, its new shard may serve it."""
        if not self.shard_list.changing:
            return
        groups = set()
        for lease in leases:  # a lease from the old shard of a group that moves
            target, previous = self.shard_list.placement(lease.group_id)
            if lease.shard and lease.shard == previous != target:
                groups.add(lease.group_id)
        if groups:
            await self._release_if_gone(groups)

    async def _release_if_gone(self, groups: set[str]) -> None:
        present = await self._still_on_old_shards(groups)
        gone = groups - present
        by_target: dict[str, list[str]] = {}
        for group_id in gone:
            by_target.setdefault(self.shard_list.placement(group_id)[0], []).append(group_id)
        await self._on_many(
            list(by_target),
            lambda name, shard: shard._run(
                Plan(sql.release_waits(shard._core.names, sorted(by_target[name])), _none)
            ),
        )

    async def release_moved_groups(self) -> int:
        """Let the new shards serve the moving groups whose old shard has delivered all of
        theirs (done after each such ack too; this catches any a crash left held). Returns
        how many were still held."""
        self._check_open()
        if not self.shard_list.changing:
            return 0
        results = await self._answering(
            lambda _, shard: shard._run(
                Plan(sql.waiting_groups(shard._core.names, limit=10_000), sql.read_waiting)
            )
        )
        waiting = {group_id for found in results.values() for group_id in found}
        if waiting:
            await self._release_if_gone(waiting)
        return len(waiting)

    async def publish_many(self, items: Iterable[PublishItem]) -> list[int]:
        """As on one cluster, split by shard: atomic on each shard, not across shards (a
        shard that fails leaves the others' messages published; the error names it). Every
        item is checked before anything is sent."""
        self._check_open()
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise InvalidArgument(f"publish_many takes a list of items, got {show(items)}")
        unpacked = [unpack_item(item) for item in items]
        for item in unpacked:
            if "group_id" not in item or "event" not in item:
                raise InvalidArgument("a publish_many item needs a group_id and an event")
            check_id(item["group_id"], "group_id")
            scoped = self._dedup(item["group_id"], item["event"], item.get("dedup_id"))
            if scoped is not None:
                item["dedup_id"] = scoped
        return await self._publish_items(unpacked)

    # ------------------------------------------------------------------------ claim, settle

    def _rotation(self) -> list[str]:
        live = self._claimable()
        self._turn += 1
        return rotation(live, self._turn) if live else []

    async def claim_many(
        self, worker_id: str, visibility: float, n: int, min_priority: int = 0
    ) -> list[Lease]:
        """Up to `n` leases from distinct groups: all of `n` from the first shard of a rotating
        order, then what it lacked from the other shards, asked in parallel. An empty shard
        costs a read, no write; a down shard is skipped."""
        self._core.claim(worker_id, visibility, n, min_priority)  # checks, as one cluster does
        result = await self.settle_and_claim(worker_id, visibility, n, min_priority=min_priority)
        return result.leases

    async def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Lease | None:
        leases = await self.claim_many(worker_id, visibility, 1, min_priority)
        return leases[0] if leases else None

    async def settle_and_claim(
        self,
        worker_id: str | None = None,
        visibility: float = 30.0,
        n: int = 0,
        *,
        ack: Sequence[Lease] = (),
        nack: Sequence[tuple[Lease, float]] = (),
        extend: Sequence[Lease] = (),
        dead: Sequence[tuple[Lease, str]] = (),
        hold_dead: bool = False,
        min_priority: int = 0,
    ) -> Round:
        """As on one cluster, each shard's part in one round trip to it (the shards in
        parallel). Settlements on a shard that does not answer come back in
        `Round.unsettled`, to be sent again; the others' leases are kept."""
        self._check_open()
        # Every argument checked as one cluster checks them, before anything is sent.
        self._core.round(
            worker_id=worker_id,
            visibility=visibility,
            n=n,
            min_priority=min_priority,
            ack=ack,
            nack=nack,
            extend=extend,
            dead=dead,
            hold_dead=hold_dead,
        )
        acks, nacks = self._by_shard(ack), self._by_shard(nack)
        extends, deads = self._by_shard(extend), self._by_shard(dead)
        settling = {*acks, *nacks, *extends, *deads}
        order = self._rotation()
        # All of n from the first shard of the rotation, then what it lacked from the others
        # at once: a worker's round stays one batch to one shard (splitting n evenly over K
        # shards measured 1.8x the leader CPU per message at K=3: bench/results/sharding.md).
        want = {order[0]: n} if order and n else {}
        first = [name for name in order if want.get(name) or name in settling]
        first += [name for name in settling if name not in first]  # a down shard's settlements

        async def part(name: str, shard: AsyncTransport) -> Round:
            share = want.get(name, 0)
            if name not in settling:  # a claim alone: an idle shard answers with a read
                return Round(
                    leases=await shard._claim_many(
                        worker_id or "", visibility, share, min_priority, self.claim_deadline
                    )
                )
            self._check_up(name, leases=True)
            return await shard._settle_and_claim(
                worker_id,
                visibility,
                share,
                acks.get(name, ()),
                nacks.get(name, ()),
                extends.get(name, ()),
                deads.get(name, ()),
                hold_dead,
                min_priority,
                self.claim_deadline,
            )

        results = await self._on_many(first, part, self.claim_health)
        rounds: dict[str, Round] = {}
        unsettled: list[Lease] = []
        exhausted: set[str] = set()
        for name in first:
            result = results[name]
            if isinstance(result, BaseException):
                exhausted.add(name)
                unsettled += [*acks.get(name, ()), *extends.get(name, ())]
                unsettled += [lease for lease, _ in [*nacks.get(name, ()), *deads.get(name, ())]]
            else:
                rounds[name] = result
                if len(result.leases) < want.get(name, 0):
                    exhausted.add(name)
        remaining = n - sum(len(r.leases) for r in rounds.values())
        while remaining > 0:  # the shards not asked yet, or that filled their share, for more
            claimable = self._claimable()
            candidates = [name for name in order if name not in exhausted and name in claimable]
            if not candidates:
                break
            more_want = shares(remaining, candidates)
            ask = [name for name in candidates if more_want[name]]
            more = await self._on_many(
                ask,
                functools.partial(
                    _claim_from,
                    worker_id or "",
                    visibility,
                    more_want,
                    min_priority,
                    self.claim_deadline,
                ),
                self.claim_health,
            )
            for name in ask:
                extra = more[name]
                if isinstance(extra, BaseException):
                    exhausted.add(name)
                    continue
                if len(extra) < more_want[name]:
                    exhausted.add(name)
                remaining -= len(extra)
                r = rounds.get(name, Round())
                rounds[name] = dataclasses.replace(r, leases=[*r.leases, *extra])
        if n and not rounds and not self._claimable():
            raise Unavailable(f"queue {self.queue!r}: no shard answers")
        if self.shard_list.changing:
            finished = [
                lease
                for lease in [*ack, *(lease for lease, _ in dead)]
                if self._lease_shard(lease) in rounds
            ]
            # On failure left held: the next settlement or release_moved_groups() frees them.
            with contextlib.suppress(Unavailable):
                await self._release_moved(finished)
        done = Round(
            leases=[
                dataclasses.replace(lease, shard=name)
                for name, r in rounds.items()
                for lease in r.leases
            ],
            lost=in_given_order(
                [*ack, *(lease for lease, _ in nack), *extend, *(lease for lease, _ in dead)],
                [r.lost for r in rounds.values()],
            ),
            extended=[
                dataclasses.replace(lease, shard=name)
                for name, r in rounds.items()
                for lease in r.extended
            ],
            unsettled=unsettled,
        )
        if unsettled:
            down = sorted({self._lease_shard(lease) for lease in unsettled})
            raise PartialRound(
                f"settlements on shard(s) {', '.join(down)} were not applied (they did not "
                f"answer); the rest of the round was: see .round",
                done,
            )
        return done

    async def probe(self, min_priority: int = 0) -> Probe:
        """Claimable if any answering shard is; the earliest due time of them all."""
        self._check_open()
        probes = await self._answering(
            lambda _, shard: shard._run(shard._core.probe(min_priority), self.claim_deadline),
            workers=True,
        )
        return merge_probes(probes.values())

    async def ack(self, lease: Lease) -> None:
        self._check_open()
        self._core.ack([lease])  # checks the lease as one cluster does
        await self._on(self._lease_shard(lease), lambda shard: shard.ack(lease), True)
        await self._release_moved([lease])

    async def nack(self, lease: Lease, delay: float = 0.0) -> None:
        self._check_open()
        self._core.nack(lease, delay)
        await self._on(self._lease_shard(lease), lambda shard: shard.nack(lease, delay), True)

    async def extend(self, lease: Lease, visibility: float) -> Lease:
        self._check_open()
        self._core.extend(lease, visibility)
        name = self._lease_shard(lease)
        extended = await self._on(name, lambda shard: shard.extend(lease, visibility), True)
        return dataclasses.replace(extended, shard=name)

    async def dead_letter(self, lease: Lease, reason: str, *, hold: bool = False) -> None:
        self._check_open()
        self._core.dead_letter(lease, reason, hold)
        await self._on(
            self._lease_shard(lease),
            lambda shard: shard.dead_letter(lease, reason, hold=hold),
            True,
        )
        await self._release_moved([lease])

    async def ack_many(self, leases: Sequence[Lease]) -> None:
        self._check_open()
        self._core.ack(leases)  # checks the leases as one cluster does
        parts = self._by_shard(leases)
        for name in parts:
            self._check_up(name, leases=True)
        results = await self._on_many(list(parts), lambda name, shard: _lost_of(shard, parts[name]))
        lost = in_given_order(
            list(leases), [r for r in results.values() if not isinstance(r, BaseException)]
        )
        failed = [name for name, r in results.items() if isinstance(r, BaseException)]
        if failed:
            raise Unavailable(f"ack_many: shard(s) {', '.join(failed)} did not answer")
        await self._release_moved(leases)
        if lost:
            raise LeaseLost(f"{len(lost)} of the leases no longer held", lost)

    # ------------------------------------------------------------------------ schedules

    async def schedule(
        self,
        name: str,
        group_id: str,
        event: Any,
        *,
        every: float | None = None,
        cron: str | None = None,
        priority: int = 0,
        catch_up: bool = False,
        start_at: float | None = None,
    ) -> Schedule:
        """Stored on the group's shard (its ticks are publishes to that group); a schedule of
        the same name on another shard is removed first."""
        self._check_open()
        check_id(name, "name")
        target = self.shard_of(group_id)
        others = [n for n in self.names if n != target]
        for other in others:  # none down, or nothing is changed
            self._check_up(other)
        if others:
            await self._everywhere(
                lambda _, shard: shard.unschedule(name), f"schedule {name!r}", others
            )
        return await self._on(
            target,
            lambda shard: shard.schedule(
                name,
                group_id,
                event,
                every=every,
                cron=cron,
                priority=priority,
                catch_up=catch_up,
                start_at=start_at,
            ),
        )

    async def unschedule(self, name: str) -> bool:
        self._check_open()
        results = await self._everywhere(lambda _, shard: shard.unschedule(name), "unschedule")
        return any(results.values())

    async def schedules(self) -> list[Schedule]:
        self._check_open()
        results = await self._answering(lambda _, shard: shard.schedules())
        return sorted((s for found in results.values() for s in found), key=lambda s: s.name)

    async def fire_schedules(self) -> int:
        """Publish the due ticks, each shard its own schedules. A schedule whose group lives
        on another shard (left behind by a change of the shard list) is moved there first;
        while the list changes, the schedules of groups that move wait for the change to end
        (their missed ticks are then caught up as usual)."""
        self._check_open()
        if self.shard_list.changing and time.monotonic() >= self._next_release_sweep:
            self._next_release_sweep = time.monotonic() + RELEASE_SWEEP
            await self.release_moved_groups()
        results = await self._answering(self._fire_on, workers=True)
        return sum(results.values())

    async def _fire_on(self, name: str, shard: AsyncTransport) -> int:
        due = await shard._run(shard._core.due_schedules(), self.claim_deadline)
        fire: list[ScheduleRow] = []
        move: list[ScheduleRow] = []
        for row in due:
            target, previous = self.shard_list.placement(row.group_id)
            if target != previous:
                continue  # a moving group: its ticks wait for the change to end
            (fire if target == name else move).append(row)
        for row in move:  # on the group's shard first, then gone from here
            target = self.shard_list.placement(row.group_id)[0]
            self._check_up(target)
            await self._shards[target]._run(self._shards[target]._core.put_row(row))
            await shard._run(shard._core.unschedule(row.name))
        return await shard._run(shard._core.fire(fire), self.claim_deadline) if fire else 0

    # ------------------------------------------------------------------------ operators

    async def hold_group(self, group_id: str) -> None:
        self._check_open()
        await self._on(await self._locate(group_id), lambda shard: shard.hold_group(group_id))

    async def release_group(self, group_id: str) -> bool:
        self._check_open()
        return await self._on(
            await self._locate(group_id), lambda shard: shard.release_group(group_id)
        )

    async def cancel_group(self, group_id: str, reason: str) -> int:
        self._check_open()
        name = await self._locate(group_id)
        cancelled = await self._on(name, lambda shard: shard.cancel_group(group_id, reason))
        if self.shard_list.changing and name != self.shard_list.placement(group_id)[0]:
            await self._release_if_gone({group_id})
        return cancelled

    async def set_priority(self, group_id: str, priority: int) -> bool:
        self._check_open()
        return await self._on(
            await self._locate(group_id), lambda shard: shard.set_priority(group_id, priority)
        )

    async def peek(self, group_id: str, limit: int = 10) -> list[tuple[int, Any]]:
        self._check_open()
        return await self._on(
            await self._locate(group_id), lambda shard: shard.peek(group_id, limit)
        )

    async def groups(
        self,
        *,
        state: str | None = None,
        prefix: str | None = None,
        min_priority: int = 0,
        limit: int = 100,
        after: str | None = None,
    ) -> list[GroupInfo]:
        """A page of every answering shard's groups, merged in group id order."""
        self._check_open()

        async def page(name: str, shard: AsyncTransport) -> list[GroupInfo]:
            found = await shard.groups(
                state=state, prefix=prefix, min_priority=min_priority, limit=limit, after=after
            )
            return [dataclasses.replace(info, shard=name) for info in found]

        results = await self._answering(page)
        return merge_sorted(results.values(), key=lambda info: info.group_id, limit=limit)

    async def pause(self) -> None:
        self._check_open()
        await self._everywhere(lambda _, shard: shard.pause(), "pause")

    async def resume(self) -> None:
        self._check_open()
        await self._everywhere(lambda _, shard: shard.resume(), "resume")

    async def dead_letters(
        self, limit: int = 100, *, group_id: str | None = None
    ) -> list[DeadLetter]:
        """The answering shards' dead letters (the group's shard's, with `group_id`), the
        oldest first."""
        self._check_open()
        if group_id is not None:
            name = await self._locate(group_id)
            found = await self._on(name, lambda shard: shard.dead_letters(limit, group_id=group_id))
            return [dataclasses.replace(letter, shard=name) for letter in found]

        async def page(name: str, shard: AsyncTransport) -> list[DeadLetter]:
            found = await shard.dead_letters(limit)
            return [dataclasses.replace(letter, shard=name) for letter in found]

        results = await self._answering(page)
        return merge_sorted(
            results.values(), key=lambda d: (d.dead_at, d.shard, d.seq), limit=limit
        )

    async def requeue_dead(
        self, seqs: Sequence[int] | None = None, *, shard: str | None = None
    ) -> int:
        """Put dead letters back at the tail of their groups: all of them, or those seqs of
        `shard` (seqs are per shard: `DeadLetter.shard`)."""
        self._check_open()
        return await self._dead_call(
            seqs, shard, "requeue_dead", lambda s, chosen: s.requeue_dead(chosen)
        )

    async def purge_dead(
        self, seqs: Sequence[int] | None = None, *, shard: str | None = None
    ) -> int:
        """Delete dead letters for good: all of them, or those seqs of `shard`."""
        self._check_open()
        return await self._dead_call(
            seqs, shard, "purge_dead", lambda s, chosen: s.purge_dead(chosen)
        )

    async def _dead_call(
        self,
        seqs: Sequence[int] | None,
        shard: str | None,
        what: str,
        call: Callable[[AsyncTransport, Sequence[int] | None], Awaitable[int]],
    ) -> int:
        if what == "requeue_dead" and self.shard_list.changing:
            # A requeue puts messages back on the dead letter's shard, unguarded: for a group
            # that has moved on, that would be a second shard.
            raise InvalidArgument(
                "requeue_dead waits for the change of the shard list to finish "
                "(`rqlite-queue shards status`)"
            )
        if shard is not None:
            self.shard(shard)
            return await self._on(shard, lambda s: call(s, seqs))
        if seqs is not None and len(self.names) > 1:
            raise InvalidArgument(f"{what}: seqs are per shard: give shard= (DeadLetter.shard)")
        if seqs is not None:
            return await self._on(self.names[0], lambda s: call(s, seqs))
        results = await self._everywhere(lambda _, s: call(s, None), what)
        return sum(results.values())

    async def stats(self) -> Stats:
        """The totals over the answering shards; `Stats.shards_down` names the others."""
        self._check_open()
        results = await self._answering(lambda _, shard: shard.stats())
        merged = merge_stats(results[name] for name in self.names if name in results)
        missing = tuple(name for name in self.names if name not in results)
        depths = {name: results[name].depth for name in self.names if name in results}
        return dataclasses.replace(merged, shards_down=missing, by_shard=depths)

    async def shard_status(self) -> list[ShardStatus]:
        """Each shard as a change of the shard list sees it: its part in the change, whether
        it answers, the list epoch it has been given, its depth and groups, the groups that
        still have to leave it (messages here, new messages going elsewhere), its dead letters
        and the schedules that belong elsewhere. Pages through every group: an operator's
        call."""
        self._check_open()

        async def one(name: str, shard: AsyncTransport) -> ShardStatus:
            stats = await shard.stats()
            epoch = await shard._run(_epoch_plan(shard))
            leaving, after = 0, None
            while True:
                page = await shard.groups(limit=1000, after=after)
                leaving += sum(
                    1
                    for info in page
                    if info.depth and self.shard_list.placement(info.group_id)[0] != name
                )
                if len(page) < 1000:
                    break
                after = page[-1].group_id
            schedules = await shard.schedules()
            elsewhere = sum(
                1 for sch in schedules if self.shard_list.placement(sch.group_id)[0] != name
            )
            waiting = await shard._run(
                Plan(sql.waiting_groups(shard._core.names, limit=1_000_000), sql.read_waiting)
            )
            return ShardStatus(
                name,
                self._state(name),
                True,
                epoch,
                stats.depth,
                stats.groups,
                leaving,
                len(waiting),
                stats.dead,
                elsewhere,
            )

        results = await self._on_many(list(self.names), one)
        return [
            result
            if not isinstance(result, BaseException)
            else ShardStatus(
                name, self._state(name), False, None, None, None, None, None, None, None
            )
            for name, result in results.items()
        ]

    def _state(self, name: str) -> str:
        return next((s.state for s in self.shard_list.specs if s.name == name), "active")

    async def close(self) -> None:
        if not self._core.closed:
            self._core.closed = True
            await self._fan.close()
            for shard in self._shards.values():
                await shard.close()


def _epoch_plan(shard: AsyncTransport) -> Plan[int]:
    return Plan(sql.shard_epoch(shard._core.names), sql.read_shard_epoch)


def _none(reply: sql.Reply) -> None:
    return None


def _guarded(
    plan: Plan[T], shard: AsyncTransport, epoch: int, extra: Sequence[sql.Statement] = ()
) -> Plan[T]:
    """`plan` behind the shard list's epoch (`sql.epoch_guards`), and `extra` statements."""
    guards = [*sql.epoch_guards(shard._core.names, epoch=epoch), *extra]
    return Plan(
        sql.guarded(plan.batch, guards),
        plan.read,
        plan.replay,
        None if plan.replay_batch is None else sql.guarded(plan.replay_batch, guards),
    )


async def _claim_from(
    worker_id: str,
    visibility: float,
    want: Mapping[str, int],
    min_priority: int,
    within: float,
    name: str,
    shard: AsyncTransport,
) -> list[Lease]:
    return await shard._claim_many(worker_id, visibility, want[name], min_priority, within)


async def _lost_of(shard: AsyncTransport, leases: list[Lease]) -> list[Lease]:
    """Ack `leases` on one shard; the ones that no longer held."""
    try:
        await shard.ack_many(leases)
    except LeaseLost as exc:
        return list(exc.leases)
    return []


def _open_shard(
    spec: ShardSpec,
    *,
    queue: str,
    codec: Codec | type[Any] | None,
    clock: Callable[[], float],
    deadline: float,
    options: Mapping[str, Any],
) -> AsyncTransport:
    common: dict[str, Any] = {"queue": queue, "codec": codec, "clock": clock, "deadline": deadline}
    if spec.url.startswith("sqlite://"):
        embedded = {k: v for k, v in options.items() if k not in _RQLITE_ONLY}
        return AsyncSqliteTransport(_sqlite_path(spec.url), **common, **embedded)
    return AsyncRqliteTransport(spec.url, **common, **options)
