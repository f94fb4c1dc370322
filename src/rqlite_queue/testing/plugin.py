"""pytest fixtures for testing code that uses rqlite-queue against a real queue.

Registered through the `pytest11` entry point, so installing rqlite-queue is enough. Fixtures:

- `rqlited_path` (session): the rqlited the clusters run (`--rqlited PATH`, else `$RQLITED`, the
  cache `rqlite-queue rqlited` builds into, or PATH). A missing one is an error, not a skip.
- `rqlite_cluster`, `rqlite_cluster3` (session): a shared 1-node and 3-node cluster, started
  when first asked for. Shared: do not kill their nodes (use `rqlite_cluster_factory`).
- `rqlite_cluster_factory`: `make(n=3, **Cluster options)` starts a private cluster whose nodes
  a test may kill, pause and restart; every one is stopped after the test. With
  `links=Links(rtt=0.001)` its nodes' Raft traffic and the clients' HTTP go through toxiproxy
  (`cluster.links`: latency, a silent link, resets... per link; the server `toxiproxy_path`).
- `toxiproxy_path` (session): the toxiproxy server of the links (`$TOXIPROXY`, else the cache
  `rqlite-queue toxiproxy` builds into). A missing one is an error, not a skip.
- `rqlite_queue_name`: a queue name of this test's own (queues in one cluster are independent).
- `rqlite_transport`: a `Transport` on `rqlite_cluster`, on that queue; closed after the test.
- `embedded_transport`: a `Transport` on an SQLite file in `tmp_path` (no rqlited needed).

At the end of the session every rqlited the harness started and nobody stopped is killed, and
the run fails naming them: a test never leaves an rqlited behind.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .. import Transport
from ..local_cluster import Cluster, RqlitedNotFound, kill_leftovers
from ..rqlited import check_rqlited, find_rqlited
from ..toxiproxy import ToxiproxyNotFound, find_toxiproxy


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rqlite-queue")
    group.addoption(
        "--rqlited",
        metavar="PATH",
        help="the rqlited binary for rqlite-queue's cluster fixtures "
        "(default: $RQLITED, the rqlite-queue cache, then PATH)",
    )


@pytest.fixture(scope="session")
def rqlited_path(pytestconfig: pytest.Config) -> str:
    """The rqlited binary the cluster fixtures run; fails (with how to get one) when missing."""
    given = pytestconfig.getoption("rqlited")
    try:
        info = check_rqlited(given) if given else find_rqlited()
    except RqlitedNotFound as exc:
        pytest.fail(f"rqlite-queue fixtures: {exc}", pytrace=False)
    if info.warning:
        sys.stderr.write(f"\nrqlite-queue fixtures: using {info.path}: {info.warning}\n")
    return info.path


@pytest.fixture(scope="session")
def toxiproxy_path() -> str:
    """The toxiproxy server that clusters with `links` run; fails (saying how to get it) when
    missing."""
    try:
        return find_toxiproxy()
    except ToxiproxyNotFound as exc:
        pytest.fail(f"rqlite-queue fixtures: {exc}", pytrace=False)


def _session_cluster(n: int, binary: str) -> Iterator[Cluster]:
    cluster = Cluster(n, binary=binary)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def rqlite_cluster(rqlited_path: str) -> Iterator[Cluster]:
    """A 1-node cluster shared by the session (`.url` for `from_url`)."""
    yield from _session_cluster(1, rqlited_path)


@pytest.fixture(scope="session")
def rqlite_cluster3(rqlited_path: str) -> Iterator[Cluster]:
    """A 3-node cluster shared by the session: leader elected, followers forwarding."""
    yield from _session_cluster(3, rqlited_path)


@pytest.fixture
def rqlite_cluster_factory(
    rqlited_path: str, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Cluster]]:
    """`make(n=3, **options)`: a started private cluster, for failover tests (`.leader().kill()`,
    `.node("n2").restart()`...); all of them stopped after the test."""
    made: list[Cluster] = []

    def make(n: int = 3, **options: Any) -> Cluster:
        options.setdefault("binary", rqlited_path)
        if options.get("links"):
            request.getfixturevalue("toxiproxy_path")  # a clear failure when it is missing
        cluster = Cluster(n, **options)
        made.append(cluster)
        cluster.start()
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.stop()


@pytest.fixture
def rqlite_queue_name() -> str:
    """A fresh queue name, so tests sharing a cluster never see each other's messages."""
    return "t_" + uuid.uuid4().hex[:16]


@pytest.fixture
def rqlite_transport(rqlite_cluster: Cluster, rqlite_queue_name: str) -> Iterator[Transport]:
    """A Transport on the shared 1-node cluster, on this test's own queue."""
    transport = Transport.from_url(rqlite_cluster.url, queue=rqlite_queue_name)
    try:
        yield transport
    finally:
        transport.close()


@pytest.fixture
def embedded_transport(tmp_path: Path, rqlite_queue_name: str) -> Iterator[Transport]:
    """A Transport on an embedded SQLite queue in this test's tmp_path."""
    transport = Transport.from_url(f"sqlite:///{tmp_path}/queue.db", queue=rqlite_queue_name)
    try:
        yield transport
    finally:
        transport.close()


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    """Kill any rqlited the harness started that is still running, and fail the run if there
    was one. A wrapper, so it runs after pytest's own sessionfinish has torn down the
    session-scoped fixtures (the shared clusters)."""
    result = yield
    leaked = kill_leftovers()
    if leaked:
        sys.stderr.write(
            f"\nERROR: rqlited processes left running by the tests (now killed): {sorted(leaked)}\n"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result
