"""Concurrent single publishes, coalesced (group commit) or each sent on its own, beside one
thread's single publishes: the producer pattern of a web app that publishes one message per
request from many threads (issue 23, "coalesced publishes").

    .venv/bin/python bench/coalesce_bench.py                 # 3 repetitions, writes the table
    .venv/bin/python bench/coalesce_bench.py --reps 5 --threads 64 --per-thread 50

On a local 3-node rqlite cluster (rqlite's default Raft timeouts, as the main bench) and the
embedded SQLite file, each repetition runs, in an order that alternates between repetitions:
one thread making `--single` publishes; `--threads` threads each making `--per-thread`
publishes on one transport, coalesced (the default) and not (the coalescer turned off). Rates
are messages per second; ratios are taken within each repetition; medians [min-max].
Writes bench/results/coalesce.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rqlite_queue import Transport  # noqa: E402
from rqlite_queue.local_cluster import Cluster  # noqa: E402


def single(url: str, count: int) -> float:
    with Transport.from_url(url, queue=f"b_{uuid.uuid4().hex[:8]}") as q:
        q.publish("warm", 0)
        started = time.perf_counter()
        for i in range(count):
            q.publish(f"g{i % 100}", i)
        return count / (time.perf_counter() - started)


def threaded(url: str, threads: int, per_thread: int, coalesce: bool) -> tuple[float, float]:
    """Messages per second, and calls per send."""
    with Transport.from_url(url, queue=f"b_{uuid.uuid4().hex[:8]}") as q:
        q.publish("warm", 0)
        coalescer: Any = q.router.publishes
        coalescer.enabled = coalesce
        sends_before = coalescer.sends
        start = threading.Barrier(threads + 1)

        def work(t: int) -> None:
            start.wait()
            for i in range(per_thread):
                q.publish(f"g{(t * per_thread + i) % 100}", i)

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for thread in pool:
            thread.start()
        start.wait()
        started = time.perf_counter()
        for thread in pool:
            thread.join()
        seconds = time.perf_counter() - started
        total = threads * per_thread
        sends = coalescer.sends - sends_before if coalesce else total
        assert q.stats().depth == total + 1
        return total / seconds, total / max(1, sends)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=64)
    parser.add_argument("--per-thread", type=int, default=50)
    parser.add_argument("--single", type=int, default=500)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "coalesce.md"))
    args = parser.parse_args()
    rows: dict[str, dict[str, list[float]]] = {}
    with Cluster(3, fast=False) as cluster, tempfile.TemporaryDirectory() as tmp:
        cluster.wait_ready()
        urls = {"rqlite 3-node": cluster.url, "embedded SQLite": f"sqlite:///{tmp}/q.db"}
        for rep in range(args.reps):
            for backend, url in urls.items():
                cells = rows.setdefault(backend, {})
                order = [True, False] if rep % 2 == 0 else [False, True]
                one = single(url, args.single)
                cells.setdefault("one", []).append(one)
                for coalesce in order:
                    rate, per_send = threaded(url, args.threads, args.per_thread, coalesce)
                    key = "on" if coalesce else "off"
                    cells.setdefault(key, []).append(rate)
                    if coalesce:
                        cells.setdefault("per_send", []).append(per_send)
                cells.setdefault("on/one", []).append(cells["on"][-1] / one)
                cells.setdefault("on/off", []).append(cells["on"][-1] / cells["off"][-1])
                print(
                    f"rep {rep + 1} {backend}: one thread {one:,.0f}/s, {args.threads} threads "
                    f"coalesced {cells['on'][-1]:,.0f}/s ({cells['per_send'][-1]:.1f} calls a "
                    f"send), not coalesced {cells['off'][-1]:,.0f}/s",
                    flush=True,
                )

    def cell(values: list[float], fmt: str = "{:,.0f}") -> str:
        return (
            f"{fmt.format(statistics.median(values))} "
            f"[{fmt.format(min(values))}-{fmt.format(max(values))}]"
        )

    lines = [
        "# Coalesced publishes",
        "",
        f"Command: `.venv/bin/python bench/coalesce_bench.py --reps {args.reps} --threads "
        f"{args.threads} --per-thread {args.per_thread} --single {args.single}`. Single "
        "`publish` calls; messages per second, medians [min-max] of the repetitions; ratios "
        "within each repetition.",
        "",
        f"| backend | one thread | {args.threads} threads, coalesced | calls per send | "
        f"{args.threads} threads, each sent alone | coalesced / one thread | coalesced / alone |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, cells in rows.items():
        lines.append(
            f"| {backend} | {cell(cells['one'])} | {cell(cells['on'])} | "
            f"{cell(cells['per_send'], '{:.1f}')} | {cell(cells['off'])} | "
            f"{cell(cells['on/one'], '{:.2f}')} | {cell(cells['on/off'], '{:.2f}')} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
