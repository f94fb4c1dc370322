"""Where the Worker's round trip at concurrency 1 spends rqlite's time: the round as the library
sends it, the same round without one statement at a time, the single calls `claim()` then
`ack()` (as harel's runner makes them; their ack also on `/db/request`, where the library sent
it before), and bare writes of 1 and 7 trivial statements, all over urllib3 to the leader of
one fresh local 3-node cluster.

    .venv/bin/python bench/statement_cost.py [--requests 1000] [--repeats 3] [--pprof 8]

Per variant: wall time per request, rqlite's own `time` and the sum of its statements' SQL
times (`?timings`, on the leader), and the CPU of the 3 rqlited processes per request (from
/proc). Each round acks the lease the previous one took and claims the next, as the Worker at
concurrency 1 does; a variant without a statement drops it from the request (its effect on
the queue is then wrong, its cost is what is measured). Variants run interleaved, in an order
rotated between repetitions; cells are medians [min-max] over the repetitions. Writes
bench/results/statement_cost.md. With `--pprof S`, also takes an S-second CPU profile of the
leader (rqlited's /debug/pprof) while the round loop (`--pprof-single`: the claim() + ack()
loop) runs, and writes it with, when `go` is on the PATH, its `go tool pprof -top -cum` text
beside it. The single calls' rows are per pair (two requests).

Also the variants of a statement for what a queue does not use, side by side with the general
statement they stand in for (issue 31): a publish of a client that knows tenants off (its
groups' rows without the tenant separator's lookup, without a WITH: on `/db/execute`) against
the same publish with the general group upsert (what the library sent before, on
`/db/request`), and the probe of such a client against the general probe (the tenants'
allowances and next tokens): rqlited CPU per request, as above. And, in-process, what SQLite
takes to compile each variant and its general form (`--compile`: microseconds per prepare,
the least of `--compile-runs` runs of 200 prepares on a connection that caches none; the
embedded backend compiles every statement once per send, and rqlite once per node and
more)."""

from __future__ import annotations

import argparse
import dataclasses
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
from rqlite_queue._protocol import messages, names, probes, publish, round_spec, rounds, schema
from rqlite_queue._protocol.http import parse_reply, request_for
from rqlite_queue._protocol.plan import Batch, Plan, Reply
from rqlite_queue._protocol.round_spec import RoundSpec
from rqlite_queue.testing import Cluster
from rqlite_queue.types import Round

RESULTS = Path(__file__).resolve().parent / "results" / "statement_cost.md"

# SQL prefixes of the round's statements, to drop one at a time.
DROPS = {
    "lapsed leases rejoin (UPDATE groups ... WHERE ready = 0 AND until <= now)": (
        f"UPDATE rq_{QUEUE}_groups SET ready = 1, parked = 0"
    ),
    "the turn counter (UPDATE meta)": f"UPDATE rq_{QUEUE}_meta SET value = value + 1",
    "the claim's token (INSERT INTO claims)": f"INSERT INTO rq_{QUEUE}_claims",
    "the schema fence (INSERT INTO meta ... WHERE the version is not this code's)": (
        f"INSERT INTO rq_{QUEUE}_meta (key, value) SELECT 'schema_version'"
    ),
}


@dataclass
class Sample:
    wall: list[float] = field(default_factory=list)
    server: list[float] = field(default_factory=list)
    sql: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    statements: int = 0
    body: int = 0


class Sender:
    def __init__(self, url: str) -> None:
        self.pool = urllib3.connection_from_url(url, maxsize=2, retries=False)

    def send(self, body: bytes, path: str = WRITE_PATH) -> tuple[dict[str, Any], float]:
        t0 = time.perf_counter()
        r = self.pool.urlopen("POST", path + "&timings", body=body, headers=HEADERS, retries=False)
        wall = time.perf_counter() - t0
        reply = json.loads(r.data)
        if r.status != 200 or "error" in reply:
            raise RuntimeError(r.data[:300])
        for result in reply["results"]:
            if "error" in result:
                raise RuntimeError(result["error"])
        return reply, wall


def _read(plan: Plan[Round], reply: dict[str, Any]) -> Round:
    """The plan's own reading of rqlite's reply."""
    results = parse_reply(200, json.dumps(reply).encode(), len(plan.batch.statements))
    return plan.read(Reply(plan.batch, results))


class RoundLoop:
    """The Worker at concurrency 1 (`single=False`): each request acks the last lease and
    claims one. Or a caller of the single calls (`single=True`): `claim()`, then `ack()`, two
    requests a step; with `ack_path`, the ack goes there instead of where the library sends
    it."""

    def __init__(self, drop: str | None, single: bool = False, ack_path: str | None = None):
        self.core = make_core()
        self.drop = drop
        self.single = single
        self.ack_path = ack_path
        self.leases: list[Lease] = []

    def plan(self, n: int, ack: list[Lease]) -> Plan[Round]:
        spec = RoundSpec(worker_id="w", visibility=VISIBILITY, n=n, ack=ack)
        plan = rounds.plan(self.core, round_spec.check(self.core, spec))
        # As the transport sends it: with the schema fence at its end.
        fenced = plan.batch.last(*schema.fence(self.core.names, plan.batch.write))
        plan = dataclasses.replace(plan, batch=fenced)
        kept = [
            k
            for k, s in enumerate(plan.batch.statements)
            if not (self.drop and s.sql.startswith(self.drop))
        ]
        batch = dataclasses.replace(
            plan.batch,
            statements=tuple(plan.batch.statements[k] for k in kept),
            slots={slot: kept.index(k) for slot, k in plan.batch.slots.items() if k in kept},
        )
        return dataclasses.replace(plan, batch=batch)

    def step(self, sender: Sender) -> tuple[list[dict[str, Any]], float, int, int]:
        """One step's replies, wall seconds, statements and body bytes."""
        if not self.single:
            plan = self.plan(1, self.leases)
            request = request_for(plan.batch)
            reply, wall = sender.send(request.body, request.path)
            self.leases = _read(plan, reply).leases
            replies = [reply]
            sizes = (request.statements, len(request.body))
        else:
            claim = self.plan(1, [])
            request = request_for(claim.batch)
            reply, wall = sender.send(request.body, request.path)
            self.leases = _read(claim, reply).leases
            if not self.leases:
                raise RuntimeError("the backlog ran out")
            ack = self.plan(0, self.leases)
            second = request_for(ack.batch)
            reply2, wall2 = sender.send(second.body, self.ack_path or second.path)
            self.leases = []
            replies, wall = [reply, reply2], wall + wall2
            sizes = (request.statements + second.statements, len(request.body + second.body))
        if not self.single and not self.leases:
            raise RuntimeError("the backlog ran out")
        return replies, wall, *sizes


class BatchLoop:
    """One batch a step, made anew each time (`make`), fenced as the transport sends it."""

    def __init__(self, make: Callable[[], Batch]) -> None:
        self.make = make
        self.leases: list[Lease] = []

    def step(self, sender: Sender) -> tuple[list[dict[str, Any]], float, int, int]:
        batch = self.make()
        batch = batch.last(*schema.fence(make_core().names, batch.write))
        request = request_for(batch)
        reply, wall = sender.send(request.body, request.path)
        return [reply], wall, request.statements, len(request.body)


def _publish_one(general: bool) -> Callable[[], Batch]:
    """A publish of one message by a client that knows tenants off: the tripwire form, or
    (`general`) the same with the general group upsert in place of its variant."""
    core = make_core()
    counter = iter(range(10**9))

    def make() -> Batch:
        checked = messages.checked(core, [(f"p{next(counter) % 500}", 1)], scoped=False)
        batch = publish.plan(core, checked, tenants_on=False).batch
        if not general:
            return batch
        rows = publish._items_rows(publish.ALWAYS, False)
        upsert = publish.upsert_groups(rows, tenants=True, delays=True)(core.names)
        last = len(batch.statements) - 1
        given = dict(batch.statements[last].params)  # (the general form reads the time too)
        general_upsert = dataclasses.replace(
            batch.statements[last], sql=upsert, params={**given, "now": core.clock()}
        )
        statements = (*batch.statements[:last], general_upsert)
        return Batch(statements, batch.write, batch.local, batch.slots, batch.returning, True)

    return make


def _probe(tenants: bool) -> Callable[[], Batch]:
    core = make_core()
    return lambda: probes.plan(core, 0, tenants=tenants).batch


VARIANTS: dict[str, Callable[[], Callable[[], Batch]]] = {
    "publish 1, tenants known off: the variant (no tenant lookup, no WITH: /db/execute)": (
        lambda: _publish_one(False)
    ),
    "publish 1, tenants known off: the general upsert (as before: /db/request)": (
        lambda: _publish_one(True)
    ),
    "probe, tenants known off: the variant": lambda: _probe(False),
    "probe, the general form (allowances, next tokens)": lambda: _probe(True),
}


def compile_costs(runs: int) -> str:
    """What SQLite takes to compile each variant and its general form (see the top)."""
    import sqlite3
    import tempfile

    from rqlite_queue._protocol import schema as schema_module

    n = names.Names.of(QUEUE)
    rows = publish._items_rows(publish.ALWAYS, False)
    pairs = {
        "a publish's group upsert": (
            publish.upsert_groups(rows, tenants=False, delays=False),
            publish.upsert_groups(rows, tenants=True, delays=True),
            "tenants known off, heads due at once",
        ),
        "a publish's group upsert, heads due at once": (
            publish.upsert_groups(rows, tenants=True, delays=False),
            publish.upsert_groups(rows, tenants=True, delays=True),
            "with the tenant lookup",
        ),
        "the probe": (probes._probe(False, False), probes._probe(False, True), "tenants off"),
    }
    lines = [
        "| statement | variant | variant us | general us | variant / general |",
        "|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(f"{tmp}/q.db", cached_statements=0)
        for statement in [
            *schema_module.bootstrap_batch(n).statements,
            *schema_module.create(n).statements,
        ]:
            conn.execute(statement.sql, statement.params)
        for what, (variant, general, which) in pairs.items():
            costs = []
            for sql in (variant(n), general(n)):
                best = float("inf")
                for _ in range(runs):
                    started = time.perf_counter()
                    for _ in range(200):
                        conn.execute("EXPLAIN " + sql, _params(sql)).fetchone()
                    best = min(best, (time.perf_counter() - started) / 200)
                costs.append(best * 1e6)
            ratio = costs[0] / costs[1]
            lines.append(f"| {what} | {which} | {costs[0]:.1f} | {costs[1]:.1f} | {ratio:.2f} |")
        conn.close()
    return "\n".join(lines) + "\n"


def _params(sql: str) -> dict[str, Any]:
    """NULL for every named parameter of `sql` (EXPLAIN compiles it; nothing runs)."""
    import re

    return {name: None for name in re.findall(r":(\w+)", sql)}


def _fixed(statements: int, pad: int = 0) -> Callable[[], tuple[bytes, int]]:
    """`statements` trivial UPDATEs, each padded with an SQL comment of `pad` bytes."""
    comment = f" /*{'x' * pad}*/" if pad else ""
    body = json.dumps([[FLOOR_UPDATE + comment, k] for k in range(statements)]).encode()
    return lambda: (body, statements)


# Pads each of the 7 UPDATEs so that the request is as large as the Worker's round (~1.9 KB).
ROUND_PAD = 220


def run_variant(sender: Sender, pids: list[int], name: str, n: int, sample: Sample) -> None:
    single = name.startswith("claim() + ack()")
    ack_path = WRITE_PATH if single and "/db/request" in name else None
    loop: RoundLoop | BatchLoop = (
        BatchLoop(VARIANTS[name]())
        if name in VARIANTS
        else RoundLoop(DROPS.get(name.removeprefix("Worker round without ")), single, ack_path)
    )
    pad = ROUND_PAD if "padded" in name else 0
    fixed = _fixed(7 if "7" in name else 1, pad) if name.startswith("bare") else None
    walls, servers, sqls = [], [], []
    cpu0 = cpu_seconds(pids)
    for _ in range(n):
        if fixed is not None:
            body, count = fixed()
            reply, wall = sender.send(body)
            replies = [reply]
            sample.statements, sample.body = count, len(body)
        else:
            replies, wall, sample.statements, sample.body = loop.step(sender)
        walls.append(1e3 * wall)
        servers.append(1e3 * sum(r.get("time", 0.0) for r in replies))
        sqls.append(1e3 * sum(x.get("time", 0.0) for r in replies for x in r["results"]))
    sample.cpu.append(1e3 * (cpu_seconds(pids) - cpu0) / n)
    sample.wall.append(statistics.median(walls))
    sample.server.append(statistics.median(servers))
    sample.sql.append(statistics.median(sqls))
    if isinstance(loop, RoundLoop) and loop.leases:  # give the last lease back done
        last = request_for(loop.plan(0, loop.leases).batch)
        sender.send(last.body, last.path)


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def report(samples: dict[str, Sample], args: argparse.Namespace, when: str) -> str:
    floor = samples["bare write, 1 UPDATE"]
    command = " ".join(["python bench/statement_cost.py", *sys.argv[1:]])
    lines = [
        "# What a write costs rqlite, statement by statement",
        "",
        f"`{command}`, {when}. One fresh local 3-node cluster (rqlited default Raft "
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


def profile_leader(url: str, seconds: int, single: bool) -> None:
    """A CPU profile of the leader while the Worker round loop (or, `single`, the claim() +
    ack() loop) runs."""
    sender = Sender(url)
    stop = threading.Event()

    def load() -> None:
        loop = RoundLoop(None, single=single)
        while not stop.is_set():
            loop.step(sender)

    thread = threading.Thread(target=load)
    thread.start()
    try:
        time.sleep(1)
        pool = urllib3.connection_from_url(url, retries=False)
        r = pool.request("GET", f"/debug/pprof/profile?seconds={seconds}", timeout=seconds + 30)
    finally:
        stop.set()
        thread.join()
    raw = RESULTS.with_name(f"rqlited_{'claim_ack' if single else 'worker_round'}.pprof")
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
    parser.add_argument(
        "--pprof-single", action="store_true", help="profile claim() + ack(), not the round"
    )
    parser.add_argument("--compile", action="store_true", help="also SQLite's compile costs")
    parser.add_argument("--compile-runs", type=int, default=20)
    parser.add_argument("--only-variants", action="store_true", help="the variants' rows only")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    names = [
        "bare write, 1 UPDATE",
        *(
            []
            if args.only_variants
            else [
                "bare write, 7 UPDATEs",
                "bare write, 7 UPDATEs padded to the round's size",
                "Worker round, ack 1 + claim 1",
                *(f"Worker round without {d}" for d in DROPS),
                "claim() + ack(), as the library sends them",
                "claim() + ack(), the ack on /db/request",
            ]
        ),
        *VARIANTS,
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
            profile_leader(url, args.pprof, args.pprof_single)
        admin.close()
    text = report(samples, args, when)
    if args.compile:
        text += (
            "\nSQLite's compile of each variant and of the general statement it stands in for "
            f"(`--compile`, the least of {args.compile_runs} runs of 200 prepares):\n\n"
            + compile_costs(args.compile_runs)
        )
    print(text)
    Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
