"""Django's own tests of its Tasks framework (`tests/tasks/test_tasks.py` of the installed
Django's source distribution, downloaded from the package index at test time into the user
cache, never copied into this repository), run with `rqlite_queue.django` as the default
backend: enqueueing, `get_result` / `aget_result` (a result read back equals the one
`enqueue` returned), `refresh()` / `arefresh()`, unknown ids, another task's result, pickled
results. On the embedded file and on a 1-node cluster, each in a process of its own.

Django 6 only (`make django6`): the backport's sdist (django-tasks 0.12) ships no tests.
`FAILING` lists the tests that do not pass, and why; the test fails if another one fails, or
if one of them starts to pass (then the list is updated)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

pytest.importorskip("django")
if find_spec("django.tasks") is None:
    pytest.skip("Django's own tests of django.tasks: Django 6 only", allow_module_level=True)

from sdists import sdist_files

from rqlite_queue.testing import Cluster

FAILING = {
    "test_enqueue_task": "reads DummyBackend.results (the results it keeps in memory)",
    "test_enqueue_task_async": "reads DummyBackend.results (the results it keeps in memory)",
    "test_using_correct_backend": "checks that the default backend is a DummyBackend",
    "test_get_backend": "checks that the default backend is a DummyBackend",
}
"""Django's tests of its tasks that do not pass with this backend as the default, and why:
they test Django's DummyBackend itself."""

BACKEND = '''
from rqlite_queue.django import RqliteQueueBackend


class Backend(RqliteQueueBackend):
    def clear(self):
        """What Django's tests call before each (DummyBackend's): nothing to clear here, each
        test reads only what it enqueued."""
'''

RUN = """
import json
import os
import sys
import unittest

import django
from django.conf import settings

OURS = {
    "BACKEND": "suite_backend.Backend",
    "QUEUES": ["default", "queue_1"],
    "OPTIONS": {"url": os.environ["SUITE_URL"], "queue_prefix": os.environ["SUITE_PREFIX"]},
}
settings.configure(SECRET_KEY="suite", USE_TZ=True, DATABASES={}, TASKS={"default": OURS})
django.setup()

from django.test.utils import override_settings, setup_test_environment

from tasks import test_tasks

IMMEDIATE = {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend", "QUEUES": []}


@override_settings(
    TASKS={"default": OURS, "immediate": IMMEDIATE, "missing": {"BACKEND": "does.not.exist"}}
)
class OnRqliteQueue(test_tasks.TaskTestCase):
    pass


setup_test_environment()
suite = unittest.TestLoader().loadTestsFromTestCase(OnRqliteQueue)
outcomes = {case._testMethodName: "passed" for case in suite}
result = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
for case, _ in result.failures + result.errors:
    outcomes[case._testMethodName] = "failed"
for case, _ in result.skipped:
    outcomes[case._testMethodName] = "skipped"
print(json.dumps(outcomes))
"""


def django_task_tests() -> dict[str, str]:
    """`tests/tasks/{tasks,test_tasks}.py` of the installed Django's sdist (downloaded once)."""
    names = ("tasks.py", "test_tasks.py")
    files = sdist_files("django", [f"tests/tasks/{name}" for name in names], timeout=600)
    return {name: files[f"tests/tasks/{name}"] for name in names}


def run_djangos_tests(where: Path, url: str) -> dict[str, str]:
    """Django's TaskTestCase with this backend as the default: test name -> outcome."""
    (where / "tasks").mkdir()
    (where / "tasks" / "__init__.py").write_text("")
    for name, text in django_task_tests().items():
        (where / "tasks" / name).write_text(text)
    (where / "suite_backend.py").write_text(BACKEND)
    (where / "run_suite.py").write_text(RUN)
    env = {
        **os.environ,
        "SUITE_URL": url,
        "SUITE_PREFIX": f"s{os.getpid()}_",
        "PYTHONPATH": os.pathsep.join([str(where), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "run_suite.py"],
        cwd=where,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.stdout.strip(), done.stderr[-4000:]
    outcomes: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    print(done.stderr[-3000:])
    return outcomes


def check(outcomes: dict[str, str]) -> None:
    failing = {name for name, outcome in outcomes.items() if outcome != "passed"}
    assert failing == set(FAILING), f"Django's tests, other than passed: {sorted(failing)}"
    results = {name for name in outcomes if "result" in name}
    assert {
        "test_get_result",
        "test_get_result_async",
        "test_get_missing_result",
        "test_get_incorrect_result",
        "test_get_incorrect_result_async",
        "test_refresh_result",
        "test_pickle_task_result",
    } <= results
    assert len(outcomes) >= 30, outcomes


def test_djangos_task_tests_on_the_embedded_queue(tmp_path: Path) -> None:
    check(run_djangos_tests(tmp_path, f"sqlite:///{tmp_path}/suite.db"))


def test_djangos_task_tests_on_rqlite(tmp_path: Path, rqlite_cluster: Cluster) -> None:
    check(run_djangos_tests(tmp_path, rqlite_cluster.url))
