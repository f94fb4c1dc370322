"""The worker runtime: claims in batches, runs a handler per message with heartbeats, retries
with backoff, dead-letters after `max_attempts`, stops gracefully. This file is the source;
`_sync/worker.py` (threads) is generated from it by `scripts/gen_sync.py`; what threads and
asyncio do differently lives in `_runtime.py`, the decisions in `worker_policy.py`."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._runtime import AsyncRuntime
from ..errors import InvalidArgument, LeaseLost, QueueError
from ..lease import Lease
from ..worker_policy import Backoff, IdlePoll, PriorityShare, failure_reason, heartbeat_due
from .transport import AsyncTransport

log = logging.getLogger("rqlite_queue.worker")

# Upper bounds (seconds) of the claim-latency histogram.
CLAIM_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


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
    claim_seconds: float = 0.0
    """Total time spent in claim calls (divide by claim rounds for the mean latency)."""
    claim_rounds: int = 0
    claim_buckets: list[int] = field(default_factory=lambda: [0] * len(CLAIM_BUCKETS))
    """Claim rounds that took at most each of `CLAIM_BUCKETS` seconds (cumulative)."""

    def record_claim(self, seconds: float) -> None:
        self.claim_rounds += 1
        self.claim_seconds += seconds
        for i, bound in enumerate(CLAIM_BUCKETS):
            if seconds <= bound:
                self.claim_buckets[i] += 1


class AsyncWorker:
    """Runs `handler(lease)` for each message, `concurrency` at a time.

    - Claims as many messages as there are free slots, in one round trip (`claim_many`);
      an empty claim backs off (`idle_poll`), never a busy spin.
    - A handler running longer than a third of `visibility` has its lease extended.
    - A handler that raises: the message is nacked with `backoff` (its group parked, order
      kept) until it has been tried `max_attempts` times, then dead-lettered with the
      exception type and message.
    - On `LeaseLost` (the lease lapsed and another worker took the group) the result is
      dropped and logged.
    - `stop()` (or SIGINT/SIGTERM while `run` runs in the main thread): stop claiming, let
      handlers finish within `grace` seconds, nack the rest. Nothing is lost."""

    def __init__(
        self,
        transport: AsyncTransport,
        handler: Callable[[Lease], Any],
        *,
        concurrency: int = 4,
        visibility: float = 30.0,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        worker_id: str | None = None,
        priority_share: float = 0.0,
        priority_floor: int = 3,
        idle_poll: IdlePoll | None = None,
        grace: float = 30.0,
        heartbeat_interval: float | None = None,
    ) -> None:
        if concurrency < 1:
            raise InvalidArgument("concurrency must be >= 1")
        if visibility <= 0:
            raise InvalidArgument("visibility must be > 0")
        if max_attempts < 1:
            raise InvalidArgument("max_attempts must be >= 1")
        self.transport = transport
        self.handler = handler
        self.concurrency = concurrency
        self.visibility = visibility
        self.max_attempts = max_attempts
        self.backoff = backoff or Backoff()
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.priority = PriorityShare(priority_share, priority_floor)
        self.idle_poll = idle_poll or IdlePoll()
        self.grace = grace
        self.heartbeat_interval = heartbeat_interval or max(0.05, visibility / 6)
        self.stats = WorkerStats()
        self._running: dict[tuple[str, int], Lease] = {}
        self._lock = threading.Lock()
        self._stopping = False
        self._rng = random.Random()
        self._runtime: AsyncRuntime | None = None

    # ----------------------------------------------------------------------------- control

    def stop(self) -> None:
        """Ask `run` to stop claiming and wind down (thread-safe)."""
        self._stopping = True
        if self._runtime is not None:
            self._runtime.wake()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    async def run(self, *, handle_signals: bool = True) -> None:
        """Work until `stop()` (or SIGINT/SIGTERM); then wind down gracefully."""
        runtime = self._runtime = AsyncRuntime(self.concurrency)
        self._stopping = False
        if handle_signals:
            runtime.install_signals(self._on_signal)
        log.info("worker %s started (concurrency %d)", self.worker_id, self.concurrency)
        try:
            runtime.spawn(self._heartbeats, runtime)
            await self._claim_loop(runtime)
            await self._wind_down(runtime)
        finally:
            self._stopping = True
            runtime.wake()
            if handle_signals:
                runtime.remove_signals()
        log.info("worker %s stopped: %s", self.worker_id, self.stats)

    def _on_signal(self) -> None:
        log.info("worker %s: signal received, stopping", self.worker_id)
        self.stop()

    # ------------------------------------------------------------------------------- loops

    async def _claim_loop(self, runtime: AsyncRuntime) -> None:
        while not self._stopping:
            free = self.concurrency - len(self._running)
            if free <= 0:
                await runtime.sleep(self.heartbeat_interval)  # woken when a handler ends
                continue
            leases = await self._claim(free)
            if not leases:
                await runtime.sleep(self.idle_poll.empty())
                continue
            self.idle_poll.found()
            for lease in leases:
                with self._lock:
                    self._running[(lease.group_id, lease.seq)] = lease
                runtime.spawn(self._handle, runtime, lease)

    async def _claim(self, n: int) -> list[Lease]:
        floor = self.priority.next_floor()
        started = time.monotonic()
        try:
            leases = await self.transport.claim_many(self.worker_id, self.visibility, n, floor)
            if not leases and floor > 0:
                leases = await self.transport.claim_many(self.worker_id, self.visibility, n, 0)
        except QueueError as exc:
            self.stats.claim_errors += 1
            log.warning("worker %s: claim failed: %s", self.worker_id, exc)
            return []
        finally:
            self.stats.record_claim(time.monotonic() - started)
        self.stats.claimed += len(leases)
        return leases

    async def _handle(self, runtime: AsyncRuntime, lease: Lease) -> None:
        context = {"group": lease.group_id, "seq": lease.seq, "attempts": lease.attempts}
        try:
            try:
                await runtime.call(self.handler, lease)
            except Exception as exc:
                await self._failed(lease, exc, context)
            else:
                await self._finish(lease, context)
        except LeaseLost:
            self.stats.leases_lost += 1
            log.warning("lease lost, result dropped: group %(group)s seq %(seq)s", context)
        except QueueError as exc:
            # The backend stayed unreachable past the transport's deadline: the lease will
            # lapse and the message come back (at least once).
            log.error("could not finish group %s seq %s: %s", lease.group_id, lease.seq, exc)
        finally:
            with self._lock:
                self._running.pop((lease.group_id, lease.seq), None)
            runtime.wake()

    async def _finish(self, lease: Lease, context: dict[str, Any]) -> None:
        current = self._current(lease)
        if current is None:
            return  # nacked at shutdown while the handler ran
        await self.transport.ack(current)
        self.stats.acked += 1
        log.debug("acked group %(group)s seq %(seq)s", context)

    async def _failed(self, lease: Lease, exc: Exception, context: dict[str, Any]) -> None:
        current = self._current(lease)
        if current is None:
            return
        if lease.attempts >= self.max_attempts:
            reason = failure_reason(exc)
            await self.transport.dead_letter(current, reason)
            self.stats.dead_lettered += 1
            log.error(
                "dead-lettered group %(group)s seq %(seq)s after %(attempts)s attempts: %(r)s",
                {**context, "r": reason},
            )
            return
        delay = self.backoff.delay(lease.attempts, self._rng)
        await self.transport.nack(current, delay)
        self.stats.nacked += 1
        log.warning(
            "handler failed for group %(group)s seq %(seq)s (attempt %(attempts)s), "
            "retrying in %(delay).2fs: %(exc)s",
            {**context, "delay": delay, "exc": failure_reason(exc)},
        )

    def _current(self, lease: Lease) -> Lease | None:
        """The lease as last extended (its token never changes), or None once released."""
        with self._lock:
            return self._running.get((lease.group_id, lease.seq))

    async def _heartbeats(self, runtime: AsyncRuntime) -> None:
        while not self._stopping or self._running:
            now = self.transport.clock()
            with self._lock:
                due = [
                    lease
                    for lease in self._running.values()
                    if heartbeat_due(lease, now, self.visibility)
                ]
            for lease in due:
                try:
                    extended = await self.transport.extend(lease, self.visibility)
                except LeaseLost:
                    log.warning(
                        "heartbeat: lease lost for group %s seq %s", lease.group_id, lease.seq
                    )
                    continue
                except QueueError as exc:
                    log.warning("heartbeat failed for group %s: %s", lease.group_id, exc)
                    continue
                self.stats.extended += 1
                with self._lock:
                    key = (lease.group_id, lease.seq)
                    if key in self._running:
                        self._running[key] = extended
            await runtime.sleep(self.heartbeat_interval)

    async def _wind_down(self, runtime: AsyncRuntime) -> None:
        """Let running handlers finish within the grace period; nack what is left."""
        if self._running:
            log.info("worker %s: waiting up to %.1fs for %d handlers", self.worker_id,
                     self.grace, len(self._running))  # fmt: skip
        finished = await runtime.wait_all(self.grace)
        if finished:
            return
        with self._lock:
            leftover = list(self._running.values())
            self._running.clear()
        for lease in leftover:
            try:
                await self.transport.nack(lease, 0)
                self.stats.nacked += 1
                log.warning("shutdown: nacked group %s seq %s", lease.group_id, lease.seq)
            except QueueError as exc:
                log.error(
                    "shutdown: could not nack group %s: %s (it will lapse)", lease.group_id, exc
                )
        runtime.cancel_all()
