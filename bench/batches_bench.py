"""What batches cost the Worker: messages that belong to batches against plain messages.

    .venv/bin/python bench/batches_bench.py [--concurrency 64] [--reps 5]

One local 3-node cluster (rqlited's default Raft timeouts), the Worker on the leader with a
no-op handler; each point drains a fresh backlog of `--messages` in `--groups` groups
(`until_empty`), published either plainly or as batches of `--size` (their callbacks handled
in the same drain, not counted as messages), side by side in one run (the two in turn, their
order reversed between repetitions). The ratio (batches / plain) is taken within each
repetition; the Raft entries per round come from the leader's last log index over the drain
(one per round either way: the counts and the callbacks ride in the rounds' own
transactions).

Writes bench/results/batches.md."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from rqlite_queue import RqliteTransport, Worker
from rqlite_queue.testing import Cluster

RESULTS = Path(__file__).resolve().parent / "results" / "batches.md"
PLAIN, BATCHED = "plain", "batches"


def raft_index(cluster: Cluster) -> int:
    return int(cluster.leader().status()["store"]["raft"]["last_log_index"])


def nodes_cpu(cluster: Cluster) -> float:
    """CPU seconds the cluster's rqlited processes have used (user and system)."""
    total = 0
    for node in cluster.nodes:
        fields = Path(f"/proc/{node.pid}/stat").read_text().rpartition(")")[2].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / os.sysconf("SC_CLK_TCK")


def publish(transport: RqliteTransport, mode: str, messages: int, groups: int, size: int) -> int:
    """The backlog; how many callbacks it will publish."""
    items = [(f"g{i % groups}", i) for i in range(messages)]
    if mode == PLAIN:
        for start in range(0, messages, 500):
            transport.publish_many(items[start : start + 500])
        return 0
    for start in range(0, messages, size):
        # (each callback in a group of its own: in one group they would be handled one by one)
        with transport.batch(on_complete=(f"done-{start}", start)) as batch:
            batch.publish_many(items[start : start + size])
    return (messages + size - 1) // size


def drain(
    cluster: Cluster, url: str, concurrency: int, mode: str, messages: int, groups: int, size: int
) -> tuple[float, float, float]:
    """(msg/s, Raft entries per round, CPU milliseconds per message: the client's and the
    nodes') of one Worker draining a fresh backlog."""
    transport = RqliteTransport(url, queue=f"bb{uuid.uuid4().hex[:8]}")
    try:
        transport.setup()
        callbacks = publish(transport, mode, messages, groups, size)
        worker = Worker(transport, lambda lease: None, concurrency=concurrency)
        before, cpu_before = raft_index(cluster), nodes_cpu(cluster) + time.process_time()
        t0 = time.perf_counter()
        worker.run(handle_signals=False, until_empty=True)
        seconds = time.perf_counter() - t0
        entries = raft_index(cluster) - before
        cpu = nodes_cpu(cluster) + time.process_time() - cpu_before
        stats = transport.stats()
        if stats.depth or stats.open_batches:
            raise RuntimeError("the worker stopped before the backlog was drained")
        if worker.stats.acked != messages + callbacks:
            raise RuntimeError(f"{worker.stats.acked} acked, {messages + callbacks} published")
        return messages / seconds, entries / worker.stats.rounds, cpu * 1000 / messages
    finally:
        transport.close()


def cell(values: list[float], fmt: str = ".0f") -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--groups", type=int, default=800)
    parser.add_argument("--size", type=int, default=20)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    modes = [PLAIN, BATCHED]
    rates: dict[tuple[int, str], list[float]] = {}
    entries: dict[tuple[int, str], list[float]] = {}
    cpus: dict[tuple[int, str], list[float]] = {}
    with Cluster(3, fast=False) as cluster:
        url = cluster.wait_ready().http_url
        for rep in range(args.reps):
            for c in args.concurrency:
                for mode in modes if rep % 2 == 0 else modes[::-1]:
                    rate, per_round, cpu = drain(
                        cluster, url, c, mode, args.messages, args.groups, args.size
                    )
                    rates.setdefault((c, mode), []).append(rate)
                    entries.setdefault((c, mode), []).append(per_round)
                    cpus.setdefault((c, mode), []).append(cpu)
                    print(
                        f"rep {rep + 1} c={c} {mode}: {rate:.0f} msg/s, "
                        f"{per_round:.2f} Raft entries per round, {cpu:.3f} CPU ms per message",
                        flush=True,
                    )
    rows = []
    for c in args.concurrency:
        plain, batched = rates[(c, PLAIN)], rates[(c, BATCHED)]
        ratio = cell([b / p for b, p in zip(batched, plain, strict=True)], ".2f")
        cpu_ratio = cell(
            [p / b for b, p in zip(cpus[(c, BATCHED)], cpus[(c, PLAIN)], strict=True)], ".2f"
        )
        rows.append(
            f"| {c} | {cell(plain)} | {cell(batched)} | {ratio}x | "
            f"{cell(cpus[(c, PLAIN)], '.3f')} | {cell(cpus[(c, BATCHED)], '.3f')} | {cpu_ratio}x | "
            f"{cell(entries[(c, PLAIN)], '.2f')} | {cell(entries[(c, BATCHED)], '.2f')} |"
        )
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = " ".join(["python bench/batches_bench.py", *argv])
    text = "\n".join(
        [
            "# Batches: what they cost the Worker",
            "",
            f"`{command}`, {when}. One local 3-node cluster (default Raft timeouts), the Worker "
            f"on the leader draining {args.messages:,} messages in {args.groups:,} groups per "
            f"point, published plainly or as batches of {args.size} (each with an on_complete "
            "callback in a group of its own, handled in the same drain and not counted in msg/s), "
            "no-op handler; "
            f"{args.reps} repetitions, the two in turn, their order reversed between "
            "repetitions; medians [min-max]; the ratios are taken within each repetition. CPU "
            "per message: the three rqlited processes' and the client's (user and system), "
            "over the drain: what the machine's other load does not move.",
            "",
            "| concurrency | msg/s, plain | msg/s, batches | batches / plain | CPU ms per "
            "message, plain | batches | plain / batches | Raft entries per round, plain | "
            "batches |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
