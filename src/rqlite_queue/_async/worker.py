"""The worker runtime: claims and settles in one round trip, runs a handler per message on
reused threads or tasks, heartbeats, retries with backoff, dead-letters, stops gracefully. This
file is the source; `_sync/worker.py` (threads) is generated from it by `scripts/gen_sync.py`;
what threads and asyncio do differently lives in `_runtime.py`, the decisions in
`_protocol/worker_policy.py`."""

from __future__ import annotations

import collections
import functools
import logging
import math
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _tracing
from .._job import Job, Result, error_of, in_job
from .._protocol.checks import check_bool, check_int, check_seconds
from .._protocol.messages import MAX_PUBLISH
from .._protocol.retry import ROUND_ERRORS, Backoff
from .._protocol.worker_policy import FailurePolicy, Park, PriorityShare, Verdict, heartbeat_due
from .._runtime import LOCAL_CANCELS, LOCAL_PUBLISHES, SKIPPED, AsyncRuntime, is_async_handler
from ..errors import (
    AuthError,
    InvalidArgument,
    PartialRound,
    QueueError,
    SchemaError,
    TransportClosed,
)
from ..types import CheckedItems, CheckedResult, JobError, Lease, Round
from .queue import AsyncTransport

log = logging.getLogger("rqlite_queue.worker")

# Upper bounds (seconds) of the claim-latency histogram.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PERMANENT = (AuthError, SchemaError, TransportClosed)
"""Errors no retry can mend: the worker stops and `run` raises them."""
KEEPER_TICK = 0.1
"""How often the lease keeper looks at a round trip in flight."""
WAIT_LOG_EVERY = 5.0
"""At most one warning this often about settlements waiting for their shard."""
SCHEDULE_CHECK = 1.0
"""A busy worker looks for due schedules this often (an idle one learns the next tick from
its polls)."""
EWMA = 0.2
"""The weight of the latest measure in the running means of handler and round-trip times."""
# The default prefetch cap, per slot, while the queue's tenants are on (Celery's default
# prefetch multiplier): with quick handlers a round carries up to 5 x `concurrency` messages
# (bench/results/prefetch.md). A tenant's share needs groups of its own claimable: a worker
# holding more ahead ties up a small tenant's few groups (tests/test_fairness.py fails at
# 8 x concurrency). Tenants off, claims are plain round robin and no share is at stake: the
# cap is 16 x concurrency, at most PREFETCH_TENANTS_OFF_MAX (never below 4 x concurrency).
# Behind 1 ms links, concurrency 8, that doubles a Worker with quick handlers (BENCHMARKS.md,
# issue 34); at 64, rounds of up to 16 x 64 were slower than 4 x 64's (a round that takes every
# claimable group leaves the next one nothing to claim while its handlers run).
PREFETCH_MULTIPLIER = 4
PREFETCH_MULTIPLIER_TENANTS_OFF = 16
PREFETCH_TENANTS_OFF_MAX = 256
QUICK_POLL = 0.01
QUICK_POLL_FOR = 1.0
"""For this long after its last message, an idle worker polls every QUICK_POLL seconds (work
tends to come in bursts), then every `poll_interval`."""


@dataclass
class WorkerStats:
    """Counters since the worker started (read them any time, e.g. for metrics)."""

    claimed: int = 0
    acked: int = 0
    nacked: int = 0
    dead_lettered: int = 0
    leases_lost: int = 0
    extended: int = 0
    claim_errors: int = 0
    """Round trips that failed (the backend unavailable, say); what they carried is resent."""
    rounds: int = 0
    """Round trips to the backend (each one write: settle and claim together)."""
    probes: int = 0
    """Node-local reads made while idle (no write)."""
    ticks: int = 0
    """Messages this worker published for due schedules."""
    published: int = 0
    """Follow-ups published with this worker's acks (`follow_ups=True`)."""
    forwarded: int = 0
    """Follow-ups forwarded from a shard's outbox to their own shard at the end of this
    worker's rounds (sharded queues; the periodic sweep is not counted)."""
    results: int = 0
    """Handlers' return values kept as their message's result (messages that keep their
    outcome: `publish(keep=...)`)."""
    cancelled: int = 0
    """Handlers told that their message was cancelled (`cancel()`), and messages cancelled
    before their handler started (settled without running it). A lease lost while its
    handler runs (its group cancelled, or taken over) counts in `leases_lost`."""
    progress: int = 0
    """Progress values that reached the queue with an extension."""
    claim_seconds: float = 0.0
    """Total time spent in round trips that claimed (divide by claim_rounds for the mean)."""
    claim_rounds: int = 0
    claim_buckets: list[int] = field(default_factory=lambda: [0] * len(CLAIM_BUCKETS))
    """Claiming round trips that took at most each of `CLAIM_BUCKETS` seconds (cumulative)."""

    def summary(self) -> str:
        """The totals in words, as the stop is logged: `3 claimed, 2 acked, 1 nacked, 0
        dead-lettered`, then the other counters that are not zero."""
        words = [
            f"{self.claimed} claimed",
            f"{self.acked} acked",
            f"{self.nacked} nacked",
            f"{self.dead_lettered} dead-lettered",
        ]
        for count, what in (
            (self.leases_lost, "leases lost"),
            (self.extended, "leases extended"),
            (self.claim_errors, "round trips failed"),
            (self.ticks, "schedule ticks published"),
            (self.published, "follow-ups published"),
            (self.forwarded, "follow-ups forwarded"),
        ):
            if count:
                words.append(f"{count} {what}")
        return ", ".join(words)

    def record_claim(self, seconds: float) -> None:
        self.claim_rounds += 1
        self.claim_seconds += seconds
        for i, bound in enumerate(CLAIM_BUCKETS):
            if seconds <= bound:
                self.claim_buckets[i] += 1


@dataclass
class _Pending:
    """What the next round trip carries."""

    ack: list[Lease] = field(default_factory=list)
    nack: list[tuple[Lease, float]] = field(default_factory=list)
    dead: list[tuple[Lease, str]] = field(default_factory=list)
    publish: list[tuple[Lease, CheckedItems]] = field(default_factory=list)
    """The follow-ups the handlers returned, with their acks."""
    results: list[tuple[Lease, CheckedResult]] = field(default_factory=list)
    """The values the handlers returned, with the acks of messages that keep their outcome."""
    errors: list[tuple[Lease, JobError]] = field(default_factory=list)
    """The errors of failed handlers, with the nacks and dead letters of messages that keep
    their outcome."""

    def __bool__(self) -> bool:
        return bool(self.ack or self.nack or self.dead)

    def take(self) -> _Pending:
        taken = _Pending(self.ack, self.nack, self.dead, self.publish, self.results, self.errors)
        self.ack, self.nack, self.dead, self.publish = [], [], [], []
        self.results, self.errors = [], []
        return taken

    def put_back(self, other: _Pending) -> None:
        self.ack += other.ack
        self.nack += other.nack
        self.dead += other.dead
        self.publish += other.publish
        self.results += other.results
        self.errors += other.errors

    def leases(self) -> list[Lease]:
        return [*self.ack, *(lease for lease, _ in self.nack), *(lease for lease, _ in self.dead)]


@dataclass(frozen=True, slots=True)
class _Returned:
    """What a handler returned: its follow-ups and its result, checked, or why they fail its
    message."""

    follow_ups: CheckedItems | None
    error: Exception | None
    result: CheckedResult | None = None


class _FollowUpRoom:
    """What follow-ups the next round can still carry: a round refuses two leases'
    follow-ups with one dedup id (which of them holds is known only when it applies), and
    more than MAX_PUBLISH follow-ups."""

    def __init__(self, *waiting: _Pending) -> None:
        self.count = 0
        self.dedup_ids: set[str] = set()
        for pending in waiting:
            for _, checked in pending.publish:
                self.count += len(checked)
                self.dedup_ids |= checked.dedup_ids

    def take(self, follow_ups: CheckedItems) -> bool:
        """Whether these fit (then counted in)."""
        if self.count + len(follow_ups) > MAX_PUBLISH or follow_ups.dedup_ids & self.dedup_ids:
            return False
        self.count += len(follow_ups)
        self.dedup_ids |= follow_ups.dedup_ids
        return True


class AsyncWorker:
    """Runs `handler(lease)` for each message, `concurrency` at a time.

    - One round trip at a time settles every message whose handler finished (ack, retry,
      dead letter) and claims as many new ones as there are free slots: one write (one Raft
      entry) per round, however many messages it carries. At concurrency 1 that is one write
      per message; at concurrency c, the handlers that finished during a round trip (or within
      `batch_wait`, 2 ms, of the first to finish while others run) are settled, and their
      slots refilled, by the next one.
    - Idle (the last claim found nothing and nothing is left to settle), it asks the node it
      talks to, every `poll_interval` seconds, whether anything is claimable: a read, no
      write. A new message is picked up within about `poll_interval`.
    - Prefetch: a round claims ahead of the free slots as many messages as the handlers are
      expected to finish during one round trip (`concurrency` x round trip / handler time,
      running means), at most `prefetch` (default: 16 x `concurrency` up to 256, or 4 x
      `concurrency` if more; 4 x `concurrency`, Celery's default prefetch multiplier, once the
      queue's tenants are on, so that a small tenant's few groups are not all held ahead; 0:
      never ahead). They wait
      in order and start as soon as a slot frees, while the next round trip is in flight, so
      that a round carries more than `concurrency` messages when handlers are quick. Slow
      handlers claim nothing ahead. A prefetched message whose handler has not started within
      a third of `visibility` (or when the worker stops) is given back at once (nack without
      delay: its group is claimable again, its attempt counted).
    - A handler running longer than a third of `visibility` has its lease extended (in the
      next round trip, or one of its own).
    - A handler that raises: the message is retried after `backoff` (its group parked, order
      kept) until it has been tried `max_attempts` times, then dead-lettered with the exception
      type and message; an exception in `non_retryable` is dead-lettered at once; `Park(delay)`
      puts it back for `delay` seconds. With `hold_group_on_dead_letter`, a dead letter also
      holds its group (its later messages wait for `release_group`).
    - On a lease that no longer held (it lapsed and another worker took the group) the result
      is dropped and logged.
    - `stop()` (or SIGINT/SIGTERM while `run` runs in the main thread): stop claiming, let
      handlers finish within `grace` seconds, settle them, give the rest back. Nothing is lost.
    - Schedules: between claims it publishes the ticks of the queue's schedules that are due
      (each exactly once, whichever worker gets there first); `schedules=False` leaves that to
      others (`rqlite-queue scheduler`).
    - Follow-ups (`follow_ups=True`): the handler returns the messages its work produced, as
      `publish_many` takes them (or None); they are published with its ack, in the same
      transaction, only if the ack applies: the message's effects inside the queue happen
      exactly once. A handler that raises publishes nothing; a bad return value fails its
      message as an exception would.
    - Results: a message published with `keep=` keeps its outcome; the handler's return value
      is its result (with `follow_ups=True`, return `Result(value, publish=[...])` to give
      both), written with its ack. A value the queue's codec cannot store (or over the
      payload limit) fails its message as an exception would. A message that fails for good
      keeps the error's type, message and a bounded traceback (each failed attempt's, with
      its retries). Without `keep=` the return value is ignored.
    - Cancellation: every `heartbeat_interval` while handlers run, the worker asks (a read,
      no Raft entry; at once after a `cancel()` in this process) whether their messages were
      cancelled or their leases lost. It tells the handler (`current_job().cancelled`,
      `wait_cancelled()`, `raise_if_cancelled()`; an async handler's task is cancelled), and
      settles the message as cancelled however the handler ends, without retrying it (a
      lease lost is dropped: its group was cancelled, or another worker has the message). A
      cancelled message whose handler has not started is settled without running it.
    - Progress: `current_job().progress(value)` (a small JSON value); the latest one goes
      with the lease's next extension, or with a round the worker sends anyway (no Raft
      entry of its own), and `result()` shows it.
    - Errors no retry can mend (wrong credentials, a newer schema, a closed transport) stop the
      worker: `run` raises them."""

    def __init__(
        self,
        transport: AsyncTransport,
        handler: Callable[[Lease], Any],
        *,
        concurrency: int = 4,
        visibility: float = 30.0,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        non_retryable: Sequence[type[BaseException]] = (),
        hold_group_on_dead_letter: bool = False,
        worker_id: str | None = None,
        priority_share: float = 0.0,
        priority_floor: int = 3,
        poll_interval: float = 0.05,
        grace: float = 30.0,
        heartbeat_interval: float | None = None,
        schedules: bool = True,
        batch_wait: float = 0.002,
        follow_ups: bool = False,
        prefetch: int | None = None,
    ) -> None:
        AsyncRuntime.check_handler(handler)
        check_int(concurrency, "concurrency", 1, 10_000)
        check_int(max_attempts, "max_attempts", 1, 1_000_000)
        check_seconds(visibility, "visibility", allow_zero=False)
        check_seconds(poll_interval, "poll_interval", allow_zero=False)
        check_seconds(grace, "grace", allow_zero=True)
        check_seconds(batch_wait, "batch_wait", allow_zero=True)
        if heartbeat_interval is not None:
            check_seconds(heartbeat_interval, "heartbeat_interval", allow_zero=False)
        check_bool(hold_group_on_dead_letter, "hold_group_on_dead_letter")
        check_bool(schedules, "schedules")
        check_bool(follow_ups, "follow_ups")
        if prefetch is not None:
            check_int(prefetch, "prefetch", 0, 10_000)
        if not isinstance(non_retryable, Sequence) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in non_retryable
        ):
            raise InvalidArgument("non_retryable must be a sequence of exception classes")
        self.transport = transport
        self.handler = handler
        self.concurrency = concurrency
        self.visibility = float(visibility)
        self.policy = FailurePolicy(max_attempts, backoff or Backoff(), tuple(non_retryable))
        self.hold_group_on_dead_letter = hold_group_on_dead_letter
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.priority = PriorityShare(priority_share, priority_floor)
        self.poll_interval = float(poll_interval)
        self.grace = float(grace)
        self.heartbeat_interval = heartbeat_interval or max(0.05, visibility / 6)
        self.stats = WorkerStats()
        self.prefetch = prefetch
        """The prefetch cap given (None: the default, `_prefetch_cap`)."""
        self._running: dict[tuple[str, int], Lease] = {}
        """Every lease this worker holds for a handler: running, or waiting for a slot."""
        self._waiting: dict[int, tuple[tuple[str, int], float]] = {}
        """The leases in `_running` whose handler has not started, by `id(lease)` (a lease
        given back and claimed again is another lease): key, when claimed (monotonic). Popped
        by whoever comes first: the handler starting, or a give-back."""
        self._began: dict[tuple[str, int], float] = {}
        self._jobs: dict[tuple[str, int], Job] = {}
        """The job of each lease in `_running`, as its handler sees it (`current_job()`)."""
        self._news: collections.deque[tuple[str, Lease, str]] = collections.deque()
        """What the lease keeper learnt of running leases, for the loop to take in:
        ("cancelled" or "lost", the lease, why)."""
        self._check_now = False
        """A message of this queue was cancelled in this process: look at once."""
        self._progressed: set[tuple[str, int]] = set()
        """The keys of the jobs whose handler reported progress since the last round looked
        (their threads add to it)."""
        self._next_give_back = 0.0
        self._published_here = False
        self._last_work = -math.inf
        """When a round last claimed something (monotonic)."""
        self._handler_seconds: float | None = None
        self._round_seconds: float | None = None
        """Running means (EWMA) of a handler's time and of a round trip's."""
        self._finished: collections.deque[tuple[tuple[str, int], BaseException | None, Any]] = (
            collections.deque()
        )
        self._pending = _Pending()
        self._retry = _Pending()
        """Settlements whose shard did not answer: sent again at `_retry_at`."""
        self._retry_at = 0.0
        self._retry_failures = 0
        self._not_before = 0.0
        """After a round that failed whole: no round before then (monotonic)."""
        self._round_failures = 0
        self._round_started: float | None = None
        """When the round trip in flight started (monotonic; None: none in flight)."""
        self._settling: list[Lease] = []
        """The leases the round trip in flight settles."""
        self._kept: collections.deque[Round] = collections.deque()
        """What the lease keeper's own extensions did, for the loop to take in."""
        self._waiting_since = 0.0
        self._stopping = False
        self._rng = random.Random()
        self._runtime: AsyncRuntime | None = None
        self.schedules = schedules
        self.batch_wait = float(batch_wait)
        self.follow_ups = follow_ups
        self._finish = functools.partial(self._returned, False) if follow_ups else None
        """What turns a handler's return value into what it settles, where it ran (None: the
        value is ignored, unless it is a `Result`); `_finish_kept`, for a message that keeps
        its outcome."""
        self._finish_kept = functools.partial(self._returned, True)
        self._is_async = is_async_handler(handler)
        self._next_tick = 0.0
        """When (the transport's clock) to look for due schedules next."""
        self._next_due: float | None = None
        """When the last idle probe said a lease, park, delay or rate limit ends."""
        self._traced = _tracing.installed()
        """OpenTelemetry is installed: rounds that claim and handlers are traced while a
        tracer provider is set (`_tracing`)."""

    # ----------------------------------------------------------------------------- control

    def stop(self) -> None:
        """Ask `run` to stop claiming and wind down (thread-safe)."""
        self._stopping = True
        if self._runtime is not None:
            self._runtime.wake()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    async def run(self, *, handle_signals: bool = True, until_empty: bool = False) -> None:
        """Work until `stop()` (or SIGINT/SIGTERM), then wind down gracefully. With
        `until_empty`, also stop once a claim finds nothing and every handler has finished."""
        runtime = self._runtime = AsyncRuntime(self.concurrency)
        self._stopping = False
        if handle_signals:
            runtime.install_signals(self._on_signal)
        log.info("worker %s started (concurrency %d)", self.worker_id, self.concurrency)
        started = time.monotonic()
        runtime.keep(self._keep_leases)
        LOCAL_PUBLISHES.listen(self.transport.queue, self._on_local_publish)
        LOCAL_CANCELS.listen(self.transport.queue, self._on_local_cancel)
        try:
            await self._loop(runtime, until_empty)
        finally:
            LOCAL_CANCELS.forget(self.transport.queue, self._on_local_cancel)
            LOCAL_PUBLISHES.forget(self.transport.queue, self._on_local_publish)
            self._stopping = True
            # Leases claimed ahead and still waiting for a slot never start now (a graceful
            # stop gave them back already; after a permanent error nothing can, and they
            # lapse): a handler must not begin after `run` returned or raised.
            self._waiting.clear()
            if handle_signals:
                runtime.remove_signals()
            runtime.abandon()
        log.info(
            "worker %s stopped after %.1fs: %s",
            self.worker_id,
            time.monotonic() - started,
            self.stats.summary(),
        )

    def _on_local_publish(self) -> None:
        """A publish to this queue in this process (any thread): an idle worker claims at
        once, without waiting for its next poll or asking with a read first."""
        self._published_here = True
        if self._runtime is not None:
            self._runtime.wake()

    def _on_local_cancel(self) -> None:
        """A message of this queue was cancelled in this process (any thread): the lease
        keeper looks at its running leases now, not at its next check."""
        self._check_now = True

    def _on_signal(self) -> None:
        log.info("worker %s: signal received, stopping", self.worker_id)
        self.stop()

    # -------------------------------------------------------------------------------- loop

    async def _loop(self, runtime: AsyncRuntime, until_empty: bool) -> None:
        idle = False
        floor_again = False
        give_up_at: float | None = None
        batch_until: float | None = None
        while True:
            self._collect()
            now = time.monotonic()
            if self._stopping and give_up_at is None:
                give_up_at = now + self.grace
                if self._running:
                    log.info(
                        "worker %s: waiting up to %.1fs for %d handlers",
                        self.worker_id,
                        self.grace,
                        len(self._running),
                    )
            if give_up_at is not None and now >= give_up_at:
                if self._running:
                    self._give_back_running()
                elif self._pending or self._retry:
                    self._drop_unsent()
            if now < self._not_before:  # the last round failed: back off (handlers that
                await runtime.wait(self._not_before - now)  # finish do not cut it short)
                continue
            if self.schedules and not self._stopping:
                await self._fire_schedules()
            self._give_back_waiting(self._stopping)
            extend = self._due_heartbeats()
            # Free slots; a round claims ahead of them, but never runs only to claim ahead.
            slots = 0 if self._stopping else self.concurrency - len(self._running)
            retry_due = bool(self._retry) and now >= self._retry_at
            if not self._pending and not extend and not retry_due:
                if self._stopping and not self._running and not self._retry:
                    return
                published_here, self._published_here = self._published_here, False
                if slots <= 0 or (
                    idle and not published_here and not await self._worth_claiming(runtime)
                ):
                    await runtime.wait(self._next_wake(give_up_at, idle and slots > 0))
                    continue
            if self._pending and self._running and not self._stopping:
                # Handlers still running may finish in a moment: wait a little for them, so
                # one round trip settles (and refills) many slots instead of a few.
                now = time.monotonic()
                batch_until = batch_until or now + self.batch_wait
                if now < batch_until:
                    await runtime.wait(batch_until - now)
                    continue
            batch_until = None
            progress = self._progress_riders(extend)
            free = 0 if self._stopping else max(0, slots + self._ahead())
            floor = 0 if floor_again else self.priority.next_floor()
            pending = self._pending.take()
            if retry_due:
                pending.put_back(self._retry.take())
            self._settling = pending.leases()
            traced = (
                _tracing.claim_round(self.transport.queue, self.worker_id)
                if (self._traced and free)
                else None
            )
            started = self._round_started = time.monotonic()
            try:
                result = await self.transport.settle_and_claim(
                    self.worker_id,
                    self.visibility,
                    free,
                    ack=pending.ack,
                    nack=pending.nack,
                    extend=extend,
                    dead=pending.dead,
                    hold_dead=self.hold_group_on_dead_letter,
                    min_priority=floor,
                    publish=pending.publish,
                    results=pending.results,
                    errors=pending.errors,
                    progress=progress,
                )
            except PartialRound as partial:  # a shard did not answer: the rest was applied
                result = partial.round
            except PERMANENT as exc:
                log.error("worker %s: stopping: %s", self.worker_id, exc)
                raise
            except QueueError as exc:
                if traced is not None:
                    traced.failed(exc)
                self._progress_reached([], progress)
                self._pending.put_back(pending)
                self.stats.claim_errors += 1
                self._round_failures += 1
                self._not_before = time.monotonic() + ROUND_ERRORS.delay(
                    self._round_failures, self._rng.random
                )
                log.warning("worker %s: round trip failed: %s", self.worker_id, exc)
                continue
            finally:
                self._round_started = None
                self._settling = []
            self._round_failures = 0
            self.stats.rounds += 1
            took = time.monotonic() - started
            self._round_seconds = _mean(self._round_seconds, took)
            if free:
                self.stats.record_claim(took)
            self._settled(pending, result, extend)
            self._progress_reached(result.extended, progress)
            floor_again = floor > 0 and len(result.leases) < free
            idle = free > 0 and not result.leases and not floor_again and not result.forwarded
            settling = self._pending or self._retry
            if until_empty and idle and not self._running and not settling:
                return
            claimed_at = time.monotonic()
            if result.leases:
                self._last_work = claimed_at
            contexts = traced.received(result.leases) if traced and result.leases else None
            for index, lease in enumerate(result.leases):
                key = (lease.group_id, lease.seq)
                self._running[key] = lease
                self._waiting[id(lease)] = (key, claimed_at)
                job = self._jobs[key] = Job(lease)
                is_async = self._is_async
                if is_async:
                    job.on_cancel(functools.partial(runtime.cancel, key))
                job.on_progress(functools.partial(self._progressed.add, key))
                handler = in_job(job, self.handler, is_async)
                finish = self._finish if lease.keep is None else self._finish_kept
                if traced is not None and contexts is not None:
                    # In the lease's process span, its follow-ups checked within it.
                    handler = traced.handler(
                        handler, finish, lease, contexts[index], is_async_handler(handler)
                    )
                    finish = None
                runtime.start(handler, lease, key, self._on_done, finish, self._admit)

    async def _keep_leases(self, runtime: AsyncRuntime) -> None:
        """Beside the loop: every `heartbeat_interval` while handlers run (at once after a
        cancel in this process), ask whether their messages were cancelled or their leases
        lost, and tell them. And while a round trip is stuck (on a frozen or cut-off node,
        until the transport gives up on it and fails over), extend the leases that fall due,
        of running handlers and of the settlements in the stuck round, with requests of its
        own, so that they stay ahead of their deadline (and the settlements still hold when
        they apply)."""
        kept: dict[tuple[str, int], float] = {}
        next_check = time.monotonic() + self.heartbeat_interval
        wait = KEEPER_TICK
        while not await runtime.pause(wait):
            if not self._running:
                next_check = max(next_check, time.monotonic() + self.heartbeat_interval / 2)
            elif self._check_now or time.monotonic() >= next_check:
                self._check_now = False
                next_check = time.monotonic() + self.heartbeat_interval
                await self._check_running(runtime)
            wait = max(0.001, min(KEEPER_TICK, next_check - time.monotonic()))
            started = self._round_started
            if started is None or time.monotonic() - started < KEEPER_TICK:
                continue
            now = self.transport.clock()
            held = [*self._running.values(), *self._settling]
            due = [
                lease
                for lease in held
                if max(lease.expires_at, kept.get((lease.group_id, lease.seq), 0.0)) - now
                <= self.visibility * 2 / 3
            ]
            if not due:
                continue
            try:
                result = await self.transport.settle_and_claim(
                    self.worker_id, self.visibility, 0, extend=due
                )
            except PartialRound as partial:
                result = partial.round
            except QueueError as exc:
                log.warning("worker %s: keeping leases failed: %s", self.worker_id, exc)
                continue
            for lease in result.extended:
                kept[(lease.group_id, lease.seq)] = lease.expires_at
            self._kept.append(result)
            runtime.wake()

    async def _check_running(self, runtime: AsyncRuntime) -> None:
        """Ask (a read, no Raft entry) whether the running leases' messages were cancelled or
        their leases lost; tell their handlers at once (the keeper's thread or task), and the
        loop what to settle or drop."""
        running = list(self._running.values())  # (a copy: the loop changes it)
        try:
            check = await self.transport.check_leases(running)
        except QueueError as exc:
            log.warning("worker %s: looking for cancels failed: %s", self.worker_id, exc)
            return
        news = False
        for kind, found in (("cancelled", check.cancelled), ("lost", check.lost)):
            for lease, why in found:
                job = self._jobs.get((lease.group_id, lease.seq))
                if job is None or job.lease.token != lease.token:
                    continue  # settled since, or claimed again
                if job.tell_cancelled(why) or kind == "lost":
                    self._news.append((kind, lease, why))
                    news = True
        if news:
            runtime.wake()

    async def _worth_claiming(self, runtime: AsyncRuntime) -> bool:
        """Idle: is a claim worth a write? A read without a Raft round decides."""
        self.stats.probes += 1
        try:
            probe = await self.transport.probe(0)
        except PERMANENT:
            raise
        except QueueError as exc:
            log.warning("worker %s: probe failed: %s", self.worker_id, exc)
            return False
        if probe.next_tick is not None:
            self._next_tick = min(self._next_tick, probe.next_tick)
        self._next_due = probe.next_due
        return probe.claimable or (
            probe.next_due is not None and probe.next_due <= self.transport.clock()
        )

    async def _fire_schedules(self) -> None:
        """Publish the schedules' due ticks: at once when an idle probe says one is due,
        otherwise at most every SCHEDULE_CHECK seconds (a read; a write only if one is)."""
        now = self.transport.clock()
        if now < self._next_tick:
            return
        self._next_tick = now + SCHEDULE_CHECK
        try:
            self.stats.ticks += await self.transport.fire_schedules()
        except PERMANENT:
            raise
        except QueueError as exc:
            log.warning("worker %s: firing schedules failed: %s", self.worker_id, exc)

    def _next_wake(self, give_up_at: float | None, polling: bool) -> float:
        """How long to wait for a handler to finish: until the next heartbeat is due, the
        grace period ends, or (idle) the next poll."""
        now = time.monotonic()
        wait = self.heartbeat_interval
        if polling:
            quick = now - self._last_work < QUICK_POLL_FOR
            wait = min(wait, self.poll_interval, QUICK_POLL if quick else math.inf)
            if self._next_due is not None:
                # A lease, park or delay ends, or a rate-limited tenant gets its next token,
                # before the next poll: wake then, not a poll later.
                wait = min(wait, max(0.0, self._next_due - self.transport.clock()) + 0.001)
        if self._retry:
            wait = min(wait, max(0.0, self._retry_at - now))
        if give_up_at is not None:
            wait = min(wait, max(0.0, give_up_at - now) + 0.001)
        return wait

    # ---------------------------------------------------------------------------- handlers

    def _admit(self, key: tuple[str, int], lease: Lease) -> bool:
        """A slot is free for this lease's handler (on its thread, or the event loop): run it
        unless it was given back while it waited."""
        if self._waiting.pop(id(lease), None) is None:
            return False
        self._began[key] = time.monotonic()
        return True

    def _on_done(self, key: tuple[str, int], exc: BaseException | None, result: Any) -> None:
        # On a handler's thread (Worker) or the event loop (AsyncWorker).
        if result is SKIPPED:
            return  # given back before it started (the key may be claimed again since)
        began = self._began.pop(key, None)
        if began is not None:
            self._handler_seconds = _mean(self._handler_seconds, time.monotonic() - began)
        self._finished.append((key, exc, result))
        if self._runtime is not None:
            self._runtime.wake()

    def _ahead(self) -> int:
        """How many messages to claim ahead of the free slots: those the handlers are
        expected to finish during one round trip, at most `prefetch`. A handler running
        longer than the mean counts at its age so far: a slow one stops the prefetch at once."""
        cap = self._prefetch_cap()
        if not cap or self._handler_seconds is None or self._round_seconds is None:
            return 0
        seconds = self._handler_seconds
        began = list(self._began.values())  # (a copy: handlers' threads change it)
        if began:
            seconds = max(seconds, time.monotonic() - min(began))
        expected = self.concurrency * self._round_seconds / max(seconds, 1e-6)
        return min(cap, int(expected))

    def _prefetch_cap(self) -> int:
        """`prefetch` if given; else 4 x `concurrency` while the queue's tenants are on (as
        this client last learnt it: a claim that meets them turned on learns it, and the
        next round keeps to it), and while they are off 16 x `concurrency`, at most 256 (4 x
        `concurrency` if that is more)."""
        if self.prefetch is not None:
            return self.prefetch
        cap = PREFETCH_MULTIPLIER * self.concurrency
        if self.transport.router.tenants_on:
            return cap
        larger = PREFETCH_MULTIPLIER_TENANTS_OFF * self.concurrency
        return max(cap, min(larger, PREFETCH_TENANTS_OFF_MAX))

    def _give_back_waiting(self, everything: bool) -> None:
        """Give back the prefetched leases whose handler has not started within a third of
        `visibility` (all of them, when stopping): their groups are claimable again at once."""
        now = time.monotonic()
        if not self._waiting or (not everything and now < self._next_give_back):
            return
        self._next_give_back = now + KEEPER_TICK  # (a scan per handler that ends costs too much)
        too_old = now - self.visibility / 3
        # A copy made whole (dict.copy allocates nothing the garbage collector tracks while
        # it reads): `list(items())` allocates a tuple an entry, a collection it sets off may
        # run finalizers, switch threads, and a handler starting (`_admit`) then changes the
        # dict under it ("dictionary changed size during iteration" stopped a Worker).
        for ident, (key, claimed_at) in self._waiting.copy().items():
            if not everything and claimed_at > too_old:
                continue
            if self._waiting.pop(ident, None) is None:
                continue  # its handler just started
            lease = self._running.pop(key)
            self._jobs.pop(key, None)
            self._pending.nack.append((lease, 0.0))
            log.info(
                "worker %s: giving back prefetched group %s seq %s (not started)",
                self.worker_id,
                lease.group_id,
                lease.seq,
                extra=_fields(lease, self.worker_id),
            )

    def _collect(self) -> None:
        """Turn finished handlers into what the next round trip settles, and take in what
        the lease keeper's extensions and checks found."""
        while self._kept:
            kept = self._kept.popleft()
            self._took_in_extensions(kept.extended, kept.lost)
        while self._news:
            self._take_news(*self._news.popleft())
        later: list[tuple[tuple[str, int], BaseException | None, Any]] = []
        room: _FollowUpRoom | None = None
        while self._finished:
            key, exc, result = self._finished.popleft()
            if key not in self._running:
                continue  # given back at shutdown while its handler ran, or its lease lost
            if isinstance(result, Result):  # (not checked where it ran: nothing else was)
                result = self._returned(False, result)
            follow_ups, value = None, None
            if isinstance(result, _Returned):  # checked where it ran
                follow_ups, value, exc = result.follow_ups, result.result, result.error
                if follow_ups is not None:
                    room = room or _FollowUpRoom(self._pending, self._retry)
                    if not room.take(follow_ups):
                        later.append((key, exc, result))  # in the next round
                        continue
            lease = self._running.pop(key)
            job = self._jobs.pop(key, None)
            if job is not None and job.cancelled:
                # However it ended, the message settles as cancelled (its record in the
                # queue says so), with what the handler returned; nothing is published.
                self._pending.ack.append(lease)
                if value is not None:
                    self._pending.results.append((lease, value))
                log.info(
                    "worker %s: group %s seq %s settled as cancelled: %s",
                    self.worker_id,
                    lease.group_id,
                    lease.seq,
                    job.cancel_reason,
                    extra=_fields(lease, self.worker_id),
                )
                continue
            verdict = self.policy.verdict(lease, exc, self._rng.random)
            if verdict.kind == "ack":
                self._pending.ack.append(lease)
                if follow_ups:
                    self._pending.publish.append((lease, follow_ups))
                if value is not None:
                    self._pending.results.append((lease, value))
                continue
            if verdict.kind == "nack":
                self._pending.nack.append((lease, verdict.delay))
            else:
                self._pending.dead.append((lease, verdict.reason))
            if lease.keep is not None and exc is not None and not isinstance(exc, Park):
                self._pending.errors.append((lease, error_of(exc, lease.attempts)))
            _log_failure(lease, exc, verdict, self.worker_id)
        self._finished.extend(later)

    def _take_news(self, kind: str, lease: Lease, why: str) -> None:
        """What the lease keeper's check found of a lease (its handler was told already): a
        cancelled message whose handler has not started settles now, without running it; a
        lease lost is dropped (its handler's work will be refused)."""
        key = (lease.group_id, lease.seq)
        running = self._running.get(key)
        if running is None or running.token != lease.token:
            return  # settled (or given back) since
        # Not started yet: popped here, it never starts (`_admit` pops it first otherwise).
        ident = next((i for i, (k, _) in self._waiting.copy().items() if k == key), None)
        waiting = ident is not None and self._waiting.pop(ident, None) is not None
        if kind == "cancelled":
            self.stats.cancelled += 1
            log.info(
                "worker %s: group %s seq %s cancelled while %s: %s",
                self.worker_id,
                lease.group_id,
                lease.seq,
                "waiting for a slot" if waiting else "its handler runs",
                why,
                extra=_fields(lease, self.worker_id),
            )
            if waiting:
                self._running.pop(key)
                self._jobs.pop(key, None)
                self._pending.ack.append(running)  # (settled as cancelled, not handled)
            return
        self._running.pop(key)
        self._jobs.pop(key, None)
        self.stats.leases_lost += 1
        log.warning(
            "lease lost while %s: group %s seq %s: %s",
            "waiting for a slot" if waiting else "running",
            lease.group_id,
            lease.seq,
            why,
            extra=_fields(lease, self.worker_id),
        )

    def _returned(self, keeps: bool, value: Any) -> Any:
        """What a handler returned, checked where it ran (its thread or its task, beside the
        round trip in flight): its follow-ups (a `Result`'s, or the value itself with
        `follow_ups=True`) and its result (a `Result`'s value, or the value itself, for a
        message that `keeps` its outcome). A bad one fails its own message only, and they
        are not checked again when the round is sent."""
        if isinstance(value, Result):
            follow, result = value.publish, value.value
        elif self.follow_ups:
            follow, result = value, None
        elif keeps:
            follow, result = None, value
        else:
            return None  # ignored
        none = follow is None or (isinstance(follow, tuple | list) and not follow)
        returned = _Returned(None, None) if none else self._check_follow_ups(follow)
        if returned.error is not None or not keeps or result is None:
            return returned
        try:
            checked = self.transport.check_result(result)
        except InvalidArgument as bad:
            return _Returned(None, InvalidArgument(f"the handler's result cannot be kept: {bad}"))
        return _Returned(returned.follow_ups, None, checked)

    def _check_follow_ups(self, result: Any) -> _Returned:
        """A handler's follow-ups, checked and encoded."""
        if result is None:
            return _Returned(None, None)
        given = result
        if isinstance(result, Iterable) and not isinstance(result, str | bytes | Mapping):
            try:
                given = list(result)
            except Exception as exc:  # the handler's own generator failed
                return _Returned(None, exc)
        try:
            checked = self.transport.check_publish_many(given)  # refuses a str, a mapping...
        except InvalidArgument as bad:
            return _Returned(None, InvalidArgument(f"the handler returned bad follow-ups: {bad}"))
        return _Returned(checked if len(checked) else None, None)

    def _give_back_running(self) -> None:
        """The grace period is over: give back what still runs (it can be claimed again now),
        and tell the handlers (a sync one may stop early; an async one's task is cancelled)."""
        for key, lease in self._running.items():
            job = self._jobs.get(key)
            if job is not None:
                job.tell_cancelled("the worker stopped: its message was given back")
            self._pending.nack.append((lease, 0.0))
            log.warning(
                "shutdown: giving back group %s seq %s",
                lease.group_id,
                lease.seq,
                extra=_fields(lease, self.worker_id),
            )
        self._running.clear()
        self._jobs.clear()

    def _drop_unsent(self) -> None:
        """Stopping, the grace period over, and settlements still not applied (the cluster,
        or a shard, does not answer): they are dropped; their leases lapse and the messages
        are delivered again (nothing is lost)."""
        dropped = [*self._pending.leases(), *self._retry.leases()]
        self._pending, self._retry = _Pending(), _Pending()
        log.warning(
            "worker %s: stopping with %d settlements not applied (no answer): their leases "
            "lapse and their messages come back",
            self.worker_id,
            len(dropped),
        )

    def _took_in_extensions(self, extended: Sequence[Lease], lost: Sequence[Lease]) -> None:
        """Extensions that applied move a running lease's deadline on (never back: the
        keeper's may be later than a stuck round's); an extension found lost means the lease
        was taken over: its handler's result will be dropped when it finishes."""
        self.stats.extended += len(extended)
        for lease in extended:
            key = (lease.group_id, lease.seq)
            running = self._running.get(key)
            if running is not None and lease.expires_at > running.expires_at:
                self._running[key] = lease
        for lease in lost:
            key = (lease.group_id, lease.seq)
            if self._running.pop(key, None) is not None:
                job = self._jobs.pop(key, None)
                if job is not None:
                    job.tell_cancelled("lease lost: its extension found another holder")
                self.stats.leases_lost += 1
                log.warning(
                    "lease lost while running: group %s seq %s",
                    lease.group_id,
                    lease.seq,
                    extra=_fields(lease, self.worker_id),
                )

    def _due_heartbeats(self) -> list[Lease]:
        now = self.transport.clock()
        return [
            lease for lease in self._running.values() if heartbeat_due(lease, now, self.visibility)
        ]

    def _progress_riders(self, extend: list[Lease]) -> list[tuple[Lease, str]]:
        """The progress the round about to go carries: each lease's latest, for the leases it
        extends, and for the other running ones whose progress last reached the queue a
        `heartbeat_interval` ago or more (extended with it: the round is sent anyway)."""
        progress: list[tuple[Lease, str]] = []
        if not self._progressed:
            return progress  # (the common case: no handler reports any)
        extending = {(held.group_id, held.seq) for held in extend}
        quiet_since = time.monotonic() - self.heartbeat_interval
        for key in list(self._progressed):  # (a copy: handlers' threads add to it)
            self._progressed.discard(key)  # (before the read: a report after it adds it back)
            job, lease = self._jobs.get(key), self._running.get(key)
            text = None if job is None else job.progress_to_send()
            if job is None or lease is None or text is None:
                continue  # finished, or nothing new
            if key not in extending:
                if job.sent_at > quiet_since:
                    self._progressed.add(key)  # sent lately: for a later round
                    continue
                extend.append(lease)
            progress.append((lease, text))
        return progress

    def _progress_reached(self, extended: Sequence[Lease], sent: list[tuple[Lease, str]]) -> None:
        """The progress carried by the extensions that applied reached the queue; the rest is
        sent again with a later round (if its lease still runs here)."""
        if not sent:
            return
        applied = {(lease.group_id, lease.seq, lease.token) for lease in extended}
        now = time.monotonic()
        for lease, text in sent:
            key = (lease.group_id, lease.seq)
            job = self._jobs.get(key)
            if job is None:
                continue
            if (*key, lease.token) in applied:
                job.progress_sent(text, now)
                self.stats.progress += 1
            else:
                self._progressed.add(key)

    def _settled(self, pending: _Pending, result: Round, extend: list[Lease]) -> None:
        if result.unsettled:  # a shard did not answer: sent again with a backoff of its own
            again = {id(lease) for lease in result.unsettled}
            pending, retry = _split_pending(pending, again)
            self._retry.put_back(retry)
            self._retry_failures += 1
            self._retry_at = time.monotonic() + ROUND_ERRORS.delay(
                self._retry_failures, self._rng.random
            )
            if time.monotonic() - self._waiting_since > WAIT_LOG_EVERY:
                self._waiting_since = time.monotonic()
                log.warning(
                    "worker %s: %d settlements wait for their shard",
                    self.worker_id,
                    len(result.unsettled),
                )
        elif not self._retry:
            self._retry_failures = 0
        lost = {id(lease) for lease in result.lost}
        extending = {id(lease) for lease in extend}
        for lease in result.lost:
            if id(lease) in extending:
                continue  # counted by _took_in_extensions
            self.stats.leases_lost += 1
            log.warning(
                "lease lost, result dropped: group %s seq %s",
                lease.group_id,
                lease.seq,
                extra=_fields(lease, self.worker_id),
            )
        self.stats.claimed += len(result.leases)
        self.stats.acked += sum(id(lease) not in lost for lease in pending.ack)
        self.stats.nacked += sum(id(lease) not in lost for lease, _ in pending.nack)
        self.stats.dead_lettered += sum(id(lease) not in lost for lease, _ in pending.dead)
        self.stats.published += sum(
            len(items) for lease, items in pending.publish if id(lease) not in lost
        )
        self.stats.results += sum(id(lease) not in lost for lease, _ in pending.results)
        self.stats.forwarded += result.forwarded
        self._took_in_extensions(result.extended, [lease for lease in extend if id(lease) in lost])


def _mean(mean: float | None, value: float) -> float:
    return value if mean is None else mean + EWMA * (value - mean)


def _split_pending(pending: _Pending, again: set[int]) -> tuple[_Pending, _Pending]:
    """(the settlements that were applied, those of leases in `again`)."""
    done, retry = _Pending(), _Pending()
    for lease in pending.ack:
        (retry if id(lease) in again else done).ack.append(lease)
    for nack in pending.nack:
        (retry if id(nack[0]) in again else done).nack.append(nack)
    for dead in pending.dead:
        (retry if id(dead[0]) in again else done).dead.append(dead)
    for publish in pending.publish:
        (retry if id(publish[0]) in again else done).publish.append(publish)
    for result in pending.results:
        (retry if id(result[0]) in again else done).results.append(result)
    for error in pending.errors:
        (retry if id(error[0]) in again else done).errors.append(error)
    return done, retry


def _fields(lease: Lease, worker_id: str) -> dict[str, Any]:
    return {
        "group_id": lease.group_id,
        "seq": lease.seq,
        "attempts": lease.attempts,
        "worker_id": worker_id,
    }


def _log_failure(lease: Lease, exc: BaseException | None, verdict: Verdict, worker: str) -> None:
    extra = _fields(lease, worker)
    if verdict.kind == "dead":
        log.error(
            "dead-lettered group %s seq %s after %s attempts: %s",
            lease.group_id,
            lease.seq,
            lease.attempts,
            verdict.reason,
            exc_info=exc,
            extra=extra,
        )
    else:
        log.warning(
            "handler failed for group %s seq %s (attempt %s), retrying in %.2fs: %s",
            lease.group_id,
            lease.seq,
            lease.attempts,
            verdict.delay,
            verdict.reason,
            exc_info=exc,
            extra=extra,
        )
