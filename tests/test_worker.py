"""The worker runtime on SQLite and a 3-node rqlite cluster, threads and asyncio."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rqlite_queue import AsyncTransport, Lease, Transport
from rqlite_queue.worker import AsyncWorker, Backoff, Worker


@pytest.fixture
def queue() -> str:
    return f"w_{uuid.uuid4().hex[:10]}"


def run_sync(worker: Worker, until: Callable[[], bool], timeout: float = 20) -> None:
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        time.sleep(0.02)
    worker.stop()
    thread.join(timeout)
    assert not thread.is_alive()


class Recorder:
    """Records what the handler saw, and checks exclusivity as it goes."""

    def __init__(self, fail: Callable[[Lease], bool] = lambda lease: False, work: float = 0):
        self.lock = threading.Lock()
        self.busy: set[str] = set()
        self.overlaps = 0
        self.done: dict[str, list[Any]] = defaultdict(list)
        self.calls = 0
        self.fail = fail
        self.work = work

    def __call__(self, lease: Lease) -> None:
        with self.lock:
            self.calls += 1
            if lease.group_id in self.busy:
                self.overlaps += 1
            self.busy.add(lease.group_id)
        try:
            time.sleep(self.work)
            if self.fail(lease):
                raise ValueError(f"cannot handle {lease.event}")
            with self.lock:
                self.done[lease.group_id].append(lease.event)
        finally:
            with self.lock:
                self.busy.discard(lease.group_id)

    def count(self) -> int:
        with self.lock:
            return sum(len(v) for v in self.done.values())


def test_a_thread_worker_drains_in_order_and_exclusively(url: str, queue: str) -> None:
    q = Transport.from_url(url, queue=queue)
    q.publish_many([(f"g{i % 10}", i) for i in range(100)])
    recorder = Recorder(work=0.002)
    worker = Worker(q, recorder, concurrency=6, visibility=10)
    run_sync(worker, lambda: recorder.count() == 100)
    assert recorder.count() == 100 and recorder.overlaps == 0
    for g, events in recorder.done.items():
        assert events == sorted(events), g
    assert worker.stats.acked == 100
    assert worker.stats.claim_rounds < 100  # claimed in batches
    assert q.stats().depth == 0
    q.close()


async def test_an_async_worker_drains_with_async_and_sync_handlers(url: str, queue: str) -> None:
    q = await AsyncTransport.from_url(url, queue=queue)
    await q.publish_many([(f"g{i % 5}", i) for i in range(40)])
    seen: dict[str, list[int]] = defaultdict(list)
    busy: set[str] = set()
    overlaps = 0

    async def handler(lease: Lease) -> None:
        nonlocal overlaps
        overlaps += lease.group_id in busy
        busy.add(lease.group_id)
        await asyncio.sleep(0.002)
        seen[lease.group_id].append(lease.event)
        busy.discard(lease.group_id)

    worker = AsyncWorker(q, handler, concurrency=4, visibility=10)
    task = asyncio.create_task(worker.run(handle_signals=False))
    for _ in range(1000):
        if sum(map(len, seen.values())) == 40:
            break
        await asyncio.sleep(0.02)
    worker.stop()
    await asyncio.wait_for(task, 30)
    assert sum(map(len, seen.values())) == 40 and overlaps == 0
    assert all(v == sorted(v) for v in seen.values())

    await q.publish_many([("s", i) for i in range(5)])
    sync_seen: list[int] = []
    worker = AsyncWorker(q, lambda lease: sync_seen.append(lease.event), visibility=10)
    task = asyncio.create_task(worker.run(handle_signals=False))
    for _ in range(500):
        if len(sync_seen) == 5:
            break
        await asyncio.sleep(0.02)
    worker.stop()
    await asyncio.wait_for(task, 30)
    assert sync_seen == [0, 1, 2, 3, 4]
    await q.close()


def test_retry_then_park_then_dead_letter(url: str, queue: str) -> None:
    q = Transport.from_url(url, queue=queue)
    q.publish_many([("bad", "poison"), ("bad", "after"), ("ok", 1)])
    recorder = Recorder(fail=lambda lease: lease.event == "poison")
    worker = Worker(q, recorder, max_attempts=3, backoff=Backoff(base=0.2, jitter=0), visibility=10)
    started = time.monotonic()
    run_sync(worker, lambda: recorder.count() == 2)
    # Parked between attempts: 0.2 s then 0.4 s before the third try.
    assert time.monotonic() - started >= 0.6
    assert recorder.calls == 5  # 3 tries of the poison, then "after" and "ok"
    assert recorder.done == {"ok": [1], "bad": ["after"]}
    [dead] = q.dead_letters()
    assert (dead.event, dead.attempts) == ("poison", 3)
    assert dead.reason == "ValueError: cannot handle poison"
    assert (worker.stats.nacked, worker.stats.dead_lettered) == (2, 1)
    q.close()


def test_heartbeats_keep_a_long_handlers_lease(url: str, queue: str) -> None:
    q = Transport.from_url(url, queue=queue)
    q.publish("slow", 1)
    recorder = Recorder(work=2.5)
    worker = Worker(q, recorder, visibility=1.0)
    thief = Transport.from_url(url, queue=queue)
    stolen: list[Lease] = []

    def steal() -> bool:
        if recorder.calls == 0:
            return False  # the worker has not taken the message yet
        lease = thief.claim("thief", 5)
        if lease is not None:
            stolen.append(lease)
        return recorder.count() == 1

    run_sync(worker, steal)
    assert stolen == []  # the lease never lapsed while the handler ran
    assert worker.stats.extended >= 2
    assert worker.stats.acked == 1 and worker.stats.leases_lost == 0
    thief.close()
    q.close()


def test_graceful_shutdown_finishes_or_nacks_and_loses_nothing(url: str, queue: str) -> None:
    q = Transport.from_url(url, queue=queue)
    q.publish_many([(f"g{i}", i) for i in range(6)])
    recorder = Recorder(work=0.5)
    worker = Worker(q, recorder, concurrency=3, visibility=30, grace=5)
    run_sync(worker, lambda: recorder.calls == 3, timeout=10)
    # Stopped while 3 handlers ran: they finished within the grace period and were acked.
    assert recorder.count() == 3 and worker.stats.acked == 3
    assert q.stats().depth == 3 and q.stats().in_flight == 0

    slow = Recorder(work=3)
    worker = Worker(q, slow, concurrency=2, visibility=30, grace=0.2)
    run_sync(worker, lambda: slow.calls == 2, timeout=10)
    # Grace too short: the two running were nacked, so they are claimable again right away.
    assert worker.stats.nacked == 2
    stats = q.stats()
    assert (stats.depth, stats.in_flight) == (3, 0)
    leases = q.claim_many("next", 30, 3)
    assert len(leases) == 3
    q.close()


def test_an_idle_worker_reads_instead_of_writing_and_picks_up_within_a_poll(
    tmp_path: Path,
) -> None:
    q = Transport.from_url(f"sqlite:///{tmp_path}/q.db")
    seen: list[float] = []
    worker = Worker(q, lambda lease: seen.append(time.monotonic()), poll_interval=0.05)
    started = time.monotonic()
    run_sync(worker, lambda: time.monotonic() - started > 1.0)
    # One write (the first claim found nothing), then reads only, about one per poll.
    assert worker.stats.rounds == 1
    assert 10 <= worker.stats.probes <= 25
    q.close()


def test_priority_share_serves_high_priority_groups_first(tmp_path: Path) -> None:
    q = Transport.from_url(f"sqlite:///{tmp_path}/q.db")
    q.publish_many([(f"low{i}", i, 0) for i in range(20)] + [(f"high{i}", i, 4) for i in range(5)])
    order: list[str] = []
    worker = Worker(q, lambda lease: order.append(lease.group_id), concurrency=1,
                    priority_share=0.5, priority_floor=4)  # fmt: skip
    run_sync(worker, lambda: len(order) == 25)
    # Every other claim takes a high-priority group while there is one.
    assert [g.startswith("high") for g in order[:10]] == [True, False] * 5
    q.close()


def test_a_stuck_handler_does_not_keep_the_process_alive(tmp_path: Path) -> None:
    """After the grace period the stuck handler's lease is nacked and the process may exit."""
    script = f"""
import threading, time
from rqlite_queue import Transport
from rqlite_queue.worker import Worker
q = Transport.from_url("sqlite:///{tmp_path}/q.db")
q.publish("g", 1)
started = threading.Event()
def handler(lease):
    started.set()
    time.sleep(30)
worker = Worker(q, handler, grace=0.3)
threading.Thread(target=lambda: (started.wait(), worker.stop())).start()
worker.run(handle_signals=False)
print("nacked", worker.stats.nacked)
"""
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "nacked 1"
    assert time.monotonic() - started < 15
