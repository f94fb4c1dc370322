"""What one snapshot costs a read of several statements: a job's read (its outcome, then its
message: `Transport.result`) sent to the leader of a local 3-node cluster as the library sends
it now (`/db/query?level=...&transaction`) and as it did before (without `&transaction`,
each SELECT on its own), side by side over urllib3.

    .venv/bin/python bench/snapshot_reads.py [--reads 2000] [--reps 5]

Both levels the library uses: `linearizable` (a fresh `result()`) and `weak` (a waiter's
polls). Each repetition runs the four variants in an order rotated between repetitions, each
`--reads` requests of the same body; cells are medians [min-max] over the repetitions of the
wall time per read and of the 3 rqlited processes' CPU per read (from /proc); the ratio
(with / without) is taken within each repetition. Writes bench/results/snapshot_reads.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import urllib3
from measure import rotate
from systems import cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rqlite_queue import Transport  # noqa: E402
from rqlite_queue._protocol import jobs  # noqa: E402
from rqlite_queue._protocol.http import request_for  # noqa: E402
from rqlite_queue.local_cluster import Cluster  # noqa: E402

LEVELS = ("linearizable", "weak")


def spread(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    v = [x * scale for x in values]
    return f"{statistics.median(v):.{digits}f} [{min(v):.{digits}f}-{max(v):.{digits}f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    with Cluster(3) as cluster:
        q = Transport.from_url(cluster.url, queue="snap")
        seq = q.publish("g", {"n": 1}, keep=3600)
        body = request_for(jobs.job(q._core, "g", seq).batch).body
        q.close()
        leader = cluster.leader()
        pids = [node.pid for node in cluster.nodes if node.pid is not None]
        pool = urllib3.HTTPConnectionPool("127.0.0.1", int(leader.http_addr.split(":")[1]))
        headers = {"Content-Type": "application/json"}
        variants = [(level, tx) for level in LEVELS for tx in (False, True)]
        wall: dict[tuple[str, bool], list[float]] = {v: [] for v in variants}
        cpu: dict[tuple[str, bool], list[float]] = {v: [] for v in variants}
        for rep in range(args.reps):
            for level, tx in rotate(variants, rep):
                path = f"/db/query?level={level}" + ("&transaction" if tx else "")
                reply = pool.urlopen("POST", path, body=body, headers=headers)
                assert reply.status == 200 and b'"error"' not in reply.data, reply.data
                cpu0, t0 = cpu_seconds(pids), time.perf_counter()
                for _ in range(args.reads):
                    pool.urlopen("POST", path, body=body, headers=headers).data  # noqa: B018
                took, used = time.perf_counter() - t0, cpu_seconds(pids) - cpu0
                wall[(level, tx)].append(took / args.reads)
                cpu[(level, tx)].append(used / args.reads)
        pool.close()

    lines = [
        "# A snapshot for reads of several statements: what `&transaction` costs",
        "",
        f"`python bench/snapshot_reads.py --reads {args.reads} --reps {args.reps}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. A job's read (two SELECTs) "
        "to the leader of a local 3-node cluster over urllib3, with and without "
        "`&transaction`, the four variants in turn (order rotated between repetitions); "
        "medians [min-max] over the repetitions; ratios taken within each repetition.",
        "",
        "| level | µs a read, without | with | with / without | rqlited CPU µs a read, "
        "without | with | with / without |",
        "|---|---|---|---|---|---|---|",
    ]
    for level in LEVELS:
        off, on = (level, False), (level, True)
        wall_ratio = [b / a for a, b in zip(wall[off], wall[on], strict=True)]
        cpu_ratio = [b / a for a, b in zip(cpu[off], cpu[on], strict=True)]
        lines.append(
            f"| {level} | {spread(wall[off], 1e6)} | {spread(wall[on], 1e6)} | "
            f"{spread(wall_ratio, digits=2)}x | {spread(cpu[off], 1e6)} | "
            f"{spread(cpu[on], 1e6)} | {spread(cpu_ratio, digits=2)}x |"
        )
    text = "\n".join(lines) + "\n"
    (ROOT / "bench" / "results" / "snapshot_reads.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
