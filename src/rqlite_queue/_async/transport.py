"""The transports: thin shells that run `core` plans on a backend. This file is the source;
`_sync/transport.py` is generated from it (`scripts/gen_sync.py`): edit here, then
`make generate`."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from ..codec import Codec
from ..core import (
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_SKEW,
    Plan,
    Probe,
    PublishItem,
    QueueCore,
    Round,
)
from ..errors import BackendError, InvalidArgument, OutcomeUnknown, Unavailable
from ..http_async import AiohttpClient
from ..lease import DeadLetter, GroupInfo, Lease, Schedule, Stats
from ..rqlite_http import MIN_ATTEMPT, parse_endpoints, redact
from ..sharding import is_sharded_url
from ..sql import Batch, Reply, Result
from ..sqlite_backend import AsyncSqliteExecutor

T = TypeVar("T")

DEFAULT_DEADLINE = 15.0
UPGRADE_ATTEMPTS = 5


class AsyncExecutor(Protocol):
    async def execute(self, batch: Batch, deadline: float) -> list[Result]: ...

    async def close(self) -> None: ...


def _token() -> str:
    return uuid.uuid4().hex


class AsyncTransport:
    """A queue with per-group exclusivity on one backend (see the contract in the docs).

    Build one with `from_url`, or `AsyncRqliteTransport(url)` / `AsyncSqliteTransport(path)`.
    The tables are created (or upgraded) on first use. Every call finishes within `deadline`
    seconds: failover, resends and request timeouts included."""

    def __init__(
        self, executor: AsyncExecutor, core: QueueCore, *, deadline: float = DEFAULT_DEADLINE
    ) -> None:
        if isinstance(deadline, bool) or not isinstance(deadline, int | float) or deadline <= 0:
            raise InvalidArgument(f"deadline must be a number of seconds > 0, got {deadline!r}")
        self._executor = executor
        self._core = core
        self._schema_checked = False
        self._idle: dict[int, bool] = {}
        self.deadline = float(deadline)
        self.resent = 0
        """How many batches were sent again after an unknown outcome (for tests, metrics)."""

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

    @classmethod
    async def from_url(
        cls, url: str, *, connect_timeout: float = 30.0, **options: Any
    ) -> AsyncTransport:
        """`sqlite:///path.db` (embedded), `http(s)://host:port[,host:port...]` (rqlite), or
        several clusters (`a=http://...;b=http://...`, an `AsyncShardedTransport`).
        Waits until the backend answers and, for rqlite, has a leader; then creates or
        upgrades the tables. Raises `Unavailable` after `connect_timeout` seconds."""
        transport: AsyncTransport
        if not isinstance(url, str):
            raise InvalidArgument(f"not a URL: {type(url).__name__}")
        if is_sharded_url(url):
            from .sharded import AsyncShardedTransport  # a subclass of this one

            transport = AsyncShardedTransport(url, **options)
        elif url.startswith("sqlite://"):
            transport = AsyncSqliteTransport(_sqlite_path(url), **options)
        elif url.startswith(("http://", "https://")):
            transport = AsyncRqliteTransport(url, **options)
        else:
            raise InvalidArgument(
                f"unknown URL scheme in {redact(url)!r} (use sqlite, http or https)"
            )
        give_up = time.monotonic() + connect_timeout
        while True:
            try:
                await transport._setup(give_up)
                return transport
            except Unavailable as exc:
                # The inner retries may stop short of give_up (their next backoff would not
                # fit); wait out the rest, so the promised connect_timeout is what passes.
                left = give_up - time.monotonic()
                if left <= 0:
                    await transport.close()
                    raise Unavailable(
                        f"{redact(url)}: not available after {connect_timeout:g}s: {exc}"
                    ) from exc
                await asyncio.sleep(min(0.2, left))
            except BaseException:
                await transport.close()
                raise

    async def setup(self) -> None:
        """Create the queue's tables if missing, or upgrade them in place, and check their
        version (`SchemaError` if they are newer than this library)."""
        await self._setup(time.monotonic() + self.deadline)

    async def _setup(self, deadline: float) -> None:
        failure: Exception | None = None
        for _ in range(UPGRADE_ATTEMPTS):
            plan = self._core.upgrade(await self._send(self._core.bootstrap(), deadline))
            if plan is None:
                self._schema_checked = True
                return
            try:
                await self._send(plan, deadline)
            except (BackendError, OutcomeUnknown) as exc:
                # Another client upgraded first (its version check failed ours), or the reply
                # was lost: read the version again.
                failure = exc
        raise BackendError(f"queue {self.queue!r}: could not upgrade the schema: {failure}")

    async def _send(self, plan: Plan[T], deadline: float) -> T:
        if not plan.batch.statements:
            return plan.read(Reply(plan.batch, []))  # nothing to do (an empty settle, say)
        return plan.read(Reply(plan.batch, await self._executor.execute(plan.batch, deadline)))

    async def _run(self, plan: Plan[T], within: float | None = None) -> T:
        """Run `plan` within `within` seconds (default: the transport's `deadline`)."""
        deadline = time.monotonic() + (self.deadline if within is None else within)
        if not self._schema_checked:
            await self._setup(deadline)
        try:
            return await self._send(plan, deadline)
        except OutcomeUnknown:
            if plan.replay is None:
                raise
            return await self._replay(plan, plan.replay, deadline)

    async def _replay(self, plan: Plan[T], read: Callable[[Reply], T], deadline: float) -> T:
        """Send a retry-safe batch again after an unknown outcome, until `deadline`."""
        batch = plan.replay_batch or plan.batch
        backoff = 0.05
        while True:
            left = deadline - time.monotonic()
            if left < MIN_ATTEMPT + backoff / 2:
                raise OutcomeUnknown(
                    f"queue {self.queue!r}: the deadline passed while the outcome of a write "
                    f"was unknown"
                )
            await asyncio.sleep(min(backoff * random.uniform(0.5, 1.0), left - MIN_ATTEMPT))
            self.resent += 1
            try:
                return read(Reply(batch, await self._executor.execute(batch, deadline)))
            except Unavailable as exc:
                # Whatever this attempt met, the first one may have applied.
                if time.monotonic() + MIN_ATTEMPT >= deadline:
                    raise OutcomeUnknown(f"queue {self.queue!r}: outcome unknown: {exc}") from exc
                backoff = min(backoff * 2, 1.0)

    # ------------------------------------------------------------------------ the seed's calls

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
        """Append `event` to `group_id`'s FIFO; returns its seq. `priority` (0-4) is fixed by
        the publish that creates the group. With `dedup_id` (or the transport's `dedup_key`),
        a repeat within the dedup window publishes nothing and returns the first seq.

        `delay` (seconds) or `not_before` (epoch seconds): not delivered before then; FIFO is
        kept, so the messages published after it in its group wait too. `ttl` (seconds): if it
        is not delivered within them, it is moved to the dead letters (reason `expired`)
        instead, and its group moves on."""
        return await self._run(
            self._core.publish(group_id, event, priority, dedup_id, delay, not_before, ttl)
        )

    async def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Lease | None:
        """Lease the head of the claimable group claimed least recently, for `visibility`
        seconds; None when nothing is claimable."""
        leases = await self.claim_many(worker_id, visibility, 1, min_priority)
        return leases[0] if leases else None

    async def ack(self, lease: Lease) -> None:
        """Done: remove the message and free its group. `LeaseLost` if the lease no longer
        holds the group."""
        await self._run(self._core.ack([lease]))

    async def nack(self, lease: Lease, delay: float = 0.0) -> None:
        """Give the message back: claimable now (`delay=0`) or its group parked for `delay`
        seconds. The message stays its group's head."""
        await self._run(self._core.nack(lease, delay))

    async def close(self) -> None:
        if not self._core.closed:
            self._core.closed = True
            await self._executor.close()

    async def __aenter__(self: _Self) -> _Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------------ beyond the seed

    async def publish_many(self, items: Iterable[PublishItem]) -> list[int]:
        """Publish many messages in one round trip, atomically, in order. Items are
        `(group_id, event)`, `(group_id, event, priority)` or mappings with those keys and
        optionally `dedup_id`, `delay`, `not_before`, `ttl` (as `publish` takes them)."""
        return await self._run(self._core.publish_many(items))

    async def claim_many(
        self, worker_id: str, visibility: float, n: int, min_priority: int = 0
    ) -> list[Lease]:
        """Up to `n` leases from `n` distinct groups, in one round trip. After a claim that
        found nothing, the next one first asks the node it talks to (a read, no Raft write)
        and only writes when something is claimable."""
        return await self._claim_many(worker_id, visibility, n, min_priority, None)

    async def _claim_many(
        self, worker_id: str, visibility: float, n: int, min_priority: int, within: float | None
    ) -> list[Lease]:
        plan = self._core.claim(worker_id, visibility, n, min_priority)
        if self._idle.get(min_priority) and not await self._worth_claiming(min_priority, within):
            return []
        result = await self._claimed(
            await self._run(plan, within), worker_id, visibility, min_priority, within
        )
        self._idle[min_priority] = not result.leases
        return result.leases

    async def _claimed(
        self,
        result: Round,
        worker_id: str | None,
        visibility: float,
        min_priority: int,
        within: float | None = None,
    ) -> Round:
        """Leases taken on messages whose ttl had passed are never handed out: they are
        dead-lettered (reason `expired`), and as many leases claimed again in the same round
        trip. If that fails, those leases lapse and the next claim expires them."""
        leases, expired = list(result.leases), result.expired
        while expired:
            plan = self._core.round(
                worker_id=worker_id,
                visibility=visibility,
                n=len(expired),
                min_priority=min_priority,
                expired=expired,
            )
            try:
                more = await self._run(plan, within)
            except Unavailable:
                break
            leases += more.leases
            expired = more.expired
        return Round(leases=leases, lost=result.lost, extended=result.extended)

    async def _worth_claiming(self, min_priority: int, within: float | None = None) -> bool:
        probe = await self._run(self._core.probe(min_priority), within)
        return probe.claimable or (probe.next_due is not None and probe.next_due <= self.clock())

    async def probe(self, min_priority: int = 0) -> Probe:
        """A look without a Raft round (a read of the leader's copy, no write): is a group
        claimable now, when does the earliest lease, park or delayed head end, when is the next
        schedule due?"""
        return await self._run(self._core.probe(min_priority))

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
        """Settle leases (ack; nack as `(lease, delay)`; extend by `visibility`; dead-letter as
        `(lease, reason)`, holding their groups with `hold_dead`) and claim up to `n` new
        leases, in one round trip and one transaction. Leases that no longer held are listed
        in `Round.lost` (they changed nothing); nothing is raised for them."""
        return await self._settle_and_claim(
            worker_id, visibility, n, ack, nack, extend, dead, hold_dead, min_priority, None
        )

    async def _settle_and_claim(
        self,
        worker_id: str | None,
        visibility: float,
        n: int,
        ack: Sequence[Lease],
        nack: Sequence[tuple[Lease, float]],
        extend: Sequence[Lease],
        dead: Sequence[tuple[Lease, str]],
        hold_dead: bool,
        min_priority: int,
        within: float | None,
    ) -> Round:
        plan = self._core.round(
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
        return await self._claimed(
            await self._run(plan, within), worker_id, visibility, min_priority, within
        )

    async def ack_many(self, leases: Sequence[Lease]) -> None:
        """Ack several leases in one round trip. Those that still hold are acked; if any did
        not, `LeaseLost` lists them."""
        await self._run(self._core.ack(leases))

    async def extend(self, lease: Lease, visibility: float) -> Lease:
        """Heartbeat: the lease now lapses `visibility` seconds from now. Returns the lease
        with its new `expires_at`."""
        return await self._run(self._core.extend(lease, visibility))

    async def dead_letter(self, lease: Lease, reason: str, *, hold: bool = False) -> None:
        """Move the message to the dead-letter table, with `reason`, and free its group (or,
        with `hold`, hold it until `release_group`)."""
        await self._run(self._core.dead_letter(lease, reason, hold))

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
        """Publish `event` to `group_id` every `every` seconds, or at the times of the `cron`
        expression (UTC), from `start_at` (default: the first tick after now). Stored in the
        queue: it survives restarts, and its ticks are published by whichever workers run
        (`Worker`, or `rqlite-queue scheduler`), each exactly once. A stretch with no worker
        running gives one message for all the ticks it missed (`catch_up=True`: one per
        tick, at most 1000). Scheduling a name again replaces it."""
        return await self._run(
            self._core.schedule(
                name,
                group_id,
                event,
                every=every,
                cron=cron,
                priority=priority,
                catch_up=catch_up,
                start_at=start_at,
            )
        )

    async def unschedule(self, name: str) -> bool:
        """Remove a schedule; False if there was none of that name."""
        return await self._run(self._core.unschedule(name))

    async def schedules(self) -> list[Schedule]:
        return await self._run(self._core.schedules())

    async def fire_schedules(self) -> int:
        """Publish the ticks that are due (a read, then a write only if some are); returns how
        many messages went out. Workers call it between claims."""
        due = await self._run(self._core.due_schedules())
        return await self._run(self._core.fire(due)) if due else 0

    async def hold_group(self, group_id: str) -> None:
        """No claim takes this group until `release_group` (a lease in flight on it finishes
        normally; publishing to it goes on)."""
        await self._run(self._core.hold(group_id))

    async def release_group(self, group_id: str) -> bool:
        """Undo `hold_group`; False if the group was not held."""
        return await self._run(self._core.release(group_id))

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
        return await self._run(
            self._core.groups(
                state=state, prefix=prefix, min_priority=min_priority, limit=limit, after=after
            )
        )

    async def cancel_group(self, group_id: str, reason: str) -> int:
        """Move every message of the group to the dead letters with `reason`, in one
        transaction, and return how many. A lease in flight on it is fenced: its ack, nack or
        extend raises `LeaseLost`. Messages published after this call are not touched. Not
        resent after a lost reply (that could cancel newer messages): `OutcomeUnknown`."""
        return await self._run(self._core.cancel_group(group_id, reason))

    async def set_priority(self, group_id: str, priority: int) -> bool:
        """Change the priority (0-4) of a group that has messages; False if it has none (its
        next publish sets its priority). Publishing to a group that has messages keeps its
        priority, whatever the publish says."""
        return await self._run(self._core.set_priority(group_id, priority))

    async def pause(self) -> None:
        """Claims of this queue take nothing until `resume()`, from every client (publishes go
        on; leases in flight finish normally)."""
        await self._run(self._core.set_paused(True))

    async def resume(self) -> None:
        """Undo `pause()`."""
        await self._run(self._core.set_paused(False))

    async def dead_letters(
        self, limit: int = 100, *, group_id: str | None = None
    ) -> list[DeadLetter]:
        return await self._run(self._core.dead_letters(limit, group_id))

    async def requeue_dead(self, seqs: Sequence[int] | None = None) -> int:
        """Put dead letters (all, or those seqs) back at the tail of their groups."""
        return await self._run(self._core.requeue_dead(seqs))

    async def purge_dead(self, seqs: Sequence[int] | None = None) -> int:
        """Delete dead letters (all, or those seqs) for good."""
        return await self._run(self._core.purge_dead(seqs))

    async def stats(self) -> Stats:
        return await self._run(self._core.stats())

    async def peek(self, group_id: str, limit: int = 10) -> list[tuple[int, Any]]:
        """The next messages of a group, as (seq, event), without leasing them."""
        return await self._run(self._core.peek(group_id, limit))


_Self = TypeVar("_Self", bound=AsyncTransport)


class AsyncRqliteTransport(AsyncTransport):
    """The queue on an rqlite cluster: `url` is `http(s)://[user:pass@]host:port[,host:port]`.
    Each operation is one HTTP request (more only to fail over, or to resend a write whose
    reply was lost where that is safe). `timeout` bounds each request, `deadline` each call.

    Clocks: the node's clock is read from the `Date` of its replies (no extra request); a
    difference above `skew_warning` seconds is logged, and a lease is refused (`ClockSkew`)
    when the difference exceeds `max_skew` of its visibility (`max_skew=None`: neither, for
    a clock of the caller's own, such as a test's fake clock)."""

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
    ) -> None:
        _check_timeout(timeout)
        _check_timeout(skew_warning)
        if max_skew is None:
            skew_warning = float("inf")  # a clock of the caller's own: not ours to judge
        if auth is not None and not (
            isinstance(auth, tuple) and len(auth) == 2 and all(isinstance(a, str) for a in auth)
        ):
            raise InvalidArgument("auth must be a (user, password) pair of strings")
        endpoints = parse_endpoints(url, auth)
        core = QueueCore(
            queue=queue,
            codec=codec,
            clock=clock,
            token=_token,
            chance=random.random,
            max_payload_bytes=max_payload_bytes,
            dedup_window=dedup_window,
            dedup_key=dedup_key,
            max_skew=max_skew,
        )
        self.client = AiohttpClient(
            endpoints, timeout=timeout, verify=verify, skew_warning=skew_warning, clock=clock
        )
        core.clock_skew = self.client.clock_skew
        super().__init__(self.client, core, deadline=deadline)


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
    ) -> None:
        core = QueueCore(
            queue=queue,
            codec=codec,
            clock=clock,
            token=_token,
            chance=random.random,
            max_payload_bytes=max_payload_bytes,
            dedup_window=dedup_window,
            dedup_key=dedup_key,
        )
        _check_timeout(busy_timeout)
        super().__init__(
            AsyncSqliteExecutor(path, busy_timeout=busy_timeout), core, deadline=deadline
        )


def _check_timeout(timeout: object) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
        raise InvalidArgument(f"timeout must be a number of seconds > 0, got {timeout!r}")


def _sqlite_path(url: str) -> str:
    path = url.removeprefix("sqlite://")
    if not path.startswith("/") or path == "/":
        raise InvalidArgument("sqlite URL needs a path: sqlite:///relative.db or sqlite:////abs.db")
    return path[1:] or ":memory:"
