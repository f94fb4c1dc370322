"""Measuring: results (`Point`), workers, and the thread and asyncio runners.

A run of a concurrent point processes a fixed number of messages (a shared counter) and is
timed from the moment every worker is ready (a barrier) to the moment the last one stopped, so
worker start-up and transport set-up are never measured."""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

VISIBILITY = 300.0


@dataclass
class Point:
    """One measured point: `values` holds one number per repetition."""

    section: str
    system: str
    x: int | str
    unit: str
    values: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def low(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def high(self) -> float:
        return max(self.values) if self.values else float("nan")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Point:
        return cls(**data)


class Results:
    """All points of a run, found again by (section, system, x)."""

    def __init__(self, points: Sequence[Point] = ()) -> None:
        self.points: list[Point] = list(points)

    def point(self, section: str, system: str, x: int | str, unit: str) -> Point:
        for p in self.points:
            if (p.section, p.system, p.x) == (section, system, x):
                return p
        p = Point(section, system, x, unit)
        self.points.append(p)
        return p

    def get(self, section: str, system: str, x: int | str) -> Point | None:
        for p in self.points:
            if (p.section, p.system, p.x) == (section, system, x):
                return p
        return None

    def add(self, section: str, system: str, x: int | str, unit: str, value: float) -> Point:
        p = self.point(section, system, x, unit)
        p.values.append(value)
        return p

    def section(self, section: str) -> list[Point]:
        return [p for p in self.points if p.section == section]


def rotate(items: Sequence[Any], k: int) -> list[Any]:
    """The systems of one repetition, each repetition starting with a different one, so that
    a slow drift of the machine does not always favour the same system."""
    k %= len(items)
    return list(items[k:]) + list(items[:k])


# ----------------------------------------------------------------------------------- workers


class Worker(Protocol):
    claim_s: float
    ack_s: float

    def step(self) -> int: ...

    def close(self) -> None: ...


class QueueWorker:
    """claim + ack (or claim_many(n) + ack_many) on one transport, ours or the seed's."""

    def __init__(self, queue: Any, worker_id: str, many: int = 0, close: bool = True) -> None:
        self.queue = queue
        self.worker_id = worker_id
        self.many = many
        self._close = close
        self.claim_s = 0.0
        self.ack_s = 0.0

    def step(self) -> int:
        t0 = time.perf_counter()
        if self.many:
            leases = self.queue.claim_many(self.worker_id, VISIBILITY, self.many)
        else:
            lease = self.queue.claim(self.worker_id, VISIBILITY)
            leases = [lease] if lease is not None else []
        t1 = time.perf_counter()
        self.claim_s += t1 - t0
        if not leases:
            return 0
        if self.many:
            self.queue.ack_many(leases)
        else:
            self.queue.ack(leases[0])
        self.ack_s += time.perf_counter() - t1
        return len(leases)

    def close(self) -> None:
        if self._close:
            self.queue.close()


class FloorWorker:
    def __init__(self, floor: Any) -> None:
        self.floor = floor
        self.claim_s = 0.0
        self.ack_s = 0.0

    def step(self) -> int:
        self.floor.write()
        return 1

    def close(self) -> None:
        self.floor.close()


class AsyncQueueWorker:
    def __init__(self, queue: Any, worker_id: str) -> None:
        self.queue = queue
        self.worker_id = worker_id

    async def step(self) -> int:
        lease = await self.queue.claim(self.worker_id, VISIBILITY)
        if lease is None:
            return 0
        await self.queue.ack(lease)
        return 1


class AsyncFloorWorker:
    def __init__(self, floor: Any) -> None:
        self.floor = floor

    async def step(self) -> int:
        await self.floor.write()
        return 1


@dataclass
class Run:
    messages: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds


def run_threads(workers: Sequence[Worker], target: int, cap_s: float) -> Run:
    """Each worker in its own thread, until `target` messages are done (or `cap_s` passed)."""
    lock = threading.Lock()
    done = [0]
    stop = threading.Event()
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(workers) + 1)

    def loop(worker: Worker) -> None:
        try:
            barrier.wait()
            while not stop.is_set():
                k = worker.step()
                if k == 0:
                    time.sleep(0.001)
                    continue
                with lock:
                    done[0] += k
                    if done[0] >= target:
                        stop.set()
        except BaseException as exc:
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=loop, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    stop.wait(cap_s)
    stop.set()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return Run(done[0], seconds)


async def run_tasks(
    steps: Sequence[Callable[[], Awaitable[int]]], target: int, cap_s: float
) -> Run:
    """Each step function in its own asyncio task, until `target` messages are done."""
    done = [0]
    stop = asyncio.Event()

    async def loop(step: Callable[[], Awaitable[int]]) -> None:
        while not stop.is_set():
            k = await step()
            if k == 0:
                await asyncio.sleep(0.001)
                continue
            done[0] += k
            if done[0] >= target:
                stop.set()

    t0 = time.perf_counter()
    tasks = [asyncio.create_task(loop(s)) for s in steps]
    try:
        await asyncio.wait_for(stop.wait(), cap_s)
    except TimeoutError:
        stop.set()
    await asyncio.gather(*tasks)
    return Run(done[0], time.perf_counter() - t0)


def rss_mb() -> float:
    """This process's resident set size now (VmRSS), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# ------------------------------------------------------------------------- measured windows


@dataclass
class Cost:
    """What a measured window cost, in total: wall seconds, Raft log entries appended on the
    leader (None off rqlite), CPU seconds of the server processes and of this process, and
    whether the Raft term changed meanwhile (an election: the entry count is then suspect)."""

    seconds: float
    raft_entries: int | None
    server_cpu: float
    client_cpu: float
    term_changed: bool = False

    def per(self, messages: int) -> dict[str, float]:
        """Per message: Raft entries, and server and client CPU in ms."""
        out = {
            "server_ms": 1e3 * self.server_cpu / messages,
            "client_ms": 1e3 * self.client_cpu / messages,
        }
        if self.raft_entries is not None:
            out["raft"] = self.raft_entries / messages
        return out


class Meter:
    """Measures one window: `start()`, the work, then `stop()`. `raft` reads the leader's Raft
    state (last log index, term); `cpu` the server processes' CPU seconds."""

    def __init__(self, raft: Callable[[], Any] | None, cpu: Callable[[], float] | None) -> None:
        self._raft = raft
        self._cpu = cpu
        self._t0 = self._client0 = self._server0 = 0.0
        self._raft0: Any = None

    def start(self) -> Meter:
        self._raft0 = self._raft() if self._raft else None
        self._server0 = self._cpu() if self._cpu else 0.0
        self._client0 = time.process_time()
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> Cost:
        seconds = time.perf_counter() - self._t0
        client = time.process_time() - self._client0
        server = (self._cpu() - self._server0) if self._cpu else 0.0
        entries, changed = None, False
        if self._raft and self._raft0 is not None:
            now = self._raft()
            entries = now.index - self._raft0.index
            changed = now.term != self._raft0.term
        return Cost(seconds, entries, server, client, changed)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)
