"""Context, not a peer: River (Go, on PostgreSQL) draining no-op jobs, unordered.

River has no per-group FIFO and no exclusivity, and runs on one unreplicated PostgreSQL: its
line says how fast a PostgreSQL job queue goes when it need not keep any order, beside our
workload's numbers. `river(dsn, reps)` runs River's `river bench --num-total-jobs N` (see
bench/peers/river.py) on a fresh database of that server per repetition; `river_md` is its
section of the report.

    .venv/bin/python bench/river_bench.py [--reps 3] [--jobs 20000]

starts its own PostgreSQL (bench/peers/postgres.py), prints the section and writes it to
bench/results/river.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import statistics
import sys
from pathlib import Path

from peers.postgres import LocalPostgres, PostgresUnavailable
from peers.river import RIVER_VERSION, RiverUnavailable, river_binary, run_river_bench
from peers.river import shown_command as command

RESULTS = Path(__file__).resolve().parent / "results" / "river.md"
# As many jobs as the FULL Worker workload's messages (bench/workloads.py: 20,000).
JOBS = 20_000

__all__ = ["JOBS", "RiverUnavailable", "command", "describe", "river", "river_md"]


def describe() -> str:
    """What the River line ran: River's own CLI, or its bench rebuilt on River's main module."""
    return river_binary().describe


def river(pg_dsn: str, reps: int, jobs: int = JOBS) -> list[float]:
    """jobs/s of each of `reps` runs of `river bench --num-total-jobs jobs`, each on a fresh
    database of the PostgreSQL server at `pg_dsn`. Raises RiverUnavailable (one line) if River
    cannot be built or run: the caller skips River with that line."""
    binary = river_binary()
    return [run_river_bench(pg_dsn, jobs, binary).jobs_per_s for _ in range(reps)]


def river_md(values: list[float], command: str, version: str, binary: str = "") -> str:
    """The report's River section. `command` is the bench's command line (`command(jobs)`),
    `version` the PostgreSQL server's (LocalPostgres.version), `binary` what ran (`describe()`)."""
    version = version.replace("postgres (PostgreSQL) ", "PostgreSQL ")  # as `postgres --version`
    reps = ", ".join(f"{v:,.0f}" for v in values)
    median = statistics.median(values) if values else float("nan")
    return (
        "### Context: River, unordered (not a peer)\n\n"
        f"River {RIVER_VERSION} (Go) on {version}, one unreplicated server on this machine "
        "(fsync on, data on `/dev/shm`), with **its own workload**: no-op jobs of one kind "
        "inserted before the start, then worked down by one client with River's bench settings "
        "(one queue of 2,000 workers, 2 ms fetch cooldown). River has **no per-group FIFO and "
        "no exclusivity**: any job runs beside any other, and nothing is replicated. It is "
        "context for how fast an unordered PostgreSQL queue drains, not a peer on our "
        "workload (Procrastinate, with one lock per group, is that).\n\n"
        "| system | order | jobs | repetitions (jobs/s) | median jobs/s |\n"
        "| --- | --- | ---: | --- | ---: |\n"
        f"| River {RIVER_VERSION} (`river bench` workload) | none | {_jobs(command)} | {reps} | "
        f"{median:,.0f} |\n\n"
        f"Command, per repetition (a fresh database, `river migrate-up`, then): `{command}`. "
        "jobs/s is River's own figure: jobs worked over the time from the client's start to "
        "the last job's completion event." + (f" Binary: {binary}." if binary else "") + "\n"
    )


def _jobs(command: str) -> str:
    words = command.split()
    return f"{int(words[words.index('--num-total-jobs') + 1]):,}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=JOBS)
    args = parser.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    try:
        what = describe()
        print(what, file=sys.stderr)
        with LocalPostgres() as pg:
            values = river(pg.dsn, args.reps, args.jobs)
            version = pg.version
    except (RiverUnavailable, PostgresUnavailable) as exc:
        print(f"River skipped: {exc}")
        return 1
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    md = river_md(values, command(args.jobs), version, what)
    ran = shlex.join([".venv/bin/python", "bench/river_bench.py", *argv])
    md += f"\nRun {when} with `{ran}`; load average at start {load}, {os.cpu_count()} cores.\n"
    print(md)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
