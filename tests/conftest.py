"""The project's tests run on the fixtures of its own pytest plugin (`rqlite_queue.testing.plugin`,
loaded through its `pytest11` entry point): `rqlite_cluster`, `rqlite_cluster3`,
`rqlite_cluster_factory`, `rqlited_path`. The shared clusters must be left healthy (no kill or
pause) and each test uses its own queue name; fault tests build their own clusters with
`rqlite_cluster_factory` (or `with Cluster(...)`). The plugin also fails the run if any rqlited
is left behind.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import urllib3
from shared_clusters import STARTED, drop, tables

from rqlite_queue import RqliteTransport
from rqlite_queue.testing import Cluster
from rqlite_queue.worker import Worker

ThreeWorkers = Callable[..., AbstractContextManager[None]]


@pytest.fixture(scope="session")
def rqlite_cluster(rqlite_cluster: Cluster) -> Cluster:
    """The plugin's shared 1-node cluster, noted for the sweep after each module."""
    STARTED.append(rqlite_cluster)
    return rqlite_cluster


@pytest.fixture(scope="session")
def rqlite_cluster3(rqlite_cluster3: Cluster) -> Cluster:
    """The plugin's shared 3-node cluster, noted for the sweep after each module."""
    STARTED.append(rqlite_cluster3)
    return rqlite_cluster3


@pytest.fixture(scope="module", autouse=True)
def _sweep_the_shared_clusters() -> Iterator[None]:
    """Drop, when a module ends, every table it made on the session's shared clusters (those
    already started, and those it started): see `shared_clusters`."""
    http = urllib3.PoolManager(timeout=30.0)
    before = {id(cluster): tables(http, cluster.urls) for cluster in STARTED}
    yield
    for cluster in STARTED:
        made = tables(http, cluster.urls) - before.get(id(cluster), set())
        drop(http, cluster.urls, made)
    http.clear()


@pytest.fixture(params=["sqlite", "rqlite3"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A queue URL: an SQLite file of this test's, then the session's 3-node cluster."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/q.db"
    cluster: Cluster = request.getfixturevalue("rqlite_cluster3")
    return cluster.url


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark `rqlite` every test that needs a real rqlited (every cluster fixture depends on
    `rqlited_path`; backends chosen by parameter are named rqlite*), so that
    `pytest -m "not rqlite"` (`make unit-fast`) runs without Go or rqlited."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        values = callspec.params.values() if callspec is not None else ()
        if "rqlited_path" in getattr(item, "fixturenames", ()) or any(
            isinstance(v, str) and v.startswith("rqlite") for v in values
        ):
            item.add_marker(pytest.mark.rqlite)


@pytest.fixture
def three_workers() -> ThreeWorkers:
    """`with three_workers(cluster, queue, handler, concurrency=N):` three Workers on threads,
    each with a transport of its own to `cluster`, draining `queue` until the block ends
    (then stopped and joined)."""

    @contextmanager
    def run(
        cluster: Cluster, queue: str, handler: Callable[[Any], None], concurrency: int
    ) -> Iterator[None]:
        transports = [RqliteTransport(cluster.url, queue=queue) for _ in range(3)]
        workers = [Worker(t, handler, concurrency=concurrency, visibility=30) for t in transports]
        threads = [
            threading.Thread(target=w.run, kwargs={"handle_signals": False}) for w in workers
        ]
        for thread in threads:
            thread.start()
        try:
            yield
        finally:
            for worker in workers:
                worker.stop()
            for thread in threads:
                thread.join(30)
            for transport in transports:
                transport.close()

    return run
