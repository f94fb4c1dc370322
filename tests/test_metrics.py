"""Prometheus metrics of a running worker, scraped over HTTP, on SQLite and a 3-node rqlite."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rqlite_queue import AsyncTransport, Lease, RqliteTransport, Transport
from rqlite_queue.metrics import WorkerCollector, serve_metrics
from rqlite_queue.testing import free_port
from rqlite_queue.worker import AsyncWorker, Backoff, Worker

BACKOFF = Backoff(base=0.05, cap=0.05)


@pytest.fixture
def queue_name() -> str:
    return f"m_{uuid.uuid4().hex[:10]}"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape: (name, sorted labels without `queue`) -> value."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "queue"))
            found[(sample.name, labels)] = sample.value
    return found


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


def wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def handler(lease: Lease) -> None:
    if lease.event == "poison":
        raise ValueError("poison")


@pytest.fixture
def running() -> Iterator[list[tuple[Worker, threading.Thread]]]:
    started: list[tuple[Worker, threading.Thread]] = []
    yield started
    for worker, thread in started:
        worker.stop()
        thread.join(10)


def test_counters_and_depth_move_after_work(
    url: str, queue_name: str, running: list[tuple[Worker, threading.Thread]]
) -> None:
    with Transport.from_url(url, queue=queue_name) as queue:
        queue.publish_many(
            [("a", 1, 2), ("a", 2), ("b", "poison", 4), ("c", 1), ("c", 2), ("d", 1)]
        )
        worker = Worker(
            queue, handler, concurrency=3, max_attempts=2, backoff=BACKOFF, poll_interval=0.02
        )
        with serve_metrics(worker, 0, host="127.0.0.1", stats_interval=0) as server:
            endpoint = f"http://127.0.0.1:{server.port}/metrics"
            before = httpx.get(endpoint, timeout=5).text
            assert value(before, "rqlite_queue_worker_acked_total") == 0
            assert value(before, "rqlite_queue_depth", priority="2") == 2
            assert value(before, "rqlite_queue_depth", priority="4") == 1
            assert value(before, "rqlite_queue_depth", priority="0") == 3
            assert value(before, "rqlite_queue_groups") == 4
            if sys.platform == "linux":
                assert "process_cpu_seconds_total" in before

            thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
            running.append((worker, thread))
            thread.start()
            wait_for(lambda: worker.stats.acked == 5 and worker.stats.dead_lettered == 1)

            after = httpx.get(endpoint, timeout=5).text
            assert value(after, "rqlite_queue_worker_acked_total") == 5
            assert value(after, "rqlite_queue_worker_nacked_total") == 1
            assert value(after, "rqlite_queue_worker_dead_lettered_total") == 1
            assert value(after, "rqlite_queue_worker_claimed_total") == 7
            assert value(after, "rqlite_queue_worker_leases_lost_total") == 0
            rounds = value(after, "rqlite_queue_worker_claim_seconds_count")
            assert rounds > 0
            assert value(after, "rqlite_queue_worker_claim_seconds_bucket", le="+Inf") == rounds
            assert value(after, "rqlite_queue_worker_claim_seconds_sum") > 0
            assert value(after, "rqlite_queue_dead_letters") == 1
            assert value(after, "rqlite_queue_groups") == 0
            for priority in range(5):
                assert value(after, "rqlite_queue_depth", priority=str(priority)) == 0
            assert value(after, "rqlite_queue_stats_errors_total") == 0
            worker.stop()  # before the transport closes under it
            thread.join(10)
            assert not thread.is_alive()
        with pytest.raises(httpx.HTTPError):
            httpx.get(endpoint, timeout=2)


def test_paused_held_delayed_and_oldest_age_per_priority(url: str, queue_name: str) -> None:
    """The gauges an operator alerts on (docs/alerts.md): whether the queue is paused, the
    groups held and waiting for a delayed head, and each priority's oldest message."""
    with Transport.from_url(url, queue=queue_name) as queue:
        queue.publish("old", 1, priority=3)
        time.sleep(0.5)
        queue.publish_many([("a", 1), ("a", 2), ("h", 1), ("later-too", 1)])
        queue.publish("later", 1, delay=3600)  # a group whose head is not due
        queue.publish("a", 3, delay=3600)  # behind a head that is: not a delayed group
        queue.hold_group("h")
        worker = Worker(queue, handler, poll_interval=0.02)
        with serve_metrics(worker, 0, host="127.0.0.1", stats_interval=0) as server:
            endpoint = f"http://127.0.0.1:{server.port}/metrics"
            text = httpx.get(endpoint, timeout=5).text
            assert value(text, "rqlite_queue_paused") == 0
            assert value(text, "rqlite_queue_held_groups") == 1
            assert value(text, "rqlite_queue_delayed_groups") == 1
            age = {
                p: value(text, "rqlite_queue_priority_oldest_age_seconds", priority=str(p))
                for p in range(5)
            }
            assert age[3] >= 0.5 and age[3] > age[0] > 0
            assert age[1] == age[2] == age[4] == 0
            assert value(text, "rqlite_queue_oldest_age_seconds") == pytest.approx(age[3], abs=0.2)
            queue.pause()
            queue.release_group("h")
            text = httpx.get(endpoint, timeout=5).text
            assert value(text, "rqlite_queue_paused") == 1
            assert value(text, "rqlite_queue_held_groups") == 0
            queue.resume()


def test_the_operator_gauges_of_a_sharded_queue(
    rqlite_cluster_factory: Callable[..., Any], queue_name: str
) -> None:
    """Summed over the shards (the oldest age: the oldest of any shard); paused once paused."""
    a, b = rqlite_cluster_factory(1), rqlite_cluster_factory(1)
    with Transport.from_url(f"a={a.url};b={b.url}", queue=queue_name) as queue:
        on = {s: [g for g in (f"g{i}" for i in range(200)) if queue.shard_of(g) == s] for s in "ab"}
        queue.publish(on["b"][0], 1, priority=2)
        time.sleep(0.3)
        queue.publish(on["a"][0], 1, priority=2)
        for shard in "ab":
            queue.publish(on[shard][1], 1, delay=3600)
        queue.hold_group(on["a"][0])
        queue.pause()
        worker = Worker(queue, handler, poll_interval=0.02)
        with serve_metrics(worker, 0, host="127.0.0.1", stats_interval=0) as server:
            text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text
        assert value(text, "rqlite_queue_paused") == 1
        assert value(text, "rqlite_queue_held_groups") == 1
        assert value(text, "rqlite_queue_delayed_groups") == 2
        assert value(text, "rqlite_queue_priority_oldest_age_seconds", priority="2") >= 0.3
        assert value(text, "rqlite_queue_priority_oldest_age_seconds", priority="4") == 0


async def test_async_worker_metrics(tmp_path: Path, queue_name: str) -> None:
    queue = await AsyncTransport.from_url(f"sqlite:///{tmp_path}/q.db", queue=queue_name)
    async with queue:
        await queue.publish_many([(f"g{i}", i) for i in range(4)])

        async def handle(lease: Lease) -> None:
            await asyncio.sleep(0)

        worker = AsyncWorker(queue, handle, backoff=BACKOFF, poll_interval=0.02)
        server = serve_metrics(worker, free_port(), host="127.0.0.1", stats_interval=0)
        task = asyncio.create_task(worker.run(handle_signals=False))
        try:
            async with httpx.AsyncClient() as client:
                endpoint = f"http://127.0.0.1:{server.port}/metrics"
                for _ in range(500):
                    text = (await client.get(endpoint)).text
                    if value(text, "rqlite_queue_worker_acked_total") == 4:
                        break
                    await asyncio.sleep(0.02)
                assert value(text, "rqlite_queue_worker_acked_total") == 4
                # The queue's depth comes from the worker's own loop, while it runs.
                wait_until = time.monotonic() + 5
                while value(text, "rqlite_queue_groups") != 0 and time.monotonic() < wait_until:
                    text = (await client.get(endpoint)).text
                assert value(text, "rqlite_queue_groups") == 0
                assert value(text, "rqlite_queue_stats_errors_total") == 0
        finally:
            worker.stop()
            await task
            server.stop()


def test_an_async_collector_needs_its_loop(tmp_path: Path) -> None:
    async def make() -> AsyncWorker:
        transport = await AsyncTransport.from_url(f"sqlite:///{tmp_path}/q.db")
        return AsyncWorker(transport, lambda lease: None)

    worker = asyncio.run(make())
    with pytest.raises(RuntimeError, match="event loop"):
        WorkerCollector(worker)
    WorkerCollector(worker, stats_interval=None)  # counters only: no loop needed


def test_stats_are_cached_and_failures_counted(tmp_path: Path) -> None:
    with Transport.from_url(f"sqlite:///{tmp_path}/q.db") as queue:
        worker = Worker(queue, handler)
        cached = WorkerCollector(worker, stats_interval=60)
        assert cached.queue_stats() is cached.queue_stats()
        fresh = WorkerCollector(worker, stats_interval=0)
        assert fresh.queue_stats() is not fresh.queue_stats()

    dead = RqliteTransport(f"http://127.0.0.1:{free_port()}", deadline=0.2, timeout=0.2)
    try:
        registry = CollectorRegistry()
        collector = WorkerCollector(Worker(dead, handler), stats_interval=0)
        registry.register(collector)  # type: ignore[arg-type]
        text = generate_latest(registry).decode()
        assert value(text, "rqlite_queue_stats_errors_total") == 1
        assert value(text, "rqlite_queue_worker_acked_total") == 0
        assert not [key for key in samples(text) if key[0] == "rqlite_queue_depth"]
    finally:
        dead.close()


def test_without_prometheus_client_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Transport.from_url(f"sqlite:///{tmp_path}/q.db") as queue:
        worker = Worker(queue, handler)
        monkeypatch.setitem(sys.modules, "prometheus_client", None)
        monkeypatch.setitem(sys.modules, "prometheus_client.core", None)
        with pytest.raises(ImportError, match=r"rqlite-queue\[metrics\]"):
            serve_metrics(worker, 0)


def test_a_sharded_queue_reports_each_shard(
    rqlite_cluster_factory: Callable[..., object], queue_name: str
) -> None:
    """`shard_up` and `shard_depth` per shard; a shard killed reads 0 once found down."""
    from rqlite_queue import ShardedTransport
    from rqlite_queue.testing import Cluster

    a: Cluster = rqlite_cluster_factory(1)  # type: ignore[assignment]
    b: Cluster = rqlite_cluster_factory(1)  # type: ignore[assignment]
    with ShardedTransport(f"a={a.url};b={b.url}", queue=queue_name, deadline=2.0) as q:
        q.publish_many([(f"g{i}", i) for i in range(20)])
        worker = Worker(q, handler)
        registry = CollectorRegistry()
        registry.register(WorkerCollector(worker, stats_interval=0))  # type: ignore[arg-type]
        text = generate_latest(registry).decode()
        on_a = sum(1 for i in range(20) if q.shard_of(f"g{i}") == "a")
        assert value(text, "rqlite_queue_shard_depth", shard="a") == on_a
        assert value(text, "rqlite_queue_shard_depth", shard="b") == 20 - on_a
        assert value(text, "rqlite_queue_shard_up", shard="b") == 1
        b.nodes[0].kill()
        with pytest.raises(Exception):  # noqa: B017 - Unavailable, after its deadline
            q.publish(next(f"g{i}" for i in range(20) if q.shard_of(f"g{i}") == "b"), 1)
        text = generate_latest(registry).decode()
        assert value(text, "rqlite_queue_shard_up", shard="b") == 0
        assert value(text, "rqlite_queue_shard_up", shard="a") == 1
        assert ("rqlite_queue_shard_depth", (("shard", "b"),)) not in samples(text)


def test_follow_ups_are_counted(
    url: str, queue_name: str, running: list[tuple[Worker, threading.Thread]]
) -> None:
    """`published_total` counts the follow-ups published with the worker's acks."""

    def chain(lease: Lease) -> list[tuple[str, int | str]]:
        if lease.event == "side":
            return []
        hop = int(lease.event)
        return [(lease.group_id, hop + 1), (f"side-{hop}", "side")] if hop < 3 else []

    with Transport.from_url(url, queue=queue_name) as queue:
        queue.publish("a", 0)
        worker = Worker(queue, chain, follow_ups=True, poll_interval=0.02)
        registry = CollectorRegistry()
        registry.register(WorkerCollector(worker, stats_interval=0))  # type: ignore[arg-type]
        thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
        running.append((worker, thread))
        thread.start()
        wait_for(lambda: worker.stats.acked == 7)  # hops 0..3 and three side messages
        text = generate_latest(registry).decode()
        assert value(text, "rqlite_queue_worker_published_total") == 6
        assert value(text, "rqlite_queue_worker_forwarded_total") == 0
        assert value(text, "rqlite_queue_groups") == 0
        worker.stop()  # before the transport closes under it (its thread died on that)
        thread.join(10)
        assert not thread.is_alive()


def test_a_sharded_queue_reports_its_outbox(
    rqlite_cluster_factory: Callable[..., object], queue_name: str
) -> None:
    """A follow-up for a shard that is down waits in the settling shard's outbox (the
    `outbox` gauge) until it is forwarded; a worker's forwards are `forwarded_total`."""
    from rqlite_queue import ShardedTransport
    from rqlite_queue.testing import Cluster

    a: Cluster = rqlite_cluster_factory(1)  # type: ignore[assignment]
    b: Cluster = rqlite_cluster_factory(1)  # type: ignore[assignment]
    with ShardedTransport(f"a={a.url};b={b.url}", queue=queue_name, deadline=2.0) as q:
        on_a = next(f"g{i}" for i in range(100) if q.shard_of(f"g{i}") == "a")
        on_b = next(f"g{i}" for i in range(100) if q.shard_of(f"g{i}") == "b")
        q.publish_many([(on_a, "first"), (on_a, "second")])
        lease = q.claim("w", visibility=60)
        assert lease is not None and lease.event == "first"

        def forward_one(lease: Lease) -> list[tuple[str, str]]:
            return [(on_b, "from the worker")] if lease.event == "second" else []

        worker = Worker(q, forward_one, follow_ups=True)
        registry = CollectorRegistry()
        registry.register(WorkerCollector(worker, stats_interval=0))  # type: ignore[arg-type]
        b.nodes[0].stop()
        q.ack(lease, publish=[(on_b, "from the ack")])  # its forward fails: b is down
        assert value(generate_latest(registry).decode(), "rqlite_queue_outbox") == 1
        b.nodes[0].start()

        def swept() -> bool:  # by the periodic sweep, once the client sees b answer again
            q.fire_schedules()
            return value(generate_latest(registry).decode(), "rqlite_queue_outbox") == 0

        wait_for(swept)

        worker.run(until_empty=True, handle_signals=False)
        text = generate_latest(registry).decode()
        assert value(text, "rqlite_queue_worker_forwarded_total") == 1
        assert value(text, "rqlite_queue_worker_published_total") == 1
        assert worker.stats.acked == 3  # "second", then both follow-ups on b
        assert value(text, "rqlite_queue_outbox") == 0


def test_tenants_are_gauges_once_on_for_the_deepest_only(tmp_path: Path) -> None:
    """No tenant series while a queue's tenants are off; once on, depth, leases in flight
    and weight of the deepest MAX_TENANT_LABELS tenants, and how many there are."""
    from rqlite_queue.metrics import MAX_TENANT_LABELS

    with Transport.from_url(f"sqlite:///{tmp_path}/q.db") as queue:
        registry = CollectorRegistry()
        registry.register(WorkerCollector(Worker(queue, handler), stats_interval=0))  # type: ignore[arg-type]
        queue.publish("plain", 1)
        off = generate_latest(registry).decode()
        assert not [key for key in samples(off) if key[0].startswith("rqlite_queue_tenant")]

        many = MAX_TENANT_LABELS + 10
        queue.publish_many(
            [
                {"group_id": f"g{i}-{k}", "event": k, "tenant": f"t{i:03}"}
                for i in range(many)
                for k in range(i + 1)  # t000 has 1 message, the last one the most
            ]
        )
        queue.set_tenant("t059", weight=3)
        queue.claim("w", 30)
        text = generate_latest(registry).decode()
        assert value(text, "rqlite_queue_tenants") == many + 1  # and ''
        depths = {
            dict(labels)["tenant"]: v
            for (name, labels), v in samples(text).items()
            if name == "rqlite_queue_tenant_depth"
        }
        assert len(depths) == MAX_TENANT_LABELS
        assert depths["t059"] == 60 and "t000" not in depths
        assert value(text, "rqlite_queue_tenant_weight", tenant="t059") == 3
        in_flight = sum(
            v for (name, _), v in samples(text).items() if name == "rqlite_queue_tenant_in_flight"
        )
        listed = queue.tenants(limit=1000)
        assert sum(t.in_flight for t in listed) == 1
        assert in_flight == sum(t.in_flight for t in listed if t.name in depths)


def test_stopping_the_server_is_quick_even_when_idle(tmp_path: Path) -> None:
    """socketserver's loop looks for a stop every half second when idle: a worker's exit
    waited for it after its `stopped` line (issue 36). Each stop is now woken at once."""
    with Transport.from_url(f"sqlite:///{tmp_path}/q.db") as q:
        worker = Worker(q, lambda lease: None)
        took = []
        for _ in range(3):
            server = serve_metrics(worker, 0, host="127.0.0.1", stats_interval=0)
            time.sleep(0.1)  # idle, in the loop's select
            began = time.monotonic()
            server.stop()
            took.append(time.monotonic() - began)
            assert not server.thread.is_alive()
    assert max(took) < 0.25, took  # ~0.01 s here; up to 0.5 s each before


def test_jobs_are_counted(tmp_path: Path, queue_name: str) -> None:
    """Results kept, handlers told of a cancel, progress that reached the queue (worker
    counters), and the outcomes kept (a gauge of the queue's)."""
    from rqlite_queue.worker import current_job

    started = threading.Event()

    def work(lease: Lease) -> Any:
        if lease.event == "long":
            current_job().progress({"step": 1})
            started.set()
            current_job().wait_cancelled(30)
        return {"seq": lease.seq}

    with Transport.from_url(f"sqlite:///{tmp_path / 'jobs.db'}", queue=queue_name) as queue:
        queue.publish("a", "short", keep=60)
        seq = queue.publish("b", "long", keep=60)
        queue.publish("c", "not kept")
        worker = Worker(queue, work, visibility=0.6, poll_interval=0.02)
        registry = CollectorRegistry()
        registry.register(WorkerCollector(worker, stats_interval=0))  # type: ignore[arg-type]
        thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
        thread.start()
        try:
            assert started.wait(10)
            wait_for(lambda: worker.stats.progress == 1)  # (with an extension, every 0.2 s)
            assert queue.cancel("b", seq, "stop") == "cancelling"
            wait_for(lambda: worker.stats.acked == 3 and queue.stats().outcomes == 2)
            text = generate_latest(registry).decode()
        finally:
            worker.stop()
            thread.join(10)
    assert value(text, "rqlite_queue_worker_results_total") == 2  # (a cancelled one keeps its)
    assert value(text, "rqlite_queue_worker_cancelled_total") == 1
    assert value(text, "rqlite_queue_worker_progress_total") == 1
    assert value(text, "rqlite_queue_outcomes") == 2
