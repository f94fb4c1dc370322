"""docs/reference/configuration.md against the code: every parameter of the configured classes
with its default, every environment variable the package reads, and the generated CLI page
covering every command (a parameter or variable added without docs fails here)."""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest

import rqlite_queue
from rqlite_queue import backup, metrics, worker
from rqlite_queue.cli import cli
from rqlite_queue.testing import Cluster

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "reference" / "configuration.md").read_text()

# Each table of the page (by its heading) and the callables it documents; a pair (sync, async)
# must take the same parameters.
TABLES: dict[str, list[Callable[..., Any]]] = {
    "from_url": [rqlite_queue.Transport.from_url, rqlite_queue.AsyncTransport.from_url],
    "RqliteTransport": [rqlite_queue.RqliteTransport, rqlite_queue.AsyncRqliteTransport],
    "SqliteTransport": [rqlite_queue.SqliteTransport, rqlite_queue.AsyncSqliteTransport],
    "ShardedTransport": [rqlite_queue.ShardedTransport, rqlite_queue.AsyncShardedTransport],
    "batch": [rqlite_queue.Transport.batch, rqlite_queue.AsyncTransport.batch],
    "Worker": [worker.Worker, worker.AsyncWorker],
    "Worker.run": [worker.Worker.run, worker.AsyncWorker.run],
    "Backoff": [worker.Backoff],
    "serve_metrics": [metrics.serve_metrics],
    "testing.Cluster": [Cluster],
    "backup": [backup.backup, backup.backup_async],
    "restore": [backup.restore, backup.restore_async],
}


def _create_app() -> Callable[..., Any]:
    pytest.importorskip("starlette")
    from rqlite_queue.dashboard import create_app

    return create_app


def table(heading: str) -> dict[str, str]:
    """The rows of the table under `### heading`: parameter -> default as written."""
    section = PAGE.split(f"\n### {heading}\n", 1)
    assert len(section) == 2, f"no '### {heading}' in the page"
    body = re.split(r"\n#{2,3} ", section[1], maxsplit=1)[0]
    rows: dict[str, str] = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1]
    return rows


def documented_default(value: Any) -> str | None:
    """How the page writes a default, or None where it is not compared (a callable's)."""
    if value is inspect.Parameter.empty:
        return "(required)"
    if value is time.time:
        return "`time.time`"
    if value is None or isinstance(value, bool | int | float | str | tuple):
        return f"`{value!r}`"
    return None


def parameters(target: Callable[..., Any]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name, param in inspect.signature(target).parameters.items():
        if name == "self":
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            found[f"**{name}"] = ""
        else:
            found[name] = documented_default(param.default)
    return found


@pytest.mark.parametrize("heading", [*TABLES, "create_app"])
def test_every_parameter_is_documented_with_its_default(heading: str) -> None:
    targets = TABLES.get(heading) or [_create_app()]
    expected = parameters(targets[0])
    for twin in targets[1:]:
        assert parameters(twin) == expected, f"{twin} differs from {targets[0]}"
    rows = table(heading)
    assert list(rows) == list(expected), f"### {heading}: parameters differ from the code"
    for name, default in expected.items():
        if default is not None:
            assert rows[name] == default, f"### {heading}: {name} defaults to {default}"


def test_every_environment_variable_is_documented() -> None:
    read: set[str] = set()
    for path in (ROOT / "src" / "rqlite_queue").rglob("*.py"):
        text = path.read_text()
        read |= set(re.findall(r"os\.environ(?:\.get)?\(\s*\"([A-Z_]+)\"", text))
        read |= set(re.findall(r"os\.environ\[\"([A-Z_]+)\"\]", text))
        read |= set(re.findall(r"^[A-Z_]+_ENV = \"([A-Z_]+)\"", text, re.MULTILINE))

    def envvars(command: click.Command) -> set[str]:
        found = {
            p.envvar
            for p in command.params
            if isinstance(p, click.Option) and isinstance(p.envvar, str)
        }
        if isinstance(command, click.Group):
            for sub in command.commands.values():
                found |= envvars(sub)
        return found

    read |= envvars(cli)
    assert {"RQLITE_QUEUE_URL", "RQLITED"} <= read  # the scan itself finds what it looks for
    variables = PAGE.split("## Environment variables")[1]
    documented = set(re.findall(r"^\| `([A-Z_]+)` \|", variables, re.MULTILINE))
    assert read == documented


def test_the_cli_reference_is_generated_from_the_commands() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    assert "mkdocs-click" in config
    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    assert re.search(r":module: rqlite_queue\.cli\n\s+:command: cli\n", page)
    assert ":depth:" in page or ":style:" in page
