"""Where the Worker's round trip at concurrency 1 spends rqlite's time: the round as the library
sends it, the same round without one statement at a time, and bare writes of 1 and 7 trivial
statements, all over urllib3 to the leader of one fresh local 3-node cluster.

    .venv/bin/python bench/statement_cost.py [--requests 1000] [--repeats 3] [--pprof 8]

Per variant: wall time per request, rqlite's own `time` and the sum of its statements' SQL
times (`?timings`, on the leader), and the CPU of the 3 rqlited processes per request (from
/proc). Each round acks the lease the previous one took and claims the next, as the Worker at
concurrency 1 does; a variant without a statement drops it from the request (its effect on
the queue is then wrong, its cost is what is measured). Variants run interleaved, in an order
rotated between repetitions; cells are medians [min-max] over the repetitions. Writes
bench/results/statement_cost.md. With `--pprof S`, also takes an S-second CPU profile of the
leader (rqlited's /debug/pprof) while the round loop runs, and writes it with, when `go` is on
the PATH, its `go tool pprof -top -cum` text beside it."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from measure import VISIBILITY, rotate
from systems import (
    FLOOR_UPDATE,
    HEADERS,
    WRITE_PATH,
    RqliteAdmin,
    build_ours,
    cpu_seconds,
    reset_ours,
    setup_floor,
)
from workloads import QUEUE, make_core

from rqlite_queue import Lease
from rqlite_queue._protocol.http import request_for
from rqlite_queue._protocol.sql import Batch, Statement
from rqlite_queue.testing import Cluster

RESULTS = Path(__file__).resolve().parent / "results" / "statement_cost.md"

# SQL prefixes of the round's statements, to drop one at a time.
DROPS = {
    "lapsed leases rejoin (UPDATE groups ... WHERE ready = 0 AND until <= now)": (
        f"UPDATE rq_{QUEUE}_groups SET ready = 1, parked = 0"
    ),
    "the turn counter (UPDATE meta)": f"UPDATE rq_{QUEUE}_meta SET value = value + 1",
    "the claim's token (INSERT INTO claims)": f"INSERT OR IGNORE INTO rq_{QUEUE}_claims",
}


@dataclass
class Sample:
    wall: list[float] = field(default_factory=list)
    server: list[float] = field(default_factory=list)
    sql: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    statements: int = 0
    body: int = 0


def _body(statements: list[Statement]) -> bytes:
    return request_for(Batch(tuple(statements))).body


class Sender:
    def __init__(self, url: str) -> None:
        self.pool = urllib3.connection_from_url(url, maxsize=2, retries=False)

    def send(self, body: bytes) -> tuple[dict[str, Any], float]:
        t0 = time.perf_counter()
        r = self.pool.urlopen(
            "POST", WRITE_PATH + "&timings", body=body, headers=HEADERS, retries=False
        )
        wall = time.perf_counter() - t0
        reply = json.loads(r.data)
        if r.status != 200 or "error" in reply:
            raise RuntimeError(r.data[:300])
        for result in reply["results"]:
            if "error" in result:
                raise RuntimeError(result["error"])
        return reply, wall


class RoundLoop:
    """The Worker at concurrency 1: each request acks the last lease and claims one."""

    def __init__(self, drop: str | None) -> None:
        self.core = make_core()
        self.drop = drop
        self.leases: list[Lease] = []

    def body(self) -> tuple[bytes, int, str]:
        plan = self.core.round(worker_id="w", visibility=VISIBILITY, n=1, ack=self.leases)
        statements = [
            s for s in plan.batch.statements if not (self.drop and s.sql.startswith(self.drop))
        ]
        token = next(
            s.params["k"] for s in statements if isinstance(s.params, dict) and "k" in s.params
        )
        return _body(statements), len(statements), token

    def read(self, reply: dict[str, Any], token: str) -> None:
        rows = reply["results"][-1].get("values") or []
        self.leases = [
            Lease(int(r[0]), str(r[1]), json.loads(r[2]), token, int(r[3]), float(r[4]))
            for r in rows
        ]
        if not self.leases:
            raise RuntimeError("the backlog ran out")


def _fixed(statements: int, pad: int = 0) -> Callable[[], tuple[bytes, int, str]]:
    """`statements` trivial UPDATEs, each padded with an SQL comment of `pad` bytes."""
    comment = f" /*{'x' * pad}*/" if pad else ""
    body = json.dumps([[FLOOR_UPDATE + comment, k] for k in range(statements)]).encode()
    return lambda: (body, statements, "")


# Pads each of the 7 UPDATEs so that the request is as large as the Worker's round (~1.9 KB).
ROUND_PAD = 220


def run_variant(sender: Sender, pids: list[int], name: str, n: int, sample: Sample) -> None:
    loop = RoundLoop(DROPS.get(name.removeprefix("Worker round without ")))
    pad = ROUND_PAD if "padded" in name else 0
    make = _fixed(7 if "7" in name else 1, pad) if name.startswith("bare") else loop.body
    walls, servers, sqls = [], [], []
    cpu0 = cpu_seconds(pids)
    for _ in range(n):
        body, count, token = make()
        reply, wall = sender.send(body)
        if token:
            loop.read(reply, token)
        walls.append(1e3 * wall)
        servers.append(1e3 * reply.get("time", 0.0))
        sqls.append(1e3 * sum(x.get("time", 0.0) for x in reply["results"]))
        sample.statements, sample.body = count, len(body)
    sample.cpu.append(1e3 * (cpu_seconds(pids) - cpu0) / n)
    sample.wall.append(statistics.median(walls))
    sample.server.append(statistics.median(servers))
    sample.sql.append(statistics.median(sqls))
    if loop.leases:  # give the last lease back done
        sender.send(_body(list(loop.core.ack(loop.leases).batch.statements)))


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def report(samples: dict[str, Sample], args: argparse.Namespace, when: str) -> str:
    floor = samples["bare write, 1 UPDATE"]
    pprof = f" --pprof {args.pprof}" if args.pprof else ""
    lines = [
        "# What a write costs rqlite, statement by statement",
        "",
        f"`python bench/statement_cost.py --requests {args.requests} --repeats "
        f"{args.repeats}{pprof}`, {when}. One fresh local 3-node cluster (rqlited default Raft "
        "timeouts, data on /dev/shm), every request to the leader over urllib3, one at a time. "
        "Backlog: 20,000 messages in 2,000 groups. Medians [min-max] over the repetitions "
        "(each the median of its requests, or the mean for CPU).",
        "",
        "| request | statements | body bytes | wall ms | rqlite time ms | of which SQL ms "
        "| rqlited CPU ms (3 nodes) | CPU vs bare write |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = statistics.median(floor.cpu)
    for name, s in samples.items():
        lines.append(
            f"| {name} | {s.statements} | {s.body} | {_cell(s.wall)} | {_cell(s.server)} "
            f"| {_cell(s.sql)} | {_cell(s.cpu)} | {statistics.median(s.cpu) / base:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def profile_leader(url: str, seconds: int) -> None:
    """A CPU profile of the leader while the Worker round loop runs."""
    sender = Sender(url)
    stop = threading.Event()

    def load() -> None:
        loop = RoundLoop(None)
        while not stop.is_set():
            body, _, token = loop.body()
            loop.read(sender.send(body)[0], token)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        time.sleep(1)
        pool = urllib3.connection_from_url(url, retries=False)
        r = pool.request("GET", f"/debug/pprof/profile?seconds={seconds}", timeout=seconds + 30)
    finally:
        stop.set()
        thread.join()
    raw = RESULTS.with_name("rqlited_worker_round.pprof")
    raw.write_bytes(r.data)
    if shutil.which("go"):
        top = subprocess.run(
            ["go", "tool", "pprof", "-top", "-cum", "-nodecount=60", str(raw)],
            capture_output=True,
            text=True,
            check=False,
        )
        raw.with_suffix(".txt").write_text(top.stdout or top.stderr)
    print(f"profile written to {raw}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pprof", type=int, default=0, help="seconds of leader CPU profile")
    args = parser.parse_args(argv)
    names = [
        "bare write, 1 UPDATE",
        "bare write, 7 UPDATEs",
        "bare write, 7 UPDATEs padded to the round's size",
        "Worker round, ack 1 + claim 1",
        *(f"Worker round without {d}" for d in DROPS),
    ]
    samples = {name: Sample() for name in names}
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with Cluster(3, fast=False) as cluster:
        url = cluster.wait_ready().http_url
        pids = [node.pid for node in cluster.nodes if node.pid is not None]
        admin = RqliteAdmin(url)
        setup_floor(admin)
        sender = Sender(url)
        for rep in range(args.repeats):
            for name in rotate(names, rep):
                reset_ours(admin, QUEUE)
                build_ours(admin, QUEUE, 20_000, 2_000)
                time.sleep(0.5)
                run_variant(sender, pids, name, args.requests, samples[name])
                print(f"rep {rep + 1} {name}: {samples[name].cpu[-1]:.3f} ms CPU", flush=True)
        if args.pprof:
            reset_ours(admin, QUEUE)
            build_ours(admin, QUEUE, 20_000, 2_000)
            profile_leader(url, args.pprof)
        admin.close()
    text = report(samples, args, when)
    print(text)
    RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
