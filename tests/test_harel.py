"""harel 0.9 runs its distributed statecharts over rqlite-queue, as a drop-in transport.

harel's `DistributedRunner`/`Worker` and `AsyncDistributedRunner`/`AsyncWorker` take any object
with the seed's protocol (publish/claim/ack/nack/close; a lease with seq, group_id, event,
token). Our transports are handed to them as they are, with `codec=Event` so a claimed
message comes back as a harel `Event`: no adapter. harel's own SQLite store keeps the
executions (in tmp_path); the queue is a real 3-node rqlite cluster (or the embedded SQLite
queue), each test on a queue of its own.

The machines cover the features harel's distributed path moves through the queue: plain
events (flat), orthogonal regions (fork: one group per region; broadcast; join: the regions'
`Finished` travel back to the parent's group), durable timers driving a modelled retry loop
(the worker's idle sweep publishes `Timeout`s), and the control plane's suspend (the worker
parks the group with `nack(delay)`) and resume. Every execution must end in its final state
with the expected action trace and harel's own step timeline (`trace=True`, `read_trace`), and
the queue must be drained.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harel import Event, SqliteStore, definition_from_dsl
from harel.definition.model import Definition
from harel.engine.aio.distributed import AsyncDistributedRunner, AsyncWorker
from harel.engine.aio_store import AsyncSqliteStore
from harel.engine.aio_transport import AsyncTransport as HarelAsyncTransport
from harel.engine.distributed import DistributedRunner, Worker
from harel.engine.execution import Execution, Status
from harel.engine.transport import Transport as HarelTransport
from harel.testing import assert_async_transport_contract, assert_transport_contract

from rqlite_queue import (
    AsyncRqliteTransport,
    AsyncSqliteTransport,
    AsyncTransport,
    RqliteTransport,
    SqliteTransport,
    Transport,
    from_url,
)
from rqlite_queue.testing import Cluster

DEADLINE = 45.0  # seconds for a whole plan to finish; normally a few

# ------------------------------------------------------------------------------ the machines


def rec(stm: Any, event: Event, **inputs: Any) -> None:
    """`on enter rec(at: "X")`: append X to the execution's trace, and note which process ran
    it (the multi-process test checks the work was shared)."""
    ctx = stm.execution_ctx
    ctx.setdefault("trace", []).append(inputs["at"])
    ctx.setdefault("pids", []).append(os.getpid())


def attempt(stm: Any, event: Event, **inputs: Any) -> None:
    """One try of the retry loop; the next wait (seconds) goes into the context, where the
    `Waiting` state's `timeout context backoff` reads it."""
    ctx = stm.execution_ctx
    ctx["attempts"] = ctx.get("attempts", 0) + 1
    ctx["backoff"] = 0.2
    ctx.setdefault("trace", []).append(f"attempt{ctx['attempts']}")
    ctx.setdefault("pids", []).append(os.getpid())


def check(stm: Any, event: Event, **inputs: Any) -> str:
    """The selector after each attempt: the third one succeeds."""
    return "ok" if stm.execution_ctx["attempts"] >= 3 else "fail"


def _rec(label: str) -> str:
    return f'on enter rec(at: "{label}")'


FLAT = f"""
event Go {{}}
machine flat {{
  initial A
  state A {{ {_rec("A")} }}
  state B {{ {_rec("B")} }}
  final C success {{ {_rec("C")} }}
  from A to B on Go
  from B to C on Go
}}
"""

ORTHOGONAL = f"""
event FraudCleared {{}}
event StockReserved {{}}
machine checkout {{
  initial Verifying
  orthogonal Verifying {{
    state Fraud {{
      initial Screening
      state Screening {{ {_rec("Screening")} }}
      final Cleared success {{ {_rec("Cleared")} }}
      from Screening to Cleared on FraudCleared
    }}
    state Stock {{
      initial Checking
      state Checking {{ {_rec("Checking")} }}
      final Reserved success {{ {_rec("Reserved")} }}
      from Checking to Reserved on StockReserved
    }}
  }}
  final Approved success {{ {_rec("Approved")} }}
  from Verifying to Approved
}}
"""

# Retry with backoff, modelled the harel way: a durable timer per wait, a selector per try, and
# the composite's own timeout as the overall budget.
RETRY = """
machine retry {
  initial Charging
  state Charging {
    timeout 30
    initial Attempt
    state Attempt { on enter attempt }
    state Waiting { timeout context backoff }
    from Attempt select check { "ok" to Paid  "fail" to Waiting }
    from Waiting to Attempt on Timeout
  }
  final Paid success {}
  final Declined failed {}
  from Charging to Declined on Timeout
}
"""

ACTIONS: dict[str, Callable[..., Any]] = {"rec": rec, "attempt": attempt, "check": check}


def definitions() -> dict[str, Definition]:
    """A fresh registry (harel adds submachines to it in place): flat, checkout, retry."""
    defs = {}
    for source, name in ((FLAT, "flat"), (ORTHOGONAL, "checkout"), (RETRY, "retry")):
        defn = definition_from_dsl(source, name, actions=ACTIONS)
        defs[defn.id] = defn
    return defs


EVENTS = {"flat": ["Go", "Go"], "checkout": ["FraudCleared", "StockReserved"], "retry": []}


def plan(flat: int, checkout: int, retry: int) -> list[str]:
    return ["flat"] * flat + ["checkout"] * checkout + ["retry"] * retry


# ------------------------------------------------------------------------------ expectations


@dataclass
class Snapshot:
    """An execution as the store has it: the record, harel's step timeline, and its regions."""

    exe: Execution
    steps: list[tuple[str, str | None, str | None]]
    regions: list[Snapshot]


def _steps(trace: list[dict[str, Any]]) -> list[tuple[str, str | None, str | None]]:
    return [(s["event_kind"], s["from_path"], s["to_path"]) for s in trace]


def sync_snapshot(store: SqliteStore, execution_id: str) -> Snapshot:
    exe = store.load(execution_id)
    assert exe is not None, execution_id
    regions = [sync_snapshot(store, cid) for cid in exe.children]
    return Snapshot(exe, _steps(store.read_trace(execution_id)), regions)


async def async_snapshot(store: AsyncSqliteStore, execution_id: str) -> Snapshot:
    exe = await store.load(execution_id)
    assert exe is not None, execution_id
    regions = [await async_snapshot(store, cid) for cid in exe.children]
    return Snapshot(exe, _steps(await store.read_trace(execution_id)), regions)


def _moves(snap: Snapshot) -> list[tuple[str, str | None, str | None]]:
    """The steps that moved the execution (an event a state ignores leaves a no-op step)."""
    return [s for s in snap.steps if s[1] != s[2]]


def assert_finished(snap: Snapshot) -> None:
    """The execution reached its final state, having done exactly what its machine says."""
    exe = snap.exe
    assert exe.status is Status.DONE, (exe.definition_id, exe.status, exe.error)
    assert exe.outcome == "success"
    if exe.definition_id == "flat":
        assert exe.active_path == "C"
        assert exe.context["trace"] == ["A", "B", "C"]
        assert snap.steps == [("Start", None, "A"), ("Go", "A", "B"), ("Go", "B", "C")]
    elif exe.definition_id == "checkout":
        assert exe.active_path == "Approved"
        assert exe.context["trace"] == ["Approved"]
        assert exe.context["region_results"] == {
            "Verifying.Fraud": {"outcome": "success"},
            "Verifying.Stock": {"outcome": "success"},
        }
        # fork, two regions report back, join
        assert [s[0] for s in snap.steps] == ["Start", "Finished", "Finished"]
        assert _moves(snap) == [("Start", None, "Verifying"), ("Finished", "Verifying", "Approved")]
        regions = {r.exe.root_path: r for r in snap.regions}
        assert sorted(regions) == ["Verifying.Fraud", "Verifying.Stock"]
        for root, first, event, last in (
            ("Verifying.Fraud", "Screening", "FraudCleared", "Cleared"),
            ("Verifying.Stock", "Checking", "StockReserved", "Reserved"),
        ):
            region = regions[root]
            assert region.exe.status is Status.DONE, (root, region.exe.status, region.exe.error)
            assert region.exe.active_path == f"{root}.{last}"
            assert region.exe.context["trace"] == [first, last]
            # Each event is broadcast to the regions still live when the parent routes it, in
            # the order it was sent. Stock is live for both; Fraud ends on FraudCleared, so it
            # gets StockReserved only if the parent routes that before Fraud's `Finished`
            # (the runner sends it while workers run: either order is harel's semantics).
            both = ["Start", "FraudCleared", "StockReserved"]
            steps = [s[0] for s in region.steps]
            assert steps == both or (root == "Verifying.Fraud" and steps == both[:2]), steps
            assert _moves(region) == [
                ("Start", None, f"{root}.{first}"),
                (event, f"{root}.{first}", f"{root}.{last}"),
            ]
    elif exe.definition_id == "retry":
        assert exe.active_path == "Paid"
        assert exe.context["trace"] == ["attempt1", "attempt2", "attempt3"]
        assert snap.steps == [
            ("Start", None, "Charging.Waiting"),
            ("Timeout", "Charging.Waiting", "Charging.Waiting"),
            ("Timeout", "Charging.Waiting", "Paid"),
        ]
    else:  # pragma: no cover
        raise AssertionError(exe.definition_id)


def _final(exe: Execution | None) -> bool:
    if exe is not None and exe.status is Status.FAILED:
        raise AssertionError(f"execution {exe.id} failed: {exe.error}")
    return exe is not None and exe.status is Status.DONE


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.02)


async def async_wait_for(
    predicate: Callable[[], Awaitable[bool]], what: str, timeout: float = DEADLINE
) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.02)


# ------------------------------------------------------------------------------ helpers


def fresh_queue() -> str:
    return f"harel_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def queue_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The queue's URL for the test's `queue_url` parameter: "rqlite" (the session's 3-node
    cluster) or "sqlite" (the embedded queue, a file in tmp_path)."""
    backend = request.param
    if backend == "sqlite":
        return "sqlite:///" + os.fspath(tmp_path / "queue.db")
    cluster: Cluster = request.getfixturevalue("rqlite_cluster3")
    return cluster.url


def start_sync(runner: DistributedRunner, machines: list[str]) -> list[str]:
    ids = []
    for definition_id in machines:
        exe = runner.create(definition_id)
        for kind in EVENTS[definition_id]:
            runner.send(exe.id, Event(kind=kind))
        ids.append(exe.id)
    return ids


async def start_async(runner: AsyncDistributedRunner, machines: list[str]) -> list[str]:
    ids = []
    for definition_id in machines:
        exe = await runner.create(definition_id)
        for kind in EVENTS[definition_id]:
            await runner.send(exe.id, Event(kind=kind))
        ids.append(exe.id)
    return ids


def drained(transport: Transport) -> bool:
    stats = transport.stats()
    return stats.depth == 0 and stats.dead == 0


@contextlib.contextmanager
def worker_threads(
    n: int,
    url: str,
    queue: str,
    store_path: str,
    defs: dict[str, Definition],
    execution: str,
    suspend_recheck: float = 5.0,
) -> Iterator[list[BaseException]]:
    """`n` harel `Worker.run` loops on threads, each with its own transport and store (as
    separate machines would have). Yields the list their errors go to; stops and joins them,
    and closes what they opened, on exit."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(worker_id: str) -> None:
        try:
            with from_url(url, queue=queue, codec=Event) as transport:
                store = SqliteStore(store_path)
                try:
                    worker = Worker(
                        store,
                        transport,
                        defs,
                        worker_id=worker_id,
                        suspend_recheck=suspend_recheck,
                        trace=True,
                        execution=execution,
                    )
                    worker.run(stop, idle_sleep=0.005)
                finally:
                    store.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"w{i}",), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    try:
        yield errors
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "a worker thread did not stop"


# ------------------------------------------------------------------------------ the seam


def test_our_transports_satisfy_harels_protocols(rqlite_cluster3: Cluster, tmp_path: Path) -> None:
    """harel's `Transport` / `AsyncTransport` Protocols are runtime_checkable."""
    with RqliteTransport(rqlite_cluster3.url, queue=fresh_queue(), codec=Event) as rq:
        assert isinstance(rq, HarelTransport)
    with SqliteTransport(os.fspath(tmp_path / "q.db"), codec=Event) as sq:
        assert isinstance(sq, HarelTransport)
    assert isinstance(AsyncRqliteTransport(rqlite_cluster3.url, codec=Event), HarelAsyncTransport)
    assert isinstance(AsyncSqliteTransport(os.fspath(tmp_path / "q.db")), HarelAsyncTransport)


def test_harel_transport_contract_on_rqlite(rqlite_cluster3: Cluster) -> None:
    assert_transport_contract(
        lambda clock: RqliteTransport(
            rqlite_cluster3.url, clock=clock, queue=fresh_queue(), codec=Event, max_skew=None
        )
    )


async def test_harel_async_transport_contract_on_rqlite(rqlite_cluster3: Cluster) -> None:
    await assert_async_transport_contract(
        lambda clock: AsyncRqliteTransport(
            rqlite_cluster3.url, clock=clock, queue=fresh_queue(), codec=Event, max_skew=None
        )
    )


def test_harel_transport_contract_on_sqlite(tmp_path: Path) -> None:
    def make(clock: Callable[[], float]) -> SqliteTransport:
        path = os.fspath(tmp_path / f"{uuid.uuid4().hex}.db")
        return SqliteTransport(path, clock=clock, codec=Event)

    assert_transport_contract(make)


async def test_harel_async_transport_contract_on_sqlite(tmp_path: Path) -> None:
    def make(clock: Callable[[], float]) -> AsyncSqliteTransport:
        path = os.fspath(tmp_path / f"{uuid.uuid4().hex}.db")
        return AsyncSqliteTransport(path, clock=clock, codec=Event)

    await assert_async_transport_contract(make)


# ------------------------------------------------------------------------------ end to end


@pytest.mark.parametrize(
    ("queue_url", "execution"),
    [("rqlite", "background"), ("rqlite", "inline"), ("sqlite", "inline")],
    indirect=["queue_url"],
)
def test_sync_runner_and_worker_threads(queue_url: str, execution: str, tmp_path: Path) -> None:
    """`DistributedRunner` sends; three `Worker` threads, each with its own transport, run
    flat, orthogonal and retrying machines to their final states."""
    queue, store_path, defs = fresh_queue(), os.fspath(tmp_path / "store.db"), definitions()
    with ExitStack() as stack:
        transport = stack.enter_context(from_url(queue_url, queue=queue, codec=Event))
        store = SqliteStore(store_path)
        stack.callback(store.close)
        runner = DistributedRunner(store, transport, defs, trace=True, execution=execution)
        ids = start_sync(runner, plan(flat=6, checkout=3, retry=2))

        with worker_threads(3, queue_url, queue, store_path, defs, execution) as errors:
            wait_for(
                lambda: bool(errors) or all(_final(store.load(i)) for i in ids), "every execution"
            )
            wait_for(lambda: bool(errors) or drained(transport), "the queue to drain")
        assert not errors, errors

        for execution_id in ids:
            assert_finished(sync_snapshot(store, execution_id))


@pytest.mark.parametrize("queue_url", ["rqlite", "sqlite"], indirect=True)
async def test_async_runner_and_workers(queue_url: str, tmp_path: Path) -> None:
    """`AsyncDistributedRunner` sends; two `AsyncWorker`s, each with its own transport and up
    to 8 events in flight, run the same machines on one event loop."""
    queue, store_path, defs = fresh_queue(), os.fspath(tmp_path / "store.db"), definitions()
    async with AsyncExitStack() as stack:
        transport = await stack.enter_async_context(
            await AsyncTransport.from_url(queue_url, queue=queue, codec=Event)
        )
        store = await AsyncSqliteStore.create(store_path)
        stack.push_async_callback(store.close)
        runner = AsyncDistributedRunner(store, transport, defs, trace=True)
        ids = await start_async(runner, plan(flat=6, checkout=3, retry=2))

        stop = asyncio.Event()
        tasks = []
        for i in range(2):
            worker_transport = await stack.enter_async_context(
                await AsyncTransport.from_url(queue_url, queue=queue, codec=Event)
            )
            worker_store = await AsyncSqliteStore.create(store_path)
            stack.push_async_callback(worker_store.close)
            worker = AsyncWorker(
                worker_store, worker_transport, defs, f"aw{i}", concurrency=8, trace=True
            )
            tasks.append(asyncio.create_task(worker.run(stop, idle_sleep=0.005)))

        async def all_final() -> bool:
            if any(t.done() for t in tasks):
                return True  # a worker died: stop waiting, its exception is raised below
            return all([_final(await store.load(i)) for i in ids])

        async def queue_drained() -> bool:
            stats = await transport.stats()
            return any(t.done() for t in tasks) or (stats.depth == 0 and stats.dead == 0)

        try:
            await async_wait_for(all_final, "every execution")
            await async_wait_for(queue_drained, "the queue to drain")
        finally:
            stop.set()
            await asyncio.gather(*tasks)

        for execution_id in ids:
            assert_finished(await async_snapshot(store, execution_id))


def test_sync_runner_over_the_async_transport(rqlite_cluster3: Cluster, tmp_path: Path) -> None:
    """harel's sync facade also takes async backends as they are (`execution="background"`
    runs them on its own event loop thread): our `AsyncRqliteTransport`, built outside any
    loop, works there too."""
    from harel.engine.aio import facade

    queue, store_path, defs = fresh_queue(), os.fspath(tmp_path / "store.db"), definitions()
    transport = AsyncRqliteTransport(rqlite_cluster3.url, queue=queue, codec=Event)
    store = facade.run(AsyncSqliteStore.create, store_path)
    try:
        runner = DistributedRunner(store, transport, defs, trace=True)
        ids = start_sync(runner, plan(flat=3, checkout=1, retry=1))
        worker = runner.worker("bg")
        stop = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            try:
                worker.run(stop, idle_sleep=0.005)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        try:
            wait_for(
                lambda: bool(errors) or all(_final(facade.run(store.load, i)) for i in ids),
                "every execution",
            )
        finally:
            stop.set()
            thread.join(timeout=30)
        assert not errors, errors
        for execution_id in ids:
            assert_finished(facade.run(async_snapshot, store, execution_id))
        assert facade.run(transport.stats).depth == 0
    finally:
        facade.run(transport.close)
        facade.run(store.close)


def test_suspend_parks_the_group_and_resume_releases_it(
    rqlite_cluster3: Cluster, tmp_path: Path
) -> None:
    """harel's control plane over the queue: a worker meeting a suspended execution parks its
    group with `nack(delay=suspend_recheck)`; its events wait, in order, until `resume`."""
    queue, store_path, defs = fresh_queue(), os.fspath(tmp_path / "store.db"), definitions()
    with ExitStack() as stack:
        transport = stack.enter_context(
            RqliteTransport(rqlite_cluster3.url, queue=queue, codec=Event)
        )
        store = SqliteStore(store_path)
        stack.callback(store.close)
        runner = DistributedRunner(store, transport, defs, trace=True, execution="inline")
        exe = runner.create("flat")

        with worker_threads(
            2, rqlite_cluster3.url, queue, store_path, defs, "inline", suspend_recheck=0.1
        ) as errors:
            wait_for(lambda: (e := store.load(exe.id)) is not None and e.active_path == "A", "A")
            runner.suspend(exe.id)
            runner.send(exe.id, Event(kind="Go"))
            runner.send(exe.id, Event(kind="Go"))
            wait_for(lambda: transport.stats().parked == 1, "the group to be parked")
            time.sleep(0.5)  # several suspend_recheck periods: claimed, parked again, ...
            held = store.load(exe.id)
            assert held is not None
            assert (held.status, held.active_path) == (Status.SUSPENDED, "A")
            assert transport.stats().depth == 2

            runner.resume(exe.id)
            wait_for(lambda: _final(store.load(exe.id)), "the execution after resume")
            wait_for(lambda: drained(transport), "the queue to drain")
        assert not errors, errors
        assert_finished(sync_snapshot(store, exe.id))


# ------------------------------------------------------------------------------ processes


def _process_main(
    kind: str,
    url: str,
    queue: str,
    store_path: str,
    worker_id: str,
    stop: Any,
    ready: Any,
) -> None:
    """A worker process: builds its own transport (from the URL) and store (from the path),
    tells the parent it is ready, and runs harel's worker loop until `stop` is set."""
    if kind == "sync":
        with from_url(url, queue=queue, codec=Event) as transport:
            store = SqliteStore(store_path)
            try:
                worker = Worker(
                    store, transport, definitions(), worker_id, trace=True, execution="inline"
                )
                ready.put(worker_id)
                worker.run(stop, idle_sleep=0.005)
            finally:
                store.close()
    else:
        asyncio.run(_async_process_main(url, queue, store_path, worker_id, stop, ready))


async def _async_process_main(
    url: str, queue: str, store_path: str, worker_id: str, stop: Any, ready: Any
) -> None:
    """As `python -m harel.worker` does: one event loop, `AsyncWorker.run`."""
    async with await AsyncTransport.from_url(url, queue=queue, codec=Event) as transport:
        store = await AsyncSqliteStore.create(store_path)
        try:
            worker = AsyncWorker(
                store, transport, definitions(), worker_id, concurrency=8, trace=True
            )
            stopped = asyncio.Event()

            async def watch() -> None:
                while not stop.is_set():
                    await asyncio.sleep(0.02)
                stopped.set()

            ready.put(worker_id)
            await asyncio.gather(worker.run(stopped, idle_sleep=0.005), watch())
        finally:
            await store.close()


def test_worker_processes(rqlite_cluster3: Cluster, tmp_path: Path) -> None:
    """Three worker processes (spawned: nothing shared but the cluster and the store file),
    two running the sync `Worker`, one the `AsyncWorker`, drive executions a runner in this
    process created; every one finishes, and the work was spread over the processes."""
    queue, store_path = fresh_queue(), os.fspath(tmp_path / "store.db")
    ctx = multiprocessing.get_context("spawn")
    stop, ready = ctx.Event(), ctx.Queue()
    processes = [
        ctx.Process(
            target=_process_main,
            args=(kind, rqlite_cluster3.url, queue, store_path, f"p{i}-{kind}", stop, ready),
            daemon=True,
        )
        for i, kind in enumerate(["sync", "async", "sync"])
    ]
    with ExitStack() as stack:
        transport = stack.enter_context(
            RqliteTransport(rqlite_cluster3.url, queue=queue, codec=Event)
        )
        store = SqliteStore(store_path)
        stack.callback(store.close)
        try:
            for process in processes:
                process.start()
            for _ in processes:
                ready.get(timeout=60)
            runner = DistributedRunner(store, transport, definitions(), trace=True)
            ids = start_sync(runner, plan(flat=12, checkout=4, retry=2))

            def dead() -> bool:
                return any(p.exitcode is not None for p in processes)

            wait_for(lambda: dead() or all(_final(store.load(i)) for i in ids), "every execution")
            wait_for(lambda: dead() or drained(transport), "the queue to drain")
            assert not dead(), [p.exitcode for p in processes]
        finally:
            stop.set()
            for process in processes:
                process.join(timeout=20)
            for process in processes:  # only if it did not stop: ours, by its own handle
                if process.is_alive():
                    process.kill()
                    process.join()
            ready.close()
        assert [p.exitcode for p in processes] == [0, 0, 0]

        snapshots = [sync_snapshot(store, i) for i in ids]
        for snap in snapshots:
            assert_finished(snap)
        pids: set[int] = set()
        for snap in snapshots:
            pids.update(snap.exe.context["pids"])
            for region in snap.regions:
                pids.update(region.exe.context["pids"])
        assert os.getpid() not in pids, "the runner must not run actions"
        assert len(pids) >= 2, "the work was not shared between the worker processes"


def test_a_leader_kill_never_reaches_send_when_publishes_carry_the_event_id(
    rqlite_cluster_factory: Callable[..., Cluster], tmp_path: Path
) -> None:
    """harel publishes without a dedup id, so after a lost reply it cannot know whether its
    event is queued. With `dedup_key=lambda e: str(e.id)` every publish is safe to resend and
    the transport resends it: while the leader is killed and restarted, `create` and `send`
    never raise, and every execution finishes."""
    cluster = rqlite_cluster_factory(3)
    queue, store_path, defs = fresh_queue(), os.fspath(tmp_path / "store.db"), definitions()
    failures: list[BaseException] = []
    with ExitStack() as stack:
        transport = stack.enter_context(
            RqliteTransport(cluster.url, queue=queue, codec=Event, dedup_key=lambda e: str(e.id))
        )
        store = SqliteStore(store_path)
        stack.callback(store.close)
        runner = DistributedRunner(store, transport, defs, execution="inline")
        killer_done = threading.Event()

        def kill_leaders() -> None:
            for _ in range(2):
                time.sleep(1.0)
                leader = cluster.leader()
                leader.kill()
                time.sleep(1.0)
                leader.restart()
            killer_done.set()

        killer = threading.Thread(target=kill_leaders, daemon=True)
        killer.start()
        ids: list[str] = []
        while not killer_done.is_set():
            try:
                exe = runner.create("flat")
                ids.append(exe.id)
                for kind in EVENTS["flat"]:
                    runner.send(exe.id, Event(kind=kind))
            except Exception as exc:
                failures.append(exc)
        killer.join()
        assert failures == [] and len(ids) > 10
        with worker_threads(2, cluster.url, queue, store_path, defs, "inline") as errors:
            wait_for(
                lambda: bool(errors) or all(_final(store.load(i)) for i in ids), "every execution"
            )
        assert not errors, errors
        assert transport.resent > 0, "no reply was lost: the leader kills proved nothing"
