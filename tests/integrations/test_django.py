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
        # Its signal carries both attempts, the first one's error (as get_result does).
        assert finished[flaky.id][2:] == ["SUCCESSFUL", "2", "1", "builtins.RuntimeError"]
        assert finished[fatal.id][2:4] == ["FAILED", "1"], signals
        assert len(lines(events, "fatal")) == 1  # non_retryable: not tried again
        assert finished[asleep.id][2] == "SUCCESSFUL"
        for result in every:
            if result is not fatal:
                assert finished[result.id][2] == "SUCCESSFUL", result.id
            assert any(s[0] == "started" and s[1] == result.id for s in signals)

        # Every run's result, read back from the queue by its id (the 3-node run: after a
        # leader kill; both: after a worker's SIGKILL, whose tasks ran again elsewhere).
        pids = {str(p.pid) for p in processes.started}
        for result in every:
            got = result.task.get_result(result.id)
            expected = "FAILED" if result is fatal else "SUCCESSFUL"
            assert (got.status, got.id, got.args) == (expected, result.id, result.args)
            assert got.enqueued_at == result.enqueued_at
            assert got.enqueued_at <= got.started_at <= got.finished_at
            assert got.attempts >= 1 and {w.rsplit("-", 1)[1] for w in got.worker_ids} <= pids
        assert [r.task.get_result(r.id).return_value for r in results[:2]] == [
            [KEYS[0], 0],
            [KEYS[1], 0],
        ]
        flaky_result = tasks.flaky.get_result(flaky.id)
        assert flaky_result.return_value == 2 and flaky_result.attempts == 2
        assert [e.exception_class_path for e in flaky_result.errors] == ["builtins.RuntimeError"]
        fatal_result = tasks.fatal.get_result(fatal.id)
        assert [e.exception_class_path for e in fatal_result.errors] == ["steps.tasks.Fatal"]
        assert fatal_result.errors[0].exception_class is tasks.Fatal

    # A graceful stop: SIGTERM, running tasks finish, exit 0 (once it has started: its line
    # comes once its handlers are set; a SIGTERM during Django's imports is the default's).
    from rqlite_queue.django.results import result_id

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
        assert [result_id("default", d.group_id, d.seq) for d in letters] == [fatal.id]
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


def test_get_result_reads_each_run_back_as_djangos_backends_report_it(
    django_setup: Any, tmp_path: Path, processes: Processes
) -> None:
    """`get_result` / `aget_result` and `TaskResult.refresh()` in the enqueueing process, the
    tasks run by a real worker: READY results equal to what `enqueue` returned (Django's own
    test of its backends), RUNNING with its worker and start, then SUCCESSFUL with the return
    value, or FAILED with each attempt's error (class path, traceback) and worker; times in
    order; TaskResultDoesNotExist for ids it never gave, TaskResultMismatch for another
    task's."""
    import asyncio

    from django.test.utils import override_settings

    from rqlite_queue.django.results import result_id

    compat = django_setup
    from steps import tasks

    url = f"sqlite:///{tmp_path}/tasks.db"
    prefix = f"r{uuid.uuid4().hex[:6]}_"
    env = {
        **os.environ,
        "TEST_TASKS_URL": url,
        "TEST_QUEUE_PREFIX": prefix,
        "TEST_EVENTS": str(tmp_path / "events.log"),
        "PYTHONPATH": os.pathsep.join([str(PROJECT), os.environ.get("PYTHONPATH", "")]),
    }
    release = tmp_path / "release"
    with override_settings(TASKS=tasks_setting(url, prefix)):
        backend = compat.task_backends["default"]
        assert backend.supports_get_result
        later = datetime.now().astimezone() + timedelta(seconds=0.5)
        enqueued = {
            "ok": tasks.step.using(group="order-1", priority=30).enqueue("ok", 1),
            "later": tasks.step.using(run_after=later, queue_name="urgent").enqueue("later", 2),
            "flaky": tasks.flaky.enqueue("flaky"),
            "doomed": tasks.doomed.enqueue("doomed"),
            "fatal": tasks.fatal.enqueue("fatal"),
            "async": tasks.asleep.enqueue("async"),
            "held": tasks.hold.enqueue(str(release)),
        }
        for name, result in enqueued.items():
            assert result.task.get_result(result.id) == result, name
            assert asyncio.run(result.task.aget_result(result.id)) == result, name
            assert backend.get_result(result.id).status == compat.TaskResultStatus.READY
        assert backend.get_result(enqueued["later"].id).task.run_after == later
        assert backend.get_result(enqueued["ok"].id).task.group == "order-1"

        for unknown in ("123", "", "a.b.c", enqueued["ok"].id + "0", enqueued["ok"].id[1:]):
            with pytest.raises(compat.TaskResultDoesNotExist):
                backend.get_result(unknown)
            with pytest.raises(compat.TaskResultDoesNotExist):
                asyncio.run(backend.aget_result(unknown))
        elsewhere = result_id("not-a-queue-of-it", "g", 1)
        with pytest.raises(compat.TaskResultDoesNotExist):
            backend.get_result(elsewhere)
        with pytest.raises(compat.TaskResultMismatch, match="Task does not match"):
            tasks.step.get_result(enqueued["flaky"].id)

        log = tmp_path / "worker.log"
        argv = [*worker_argv(), "--worker-id", "w-one"]
        processes.start(argv, cwd=PROJECT, env=env, log=log)
        held = enqueued["held"]
        wait_for(
            lambda: backend.get_result(held.id).status == compat.TaskResultStatus.RUNNING,
            60,
            "the held task never ran: " + (log.read_text()[-3000:] if log.exists() else ""),
        )
        running = backend.get_result(held.id)
        assert running.worker_ids == ["w-one"] and running.finished_at is None
        assert running.started_at == running.last_attempted_at >= running.enqueued_at
        with pytest.raises(ValueError, match="not finished"):
            running.return_value  # noqa: B018 (the property raises)
        release.touch()
        held.refresh()
        wait_for(lambda: held.refresh() or held.is_finished, 30, "the held task never ended")
        assert (held.status, held.return_value) == (compat.TaskResultStatus.SUCCESSFUL, "released")

        def finished() -> bool:
            return all(backend.get_result(r.id).is_finished for r in enqueued.values())

        wait_for(finished, 60, "not every task finished: " + log.read_text()[-3000:])
        ok = tasks.step.get_result(enqueued["ok"].id)
        assert (ok.status, ok.return_value, ok.worker_ids, ok.errors) == (
            compat.TaskResultStatus.SUCCESSFUL,
            ["ok", 1],
            ["w-one"],
            [],
        )
        assert ok.enqueued_at <= ok.started_at <= ok.finished_at
        assert ok.task.priority == 30 and ok.task.group == "order-1"
        later_run = tasks.step.get_result(enqueued["later"].id)
        assert later_run.started_at >= later and later_run.task.queue_name == "urgent"
        assert asyncio.run(tasks.asleep.aget_result(enqueued["async"].id)).return_value == "async"

        flaky = enqueued["flaky"]
        asyncio.run(flaky.arefresh())
        assert (flaky.status, flaky.return_value, flaky.attempts) == (
            compat.TaskResultStatus.SUCCESSFUL,
            2,
            2,
        )
        assert flaky.worker_ids == ["w-one", "w-one"]
        assert [e.exception_class for e in flaky.errors] == [RuntimeError]
        assert "RuntimeError: flaky: first attempt fails" in flaky.errors[0].traceback

        doomed = tasks.doomed.get_result(enqueued["doomed"].id)
        assert doomed.status == compat.TaskResultStatus.FAILED and doomed.attempts == 3
        assert [e.exception_class_path for e in doomed.errors] == ["builtins.ValueError"] * 3
        assert doomed.errors[-1].traceback.startswith("Traceback (most recent call last):")
        assert doomed.errors[-1].traceback.rstrip().endswith("ValueError: doomed: never works")
        with pytest.raises(ValueError, match="Task failed"):
            doomed.return_value  # noqa: B018 (the property raises)
        assert doomed.finished_at >= doomed.started_at

        fatal = tasks.fatal.get_result(enqueued["fatal"].id)
        assert (fatal.status, fatal.attempts) == (compat.TaskResultStatus.FAILED, 1)
        assert fatal.errors[0].exception_class is tasks.Fatal
        backend.close()


def test_results_on_a_sharded_queue(django_setup: Any, tmp_path: Path) -> None:
    """On shards (two embedded files here) a result is read where its group lives: the
    worker command (in this process) runs every task, each result reads back SUCCESSFUL."""
    from django.core.management import call_command
    from django.test.utils import override_settings

    compat = django_setup
    from steps import tasks

    url = f"a=sqlite:///{tmp_path}/a.db;b=sqlite:///{tmp_path}/b.db"
    with override_settings(TASKS=tasks_setting(url, "s_")):
        backend = compat.task_backends["default"]
        enqueued = [tasks.step.using(group=f"k{i}").enqueue(f"k{i}", i) for i in range(8)]
        enqueued += [tasks.step.enqueue("free", 9)]
        call_command("rqlite_queue_worker", "--until-empty", "--worker-id", "w-s")
        for result in enqueued:
            result.refresh()
            assert (result.status, result.worker_ids) == ("SUCCESSFUL", ["w-s"])
            assert result.return_value == result.args[:2]
        on_each = [backend.queue("default").shard(n).stats().depth for n in ("a", "b")]
        assert on_each == [0, 0]
        backend.close()


def test_a_cancelled_task_is_failed_with_the_cancel_as_its_error(
    django_setup: Any, tmp_path: Path
) -> None:
    """Django has no status for a cancel (`rqlite-queue job GROUP SEQ --cancel`): FAILED, its
    error the queue's JobCancelled with the reason, as a failure to run is reported."""
    from django.test.utils import override_settings

    from rqlite_queue.django.results import message_of
    from rqlite_queue.worker import JobCancelled

    compat = django_setup
    from steps import tasks

    with override_settings(TASKS=tasks_setting(f"sqlite:///{tmp_path}/c.db", "c_")):
        backend = compat.task_backends["default"]
        result = tasks.step.enqueue("x", 0)
        found = message_of(result.id)
        assert found is not None
        queue_name, group, seq = found
        assert backend.queue(queue_name).cancel(group, seq, "no longer needed") == "cancelled"
        result.refresh()
        assert result.status == compat.TaskResultStatus.FAILED and result.is_finished
        assert [e.exception_class for e in result.errors] == [JobCancelled]
        assert "no longer needed" in result.errors[0].traceback
        with pytest.raises(ValueError, match="Task failed"):
            result.return_value  # noqa: B018 (the property raises)
        backend.close()


def test_without_keep_results_are_not_offered(django_setup: Any, tmp_path: Path) -> None:
    """OPTIONS["keep"] = None: outcomes are not kept, and the backend says so as Django's own
    backends without results do (supports_get_result False, NotImplementedError)."""
    from django.test.utils import override_settings

    compat = django_setup
    from steps import tasks

    with override_settings(TASKS=tasks_setting(f"sqlite:///{tmp_path}/t.db", "n_", keep=None)):
        backend = compat.task_backends["default"]
        assert not backend.supports_get_result
        result = tasks.step.enqueue("x", 0)
        with pytest.raises(NotImplementedError):
            tasks.step.get_result(result.id)
        backend.close()
    for wrong in (0, -1, "1d", True):
        from django.core.exceptions import ImproperlyConfigured

        with (
            override_settings(TASKS=tasks_setting(f"sqlite:///{tmp_path}/t.db", "n_", keep=wrong)),
            pytest.raises(ImproperlyConfigured, match="keep"),
        ):
            compat.task_backends["default"]


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
        assert backend.supports_get_result
        # URL-safe: the queue and the group base64url-encoded, then the seq
        assert re.fullmatch(
            r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[0-9]+", tasks.step.enqueue("x", 0).id
        )
        backend.close()
