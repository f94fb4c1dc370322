"""The main job: a small, noisy workload that shows the queue keeping its promises.

`rqlite-queue demo` (or `make demo`) publishes a few hundred messages into many
groups with mixed priorities, then runs worker threads against them:

- one worker "crashes" once: it claims a message and abandons it without acking; the lease
  lapses after VISIBILITY seconds and the message is delivered again, with attempts=2;
- one worker is slow (sleeps on every message);
- one worker claims with a priority floor half of the time;
- the handler fails on a few "poison" messages: they are parked (nack with a delay) and, after
  MAX_ATTEMPTS, dead-lettered with a reason.

Meanwhile the demo watches what the workers see (in-flight groups across threads, the order
of acks per group, who was served when) and ends with a report. It exits non-zero if order or
exclusivity was violated or a message was lost.

Backend: a local 3-node rqlite cluster (`rqlite_queue.testing`); without a usable rqlited the demo
says so, and how to get one, and stops: the embedded SQLite in a temp dir is the explicit
choice `--backend sqlite`; `--backend auto` (what `make demo` runs, for a first run anywhere)
builds an rqlited where Go and a C compiler are, and otherwise runs on the embedded SQLite,
saying why and how to get the 3-node demo; `--url` uses an existing backend.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from .. import Lease, LeaseLost, Transport
from ..local_cluster import Cluster, ClusterError
from ..rqlited import RqlitedNotFound, find_rqlited
from ._base import REFUSED_TIMEOUT, _state

VISIBILITY = 2.0
"""Lease length: short, so the abandoned lease lapses quickly."""
PARK_DELAY = 0.3
"""How long a failed message's group is parked before the message is retried."""
MAX_ATTEMPTS = 3
"""A message that failed this many times is dead-lettered."""
FLOOR = 3
"""The floor worker's `min_priority` (every other claim)."""
WORK_SECONDS = (0.02, 0.06)
"""Each message takes this long to handle (uniform), on top of the queue's round trips."""
SLOW_SECONDS = 0.2
"""The slow worker's extra time per message."""
CRASH_AT = 2
"""The crashing worker abandons its CRASH_AT-th lease."""
IDLE_SECONDS = 0.05
PRIORITY_WEIGHTS = {0: 50, 1: 15, 2: 15, 3: 10, 4: 10}
ROLES = ("crashy", "slow", "floor")
"""Roles of the first workers; any further worker is plain."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# --------------------------------------------------------------------------------- backend


@dataclass(frozen=True)
class Backend:
    description: str
    urls: list[str]
    """One URL per node (one for SQLite); workers get them in rotated order."""
    queue: str
    external: bool

    @property
    def remote(self) -> bool:
        return not self.urls[0].startswith("sqlite:")

    def url_for(self, i: int) -> str:
        """The URL for the i-th client: the node list rotated, so clients start on
        different nodes (a follower forwards writes to the leader)."""
        if self.urls[0].startswith("sqlite:"):
            return self.urls[0]
        k = i % len(self.urls)
        return ",".join(self.urls[k:] + self.urls[:k])


@contextlib.contextmanager
def open_backend(args: argparse.Namespace) -> Iterator[Backend]:
    """The backend to run on; a cluster or temp dir made here is removed on exit."""
    if args.url:
        urls = [args.url] if args.url.startswith("sqlite:") else args.url.split(",")
        queue = f"demo_{uuid.uuid4().hex[:8]}"
        yield Backend(f"{args.url} (given), queue {queue!r}", urls, queue, external=True)
        return
    backend = args.backend
    if backend == "auto":
        try:
            find_rqlited(build=True, log=log)
            backend = "rqlite"
        except RqlitedNotFound as exc:
            log(f"no usable rqlited, and none could be built here: {exc}")
            log(
                "running the demo on the embedded queue (SQLite) instead; for the 3-node "
                "rqlite demo, get an rqlited in one of the ways above (with Go 1.24+ and gcc, "
                "`rqlite-queue rqlited` builds it), then run `make demo` again"
            )
            backend = "sqlite"
    if backend == "rqlite":
        rqlited = find_rqlited()
        if rqlited.warning:
            log(f"using {rqlited.path}: {rqlited.warning}")
        log(f"starting a local 3-node rqlite cluster (rqlited {rqlited.label})")
        started = time.monotonic()
        cluster = Cluster(3, binary=rqlited.path)
        try:
            cluster.start()
            leader = cluster.leader()
            log(f"cluster ready in {time.monotonic() - started:.1f} s, leader {leader.node_id}")
            nodes = ", ".join(
                f"{n.node_id}{' (leader)' if n is leader else ''} {n.http_addr}"
                for n in cluster.nodes
            )
            yield Backend(f"rqlite {rqlited.label}, 3 nodes: {nodes}", cluster.urls, "demo", False)
        finally:
            log("stopping the rqlite cluster")
            cluster.stop()
        return
    with tempfile.TemporaryDirectory(prefix="rqlite-queue-demo-") as tmp:
        path = os.path.join(tmp, "queue.db")
        yield Backend(
            "embedded SQLite (a file in a temp dir)", ["sqlite:///" + path], "demo", False
        )


# --------------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    groups: dict[str, int]
    """group id -> priority"""
    items: list[tuple[str, dict[str, Any], int]]
    """(group, event, priority) in publish order"""
    poison: set[tuple[str, int]]


def make_workload(groups: int, messages: int, rng: random.Random) -> Workload:
    names = [f"g{i:03d}" for i in range(groups)]
    prios = rng.choices(list(PRIORITY_WEIGHTS), weights=list(PRIORITY_WEIGHTS.values()), k=groups)
    if groups > 1 and max(prios) < FLOOR:
        prios[0] = 4  # so the floor has something to find
    by_group = dict(zip(names, prios, strict=True))
    # Two poison messages in two different groups (one when there is a single group).
    poison = {(g, rng.randrange(messages)) for g in rng.sample(names, min(2, groups))}
    items = [
        (g, {"group": g, "n": n, "poison": (g, n) in poison}, by_group[g])
        for n in range(messages)
        for g in names
    ]
    return Workload(by_group, items, poison)


class Poisoned(Exception):
    pass


def handle(event: dict[str, Any]) -> None:
    """The application's handler: fails on poison messages, whatever the attempt."""
    if event.get("poison"):
        raise Poisoned(f"cannot process {event['group']}#{event['n']}: malformed payload")


# --------------------------------------------------------------------------------- observation


@dataclass
class Claim:
    at: float
    worker: str
    group: str
    seq: int
    attempts: int
    min_priority: int


@dataclass
class Observer:
    """What the workers saw, shared by every thread (always under `lock`)."""

    priorities: dict[str, int]
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: dict[str, tuple[str, float]] = field(default_factory=dict)
    """group -> (token, until): who holds the group (a lease or a park) and until when."""
    violations: list[str] = field(default_factory=list)
    claims: list[Claim] = field(default_factory=list)
    handled: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    """group -> seqs in the order they were handled (and acked)"""
    acked: set[int] = field(default_factory=set)
    dead: dict[int, str] = field(default_factory=dict)
    parks: int = 0
    lease_lost: int = 0
    abandoned: dict[int, tuple[str, float]] = field(default_factory=dict)
    redelivered: list[str] = field(default_factory=list)
    floor_claims: int = 0
    floor_violations: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done_at: dict[str, float] = field(default_factory=dict)
    """group -> when its last ack or dead letter so far happened"""

    def claimed(self, worker: str, lease: Lease, min_priority: int) -> None:
        claimed_at = lease.expires_at - VISIBILITY  # the claim's own clock reading
        with self.lock:
            held = self.in_flight.get(lease.group_id)
            if held is not None and held[1] > claimed_at:
                self.violations.append(
                    f"{worker} got {lease.group_id} (seq {lease.seq}) while {held[0]} held it"
                )
            self.in_flight[lease.group_id] = (lease.token, lease.expires_at)
            self.claims.append(
                Claim(time.time(), worker, lease.group_id, lease.seq, lease.attempts, min_priority)
            )
            if min_priority:
                self.floor_claims += 1
                if self.priorities[lease.group_id] < min_priority:
                    self.floor_violations.append(f"{lease.group_id} under floor {min_priority}")
            if lease.seq in self.abandoned and lease.attempts > 1:
                by, at = self.abandoned.pop(lease.seq)
                self.redelivered.append(
                    f"seq {lease.seq} ({lease.group_id}) abandoned by {by}, redelivered "
                    f"{time.time() - at:.1f} s later to {worker} with attempts={lease.attempts}"
                )

    def _release(self, lease: Lease, until: float | None = None) -> None:
        held = self.in_flight.get(lease.group_id)
        if held is not None and held[0] == lease.token:
            if until is None:
                del self.in_flight[lease.group_id]
            else:
                self.in_flight[lease.group_id] = (f"{lease.token} (parked)", until)

    def before_ack(self, lease: Lease) -> None:
        """Called while the lease still holds the group, so `handled` is in true order."""
        with self.lock:
            self.handled[lease.group_id].append(lease.seq)
            self._release(lease)

    def acked_ok(self, lease: Lease) -> None:
        with self.lock:
            self.acked.add(lease.seq)
            self.done_at[lease.group_id] = time.time()

    def ack_lost(self, lease: Lease) -> None:
        with self.lock:
            self.lease_lost += 1
            seqs = self.handled[lease.group_id]
            if lease.seq in seqs:
                seqs.reverse()
                seqs.remove(lease.seq)
                seqs.reverse()

    def before_park(self, lease: Lease, delay: float) -> None:
        with self.lock:
            self.parks += 1
            self._release(lease, time.time() + delay)

    def before_dead(self, lease: Lease) -> None:
        with self.lock:
            self._release(lease)

    def dead_ok(self, lease: Lease, reason: str) -> None:
        with self.lock:
            self.dead[lease.seq] = reason
            self.done_at[lease.group_id] = time.time()

    def abandon(self, worker: str, lease: Lease) -> None:
        with self.lock:
            self.abandoned[lease.seq] = (worker, time.time())

    def other_lost(self) -> None:
        with self.lock:
            self.lease_lost += 1

    def error(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)

    def finished(self) -> int:
        with self.lock:
            return len(self.acked) + len(self.dead)


# --------------------------------------------------------------------------------- workers


def worker(
    name: str,
    role: str,
    url: str,
    queue: str,
    obs: Observer,
    stop: threading.Event,
    rng: random.Random,
) -> None:
    """One worker thread with its own sync transport."""
    worker_id = name
    transport: Transport | None = None
    crashed = False
    n = 0
    try:
        transport = Transport.from_url(url, queue=queue)
        while not stop.is_set():
            floor = FLOOR if role == "floor" and n % 2 == 0 else 0
            lease = transport.claim(worker_id, VISIBILITY, floor)
            if lease is None and floor:
                floor = 0
                lease = transport.claim(worker_id, VISIBILITY, 0)
            if lease is None:
                stop.wait(IDLE_SECONDS)
                continue
            n += 1
            obs.claimed(worker_id, lease, floor)
            if role == "crashy" and not crashed and n == CRASH_AT:
                # "Crash": drop the lease and the connection, come back as a new process.
                crashed = True
                obs.abandon(worker_id, lease)
                log(f"{worker_id} crashes holding seq {lease.seq} ({lease.group_id})")
                transport.close()
                transport = None
                stop.wait(0.2)
                worker_id = f"{name}-restarted"
                transport = Transport.from_url(url, queue=queue)
                continue
            time.sleep(rng.uniform(*WORK_SECONDS) + (SLOW_SECONDS if role == "slow" else 0.0))
            try:
                try:
                    handle(lease.event)
                except Poisoned as exc:
                    if lease.attempts >= MAX_ATTEMPTS:
                        reason = f"{exc} (failed {lease.attempts} attempts)"
                        obs.before_dead(lease)
                        transport.dead_letter(lease, reason)
                        obs.dead_ok(lease, reason)
                    else:
                        obs.before_park(lease, PARK_DELAY)
                        transport.nack(lease, PARK_DELAY)
                    continue
                obs.before_ack(lease)
                try:
                    transport.ack(lease)
                except LeaseLost:
                    obs.ack_lost(lease)
                    continue
                obs.acked_ok(lease)
            except LeaseLost:
                obs.other_lost()
    except Exception as exc:
        obs.error(f"{worker_id}: {exc!r}")
        log(f"{worker_id} failed: {exc!r}")
    finally:
        if transport is not None:
            transport.close()


# --------------------------------------------------------------------------------- the run


@dataclass
class Outcome:
    published: list[int]
    publish_seconds: float
    run_seconds: float
    max_parked: int
    max_in_flight: int
    depth: int
    dead_letters: list[tuple[int, str, str]]
    timed_out: bool


def run(
    args: argparse.Namespace,
    backend: Backend,
    work: Workload,
    obs: Observer,
    rng: Callable[[int], random.Random],
) -> Outcome:
    # A given URL where nothing listens is said at once (REFUSED_TIMEOUT), as by the other
    # commands; the workers' own transports keep the whole deadline (the demo kills nodes).
    first = {"refused_timeout": REFUSED_TIMEOUT} if backend.external and backend.remote else {}
    main = Transport.from_url(backend.url_for(0), queue=backend.queue, **first)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        log(f"publishing {len(work.items)} messages into {len(work.groups)} groups")
        started = time.monotonic()
        published: list[int] = []
        for i in range(0, len(work.items), 100):  # publish_many: one round trip per 100
            published += main.publish_many(work.items[i : i + 100])
        publish_seconds = time.monotonic() - started

        log(f"starting {args.workers} workers (visibility {VISIBILITY:.0f} s)")
        started = time.monotonic()
        for i in range(args.workers):
            role = ROLES[i] if i < len(ROLES) else "plain"
            name = f"w{i + 1}-{role}"
            thread = threading.Thread(
                target=worker,
                args=(name, role, backend.url_for(i), backend.queue, obs, stop, rng(i)),
                name=name,
                daemon=True,
            )
            threads.append(thread)
            thread.start()

        max_parked = max_in_flight = 0
        timed_out = False
        while obs.finished() < len(published):
            stats = main.stats()
            max_parked = max(max_parked, stats.parked)
            max_in_flight = max(max_in_flight, stats.in_flight)
            if time.monotonic() - started > args.timeout:
                timed_out = True
                log(f"gave up after {args.timeout:.0f} s")
                break
            if obs.errors and not any(t.is_alive() for t in threads):
                break
            time.sleep(0.1)
        run_seconds = time.monotonic() - started
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        depth = main.stats().depth
        dead = [(d.seq, d.group_id, d.reason) for d in main.dead_letters(limit=1000)]
        if backend.external:
            main.purge_dead()
        return Outcome(
            published,
            publish_seconds,
            run_seconds,
            max_parked,
            max_in_flight,
            depth,
            sorted(dead),
            timed_out,
        )
    finally:
        stop.set()
        main.close()


def report(
    args: argparse.Namespace, backend: Backend, work: Workload, obs: Observer, out: Outcome
) -> bool:
    """Print the report; True when every check held."""
    # Order: per group, the acked seqs in handling order == published seqs minus dead letters.
    expected: dict[str, list[int]] = defaultdict(list)
    for (group, _, _), seq in zip(work.items, out.published, strict=True):
        if seq not in obs.dead:
            expected[group].append(seq)
    order_bad = [g for g in work.groups if obs.handled.get(g, []) != expected[g]]
    lost = sorted(set(out.published) - obs.acked - set(obs.dead))
    stored_dead = {seq for seq, _, _ in out.dead_letters}
    dead_mismatch = stored_dead != set(obs.dead)

    n_groups = len(work.groups)
    first = obs.claims[:n_groups]
    per_group = Counter(c.group for c in obs.claims)
    per_worker = Counter(c.worker.removesuffix("-restarted") for c in obs.claims)
    t0 = obs.claims[0].at if obs.claims else 0.0
    per_second: dict[int, set[str]] = defaultdict(set)
    for c in obs.claims:
        per_second[int(c.at - t0)].add(c.group)
    seconds = range(max(per_second) + 1) if per_second else range(0)
    prio_count = Counter(work.groups.values())
    processed = len(obs.acked) + len(obs.dead)
    ok = not (order_bad or obs.violations or lost or out.depth or obs.errors or out.timed_out)
    ok = ok and not dead_mismatch
    ok = ok and not obs.floor_violations

    def line(label: str, text: str) -> None:
        print(f"  {label:<16} {text}")

    print()
    print("rqlite-queue demo report")
    line("backend", backend.description)
    line(
        "published",
        f"{len(out.published)} messages in {n_groups} groups, priorities "
        + " ".join(f"{p}:{prio_count[p]}" for p in sorted(prio_count))
        + f" (publish_many, {out.publish_seconds:.2f} s)",
    )
    line(
        "processed",
        f"{len(obs.acked)} acked + {len(obs.dead)} dead-lettered = {processed}"
        f" of {len(out.published)}; lost: {len(lost)}; left in queue: {out.depth}",
    )
    line(
        "order",
        f"{'held' if not order_bad else 'VIOLATED'} in {n_groups - len(order_bad)}/{n_groups}"
        " groups (acked order == publish order, dead letters excluded)"
        + (f": bad {', '.join(order_bad[:5])}" if order_bad else ""),
    )
    line(
        "exclusivity",
        f"{len(obs.violations)} violations (in-flight groups tracked across {args.workers}"
        f" threads; max {out.max_in_flight} groups in flight in stats())",
    )
    for v in obs.violations[:5]:
        line("", v)
    seen: set[str] = set()
    repeats = Counter[bool]()
    for c in first:
        if c.group in seen:
            repeats[bool(c.min_priority)] += 1
        seen.add(c.group)
    note = ""
    if repeats[True] and not repeats[False]:
        note = f" (the {repeats[True]} repeat(s): the floor worker's)"
    line(
        "fairness",
        f"first {len(first)} claims served {len(seen)} distinct groups{note};"
        f" claims per group min {min(per_group.values(), default=0)}"
        f" / max {max(per_group.values(), default=0)}",
    )
    line("groups/second", " ".join(str(len(per_second[s])) for s in seconds))
    line("claims/worker", ", ".join(f"{w} {k}" for w, k in sorted(per_worker.items())))
    if obs.floor_violations:
        floor = f"{len(obs.floor_violations)} BELOW the floor: {obs.floor_violations[:3]}"
    elif obs.floor_claims:
        floor = f"all from groups with priority >= {FLOOR}"
    else:
        floor = "no floor worker (it is the third: use --workers 3 or more)"
    line("priority floor", f"{obs.floor_claims} claims with min_priority={FLOOR}: {floor}")
    drained = {
        high: max(
            (t - t0 for g, t in obs.done_at.items() if (work.groups[g] >= FLOOR) == high),
            default=0.0,
        )
        for high in (True, False)
    }
    line(
        "",
        f"groups with priority >= {FLOOR} drained after {drained[True]:.1f} s,"
        f" the others after {drained[False]:.1f} s",
    )
    line(
        "parked",
        f"{obs.parks} nacks with delay {PARK_DELAY} s; at most {out.max_parked}"
        " group(s) parked at once in stats()",
    )
    line(
        "dead letters",
        f"{len(out.dead_letters)} stored (after {MAX_ATTEMPTS} attempts)"
        + (f"; MISMATCH: workers dead-lettered {sorted(obs.dead)}" if dead_mismatch else ""),
    )
    for seq, group, reason in out.dead_letters:
        line("", f"seq {seq} {group}: {reason}")
    line("lease lapse", f"{len(obs.redelivered)} redelivered after a crash")
    for text in obs.redelivered:
        line("", text)
    if obs.lease_lost:
        line("lease lost", f"{obs.lease_lost} calls refused with LeaseLost (fencing)")
    for err in obs.errors:
        line("worker error", err)
    line(
        "elapsed",
        f"{out.run_seconds:.1f} s processing, {processed / max(out.run_seconds, 1e-9):.0f}"
        f" msg/s with {args.workers} workers",
    )
    line("result", "OK" if ok else "FAILED")
    return ok


# --------------------------------------------------------------------------------- entry point


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="rqlite-queue demo",
        description="Run a noisy workload on the queue and report what held.",
    )
    p.add_argument(
        "--backend",
        choices=["rqlite", "sqlite", "auto"],
        default="rqlite",
        help="rqlite (default): a local 3-node cluster; sqlite: the embedded queue; auto: "
        "rqlite if an rqlited is found or can be built, else sqlite (saying why)",
    )
    p.add_argument("--url", help="use an existing backend (sqlite:///path or http://h:p,...)")
    p.add_argument("--groups", type=int, default=40, help="groups (default 40)")
    p.add_argument("--messages", type=int, default=10, help="messages per group (default 10)")
    p.add_argument("--workers", type=int, default=4, help="worker threads (default 4)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--timeout", type=float, default=120.0, help="give up after (s)")
    args = p.parse_args(argv)
    for name in ("groups", "messages", "workers"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    return args


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # run the same cleanup as Ctrl-C


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(10_000)
    work = make_workload(args.groups, args.messages, random.Random(seed))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    log(f"seed {seed}; poison messages: " + ", ".join(f"{g}#{n}" for g, n in sorted(work.poison)))
    try:
        with open_backend(args) as backend:
            obs = Observer(work.groups)
            outcome = run(args, backend, work, obs, lambda i: random.Random(seed * 1000 + i))
        return 0 if report(args, backend, work, obs, outcome) else 1
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    except RqlitedNotFound as exc:
        log(f"error: no usable rqlited for the demo's cluster: {exc}")
        log("Or run the demo on the embedded queue: --backend sqlite")
        return 2
    except ClusterError as exc:  # a node that could not start: its own reason first
        first, _, details = str(exc).partition("\n")
        log(f"error: the demo's cluster did not start: {first}")
        log("its log's last lines:" if _state.verbose else "(its log: 'rqlite-queue -v demo')")
        if _state.verbose:
            for line in details.splitlines():
                log(f"  {line}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
