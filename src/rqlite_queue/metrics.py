"""Prometheus metrics for a running worker (needs the `metrics` extra: prometheus-client).

    from rqlite_queue.metrics import serve_metrics

    worker = Worker(queue, handle)
    server = serve_metrics(worker, 9100)   # http://0.0.0.0:9100/metrics
    worker.run()
    server.stop()

Everything is read when Prometheus scrapes: the worker's counters from `worker.stats`, the
queue's depth from `transport.stats()` (at most once per `stats_interval` seconds; one
linearizable read on rqlite). Every metric has a `queue` label:

| metric | type | from |
| --- | --- | --- |
| `rqlite_queue_worker_claimed_total` | counter | messages claimed |
| `rqlite_queue_worker_acked_total` | counter | messages acked |
| `rqlite_queue_worker_nacked_total` | counter | messages nacked (retries, and at shutdown) |
| `rqlite_queue_worker_dead_lettered_total` | counter | messages dead-lettered |
| `rqlite_queue_worker_leases_lost_total` | counter | results dropped: the lease was taken over |
| `rqlite_queue_worker_extended_total` | counter | lease extensions (heartbeats) |
| `rqlite_queue_worker_claim_errors_total` | counter | round trips that failed (resent later) |
| `rqlite_queue_worker_rounds_total` | counter | round trips (one write: settle and claim) |
| `rqlite_queue_worker_probes_total` | counter | reads made while idle, instead of a write |
| `rqlite_queue_worker_ticks_total` | counter | messages published for due schedules |
| `rqlite_queue_worker_published_total` | counter | follow-ups published with the worker's acks |
| `rqlite_queue_worker_forwarded_total` | counter | sharded: follow-ups forwarded from an outbox |
| `rqlite_queue_worker_results_total` | counter | handlers' return values kept as results |
| `rqlite_queue_worker_cancelled_total` | counter | handlers told their message was cancelled |
| `rqlite_queue_worker_progress_total` | counter | progress values that reached the queue |
| `rqlite_queue_worker_claim_seconds` | histogram | time per round trip that claimed |
| `rqlite_queue_worker_in_flight` | gauge | handlers running now |
| `rqlite_queue_transport_resent_total` | counter | batches resent after an unknown outcome |
| `rqlite_queue_depth{priority}` | gauge | messages waiting or in flight, per group priority |
| `rqlite_queue_groups`, `..._in_flight_groups`, `..._parked_groups` | gauge | groups |
| `rqlite_queue_dead_letters` | gauge | messages in the dead-letter table |
| `rqlite_queue_oldest_age_seconds` | gauge | age of the oldest queued message |
| `rqlite_queue_priority_oldest_age_seconds{priority}` | gauge | ...per group priority (0: none) |
| `rqlite_queue_paused` | gauge | 1 while the queue is paused, else 0 |
| `rqlite_queue_held_groups` | gauge | groups held (never claimed until released) |
| `rqlite_queue_delayed_groups` | gauge | groups whose head is a delayed message not due yet |
| `rqlite_queue_outcomes` | gauge | outcomes of settled messages kept for `result()` |
| `rqlite_queue_open_batches` | gauge | batches not done yet (open or closed) |
| `rqlite_queue_stats_errors_total` | counter | scrapes whose `stats()` call failed |
| `rqlite_queue_shard_up{shard}` | gauge | sharded: 1 while the shard answers, else 0 |
| `rqlite_queue_shard_depth{shard}` | gauge | sharded: messages on each shard that answered |
| `rqlite_queue_outbox` | gauge | sharded: follow-ups waiting in the shards' outboxes |
| `rqlite_queue_tenant_depth{tenant}` | gauge | tenants on: messages of the deepest tenants |
| `rqlite_queue_tenant_in_flight{tenant}` | gauge | tenants on: their leases in flight |
| `rqlite_queue_tenant_weight{tenant}` | gauge | tenants on: their weights |
| `rqlite_queue_tenants` | gauge | tenants on: how many `tenants()` lists (at most 1 000) |

Tenants are labels only for the deepest 50 (`MAX_TENANT_LABELS`; the default tenant is ''),
so the series stay bounded however many tenants a queue has; `rqlite_queue_tenants` says how
many there are. A queue whose tenants are not on has none of these samples.

The claim-latency histogram's buckets are `rqlite_queue.worker.CLAIM_BUCKETS`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from . import AsyncTransport
from .types import Stats, TenantInfo
from .worker import CLAIM_BUCKETS, AsyncWorker, Worker

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector, CollectorRegistry

__all__ = ["MetricsServer", "WorkerCollector", "serve_metrics"]

log = logging.getLogger("rqlite_queue.metrics")

PREFIX = "rqlite_queue"
PRIORITIES = range(5)
MAX_TENANT_LABELS = 50
"""The tenants that get series of their own: the deepest this many (bounded cardinality)."""
TENANTS_READ = 1000


def _require_prometheus() -> None:
    """prometheus-client is imported lazily (where it is used), so that this module imports
    without it; this turns its absence into a clear error up front."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "rqlite_queue.metrics needs prometheus-client: pip install 'rqlite-queue[metrics]'"
        ) from exc


class WorkerCollector:
    """A Prometheus collector for one `Worker` or `AsyncWorker` and its queue.

    Register it in any registry (`registry.register(WorkerCollector(worker))`), or use
    `serve_metrics`. The queue's stats are fetched during a scrape, at most once per
    `stats_interval` seconds (0: on every scrape), with `stats_interval=None` never. For an
    `AsyncWorker` they are fetched on its event loop (`loop`, by default the loop running when
    the collector is made), waiting at most `stats_timeout` seconds."""

    def __init__(
        self,
        worker: Worker | AsyncWorker,
        *,
        stats_interval: float | None = 5.0,
        stats_timeout: float = 5.0,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        _require_prometheus()
        self.worker = worker
        self.stats_interval = stats_interval
        self.stats_timeout = stats_timeout
        self.stats_errors = 0
        self._loop = loop
        needs_loop = isinstance(worker.transport, AsyncTransport) and stats_interval is not None
        if needs_loop and loop is None:
            try:
                self._loop = asyncio.get_running_loop()
            except RuntimeError:
                raise RuntimeError(
                    "WorkerCollector for an AsyncWorker: create it inside the worker's "
                    "event loop, or pass loop="
                ) from None
        self._lock = threading.Lock()
        self._stats: Stats | None = None
        self._tenants: list[TenantInfo] = []
        self._stats_at = -float("inf")

    @property
    def queue(self) -> str:
        return self.worker.transport.queue

    # ----------------------------------------------------------------------- queue stats

    def queue_stats(self) -> Stats | None:
        """The queue's stats, cached for `stats_interval` seconds; None if unavailable."""
        if self.stats_interval is None:
            return None
        with self._lock:
            now = time.monotonic()
            if self._stats is not None and now - self._stats_at < self.stats_interval:
                return self._stats
            try:
                self._stats = self._fetch(lambda transport: transport.stats())
                self._tenants = (
                    self._fetch(lambda transport: transport.tenants(limit=TENANTS_READ))
                    if self._stats.tenants_on
                    else []
                )
                self._stats_at = now
            except Exception as exc:  # a failed stats call must not fail the scrape
                self.stats_errors += 1
                self._stats = None
                self._tenants = []
                log.warning("metrics: queue stats unavailable: %s", exc)
            return self._stats

    def _fetch(self, call: Callable[[Any], Any]) -> Any:
        """`call(transport)`, on the worker's event loop for an `AsyncWorker`."""
        transport = self.worker.transport
        if isinstance(transport, AsyncTransport):
            loop = self._loop
            if loop is None or loop.is_closed() or not loop.is_running():
                raise RuntimeError("the worker's event loop is not running")
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                raise RuntimeError("cannot wait for stats on the event loop's own thread")
            future = asyncio.run_coroutine_threadsafe(call(transport), loop)
            try:
                return future.result(self.stats_timeout)
            except TimeoutError:
                future.cancel()
                raise
        return call(transport)

    # ----------------------------------------------------------------------- collector

    def describe(self) -> Iterator[Metric]:
        """The metric names, without asking the queue (so registering costs nothing)."""
        yield from self._families(with_samples=False)

    def collect(self) -> Iterator[Metric]:
        yield from self._families(with_samples=True)

    def _families(self, *, with_samples: bool) -> Iterator[Metric]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        queue = [self.queue]
        stats = self.worker.stats
        counters = (
            ("claimed", "Messages claimed by this worker.", stats.claimed),
            ("acked", "Messages acked by this worker.", stats.acked),
            ("nacked", "Messages nacked (retried later, or at shutdown).", stats.nacked),
            ("dead_lettered", "Messages moved to the dead-letter table.", stats.dead_lettered),
            ("leases_lost", "Results dropped: the lease was taken over.", stats.leases_lost),
            ("extended", "Lease extensions (heartbeats).", stats.extended),
            (
                "claim_errors",
                "Round trips that failed (their settlements are resent).",
                stats.claim_errors,
            ),
            (
                "rounds",
                "Round trips: one write each, settling and claiming together.",
                stats.rounds,
            ),
            ("probes", "Reads made while idle, instead of a write.", stats.probes),
            ("ticks", "Messages published for due schedules.", stats.ticks),
            ("published", "Follow-ups published with this worker's acks.", stats.published),
            (
                "forwarded",
                "Follow-ups forwarded from a shard's outbox to their shard.",
                stats.forwarded,
            ),
            ("results", "Handlers' return values kept as their message's result.", stats.results),
            (
                "cancelled",
                "Handlers told that their message was cancelled (or settled unstarted).",
                stats.cancelled,
            ),
            ("progress", "Progress values that reached the queue.", stats.progress),
        )
        for name, text, value in counters:
            metric = CounterMetricFamily(f"{PREFIX}_worker_{name}", text, labels=["queue"])
            if with_samples:
                metric.add_metric(queue, value)
            yield metric
        histogram = HistogramMetricFamily(
            f"{PREFIX}_worker_claim_seconds",
            "Time per round trip that claimed (settling what finished, in the same write).",
            labels=["queue"],
        )
        if with_samples:
            buckets = [
                (f"{bound:g}", float(count))
                for bound, count in zip(CLAIM_BUCKETS, stats.claim_buckets, strict=True)
            ]
            buckets.append(("+Inf", float(stats.claim_rounds)))
            histogram.add_metric(queue, buckets=buckets, sum_value=stats.claim_seconds)
        yield histogram
        in_flight = GaugeMetricFamily(
            f"{PREFIX}_worker_in_flight", "Handlers running now.", labels=["queue"]
        )
        if with_samples:
            in_flight.add_metric(queue, self.worker.in_flight)
        yield in_flight
        resent = CounterMetricFamily(
            f"{PREFIX}_transport_resent",
            "Batches sent again after an unknown outcome (a lost reply).",
            labels=["queue"],
        )
        if with_samples:
            resent.add_metric(queue, self.worker.transport.resent)
        yield resent
        yield from self._queue_families(with_samples)

    def _queue_families(self, with_samples: bool) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snapshot = self.queue_stats() if with_samples else None
        queue = [self.queue]
        errors = CounterMetricFamily(
            f"{PREFIX}_stats_errors", "Scrapes whose queue stats call failed.", labels=["queue"]
        )
        if with_samples:
            errors.add_metric(queue, self.stats_errors)
        yield errors
        if self.stats_interval is None:
            return
        depth = GaugeMetricFamily(
            f"{PREFIX}_depth",
            "Messages waiting or in flight, by group priority.",
            labels=["queue", "priority"],
        )
        groups = GaugeMetricFamily(f"{PREFIX}_groups", "Groups with messages.", labels=["queue"])
        leased = GaugeMetricFamily(
            f"{PREFIX}_in_flight_groups", "Groups whose head is leased.", labels=["queue"]
        )
        parked = GaugeMetricFamily(
            f"{PREFIX}_parked_groups", "Groups parked by a nack.", labels=["queue"]
        )
        dead = GaugeMetricFamily(
            f"{PREFIX}_dead_letters", "Messages in the dead-letter table.", labels=["queue"]
        )
        oldest = GaugeMetricFamily(
            f"{PREFIX}_oldest_age_seconds", "Age of the oldest queued message.", labels=["queue"]
        )
        oldest_by_priority = GaugeMetricFamily(
            f"{PREFIX}_priority_oldest_age_seconds",
            "Age of the oldest queued message of each group priority (0: none queued).",
            labels=["queue", "priority"],
        )
        paused = GaugeMetricFamily(
            f"{PREFIX}_paused",
            "1 while the queue is paused (claims take nothing).",
            labels=["queue"],
        )
        held = GaugeMetricFamily(
            f"{PREFIX}_held_groups", "Groups held (never claimed until released).", labels=["queue"]
        )
        delayed = GaugeMetricFamily(
            f"{PREFIX}_delayed_groups",
            "Groups whose head is a delayed message not due yet.",
            labels=["queue"],
        )
        outcomes = GaugeMetricFamily(
            f"{PREFIX}_outcomes",
            "Outcomes of settled messages kept for result() (publish keep=).",
            labels=["queue"],
        )
        open_batches = GaugeMetricFamily(
            f"{PREFIX}_open_batches",
            "Batches not done yet (some of their messages are not settled).",
            labels=["queue"],
        )
        if snapshot is not None:
            for priority in PRIORITIES:
                depth.add_metric([*queue, str(priority)], snapshot.by_priority.get(priority, 0))
            groups.add_metric(queue, snapshot.groups)
            leased.add_metric(queue, snapshot.in_flight)
            parked.add_metric(queue, snapshot.parked)
            dead.add_metric(queue, snapshot.dead)
            oldest.add_metric(queue, snapshot.oldest_age or 0.0)
            for priority in PRIORITIES:
                age = snapshot.oldest_by_priority.get(priority, 0.0)
                oldest_by_priority.add_metric([*queue, str(priority)], age)
            paused.add_metric(queue, 1 if snapshot.paused else 0)
            held.add_metric(queue, snapshot.held)
            delayed.add_metric(queue, snapshot.delayed_groups)
            outcomes.add_metric(queue, snapshot.outcomes)
            open_batches.add_metric(queue, snapshot.open_batches)
        yield from (depth, groups, leased, parked, dead, oldest, oldest_by_priority)
        yield from (paused, held, delayed, outcomes, open_batches)
        yield from self._tenant_families(snapshot)
        yield from self._shard_families(snapshot, with_samples)

    def _tenant_families(self, snapshot: Stats | None) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        labels = ["queue", "tenant"]
        count = GaugeMetricFamily(
            f"{PREFIX}_tenants", "Tenants (once on; at most 1 000 read).", labels=["queue"]
        )
        depth = GaugeMetricFamily(
            f"{PREFIX}_tenant_depth", "Messages of the deepest tenants.", labels=labels
        )
        in_flight = GaugeMetricFamily(
            f"{PREFIX}_tenant_in_flight", "Leases in flight of the deepest tenants.", labels=labels
        )
        weight = GaugeMetricFamily(
            f"{PREFIX}_tenant_weight", "Weights of the deepest tenants.", labels=labels
        )
        if snapshot is not None and snapshot.tenants_on:
            tenants = self._tenants
            count.add_metric([self.queue], len(tenants))
            deepest = sorted(tenants, key=lambda t: (-t.depth, t.name))[:MAX_TENANT_LABELS]
            for t in deepest:
                depth.add_metric([self.queue, t.name], t.depth)
                in_flight.add_metric([self.queue, t.name], t.in_flight)
                weight.add_metric([self.queue, t.name], t.weight)
        yield from (count, depth, in_flight, weight)

    def _shard_families(self, snapshot: Stats | None, with_samples: bool) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        transport = self.worker.transport
        names: list[str] | None = getattr(transport, "names", None)
        if names is None or not hasattr(transport, "down_shards"):
            return  # one cluster
        up = GaugeMetricFamily(
            f"{PREFIX}_shard_up",
            "1 while the shard answers, 0 while it is down or skipped by claims.",
            labels=["queue", "shard"],
        )
        depth = GaugeMetricFamily(
            f"{PREFIX}_shard_depth", "Messages on the shard.", labels=["queue", "shard"]
        )
        if with_samples:
            down = set(transport.down_shards())
            for name in names:
                up.add_metric([self.queue, name], 0 if name in down else 1)
            for name, count in (snapshot.by_shard if snapshot is not None else {}).items():
                depth.add_metric([self.queue, name], count)
        outbox = GaugeMetricFamily(
            f"{PREFIX}_outbox",
            "Follow-ups waiting in the shards' outboxes to be forwarded.",
            labels=["queue"],
        )
        if snapshot is not None:
            outbox.add_metric([self.queue], snapshot.outbox)
        yield from (up, depth, outbox)


class MetricsServer:
    """What `serve_metrics` started: the HTTP server (in a daemon thread) and the collector."""

    def __init__(
        self,
        server: WSGIServer,
        thread: threading.Thread,
        registry: CollectorRegistry,
        collector: WorkerCollector,
    ) -> None:
        self.server = server
        self.thread = thread
        self.registry = registry
        self.collector = collector

    @property
    def port(self) -> int:
        """The port served (useful after asking for port 0)."""
        return int(self.server.server_port)

    def stop(self) -> None:
        """Stop serving and unregister the collector. Idempotent. Quick: the server's loop
        looks for the stop between requests, or every half second when idle (socketserver's
        poll), so it is woken with a connection of its own until it has seen it."""
        if self.thread.is_alive():
            stopping = threading.Thread(target=self.server.shutdown, daemon=True)
            stopping.start()
            while stopping.is_alive():
                self._wake()
                stopping.join(0.05)
        self.server.server_close()
        self.thread.join(5)
        with contextlib.suppress(KeyError):
            self.registry.unregister(_as_collector(self.collector))

    def _wake(self) -> None:
        host = str(self.server.server_address[0])
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
        with contextlib.suppress(OSError), socket.create_connection((host, self.port), 0.2):
            pass

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve_metrics(
    worker: Worker | AsyncWorker,
    port: int,
    *,
    host: str = "0.0.0.0",
    registry: CollectorRegistry | None = None,
    stats_interval: float | None = 5.0,
    loop: asyncio.AbstractEventLoop | None = None,
) -> MetricsServer:
    """Serve `worker`'s metrics on `http://host:port/metrics` (port 0: any free port, see
    `MetricsServer.port`) from a daemon thread; returns at once.

    Without `registry`, a new one is made with the process, platform and GC collectors
    besides the worker's. For an `AsyncWorker`, call this from its event loop (or pass
    `loop=`). Raises `ImportError` if prometheus-client is not installed."""
    _require_prometheus()
    from prometheus_client import (
        CollectorRegistry,
        GCCollector,
        PlatformCollector,
        ProcessCollector,
        start_http_server,
    )

    if registry is None:
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    collector = WorkerCollector(worker, stats_interval=stats_interval, loop=loop)
    registry.register(_as_collector(collector))
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except BaseException:
        registry.unregister(_as_collector(collector))
        raise
    return MetricsServer(server, thread, registry, collector)


def _as_collector(collector: WorkerCollector) -> Collector:
    """`WorkerCollector` is a collector by shape (describe/collect); prometheus-client's
    `Collector` base class is not subclassed so that importing this module never needs it."""
    return cast("Collector", collector)
