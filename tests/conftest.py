"""Shared pytest fixtures: the rqlited binary and real local rqlite clusters.

The session clusters (`cluster1`, `cluster3`) are shared by many tests, so tests using them must
leave them healthy (no kill/pause) and use their own table names. Fault tests build their own
cluster with `make_cluster` (or `with Cluster(...)`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rqlite_queue.cluster import Cluster, find_rqlited, live_pids


@pytest.fixture(scope="session")
def rqlited_binary() -> str:
    """Path of the pinned rqlited; errors (does not skip) when missing, with the build hint."""
    return find_rqlited()


@pytest.fixture(scope="session")
def cluster1(rqlited_binary: str) -> Iterator[Cluster]:
    """A single-node cluster for the whole session, started when first requested."""
    cluster = Cluster(1, binary=rqlited_binary)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def cluster3(rqlited_binary: str) -> Iterator[Cluster]:
    """A three-node cluster for the whole session, started when first requested."""
    cluster = Cluster(3, binary=rqlited_binary)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", "rqlite3"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A queue URL: an SQLite file of this test's, then the session's 3-node cluster."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/q.db"
    cluster: Cluster = request.getfixturevalue("cluster3")
    return cluster.url


@pytest.fixture
def make_cluster(rqlited_binary: str) -> Iterator[Callable[..., Cluster]]:
    """Factory for private, started clusters (for fault tests); all stopped after the test."""
    made: list[Cluster] = []

    def make(n: int = 3, **kwargs: Any) -> Cluster:
        kwargs.setdefault("binary", rqlited_binary)
        cluster = Cluster(n, **kwargs)
        made.append(cluster)
        cluster.start()
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `rqlite` every test that needs a real rqlited (every cluster fixture depends on
    `rqlited_binary`; backends chosen by parameter are named rqlite*), so that
    `pytest -m "not rqlite"` (`make unit-fast`) runs without Go or rqlited."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        values = callspec.params.values() if callspec is not None else ()
        if "rqlited_binary" in getattr(item, "fixturenames", ()) or any(
            isinstance(v, str) and v.startswith("rqlite") for v in values
        ):
            item.add_marker(pytest.mark.rqlite)


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Iterator[None]:
    """Fail the run if any rqlited started by the harness is still alive at the very end.

    A wrapper, so the check runs after every other sessionfinish implementation, including
    pytest's own that tears down the session-scoped fixtures (the clusters) still set up.
    """
    result = yield
    leaked = live_pids()
    if leaked:
        sys.stderr.write(
            f"\nERROR: rqlited processes left running by the tests: {sorted(leaked)}\n"
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result
