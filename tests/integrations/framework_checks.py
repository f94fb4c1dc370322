"""What the framework tests check in the notes their tasks leave (one line per event,
`start|end KEY N PID TIME`): every step ran to its end, steps of a key started in order, and
never two steps of one key at once (a run cut short by a SIGKILL ends when it was killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Run:
    key: str
    n: int
    pid: int
    start: float
    end: float | None


def read_runs(path: Path) -> dict[str, list[Run]]:
    """Each key's runs in the order they started."""
    starts: list[tuple[str, int, int, float]] = []
    ends: dict[tuple[str, int, int], list[float]] = defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            kind, *fields = line.split()
            if kind not in ("start", "end"):
                continue
            key, n, pid, at = fields
            if kind == "start":
                starts.append((key, int(n), int(pid), float(at)))
            else:
                ends[(key, int(n), int(pid))].append(float(at))
    runs: dict[str, list[Run]] = defaultdict(list)
    for key, n, pid, at in sorted(starts, key=lambda s: s[3]):
        later = [e for e in ends[(key, n, pid)] if e >= at]
        end = min(later) if later else None
        if end is not None:
            ends[(key, n, pid)].remove(end)
        runs[key].append(Run(key, n, pid, at, end))
    return runs


def check_runs(
    path: Path, steps: Mapping[str, int], killed: Mapping[int, float] | None = None
) -> dict[str, list[Run]]:
    """Every step 0..steps[key]-1 of every key ran to its end; per key, runs started in step
    order (a step may run again after a kill, never one before it); no two runs of one key
    overlapped. `killed`: pid -> when it was killed (its unfinished runs end then)."""
    killed = killed or {}
    runs = read_runs(path)
    for key, count in steps.items():
        mine = runs.get(key, [])
        finished = sorted({r.n for r in mine if r.end is not None})
        assert finished == list(range(count)), f"{key}: finished steps {finished} of {count}"
        order = [r.n for r in mine]
        assert order == sorted(order), f"{key}: steps started out of order: {order}"
        previous_end = 0.0
        for run in mine:
            end = run.end if run.end is not None else killed.get(run.pid)
            assert end is not None, f"{key}#{run.n} on pid {run.pid} never ended, not killed"
            assert run.start >= previous_end, f"{key}: two steps at once: {mine}"
            previous_end = end
    return runs


class Processes:
    """Worker processes of a test, each in its own session (a SIGKILL takes its children
    too); all of them stopped at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []
        self.killed: dict[int, float] = {}

    def start(self, argv: list[str], *, cwd: Path, env: Mapping[str, str], log: Path) -> int:
        out = log.open("ab")
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        self.started.append(proc)
        return proc.pid

    def kill(self, pid: int) -> None:
        """SIGKILL the process and everything in its session, as a machine's crash would."""
        os.killpg(pid, signal.SIGKILL)
        self.killed[pid] = time.time()
        for proc in self.started:
            if proc.pid == pid:
                proc.wait(10)

    def stop(self, grace: float = 20.0) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.terminate()  # (the worker stops its own children)
        deadline = time.monotonic() + grace
        for proc in self.started:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def wait_for(what: Callable[[], bool], timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s: {message}")
        time.sleep(0.05)
