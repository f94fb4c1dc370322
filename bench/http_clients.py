"""Which HTTP client for the library's hot path: measured on a local 3-node rqlite cluster.

    .venv/bin/python bench/http_clients.py             # 3 repetitions, about 15 minutes
    .venv/bin/python bench/http_clients.py --quick     # a quarter of the requests, about 4 minutes

Every client sends the same requests to the leader of a freshly started `Cluster(3)`, over
keep-alive connections, and every reply is checked and `json.loads`-ed as the library does.
Three request shapes: a bare single-row write, a write with a ~20 KB body, and a weak read that
returns 50 rows of ~100 bytes. Per point: client CPU per request (`time.process_time` of this
process), wall-clock requests/s, rqlited CPU per request (utime + stime of the three nodes)
and the connections opened while measuring. Clients run interleaved within a repetition, in an
order rotated between repetitions, and each is also given as a ratio to `http.client` at the
same concurrency in the same repetition, because the machine is small and shared.

With strace available, each client is also run under `strace -f -c` (every shape at one worker,
the bare write at 32), twice with different request counts in a child process, and the
difference gives the socket and poll syscalls per request.

Writes bench/results/http_clients.md and prints it."""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import importlib.metadata
import itertools
import json
import os
import platform
import random
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit

import aiohttp
import httpcore
import httpx
import urllib3

if TYPE_CHECKING:
    from rqlite_queue.testing import Cluster

RESULTS = Path(__file__).resolve().parent / "results" / "http_clients.md"
TIMEOUT = 10.0
HEADERS = {"Content-Type": "application/json"}
REF = "http.client"
CONCURRENCY = (1, 8, 32)
SYNC_CONCURRENCY = (1, 8)
BLOB_SLOTS = 64
ROWS = 50
STRACE_CALLS = "sendto,sendmsg,write,writev,recvfrom,recvmsg,read,readv,epoll_wait,poll,select"
SEND_CALLS = {"sendto", "sendmsg", "write", "writev"}
RECV_CALLS = {"recvfrom", "recvmsg", "read", "readv"}
WAIT_CALLS = {"epoll_wait", "poll", "select"}
LIBRARIES = ("httpx", "httpcore", "h11", "urllib3", "aiohttp", "multidict", "yarl", "anyio")

ATTEMPTS = 3

Reply = tuple[int, bytes]
T = TypeVar("T")
SyncSend = Callable[[str, bytes], Reply]


class BenchError(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------------
# Request shapes


@dataclass(frozen=True)
class Shape:
    name: str
    title: str
    path: str
    setup: tuple[str, ...]
    body: Callable[[int], bytes]
    rows: int | None
    requests: int

    def count(self, concurrency: int, scale: float) -> int:
        factor = 1.0 if concurrency == 1 else 1.5
        return max(50, int(self.requests * factor * scale))


PAYLOAD = random.Random(0).randbytes(10_000).hex()
ROW_TEXT = "printf('%095d', i)"


def _write_body(_: int) -> bytes:
    return json.dumps([["UPDATE t SET v = v + 1 WHERE id = ?", 1]]).encode()


def _blob_body(i: int) -> bytes:
    sql = "INSERT OR REPLACE INTO blob (id, v) VALUES (?, ?)"
    return json.dumps([[sql, i % BLOB_SLOTS, PAYLOAD]]).encode()


def _rows_body(_: int) -> bytes:
    return json.dumps([["SELECT id, v FROM r ORDER BY id LIMIT ?", ROWS]]).encode()


SHAPES = (
    Shape(
        "write",
        "bare write: POST /db/request?transaction, one single-row UPDATE",
        "/db/request?transaction",
        (
            "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)",
            "INSERT INTO t (id, v) VALUES (1, 0)",
        ),
        _write_body,
        None,
        2000,
    ),
    Shape(
        "blob",
        "20 KB body: POST /db/request?transaction, one INSERT OR REPLACE of a 20,000-char text",
        "/db/request?transaction",
        ("CREATE TABLE blob (id INTEGER PRIMARY KEY, v TEXT NOT NULL)",),
        _blob_body,
        None,
        600,
    ),
    Shape(
        "rows",
        f"{ROWS}-row reply: POST /db/request (weak read), {ROWS} rows of ~100 bytes",
        "/db/request",
        (
            "CREATE TABLE r (id INTEGER PRIMARY KEY, v TEXT NOT NULL)",
            f"INSERT INTO r (v) WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s "
            f"WHERE i < {ROWS}) SELECT {ROW_TEXT} FROM s",
        ),
        _rows_body,
        ROWS,
        3000,
    ),
)
SHAPES_BY_NAME = {shape.name: shape for shape in SHAPES}


def check(status: int, content: bytes, rows: int | None) -> None:
    if status != 200:
        raise BenchError(f"HTTP {status}: {content[:200]!r}")
    reply = json.loads(content)
    results = reply.get("results")
    if "error" in reply or not results or "error" in results[0]:
        raise BenchError(f"rqlite error: {content[:200]!r}")
    if rows is not None and len(results[0].get("values", ())) != rows:
        raise BenchError(f"expected {rows} rows: {content[:200]!r}")


def send_checked(send: SyncSend, shape: Shape, i: int) -> None:
    check(*send(shape.path, shape.body(i)), shape.rows)


# ---------------------------------------------------------------------------------------------
# Sync clients: `sender()` is called once per thread.


class SyncClient(Protocol):
    def sender(self) -> SyncSend: ...

    def close(self) -> None: ...


class StdlibClient:
    """One `http.client.HTTPConnection` per thread."""

    def __init__(self, url: str, size: int) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.connections: list[http.client.HTTPConnection] = []
        self.lock = threading.Lock()

    def sender(self) -> SyncSend:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)
        with self.lock:
            self.connections.append(conn)

        def send(target: str, body: bytes) -> Reply:
            conn.request("POST", target, body, HEADERS)
            response = conn.getresponse()
            return response.status, response.read()

        return send

    def close(self) -> None:
        for conn in self.connections:
            conn.close()


class Urllib3Client:
    def __init__(self, url: str, size: int) -> None:
        parts = urlsplit(url)
        self.pool = urllib3.HTTPConnectionPool(
            parts.hostname or "127.0.0.1",
            parts.port,
            maxsize=size,
            block=True,
            timeout=urllib3.Timeout(connect=TIMEOUT, read=TIMEOUT),
            retries=False,
        )

    def sender(self) -> SyncSend:
        def send(target: str, body: bytes) -> Reply:
            response = self.pool.request("POST", target, body=body, headers=HEADERS)
            return response.status, response.data

        return send

    def close(self) -> None:
        self.pool.close()


HTTPCORE_TIMEOUTS = {"connect": TIMEOUT, "read": TIMEOUT, "write": TIMEOUT, "pool": TIMEOUT}
HTTPCORE_HEADERS = [(k.encode(), v.encode()) for k, v in HEADERS.items()]


class HttpcoreClient:
    def __init__(self, url: str, size: int) -> None:
        self.url = url
        self.pool = httpcore.ConnectionPool(max_connections=size, max_keepalive_connections=size)

    def sender(self) -> SyncSend:
        def send(target: str, body: bytes) -> Reply:
            response = self.pool.request(
                "POST",
                self.url + target,
                headers=HTTPCORE_HEADERS,
                content=body,
                extensions={"timeout": HTTPCORE_TIMEOUTS},
            )
            return response.status, response.content

        return send

    def close(self) -> None:
        self.pool.close()


def httpx_limits(size: int) -> httpx.Limits:
    return httpx.Limits(max_connections=size, max_keepalive_connections=size)


class HttpxClient:
    def __init__(self, url: str, size: int) -> None:
        self.client = httpx.Client(
            base_url=url, timeout=TIMEOUT, limits=httpx_limits(size), trust_env=False
        )

    def sender(self) -> SyncSend:
        def send(target: str, body: bytes) -> Reply:
            response = self.client.post(target, content=body, headers=HEADERS)
            return response.status_code, response.content

        return send

    def close(self) -> None:
        self.client.close()


# ---------------------------------------------------------------------------------------------
# Async clients: one shared client per point, made inside the running loop.


class AsyncClient(Protocol):
    async def send(self, target: str, body: bytes) -> Reply: ...

    async def aclose(self) -> None: ...


class HttpxAsyncClient:
    def __init__(self, url: str, size: int, limits: httpx.Limits | None = None) -> None:
        self.client = httpx.AsyncClient(
            base_url=url,
            timeout=TIMEOUT,
            limits=limits if limits is not None else httpx_limits(size),
            trust_env=False,
        )

    async def send(self, target: str, body: bytes) -> Reply:
        response = await self.client.post(target, content=body, headers=HEADERS)
        return response.status_code, response.content

    async def aclose(self) -> None:
        await self.client.aclose()


class HttpxAsyncDefaultLimits(HttpxAsyncClient):
    """What the library does today: httpx's default pool, 20 keep-alive connections."""

    def __init__(self, url: str, size: int) -> None:
        super().__init__(url, size, httpx.Limits(max_connections=100, max_keepalive_connections=20))


class HttpcoreAsyncClient:
    def __init__(self, url: str, size: int) -> None:
        self.url = url
        self.pool = httpcore.AsyncConnectionPool(
            max_connections=size, max_keepalive_connections=size
        )

    async def send(self, target: str, body: bytes) -> Reply:
        response = await self.pool.request(
            "POST",
            self.url + target,
            headers=HTTPCORE_HEADERS,
            content=body,
            extensions={"timeout": HTTPCORE_TIMEOUTS},
        )
        return response.status, response.content

    async def aclose(self) -> None:
        await self.pool.aclose()


class AiohttpClient:
    def __init__(self, url: str, size: int) -> None:
        self.session = aiohttp.ClientSession(
            base_url=url,
            connector=aiohttp.TCPConnector(limit=size, limit_per_host=size),
            timeout=aiohttp.ClientTimeout(total=TIMEOUT),
        )

    async def send(self, target: str, body: bytes) -> Reply:
        async with self.session.post(target, data=body, headers=HEADERS) as response:
            return response.status, await response.read()

    async def aclose(self) -> None:
        await self.session.close()


SYNC_CLIENTS: dict[str, Callable[[str, int], SyncClient]] = {
    REF: StdlibClient,
    "urllib3.HTTPConnectionPool": Urllib3Client,
    "httpcore.ConnectionPool": HttpcoreClient,
    "httpx.Client": HttpxClient,
}
ASYNC_CLIENTS: dict[str, Callable[[str, int], AsyncClient]] = {
    "httpx.AsyncClient": HttpxAsyncClient,
    "httpcore.AsyncConnectionPool": HttpcoreAsyncClient,
    "aiohttp.ClientSession": AiohttpClient,
}
EXTRA_AT_32: dict[str, Callable[[str, int], AsyncClient]] = {
    "httpx.AsyncClient, default Limits": HttpxAsyncDefaultLimits,
}


def lineup(concurrency: int) -> list[str]:
    """The clients of one concurrency; `http.client` (the reference) is in every lineup."""
    if concurrency in SYNC_CONCURRENCY:
        return [*SYNC_CLIENTS, *ASYNC_CLIENTS]
    return [REF, *ASYNC_CLIENTS, *EXTRA_AT_32]


def is_sync(client: str) -> bool:
    return client in SYNC_CLIENTS


def mode(client: str, concurrency: int) -> str:
    if is_sync(client):
        return f"{concurrency} thread" + ("s" if concurrency > 1 else "")
    return f"{concurrency} task" + ("s" if concurrency > 1 else "")


# ---------------------------------------------------------------------------------------------
# Measuring


@dataclass(frozen=True)
class Mark:
    wall: float
    cpu: float
    server: float
    connects: int


@dataclass(frozen=True)
class Sample:
    requests: int
    wall: float
    cpu: float
    server: float
    connects: int

    @classmethod
    def between(cls, start: Mark, end: Mark, requests: int) -> Sample:
        return cls(
            requests,
            end.wall - start.wall,
            end.cpu - start.cpu,
            end.server - start.server,
            end.connects - start.connects,
        )

    def metric(self, name: str) -> float:
        if name == "cpu":
            return self.cpu / self.requests * 1e6
        if name == "rps":
            return self.requests / self.wall
        if name == "server":
            return self.server / self.requests * 1e6
        return float(self.connects)


CLOCK_TICK = os.sysconf("SC_CLK_TCK")


def rqlited_cpu(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICK


CONNECTS: list[None] = []


def count_connects() -> None:
    """Count this process's `connect()` calls: every client here opens its sockets through
    `socket.socket.connect`, directly or from asyncio's `sock_connect`."""
    original = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> None:
        CONNECTS.append(None)
        original(sock, address)

    socket.socket.connect = connect  # type: ignore[method-assign, assignment]


def mark(pids: Sequence[int]) -> Mark:
    return Mark(time.perf_counter(), time.process_time(), rqlited_cpu(pids), len(CONNECTS))


def run_threads(
    client: SyncClient, threads: int, total: int, shape: Shape, pids: Sequence[int]
) -> Sample:
    counter = itertools.count()
    marks: list[Mark] = []
    errors: list[BaseException] = []
    ready = threading.Barrier(threads)
    barrier = threading.Barrier(threads, action=lambda: marks.append(mark(pids)))

    def work() -> None:
        try:
            send = client.sender()
            ready.wait()
            send_checked(send, shape, 0)
            barrier.wait()
            while (i := next(counter)) < total:
                send_checked(send, shape, i)
        except BaseException as exc:
            errors.append(exc)
            ready.abort()
            barrier.abort()

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return Sample.between(marks[0], mark(pids), total)


async def run_tasks(
    factory: Callable[[str, int], AsyncClient],
    url: str,
    tasks: int,
    total: int,
    shape: Shape,
    pids: Sequence[int],
) -> Sample:
    client = factory(url, tasks)
    counter = itertools.count()

    async def one(i: int) -> None:
        check(*await client.send(shape.path, shape.body(i)), shape.rows)

    async def work() -> None:
        while (i := next(counter)) < total:
            await one(i)

    try:
        await asyncio.gather(*(one(0) for _ in range(tasks)))
        start = mark(pids)
        await asyncio.gather(*(work() for _ in range(tasks)))
        return Sample.between(start, mark(pids), total)
    finally:
        await client.aclose()


def measure(
    client: str, concurrency: int, shape: Shape, total: int, pids: Sequence[int], url: str
) -> Sample:
    gc.collect()
    if is_sync(client):
        session = SYNC_CLIENTS[client](url, concurrency)
        try:
            return run_threads(session, concurrency, total, shape, pids)
        finally:
            session.close()
    factory = {**ASYNC_CLIENTS, **EXTRA_AT_32}[client]
    return asyncio.run(run_tasks(factory, url, concurrency, total, shape, pids))


def settle(pids: Sequence[int], idle: float, limit: float = 10.0) -> None:
    """Wait until rqlited is back to its idle CPU rate (a snapshot or a straggler may run)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        before = rqlited_cpu(pids)
        time.sleep(0.3)
        if (rqlited_cpu(pids) - before) / 0.3 <= max(2 * idle, 0.04):
            return


def idle_rate(pids: Sequence[int], seconds: float = 2.0) -> float:
    before = rqlited_cpu(pids)
    time.sleep(seconds)
    return (rqlited_cpu(pids) - before) / seconds


def json_cost(shape: Shape, reply: bytes, n: int = 2000) -> float:
    """Client CPU per request of the JSON work alone (body encode, reply decode and check)."""
    start = time.process_time()
    for i in range(n):
        shape.body(i)
        check(200, reply, shape.rows)
    return (time.process_time() - start) / n * 1e6


# ---------------------------------------------------------------------------------------------
# The cluster


def post_json(url: str, path: str, statements: Sequence[Any]) -> bytes:
    with httpx.Client(base_url=url, timeout=TIMEOUT, trust_env=False) as client:
        response = client.post(path, json=statements)
    check(response.status_code, response.content, None)
    return response.content


def set_up(shape: Shape, url: str) -> bytes:
    """Create the shape's table; return one reply, for the JSON-only cost."""
    post_json(url, "/db/request?transaction", [[sql] for sql in shape.setup])
    reply = post_json(url, shape.path, json.loads(shape.body(0)))
    check(200, reply, shape.rows)
    return reply


# ---------------------------------------------------------------------------------------------
# A run

Key = tuple[str, int, str]


@dataclass
class Run:
    repeats: int
    scale: float
    load_start: str
    samples: dict[Key, list[Sample]] = field(default_factory=dict)
    json_us: dict[str, float] = field(default_factory=dict)
    syscalls: dict[Key, dict[str, float]] = field(default_factory=dict)
    idle: dict[str, float] = field(default_factory=dict)
    reruns: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Target:
    """The cluster as the points see it: its current leader, its pids, the points rerun."""

    cluster: Cluster
    pids: list[int]
    reruns: list[str] = field(default_factory=list)

    def attempt(self, what: str, action: Callable[[str], T]) -> T:
        """Run `action` on the leader's URL; after a failure (a leader change on this busy
        machine, say), wait for the cluster and run it again, at most `ATTEMPTS` times."""
        for tries in itertools.count(1):
            try:
                return action(self.cluster.leader().http_url)
            except Exception as exc:
                if tries >= ATTEMPTS:
                    raise
                self.reruns.append(f"{what}: {exc!r}"[:300])
                log(f"rerun {what}: {exc!r}"[:300])
                self.cluster.wait_ready()
        raise AssertionError("unreachable")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def rotate(items: list[str], k: int) -> list[str]:
    k %= len(items)
    return items[k:] + items[:k]


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def warm_up(target: Target, shape: Shape, scale: float) -> None:
    total = max(20, int(200 * scale))
    for client in lineup(1):
        action = partial(measure, client, 1, shape, total, target.pids)
        target.attempt(f"warm-up {shape.name} {client}", action)


def repetition(run: Run, rep: int, shape: Shape, target: Target) -> None:
    for concurrency in CONCURRENCY:
        total = shape.count(concurrency, run.scale)
        for client in rotate(lineup(concurrency), rep):
            settle(target.pids, run.idle[shape.name])
            action = partial(measure, client, concurrency, shape, total, target.pids)
            what = f"rep {rep + 1} {shape.name} c={concurrency} {client}"
            sample = target.attempt(what, action)
            run.samples.setdefault((shape.name, concurrency, client), []).append(sample)
            log(
                f"rep {rep + 1} {shape.name:5} c={concurrency:<2} {client:34} "
                f"{sample.metric('rps'):7.0f} req/s  client {sample.metric('cpu'):6.0f} us"
                f"  rqlited {sample.metric('server'):6.0f} us  conns {sample.connects}"
            )


def bench_shape(run: Run, shape: Shape, syscalls: bool) -> None:
    """All repetitions of one shape, on a cluster of its own: 20 KB Raft entries make every
    later write on the same cluster dearer, so the shapes must not share one."""
    from rqlite_queue.testing import Cluster, rqlited_path

    with Cluster(3, binary=rqlited_path(), fast=False) as cluster:
        cluster.wait_ready()
        pids = [node.pid for node in cluster.nodes if node.pid is not None]
        target = Target(cluster, pids)
        reply = target.attempt(f"set-up {shape.name}", partial(set_up, shape))
        run.json_us[shape.name] = json_cost(shape, reply)
        log(f"{shape.name}: warming up")
        warm_up(target, shape, run.scale)
        run.idle[shape.name] = idle_rate(pids)
        for rep in range(run.repeats):
            repetition(run, rep, shape, target)
        if syscalls:
            run.syscalls |= count_syscalls(target, shape, run.scale)
        run.reruns += target.reruns


def bench(repeats: int, scale: float, syscalls: bool) -> Run:
    started = time.monotonic()
    count_connects()
    run = Run(repeats, scale, load_average())
    for shape in SHAPES:
        bench_shape(run, shape, syscalls)
    run.seconds = time.monotonic() - started
    return run


# ---------------------------------------------------------------------------------------------
# Socket syscalls per request, under strace


def strace_counts(key: Key, n: int, url: str) -> dict[str, int]:
    shape, concurrency, client = key
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as out:
        command = [
            *("strace", "-f", "-c", "-o", out.name, "-e", f"trace={STRACE_CALLS}"),
            *(sys.executable, str(Path(__file__).resolve()), "--child"),
            *(shape, str(concurrency), client, str(n), url),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise BenchError(f"child {key} exited {done.returncode}: {done.stderr[-2000:]}")
        return parse_strace(out.read())


def parse_strace(text: str) -> dict[str, int]:
    counts = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
            counts[parts[-1]] = int(parts[3])
    return counts


def per_request(key: Key, n: int, url: str) -> dict[str, float]:
    low = strace_counts(key, n, url)
    high = strace_counts(key, 2 * n, url)

    def delta(names: set[str]) -> float:
        return sum(high.get(c, 0) - low.get(c, 0) for c in names) / n

    return {"send": delta(SEND_CALLS), "recv": delta(RECV_CALLS), "wait": delta(WAIT_CALLS)}


def strace_keys(shape: Shape) -> list[Key]:
    keys = [(shape.name, 1, client) for client in lineup(1)]
    if shape.name == "write":
        keys += [(shape.name, 32, client) for client in lineup(32)]
    return keys


def count_syscalls(target: Target, shape: Shape, scale: float) -> dict[Key, dict[str, float]]:
    if shutil.which("strace") is None:
        log("strace not found: no syscall counts")
        return {}
    n = max(100, int(400 * scale))
    counts = {}
    for key in strace_keys(shape):
        log(f"strace {key}")
        try:
            counts[key] = target.attempt(f"strace {key}", partial(per_request, key, n))
        except BenchError as exc:
            log(str(exc))
    return counts


def child(shape: str, concurrency: int, client: str, n: int, url: str) -> None:
    measure(client, concurrency, SHAPES_BY_NAME[shape], n, [], url)


# ---------------------------------------------------------------------------------------------
# The report


def num(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def summary(values: Sequence[float], ratio: bool = False) -> str:
    med, low, high = statistics.median(values), min(values), max(values)
    if ratio:
        return f"{med:.2f}\u00d7 [{low:.2f}\u2013{high:.2f}]"
    return f"{num(med)} [{num(low)}\u2013{num(high)}]"


def ratios(run: Run, key: Key, metric: str) -> list[float]:
    shape, concurrency, _ = key
    ref = run.samples[(shape, concurrency, REF)]
    mine = run.samples[key]
    return [m.metric(metric) / r.metric(metric) for m, r in zip(mine, ref, strict=True)]


def shape_table(run: Run, shape: Shape) -> list[str]:
    head = (
        "| concurrency | client | client CPU \u00b5s/req | \u00d7 http.client | req/s "
        "| \u00d7 http.client | rqlited CPU \u00b5s/req | \u00d7 http.client | new conns |"
    )
    lines = [f"### {shape.title}", "", head, "|" + "---|" * 9]
    for concurrency in CONCURRENCY:
        for client in lineup(concurrency):
            lines.append(table_row(run, (shape.name, concurrency, client)))
    lines += [
        "",
        f"Requests per point: {shape.count(1, run.scale):,} at 1 worker, "
        f"{shape.count(8, run.scale):,} at 8 and 32. JSON work alone (encode the body, "
        f"`json.loads` and check the reply): {run.json_us[shape.name]:.1f} \u00b5s/req of "
        "the client CPU.",
        "",
    ]
    return lines


def table_row(run: Run, key: Key) -> str:
    _, concurrency, client = key
    samples = run.samples[key]
    cells = [mode(client, concurrency), f"`{client}`"]
    for metric in ("cpu", "rps", "server"):
        cells.append(summary([s.metric(metric) for s in samples]))
        cells.append("ref." if client == REF else summary(ratios(run, key, metric), ratio=True))
    cells.append(f"{statistics.median(s.connects for s in samples):.0f}")
    return "| " + " | ".join(cells) + " |"


def syscall_cell(counts: dict[str, float]) -> str:
    return f"{counts['send']:.2f} / {counts['recv']:.2f} / {counts['wait']:.2f}"


def syscall_table(run: Run) -> list[str]:
    if not run.syscalls:
        return ["No syscall counts (strace not available, or `--no-strace`).", ""]
    lines = [
        "### Syscalls per request: send / recv / poll",
        "",
        "`strace -f -c` over two runs of the same point (N and 2N requests, in a child "
        "process); the difference divided by N. send = sendto + sendmsg + write + writev, "
        "recv = recvfrom + recvmsg + read + readv, poll = epoll_wait + poll + select.",
        "",
        f"| client | {' | '.join(f'{s.name}, 1 worker' for s in SHAPES)} | write, 32 workers |",
        "|" + "---|" * (len(SHAPES) + 2),
    ]
    for client in dict.fromkeys([*lineup(1), *lineup(32)]):
        cells = [f"`{client}`"]
        for key in [*((s.name, 1, client) for s in SHAPES), ("write", 32, client)]:
            counts = run.syscalls.get(key)
            cells.append(syscall_cell(counts) if counts else "")
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def reruns(run: Run) -> list[str]:
    if not run.reruns:
        return ["No point had to be rerun.", ""]
    head = f"{len(run.reruns)} point(s) failed once and were rerun (the failed try is dropped):"
    return [head, "", *(f"- {line}" for line in run.reruns), ""]


def machine(run: Run) -> list[str]:
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=True).stdout.strip()
    return [
        f"- `nproc`: {nproc} ({cpu}); MemTotal {meminfo['MemTotal'].strip()}, "
        f"MemAvailable {meminfo['MemAvailable'].strip()} (`/proc/meminfo`)",
        f"- load average (1, 5, 15 min): {run.load_start} at the start, {load_average()} "
        "at the end",
        f"- Python {platform.python_version()} ({platform.python_implementation()}), "
        f"{platform.platform()}",
    ]


def versions() -> str:
    from rqlite_queue.testing import rqlited_path

    found = [f"{name} {importlib.metadata.version(name)}" for name in LIBRARIES]
    parser = aiohttp.http_parser.HttpResponseParser.__module__
    out = subprocess.run([rqlited_path(), "-version"], capture_output=True, text=True, check=False)
    rqlited = (out.stdout + out.stderr).strip().splitlines()[0]
    return (
        f"- libraries: {', '.join(found)}, http.client (stdlib); aiohttp response parser: "
        f"`{parser}`\n- {rqlited}"
    )


def method(run: Run) -> list[str]:
    return [
        "- One freshly started `Cluster(3, fast=False)` per shape, which runs all its "
        "repetitions: a cluster that took thousands of 20 KB writes makes every later write "
        "dearer (its Raft log compactions leave a large BoltDB freelist), so the shapes do not "
        "share one. `fast=False` keeps rqlite's default 1 s Raft timeouts: the harness's 200 ms "
        "ones let the leader change under this load. Data on /dev/shm. Every request goes to "
        "the leader, found again before each point.",
        f"- Repetitions: {run.repeats}. Within one, each concurrency runs its clients back "
        "to back, in an order rotated between repetitions, each once rqlited is idle again. "
        "A warm-up pass of every client comes first.",
        "- Keep-alive everywhere, 10 s timeouts. Sync: `http.client` has one connection per "
        "thread; the others share one pool sized to the threads. Async: one client per point "
        "on one event loop, pool sized to the tasks. Every worker sends one request before the "
        "clock starts, so connections are open. A point is a fixed number of requests "
        "(a shared counter).",
        "- Client CPU is this process's `time.process_time()`, rqlited CPU the utime + stime "
        "of the 3 nodes (`/proc/PID/stat`), both per request. New conns: the `connect()` calls "
        "of this process while the point was measured.",
        "- Each cell: median [min\u2013max] over the repetitions. A ratio is taken against "
        "`http.client` at the same concurrency in the same repetition (at 32 it runs 32 "
        "threads, as a reference), then summarised the same way. CPU: < 1 is cheaper; "
        "req/s: > 1 is faster.",
        "- Idle rqlited CPU (3 nodes, heartbeats), ms/s: "
        + ", ".join(f"{name} {rate * 1000:.0f}" for name, rate in run.idle.items())
        + f". Run time {run.seconds / 60:.1f} min.",
    ]


def report(run: Run, command: str) -> str:
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# HTTP clients for the hot path",
        "",
        f"Run {now}: `{command}`",
        "",
        "## Machine",
        "",
        *machine(run),
        versions(),
        "",
        "## Method",
        "",
        *method(run),
        "",
        "## Results",
        "",
    ]
    for shape in SHAPES:
        lines += shape_table(run, shape)
    lines += syscall_table(run)
    lines += reruns(run)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of the requests")
    parser.add_argument("--repeats", type=int, default=3, help="repetitions (default 3)")
    parser.add_argument("--no-strace", action="store_true", help="skip the syscall counts")
    parser.add_argument("--output", type=Path, default=RESULTS, help="markdown file to write")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        shape, concurrency, client, n, url = args.child
        child(shape, int(concurrency), client, int(n), url)
        return
    if args.repeats < 1:
        raise SystemExit("--repeats must be at least 1")
    run = bench(args.repeats, 0.25 if args.quick else 1.0, not args.no_strace)
    command = shlex.join(["python", "bench/http_clients.py", *sys.argv[1:]])
    text = report(run, command)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
