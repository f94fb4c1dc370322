"""The transport's workloads, each run on one `Env` (a 3-node rqlite cluster, or a local SQLite
file) for the three systems side by side: the floor, the seed, and ours (the Worker section is
in worker_bench.py). Every point is repeated `cfg.reps` times; within a repetition the systems
run one after the other, in an order that rotates from one repetition to the next."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import os
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import seed_transport as seed
import urllib3
from measure import (
    VISIBILITY,
    AsyncFloorWorker,
    AsyncQueueWorker,
    FloorWorker,
    QueueWorker,
    Results,
    Run,
    Worker,
    rotate,
    rss_mb,
    run_tasks,
    run_threads,
)
from systems import (
    FLOOR_UPDATE,
    HEADERS,
    WRITE_PATH,
    Admin,
    AsyncFloorRqlite,
    FloorRqlite,
    FloorSqlite,
    RaftState,
    SqliteAdmin,
    build_ours,
    build_seed,
    cpu_seconds,
    drop_all,
    floor_rows_insert,
    floor_session,
    reset_ours,
    reset_seed,
    setup_floor,
    setup_floor_rows,
)

from rqlite_queue import AsyncTransport, Transport
from rqlite_queue._protocol import messages, probes, round_spec, rounds, schema
from rqlite_queue._protocol import publish as publishing
from rqlite_queue._protocol.core import QueueCore
from rqlite_queue._protocol.http import parse_reply, request_for
from rqlite_queue._protocol.messages import Message
from rqlite_queue._protocol.plan import Reply
from rqlite_queue._protocol.round_spec import RoundSpec

QUEUE = "bench"


@dataclass(frozen=True)
class Config:
    reps: int
    publish_single: int
    publish_batches: dict[int, int]  # batch size -> batches per repetition
    workers: tuple[int, ...]
    cycle_backlog: tuple[int, int]  # messages, groups
    cycle_big_backlog: tuple[int, int]  # the same workload behind a larger backlog
    cycle_messages: int
    many: int
    many_messages: int
    sweep_sizes: tuple[int, ...]
    sweep_claims: int
    seed_budget_s: float  # per sweep/priority point, all repetitions together
    priority_behind: int
    priority_high: tuple[int, int]  # messages, groups at priority 4
    delayed_behind: int  # delayed messages (each the head of its own group) behind claims
    memory_messages: int
    timing_requests: int
    cap_s: float  # safety cap on one concurrent run
    # The Worker section (worker_bench.py).
    worker_reps: int = 3
    worker_concurrency: tuple[int, ...] = (1, 8, 32, 64, 128)
    worker_backlog: tuple[int, int] = (20_000, 2_000)  # messages, groups
    worker_c1_messages: int = 3_000  # concurrency 1 handles only the first ones of the backlog
    floor_writes: int = 2_000  # bare writes per floor point (concurrency 1)
    procrastinate_concurrency: tuple[int, ...] = (1, 8, 32, 64, 128)
    harel_concurrency: tuple[int, ...] = (1, 8, 64)
    harel_window_s: float = 8.0  # harel's transport runs for this long (it is slow)
    idle_s: float = 60.0
    idle_baseline_s: float = 20.0
    pickups: int = 50


def rqlite_config(full: bool) -> Config:
    return Config(
        reps=3,
        publish_single=300 if full else 100,
        publish_batches={10: 30, 100: 10, 1000: 10} if full else {10: 10, 100: 5, 1000: 5},
        workers=(1, 8, 32),
        cycle_backlog=(1000, 100),
        cycle_big_backlog=(10_000, 1_000),
        cycle_messages=600 if full else 200,
        many=32,
        many_messages=640,
        sweep_sizes=(1_000, 10_000, 100_000, 1_000_000) if full else (1_000, 10_000, 100_000),
        sweep_claims=30 if full else 15,
        seed_budget_s=45.0 if full else 8.0,
        priority_behind=1_000_000 if full else 100_000,
        priority_high=(200, 20),
        delayed_behind=1_000_000 if full else 100_000,
        memory_messages=200_000 if full else 20_000,
        timing_requests=200 if full else 60,
        cap_s=120.0,
        worker_reps=3 if full else 2,
        worker_backlog=(20_000, 2_000) if full else (4_000, 400),
        worker_c1_messages=3_000 if full else 800,
        floor_writes=2_000 if full else 600,
        procrastinate_concurrency=(1, 8, 32, 64, 128) if full else (1, 64),
        harel_concurrency=(1, 8, 64),
        harel_window_s=8.0 if full else 3.0,
        idle_s=60.0 if full else 15.0,
        idle_baseline_s=20.0 if full else 5.0,
    )


def sqlite_config(full: bool) -> Config:
    return Config(
        reps=3,
        publish_single=3000 if full else 1000,
        publish_batches={10: 300, 100: 50, 1000: 10} if full else {10: 100, 100: 20, 1000: 5},
        workers=(1, 8, 32),
        cycle_backlog=(1000, 100),
        cycle_big_backlog=(10_000, 1_000),
        cycle_messages=800 if full else 400,
        many=32,
        many_messages=640,
        sweep_sizes=(1_000, 10_000, 100_000, 1_000_000) if full else (1_000, 10_000, 100_000),
        sweep_claims=50 if full else 20,
        seed_budget_s=30.0 if full else 6.0,
        priority_behind=1_000_000 if full else 100_000,
        priority_high=(200, 20),
        delayed_behind=1_000_000 if full else 100_000,
        memory_messages=0,
        timing_requests=0,
        cap_s=120.0,
        worker_reps=3 if full else 2,
        worker_concurrency=(1, 8, 64),
        worker_backlog=(20_000, 2_000) if full else (4_000, 400),
        worker_c1_messages=5_000 if full else 2_000,
        floor_writes=5_000 if full else 2_000,
    )


@dataclass
class Env:
    label: str  # "rqlite" or "sqlite": the prefix of every section
    admin: Admin
    ours: Callable[[], Transport]  # a set-up transport on QUEUE
    ours_on: Callable[[str], Transport]  # a set-up transport on another queue
    seed: Callable[[], Any]  # SeedRqliteTransport | SeedSqliteTransport, set up
    floor: Callable[[int], Any]  # FloorRqlite | FloorSqlite writing row i
    ours_async: Callable[[], AsyncTransport] | None = None  # not set up (its loop's job)
    url: str | None = None  # rqlite: the node every client talks to (the leader)
    server_pids: list[int] = field(default_factory=list)
    path: str = ""  # sqlite: the database file
    raft: Callable[[], RaftState] | None = None  # rqlite: the leader's Raft state

    def server_cpu(self) -> float:
        return cpu_seconds(self.server_pids)


def write_profile(profiler: Any, out_path: str) -> None:
    """A pyinstrument profile as text, then its 40 costliest functions by self time; file
    names relative to the checkout (the machine's own paths stay out of the results)."""
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    flat = profiler.output_text(unicode=False, color=False, flat=True)
    text += "\n\nSelf time per function (flat):\n\n" + "\n".join(flat.splitlines()[:40]) + "\n"
    root = str(Path(__file__).resolve().parent.parent) + os.sep
    Path(out_path).write_text(text.replace(root, ""))


def make_core() -> QueueCore:
    """A core on the bench's queue that never prunes (so that timed plans are all alike)."""
    return QueueCore(
        queue=QUEUE, clock=time.time, token=lambda: uuid.uuid4().hex, chance=lambda: 1.0
    )


_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def _cpu_seconds(pids: list[int]) -> float:
    return cpu_seconds(pids)


def settle(env: Env, timeout: float = 60.0) -> None:
    """Let the aftermath of a backlog build pass before measuring: rqlite snapshots when its
    WAL passes 4 MiB, and a big insert does that; wait until the rqlited processes are idle
    (under 10% of one core over 0.3 s). On SQLite, checkpoint the WAL."""
    if not env.server_pids:
        env.admin.checkpoint()
        return
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        before = _cpu_seconds(env.server_pids)
        time.sleep(0.3)
        if _cpu_seconds(env.server_pids) - before < 0.03:
            return


# ------------------------------------------------------------------------------------ publish


def _items(batch: int, k: int) -> list[tuple[str, dict[str, int]]]:
    return [(f"p{i % 100}", {"i": i}) for i in range(k * batch, (k + 1) * batch)]


def _publish_floor(env: Env, n: int) -> tuple[int, float]:
    f = env.floor(0)
    t0 = time.perf_counter()
    for _ in range(n):
        f.write()
    seconds = time.perf_counter() - t0
    f.close()
    return n, seconds


def _publish_floor_rows(env: Env, batch: int, batches: int) -> tuple[int, float]:
    """The bare many-row INSERT: `batches` requests of one `batch`-row INSERT each."""
    setup_floor_rows(env.admin)
    now = time.time()
    statements = [
        floor_rows_insert([(g, json.dumps(e)) for g, e in _items(batch, k)], now)
        for k in range(batches)
    ]
    f = env.floor(0)
    t0 = time.perf_counter()
    for statement in statements:
        if isinstance(f, FloorSqlite):
            f.post_rows(statement)
        else:
            f.post(json.dumps([statement]).encode())
    seconds = time.perf_counter() - t0
    f.close()
    return batch * batches, seconds


def _publish_seed(env: Env, n: int) -> tuple[int, float]:
    reset_seed(env.admin)
    s = env.seed()
    t0 = time.perf_counter()
    for i in range(n):
        s.publish(f"p{i % 100}", {"i": i})
    seconds = time.perf_counter() - t0
    s.close()
    return n, seconds


def _publish_ours(env: Env, n: int, batch: int, batches: int) -> tuple[int, float]:
    reset_ours(env.admin, QUEUE)
    q = env.ours()
    if batch == 1:
        t0 = time.perf_counter()
        for i in range(n):
            q.publish(f"p{i % 100}", {"i": i})
        seconds = time.perf_counter() - t0
        q.close()
        return n, seconds
    items = [_items(batch, k) for k in range(batches)]
    t0 = time.perf_counter()
    for chunk in items:
        q.publish_many(chunk)
    seconds = time.perf_counter() - t0
    q.close()
    return batch * batches, seconds


def publish(env: Env, cfg: Config, res: Results) -> None:
    """Messages (rows) per second: the floor (single-row writes), the seed's publish, ours one
    at a time and in batches, and the bare many-row INSERT of the largest batch size."""
    sec = f"{env.label}.publish"
    n = cfg.publish_single
    big = max(cfg.publish_batches)
    tasks: list[tuple[str, int]] = [("floor", 1), ("seed", 1), ("ours", 1), ("floor_rows", big)]
    tasks += [("ours", b) for b in cfg.publish_batches]
    setup_floor(env.admin)
    for rep in range(cfg.reps):
        for system, batch in rotate(tasks, rep):
            if system == "floor":
                count, seconds = _publish_floor(env, n)
            elif system == "floor_rows":
                count, seconds = _publish_floor_rows(env, batch, cfg.publish_batches[batch])
            elif system == "seed":
                count, seconds = _publish_seed(env, n)
            else:
                count, seconds = _publish_ours(env, n, batch, cfg.publish_batches.get(batch, 0))
            p = res.add(sec, system, batch, "msg/s", count / seconds)
            log(f"{sec} {system} batch={batch}: {p.values[-1]:.0f} msg/s")


# -------------------------------------------------------------------------------- claim + ack


def _fresh_backlog(env: Env, system: str, messages: int, groups: int) -> None:
    if system.startswith("seed"):
        reset_seed(env.admin)
        build_seed(env.admin, messages, groups)
    elif system.startswith("ours"):
        reset_ours(env.admin, QUEUE)
        build_ours(env.admin, QUEUE, messages, groups)
    settle(env)


def _threads(env: Env, cfg: Config, system: str, workers: int, target: int) -> tuple[Run, Worker]:
    objs: list[Worker] = []
    for i in range(workers):
        if system == "floor":
            objs.append(FloorWorker(env.floor(i)))
        elif system == "seed":
            objs.append(QueueWorker(env.seed(), f"w{i}"))
        elif system == "ours":
            objs.append(QueueWorker(env.ours(), f"w{i}"))
        elif system == "ours_many":
            objs.append(QueueWorker(env.ours(), f"w{i}", many=cfg.many))
        else:
            raise ValueError(system)
    try:
        run = run_threads(objs, target, cfg.cap_s)
    finally:
        for w in objs:
            w.close()
    return run, objs[0]


def _tasks(env: Env, cfg: Config, system: str, workers: int, target: int) -> Run:
    async def go() -> Run:
        if system == "ours_async":
            assert env.ours_async is not None
            q = env.ours_async()
            await q.setup()
            try:
                steps = [AsyncQueueWorker(q, f"a{i}").step for i in range(workers)]
                return await run_tasks(steps, target, cfg.cap_s)
            finally:
                await q.close()
        assert env.url is not None
        async with floor_session() as session:
            floors = [
                AsyncFloorWorker(AsyncFloorRqlite(session, env.url, i)) for i in range(workers)
            ]
            return await run_tasks([f.step for f in floors], target, cfg.cap_s)

    return asyncio.run(go())


def cycle(env: Env, cfg: Config, res: Results, big: bool = False) -> None:
    """claim + ack per message with 1..32 workers; claim_many + ack_many with one worker.
    `big`: only floor, seed and ours, 1 and 8 workers, behind the larger backlog."""
    suffix = "_big" if big else ""
    sec = f"{env.label}.cycle{suffix}"
    setup_floor(env.admin)
    systems = ["floor", "seed", "ours"]
    if env.ours_async is not None and not big:
        systems += ["ours_async"] + (["floor_async"] if env.url else [])
    backlog, groups = cfg.cycle_big_backlog if big else cfg.cycle_backlog
    for rep in range(cfg.reps):
        for workers in (1, 8) if big else cfg.workers:
            runs = [(s, workers, cfg.cycle_messages) for s in systems]
            if workers == 1 and not big:
                runs.append(("ours_many", 1, cfg.many_messages))
            for system, w, target in rotate(runs, rep):
                _fresh_backlog(env, system, backlog, groups)
                cpu0 = _cpu_seconds(env.server_pids)
                client0 = time.process_time()
                if system.endswith("_async"):
                    run = _tasks(env, cfg, system, w, target)
                    first: Worker | None = None
                else:
                    run, first = _threads(env, cfg, system, w, target)
                client_cpu = time.process_time() - client0
                server_cpu = _cpu_seconds(env.server_pids) - cpu0
                p = res.add(sec, system, w, "msg/s", run.rate)
                res.add(
                    f"{env.label}.cpu{suffix}",
                    f"{system}/client",
                    w,
                    "ms/msg",
                    1e3 * client_cpu / run.messages,
                )
                if env.server_pids:
                    res.add(
                        f"{env.label}.cpu{suffix}",
                        f"{system}/server",
                        w,
                        "ms/msg",
                        1e3 * server_cpu / run.messages,
                    )
                if w == 1 and first is not None and system != "floor":
                    res.add(
                        f"{env.label}.split{suffix}",
                        f"{system}/claim",
                        1,
                        "ms/msg",
                        1e3 * first.claim_s / run.messages,
                    )
                    res.add(
                        f"{env.label}.split{suffix}",
                        f"{system}/ack",
                        1,
                        "ms/msg",
                        1e3 * first.ack_s / run.messages,
                    )
                log(
                    f"{sec} {system} workers={w}: {p.values[-1]:.0f} msg/s "
                    f"({run.messages} in {run.seconds:.2f}s)"
                )


# ------------------------------------------------------------------------- latency of claims


def _timed_claims(q: Any, claims: int, min_priority: int = 0) -> list[float]:
    """claim (timed, ms) then ack (not timed), `claims` times."""
    out = []
    for _ in range(claims):
        t0 = time.perf_counter()
        lease = q.claim("lat", VISIBILITY, min_priority)
        out.append(1e3 * (time.perf_counter() - t0))
        if lease is None:
            raise RuntimeError("nothing to claim: the backlog is too small for this point")
        q.ack(lease)
    return out


def _latency_point(
    env: Env,
    cfg: Config,
    res: Results,
    sec: str,
    x: int,
    note: str,
    min_priority: int = 0,
) -> None:
    """Ours and the seed on the backlogs already built; the seed within its time budget."""
    seed_claims = cfg.sweep_claims
    capped = ""
    # Warm-up (not counted), which also measures the seed's cost to fit it to the budget.
    q = env.ours()
    _timed_claims(q, 2, min_priority)
    q.close()
    s = env.seed()
    t0 = time.perf_counter()
    _timed_claims(s, 1, min_priority)
    one = time.perf_counter() - t0
    s.close()
    if one * seed_claims * cfg.reps > cfg.seed_budget_s:
        seed_claims = max(1, int(cfg.seed_budget_s / (one * cfg.reps)))
        capped = f"seed capped at {seed_claims} claim(s) per repetition (time budget)"
    for rep in range(cfg.reps):
        for system in rotate(["ours", "seed"], rep):
            if system == "ours":
                q = env.ours()
                lat = _timed_claims(q, cfg.sweep_claims, min_priority)
                q.close()
            else:
                s = env.seed()
                lat = _timed_claims(s, seed_claims, min_priority)
                s.close()
            p = res.add(sec, f"{system}:{note}", x, "ms", statistics.median(lat))
            if system == "seed" and capped:
                p.note = capped
            log(f"{sec} {system} {note} x={x}: claim {p.values[-1]:.2f} ms")


def _spreads(n: int) -> list[tuple[str, int]]:
    return [("10 groups", 10), ("n/10 groups", max(10, n // 10))]


def sweep(env: Env, cfg: Config, res: Results) -> None:
    """Claim latency against the backlog size, for few and for many groups."""
    sec = f"{env.label}.sweep"
    for n in cfg.sweep_sizes:
        for note, groups in _spreads(n):
            t0 = time.perf_counter()
            reset_ours(env.admin, QUEUE)
            build_ours(env.admin, QUEUE, n, groups)
            reset_seed(env.admin)
            build_seed(env.admin, n, groups)
            settle(env)
            log(f"{sec} built {n} messages in {groups} groups ({time.perf_counter() - t0:.1f}s)")
            _latency_point(env, cfg, res, sec, n, note)
        drop_all(env.admin, QUEUE)


def priority(env: Env, cfg: Config, res: Results) -> None:
    """claim(min_priority=4) behind many priority-0 groups (one message each), and with only
    the priority-4 groups queued."""
    sec = f"{env.label}.priority"
    high, high_groups = cfg.priority_high
    # Enough priority-4 messages for every claim of the point (warm-ups included).
    high = max(high, cfg.reps * cfg.sweep_claims + 10)
    for behind in (0, cfg.priority_behind):
        reset_ours(env.admin, QUEUE)
        reset_seed(env.admin)
        t0 = time.perf_counter()
        if behind:
            build_ours(env.admin, QUEUE, behind, behind, priority=0, prefix="low")
            build_seed(env.admin, behind, behind, priority=0, prefix="low")
        build_ours(env.admin, QUEUE, high, high_groups, priority=4, prefix="high")
        build_seed(env.admin, high, high_groups, priority=4, prefix="high")
        settle(env)
        log(f"{sec} built {behind} low + {high} high ({time.perf_counter() - t0:.1f}s)")
        _latency_point(env, cfg, res, sec, behind, "min_priority=4", min_priority=4)
    drop_all(env.admin, QUEUE)


def delayed(env: Env, cfg: Config, res: Results) -> None:
    """claim behind `delayed_behind` delayed messages, each the head of its own group (due in
    a day, so every one of those groups waits in the index of busy groups, the worst shape
    for a claim) vs the same claimable messages on a queue with nothing delayed. The two
    queues live side by side and are measured alternately, repetition by repetition."""
    sec = f"{env.label}.delayed"
    plain, loaded = f"{QUEUE}_plain", QUEUE
    ready = cfg.reps * (cfg.sweep_claims + 2) + 10  # every claim of the point, warm-ups too
    t0 = time.perf_counter()
    for queue in (plain, loaded):
        reset_ours(env.admin, queue)
        q = env.ours_on(queue)
        q.publish_many([(f"r{i}", {"i": i}) for i in range(ready)])
        q.close()
    q = env.ours_on(loaded)
    chunk = 1000
    for lo in range(0, cfg.delayed_behind, chunk):
        q.publish_many(
            {"group_id": f"d{i}", "event": {"i": i}, "delay": 86_400.0}
            for i in range(lo, min(lo + chunk, cfg.delayed_behind))
        )
    stats = q.stats()
    q.close()
    if stats.depth != ready + cfg.delayed_behind or stats.delayed != cfg.delayed_behind:
        raise RuntimeError(f"the delayed backlog is not what was built: {stats}")
    settle(env)
    built = time.perf_counter() - t0
    log(f"{sec} built {cfg.delayed_behind:,} delayed + {ready} ready messages ({built:.1f}s)")
    points = {plain: ("nothing delayed", 0), loaded: ("delayed backlog", cfg.delayed_behind)}
    for queue in (plain, loaded):  # warm-up, not counted
        q = env.ours_on(queue)
        _timed_claims(q, 2)
        q.close()
    for rep in range(cfg.reps):
        for queue in rotate([plain, loaded], rep):
            note, x = points[queue]
            q = env.ours_on(queue)
            lat = _timed_claims(q, cfg.sweep_claims)
            q.close()
            p = res.add(sec, f"ours:{note}", x, "ms", statistics.median(lat))
            log(f"{sec} {note} x={x}: claim {p.values[-1]:.2f} ms")
    drop_all(env.admin, plain)
    drop_all(env.admin, loaded)


# ------------------------------------------------------------------------------------ memory


def memory(env: Env, cfg: Config, res: Results) -> None:
    """Client RSS while one worker drains the whole backlog with claim_many + ack_many."""
    sec = f"{env.label}.memory"
    m = cfg.memory_messages
    reset_ours(env.admin, QUEUE)
    t0 = time.perf_counter()
    build_ours(env.admin, QUEUE, m, max(10, m // 10))
    settle(env)
    log(f"{sec} built {m} messages ({time.perf_counter() - t0:.1f}s)")
    q = env.ours()
    gc.collect()
    every = max(cfg.many, m // 50)
    drained = 0
    next_sample = 0
    t0 = time.perf_counter()
    while True:
        if drained >= next_sample:
            res.add(sec, "ours", drained, "MiB", rss_mb())
            next_sample += every
        leases = q.claim_many("mem", VISIBILITY, cfg.many)
        if not leases:
            break
        q.ack_many(leases)
        drained += len(leases)
    seconds = time.perf_counter() - t0
    res.add(sec, "ours", drained, "MiB", rss_mb())
    res.add(f"{sec}.rate", "ours", m, "msg/s", drained / seconds)
    q.close()
    log(f"{sec} drained {drained} in {seconds:.1f}s, RSS now {rss_mb():.1f} MiB")
    drop_all(env.admin, QUEUE)


# ----------------------------------------------------------------------- where the time goes


class _Timer:
    """Sends requests with `?timings` over urllib3 and keeps, per kind of request, the
    client's wall time, rqlite's `time` and the sum of the statements' SQL times (ms)."""

    def __init__(self, url: str) -> None:
        self.pool = urllib3.connection_from_url(url, maxsize=4, retries=False)
        self.samples: dict[str, list[tuple[float, float, float]]] = {}

    def send(self, op: str, path: str, body: bytes) -> tuple[int, bytes]:
        sep = "&" if "?" in path else "?"
        t0 = time.perf_counter()
        r = self.pool.urlopen(
            "POST", path + sep + "timings", body=body, headers=HEADERS, retries=False
        )
        wall = time.perf_counter() - t0
        reply = json.loads(r.data)
        results = reply["results"]
        sql_time = sum(x.get("time", 0.0) for x in results)
        self.samples.setdefault(op, []).append(
            (1e3 * wall, 1e3 * reply.get("time", 0.0), 1e3 * sql_time)
        )
        if op.startswith("ours") and len(results) > 1:
            for k, x in enumerate(results):
                t = 1e3 * x.get("time", 0.0)
                self.samples.setdefault(f"{op}, statement {k + 1}", []).append((t, t, t))
        return r.status, r.data

    def plan(self, op: str, plan: Any) -> Any:
        """Send a core plan exactly as the library does, and read its reply."""
        req = request_for(plan.batch)
        status, data = self.send(op, req.path, req.body)
        return plan.read(Reply(plan.batch, parse_reply(status, data, req.statements)))

    def seed(self, op: str, path: str, statements: list[list[Any]]) -> Any:
        return json.loads(self.send(op, path, json.dumps(statements).encode())[1])

    def close(self) -> None:
        self.pool.close()


def _fenced(core: QueueCore, plan: Any) -> Any:
    """The plan as the transport sends it: with the schema fence at its end."""
    return dataclasses.replace(plan, batch=plan.batch.last(*schema.fence(core.names, True)))


def _round(core: QueueCore, **spec: Any) -> Any:
    checked = round_spec.check(core, RoundSpec(worker_id="t", **spec))
    return _fenced(core, rounds.plan(core, checked))


def _time_ours(t: _Timer, core: QueueCore, i: int, many: int) -> None:
    t.send("floor: UPDATE", WRITE_PATH, json.dumps([[FLOOR_UPDATE, 0]]).encode())
    leases = t.plan("ours: claim", _round(core, visibility=VISIBILITY, n=1)).leases
    plan = _round(core, visibility=VISIBILITY, n=1, ack=leases)
    leases = t.plan("ours: Worker round, ack 1 + claim 1", plan).leases
    t.plan("ours: ack", _round(core, ack=leases))
    if i % 4 == 0:
        probe = probes.plan(core, 0)
        fence, slot = schema.fence(core.names, False)
        probe = dataclasses.replace(probe, batch=probe.batch.last(fence, slot))
        t.plan("ours: probe (node-local read)", probe)
        items = Message.parse_many(_items(100, i))
        checked = messages.checked(core, items, scoped=False)
        t.plan("ours: publish_many(100)", _fenced(core, publishing.plan(core, checked)))
        batch = t.plan(f"ours: claim_many({many})", _round(core, visibility=VISIBILITY, n=many))
        plan = _round(core, visibility=VISIBILITY, n=many, ack=batch.leases)
        again = t.plan(f"ours: Worker round, ack {many} + claim {many}", plan).leases
        t.plan(f"ours: ack_many({many})", _round(core, ack=again))


def _time_seed(t: _Timer) -> None:
    token = f"t:{uuid.uuid4()}"
    now = time.time()
    t.seed(
        "seed: claim 1/3 UPDATE",
        "/db/execute",
        [[seed.CLAIM, token, now + VISIBILITY, now, now, 0]],
    )
    reply = t.seed("seed: claim 2/3 read-back", "/db/query?level=strong", [[seed.READ_BACK, token]])
    seq, group_id, _ = reply["results"][0]["values"][0]
    t.seed("seed: claim 3/3 groups", "/db/execute", [[seed.MARK_GROUP, time.time(), group_id]])
    t.seed(
        "seed: ack",
        "/db/execute?transaction",
        [[seed.ACK_MESSAGE, seq], [seed.ACK_GROUP, group_id, group_id]],
    )


def timings(env: Env, cfg: Config, res: Results) -> None:
    """Per request: the client's wall time, rqlite's own `time` for the request (`?timings`:
    the HTTP handler's whole work, Raft commit included) and the sum of its statements' SQL
    times. Ours are sent exactly as the library sends them (`request_for`), over urllib3 as
    the library does, behind the Worker section's backlog."""
    assert env.url is not None
    sec = f"{env.label}.timings"
    backlog, groups = cfg.worker_backlog
    reset_ours(env.admin, QUEUE)
    build_ours(env.admin, QUEUE, backlog, groups)
    reset_seed(env.admin)
    build_seed(env.admin, cfg.cycle_backlog[0], cfg.cycle_backlog[1])
    setup_floor(env.admin)
    settle(env)
    core = make_core()
    timer = _Timer(env.url)
    try:
        for i in range(cfg.timing_requests):
            _time_ours(timer, core, i, cfg.many)
            _time_seed(timer)
    finally:
        timer.close()
    for op, rows in timer.samples.items():
        for j, what in enumerate(("wall", "server", "sql")):
            res.point(sec, op, what, "ms").values = [statistics.median(r[j] for r in rows)]
    # The library's own overhead: the same claim through the transport.
    q = env.ours()
    lat = _timed_claims(q, cfg.timing_requests)
    q.close()
    res.point(sec, "ours: claim via RqliteTransport", "wall", "ms").values = [
        statistics.median(lat)
    ]
    drop_all(env.admin, QUEUE)
    log(f"{sec}: {len(timer.samples)} request kinds timed")


def _size_run(env: Env, variant: str, sql_text: str, n: int) -> tuple[float, float]:
    """n claim+ack (or floor writes) of one variant: wall and rqlited CPU, in seconds."""
    q: Transport | None = None
    if variant.startswith("claim"):
        q = env.ours()
    floor = FloorRqlite(env.url or "")
    body = json.dumps([[sql_text, 0]]).encode()
    time.sleep(0.2)
    cpu0 = _cpu_seconds(env.server_pids)
    t0 = time.perf_counter()
    for _ in range(n):
        if q is not None:
            lease = q.claim("w", VISIBILITY, 4 if "=4" in variant else 0)
            assert lease is not None
            q.ack(lease)
        else:
            floor.post(body)
    wall = time.perf_counter() - t0
    cpu = _cpu_seconds(env.server_pids) - cpu0
    floor.close()
    if q is not None:
        q.close()
    return wall, cpu


def request_size(env: Env, cfg: Config, res: Results) -> None:
    """What the size of a request costs. rqlite v8 gzips a Raft command whose SQL passes 1024
    bytes (its command marshaler), and every node then decompresses it. Our claim+ack two ways
    (`min_priority=0`: one probe of the ready index; `min_priority=4`: the per-priority arms)
    on a queue whose groups are all priority 4; and the floor write, plain and padded with an
    SQL comment past 1024 bytes."""
    assert env.url is not None
    sec = f"{env.label}.size"
    backlog, groups = cfg.cycle_backlog
    n = 3 * cfg.timing_requests
    core = make_core()
    padded = FLOOR_UPDATE + " /*" + "x" * (1100 - len(FLOOR_UPDATE) - 6) + "*/"
    sizes = {
        "claim(min_priority=0) + ack": sum(
            len(s.sql)
            for s in _round(core, visibility=VISIBILITY, n=1, min_priority=0).batch.statements
        ),
        "claim(min_priority=4) + ack": sum(
            len(s.sql)
            for s in _round(core, visibility=VISIBILITY, n=1, min_priority=4).batch.statements
        ),
        "floor write": len(FLOOR_UPDATE),
        "floor write padded to 1100 bytes": len(padded),
    }
    setup_floor(env.admin)
    for rep in range(cfg.reps):
        for variant in rotate(list(sizes), rep):
            if variant.startswith("claim"):
                reset_ours(env.admin, QUEUE)
                build_ours(env.admin, QUEUE, backlog, groups, priority=4)
            sql_text = padded if "padded" in variant else FLOOR_UPDATE
            wall, cpu = _size_run(env, variant, sql_text, n)
            res.add(sec, f"{variant}/wall", sizes[variant], "ms/op", 1e3 * wall / n)
            res.add(sec, f"{variant}/cpu", sizes[variant], "ms/op", 1e3 * cpu / n)
            log(f"{sec} {variant}: {1e3 * wall / n:.2f} ms/op, rqlited {1e3 * cpu / n:.2f} ms CPU")
    drop_all(env.admin, QUEUE)


def prepare_cost(path: str, res: Results, repeats: int = 300) -> None:
    """Each statement of our claim on SQLite (the standard sqlite3 module): executed with the
    statement cache (compiled once), and without it (compiled on every call, as rqlite does on
    every node for every statement it applies). Ms per statement, medians over `repeats`."""
    sec = "sqlite.prepare"
    admin = SqliteAdmin(path)
    reset_ours(admin, QUEUE)
    build_ours(admin, QUEUE, 1000, 100)
    admin.close()
    core = make_core()
    for cached in (True, False):
        conn = sqlite3.connect(path, isolation_level=None, cached_statements=128 if cached else 0)
        times: dict[int, list[float]] = {}
        for _ in range(repeats):
            plan = _round(core, visibility=VISIBILITY, n=1)
            conn.execute("BEGIN IMMEDIATE")
            leased: list[Any] = []
            for k, st in enumerate(plan.batch.statements):
                t0 = time.perf_counter()
                rows = conn.execute(st.sql, st.params).fetchall()
                times.setdefault(k + 1, []).append(1e3 * (time.perf_counter() - t0))
                leased += rows
            conn.execute("ROLLBACK")
            if not leased:  # from the claim's RETURNING, or its SELECT
                raise RuntimeError("the claim found nothing")
        for k, values in times.items():
            kind = "compiled once" if cached else "compiled every call"
            res.point(sec, kind, k, "ms").values = [statistics.median(values)]
        conn.close()
    log(f"{sec}: done")


def profile(env: Env, cfg: Config, out_path: str) -> None:
    """pyinstrument over one worker's claim + ack loop (ours), written as text."""
    from pyinstrument import Profiler

    # Embedded cycles are ~50x shorter: profile more of them, with finer sampling.
    cycles, interval = (500, 0.0005) if env.server_pids else (5000, 0.0001)
    reset_ours(env.admin, QUEUE)
    build_ours(env.admin, QUEUE, cycles + 100, 100)
    q = env.ours()
    worker = QueueWorker(q, "prof")
    profiler = Profiler(interval=interval)
    profiler.start()
    done = 0
    while done < cycles:
        done += worker.step()
    profiler.stop()
    q.close()
    write_profile(profiler, out_path)
    drop_all(env.admin, QUEUE)
    log(f"profile written to {out_path}")
