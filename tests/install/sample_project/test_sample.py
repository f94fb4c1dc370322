"""A user's own tests, written against rqlite-queue's pytest fixtures alone: no conftest, no
harness of their own. tests/install runs this file under plain `pytest` in a fresh virtualenv;
the project's own run collects it too."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rqlite_queue import Lease, Transport, Worker


def run_orders(queue: Transport) -> dict[str, list[Any]]:
    """The code under test: publish two orders' steps, work them off, return what was done."""
    done: dict[str, list[Any]] = defaultdict(list)

    def handle(lease: Lease) -> None:
        done[lease.group_id].append(lease.event["step"])

    for order in ("order-1", "order-2"):
        for step in ("charge", "pack", "ship"):
            queue.publish(order, {"step": step})
    Worker(queue, handle, concurrency=4).run(until_empty=True)
    return dict(done)


def test_orders_on_a_real_rqlite(rqlite_transport: Transport) -> None:
    assert run_orders(rqlite_transport) == {
        "order-1": ["charge", "pack", "ship"],
        "order-2": ["charge", "pack", "ship"],
    }
    assert rqlite_transport.stats().depth == 0


def test_orders_on_the_embedded_queue(embedded_transport: Transport) -> None:
    assert run_orders(embedded_transport)["order-2"] == ["charge", "pack", "ship"]


def test_orders_on_three_nodes(rqlite_cluster3: Any, rqlite_queue_name: str) -> None:
    with Transport.from_url(rqlite_cluster3.url, queue=rqlite_queue_name) as queue:
        assert run_orders(queue)["order-1"] == ["charge", "pack", "ship"]


def test_a_leader_kill_loses_nothing(rqlite_cluster_factory: Any, rqlite_queue_name: str) -> None:
    cluster = rqlite_cluster_factory(3)
    with Transport.from_url(cluster.url, queue=rqlite_queue_name) as queue:
        queue.publish("order-9", {"step": "charge"})
        cluster.leader().kill()
        # A dedup id makes the publish safe to resend when a reply is lost in the failover.
        queue.publish("order-9", {"step": "ship"}, dedup_id="order-9/ship")
        first = queue.claim("w1", visibility=30)
        assert first is not None and first.event == {"step": "charge"}
        queue.ack(first)
        second = queue.claim("w1", visibility=30)
        assert second is not None and second.event == {"step": "ship"}
        queue.ack(second)
