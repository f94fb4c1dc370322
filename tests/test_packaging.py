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


def test_the_sdist_holds_source_tests_and_docs_but_no_bench_results(tmp_path: Path) -> None:
    hatchling = pytest.importorskip("hatchling.builders.sdist")
    builder = hatchling.SdistBuilder(str(ROOT))
    built = Path(next(iter(builder.build(directory=str(tmp_path), versions=["standard"]))))
    with tarfile.open(built) as sdist:
        names = [name.split("/", 1)[1] for name in sdist.getnames() if "/" in name]
    assert "src/rqlite_queue/core.py" in names
    assert "src/rqlite_queue/dashboard/static/htmx.min.js" in names
    assert "tests/test_packaging.py" in names and "docs/contract.md" in names
    assert not [name for name in names if name.startswith(("bench/results/", "site/"))]
    assert built.stat().st_size < 1_000_000, built.stat().st_size
