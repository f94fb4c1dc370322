"""Failover with the library's defaults: two Workers (one on threads, one on asyncio), 16 slots
each, on a 3-node cluster, leases of 2 s, and nothing else tuned (the transports' own timeouts
and deadlines); a publisher keeps a stream going; a nemesis freezes the leader (SIGSTOP) or
cuts it off from its peers (iptables, clients still reach it) again and again.

Per fault it measures how long the Workers' acks stop (from the fault to the first round trip
that applies acks and started after it), how long the cluster took to elect a new leader, and
the deliveries of a message more than once, by cause. At the end: nothing lost, FIFO per group,
no two handlers of a group at once."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rqlite_queue import AsyncTransport, AsyncWorker, Lease, QueueError, Transport, Worker
from rqlite_queue.testing import Cluster, Node

from .network import Network, private_network, why_unavailable

FREEZE, PARTITION = "freeze_leader", "partition_leader"


@dataclass
class FailoverConfig:
    seed: int = 1
    faults: int = 4
    kinds: tuple[str, ...] = (FREEZE, PARTITION)
    freeze: float = 3.0
    partition: float = 4.0
    gap: tuple[float, float] = (3.0, 5.0)
    """Calm between two faults."""
    visibility: float = 2.0
    concurrency: int = 16
    groups: int = 60
    handler_time: tuple[float, float] = (0.005, 0.05)
    publish_pace: float = 0.01
    """Seconds between two publishes: a steady stream through every fault."""


@dataclass
class FaultRecord:
    kind: str
    node: str
    started: float
    ended: float
    elected: float | None = None
    """Seconds from the fault to a new leader among the other nodes (None: none seen)."""
    resumed: float | None = None
    """Seconds from the fault to the first round trip, started after it, that applied acks."""


@dataclass
class Delivery:
    worker: str
    group: str
    seq: int
    attempts: int
    started: float
    ended: float
    expires_at: float


@dataclass
class FailoverReport:
    config: FailoverConfig
    faults: list[FaultRecord] = field(default_factory=list)
    published: int = 0
    remaining: int = -1
    deliveries: list[Delivery] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    duplicates: dict[str, int] = field(default_factory=dict)
    leases_lost: int = 0
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return not (self.lost or self.order_violations) and self.remaining == 0

    def summary(self) -> str:
        lines = [
            f"published {self.published}, handled {len({d.seq for d in self.deliveries})}, "
            f"left in the queue {self.remaining}, lost {len(self.lost)}",
            f"order violations {len(self.order_violations)}, two handlers of a group at once "
            f"{len(self.overlaps)}, settlements reported lost by the Workers {self.leases_lost}",
            "duplicates delivered: "
            + (", ".join(f"{n} ({cause})" for cause, n in self.duplicates.items()) or "0"),
        ]
        if self.skipped:
            lines.append(f"skipped: {self.skipped}")
        lines.append("fault              node  length  new leader after  acks resumed after")
        for f in self.faults:
            elected = "none seen" if f.elected is None else f"{f.elected:.2f} s"
            resumed = "never" if f.resumed is None else f"{f.resumed:.2f} s"
            lines.append(
                f"{f.kind:<18} {f.node:<5} {f.ended - f.started:5.1f} s  {elected:>16}  "
                f"{resumed:>18}"
            )
        return "\n".join(lines)


class Recorded:
    """A transport, as a Worker sees it, that notes when each round trip that applied acks
    started and ended."""

    def __init__(self, inner: Any, rounds: list[tuple[float, float]]) -> None:
        self._inner = inner
        self.rounds = rounds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def settle_and_claim(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        result = self._inner.settle_and_claim(*args, **kwargs)
        if kwargs.get("ack"):
            self.rounds.append((started, time.monotonic()))
        return result


class AsyncRecorded(Recorded):
    async def settle_and_claim(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        started = time.monotonic()
        result = await self._inner.settle_and_claim(*args, **kwargs)
        if kwargs.get("ack"):
            self.rounds.append((started, time.monotonic()))
        return result


def run_failover(
    config: FailoverConfig, rqlited: str, tmp: Path, order: list[str] | None = None
) -> FailoverReport:
    """`order`: the faults, in this order (default: `config.faults` drawn from its kinds)."""
    report = FailoverReport(config)
    kinds = config.kinds
    if PARTITION in kinds and (reason := why_unavailable()) is not None:
        kinds = tuple(k for k in kinds if k != PARTITION)
        report.skipped = f"partitions: {reason}"
    with _network(PARTITION in kinds) as net:
        hosts = net.hosts if net is not None else None
        wrappers = net.wrappers if net is not None else None
        with Cluster(3, binary=rqlited, hosts=hosts, wrappers=wrappers) as cluster:
            cluster.wait_ready()
            rng = random.Random(config.seed)
            faults = [k for k in order if k in kinds] if order is not None else None
            faults = faults or [rng.choice(kinds) for _ in range(config.faults)]
            _run(config, faults, cluster, net, report)
    return report


@contextlib.contextmanager
def _network(wanted: bool) -> Iterator[Network | None]:
    if not wanted:
        yield None
        return
    with private_network(3) as net:
        yield net


def _run(
    config: FailoverConfig,
    faults: list[str],
    cluster: Cluster,
    net: Network | None,
    report: FailoverReport,
) -> None:
    rng = random.Random(config.seed)
    queue = f"fo_{uuid.uuid4().hex[:8]}"
    url = cluster.url
    lock = threading.Lock()
    rounds: list[tuple[float, float]] = []
    done_publishing = threading.Event()
    published: list[tuple[str, int]] = []

    def handle_sync(lease: Lease) -> None:
        record("sync", lease)

    async def handle_async(lease: Lease) -> None:
        started = time.monotonic()
        await asyncio.sleep(rng_time())
        with lock:
            report.deliveries.append(_delivery("async", lease, started))

    def rng_time() -> float:
        with lock:
            return rng.uniform(*config.handler_time)

    def record(worker: str, lease: Lease) -> None:
        started = time.monotonic()
        time.sleep(rng_time())
        with lock:
            report.deliveries.append(_delivery(worker, lease, started))

    def publisher() -> None:
        groups = [f"g{i}" for i in range(config.groups)]
        with Transport.from_url(url, queue=queue) as q:
            i = 0
            while not stop_publishing.is_set():
                group = groups[i % len(groups)]
                while True:  # a dedup id makes a retry after any failure safe
                    try:
                        seq = q.publish(group, {"i": i}, dedup_id=f"m{i}")
                        break
                    except QueueError:
                        time.sleep(0.05)
                published.append((group, seq))
                i += 1
                time.sleep(config.publish_pace)
        done_publishing.set()

    stop_publishing = threading.Event()
    sync_q = Transport.from_url(url, queue=queue)
    sync_worker = Worker(
        Recorded(sync_q, rounds),  # type: ignore[arg-type]
        handle_sync,
        concurrency=config.concurrency,
        visibility=config.visibility,
        worker_id="sync",
    )
    async_state: dict[str, Any] = {}
    async_started = threading.Event()

    def run_async_worker() -> None:
        async def main() -> None:
            q = await AsyncTransport.from_url(url, queue=queue)
            worker = AsyncWorker(
                AsyncRecorded(q, rounds),  # type: ignore[arg-type]
                handle_async,
                concurrency=config.concurrency,
                visibility=config.visibility,
                worker_id="async",
            )
            async_state["worker"] = worker
            async_started.set()
            await worker.run(handle_signals=False)
            await q.close()

        asyncio.run(main())

    threads = [
        threading.Thread(target=publisher, name="publisher"),
        threading.Thread(
            target=sync_worker.run, kwargs={"handle_signals": False}, name="sync-worker"
        ),
        threading.Thread(target=run_async_worker, name="async-worker"),
    ]
    for thread in threads:
        thread.start()
    async_started.wait(30)
    try:
        time.sleep(2.0)  # the stream runs
        for kind in faults:
            report.faults.append(_fault(kind, cluster, net, config))
            time.sleep(rng.uniform(*config.gap))
    finally:
        stop_publishing.set()
        done_publishing.wait(60)
        with Transport.from_url(url, queue=queue) as q:
            give_up = time.monotonic() + 60
            while q.stats().depth and time.monotonic() < give_up:
                time.sleep(0.2)
            report.remaining = q.stats().depth
        sync_worker.stop()
        if "worker" in async_state:
            async_state["worker"].stop()
        for thread in threads:
            thread.join(60)
        sync_q.close()
    report.published = len(published)
    report.leases_lost = sync_worker.stats.leases_lost + async_state["worker"].stats.leases_lost
    for fault in report.faults:
        after = [end for start, end in rounds if start >= fault.started]
        fault.resumed = min(after) - fault.started if after else None
    _check(report, published)


def _delivery(worker: str, lease: Lease, started: float) -> Delivery:
    return Delivery(
        worker,
        lease.group_id,
        lease.seq,
        lease.attempts,
        started,
        time.monotonic(),
        lease.expires_at,
    )


def _fault(kind: str, cluster: Cluster, net: Network | None, config: FailoverConfig) -> FaultRecord:
    leader = cluster.leader(timeout=30)
    others = [n for n in cluster.nodes if n is not leader]
    k = cluster.nodes.index(leader)
    if kind == FREEZE:
        leader.pause()  # returns once the kernel has stopped it
        length = config.freeze
    else:
        assert net is not None
        net.partition(k)  # returns once both DROP rules are in
        length = config.partition
    started = time.monotonic()  # the fault is in effect from here
    elected = _wait_for_leader(others, started + length)
    remaining = started + length - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
    if kind == FREEZE:
        leader.resume()
    else:
        assert net is not None
        net.heal(k)
    ended = time.monotonic()
    cluster.leader(timeout=30)  # one leader again, agreed on by all
    return FaultRecord(
        kind,
        leader.node_id,
        started,
        ended,
        None if elected is None else elected - started,
    )


def _wait_for_leader(nodes: list[Node], until: float) -> float | None:
    """When one of `nodes` first says it leads (polled), or None before `until`."""
    while time.monotonic() < until:
        for node in nodes:
            try:
                state = node.status(timeout=0.3)["store"]["raft"]["state"]
            except Exception:  # a node that does not answer its status now
                continue
            if state == "Leader":
                return time.monotonic()
        time.sleep(0.02)
    return None


def _check(report: FailoverReport, published: list[tuple[str, int]]) -> None:
    by_seq: dict[int, list[Delivery]] = defaultdict(list)
    for d in report.deliveries:
        by_seq[d.seq].append(d)
    report.lost = [seq for _, seq in published if seq not in by_seq]
    # Duplicates, by cause: the lease of the delivery before lapsed during a fault (its
    # holder's round trips stuck), or at another time.
    duplicates: dict[str, int] = defaultdict(int)
    margin = report.config.visibility
    for deliveries in by_seq.values():
        deliveries.sort(key=lambda d: d.attempts)
        for before in deliveries[:-1]:
            during = any(
                f.started - margin <= before.started <= f.ended + margin for f in report.faults
            )
            duplicates["its lease lapsed around a fault" if during else "other"] += 1
    report.duplicates = dict(duplicates)
    # FIFO and exclusivity: in each group, the deliveries (first ones) in seq order, each
    # starting after the one before ended.
    by_group: dict[str, list[Delivery]] = defaultdict(list)
    for deliveries in by_seq.values():
        by_group[deliveries[0].group].extend(deliveries)
    for group, deliveries in by_group.items():
        deliveries.sort(key=lambda d: d.started)
        for a, b in itertools.pairwise(deliveries):
            if b.started < a.ended:
                report.overlaps.append(f"{group}: {a.seq}#{a.attempts} and {b.seq}#{b.attempts}")
            if b.seq < a.seq:
                report.order_violations.append(f"{group}: {b.seq} after {a.seq}")
