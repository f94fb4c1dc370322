"""docs/howto/monitoring.md's alert rules: a valid rules file for promtool (where it is
installed), naming only metrics that the metrics page lists."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGE = (DOCS / "howto" / "monitoring.md").read_text()
RULES = re.findall(r"```yaml\n(# rules.yml\n.*?)```", PAGE, re.DOTALL)


def test_the_rules_name_only_listed_metrics() -> None:
    assert len(RULES) == 1
    listed = set(re.findall(r"`(rqlite_queue_[a-z_]+)", (DOCS / "metrics.md").read_text()))
    named = {
        re.sub(r"_(bucket|sum|count)$", "", name)
        for name in re.findall(r"\b(rqlite_queue_[a-z_]+)", RULES[0])
    }
    assert named and named <= listed, named - listed


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(RULES[0])
    done = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
