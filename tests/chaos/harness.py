"""The run scaffolding the chaos harnesses of chains, jobs and batches share: their clusters
(3 nodes each; several make a sharded queue), their Worker processes (spawned, SIGKILLed and
restarted at once, stopped by a file), the fault loop, waiting for the queue to drain, and
the reading of the workers' logs. Each harness keeps its own workload, handler and checks."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rqlite_queue import QueueError, Transport, Worker
from rqlite_queue.testing import Cluster

from .network import Network

KILL_WORKER, KILL_LEADER, SHARD_OUTAGE = "kill_worker", "kill_leader", "shard_outage"


def stop_when(path: str, worker: Worker) -> None:
    """In a worker process: stop the Worker once `path` exists (the run is over)."""
    while not os.path.exists(path):
        time.sleep(0.1)
    worker.stop()


def open_clusters(
    stack: contextlib.ExitStack, rqlited: str, count: int, net: Network | None = None
) -> tuple[list[Cluster], str]:
    """`count` 3-node clusters, ready, and the queue's URL: the cluster's own for one, else
    the shards `s0=...;s1=...`. `net`: the first cluster's nodes each get a network of it."""
    clusters = [
        stack.enter_context(
            Cluster(
                3,
                binary=rqlited,
                hosts=net.hosts if net is not None and k == 0 else None,
                wrappers=net.wrappers if net is not None and k == 0 else None,
            )
        )
        for k in range(count)
    ]
    for cluster in clusters:
        cluster.wait_ready()
    if count == 1:
        return clusters, clusters[0].url
    return clusters, ";".join(f"s{k}={c.url}" for k, c in enumerate(clusters))


class WorkerProcesses:
    """`count` worker processes running `target(*args(k))` (spawned: nothing inherited but
    the arguments), named `{prefix}{k}`; each one killed is restarted with `args(k)` anew."""

    def __init__(
        self,
        target: Callable[..., None],
        args: Callable[[int], tuple[Any, ...]],
        count: int,
        stop_path: str,
        prefix: str = "w",
    ) -> None:
        self._spawn = multiprocessing.get_context("spawn")
        self._target, self._args, self._prefix = target, args, prefix
        self.stop_path = stop_path
        self.processes = [self._start(k) for k in range(count)]

    def _start(self, k: int) -> multiprocessing.process.BaseProcess:
        process = self._spawn.Process(
            target=self._target, args=self._args(k), name=f"{self._prefix}{k}"
        )
        process.start()
        return process

    def kill_one(self, rng: random.Random) -> None:
        """SIGKILL one (chosen by `rng`), and start it again at once."""
        k = rng.randrange(len(self.processes))
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.processes[k].pid or 0, signal.SIGKILL)
        self.processes[k].join(10)
        self.processes[k] = self._start(k)

    def stop(self) -> None:
        """Tell them all to stop (the stop file), wait, kill those that do not."""
        Path(self.stop_path).touch()
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join(10)


def kill_leader(cluster: Cluster) -> None:
    """SIGKILL the cluster's leader, restart it a second later, wait for a leader."""
    leader = cluster.leader(timeout=30)
    leader.kill()
    time.sleep(1.0)
    leader.restart()
    cluster.leader(timeout=30)


def cluster_outage(cluster: Cluster, seconds: float) -> None:
    """The whole cluster down for `seconds`, then back with a leader."""
    for node in cluster.nodes:
        node.kill()
    time.sleep(seconds)
    for node in cluster.nodes:
        node.restart()
    cluster.leader(timeout=30)


def run_faults(
    kinds: tuple[str, ...],
    count: int,
    gap: tuple[float, float],
    rng: random.Random,
    inject: Callable[[int, str], None],
    faults: list[str],
    *,
    started: float,
) -> None:
    """`started` seconds for the workers to start, then `count` faults, the i-th of kind
    `kinds[i % len(kinds)]` (recorded in `faults`, then `inject(i, kind)`), a random `gap`
    after each."""
    time.sleep(started)
    for i in range(count):
        kind = kinds[i % len(kinds)]
        faults.append(kind)
        inject(i, kind)
        time.sleep(rng.uniform(*gap))


def shard_fault(
    kind: str,
    i: int,
    workers: WorkerProcesses,
    clusters: list[Cluster],
    rng: random.Random,
    outage: float,
) -> None:
    """The faults of a sharded run: a worker process killed, the leader of cluster `i % 2`
    killed, or the second cluster down whole for `outage` seconds."""
    if kind == KILL_WORKER:
        workers.kill_one(rng)
    elif kind == KILL_LEADER:
        kill_leader(clusters[i % 2])
    else:
        cluster_outage(clusters[1], outage)


def drained(url: str, queue: str, give_up: float, *, again_after: float = 0.0) -> int:
    """Wait until nothing is left (outboxes included); what is left then. `again_after`:
    once empty, look again that much later (a message the last forward is bringing)."""
    with Transport.from_url(url, queue=queue, deadline=20) as q:
        left = -1
        while time.monotonic() < give_up:
            try:
                stats = q.stats()
            except QueueError:
                time.sleep(0.5)
                continue
            left = stats.depth + stats.outbox
            if left == 0:
                if not again_after:
                    return 0
                time.sleep(again_after)
                stats = q.stats()
                if stats.depth + stats.outbox == 0:
                    return 0
            time.sleep(0.5)
        return left


def log_lines(paths: list[str]) -> Iterator[list[str]]:
    """The words of each line of the workers' logs (a log never written: none)."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError), open(path) as f:
            for line in f:
                yield line.split()
