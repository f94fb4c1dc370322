"""What tenants cost, and what they buy, on one local 3-node cluster:

1. **Claim latency.** A single claim + ack behind a backlog of 20 000 groups in the default
   tenant, and behind the same backlog spread over 1 000 tenants of mixed weights; the two
   queues alternate, claim by claim, in one run (the ratio is within the run).
2. **The flood** (issue 22's test, long): tenant A publishes 50 000 messages in 5 000 groups,
   B, C and D 500 each in 10 groups, weights 1, 1, 2, 4; three Workers (concurrency 2) drain.
   While every tenant has work: each tenant's share of the messages handled.
3. **B's pickup during A's flood.** B publishes a message to one of its 10 groups every 20 ms
   while three Workers drain A's flood, then again with no A: the time from B's publish to its
   handler, p50 and p99, with and without A.

    .venv/bin/python bench/fairness_bench.py

Writes bench/results/fairness.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rqlite_queue import Transport, Worker  # noqa: E402
from rqlite_queue.local_cluster import Cluster  # noqa: E402

WEIGHTS = {"A": 1, "B": 1, "C": 2, "D": 4}


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def claim_latency(cluster: Cluster, claims: int) -> dict[str, list[float]]:
    """Seconds per claim + ack, behind 20 000 groups: one tenant, 1 000 tenants, or 1 000
    tenants of which a tenth have a cap, a rate limit and bounds (none reached: what checking
    them costs)."""
    queues: dict[str, Any] = {}
    for name, tenants, limited in (
        ("none", 0, False),
        ("1k tenants", 1000, False),
        ("1k tenants, a tenth limited", 1000, True),
    ):
        q = Transport.from_url(cluster.url, queue=f"cl_{uuid.uuid4().hex[:8]}")
        if tenants:
            for t in range(0, tenants, 10):
                q.set_tenant(f"t{t}", weight=1 + t % 4)
                if limited:
                    q.set_tenant(f"t{t}", max_in_flight=1000, rate=1e5, burst=1e5, max_queued=10**7)
        for start in range(0, 20_000, 2000):
            q.publish_many(
                [
                    {
                        "group_id": f"g{i}",
                        "event": i,
                        **({"tenant": f"t{i % tenants}"} if tenants else {}),
                    }
                    for i in range(start, start + 2000)
                ]
            )
        queues[name] = q
    times: dict[str, list[float]] = {name: [] for name in queues}
    for i in range(claims):
        names = list(queues)
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            q = queues[name]
            started = time.perf_counter()
            lease = q.claim("w", 30)
            q.ack(lease)
            times[name].append(time.perf_counter() - started)
    for q in queues.values():
        q.close()
    return times


def run_workers(
    cluster: Cluster, queue: str, handler: Any, until: threading.Event, limit: float
) -> None:
    transports = [Transport.from_url(cluster.url, queue=queue) for _ in range(3)]
    workers = [Worker(t, handler, concurrency=2, visibility=60) for t in transports]
    threads = [threading.Thread(target=w.run, kwargs={"handle_signals": False}) for w in workers]
    for thread in threads:
        thread.start()
    until.wait(limit)
    for worker in workers:
        worker.stop()
    for thread in threads:
        thread.join(60)
    for transport in transports:
        transport.close()


def publish_flood(q: Transport, a_messages: int, a_groups: int) -> None:
    for start in range(0, a_messages, 5000):
        q.publish_many(
            [
                {"group_id": f"A-{i % a_groups}", "event": ("A", 0.0), "tenant": "A"}
                for i in range(start, min(a_messages, start + 5000))
            ]
        )


def flood(cluster: Cluster, args: argparse.Namespace) -> Counter[str]:
    queue = f"fl_{uuid.uuid4().hex[:8]}"
    log: list[str] = []
    done = Counter[str]()
    out = threading.Event()
    lock = threading.Lock()
    with Transport.from_url(cluster.url, queue=queue) as q:
        for tenant, weight in WEIGHTS.items():
            q.set_tenant(tenant, weight=weight)
        publish_flood(q, args.a_messages, args.a_groups)
        q.publish_many(
            [
                {"group_id": f"{t}-{i % 10}", "event": (t, 0.0), "tenant": t}
                for t in "BCD"
                for i in range(args.small)
            ]
        )

        def handler(lease: Any) -> None:
            tenant = lease.event[0]
            with lock:
                log.append(tenant)
                done[tenant] += 1
                if tenant != "A" and done[tenant] == args.small:
                    out.set()

        run_workers(cluster, queue, handler, out, 600)
    first_out = min(
        max(i for i, t in enumerate(log) if t == tenant)
        for tenant in "BCD"
        if done[tenant] == args.small
    )
    return Counter(log[: max(0, first_out - 6)])


def pickup(cluster: Cluster, with_a: bool, args: argparse.Namespace) -> list[float]:
    """Seconds from B's publish to its handler, for B's messages published every 20 ms."""
    queue = f"pk_{uuid.uuid4().hex[:8]}"
    waits: list[float] = []
    lock = threading.Lock()
    finished = threading.Event()
    with Transport.from_url(cluster.url, queue=queue) as q:
        if with_a:
            publish_flood(q, args.a_messages, args.a_groups)

        def handler(lease: Any) -> None:
            tenant, sent = lease.event
            if tenant == "B":
                with lock:
                    waits.append(time.time() - sent)
                    if len(waits) == args.pickups:
                        finished.set()

        def trickle() -> None:
            with Transport.from_url(cluster.url, queue=queue) as p:
                for i in range(args.pickups):
                    p.publish(f"B-{i % 10}", ("B", time.time()), tenant="B")
                    time.sleep(0.02)

        producer = threading.Thread(target=trickle)
        producer.start()
        run_workers(cluster, queue, handler, finished, 600)
        producer.join()
    return waits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--a-messages", type=int, default=50_000)
    parser.add_argument("--a-groups", type=int, default=5_000)
    parser.add_argument("--small", type=int, default=500)
    parser.add_argument("--pickups", type=int, default=500)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "fairness.md"))
    args = parser.parse_args()
    with Cluster(3, fast=False) as cluster:
        latency = claim_latency(cluster, args.claims)
        shares = flood(cluster, args)
        with_a = pickup(cluster, True, args)
        alone = pickup(cluster, False, args)
    none, many = (statistics.median(latency[k]) for k in ("none", "1k tenants"))
    total = sum(shares.values())
    weight_sum = sum(WEIGHTS.values())
    lines = [
        "# Tenants: cost and fairness",
        "",
        f"`.venv/bin/python bench/fairness_bench.py`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. One local 3-node cluster "
        f"(rqlite's default Raft timeouts).",
        "",
        "## Claim latency: one claim + ack behind 20 000 groups",
        "",
        "| backlog | p50 ms | p90 ms | ratio of p50 to one tenant |",
        "| --- | --- | --- | --- |",
    ]
    labels = {
        "none": "one tenant",
        "1k tenants": "1 000 tenants (weights 1-4)",
        "1k tenants, a tenth limited": "1 000 tenants, a tenth capped, rate-limited, bounded",
    }
    for name, label in labels.items():
        p50 = statistics.median(latency[name])
        lines.append(
            f"| {label} | {p50 * 1000:.2f} | {quantile(latency[name], 0.9) * 1000:.2f} | "
            f"{p50 / none:.2f}x |"
        )
    lines += [
        "",
        f"{args.claims} claims each, the queues taking turns claim by claim; 1 000 tenants "
        f"to {many / none:.2f}x the claim with one; with limits to check (none reached), "
        f"{statistics.median(latency['1k tenants, a tenth limited']) / none:.2f}x.",
        "",
        f"## The flood: A {args.a_messages:,} messages in {args.a_groups:,} groups; B, C, D "
        f"{args.small} each in 10 groups",
        "",
        "Three Workers (concurrency 2); the messages handled while every tenant had work:",
        "",
        "| tenant | weight | handled | share | weight's share | off by |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for tenant, weight in WEIGHTS.items():
        share, expected = shares[tenant] / total, weight / weight_sum
        lines.append(
            f"| {tenant} | {weight} | {shares[tenant]:,} | {share:.3f} | {expected:.3f} | "
            f"{(share - expected) / expected:+.1%} |"
        )
    ratio = quantile(with_a, 0.99) / quantile(alone, 0.99)
    lines += [
        "",
        f"## B's pickup: a message every 20 ms ({args.pickups}), three Workers",
        "",
        "| | p50 ms | p99 ms |",
        "| --- | --- | --- |",
        f"| during A's flood | {statistics.median(with_a) * 1000:.1f} | "
        f"{quantile(with_a, 0.99) * 1000:.1f} |",
        f"| without A | {statistics.median(alone) * 1000:.1f} | "
        f"{quantile(alone, 0.99) * 1000:.1f} |",
        "",
        f"p99 during the flood / without: {ratio:.2f}x.",
        "",
    ]
    text = "\n".join(lines)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
