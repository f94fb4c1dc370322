"""The package as users get it: the library runs without the command line's dependencies
(click, rich: base dependencies, for the CLI alone), and the sdist carries the source, tests
and docs but not the benchmarks' results."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

BLOCK_CLI_DEPS = """
import importlib.abc, sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("click", "rich"):
            raise ImportError(f"{name} is blocked")
        return None

sys.meta_path.insert(0, Blocked())
import os, tempfile
import rqlite_queue
from rqlite_queue import Worker, from_url

with from_url("sqlite:///" + os.path.join(tempfile.mkdtemp(), "q.db")) as queue:
    queue.publish_many([("g", 1), ("g", 2)])
    Worker(queue, lambda lease: None).run(until_empty=True)
    assert queue.stats().depth == 0
print("ok", sorted(m for m in sys.modules if m.split(".")[0] in ("click", "rich")))
"""


def test_the_library_runs_without_the_cli_dependencies() -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK_CLI_DEPS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok []"


FRAMEWORKS_UNTOUCHED = """
import sys
import rqlite_queue, rqlite_queue.worker, rqlite_queue.testing, rqlite_queue.cli
frameworks = ("django", "django_tasks", "kombu", "celery")
print(sorted({m.split(".")[0] for m in sys.modules} & set(frameworks)))
"""


def test_the_library_imports_no_framework() -> None:
    """The integrations (`rqlite_queue.django`, `rqlite_queue.kombu`) are extras: the library,
    its worker, fixtures and CLI import neither Django nor kombu nor Celery."""
    done = subprocess.run(
        [sys.executable, "-c", FRAMEWORKS_UNTOUCHED], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_sdist_holds_source_tests_and_docs_but_no_bench_results(tmp_path: Path) -> None:
    hatchling = pytest.importorskip("hatchling.builders.sdist")
    builder = hatchling.SdistBuilder(str(ROOT))
    built = Path(next(iter(builder.build(directory=str(tmp_path), versions=["standard"]))))
    with tarfile.open(built) as sdist:
        names = [name.split("/", 1)[1] for name in sdist.getnames() if "/" in name]
    assert "src/rqlite_queue/_protocol/core.py" in names
    assert "src/rqlite_queue/dashboard/static/htmx.min.js" in names
    assert "tests/test_packaging.py" in names and "docs/contract.md" in names
    assert not [
        name
        for name in names
        if name.startswith(("bench/results/", "site/", ".import_linter_cache/"))
    ]
    # About 1.5 MB: the docs' screenshots (taken from the staged demo queue, ~550 kB), the
    # migration fixtures (real v1-v7 databases) and the source, tests and docs; the bound
    # catches a stray build, dataset or site.
    assert built.stat().st_size < 1_800_000, built.stat().st_size


NO_SIDE_EFFECTS = """
import atexit, threading
import logging, aiohttp, click, cronsim, httpx, pytest, rich, urllib3  # their own hooks first
hooks, threads = atexit._ncallbacks(), threading.active_count()
import rqlite_queue, rqlite_queue.testing, rqlite_queue.testing.plugin, rqlite_queue.cli
import rqlite_queue.rqlited, rqlite_queue.cli.demo
assert atexit._ncallbacks() == hooks, "an import registered an atexit hook"
assert threading.active_count() == threads, "an import started a thread"
from rqlite_queue import local_cluster as cluster
assert not cluster._exit_hook_registered and not cluster.live_pids()
print("ok")
"""


def test_importing_the_package_starts_and_registers_nothing() -> None:
    """The plugin is loaded by every pytest run of an environment with rqlite-queue installed:
    importing it (or the library, or the harness) must start nothing and register nothing; the
    harness's exit hook comes with its first process."""
    done = subprocess.run(
        [sys.executable, "-c", NO_SIDE_EFFECTS], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_pytest_plugin_is_registered() -> None:
    from importlib.metadata import entry_points

    plugins = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert plugins.get("rqlite_queue") == "rqlite_queue.testing.plugin"


def test_the_public_surface_is_small_and_every_other_name_has_a_home() -> None:
    """`rqlite_queue.__all__` holds what users reach for; the names that lived at the top
    before are still found there (with a warning naming their home), and every public module
    documents its own `__all__` or names."""
    import rqlite_queue
    import rqlite_queue.codec
    import rqlite_queue.errors
    import rqlite_queue.types

    assert len(rqlite_queue.__all__) <= 22
    for name in rqlite_queue.__all__:
        assert getattr(rqlite_queue, name) is not None
    with pytest.warns(DeprecationWarning, match=r"rqlite_queue\.types\.Stats"):
        assert rqlite_queue.Stats is rqlite_queue.types.Stats  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match=r"rqlite_queue\.errors\.NoLeader"):
        assert rqlite_queue.NoLeader is rqlite_queue.errors.NoLeader  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match=r"rqlite_queue\.codec\.JsonCodec"):
        assert rqlite_queue.JsonCodec is rqlite_queue.codec.JsonCodec  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        rqlite_queue.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def test_a_not_applied_error_is_not_the_parent_of_a_may_have_applied_one() -> None:
    """Catching `Unavailable` (not applied: retry) must never catch a write that may have
    applied (`OutcomeUnknown`) or partly applied (`PartialRound`)."""
    from rqlite_queue import OutcomeUnknown, Unavailable
    from rqlite_queue.errors import NoLeader, PartialRound, ShardDown

    assert not issubclass(OutcomeUnknown, Unavailable)
    assert not issubclass(PartialRound, Unavailable)
    assert issubclass(NoLeader, Unavailable) and issubclass(ShardDown, Unavailable)
