"""Peer benchmark: Procrastinate on a local PostgreSQL, one lock per group.

Procrastinate runs at most one job per `lock` at a time, and the jobs of a lock in job-id
order: with `lock=f"g{group}"` that is the same per-group FIFO exclusivity as rqlite-queue's.
`messages` jobs of one no-op task are deferred round-robin over `groups` locks (not timed),
then ONE async Procrastinate worker with `concurrency` slots drains them (timed, from worker
start until every job is `succeeded`).

    python bench/peers/procrastinate_peer.py [--messages N] [--groups G]
        [--concurrency 1,8,32,64,128] [--repeats R]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import itertools
import logging
import os
import platform
import shlex
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import procrastinate
import psycopg

try:
    from .postgres import LocalPostgres, PostgresUnavailable, process_tree_cpu_seconds
except ImportError:  # run as a script: this file's folder is on sys.path
    from postgres import (  # type: ignore[no-redef]
        LocalPostgres,
        PostgresUnavailable,
        process_tree_cpu_seconds,
    )

RESULTS = Path(__file__).resolve().parents[1] / "results" / "procrastinate.md"
DEFER_CHUNK = 5000  # jobs per batch-defer statement: one round trip each, bounded size

# (group, index, start, end) of each task execution, perf_counter seconds.
Record = tuple[int, int, float, float]


@dataclass
class Checks:
    problems: list[str] = field(default_factory=list)

    def expect(self, ok: bool, problem: str) -> None:
        if not ok and len(self.problems) < 20:
            self.problems.append(problem)


# --- set-up (not timed) ----------------------------------------------------------------------


async def _reset_schema(dsn: str) -> None:
    # A fresh schema per run: no bloat, no sequence or statistics carried between runs.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("DROP SCHEMA IF EXISTS public CASCADE")
        await conn.execute("CREATE SCHEMA public")


def _make_app(dsn: str, pool_size: int | None, records: list[Record]) -> tuple[Any, Any]:
    pool_args: dict[str, Any] = {}
    if pool_size is not None:
        pool_args = {"min_size": pool_size, "max_size": pool_size}
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn, **pool_args))

    @app.task(name="noop")
    async def noop(group: int, index: int) -> None:
        start = time.perf_counter()
        # Yield once, so that a second job of the same group, if one were running, would
        # interleave with this one and the overlap check would see it.
        await asyncio.sleep(0)
        records.append((group, index, start, time.perf_counter()))

    return app, noop


async def _defer_all(app: Any, task: Any, messages: int, groups: int) -> None:
    # One batch mixes all locks, so job ids follow the round-robin defer order exactly;
    # `Task.batch_defer_async` would need one batch per lock, which would reorder the ids.
    deferrers = [task.configure(lock=f"g{g}") for g in range(groups)]
    for lo in range(0, messages, DEFER_CHUNK):
        batch = [
            deferrers[i % groups].make_new_job(group=i % groups, index=i)
            for i in range(lo, min(lo + DEFER_CHUNK, messages))
        ]
        await app.job_manager.batch_defer_jobs_async(jobs=batch)


async def _vacuum_analyze(dsn: str) -> None:
    # Planner statistics for the fresh table, so every run starts from the same state.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("VACUUM ANALYZE procrastinate_jobs")


async def _server_pid(dsn: str) -> int | None:
    """The postmaster's pid, read from its data directory (the server must be local)."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        row = await (await conn.execute("SHOW data_directory")).fetchone()
    try:
        with open(os.path.join(row[0] if row else "", "postmaster.pid")) as f:
            return int(f.readline())
    except (OSError, ValueError):
        return None


async def _commits(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        query = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        row = await (await conn.execute(query)).fetchone()
    return int(row[0]) if row else 0


# --- the timed part --------------------------------------------------------------------------


async def _remaining(dsn: str) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        query = "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'"
        row = await (await conn.execute(query)).fetchone()
    return int(row[0]) if row else -1


async def _drain(app: Any, dsn: str, concurrency: int) -> int:
    """Run the worker until every job succeeded; returns how many worker runs that took.

    With wait=False the worker stops at its first empty fetch. That also happens when the
    only jobs left wait for a lock that a running job holds, so a run may end early: start
    another one then.
    """
    runs = 0
    while True:
        await app.run_worker_async(
            concurrency=concurrency, wait=False, install_signal_handlers=False, name="bench"
        )
        runs += 1
        if await _remaining(dsn) == 0:
            return runs


# --- correctness -----------------------------------------------------------------------------


def _check_records(records: list[Record], messages: int, groups: int, checks: Checks) -> None:
    indices = sorted(index for _, index, _, _ in records)
    checks.expect(indices == list(range(messages)), "task runs != one per message")
    by_group: dict[int, list[Record]] = defaultdict(list)
    for record in records:
        by_group[record[0]].append(record)
    for group, runs in by_group.items():
        runs.sort(key=lambda r: r[2])
        for prev, cur in itertools.pairwise(runs):
            checks.expect(cur[1] > prev[1], f"group {group}: {cur[1]} ran after {prev[1]}")
            checks.expect(cur[2] >= prev[3], f"group {group}: {cur[1]} overlapped {prev[1]}")
        checks.expect(all(r[1] % groups == group for r in runs), f"group {group}: foreign message")


async def _fetch(dsn: str, query: str) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return await (await conn.execute(query)).fetchall()  # type: ignore[arg-type]


async def _check_database(dsn: str, messages: int, checks: Checks) -> None:
    jobs = await _fetch(
        dsn, "SELECT id, status, attempts, (args->>'index')::int FROM procrastinate_jobs"
    )
    checks.expect(len(jobs) == messages, f"{len(jobs)} jobs in the table")
    checks.expect(all(j[1] == "succeeded" for j in jobs), "a job is not succeeded")
    checks.expect(all(j[2] == 1 for j in jobs), "a job ran more than once")
    by_id = [j[3] for j in sorted(jobs)]
    checks.expect(by_id == sorted(by_id), "job ids do not follow the defer order")
    # Event ids come from a sequence, so their order is the order the statements ran in:
    # per lock, each job's `succeeded` must come before the next job's `started`.
    events = await _fetch(
        dsn,
        "SELECT j.lock, e.job_id, e.type FROM procrastinate_events e"
        " JOIN procrastinate_jobs j ON j.id = e.job_id"
        " WHERE e.type IN ('started', 'succeeded') ORDER BY e.id",
    )
    _check_event_order(events, messages, checks)


def _check_event_order(events: Iterable[tuple[Any, ...]], messages: int, checks: Checks) -> None:
    per_lock: dict[str, list[tuple[int, str]]] = defaultdict(list)
    count = 0
    for lock, job_id, kind in events:
        per_lock[lock].append((job_id, kind))
        count += 1
    checks.expect(count == 2 * messages, f"{count} start/success events for {messages} jobs")
    for lock, seq in per_lock.items():
        kinds = [kind for _, kind in seq]
        checks.expect(
            kinds == ["started", "succeeded"] * (len(seq) // 2), f"lock {lock}: jobs overlapped"
        )
        starts = [job_id for job_id, kind in seq if kind == "started"]
        checks.expect(starts == sorted(starts), f"lock {lock}: not in job-id order")


# --- one run ---------------------------------------------------------------------------------


async def _run(
    dsn: str, messages: int, groups: int, concurrency: int, pool_size: int | None
) -> dict[str, Any]:
    records: list[Record] = []
    await _reset_schema(dsn)
    app, task = _make_app(dsn, pool_size, records)
    server_pid = await _server_pid(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        await _defer_all(app, task, messages, groups)
        await _vacuum_analyze(dsn)
        commits0 = await _commits(dsn)
        pg0 = process_tree_cpu_seconds(server_pid) if server_pid else None
        cpu0, t0 = time.process_time(), time.perf_counter()
        worker_runs = await _drain(app, dsn, concurrency)
        seconds = time.perf_counter() - t0
        client_cpu = time.process_time() - cpu0
        pg_cpu = process_tree_cpu_seconds(server_pid) - pg0 if server_pid and pg0 else None
    # Closing the pool ended its backends, which flushes their statistics.
    await asyncio.sleep(0.3)
    # Includes a handful of the bench's own queries: noise next to thousands of jobs.
    commits = await _commits(dsn) - commits0
    checks = Checks()
    _check_records(records, messages, groups, checks)
    await _check_database(dsn, messages, checks)
    return {
        "msg_per_s": messages / seconds,
        "seconds": seconds,
        "postgres_cpu_ms_per_msg": None if pg_cpu is None else 1000 * pg_cpu / messages,
        "client_cpu_ms_per_msg": 1000 * client_cpu / messages,
        "procrastinate_version": importlib.metadata.version("procrastinate"),
        "commits_per_msg": commits / messages,
        "worker_runs": worker_runs,
        "problems": checks.problems,
    }


def run_procrastinate(
    dsn: str,
    *,
    messages: int = 20000,
    groups: int = 2000,
    concurrency: int = 8,
    pool_size: int | None = None,
) -> dict[str, Any]:
    """Defer `messages` jobs over `groups` locks, drain them with one worker, time the drain.

    The database's `public` schema is dropped and recreated first. `pool_size` None keeps
    Procrastinate's default connection pool (psycopg_pool's default size, 4).
    `postgres_cpu_ms_per_msg` is None if the server's postmaster.pid is not readable here.
    `problems` lists what the correctness checks found (empty when all passed).
    """
    return asyncio.run(_run(dsn, messages, groups, concurrency, pool_size))


# --- command line ----------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--groups", type=int, default=2000)
    parser.add_argument("--concurrency", default="1,8,32,64,128", help="comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--pool-size",
        type=int,
        default=None,
        help="connection pool size (default: Procrastinate's, 4; PostgreSQL allows 100 in all)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def _median_range(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def _table(results: dict[int, list[dict[str, Any]]]) -> list[str]:
    lines = [
        "| concurrency | msg/s | seconds | PostgreSQL CPU ms/msg | client CPU ms/msg"
        " | commits/msg | worker runs | checks |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for concurrency, runs in sorted(results.items()):
        pg = [r["postgres_cpu_ms_per_msg"] for r in runs if r["postgres_cpu_ms_per_msg"]]
        problems = sum(len(r["problems"]) for r in runs)
        cells = [
            str(concurrency),
            _median_range([r["msg_per_s"] for r in runs], ".0f"),
            f"{statistics.median(r['seconds'] for r in runs):.2f}",
            _median_range(pg, ".3f") if pg else "n/a",
            _median_range([r["client_cpu_ms_per_msg"] for r in runs], ".3f"),
            f"{statistics.median(r['commits_per_msg'] for r in runs):.2f}",
            ", ".join(str(r["worker_runs"]) for r in runs),
            "ok" if problems == 0 else f"{problems} problems",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _machine() -> str:
    mem = "?"
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"nproc {len(os.sched_getaffinity(0))} ({model}), MemTotal {mem}, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def _versions() -> str:
    names = ["procrastinate", "psycopg", "psycopg-binary", "psycopg-pool"]
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return ", ".join(found) + f" (psycopg implementation: {psycopg.pq.__impl__})"


def _report(
    args: argparse.Namespace,
    pg: LocalPostgres,
    results: dict[int, list[dict[str, Any]]],
    load: tuple[float, float],
    wall: float,
) -> str:
    pool = args.pool_size or "4 (default)"
    lines = [
        "# Procrastinate on a local PostgreSQL, one lock per group",
        "",
        f"- command: `python {shlex.join(['bench/peers/procrastinate_peer.py', *sys.argv[1:]])}`",
        f"- date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, wall time {wall:.0f} s",
        f"- machine: {_machine()}; load average at start {load[0]:.2f}, at end {load[1]:.2f}",
        f"- PostgreSQL: {pg.version}, fresh server on /dev/shm, defaults (fsync and"
        " synchronous_commit on) except shared_buffers 128MB",
        f"- client: {_versions()}; connection pool size {pool}",
        f"- workload: {args.messages} jobs of a no-op async task, deferred round-robin over"
        f" {args.groups} locks (`lock=f'g{{group}}'`, not timed), then one async worker"
        " (`run_worker_async(concurrency=C, wait=False)`) drains them; timed from worker start"
        " until every job is `succeeded`. Fresh schema per run.",
        f"- {args.repeats} runs per point, concurrencies interleaved; median (min-max)",
        "",
        *_table(results),
        "",
        "CPU per message is over the timed window: PostgreSQL is the postmaster and all its"
        " backends (/proc utime+stime, exited backends included); client is this process"
        " (`time.process_time`). commits/msg counts the server's committed transactions"
        " (pg_stat_database).",
        "",
        "Checks, per run: every job ran exactly once and ended `succeeded` with attempts 1; job"
        " ids follow the defer order; within each group the task ran in defer order with no two"
        " runs overlapping (in-memory timestamps); per lock, the event log alternates"
        " started/succeeded in job-id order.",
        "",
        "Every run (msg/s):",
        "",
    ]
    for concurrency, runs in sorted(results.items()):
        rates = ", ".join(f"{r['msg_per_s']:.0f}" for r in runs)
        lines.append(f"- concurrency {concurrency}: {rates}")
    problems = [p for runs in results.values() for r in runs for p in r["problems"]]
    if problems:
        lines += ["", "Problems found:", "", *(f"- {p}" for p in problems)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    # The worker runs in this process, so the app living in __main__ is fine: mute the warning.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    started, load0 = time.perf_counter(), os.getloadavg()[0]
    results: dict[int, list[dict[str, Any]]] = defaultdict(list)
    try:
        with LocalPostgres() as pg:
            for repeat in range(args.repeats):
                for concurrency in concurrencies:
                    result = run_procrastinate(
                        pg.dsn,
                        messages=args.messages,
                        groups=args.groups,
                        concurrency=concurrency,
                        pool_size=args.pool_size,
                    )
                    results[concurrency].append(result)
                    print(
                        f"run {repeat + 1}/{args.repeats} concurrency {concurrency}: "
                        f"{result['msg_per_s']:.0f} msg/s, problems {result['problems']}",
                        flush=True,
                    )
            report = _report(
                args, pg, results, (load0, os.getloadavg()[0]), time.perf_counter() - started
            )
    except PostgresUnavailable as exc:
        print(f"procrastinate peer skipped: PostgreSQL unavailable: {exc}")
        return 0
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    return 1 if any(r["problems"] for runs in results.values() for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
