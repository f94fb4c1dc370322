"""A throwaway local PostgreSQL server, for peer benchmarks.

`LocalPostgres()` starts a fresh server from Debian's packages (installing them once if they are
missing), listening only on 127.0.0.1 on a port picked at run time, with its data on /dev/shm
when that is writable. The server keeps PostgreSQL's durability defaults (fsync and
synchronous_commit stay on): the peers we compare against are durable, so this one is too.
It is always stopped and its directory removed on exit.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType

PG_USER = "postgres"
SHARED_BUFFERS = "128MB"
START_TIMEOUT_S = 60

_apt_tried: set[str] = set()


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be started; the message says which step failed."""


def _version_key(bin_dir: str) -> tuple[int, ...]:
    version = Path(bin_dir).parent.name
    return tuple(int(part) for part in re.findall(r"\d+", version)) or (0,)


def _find_bin_dir() -> str | None:
    dirs = [os.path.dirname(p) for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")]
    dirs = [d for d in dirs if os.access(os.path.join(d, "pg_ctl"), os.X_OK)]
    return max(dirs, key=_version_key) if dirs else None


def _run(cmd: list[str], what: str, timeout: float = 600) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PostgresUnavailable(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise PostgresUnavailable(f"{what} failed (exit {proc.returncode}): {' | '.join(tail)}")
    return proc.stdout


def _privileged(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return cmd
    if shutil.which("sudo"):
        return ["sudo", "-n", *cmd]
    raise PostgresUnavailable(f"{shlex.join(cmd)} needs root, and there is no sudo")


def apt_install(package: str, missing: str) -> None:
    """`apt-get install -y package`, tried once per process and package (a second try would
    only fail again); `missing` says what was looked for. PostgresUnavailable on failure."""
    if package in _apt_tried:
        raise PostgresUnavailable(f"{missing} (installing {package} failed)")
    _apt_tried.add(package)
    if not shutil.which("apt-get"):
        raise PostgresUnavailable(f"{missing}, and no apt-get")
    install = ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", package]
    try:
        _run(_privileged(install), f"apt-get install -y {package}")
    except PostgresUnavailable:
        # A fresh machine may have no package lists yet; refresh them and try the install again.
        _run(_privileged(["apt-get", "update"]), "apt-get update")
        _run(_privileged(install), f"apt-get install -y {package}")


def _bin_dir() -> str:
    found = _find_bin_dir()
    if found is None:
        apt_install("postgresql", "no initdb under /usr/lib/postgresql/*/bin")
        found = _find_bin_dir()
    if found is None:
        raise PostgresUnavailable("apt-get installed postgresql but no initdb was found")
    return found


def _server_user() -> str | None:
    """The user to run the server as, or None for ourselves: initdb refuses to run as root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(PG_USER)
    except KeyError:
        _run(["useradd", "--system", "--no-create-home", PG_USER], f"useradd {PG_USER}")
    return PG_USER


def _as_user(user: str | None, cmd: list[str]) -> list[str]:
    if user is None:
        return cmd
    if shutil.which("runuser"):
        return ["runuser", "-u", user, "--", *cmd]
    return ["su", user, "-s", "/bin/sh", "-c", shlex.join(cmd)]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _scratch_base() -> str | None:
    # On tmpfs, fsync returns at once: the numbers measure PostgreSQL, not this machine's disk.
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _stat_cpu(pid: int, with_children: bool) -> float:
    """utime+stime of one process, in clock ticks (plus reaped children's, if asked)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces and parentheses: split after its closing one.
        fields = f.read().rsplit(")", 1)[1].split()
    # fields[0] is the state (field 3 of stat(5)): utime is field 14, so fields[11].
    ticks = int(fields[11]) + int(fields[12])
    if with_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks


def _children(pid: int) -> list[int]:
    kids = []
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            with open(status) as f:
                text = f.read()
        except OSError:
            continue  # the process exited while we looked
        match = re.search(r"^PPid:\s+(\d+)", text, re.MULTILINE)
        if match and int(match.group(1)) == pid:
            kids.append(int(status.split("/")[2]))
    return kids


def process_tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a server: the process, its live children, and children it has reaped.

    Backends that exited (closed connections) are reaped by the postmaster, which then holds
    their CPU time in its cutime/cstime, so counting those keeps the total monotonic.
    """
    ticks = _stat_cpu(pid, with_children=True)
    for kid in _children(pid):
        try:
            ticks += _stat_cpu(kid, with_children=False)
        except (OSError, IndexError):
            continue  # the backend exited between the listing and the read
    return ticks / os.sysconf("SC_CLK_TCK")


class LocalPostgres:
    """A private PostgreSQL server for the duration of a `with` block."""

    def __init__(self) -> None:
        self.bin_dir = ""
        self.port = 0
        self.pid = 0
        self.dsn = ""
        self.version = ""
        self._user: str | None = None
        self._root: str | None = None

    @property
    def data_dir(self) -> str:
        assert self._root is not None
        return os.path.join(self._root, "data")

    def __enter__(self) -> LocalPostgres:
        self.bin_dir = _bin_dir()
        self._user = _server_user()
        self._root = tempfile.mkdtemp(prefix="pgpeer-", dir=_scratch_base())
        try:
            self._start()
        except BaseException:
            self._cleanup()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cleanup()

    def cpu_seconds(self) -> float:
        """Total CPU seconds used so far by the postmaster and all its backends."""
        return process_tree_cpu_seconds(self.pid)

    def _pg(self, tool: str, *args: str) -> list[str]:
        return _as_user(self._user, [os.path.join(self.bin_dir, tool), *args])

    def _start(self) -> None:
        assert self._root is not None
        if self._user is not None:
            entry = pwd.getpwnam(self._user)
            os.chown(self._root, entry.pw_uid, entry.pw_gid)
        os.chmod(self._root, 0o700)
        self.version = _run(self._pg("postgres", "--version"), "postgres --version").strip()
        _run(
            self._pg(
                "initdb", "-D", self.data_dir, "-U", PG_USER, "--auth=trust",
                "-E", "UTF8", "--locale=C", "--no-sync",
            ),
            "initdb",
        )  # fmt: skip
        self.port = _free_port()
        self._write_config()
        log = os.path.join(self._root, "server.log")
        start = self._pg("pg_ctl", "start", "-D", self.data_dir, "-w", "-l", log)
        try:
            _run([*start, "-t", str(START_TIMEOUT_S)], "pg_ctl start")
        except PostgresUnavailable as exc:
            raise PostgresUnavailable(f"{exc} (server log: {self._log_tail(log)})") from exc
        with open(os.path.join(self.data_dir, "postmaster.pid")) as f:
            self.pid = int(f.readline())
        self.dsn = f"postgresql://{PG_USER}@127.0.0.1:{self.port}/postgres"

    def _write_config(self) -> None:
        assert self._root is not None
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self._root}'",
            "shared_buffers": SHARED_BUFFERS,
        }
        lines = "".join(f"{key} = {value}\n" for key, value in settings.items())
        # Appended settings win over earlier ones; the file is the server user's, open it as root.
        with open(os.path.join(self.data_dir, "postgresql.conf"), "a") as f:
            f.write("\n# bench/peers/postgres.py\n" + lines)

    @staticmethod
    def _log_tail(log: str) -> str:
        try:
            with open(log) as f:
                return " | ".join(f.read().strip().splitlines()[-3:])
        except OSError:
            return "no log"

    def _kill_if_alive(self) -> None:
        # pg_ctl may have failed to stop it. Kill only our own postmaster: the pid must still
        # run a program whose command line names our data directory.
        try:
            with open(f"/proc/{self.pid}/cmdline", "rb") as f:
                ours = self.data_dir.encode() in f.read()
        except OSError:
            ours = False
        if self.pid and ours:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGQUIT)

    def _cleanup(self) -> None:
        if self._root is None:
            return
        if os.path.exists(os.path.join(self.data_dir, "postmaster.pid")):
            stop = self._pg("pg_ctl", "stop", "-D", self.data_dir, "-m", "immediate", "-w")
            subprocess.run(stop, capture_output=True, timeout=60, check=False)
        self._kill_if_alive()
        shutil.rmtree(self._root, ignore_errors=True)
        self._root = None
