"""Weighted fair share through Workers on a real 3-node cluster (the short flood of issue 22;
`bench/fairness_bench.py` is the long one): tenant A floods the queue with many groups, tenants
B, C and D have a few each, weights 1, 1, 2, 4; three Workers drain it. While every tenant has
work, each tenant's share of the messages handled is within 10 % of its weight's share, read
from the handlers' own log."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

from rqlite_queue import RqliteTransport
from rqlite_queue.testing import Cluster
from rqlite_queue.worker import Worker

WEIGHTS = {"A": 1, "B": 1, "C": 2, "D": 4}
SMALL = 300
"""Messages of each of B, C and D, in 10 groups (A: 4 000 in 400 groups)."""


def flood() -> list[dict[str, Any]]:
    items = [{"group_id": f"A-{i % 400}", "event": "A", "tenant": "A"} for i in range(4000)]
    for tenant in "BCD":
        items += [
            {"group_id": f"{tenant}-{i % 10}", "event": tenant, "tenant": tenant}
            for i in range(SMALL)
        ]
    return items


def test_three_workers_share_claims_between_tenants_by_weight(
    rqlite_cluster3: Cluster,
) -> None:
    queue = f"fair_{uuid.uuid4().hex[:8]}"
    handled: list[str] = []
    lock = threading.Lock()
    done = {tenant: 0 for tenant in WEIGHTS}
    one_ran_out = threading.Event()

    def handler(lease: Any) -> None:
        with lock:
            handled.append(lease.event)
            done[lease.event] += 1
            if lease.event != "A" and done[lease.event] == SMALL:
                one_ran_out.set()

    with RqliteTransport(rqlite_cluster3.url, queue=queue) as q:
        for tenant, weight in WEIGHTS.items():
            q.set_tenant(tenant, weight=weight)
        q.publish_many(flood())
        transports = [RqliteTransport(rqlite_cluster3.url, queue=queue) for _ in range(3)]
        # 6 slots: D's share (half) needs 3 of its 10 groups in flight, so it always has some
        # claimable (a tenant with none is not "backlogged": it has no claim to a share then).
        workers = [Worker(t, handler, concurrency=2, visibility=30) for t in transports]
        threads = [
            threading.Thread(target=w.run, kwargs={"handle_signals": False}) for w in workers
        ]
        for thread in threads:
            thread.start()
        try:
            assert one_ran_out.wait(120), f"no small tenant ran out: {done}"
        finally:
            for worker in workers:
                worker.stop()
            for thread in threads:
                thread.join(30)
            for transport in transports:
                transport.close()
    with lock:
        log = list(handled)
    # While all had work: up to the first small tenant's last message, less the last round of
    # each worker (6 slots), when that tenant had fewer groups left than its share.
    first_out = min(
        max(i for i, t in enumerate(log) if t == tenant)
        for tenant in "BCD"
        if done[tenant] == SMALL
    )
    shares = Counter(log[: max(0, first_out - 6)])
    total = sum(shares.values())
    assert total > 200, shares
    weight_sum = sum(WEIGHTS.values())
    for tenant, weight in WEIGHTS.items():
        expected = weight / weight_sum
        assert abs(shares[tenant] / total - expected) <= 0.1 * expected, (shares, first_out, done)
