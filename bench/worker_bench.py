"""The Worker section: `Worker` (threads) and `AsyncWorker` against their peers, on one backlog
(`cfg.worker_backlog`: 20,000 messages in 2,000 groups in FULL) and a no-op handler; and the
idle Worker (Raft entries while idle, pickup latency).

Every point starts from a fresh backlog built on the server, waits until the rqlited processes
are idle and the leader's Raft log stands still, then measures one window: messages handled
per second, Raft entries appended on the leader per message (`/status` `last_log_index`,
before and after; nothing else writes during the window, and a change of term is flagged),
CPU per message of the 3 rqlited processes (from /proc) and of this process.

Systems, at each concurrency, in an order rotated between repetitions:

- `worker` / `worker_async`: one `Worker` / `AsyncWorker` with `concurrency=c`, run with
  `until_empty=True` (drains the backlog); at concurrency 1 it is stopped after
  `cfg.worker_c1_messages` messages (the rest of the backlog stays queued).
- `floor` / `floor_async` (concurrency 1): the bare single-row write, one at a time, over
  urllib3 / aiohttp: the rate the Worker at concurrency 1 is compared with.
- `many` (concurrency 1): one loop of `claim_many(32)` + `ack_many`, draining the backlog.
- `procrastinate`: Procrastinate 3.10 on a local PostgreSQL, one lock per group, one worker
  with `concurrency=c` (bench/peers/procrastinate_peer.py); its CPU is PostgreSQL's.
- `harel`: harel 0.9's own `RqliteTransport` (the seed's algorithm over `requests`), driven by
  c threads each running claim -> no-op -> ack with a transport of its own, for
  `cfg.harel_window_s` seconds (it is too slow to drain the backlog).
- `harel_redis` / `harel_pg`: the same loop over harel 0.9's `RedisTransport` (Lua scripts on
  one local Redis without persistence, bench/peers/redis_server.py) and `PostgresTransport`
  (`SELECT ... FOR UPDATE SKIP LOCKED` on the local PostgreSQL): unreplicated peers with the
  same per-group exclusivity; their backlog is published through the transport before the
  window, their CPU is their server's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from measure import VISIBILITY, Cost, Meter, QueueWorker, Results, percentile, rotate, run_threads
from systems import (
    HAREL_EVENT_SQL,
    AsyncFloorRqlite,
    build_ours,
    build_seed,
    cpu_seconds,
    floor_session,
    reset_ours,
    setup_floor,
)
from workloads import QUEUE, Config, Env, log, settle, write_profile

from rqlite_queue import AsyncWorker, Lease, Worker

MANY = 32


@dataclass
class Peers:
    """The peers available in this run; `skipped` says why one is missing (one line each)."""

    pg_dsn: str | None = None
    pg_version: str = ""
    harel: bool = False
    skipped: tuple[str, ...] = ()
    redis_url: str | None = None
    redis_version: str = ""


def meter(env: Env) -> Meter:
    return Meter(env.raft, env.server_cpu if env.server_pids else None)


def quiet(env: Env) -> bool:
    """Wait until the servers are idle; True if the leader's Raft log also stood still for
    0.2 s (nothing else writing)."""
    settle(env)
    if env.raft is None:
        return True
    before = env.raft().index
    time.sleep(0.2)
    return env.raft().index == before


# -------------------------------------------------------------------------------- the runs


@dataclass
class Outcome:
    messages: int
    cost: Cost
    rounds: int = 0
    extra: dict[str, float] | None = None
    note: str = ""


def _stopper(target: int, stop: Callable[[], None]) -> Callable[[], None]:
    counter = itertools.count(1)  # next() is atomic under the GIL: safe from handler threads

    def tick() -> None:
        if next(counter) == target:
            stop()

    return tick


def run_worker(env: Env, c: int, target: int, prefetch: int | None = None) -> Outcome:
    """The Worker at concurrency `c` (its `prefetch`, if given; else its default)."""
    transport = env.ours()  # set up before the window: its bootstrap write is not counted
    worker: Worker

    def handler(lease: Lease) -> None:
        tick()

    worker = Worker(transport, handler, concurrency=c, visibility=VISIBILITY, prefetch=prefetch)
    tick = _stopper(target, worker.stop)
    m = meter(env).start()
    worker.run(handle_signals=False, until_empty=True)
    cost = m.stop()
    transport.close()
    return Outcome(worker.stats.acked, cost, worker.stats.rounds)


def run_async_worker(env: Env, c: int, target: int) -> Outcome:
    assert env.ours_async is not None
    make = env.ours_async

    async def go() -> Outcome:
        transport = make()
        await transport.setup()
        worker: AsyncWorker

        async def handler(lease: Lease) -> None:
            tick()

        worker = AsyncWorker(transport, handler, concurrency=c, visibility=VISIBILITY)
        tick = _stopper(target, worker.stop)
        m = meter(env).start()
        await worker.run(handle_signals=False, until_empty=True)
        cost = m.stop()
        await transport.close()
        return Outcome(worker.stats.acked, cost, worker.stats.rounds)

    return asyncio.run(go())


def run_floor(env: Env, writes: int) -> Outcome:
    floor = env.floor(0)
    m = meter(env).start()
    for _ in range(writes):
        floor.write()
    cost = m.stop()
    floor.close()
    return Outcome(writes, cost)


def run_floor_async(env: Env, writes: int) -> Outcome:
    assert env.url is not None
    url = env.url

    async def go() -> Outcome:
        async with floor_session() as session:
            floor = AsyncFloorRqlite(session, url)
            await floor.write()  # opens the connection before the window
            m = meter(env).start()
            for _ in range(writes):
                await floor.write()
            return Outcome(writes, m.stop())

    return asyncio.run(go())


def run_many(env: Env, target: int) -> Outcome:
    q = env.ours()
    loop = QueueWorker(q, "many", many=MANY)
    m = meter(env).start()
    done = 0
    while done < target:
        k = loop.step()
        if k == 0:
            break
        done += k
    cost = m.stop()
    q.close()
    return Outcome(done, cost)


def run_procrastinate(env: Env, cfg: Config, peers: Peers, c: int) -> Outcome:
    from peers.procrastinate_peer import run_procrastinate as drain

    assert peers.pg_dsn is not None
    backlog, groups = cfg.worker_backlog
    r = drain(peers.pg_dsn, messages=backlog, groups=groups, concurrency=c)
    messages = backlog
    cost = Cost(
        seconds=r["seconds"],
        raft_entries=None,
        server_cpu=(r["postgres_cpu_ms_per_msg"] or float("nan")) * messages / 1e3,
        client_cpu=r["client_cpu_ms_per_msg"] * messages / 1e3,
    )
    note = f"checks: {len(r['problems'])} problems" if r["problems"] else ""
    return Outcome(messages, cost, extra={"commits": r["commits_per_msg"]}, note=note)


def run_harel(env: Env, cfg: Config, c: int) -> Outcome:
    from harel.engine.schema import Names as HarelNames
    from harel.engine.transport import RqliteTransport as HarelTransport

    assert env.url is not None
    prefix = f"hb{uuid.uuid4().hex[:8]}"
    names = HarelNames(prefix)
    HarelTransport(env.url, prefix=prefix).close()  # creates its tables
    backlog, groups = cfg.worker_backlog
    tables = (names.messages, names.groups)
    build_seed(env.admin, backlog, groups, tables=tables, event_sql=HAREL_EVENT_SQL)
    if not quiet(env):
        log("WARNING: the Raft log moved while idle before a harel point")
    loops = [
        QueueWorker(HarelTransport(env.url, prefix=prefix, create_schema=False), f"h{i}")
        for i in range(c)
    ]
    m = meter(env).start()
    run = run_threads(loops, backlog, cfg.harel_window_s)
    cost = m.stop()
    for loop in loops:
        loop.close()
    env.admin.execute([[f"DROP TABLE IF EXISTS {t}"] for t in tables])
    return Outcome(run.messages, cost)


def run_harel_elsewhere(env: Env, cfg: Config, peers: Peers, system: str, c: int) -> Outcome:
    """harel's claim/ack loop over its Redis or PostgreSQL transport: c threads, a transport
    each, for `cfg.harel_window_s` seconds, behind the same backlog as the Worker's."""
    from harel.spec.states import Event

    prefix = f"hb{uuid.uuid4().hex[:8]}"
    make: Callable[[bool], Any]
    if system == "harel_redis":
        from harel.engine.transport import RedisTransport

        url = peers.redis_url
        assert url is not None
        make = lambda first: RedisTransport.from_url(url, prefix=prefix)  # noqa: E731
    else:
        from harel.engine.transport import PostgresTransport

        dsn = peers.pg_dsn
        assert dsn is not None
        make = lambda first: PostgresTransport.from_dsn(  # noqa: E731
            dsn, prefix=prefix, create_schema=first
        )
    backlog, groups = cfg.worker_backlog
    publisher = make(True)
    for i in range(backlog):
        publisher.publish(f"g{i % groups}", Event(kind="m", data={"i": i}))
    loops = [QueueWorker(make(False), f"h{i}") for i in range(c)]
    pids = _server_pids(system)  # (after the loops connect: PostgreSQL forks a backend each)
    cpu0 = cpu_seconds(pids)
    m = meter(env).start()
    run = run_threads(loops, backlog, cfg.harel_window_s)
    cost = m.stop()
    server_cpu = cpu_seconds(pids) - cpu0
    for loop in loops:
        loop.close()
    _drop_harel(publisher, system, prefix)
    publisher.close()
    # Its server's CPU, not rqlited's (idle meanwhile); no Raft log.
    cost = dataclasses.replace(
        cost, raft_entries=None, server_cpu=server_cpu if pids else float("nan")
    )
    return Outcome(run.messages, cost)


def _server_pids(system: str) -> list[int]:
    """The peer's server processes (their CPU is the server's share)."""
    name = "redis-server" if system == "harel_redis" else "postgres"
    out = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True, check=False)
    return [int(p) for p in out.stdout.split()]


def _drop_harel(transport: Any, system: str, prefix: str) -> None:
    """Leave nothing behind for the next point."""
    if system == "harel_redis":
        client = transport._r
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        return
    conn = transport._conn
    with conn.cursor() as cur:
        cur.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE %s", (f"{prefix}%",))
        for (table,) in cur.fetchall():
            cur.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
    conn.commit()


# ------------------------------------------------------------------------------ the section


def _runs(env: Env, cfg: Config, peers: Peers, c: int) -> list[str]:
    runs = ["worker"]
    if env.ours_async is not None:
        runs.append("worker_async")
    if c == 1:
        runs += ["floor", "many"] + (["floor_async"] if env.url else [])
    if peers.pg_dsn and c in cfg.procrastinate_concurrency:
        runs.append("procrastinate")
    if peers.harel and c in cfg.harel_concurrency:
        runs.append("harel")
        if peers.redis_url:
            runs.append("harel_redis")
        if peers.pg_dsn:
            runs.append("harel_pg")
    return runs


def _one(env: Env, cfg: Config, peers: Peers, system: str, c: int) -> Outcome:
    backlog, groups = cfg.worker_backlog
    if system in ("worker", "worker_async", "many") or system.startswith("worker_pf"):
        reset_ours(env.admin, QUEUE)
        build_ours(env.admin, QUEUE, backlog, groups)
    if system == "procrastinate":
        return run_procrastinate(env, cfg, peers, c)
    if system == "harel":
        return run_harel(env, cfg, c)
    if system in ("harel_redis", "harel_pg"):
        return run_harel_elsewhere(env, cfg, peers, system, c)
    still = quiet(env)
    target = backlog if c > 1 else cfg.worker_c1_messages
    if system == "worker":
        out = run_worker(env, c, target)
    elif system.startswith("worker_pf"):  # worker_pfM: prefetch M x c
        out = run_worker(env, c, target, int(system.removeprefix("worker_pf")) * c)
    elif system == "worker_async":
        out = run_async_worker(env, c, target)
    elif system == "floor":
        out = run_floor(env, cfg.floor_writes)
    elif system == "floor_async":
        out = run_floor_async(env, cfg.floor_writes)
    else:
        out = run_many(env, backlog)
    if not still:
        out.note = "the Raft log moved before the window"
    return out


def _record(res: Results, sec: str, system: str, c: int, out: Outcome) -> None:
    p = res.add(sec, system, c, "msg/s", out.messages / out.cost.seconds)
    per = out.cost.per(out.messages)
    if "raft" in per:
        res.add(f"{sec}.raft", system, c, "entries/msg", per["raft"])
    if out.cost.server_cpu or system == "procrastinate":
        res.add(f"{sec}.server_cpu", system, c, "ms/msg", per["server_ms"])
    res.add(f"{sec}.client_cpu", system, c, "ms/msg", per["client_ms"])
    if out.rounds:
        res.add(f"{sec}.per_round", system, c, "msg/round", out.messages / out.rounds)
    for key, value in (out.extra or {}).items():
        res.add(f"{sec}.{key}", system, c, f"{key}/msg", value)
    election = "election during the window" if out.cost.term_changed else ""
    p.note = "; ".join(dict.fromkeys(n for n in (p.note, out.note, election) if n))
    raft = f", {per['raft']:.3f} Raft entries/msg" if "raft" in per else ""
    log(
        f"{sec} {system} c={c}: {p.values[-1]:.0f} msg/s ({out.messages} in "
        f"{out.cost.seconds:.2f}s){raft}, server {per['server_ms']:.3f} ms/msg, "
        f"client {per['client_ms']:.3f} ms/msg" + (f" [{p.note}]" if p.note else "")
    )


def worker_section(env: Env, cfg: Config, res: Results, peers: Peers) -> None:
    sec = f"{env.label}.worker"
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    setup_floor(env.admin)
    for rep in range(cfg.worker_reps):
        for c in cfg.worker_concurrency:
            for system in rotate(_runs(env, cfg, peers, c), rep + c):
                _record(res, sec, system, c, _one(env, cfg, peers, system, c))
    reset_ours(env.admin, QUEUE)


# ----------------------------------------------------------------------------------- drift

DRIFT_WRITES = 500


def drift(env: Env, res: Results, before: str) -> None:
    """The cluster's speed before a section: bare writes/s and rqlited CPU per write (a long
    run slows rqlite down: the same write costs more once the cluster has taken a lot of
    writes, which is why ratios are taken within a repetition)."""
    setup_floor(env.admin)
    quiet(env)
    out = run_floor(env, DRIFT_WRITES)
    res.add("rqlite.drift", "floor", before, "writes/s", out.messages / out.cost.seconds)
    cpu = res.add(
        "rqlite.drift", "floor cpu", before, "ms/write", 1e3 * out.cost.server_cpu / DRIFT_WRITES
    )
    log(
        f"cluster speed before {before}: {out.messages / out.cost.seconds:.0f} writes/s, "
        f"rqlited {cpu.values[-1]:.2f} ms/write"
    )


# ------------------------------------------------------------------------------------ idle


class Background:
    """A Worker (or AsyncWorker on its own event loop) running in a thread on an empty queue,
    recording when each handler started (perf_counter, by the message's payload)."""

    def __init__(self, env: Env, kind: str) -> None:
        self.env = env
        self.kind = kind
        self.started: dict[int, float] = {}
        self.worker: Worker | AsyncWorker | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _record(self, lease: Lease) -> None:
        self.started[int(lease.event)] = time.perf_counter()

    def _main(self) -> None:
        if self.kind == "worker":
            transport = self.env.ours()

            def handler(lease: Lease) -> None:
                self._record(lease)

            sync = Worker(transport, handler, concurrency=1, visibility=VISIBILITY)
            self.worker = sync
            self._ready.set()
            sync.run(handle_signals=False)
            transport.close()
        else:
            asyncio.run(self._main_async())

    async def _main_async(self) -> None:
        assert self.env.ours_async is not None
        transport = self.env.ours_async()
        await transport.setup()

        async def handler(lease: Lease) -> None:
            self._record(lease)

        worker = AsyncWorker(transport, handler, concurrency=1, visibility=VISIBILITY)
        self.worker = worker
        self._ready.set()
        await worker.run(handle_signals=False)
        await transport.close()

    def __enter__(self) -> Background:
        self._thread.start()
        self._ready.wait(30)
        deadline = time.monotonic() + 30
        # Idle: the first (empty) claim is done and it polls with reads.
        while time.monotonic() < deadline:
            w = self.worker
            if w is not None and w.stats.rounds >= 1 and w.stats.probes >= 2:
                return self
            time.sleep(0.02)
        raise RuntimeError(f"the {self.kind} did not go idle")

    def __exit__(self, *exc: object) -> None:
        if self.worker is not None:
            self.worker.stop()
        self._thread.join(60)


def _idle_window(env: Env, cfg: Config, res: Results, sec: str, bg: Background) -> None:
    assert bg.worker is not None
    probes0 = bg.worker.stats.probes
    rounds0 = bg.worker.stats.rounds
    m = meter(env).start()
    time.sleep(cfg.idle_s)
    cost = m.stop()
    minutes = cost.seconds / 60
    entries = cost.raft_entries if cost.raft_entries is not None else float("nan")
    p = res.add(sec, bg.kind, "raft entries/min", "entries/min", entries / minutes)
    if cost.term_changed:
        p.note = "election during the window"
    res.add(sec, bg.kind, "writes/min", "rounds/min", (bg.worker.stats.rounds - rounds0) / minutes)
    res.add(sec, bg.kind, "probes/min", "reads/min", (bg.worker.stats.probes - probes0) / minutes)
    res.add(sec, bg.kind, "rqlited CPU ms/s", "ms/s", 1e3 * cost.server_cpu / cost.seconds)
    res.add(sec, bg.kind, "client CPU ms/s", "ms/s", 1e3 * cost.client_cpu / cost.seconds)
    log(
        f"{sec} {bg.kind}: {entries} Raft entries in {cost.seconds:.0f}s, "
        f"{bg.worker.stats.probes - probes0} probes, rqlited "
        f"{1e3 * cost.server_cpu / cost.seconds:.1f} ms/s"
    )


def _pickups(env: Env, cfg: Config, res: Results, sec: str, bg: Background) -> None:
    """Single messages published at random intervals (100-300 ms apart) while the worker
    idles with its default poll_interval: publish returned -> handler started, in ms."""
    publisher = env.ours()
    rng = random.Random(7)
    returned: dict[int, float] = {}
    for i in range(cfg.pickups):
        time.sleep(rng.uniform(0.1, 0.3))
        publisher.publish(f"pick{i}", i)
        returned[i] = time.perf_counter()
    deadline = time.monotonic() + 10
    while len(bg.started) < cfg.pickups and time.monotonic() < deadline:
        time.sleep(0.01)
    publisher.close()
    lat = [1e3 * (bg.started[i] - returned[i]) for i in returned if i in bg.started]
    missing = cfg.pickups - len(lat)
    for name, q in (("pickup p50", 0.5), ("pickup p99", 0.99), ("pickup max", 1.0)):
        p = res.add(sec, bg.kind, name, "ms", percentile(lat, q))
        if missing:
            p.note = f"{missing} of {cfg.pickups} not picked up within 10 s"
    log(
        f"{sec} {bg.kind} pickup: p50 {percentile(lat, 0.5):.1f} ms, "
        f"p99 {percentile(lat, 0.99):.1f} ms over {len(lat)}"
    )


def idle(env: Env, cfg: Config, res: Results) -> None:
    """The cluster with no client (baseline); then each kind of Worker idle on an empty queue
    for `cfg.idle_s`, then its pickup latency."""
    sec = f"{env.label}.idle"
    reset_ours(env.admin, QUEUE)
    quiet(env)
    m = meter(env).start()
    time.sleep(cfg.idle_baseline_s)
    base = m.stop()
    entries = base.raft_entries if base.raft_entries is not None else float("nan")
    res.add(sec, "no client", "raft entries/min", "entries/min", entries * 60 / base.seconds)
    res.add(sec, "no client", "rqlited CPU ms/s", "ms/s", 1e3 * base.server_cpu / base.seconds)
    kinds = ["worker"] + (["worker_async"] if env.ours_async is not None else [])
    for kind in kinds:
        reset_ours(env.admin, QUEUE)
        quiet(env)
        with Background(env, kind) as bg:
            _idle_window(env, cfg, res, sec, bg)
            _pickups(env, cfg, res, sec, bg)
    reset_ours(env.admin, QUEUE)


def describe_peers(peers: Peers) -> str:
    out = []
    if peers.pg_dsn:
        out.append(f"Procrastinate 3.10.0 with one lock per group, on {peers.pg_version}")
    if peers.harel:
        out.append("harel 0.9.0's RqliteTransport (requests), a claim/ack loop per thread")
    if peers.harel and peers.redis_url:
        out.append(f"harel 0.9.0's RedisTransport on {peers.redis_version} (no persistence)")
    if peers.harel and peers.pg_dsn:
        out.append(f"harel 0.9.0's PostgresTransport on {peers.pg_version}")
    return "; ".join([*out, *peers.skipped]) or "none"


def profile_async_worker(env: Env, out_path: str) -> None:
    """pyinstrument over an AsyncWorker at concurrency 1 (one thread: the event loop runs the
    loop, the HTTP client and the async handler), written as text."""
    from pyinstrument import Profiler

    assert env.ours_async is not None
    make = env.ours_async
    messages, interval = (1000, 0.0005) if env.server_pids else (5000, 0.0001)
    reset_ours(env.admin, QUEUE)
    build_ours(env.admin, QUEUE, messages + 100, 100)
    profiler = Profiler(interval=interval)

    async def go() -> None:
        transport = make()
        await transport.setup()
        worker: AsyncWorker

        async def handler(lease: Lease) -> None:
            tick()

        worker = AsyncWorker(transport, handler, concurrency=1, visibility=VISIBILITY)
        tick = _stopper(messages, worker.stop)
        profiler.start()
        await worker.run(handle_signals=False)
        profiler.stop()
        await transport.close()

    asyncio.run(go())
    write_profile(profiler, out_path)
    reset_ours(env.admin, QUEUE)
    log(f"profile written to {out_path}")
