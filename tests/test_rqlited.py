"""Finding and judging rqlited (`rqlite_queue.rqlited`, `rqlite-queue rqlited`).

Fake binaries here are shell scripts that print a version line, so that every branch of the
version policy is exercised; the real rqlited is checked too. Building from Go is exercised by
tests/install (a fresh virtualenv with an empty cache).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rqlite_queue.rqlited import (
    BUILD_VERSION,
    MINIMUM,
    TESTED,
    RqlitedNotFound,
    build_rqlited,
    check_rqlited,
    find_rqlited,
    judge_version,
    parse_version,
)

EXE = Path(sys.executable).parent / "rqlite-queue"


def fake(folder: Path, version_line: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rqlited"
    path.write_text(f"#!/bin/sh\necho '{version_line}'\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No $RQLITED, an empty cache, and a PATH with nothing but the shell's tools."""
    monkeypatch.delenv("RQLITED", raising=False)
    monkeypatch.setenv("RQLITE_QUEUE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    return tmp_path


def test_parse_version() -> None:
    assert parse_version("rqlited v8.43.4 linux amd64 go1.26.8 sqlite3.50.4") == (8, 43, 4)
    assert parse_version("rqlited 8.44.0 linux") == (8, 44, 0)
    assert parse_version("rqlited 8 linux amd64 go1.24") == (8,)
    assert parse_version("rqlited v9.1.0") == (9, 1, 0)
    assert parse_version("something else") is None


def test_the_version_policy() -> None:
    assert judge_version(TESTED[0]) == (True, None)
    usable, warning = judge_version((8, 44, 0))  # newer v8: used, with a warning
    assert usable and warning is not None and "not tested" in warning
    usable, warning = judge_version(MINIMUM)
    assert usable and warning is not None
    usable, warning = judge_version((8,))  # a build without its release stamped in
    assert usable and warning is not None and "only '8'" in warning
    for refused, reason in [
        ((9, 0, 0), "not open source"),
        ((10, 2, 1), "not open source"),
        ((7, 40, 0), "predates"),
        ((8, 32, 1), "older than v8.32.2"),
        (None, "does not print a version"),
    ]:
        usable, why = judge_version(refused)
        assert not usable and why is not None and reason in why, (refused, why)


def test_the_real_rqlited_is_tested(rqlited_path: str) -> None:
    info = check_rqlited(rqlited_path)
    assert info.version in TESTED and info.warning is None


def test_rqlited_env_is_the_only_place_looked_when_set(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = fake(isolated / "cache" / "v8.43.4", "rqlited v8.43.4 linux")
    monkeypatch.setenv("RQLITED", str(isolated / "missing"))
    with pytest.raises(RqlitedNotFound, match=r"RQLITED: .*missing is not an executable"):
        find_rqlited()
    monkeypatch.setenv("RQLITED", fake(isolated / "v9", "rqlited v9.0.1 linux"))
    with pytest.raises(RqlitedNotFound, match="v9 or later"):
        find_rqlited()
    monkeypatch.delenv("RQLITED")
    assert find_rqlited().path == cached


def test_cache_then_path_and_refusals_are_listed(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = isolated / "bin"
    fake(bin_dir, "rqlited v9.2.0 linux amd64")
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    with pytest.raises(RqlitedNotFound) as refused:
        find_rqlited()
    message = str(refused.value)
    assert "refused" in message and "v9 or later" in message
    for way in ("rqlite-queue rqlited", "releases", "docker", "package manager", "RQLITED="):
        assert way in message, way

    fake(bin_dir, "rqlited v8.44.0 linux amd64")  # on PATH, untested: used with a warning
    info = find_rqlited()
    assert info.path == str(bin_dir / "rqlited") and info.version == (8, 44, 0)
    assert info.warning is not None

    cached = fake(isolated / "cache" / "v8.43.4", "rqlited v8.43.4 linux")
    assert find_rqlited().path == cached  # the cache before PATH


def test_build_refuses_what_it_would_not_run(isolated: Path) -> None:
    for version in [(9, 0, 0), (8, 10, 0), (8, 44, 0)]:
        with pytest.raises(RqlitedNotFound, match="will not build"):
            build_rqlited(version)
    assert BUILD_VERSION in TESTED


def test_the_command_prints_the_path(rqlited_path: str) -> None:
    env = {**os.environ, "RQLITED": rqlited_path}
    result = subprocess.run(
        [EXE, "rqlited"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert (result.returncode, result.stdout.strip()) == (0, rqlited_path), result.stderr


def test_the_command_without_rqlited_or_go_explains(isolated: Path) -> None:
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    env.pop("RQLITED", None)
    for args in (["rqlited"], ["rqlited", "--no-build"]):
        result = subprocess.run(
            [EXE, *args], capture_output=True, text=True, env=env, timeout=60, check=False
        )
        assert result.returncode == 1 and result.stdout == ""
        assert result.stderr.startswith("error: no usable rqlited")
        assert "docker" in result.stderr and "RQLITED=" in result.stderr
        if args == ["rqlited"] and not any(
            (Path(d) / "go").exists() for d in env["PATH"].split(":")
        ):
            assert "Go is not installed" in result.stderr
