"""docs/howto/celery.md's examples run as written: its `tasks.py` under a real `celery worker`,
its publishing example as a script, on the embedded queue (the page's URL is the one thing the
test sets, through the page's own BROKER_URL and RESULT_BACKEND)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("celery")

from framework_checks import Processes

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "howto" / "celery.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE, re.DOTALL)


def test_the_pages_app_worker_and_publisher_run(tmp_path: Path) -> None:
    (tmp_path / "tasks.py").write_text(BLOCKS[0])
    (tmp_path / "results").mkdir()
    env = {
        **os.environ,
        "BROKER_URL": f"rqlite+sqlite:///{tmp_path}/celery-broker.db",
        "RESULT_BACKEND": f"file://{tmp_path}/results",
        "PYTHONPATH": str(tmp_path),
    }
    worker = ["celery", "-A", "tasks", "worker", "--concurrency", "8"]  # as the page says
    assert " ".join(worker) in PAGE
    procs = Processes()
    try:
        procs.start(
            [sys.executable, "-m", *worker, "-l", "WARNING"],
            cwd=tmp_path,
            env=env,
            log=tmp_path / "worker.log",
        )
        done = subprocess.run(
            [sys.executable, "-c", BLOCKS[1]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        procs.stop()
    assert done.returncode == 0, done.stderr + (tmp_path / "worker.log").read_text()[-3000:]
    assert done.stdout.strip() == "order-42: ship done"
