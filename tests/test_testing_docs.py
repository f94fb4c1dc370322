"""docs/testing.md's examples run as written: its test file under a plain pytest run (the
plugin's fixtures alone, no conftest), its harness example as a script."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "testing.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE, re.DOTALL)


def test_the_pages_test_file_passes_under_plain_pytest(rqlited_path: str, tmp_path: Path) -> None:
    (tmp_path / "test_from_the_docs.py").write_text(BLOCKS[0])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rqlited", rqlited_path],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def test_the_pages_harness_example_runs(rqlited_path: str, tmp_path: Path) -> None:
    env = {**os.environ, "RQLITED": rqlited_path}
    done = subprocess.run(
        [sys.executable, "-c", BLOCKS[1]], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
