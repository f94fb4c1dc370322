"""Start and control real local rqlited clusters (on 127.0.0.1, free ports).

One harness shared by the pytest plugin (`rqlite_queue.testing`, and so the project's tests),
the benchmarks, the demo and `rqlite-queue cluster up`, so that every one of them runs against
a real rqlited started the same way, and none of them can leave a process behind: every
process started here is recorded in a module-level registry and killed at interpreter exit if
nobody stopped it. Importing this module starts and registers nothing; the exit hook is
registered by the first process start.

Typical use::

    with Cluster(3) as c:
        c.wait_ready()
        with from_url(c.url) as queue:
            queue.publish("g", "hello")
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import urllib3
from urllib3.exceptions import HTTPError

from .rqlited import RqlitedNotFound, find_rqlited
from .toxiproxy import ClusterLinks, Links, Toxiproxy, find_toxiproxy, spawn, wait_api

__all__ = [
    "FAST_RAFT_ARGS",
    "Cluster",
    "ClusterError",
    "Links",
    "Node",
    "NodeStartError",
    "PortInUse",
    "RqlitedNotFound",
    "free_port",
    "kill_leftovers",
    "live_pids",
    "rqlited_path",
]

# Faster failure detection than rqlite's 1 s defaults, so fault tests elect a new leader in about
# a second instead of several. hashicorp/raft (v1.7.3 in rqlite v8.43.4) validates the config at
# start and the node exits if: any of the three is < 5 ms, the leader lease timeout is larger
# than the heartbeat timeout (rqlite's "0s" keeps raft's 500 ms default lease, which is why the
# lease must be given explicitly once the heartbeat goes below 500 ms), or the election timeout
# is smaller than the heartbeat timeout. 200/400/200 ms satisfies all of these and is still slow
# enough not to cause spurious elections on a loaded 2-core machine.
FAST_RAFT_ARGS: tuple[str, ...] = (
    "-raft-timeout",
    "200ms",
    "-raft-election-timeout",
    "400ms",
    "-raft-leader-lease-timeout",
    "200ms",
)

_HOST = "127.0.0.1"
# Short per-request timeout for the harness's own probes: a paused (SIGSTOPped) node accepts TCP
# connections (the kernel completes the handshake) but never answers, and a probe must not hang.
_PROBE_TIMEOUT = 2.0
_POLL_INTERVAL = 0.05


class ClusterError(RuntimeError):
    """A node or cluster did not reach the expected state in time."""


class NodeStartError(ClusterError):
    """rqlited exited or did not come up while starting."""


class PortInUse(NodeStartError):
    """rqlited exited because one of its addresses was already bound by another process;
    `address` is that address (`host:port`) when its log names it."""

    def __init__(self, message: str, address: str | None = None) -> None:
        super().__init__(message)
        self.address = address


# rqlited's log lines start with "[component] 2026/01/02 15:04:05 ".
_LOG_PREFIX = re.compile(r"^\[[\w .-]+\] \d{4}/\d\d/\d\d \d\d:\d\d:\d\d(?:\.\d+)? ")
_FAILURE = re.compile(r"fail|fatal|error|panic|cannot|can't|not defined|invalid|denied", re.I)
_TAKEN = re.compile(r"listen tcp (\S+): bind: address already in use")


def exit_reason(log: str) -> str:
    """The line of a failed start's log that says why: the last one that reads like a failure
    (rqlited prints its usage after a bad flag, so the last line is not always it), without
    its component and timestamp; only the lines after the last start's `===` header count."""
    lines = log.split("\n=== ")[-1].splitlines()
    lines = [_LOG_PREFIX.sub("", line).strip() for line in lines if not line.startswith("=== ")]
    lines = [line for line in lines if line]
    failures = [line for line in lines if _FAILURE.search(line)]
    return (failures or lines or ["(nothing in its log)"])[-1]


# ---------------------------------------------------------------------------------------------
# Finding the binary


def rqlited_path() -> str:
    """The usable rqlited `find_rqlited` picks ($RQLITED, the cache, PATH); never builds."""
    return find_rqlited().path


# ---------------------------------------------------------------------------------------------
# Ports

_ports_lock = threading.Lock()
_handed_out_ports: set[int] = set()


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    rqlited cannot be given port 0 (it would advertise ":0" to its peers), so ports are picked
    here first. There is a window in which something else may bind the port; callers retry with
    new ports when rqlited then fails with "address already in use". Ports already handed out by
    this process are never returned again, so two nodes of one process never get the same port
    even if the first has not bound it yet.
    """
    with _ports_lock:
        for _ in range(1000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((_HOST, 0))
                port: int = s.getsockname()[1]
            if port not in _handed_out_ports:
                _handed_out_ports.add(port)
                return port
    raise ClusterError("could not find a free port")


# ---------------------------------------------------------------------------------------------
# Process registry: nothing started here may outlive the interpreter.

_registry_lock = threading.Lock()
_live: dict[int, subprocess.Popen[bytes]] = {}
_live_dirs: set[Path] = set()


_exit_hook_registered = False


def _register(proc: subprocess.Popen[bytes]) -> None:
    global _exit_hook_registered
    with _registry_lock:
        if not _exit_hook_registered:  # at the first start, not on import
            atexit.register(kill_leftovers)
            _exit_hook_registered = True
        # Forget reaped processes so a long-running user (benchmarks) does not accumulate them.
        for pid in [pid for pid, p in _live.items() if p.returncode is not None]:
            del _live[pid]
        _live[proc.pid] = proc


def _stop(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, SIGKILL after `timeout`; reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def live_pids() -> set[int]:
    """PIDs of rqlited processes started by this harness that are still running.

    Reaps any that have exited, so an empty result really means no process (and no zombie) is
    left.
    """
    with _registry_lock:
        procs = list(_live.items())
    alive: set[int] = set()
    for pid, proc in procs:
        if proc.poll() is None:
            alive.add(pid)
        else:
            with _registry_lock:
                _live.pop(pid, None)
    return alive


def kill_leftovers() -> set[int]:
    """SIGKILL every process started here that still runs, remove leftover data directories;
    returns the PIDs killed. Run at interpreter exit, and by the pytest plugin at session end."""
    with _registry_lock:
        procs = list(_live.values())
        dirs = list(_live_dirs)
    killed: set[int] = set()
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()
                killed.add(proc.pid)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            proc.wait(timeout=5)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    return killed


# ---------------------------------------------------------------------------------------------
# HTTP helpers


class _Http:
    """GETs of a node's JSON endpoints, with urllib3 (no proxy from the environment can
    capture 127.0.0.1 traffic: urllib3 reads none)."""

    def __init__(self, timeout: float, verify: bool | str, auth: tuple[str, str] | None) -> None:
        context = ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
        if verify is False:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        self._headers = urllib3.make_headers(basic_auth=":".join(auth)) if auth else {}
        self._pool = urllib3.PoolManager(
            ssl_context=context, timeout=urllib3.Timeout(total=timeout), retries=False
        )

    def get(self, url: str, **params: str) -> tuple[int, Any]:
        """(status, the body read as JSON, or None)."""
        r = self._pool.request("GET", url, fields=params or None, headers=self._headers)
        try:
            return r.status, json.loads(r.data) if r.data else None
        except ValueError:
            return r.status, None

    def __enter__(self) -> _Http:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._pool.clear()


def _client(
    timeout: float = _PROBE_TIMEOUT,
    verify: bool | str = True,
    auth: tuple[str, str] | None = None,
) -> _Http:
    return _Http(timeout, verify, auth)


def _default_tmp_root() -> str | None:
    """/dev/shm when present: rqlite v8 keeps its SQLite file on disk, and tmpfs keeps the
    tests' fsyncs off the real disk."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return str(shm)
    return None


# ---------------------------------------------------------------------------------------------
# Node


class Node:
    """One rqlited process with fixed ports and a data directory that survive restarts."""

    def __init__(
        self,
        node_id: str,
        data_dir: Path | str,
        *,
        binary: str | None = None,
        http_port: int | None = None,
        raft_port: int | None = None,
        join: str | None = None,
        extra_args: Sequence[str] = (),
        log_path: Path | str | None = None,
        tls: tuple[str, str, str] | None = None,
        auth: tuple[str, str] | None = None,
        host: str = _HOST,
        wrapper: Sequence[str] = (),
        raft_adv_port: int | None = None,
        http_adv_port: int | None = None,
    ) -> None:
        """`tls` = (cert file, key file, CA file) serves HTTPS; `auth` = the (user, password)
        the harness's own probes send when rqlited runs with `-auth`. `host` is the address
        both ports bind and advertise; `wrapper` is a command prefix that execs rqlited (e.g.
        `ip netns exec NS`, to run the node in its own network namespace: the chaos tests
        partition nodes that way). The wrapper must exec, not fork, so the PID stays rqlited's.
        `raft_adv_port`, `http_adv_port`: the ports on `host` it advertises instead of its own
        (`-raft-adv-addr`, `-http-adv-addr`: a proxy in front of each, see `Links`); the
        harness's own probes always go to its own HTTP port."""
        self.node_id = node_id
        self.host = host
        self.wrapper = tuple(wrapper)
        self.tls = tls
        self.auth = auth
        self.binary = binary if binary is not None else rqlited_path()
        self.data_dir = Path(data_dir)
        # Ports we picked may be re-picked on a clash at first start; ports given are kept.
        self._may_repick_ports = http_port is None and raft_port is None
        self.http_port = http_port if http_port is not None else free_port()
        self.raft_port = raft_port if raft_port is not None else free_port()
        self.raft_adv_port = raft_adv_port
        self.http_adv_port = http_adv_port
        self.join = join
        self.extra_args = tuple(extra_args)
        # In the data dir's parent, so the log survives wiping the data dir and is not mistaken
        # for rqlite data; a file, not a pipe, so a chatty node can never block on a full pipe.
        self.log_path = (
            Path(log_path) if log_path is not None else self.data_dir.parent / f"{self.node_id}.log"
        )
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False
        self._started_once = False
        # Set by stop()/kill(), so an exit we caused is not mistaken for a crash.
        self.exit_expected = False

    def __repr__(self) -> str:
        state = "running" if self.is_running else "stopped"
        if self.paused:
            state = "paused"
        return f"Node({self.node_id!r}, {self.http_url}, raft={self.raft_addr}, {state})"

    # -- addresses --

    @property
    def http_addr(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def http_url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.http_addr}"

    def _client(self, timeout: float) -> _Http:
        verify: bool | str = self.tls[2] if self.tls else True
        return _client(timeout, verify=verify, auth=self.auth)

    @property
    def raft_addr(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def raft_adv_addr(self) -> str:
        """The Raft address its peers know it by (a proxy's, with links)."""
        port = self.raft_adv_port if self.raft_adv_port is not None else self.raft_port
        return f"{self.host}:{port}"

    @property
    def client_url(self) -> str:
        """The HTTP URL clients are given (a proxy's, when the clients' HTTP goes through one);
        `http_url` is the node's own port."""
        if self.http_adv_port is None:
            return self.http_url
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.http_adv_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def is_running(self) -> bool:
        """True while the process exists (also while paused)."""
        return self.process is not None and self.process.poll() is None

    @property
    def crashed(self) -> bool:
        """The process exited without stop()/kill() asking it to (e.g. a fatal startup error)."""
        return (
            self.process is not None and self.process.poll() is not None and not self.exit_expected
        )

    def command(self) -> list[str]:
        cmd = [
            *self.wrapper,
            self.binary,
            "-node-id",
            self.node_id,
            "-http-addr",
            self.http_addr,
            "-raft-addr",
            self.raft_addr,
        ]
        if self.raft_adv_port is not None:
            cmd += ["-raft-adv-addr", self.raft_adv_addr]
        if self.http_adv_port is not None:
            cmd += ["-http-adv-addr", f"{self.host}:{self.http_adv_port}"]
        if self.join:
            cmd += ["-join", self.join]
        if self.tls:
            cmd += ["-http-cert", self.tls[0], "-http-key", self.tls[1]]
        cmd += list(self.extra_args)
        cmd.append(str(self.data_dir))
        return cmd

    # -- lifecycle --

    def start(self, timeout: float = 30.0) -> None:
        """Launch rqlited and wait until its HTTP API answers (not until it has a leader).

        On the very first start of a node whose ports were picked here, an "address already in
        use" failure is retried with fresh ports and a wiped data dir; a restart keeps its ports
        (its peers know it by them) and raises `PortInUse` instead.
        """
        if self.is_running:
            return
        attempts = 5 if (self._may_repick_ports and not self._started_once) else 1
        for attempt in range(attempts):
            try:
                self._start_once(timeout)
            except PortInUse:
                if attempt == attempts - 1:
                    raise
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self.http_port, self.raft_port = free_port(), free_port()
            else:
                self._started_once = True
                return

    def _start_once(self, timeout: float) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, TZ="UTC")
        with open(self.log_path, "ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} {' '.join(self.command())}\n".encode())
            log.flush()
            proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                close_fds=True,
            )
        _register(proc)
        self.process = proc
        self.paused = False
        self.exit_expected = False
        try:
            self._wait_http(timeout)
        except BaseException:
            self.kill()
            raise

    def _wait_http(self, timeout: float) -> None:
        """Wait until *our* process serves HTTP: /status must report our PID, so a stranger
        that happens to hold the port is never mistaken for this node."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        with self._client(1.0) as client:
            while True:
                rc = self.process.poll()
                if rc is not None:
                    self.process.wait()
                    raise self.start_failure(f"exited with code {rc} at start")
                try:
                    status, body = client.get(f"{self.http_url}/status", key="os")
                    if status == 200 and (body or {}).get("pid") == self.process.pid:
                        return
                except (HTTPError, OSError, AttributeError):
                    pass
                if time.monotonic() > deadline:
                    raise NodeStartError(
                        f"rqlited {self.node_id} did not serve HTTP within {timeout}s:\n"
                        + self.log_tail(30)
                    )
                time.sleep(_POLL_INTERVAL)

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful stop: SIGTERM (a leader steps down first), SIGKILL after `timeout`."""
        proc = self.process
        if proc is None:
            return
        self.exit_expected = True
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
                # A stopped process would not act on SIGTERM until continued.
                proc.send_signal(signal.SIGCONT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self.paused = False

    def kill(self) -> None:
        """Crash the node: SIGKILL (works even when paused) and reap it."""
        proc = self.process
        if proc is None:
            return
        self.exit_expected = True
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        proc.wait()
        self.paused = False

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): to its peers it looks like a hung or partitioned node.
        Returns once the kernel has stopped it (on a loaded machine that can take a while, and
        a node that still answers meanwhile would make a fault test prove nothing)."""
        if not self.is_running:
            raise ClusterError(f"{self.node_id} is not running")
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.paused = True
        stat = Path(f"/proc/{self.process.pid}/stat")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                state = stat.read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return  # no procfs here: nothing to wait on
            if state in ("T", "t"):
                return
            time.sleep(0.001)
        raise ClusterError(f"{self.node_id} did not stop within 5 s of SIGSTOP")

    def resume(self) -> None:
        """Continue a paused process (SIGCONT)."""
        if not self.is_running:
            raise ClusterError(f"{self.node_id} is not running")
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)
        self.paused = False

    def restart(self, timeout: float = 30.0) -> None:
        """Start again on the same data dir and ports (stopping first if still running).

        The node rejoins from its own Raft state, so no -join is needed, but the flag is kept:
        rqlite ignores it when the node already has cluster state.
        """
        if self.is_running:
            self.stop()
        self.start(timeout)

    # -- inspection --

    def status(self, timeout: float = _PROBE_TIMEOUT) -> dict[str, Any]:
        """GET /status of this node."""
        with self._client(timeout) as client:
            status, body = client.get(f"{self.http_url}/status")
            if status != 200 or not isinstance(body, dict):
                raise HTTPError(f"/status of node {self.node_id} answered HTTP {status}")
            return body

    def is_ready(self, timeout: float = _PROBE_TIMEOUT) -> bool:
        """GET /readyz is 200: the node is up, knows a contactable leader and its store is open."""
        try:
            with self._client(timeout) as client:
                return client.get(f"{self.http_url}/readyz", timeout=f"{timeout}s")[0] == 200
        except (HTTPError, OSError):
            return False

    def start_failure(self, what: str) -> NodeStartError:
        """The error of a start that failed: its first line says why in rqlited's words (the
        last failure its log shows), the lines after it are the log's tail."""
        tail = self.log_tail(30)
        reason = exit_reason(tail)
        message = f"rqlited {self.node_id} {what}: {reason}\n{tail}"
        if "address already in use" in tail:
            taken = _TAKEN.search(reason) or _TAKEN.search(tail)
            return PortInUse(message, taken.group(1) if taken else None)
        return NodeStartError(message)

    def log_tail(self, lines: int = 50) -> str:
        """Last lines of this node's log, for error messages."""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no log)"
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# Cluster


class Cluster:
    """N local rqlited nodes forming one Raft cluster, in a temp dir removed on stop.

    Node ids are n1..nN. `extra_args` go after the fast Raft flags, so they can override them
    (Go's flag package keeps the last value). A Cluster is single-use: start, then stop.
    """

    def __init__(
        self,
        n: int = 3,
        binary: str | None = None,
        base_dir: Path | str | None = None,
        extra_args: Iterable[str] = (),
        fast: bool = True,
        tls: tuple[str, str, str] | None = None,
        auth: tuple[str, str] | None = None,
        hosts: Sequence[str] | None = None,
        wrappers: Sequence[Sequence[str]] | None = None,
        data_dir: Path | str | None = None,
        http_port: int | None = None,
        links: Links | bool | None = None,
    ) -> None:
        """`tls` and `auth` as for `Node` (a cluster with `-auth` must also let its nodes join:
        pass `-join-as USER` in `extra_args`); `hosts` and `wrappers`, one per node, are each
        node's `host` and `wrapper` (default: all on 127.0.0.1, no wrapper).

        `data_dir`: the nodes keep their data there, and it is not removed on stop; a cluster
        started again on it (same `n`) is the same cluster, with the same ports and the same
        data (the ports are recorded in `cluster.json` inside). `http_port`: node i listens
        for HTTP on `http_port + 2(i-1)` and for Raft on the port above (4001, 4002, 4003...,
        as rqlite's own examples); by default ports are picked free.

        `links` (a `Links`, or True for `Links()`): each node's Raft traffic, and the clients'
        HTTP unless `Links(http=False)`, goes through a proxy of a toxiproxy server the cluster
        starts and stops (its binary: `rqlite-queue toxiproxy`); `cluster.links` then sets and
        clears latency, silence, resets... on each link. Not with `data_dir` or `hosts`."""
        if n < 1:
            raise ValueError("a cluster needs at least one node")
        if (hosts is not None and len(hosts) != n) or (wrappers is not None and len(wrappers) != n):
            raise ValueError("hosts and wrappers need one entry per node")
        self.hosts = list(hosts) if hosts is not None else [_HOST] * n
        self.wrappers = [tuple(w) for w in wrappers] if wrappers is not None else [()] * n
        self.n = n
        self.binary = binary
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.extra_args = tuple(extra_args)
        self.fast = fast
        self.tls = tls
        self.auth = auth
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.http_port = http_port
        self.link_spec = Links() if links is True else links or None
        if self.link_spec is not None and (data_dir is not None or hosts is not None):
            raise ValueError("links are for clusters on 127.0.0.1 in a temp dir")
        self.links: ClusterLinks | None = None
        """The cluster's links by node id, once started with `links`."""
        self._toxiproxy: subprocess.Popen[bytes] | None = None
        self.dir: Path | None = None
        self.nodes: list[Node] = []

    def __repr__(self) -> str:
        return f"Cluster(n={self.n}, dir={self.dir}, nodes={self.nodes})"

    def _ports(self) -> tuple[list[tuple[int | None, int | None]], bool]:
        """Each node's (HTTP, Raft) ports (None: pick one), and whether the cluster exists
        already in `data_dir` (a restart: every node starts at once, no join)."""
        if self.data_dir is not None:
            record = self.data_dir / "cluster.json"
            if record.is_file():
                known = json.loads(record.read_text())
                if known.get("n") != self.n:
                    raise ClusterError(
                        f"{self.data_dir} holds a {known.get('n')}-node cluster, not {self.n}"
                    )
                return [(int(h), int(r)) for h, r in known["ports"]], True
        if self.http_port is not None:
            return [
                (self.http_port + 2 * i, self.http_port + 2 * i + 1) for i in range(self.n)
            ], False
        return [(None, None)] * self.n, False

    def _record(self) -> None:
        if self.data_dir is not None:
            ports = [[node.http_port, node.raft_port] for node in self.nodes]
            (self.data_dir / "cluster.json").write_text(json.dumps({"n": self.n, "ports": ports}))

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- addresses --

    @property
    def urls(self) -> list[str]:
        """The nodes' URLs for clients (through their HTTP links, when the cluster has them)."""
        return [node.client_url for node in self.nodes]

    @property
    def url(self) -> str:
        """All HTTP URLs comma-joined: the form clients take for a list of seed nodes."""
        return ",".join(self.urls)

    def node(self, node_id: str) -> Node:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(node_id)

    # -- lifecycle --

    def start(self, timeout: float = 30.0) -> Self:
        """Start node 1, then join the others through its Raft address, then wait until ready.

        If anything fails, every node started so far is stopped and the directory removed before
        the error propagates.
        """
        if self.nodes:
            raise ClusterError("a Cluster can be started only once; make a new one")
        binary = self.binary if self.binary is not None else rqlited_path()
        self.binary = binary
        ports, restart = self._ports()
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            self.dir = self.data_dir
        else:
            root = str(self.base_dir) if self.base_dir is not None else _default_tmp_root()
            if self.base_dir is not None:
                self.base_dir.mkdir(parents=True, exist_ok=True)
            self.dir = Path(tempfile.mkdtemp(prefix="rqlite-queue-", dir=root))
            with _registry_lock:
                _live_dirs.add(self.dir)
        args = (*FAST_RAFT_ARGS, *self.extra_args) if self.fast else self.extra_args
        try:
            links = self._start_links() if self.link_spec is not None else None
            for i in range(1, self.n + 1):
                raft_link = http_link = None
                if links is not None:
                    raft_link = links.api.create(f"n{i}-raft", f"{_HOST}:0", f"{_HOST}:1")
                    links.raft[f"n{i}"] = raft_link
                    if links.spec.http:
                        http_link = links.api.create(f"n{i}-http", f"{_HOST}:0", f"{_HOST}:1")
                        links.http[f"n{i}"] = http_link
                node = Node(
                    f"n{i}",
                    self.dir / f"n{i}",
                    binary=binary,
                    join=None if i == 1 or restart else self.nodes[0].raft_adv_addr,
                    extra_args=args,
                    tls=self.tls,
                    auth=self.auth,
                    host=self.hosts[i - 1],
                    wrapper=self.wrappers[i - 1],
                    http_port=ports[i - 1][0],
                    raft_port=ports[i - 1][1],
                    raft_adv_port=raft_link.port if raft_link is not None else None,
                    http_adv_port=http_link.port if http_link is not None else None,
                )
                self.nodes.append(node)
                if raft_link is not None:
                    raft_link.retarget(node.raft_addr)
                if http_link is not None:
                    http_link.retarget(node.http_addr)
                node.start(timeout)
                if raft_link is not None and raft_link.upstream != node.raft_addr:
                    raft_link.retarget(node.raft_addr)  # it started on other ports
                if http_link is not None and http_link.upstream != node.http_addr:
                    http_link.retarget(node.http_addr)
                if i == 1 and not restart:
                    # Joining before node 1 has elected itself fails with "no leader" and the
                    # joiner then sleeps its -join-interval (3 s by default) before retrying.
                    self.wait_ready(timeout)
            self.wait_ready(timeout)
            self._record()
            if links is not None and links.rtt > 0:
                links.latency(links.rtt, links.jitter)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_links(self) -> ClusterLinks:
        """The toxiproxy server, its API on a free port; registered like the nodes, so it is
        stopped with them or at exit."""
        assert self.link_spec is not None and self.dir is not None
        binary = find_toxiproxy()
        port = free_port()
        proc = spawn(binary, port, self.dir / "toxiproxy.log")
        _register(proc)
        self._toxiproxy = proc
        log = self.dir / "toxiproxy.log"

        def context() -> str:
            state = "running" if proc.poll() is None else f"exited with code {proc.returncode}"
            try:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            except OSError:
                tail = "(no log)"
            return f"the toxiproxy server (pid {proc.pid}) {state}; its log ends:\n{tail}"

        api = Toxiproxy(f"http://{_HOST}:{port}", context=context)
        wait_api(api, proc)
        self.links = ClusterLinks(api, self.link_spec)
        return self.links

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every node (SIGTERM to all at once, SIGKILL after `timeout`) and remove the
        directory. Idempotent.

        All nodes are signalled together: stopping them one by one makes each last leader try
        to step down to peers that are already gone. The links' toxiproxy goes first: a node
        stopping waits for its Raft calls in flight, and one through a proxy whose far end is
        gone gets no reset, only its 10 s read timeout (every test cluster with links took
        9-10 s to stop; 0.1 s with the proxy stopped first).
        """
        if self._toxiproxy is not None:
            if self.links is not None:
                self.links.api.close()
            _stop(self._toxiproxy, timeout)
            self._toxiproxy = None
        for node in self.nodes:
            node.exit_expected = True
        procs = [n.process for n in self.nodes if n.process is not None]
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
                    proc.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + timeout
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for node in self.nodes:
            node.paused = False
        if self.dir is not None and self.data_dir is None:
            shutil.rmtree(self.dir, ignore_errors=True)
            with _registry_lock:
                _live_dirs.discard(self.dir)

    # -- state --

    def running(self) -> list[Node]:
        """Nodes whose process exists and is not paused, i.e. that can answer requests."""
        return [n for n in self.nodes if n.is_running and not n.paused]

    def _leader_once(self) -> Node | None:
        """The leader if every answering node agrees on it and it says so itself, else None.

        Several nodes are asked because a node that was cut off (paused, or the old leader
        just after a failover) can report a stale leader for a while.
        """
        by_id = {n.node_id: n for n in self.nodes}
        by_raft = {n.raft_adv_addr: n for n in self.nodes}
        claimed: set[str] = set()
        self_leaders: set[str] = set()
        for node in self.running():
            try:
                store = node.status()["store"]
            except (HTTPError, OSError, ValueError, KeyError):
                continue
            leader = store.get("leader") or {}
            target = by_id.get(leader.get("node_id", "")) or by_raft.get(leader.get("addr", ""))
            if target is not None:
                claimed.add(target.node_id)
            if store.get("raft", {}).get("state") == "Leader":
                self_leaders.add(node.node_id)
        if len(claimed) == 1 and claimed == self_leaders:
            leader_node = by_id[claimed.pop()]
            if leader_node.is_running and not leader_node.paused:
                return leader_node
        return None

    def leader(self, timeout: float = 10.0) -> Node:
        """The current leader, polling until the answering nodes agree on one."""
        deadline = time.monotonic() + timeout
        while True:
            found = self._leader_once()
            if found is not None:
                return found
            if time.monotonic() > deadline:
                raise ClusterError(f"no agreed leader within {timeout}s: {self.nodes}")
            time.sleep(_POLL_INTERVAL)

    def followers(self, timeout: float = 10.0) -> list[Node]:
        """Running nodes (paused ones included) other than the leader."""
        leader = self.leader(timeout)
        return [n for n in self.nodes if n.is_running and n is not leader]

    def wait_ready(self, timeout: float = 30.0) -> Node:
        """Wait until every running, unpaused node's /readyz is 200 and a leader is agreed on.

        Returns the leader. Raises at once if a node crashed (rather than timing out), e.g. when
        rqlited rejected its flags after its HTTP server was already up.
        """
        deadline = time.monotonic() + timeout
        while True:
            for n in self.nodes:
                if n.crashed:
                    rc = n.process.returncode if n.process is not None else None
                    raise n.start_failure(f"exited with code {rc}")
            nodes = self.running()
            if nodes and all(n.is_ready() for n in nodes):
                leader = self._leader_once()
                if leader is not None:
                    return leader
            if time.monotonic() > deadline:
                states = {n.node_id: n.is_ready() for n in nodes}
                raise ClusterError(f"cluster not ready within {timeout}s: readyz={states}")
            time.sleep(_POLL_INTERVAL)
