"""The Worker's throughput against its `prefetch`, on a no-op handler: how far ahead of its free
slots a round should claim by default.

    .venv/bin/python bench/prefetch_bench.py [--concurrency 1 8 64] [--multipliers 1 4 8]

One local 3-node cluster (rqlited's default Raft timeouts), the Worker on the leader; each point
drains a fresh backlog of `--messages` in `--groups` groups (`until_empty`), for each
concurrency c and each prefetch m x c, in an order reversed between repetitions. Medians
[min-max] of msg/s, and each point's ratio to prefetch = c (the default before issue 23's
change). Writes bench/results/prefetch.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

from rqlite_queue import RqliteTransport, Worker
from rqlite_queue.testing import Cluster

RESULTS = Path(__file__).resolve().parent / "results" / "prefetch.md"


def drain(url: str, concurrency: int, prefetch: int, messages: int, groups: int) -> float:
    """msg/s of one Worker draining a fresh backlog."""
    transport = RqliteTransport(url, queue=f"pf{uuid.uuid4().hex[:8]}")
    try:
        transport.setup()
        for start in range(0, messages, 500):
            end = min(start + 500, messages)
            transport.publish_many([(f"g{i % groups}", i) for i in range(start, end)])
        worker = Worker(transport, lambda lease: None, concurrency=concurrency, prefetch=prefetch)
        t0 = time.perf_counter()
        worker.run(handle_signals=False, until_empty=True)
        seconds = time.perf_counter() - t0
        if transport.stats().depth:
            raise RuntimeError("the worker stopped before the backlog was drained")
        return messages / seconds
    finally:
        transport.close()


def cell(values: list[float], fmt: str = ".0f") -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--multipliers", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    points = [(c, m) for c in args.concurrency for m in args.multipliers]
    rates: dict[tuple[int, int], list[float]] = {p: [] for p in points}
    with Cluster(3, fast=False) as cluster:
        url = cluster.wait_ready().http_url
        for rep in range(args.reps):
            for c, m in points if rep % 2 == 0 else points[::-1]:
                rate = drain(url, c, m * c, args.messages, args.groups)
                rates[(c, m)].append(rate)
                print(f"rep {rep + 1} c={c} prefetch={m * c}: {rate:.0f} msg/s", flush=True)
    rows = []
    for c, m in points:
        base = rates.get((c, 1), [])
        ratio = (
            cell([a / b for a, b in zip(rates[(c, m)], base, strict=True)], ".2f") + "x"
            if base
            else "-"
        )
        rows.append(f"| {c} | {m * c} ({m} x c) | {cell(rates[(c, m)])} | {ratio} |")
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = " ".join(["python bench/prefetch_bench.py", *argv])
    text = "\n".join(
        [
            "# The Worker's throughput against its prefetch (no-op handler)",
            "",
            f"`{command}`, {when}. One local 3-node cluster (default Raft timeouts), the Worker "
            f"on the leader draining {args.messages:,} messages in {args.groups:,} groups per "
            f"point; {args.reps} repetitions, order reversed between them; medians [min-max]. "
            "The ratio is to prefetch = concurrency, within each repetition.",
            "",
            "| concurrency | prefetch | msg/s | vs prefetch = concurrency |",
            "|---|---|---|---|",
            *rows,
            "",
        ]
    )
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
