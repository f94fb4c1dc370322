"""What keeping outcomes costs the Worker, and how soon a cancel reaches a running handler.

    .venv/bin/python bench/outcomes_bench.py [--concurrency 1 64] [--reps 5] [--cancels 20]

1. Throughput: one local 3-node cluster (rqlited's default Raft timeouts), the Worker on the
   leader, a no-op handler returning a small value; each point drains a fresh backlog of
   `--messages` in `--groups` groups (`until_empty`), every message published with `keep=`
   or none, side by side in one run (the two in turn, their order reversed between
   repetitions). The ratio (kept / not kept) is taken within each repetition; the Raft
   entries per round come from the leader's last log index over the drain (one per round
   either way: the outcomes ride in the rounds' own transactions).
2. Cancel latency: a sync handler waiting on `current_job().wait_cancelled()`; `cancel()` made
   from another process than the Worker's (the worker learns it at its next check, every
   `heartbeat_interval`: `--heartbeat`), and from the Worker's own process (woken at once);
   the time from `cancel()` returning to the handler's signal (the machine's clock, in both
   processes), over `--cancels` jobs each, cancelled at spread points of the check cycle.

Writes bench/results/outcomes.md."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from systems import cpu_seconds

from rqlite_queue import RqliteTransport, Worker
from rqlite_queue.testing import Cluster
from rqlite_queue.worker import current_job

RESULTS = Path(__file__).resolve().parent / "results" / "outcomes.md"


def raft_index(cluster: Cluster) -> int:
    return int(cluster.leader().status()["store"]["raft"]["last_log_index"])


def drain(
    cluster: Cluster, url: str, concurrency: int, keep: float | None, messages: int, groups: int
) -> tuple[float, float, float, float]:
    """(msg/s, Raft entries per round, rqlited's CPU µs per message (3 nodes), this
    process's CPU µs per message) of one Worker draining a fresh backlog."""
    transport = RqliteTransport(url, queue=f"oc{uuid.uuid4().hex[:8]}")
    try:
        transport.setup()
        for start in range(0, messages, 500):
            end = min(start + 500, messages)
            items = [
                {"group_id": f"g{i % groups}", "event": i, "keep": keep} for i in range(start, end)
            ]
            transport.publish_many(items)
        worker = Worker(transport, lambda lease: {"ok": lease.seq}, concurrency=concurrency)
        pids = [node.pid for node in cluster.nodes if node.pid is not None]
        before = raft_index(cluster)
        server, client = cpu_seconds(pids), time.process_time()
        t0 = time.perf_counter()
        worker.run(handle_signals=False, until_empty=True)
        seconds = time.perf_counter() - t0
        server, client = cpu_seconds(pids) - server, time.process_time() - client
        entries = raft_index(cluster) - before
        stats = transport.stats()
        if stats.depth:
            raise RuntimeError("the worker stopped before the backlog was drained")
        if keep is not None and stats.outcomes < messages * 0.9:
            raise RuntimeError(f"only {stats.outcomes} outcomes kept of {messages}")
        return (
            messages / seconds,
            entries / worker.stats.rounds,
            server / messages * 1e6,
            client / messages * 1e6,
        )
    finally:
        transport.close()


def _worker_process(url: str, queue: str, heartbeat: float, log: str) -> None:
    """A Worker in a process of its own (a cancel made elsewhere wakes nothing here: the
    worker learns it at its next check): one line per handler start and per cancel signal."""
    transport = RqliteTransport(url, queue=queue)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def handler(lease: Any) -> None:
        os.write(fd, f"started {lease.seq} {time.time():.6f}\n".encode())
        if current_job().wait_cancelled(60):
            os.write(fd, f"told {lease.seq} {time.time():.6f}\n".encode())

    worker = Worker(transport, handler, concurrency=1, heartbeat_interval=heartbeat)
    stop = Path(log + ".stop")
    threading.Thread(
        target=lambda: (_wait_for(stop.exists, 3600), worker.stop()), daemon=True
    ).start()
    worker.run(handle_signals=False)
    transport.close()


def _wait_for(ready: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def cancel_latencies(
    url: str, jobs: int, heartbeat: float, same_process: bool, tmp: Path
) -> list[float]:
    """Seconds from `cancel()` returning to the running handler's signal, for `jobs` jobs:
    with the Worker in this process (its own transport cancels: woken at once), or in a
    process of its own (it learns a cancel at its next check, every `heartbeat`)."""
    queue = f"cl{uuid.uuid4().hex[:8]}"
    log = tmp / f"{queue}.log"
    log.touch()
    transport = RqliteTransport(url, queue=queue)
    transport.setup()
    process: multiprocessing.process.BaseProcess | None = None
    thread: threading.Thread | None = None
    if same_process:
        runner = threading.Thread(
            target=_worker_process, args=(url, queue, heartbeat, str(log)), daemon=True
        )
        runner.start()
        thread = runner
    else:
        process = multiprocessing.get_context("spawn").Process(
            target=_worker_process, args=(url, queue, heartbeat, str(log))
        )
        process.start()

    def lines(kind: str, seq: int) -> list[float]:
        return [
            float(parts[2])
            for parts in (line.split() for line in log.read_text().splitlines())
            if len(parts) == 3 and parts[0] == kind and int(parts[1]) == seq
        ]

    latencies = []
    try:
        for i in range(jobs):
            seq = transport.publish(f"c{i}", i, keep=60)
            if not _wait_for(lambda seq=seq: bool(lines("started", seq)), 60):
                raise RuntimeError("the handler did not start")
            time.sleep(heartbeat * (i % 7) / 7)  # at a spread point of the check cycle
            transport.cancel(f"c{i}", seq, "bench")
            cancelled_at = time.time()
            if not _wait_for(lambda seq=seq: bool(lines("told", seq)), 30):
                raise RuntimeError("the cancel never reached the handler")
            latencies.append(lines("told", seq)[0] - cancelled_at)
    finally:
        (tmp / f"{queue}.log.stop").touch()
        if process is not None:
            process.join(30)
        if thread is not None:
            thread.join(30)
        transport.close()
    return latencies


def cell(values: list[float], fmt: str = ".0f") -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--groups", type=int, default=600)
    parser.add_argument("--keep", type=float, default=3600.0)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--cancels", type=int, default=20)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    args = parser.parse_args(argv)
    modes: list[float | None] = [None, args.keep]
    rates: dict[tuple[int, float | None], list[float]] = {}
    entries: dict[tuple[int, float | None], list[float]] = {}
    cpus: dict[tuple[int, float | None], list[tuple[float, float]]] = {}
    with Cluster(3, fast=False) as cluster:
        url = cluster.wait_ready().http_url
        for rep in range(args.reps):
            for c in args.concurrency:
                for keep in modes if rep % 2 == 0 else modes[::-1]:
                    rate, per_round, server, client = drain(
                        cluster, url, c, keep, args.messages, args.groups
                    )
                    rates.setdefault((c, keep), []).append(rate)
                    entries.setdefault((c, keep), []).append(per_round)
                    cpus.setdefault((c, keep), []).append((server, client))
                    label = "kept" if keep else "not kept"
                    print(
                        f"rep {rep + 1} c={c} {label}: {rate:.0f} msg/s, "
                        f"{per_round:.2f} Raft entries per round, CPU per message: rqlited "
                        f"{server:.0f} us, client {client:.0f} us",
                        flush=True,
                    )
        with tempfile.TemporaryDirectory() as tmp:
            latencies = {
                same: cancel_latencies(url, args.cancels, args.heartbeat, same, Path(tmp))
                for same in (False, True)
            }
    rows, cpu_rows = [], []
    for c in args.concurrency:
        plain, kept = rates[(c, None)], rates[(c, args.keep)]
        ratio = cell([k / p for k, p in zip(kept, plain, strict=True)], ".2f")
        rows.append(
            f"| {c} | {cell(plain)} | {cell(kept)} | {ratio}x | "
            f"{cell(entries[(c, None)], '.2f')} | {cell(entries[(c, args.keep)], '.2f')} |"
        )
        base, more = cpus[(c, None)], cpus[(c, args.keep)]
        totals = [(b[0] + b[1]) / (m[0] + m[1]) for b, m in zip(base, more, strict=True)]
        cpu_rows.append(
            f"| {c} | {cell([x[0] for x in base])} | {cell([x[0] for x in more])} | "
            f"{cell([x[1] for x in base])} | {cell([x[1] for x in more])} | "
            f"{cell(totals, '.2f')}x |"
        )
    where = {True: "the worker's own process", False: "another process"}
    cancel_rows = [
        f"| {where[same]} | {cell([s * 1000 for s in values])} | {max(values) * 1000:.0f} |"
        for same, values in latencies.items()
    ]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = " ".join(["python bench/outcomes_bench.py", *argv])
    text = "\n".join(
        [
            "# Results, cancellation and progress: what they cost",
            "",
            f"`{command}`, {when}. One local 3-node cluster (default Raft timeouts), the Worker "
            f"on the leader draining {args.messages:,} messages in {args.groups:,} groups per "
            f"point, every message kept ({args.keep:g} s) or none, no-op handler returning a "
            f"small value; {args.reps} repetitions, the two modes in turn, their order reversed "
            "between repetitions; medians [min-max]; the ratio is taken within each repetition.",
            "",
            "| concurrency | msg/s, not kept | msg/s, kept | kept / not kept | Raft entries per "
            "round, not kept | kept |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            "The CPU each message cost, the same drains (the machine's other load moves the "
            "rates, not these): the 3 rqlited processes' (from /proc) and this client's "
            "(`time.process_time`), µs per message; the last column is CPU per message not "
            "kept over kept (the inverse of its cost: 1 is free).",
            "",
            "| concurrency | rqlited, not kept | rqlited, kept | client, not kept | client, kept "
            "| not kept / kept, CPU |",
            "|---|---|---|---|---|---|",
            *cpu_rows,
            "",
            f"Time from `cancel()` to the running handler's signal (`wait_cancelled`), "
            f"heartbeat_interval {args.heartbeat:g} s (the target: within one heartbeat interval "
            f"plus 100 ms), {args.cancels} jobs each, cancelled at spread points of the worker's "
            "check cycle; milliseconds, median [min-max] and the worst.",
            "",
            "| cancel() made in | ms | worst ms |",
            "|---|---|---|",
            *cancel_rows,
            "",
        ]
    )
    RESULTS.write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
