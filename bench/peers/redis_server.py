"""A throwaway local Redis server, for peer benchmarks (harel's RedisTransport).

`LocalRedis()` starts a fresh `redis-server` from Debian's packages (installing them once if
missing), listening only on 127.0.0.1 on a port picked at run time, with its directory in a
temporary place. Persistence is Redis's default for a server started with a config of its
own: none here (no RDB snapshots, no AOF), as harel's Redis transport is usually run; the
report says so. It is always stopped and its directory removed on exit.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from peers.postgres import PostgresUnavailable, apt_install

START_TIMEOUT_S = 30


class RedisUnavailable(RuntimeError):
    """No Redis server could be started; the message says which step failed."""


def _install_redis() -> None:
    try:
        apt_install("redis-server", "no redis-server on the PATH")
    except PostgresUnavailable as exc:  # (the shared installer's error)
        raise RedisUnavailable(str(exc)) from exc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRedis:
    def __init__(self) -> None:
        self.port = 0
        self.version = ""
        self._dir: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> LocalRedis:
        binary = shutil.which("redis-server")
        if binary is None:
            _install_redis()
            binary = shutil.which("redis-server")
        if binary is None:
            raise RedisUnavailable("redis-server still missing after apt-get install")
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False)
        self.version = out.stdout.strip()
        self._dir = tempfile.mkdtemp(prefix="rq-bench-redis-")
        self.port = _free_port()
        self._proc = subprocess.Popen(
            [
                binary,
                "--bind", "127.0.0.1",
                "--port", str(self.port),
                "--dir", self._dir,
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--logfile", str(Path(self._dir) / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self.__exit__(None, None, None)
                raise RedisUnavailable(f"redis-server exited with {self._proc.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        self.__exit__(None, None, None)
        raise RedisUnavailable(f"redis-server did not answer within {START_TIMEOUT_S} s")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
