"""docs/howto/django.md's examples run as written: its settings, its `shop/tasks.py` and its
enqueueing code in a project made here, then the page's worker command (with --until-empty,
so that it stops), on the embedded queue (the page's TASKS_URL is the one thing set). Runs on
Django 6 and on the backport, as test_django.py does."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("django")

PAGE = (Path(__file__).resolve().parents[2] / "docs" / "howto" / "django.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", PAGE, re.DOTALL)
OUTPUTS = [text.strip() for text in re.findall(r"```text\n(.*?)```", PAGE, re.DOTALL)]
MANAGE = """import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
from django.core.management import execute_from_command_line
execute_from_command_line(sys.argv)
"""


def test_the_pages_settings_tasks_and_worker_run(tmp_path: Path) -> None:
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "__init__.py").write_text("")
    (tmp_path / "project" / "settings.py").write_text(
        'SECRET_KEY = "docs"\nUSE_TZ = True\nDATABASES = {}\n' + BLOCKS[0]
    )
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "tasks.py").write_text(BLOCKS[1])
    (tmp_path / "manage.py").write_text(MANAGE)
    env = {
        **os.environ,
        "TASKS_URL": f"sqlite:///{tmp_path}/tasks.db",
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "PYTHONPATH": str(tmp_path),
    }
    enqueue = "import django\ndjango.setup()\n" + BLOCKS[2]
    done = subprocess.run(
        [sys.executable, "-c", enqueue], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    # The results section: its enqueue prints what the page says; its id is kept for later.
    refund = "import django\ndjango.setup()\n" + BLOCKS[3] + "print(result.id)\n"
    done = subprocess.run(
        [sys.executable, "-c", refund], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    printed, result_id = done.stdout.splitlines()
    assert printed == OUTPUTS[0]
    command = "python manage.py rqlite_queue_worker"
    assert command in PAGE
    worker = subprocess.run(
        [sys.executable, "manage.py", "rqlite_queue_worker", "--until-empty"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert worker.returncode == 0, worker.stdout + worker.stderr
    # (two tasks' prints may share a line: print writes its text and its end apart)
    printed = re.findall(r"order \d+: (?:reserve|charge|ship|receipt|refund)", worker.stdout)
    steps = [line for line in printed if line.startswith("order 42")]
    assert steps == ["order 42: reserve", "order 42: charge", "order 42: ship"], worker.stdout
    assert "order 7: receipt" in printed
    later = f"import django\ndjango.setup()\nresult_id = {result_id!r}\n" + BLOCKS[4]
    done = subprocess.run(
        [sys.executable, "-c", later], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == OUTPUTS[1]
