"""The worker runtime on SQLite and a 3-node rqlite cluster, threads and asyncio."""

from __future__ import annotations

import asyncio
import gc
import logging
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

from rqlite_queue import (
    AsyncSqliteTransport,
    AsyncTransport,
    InvalidArgument,
    Lease,
    SqliteTransport,
    Transport,
)
from rqlite_queue._protocol.plan import Batch, Statement
from rqlite_queue.errors import SchemaError, TransportClosed
from rqlite_queue.testing import Cluster
from rqlite_queue.worker import AsyncWorker, Backoff, Park, Worker


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
    # (No prefetch: a round then claims one message, and shares are by round.)
    worker = Worker(q, lambda lease: order.append(lease.group_id), concurrency=1,
                    priority_share=0.5, priority_floor=4, prefetch=0)  # fmt: skip
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


def test_non_retryable_errors_are_dead_lettered_at_once(url: str, queue: str) -> None:
    q = Transport.from_url(url, queue=queue)
    q.publish_many([("card", "declined"), ("card", "next")])

    def handler(lease: Lease) -> None:
        if lease.event == "declined":
            raise PermissionError("card declined")

    worker = Worker(q, handler, max_attempts=5, non_retryable=(PermissionError,))
    run_sync(worker, lambda: worker.stats.acked == 1)
    [dead] = q.dead_letters()
    assert (dead.event, dead.attempts, dead.reason) == (
        "declined",
        1,
        "PermissionError: card declined",
    )
    q.close()


def test_park_puts_the_message_back_for_the_chosen_delay_and_never_dead_letters(
    tmp_path: Path,
) -> None:
    q = Transport.from_url(f"sqlite:///{tmp_path}/q.db")
    q.publish_many([("rate-limited", 1), ("rate-limited", 2)])
    calls: list[tuple[Any, float]] = []

    def handler(lease: Lease) -> None:
        calls.append((lease.event, time.monotonic()))
        if lease.event == 1 and lease.attempts < 3:
            raise Park(0.3, "API rate limit")

    worker = Worker(q, handler, max_attempts=1, poll_interval=0.02)
    run_sync(worker, lambda: worker.stats.acked == 2)
    assert [event for event, _ in calls] == [1, 1, 1, 2]  # order kept, parked twice
    assert calls[1][1] - calls[0][1] >= 0.3
    assert q.dead_letters() == [] and worker.stats.nacked == 2
    q.close()


def test_a_dead_letter_can_hold_its_group_until_released(url: str, queue: str) -> None:
    q = Transport.from_url(url, queue=queue)
    q.publish_many([("order", "charge"), ("order", "ship"), ("other", 1)])

    def handler(lease: Lease) -> None:
        if lease.event == "charge":
            raise ValueError("declined")

    seen: list[Any] = []
    worker = Worker(
        q,
        lambda lease: (seen.append(lease.event), handler(lease)),
        max_attempts=1,
        hold_group_on_dead_letter=True,
    )
    run_sync(worker, lambda: worker.stats.dead_lettered == 1 and worker.stats.acked == 1)
    assert "ship" not in seen  # the later step did not run after the earlier one died
    stats = q.stats()
    assert (stats.held, stats.depth) == (1, 1)
    assert q.release_group("order")
    assert q.claim("w", 30).event == "ship"
    q.close()


def test_until_empty_returns_once_the_queue_is_drained(url: str, queue: str) -> None:
    q = Transport.from_url(url, queue=queue)
    q.publish_many([(f"g{i % 3}", i) for i in range(12)])
    done: list[int] = []
    worker = Worker(q, lambda lease: done.append(lease.event), concurrency=3)
    worker.run(handle_signals=False, until_empty=True)
    assert sorted(done) == list(range(12)) and q.stats().depth == 0
    q.close()


def test_permanent_errors_stop_the_worker(tmp_path: Path) -> None:
    path = f"{tmp_path}/q.db"
    q = Transport.from_url(f"sqlite:///{path}", queue="newer")
    q.router.backend.executor.execute(  # what a future version of the library would have written
        Batch((Statement("UPDATE rq_newer_meta SET value = 99 WHERE key = 'schema_version'"),)),
        time.monotonic() + 10,
    )
    q.close()
    fresh = SqliteTransport(path, queue="newer")
    with pytest.raises(SchemaError):
        Worker(fresh, lambda lease: None).run(handle_signals=False)
    closed = Transport.from_url(f"sqlite:///{tmp_path}/other.db")
    closed.close()
    with pytest.raises(TransportClosed):
        Worker(closed, lambda lease: None).run(handle_signals=False)


def test_no_handler_starts_once_run_has_raised(url: str, queue: str) -> None:
    """Prefetched leases wait in the pool for a free thread; when a permanent error stops the
    worker, none of them may start after `run` raised (no call can give them back: their
    leases lapse). They did: a rolling upgrade's old worker, refused by the schema fence, went
    on starting handlers after its refusal."""
    q = Transport.from_url(url, queue=queue)
    q.publish_many([(f"g{i}", i) for i in range(400)])
    starts: list[float] = []
    waiting: list[int] = []

    def handler(lease: Lease) -> None:
        starts.append(time.monotonic())
        if len(starts) == 100:
            waiting.append(len(worker._waiting))
            q.close()  # the round settling the one before raises TransportClosed
            time.sleep(0.3)  # while the leases claimed ahead of this one wait for its thread

    worker = Worker(q, handler, concurrency=1, prefetch=64)
    with pytest.raises(TransportClosed):
        worker.run(handle_signals=False)
    raised = time.monotonic()
    time.sleep(0.5)  # a waiting handler, were one to run, would start at once
    assert waiting[0] > 0  # (what this test is about: leases claimed ahead, waiting)
    assert [t for t in starts if t > raised] == [], (len(starts), waiting)


def test_a_handler_of_the_wrong_kind_is_refused_at_construction(tmp_path: Path) -> None:
    q = Transport.from_url(f"sqlite:///{tmp_path}/q.db")

    async def handler(lease: Lease) -> None:
        return None

    with pytest.raises(InvalidArgument, match="AsyncWorker"):
        Worker(q, handler)
    with pytest.raises(InvalidArgument):
        Worker(q, "not callable")  # type: ignore[arg-type]
    q.close()


def test_a_failure_log_line_carries_the_traceback_and_the_message_fields(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = Transport.from_url(f"sqlite:///{tmp_path}/q.db")
    q.publish("g", "boom")

    def handler(lease: Lease) -> None:
        raise RuntimeError("it broke")

    worker = Worker(q, handler, max_attempts=1)
    with caplog.at_level(logging.ERROR, logger="rqlite_queue.worker"):
        run_sync(worker, lambda: worker.stats.dead_lettered == 1)
    [record] = [r for r in caplog.records if "dead-lettered" in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is RuntimeError
    fields = {k: getattr(record, k) for k in ("group_id", "seq", "attempts", "worker_id")}
    assert fields == {"group_id": "g", "seq": 1, "attempts": 1, "worker_id": worker.worker_id}
    q.close()


def raft_index(cluster: Cluster) -> int:
    return int(cluster.leader().status()["store"]["raft"]["last_log_index"])


def test_one_raft_entry_per_message_at_concurrency_one_and_none_when_idle(
    rqlite_cluster3: Cluster, queue: str
) -> None:
    q = Transport.from_url(rqlite_cluster3.url, queue=queue)
    q.publish_many([(f"g{i % 7}", i) for i in range(60)])
    done: list[int] = []
    worker = Worker(q, lambda lease: done.append(lease.event), concurrency=1, poll_interval=0.02)
    before = raft_index(rqlite_cluster3)
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    deadline = time.monotonic() + 30
    while len(done) < 60 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # the last ack went with the next (empty) claim
    drained = raft_index(rqlite_cluster3)
    # One write per message (the last one's ack rides with a claim that finds nothing).
    assert len(done) == 60 and drained - before <= 61
    time.sleep(1.5)  # idle: reads only
    assert raft_index(rqlite_cluster3) == drained
    assert worker.stats.probes >= 20
    q.publish("late", "x")
    picked = time.monotonic()
    while "x" not in done and time.monotonic() - picked < 5:
        time.sleep(0.005)
    assert "x" in done and time.monotonic() - picked < 0.5
    worker.stop()
    thread.join(10)
    q.close()


def test_a_round_settles_and_refills_many_slots_at_once(
    rqlite_cluster3: Cluster, queue: str
) -> None:
    q = Transport.from_url(rqlite_cluster3.url, queue=queue)
    q.publish_many([(f"g{i}", i) for i in range(400)])
    done: list[int] = []
    worker = Worker(q, lambda lease: done.append(lease.event), concurrency=32)
    run_sync(worker, lambda: len(done) == 400)
    assert worker.stats.acked == 400
    assert worker.stats.rounds < 400 / 4  # many messages per write
    q.close()


class StuckClaims:
    """An executor whose claiming round trips get stuck (as on a frozen leader, until the
    transport fails over) after the first `free` ones; other requests go through."""

    def __init__(self, inner: Any, stuck: float, free: int = 1) -> None:
        self.inner, self.stuck, self.free = inner, stuck, free
        self.stuck_rounds = 0

    def _stuck(self, batch: Batch) -> bool:
        claims = any(
            s.sql.startswith("INSERT") and "claims (token, expires_at" in s.sql
            for s in batch.statements
        )
        if not claims:
            return False
        if self.free > 0:
            self.free -= 1
            return False
        self.stuck_rounds += 1
        return True

    def execute(self, batch: Batch, deadline: float, **hints: Any) -> Any:
        if self._stuck(batch):
            time.sleep(self.stuck)
        return self.inner.execute(batch, deadline, **hints)

    def close(self) -> None:
        self.inner.close()


class AsyncStuckClaims(StuckClaims):
    async def execute(self, batch: Batch, deadline: float, **hints: Any) -> Any:  # type: ignore[override]
        if self._stuck(batch):
            await asyncio.sleep(self.stuck)
        return await self.inner.execute(batch, deadline, **hints)

    async def close(self) -> None:  # type: ignore[override]
        await self.inner.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_leases_are_kept_ahead_of_their_deadline_while_a_round_is_stuck(
    tmp_path: Path, flavour: str
) -> None:
    """A round trip stuck for twice the visibility: the leases of running handlers, and of
    the settlements in the stuck round, are extended beside it by requests of their own, so
    none lapses and none is taken over. Another worker that claims everything while the round
    is stuck gets only the free group."""
    path = str(tmp_path / "q.db")
    with SqliteTransport(path, queue="kept") as setup:
        setup.publish_many([("slow", 1), ("fast", 2), ("free", 3)])
    started = time.monotonic()
    taken: list[Lease] = []

    def thief() -> None:
        # 1.6 s in: the round stuck since ~0.2 s (until ~2.2 s); the slow lease, taken at 0 s
        # for 1 s, would have lapsed by now, and so would the fast one, whose ack is stuck.
        time.sleep(1.6)
        with SqliteTransport(path, queue="kept") as other:
            taken.extend(other.claim_many("thief", 30, 3))

    stealing = threading.Thread(target=thief)
    stealing.start()
    if flavour == "sync":
        q: Any = SqliteTransport(path, queue="kept")
        stuck: StuckClaims = StuckClaims(q.router.backend.executor, stuck=2.0)
        q.router.backend.executor = stuck
        worker: Any = Worker(q, lambda lease: time.sleep(3.0 if lease.event == 1 else 0.2),
                             concurrency=2, visibility=1.0)  # fmt: skip
        worker.run(handle_signals=False, until_empty=True)
        q.close()
    else:

        async def main() -> tuple[Any, StuckClaims]:
            aq = AsyncSqliteTransport(path, queue="kept")
            stuck = AsyncStuckClaims(aq.router.backend.executor, stuck=2.0)
            aq.router.backend.executor = stuck

            async def handle(lease: Lease) -> None:
                await asyncio.sleep(3.0 if lease.event == 1 else 0.2)

            aworker = AsyncWorker(aq, handle, concurrency=2, visibility=1.0)
            await aworker.run(handle_signals=False, until_empty=True)
            await aq.close()
            return aworker, stuck

        worker, stuck = asyncio.run(main())
    stealing.join()
    assert stuck.stuck_rounds >= 1 and time.monotonic() - started > 3
    assert [lease.group_id for lease in taken] == ["free"], taken  # never "slow" nor "fast"
    assert worker.stats.leases_lost == 0 and worker.stats.acked == 2


# ------------------------------------------------------------------------------ follow-ups


def test_a_handlers_return_value_is_ignored_without_follow_ups(url: str, queue: str) -> None:
    q = Transport.from_url(url, queue=queue)
    q.publish("a", 1)
    worker = Worker(q, lambda lease: [("b", 2)])
    worker.run(handle_signals=False, until_empty=True)
    assert worker.stats.acked == 1 and worker.stats.published == 0
    assert q.stats().depth == 0
    q.close()


def test_the_follow_ups_a_handler_returns_are_published_with_its_ack(url: str, queue: str) -> None:
    """Each hop returns the next one (its own group, after it) and a side message (another
    group, a priority): all published, in order, once each."""
    q = Transport.from_url(url, queue=queue)
    q.publish("chain", 0)
    seen: list[tuple[str, Any]] = []

    def hop(lease: Lease) -> list[Any] | None:
        seen.append((lease.group_id, lease.event))
        if lease.group_id != "chain" or lease.event == 4:
            return None
        n = lease.event
        return [("chain", n + 1), {"group_id": f"side-{n}", "event": n, "priority": 2}]

    worker = Worker(q, hop, follow_ups=True, concurrency=3)
    worker.run(handle_signals=False, until_empty=True)
    assert [e for g, e in seen if g == "chain"] == [0, 1, 2, 3, 4]
    assert sorted(e for g, e in seen if g != "chain") == [0, 1, 2, 3]
    assert len(seen) == 9 and worker.stats.published == 8
    assert q.stats().depth == 0
    q.close()


def test_a_failed_attempt_publishes_nothing_and_the_next_ones_follow_ups_count(
    url: str, queue: str
) -> None:
    q = Transport.from_url(url, queue=queue)
    q.publish("a", "start")
    attempts: list[int] = []

    def flaky(lease: Lease) -> list[Any] | None:
        if lease.event != "start":
            return None
        attempts.append(lease.attempts)
        if lease.attempts < 3:
            raise ValueError("not yet")
        return [("b", f"after attempt {lease.attempts}")]

    done: list[Any] = []

    def handle(lease: Lease) -> list[Any] | None:
        if lease.group_id == "b":
            done.append(lease.event)
        return flaky(lease)

    worker = Worker(q, handle, follow_ups=True, backoff=Backoff(base=0.01, cap=0.01))
    run_sync(worker, lambda: bool(done))  # until_empty would stop while it waits to retry
    assert attempts == [1, 2, 3]
    assert done == ["after attempt 3"]
    q.close()


@pytest.mark.parametrize(
    "returned",
    [
        "a string",
        {"group_id": "b", "event": 1},  # a mapping: one item, not a list of them
        42,  # not iterable
        [("b", 1, 9)],  # priority out of range
        [("", 1)],  # empty group
        [("b",)],  # no event
    ],
    ids=["str", "mapping", "int", "priority", "group", "short"],
)
def test_bad_follow_ups_fail_their_own_message(tmp_path: Path, returned: Any) -> None:
    """Checked when the handler returns: the message fails as if the handler had raised
    (here dead-lettered at once), nothing of its follow-ups is published, and the worker
    goes on with the other messages."""
    q = SqliteTransport(str(tmp_path / "q.db"), queue="bad")
    q.publish_many([("a", "bad"), ("c", "good")])

    def handle(lease: Lease) -> Any:
        if lease.event == "bad":
            return returned
        return [("d", "from good")] if lease.event == "good" else None

    worker = Worker(q, handle, follow_ups=True, max_attempts=1)
    worker.run(handle_signals=False, until_empty=True)
    [dead] = q.dead_letters()
    assert dead.event == "bad"
    assert dead.reason.startswith("InvalidArgument: the handler returned bad follow-ups")
    assert worker.stats.acked == 2 and worker.stats.published == 1  # "good" and its follow-up
    assert q.stats().depth == 0
    q.close()


def test_two_handlers_follow_ups_with_one_dedup_id_are_published_once(url: str, queue: str) -> None:
    """A round refuses two leases' follow-ups that share a dedup id: the Worker sends the
    second in a later round, where the dedup id makes it a duplicate."""
    q = Transport.from_url(url, queue=queue)
    q.publish_many([(f"g{i}", i) for i in range(8)])
    gate = threading.Barrier(8, timeout=10)

    def handle(lease: Lease) -> list[Any] | None:
        if lease.group_id == "summary":
            return None
        gate.wait()  # all eight finish together: their acks go in one round
        return [{"group_id": "summary", "event": lease.event, "dedup_id": "the-summary"}]

    worker = Worker(q, handle, follow_ups=True, concurrency=8)
    worker.run(handle_signals=False, until_empty=True)
    assert worker.stats.acked == 9 and worker.stats.claim_errors == 0
    assert q.stats().depth == 0 and q.dead_letters() == []
    assert worker.stats.rounds >= 3  # the eight acks could not all go in one round
    q.close()


def test_a_handlers_generator_that_fails_fails_its_message(tmp_path: Path) -> None:
    q = SqliteTransport(str(tmp_path / "q.db"), queue="gen")
    q.publish("a", 1)

    def handle(lease: Lease) -> Any:
        def follow_ups() -> Any:
            yield ("b", 1)
            raise RuntimeError("half way")

        return follow_ups()

    worker = Worker(q, handle, follow_ups=True, max_attempts=1)
    worker.run(handle_signals=False, until_empty=True)
    [dead] = q.dead_letters()
    assert dead.reason == "RuntimeError: half way"
    assert q.peek("b") == []
    q.close()


async def test_an_async_handlers_follow_ups(url: str, queue: str) -> None:
    q = await AsyncTransport.from_url(url, queue=queue)
    await q.publish("chain", 0)
    seen: list[int] = []

    async def hop(lease: Lease) -> list[tuple[str, int]]:
        await asyncio.sleep(0)
        seen.append(lease.event)
        return [("chain", lease.event + 1)] if lease.event < 5 else []

    worker = AsyncWorker(q, hop, follow_ups=True)
    await worker.run(handle_signals=False, until_empty=True)
    assert seen == [0, 1, 2, 3, 4, 5] and worker.stats.published == 5
    await q.close()


def test_a_chain_of_follow_ups_costs_one_raft_entry_per_hop(
    rqlite_cluster3: Cluster, queue: str
) -> None:
    """The ack, its follow-up and the next claim are one write (concurrency 1)."""
    q = Transport.from_url(rqlite_cluster3.url, queue=queue)
    q.publish("chain", 0)
    seen: list[int] = []

    def hop(lease: Lease) -> list[tuple[str, int]]:
        seen.append(lease.event)
        return [("chain", lease.event + 1)] if lease.event < 39 else []

    before = raft_index(rqlite_cluster3)
    worker = Worker(q, hop, follow_ups=True, concurrency=1, poll_interval=0.02)
    worker.run(handle_signals=False, until_empty=True)
    assert seen == list(range(40))
    # 40 rounds that each ack a hop, publish the next and claim it; the first claims only.
    assert raft_index(rqlite_cluster3) - before <= 41
    q.close()


# ------------------------------------------------------------------------------ prefetch


def test_quick_handlers_prefetch_and_a_round_carries_more_than_the_slots(tmp_path: Path) -> None:
    """Handlers much quicker than a round trip: rounds claim ahead of the free slots, so the
    same drain takes fewer rounds than without prefetch; each message is handled once."""
    rounds = {}
    for prefetch in (0, None):
        q = Transport.from_url(f"sqlite:///{tmp_path}/q{prefetch}.db")
        q.publish_many([(f"g{i}", i) for i in range(400)])
        seen: list[int] = []
        worker = Worker(q, lambda lease, seen=seen: seen.append(lease.event), concurrency=2,
                        prefetch=prefetch)  # fmt: skip
        worker.run(handle_signals=False, until_empty=True)
        assert sorted(seen) == list(range(400))
        rounds[prefetch] = worker.stats.rounds
        q.close()
    assert rounds[0] >= 200  # two slots: at most two messages a round
    assert rounds[None] < rounds[0] * 0.75


@pytest.mark.parametrize("tenants", [False, True])
def test_the_default_prefetch_cap_is_four_times_smaller_once_tenants_are_on(
    tmp_path: Path, tenants: bool
) -> None:
    """Handlers much quicker than a (slowed) round trip: the adaptive prefetch asks for more
    than the cap. Tenants off, a round claims up to the free slots + 16 x `concurrency`;
    once they are on (turned on by another client: learnt at the setup), + 4 x
    `concurrency`, so that a small tenant's few groups are not all held ahead of the slots
    (tests/test_fairness.py). Each message is handled once either way."""
    path = f"sqlite:///{tmp_path}/q.db"
    with Transport.from_url(path) as other:
        if tenants:
            other.set_tenant("small", weight=1)
        other.publish_many([(f"g{i}", i) for i in range(300)])
    q = Transport.from_url(path)
    sizes: list[int] = []
    inner = q.settle_and_claim

    def slowed(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.02)  # a slow link's round trip
        result = inner(*args, **kwargs)
        sizes.append(len(result.leases))
        return result

    q.settle_and_claim = slowed  # type: ignore[method-assign]
    seen: list[int] = []
    worker = Worker(q, lambda lease: seen.append(lease.event), concurrency=2)
    worker.run(handle_signals=False, until_empty=True)
    assert sorted(seen) == list(range(300))
    if tenants:
        assert max(sizes) <= 2 + 4 * 2, sizes
    else:
        assert 2 + 4 * 2 < max(sizes) <= 2 + 16 * 2, sizes
    q.close()


def test_a_prefetched_message_waits_at_most_a_third_of_the_visibility(tmp_path: Path) -> None:
    """A prefetched message whose handler cannot start (the one slot is taken by a slow
    handler) is given back after a third of the visibility: another worker gets it then,
    and the slow handler stops the prefetch (nothing claimed ahead while it runs)."""
    path = f"sqlite:///{tmp_path}/q.db"
    q = Transport.from_url(path)
    q.publish_many([("quick", 0), ("slow", 1), ("next", 2)])
    seen: list[str] = []

    def handle(lease: Lease) -> None:
        seen.append(lease.group_id)
        if lease.group_id == "slow":
            time.sleep(2.5)

    taken: list[Lease] = []

    def thief() -> None:
        while "slow" not in seen:
            time.sleep(0.01)
        time.sleep(1.0)  # the worker's visibility is 1.5: "next" given back after 0.5 s
        with Transport.from_url(path) as other:
            taken.extend(other.claim_many("thief", 30, 3))

    # Quick first: the worker learns its handlers are quick, and claims ahead.
    worker = Worker(q, handle, concurrency=1, visibility=1.5, prefetch=1, batch_wait=0)
    stealing = threading.Thread(target=thief)
    stealing.start()
    run_sync(worker, lambda: not stealing.is_alive() and len(seen) >= 2, timeout=15)
    stealing.join()
    assert seen[:2] == ["quick", "slow"]
    assert [lease.group_id for lease in taken] == ["next"]
    assert taken[0].attempts == 2  # its prefetch counted
    assert "next" not in seen and worker.stats.nacked == 1
    q.close()


def test_stop_gives_prefetched_messages_back_at_once(tmp_path: Path) -> None:
    """Stopping: a message claimed ahead whose handler has not started is given back at once,
    not after the grace period; the running handler finishes within it."""
    path = f"sqlite:///{tmp_path}/q.db"
    q = Transport.from_url(path)
    q.publish_many([("quick", 0), ("slow", 1), ("next", 2)])
    seen: list[str] = []
    release = threading.Event()

    def handle(lease: Lease) -> None:
        seen.append(lease.group_id)
        if lease.group_id == "slow":
            release.wait(5)

    worker = Worker(q, handle, concurrency=1, visibility=30, prefetch=1, batch_wait=0, grace=5)
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    deadline = time.monotonic() + 10
    while "slow" not in seen and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    worker.stop()
    time.sleep(0.3)
    with Transport.from_url(path) as other:
        taken = other.claim_many("other", 30, 3)
    release.set()
    thread.join(10)
    assert [lease.group_id for lease in taken] == ["next"]
    assert seen == ["quick", "slow"]
    q.close()


def test_giving_back_prefetched_leases_survives_handlers_starting_meanwhile(
    tmp_path: Path,
) -> None:
    """The handlers' threads take leases off the waiting list while the worker's loop looks
    for old ones to give back: a garbage collection inside that look (it can switch threads)
    that starts handlers must not stop the worker ("dictionary changed size during
    iteration", seen at 1 ms links with 128 leases waiting); the started ones are not given
    back, every other one is."""
    q = Transport.from_url(f"sqlite:///{tmp_path}/q.db")
    q.publish_many([(f"g{i}", i) for i in range(200)])
    worker = Worker(q, lambda lease: None, concurrency=8, visibility=30)
    leases = q.claim_many(worker.worker_id, 30, 200)
    assert len(leases) == 200
    for lease in leases:
        key = (lease.group_id, lease.seq)
        worker._running[key] = lease
        worker._waiting[id(lease)] = (key, 0.0)
    started: list[Lease] = []
    in_order = iter(leases)

    def a_handler_starts(phase: str, info: dict[str, int]) -> None:
        # (Nothing allocated here: each allocation would set off the next collection.)
        if phase == "start" and len(started) < 50:
            for lease in in_order:
                if worker._admit((lease.group_id, lease.seq), lease):
                    started.append(lease)
                    return

    # Pairs held, so that the look's own pairs are new objects (not the interpreter's spare
    # ones), each counted towards the next collection.
    held = [(i, -i) for i in range(10_000)]
    threshold = gc.get_threshold()
    gc.callbacks.append(a_handler_starts)
    gc.set_threshold(1)
    try:
        worker._give_back_waiting(everything=True)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(a_handler_starts)
    given_back = {lease.seq for lease, _delay in worker._pending.nack}
    assert started  # (collections did run during the look)
    del held
    assert given_back == {lease.seq for lease in leases} - {lease.seq for lease in started}
    assert not worker._waiting
    q.close()


# ------------------------------------------------------------------------ local pickup


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_publish_in_the_same_process_wakes_an_idle_worker_at_once(url: str, flavour: str) -> None:
    """The worker polls every 5 s; a publish made by another transport of this process
    starts its handler well before that."""
    queue = f"wake_{flavour}"
    started: list[float] = []
    publisher = Transport.from_url(url, queue=queue)
    publisher.setup()

    def publish_soon() -> None:
        time.sleep(0.5)  # idle by then: its first claim found nothing
        publisher.publish("g", 1)
        published.append(time.monotonic())

    published: list[float] = []
    threading.Thread(target=publish_soon).start()
    if flavour == "sync":
        q = Transport.from_url(url, queue=queue)
        worker: Any = Worker(q, lambda lease: started.append(time.monotonic()), poll_interval=5)
        run_sync(worker, lambda: bool(started), timeout=10)
        q.close()
    else:

        async def main() -> Any:
            aq = await AsyncTransport.from_url(url, queue=queue)

            async def handle(lease: Lease) -> None:
                started.append(time.monotonic())
                aworker.stop()

            aworker = AsyncWorker(aq, handle, poll_interval=5)
            await aworker.run(handle_signals=False)
            await aq.close()
            return aworker

        worker = asyncio.run(main())
    publisher.close()
    assert started and started[0] - published[0] < 1.0
    assert worker.stats.claimed == 1


def test_the_idle_poll_is_quick_for_a_second_after_work_then_slows(tmp_path: Path) -> None:
    """Reads only: every 10 ms for a second after the last message, then every
    `poll_interval` (0.2 s here)."""
    q = Transport.from_url(f"sqlite:///{tmp_path}/q.db")
    handled: list[float] = []
    worker = Worker(q, lambda lease: handled.append(time.monotonic()), poll_interval=0.2)
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
    thread.start()
    time.sleep(0.3)
    q.publish("g", 1)  # (a publish of this process: picked up at once)
    deadline = time.monotonic() + 5
    while not worker.stats.acked and time.monotonic() < deadline:
        time.sleep(0.005)
    assert handled
    probes, rounds = worker.stats.probes, worker.stats.rounds
    time.sleep(0.6)
    quick = worker.stats.probes - probes
    time.sleep(1.0)  # (the quick second is over)
    probes = worker.stats.probes
    time.sleep(1.0)
    slow = worker.stats.probes - probes
    worker.stop()
    thread.join(10)
    q.close()
    assert quick >= 20, quick  # ~ every 10 ms
    assert slow <= 7, slow  # ~ every 0.2 s
    assert worker.stats.rounds == rounds  # reads only, once the ack's round is done
