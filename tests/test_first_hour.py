"""Issue 36, the first hour of a new user: every mistake a newcomer makes gets one line that
says what happened (with the URL, the port or the file it concerns) and what to do next; no
traceback for an expected failure (`-v` keeps the details). Each test is one row of the
issue's table; `test_every_command_keeps_the_rule` walks every command with a dead URL, a bad
URL and a taken port, so that new commands keep it too."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import EXE, cli_env, one_error_line, run

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
