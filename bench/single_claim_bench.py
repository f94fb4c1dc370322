"""The single claim + ack, as callers that do not use the Worker make it (harel's runner: one
`claim`, then one `ack`), against a bare write and the seed's algorithm, in one run, on a
1-node and a 3-node local cluster.

    .venv/bin/python bench/single_claim_bench.py [--reps 3] [--messages 300] [--sizes 1 3]

Per cluster: `workloads.cycle` (the main bench's claim + ack section: floor, seed and ours
interleaved, in an order rotated between repetitions) on a 1,000-message backlog in 100
groups with 1 worker, then behind a 10,000-message backlog in 1,000 groups with 1 and 8
workers. The figures are ratios taken within each repetition, medians [min-max]: the cost of
our claim + ack in bare writes (floor rate / ours rate: 2.0 is exactly two bare writes per
message) and our throughput over the seed's. Writes bench/results/single_claim.md."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import workloads
from measure import Results
from run import rqlite_env
from workloads import log

from rqlite_queue.testing import Cluster

RESULTS = Path(__file__).resolve().parent / "results" / "single_claim.md"


def ratios(res: Results, section: str, workers: int, num: str, den: str) -> list[float]:
    """num / den, repetition by repetition."""
    a, b = res.get(section, num, workers), res.get(section, den, workers)
    if a is None or b is None:
        return []
    return [x / y for x, y in zip(a.values, b.values, strict=True)]


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def rate(res: Results, section: str, system: str, workers: int) -> str:
    p = res.get(section, system, workers)
    return f"{statistics.median(p.values):.0f}" if p else "-"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--messages", type=int, default=300, help="claims per point")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 3], help="cluster sizes")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    rows: list[str] = []
    for size in args.sizes:
        res = Results()
        with Cluster(size, fast=False) as cluster:
            env = dataclasses.replace(rqlite_env(cluster), ours_async=None)
            cfg = dataclasses.replace(
                workloads.rqlite_config(False),
                reps=args.reps,
                workers=(1,),
                cycle_messages=args.messages,
                many_messages=args.messages,
            )
            log(f"{size}-node cluster up, leader {env.url}")
            try:
                workloads.cycle(env, cfg, res)
                workloads.cycle(env, cfg, res, big=True)
            finally:
                env.admin.close()
        for section, backlog, workers in (
            ("rqlite.cycle", "1,000 in 100 groups", 1),
            ("rqlite.cycle_big", "10,000 in 1,000 groups", 1),
            ("rqlite.cycle_big", "10,000 in 1,000 groups", 8),
        ):
            cost = ratios(res, section, workers, "floor", "ours")
            over_seed = ratios(res, section, workers, "ours", "seed")
            rows.append(
                f"| {size} | {backlog} | {workers} | {cell(cost)} | {cell(over_seed)} "
                f"| {rate(res, section, 'floor', workers)} | {rate(res, section, 'seed', workers)} "
                f"| {rate(res, section, 'ours', workers)} |"
            )
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = " ".join(["python bench/single_claim_bench.py", *argv])
    text = "\n".join(
        [
            "# Single claim + ack against a bare write and the seed",
            "",
            f"`{command}`, {when}. Local clusters with rqlited's default Raft timeouts, every "
            "client on the leader over urllib3; floor, seed and ours interleaved, order rotated "
            f"between the {args.reps} repetitions; ratios within each repetition, medians "
            "[min-max]. Cost in bare writes = floor writes/s over our claim + ack pairs/s.",
            "",
            "| nodes | backlog (messages) | workers | our claim + ack, in bare writes | ours / "
            "seed (throughput) | floor writes/s | seed msg/s | ours msg/s |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
