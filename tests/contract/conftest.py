"""The contract suite's fixtures: one queue, on every backend, sync and async.

Every test gets a fresh named queue (its own tables), so the session clusters can be shared.
Sync transports are wrapped so the same `async def` tests drive both flavours: the wrapper
calls the sync method directly, on the event loop's thread."""

from __future__ import annotations

import inspect
import itertools
import os
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import pytest
import urllib3
from shared_clusters import STARTED, drop, nodes_of, post

from rqlite_queue import (
    AsyncRqliteTransport,
    AsyncShardedTransport,
    AsyncSqliteTransport,
    AsyncTransport,
    OutcomeUnknown,
    RqliteTransport,
    ShardedTransport,
    SqliteTransport,
    Transport,
)
from rqlite_queue.testing import Cluster

BACKENDS: list[Any] = [
    "sqlite",
    "rqlite1",
    "rqlite3",
    "rqlite3-follower",
    "rqlite-sharded2",
    pytest.param("rqlite-sharded2x3", marks=pytest.mark.slow),
]
"""`rqlite-sharded2`: one queue over two 1-node clusters (a ShardedTransport);
`rqlite-sharded2x3`, in the slow tier (`pytest -m slow tests/contract`): over two 3-node
clusters."""
FLAVOURS = ["sync", "async"]

ONE_TOPOLOGY_ENOUGH = {
    "test_hostile_input",
    "test_time",
    "test_lost_replies",
    "test_admin",
    "test_follow_ups",
    "test_tenants",
    "test_limits",
    "test_debounce",
    "test_headers",
    "test_outcomes",
    "test_batches",
}
"""Modules whose checks are the same code on every rqlite topology (arguments are checked
before any I/O; the fake clock and the injected lost replies sit above the HTTP client; admin
calls, follow-ups and tenants are SQL that a follower forwards as it forwards the rest): by
default they run on SQLite, the 3-node cluster and two shards; on one node and through a
follower only in the slow tier (`pytest -m slow tests/contract`), to keep `make test` short."""
SLOW_TOPOLOGIES = {"rqlite1", "rqlite3-follower"}
ONE_NODE_IN_THE_SLOW_TIER = {"test_contract"}
"""The main contract module runs through a follower by default, but on the one-node cluster
only in the slow tier: the 3-node cluster's leader runs the same code, two shards run on
one-node clusters, and the stateful model runs on one."""


ONE_FLAVOUR_BY_DEFAULT = {"rqlite3": "sync", "rqlite-sharded2": "async"}
"""In the modules of `ONE_TOPOLOGY_ENOUGH`, the flavour each cluster backend runs by default
(the other in the slow tier): both flavours on SQLite, and each on a real cluster, so that
both HTTP clients (urllib3 for sync, aiohttp for async) and both generated transports meet
every check on rqlite in the default run."""
FOLLOWER_FLAVOUR_BY_DEFAULT = "sync"
"""The main module through a follower (the forwarding, and the client's move to the leader)
in one flavour by default, the other in the slow tier: the path is the HTTP client's, and
both flavours run it on the 3-node cluster's leader and on two shards."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        backend = callspec.params.get("backend") if callspec is not None else None
        flavour = callspec.params.get("flavour") if callspec is not None else None
        module = item.module.__name__.rpartition(".")[2] if item.module else ""
        if backend in SLOW_TOPOLOGIES and module in ONE_TOPOLOGY_ENOUGH:
            item.add_marker(pytest.mark.slow)
        if backend == "rqlite1" and module in ONE_NODE_IN_THE_SLOW_TIER:
            item.add_marker(pytest.mark.slow)
        one_flavour = ONE_FLAVOUR_BY_DEFAULT.get(backend, flavour)
        if module in ONE_TOPOLOGY_ENOUGH and one_flavour != flavour:
            item.add_marker(pytest.mark.slow)
        if backend == "rqlite3-follower" and flavour not in (None, FOLLOWER_FLAVOUR_BY_DEFAULT):
            item.add_marker(pytest.mark.slow)


_names = itertools.count()
Closing = TypeVar("Closing", Transport, ShardedTransport)


class FakeClock:
    """A clock the test moves by hand, so lease lapses need no sleeping."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class SyncAsAsync:
    """Presents a sync transport with the async transport's awaitable methods."""

    def __init__(self, transport: Transport) -> None:
        self.sync = transport

    def transaction(self) -> Any:
        return AsyncContext(self.sync.transaction())

    def batch(self, *args: Any, **kwargs: Any) -> Any:
        return AsyncBatchFacade(self.sync.batch(*args, **kwargs))

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.sync, name)
        if not callable(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            return attr(*args, **kwargs)

        return call


class AsyncBatchFacade:
    """A sync batch with the async batch's methods (its block with `async with`)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def batch(self, *args: Any, **kwargs: Any) -> Any:
        return AsyncBatchFacade(self.inner.batch(*args, **kwargs))

    async def flush(self) -> None:
        self.inner.flush()

    async def __aenter__(self) -> Any:
        self.inner.__enter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        return self.inner.__exit__(*exc_info)


class AsyncContext:
    """A sync context manager used with `async with` (a sync transaction, in the tests)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __aenter__(self) -> Any:
        return self.inner.__enter__()

    async def __aexit__(self, *exc_info: Any) -> Any:
        return self.inner.__exit__(*exc_info)


def per_shard(q: Any, groups: list[str]) -> dict[str, list[str]]:
    """`groups`, in order, split by the shard each lives on (one list on one cluster). The
    claim order a single cluster promises exactly holds within each shard of a sharded queue:
    tests of that order compare these projections."""
    transport = getattr(q, "sync", q)
    shard_of = getattr(transport, "shard_of", None)
    if shard_of is None:
        return {"": list(groups)}
    split: dict[str, list[str]] = {}
    for group in groups:
        split.setdefault(shard_of(group), []).append(group)
    return split


@pytest.fixture(scope="session")
def second_cluster(rqlited_path: str) -> Any:
    """Another 1-node cluster: the second shard of `rqlite-sharded2`."""
    with Cluster(1, binary=rqlited_path) as cluster:
        STARTED.append(cluster)
        yield cluster


@pytest.fixture(scope="session")
def second_cluster3(rqlited_path: str) -> Any:
    """Another 3-node cluster: the second shard of `rqlite-sharded2x3`."""
    with Cluster(3, binary=rqlited_path) as cluster:
        STARTED.append(cluster)
        yield cluster


def backend_url(backend: str, request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if backend == "rqlite-sharded2x3":
        first: Cluster = request.getfixturevalue("rqlite_cluster3")
        second: Cluster = request.getfixturevalue("second_cluster3")
        return f"a={first.url};b={second.url}"
    if backend == "rqlite-sharded2":
        first: Cluster = request.getfixturevalue("rqlite_cluster")
        second: Cluster = request.getfixturevalue("second_cluster")
        return f"a={first.url};b={second.url}"
    if backend == "sqlite":
        return "sqlite:///" + os.fspath(tmp_path / "queue.db")
    if backend == "rqlite1":
        cluster: Cluster = request.getfixturevalue("rqlite_cluster")
        return cluster.url
    cluster = request.getfixturevalue("rqlite_cluster3")
    if backend == "rqlite3-follower":
        return cluster.followers()[0].http_url
    return cluster.url


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def url(backend: str, request: pytest.FixtureRequest, tmp_path: Any) -> str:
    return backend_url(backend, request, tmp_path)


MakeQueue = Callable[..., Any]


@pytest.fixture
async def make_queue(url: str, flavour: str, clock: FakeClock) -> AsyncIterator[MakeQueue]:
    """`make_queue(**options)`: a transport on this test's backend and flavour, on a queue
    name of its own (pass `queue=` to share one between two transports)."""
    opened: list[Any] = []
    default_queue = f"t{os.getpid()}_{next(_names)}"

    async def make(**options: Any) -> Any:
        options.setdefault("queue", default_queue)
        options.setdefault("clock", clock)
        sqlite = url.startswith("sqlite")
        if not sqlite:
            options.setdefault("max_skew", None)  # the fake clock is years from rqlite's
        if ";" in url:
            if flavour == "async":
                sharded = AsyncShardedTransport(url, **options)
                await sharded.setup()
                opened.append(sharded)
                return sharded
            sync_sharded = ShardedTransport(url, **options)
            sync_sharded.setup()
            opened.append(sync_sharded)
            return SyncAsAsync(sync_sharded)
        if flavour == "async":
            cls: type[Any] = AsyncSqliteTransport if sqlite else AsyncRqliteTransport
            target = url.removeprefix("sqlite:///") if sqlite else url
            transport: AsyncTransport = cls(target, **options)
            await transport.setup()
            opened.append(transport)
            return transport
        sync_cls: type[Any] = SqliteTransport if sqlite else RqliteTransport
        target = url.removeprefix("sqlite:///") if sqlite else url
        sync: Transport = sync_cls(target, **options)
        sync.setup()
        opened.append(sync)
        return SyncAsAsync(sync)

    yield make
    for transport in opened:
        result = transport.close()
        if hasattr(result, "__await__"):
            await result
    queues = {getattr(t, "sync", t).queue for t in opened}
    if not url.startswith("sqlite"):
        drop_queues(url, queues)


def drop_queues(url: str, queues: set[str]) -> None:
    """Drop the tables of these queues on the clusters of `url` (each shard's): the session's
    clusters are shared by thousands of tests (`shared_clusters`)."""
    http = urllib3.PoolManager(timeout=30.0)
    for nodes in nodes_of(url):
        for queue in queues:
            prefix = f"rq_{queue}_"
            query = [
                "SELECT name FROM sqlite_master WHERE type = 'table' AND substr(name, 1, ?) = ?",
                len(prefix),
                prefix,
            ]
            reply = post(http, nodes, "/db/query?level=strong", [query])
            drop(http, nodes, {name for (name,) in reply["results"][0].get("values") or []})


def dropped_when_closed(transport: Closing, url: str) -> Closing:
    """`transport`, whose `close()` also drops its queue's tables on the clusters of `url`: the
    stateful machines open a queue per example on the session's clusters, and the 1-node ones
    (two shards, the stateful runs on rqlite) were left with hundreds of tables: the contract
    modules after them ran 5-10x slower on two shards (0.7-1 s a test, 0.1 s on clean ones)."""
    close = transport.close

    def close_and_drop() -> None:
        close()
        drop_queues(url, {transport.queue})

    transport.close = close_and_drop  # type: ignore[method-assign]
    return transport


@pytest.fixture
async def q(make_queue: MakeQueue) -> Any:
    return await make_queue()


# ------------------------------------------------------------------------ lost replies


class LoseReplies:
    """Wraps one cluster's executor; shared by the shards of a queue (`plan`)."""

    def __init__(self, inner: Any, plan: list[tuple[str, Callable[[], Any] | None]]) -> None:
        self.inner = inner
        self.plan = plan
        """What to do with the next writes: ("apply" | "drop", then run this before the
        resend)."""
        self.sent = 0
        if inspect.iscoroutinefunction(inner.execute):
            self.execute = self._execute_async  # type: ignore[method-assign]

    def _next(self, batch: Any) -> tuple[str, Callable[[], Any] | None] | None:
        if batch.write and self.plan:
            return self.plan.pop(0)
        return None

    def execute(self, batch: Any, deadline: float, **hints: Any) -> Any:
        self.sent += 1
        step = self._next(batch)
        if step is None:
            return self.inner.execute(batch, deadline, **hints)
        if step[0] == "apply":
            self.inner.execute(batch, deadline, **hints)
        if step[1] is not None:
            step[1]()
        raise OutcomeUnknown(f"reply lost (test: {step[0]})")

    async def _execute_async(self, batch: Any, deadline: float, **hints: Any) -> Any:
        self.sent += 1
        step = self._next(batch)
        if step is None:
            return await self.inner.execute(batch, deadline, **hints)
        if step[0] == "apply":
            await self.inner.execute(batch, deadline, **hints)
        if step[1] is not None:
            step[1]()
        raise OutcomeUnknown(f"reply lost (test: {step[0]})")

    def close(self) -> Any:
        return self.inner.close()  # the inner one's: a coroutine for an async executor


def lose(q: Any, *steps: tuple[str, Callable[[], Any] | None]) -> list[Any]:
    """Make the next writes of `q` (on whichever cluster) lose their replies as `steps` say."""
    transport = getattr(q, "sync", q)
    router = transport.router
    one = router.cluster
    backends = [one] if one is not None else [router.backend(name) for name in router.names]
    plan = list(steps)
    for backend in backends:
        if not isinstance(backend.executor, LoseReplies):
            backend.executor = LoseReplies(backend.executor, plan)
        else:
            backend.executor.plan = plan
    return plan


def taken_over(make_other: Callable[[], Any], clock: FakeClock, group: str) -> Callable[[], Any]:
    """Before the resend: the lease lapses, and another worker takes its group over."""

    def act() -> None:
        clock.advance(31)
        other = make_other()
        lease = other.claim("other", 30)
        assert lease is not None and lease.group_id == group

    return act


@pytest.fixture
async def q_and_other(
    make_queue: MakeQueue, url: str, clock: FakeClock
) -> AsyncIterator[tuple[Any, Transport]]:
    """The transport under test, and a sync transport of the same queue for another worker
    (sync, so that it can act from inside a lost reply, on the event loop's thread too)."""
    q = await make_queue()
    options: dict[str, Any] = {"queue": getattr(q, "sync", q).queue, "clock": clock}
    if not url.startswith("sqlite"):
        options["max_skew"] = None  # the fake clock is years from rqlite's
    other = Transport.from_url(url, **options)
    yield q, other
    other.close()
