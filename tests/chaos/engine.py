"""The chaos run: publishers and workers on a real 3-node rqlite cluster while a nemesis kills
and freezes nodes on a seeded schedule; then a checker reads the log of every operation.

Workers are threads (sync transports), asyncio tasks (async transports, one per task) and
separate processes; every one logs each operation with its start and end times (one machine,
one clock) and its outcome. See `check` for what is verified."""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from rqlite_queue import (
    AsyncRqliteTransport,
    LeaseLost,
    QueueError,
    RqliteTransport,
    Unavailable,
)
from rqlite_queue.cluster import Cluster

VISIBILITY = 2.0
HTTP_TIMEOUT = 1.0  # a frozen node must not hold a request for long
DEADLINE = 20.0


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


@dataclass
class Op:
    """One call and its outcome, as a worker or publisher saw it."""

    kind: str  # publish | claim | ack
    actor: str
    t0: float
    t1: float
    outcome: str  # ok | resent | lease_lost | unavailable | error:<type> | empty
    group: str = ""
    i: int = -1
    seq: int = -1
    attempts: int = 0
    expires_at: float = 0.0


@dataclass
class Fault:
    kind: str
    node: str
    t0: float
    t1: float = 0.0


@dataclass
class Report:
    config: Config
    operations: int
    faults: list[Fault]
    published: int
    acked: int
    lost: list[tuple[str, int]]
    duplicates_delivered: int
    order_violations: list[str]
    exclusivity_violations: list[str]
    unfenced_violations: list[str]
    fenced_overlaps: int
    recoveries: list[float]
    replicas_identical: bool
    replica_detail: str
    elapsed: float
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            not self.lost
            and not self.order_violations
            and not self.exclusivity_violations
            and not self.unfenced_violations
            and self.replicas_identical
            and self.published == self.config.groups * self.config.messages
        )

    def summary(self) -> str:
        kinds = Counter(f.kind for f in self.faults)
        rec = sorted(self.recoveries)
        recovery = (
            f"{len(rec)} leader kills with writes after them: median {rec[len(rec) // 2]:.2f} s, "
            f"max {rec[-1]:.2f} s"
            if rec
            else "no leader kill"
        )
        lines = [
            f"seed {self.config.seed}: {self.config.groups} groups x {self.config.messages} "
            f"messages, workers: {self.config.thread_workers} threads, "
            f"{self.config.task_workers} asyncio tasks, {self.config.process_workers} processes; "
            f"publishes paced {self.config.publish_pace * 1000:.0f} ms apart per publisher",
            f"operations: {self.operations} ({dict(sorted(self.outcomes.items()))})",
            f"faults injected: {len(self.faults)} ({dict(sorted(kinds.items()))})",
            f"published: {self.published}, acked: {self.acked}, lost: {len(self.lost)}",
            f"duplicates delivered: {self.duplicates_delivered} "
            f"(redeliveries after a lapsed lease or an unknown ack outcome)",
            f"order violations: {len(self.order_violations)}",
            f"exclusivity violations (two valid leases on one group): "
            f"{len(self.exclusivity_violations)}",
            f"overlaps after a lapsed lease: {self.fenced_overlaps}, "
            f"unfenced (old holder's ack succeeded): {len(self.unfenced_violations)}",
            f"time to recover after a leader kill: {recovery}",
            f"replicas identical: {self.replicas_identical} ({self.replica_detail})",
            f"elapsed: {self.elapsed:.1f} s",
        ]
        for bad in (self.order_violations, self.exclusivity_violations, self.unfenced_violations):
            lines += [f"  ! {v}" for v in bad[:10]]
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the actors


def _classify(exc: BaseException) -> str:
    if isinstance(exc, LeaseLost):
        return "lease_lost"
    if isinstance(exc, Unavailable):
        return "unavailable"
    return f"error:{type(exc).__name__}"


def _transport(url: str, queue: str) -> RqliteTransport:
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


def thread_worker(
    url: str, queue: str, name: str, done: Callable[[], bool], log: list[Op], seed: int
) -> None:
    rng = random.Random(seed)
    with _transport(url, queue) as q:
        while not done():
            t0 = time.time()
            try:
                lease = q.claim(name, VISIBILITY)
            except QueueError as exc:
                log.append(Op("claim", name, t0, time.time(), _classify(exc)))
                time.sleep(0.05)
                continue
            if lease is None:
                time.sleep(0.02)
                continue
            e = lease.event
            log.append(
                Op("claim", name, t0, time.time(), "ok", e["g"], e["i"], lease.seq,
                   lease.attempts, lease.expires_at)
            )  # fmt: skip
            time.sleep(rng.uniform(0, 0.01))
            resent = q.resent
            t0 = time.time()
            try:
                q.ack(lease)
                outcome = "resent" if q.resent != resent else "ok"
            except QueueError as exc:
                outcome = _classify(exc)
            log.append(Op("ack", name, t0, time.time(), outcome, e["g"], e["i"], lease.seq))


async def task_worker(
    url: str, queue: str, name: str, done: Callable[[], bool], log: list[Op], seed: int
) -> None:
    rng = random.Random(seed)
    async with AsyncRqliteTransport(url, timeout=HTTP_TIMEOUT, queue=queue, deadline=DEADLINE) as q:
        while not done():
            t0 = time.time()
            try:
                lease = await q.claim(name, VISIBILITY)
            except QueueError as exc:
                log.append(Op("claim", name, t0, time.time(), _classify(exc)))
                await asyncio.sleep(0.05)
                continue
            if lease is None:
                await asyncio.sleep(0.02)
                continue
            e = lease.event
            log.append(
                Op("claim", name, t0, time.time(), "ok", e["g"], e["i"], lease.seq,
                   lease.attempts, lease.expires_at)
            )  # fmt: skip
            await asyncio.sleep(rng.uniform(0, 0.01))
            resent = q.resent
            t0 = time.time()
            try:
                await q.ack(lease)
                outcome = "resent" if q.resent != resent else "ok"
            except QueueError as exc:
                outcome = _classify(exc)
            log.append(Op("ack", name, t0, time.time(), outcome, e["g"], e["i"], lease.seq))


def process_worker(
    url: str, queue: str, name: str, stop_file: str, log_file: str, seed: int
) -> None:
    """A worker in its own process: same loop, log written as JSON lines at the end."""
    log: list[Op] = []
    try:
        thread_worker(url, queue, name, lambda: os.path.exists(stop_file), log, seed)
    finally:
        with open(log_file, "w") as f:
            for op in log:
                f.write(json.dumps(asdict(op)) + "\n")


# ---------------------------------------------------------------------------- the nemesis


def nemesis(cluster: Cluster, config: Config, stop: threading.Event, faults: list[Fault]) -> None:
    """On a seeded schedule: kill -9 the leader (restart it a little later), or SIGSTOP the
    leader or a follower for longer than the election timeout, then SIGCONT."""
    rng = random.Random(config.seed)
    for _ in range(config.faults):
        if stop.wait(rng.uniform(*config.fault_gap)):
            return
        action = rng.choice(["kill_leader", "pause_leader", "pause_follower"])
        try:
            leader = cluster.leader(timeout=10)
        except Exception:  # no leader right now: let the cluster settle
            continue
        if action == "kill_leader":
            fault = Fault(action, leader.node_id, time.time())
            leader.kill()
            faults.append(fault)
            stop.wait(rng.uniform(0.5, 2.0))
            leader.restart()
            fault.t1 = time.time()
        else:
            followers = [n for n in cluster.nodes if n is not leader and n.is_running]
            node = leader if action == "pause_leader" or not followers else rng.choice(followers)
            fault = Fault(action, node.node_id, time.time())
            node.pause()
            faults.append(fault)
            stop.wait(rng.uniform(0.8, 2.0))  # election timeout is 0.4 s
            node.resume()
            fault.t1 = time.time()
    # Leave every node running and the cluster settled for the final comparison.
    for node in cluster.nodes:
        if not node.is_running:
            node.restart()


# ------------------------------------------------------------------------------- the run


def run(config: Config, binary: str, workdir: Path) -> Report:
    queue = f"chaos{config.seed}_{os.getpid()}"
    groups = [f"g{k:04d}" for k in range(config.groups)]
    log: list[Op] = []
    faults: list[Fault] = []
    start = time.time()
    with Cluster(3, binary=binary) as cluster:
        url = cluster.url
        _transport(url, queue).setup()
        publishing = [
            threading.Thread(
                target=publisher,
                args=(
                    url,
                    queue,
                    groups[p :: config.publishers],
                    config.messages,
                    config.publish_pace,
                    log,
                ),
            )
            for p in range(config.publishers)
        ]
        finished = threading.Event()
        stop_file = str(workdir / "stop")

        def done() -> bool:
            return finished.is_set()

        workers = [
            threading.Thread(target=thread_worker, args=(url, queue, f"t{k}", done, log, k))
            for k in range(config.thread_workers)
        ]

        def tasks() -> None:
            async def main() -> None:
                await asyncio.gather(
                    *(
                        task_worker(url, queue, f"a{k}", done, log, 100 + k)
                        for k in range(config.task_workers)
                    )
                )

            asyncio.run(main())

        workers.append(threading.Thread(target=tasks))
        spawn = multiprocessing.get_context("spawn")
        processes = [
            spawn.Process(
                target=process_worker,
                args=(url, queue, f"p{k}", stop_file, str(workdir / f"p{k}.jsonl"), 200 + k),
            )
            for k in range(config.process_workers)
        ]
        stop_nemesis = threading.Event()
        chaos = threading.Thread(target=nemesis, args=(cluster, config, stop_nemesis, faults))
        for t in (*publishing, *workers, chaos):
            t.start()
        for p in processes:
            p.start()
        try:
            for t in publishing:
                t.join(config.time_limit)
            chaos.join(config.time_limit)
            _wait_drained(url, queue, start + config.time_limit)
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
        for k in range(config.process_workers):
            path = workdir / f"p{k}.jsonl"
            if path.exists():
                log += [Op(**json.loads(line)) for line in path.read_text().splitlines()]
        identical, detail = _compare_replicas(cluster, queue)
    return check(config, log, faults, identical, detail, time.time() - start)


def _wait_drained(url: str, queue: str, give_up: float) -> None:
    with _transport(url, queue) as q:
        while time.time() < give_up:
            try:
                if q.stats().depth == 0:
                    return
            except QueueError:
                pass
            time.sleep(0.2)


def _compare_replicas(cluster: Cluster, queue: str) -> tuple[bool, str]:
    """Read every table of the queue from each node with level=none and compare."""
    tables = ["meta", "messages", "groups", "dead", "dedup", "retired"]
    deadline = time.time() + 30
    snapshots: list[list[Any]] = []
    while time.time() < deadline:
        snapshots = []
        for node in cluster.nodes:
            body = [[f"SELECT * FROM rq_{queue}_{t} ORDER BY 1"] for t in tables]
            try:
                r = httpx.post(
                    node.http_url + "/db/query", params={"level": "none"}, json=body, timeout=5
                )
                snapshots.append([res.get("values", []) for res in r.json()["results"]])
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                snapshots.append([f"unreadable: {exc}"])
        if all(s == snapshots[0] for s in snapshots):
            rows = sum(len(t) for t in snapshots[0])
            return True, f"{len(cluster.nodes)} nodes, {len(tables)} tables, {rows} rows each"
        time.sleep(0.5)
    return False, f"differ: {[[len(t) for t in s] for s in snapshots]}"


# ---------------------------------------------------------------------------- the checker


def check(
    config: Config,
    log: Iterable[Op],
    faults: list[Fault],
    identical: bool,
    detail: str,
    elapsed: float,
) -> Report:
    """From the log alone:

    - lost: published (publish returned) but never acked;
    - order: a claim of message i+1 of a group must come after an ack of message i started
      (FIFO: N+1 is never delivered before N is acked), and successful first-send acks of a
      group come in publish order;
    - exclusivity: no claim of a group may complete while another worker's lease on it is
      still valid (not lapsed by the claimer's clock) and not yet released;
    - fencing: where a claim took over a lapsed lease, the old holder's later ack must not have
      succeeded on its first send (it must get LeaseLost, or an unknown outcome).
    """
    ops = sorted(log, key=lambda op: op.t0)
    published = {(o.group, o.i) for o in ops if o.kind == "publish" and o.outcome == "ok"}
    acks_ok = [o for o in ops if o.kind == "ack" and o.outcome in ("ok", "resent")]
    acked = {(o.group, o.i) for o in acks_ok}
    claims = [o for o in ops if o.kind == "claim" and o.outcome == "ok"]
    deliveries = Counter((o.group, o.i) for o in claims)

    order: list[str] = []
    ack_started: dict[tuple[str, int], float] = {}
    for o in ops:
        if o.kind == "ack":
            ack_started.setdefault((o.group, o.i), o.t0)
    for c in claims:
        if c.i > 0:
            prev = ack_started.get((c.group, c.i - 1))
            if prev is None or prev > c.t1:
                order.append(f"{c.group}: message {c.i} claimed at {c.t1:.3f} before message "
                             f"{c.i - 1} was acked")  # fmt: skip
    by_group: dict[str, list[Op]] = defaultdict(list)
    for a in sorted((a for a in acks_ok if a.outcome == "ok"), key=lambda a: a.t1):
        by_group[a.group].append(a)
    for group, acks in by_group.items():
        seen = [a.i for a in acks]
        if seen != sorted(seen):
            order.append(f"{group}: acks out of order {seen}")

    # Each claim's hold ends where its holder's next ack on it starts (or never).
    release: dict[tuple[str, int, str, float], float] = {}
    for c in claims:
        later = [a.t0 for a in ops if a.kind == "ack" and a.actor == c.actor
                 and a.seq == c.seq and a.t0 >= c.t1]  # fmt: skip
        release[(c.actor, c.seq, c.group, c.t0)] = min(later) if later else float("inf")
    claims_by_group: dict[str, list[Op]] = defaultdict(list)
    for c in claims:
        claims_by_group[c.group].append(c)
    exclusivity: list[str] = []
    unfenced: list[str] = []
    fenced = 0
    for group, cs in claims_by_group.items():
        for a, b in itertools.pairwise(cs):
            held_until = release[(a.actor, a.seq, a.group, a.t0)]
            if held_until <= b.t1:
                continue  # a released (or started releasing) before b got the group
            if b.t0 < a.expires_at:
                exclusivity.append(
                    f"{group}: {b.actor} claimed at {b.t0:.3f}-{b.t1:.3f} while {a.actor}'s "
                    f"lease ran until {a.expires_at:.3f}"
                )
                continue
            fenced += 1
            old_acks = [o for o in ops if o.kind == "ack" and o.actor == a.actor
                        and o.seq == a.seq and o.t0 >= b.t1]  # fmt: skip
            if any(o.outcome == "ok" for o in old_acks):
                unfenced.append(f"{group}: {a.actor}'s lapsed lease acked after {b.actor} took it")

    recoveries = []
    for f in faults:
        if f.kind != "kill_leader":
            continue
        # The first write that started after the kill and succeeded.
        after = [o.t1 for o in ops if o.t0 >= f.t0 and o.outcome in ("ok", "resent")
                 and o.kind in ("ack", "publish")]  # fmt: skip
        if after:
            recoveries.append(min(after) - f.t0)
    return Report(
        config=config,
        operations=len(ops),
        faults=faults,
        published=len(published),
        acked=len(acked & published),
        lost=sorted(published - acked),
        duplicates_delivered=sum(n - 1 for n in deliveries.values()),
        order_violations=order,
        exclusivity_violations=exclusivity,
        unfenced_violations=unfenced,
        fenced_overlaps=fenced,
        recoveries=recoveries,
        replicas_identical=identical,
        replica_detail=detail,
        elapsed=elapsed,
        outcomes=dict(Counter(f"{o.kind}:{o.outcome}" for o in ops)),
    )
