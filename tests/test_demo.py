"""The main job (`rqlite-queue demo`) run as users run it: a subprocess, on the
embedded SQLite and on a real local rqlite cluster, which it must never leave running."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

DEMO = [sys.executable, "-m", "rqlite_queue", "demo"]


MARK = "RQLITE_QUEUE_TEST_DEMO"
"""Set in the environment of each demo a test runs, so that the rqlited processes it starts
(they inherit it) are told from those of other test runs on the same machine."""


def demo_env(base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    return {**(os.environ if base is None else base), **extra, MARK: uuid.uuid4().hex}


def rqlited_pids(env: dict[str, str]) -> set[int]:
    """PIDs of the rqlited processes started under `env` (a `demo_env`): those whose
    environment carries its mark (Linux /proc)."""
    mark = f"{MARK}={env[MARK]}".encode()
    pids: set[int] = set()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv0 = (entry / "cmdline").read_bytes().split(b"\0", 1)[0]
            if not os.path.basename(argv0).startswith(b"rqlited"):
                continue
            if mark in (entry / "environ").read_bytes().split(b"\0"):
                pids.add(int(entry.name))
        except OSError:
            continue
    return pids


def left_behind(env: dict[str, str]) -> set[int]:
    """rqlited processes of this demo still alive a moment after it ended."""
    deadline = time.monotonic() + 5
    while (left := rqlited_pids(env)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def run_demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEMO, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def check_report(out: str, groups: int, messages: int) -> None:
    total = groups * messages
    assert re.search(r"result\s+OK", out), out
    assert re.search(rf"published\s+{total} messages in {groups} groups", out), out
    assert re.search(rf"= {total} of {total}; lost: 0; left in queue: 0", out), out
    assert re.search(rf"order\s+held in {groups}/{groups} groups", out), out
    assert re.search(r"exclusivity\s+0 violations", out), out
    assert re.search(r"dead letters\s+2 stored", out), out
    assert out.count("malformed payload (failed 3 attempts)") == 2, out
    assert re.search(r"lease lapse\s+1 redelivered after a crash", out), out
    assert "with attempts=2" in out, out
    assert re.search(r"priority floor\s+\d+ claims with min_priority=3", out), out
    assert "BELOW the floor" not in out, out


def test_demo_on_sqlite() -> None:
    result = run_demo("--backend", "sqlite", "--groups", "10", "--messages", "5", "--seed", "7")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"backend\s+embedded SQLite", result.stdout)
    check_report(result.stdout, 10, 5)


def test_demo_on_rqlite_cluster(rqlited_path: str) -> None:
    env = demo_env(RQLITED=rqlited_path)
    result = run_demo(
        "--backend", "rqlite", "--groups", "8", "--messages", "4", "--seed", "3", env=env
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"backend\s+rqlite v8\.43\.4, 3 nodes: n1", result.stdout), result.stdout
    check_report(result.stdout, 8, 4)
    assert not left_behind(env)


def test_demo_interrupted_stops_its_cluster(rqlited_path: str) -> None:
    """Ctrl-C in the middle of the run: exit 130, and the cluster is gone."""
    env = demo_env(RQLITED=rqlited_path)
    proc = subprocess.Popen(
        [*DEMO, "--backend", "rqlite", "--groups", "20", "--messages", "10"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "starting" in line and "workers" in line:
                break
        else:
            pytest.fail("the demo never started its workers")
        assert rqlited_pids(env), "the demo's cluster is not running"
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, rest
    assert "interrupted" in rest
    assert not left_behind(env)


def test_demo_without_rqlited_says_so_and_never_falls_back_to_sqlite(tmp_path: Path) -> None:
    env = dict(os.environ, RQLITED=str(tmp_path / "no-such-rqlited"))
    result = run_demo("--groups", "2", "--messages", "1", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert "no usable rqlited" in output and "--backend sqlite" in output
    assert "rqlite-queue rqlited" in output
    assert "embedded SQLite" not in output and "result" not in output


def test_make_demo_without_go_or_gcc_runs_on_the_embedded_queue(tmp_path: Path) -> None:
    """A first run anywhere (issue 35, item 6): `make demo` on a machine where no rqlited can
    be found or built runs on the embedded queue, saying why and how to get the 3-node demo.
    The toolchain is hidden: PATH holds `make` alone (no go, gcc, rqlited), an empty cache."""
    root = Path(__file__).resolve().parent.parent
    make = shutil.which("make")
    if make is None or not (root / ".venv" / "bin" / "rqlite-queue").exists():
        pytest.skip("needs make and the checkout's .venv (`make setup`)")
    hidden = tmp_path / "bin"
    hidden.mkdir()
    (hidden / "make").symlink_to(make)
    env = demo_env(
        {},
        PATH=str(hidden),
        HOME=str(tmp_path),
        RQLITE_QUEUE_CACHE=str(tmp_path / "cache"),
        LANG="C.UTF-8",
    )
    demo_args = "DEMO_ARGS=--groups 6 --messages 3 --seed 5"
    result = subprocess.run(
        # -o: the venv is there; make must not try to reinstall it with the PATH hidden.
        [make, "-s", "-C", str(root), "-o", ".venv/.installed", "demo", demo_args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "no usable rqlited, and none could be built here" in output, output
    assert "Go is not installed" in output, output
    assert "rqlite-queue rqlited" in output and "make demo` again" in output, output
    assert re.search(r"backend\s+embedded SQLite", result.stdout), output
    check_report(result.stdout, 6, 3)
    assert not rqlited_pids(env)
