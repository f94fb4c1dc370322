"""The queue: one class whatever the topology. Each method checks its arguments once (in the
core), builds the plan once, and hands it to the queue's router (`router.AsyncRouter`): one
cluster (`cluster.AsyncClusterRouter`) or several (`shards.AsyncShardRouter`). The classes
below it only construct: an rqlite cluster, an embedded SQLite file, or shards. This file is
the source; `_sync/queue.py` is generated from it (`scripts/gen_sync.py`): edit here, then
`make generate`."""

from __future__ import annotations

import asyncio
import functools
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, Unpack

from .. import _tracing
from .._io.sqlite import AsyncSqliteExecutor
from .._job import error_of
from .._protocol import (
    admin,
    batch_status,
    batches,
    jobs,
    messages,
    probes,
    publish,
    round_spec,
    schedules,
    sharding,
    tenants,
)
from .._protocol.batch_ids import check_batch_id
from .._protocol.checks import check_id, check_int, check_seconds, show
from .._protocol.core import (
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_SKEW,
    QueueCore,
)
from .._protocol.http import parse_endpoints, redact, unknown_scheme
from .._protocol.messages import GivenMessage, Message
from .._protocol.outcomes import poll_delays
from .._protocol.round_spec import RoundSpec, lease_lost
from .._protocol.schedules import ScheduleSpec
from .._protocol.sharding import ShardList, ShardSpec, check_shard_name, parse_shard_list
from .._runtime import LOCAL_CANCELS, LOCAL_OUTCOMES, AsyncWaiter
from ..codec import Codec
from ..errors import InvalidArgument, NothingListens, OutcomeUnknown, Unavailable
from ..types import (
    DEFAULT_BATCH_KEEP,
    MAX_BATCH,
    BatchStatus,
    CheckedItems,
    CheckedResult,
    DeadLetter,
    FollowUps,
    GroupInfo,
    JobError,
    JobResult,
    Lease,
    LeaseCheck,
    NodeView,
    Probe,
    PublishItem,
    PublishOptions,
    Round,
    Schedule,
    ShardStatus,
    Stats,
    TenantInfo,
)
from .batch import AsyncBatch
from .cluster import AsyncBackend, AsyncClusterRouter
from .router import AsyncRouter
from .shards import DEFAULT_CLAIM_DEADLINE, AsyncShardRouter
from .transaction import AsyncTransaction

if TYPE_CHECKING:  # (imported where a transport is made: the package loads no HTTP client)
    from .._io.aiohttp_client import AiohttpClient

T = TypeVar("T")

DEFAULT_DEADLINE = 15.0


class AsyncTransport:
    """A queue with per-group exclusivity (see the contract in the docs), on one cluster or
    many: build one with `from_url`, or `AsyncRqliteTransport(url)`,
    `AsyncSqliteTransport(path)`, `AsyncShardedTransport(shards)`. The tables are created (or
    upgraded) on first use. Every call finishes within `deadline` seconds: failover, resends
    and request timeouts included."""

    def __init__(
        self, router: AsyncRouter, core: QueueCore, *, deadline: float = DEFAULT_DEADLINE
    ) -> None:
        check_seconds(deadline, "deadline", allow_zero=False)
        self.router = router
        """How this queue reaches its cluster(s)."""
        self._core = core
        core.trace_headers = _tracing.hook()
        self.deadline = float(deadline)

    @property
    def queue(self) -> str:
        return self._core.names.queue

    @property
    def clock(self) -> Callable[[], float]:
        """The clock lease deadlines are computed with."""
        return self._core.clock

    @property
    def closed(self) -> bool:
        return self._core.closed

    @property
    def resent(self) -> int:
        """How many batches were sent again after an unknown outcome (for tests, metrics)."""
        return self.router.resent

    def _by(self) -> float:
        """The deadline (a `time.monotonic()` time) of a call starting now."""
        return time.monotonic() + self.deadline

    @classmethod
    async def from_url(
        cls, url: str, *, connect_timeout: float = 30.0, **options: Any
    ) -> AsyncTransport:
        """`sqlite:///path.db` (embedded), `http(s)://host:port[,host:port...]` (rqlite), or
        several clusters (`a=http://...;b=http://...`, an `AsyncShardedTransport`).
        Waits until the backend answers and, for rqlite, has a leader; then creates or
        upgrades the tables. Raises `Unavailable` after `connect_timeout` seconds (sooner
        with rqlite's `refused_timeout`, when nothing listens)."""
        transport: AsyncTransport
        if not isinstance(url, str):
            raise InvalidArgument(f"not a URL: {type(url).__name__}")
        if sharding.is_sharded_url(url):
            transport = AsyncShardedTransport(url, **options)
        elif url.startswith("sqlite://"):
            transport = AsyncSqliteTransport(_sqlite_path(url), **options)
        elif url.startswith(("http://", "https://")):
            transport = AsyncRqliteTransport(url, **options)
        else:
            raise unknown_scheme(url)
        try:
            await transport.connect(connect_timeout, url)
        except BaseException:
            await transport.close()
            raise
        return transport

    async def connect(self, timeout: float, url: str = "") -> None:
        """`setup()`, tried again until it succeeds or `timeout` seconds have passed (then
        `Unavailable`, with what each node did): for a cluster that is still starting or
        electing its leader. A cluster none of whose nodes ever accepted a connection, for
        rqlite's `refused_timeout`, is not tried again."""
        give_up = time.monotonic() + timeout
        seen: Unavailable | None = None
        while True:
            try:
                await self.router.setup(give_up)
                return
            except (Unavailable, OutcomeUnknown) as exc:
                if isinstance(exc, NothingListens):
                    raise
                if isinstance(exc, Unavailable) and exc.nodes:
                    seen = exc  # what the nodes did (a last try may have had no time to)
                # The inner retries may stop short of give_up (their next backoff would not
                # fit); wait out the rest, so the promised timeout is what passes.
                left = give_up - time.monotonic()
                if left <= 0:
                    where = "" if seen else (redact(url) if url else f"queue {self.queue!r}")
                    raise Unavailable(
                        f"{where}{': ' if where else ''}not available after {timeout:g}s: "
                        f"{seen or exc}",
                        seen.nodes if seen else None,
                    ) from exc
                await asyncio.sleep(min(0.2, left))

    async def setup(self) -> None:
        """Create the queue's tables if missing, or upgrade them in place, and check their
        version (`SchemaError` if they are newer than this library)."""
        await self.router.setup(self._by())

    # ------------------------------------------------------------------------ the seed's calls

    async def publish(
        self,
        group_id: str,
        event: Any,
        priority: int = 0,
        *,
        connection: object = None,
        **options: Unpack[PublishOptions],
    ) -> int:
        """Append `event` to `group_id`'s FIFO; returns its seq. `priority` (0-4) is fixed by
        the publish that creates the group. Its keywords (`types.PublishOptions`, which a
        transaction's publish takes too; a batch's, `types.MessageOptions`):

        With `dedup_id` (or the transport's `dedup_key`), a repeat within the dedup window
        publishes nothing and returns the first seq.

        `delay` (seconds) or `not_before` (epoch seconds): not delivered before then; FIFO is
        kept, so the messages published after it in its group wait too. `ttl` (seconds): if it
        is not delivered within them, it is moved to the dead letters (reason `expired`)
        instead, and its group moves on. `tenant`: the tenant of the group, if this publish
        creates it (or refills it); naming another tenant for a group that has messages
        raises `TenantMismatch`. Without it, the queue's tenant rule (`set_tenant_rule`)
        or the default tenant decides.

        `debounce` (a key): if the group has a message with the same key that it has not
        delivered yet, this publish replaces it instead of adding one: its event, ttl and
        due time become this one's, its place in the group's order is kept, and its seq is
        returned. With `delay`, each publish of a run pushes the delivery back; `max_wait`
        (seconds): never later than that after the run's first publish. Not with `dedup_id`
        (sent again, a debounced publish replaces its message again).

        `headers`: str keys and values stored with the message and returned on
        `Lease.headers` (at most 64 of them, 8 KiB encoded; `InvalidHeaders` otherwise).
        With OpenTelemetry (the `otel` extra, a tracer provider set), the publish's trace
        context is added to them (`traceparent`, `tracestate`).

        `keep` (seconds): keep the message's outcome that long after it settles (succeeded
        with its result, failed with its errors, cancelled, expired), for `result()`; None: the
        transport's `keep` (by default: not kept); 0: not kept.

        `batch`: the id of a batch the message joins (`batch()`): counted in it in the
        publish's own transaction, so the batch is not done before this message is settled;
        `BatchDone` if the batch is done already (nothing written). Not with `dedup_id` or
        `debounce` (each message of a batch counts once). On a sharded queue, a message
        whose group lives on another shard than the batch's is written with the batch's
        count on the batch's shard and forwarded to its own from there (exactly once);
        `ForwardPending` if its shard did not answer in time (it will be published: do not
        publish it again).

        `connection` (the embedded queue): a `sqlite3.Connection` of the caller's to the
        queue's file, with a transaction open (or in Python's default transaction mode: the
        publish begins one, as an INSERT would); the publish runs in that transaction, and
        commits or rolls back with the caller's own writes."""
        message = Message(group_id, event, priority, **options)
        return (await self._publish([message], connection))[0]

    async def _publish(self, given: Sequence[GivenMessage], connection: object = None) -> list[int]:
        span = None if self._core.trace_headers is None else _tracing.publishing(self.queue, given)
        if span is None:
            return await self._send(given, connection)
        with span as current:  # (the messages are checked within it: they carry its context)
            seqs = await self._send(given, connection)
            _tracing.published(current, seqs)
            return seqs

    async def _send(self, given: Sequence[GivenMessage], connection: object = None) -> list[int]:
        checked = messages.checked(self._core, given, scoped=self.router.scoped_dedup)
        if connection is None:
            return await self.router.publish(checked, self._by())
        backend = self.router.cluster
        if backend is None:
            raise InvalidArgument("connection= is for the embedded SQLite queue, not shards")
        return backend.run_in(
            connection, publish.plan(self._core, checked, bind_rows=backend.binds_rows)
        )

    async def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Lease | None:
        """Lease the head of the claimable group claimed least recently, for `visibility`
        seconds; None when nothing is claimable."""
        leases = await self.claim_many(worker_id, visibility, 1, min_priority)
        return leases[0] if leases else None

    async def ack(self, lease: Lease, *, publish: FollowUps = (), result: Any = None) -> None:
        """Done: remove the message and free its group. `LeaseLost` if the lease no longer
        holds the group (then nothing changed).

        `publish`: follow-ups, as `publish_many` takes them (any groups, priorities, dedup
        ids, delays), published in the same transaction as the ack and only if it applies:
        the message's effects inside the queue happen exactly once (see "Exactly-once
        effects" in the docs).

        `result`: kept with the message's outcome, if it keeps one (`publish(keep=...)`),
        through the queue's codec (`EncodeError`, `PayloadTooLarge`: nothing written). A
        message cancelled while leased settles as cancelled, whatever its ack says."""
        spec = RoundSpec(
            ack=[lease], publish=_follow_ups(lease, publish), results=_pairs(lease, result)
        )
        await self._settle("ack", spec)

    async def nack(
        self, lease: Lease, delay: float = 0.0, *, error: BaseException | JobError | None = None
    ) -> None:
        """Give the message back: claimable now (`delay=0`) or its group parked for `delay`
        seconds. The message stays its group's head. `error`: what failed this attempt (an
        exception, or a `JobError`), kept with the message's outcome if it keeps one. A
        message cancelled while leased is not given back: it settles as cancelled."""
        errors = _pairs(lease, _error_of(lease, error))
        await self._settle("nack", RoundSpec(nack=[(lease, delay)], errors=errors))

    async def close(self) -> None:
        if not self._core.closed:
            self._core.closed = True
            await self.router.close()

    async def __aenter__(self: _Self) -> _Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------------ beyond the seed

    async def publish_many(
        self, items: Iterable[PublishItem], *, connection: object = None
    ) -> list[int]:
        """Publish many messages in one round trip, atomically, in order. Items are
        `(group_id, event)`, `(group_id, event, priority)` or mappings with those keys and
        optionally `dedup_id`, `delay`, `not_before`, `ttl`, `tenant`, `debounce`, `max_wait`,
        `headers`, `keep`, `batch` (as `publish` takes them). On a
        sharded queue: atomic on each shard, not across shards (a shard that fails leaves the
        others' messages published; the error names it). `connection`: as `publish` takes
        it."""
        return await self._publish(Message.parse_many(items), connection)

    def check_publish_many(self, items: Iterable[PublishItem]) -> CheckedItems:
        """Check `items` as `publish_many` does (shapes, values, the codec, the size limit),
        sending nothing: `InvalidArgument`, whose `index` is the first bad item's. Returns
        them checked and encoded, which this queue's `publish=` arguments take as they are
        (a Worker checks its handlers' follow-ups when they return, and sends them later)."""
        return messages.checked_items(self._core, items, scoped=self.router.scoped_dedup)

    def transaction(self) -> AsyncTransaction:
        """`async with queue.transaction() as tx:` your statements (`tx.execute(sql,
        params)`) and publishes (`tx.publish(...)`, `tx.publish_many(...)`), sent as one
        transaction when the block ends: all of them or none (one request, one Raft entry on
        rqlite). Your tables are in the queue's database. See `AsyncTransaction`."""
        return AsyncTransaction(self._core, self.router, self.deadline)

    async def claim_many(
        self, worker_id: str, visibility: float, n: int, min_priority: int = 0
    ) -> list[Lease]:
        """Up to `n` leases from `n` distinct groups, in one round trip. After a claim that
        found nothing, the next one first asks the node it talks to (a read, no Raft write)
        and only writes when something is claimable."""
        check_int(n, "n", 1, MAX_BATCH)
        spec = RoundSpec(worker_id=worker_id, visibility=visibility, n=n, min_priority=min_priority)
        checked = round_spec.check(self._core, spec)
        result = await self.router.round(checked, self._by(), probe_when_idle=True)
        return result.leases

    async def probe(self, min_priority: int = 0) -> Probe:
        """A look without a Raft round (a read of the leader's copy, no write): is a group
        claimable now, when does the earliest lease, park or delayed head end, when is the next
        schedule due?"""
        plan = probes.plan(self._core, min_priority)
        return await self.router.gather(plan, self._by(), sharding.probe_of, workers=True)

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
        publish: Sequence[tuple[Lease, FollowUps]] = (),
        results: Sequence[tuple[Lease, Any]] = (),
        errors: Sequence[tuple[Lease, BaseException | JobError]] = (),
        progress: Sequence[tuple[Lease, Any]] = (),
    ) -> Round:
        """Settle leases (ack; nack as `(lease, delay)`; extend by `visibility`; dead-letter as
        `(lease, reason)`, holding their groups with `hold_dead`) and claim up to `n` new
        leases, in one round trip and one transaction. Leases that no longer held are listed
        in `Round.lost` (they changed nothing); nothing is raised for them. `publish`: the
        follow-ups of acked or dead-lettered leases, as `(lease, items)`, each published only
        if its lease's settlement applies. `results` (of acked leases), `errors` (of nacked
        or dead-lettered ones) and `progress` (of extended ones): as `ack(result=)`,
        `nack(error=)` and `extend(progress=)` take them. On a sharded queue, settlements on a
        shard that did not answer raise `PartialRound`, whose `.round` lists them in
        `unsettled` (the rest was applied)."""
        spec = RoundSpec(
            worker_id=worker_id,
            visibility=visibility,
            n=n,
            min_priority=min_priority,
            ack=ack,
            nack=nack,
            extend=extend,
            dead=dead,
            hold_dead=hold_dead,
            publish=publish,
            results=results,
            errors=_errors_of(errors),
            progress=progress,
        )
        checked = round_spec.check(self._core, spec, scoped=self.router.scoped_dedup)
        return await self.router.round(checked, self._by(), probe_when_idle=False)

    async def _settle(self, what: str, spec: RoundSpec) -> Round:
        """Settlements alone, fenced: `LeaseLost` lists the leases that no longer held."""
        checked = round_spec.check(self._core, spec, scoped=self.router.scoped_dedup)
        result = await self.router.settle(checked, self._by(), what)
        if result.lost:
            raise lease_lost(result.lost, what)
        return result

    async def ack_many(self, leases: Sequence[Lease]) -> None:
        """Ack several leases in one round trip. Those that still hold are acked; if any did
        not, `LeaseLost` lists them."""
        if not isinstance(leases, list | tuple):
            raise InvalidArgument(f"leases must be a list, got {show(leases)}")
        await self._settle("ack", RoundSpec(ack=leases))

    async def extend(self, lease: Lease, visibility: float, *, progress: Any = None) -> Lease:
        """Heartbeat: the lease now lapses `visibility` seconds from now. Returns the lease
        with its new `expires_at`. `progress`: how far its job has come, a small JSON value
        (at most 8 KiB as JSON), kept with the message (`result()` shows it; None: unchanged)."""
        spec = RoundSpec(extend=[lease], visibility=visibility, progress=_pairs(lease, progress))
        result = await self._settle("extend", spec)
        return result.extended[0]

    async def dead_letter(
        self,
        lease: Lease,
        reason: str,
        *,
        hold: bool = False,
        publish: FollowUps = (),
        error: BaseException | JobError | None = None,
    ) -> None:
        """Move the message to the dead-letter table, with `reason`, and free its group (or,
        with `hold`, hold it until `release_group`). `publish`: follow-ups, as `ack` takes
        them. `error`: as `nack` takes it. A message that keeps its outcome keeps it as
        failed, with `reason`; one cancelled while leased is cancelled instead (no dead
        letter)."""
        spec = RoundSpec(
            dead=[(lease, reason)],
            hold_dead=hold,
            publish=_follow_ups(lease, publish),
            errors=_pairs(lease, _error_of(lease, error)),
        )
        await self._settle("dead_letter", spec)

    def check_result(self, value: Any) -> CheckedResult:
        """A result checked and encoded as `ack(result=)` would (the codec, the payload
        limit: `EncodeError`, `PayloadTooLarge`), sending nothing; this queue's settlements
        take it as it is (a Worker checks its handlers' results where they ran)."""
        return round_spec.check_result(self._core, value)

    # ------------------------------------------------------------------------ jobs

    async def result(self, group_id: str, seq: int, *, wait: float = 0.0) -> JobResult | None:
        """Message `seq` of `group_id` as a job: `queued`, `running` (with its progress and
        attempt), or its final outcome (kept for its publish's `keep` seconds after it
        settled); None for a message this queue never had, or that settled without keeping
        its outcome, or whose outcome was pruned. On a sharded queue, the group names the
        shard.

        `wait` (seconds): block until the job is over (or the time is up; then its state
        as last read), with reads only. A waiter in the process that settles the message is
        woken as the settlement applies; others read after 0.01 s, then twice as late each
        time up to every 0.5 s (at most 7 reads in the first second, then 2 a second)."""
        check_seconds(wait, "wait", allow_zero=True)
        plan = jobs.job(self._core, group_id, seq)
        if not wait:
            return await self.router.on_group(group_id, plan, self._by())
        give_up = time.monotonic() + wait
        waiter = AsyncWaiter()
        key = (self.queue, group_id)
        LOCAL_OUTCOMES.listen(key, waiter.wake)  # (before the first read: no wake missed)
        try:
            found = await self.router.on_group(group_id, plan, self._by())
            for delay in poll_delays():
                if found is None or found.final:
                    return found
                left = give_up - time.monotonic()
                if left <= 0:
                    return found
                await waiter.wait(min(delay, left))
                polled = jobs.job(self._core, group_id, seq, local=True)
                found = await self.router.on_group(group_id, polled, self._by())
            return found  # (never reached: the polls go on)
        finally:
            LOCAL_OUTCOMES.forget(key, waiter.wake)

    async def cancel(
        self, group_id: str, seq: int, reason: str = "cancelled"
    ) -> Literal["cancelled", "cancelling"] | None:
        """Cancel message `seq` of `group_id`. Queued: removed at once (its outcome
        `cancelled`, if it keeps one; its group goes on with its next message, in order):
        "cancelled". Leased: flagged, "cancelling": its worker learns it within a
        `heartbeat_interval` (at once in this process), tells its handler, and settles it as
        cancelled; any settlement of it settles it so, and a claim that takes it again after
        its lease lapsed settles it so at once: it is never retried, never reported
        succeeded. None: nothing to cancel (it is over, or was never queued). Safe to resend
        after a lost reply."""
        plan = jobs.cancel(self._core, group_id, seq, reason, sharded=self.router.cluster is None)
        done = await self.router.on_group(group_id, plan, self._by())
        if done == "cancelling":
            LOCAL_CANCELS.wake([self.queue])
        elif done == "cancelled":
            LOCAL_OUTCOMES.wake([(self.queue, group_id)])
        return done  # type: ignore[return-value]

    async def check_leases(self, leases: Sequence[Lease]) -> LeaseCheck:
        """Of leases a worker holds (a read, no Raft entry): which messages were cancelled
        while leased (tell their handlers: any settlement now settles them as cancelled), and
        which leases no longer hold their group (cancelled with it by `cancel_group`, or
        taken over after they lapsed): their handlers' work will be refused. On a sharded
        queue, leases on a shard that does not answer are in neither list."""
        news = functools.partial(jobs.lease_news, self._core)
        news(leases)  # (checked before anything is sent)
        found = await self.router.on_leases(leases, news, self._by())
        return jobs.in_given_order(leases, found)

    # ------------------------------------------------------------------------ batches

    def batch(
        self,
        on_complete: PublishItem | None = None,
        on_success: PublishItem | None = None,
        *,
        parent: str | None = None,
        keep: float = DEFAULT_BATCH_KEEP,
    ) -> AsyncBatch:
        """A batch of messages whose settlements are counted, and whose callbacks are
        published once, in the transaction of the batch's last settlement (acked,
        dead-lettered or cancelled): `on_complete` in any case, `on_success` only if none of
        its messages failed. Each callback is `(group_id, event[, priority])` or a mapping
        with `group_id`, `event` and optionally `priority`, `delay`, `ttl`, `tenant`,
        `headers`, `keep` (how long its outcome is kept, as `publish` takes it; without it, the
        transport's `keep`); it is published with the header `types.BATCH_HEADER`, the batch
        as it was when it was done (`Lease.completed_batch`: its counts, its first failures
        with their reasons).

        `async with queue.batch(...) as b:` then `b.publish(...)`, `b.publish_many(...)`:
        written with the batch when the block ends, all at once (see `AsyncBatch`). A
        message of the batch joins it with its follow-ups that name it
        (`{"batch": lease.batch, ...}`), in its settlement's transaction, so a batch can
        grow as a tree; any publish can join a batch that is not done (`publish(batch=id)`).

        `parent`: the id of a batch this one is a message of (nested): counted in it when
        this one is first written, settled in it when this one is done (as succeeded if
        none of this one's messages failed, else as failed); at most `MAX_BATCH_DEPTH`
        levels. `keep`: how long `batch_status()` keeps the batch after it is done
        (seconds)."""
        sharded = self.router.cluster is None
        if parent is not None:
            parent = check_batch_id(parent, sharded=sharded)
        spec = batches.spec(
            self._core,
            on_complete,
            on_success,
            parent=parent,
            keep=keep,
            shard=self.router.batch_shard(parent),
            sharded=sharded,
        )
        return AsyncBatch(self._core, self.router, spec, self.deadline)

    async def batch_status(self, batch_id: str) -> BatchStatus | None:
        """A batch's state: open, closed or done, its counts (pending, succeeded, failed,
        cancelled), its first failures with their reasons. None for a batch this queue
        does not know (never made, or forgotten `keep` seconds after it was done). A read
        (no Raft entry)."""
        plan = batch_status.status_plan(self._core, batch_id, sharded=self.router.cluster is None)
        return await self.router.on_batch(batch_id, plan, self._by())

    async def batches(
        self, *, state: str | None = None, limit: int = 100, after: str | None = None
    ) -> list[BatchStatus]:
        """A page of the batches (of `state`: `open`, `closed` or `done`), oldest first (ids
        sort by creation): pass the last id of a page as `after` for the next one."""
        plan = batch_status.list_plan(self._core, state=state, limit=limit, after=after)
        return await self.router.gather(plan, self._by(), sharding.batches_of(limit))

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
        keep: float | None = None,
    ) -> Schedule:
        """Publish `event` to `group_id` every `every` seconds, or at the times of the `cron`
        expression (UTC), from `start_at` (default: the first tick after now). Stored in the
        queue: it survives restarts, and its ticks are published by whichever workers run
        (`Worker`, or `rqlite-queue scheduler`), each exactly once. A stretch with no worker
        running gives one message for all the ticks it missed (`catch_up=True`: one per
        tick, at most 1000). Scheduling a name again replaces it. On a sharded queue it is
        stored on its group's shard. `keep`: how long each tick's message keeps its outcome,
        as `publish` takes it."""
        spec = ScheduleSpec(
            name=name,
            group_id=group_id,
            event=event,
            every=every,
            cron=cron,
            priority=priority,
            catch_up=catch_up,
            start_at=start_at,
            keep=keep,
        )
        return await self.router.schedule(
            schedules.schedule(self._core, spec), name, group_id, self._by()
        )

    async def unschedule(self, name: str) -> bool:
        """Remove a schedule; False if there was none of that name."""
        removed = await self.router.everywhere(
            schedules.unschedule(self._core, name), self._by(), "unschedule"
        )
        return any(removed)

    async def schedules(self) -> list[Schedule]:
        return await self.router.gather(
            schedules.schedules(self._core), self._by(), sharding.schedules_of
        )

    async def fire_schedules(self) -> int:
        """Publish the ticks that are due (a read, then a write only if some are); returns how
        many messages went out. Workers call it between claims."""
        self._core.check_open()
        return await self.router.fire_schedules(self._by())

    # ------------------------------------------------------------------------ operators

    async def hold_group(self, group_id: str) -> None:
        """No claim takes this group until `release_group` (a lease in flight on it finishes
        normally; publishing to it goes on)."""
        await self.router.on_group(group_id, admin.hold_group(self._core, group_id), self._by())

    async def release_group(self, group_id: str) -> bool:
        """Undo `hold_group`; False if the group was not held."""
        return await self.router.on_group(
            group_id, admin.release_group(self._core, group_id), self._by()
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
        """A page of the groups that have messages (and the held ones), in group id order:
        pass the last id of a page as `after` for the next one. Filters: `state` (see
        `GroupInfo.state`), a group id `prefix`, `min_priority`."""
        plan = admin.groups(
            self._core,
            state=state,
            prefix=prefix,
            min_priority=min_priority,
            limit=limit,
            after=after,
        )
        return await self.router.gather(plan, self._by(), sharding.groups_of(limit))

    async def cancel_group(self, group_id: str, reason: str) -> int:
        """Move every message of the group to the dead letters with `reason`, in one
        transaction, and return how many. A lease in flight on it is fenced: its ack, nack or
        extend raises `LeaseLost`. Messages published after this call are not touched. Not
        resent after a lost reply (that could cancel newer messages): `OutcomeUnknown`."""
        plan = admin.cancel_group(self._core, group_id, reason, sharded=self.router.cluster is None)
        return await self.router.on_group(group_id, plan, self._by())

    async def set_priority(self, group_id: str, priority: int) -> bool:
        """Change the priority (0-4) of a group that has messages; False if it has none (its
        next publish sets its priority). Publishing to a group that has messages keeps its
        priority, whatever the publish says."""
        plan = admin.set_priority(self._core, group_id, priority)
        return await self.router.on_group(group_id, plan, self._by())

    async def set_tenant(
        self,
        name: str,
        *,
        weight: float | None = None,
        rate: float | None = None,
        burst: float | None = None,
        max_in_flight: float | None = None,
        max_queued: float | None = None,
        max_group_queued: float | None = None,
    ) -> None:
        """Set a tenant's weight and limits (`name` '' is the default tenant). A setting left
        out (None) keeps its stored value; `math.inf` removes a limit. A new tenant weighs 1
        and has no limits.

        - `weight`: while several tenants have claimable work, claims without a priority
          floor are shared between them in proportion to their weights, whatever number of
          groups each has.
        - `rate` (claims per second) and `burst` (claims at once after a quiet spell; default
          one second's worth, at least 1): a token bucket that every claim draws from; a
          tenant out of tokens is passed over until its next one (idle workers wake then).
        - `max_in_flight`: at most this many of its groups leased at once (a lapsed lease
          frees its slot; 0 stops its claims).
        - `max_queued`, `max_group_queued`: a publish (or follow-up) that would take the
          tenant's messages, or one of its groups', over the bound raises `QueueFull` and
          writes nothing.

        On a sharded queue, the settings are stored on every shard and each shard enforces
        them on its own groups: limits are per shard."""
        given = tenants.settings(weight, rate, burst, max_in_flight, max_queued, max_group_queued)
        plan = tenants.set_tenant(self._core, name, given)
        await self.router.everywhere(plan, self._by(), "set_tenant")

    async def set_tenant_rule(self, separator: str | None) -> None:
        """Groups created from now on without `tenant=` belong to the part of their id before
        the first `separator` (one character; e.g. ':' puts "acme:order-7" in tenant "acme");
        None: to the default tenant. Stored in the queue: every client follows it."""
        plan = tenants.set_tenant_separator(self._core, separator)
        await self.router.everywhere(plan, self._by(), "set_tenant_rule")

    async def tenants(self, *, limit: int = 100, after: str | None = None) -> list[TenantInfo]:
        """A page of the tenants, by name (the default tenant, '', first): weight, claimable
        groups, groups with messages, leases in flight, messages."""
        plan = tenants.tenants(self._core, limit, after)
        return await self.router.gather(plan, self._by(), sharding.tenants_of(limit))

    async def pause(self) -> None:
        """Claims of this queue take nothing until `resume()`, from every client (publishes go
        on; leases in flight finish normally)."""
        await self.router.everywhere(admin.set_paused(self._core, True), self._by(), "pause")

    async def resume(self) -> None:
        """Undo `pause()`."""
        await self.router.everywhere(admin.set_paused(self._core, False), self._by(), "resume")

    async def dead_letters(
        self, limit: int = 100, *, group_id: str | None = None, after: str | None = None
    ) -> list[DeadLetter]:
        """A page of the dead letters (of `group_id`) in seq order (on a sharded queue, in
        (seq, shard) order: seqs are per shard). For the next page, pass the last one's
        `DeadLetter.cursor` as `after` (keyset paging: dead letters requeued or purged
        between two pages never make a page repeat or skip one that was there all along)."""
        sharded = self.router.cluster is None  # seqs are per shard: the cursor names one
        cursor = None if after is None else sharding.parse_dead_cursor(after, sharded=sharded)
        plan = admin.dead_letters(self._core, limit, group_id, cursor)
        merge = sharding.dead_letters_of(limit, cursor)
        if group_id is not None:
            return await self.router.on_group(group_id, plan, self._by(), merge=merge)
        return await self.router.gather(plan, self._by(), merge)

    async def requeue_dead(
        self, seqs: Sequence[int] | None = None, *, shard: str | None = None
    ) -> int:
        """Put dead letters back at the tail of their groups: all of them, or those seqs (on
        a sharded queue, of `shard`: seqs are per shard, see `DeadLetter.shard`)."""
        plan = admin.requeue_dead(self._core, seqs)
        return await self.router.dead(plan, self._by(), seqs=seqs, shard=shard, what="requeue_dead")

    async def purge_dead(
        self, seqs: Sequence[int] | None = None, *, shard: str | None = None
    ) -> int:
        """Delete dead letters for good: all of them, or those seqs (of `shard`)."""
        plan = admin.purge_dead(self._core, seqs)
        return await self.router.dead(plan, self._by(), seqs=seqs, shard=shard, what="purge_dead")

    async def stats(self) -> Stats:
        """A snapshot of the queue (on a sharded queue, the totals over the shards that
        answered; `Stats.shards_down` names the others)."""
        return await self.router.gather(admin.stats(self._core), self._by(), sharding.stats_of)

    async def peek(self, group_id: str, limit: int = 10) -> list[tuple[int, Any]]:
        """The next messages of a group, as (seq, event), without leasing them."""
        return await self.router.on_group(
            group_id, admin.peek(self._core, group_id, limit), self._by()
        )

    async def nodes(self) -> list[NodeView]:
        """The rqlite nodes behind this queue (none for the embedded file): which answer,
        which one leads, how far each has applied the Raft log."""
        self._core.check_open()
        return await self.router.nodes()


_Self = TypeVar("_Self", bound=AsyncTransport)


class AsyncRqliteTransport(AsyncTransport):
    """The queue on an rqlite cluster: `url` is `http(s)://[user:pass@]host:port[,host:port]`.
    Each operation is one HTTP request (more only to fail over, or to resend a write whose
    reply was lost where that is safe). `timeout` bounds each request, `deadline` each call.

    Clocks: the node's clock is read from the `Date` of its replies (no extra request); a
    difference above `skew_warning` seconds is logged, and a lease is refused (`ClockSkew`)
    when the difference exceeds `max_skew` of its visibility (`max_skew=None`: neither, for
    a clock of the caller's own, such as a test's fake clock).

    `refused_timeout`: until a node of the cluster has accepted a connection once, a call
    raises `NothingListens` as soon as every node has refused connections for that long
    (nothing listens: the cluster is not running, or the port is wrong), instead of trying
    until its deadline. None (the default): a refused node is tried again like any other
    (a cluster still starting). Once a node has answered, failover is never cut short."""

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        *,
        queue: str = "default",
        codec: Codec | type[Any] | None = None,
        auth: tuple[str, str] | None = None,
        verify: bool | str = True,
        deadline: float = DEFAULT_DEADLINE,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
        dedup_key: Callable[[Any], str | None] | None = None,
        max_skew: float | None = DEFAULT_MAX_SKEW,
        skew_warning: float = 1.0,
        refused_timeout: float | None = None,
        keep: float | None = None,
    ) -> None:
        core = _core(
            queue, codec, clock, max_payload_bytes, dedup_window, dedup_key, keep, max_skew
        )
        backend = _rqlite_backend(
            url,
            core,
            timeout=timeout,
            auth=auth,
            verify=verify,
            skew_warning=skew_warning,
            refused_timeout=refused_timeout,
        )
        self.client: AiohttpClient = backend.executor  # type: ignore[assignment]
        """The HTTP client (its `requests` count, its nodes)."""
        super().__init__(AsyncClusterRouter(backend), core, deadline=deadline)


class AsyncSqliteTransport(AsyncTransport):
    """The embedded queue on a local SQLite file, shared safely by threads and processes."""

    def __init__(
        self,
        path: str,
        clock: Callable[[], float] = time.time,
        *,
        queue: str = "default",
        codec: Codec | type[Any] | None = None,
        busy_timeout: float = 30.0,
        deadline: float = DEFAULT_DEADLINE,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
        dedup_key: Callable[[Any], str | None] | None = None,
        keep: float | None = None,
    ) -> None:
        core = _core(queue, codec, clock, max_payload_bytes, dedup_window, dedup_key, keep)
        backend = _sqlite_backend(path, core, busy_timeout=busy_timeout)
        super().__init__(AsyncClusterRouter(backend), core, deadline=deadline)


class AsyncShardedTransport(AsyncTransport):
    """One queue over several clusters (shards), with the methods of a single-cluster
    transport: code that takes an `AsyncTransport` works unchanged.

    `shards`: a URL such as `a=http://h1:4001,http://h2:4001;b=http://h3:4001` (clusters
    separated by `;`, each optionally named; SQLite files too, named), or a mapping of shard
    name to an open single-cluster transport (all on the same queue). The options of a
    cluster (`timeout`, `auth`, `verify`, `skew_warning`, `refused_timeout`; `busy_timeout`
    for SQLite files) are given to every shard.

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
        claim_deadline: float = DEFAULT_CLAIM_DEADLINE,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
        dedup_key: Callable[[Any], str | None] | None = None,
        max_skew: float | None = DEFAULT_MAX_SKEW,
        keep: float | None = None,
        **options: Any,
    ) -> None:
        check_seconds(deadline, "deadline", allow_zero=False)
        check_seconds(claim_deadline, "claim_deadline", allow_zero=False)
        allowed = {"timeout", "auth", "verify", "skew_warning", "refused_timeout", "busy_timeout"}
        unknown = set(options) - allowed
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        core = _core(
            queue, codec, clock, max_payload_bytes, dedup_window, dedup_key, keep, max_skew
        )
        if isinstance(shards, Mapping):
            backends = _given_backends(shards, queue)
            shard_list = ShardList(tuple(ShardSpec(name, "") for name in backends))
        else:
            shard_list = parse_shard_list(shards)
            backends = _opened_backends(shard_list, core, options)
        self._shards = AsyncShardRouter(
            backends, shard_list, core, claim_deadline=min(float(deadline), claim_deadline)
        )
        super().__init__(self._shards, core, deadline=deadline)

    @property
    def names(self) -> list[str]:
        """The shards' names, in the order given."""
        return list(self._shards.names)

    @property
    def shard_list(self) -> ShardList:
        """The shards, their part in a change of the list, and the list's epoch."""
        return self._shards.shard_list

    @property
    def claim_deadline(self) -> float:
        return self._shards.claim_deadline

    def shard(self, name: str) -> AsyncTransport:
        """The queue on one of the shards alone."""
        backend = self._shards.backend(name)
        return AsyncTransport(AsyncClusterRouter(backend), backend.core, deadline=self.deadline)

    def shard_of(self, group_id: str) -> str:
        """The name of the shard `group_id` lives on (while the shard list changes: the shard
        that takes its new messages once its old shard has none left)."""
        return self.placement(group_id)[0]

    def placement(self, group_id: str) -> tuple[str, str]:
        """(target, previous) of `ShardList.placement`: the same shard twice unless the group
        moves in the change of the shard list under way."""
        check_id(group_id, "group_id")
        return self.shard_list.placement(group_id)

    def down_shards(self) -> list[str]:
        """The shards that did not answer and are being probed in the background (down, or
        skipped by claims)."""
        return self._shards.down()

    async def release_moved_groups(self) -> int:
        """Let the new shards serve the moving groups whose old shard has delivered all of
        theirs (done after each such ack too; this catches any a crash left held). Returns
        how many were still held."""
        self._core.check_open()
        return await self._shards.release_moved_groups(self._by())

    async def shard_status(self) -> list[ShardStatus]:
        """Each shard as a change of the shard list sees it: its part in the change, whether
        it answers, the list epoch it has been given, its depth and groups, the groups that
        still have to leave it, its dead letters and the schedules that belong elsewhere.
        Pages through every group: an operator's call."""
        self._core.check_open()
        return await self._shards.shard_status(self._by())


def _token() -> str:
    return uuid.uuid4().hex


def _core(
    queue: str,
    codec: Codec | type[Any] | None,
    clock: Callable[[], float],
    max_payload_bytes: int,
    dedup_window: float,
    dedup_key: Callable[[Any], str | None] | None,
    keep: float | None,
    max_skew: float | None = DEFAULT_MAX_SKEW,
) -> QueueCore:
    """A transport's configuration, checked, with this process's claim tokens and chance (the
    protocol draws neither)."""
    return QueueCore(
        queue=queue,
        codec=codec,
        clock=clock,
        token=_token,
        chance=random.random,
        max_payload_bytes=max_payload_bytes,
        dedup_window=dedup_window,
        dedup_key=dedup_key,
        max_skew=max_skew,
        keep=keep,
    )


def _follow_ups(lease: Lease, items: FollowUps) -> list[tuple[Lease, FollowUps]]:
    if isinstance(items, tuple) and not items:
        return []
    return [(lease, items)]


def _pairs(lease: Lease, value: Any) -> list[tuple[Lease, Any]]:
    return [] if value is None else [(lease, value)]


def _error_of(lease: Lease, error: object) -> object:
    """An exception as a job keeps it (its traceback formatted here: it reads source files);
    anything else as given (checked later)."""
    if isinstance(error, BaseException):
        return error_of(error, lease.attempts if isinstance(lease, Lease) else 0)
    return error


def _errors_of(errors: Any) -> Any:
    if not isinstance(errors, list | tuple):
        return errors  # (refused when the round is checked)
    return [
        (pair[0], _error_of(pair[0], pair[1]))
        if isinstance(pair, tuple) and len(pair) == 2
        else pair
        for pair in errors
    ]


def _rqlite_backend(
    url: str,
    core: QueueCore,
    *,
    timeout: float = 10.0,
    auth: tuple[str, str] | None = None,
    verify: bool | str = True,
    skew_warning: float = 1.0,
    refused_timeout: float | None = None,
) -> AsyncBackend:
    check_seconds(timeout, "timeout", allow_zero=False)
    check_seconds(skew_warning, "skew_warning", allow_zero=False)
    if refused_timeout is not None:
        check_seconds(refused_timeout, "refused_timeout", allow_zero=False)
    if core.max_skew is None:
        skew_warning = float("inf")  # a clock of the caller's own: not ours to judge
    if auth is not None and not (
        isinstance(auth, tuple) and len(auth) == 2 and all(isinstance(a, str) for a in auth)
    ):
        raise InvalidArgument("auth must be a (user, password) pair of strings")
    from .._io.aiohttp_client import AiohttpClient

    client = AiohttpClient(
        parse_endpoints(url, auth),
        timeout=timeout,
        verify=verify,
        skew_warning=skew_warning,
        clock=core.clock,
        refused_timeout=refused_timeout,
    )
    return AsyncBackend(client, core, skew=client.clock_skew)


def _sqlite_backend(path: str, core: QueueCore, *, busy_timeout: float = 30.0) -> AsyncBackend:
    check_seconds(busy_timeout, "busy_timeout", allow_zero=False)
    return AsyncBackend(AsyncSqliteExecutor(path, busy_timeout=busy_timeout), core, binds_rows=True)


def _opened_backends(
    shard_list: ShardList, core: QueueCore, options: Mapping[str, Any]
) -> dict[str, AsyncBackend]:
    embedded = {k: v for k, v in options.items() if k == "busy_timeout"}
    remote = {k: v for k, v in options.items() if k != "busy_timeout"}
    backends: dict[str, AsyncBackend] = {}
    try:
        for spec in shard_list.specs:
            if spec.url.startswith("sqlite://"):
                backends[spec.name] = _sqlite_backend(_sqlite_path(spec.url), core, **embedded)
            else:
                backends[spec.name] = _rqlite_backend(spec.url, core, **remote)
    except BaseException:
        core.closed = True  # nothing was opened that needs closing: no request was sent
        raise
    return backends


def _given_backends(shards: Mapping[str, AsyncTransport], queue: str) -> dict[str, AsyncBackend]:
    backends: dict[str, AsyncBackend] = {}
    for name, transport in shards.items():
        router = getattr(transport, "router", None)
        backend = getattr(router, "cluster", None)
        if not isinstance(backend, AsyncBackend):
            raise InvalidArgument(
                f"shard {name!r}: not a single-cluster transport: {show(transport)}"
            )
        if transport.queue != queue:
            raise InvalidArgument(f"shard {name!r} is on queue {transport.queue!r}, not {queue!r}")
        backends[check_shard_name(name)] = backend
    if not backends:
        raise InvalidArgument("a sharded transport needs at least one shard")
    return backends


def _sqlite_path(url: str) -> str:
    path = url.removeprefix("sqlite://")
    if not path.startswith("/") or path == "/":
        raise InvalidArgument("sqlite URL needs a path: sqlite:///relative.db or sqlite:////abs.db")
    return path[1:] or ":memory:"
