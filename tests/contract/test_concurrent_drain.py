"""A concurrent drain: 8 workers over 50 groups x 20 messages, on SQLite and a 3-node rqlite.

Guarantees 1 (FIFO per group) and 2 (exclusivity) under real concurrency, plus "each message
is processed exactly once" when no lease lapses (visibility 60 s, the real clock). Three ways
of being concurrent: threads with a sync transport each, asyncio tasks (sharing one async
transport, or one each), and spawned processes that each build a transport from a URL.

Every worker logs, per message, `(group, i, worker, t_claim, t_ack, attempts)`: `t_claim` is
taken just after `claim` returned, `t_ack` just before `ack` is called, so each logged interval
lies inside the time the worker really held the group, and two logged intervals of one group
that overlap prove a real overlap. `check_drain` (a pure function) judges the logs. In-process
variants also keep a lock-protected "in flight" set that catches an overlap the moment it
happens."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rqlite_queue import (
    AsyncRqliteTransport,
    AsyncSqliteTransport,
    AsyncTransport,
    Lease,
    LeaseLost,
    RqliteTransport,
    SqliteTransport,
    Transport,
)

GROUPS = 50
PER_GROUP = 20
VISIBILITY = 60.0
EMPTY_POLLS = 3  # consecutive polls that see an empty queue before a worker stops
IDLE_SLEEP = 0.005

pytestmark = pytest.mark.timeout(180)


# ---------------------------------------------------------------------------- the checker


@dataclass(frozen=True, slots=True)
class Record:
    """One message as a worker processed it."""

    group: int
    i: int
    worker: str
    t_claim: float
    t_ack: float
    attempts: int = 1
    acked: bool = True
    """False: `ack` raised `LeaseLost` (the worker logs it and goes on)."""


def check_drain(
    records: Iterable[Record], groups: int = GROUPS, per_group: int = PER_GROUP
) -> list[str]:
    """Every way the logs break the contract; empty when they do not.

    - each `(group, i)` processed exactly once, and nothing else processed;
    - per group, the `i` in ack order are 0, 1, ..., per_group - 1 (FIFO);
    - no two logged holds of one group overlap (exclusivity);
    - every lease was a first delivery (attempts == 1: no lease may lapse in this drain);
    - every ack succeeded (no `LeaseLost`)."""
    records = list(records)
    problems: list[str] = []
    seen = Counter((r.group, r.i) for r in records)
    expected = {(g, i) for g in range(groups) for i in range(per_group)}
    missing = sorted(expected - set(seen))
    if missing:
        problems.append(f"{len(missing)} messages never processed, e.g. {missing[:5]}")
    extra = sorted(set(seen) - expected)
    if extra:
        problems.append(f"unknown messages processed: {extra[:5]}")
    twice = sorted(key for key, count in seen.items() if count > 1)
    if twice:
        problems.append(f"{len(twice)} messages processed more than once, e.g. {twice[:5]}")
    lost = [r for r in records if not r.acked]
    if lost:
        problems.append(f"{len(lost)} acks raised LeaseLost, e.g. {lost[:3]}")
    redelivered = [r for r in records if r.attempts != 1]
    if redelivered:
        problems.append(f"{len(redelivered)} redeliveries, e.g. {redelivered[:3]}")
    by_group: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        by_group[r.group].append(r)
    for group, rs in sorted(by_group.items()):
        in_ack_order = [r.i for r in sorted(rs, key=lambda r: r.t_ack)]
        if in_ack_order != list(range(per_group)):
            problems.append(f"group {group}: acked out of order: {in_ack_order}")
        latest: Record | None = None  # the record with the latest t_ack so far
        for r in sorted(rs, key=lambda r: r.t_claim):
            if r.t_ack < r.t_claim:
                problems.append(f"group {group}: bad interval {r}")
            if latest is not None and r.t_claim < latest.t_ack:
                problems.append(f"group {group}: held twice at once: {latest} and {r}")
            if latest is None or r.t_ack > latest.t_ack:
                latest = r
    return problems


def workers_used(records: Iterable[Record]) -> Counter[str]:
    return Counter(r.worker for r in records)


def assert_clean_drain(records: list[Record], overlaps: list[str], workers: int) -> None:
    problems = overlaps + check_drain(records)
    assert not problems, "\n".join(problems[:20])
    used = workers_used(records)
    # The test must be able to fail: the work really was spread over several workers.
    assert len(used) >= max(2, workers // 2), f"only {dict(used)} did any work"
    assert len(used) <= workers


def test_the_checker_accepts_a_clean_log_and_catches_each_kind_of_violation() -> None:
    def log(shift: float = 0.0) -> list[Record]:
        return [
            Record(g, i, f"w{(g + i) % 3}", t := g * 100 + i * 2.0 + shift, t + 1.0)
            for g in range(2)
            for i in range(3)
        ]

    assert check_drain(log(), groups=2, per_group=3) == []
    clean = log()
    # An overlap: w9 holds group 0 while message 1 is held.
    overlap = [*clean[:1], Record(0, 1, "w9", 0.5, 2.5), *clean[2:]]
    assert any("held twice" in p for p in check_drain(overlap, 2, 3))
    # A hold nested inside a longer one is an overlap too.
    nested = [Record(0, 0, "a", 0.0, 10.0), Record(0, 1, "b", 2.0, 3.0), Record(0, 2, "c", 11, 12)]
    assert any("held twice" in p for p in check_drain(nested, 1, 3))
    # Out of order: message 1 acked before message 0.
    swapped = [Record(0, 1, "a", 0.0, 1.0), Record(0, 0, "b", 2.0, 3.0), Record(0, 2, "c", 4, 5)]
    assert any("out of order" in p for p in check_drain(swapped, 1, 3))
    assert any("never processed" in p for p in check_drain(clean[1:], 2, 3))
    assert any("more than once" in p for p in check_drain([*clean, clean[0]], 2, 3))
    redelivered = [Record(0, 0, "a", 0, 1, attempts=2), Record(0, 1, "a", 2, 3)]
    assert any("redeliveries" in p for p in check_drain(redelivered, 1, 2))
    fenced = [Record(0, 0, "a", 0, 1, acked=False), Record(0, 1, "a", 2, 3)]
    assert any("LeaseLost" in p for p in check_drain(fenced, 1, 2))


# ------------------------------------------------------------------------------- plumbing


def new_queue_name() -> str:
    return f"drain_{uuid.uuid4().hex[:8]}"


def the_messages() -> list[tuple[str, dict[str, int]]]:
    """50 x 20, interleaved across groups (seq order: g0/0, g1/0, ..., g49/0, g0/1, ...)."""
    return [(f"g{g:02d}", {"g": g, "i": i}) for i in range(PER_GROUP) for g in range(GROUPS)]


@pytest.fixture(params=["sqlite", "rqlite3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the queue lives: a SQLite file path, or the 3-node cluster's comma-joined URL."""
    if request.param == "sqlite":
        return os.fspath(tmp_path / "drain.db")
    return str(request.getfixturevalue("rqlite_cluster3").url)


def is_sqlite(target: str) -> bool:
    return not target.startswith(("http://", "https://"))


def sync_transport(target: str, queue: str) -> Transport:
    if is_sqlite(target):
        return SqliteTransport(target, queue=queue)
    return RqliteTransport(target, queue=queue)


def async_transport(target: str, queue: str) -> AsyncTransport:
    if is_sqlite(target):
        return AsyncSqliteTransport(target, queue=queue)
    return AsyncRqliteTransport(target, queue=queue)


def publish_all(target: str, queue: str) -> None:
    with sync_transport(target, queue) as q:
        seqs = q.publish_many(the_messages())
        assert len(seqs) == GROUPS * PER_GROUP
        stats = q.stats()
        assert (stats.depth, stats.groups) == (GROUPS * PER_GROUP, GROUPS)


def assert_drained(target: str, queue: str) -> None:
    with sync_transport(target, queue) as q:
        stats = q.stats()
        assert (stats.depth, stats.groups, stats.in_flight, stats.dead) == (0, 0, 0, 0)


@dataclass
class InFlight:
    """The groups held right now, across the in-process workers: a second hold is recorded."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    held: dict[int, str] = field(default_factory=dict)
    overlaps: list[str] = field(default_factory=list)

    def take(self, group: int, worker: str) -> None:
        with self.lock:
            if group in self.held:
                self.overlaps.append(f"group {group}: {worker} got it while {self.held[group]}")
            self.held[group] = worker

    def give_back(self, group: int, worker: str) -> None:
        with self.lock:
            if self.held.get(group) == worker:
                del self.held[group]


def worker_takes_many(index: int) -> int:
    """Odd workers claim two groups at a time with `claim_many`; even ones use `claim`."""
    return 2 if index % 2 else 1


# ------------------------------------------------------------------ the sync worker loop


def sync_worker(
    q: Transport, worker: str, take: int, log: list[Record], in_flight: InFlight | None
) -> None:
    rng = random.Random(worker)
    empty = 0
    while empty < EMPTY_POLLS:
        leases: list[Lease]
        if take == 1:
            lease = q.claim(worker, VISIBILITY)
            leases = [] if lease is None else [lease]
        else:
            leases = q.claim_many(worker, VISIBILITY, take)
        t_claim = time.monotonic()
        if not leases:
            if q.stats().depth == 0:
                empty += 1
            else:
                empty = 0
            time.sleep(IDLE_SLEEP)
            continue
        empty = 0
        if in_flight is not None:
            for lease in leases:
                in_flight.take(lease.event["g"], worker)
        for lease in leases:
            time.sleep(rng.uniform(0, 0.002))  # the work
            t_ack = time.monotonic()
            g, i = lease.event["g"], lease.event["i"]
            if in_flight is not None:
                in_flight.give_back(g, worker)
            try:
                q.ack(lease)
                acked = True
            except LeaseLost:
                acked = False
            log.append(Record(g, i, worker, t_claim, t_ack, lease.attempts, acked))


# ------------------------------------------------------------------ 1. threads


def test_threads_with_a_transport_each(target: str) -> None:
    queue = new_queue_name()
    publish_all(target, queue)
    workers = 8
    logs: list[list[Record]] = [[] for _ in range(workers)]
    errors: list[BaseException] = []
    in_flight = InFlight()
    start = threading.Barrier(workers)

    def run(index: int) -> None:
        try:
            with sync_transport(target, queue) as q:
                q.setup()
                start.wait(timeout=30)
                sync_worker(q, f"t{index}", worker_takes_many(index), logs[index], in_flight)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=150)
    assert not any(t.is_alive() for t in threads), "a worker thread did not finish"
    assert not errors, errors
    assert_clean_drain([r for log in logs for r in log], in_flight.overlaps, workers)
    assert_drained(target, queue)


# ------------------------------------------------------------------ 2. asyncio tasks


async def async_worker(
    q: AsyncTransport, worker: str, take: int, log: list[Record], in_flight: InFlight
) -> None:
    rng = random.Random(worker)
    empty = 0
    while empty < EMPTY_POLLS:
        leases: list[Lease]
        if take == 1:
            lease = await q.claim(worker, VISIBILITY)
            leases = [] if lease is None else [lease]
        else:
            leases = await q.claim_many(worker, VISIBILITY, take)
        t_claim = time.monotonic()
        if not leases:
            if (await q.stats()).depth == 0:
                empty += 1
            else:
                empty = 0
            await asyncio.sleep(IDLE_SLEEP)
            continue
        empty = 0
        for lease in leases:
            in_flight.take(lease.event["g"], worker)
        for lease in leases:
            await asyncio.sleep(rng.uniform(0, 0.002))  # the work
            t_ack = time.monotonic()
            g, i = lease.event["g"], lease.event["i"]
            in_flight.give_back(g, worker)
            try:
                await q.ack(lease)
                acked = True
            except LeaseLost:
                acked = False
            log.append(Record(g, i, worker, t_claim, t_ack, lease.attempts, acked))


@pytest.mark.parametrize("sharing", ["shared", "one_each"])
async def test_asyncio_tasks(target: str, sharing: str) -> None:
    queue = new_queue_name()
    publish_all(target, queue)
    workers = 8
    logs: list[list[Record]] = [[] for _ in range(workers)]
    in_flight = InFlight()
    transports = [
        async_transport(target, queue) for _ in range(1 if sharing == "shared" else workers)
    ]
    try:
        for q in transports:
            await q.setup()
        await asyncio.wait_for(
            asyncio.gather(
                *(
                    async_worker(
                        transports[i % len(transports)],
                        f"a{i}",
                        worker_takes_many(i),
                        logs[i],
                        in_flight,
                    )
                    for i in range(workers)
                )
            ),
            timeout=150,
        )
    finally:
        for q in transports:
            await q.close()
    assert_clean_drain([r for log in logs for r in log], in_flight.overlaps, workers)
    assert_drained(target, queue)


# ------------------------------------------------------------------ 3. processes


def process_worker(url: str, queue: str, worker: str, take: int, out: str, start: Any) -> None:
    """Runs in a spawned process: its own transport from a URL, its log as JSON lines."""
    log: list[Record] = []
    with Transport.from_url(url, queue=queue) as q:
        start.wait(60)
        sync_worker(q, worker, take, log, None)
    with open(out, "w", encoding="utf-8") as f:
        for r in log:
            row = [r.group, r.i, r.worker, r.t_claim, r.t_ack, r.attempts, r.acked]
            f.write(json.dumps(row) + "\n")


def read_log(path: Path) -> Iterator[Record]:
    for line in path.read_text(encoding="utf-8").splitlines():
        yield Record(*json.loads(line))


def test_processes_with_a_transport_each(target: str, tmp_path: Path) -> None:
    queue = new_queue_name()
    publish_all(target, queue)
    url = "sqlite:///" + target if is_sqlite(target) else target
    workers = 4
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(workers + 1)
    outs = [tmp_path / f"p{i}.jsonl" for i in range(workers)]
    procs = [
        ctx.Process(
            target=process_worker,
            args=(url, queue, f"p{i}", worker_takes_many(i), os.fspath(outs[i]), start),
        )
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    try:
        start.wait(60)  # every process is up and connected: go
        for p in procs:
            p.join(timeout=150)
        assert [p.exitcode for p in procs] == [0] * workers
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    records = [r for out in outs for r in read_log(out)]
    assert_clean_drain(records, [], workers)
    assert_drained(target, queue)
