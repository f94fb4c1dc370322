"""Two versions of the library side by side on one cluster: the Worker's throughput and Raft
entries per message before and after a change (a refactoring must not move them).

    .venv/bin/python bench/before_after.py --before e80885b          # the redesign's check
    .venv/bin/python bench/before_after.py --before REV --after REV2 --reps 5

With `--flavours publish`, also single `publish` calls from one thread (`--publishes` of them,
into `--groups` groups): the producer's cost per message.

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
    started = time.perf_counter()
    worker.run(handle_signals=False, until_empty=True)
    seconds = time.perf_counter() - started
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
        started = time.perf_counter()
        await worker.run(handle_signals=False, until_empty=True)
        seconds = time.perf_counter() - started
        await q.close()
        return seconds
    seconds = asyncio.run(main())
print(json.dumps({"seconds": seconds, "handled": handled}))
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
    started = time.perf_counter()
    for i in range(messages):
        q.publish(f"g{i % groups}", i)
    seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "handled": messages}))
"""


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


def one_run(
    src: Path, cluster: Cluster, flavour: str, concurrency: int, args: argparse.Namespace
) -> tuple[float, float]:
    """(messages per second, Raft entries per message) of one drain (or, flavour `publish`,
    of single publishes)."""
    queue = f"ba_{uuid.uuid4().hex[:10]}"
    if flavour == "publish":
        before = raft_index(cluster)
        argv = [cluster.url, queue, str(args.publishes), str(args.groups)]
        out = json.loads(run_child(src, PUBLISH_ONE, argv).stdout.strip().splitlines()[-1])
        entries = raft_index(cluster) - before
        return out["handled"] / out["seconds"], entries / max(1, out["handled"])
    # Published by the version under test: each makes (and must find) its own schema.
    run_child(src, PUBLISH, [cluster.url, queue, str(args.messages), str(args.groups)])
    time.sleep(0.5)  # let the cluster settle after the publishes
    stop_after = args.c1_messages if concurrency == 1 else 0
    before = raft_index(cluster)
    argv = [cluster.url, queue, flavour, str(concurrency), str(stop_after)]
    child = run_child(src, CHILD, argv)
    entries = raft_index(cluster) - before
    out = json.loads(child.stdout.strip().splitlines()[-1])
    return out["handled"] / out["seconds"], entries / max(1, out["handled"])


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
        "--flavours", nargs="+", default=["sync", "async"], choices=["sync", "async", "publish"]
    )
    parser.add_argument("--publishes", type=int, default=1000)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "before_after.md"))
    args = parser.parse_args()
    label = {"before": args.before, "after": args.after or "working tree"}
    results: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
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
                            if flavour == "publish" and concurrency != args.concurrency[0]:
                                continue  # one producer thread: once a repetition
                            order = ["before", "after"] if rep % 2 == 0 else ["after", "before"]
                            for version in order:
                                rate, raft = one_run(
                                    trees[version], cluster, flavour, concurrency, args
                                )
                                results.setdefault((flavour, concurrency, version), []).append(
                                    (rate, raft)
                                )
                                print(
                                    f"rep {rep + 1} {flavour} c={concurrency} {version}: "
                                    f"{rate:,.0f} msg/s, {raft:.3f} Raft entries/msg",
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
    results: dict[tuple[str, int, str], list[tuple[float, float]]],
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
        "median [min-max]; the ratio is after/before within each repetition.",
        "",
        "| worker | concurrency | before msg/s | after msg/s | after/before | Raft entries/msg "
        "before | after |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    names = {"sync": "Worker", "async": "AsyncWorker", "publish": "single publish"}
    for flavour in args.flavours:
        for concurrency in args.concurrency:
            if (flavour, concurrency, "before") not in results:
                continue
            before = results[(flavour, concurrency, "before")]
            after = results[(flavour, concurrency, "after")]
            ratios = [a[0] / b[0] for a, b in zip(after, before, strict=True)]
            lines.append(
                f"| {names[flavour]} | {concurrency if flavour != 'publish' else 1} | "
                f"{cell([r for r, _ in before], ',.0f')} | {cell([r for r, _ in after], ',.0f')} "
                f"| {cell(ratios, '.2f')} | {cell([e for _, e in before], '.3f')} | "
                f"{cell([e for _, e in after], '.3f')} |"
            )
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    return text


if __name__ == "__main__":
    raise SystemExit(main())
