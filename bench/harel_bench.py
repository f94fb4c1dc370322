"""harel's worker over rqlite: harel's own `RqliteTransport` against rqlite-queue's.

    python bench/harel_bench.py [--quick] [--executions N] [--repeats R] [--workers 1,8]

One freshly started local 3-node rqlite cluster (`rqlite_queue.testing.Cluster`) serves both
transports. The workload is the same for both: N executions of a small flat machine
(S0 -Go-> S1 -Go-> S2 -Go-> Done), each with its `Start` and three `Go` events already queued,
so 4 events per execution. The timed window is harel's own worker loop (`Worker.run`) draining
them all: from the moment the worker threads are released until every execution is DONE in
the store. Events per second = 4 N / that time.

Each worker is a thread with its own transport and its own harel `SqliteStore` connection (one
store file per run, the same for both transports; on /dev/shm by default, so the store's fsyncs
do not blur the comparison of the queues: `--store-dir` to change), running `Worker.run` with
`execution="inline"`: in harel's default `"background"` mode every sync worker of a process
funnels its calls through one shared event-loop thread, so threads would not overlap their
HTTP round trips at all. Both transports get the leader's URL (harel's takes one URL; ours
would also take the list and fail over). Each point is repeated, the two transports
interleaved, and reported as median and min-max, with the CPU per event (the rqlited nodes',
from /proc, and this process's) over the same windows. A second, smaller table times the
queue operations alone (publish, claim, ack; one caller). Results go to stdout and to
`bench/results/harel.md`.

Needs the `harel` extra (`pip install -e '.[harel]'`: harel 0.9.0 and `requests`, which
harel's rqlite transport uses) and rqlited (`make rqlited`).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harel import Event, SqliteStore, definition_from_dsl
from harel.definition.model import Definition
from harel.engine.distributed import DistributedRunner, Worker
from harel.engine.schema import Names
from harel.engine.transport import RqliteTransport as HarelRqliteTransport

from rqlite_queue import RqliteTransport
from rqlite_queue.rqlited import find_rqlited
from rqlite_queue.testing import Cluster

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "harel.md"

MACHINE = """
event Go {}
machine bench {
  initial S0
  state S0 {}
  state S1 {}
  state S2 {}
  final Done success {}
  from S0 to S1 on Go
  from S1 to S2 on Go
  from S2 to Done on Go
}
"""
GO_EVENTS = 3
EVENTS_PER_EXECUTION = 1 + GO_EVENTS  # the Start, then the Go events
RUN_TIMEOUT = 600.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

TRANSPORTS = {
    "harel": "harel `RqliteTransport` (requests)",
    "ours": "rqlite-queue `RqliteTransport` (urllib3)",
}


def make_transport(kind: str, url: str, run_id: str) -> Any:
    """A transport on a queue of this run's own (fresh tables: no backlog from earlier runs)."""
    if kind == "harel":
        return HarelRqliteTransport(url, prefix=f"hb_{run_id}")
    return RqliteTransport(url, queue=f"qb_{run_id}", codec=Event)


@dataclass
class Point:
    kind: str
    workers: int
    rates: list[float] = field(default_factory=list)
    server_cpu: list[float] = field(default_factory=list)
    """rqlited CPU (user + system, the 3 nodes summed) per event, ms."""
    client_cpu: list[float] = field(default_factory=list)
    """This process's CPU (the workers: harel, the transport, the store) per event, ms."""

    @property
    def median(self) -> float:
        return statistics.median(self.rates)


def rqlited_cpu(cluster: Cluster) -> float:
    """CPU seconds (user + system) the cluster's rqlited processes have used so far."""
    total = 0
    for node in cluster.nodes:
        with open(f"/proc/{node.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (after pid, comm)
    return total / CLOCK_TICKS


def one_run(
    kind: str,
    cluster: Cluster,
    url: str,
    workers: int,
    executions: int,
    run_id: str,
    workdir: Path,
    defs: dict[str, Definition],
) -> tuple[float, float, float]:
    """Queue the workload, then time `workers` harel workers draining it. Returns events per
    second, and the rqlited and client CPU milliseconds per event over the timed window."""
    store_path = os.fspath(workdir / f"store_{run_id}.db")
    sender = make_transport(kind, url, run_id)
    store = SqliteStore(store_path)
    try:
        runner = DistributedRunner(store, sender, defs, execution="inline")
        for _ in range(executions):
            exe = runner.create("bench")
            for _ in range(GO_EVENTS):
                runner.send(exe.id, Event(kind="Go"))

        stop = threading.Event()
        release = threading.Barrier(workers + 1)
        errors: list[BaseException] = []

        def work(worker_id: str) -> None:
            transport = make_transport(kind, url, run_id)
            worker_store = SqliteStore(store_path)
            try:
                worker = Worker(worker_store, transport, defs, worker_id, execution="inline")
                release.wait()
                worker.run(stop, idle_sleep=0.002)
            except BaseException as exc:
                errors.append(exc)
                release.abort()
            finally:
                worker_store.close()
                transport.close()

        threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(workers)]
        for thread in threads:
            thread.start()
        done_sql = (
            f"SELECT COUNT(*) FROM {Names().executions} "
            "WHERE json_extract(data, '$.status') = 'DONE'"
        )
        probe = sqlite3.connect(store_path)
        try:
            release.wait()
            started = time.perf_counter()
            server0, client0 = rqlited_cpu(cluster), time.process_time()
            while True:
                (done,) = probe.execute(done_sql).fetchone()
                if done == executions:
                    break
                if errors:
                    raise RuntimeError(f"a worker failed: {errors[0]!r}") from errors[0]
                if time.perf_counter() - started > RUN_TIMEOUT:
                    raise RuntimeError(f"{kind}: {done}/{executions} done after {RUN_TIMEOUT}s")
                time.sleep(0.005)
            elapsed = time.perf_counter() - started
            server = rqlited_cpu(cluster) - server0
            client = time.process_time() - client0
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            probe.close()
        events = executions * EVENTS_PER_EXECUTION
        return events / elapsed, server * 1000 / events, client * 1000 / events
    finally:
        store.close()
        sender.close()


def op_latencies(kind: str, url: str, run_id: str, n: int) -> dict[str, float]:
    """The queue alone, one caller, no harel worker: median milliseconds per operation, with
    `n` groups queued (the claim's backlog shrinks from n to 1)."""
    transport = make_transport(kind, url, run_id)
    samples: dict[str, list[float]] = {"publish": [], "claim": [], "ack": []}
    event = Event(kind="Go")
    try:
        for i in range(n):
            started = time.perf_counter()
            transport.publish(f"g{i}", event)
            samples["publish"].append(time.perf_counter() - started)
        for _ in range(n):
            started = time.perf_counter()
            lease = transport.claim("w", 30.0)
            samples["claim"].append(time.perf_counter() - started)
            assert lease is not None
            started = time.perf_counter()
            transport.ack(lease)
            samples["ack"].append(time.perf_counter() - started)
    finally:
        transport.close()
    return {op: statistics.median(values) * 1000 for op, values in samples.items()}


def machine_info() -> str:
    mem_kib = 0
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    nproc = len(os.sched_getaffinity(0))
    return (
        f"nproc {nproc} ({cpu}), memory {mem_kib / 1024 / 1024:.1f} GiB, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def versions() -> str:
    def v(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    return (
        f"harel {v('harel')}, rqlite-queue {v('rqlite-queue')}, urllib3 {v('urllib3')}, "
        f"requests {v('requests')}, rqlited {find_rqlited().label}"
    )


def fmt_point(point: Point) -> str:
    return f"{point.median:,.0f} ({min(point.rates):,.0f}-{max(point.rates):,.0f})"


def render(
    points: dict[tuple[str, int], Point],
    latencies: dict[str, list[dict[str, float]]],
    worker_counts: list[int],
    args: argparse.Namespace,
    command: str,
    when: str,
    wall: float,
    load_start: str,
) -> str:
    lines = [
        "# harel's worker over rqlite: harel's RqliteTransport vs rqlite-queue",
        "",
        f"- command: `{command}`",
        f"- date: {when}",
        f"- machine: {machine_info()}",
        f"- software: {versions()}",
        "- cluster: 3 local rqlited nodes on this machine (same cores as the workers), "
        "fresh for this run; both transports talk to the leader",
        f"- workload: {args.executions} executions x {EVENTS_PER_EXECUTION} events "
        f"(Start + {GO_EVENTS} Go) of a 4-state flat machine, queued before the clock starts; "
        f"harel `Worker.run` (execution=inline) threads, each with its own transport and "
        f"harel `SqliteStore` connection (store files in {args.store_dir or 'the temp dir'}); "
        "timed until every execution is DONE",
        f"- {args.repeats} runs per point, transports interleaved; median (min-max) "
        f"events/s; total wall time {wall:.0f} s",
        "",
        f"| workers | {TRANSPORTS['harel']} | {TRANSPORTS['ours']} | ours / harel |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for workers in worker_counts:
        harel, ours = points[("harel", workers)], points[("ours", workers)]
        lines.append(
            f"| {workers} | {fmt_point(harel)} | {fmt_point(ours)} | "
            f"{ours.median / harel.median:.2f}x |"
        )
    lines += [
        "",
        "CPU per event over the timed window (median of the runs, ms): rqlited is the 3 nodes "
        "summed; workers is this process (harel, the transport's client, the store).",
        "",
        "| workers | rqlited, harel | rqlited, ours | workers, harel | workers, ours |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for workers in worker_counts:
        harel, ours = points[("harel", workers)], points[("ours", workers)]
        lines.append(
            f"| {workers} | {statistics.median(harel.server_cpu):.2f} "
            f"| {statistics.median(ours.server_cpu):.2f} "
            f"| {statistics.median(harel.client_cpu):.2f} "
            f"| {statistics.median(ours.client_cpu):.2f} |"
        )
    lines += [
        "",
        "The queue operations alone (one caller, no harel worker, median of the runs' "
        f"medians over {args.op_samples} operations each, ms):",
        "",
        "| operation | harel | ours |",
        "| --- | ---: | ---: |",
    ]
    for op in ("publish", "claim", "ack"):
        harel_ms = statistics.median(run[op] for run in latencies["harel"])
        ours_ms = statistics.median(run[op] for run in latencies["ours"])
        lines.append(f"| {op} | {harel_ms:.2f} | {ours_ms:.2f} |")
    lines += ["", "Every run (events/s):", ""]
    for workers in worker_counts:
        for kind in TRANSPORTS:
            rates = ", ".join(f"{r:,.0f}" for r in points[(kind, workers)].rates)
            lines.append(f"- {workers} worker(s), {kind}: {rates}")
    lines += [
        "",
        "Per event, harel's worker does claim -> load -> commit -> ack. On rqlite, harel's "
        "transport claims with three HTTP requests (an UPDATE, a `level=strong` read-back, an "
        "UPDATE of the group's round-robin time: three Raft entries, since rqlite sends a "
        "strong read through its log) and acks with one (two statements); rqlite-queue claims "
        "with one request (one Raft entry: five statements; after a claim that found nothing, "
        "the next one first asks with a node-local read) and acks with one (two statements, "
        "two more on one ack in 16, which prunes). The store is the same harel SQLite store "
        "for both, so the difference is the queue. The rqlited nodes and the workers share "
        "this machine's "
        f"{len(os.sched_getaffinity(0))} cores (load average at start {load_start}, at the end "
        f"{os.getloadavg()[0]:.2f}; other work on the machine shows as spread), so with several "
        "workers the CPU per event, more than round trips, sets the rate.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small run (under ~2 minutes)")
    parser.add_argument("--executions", type=int, help="executions per run")
    parser.add_argument("--repeats", type=int, help="runs per point (>= 3)")
    parser.add_argument("--workers", default="1,8", help="comma-separated worker counts")
    parser.add_argument("--out", type=Path, default=RESULTS, help="markdown output file")
    parser.add_argument(
        "--store-dir",
        default="/dev/shm" if os.path.isdir("/dev/shm") else None,
        help="where harel's SQLite store files go (default: /dev/shm, so that the store's "
        "fsyncs do not blur the comparison of the queues)",
    )
    args = parser.parse_args(argv)
    if args.executions is None:
        args.executions = 60 if args.quick else 250
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    args.op_samples = 100 if args.quick else 300
    if args.repeats < 3:
        parser.error("--repeats must be at least 3")
    worker_counts = [int(w) for w in args.workers.split(",")]
    command = "python bench/harel_bench.py" + "".join(f" {a}" for a in sys.argv[1:])
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    defn = definition_from_dsl(MACHINE, "bench")
    log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    load_start = f"{os.getloadavg()[0]:.2f}"
    points = {(k, w): Point(k, w) for k in TRANSPORTS for w in worker_counts}
    latencies: dict[str, list[dict[str, float]]] = {k: [] for k in TRANSPORTS}
    wall_start = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="harel-bench-", dir=args.store_dir) as tmp,
        Cluster(3) as cluster,
    ):
        url = cluster.leader().http_url
        workdir = Path(tmp)
        counter = 0
        log(f"cluster up at {cluster.url}; leader {url}")
        # warm-up (not reported): connections, tables, the JIT-free but cold page cache
        for kind in TRANSPORTS:
            counter += 1
            one_run(kind, cluster, url, 2, 10, f"w{counter}", workdir, {defn.id: defn})
        for rep in range(args.repeats):
            kinds = list(TRANSPORTS) if rep % 2 == 0 else list(reversed(TRANSPORTS))
            for kind in kinds:
                counter += 1
                latencies[kind].append(op_latencies(kind, url, f"o{counter}", args.op_samples))
                log(
                    f"run {rep + 1}/{args.repeats} queue ops {kind:>5}: "
                    + ", ".join(f"{op} {ms:.2f} ms" for op, ms in latencies[kind][-1].items())
                )
            for workers in worker_counts:
                for kind in kinds:
                    counter += 1
                    rate, server, client = one_run(
                        kind,
                        cluster,
                        url,
                        workers,
                        args.executions,
                        f"r{counter}",
                        workdir,
                        {defn.id: defn},
                    )
                    point = points[(kind, workers)]
                    point.rates.append(rate)
                    point.server_cpu.append(server)
                    point.client_cpu.append(client)
                    log(
                        f"run {rep + 1}/{args.repeats} {workers:>2} worker(s) {kind:>5}: "
                        f"{rate:8.1f} events/s, CPU/event rqlited {server:.2f} ms, "
                        f"workers {client:.2f} ms"
                    )
    wall = time.perf_counter() - wall_start

    report = render(points, latencies, worker_counts, args, command, when, wall, load_start)
    print(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report)
    log(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
