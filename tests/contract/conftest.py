"""The contract suite's fixtures: one queue, on every backend, sync and async.

Every test gets a fresh named queue (its own tables), so the session clusters can be shared.
Sync transports are wrapped so the same `async def` tests drive both flavours: the wrapper
calls the sync method directly, on the event loop's thread."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from rqlite_queue import (
    AsyncRqliteTransport,
    AsyncShardedTransport,
    AsyncSqliteTransport,
    AsyncTransport,
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
_names = itertools.count()


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

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.sync, name)
        if not callable(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            return attr(*args, **kwargs)

        return call


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
        yield cluster


@pytest.fixture(scope="session")
def second_cluster3(rqlited_path: str) -> Any:
    """Another 3-node cluster: the second shard of `rqlite-sharded2x3`."""
    with Cluster(3, binary=rqlited_path) as cluster:
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


@pytest.fixture
async def q(make_queue: MakeQueue) -> Any:
    return await make_queue()
