"""From `pip install` to a running cluster, as a new user does it (slow: `make test-install`,
which `make test` runs).

The wheel is built from this checkout and installed into a fresh virtualenv in an empty folder,
with an empty HOME (so no rqlite-queue cache, no pip cache). Go's own module and build caches
are kept (a from-scratch rqlite build takes many minutes on two cores; what is tested is that
the installed command finds Go, builds the tested release from rqlite's module into its cache,
and everything after uses it). Without Go on this machine, the project's rqlited is put on PATH
instead, and the command must find it there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = Path(__file__).resolve().parent / "sample_project" / "test_sample.py"

pytestmark = pytest.mark.slow


class Sandbox:
    """A fresh virtualenv in an empty folder, and the environment its commands run in."""

    def __init__(self, root: Path, rqlited_path: str) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir()
        self.venv = root / "venv"
        go = shutil.which("go")
        path = [str(self.venv / "bin"), "/usr/bin", "/bin"]
        if go is not None:
            path.insert(1, str(Path(go).parent))
        else:  # the command must then find one on PATH
            bin_dir = root / "bin"
            bin_dir.mkdir()
            (bin_dir / "rqlited").symlink_to(rqlited_path)
            path.insert(1, str(bin_dir))
        drop = {"RQLITED", "RQLITE_QUEUE_CACHE", "XDG_CACHE_HOME", "VIRTUAL_ENV", "PYTHONPATH"}
        self.env = {k: v for k, v in os.environ.items() if k not in drop and "QUEUE_URL" not in k}
        self.env.update(HOME=str(self.home), PATH=":".join(path), COLUMNS="200", TZ="UTC")
        if go is not None:
            for name in ("GOCACHE", "GOMODCACHE", "GOPATH", "GOPROXY", "GOFLAGS", "GONOSUMDB"):
                value = subprocess.run(
                    [go, "env", name], capture_output=True, text=True, check=True
                ).stdout.strip()
                if value:
                    self.env[name] = value
        self.go = go is not None

    def run(
        self, *args: str | Path, cwd: Path | None = None, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(a) for a in args],
            cwd=cwd or self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run(self.venv / "bin" / "rqlite-queue", *args, timeout=timeout)

    def python(self, code: str) -> str:
        return self.run(self.venv / "bin" / "python", "-c", code).stdout


def rqlited_pids_of(data_dir: Path) -> set[int]:
    """The rqlited processes whose command line names `data_dir` (ours, started via the CLI)."""
    pids: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"rqlited") and str(data_dir).encode() in b" ".join(argv):
            pids.add(int(proc.name))
    return pids


class ClusterUp:
    """`rqlite-queue cluster up 3 --data-dir D` in the background, until stop()."""

    def __init__(self, sandbox: Sandbox, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.proc = subprocess.Popen(
            [sandbox.venv / "bin" / "rqlite-queue", "cluster", "up", "3", "--data-dir", data_dir],
            cwd=sandbox.root,
            env=sandbox.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.output: list[str] = []
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            if line.startswith("use: --url "):
                self.url = line.split()[-1]
                return
        raise AssertionError("cluster up ended early:\n" + "".join(self.output))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.output.append(self.proc.stdout.read())
            self.proc.stdout.close()
        for pid in rqlited_pids_of(self.data_dir):  # only if cluster up failed to stop them
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def cluster_ups() -> Iterator[list[ClusterUp]]:
    started: list[ClusterUp] = []
    try:
        yield started
    finally:
        for up in started:
            up.stop()


def test_from_a_wheel_to_a_cluster_and_a_users_tests(
    tmp_path: Path, rqlited_path: str, cluster_ups: list[ClusterUp]
) -> None:
    dist = tmp_path / "dist"
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*build, "-w", str(dist), str(ROOT)], check=True, capture_output=True, timeout=300
    )
    (wheel,) = dist.glob("rqlite_queue-*.whl")
    root = tmp_path / "empty"
    root.mkdir()
    sandbox = Sandbox(root, rqlited_path)
    sandbox.run(sys.executable, "-m", "venv", sandbox.venv)
    sandbox.run(sandbox.venv / "bin" / "pip", "install", "-q", wheel, "pytest")

    # The command works on a plain install.
    assert sandbox.cli("--help").stdout.startswith("Usage: rqlite-queue")

    # rqlited: built into the empty HOME's cache (with Go), or found on PATH (without).
    found = sandbox.cli("rqlited", timeout=1200)
    path = found.stdout.strip()
    if sandbox.go:
        assert path == str(sandbox.home / ".cache" / "rqlite-queue" / "v8.43.4" / "rqlited")
        assert "building rqlited v8.43.4" in found.stderr
    else:
        assert path == str(root / "bin" / "rqlited")
    assert sandbox.cli("rqlited").stdout.strip() == path  # and found again, not rebuilt

    # A kept cluster: publish two, claim and ack one, stop, start again, the other is there.
    data = root / "queue-data"
    up = ClusterUp(sandbox, data)
    cluster_ups.append(up)
    sandbox.cli("--url", up.url, "publish", "order-1", '{"step": "charge"}')
    sandbox.cli("--url", up.url, "publish", "order-1", '{"step": "ship"}')
    claimed = sandbox.python(
        "from rqlite_queue import from_url\n"
        f"with from_url({up.url!r}) as q:\n"
        "    lease = q.claim('w1', visibility=30)\n"
        "    q.ack(lease)\n"
        "    print(lease.event['step'])\n"
    )
    assert claimed.strip() == "charge"
    up.stop()
    assert up.proc.returncode == 0, "".join(up.output)
    assert not rqlited_pids_of(data)

    again = ClusterUp(sandbox, data)
    cluster_ups.append(again)
    assert again.url == up.url  # the same cluster, on the same ports
    stats = json.loads(sandbox.cli("--url", again.url, "stats", "--json").stdout)
    assert stats["depth"] == 1
    peek = sandbox.cli("--url", again.url, "peek", "order-1", "--json").stdout
    assert [json.loads(line)["event"] for line in peek.splitlines()] == [{"step": "ship"}]
    again.stop()
    assert again.proc.returncode == 0, "".join(again.output)

    # The demo runs on rqlite (its own 3-node cluster), not on SQLite.
    demo = sandbox.cli("demo", "--groups", "6", "--messages", "3", "--seed", "1", timeout=300)
    assert "rqlite v8.43.4, 3 nodes" in demo.stdout, demo.stdout
    assert "sqlite" not in demo.stdout.lower()
    assert "OK" in [line.split()[-1] for line in demo.stdout.splitlines() if "result" in line]

    # A user's test file, on the plugin's fixtures alone, under plain pytest.
    project = root / "my-project"
    project.mkdir()
    shutil.copy(SAMPLE, project / "test_my_handlers.py")
    tests = sandbox.run(
        sandbox.venv / "bin" / "pytest", "-q", "-p", "no:cacheprovider", cwd=project
    )
    assert "4 passed" in tests.stdout, tests.stdout
    assert not rqlited_pids_of(root)
