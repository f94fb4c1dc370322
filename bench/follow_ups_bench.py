"""What follow-ups cost the Worker: the same drain with a no-op handler that publishes nothing,
one follow-up per message returned by the handler (published with its ack, in the round's
transaction), and one follow-up per message published by the handler itself before its ack
(today's pattern, which can double), side by side on one local 3-node cluster.

    .venv/bin/python bench/follow_ups_bench.py            # 3 repetitions, concurrency 1 and 64

The follow-ups are not handled by the drain, so it handles the same messages in every mode:
they go either to one held group (`held`: the cheapest publish, a group that exists) or each to
a new group, delayed an hour (`groups`: every follow-up creates its group's row). Per point:
messages handled per second (the ratios to the drain without follow-ups are taken within each
repetition, the runs back to back in rotating order), and the leader's Raft entries per
message. Writes bench/results/follow_ups.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rqlite_queue import Lease, Transport, Worker  # noqa: E402
from rqlite_queue.local_cluster import Cluster  # noqa: E402

Points = list[tuple[float, float, float]]
MODES = ("none", "follow-ups", "publish, then ack")
TARGETS = ("held", "groups")


def raft_index(cluster: Cluster) -> int:
    return int(cluster.leader().status()["store"]["raft"]["last_log_index"])


def follow_up(target: str, n: int) -> Any:
    if target == "held":
        return ("sink", n)
    return {"group_id": f"next-{n}", "event": n, "delay": 3600}


def drain(
    cluster: Cluster, mode: str, target: str, concurrency: int, args: argparse.Namespace
) -> tuple[float, float, float]:
    """(messages handled per second, Raft entries per message, and for `none`: messages per
    second counting the time to publish the same follow-ups apart, in batches of one
    round's)."""
    queue = f"fu_{uuid.uuid4().hex[:10]}"
    with Transport.from_url(cluster.url, queue=queue) as q:
        q.hold_group("sink")
        for start in range(0, args.messages, 1000):
            count = min(1000, args.messages - start)
            q.publish_many([(f"g{(start + i) % args.groups}", start + i) for i in range(count)])
        time.sleep(0.5)
        stop_after = args.c1_messages if concurrency == 1 else 0
        handled = 0
        worker: Worker | None = None

        def handle(lease: Lease) -> Any:
            nonlocal handled
            handled += 1
            if stop_after and handled >= stop_after and worker is not None:
                worker.stop()
            if mode == "follow-ups":
                return [follow_up(target, lease.event)]
            if mode == "publish, then ack":
                q.publish_many([follow_up(target, lease.event)])
            return None

        worker = Worker(
            q, handle, concurrency=concurrency, visibility=60, follow_ups=mode == "follow-ups"
        )
        before = raft_index(cluster)
        started = time.perf_counter()
        worker.run(handle_signals=False, until_empty=True)
        seconds = seconds_drain = time.perf_counter() - started
        entries = raft_index(cluster) - before
        floor = 0.0
        acked = worker.stats.acked
        if mode == "none":  # the floor: the same follow-ups published apart, a round's at once
            started = time.perf_counter()
            for start in range(0, acked, concurrency):
                count = min(concurrency, acked - start)
                q.publish_many([follow_up(target, 10**6 + start + i) for i in range(count)])
            seconds += time.perf_counter() - started
            floor = acked / seconds
        if mode != "none":
            stats = q.stats()
            waiting = len(q.peek("sink", 10_000)) if target == "held" else stats.delayed
            assert waiting >= acked, f"a follow-up is missing: {waiting} for {acked} acks"
    return acked / (seconds if mode != "none" else seconds_drain), entries / max(1, acked), floor


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--groups", type=int, default=400)
    parser.add_argument("--c1-messages", type=int, default=400)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "follow_ups.md"))
    args = parser.parse_args()
    results: dict[tuple[int, str, str], Points] = {}
    with Cluster(3, fast=False) as cluster:
        cluster.wait_ready()
        for rep in range(args.reps):
            for concurrency in args.concurrency:
                for target in args.targets:
                    order = MODES[rep % 3 :] + MODES[: rep % 3]
                    for mode in order:
                        point = drain(cluster, mode, target, concurrency, args)
                        results.setdefault((concurrency, target, mode), []).append(point)
                        print(
                            f"rep {rep + 1} c={concurrency} {target} {mode}: {point[0]:,.0f} "
                            f"msg/s, {point[1]:.3f} Raft entries/message",
                            flush=True,
                        )

    def cell(values: list[float], fmt: str) -> str:
        return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"

    lines = [
        "# Follow-ups: what they cost the Worker",
        "",
        f"`{' '.join(['bench/follow_ups_bench.py', *sys.argv[1:]])}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. One local 3-node cluster "
        f"(rqlite's default Raft timers); {args.reps} repetitions, the runs of a point back to "
        f"back in rotating order; {args.messages:,} messages in {args.groups} groups, a no-op "
        f"handler (concurrency 1: the first {args.c1_messages}) that publishes nothing, returns "
        "one follow-up (published with its ack), or publishes one itself and then returns. The "
        "follow-ups go to one held group (`held`) or each to a new group, delayed (`groups`). "
        "Cells: median [min-max]; ratios to the drain without follow-ups, within each "
        "repetition. The next to last column is what publishing the same follow-ups costs "
        "anyway: the drain without them, then its follow-ups published with `publish_many` "
        "in batches of a round's size (the concurrency), one after the other.",
        "",
        "| concurrency | follow-ups to | none msg/s | follow-ups msg/s | ratio | publish, then "
        "ack msg/s | ratio | none, then the same follow-ups published apart: ratio | Raft "
        "entries per message (none, follow-ups, publish then ack) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for concurrency in args.concurrency:
        for target in args.targets:
            none, follow, publish = (results[(concurrency, target, m)] for m in MODES)

            def ratios(other: Points, base: Points) -> str:
                return cell([o[0] / b[0] for o, b in zip(other, base, strict=True)], ".2f")

            floor = cell([p[2] / p[0] for p in none], ".2f")

            entries = ", ".join(
                f"{statistics.median(p[1] for p in points):.3f}"
                for points in (none, follow, publish)
            )
            lines.append(
                f"| {concurrency} | {target} | {cell([p[0] for p in none], ',.0f')} | "
                f"{cell([p[0] for p in follow], ',.0f')} | {ratios(follow, none)} | "
                f"{cell([p[0] for p in publish], ',.0f')} | {ratios(publish, none)} | "
                f"{floor} | {entries} |"
            )
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
