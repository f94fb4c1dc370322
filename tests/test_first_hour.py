"""Issue 36, the first hour of a new user: every mistake a newcomer makes gets one line that
says what happened (with the URL, the port or the file it concerns) and what to do next; no
traceback for an expected failure (`-v` keeps the details). Each test is one row of the
issue's table; `test_every_command_keeps_the_rule` walks every command with a dead URL, a bad
URL and a taken port, so that new commands keep it too."""

from __future__ import annotations

import io
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from test_cli import DOCS, EXE, cli_env, one_error_line, run

from rqlite_queue import Backoff, RqliteTransport, ShardedTransport, Transport, Unavailable
from rqlite_queue.backup import backup
from rqlite_queue.cli import _base as cli_base
from rqlite_queue.cli import _run, cli
from rqlite_queue.cli._base import _state
from rqlite_queue.errors import REFUSED, NothingListens
from rqlite_queue.testing import Cluster, free_port

pytestmark = pytest.mark.skipif(EXE is None, reason="rqlite-queue not installed")


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another process's socket holds (listening) for the test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


# ------------------------------------------------------------------ a node's own reason


@pytest.mark.rqlite
def test_cluster_up_on_a_taken_port_says_which_and_what_to_do(taken_port: int) -> None:
    # node 1's Raft port is the one above its HTTP port: the taken one
    result = run("cluster", "up", "1", "--http-port", str(taken_port - 1))
    assert result.returncode == 1
    line = one_error_line(result)
    assert f"127.0.0.1:{taken_port}: bind: address already in use" in line
    assert "--http-port" in line
    assert not result.stdout


@pytest.mark.rqlite
def test_the_demo_says_why_its_cluster_did_not_start(rqlited_path: str, tmp_path: Path) -> None:
    # A real rqlited given a certificate that does not exist: it fails at start, as it says.
    wrapper = tmp_path / "rqlited"
    wrapper.write_text(
        f'#!/bin/sh\nexec {rqlited_path} -http-cert /nonexistent -http-key /nonexistent "$@"\n'
    )
    wrapper.chmod(0o755)
    result = run("demo", env=cli_env(RQLITED=str(wrapper)), cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stdout
    assert "failed to start HTTP server: open /nonexistent" in errors[0]
    assert "Traceback" not in result.stdout + result.stderr


# ------------------------------------------------------------------ the walk over every command

# Arguments that take each command to its backend (or its port). A command missing here
# fails `test_every_command_is_walked`: give it its arguments, so that it keeps the rule too.
QUEUE_COMMANDS: dict[str, list[str]] = {
    "publish": ["publish", "g", '{"n": 1}'],
    "stats": ["stats"],
    "peek": ["peek", "g"],
    "job": ["job", "g", "1"],
    "batch": ["batch", "01a3185c500010008177ffc572164643"],
    "batches": ["batches"],
    "worker": ["worker", "walk_handlers:handle", "--burst"],
    "dlq list": ["dlq", "list"],
    "dlq requeue": ["dlq", "requeue"],
    "dlq purge": ["dlq", "purge", "--yes"],
    "group hold": ["group", "hold", "g"],
    "group release": ["group", "release", "g"],
    "group cancel": ["group", "cancel", "g", "--yes"],
    "group priority": ["group", "priority", "g", "2"],
    "groups": ["groups"],
    "pause": ["pause"],
    "resume": ["resume"],
    "tenants": ["tenants"],
    "tenant weight": ["tenant", "weight", "t", "2"],
    "tenant limits": ["tenant", "limits", "t", "--max-in-flight", "3"],
    "tenant rule": ["tenant", "rule", ":"],
    "dashboard": ["dashboard", "--port", "0"],
    "schedule add": ["schedule", "add", "tick", "g", '{"n": 1}', "--every", "60"],
    "schedule list": ["schedule", "list"],
    "schedule remove": ["schedule", "remove", "tick"],
    "scheduler": ["scheduler", "--burst"],
    "shards status": ["shards", "status"],
    "shards drain": ["shards", "drain", "a"],
    "backup": ["backup", "{tmp}/walk-backup.db"],
    "restore": ["restore", "{tmp}/restorable.db", "--force"],
    "demo": ["demo", "--groups", "1", "--messages", "1", "--workers", "1"],
}
# The commands that listen on a port, with the arguments that give them the taken one; the
# backend of the others is a local file.
PORT_COMMANDS: dict[str, list[str]] = {
    "dashboard": ["dashboard", "--port", "{port}"],
    "worker": ["worker", "walk_handlers:handle", "--burst", "--metrics-port", "{port}"],
    # node 1's Raft port is the one above its HTTP port
    "cluster up": ["cluster", "up", "1", "--http-port", "{port-1}"],
}
NO_QUEUE = {"rqlited", "toxiproxy", "cluster up"}  # no backend, no port to give them


def leaf_commands(group: click.Group = cli, prefix: str = "") -> list[str]:
    names = []
    for name, command in sorted(group.commands.items()):
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            names += leaf_commands(command, path + " ")
        else:
            names.append(path)
    return names


def test_every_command_is_walked() -> None:
    walked = set(QUEUE_COMMANDS) | set(PORT_COMMANDS) | NO_QUEUE
    assert set(leaf_commands()) == walked, "give the new command its walk arguments"


@dataclass
class Ran:
    status: int
    out: str
    err: str
    seconds: float

    def ok(self) -> bool:
        return self.status == 0


@pytest.fixture
def cli_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Callable[..., Ran]:
    """`rqlite-queue ARGS` in this process (a subprocess each would cost a second of
    imports), in `tmp_path`, with `{tmp}` and `{port}` in ARGS filled in."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RQLITE_QUEUE_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    (tmp_path / "walk_handlers.py").write_text("def handle(lease):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def invoke(*args: str, port: int = 0) -> Ran:
        filled = [
            a.replace("{tmp}", str(tmp_path))
            .replace("{port-1}", str(port - 1))
            .replace("{port}", str(port))
            for a in args
        ]
        capsys.readouterr()
        handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
        began = time.monotonic()
        try:
            status = _run(filled)
        finally:
            _state.exit_hard = False  # (the worker's os._exit is the entry point's, not ours)
            for sig, handler in handlers.items():  # (the demo's, say: not this process's)
                signal.signal(sig, handler)
        seconds = time.monotonic() - began
        out, err = capsys.readouterr()
        return Ran(status, out, err, seconds)

    return invoke


def the_one_error(ran: Ran, command: str) -> str:
    lines = [line for line in ran.err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert ran.status != 0, (command, ran)
    assert "Traceback" not in ran.err + ran.out, (command, ran.err)
    assert len(errors) == 1, (command, ran.err)
    assert lines[-1] == errors[0], (command, ran.err)  # nothing after it
    return errors[0]


@pytest.fixture
def restorable(tmp_path: Path) -> Path:
    """A backup file that `restore` accepts (made from an embedded queue)."""
    with Transport.from_url(f"sqlite:///{tmp_path}/source.db", queue="walk") as queue:
        queue.publish("g", 1)
        backup(queue, tmp_path / "restorable.db")
    return tmp_path / "restorable.db"


def test_every_command_keeps_the_rule(
    cli_run: Callable[..., Ran],
    restorable: Path,
    taken_port: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every command, given a URL where nothing listens, a URL without its scheme, and (the
    ones that listen) a taken port: one error line that says what and what next, at once."""
    # The commands' half second of refusals before they say so, shortened: the walk is about
    # each command's line (30 commands waited 18 s); test_a_dead_url_is_said_at_once_with_
    # what_to_do runs the command as a user types it, with its own wait.
    monkeypatch.setattr(cli_base, "REFUSED_TIMEOUT", 0.05)
    dead = f"http://127.0.0.1:{free_port()}"
    slowest = 0.0
    for command, args in QUEUE_COMMANDS.items():
        ran = cli_run("--url", dead, "--timeout", "30", *args)
        line = the_one_error(ran, command)
        assert f"nothing answers at {dead} (connection refused)" in line, (command, line)
        assert "is the cluster running?" in line, (command, line)
        assert line.endswith("('rqlite-queue cluster up' starts a local one)"), (command, line)
        slowest = max(slowest, ran.seconds)

        bare = dead.removeprefix("http://")
        ran = cli_run("--url", bare, *args)
        line = the_one_error(ran, command)
        assert f"no scheme in the URL '{bare}'" in line and f"'{dead}'" in line, (command, line)
    # a refusal everywhere is an answer: not the --timeout (30 s) of a cluster that is slow
    assert slowest < 10, slowest

    for command, args in PORT_COMMANDS.items():
        ran = cli_run("--url", "sqlite:///walk.db", *args, port=taken_port)
        line = the_one_error(ran, command)
        assert f":{taken_port}" in line, (command, line)
        assert re.search(r"another --(metrics-|http-)?port", line), (command, line)


# ------------------------------------------------------------------ unreachable is not slow


def test_a_dead_url_is_said_at_once_with_what_to_do(tmp_path: Path) -> None:
    """The whole command, as a user types it: not 15 s of silence, then "the deadline passed
    before any request was sent"."""
    dead = f"http://127.0.0.1:{free_port()}"
    began = time.monotonic()
    result = run("--url", dead, "--timeout", "30", "stats", cwd=tmp_path)
    took = time.monotonic() - began
    assert result.returncode == 1
    assert one_error_line(result) == (
        f"error: nothing answers at {dead} (connection refused): is the cluster running? "
        "('rqlite-queue cluster up' starts a local one)"
    )
    assert took < 10, took  # about 1.5 s on a busy 2-core machine, imports included


def test_a_sharded_queue_none_of_whose_shards_listens_says_so_with_what_to_do(
    cli_run: Callable[..., Ran],
) -> None:
    """Every shard refused: the library's error says so of each shard (NothingListens, its
    nodes by URL), and `shards status` / `shards drain` give the next step as the others do."""
    a, b = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    with pytest.raises(NothingListens) as error:
        ShardedTransport(f"a={a};b={b}", refused_timeout=0.2, deadline=5).setup()
    assert error.value.refused and error.value.nodes == {a: REFUSED, b: REFUSED}
    assert f"a: nothing answers at {a}" in str(error.value)
    assert f"b: nothing answers at {b}" in str(error.value)

    for args in (["shards", "status"], ["shards", "drain", "b"]):
        ran = cli_run("--url", f"a={a};-b={b};epoch=2", *args)
        line = the_one_error(ran, " ".join(args))
        assert line.startswith("error: no shard answered: a: nothing answers at"), line
        assert line.endswith("('rqlite-queue cluster up' starts a local one)"), line


@pytest.mark.rqlite
def test_the_librarys_error_after_its_deadline_says_what_each_node_did(
    rqlite_cluster: Cluster, taken_port: int
) -> None:
    """Without `refused_timeout` (a library user's default) the cluster is waited for until
    `connect_timeout`; the error then says, by URL, what each node did. The taken port is a
    socket that accepts connections and never answers."""
    dead, silent = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{taken_port}"
    began = time.monotonic()
    with pytest.raises(Unavailable) as error:
        Transport.from_url(dead, connect_timeout=1, deadline=1)
    assert time.monotonic() - began >= 1
    assert not isinstance(error.value, NothingListens)
    assert str(error.value) == (
        f"not available after 1s: nothing answers at {dead} (connection refused): "
        "is the cluster running?"
    )
    assert error.value.nodes == {dead: REFUSED}

    with pytest.raises(Unavailable) as error:
        Transport.from_url(f"{dead},{silent}", connect_timeout=2.5, timeout=1, deadline=2.5)
    message = str(error.value)
    assert "before any request was sent" not in message
    assert f"{dead}: connection refused" in message, message
    assert f"{silent}: no reply within 1.0s" in message, message


@pytest.mark.rqlite
def test_a_cluster_once_reached_is_waited_for_through_a_restart(
    rqlite_cluster_factory: Callable[..., Cluster],
) -> None:
    """`refused_timeout` is for the first contact only: a transport (a Worker's) that has
    reached its cluster retries a node that refuses connections while it restarts, within
    the call's deadline, as it always did."""
    cluster = rqlite_cluster_factory(1)
    node = cluster.nodes[0]
    with RqliteTransport(cluster.url, refused_timeout=0.2, deadline=30) as queue:
        queue.publish("g", 1)
        node.stop()
        restart = threading.Timer(1.0, node.start)
        restart.start()
        try:
            began = time.monotonic()
            assert queue.stats().depth == 1  # refused for a second or more, then answered
            assert time.monotonic() - began > 0.5
        finally:
            restart.join()


# ------------------------------------------------------------------ a URL without its scheme


def test_a_url_without_its_scheme_is_shown_with_the_one_to_write(
    cli_run: Callable[..., Ran],
) -> None:
    for verbose in ([], ["-v"]):
        ran = cli_run(*verbose, "--url", "127.0.0.1:4001", "stats")
        assert the_one_error(ran, "stats") == (
            "error: no scheme in the URL '127.0.0.1:4001': for rqlite, write "
            "'http://127.0.0.1:4001' (or https://)"
        )
    ran = cli_run("--url", "alice:s3cret@127.0.0.1:4001", "stats")
    line = the_one_error(ran, "stats")
    assert "s3cret" not in line and "'http://USER:PASSWORD@127.0.0.1:4001'" in line
    ran = cli_run("--url", "queue.db", "stats")
    assert "write 'sqlite:///queue.db'" in the_one_error(ran, "stats")


# ------------------------------------------------------------------ which backend


def test_the_local_file_is_named_when_no_url_is_given(
    cli_run: Callable[..., Ran], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    published = cli_run("publish", "g", '{"n": 1}')
    assert published.status == 0, published.err
    assert published.err.splitlines() == [
        f"using the local file {tmp_path / 'rqlite-queue.db'} "
        "(no --url, no $RQLITE_QUEUE_URL: give one for rqlite)"
    ]
    worked = cli_run("worker", "walk_handlers:handle", "--burst")
    assert worked.status == 0, worked.err
    assert worked.err.count("using the local file") == 1
    given = cli_run("--url", f"sqlite:///{tmp_path}/other.db", "stats")
    assert given.status == 0 and "using the local file" not in given.err
    monkeypatch.setenv("RQLITE_QUEUE_URL", f"sqlite:///{tmp_path}/other.db")
    from_env = cli_run("stats")
    assert from_env.status == 0 and "using the local file" not in from_env.err


# ------------------------------------------------------------------ honest status


def test_shards_status_counts_each_moving_group_once(cli_run: Callable[..., Ran]) -> None:
    one = "a=sqlite:///{tmp}/a.db"
    two = "epoch=1;a=sqlite:///{tmp}/a.db;+b=sqlite:///{tmp}/b.db"
    groups = [f"g{i}" for i in range(12)]
    for group in groups:
        assert cli_run("--url", one, "publish", group, "1").status == 0
    for group in groups:  # a second message each, under the new list
        assert cli_run("--url", two, "publish", group, "2").status == 0
    listed = cli_run("--url", two, "shards", "status", "--json")
    statuses = {s["name"]: s for s in map(json.loads, listed.out.splitlines())}
    moving = statuses["a"]["leaving"]
    assert 0 < moving < len(groups) and statuses["b"]["waiting"] == moving
    shown = cli_run("--url", two, "shards", "status")
    assert shown.status == 0, shown.err
    assert shown.out.splitlines()[-1] == (
        f"change under way: {moving} groups still moving "
        f"({moving} of them with new messages waiting on their new shard)"
    )


def test_the_tutorial_and_worker_help_say_the_backoff_has_jitter(
    cli_run: Callable[..., Ran],
) -> None:
    """The tutorial's worker runs with --backoff 1: its waits are what `Backoff` draws."""
    backoff = Backoff(base=1.0)
    low = [backoff.ceiling(n) * (1 - backoff.jitter) for n in (1, 2)]
    high = [backoff.ceiling(n) for n in (1, 2)]
    said = f"between {low[0]:g} and {high[0]:g} s, then between {low[1]:g} and {high[1]:g} s"
    tutorial = " ".join((DOCS / "tutorial.md").read_text().split())
    assert said in tutorial
    assert "1 s, then 2 s" not in tutorial
    helped = " ".join(cli_run("worker", "--help").out.split())
    assert "doubling up to 300 s, with jitter" in helped


def test_the_readme_and_cluster_up_help_agree_that_it_never_builds(
    cli_run: Callable[..., Ran],
) -> None:
    helped = " ".join(cli_run("cluster", "up", "--help").out.split())
    assert "it never builds one" in helped
    readme = " ".join((DOCS.parent / "README.md").read_text().split())
    assert "`cluster up` never builds one itself" in readme
    assert "finds or builds the rqlited it runs" not in readme


# ------------------------------------------------------------------ output that fits


def test_narrow_tables_never_cut_ids_or_states(
    cli_run: Callable[..., Ran], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = "--url", "sqlite:///{tmp}/narrow.db"
    group = "order-2026-0042-customer-7f3a9c"
    note = "a long event, longer than any terminal is narrow"
    assert cli_run(*url, "publish", group, json.dumps({"step": "refund", "note": note})).ok()
    with Transport.from_url(f"sqlite:///{Path.cwd()}/narrow.db") as queue:
        lease = queue.claim("w", 30)
        assert lease is not None
        queue.dead_letter(lease, "ValueError: unknown step: refund")
        queue.publish(group + "-next", 1)
    monkeypatch.setenv("COLUMNS", "40")
    groups = cli_run(*url, "groups")
    assert f" {group}-next " in groups.out and " ready " in groups.out, groups.out
    dead = cli_run(*url, "dlq", "list")
    assert f" {group} " in dead.out, dead.out
    event_lines = [line for line in dead.out.splitlines() if '{"' in line or "note" in line]
    assert len(event_lines) == 1, dead.out  # the event on one line: whole, or shortened
    assert '{"step":"re' in event_lines[0]
    assert "…" in event_lines[0] or note in event_lines[0]


def test_every_table_has_json(cli_run: Callable[..., Ran]) -> None:
    """Whatever prints a table also prints JSON lines with --json (on a queue of one shard,
    so that `shards status` has its table too)."""
    tables = []
    for command, args in QUEUE_COMMANDS.items():
        if command in ("worker", "dashboard", "demo", "scheduler", "shards drain", "restore"):
            continue  # they serve, run or replace rather than list
        url = "--url", f"a=sqlite:///{{tmp}}/{command.replace(' ', '-')}.db"
        assert cli_run(*url, "publish", "g", '{"n": 1}').status == 0
        assert cli_run(*url, "schedule", "add", "tick", "g", "1", "--every", "60").status == 0
        ran = cli_run(*url, *args)
        if "┏" not in ran.out:
            continue
        tables.append(command)
        listed = cli_run(*url, *args, "--json")
        assert listed.status == 0, (command, listed.err)
        assert listed.out and all(json.loads(line) for line in listed.out.splitlines())
    assert {"stats", "peek", "groups", "tenants", "schedule list", "shards status"} <= set(tables)


# ------------------------------------------------------------------ stopping a worker


def test_a_worker_exits_at_once_after_its_stopped_line_with_its_totals_in_words(
    tmp_path: Path,
) -> None:
    assert EXE is not None
    (tmp_path / "walk_handlers.py").write_text("def handle(lease):\n    pass\n")
    url = f"sqlite:///{tmp_path}/stop.db"
    assert run("--url", url, "publish", "g", "1").returncode == 0
    proc = subprocess.Popen(
        [EXE, "--url", url, "worker", "walk_handlers:handle"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        assert proc.stderr is not None
        lines = []
        while not any(" started " in line for line in lines):
            lines.append(proc.stderr.readline())
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        stopped_at = None
        for line in proc.stderr:
            lines.append(line)
            if " stopped " in line:
                stopped_at = time.monotonic()
        assert proc.wait(10) == 0
        exited_at = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert stopped_at is not None, lines
    # measured 0.005-0.04 s here; the bound leaves room for a busy machine
    assert exited_at - stopped_at < 1.0
    stopped = next(line for line in lines if " stopped " in line)
    assert re.search(
        r"stopped after \d+\.\ds: 1 claimed, 1 acked, 0 nacked, 0 dead-lettered$",
        stopped.rstrip(),
    ), stopped
    assert "WorkerStats(" not in "".join(lines)
