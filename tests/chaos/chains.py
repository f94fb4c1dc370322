"""Exactly-once effects under faults: chains of messages, each hop's handler producing the
chain's next hop into a random group (on either shard of a sharded queue), run by Worker
processes, while a nemesis kills and freezes leaders, cuts the leader off, and SIGKILLs worker
processes (restarted at once); leases are shorter than the faults, so messages are delivered
again. At the end every chain must have exactly one message at every hop: none lost, none
doubled.

Two ways to produce the next hop, run under the same faults:

- `follow_ups`: the handler returns it (`Worker(follow_ups=True)`): published with the ack,
  in its transaction, only if the ack applies;
- `publish_then_ack`: the handler publishes it, then returns (the pattern before follow-ups):
  a handler that published and was killed, or whose lease lapsed, before its ack, publishes
  it again when the message comes back. The counter-example."""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rqlite_queue import Lease, Transport, Worker
from rqlite_queue.testing import Cluster

from .harness import (
    KILL_LEADER,
    KILL_WORKER,
    WorkerProcesses,
    drained,
    kill_leader,
    log_lines,
    open_clusters,
    run_faults,
    stop_when,
)
from .network import Network, private_network, why_unavailable

FOLLOW_UPS, PUBLISH_THEN_ACK = "follow_ups", "publish_then_ack"
PAUSE_LEADER, PARTITION_LEADER = "pause_leader", "partition_leader"


@dataclass
class ChainConfig:
    mode: str = FOLLOW_UPS
    seed: int = 1
    chains: int = 20
    hops: int = 8
    groups: int = 40
    processes: int = 3
    concurrency: int = 6
    visibility: float = 1.0
    """Shorter than the faults: leases lapse and messages come back."""
    after_publish: float = 0.05
    """How long a handler works after producing the next hop (the window a kill lands in)."""
    faults: int = 6
    kinds: tuple[str, ...] = (KILL_WORKER, KILL_LEADER, PAUSE_LEADER, PARTITION_LEADER)
    pause: float = 2.0
    partition: float = 2.5
    gap: tuple[float, float] = (0.5, 1.5)
    shards: int = 1
    time_limit: float = 180.0


@dataclass
class ChainReport:
    config: ChainConfig
    faults: list[str] = field(default_factory=list)
    deliveries: int = 0
    redelivered: int = 0
    lost: list[tuple[int, int]] = field(default_factory=list)
    doubled: dict[tuple[int, int], int] = field(default_factory=dict)
    remaining: int = -1
    skipped: str = ""

    @property
    def exactly_once(self) -> bool:
        return not self.lost and not self.doubled and self.remaining == 0

    def summary(self) -> str:
        c = self.config
        return "\n".join(
            [
                f"mode {c.mode}: {c.chains} chains x {c.hops} hops, {c.processes} worker "
                f"processes x {c.concurrency}, leases of {c.visibility:g} s, "
                f"{c.shards} cluster(s)",
                f"faults: {', '.join(self.faults) or 'none'}"
                + (f" ({self.skipped})" if self.skipped else ""),
                f"deliveries {self.deliveries} (of which again after a lapse or a kill: "
                f"{self.redelivered}); left in the queue {self.remaining}",
                f"hops lost {len(self.lost)}, hops with more than one message "
                f"{len(self.doubled)} ({sum(self.doubled.values())} extra messages)",
            ]
        )


def chain_worker(
    url: str, queue: str, config: ChainConfig, log_path: str, stop_path: str, seed: int
) -> None:
    """A worker process: handles hops until `stop_path` exists; one log line per delivery."""
    rng = random.Random(seed)
    groups = [f"g{i}" for i in range(config.groups)]
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    q = Transport.from_url(url, queue=queue, timeout=1.0)

    def handle(lease: Lease) -> Any:
        chain, hop = lease.event["chain"], lease.event["hop"]
        line = f"{chain} {hop} {lease.shard or '-'}:{lease.seq} {lease.attempts}\n"
        os.write(fd, line.encode())
        follow = []
        if hop + 1 < config.hops:
            follow = [(rng.choice(groups), {"chain": chain, "hop": hop + 1})]
        if config.mode == PUBLISH_THEN_ACK:
            for group, event in follow:
                q.publish(group, event)
            follow = []
        time.sleep(config.after_publish)
        return follow

    worker = Worker(
        q,
        handle,
        concurrency=config.concurrency,
        visibility=config.visibility,
        follow_ups=config.mode == FOLLOW_UPS,
        worker_id=f"p{seed}",
    )
    stopper = threading.Thread(target=stop_when, args=(stop_path, worker), daemon=True)
    stopper.start()
    worker.run(handle_signals=False)
    q.close()


def run_chains(config: ChainConfig, rqlited: str, tmp: Path) -> ChainReport:
    report = ChainReport(config)
    kinds = config.kinds
    wants_network = PARTITION_LEADER in kinds  # the first cluster's nodes get a network each
    if PARTITION_LEADER in kinds and (reason := why_unavailable()) is not None:
        kinds, wants_network = tuple(k for k in kinds if k != PARTITION_LEADER), False
        report.skipped = f"partitions skipped: {reason}"
    with contextlib.ExitStack() as stack:
        net = stack.enter_context(private_network(3)) if wants_network else None
        clusters, url = open_clusters(stack, rqlited, config.shards, net)
        _run(config, kinds, clusters, net, url, tmp, report)
    return report


def _run(
    config: ChainConfig,
    kinds: tuple[str, ...],
    clusters: list[Cluster],
    net: Network | None,
    url: str,
    tmp: Path,
    report: ChainReport,
) -> None:
    rng = random.Random(config.seed)
    queue = f"ch_{uuid.uuid4().hex[:8]}"
    with Transport.from_url(url, queue=queue) as q:
        q.publish_many(
            [
                (f"g{rng.randrange(config.groups)}", {"chain": c, "hop": 0})
                for c in range(config.chains)
            ]
        )
    stop_path = str(tmp / "stop")
    logs = [str(tmp / f"p{k}.log") for k in range(config.processes)]
    workers = WorkerProcesses(
        chain_worker,
        lambda k: (url, queue, config, logs[k], stop_path, config.seed * 100 + k + rng.random()),
        config.processes,
        stop_path,
        prefix="p",
    )

    def inject(i: int, kind: str) -> None:
        if kind == KILL_WORKER:
            workers.kill_one(rng)
        else:
            cluster = clusters[0 if kind == PARTITION_LEADER else i % len(clusters)]
            _node_fault(kind, cluster, net, config)

    try:
        run_faults(kinds, config.faults, config.gap, rng, inject, report.faults, started=1.5)
        report.remaining = drained(url, queue, time.monotonic() + config.time_limit)
    finally:
        workers.stop()
    _check(report, logs)


def _node_fault(kind: str, cluster: Cluster, net: Network | None, config: ChainConfig) -> None:
    if kind == KILL_LEADER:
        kill_leader(cluster)
        return
    leader = cluster.leader(timeout=30)
    if kind == PAUSE_LEADER:
        leader.pause()
        time.sleep(config.pause)
        leader.resume()
    else:
        assert net is not None
        k = cluster.nodes.index(leader)
        net.partition(k)
        time.sleep(config.partition)
        net.heal(k)
    cluster.leader(timeout=30)


def _check(report: ChainReport, logs: list[str]) -> None:
    messages: dict[tuple[int, int], set[str]] = defaultdict(set)
    for parts in log_lines(logs):
        if len(parts) != 4:
            continue  # a line cut short by a SIGKILL
        chain, hop, message, attempts = int(parts[0]), int(parts[1]), parts[2], int(parts[3])
        report.deliveries += 1
        report.redelivered += attempts > 1
        messages[(chain, hop)].add(message)
    config = report.config
    for chain in range(config.chains):
        for hop in range(config.hops):
            count = len(messages.get((chain, hop), ()))
            if count == 0:
                report.lost.append((chain, hop))
            elif count > 1:
                report.doubled[(chain, hop)] = count - 1
