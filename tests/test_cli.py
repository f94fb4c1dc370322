"""The `rqlite-queue` command, end to end through the installed entry point, on the embedded
SQLite and on a real 3-node rqlite cluster."""

from __future__ import annotations

import contextlib
import json
import os
import queue as queue_module
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
from click.testing import CliRunner

from rqlite_queue import LeaseLost, Transport
from rqlite_queue._protocol.plan import Batch, Statement
from rqlite_queue.cli import cli
from rqlite_queue.testing import Cluster, free_port

BIN = Path(sys.executable).parent
EXE = shutil.which("rqlite-queue", path=str(BIN))
DOCS = Path(__file__).resolve().parent.parent / "docs"

pytestmark = pytest.mark.skipif(
    EXE is None, reason="rqlite-queue not installed: .venv/bin/pip install -e '.[dev]'"
)

COMMANDS = [
    [],
    ["publish"],
    ["batch"],
    ["batches"],
    ["stats"],
    ["peek"],
    ["worker"],
    ["dlq"],
    ["dlq", "list"],
    ["dlq", "requeue"],
    ["dlq", "purge"],
    ["group"],
    ["group", "hold"],
    ["group", "release"],
    ["group", "cancel"],
    ["group", "priority"],
    ["groups"],
    ["pause"],
    ["resume"],
    ["tenants"],
    ["tenant"],
    ["tenant", "weight"],
    ["tenant", "limits"],
    ["tenant", "rule"],
    ["dashboard"],
    ["schedule"],
    ["schedule", "add"],
    ["schedule", "list"],
    ["schedule", "remove"],
    ["scheduler"],
    ["cluster"],
    ["cluster", "up"],
    ["rqlited"],
    ["shards"],
    ["shards", "status"],
    ["shards", "drain"],
    ["backup"],
    ["restore"],
    ["demo"],
    ["job"],
]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RQLITE_QUEUE_URL"}
    env["COLUMNS"] = "200"
    env.update(extra)
    return env


def run(
    *args: str,
    input: str | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    assert EXE is not None
    return subprocess.run(
        [EXE, *args],
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env if env is not None else cli_env(),
        timeout=timeout,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]


def wait_for(condition: Callable[[], bool], timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class Target:
    url: str
    queue: str

    @property
    def args(self) -> list[str]:
        return ["--url", self.url, "--queue", self.queue]

    def transport(self) -> Transport:
        return Transport.from_url(self.url, queue=self.queue)


# The CLI is one code path over the Transport: its commands run on rqlite (the production
# backend) in the default run, on the embedded SQLite in the slow tier too (the backends
# themselves are the contract suite's).
@pytest.fixture(params=[pytest.param("sqlite", marks=pytest.mark.slow), "rqlite3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    queue = f"cli_{uuid.uuid4().hex[:8]}"
    if request.param == "sqlite":
        return Target(f"sqlite:///{tmp_path}/q.db", queue)
    cluster: Cluster = request.getfixturevalue("rqlite_cluster3")
    return Target(cluster.url, queue)


@pytest.fixture
def rqlite_target(rqlite_cluster3: Cluster) -> Target:
    return Target(rqlite_cluster3.url, f"cli_{uuid.uuid4().hex[:8]}")


@pytest.fixture
def sqlite_target(tmp_path: Path) -> Target:
    return Target(f"sqlite:///{tmp_path}/q.db", f"cli_{uuid.uuid4().hex[:8]}")


# ------------------------------------------------------------------------------ publish, stats


def test_publish_stats_peek(target: Target) -> None:
    first = run(*target.args, "publish", "g1", '{"n": 1}')
    assert first.returncode == 0, first.stderr
    second = run(*target.args, "publish", "g1", '{"n": 2}', "--dedup-id", "g1-2")
    again = run(*target.args, "publish", "g1", '{"n": 2}', "--dedup-id", "g1-2")
    assert second.returncode == again.returncode == 0
    assert int(second.stdout) == int(again.stdout) > int(first.stdout)

    lines = [
        {"group_id": "g2", "event": {"n": 1}, "priority": 3},
        {"group_id": "g2", "event": {"n": 2}},
        {"group_id": "g3", "event": "plain text"},
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\n\n"
    piped = run(*target.args, "publish", "--batch-size", "2", input=text)
    assert piped.returncode == 0, piped.stderr
    assert "published 3 messages" in piped.stderr
    dash = run(*target.args, "publish", "-", "--priority", "4", input='{"group_id":"g4","event":0}')
    assert dash.returncode == 0, dash.stderr

    stats = run(*target.args, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    data = json.loads(stats.stdout)
    assert (data["depth"], data["groups"], data["in_flight"], data["dead"]) == (6, 4, 0, 0)
    assert data["by_priority"] == {"0": 3, "1": 0, "2": 0, "3": 2, "4": 1}
    table = run(*target.args, "stats")
    assert table.returncode == 0
    assert "messages (depth)" in table.stdout and "6" in table.stdout

    peek = run(*target.args, "peek", "g2", "--json")
    assert [json.loads(line) for line in peek.stdout.splitlines()] == [
        {"seq": seq, "event": {"n": n}} for seq, n in zip(_seqs(target, "g2"), (1, 2), strict=True)
    ]
    limited = run(*target.args, "peek", "g1", "--limit", "1")
    assert limited.returncode == 0
    assert '{"n":1}' in limited.stdout and '{"n":2}' not in limited.stdout
    assert "no messages" in run(*target.args, "peek", "nobody").stdout


def _seqs(target: Target, group: str) -> list[int]:
    with target.transport() as queue:
        return [seq for seq, _ in queue.peek(group)]


def test_a_bad_stdin_line_publishes_nothing(sqlite_target: Target) -> None:
    text = '{"group_id": "g", "event": 1}\n{"group_id": "g", "event": 2, "priority": 9}\n'
    result = run(*sqlite_target.args, "publish", input=text)
    assert result.returncode == 1
    assert "stdin line 2" in one_error_line(result)
    not_json = run(*sqlite_target.args, "publish", input='{"group_id": "g", "event": 1}\n{oops\n')
    assert not_json.returncode == 1
    assert "line 2: not valid JSON" in one_error_line(not_json)
    with sqlite_target.transport() as queue:
        assert queue.stats().depth == 0


def test_default_url_is_a_sqlite_file_in_the_current_directory(tmp_path: Path) -> None:
    result = run("publish", "g", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "rqlite-queue.db").is_file()
    other = tmp_path / "other.db"
    from_env = run(
        "publish", "g", "2", cwd=tmp_path, env=cli_env(RQLITE_QUEUE_URL=f"sqlite:///{other}")
    )
    assert from_env.returncode == 0, from_env.stderr
    with Transport.from_url(f"sqlite:///{other}") as queue:
        assert [event for _, event in queue.peek("g")] == [2]
    assert "sqlite:///rqlite-queue.db" in run("--help").stdout


def test_stats_watch_refreshes_until_interrupted(sqlite_target: Target, tmp_path: Path) -> None:
    assert EXE is not None
    out = tmp_path / "watch.out"
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [EXE, *sqlite_target.args, "stats", "--watch", "0.1"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=cli_env(),
        )
        try:
            wait_for(lambda: "messages (depth)" in out.read_text(), 20, "the first table")
            proc.send_signal(signal.SIGINT)
            assert proc.wait(10) == 0
        finally:
            _reap(proc)


# ------------------------------------------------------------------------------ errors, help


def test_errors_are_one_line_with_a_nonzero_status(sqlite_target: Target, tmp_path: Path) -> None:
    scheme = run("--url", "ftp://example", "stats")
    assert scheme.returncode == 1
    assert "unknown URL scheme" in one_error_line(scheme)

    bad_json = run(*sqlite_target.args, "publish", "g", "{not json")
    assert bad_json.returncode == 2
    assert "not valid JSON" in one_error_line(bad_json)

    bad_queue = run("--url", sqlite_target.url, "--queue", "Bad-Name", "stats")
    assert bad_queue.returncode == 1
    assert "queue name" in one_error_line(bad_queue)

    bad_priority = run(*sqlite_target.args, "publish", "g", "1", "--priority", "7")
    assert bad_priority.returncode == 2
    one_error_line(bad_priority)

    unreachable = run("--url", f"http://127.0.0.1:{free_port()}", "--timeout", "0.5", "stats")
    assert unreachable.returncode == 1
    assert "nothing answers at http://127.0.0.1:" in one_error_line(unreachable)

    no_module = run(*sqlite_target.args, "worker", "no_such_module:handle", cwd=tmp_path)
    assert no_module.returncode == 2
    assert "no_such_module" in one_error_line(no_module)
    no_colon = run(*sqlite_target.args, "worker", "handler_without_colon", cwd=tmp_path)
    assert no_colon.returncode == 2
    one_error_line(no_colon)
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom at import')\n")
    broken = run(*sqlite_target.args, "worker", "broken:handle", cwd=tmp_path)
    assert broken.returncode == 1
    assert "boom at import" in one_error_line(broken)

    unknown = run("frobnicate")
    assert unknown.returncode == 2
    one_error_line(unknown)
    with sqlite_target.transport() as queue:
        assert queue.stats().depth == 0


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c) or "top")
def test_every_command_has_help(command: list[str]) -> None:
    """In-process (click's runner: a subprocess each took a second of imports); the entry
    point itself is run as a process by the other tests, and here for the top level."""
    if command == ["demo"]:
        result = run(*command, "--help")  # passed through to the demo's own argument parser
        assert result.returncode == 0 and "usage:" in result.stdout.lower(), result.stderr
        return
    if not command:
        assert run("--help").stdout.startswith("Usage: rqlite-queue")
    invoked = CliRunner().invoke(
        cli, [*command, "--help"], prog_name="rqlite-queue", env={"COLUMNS": "200"}
    )
    assert invoked.exit_code == 0, invoked.output
    assert invoked.output.startswith(f"Usage: rqlite-queue {' '.join(command)}".rstrip())
    if command:
        assert f"## `{' '.join(command)}`" in (DOCS / "cli.md").read_text()


def test_a_group_without_a_command_prints_its_help() -> None:
    for group in ([], ["dlq"], ["cluster"]):
        result = run(*group)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("Usage: rqlite-queue")
        assert "Commands:" in result.stdout


# ------------------------------------------------------------------------------ worker

HANDLER = """
import json, os, threading, time
from pathlib import Path

_lock = threading.Lock()
OUT = Path(os.environ["HANDLER_OUT"])


def handle(lease):
    Path(OUT.parent, f"started-{lease.seq}").touch()
    time.sleep(float(os.environ.get("HANDLER_SLEEP", "0")))
    with _lock, OUT.open("a") as out:
        out.write(json.dumps([lease.group_id, lease.event]) + "\\n")


async def handle_async(lease):
    import asyncio

    await asyncio.sleep(0.01)
    handle(lease)
"""


class WorkerProcess:
    def __init__(self, target: Target, tmp_path: Path, *args: str, sleep: float = 0) -> None:
        assert EXE is not None
        (tmp_path / "handlers.py").write_text(HANDLER)
        self.out = tmp_path / "handled.jsonl"
        self.log = tmp_path / "worker.log"
        self.tmp_path = tmp_path
        env = cli_env(HANDLER_OUT=str(self.out), HANDLER_SLEEP=str(sleep))
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [EXE, *target.args, "worker", *args],
                cwd=tmp_path,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def handled(self) -> list[tuple[str, Any]]:
        if not self.out.exists():
            return []
        return [tuple(json.loads(line)) for line in self.out.read_text().splitlines()]

    def started(self) -> list[Path]:
        return list(self.tmp_path.glob("started-*"))

    def terminate(self, timeout: float = 20) -> tuple[int, float]:
        began = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout)
        return code, time.monotonic() - began


@pytest.fixture
def workers() -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    for worker in started:
        _reap(worker.proc)


def _reap(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _publish_workload(target: Target, groups: int, per_group: int) -> list[tuple[str, Any]]:
    items = [(f"g{g}", {"g": g, "n": n}) for n in range(per_group) for g in range(groups)]
    text = "".join(json.dumps({"group_id": gid, "event": event}) + "\n" for gid, event in items)
    result = run(*target.args, "publish", input=text)
    assert result.returncode == 0, result.stderr
    return [(gid, event) for gid, event in items]


def _depth(target: Target) -> int:
    with target.transport() as queue:
        return queue.stats().depth


def test_worker_drains_the_queue_and_stops_on_sigterm(
    target: Target, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    published = _publish_workload(target, groups=6, per_group=5)
    worker = WorkerProcess(target, tmp_path, "handlers:handle", "--concurrency", "4")
    workers.append(worker)
    wait_for(lambda: _depth(target) == 0, 30, "the queue to drain")
    code, _ = worker.terminate()
    assert code == 0, worker.log.read_text()
    handled = worker.handled()
    assert sorted(map(json.dumps, handled)) == sorted(map(json.dumps, published))
    for group in {gid for gid, _ in published}:  # FIFO per group
        assert [e["n"] for gid, e in handled if gid == group] == list(range(5))
    assert "stopped" in worker.log.read_text()


def test_async_handler_runs_on_asyncio(
    sqlite_target: Target, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    published = _publish_workload(sqlite_target, groups=3, per_group=2)
    worker = WorkerProcess(sqlite_target, tmp_path, "handlers:handle_async")
    workers.append(worker)
    wait_for(lambda: _depth(sqlite_target) == 0, 30, "the queue to drain")
    code, _ = worker.terminate()
    assert code == 0, worker.log.read_text()
    assert len(worker.handled()) == len(published)


def test_sigterm_lets_a_slow_handler_finish_within_grace(
    rqlite_target: Target, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    run(*rqlite_target.args, "publish", "slow", '"job"')
    worker = WorkerProcess(
        rqlite_target, tmp_path, "handlers:handle", "--grace", "20", "--visibility", "30", sleep=2
    )
    workers.append(worker)
    wait_for(lambda: bool(worker.started()), 30, "the handler to start")
    code, elapsed = worker.terminate()
    assert code == 0, worker.log.read_text()
    assert elapsed < 15
    assert worker.handled() == [("slow", "job")]
    with rqlite_target.transport() as queue:
        assert queue.stats().depth == 0  # acked


def test_sigterm_nacks_a_handler_that_outlasts_grace(
    rqlite_target: Target, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    run(*rqlite_target.args, "publish", "stuck", '"job"')
    worker = WorkerProcess(
        rqlite_target, tmp_path, "handlers:handle", "--grace", "0.5", "--visibility", "60", sleep=60
    )
    workers.append(worker)
    wait_for(lambda: bool(worker.started()), 30, "the handler to start")
    code, elapsed = worker.terminate()
    assert code == 0, worker.log.read_text()
    assert elapsed < 10, "the process must not wait for the stuck handler"
    assert worker.handled() == []
    assert "nacked" in worker.log.read_text()
    with rqlite_target.transport() as queue:
        stats = queue.stats()
        assert (stats.depth, stats.in_flight) == (1, 0)  # nacked, not left to lapse
        lease = queue.claim("check", visibility=10)
        assert lease is not None and (lease.group_id, lease.event) == ("stuck", "job")
        assert lease.attempts == 2
        queue.ack(lease)


def test_burst_drains_then_exits_zero(sqlite_target: Target, tmp_path: Path) -> None:
    published = _publish_workload(sqlite_target, groups=3, per_group=4)
    (tmp_path / "handlers.py").write_text(HANDLER)
    out = tmp_path / "handled.jsonl"
    result = subprocess.run(
        [EXE or "", *sqlite_target.args, "worker", "handlers:handle", "--burst"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=cli_env(HANDLER_OUT=str(out)),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert len(out.read_text().splitlines()) == len(published)
    assert _depth(sqlite_target) == 0


def test_a_worker_stops_with_status_1_on_an_error_no_retry_can_mend(
    sqlite_target: Target, tmp_path: Path
) -> None:
    with sqlite_target.transport() as queue:
        queue.router.backend.executor.execute(  # a newer library's schema
            Batch(
                (
                    Statement(
                        f"UPDATE rq_{sqlite_target.queue}_meta SET value = 99 "
                        f"WHERE key = 'schema_version'"
                    ),
                )
            ),
            time.monotonic() + 10,
        )
    (tmp_path / "handlers.py").write_text(HANDLER)
    result = subprocess.run(
        [EXE or "", *sqlite_target.args, "worker", "handlers:handle"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=cli_env(HANDLER_OUT=str(tmp_path / "out")),
        timeout=60,
    )
    assert result.returncode == 1
    assert "schema version 99" in result.stderr


def test_delayed_publish_and_schedules(sqlite_target: Target) -> None:
    later = run(*sqlite_target.args, "publish", "g", '"later"', "--delay", "60", "--ttl", "600")
    assert later.returncode == 0, later.stderr
    with sqlite_target.transport() as queue:
        assert queue.claim("w", 30) is None and queue.stats().delayed == 1
    added = run(*sqlite_target.args, "schedule", "add", "beat", "jobs", '{"n": 1}', "--every", "1")
    assert added.returncode == 0 and "scheduled beat" in added.stdout, added.stderr
    bad = run(*sqlite_target.args, "schedule", "add", "x", "jobs", "1", "--cron", "nope")
    assert bad.returncode == 1 and "cron" in one_error_line(bad)
    listed = run(*sqlite_target.args, "schedule", "list", "--json")
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (row["name"], row["group_id"], row["every"], row["event"]) == (
        "beat",
        "jobs",
        1.0,
        {"n": 1},
    )
    time.sleep(1.1)
    assert run(*sqlite_target.args, "scheduler", "--burst").returncode == 0
    with sqlite_target.transport() as queue:
        assert [e for _, e in queue.peek("jobs")] == [{"n": 1}]
    removed = run(*sqlite_target.args, "schedule", "remove", "beat")
    assert "removed beat" in removed.stdout
    assert run(*sqlite_target.args, "schedule", "list", "--json").stdout == ""


def test_hold_and_release_a_group(sqlite_target: Target) -> None:
    run(*sqlite_target.args, "publish", "order-7", '"ship"')
    held = run(*sqlite_target.args, "group", "hold", "order-7")
    assert held.returncode == 0 and "held order-7" in held.stdout
    with sqlite_target.transport() as queue:
        assert queue.claim("w", 30) is None and queue.stats().held == 1
    released = run(*sqlite_target.args, "group", "release", "order-7")
    assert released.returncode == 0 and "released order-7" in released.stdout
    again = run(*sqlite_target.args, "group", "release", "order-7")
    assert "was not held" in again.stdout
    with sqlite_target.transport() as queue:
        lease = queue.claim("w", 30)
        assert lease is not None and lease.event == "ship"


def test_groups_cancel_priority_pause_resume(target: Target) -> None:
    with target.transport() as queue:
        queue.publish_many([("order-1", "a"), ("order-1", "b"), ("order-2", "c"), ("x", "d")])
        lease = queue.claim("worker-9", 30)
    listed = run(*target.args, "groups", "--prefix", "order-")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0] == "2 groups"
    assert any("order-1" in line and "leased" in line and "worker-9" in line for line in lines)
    as_json = [
        json.loads(line) for line in run(*target.args, "groups", "--json").stdout.splitlines()
    ]
    assert [(g["group_id"], g["state"], g["depth"]) for g in as_json] == [
        ("order-1", "leased", 2),
        ("order-2", "ready", 1),
        ("x", "ready", 1),
    ]
    paged = run(*target.args, "groups", "--limit", "2")
    assert "more after: --after 'order-2'" in paged.stdout
    assert "x" in run(*target.args, "groups", "--after", "order-2").stdout

    refused = run(*target.args, "group", "cancel", "order-1")  # stdin is not a terminal
    assert refused.returncode == 2 and "--yes" in refused.stderr
    cancelled = run(*target.args, "group", "cancel", "order-1", "--reason", "refunded", "-y")
    assert "cancelled order-1: 2 messages dead-lettered" in cancelled.stdout
    assert run(*target.args, "group", "priority", "order-2", "4").returncode == 0
    missing = run(*target.args, "group", "priority", "order-1", "4")
    assert missing.returncode == 1 and "has no messages" in one_error_line(missing)
    assert "paused" in run(*target.args, "pause").stdout
    assert "paused ('rqlite-queue resume')" in run(*target.args, "stats").stdout
    with target.transport() as queue:
        assert queue.claim("w", 30) is None and queue.stats().paused
        assert [d.reason for d in queue.dead_letters()] == ["refunded", "refunded"]
        with pytest.raises(LeaseLost):
            queue.ack(lease)
    assert "resumed" in run(*target.args, "resume").stdout
    with target.transport() as queue:
        first = queue.claim("w", 30, min_priority=4)
        assert first is not None and first.group_id == "order-2"


def test_worker_serves_prometheus_metrics(
    sqlite_target: Target, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    _publish_workload(sqlite_target, groups=2, per_group=3)
    port = free_port()
    worker = WorkerProcess(
        sqlite_target,
        tmp_path,
        "handlers:handle",
        "--metrics-port",
        str(port),
        "--metrics-host",
        "127.0.0.1",
    )
    workers.append(worker)
    wait_for(lambda: _depth(sqlite_target) == 0, 30, "the queue to drain")
    sample = f'rqlite_queue_worker_acked_total{{queue="{sqlite_target.queue}"}} 6.0'

    def scraped() -> bool:
        try:
            return sample in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return False

    wait_for(scraped, 20, "the acked counter")
    code, _ = worker.terminate()
    assert code == 0, worker.log.read_text()


# ------------------------------------------------------------------------------ dead letters


def test_dlq_list_shows_headers_as_text(tmp_path: Path) -> None:
    target = Target(f"sqlite:///{tmp_path}/q.db", f"cli_{uuid.uuid4().hex[:8]}")
    with target.transport() as queue:
        queue.publish("a", 1, headers={"trace": "[bold]t-1[/bold]"})
        lease = queue.claim("t", visibility=30)
        assert lease is not None
        queue.dead_letter(lease, "broken")
    listed = run(*target.args, "dlq", "list", "--json")
    assert [json.loads(line)["headers"] for line in listed.stdout.splitlines()] == [
        {"trace": "[bold]t-1[/bold]"}
    ]
    table = run(*target.args, "dlq", "list", env={**os.environ, "COLUMNS": "300"})
    assert "[bold]t-1[/bold]" in table.stdout  # as written: not rich's markup


def test_dlq_list_requeue_purge(target: Target) -> None:
    with target.transport() as queue:
        for group in ("a", "b", "c"):
            queue.publish(group, {"group": group})
        seqs: dict[str, int] = {}
        while (lease := queue.claim("t", visibility=30)) is not None:
            queue.dead_letter(lease, f"broken {lease.group_id}")
            seqs[lease.group_id] = lease.seq

    listed = run(*target.args, "dlq", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    letters = [json.loads(line) for line in listed.stdout.splitlines()]
    assert {(d["group_id"], d["reason"]) for d in letters} == {
        (g, f"broken {g}") for g in ("a", "b", "c")
    }
    only_b = run(*target.args, "dlq", "list", "--group", "b", "--json")
    assert [json.loads(line)["seq"] for line in only_b.stdout.splitlines()] == [seqs["b"]]
    table = run(*target.args, "dlq", "list", "--limit", "2")
    assert "broken a" in table.stdout and "3 dead letters" not in table.stdout

    requeued = run(*target.args, "dlq", "requeue", str(seqs["a"]))
    assert requeued.returncode == 0 and "requeued 1" in requeued.stdout
    refused = run(*target.args, "dlq", "purge")  # no --yes and no terminal
    assert refused.returncode == 2
    assert "--yes" in one_error_line(refused)
    purged = run(*target.args, "dlq", "purge", str(seqs["b"]), "--yes")
    assert purged.returncode == 0 and "purged 1" in purged.stdout
    with target.transport() as queue:
        stats = queue.stats()
        assert (stats.depth, stats.dead) == (1, 1)
        assert [event for _, event in queue.peek("a")] == [{"group": "a"}]
    everything = run(*target.args, "dlq", "purge", "--yes")
    assert "purged 1" in everything.stdout
    assert "no dead letters" in run(*target.args, "dlq", "list").stdout


# ------------------------------------------------------------------------------ cluster, demo


def _rqlited_pids() -> dict[int, str]:
    """Every rqlited on the machine: pid -> command line."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and Path(argv[0].decode(errors="replace")).name.startswith("rqlited"):
            found[int(entry.name)] = " ".join(a.decode(errors="replace") for a in argv)
    return found


def _lines(stream: IO[str]) -> queue_module.Queue[str]:
    lines: queue_module.Queue[str] = queue_module.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _free_port_run(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 a moment ago."""
    for _ in range(200):
        first = free_port()
        if first + count > 65535:
            continue
        try:
            for port in range(first, first + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return first
    raise AssertionError(f"no {count} consecutive free ports")


@dataclass
class _Up:
    url: str
    proc: subprocess.Popen[str]
    printed: list[str]
    """What it printed up to the URL."""


@contextlib.contextmanager
def _cluster_up(*args: str, err: Path) -> Iterator[_Up]:
    """`rqlite-queue cluster up ARGS` until the test is done (SIGINT, then SIGKILL)."""
    assert EXE is not None
    proc = subprocess.Popen(
        [EXE, "cluster", "up", *args],
        stdout=subprocess.PIPE,
        stderr=err.open("w"),
        text=True,
        env=cli_env(),
    )
    try:
        assert proc.stdout is not None
        lines = _lines(proc.stdout)
        printed: list[str] = []
        deadline = time.monotonic() + 60
        while not printed or not printed[-1].startswith("use: --url "):
            printed.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        yield _Up(printed[-1].removeprefix("use: --url ").strip(), proc, printed)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.rqlite
def test_cluster_up_serves_until_sigint_and_leaves_no_process(tmp_path: Path) -> None:
    before = _rqlited_pids()
    with _cluster_up("1", err=tmp_path / "up.err") as up:
        data_dir = up.printed[0].split("data in ", 1)[1].split(",", 1)[0]
        ours = {pid for pid, cmd in _rqlited_pids().items() if data_dir in cmd}
        assert len(ours) == 1 and not ours & set(before)

        queue = f"cli_{uuid.uuid4().hex[:8]}"
        published = run("--url", up.url, "--queue", queue, "publish", "g", '{"hello": "cluster"}')
        assert published.returncode == 0, published.stderr
        with Transport.from_url(up.url, queue=queue) as q:
            assert [event for _, event in q.peek("g")] == [{"hello": "cluster"}]

        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(30) == 0, (tmp_path / "up.err").read_text()
    after = _rqlited_pids()
    assert not ours & set(after), "the cluster's rqlited is still running"
    assert not [cmd for pid, cmd in after.items() if pid not in before and data_dir in cmd]
    assert not Path(data_dir).exists()
    assert "stopped" in (tmp_path / "up.err").read_text()


@pytest.mark.rqlite
def test_cluster_up_on_a_data_dir_brings_the_same_queue_back(tmp_path: Path) -> None:
    data = tmp_path / "dev-queue"
    port = _free_port_run(6)
    with _cluster_up(
        "3", "--data-dir", str(data), "--http-port", str(port), err=tmp_path / "1"
    ) as up:
        url = up.url
        assert url == ",".join(f"http://127.0.0.1:{port + 2 * i}" for i in range(3))
        assert run("--url", url, "publish", "g", '{"kept": true}').returncode == 0
        up.proc.send_signal(signal.SIGINT)
        assert up.proc.wait(30) == 0
    assert not [cmd for cmd in _rqlited_pids().values() if str(data) in cmd]
    assert (data / "cluster.json").is_file()  # kept, with its ports
    with _cluster_up("3", "--data-dir", str(data), err=tmp_path / "2") as again:
        assert again.url == url
        with Transport.from_url(again.url) as q:
            assert [event for _, event in q.peek("g")] == [{"kept": True}]
        again.proc.send_signal(signal.SIGINT)
        assert again.proc.wait(30) == 0
    wrong = run("cluster", "up", "1", "--data-dir", str(data))
    assert wrong.returncode == 1 and "3-node cluster, not 1" in one_error_line(wrong)
    assert not [cmd for cmd in _rqlited_pids().values() if str(data) in cmd]


def test_demo_passes_its_arguments_through(tmp_path: Path) -> None:
    result = run(
        "demo",
        "--backend",
        "sqlite",
        "--groups",
        "3",
        "--messages",
        "2",
        "--workers",
        "2",
        "--seed",
        "1",
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result" in result.stdout and "OK" in result.stdout


def test_bench_is_a_command_of_the_checkout_not_of_the_package() -> None:
    result = run("bench")
    assert result.returncode == 2
    assert "No such command 'bench'" in one_error_line(result)


def test_tenants_weights_and_the_rule(sqlite_target: Target) -> None:
    """`publish --tenant`, `tenant weight`, `tenant rule`, `tenants` (table and JSON)."""
    target = sqlite_target
    assert run(*target.args, "publish", "g1", '"a"', "--tenant", "acme").returncode == 0
    assert run(*target.args, "tenant", "weight", "acme", "3").returncode == 0
    assert run(*target.args, "tenant", "rule", ":").returncode == 0
    lines = '{"group_id": "globex:7", "event": 1}\n{"group_id": "x", "event": 2, "tenant": "t"}\n'
    assert run(*target.args, "publish", input=lines).returncode == 0
    listed = run(*target.args, "tenants", "--json")
    assert listed.returncode == 0, listed.stderr
    tenants = {t["name"]: t for t in map(json.loads, listed.stdout.splitlines())}
    assert {name: (t["weight"], t["groups"]) for name, t in tenants.items()} == {
        "": (1.0, 0),
        "acme": (3.0, 1),
        "globex": (1.0, 1),
        "t": (1.0, 1),
    }
    table = run(*target.args, "tenants")
    assert "4 tenants" in table.stdout and "(default)" in table.stdout, table.stdout
    refused = run(*target.args, "tenant", "rule")
    assert refused.returncode == 2 and "SEPARATOR or --none" in refused.stderr
    mismatch = run(*target.args, "publish", "g1", '"b"', "--tenant", "other")
    assert mismatch.returncode == 1 and "tenant" in mismatch.stderr
    assert run(*target.args, "tenant", "rule", "--none").returncode == 0


def test_tenant_limits_bounds_and_debounce(sqlite_target: Target) -> None:
    """`tenant limits` (kept when left out, 'none' removes), `tenants` shows them, a publish
    over a bound fails with the limit, `publish --debounce` replaces the pending message."""
    target = sqlite_target
    done = run(*target.args, "tenant", "limits", "acme", "--rate", "5", "--max-group-queued", "1")
    assert done.returncode == 0, done.stderr
    assert run(*target.args, "tenant", "limits", "acme", "--max-in-flight", "2").returncode == 0
    assert run(*target.args, "publish", "a1", '"x"', "--tenant", "acme").returncode == 0
    full = run(*target.args, "publish", "a1", '"y"')
    assert full.returncode == 1 and "at most 1 messages" in full.stderr, full.stderr
    listed = run(*target.args, "tenants", "--json")
    acme = {t["name"]: t for t in map(json.loads, listed.stdout.splitlines())}["acme"]
    assert (acme["rate"], acme["burst"], acme["max_in_flight"], acme["max_group_queued"]) == (
        5.0,
        5.0,
        2,
        1,
    )
    table = run(*target.args, "tenants").stdout
    assert "5/s, burst 5" in table and "0 / 2" in table, table
    assert run(*target.args, "tenant", "limits", "acme", "--rate", "none").returncode == 0
    bad = run(*target.args, "tenant", "limits", "acme", "--max-in-flight", "lots")
    assert bad.returncode == 2 and "'none'" in bad.stderr
    assert run(*target.args, "tenant", "limits", "acme").returncode == 2
    first = run(*target.args, "publish", "d", '"v1"', "--debounce", "k", "--delay", "60")
    again = run(*target.args, "publish", "d", '"v2"', "--debounce", "k", "--delay", "60")
    assert first.stdout == again.stdout and first.returncode == 0
    peeked = run(*target.args, "peek", "d")
    assert "v2" in peeked.stdout and "v1" not in peeked.stdout, peeked.stdout


# ------------------------------------------------------------------------------ jobs


def test_job_shows_waits_for_and_cancels_a_job(target: Target) -> None:
    """`publish --keep`, then `job GROUP SEQ`: queued, then (a worker's handler) its result;
    `--wait` and its exit status; `--cancel` of a queued message (confirmed with --yes); a job
    it does not know."""
    seq = int(run(*target.args, "publish", "g", '{"n": 2}', "--keep", "600").stdout)
    shown = run(*target.args, "job", "g", str(seq), "--json")
    assert shown.returncode == 0, shown.stderr
    job = json.loads(shown.stdout)
    assert (job["status"], job["event"], job["final"]) == ("queued", {"n": 2}, False)
    waited = run(*target.args, "job", "g", str(seq), "--wait", "0.3")
    assert waited.returncode == 124 and "queued" in waited.stdout  # still not over
    with target.transport() as queue:
        lease = queue.claim("w1", 30)
        assert lease is not None and lease.keep == 600
        queue.ack(lease, result={"double": 4})
    done = run(*target.args, "job", "g", str(seq), "--wait")
    assert done.returncode == 0, done.stderr
    assert "succeeded" in done.stdout and '{"double":4}' in done.stdout and "w1" in done.stdout
    other = int(run(*target.args, "publish", "g", '"later"', "--keep", "600").stdout)
    refused = run(*target.args, "job", "g", str(other), "--cancel")
    assert refused.returncode == 2  # not a terminal: --yes is required
    cancelled = run(*target.args, "job", "g", str(other), "--cancel", "--yes", "--reason", "no")
    assert cancelled.returncode == 0, cancelled.stderr
    assert f"g#{other}: cancelled" in cancelled.stdout and "no" in cancelled.stdout
    final = json.loads(run(*target.args, "job", "g", str(other), "--json").stdout)
    assert (final["status"], final["reason"]) == ("cancelled", "no")
    failed = run(*target.args, "job", "g", str(other), "--wait", "1")
    assert failed.returncode == 1  # over, and not succeeded
    unknown = run(*target.args, "job", "g", "999999")
    assert unknown.returncode == 1 and "no such job" in one_error_line(unknown)
    assert run(*target.args, "job", "g", "1", "--cancel", "--wait", "1").returncode == 2
