"""`rqlite-queue worker --no-schedules` leaves the schedules' ticks to others (a deployment with
`rqlite-queue scheduler`); by default the worker publishes them between claims."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rqlite_queue import from_url

EXE = shutil.which("rqlite-queue", path=str(Path(sys.executable).parent))

pytestmark = pytest.mark.skipif(EXE is None, reason="rqlite-queue not installed")

HANDLER = """
from pathlib import Path

def handle(lease):
    with Path("handled.txt").open("a") as out:
        out.write(f"{lease.group_id} {lease.event}\\n")
"""


@pytest.mark.parametrize("flag", ["--schedules", "--no-schedules", None])
def test_the_worker_publishes_ticks_unless_told_not_to(flag: str | None, tmp_path: Path) -> None:
    assert EXE is not None
    (tmp_path / "app.py").write_text(HANDLER)
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    with from_url(url) as queue:
        queue.schedule("report", "reports", "tick", every=3600, start_at=time.time() - 1)
    command = [EXE, "--url", url, "worker", "app:handle", "--burst"]
    done = subprocess.run(
        command + ([flag] if flag else []),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    handled = tmp_path / "handled.txt"
    with from_url(url) as queue:
        if flag == "--no-schedules":
            assert not handled.exists()
            assert queue.fire_schedules() == 1  # the tick was still due
        else:
            assert handled.read_text() == "reports tick\n"
            assert queue.fire_schedules() == 0
