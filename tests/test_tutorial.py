"""docs/tutorial.md run as written: its shell blocks in order, in a temporary directory, on
real rqlited nodes started by the page's own `rqlite-queue cluster up`.

The page says how each block is run, in an HTML comment just before it:
`<!-- run: background NAME until TEXT -->` (a command left running in a terminal of its own:
started, then awaited until TEXT is in its output; a later block of the same NAME is typed
after Ctrl-C in that terminal), `<!-- run: until TEXT -->` (typed again until its output holds
TEXT: the page says to wait), `<!-- run: skip ... -->` (the install). Every other block runs
once and must succeed; exported variables carry over from block to block as in one shell. A
```python title="FILE"``` block is saved as FILE. The only changes to the commands: the
page's ports (the cluster's 4001/4003/4005, the dashboard's 8321) become free ones."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from rqlite_queue.testing import free_port

PAGE = Path(__file__).resolve().parent.parent / "docs" / "tutorial.md"
BIN = Path(sys.executable).parent


@dataclass
class Block:
    kind: str  # "sh" or "python"
    text: str
    run: str  # the marker's words ("" without one)
    title: str | None = None


def blocks() -> list[Block]:
    found: list[Block] = []
    marker = ""
    pattern = re.compile(
        r"<!-- run: (?P<run>.*?) -->|```(?P<kind>sh|python)(?P<info>[^\n]*)\n(?P<text>.*?)```",
        re.DOTALL,
    )
    for match in pattern.finditer(PAGE.read_text()):
        if match["run"] is not None:
            marker = match["run"].strip()
            continue
        title = re.search(r'title="([^"]+)"', match["info"])
        found.append(Block(match["kind"], match["text"], marker, title and title.group(1)))
        marker = ""
    return found


def free_range(count: int) -> int:
    """The first of `count` consecutive free ports (cluster up --http-port P uses P..P+2N-1)."""
    for _ in range(200):
        base = free_port()
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise AssertionError("no free port range")


def test_the_page_has_the_tutorials_steps() -> None:
    text = " ".join(b.text for b in blocks())
    for step in (
        "rqlite-queue cluster up 3",
        "rqlite-queue publish",
        "rqlite-queue worker app:handle",
        "rqlite-queue dashboard",
        "rqlite-queue dlq list",
        "rqlite-queue dlq requeue",
    ):
        assert step in text


def test_the_tutorial_runs_as_written(rqlited_path: str, tmp_path: Path) -> None:
    base = free_range(6)
    ports = {"4001": base, "4003": base + 2, "4005": base + 4, "8321": free_port()}

    def local(command: str) -> str:
        for port, mapped in ports.items():
            command = re.sub(rf"\b{port}\b", str(mapped), command)
        return command

    env = {k: v for k, v in os.environ.items() if not k.startswith("RQLITE_QUEUE_")}
    env |= {"RQLITED": rqlited_path, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"}
    exported = tmp_path / ".exported"
    exported.write_text("")
    running: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    logs: dict[str, list[str]] = {}

    def stop(name: str) -> int:
        proc, log = running.pop(name)
        proc.send_signal(signal.SIGINT)  # Ctrl-C in its terminal
        try:
            code = proc.wait(timeout=45)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{name} did not stop on Ctrl-C:\n{log.read_text()}") from None
        logs.setdefault(name, []).append(log.read_text())
        return code

    def shell(text: str) -> subprocess.CompletedProcess[str]:
        script = f"set -e\nsource {exported}\n{text}\nexport -p > {exported}\n"
        return subprocess.run(
            ["bash", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    try:
        for i, block in enumerate(blocks()):
            if block.run.startswith("skip"):
                continue
            if block.kind == "python":
                assert block.title is not None, block.text
                (tmp_path / block.title).write_text(block.text)
                continue
            command = local(block.text.strip())
            background = re.fullmatch(r"background (\S+) until (.+)", block.run)
            if background is not None:
                name, ready = background.groups()
                if name in running:
                    assert stop(name) == 0, logs[name][-1]
                assert "\n" not in command, command
                log = tmp_path / f".{name}-{i}.log"
                proc = subprocess.Popen(
                    ["bash", "-c", f"source {exported}\nexec {command}"],
                    cwd=tmp_path,
                    env=env,
                    stdout=log.open("wb"),
                    stderr=subprocess.STDOUT,
                )
                running[name] = (proc, log)
                deadline = time.monotonic() + 60
                while ready not in log.read_text():
                    assert proc.poll() is None, f"{command} exited:\n{log.read_text()}"
                    assert time.monotonic() < deadline, f"no {ready!r}:\n{log.read_text()}"
                    time.sleep(0.1)
                continue
            wait_for = block.run.removeprefix("until ").strip() if block.run else None
            deadline = time.monotonic() + 30
            while True:
                done = shell(command)
                assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
                if wait_for is None or wait_for in done.stdout:
                    break
                assert time.monotonic() < deadline, f"{command}: no {wait_for!r}:\n{done.stdout}"
                time.sleep(0.5)
            if "dlq list" in command:  # what the page says the dashboard shows meanwhile
                page = httpx.get(f"http://127.0.0.1:{ports['8321']}/dead", timeout=10)
                assert page.status_code == 200 and "order-3" in page.text
        # The worker's terminals: the first handled the three messages in order, and failed
        # the fourth three times; the second handled it once requeued.
        assert stop("worker") == 0
        first, second = logs["worker"]
        # (By pattern, not by line: two handler threads' prints may share a line.)
        handled = re.findall(r"order-\d+: \w+ \(attempt \d+\)", first)
        assert "order-1: charge (attempt 1)" in handled, first
        assert handled.index("order-1: charge (attempt 1)") < handled.index(
            "order-1: ship (attempt 1)"
        ), first
        assert "order-2: charge (attempt 1)" in handled
        assert first.count("ValueError: unknown step: refund") >= 3
        assert "order-3: refund (attempt 1)" in re.findall(
            r"order-\d+: \w+ \(attempt \d+\)", second
        ), second
    finally:
        for name in list(running):
            stop(name)
