"""Pickup latency across processes, two versions side by side: a Worker (concurrency 1,
default `poll_interval`) in a child process running one version of the library, messages
published from this process; publish returned -> handler started, in ms (one clock: same
machine).

    .venv/bin/python bench/pickup_bench.py --before REV            # after: the working tree

Three patterns, each version back to back in an order that alternates between repetitions,
on a local 3-node cluster (rqlite's default Raft timeouts): `after work`, single messages
100-300 ms apart (the worker idles between them); `idle`, single messages 1.2-1.8 s apart
(the worker has been idle for over a second); `busy`, a steady stream of `--rate` messages a
second into 50 groups for `--busy-seconds`, every message's pickup. Also the worker's idle
reads per second. Writes bench/results/pickup.md."""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from before_after import worktree  # noqa: E402

from rqlite_queue import Transport  # noqa: E402
from rqlite_queue.local_cluster import Cluster  # noqa: E402

CHILD = r"""
import json, sys, threading, time
from rqlite_queue import Transport, Worker

url, queue = sys.argv[1:3]
q = Transport.from_url(url, queue=queue)
started = {}
def handler(lease):
    started[lease.event] = time.time()
worker = Worker(q, handler, concurrency=1, visibility=60)
thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False})
thread.start()
print("ready", flush=True)
for line in sys.stdin:
    if line.strip() == "stats":
        print(json.dumps({"probes": worker.stats.probes, "time": time.monotonic()}), flush=True)
    elif line.strip() == "stop":
        break
worker.stop()
thread.join(30)
q.close()
print(json.dumps({"started": started}), flush=True)
"""


def pickups(src: Path, url: str, pattern: str, args: argparse.Namespace) -> dict[str, float]:
    queue = f"pk_{uuid.uuid4().hex[:10]}"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, queue],
        env={**os.environ, "PYTHONPATH": str(src)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    rng = random.Random(7)
    returned: dict[int, float] = {}
    reads = float("nan")
    with Transport.from_url(url, queue=queue) as q:
        time.sleep(1.5)  # idle
        child.stdin.write("stats\n")
        child.stdin.flush()
        first = json.loads(child.stdout.readline())
        time.sleep(2.0)
        child.stdin.write("stats\n")
        child.stdin.flush()
        second = json.loads(child.stdout.readline())
        reads = (second["probes"] - first["probes"]) / (second["time"] - first["time"])
        if pattern == "busy":
            end = time.monotonic() + args.busy_seconds
            i = 0
            while time.monotonic() < end:
                q.publish(f"g{i % 50}", i)
                returned[i] = time.time()
                i += 1
                time.sleep(max(0.0, (returned[0] + i / args.rate) - time.time()))
        else:
            low, high = (0.1, 0.3) if pattern == "after work" else (1.2, 1.8)
            for i in range(args.pickups):
                time.sleep(rng.uniform(low, high))
                q.publish(f"p{i}", i)
                returned[i] = time.time()
        time.sleep(1.0)
    child.stdin.write("stop\n")
    child.stdin.flush()
    out = json.loads(child.stdout.readlines()[-1])
    child.wait(30)
    started = {int(k): v for k, v in out["started"].items()}
    lat = sorted(1e3 * (started[i] - returned[i]) for i in returned if i in started)
    return {
        "p50": statistics.median(lat),
        "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "missing": len(returned) - len(lat),
        "reads": reads,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--pickups", type=int, default=30)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--busy-seconds", type=float, default=4.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "pickup.md"))
    args = parser.parse_args()
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    patterns = ["after work", "idle", "busy"]
    with tempfile.TemporaryDirectory() as tmp:
        trees = {
            "before": worktree(args.before, Path(tmp) / "before") / "src",
            "after": ROOT / "src",
        }
        try:
            with Cluster(3, fast=False) as cluster:
                cluster.wait_ready()
                for rep in range(args.reps):
                    order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
                    for pattern in patterns:
                        for version in order:
                            r = pickups(trees[version], cluster.url, pattern, args)
                            results.setdefault((pattern, version), []).append(r)
                            print(
                                f"rep {rep + 1} {pattern} {version}: p50 {r['p50']:.1f} ms, "
                                f"p99 {r['p99']:.1f} ms, idle reads {r['reads']:.0f}/s"
                                + (f", {r['missing']:.0f} missing" if r["missing"] else ""),
                                flush=True,
                            )
        finally:
            subprocess.run(
                [
                    "git",
                    "-C",
                    str(ROOT),
                    "worktree",
                    "remove",
                    "--force",
                    str(Path(tmp) / "before"),
                ],
                check=False,
                capture_output=True,
            )

    def med(pattern: str, version: str, key: str) -> str:
        values = [r[key] for r in results[(pattern, version)]]
        return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"

    lines = [
        "# Pickup latency across processes",
        "",
        f"Command: `.venv/bin/python bench/pickup_bench.py --before {args.before} --reps "
        f"{args.reps}`; after: the working tree at the time. A Worker (concurrency 1) in a child "
        "process, publishes from another; publish returned -> handler started, ms, medians "
        "[min-max] of the repetitions' p50 and p99. Idle reads: the worker's probes a second "
        "after 1.5 s without work.",
        "",
        "| pattern | before p50 | after p50 | before p99 | after p99 | idle reads/s before "
        "| after |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for pattern in patterns:
        lines.append(
            f"| {pattern} | {med(pattern, 'before', 'p50')} | {med(pattern, 'after', 'p50')} | "
            f"{med(pattern, 'before', 'p99')} | {med(pattern, 'after', 'p99')} | "
            f"{med(pattern, 'before', 'reads')} | {med(pattern, 'after', 'reads')} |"
        )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
