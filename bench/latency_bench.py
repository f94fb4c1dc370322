"""The bench at real latencies (issue 34): every link of a local 3-node cluster given a round
trip of 0, 1 and 4 ms (+/- 10 %) through toxiproxy (`Cluster(links=...)`): each node's Raft link
(a commit costs a leader-to-follower round trip) and the clients' HTTP; the peers' servers
(Redis, PostgreSQL) behind a link with the same round trip, in one run.

    .venv/bin/python bench/latency_bench.py [--rtts 0 1 4] [--reps 2] [--concurrency 1 8 64]
        [--prefetch M ...] [--worker-only] [--peers harel_redis ...] [--backlog 2000 200]
        [--out bench/results/latency.md]

At each round trip, repetition by repetition (the systems' order rotated): the Worker and
AsyncWorker at each concurrency against harel's Redis and PostgreSQL transports and
Procrastinate (worker_bench.py's runs, on the same backlog) and the bare write over the same
links (concurrency 1); claim() + ack() one at a time against the bare write and the seed
(workloads.cycle); a single publish against the bare write; the pickup latency of an idle
Worker (worker_bench.idle's). Also where the time of one Worker round goes: the client's round
trip (a read the node answers alone) and the Raft commit (a bare write less that read).

The rqlited run with the default Raft timeouts (1 s), as the main bench. Ratios are taken
within each repetition. `--prefetch M` adds the Worker with a prefetch cap of M x concurrency
(the default is 4) beside the others; `--worker-only` runs the Worker section alone; `--peers`
the peers named (default: all three); `--backlog MESSAGES GROUPS` the backlog every system of
the Worker section drains (default 2,000 in 200 groups; the peers drain the same). Writes
`--out` (bench/results/latency.md) and the same name in .json."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import urllib3
import worker_bench
import workloads
from measure import Results, rotate
from run import start_peers
from seed_transport import SeedRqliteTransport
from systems import FloorRqlite, RqliteAdmin, setup_floor
from worker_bench import Background, Peers, _one, _pickups, _record
from workloads import QUEUE, Env, _publish_floor, _publish_ours, log

from rqlite_queue import AsyncRqliteTransport, RqliteTransport
from rqlite_queue.testing import Cluster, Link, Links

RESULTS = Path(__file__).resolve().parent / "results"
PEERS = ("harel_redis", "harel_pg", "procrastinate")


def linked_env(cluster: Cluster) -> Env:
    """The bench's Env with every client on the leader through its HTTP link; the bench's own
    set-up and Raft counts go to the leader directly (they are not measured)."""
    leader = cluster.wait_ready()
    url, direct = leader.client_url, leader.http_url
    admin = RqliteAdmin(direct)

    def ours_on(queue: str) -> RqliteTransport:
        t = RqliteTransport(url, timeout=120.0, queue=queue)
        t.setup()
        return t

    return Env(
        label="rqlite",
        admin=admin,
        ours=lambda: ours_on(QUEUE),
        ours_on=ours_on,
        seed=lambda: SeedRqliteTransport(url),
        floor=lambda i: FloorRqlite(url, i),
        ours_async=lambda: AsyncRqliteTransport(url, timeout=120.0, queue=QUEUE),
        url=url,
        server_pids=[n.pid for n in cluster.nodes if n.pid is not None],
        raft=admin.raft,
    )


def peer_links(cluster: Cluster, peers: Peers) -> tuple[Peers, list[Link]]:
    """The peers' servers behind links of the cluster's toxiproxy, and those links."""
    assert cluster.links is not None
    api = cluster.links.api
    made: list[Link] = []
    replace: dict[str, Any] = {}
    if peers.redis_url:
        port = int(peers.redis_url.rsplit(":", 1)[1].split("/")[0])
        link = api.create("redis", "127.0.0.1:0", f"127.0.0.1:{port}")
        made.append(link)
        replace["redis_url"] = f"redis://{link.listen}/0"
    if peers.pg_dsn:
        head, tail = peers.pg_dsn.rsplit("@", 1)
        hostport, db = tail.split("/", 1)
        link = api.create("postgres", "127.0.0.1:0", hostport)
        made.append(link)
        replace["pg_dsn"] = f"{head}@{link.listen}/{db}"
    return dataclasses.replace(peers, **replace), made


def round_trip_split(env: Env, res: Results, sec: str, n: int) -> None:
    """ms of a read the node answers from its own copy (`level=none`: the client's round
    trip and the node's work) and of a bare write (that, plus the Raft commit)."""
    assert env.url is not None
    pool = urllib3.connection_from_url(env.url, maxsize=1, retries=False)
    body = json.dumps([["SELECT 1"]]).encode()
    headers = {"Content-Type": "application/json"}
    pool.urlopen("POST", "/db/query?level=none", body=body, headers=headers)
    t0 = time.perf_counter()
    for _ in range(n):
        pool.urlopen("POST", "/db/query?level=none", body=body, headers=headers)
    read = (time.perf_counter() - t0) / n
    pool.close()
    floor = env.floor(0)
    floor.write()
    t0 = time.perf_counter()
    for _ in range(n):
        floor.write()
    write = (time.perf_counter() - t0) / n
    floor.close()
    res.add(sec, "read (client round trip)", 1, "ms", 1e3 * read)
    res.add(sec, "bare write", 1, "ms", 1e3 * write)
    log(f"{sec}: read {1e3 * read:.2f} ms, bare write {1e3 * write:.2f} ms")


def single_publish(env: Env, res: Results, sec: str, n: int, rep: int) -> None:
    for system in rotate(["floor", "ours"], rep):
        if system == "floor":
            count, seconds = _publish_floor(env, n)
        else:
            count, seconds = _publish_ours(env, n, 1, 0)
        p = res.add(sec, system, 1, "ms", 1e3 * seconds / count)
        log(f"{sec} {system}: {p.values[-1]:.2f} ms a publish")


def pickups(env: Env, cfg: workloads.Config, res: Results, sec: str) -> None:
    for kind in ("worker", "worker_async"):
        workloads.reset_ours(env.admin, QUEUE)
        worker_bench.quiet(env)
        with Background(env, kind) as bg:
            _pickups(env, cfg, res, sec, bg)


def one_rtt(
    env: Env, cfg: workloads.Config, peers: Peers, res: Results, rtt_ms: float, args: Any
) -> None:
    tag = f"rtt{rtt_ms:g}"
    setup_floor(env.admin)
    if not args.worker_only:
        round_trip_split(env, res, f"{tag}.split", 100 if rtt_ms < 4 else 40)
    for rep in range(args.reps):
        for c in args.concurrency:
            runs = ["worker", "worker_async"] + (["floor", "floor_async"] if c == 1 else [])
            runs += [f"worker_pf{m}" for m in args.prefetch]
            runs += [p for p in ("harel_redis", "harel_pg") if _has(peers, p) and p in args.peers]
            if c in cfg.procrastinate_concurrency and peers.pg_dsn:
                runs.append("procrastinate")
            for system in rotate(runs, rep + c):
                _record(res, f"{tag}.worker", system, c, _one(env, cfg, peers, system, c))
        if not args.worker_only:
            single_publish(env, res, f"{tag}.publish", cfg.publish_single, rep)
    if args.worker_only:
        return
    workloads.cycle(env, cfg, res)  # its own repetitions (cfg.reps)
    for point in res.points:  # cycle writes to rqlite.cycle: file it under this round trip
        if point.section.startswith("rqlite.cycle") or point.section.startswith("rqlite.cpu"):
            point.section = f"{tag}.{point.section.split('.', 1)[1]}"
        if point.section.startswith("rqlite.split"):
            point.section = f"{tag}.cycle_split"
    pickups(env, cfg, res, f"{tag}.idle")


def _has(peers: Peers, system: str) -> bool:
    return peers.harel and bool(peers.redis_url if system == "harel_redis" else peers.pg_dsn)


# ---------------------------------------------------------------------------------- report


def _values(res: Results, sec: str, system: str, x: int | str) -> list[float]:
    p = res.get(sec, system, x)
    return list(p.values) if p else []


def _ratio(res: Results, sec: str, a: str, b: str, x: int, xb: int | None = None) -> list[float]:
    va, vb = _values(res, sec, a, x), _values(res, sec, b, x if xb is None else xb)
    return [p / q for p, q in zip(va, vb, strict=False) if q]


def cell(values: list[float], fmt: str = ".0f", suffix: str = "") -> str:
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:{fmt}}{suffix}"
    return f"{med:{fmt}}{suffix} [{min(values):{fmt}}-{max(values):{fmt}}]"


def markdown(
    res: Results,
    rtts: list[float],
    conc: list[int],
    meta: dict[str, str],
    prefetch: list[int] | None = None,
) -> str:
    out = [
        "# The bench at real latencies",
        "",
        f"`{meta['command']}`, {meta['date']}; {meta['machine']}; load average at start "
        f"{meta['load']}. A local 3-node cluster (rqlited v8.43.4, default Raft timeouts) with "
        "every link through toxiproxy (each node's Raft link and its clients' HTTP link; the "
        "peers' Redis and PostgreSQL behind a link of the same round trip), the round trip "
        "+/- 10 %. Medians [min-max] over the repetitions; ratios within a repetition.",
        "",
        f"Peers: {meta['peers']}.",
        "",
        "## Worker (no-op handler), msg/s",
        "",
        "| round trip | concurrency | Worker | AsyncWorker | bare write | harel Redis | "
        "harel PostgreSQL | Procrastinate | Worker / harel Redis | Worker / bare write |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rtt in rtts:
        sec = f"rtt{rtt:g}.worker"
        for c in conc:
            row = [f"{rtt:g} ms", str(c)]
            for system in ("worker", "worker_async", "floor", "harel_redis", "harel_pg"):
                row.append(cell(_values(res, sec, system, c if system != "floor" else 1)))
            row.append(cell(_values(res, sec, "procrastinate", c)))
            row.append(cell(_ratio(res, sec, "worker", "harel_redis", c), ".2f", "x"))
            row.append(
                cell(_ratio(res, sec, "worker", "floor", c, 1), ".2f", "x") if c == 1 else ""
            )
            out.append("| " + " | ".join(row) + " |")
    if prefetch:
        out += [
            "",
            "## The Worker with a larger prefetch cap (default: 4 x concurrency), msg/s",
            "",
            "| round trip | concurrency | prefetch | Worker | ratio to the default Worker | "
            "ratio to harel Redis |",
            "|---|---|---|---|---|---|",
        ]
        for rtt in rtts:
            sec = f"rtt{rtt:g}.worker"
            for c in conc:
                for m in prefetch:
                    system = f"worker_pf{m}"
                    out.append(
                        f"| {rtt:g} ms | {c} | {m} x c | {cell(_values(res, sec, system, c))} "
                        f"| {cell(_ratio(res, sec, system, 'worker', c), '.2f', 'x')} "
                        f"| {cell(_ratio(res, sec, system, 'harel_redis', c), '.2f', 'x')} |"
                    )
    out += [
        "",
        "## One message at a time, ms",
        "",
        "| round trip | client round trip (read) | bare write | single publish | bare write "
        "(same loop) | claim() + ack() | in bare writes | Worker c=1, per message | "
        "Worker c=1 msg/round | pickup p50 (Worker) | pickup p50 (AsyncWorker) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for rtt in rtts:
        t = f"rtt{rtt:g}"
        cyc = _values(res, f"{t}.cycle", "ours", 1)
        floor_cyc = _values(res, f"{t}.cycle", "floor", 1)
        worker_c1 = _values(res, f"{t}.worker", "worker", 1)
        out.append(
            "| "
            + " | ".join(
                [
                    f"{rtt:g} ms",
                    cell(_values(res, f"{t}.split", "read (client round trip)", 1), ".2f"),
                    cell(_values(res, f"{t}.split", "bare write", 1), ".2f"),
                    cell(_values(res, f"{t}.publish", "ours", 1), ".2f"),
                    cell(_values(res, f"{t}.publish", "floor", 1), ".2f"),
                    cell([1e3 / v for v in cyc], ".2f"),
                    cell([f / o for f, o in zip(floor_cyc, cyc, strict=False)], ".2f", "x"),
                    cell([1e3 / v for v in worker_c1], ".2f"),
                    cell(_values(res, f"{t}.worker.per_round", "worker", 1), ".1f"),
                    cell(_values(res, f"{t}.idle", "worker", "pickup p50"), ".1f"),
                    cell(_values(res, f"{t}.idle", "worker_async", "pickup p50"), ".1f"),
                ]
            )
            + " |"
        )
    out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtts", type=float, nargs="+", default=[0, 1, 4], help="ms")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument(
        "--peers",
        nargs="+",
        choices=PEERS,
        default=list(PEERS),
        help="the peers to run (default: all three)",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        nargs=2,
        default=[2_000, 200],
        metavar=("MESSAGES", "GROUPS"),
        help="the backlog every system drains (the same for all)",
    )
    parser.add_argument(
        "--prefetch",
        type=int,
        nargs="*",
        default=[],
        help="also the Worker with prefetch M x concurrency, for each M (default cap: 4)",
    )
    parser.add_argument(
        "--worker-only", action="store_true", help="the Worker section alone (no one-at-a-time)"
    )
    parser.add_argument("--out", default=str(RESULTS / "latency.md"))
    args = parser.parse_args(argv)
    base = workloads.rqlite_config(False)
    cfg = dataclasses.replace(
        base,
        reps=args.reps,
        workers=(1,),
        cycle_messages=150,
        many_messages=320,
        publish_single=150,
        worker_c1_messages=400,
        worker_backlog=(args.backlog[0], args.backlog[1]),
        floor_writes=300,
        procrastinate_concurrency=(8, 64) if "procrastinate" in args.peers else (),
        harel_window_s=3.0,
        pickups=20,
    )
    meta = {
        "command": " ".join(["python bench/latency_bench.py", *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"nproc {os.cpu_count()}",
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    res = Results()
    with (
        start_peers(not args.no_peers) as peers,
        Cluster(3, fast=False, links=Links()) as cluster,
    ):
        assert cluster.links is not None
        meta["peers"] = worker_bench.describe_peers(peers)
        linked, extra = peer_links(cluster, peers)
        env = linked_env(cluster)
        try:
            for rtt_ms in args.rtts:
                cluster.links.latency(rtt_ms / 1e3)
                for link in extra:
                    link.latency(rtt_ms / 1e3)
                log(f"== round trip {rtt_ms:g} ms on every link")
                t0 = time.monotonic()
                one_rtt(env, cfg, linked, res, rtt_ms, args)
                log(f"== round trip {rtt_ms:g} ms done in {time.monotonic() - t0:.0f}s")
                Path(args.out).with_suffix(".json").write_text(
                    json.dumps([p.to_json() for p in res.points], indent=1)
                )
        finally:
            env.admin.close()
    text = markdown(res, args.rtts, args.concurrency, meta, args.prefetch)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
