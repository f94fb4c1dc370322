"""Benchmarks on one freshly started local 3-node rqlite cluster (and the embedded SQLite mode):
the Worker and AsyncWorker against bare rqlite writes, Procrastinate on a local PostgreSQL and
harel's own rqlite transport; idle costs and pickup latency; and the transport's operations
against the seed's algorithm.

    .venv/bin/python bench/run.py            # quick: a few minutes
    .venv/bin/python bench/run.py --full     # the 20,000-message Worker workload, 1M backlogs

Writes bench/results/latest.json (every point, every repetition), latest.md (tables, ratios,
target verdicts) and the PNG plots beside them."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.util
import json
import os
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import report
import river_bench
import worker_bench
import workloads
from measure import Point, Results
from seed_transport import SeedRqliteTransport, SeedSqliteTransport
from systems import FloorRqlite, FloorSqlite, RqliteAdmin, SqliteAdmin
from worker_bench import Peers
from workloads import QUEUE, Config, Env, log

from rqlite_queue import (
    AsyncRqliteTransport,
    AsyncSqliteTransport,
    RqliteTransport,
    SqliteTransport,
)
from rqlite_queue.rqlited import find_rqlited
from rqlite_queue.testing import Cluster, live_pids

RESULTS = Path(__file__).resolve().parent / "results"
RQLITE_WORKLOADS = (
    "worker",
    "idle",
    "timings",
    "size",
    "publish",
    "cycle",
    "cycle_big",
    "sweep",
    "priority",
    "delayed",
    "memory",
    "profile",
    "profile_worker",
)
SQLITE_WORKLOADS = (
    "worker",
    "publish",
    "cycle",
    "cycle_big",
    "sweep",
    "priority",
    "delayed",
    "prepare",
    "profile",
    "profile_worker",
)


def machine(full: bool, argv: list[str]) -> dict[str, str]:
    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = "?"
    return {
        "command": "make bench"
        + (" FULL=1" if full else "")
        + f" (bench/run.py {' '.join(argv)})".replace(" )", ")"),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"nproc {os.cpu_count()}, MemTotal {mem}, {cpu}",
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "software": f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"rqlited {find_rqlited().label} (3 nodes, data on /dev/shm, default Raft timeouts)",
        "commit": f"{commit} (plus the working tree)",
        "mode": "FULL" if full else "quick",
    }


def run_all(
    env: Env,
    cfg: Config,
    names: tuple[str, ...],
    only: set[str] | None,
    res: Results,
    peers: Peers,
) -> None:
    steps: dict[str, Callable[[], None]] = {
        "worker": lambda: worker_bench.worker_section(env, cfg, res, peers),
        "idle": lambda: worker_bench.idle(env, cfg, res),
        "timings": lambda: workloads.timings(env, cfg, res),
        "size": lambda: workloads.request_size(env, cfg, res),
        "publish": lambda: workloads.publish(env, cfg, res),
        "cycle": lambda: workloads.cycle(env, cfg, res),
        "cycle_big": lambda: workloads.cycle(env, cfg, res, big=True),
        "sweep": lambda: workloads.sweep(env, cfg, res),
        "priority": lambda: workloads.priority(env, cfg, res),
        "delayed": lambda: workloads.delayed(env, cfg, res),
        "memory": lambda: workloads.memory(env, cfg, res),
        "prepare": lambda: workloads.prepare_cost(env.path, res),
        "profile": lambda: workloads.profile(
            env, cfg, str(RESULTS / f"profile_{env.label}_claim_ack.txt")
        ),
        "profile_worker": lambda: worker_bench.profile_async_worker(
            env, str(RESULTS / f"profile_{env.label}_async_worker_c1.txt")
        ),
    }
    for name in names:
        if only is not None and name not in only:
            continue
        if env.url is not None:
            worker_bench.drift(env, res, name)
        t0 = time.monotonic()
        steps[name]()
        log(f"== {env.label} {name} done in {time.monotonic() - t0:.1f}s")
        save(res)


def save(res: Results) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    data = [p.to_json() for p in res.points]
    (RESULTS / "latest.json").write_text(json.dumps(data, indent=1))


def rqlite_env(cluster: Cluster) -> Env:
    url = cluster.wait_ready().http_url  # every client talks to the leader
    admin = RqliteAdmin(url)

    def ours_on(queue: str) -> RqliteTransport:
        t = RqliteTransport(url, timeout=120.0, queue=queue)
        t.setup()
        return t

    return Env(
        label="rqlite",
        admin=admin,
        ours=lambda: ours_on(QUEUE),
        ours_on=ours_on,
        seed=lambda: SeedRqliteTransport(url),
        floor=lambda i: FloorRqlite(url, i),
        ours_async=lambda: AsyncRqliteTransport(url, timeout=120.0, queue=QUEUE),
        url=url,
        server_pids=[n.pid for n in cluster.nodes if n.pid is not None],
        raft=admin.raft,
    )


def sqlite_env(path: str) -> Env:
    def ours_on(queue: str) -> SqliteTransport:
        t = SqliteTransport(path, queue=queue)
        t.setup()
        return t

    return Env(
        label="sqlite",
        path=path,
        admin=SqliteAdmin(path),
        ours=lambda: ours_on(QUEUE),
        ours_on=ours_on,
        seed=lambda: SeedSqliteTransport(path),
        floor=lambda i: FloorSqlite(path, i),
        ours_async=lambda: AsyncSqliteTransport(path, queue=QUEUE),
    )


def _missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


@contextlib.contextmanager
def start_peers(wanted: bool) -> Iterator[Peers]:
    """harel if installed, with a local Redis for its RedisTransport (bench/peers/
    redis_server.py); a local PostgreSQL for Procrastinate and harel's PostgresTransport
    (installed with apt-get once if missing, by bench/peers/postgres.py); all stopped on exit. A
    peer that cannot run is skipped with one line saying why."""
    if not wanted:
        yield Peers(skipped=("peers not run (--no-peers, --only or --no-rqlite)",))
        return
    skipped: list[str] = []
    harel = not _missing("harel", "requests")
    if not harel:
        skipped.append("harel peer skipped: harel 0.9.0 or requests is not installed")
    with contextlib.ExitStack() as stack:
        redis_url, redis_version = None, ""
        if harel and _missing("redis"):
            skipped.append("harel's Redis transport skipped: the redis package is not installed")
        elif harel:
            from peers.redis_server import LocalRedis, RedisUnavailable

            try:
                server = stack.enter_context(LocalRedis())
                redis_url, redis_version = server.url, server.version.split(" sha=")[0]
                log(f"Redis up: {redis_version}, port {server.port}")
            except RedisUnavailable as exc:
                skipped.append(f"harel's Redis transport skipped: Redis unavailable: {exc}")
        found = dict(harel=harel, redis_url=redis_url, redis_version=redis_version)
        if _missing("procrastinate", "psycopg"):
            skipped.append("procrastinate peer skipped: procrastinate or psycopg is not installed")
            yield Peers(**found, skipped=tuple(skipped))
            return
        from peers.postgres import LocalPostgres, PostgresUnavailable

        try:
            pg = stack.enter_context(LocalPostgres())
        except PostgresUnavailable as exc:
            skipped.append(f"procrastinate peer skipped: PostgreSQL unavailable: {exc}")
            yield Peers(**found, skipped=tuple(skipped))
            return
        log(f"PostgreSQL up: {pg.version}, port {pg.port}")
        yield Peers(pg.dsn, pg.version, skipped=tuple(skipped), **found)


def river_context(peers: Peers, res: Results, meta: dict[str, str]) -> None:
    """River's own bench on the peers' PostgreSQL: the fast-unordered context line (no per-group
    order: not a peer). Skipped with one line if River cannot be built or run."""
    if not peers.pg_dsn:
        return
    try:
        values = river_bench.river(peers.pg_dsn, 3)
        meta["river"] = river_bench.describe()
    except river_bench.RiverUnavailable as exc:
        meta["river"] = f"river skipped: {exc}"
        log(meta["river"])
        return
    p = None
    for v in values:
        p = res.add("river", "river", river_bench.JOBS, "jobs/s", v)
    if p is not None:
        p.note = river_bench.command(river_bench.JOBS)
    meta["river_pg"] = peers.pg_version
    log(f"river: {', '.join(f'{v:.0f}' for v in values)} jobs/s")


def smoke(cfg: Config) -> Config:
    return dataclasses.replace(
        cfg,
        reps=2,
        publish_single=10,
        publish_batches={10: 2, 100: 1},
        workers=(1, 4),
        cycle_messages=40,
        many_messages=64,
        sweep_sizes=(1_000, 5_000),
        sweep_claims=3,
        seed_budget_s=2.0,
        priority_behind=2_000,
        delayed_behind=2_000,
        memory_messages=min(cfg.memory_messages, 1_000),
        timing_requests=min(cfg.timing_requests, 5),
        worker_reps=1,
        worker_concurrency=(1, 8),
        worker_backlog=(400, 40),
        worker_c1_messages=50,
        floor_writes=50,
        procrastinate_concurrency=(8,),
        harel_concurrency=(8,),
        harel_window_s=1.0,
        idle_s=2.0,
        idle_baseline_s=1.0,
        pickups=5,
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--full", action="store_true", help="1M backlogs, more repetitions")
    parser.add_argument("--only", help=f"comma list of: {', '.join(RQLITE_WORKLOADS)}")
    parser.add_argument("--no-rqlite", action="store_true")
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--no-peers", action="store_true", help="no Procrastinate, no harel")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the code only")
    parser.add_argument("--report-only", action="store_true", help="redo latest.md and plots")
    args = parser.parse_args(argv)
    RESULTS.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    meta_path = RESULTS / "latest.meta.json"
    if args.report_only:
        res = Results(
            [Point.from_json(d) for d in json.loads((RESULTS / "latest.json").read_text())]
        )
        meta = json.loads(meta_path.read_text())
    else:
        meta = machine(args.full, argv)
        meta_path.write_text(json.dumps(meta, indent=1))
        res = Results()
        started = time.monotonic()
        before = live_pids()
        wanted = not (args.no_peers or args.no_rqlite) and (only is None or "worker" in only)
        if not args.no_rqlite:
            # rqlite's default Raft timeouts: the harness's fast ones let the leader change
            # under load on this small machine, which would spoil the Raft entry counts.
            with start_peers(wanted) as peers, Cluster(3, fast=False) as cluster:
                meta["peers"] = worker_bench.describe_peers(peers)
                for line in peers.skipped:
                    log(line)
                env = rqlite_env(cluster)
                log(f"cluster up, leader {env.url}")
                try:
                    cfg = workloads.rqlite_config(args.full)
                    cfg = smoke(cfg) if args.smoke else cfg
                    run_all(env, cfg, RQLITE_WORKLOADS, only, res, peers)
                    if not args.smoke and (only is None or "worker" in only):
                        river_context(peers, res, meta)
                finally:
                    env.admin.close()
        leftover = live_pids() - before
        if leftover:
            log(f"WARNING: rqlited processes left behind: {sorted(leftover)}")
        if not args.no_sqlite:
            shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
            tmp = tempfile.mkdtemp(prefix="rq-bench-", dir=shm)
            env = sqlite_env(os.path.join(tmp, "bench.db"))
            try:
                cfg = workloads.sqlite_config(args.full)
                cfg = smoke(cfg) if args.smoke else cfg
                run_all(env, cfg, SQLITE_WORKLOADS, only, res, Peers())
            finally:
                env.admin.close()
                shutil.rmtree(tmp, ignore_errors=True)
        meta["duration"] = f"{time.monotonic() - started:.0f} s"
        meta_path.write_text(json.dumps(meta, indent=1))
        save(res)
    images = report.plots(res, RESULTS)
    (RESULTS / "latest.md").write_text(report.markdown(res, meta, images))
    log(f"wrote {RESULTS / 'latest.md'} and {len(images)} plots")
    if not args.smoke and not args.report_only and only is None:
        # Keep the last complete run of each mode beside `latest`.
        keep = RESULTS / meta["mode"].lower()
        keep.mkdir(exist_ok=True)
        for name in ["latest.md", "latest.json", "latest.meta.json", *images]:
            shutil.copy(RESULTS / name, keep / name)
        for profile in RESULTS.glob("profile_*.txt"):
            shutil.copy(profile, keep / profile.name)
        log(f"copied to {keep}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
