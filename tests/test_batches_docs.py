"""docs/batches.md's examples run as they are written (each alone, in a fresh directory, on
the embedded queue), and print what the page says they print."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "batches.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)```\n(?:\n```text\n(.*?)```)?", PAGE, re.DOTALL)


def test_the_page_has_its_examples() -> None:
    assert len(EXAMPLES) >= 5
    assert all(printed for _, printed in EXAMPLES)


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_the_example_runs_and_prints_what_the_page_says(index: int, tmp_path: Path) -> None:
    source, printed = EXAMPLES[index]
    done = subprocess.run(
        [sys.executable, "-c", source], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed
