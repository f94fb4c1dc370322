"""Django's Tasks on the queue (`rqlite_queue.django`), as users run them: the project of
`django_project/`, its tasks enqueued here, its workers real `manage.py rqlite_queue_worker`
processes, one SIGKILLed mid-run, on the embedded file (and, in the slow tier, on a 3-node
cluster whose leader is killed mid-run). Runs on Django 6's `django.tasks` (Python 3.12+, the
`make test` venv of scripts/django6-tests) and on the `django-tasks` backport (Django 5.2)."""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django")

from framework_checks import Processes, check_runs, read_runs, wait_for

from rqlite_queue import from_url
from rqlite_queue.testing import Cluster

PROJECT = Path(__file__).resolve().parent / "django_project"
KEYS = [f"order-{i}" for i in range(4)]
STEPS = 4


@pytest.fixture(scope="module")
def django_setup() -> Iterator[Any]:
    """Django configured in this process with the test project's settings (the enqueueing
    side); every test overrides TASKS with its own URL and queue prefix."""
    import django

    sys.path.insert(0, str(PROJECT))
    os.environ["DJANGO_SETTINGS_MODULE"] = "project.settings"
    os.environ.setdefault("TEST_EVENTS", os.devnull)
    django.setup()
    from rqlite_queue.django import compat

    yield compat
    sys.path.remove(str(PROJECT))


def tasks_setting(url: str, prefix: str, **options: Any) -> dict[str, Any]:
    from django.conf import settings

    default = dict(settings.TASKS["default"])
    default["OPTIONS"] = {**default["OPTIONS"], "url": url, "queue_prefix": prefix, **options}
    return {"default": default}


@pytest.fixture
def processes() -> Iterator[Processes]:
    procs = Processes()
    try:
        yield procs
    finally:
        procs.stop()


def worker_argv() -> list[str]:
    return [sys.executable, "manage.py", "rqlite_queue_worker", "--concurrency", "4"]


def lines(path: Path, kind: str) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split()[1:] for line in path.read_text().splitlines() if line.startswith(kind)]


def run_scenario(
    django_setup: Any,
    url: str,
    tmp_path: Path,
    processes: Processes,
    during: Callable[[], None] = lambda: None,
) -> None:
    from django.test.utils import override_settings

    compat = django_setup
    from steps import tasks

    events = tmp_path / "events.log"
    prefix = f"d{uuid.uuid4().hex[:6]}_"
    env = {
        **os.environ,
        "TEST_TASKS_URL": url,
        "TEST_QUEUE_PREFIX": prefix,
        "TEST_EVENTS": str(events),
        "TEST_SCHEDULES": "1",
        "PYTHONPATH": os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")]),
    }
    enqueued: list[Any] = []

    def on_enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
        enqueued.append(task_result)

    compat.task_enqueued.connect(on_enqueued)
    with override_settings(TASKS=tasks_setting(url, prefix)):
        try:
            results = [
                tasks.step.using(group=key).enqueue(key, n, 0.05)
                for n in range(STEPS)
                for key in KEYS
            ]
            free = [tasks.step.enqueue(f"free-{i}", 0) for i in range(8)]
            urgent = tasks.step.using(queue_name="urgent", priority=60).enqueue("urgent", 0)
            later = datetime.now().astimezone() + timedelta(seconds=1.5)
            deferred = tasks.step.using(run_after=later).enqueue("deferred", 0)
            flaky = tasks.flaky.enqueue("flaky")
            fatal = tasks.fatal.enqueue("fatal")
            asleep = tasks.asleep.enqueue("async")
        finally:
            compat.task_enqueued.disconnect(on_enqueued)
        every = [*results, *free, urgent, deferred, flaky, fatal, asleep]
        assert [r.id for r in enqueued] == [r.id for r in every]
        assert {r.status for r in every} == {compat.TaskResultStatus.READY}
        assert all(r.enqueued_at is not None and r.backend == "default" for r in every)

        log = tmp_path / "workers.log"
        first = processes.start(worker_argv(), cwd=PROJECT, env=env, log=log)
        wait_for(
            lambda: any(r.pid == first for runs in read_runs(events).values() for r in runs),
            60,
            "the first worker never ran a step: "
            + (log.read_text()[-3000:] if log.exists() else ""),
        )
        processes.kill(first)
        during()
        second = processes.start(worker_argv(), cwd=PROJECT, env=env, log=log)
        processes.start(worker_argv(), cwd=PROJECT, env=env, log=log)

        steps = {
            **dict.fromkeys(KEYS, STEPS),
            **{f"free-{i}": 1 for i in range(8)},
            "urgent": 1,
            "deferred": 1,
            "async": 1,
        }

        def done() -> bool:
            runs = read_runs(events)
            ends = all(
                sorted({r.n for r in runs.get(k, []) if r.end is not None}) == list(range(c))
                for k, c in steps.items()
            )
            return ends and len(lines(events, "tick")) >= 2 and bool(lines(events, "fatal"))

        wait_for(
            done, 90, "not every task ran: " + (log.read_text()[-3000:] if log.exists() else "")
        )
        check_runs(events, steps, processes.killed)

        runs = read_runs(events)
        assert runs["deferred"][0].start >= later.timestamp() - 0.05  # (clock of one machine)
        # flaky: failed once (READY, retried), then succeeded on its second attempt.
        assert [a[1] for a in lines(events, "attempt")] == ["1", "2"]
        signals = lines(events, "signal")
        finished = {s[1]: s for s in signals if s[0] == "finished"}
        assert finished[flaky.id][2:] == ["SUCCESSFUL", "2", "0"], signals
        assert finished[fatal.id][2:4] == ["FAILED", "1"], signals
        assert len(lines(events, "fatal")) == 1  # non_retryable: not tried again
        assert finished[asleep.id][2] == "SUCCESSFUL"
        for result in every:
            if result is not fatal:
                assert finished[result.id][2] == "SUCCESSFUL", result.id
            assert any(s[0] == "started" and s[1] == result.id for s in signals)

        with pytest.raises(NotImplementedError):
            tasks.step.get_result(flaky.id)

    # A graceful stop: SIGTERM, running tasks finish, exit 0 (once it has started: its line
    # comes once its handlers are set; a SIGTERM during Django's imports is the default's).
    wait_for(
        lambda: re.search(rf"\(worker \S+-{second}, ", log.read_text()) is not None,
        60,
        "the second worker never started: " + log.read_text()[-3000:],
    )
    proc = next(p for p in processes.started if p.pid == second)
    proc.terminate()
    assert proc.wait(30) == 0
    queue = from_url(url, queue=f"{prefix}default")
    try:
        wait_for(lambda: queue.stats().depth == 0, 20, "messages left")
        letters = queue.dead_letters()
        assert [d.event["id"] for d in letters] == [fatal.id]
        assert "Fatal" in letters[0].reason
    finally:
        queue.close()


def test_django_tasks_on_the_embedded_queue(
    django_setup: Any, tmp_path: Path, processes: Processes
) -> None:
    run_scenario(django_setup, f"sqlite:///{tmp_path}/tasks.db", tmp_path, processes)


@pytest.mark.slow
def test_django_tasks_on_a_3_node_cluster_with_a_leader_kill(
    django_setup: Any,
    tmp_path: Path,
    processes: Processes,
    rqlite_cluster_factory: Callable[..., Cluster],
) -> None:
    cluster = rqlite_cluster_factory(3)

    def kill_the_leader() -> None:
        time.sleep(0.5)
        cluster.leader().kill()

    run_scenario(django_setup, cluster.url, tmp_path, processes, during=kill_the_leader)


def test_a_worker_stopped_while_it_connects_leaves_at_once(
    tmp_path: Path, processes: Processes
) -> None:
    """SIGTERM while the worker waits for a cluster that is not up: exit 0 at once, no
    traceback (it was killed by the signal's default action before its workers ran)."""
    from rqlite_queue.testing import free_port

    events = tmp_path / "events.log"
    env = {
        **os.environ,
        "TEST_TASKS_URL": f"http://127.0.0.1:{free_port()}",
        "TEST_EVENTS": str(events),
        "PYTHONPATH": os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")]),
    }
    log = tmp_path / "worker.log"
    pid = processes.start(worker_argv(), cwd=PROJECT, env=env, log=log)
    wait_for(lambda: bool(lines(events, "ready")), 60, "Django never started")
    time.sleep(1.0)  # (past the command's start: it waits up to 30 s for the cluster)
    proc = next(p for p in processes.started if p.pid == pid)
    began = time.monotonic()
    proc.terminate()
    assert proc.wait(10) == 0, log.read_text()[-3000:]
    assert time.monotonic() - began < 5
    assert "Traceback" not in log.read_text()


def test_validate_task_refuses_what_the_backend_cannot_run(
    django_setup: Any, tmp_path: Path
) -> None:
    from django.test.utils import override_settings

    compat = django_setup
    from steps import tasks

    with override_settings(TASKS=tasks_setting(f"sqlite:///{tmp_path}/t.db", "v_")):
        backend = compat.task_backends["default"]
        assert (backend.supports_defer, backend.supports_async_task, backend.supports_priority) == (
            True,
            True,
            True,
        )
        with pytest.raises(compat.InvalidTask, match="aware"):
            tasks.step.using(run_after=datetime.now())
        with pytest.raises(compat.InvalidTask, match="not valid"):
            tasks.step.using(queue_name="elsewhere")
        with pytest.raises(compat.InvalidTask, match="priority"):
            tasks.step.using(priority=101)
        with pytest.raises(compat.InvalidTask, match="group"):
            tasks.step.using(group="")
        assert re.fullmatch(r"[0-9a-f]{32}", tasks.step.enqueue("x", 0).id)
        backend.close()
