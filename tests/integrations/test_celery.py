"""Celery on the queue (`rqlite_queue.kombu`), as users run it: the app of `celery_project/`,
its workers as real `celery worker` processes, on the embedded file and on a 3-node cluster
whose leader is killed mid-run, with a worker SIGKILLed mid-run: every task runs and its result
reads back, the steps of a key (`MessageGroupId`) run in order and never two at once. The
cluster's run (about 40 s) is in the slow tier; the embedded one in the default run."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("celery")

from framework_checks import Processes, check_runs, read_runs, wait_for

from rqlite_queue import from_url
from rqlite_queue.testing import Cluster

PROJECT = Path(__file__).resolve().parent / "celery_project"
KEYS = [f"order-{i}" for i in range(6)]
STEPS = 5


@pytest.fixture
def celery_env(tmp_path: Path) -> Callable[[str], dict[str, str]]:
    def env(broker_url: str) -> dict[str, str]:
        (tmp_path / "results").mkdir(exist_ok=True)
        return {
            **os.environ,
            "TEST_BROKER_URL": broker_url,
            "TEST_RESULTS": str(tmp_path / "results"),
            "TEST_EVENTS": str(tmp_path / "events.log"),
            "TEST_VISIBILITY": "2",
            "PYTHONPATH": os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")]),
        }

    return env


@pytest.fixture
def processes() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        procs.stop()


def celery_app(env: dict[str, str]) -> Any:
    """The test's own client of the app (the publisher, the results' reader)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    sys.path.insert(0, str(PROJECT))
    try:
        sys.modules.pop("tasks_app", None)
        import tasks_app

        return tasks_app
    finally:
        sys.path.remove(str(PROJECT))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def worker_argv(name: str, concurrency: int = 4) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tasks_app",
        "worker",
        "--pool",
        "threads",
        "-c",
        str(concurrency),
        "--without-mingle",
        "--without-gossip",
        "--without-heartbeat",
        "-l",
        "WARNING",
        "-n",
        f"{name}@%h",
    ]


def run_scenario(
    url: str,
    broker_url: str,
    env: dict[str, str],
    processes: Processes,
    tmp_path: Path,
    during: Callable[[], None] = lambda: None,
) -> None:
    tasks = celery_app(env)
    events = Path(env["TEST_EVENTS"])
    log = tmp_path / "workers.log"
    first = processes.start(worker_argv("w1"), cwd=PROJECT, env=env, log=log)
    results = []
    for n in range(STEPS):
        for key in KEYS:
            results.append(tasks.step.apply_async((key, n, 0.05), MessageGroupId=key))
    unordered = [tasks.step.apply_async((f"free-{i}", 0)) for i in range(20)]
    # The first worker is SIGKILLed while it runs steps (their leases lapse, they run again
    # on the two workers started then).
    wait_for(
        lambda: any(r.pid == first for runs in read_runs(events).values() for r in runs),
        60,
        "the first worker never ran a step: " + log.read_text()[-3000:],
    )
    processes.kill(first)
    during()
    processes.start(worker_argv("w2"), cwd=PROJECT, env=env, log=log)
    processes.start(worker_argv("w3"), cwd=PROJECT, env=env, log=log)
    for result in results + unordered:
        key, n = result.get(timeout=90)
        assert result.successful()
    assert [r.get() for r in results] == [[key, n] for n in range(STEPS) for key in KEYS]
    check_runs(
        events,
        {**dict.fromkeys(KEYS, STEPS), **{f"free-{i}": 1 for i in range(20)}},
        processes.killed,
    )
    queue = from_url(url, queue="celery")
    try:
        wait_for(lambda: queue.stats().depth == 0, 20, "messages left in the queue")
        assert queue.stats().dead == 0
    finally:
        queue.close()


def test_celery_on_the_embedded_queue(
    tmp_path: Path, celery_env: Callable[[str], dict[str, str]], processes: Processes
) -> None:
    url = f"sqlite:///{tmp_path}/broker.db"
    run_scenario(url, f"rqlite+{url}", celery_env(f"rqlite+{url}"), processes, tmp_path)


@pytest.mark.slow
def test_celery_on_a_3_node_cluster_with_a_leader_kill(
    tmp_path: Path,
    celery_env: Callable[[str], dict[str, str]],
    processes: Processes,
    rqlite_cluster_factory: Callable[..., Cluster],
) -> None:
    cluster = rqlite_cluster_factory(3)
    url = cluster.url
    broker = ";".join(f"rqlite://{node.http_addr}" for node in cluster.nodes)

    def kill_the_leader() -> None:
        time.sleep(0.5)
        cluster.leader().kill()

    run_scenario(url, broker, celery_env(broker), processes, tmp_path, during=kill_the_leader)
