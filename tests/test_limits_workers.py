"""Limits per tenant through Workers on a real 3-node cluster (issue 22's "done when"): a tenant
limited to 50 claims a second is served at 50/s within 5 % across three Workers, while another
tenant's work goes on beside it; a tenant capped at 3 groups in flight never has more than 3
handlers running, read from the handlers' own log. Short runs in `make test`; the 30-second
rate run in the slow tier (`pytest -m slow tests/test_limits_workers.py`)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from rqlite_queue import RqliteTransport
from rqlite_queue.testing import Cluster

RATE = 50.0
BURST = 5.0


@pytest.mark.parametrize(
    "seconds", [pytest.param(8.0, id="short"), pytest.param(30.0, id="30s", marks=pytest.mark.slow)]
)
def test_a_rate_limited_tenant_is_served_at_its_rate_across_three_workers(
    rqlite_cluster3: Cluster, three_workers: Any, seconds: float
) -> None:
    queue = f"rate_{uuid.uuid4().hex[:8]}"
    limited: list[float] = []
    other: list[float] = []
    lock = threading.Lock()

    def handler(lease: Any) -> None:
        with lock:
            (limited if lease.event == "R" else other).append(time.monotonic())

    with RqliteTransport(rqlite_cluster3.url, queue=queue) as q:
        q.set_tenant("R", rate=RATE, burst=BURST)
        needed = int(RATE * seconds * 1.5)
        q.publish_many(
            [{"group_id": f"R-{i % 200}", "event": "R", "tenant": "R"} for i in range(needed)]
        )
        q.publish_many([{"group_id": f"O-{i % 50}", "event": "O"} for i in range(4000)])
        with three_workers(rqlite_cluster3, queue, handler, concurrency=4):
            time.sleep(seconds + 1.5)
    with lock:
        times = sorted(limited)
    assert times, "the limited tenant was never served"
    # From one second in (the burst spent) for `seconds`: the bucket's rate, whatever the
    # three Workers' rounds and wake-ups.
    start = times[0] + 1.0
    served = sum(1 for t in times if start <= t < start + seconds)
    assert abs(served / seconds - RATE) <= 0.05 * RATE, (served, seconds)
    # The other tenant is not held back by the limited one: it is served far faster.
    assert len(other) > 2 * len(times), (len(other), len(times))


def test_a_cap_of_three_is_never_exceeded_across_three_workers(
    rqlite_cluster3: Cluster, three_workers: Any
) -> None:
    queue = f"cap_{uuid.uuid4().hex[:8]}"
    running = {"C": 0, "O": 0}
    most = {"C": 0, "O": 0}
    handled = {"C": 0, "O": 0}
    lock = threading.Lock()

    def handler(lease: Any) -> None:
        tenant = lease.event
        with lock:
            running[tenant] += 1
            most[tenant] = max(most[tenant], running[tenant])
        time.sleep(0.02)
        with lock:
            running[tenant] -= 1
            handled[tenant] += 1

    with RqliteTransport(rqlite_cluster3.url, queue=queue) as q:
        q.set_tenant("C", max_in_flight=3)
        q.publish_many(
            [{"group_id": f"C-{i % 30}", "event": "C", "tenant": "C"} for i in range(300)]
        )
        q.publish_many([{"group_id": f"O-{i % 30}", "event": "O"} for i in range(300)])
        with three_workers(rqlite_cluster3, queue, handler, concurrency=4):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and q.stats().depth:
                time.sleep(0.2)
        assert q.stats().depth == 0
    assert handled == {"C": 300, "O": 300}
    assert most["C"] == 3, most  # the cap was reached, never passed
    assert most["O"] > 3, most  # 12 slots: the uncapped tenant used more
