"""Concurrent publishes on one transport go together (group commit, `_async/coalesce.py`):
each call gets its own seqs, dedup outcome and error, on real backends (threads and tasks),
and the coalescer's hand-offs on canned sends (a fast unit tier beside them)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest

from rqlite_queue import AsyncTransport, Transport
from rqlite_queue._sync.coalesce import Coalescer
from rqlite_queue.errors import QueueFull, TenantMismatch, Unavailable

THREADS = 32


def name() -> str:
    return f"co_{uuid.uuid4().hex[:10]}"


def in_threads(count: int, call: Any) -> list[Any]:
    """Run `call(i)` on `count` threads started together; each one's result or exception."""
    results: list[Any] = [None] * count
    start = threading.Barrier(count)

    def run(i: int) -> None:
        start.wait()
        try:
            results[i] = call(i)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_concurrent_publishes_go_together_each_with_its_own_seqs(url: str) -> None:
    with Transport.from_url(url, queue=name()) as q:
        per_call = 20
        results = in_threads(
            THREADS, lambda i: [q.publish(f"g{i % 4}", (i, k)) for k in range(per_call)]
        )
        assert all(isinstance(r, list) for r in results), results
        seqs = [seq for r in results for seq in r]
        assert len(set(seqs)) == THREADS * per_call
        for r in results:  # one caller's publishes keep their order
            assert r == sorted(r)
        coalescer = q.router.publishes
        assert coalescer.sends < THREADS * per_call and coalescer.coalesced > 0
        # Every message is there once, each group in seq order.
        got: dict[str, list[Any]] = defaultdict(list)
        while leases := q.claim_many("w", 30, 10):
            for lease in leases:
                got[lease.group_id].append((lease.seq, tuple(lease.event)))
            q.ack_many(leases)
        everything = sorted(item for items in got.values() for item in items)
        assert [seq for seq, _ in everything] == sorted(seqs)
        for items in got.values():
            assert items == sorted(items)


def test_a_call_refused_among_others_raises_alone(url: str) -> None:
    """A bound and a tenant refused in one call each, among calls that go together: only
    those two raise, the others publish."""
    with Transport.from_url(url, queue=name()) as q:
        q.set_tenant("small", max_group_queued=1)
        q.publish("full", 0, tenant="small")
        q.publish("owned", 0, tenant="a")

        def call(i: int) -> int:
            if i == 3:
                return q.publish("full", 1)
            if i == 5:
                return q.publish("owned", 1, tenant="b")
            return q.publish(f"ok{i}", i)

        for _ in range(5):  # (several tries: each must hold whether or not calls coalesce)
            results = in_threads(12, call)
            assert isinstance(results[3], QueueFull)
            assert isinstance(results[5], TenantMismatch)
            ok = [r for i, r in enumerate(results) if i not in (3, 5)]
            assert all(isinstance(r, int) for r in ok), results
        assert q.stats().depth == 2 + 5 * 10


def test_a_dedup_id_repeated_by_concurrent_calls_publishes_once(url: str) -> None:
    with Transport.from_url(url, queue=name()) as q:
        results = in_threads(16, lambda i: q.publish("g", i, dedup_id="same"))
        assert len(set(results)) == 1 and isinstance(results[0], int)
        assert q.stats().depth == 1


def test_concurrent_async_publishes_go_together(url: str) -> None:
    async def main() -> None:
        async with await AsyncTransport.from_url(url, queue=name()) as q:
            seqs = await asyncio.gather(*(q.publish(f"g{i % 3}", i) for i in range(200)))
            assert len(set(seqs)) == 200
            assert q.router.publishes.coalesced > 0
            assert (await q.stats()).depth == 200

    asyncio.run(main())


# ----------------------------------------------------------- the coalescer, canned sends


def test_a_call_alone_is_sent_at_once_and_waiters_go_in_the_next_send() -> None:
    sent: list[list[int]] = []
    first_in = threading.Event()
    release = threading.Event()

    def send(items: list[int]) -> list[Any]:
        sent.append(items)
        if len(sent) == 1:
            first_in.set()
            release.wait(5)
        return [item * 10 if item != 4 else ValueError("four") for item in items]

    coalescer: Coalescer[int, int] = Coalescer(send, lambda item: 1, 3)
    results: dict[int, Any] = {}

    def submit(item: int) -> None:
        try:
            results[item] = coalescer.submit(item)
        except ValueError as exc:
            results[item] = exc

    first = threading.Thread(target=submit, args=(0,))
    first.start()
    assert first_in.wait(5)  # sent at once, alone
    others = [threading.Thread(target=submit, args=(i,)) for i in range(1, 6)]
    for thread in others:
        thread.start()
    deadline = time.monotonic() + 5
    while len(coalescer._queue) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    release.set()
    for thread in [first, *others]:
        thread.join(5)
    assert sent[0] == [0]
    assert sorted(len(items) for items in sent[1:]) == [2, 3]  # at most `limit` together
    assert sorted(x for items in sent[1:] for x in items) == [1, 2, 3, 4, 5]
    assert isinstance(results.pop(4), ValueError)
    assert results == {i: i * 10 for i in (0, 1, 2, 3, 5)}


def test_a_send_that_breaks_fails_every_call_in_it_and_the_next_ones_go_on() -> None:
    calls = 0
    gate = threading.Event()

    def send(items: list[int]) -> list[Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            gate.wait(5)
            raise Unavailable("down")
        return items

    coalescer: Coalescer[int, int] = Coalescer(send, lambda item: 1, 100)
    results = in_threads_gated(coalescer, gate)
    assert isinstance(results[0], Unavailable)
    assert results[1:] == [1, 2, 3]


def in_threads_gated(coalescer: Coalescer[int, int], gate: threading.Event) -> list[Any]:
    """Item 0 is sent first and held until the others wait; then the gate opens."""
    results: list[Any] = [None] * 4

    def submit(i: int) -> None:
        try:
            results[i] = coalescer.submit(i)
        except Exception as exc:
            results[i] = exc

    first = threading.Thread(target=submit, args=(0,))
    first.start()
    time.sleep(0.05)
    rest = [threading.Thread(target=submit, args=(i,)) for i in (1, 2, 3)]
    for thread in rest:
        thread.start()
    time.sleep(0.05)
    gate.set()
    for thread in [first, *rest]:
        thread.join(5)
    return results


def test_a_cancelled_waiter_leaves_the_others_served() -> None:
    from rqlite_queue._async.coalesce import AsyncCoalescer

    async def main() -> None:
        gate = asyncio.Event()

        async def send(items: list[int]) -> list[Any]:
            if items == [0]:
                await gate.wait()
            return [item + 100 for item in items]

        coalescer: AsyncCoalescer[int, int] = AsyncCoalescer(send, lambda item: 1, 100)
        first = asyncio.create_task(coalescer.submit(0))
        await asyncio.sleep(0)
        waiting = [asyncio.create_task(coalescer.submit(i)) for i in (1, 2, 3)]
        await asyncio.sleep(0)
        waiting[0].cancel()  # it would have led the next send
        gate.set()
        assert await first == 100
        assert await asyncio.gather(*waiting[1:]) == [102, 103]
        with pytest.raises(asyncio.CancelledError):
            await waiting[0]

    asyncio.run(main())
