"""The workloads, each run on one `Env` (a 3-node rqlite cluster, or a local SQLite file) for
the three systems side by side: the floor, the seed, and ours. Every point is repeated
`cfg.reps` times; within a repetition the systems run one after the other, in an order that
rotates from one repetition to the next."""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import os
import sqlite3
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx
import seed_transport as seed
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
    Admin,
    AsyncFloorRqlite,
    SqliteAdmin,
    build_ours,
    build_seed,
    drop_all,
    reset_ours,
    reset_seed,
    setup_floor,
)

from rqlite_queue import AsyncTransport, Transport
from rqlite_queue.core import QueueCore
from rqlite_queue.rqlite_http import parse_reply, request_for

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
    memory_messages: int
    timing_requests: int
    cap_s: float  # safety cap on one concurrent run


def rqlite_config(full: bool) -> Config:
    return Config(
        reps=5 if full else 3,
        publish_single=300 if full else 100,
        publish_batches={10: 30, 100: 10, 1000: 3} if full else {10: 10, 100: 5, 1000: 2},
        workers=(1, 8, 32),
        cycle_backlog=(1000, 100),
        cycle_big_backlog=(10_000, 1_000),
        cycle_messages=600 if full else 200,
        many=32,
        many_messages=640,
        sweep_sizes=(1_000, 10_000, 100_000, 1_000_000) if full else (1_000, 10_000, 100_000),
        sweep_claims=30 if full else 15,
        seed_budget_s=90.0 if full else 8.0,
        priority_behind=1_000_000 if full else 100_000,
        priority_high=(200, 20),
        memory_messages=1_000_000 if full else 20_000,
        timing_requests=200 if full else 60,
        cap_s=120.0,
    )


def sqlite_config(full: bool) -> Config:
    return Config(
        reps=5 if full else 3,
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
        seed_budget_s=60.0 if full else 6.0,
        priority_behind=1_000_000 if full else 100_000,
        priority_high=(200, 20),
        memory_messages=0,
        timing_requests=0,
        cap_s=120.0,
    )


@dataclass
class Env:
    label: str  # "rqlite" or "sqlite": the prefix of every section
    admin: Admin
    ours: Callable[[], Transport]  # a set-up transport on QUEUE
    seed: Callable[[], Any]  # SeedRqliteTransport | SeedSqliteTransport, set up
    floor: Callable[[int], Any]  # FloorRqlite | FloorSqlite writing row i
    ours_async: Callable[[], AsyncTransport] | None = None
    url: str | None = None  # rqlite: the node every client talks to (the leader)
    server_pids: list[int] = field(default_factory=list)
    path: str = ""  # sqlite: the database file


_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def _cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / _CLK_TCK


_CLK_TCK = float(os.sysconf("SC_CLK_TCK"))


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


def publish(env: Env, cfg: Config, res: Results) -> None:
    sec = f"{env.label}.publish"
    n = cfg.publish_single
    tasks: list[tuple[str, int]] = [("floor", 1), ("seed", 1), ("ours", 1)]
    tasks += [("ours", b) for b in cfg.publish_batches]
    setup_floor(env.admin)
    for rep in range(cfg.reps):
        for system, batch in rotate(tasks, rep):
            if system == "floor":
                f = env.floor(0)
                t0 = time.perf_counter()
                for _ in range(n):
                    f.write()
                seconds = time.perf_counter() - t0
                f.close()
                count = n
            elif system == "seed":
                reset_seed(env.admin)
                s = env.seed()
                t0 = time.perf_counter()
                for i in range(n):
                    s.publish(f"p{i % 100}", {"i": i})
                seconds = time.perf_counter() - t0
                s.close()
                count = n
            else:
                reset_ours(env.admin, QUEUE)
                q = env.ours()
                if batch == 1:
                    t0 = time.perf_counter()
                    for i in range(n):
                        q.publish(f"p{i % 100}", {"i": i})
                    seconds = time.perf_counter() - t0
                    count = n
                else:
                    batches = cfg.publish_batches[batch]
                    items = [
                        [(f"p{i % 100}", {"i": i}) for i in range(k * batch, (k + 1) * batch)]
                        for k in range(batches)
                    ]
                    t0 = time.perf_counter()
                    for chunk in items:
                        q.publish_many(chunk)
                    seconds = time.perf_counter() - t0
                    count = batch * batches
                q.close()
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
        async with httpx.AsyncClient(timeout=60.0, trust_env=False) as client:
            floors = [
                AsyncFloorWorker(AsyncFloorRqlite(client, env.url, i)) for i in range(workers)
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
        systems += ["ours_async", "floor_async"]
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


def timings(env: Env, cfg: Config, res: Results) -> None:
    """Per request: the client's wall time, rqlite's own `time` for the request (`?timings`:
    the HTTP handler's whole work, Raft commit included) and the sum of its statements' SQL
    times. Ours are sent exactly as the library sends them (`request_for`)."""
    assert env.url is not None
    sec = f"{env.label}.timings"
    backlog, groups = cfg.cycle_backlog
    reset_ours(env.admin, QUEUE)
    build_ours(env.admin, QUEUE, backlog, groups)
    reset_seed(env.admin)
    build_seed(env.admin, backlog, groups)
    setup_floor(env.admin)
    core = QueueCore(queue=QUEUE)
    samples: dict[str, list[tuple[float, float, float]]] = {}

    with httpx.Client(timeout=60.0, trust_env=False) as web:

        def send(op: str, path: str, params: dict[str, str], body: list[list[Any]]) -> Any:
            t0 = time.perf_counter()
            r = web.post(env.url + path, params={**params, "timings": ""}, json=body)
            wall = time.perf_counter() - t0
            reply = r.json()
            sql_time = sum(x.get("time", 0.0) for x in reply["results"])
            samples.setdefault(op, []).append(
                (1e3 * wall, 1e3 * reply.get("time", 0.0), 1e3 * sql_time)
            )
            if op.startswith("ours") and len(reply["results"]) > 1:
                for k, x in enumerate(reply["results"]):
                    t = 1e3 * x.get("time", 0.0)
                    samples.setdefault(f"{op}, statement {k + 1}", []).append((t, t, t))
            return r

        for i in range(cfg.timing_requests):
            send("floor: UPDATE", "/db/execute", {}, [[FLOOR_UPDATE, 0]])
            plan = core.claim("t", VISIBILITY, 1, 0)
            req = request_for(plan.batch)
            r = send("ours: claim", req.path, dict(req.params), req.body)
            leases = plan.read(parse_reply(r.status_code, r.content, len(req.body)))
            ack = core.ack(leases)
            req = request_for(ack.batch)
            r = send("ours: ack", req.path, dict(req.params), req.body)
            ack.read(parse_reply(r.status_code, r.content, len(req.body)))
            if i % 4 == 0:
                items = [(f"p{j}", {"i": j}) for j in range(100)]
                pub = core.publish_many(items)
                req = request_for(pub.batch)
                r = send("ours: publish_many(100)", req.path, dict(req.params), req.body)
                pub.read(parse_reply(r.status_code, r.content, len(req.body)))
            token = f"t:{i}"
            now = time.time()
            send(
                "seed: claim 1/3 UPDATE",
                "/db/execute",
                {},
                [[seed.CLAIM, token, now + VISIBILITY, now, now, 0]],
            )
            r = send(
                "seed: claim 2/3 read-back",
                "/db/query",
                {"level": "strong"},
                [[seed.READ_BACK, token]],
            )
            seq, group_id, _ = r.json()["results"][0]["values"][0]
            send(
                "seed: claim 3/3 groups",
                "/db/execute",
                {},
                [[seed.MARK_GROUP, time.time(), group_id]],
            )
            send(
                "seed: ack",
                "/db/execute",
                {"transaction": ""},
                [[seed.ACK_MESSAGE, seq], [seed.ACK_GROUP, group_id, group_id]],
            )
        # The same bare write from the standard library's http.client, which sends the
        # headers and the body in one send() (httpx/h11 send them separately).
        split = urlsplit(env.url)
        conn = http.client.HTTPConnection(split.hostname or "127.0.0.1", split.port or 80)
        body = json.dumps([[FLOOR_UPDATE, 0]]).encode()
        for _ in range(cfg.timing_requests):
            t0 = time.perf_counter()
            conn.request("POST", "/db/execute?timings", body, {"Content-Type": "application/json"})
            reply = json.loads(conn.getresponse().read())
            wall = time.perf_counter() - t0
            sql_time = sum(x.get("time", 0.0) for x in reply["results"])
            samples.setdefault("floor: UPDATE via http.client", []).append(
                (1e3 * wall, 1e3 * reply["time"], 1e3 * sql_time)
            )
        conn.close()
    for op, rows in samples.items():
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
    log(f"{sec}: {len(samples)} request kinds timed")


def request_size(env: Env, cfg: Config, res: Results) -> None:
    """What the size of a request costs. rqlite v8 gzips a Raft command whose SQL passes 1024
    bytes (its command marshaler), and every node then decompresses it. Two ways to claim the
    same rows: `claim(min_priority=0)` (five union arms, over 1024 bytes) and
    `claim(min_priority=4)` (one arm, under) on a queue whose groups are all priority 4; and
    the floor write, plain and padded with an SQL comment past 1024 bytes."""
    assert env.url is not None
    sec = f"{env.label}.size"
    backlog, groups = cfg.cycle_backlog
    n = 3 * cfg.timing_requests
    core = QueueCore(queue=QUEUE)
    padded = FLOOR_UPDATE + " /*" + "x" * (1100 - len(FLOOR_UPDATE) - 6) + "*/"
    sizes = {
        "claim(min_priority=0) + ack": sum(
            len(s.sql) for s in core.claim("w", VISIBILITY, 1, 0).batch.statements
        ),
        "claim(min_priority=4) + ack": sum(
            len(s.sql) for s in core.claim("w", VISIBILITY, 1, 4).batch.statements
        ),
        "floor write": len(FLOOR_UPDATE),
        "floor write padded to 1100 bytes": len(padded),
    }
    setup_floor(env.admin)
    for rep in range(cfg.reps):
        for variant in rotate(list(sizes), rep):
            q: Transport | None = None
            if variant.startswith("claim"):
                reset_ours(env.admin, QUEUE)
                build_ours(env.admin, QUEUE, backlog, groups, priority=4)
                q = env.ours()
            web = httpx.Client(timeout=60.0, trust_env=False)
            sql_text = padded if "padded" in variant else FLOOR_UPDATE
            time.sleep(0.2)
            cpu0 = _cpu_seconds(env.server_pids)
            t0 = time.perf_counter()
            for _ in range(n):
                if q is not None:
                    lease = q.claim("w", VISIBILITY, 4 if "=4" in variant else 0)
                    assert lease is not None
                    q.ack(lease)
                else:
                    web.post(env.url + "/db/execute", json=[[sql_text, 0]]).raise_for_status()
            wall = time.perf_counter() - t0
            cpu = _cpu_seconds(env.server_pids) - cpu0
            web.close()
            if q is not None:
                q.close()
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
    core = QueueCore(queue=QUEUE)
    for cached in (True, False):
        conn = sqlite3.connect(path, isolation_level=None, cached_statements=128 if cached else 0)
        times: dict[int, list[float]] = {}
        for _ in range(repeats):
            plan = core.claim("w", VISIBILITY, 1, 0)
            conn.execute("BEGIN IMMEDIATE")
            rows: list[Any] = []
            for k, st in enumerate(plan.batch.statements):
                t0 = time.perf_counter()
                rows = conn.execute(st.sql, st.params).fetchall()
                times.setdefault(k + 1, []).append(1e3 * (time.perf_counter() - t0))
            conn.execute("ROLLBACK")
            if not rows:
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
    with open(out_path, "w") as f:
        f.write(profiler.output_text(unicode=False, color=False, show_all=False))
        f.write("\n\nSelf time per function (flat):\n\n")
        flat = profiler.output_text(unicode=False, color=False, flat=True)
        f.write("\n".join(flat.splitlines()[:40]) + "\n")
    drop_all(env.admin, QUEUE)
    log(f"profile written to {out_path}")
