"""Where the Worker's time goes at concurrency 64 behind real links (issue 34): for the Worker
and the AsyncWorker draining the same backlog over a local 3-node cluster with every link
through toxiproxy (as bench/latency_bench.py), the wall time split into the rounds' round
trips (inside `settle_and_claim`: the link, the Raft commit, the nodes' SQL) and the client's
time between them, beside the CPU of each rqlited process, of toxiproxy and of the client, and
how busy the machine's cores were during the window (all processes, other jobs included).

    .venv/bin/python bench/round_split.py [--rtt 1] [--concurrency 64] [--reps 3]
        [--backlog 2000 200] [--out bench/results/round_split.md]"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import worker_bench
from latency_bench import linked_env
from systems import build_ours, cpu_seconds, reset_ours
from workloads import QUEUE, log

from rqlite_queue import AsyncWorker, Lease, Worker
from rqlite_queue.testing import Cluster, Links

RESULTS = Path(__file__).resolve().parent / "results"
VISIBILITY = 60.0


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores so far, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


class Timed:
    """Sums the seconds spent inside `settle_and_claim` (the rounds' round trips)."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap_sync(self, transport: Any) -> None:
        inner = transport.settle_and_claim

        def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t0

        transport.settle_and_claim = timed

    def wrap_async(self, transport: Any) -> None:
        inner = transport.settle_and_claim

        async def timed(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await inner(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t0

        transport.settle_and_claim = timed


def one(
    env: Any, kind: str, c: int, backlog: tuple[int, int], pids: dict[str, int]
) -> dict[str, float]:
    reset_ours(env.admin, QUEUE)
    build_ours(env.admin, QUEUE, backlog[0], backlog[1])
    worker_bench.quiet(env)
    timed = Timed()
    cpu0 = {name: cpu_seconds([pid]) for name, pid in pids.items()}
    busy0 = machine_busy()
    client0 = time.process_time()
    if kind == "worker":
        transport = env.ours()
        timed.wrap_sync(transport)
        worker = Worker(transport, lambda lease: None, concurrency=c, visibility=VISIBILITY)
        t0 = time.perf_counter()
        worker.run(handle_signals=False, until_empty=True)
        wall = time.perf_counter() - t0
        transport.close()
        stats = worker.stats
    else:

        async def go() -> tuple[float, Any]:
            transport = env.ours_async()
            await transport.setup()
            timed.wrap_async(transport)

            async def handler(lease: Lease) -> None:
                return None

            w = AsyncWorker(transport, handler, concurrency=c, visibility=VISIBILITY)
            t0 = time.perf_counter()
            await w.run(handle_signals=False, until_empty=True)
            took = time.perf_counter() - t0
            await transport.close()
            return took, w.stats

        wall, stats = asyncio.run(go())
    client = time.process_time() - client0
    busy1 = machine_busy()
    cpu = {name: cpu_seconds([pid]) - cpu0[name] for name, pid in pids.items()}
    n = stats.acked
    out = {
        "msg/s": n / wall,
        "wall s": wall,
        "rounds": stats.rounds,
        "msg/round": n / max(1, stats.rounds),
        "ms a round": 1e3 * wall / max(1, stats.rounds),
        "ms a round trip": 1e3 * timed.seconds / max(1, stats.rounds),
        "share in round trips": timed.seconds / wall,
        "client cores": client / wall,
        "machine cores busy": (busy1[0] - busy0[0])
        / max(1, busy1[1] - busy0[1])
        * (os.cpu_count() or 1),
    }
    for name, seconds in cpu.items():
        out[f"{name} cores"] = seconds / wall
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt", type=float, default=1.0, help="ms")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--backlog", type=int, nargs=2, default=[2_000, 200])
    parser.add_argument("--out", default=str(RESULTS / "round_split.md"))
    args = parser.parse_args(argv)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results: dict[str, list[dict[str, float]]] = {"worker": [], "worker_async": []}
    with Cluster(3, fast=False, links=Links()) as cluster:
        assert cluster.links is not None
        cluster.links.latency(args.rtt / 1e3)
        env = linked_env(cluster)
        leader = cluster.wait_ready()
        pids = {
            ("leader" if n is leader else f"follower {n.node_id}"): n.pid
            for n in cluster.nodes
            if n.pid is not None
        }
        proxy = cluster._toxiproxy
        if proxy is not None:
            pids["toxiproxy"] = proxy.pid
        try:
            for rep in range(args.reps):
                for kind in (
                    ["worker", "worker_async"] if rep % 2 == 0 else ["worker_async", "worker"]
                ):
                    r = one(env, kind, args.concurrency, (args.backlog[0], args.backlog[1]), pids)
                    results[kind].append(r)
                    log(
                        f"{kind} c={args.concurrency}: "
                        + ", ".join(f"{k} {v:.3g}" for k, v in r.items())
                    )
        finally:
            env.admin.close()
    keys = list(results["worker"][0])
    lines = [
        "# Where the Worker's time goes behind real links",
        "",
        f"`python bench/round_split.py {' '.join(argv)}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; nproc {os.cpu_count()}; load "
        f"average at start {load}. A local 3-node cluster (rqlited v8.43.4) with every link "
        f"through toxiproxy at {args.rtt:g} ms +/- 10 %; each drains {args.backlog[0]} messages "
        f"in {args.backlog[1]} groups with a no-op handler at concurrency {args.concurrency}. "
        "A round trip is the time inside `settle_and_claim`; cores are CPU seconds per wall "
        "second of the window (machine: all processes, other jobs included, of "
        f"{os.cpu_count()}). Medians [min-max] of {args.reps} repetitions.",
        "",
        "| | Worker | AsyncWorker |",
        "|---|---|---|",
    ]
    for k in keys:
        cells = []
        for kind in ("worker", "worker_async"):
            vs = [r[k] for r in results[kind]]
            cells.append(f"{statistics.median(vs):.3g} [{min(vs):.3g}-{max(vs):.3g}]")
        lines.append(f"| {k} | {cells[0]} | {cells[1]} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
