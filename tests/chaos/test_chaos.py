"""The chaos suite: a short run in every test run; the long one with `make chaos`, which also
writes its summary to docs/reliability.md."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from .engine import Config, Op, check, run

ROOT = Path(__file__).resolve().parents[2]


def test_short_chaos_run(rqlited_binary: str, tmp_path: Path) -> None:
    config = Config(
        seed=int(os.environ.get("CHAOS_SEED", "7")),
        groups=40,
        messages=8,
        thread_workers=3,
        task_workers=2,
        process_workers=1,
        publishers=2,
        faults=4,
        fault_gap=(1.0, 2.0),
        time_limit=240,
    )
    report = run(config, rqlited_binary, tmp_path)
    print(report.summary())
    assert report.ok, report.summary()
    assert report.faults, "the nemesis injected nothing: the run proves nothing"


@pytest.mark.slow
def test_long_chaos_run(rqlited_binary: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED", "20261129"))
    config = Config(seed=seed, faults=int(os.environ.get("CHAOS_FAULTS", "30")))
    report = run(config, rqlited_binary, tmp_path)
    summary = report.summary()
    print(summary)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    (ROOT / "docs" / "reliability.md").write_text(
        "# Reliability: the latest long chaos run\n\n"
        f"Command: `make chaos CHAOS_SEED={seed}` (at commit {commit}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores).\n\n"
        "A 3-node rqlite cluster (fast Raft timers: heartbeat 200 ms, election 400 ms); "
        "publishers with dedup ids; workers in threads, asyncio tasks and processes "
        "(visibility 2 s); a nemesis that kill -9s the leader (then restarts it) or SIGSTOPs "
        "the leader or a follower for 0.8-2 s. What the checker verifies is in "
        "`tests/chaos/engine.py` (`check`).\n\n```\n" + summary + "\n```\n"
    )
    assert report.ok, summary


# The checker must be able to fail: feed it logs with each kind of violation.


def _claim(actor: str, i: int, t: float, seq: int, until: float) -> Op:
    return Op("claim", actor, t, t + 0.01, "ok", "g", i, seq, 1, until)


def _ack(actor: str, i: int, t: float, seq: int, outcome: str = "ok") -> Op:
    return Op("ack", actor, t, t + 0.01, outcome, "g", i, seq)


def _publish(i: int) -> Op:
    return Op("publish", "pub", 0, 0.001, "ok", "g", i, i + 1)


def _report(ops: list[Op]) -> object:
    return check(Config(groups=1, messages=2), ops, [], True, "", 0)


def test_checker_passes_a_clean_log() -> None:
    ops = [_publish(0), _publish(1), _claim("a", 0, 1, 1, 3), _ack("a", 0, 1.1, 1),
           _claim("b", 1, 1.2, 2, 3.2), _ack("b", 1, 1.3, 2)]  # fmt: skip
    assert _report(ops).ok  # type: ignore[attr-defined]


def test_checker_catches_loss_order_exclusivity_and_unfenced_acks() -> None:
    lost = [_publish(0), _publish(1), _claim("a", 0, 1, 1, 3), _ack("a", 0, 1.1, 1)]
    assert _report(lost).lost == [("g", 1)]  # type: ignore[attr-defined]
    early = [_publish(0), _publish(1), _claim("a", 0, 1, 1, 3), _claim("b", 1, 1.05, 2, 3),
             _ack("a", 0, 1.1, 1), _ack("b", 1, 1.2, 2)]  # fmt: skip
    assert _report(early).order_violations  # type: ignore[attr-defined]
    double = [_publish(0), _publish(1), _claim("a", 0, 1, 1, 3), _claim("b", 0, 1.5, 1, 3.5),
              _ack("a", 0, 2, 1), _ack("b", 0, 2.1, 1, "lease_lost"),
              _claim("b", 1, 2.2, 2, 4), _ack("b", 1, 2.3, 2)]  # fmt: skip
    assert _report(double).exclusivity_violations  # type: ignore[attr-defined]
    unfenced = [_publish(0), _publish(1), _claim("a", 0, 1, 1, 3), _claim("b", 0, 3.5, 1, 5.5),
                _ack("a", 0, 4, 1), _ack("b", 0, 4.1, 1, "lease_lost"),
                _claim("b", 1, 4.2, 2, 6), _ack("b", 1, 4.3, 2)]  # fmt: skip
    assert _report(unfenced).unfenced_violations  # type: ignore[attr-defined]
