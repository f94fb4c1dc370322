"""The chaos run: publishers and workers on a real 3-node rqlite cluster while a nemesis kills,
freezes and partitions nodes and freezes workers on a seeded schedule; then the checker
(`checker.check`) reads the log of every operation.

Workers are threads (sync transports), asyncio tasks (async transports, one per task) and
separate processes. Half of them claim one lease and ack it (`claim`, `ack`); the other half
settle and claim in one write (`settle_and_claim`, several leases a round). Leases can be
shorter than the faults, and some handlers sleep past their lease, so leases lapse while their
holder is frozen or slow and another worker takes the group over: fencing is exercised."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from rqlite_queue import (
    AsyncRqliteTransport,
    AsyncShardedTransport,
    Lease,
    LeaseLost,
    OutcomeUnknown,
    QueueError,
    RqliteTransport,
    ShardedTransport,
    Transport,
    Unavailable,
)
from rqlite_queue._protocol.sharding import home
from rqlite_queue.errors import PartialRound
from rqlite_queue.testing import Cluster, Node

from .checker import Fault, Op, Report, check
from .network import Network, NetworkUnavailable, open_network, why_unavailable

HTTP_TIMEOUT = 1.0  # a frozen node must not hold a request for long
DEADLINE = 20.0
NODE_FAULTS = ("kill_leader", "pause_leader", "pause_follower")
PARTITIONS = ("partition_leader", "partition_follower")
WORKER_FAULTS = ("pause_worker",)
SHARD_FAULTS = ("shard_down",)
ALL_FAULTS = NODE_FAULTS + PARTITIONS + WORKER_FAULTS


@dataclass
class Config:
    seed: int = 1
    groups: int = 200
    messages: int = 20
    thread_workers: int = 4
    task_workers: int = 2
    process_workers: int = 2
    publishers: int = 2
    faults: int = 12
    fault_gap: tuple[float, float] = (1.0, 2.5)
    publish_pace: float = 0.04
    """Seconds between two publishes of one publisher: spreads the traffic over the faults."""
    time_limit: float = 600.0
    visibility: float = 2.0
    slow_chance: float = 0.0
    """Chance that a handler sleeps past its lease (`slow` times the visibility)."""
    slow: tuple[float, float] = (1.2, 2.5)
    batch: int = 2
    """Leases a `settle_and_claim` worker asks for per round."""
    kinds: tuple[str, ...] = ALL_FAULTS
    pause: tuple[float, float] = (0.8, 2.0)
    """How long a node or a worker stays frozen (SIGSTOP)."""
    partition: tuple[float, float] = (1.0, 3.0)
    """How long a node stays cut off."""
    shards: int = 1
    """Clusters the queue is sharded over (2+: node faults hit them in turn; partitions are
    for one cluster only)."""
    outage: tuple[float, float] = (4.0, 6.0)
    """How long a `shard_down` fault keeps every node of one shard's cluster down."""

    @property
    def wants_network(self) -> bool:
        return any(kind in PARTITIONS for kind in self.kinds)


# ----------------------------------------------------------------------------- the actors


def _classify(exc: BaseException) -> str:
    if isinstance(exc, LeaseLost):
        return "lease_lost"
    if isinstance(exc, OutcomeUnknown):
        return "unknown"  # may have applied
    if isinstance(exc, Unavailable):
        return "unavailable"  # not applied (NoLeader included)
    return f"error:{type(exc).__name__}"


def _transport(url: str, queue: str) -> Transport:
    if ";" in url:
        return ShardedTransport(url, timeout=HTTP_TIMEOUT, queue=queue, deadline=DEADLINE)
    return RqliteTransport(url, timeout=HTTP_TIMEOUT, queue=queue, deadline=DEADLINE)


def publisher(
    url: str, queue: str, groups: list[str], messages: int, pace: float, log: list[Op]
) -> None:
    """Publishes each group's messages in order, with dedup ids, retrying until each lands."""
    with _transport(url, queue) as q:
        for i in range(messages):
            for group in groups:
                time.sleep(pace)
                while True:
                    t0 = time.time()
                    try:
                        seq = q.publish(group, {"g": group, "i": i}, dedup_id=f"{group}/{i}")
                        log.append(Op("publish", "pub", t0, time.time(), "ok", group, i, seq))
                        break
                    except QueueError as exc:
                        log.append(Op("publish", "pub", t0, time.time(), _classify(exc), group, i))
                        time.sleep(0.05)


class Handler:
    """What a worker does with a message: a few ms, or now and then longer than its lease."""

    def __init__(self, config: Config, seed: int) -> None:
        self.rng = random.Random(seed)
        self.config = config

    def seconds(self, leases: int = 1) -> float:
        c = self.config
        total = 0.0
        for _ in range(leases):
            slow = self.rng.random() < c.slow_chance
            total += self.rng.uniform(*c.slow) * c.visibility if slow else self.rng.uniform(0, 0.01)
        return total


class Log:
    """One actor's entries in the shared log."""

    def __init__(self, actor: str, log: list[Op]) -> None:
        self.actor = actor
        self.log = log

    def claimed(self, t0: float, lease: Lease) -> None:
        e = lease.event
        self.log.append(
            Op("claim", self.actor, t0, time.time(), "ok", e["g"], e["i"], lease.seq,
               lease.attempts, lease.expires_at, lease.token, lease.shard)
        )  # fmt: skip

    def claim_failed(self, t0: float, exc: BaseException) -> None:
        self.log.append(Op("claim", self.actor, t0, time.time(), _classify(exc)))

    def acked(self, t0: float, lease: Lease, outcome: str) -> None:
        e = lease.event
        self.log.append(
            Op("ack", self.actor, t0, time.time(), outcome, e["g"], e["i"], lease.seq,
               token=lease.token)
        )  # fmt: skip


def _round_outcomes(
    held: Sequence[Lease], lost: Sequence[Lease], resent: bool, unsettled: Sequence[Lease] = ()
) -> list[str]:
    """Per acked lease: lost leases were fenced; after a resend, success is at-least-once;
    unsettled ones (a sharded round's shard that did not answer) were not applied."""
    return [
        "unavailable" if lease in unsettled
        else "lease_lost" if lease in lost
        else "resent" if resent
        else "ok"
        for lease in held
    ]  # fmt: skip


def thread_worker(
    url: str, queue: str, name: str, done: Callable[[], bool], log: list[Op], seed: int,
    config: Config,
) -> None:  # fmt: skip
    with _transport(url, queue) as q:
        if seed % 2:
            _settle_and_claim_loop(q, Log(name, log), done, Handler(config, seed), config)
        else:
            _claim_ack_loop(q, Log(name, log), done, Handler(config, seed), config)


def _claim_ack_loop(
    q: RqliteTransport, log: Log, done: Callable[[], bool], handler: Handler, config: Config
) -> None:
    while not done():
        t0 = time.time()
        try:
            lease = q.claim(log.actor, config.visibility)
        except QueueError as exc:
            log.claim_failed(t0, exc)
            time.sleep(0.05)
            continue
        if lease is None:
            time.sleep(0.02)
            continue
        log.claimed(t0, lease)
        time.sleep(handler.seconds())
        resent = q.resent
        t0 = time.time()
        try:
            q.ack(lease)
            outcome = "resent" if q.resent != resent else "ok"
        except QueueError as exc:
            outcome = _classify(exc)
        log.acked(t0, lease, outcome)


def _settle_and_claim_loop(
    q: RqliteTransport, log: Log, done: Callable[[], bool], handler: Handler, config: Config
) -> None:
    """Ack the last round's leases and claim the next ones in one write. A failed round drops
    its leases (they lapse and come back), as a crashed worker would."""
    held: list[Lease] = []
    while held or not done():
        n = 0 if done() else config.batch
        resent = q.resent
        t0 = time.time()
        unsettled: Sequence[Lease] = ()
        try:
            if held:
                try:
                    got = q.settle_and_claim(log.actor, config.visibility, n, ack=held)
                except PartialRound as partial:  # one shard did not answer; the rest applied
                    got = partial.round
                leases, lost, unsettled = got.leases, got.lost, got.unsettled
            else:  # nothing to settle: `claim_many` asks the node first when idle
                leases, lost = q.claim_many(log.actor, config.visibility, n), []
        except QueueError as exc:
            for lease in held:
                log.acked(t0, lease, _classify(exc))
            if n:
                log.claim_failed(t0, exc)
            held = []
            time.sleep(0.05)
            continue
        for lease, outcome in zip(
            held, _round_outcomes(held, lost, q.resent != resent, unsettled), strict=True
        ):
            log.acked(t0, lease, outcome)
        for lease in leases:
            log.claimed(t0, lease)
        held = leases
        time.sleep(handler.seconds(len(leases)) if leases else 0.02)


async def task_worker(
    url: str, queue: str, name: str, done: Callable[[], bool], log: list[Op], seed: int,
    config: Config,
) -> None:  # fmt: skip
    kind = AsyncShardedTransport if ";" in url else AsyncRqliteTransport
    async with kind(url, timeout=HTTP_TIMEOUT, queue=queue, deadline=DEADLINE) as q:
        if seed % 2:
            await _async_settle_and_claim_loop(
                q, Log(name, log), done, Handler(config, seed), config
            )
        else:
            await _async_claim_ack_loop(q, Log(name, log), done, Handler(config, seed), config)


async def _async_claim_ack_loop(
    q: AsyncRqliteTransport, log: Log, done: Callable[[], bool], handler: Handler, config: Config
) -> None:
    while not done():
        t0 = time.time()
        try:
            lease = await q.claim(log.actor, config.visibility)
        except QueueError as exc:
            log.claim_failed(t0, exc)
            await asyncio.sleep(0.05)
            continue
        if lease is None:
            await asyncio.sleep(0.02)
            continue
        log.claimed(t0, lease)
        await asyncio.sleep(handler.seconds())
        resent = q.resent
        t0 = time.time()
        try:
            await q.ack(lease)
            outcome = "resent" if q.resent != resent else "ok"
        except QueueError as exc:
            outcome = _classify(exc)
        log.acked(t0, lease, outcome)


async def _async_settle_and_claim_loop(
    q: AsyncRqliteTransport, log: Log, done: Callable[[], bool], handler: Handler, config: Config
) -> None:
    held: list[Lease] = []
    while held or not done():
        n = 0 if done() else config.batch
        resent = q.resent
        t0 = time.time()
        unsettled: Sequence[Lease] = ()
        try:
            if held:
                try:
                    got = await q.settle_and_claim(log.actor, config.visibility, n, ack=held)
                except PartialRound as partial:  # one shard did not answer; the rest applied
                    got = partial.round
                leases, lost, unsettled = got.leases, got.lost, got.unsettled
            else:
                leases, lost = await q.claim_many(log.actor, config.visibility, n), []
        except QueueError as exc:
            for lease in held:
                log.acked(t0, lease, _classify(exc))
            if n:
                log.claim_failed(t0, exc)
            held = []
            await asyncio.sleep(0.05)
            continue
        for lease, outcome in zip(
            held, _round_outcomes(held, lost, q.resent != resent, unsettled), strict=True
        ):
            log.acked(t0, lease, outcome)
        for lease in leases:
            log.claimed(t0, lease)
        held = leases
        await asyncio.sleep(handler.seconds(len(leases)) if leases else 0.02)


def process_worker(
    url: str, queue: str, name: str, stop_file: str, log_file: str, seed: int, config: Config
) -> None:
    """A worker in its own process: same loop, log written as JSON lines at the end."""
    log: list[Op] = []
    try:
        thread_worker(url, queue, name, lambda: os.path.exists(stop_file), log, seed, config)
    finally:
        with open(log_file, "w") as f:
            for op in log:
                f.write(json.dumps(asdict(op)) + "\n")


# ---------------------------------------------------------------------------- the nemesis


class Nemesis:
    """On a seeded schedule, one fault at a time, each undone before the next, every kind
    once in each round of faults:

    - kill_leader: kill -9 the leader, restart it 0.5-2 s later;
    - pause_leader / pause_follower: SIGSTOP a node (longer than the election timeout);
    - partition_leader / partition_follower: cut a node off from the other two (it still
      answers clients), watching that the majority elects a leader and the cut-off leader
      steps down;
    - pause_worker: SIGSTOP a worker process, so the leases it holds lapse under it;
    - shard_down (sharded runs): kill -9 every node of one shard's cluster, restart them all
      `outage` seconds later.

    With several clusters (shards), node faults hit them in turn."""

    def __init__(
        self,
        clusters: Sequence[Cluster],
        net: Network | None,
        workers: Sequence[multiprocessing.process.BaseProcess],
        config: Config,
        stop: threading.Event,
    ) -> None:
        self.clusters = list(clusters)
        self.net = net
        self.workers = workers
        self.config = config
        self.stop = stop
        self.rng = random.Random(config.seed)
        self.faults: list[Fault] = []
        self._deck: list[str] = []
        self.error: BaseException | None = None
        self.kinds = [
            k
            for k in config.kinds
            if (k not in PARTITIONS or net is not None)
            and (k not in WORKER_FAULTS or workers)
            and (k not in SHARD_FAULTS or len(clusters) > 1)
        ]

    def run(self) -> None:
        try:
            for _ in range(self.config.faults):
                if self.stop.wait(self.rng.uniform(*self.config.fault_gap)):
                    return
                self._one(self._next_kind())
        except BaseException as exc:  # the run must fail, not go on with fewer faults
            self.error = exc
        finally:
            self._settle()

    def _next_kind(self) -> str:
        """Every kind once per round, in a seeded order: a short run still sees each one."""
        if not self._deck:
            self._deck = self.rng.sample(self.kinds, len(self.kinds))
        return self._deck.pop()

    def _one(self, kind: str) -> None:
        if kind == "pause_worker":
            self._pause_worker(self.rng.choice(self.workers))
            return
        self.cluster = self.clusters[len(self.faults) % len(self.clusters)]
        if kind == "shard_down":
            self._shard_down(self.cluster)
            return
        try:
            leader = self.cluster.leader(timeout=10)
        except Exception:  # no leader right now: let the cluster settle
            return
        followers = [n for n in self.cluster.nodes if n is not leader and n.is_running]
        node = leader if kind.endswith("leader") or not followers else self.rng.choice(followers)
        if kind == "kill_leader":
            self._kill(node)
        elif kind.startswith("pause"):
            self._pause_node(kind, node)
        else:
            self._partition(kind, node, leader)

    def _fault(self, kind: str, node: str) -> Fault:
        fault = Fault(kind, node, time.time())
        self.faults.append(fault)
        return fault

    def _shard_down(self, cluster: Cluster) -> None:
        shard = f"s{self.clusters.index(cluster)}"
        fault = self._fault("shard_down", shard)
        for node in cluster.nodes:
            node.kill()
        self.stop.wait(self.rng.uniform(*self.config.outage))
        for node in cluster.nodes:
            node.restart()
        fault.t1 = time.time()

    def _kill(self, node: Node) -> None:
        fault = self._fault("kill_leader", node.node_id)
        node.kill()
        self.stop.wait(self.rng.uniform(0.5, 2.0))
        node.restart()
        fault.t1 = time.time()

    def _pause_node(self, kind: str, node: Node) -> None:
        fault = self._fault(kind, node.node_id)
        node.pause()
        try:
            self.stop.wait(self.rng.uniform(*self.config.pause))  # election timeout: 0.4 s
        finally:
            node.resume()
            fault.t1 = time.time()

    def _partition(self, kind: str, node: Node, leader: Node) -> None:
        assert self.net is not None
        k = self.cluster.nodes.index(node)
        fault = self._fault(kind, node.node_id)
        self.net.partition(k)
        try:
            self._watch(fault, node, leader, fault.t0 + self.rng.uniform(*self.config.partition))
        finally:
            self.net.heal(k)
            fault.t1 = time.time()

    def _watch(self, fault: Fault, cut: Node, leader: Node, until: float) -> None:
        """Until `until`: when did the majority side have a leader, and the cut node stop
        being one? (Clients reach every node: only node-to-node traffic is cut.)"""
        others = [n for n in self.cluster.nodes if n is not cut]
        while time.time() < until and not self.stop.is_set():
            states = {n.node_id: _raft_state(n) for n in self.cluster.nodes}
            now = time.time() - fault.t0
            if fault.elected is None and any(states[n.node_id] == "Leader" for n in others):
                fault.elected = now
            if cut is leader and fault.stepped_down is None and states[cut.node_id] != "Leader":
                fault.stepped_down = now
            time.sleep(0.1)

    def _pause_worker(self, worker: multiprocessing.process.BaseProcess) -> None:
        if worker.pid is None or not worker.is_alive():
            return
        fault = self._fault("pause_worker", worker.name)
        os.kill(worker.pid, signal.SIGSTOP)
        try:
            self.stop.wait(self.rng.uniform(*self.config.pause))
        finally:
            os.kill(worker.pid, signal.SIGCONT)
            fault.t1 = time.time()

    def _settle(self) -> None:
        """Leave every node running and connected, and every worker running."""
        if self.net is not None:
            for k in list(self.net.cut):
                self.net.heal(k)
        for cluster in self.clusters:
            for node in cluster.nodes:
                if node.paused:
                    node.resume()
                if not node.is_running:
                    node.restart()
        for worker in self.workers:
            if worker.pid is not None and worker.is_alive():
                os.kill(worker.pid, signal.SIGCONT)


def _raft_state(node: Node) -> str:
    try:
        return str(node.status(timeout=0.5)["store"]["raft"]["state"])
    except Exception:  # a node that does not answer is not a leader anyone can use
        return "unknown"


# ------------------------------------------------------------------------------- the run


@contextlib.contextmanager
def _network(config: Config) -> Iterator[tuple[Network | None, str]]:
    """The private network the partitions need (removed on exit, whatever happens), or None
    and one printed line saying why it cannot be made here."""
    if not config.wants_network:
        yield None, "loopback (no partitions asked for)"
        return
    net = None
    reason = why_unavailable()
    if reason is None:
        try:
            net = open_network(3)
        except NetworkUnavailable as exc:
            reason = str(exc)
    if net is None:
        print(f"chaos: network partitions skipped: {reason}")
        yield None, f"loopback (partitions skipped: {reason})"
        return
    try:
        yield net, f"one namespace per node on {net.subnet}, partitions by iptables"
    finally:
        net.destroy()


def run(config: Config, binary: str, workdir: Path) -> Report:
    start = time.time()
    if config.shards > 1:
        with contextlib.ExitStack() as stack:
            clusters = [
                stack.enter_context(Cluster(3, binary=binary)) for _ in range(config.shards)
            ]
            log, faults, remaining = _drive(config, clusters, None, workdir, start)
            compared = [_compare_replicas(c, _queue(config)) for c in clusters]
        report = check(
            config,
            log,
            faults,
            remaining=remaining,
            identical=all(same for same, _ in compared),
            detail="; ".join(f"shard s{i}: {d}" for i, (_, d) in enumerate(compared)),
            elapsed=time.time() - start,
            network=f"loopback, {config.shards} clusters (shards s0..s{config.shards - 1})",
        )
        report.outages = outage_lines(log, faults)
        return report
    with _network(config) as (net, network):
        hosts = net.hosts if net is not None else None
        wrappers = net.wrappers if net is not None else None
        with Cluster(3, binary=binary, hosts=hosts, wrappers=wrappers) as cluster:
            log, faults, remaining = _drive(config, [cluster], net, workdir, start)
            identical, detail = _compare_replicas(cluster, _queue(config))
    return check(
        config,
        log,
        faults,
        remaining=remaining,
        identical=identical,
        detail=detail,
        elapsed=time.time() - start,
        network=network,
    )


def outage_lines(log: Sequence[Op], faults: Sequence[Fault]) -> list[str]:
    """For each shard outage: the other shards' claims per second while it lasted, against
    the same span just before it (the dip a healthy shard's workers saw)."""
    lines = []
    for fault in faults:
        if fault.kind != "shard_down" or not fault.t1:
            continue
        span = fault.t1 - fault.t0
        healthy = [
            o for o in log if o.kind == "claim" and o.outcome == "ok" and o.shard != fault.node
        ]
        during = sum(1 for o in healthy if fault.t0 <= o.t1 < fault.t1) / span
        before = sum(1 for o in healthy if fault.t0 - span <= o.t1 < fault.t0) / span
        ratio = f"{during / before:.2f}x" if before else "n/a"
        lines.append(
            f"shard {fault.node} down {span:.1f} s: the other shards' claims went on at "
            f"{during:.1f}/s (before: {before:.1f}/s, {ratio})"
        )
    return lines


def _queue(config: Config) -> str:
    return f"chaos{config.seed}_{os.getpid()}"


def _drive(
    config: Config, clusters: list[Cluster], net: Network | None, workdir: Path, start: float
) -> tuple[list[Op], list[Fault], int]:
    """Publish, work and inject faults until every message is acked; return the log, the
    faults and how many messages were left in the queue."""
    queue = _queue(config)
    url = (
        clusters[0].url
        if len(clusters) == 1
        else ";".join(f"s{i}={c.url}" for i, c in enumerate(clusters))
    )
    groups = [f"g{k:04d}" for k in range(config.groups)]
    log: list[Op] = []
    _transport(url, queue).setup()
    if len(clusters) > 1:  # one publisher per shard: a shard's outage holds only its own
        names = [f"s{i}" for i in range(len(clusters))]
        parts = [[g for g in groups if home(g, names) == name] for name in names]
    else:
        parts = [groups[p :: config.publishers] for p in range(config.publishers)]
    publishing = [
        threading.Thread(
            target=publisher,
            args=(url, queue, part, config.messages, config.publish_pace, log),
        )
        for part in parts
    ]
    finished = threading.Event()
    stop_file = str(workdir / "stop")
    workers = [
        threading.Thread(target=thread_worker,
                         args=(url, queue, f"t{k}", finished.is_set, log, k, config))
        for k in range(config.thread_workers)
    ]  # fmt: skip
    workers.append(threading.Thread(target=_tasks, args=(url, queue, finished, log, config)))
    spawn = multiprocessing.get_context("spawn")
    processes = [
        spawn.Process(
            target=process_worker,
            args=(url, queue, f"p{k}", stop_file, str(workdir / f"p{k}.jsonl"), 200 + k, config),
            name=f"p{k}",
        )
        for k in range(config.process_workers)
    ]
    stop_nemesis = threading.Event()
    nemesis = Nemesis(clusters, net, processes, config, stop_nemesis)
    chaos = threading.Thread(target=nemesis.run)
    for p in processes:
        p.start()
    for t in (*publishing, *workers, chaos):
        t.start()
    remaining = -1
    try:
        for t in publishing:
            t.join(config.time_limit)
        chaos.join(config.time_limit)
        remaining = _wait_drained(url, queue, start + config.time_limit)
    finally:
        stop_nemesis.set()
        finished.set()
        Path(stop_file).touch()
        chaos.join(60)
        for t in workers:
            t.join(60)
        for p in processes:
            p.join(60)
            if p.is_alive():
                p.kill()
    if nemesis.error is not None:
        raise RuntimeError(f"the nemesis failed: {nemesis.error!r}") from nemesis.error
    for k in range(config.process_workers):
        path = workdir / f"p{k}.jsonl"
        if path.exists():
            log += [Op(**json.loads(line)) for line in path.read_text().splitlines()]
    return log, nemesis.faults, remaining


def _tasks(url: str, queue: str, finished: threading.Event, log: list[Op], config: Config) -> None:
    async def main() -> None:
        await asyncio.gather(
            *(
                task_worker(url, queue, f"a{k}", finished.is_set, log, 100 + k, config)
                for k in range(config.task_workers)
            )
        )

    asyncio.run(main())


def _wait_drained(url: str, queue: str, give_up: float) -> int:
    """Wait until the queue is empty; return its depth (-1: never read)."""
    depth = -1
    with _transport(url, queue) as q:
        while time.time() < give_up:
            with contextlib.suppress(QueueError):  # a fault may still be settling
                depth = q.stats().depth
            if depth == 0:
                return 0
            time.sleep(0.2)
    return depth


def _compare_replicas(cluster: Cluster, queue: str) -> tuple[bool, str]:
    """Read every table of the queue from each node with level=none and compare."""
    tables = ["meta", "messages", "groups", "dead", "dedup"]
    deadline = time.time() + 30
    snapshots: list[list[Any]] = []
    with httpx.Client(timeout=5, trust_env=False) as http:
        while time.time() < deadline:
            snapshots = []
            for node in cluster.nodes:
                body = [[f"SELECT * FROM rq_{queue}_{t} ORDER BY 1"] for t in tables]
                try:
                    r = http.post(node.http_url + "/db/query", params={"level": "none"}, json=body)
                    results = r.json()["results"]
                    snapshots.append([res.get("error") or res.get("values", []) for res in results])
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    snapshots.append([f"unreadable: {exc}"])
            if all(s == snapshots[0] for s in snapshots):
                if any(isinstance(t, str) for t in snapshots[0]):  # the same error on all nodes
                    return False, f"unreadable: {snapshots[0]}"
                rows = sum(len(t) for t in snapshots[0])
                return True, f"{len(cluster.nodes)} nodes, {len(tables)} tables, {rows} rows each"
            time.sleep(0.5)
    return False, f"differ: {[[len(t) for t in s] for s in snapshots]}"
