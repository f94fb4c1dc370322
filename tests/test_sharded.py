"""A queue over several real rqlite clusters (`ShardedTransport`): failure isolation, workers,
fairness across shards, the CLI. The contract suite runs on two shards too
(tests/contract, backend `rqlite-sharded2`)."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rqlite_queue import (
    AsyncShardedTransport,
    AsyncWorker,
    Lease,
    ShardedTransport,
    Transport,
    Unavailable,
    Worker,
    from_url,
)
from rqlite_queue._protocol.plan import Batch, Statement
from rqlite_queue.errors import TransportClosed
from rqlite_queue.testing import Cluster

EXE = Path(sys.executable).parent / "rqlite-queue"


def groups_on(q: ShardedTransport, shard: str, n: int, prefix: str = "g") -> list[str]:
    """`n` group ids that live on `shard`."""
    found: list[str] = []
    i = 0
    while len(found) < n:
        if q.shard_of(f"{prefix}{i}") == shard:
            found.append(f"{prefix}{i}")
        i += 1
    return found


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.fixture
def two_clusters(rqlite_cluster_factory: Callable[..., Cluster]) -> tuple[Cluster, Cluster]:
    return rqlite_cluster_factory(1), rqlite_cluster_factory(1)


def test_one_shard_down_leaves_the_other_working(two_clusters: tuple[Cluster, Cluster]) -> None:
    a, b = two_clusters
    q = ShardedTransport(f"a={a.url};b={b.url}", queue="iso", deadline=2.0)
    try:
        q.setup()
        on_a, on_b = groups_on(q, "a", 20), groups_on(q, "b", 20)
        for group in on_a + on_b:
            q.publish(group, {"group": group})
        b.nodes[0].kill()

        # The first call that meets the dead shard waits out its deadline, then says so...
        with pytest.raises(Unavailable):
            q.publish(on_b[0], "lost?")
        assert q.down_shards() == ["b"]
        # ...and from then on its groups fail at once, while the other shard serves at speed.
        started = time.monotonic()
        with pytest.raises(Unavailable, match="shard 'b'"):
            q.publish(on_b[1], "x")
        assert time.monotonic() - started < 0.2
        started = time.monotonic()
        served = []
        while (lease := q.claim("w", 30)) is not None:
            served.append(lease.group_id)
            q.ack(lease)
        assert sorted(served) == sorted(on_a)
        assert time.monotonic() - started < 10
        q.publish(on_a[0], "still")
        assert q.stats().shards_down == ("b",)

        # Back up: found by the background probe, not by a call.
        b.nodes[0].start()
        wait_for(lambda: not q.down_shards(), 30, "the background probe to find shard b")
        served = []
        while (lease := q.claim("w", 30)) is not None:
            served.append(lease.group_id)
            q.ack(lease)
        assert sorted(served) == sorted([on_a[0], *on_b])  # nothing lost
    finally:
        q.close()


def test_workers_on_three_shards_keep_order_and_lose_nothing(
    rqlite_cluster_factory: Callable[..., Cluster],
) -> None:
    clusters = [rqlite_cluster_factory(1) for _ in range(3)]
    url = ";".join(f"s{i}={c.url}" for i, c in enumerate(clusters))
    done: dict[str, list[int]] = defaultdict(list)
    active: set[str] = set()
    overlaps: list[str] = []

    def handle(lease: Lease) -> None:
        if lease.group_id in active:
            overlaps.append(lease.group_id)
        active.add(lease.group_id)
        time.sleep(0.001)
        done[lease.group_id].append(lease.event)
        active.discard(lease.group_id)

    with from_url(url, queue="work3") as q:
        assert isinstance(q, ShardedTransport)
        q.publish_many([(f"wf{g}", i) for i in range(5) for g in range(60)])
        Worker(q, handle, concurrency=8).run(until_empty=True)
        assert q.stats().depth == 0
    assert overlaps == []
    assert dict(done) == {f"wf{g}": list(range(5)) for g in range(60)}


def test_the_async_worker_on_shards(rqlite_cluster: Cluster, tmp_path: Path) -> None:
    url = f"a={rqlite_cluster.url};b=sqlite:///{tmp_path}/b.db"
    done: dict[str, list[int]] = defaultdict(list)

    async def handle(lease: Lease) -> None:
        done[lease.group_id].append(lease.event)

    async def main() -> None:
        q = await AsyncShardedTransport.from_url(url, queue="asyncw")
        assert isinstance(q, AsyncShardedTransport)
        async with q:
            await q.publish_many([(f"g{g}", i) for i in range(4) for g in range(30)])
            await AsyncWorker(q, handle, concurrency=4).run(until_empty=True)
            assert (await q.stats()).depth == 0

    asyncio.run(main())
    assert dict(done) == {f"g{g}": list(range(4)) for g in range(30)}


def test_claims_interleave_the_shards(two_clusters: tuple[Cluster, Cluster]) -> None:
    """With a backlog on both shards, consecutive claims alternate between them: in every
    window of 2 claims, one from each (the rotation), and round-robin exact within each."""
    a, b = two_clusters
    with ShardedTransport(f"a={a.url};b={b.url}", queue="fair") as q:
        on_a, on_b = groups_on(q, "a", 5), groups_on(q, "b", 5)
        q.publish_many([(g, i) for i in range(4) for g in on_a + on_b])
        shards = []
        served: dict[str, list[str]] = defaultdict(list)
        while (lease := q.claim("w", 30)) is not None:
            shards.append(lease.shard)
            served[lease.shard].append(lease.group_id)
            q.ack(lease)
        assert Counter(shards) == {"a": 20, "b": 20}
        assert all(shards[i] != shards[i + 1] for i in range(0, 40, 2))
        assert served["a"] == on_a * 4 and served["b"] == on_b * 4


def test_a_publish_many_is_atomic_per_shard_and_says_which_failed(
    two_clusters: tuple[Cluster, Cluster],
) -> None:
    a, b = two_clusters
    with ShardedTransport(f"a={a.url};b={b.url}", queue="split", deadline=2.0) as q:
        on_a, on_b = groups_on(q, "a", 2), groups_on(q, "b", 2)
        b.nodes[0].kill()
        with pytest.raises(Unavailable, match=r"not published on shard\(s\) b.*published on a"):
            q.publish_many([(on_a[0], 1), (on_b[0], 2), (on_a[1], 3)])
        assert q.shard("a").stats().depth == 2


def test_dedup_ids_are_scoped_to_the_group(two_clusters: tuple[Cluster, Cluster]) -> None:
    a, b = two_clusters
    with ShardedTransport(f"a={a.url};b={b.url}", queue="dedup") as q:
        first = q.publish("g1", 1, dedup_id="order-1")
        assert q.publish("g1", 1, dedup_id="order-1") == first
        q.publish("g2", 2, dedup_id="order-1")  # another group: another message
        assert q.stats().depth == 2


def test_the_cli_takes_several_clusters(two_clusters: tuple[Cluster, Cluster]) -> None:
    a, b = two_clusters
    url = f"a={a.url};b={b.url}"
    run = lambda *args: subprocess.run(  # noqa: E731
        [EXE, "--url", url, "--queue", "cli", *args], capture_output=True, text=True, timeout=60
    )
    for g in range(6):
        assert run("publish", f"g{g}", '{"n": 1}').returncode == 0
    stats = run("stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert '"depth":6' in stats.stdout
    listed = run("groups", "--json")
    assert listed.returncode == 0 and listed.stdout.count("\n") == 6
    with from_url(url, queue="cli") as q:
        assert isinstance(q, ShardedTransport)
        assert {q.shard_of(f"g{g}") for g in range(6)} == {"a", "b"}


def test_a_transport_of_each_shard_may_be_given(rqlite_cluster: Cluster, tmp_path: Path) -> None:
    shards: dict[str, Any] = {
        "x": Transport.from_url(rqlite_cluster.url, queue="given"),
        "y": Transport.from_url(f"sqlite:///{tmp_path}/y.db", queue="given"),
    }
    with ShardedTransport(shards, queue="given") as q:
        q.publish("g", 1)
        lease = q.claim("w", 30)
        assert lease is not None and lease.shard == q.shard_of("g")
        q.ack(lease)


def test_a_workers_settlements_wait_for_their_shard_to_come_back(
    two_clusters: tuple[Cluster, Cluster], caplog: pytest.LogCaptureFixture
) -> None:
    """Shard b dies while its messages are being handled: their acks cannot be applied, come
    back unsettled, and are sent again once b answers (within the leases' visibility), so each
    message is handled once and nothing is lost. The acks b took just before it died (their
    replies lost) are not reported lost: resent, they find their own records. While b is
    down, its settlements wait with a backoff of their own (handlers finishing on shard a do
    not cut it short), and the warning about them is not repeated each round."""
    import threading

    a, b = two_clusters
    handled: Counter[tuple[str, int]] = Counter()
    with ShardedTransport(f"a={a.url};b={b.url}", queue="unsettled", deadline=1.0) as q:
        groups = groups_on(q, "a", 6) + groups_on(q, "b", 6)
        q.publish_many([(g, i) for i in range(2) for g in groups])

        def handle(lease: Lease) -> None:
            handled[(lease.group_id, lease.event)] += 1
            assert lease.attempts == 1, "delivered again: a settlement was lost"
            time.sleep(0.5 if lease.event == 0 else 0.01)

        def outage() -> None:
            time.sleep(0.2)
            b.nodes[0].kill()
            time.sleep(3)
            b.nodes[0].start()

        fault = threading.Thread(target=outage)
        fault.start()
        worker = Worker(q, handle, concurrency=12, visibility=60)
        with caplog.at_level(logging.WARNING, logger="rqlite_queue.worker"):
            worker.run(until_empty=True)
        fault.join()
        assert q.stats().depth == 0
    assert handled == {(g, i): 1 for g in groups for i in range(2)}
    assert worker.stats.leases_lost == 0 and worker.stats.acked == len(handled)
    waits = [r for r in caplog.records if "wait for their shard" in r.getMessage()]
    assert 1 <= len(waits) <= 2, [r.getMessage() for r in waits]
    assert worker.stats.rounds < 60, worker.stats


def test_the_dashboard_shows_every_shards_nodes_and_groups(
    two_clusters: tuple[Cluster, Cluster],
) -> None:
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    import httpx

    from rqlite_queue.dashboard import create_app

    a, b = two_clusters

    async def main() -> None:
        q = await AsyncShardedTransport.from_url(f"a={a.url};b={b.url}", queue="dash")
        assert isinstance(q, AsyncShardedTransport)
        async with q:
            await q.publish_many([(f"order-{i}", i) for i in range(6)])
            asgi = httpx.ASGITransport(app=create_app(q))
            async with httpx.AsyncClient(transport=asgi, base_url="http://dash") as http:
                page = await http.get("/")
                assert page.status_code == 200
                assert 'data-node="a/' in page.text and 'data-node="b/' in page.text
                groups = await http.get("/groups")
                assert all(f"order-{i}" in groups.text for i in range(6))

    asyncio.run(main())


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_closing_a_sharded_queue_closes_every_shards_connection(
    flavour: str, rqlite_cluster: Cluster, tmp_path: Path
) -> None:
    """The shards share the queue's core (and its closed flag): each backend still closes its
    own client or file (an aiohttp session left open warns at exit; a file stays locked)."""
    url = f"a={rqlite_cluster.url};b=sqlite:///{tmp_path}/b.db"
    if flavour == "sync":
        q: Any = ShardedTransport(url, queue="closing")
        q.setup()
        q.close()
    else:

        async def open_and_close() -> Any:
            queue = AsyncShardedTransport(url, queue="closing")
            await queue.setup()
            await queue.close()
            return queue

        q = asyncio.run(open_and_close())
    assert q.closed
    rqlite_client = q.router.backend("a").executor
    sqlite_file = q.router.backend("b").executor
    if flavour == "sync":
        assert all(pool.pool is None for pool in rqlite_client._pools)  # urllib3: closed
    else:
        assert rqlite_client._session is None  # aiohttp: closed
    with pytest.raises(TransportClosed):
        batch = Batch((Statement("SELECT 1"),), write=False)
        (sqlite_file if flavour == "sync" else sqlite_file._sync).execute(batch, 1e18)
