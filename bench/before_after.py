"""Two versions of the library side by side on one cluster: the Worker's throughput and Raft
entries per message before and after a change (a refactoring must not move them).

    .venv/bin/python bench/before_after.py --before e80885b          # the redesign's check
    .venv/bin/python bench/before_after.py --before REV --after REV2 --reps 5

With `--flavours publish`, also single `publish` calls from one thread (`--publishes` of them,
into `--groups` groups): the producer's cost per message; `publish_many`, `--publish-many`
messages in calls of 1,000; `claim_ack`, one thread's `claim()` then `ack()` on a backlog of
`--messages` (it stops after `--claims`). These three run once a repetition.

Every flavour also reports the client's CPU per message (`time.process_time()` of the child
over the timed part, all its threads: the library's own cost, HTTP client included).

Each version runs from its own `git worktree` (made in a temporary directory, removed at the
end) in a child process of its own, on the same local 3-node cluster (rqlite's default Raft
timeouts, as the main bench). For every repetition, concurrency and flavour (Worker on
threads, AsyncWorker), the two versions run back to back in an order that alternates between
repetitions; each drains a fresh backlog of `--messages` in `--groups` groups with a no-op
handler (at concurrency 1 it stops after `--c1-messages`). The ratio after/before is taken
within each repetition. Writes bench/results/before_after.md."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rqlite_queue.local_cluster import Cluster  # noqa: E402

CHILD = r"""
import asyncio, json, sys, time
from rqlite_queue import AsyncTransport, AsyncWorker, Transport, Worker

url, queue, flavour, concurrency, stop_after = sys.argv[1:6]
concurrency, stop_after = int(concurrency), int(stop_after)
handled = 0

if flavour == "sync":
    q = Transport.from_url(url, queue=queue)
    worker = None
    def handler(lease):
        global handled
        handled += 1
        if stop_after and handled >= stop_after:
            worker.stop()
    worker = Worker(q, handler, concurrency=concurrency, visibility=60)
    started, cpu = time.perf_counter(), time.process_time()
    worker.run(handle_signals=False, until_empty=True)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    q.close()
else:
    async def main():
        global handled
        q = await AsyncTransport.from_url(url, queue=queue)
        worker = None
        async def handler(lease):
            global handled
            handled += 1
            if stop_after and handled >= stop_after:
                worker.stop()
        worker = AsyncWorker(q, handler, concurrency=concurrency, visibility=60)
        started, cpu = time.perf_counter(), time.process_time()
        await worker.run(handle_signals=False, until_empty=True)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
        await q.close()
        return seconds, cpu
    seconds, cpu = asyncio.run(main())
print(json.dumps({"seconds": seconds, "handled": handled, "cpu": cpu}))
"""


def raft_index(cluster: Cluster) -> int:
    return int(cluster.leader().status()["store"]["raft"]["last_log_index"])


def worktree(rev: str, into: Path) -> Path:
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(into), rev],
        check=True,
        capture_output=True,
    )
    return into


PUBLISH = """
import sys
from rqlite_queue import Transport

url, queue, messages, groups = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with Transport.from_url(url, queue=queue) as q:
    for start in range(0, messages, 1000):
        count = min(1000, messages - start)
        q.publish_many([(f"g{(start + i) % groups}", start + i) for i in range(count)])
"""


PUBLISH_ONE = """
import json, sys, time
from rqlite_queue import Transport

url, queue, messages, groups = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with Transport.from_url(url, queue=queue) as q:
    q.setup()
    started, cpu = time.perf_counter(), time.process_time()
    for i in range(messages):
        q.publish(f"g{i % groups}", i)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
print(json.dumps({"seconds": seconds, "handled": messages, "cpu": cpu}))
"""


PUBLISH_MANY = """
import json, sys, time
from rqlite_queue import Transport

url, queue, messages, groups = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with Transport.from_url(url, queue=queue) as q:
    q.setup()
    items = [(f"g{i % groups}", i) for i in range(messages)]
    started, cpu = time.perf_counter(), time.process_time()
    for start in range(0, messages, 1000):
        q.publish_many(items[start : start + 1000])
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
print(json.dumps({"seconds": seconds, "handled": messages, "cpu": cpu}))
"""


CLAIM_ACK = """
import json, sys, time
from rqlite_queue import Transport

url, queue, claims = sys.argv[1], sys.argv[2], int(sys.argv[3])
handled = 0
with Transport.from_url(url, queue=queue) as q:
    started, cpu = time.perf_counter(), time.process_time()
    while handled < claims:
        lease = q.claim("w", 60)
        if lease is None:
            break
        q.ack(lease)
        handled += 1
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
print(json.dumps({"seconds": seconds, "handled": handled, "cpu": cpu}))
"""

ONCE = ("publish", "publish_many", "claim_ack")
"""The flavours of one thread, run once a repetition (not per concurrency)."""


def run_child(src: Path, code: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`code` run with `src` as the library; its stderr shown if it fails."""
    child = subprocess.run(
        [sys.executable, "-c", code, *argv],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
    )
    if child.returncode != 0:
        raise SystemExit(f"a child failed ({src}):\n{child.stderr[-3000:]}")
    return child


Point = tuple[float, float, float]
"""(messages per second, Raft entries per message, client CPU seconds per message)."""


def one_run(
    src: Path, cluster: Cluster, flavour: str, concurrency: int, args: argparse.Namespace
) -> Point:
    """One drain (or, flavours `publish` and `publish_many`, one producer's publishes)."""
    queue = f"ba_{uuid.uuid4().hex[:10]}"
    if flavour in ("publish", "publish_many"):
        code, count = (
            (PUBLISH_ONE, args.publishes)
            if flavour == "publish"
            else (PUBLISH_MANY, args.publish_many)
        )
        argv = [cluster.url, queue, str(count), str(args.groups)]
    else:
        # Published by the version under test: each makes (and must find) its own schema.
        run_child(src, PUBLISH, [cluster.url, queue, str(args.messages), str(args.groups)])
        time.sleep(0.5)  # let the cluster settle after the publishes
        if flavour == "claim_ack":
            code, argv = CLAIM_ACK, [cluster.url, queue, str(args.claims)]
        else:
            stop_after = args.c1_messages if concurrency == 1 else 0
            code = CHILD
            argv = [cluster.url, queue, flavour, str(concurrency), str(stop_after)]
    before = raft_index(cluster)
    child = run_child(src, code, argv)
    entries = raft_index(cluster) - before
    out = json.loads(child.stdout.strip().splitlines()[-1])
    handled = max(1, out["handled"])
    return out["handled"] / out["seconds"], entries / handled, out["cpu"] / handled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the git revision to compare against")
    parser.add_argument("--after", default=None, help="default: the working tree")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--c1-messages", type=int, default=600)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument(
        "--flavours",
        nargs="+",
        default=["sync", "async"],
        choices=["sync", "async", *ONCE],
    )
    parser.add_argument("--publishes", type=int, default=1000)
    parser.add_argument("--publish-many", type=int, default=20_000)
    parser.add_argument("--claims", type=int, default=600)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "before_after.md"))
    args = parser.parse_args()
    label = {"before": args.before, "after": args.after or "working tree"}
    results: dict[tuple[str, int, str], list[Point]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": worktree(args.before, Path(tmp) / "before") / "src"}
        trees["after"] = (
            worktree(args.after, Path(tmp) / "after") / "src" if args.after else ROOT / "src"
        )
        try:
            with Cluster(3, fast=False) as cluster:
                cluster.wait_ready()
                for rep in range(args.reps):
                    for concurrency in args.concurrency:
                        for flavour in args.flavours:
                            if flavour in ONCE and concurrency != args.concurrency[0]:
                                continue  # one thread: once a repetition
                            order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
                            for version in order:
                                point = one_run(trees[version], cluster, flavour, concurrency, args)
                                results.setdefault((flavour, concurrency, version), []).append(
                                    point
                                )
                                rate, raft, cpu = point
                                print(
                                    f"rep {rep + 1} {flavour} c={concurrency} {version}: "
                                    f"{rate:,.0f} msg/s, {raft:.3f} Raft entries/msg, "
                                    f"{cpu * 1e6:,.0f} us client CPU/msg",
                                    flush=True,
                                )
        finally:
            for name in ("before", "after"):
                if (Path(tmp) / name).exists():
                    subprocess.run(
                        ["git", "-C", str(ROOT), "worktree", "remove", "--force", tmp + "/" + name],
                        check=False,
                        capture_output=True,
                    )
    report = write_report(args, label, results)
    print(report)
    return 0


def write_report(
    args: argparse.Namespace,
    label: dict[str, str],
    results: dict[tuple[str, int, str], list[Point]],
) -> str:
    def cell(values: list[float], fmt: str) -> str:
        return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"

    lines = [
        "# Before and after, side by side",
        "",
        f"`{' '.join(['bench/before_after.py', *sys.argv[1:]])}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: before = `{label['before']}`, "
        f"after = `{label['after']}`. One local 3-node cluster; {args.reps} repetitions, the two "
        f"versions back to back in alternating order; {args.messages:,} messages in "
        f"{args.groups} groups per drain (concurrency 1: the first {args.c1_messages}). Cells: "
        "median [min-max]; the ratios are after/before within each repetition. Client CPU: "
        "`time.process_time()` of the client process per message, in microseconds.",
        "",
        "| what | concurrency | before msg/s | after msg/s | after/before | Raft entries/msg "
        "before | after | client CPU us/msg before | after | after/before |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = {
        "sync": "Worker",
        "async": "AsyncWorker",
        "publish": "single publish",
        "publish_many": "publish_many (1,000 a call)",
        "claim_ack": "claim() + ack()",
    }
    for flavour in args.flavours:
        for concurrency in args.concurrency:
            if (flavour, concurrency, "before") not in results:
                continue
            before = results[(flavour, concurrency, "before")]
            after = results[(flavour, concurrency, "after")]
            ratios = [a[0] / b[0] for a, b in zip(after, before, strict=True)]
            cpu_ratios = [a[2] / b[2] for a, b in zip(after, before, strict=True)]
            lines.append(
                f"| {names[flavour]} | {concurrency if flavour not in ONCE else 1} | "
                f"{cell([p[0] for p in before], ',.0f')} | {cell([p[0] for p in after], ',.0f')} "
                f"| {cell(ratios, '.2f')} | {cell([p[1] for p in before], '.3f')} | "
                f"{cell([p[1] for p in after], '.3f')} | "
                f"{cell([p[2] * 1e6 for p in before], ',.0f')} | "
                f"{cell([p[2] * 1e6 for p in after], ',.0f')} | {cell(cpu_ratios, '.2f')} |"
            )
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    return text


if __name__ == "__main__":
    raise SystemExit(main())
