"""docs/howto/service.md's systemd unit passes `systemd-analyze verify` (where systemd is
installed), its paths and user made this machine's; its stop timeout leaves the worker's
`--grace` time to finish."""

from __future__ import annotations

import getpass
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "howto" / "service.md").read_text()
UNIT = re.findall(r"```ini\n(.*?)```", PAGE, re.DOTALL)


def test_the_stop_timeout_is_longer_than_the_grace() -> None:
    assert len(UNIT) == 1
    grace = re.search(r"--grace (\d+)", UNIT[0])
    timeout = re.search(r"^TimeoutStopSec=(\d+)$", UNIT[0], re.MULTILINE)
    assert grace is not None and timeout is not None
    assert int(timeout.group(1)) >= int(grace.group(1)) + 10


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "rqlite-queue"
    unit = (
        UNIT[0]
        .replace("/srv/orders/venv/bin/rqlite-queue", str(exe))
        .replace("WorkingDirectory=/srv/orders", f"WorkingDirectory={tmp_path}")
        .replace("User=orders", f"User={getpass.getuser()}")
    )
    assert "/srv/" not in unit
    (tmp_path / "orders-worker@.service").write_text(unit)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / "orders-worker@1.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stderr.strip(), done.stdout + done.stderr
