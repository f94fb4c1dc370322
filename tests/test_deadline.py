"""One deadline per call: failover, resends and request timeouts all fit in it. Tested while
the cluster cannot answer: its leader and one follower frozen (SIGSTOP: they accept
connections and never reply, as a partitioned node would), so no quorum is left."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from rqlite_queue import OutcomeUnknown, RqliteTransport, Unavailable
from rqlite_queue.errors import NoLeader
from rqlite_queue.testing import Cluster

DEADLINE = 3.0
TIMEOUT = 1.0
SLACK = 0.5
"""What the bound allows beyond the deadline: the time to run the client code after the last
request gave up (the contract states `deadline` + 0.1 s; this machine is shared and slow)."""


def READ(q: Any, lease: Any) -> Any:
    return q.stats()


@pytest.fixture
def frozen(rqlite_cluster_factory: Callable[..., Cluster]) -> Any:
    cluster = rqlite_cluster_factory(3)
    queue = f"dl_{uuid.uuid4().hex[:8]}"
    q = RqliteTransport(cluster.url, queue=queue, deadline=DEADLINE, timeout=TIMEOUT)
    q.publish_many([("a", 1), ("b", 2), ("c", 3)])
    lease = q.claim("w", 60)
    leader = cluster.leader()
    other = next(node for node in cluster.nodes if node is not leader)
    leader.pause()
    other.pause()
    yield q, lease, cluster
    leader.resume()
    other.resume()
    cluster.wait_ready()
    q.close()


@pytest.mark.parametrize(
    ("call", "errors"),
    [
        (lambda q, lease: q.ack(lease), (OutcomeUnknown, Unavailable)),
        (lambda q, lease: q.claim("w", 30), (OutcomeUnknown, Unavailable)),
        (lambda q, lease: q.extend(lease, 30), (OutcomeUnknown, Unavailable)),
        (lambda q, lease: q.publish("g", 1, dedup_id="x"), (OutcomeUnknown, Unavailable)),
        (lambda q, lease: q.publish("g", 1), (OutcomeUnknown, Unavailable)),
        (READ, (Unavailable,)),
    ],
    ids=["ack", "claim", "extend", "publish-dedup", "publish", "stats"],
)
def test_no_call_outlives_its_deadline_when_the_cluster_cannot_answer(
    frozen: Any, call: Callable[[Any, Any], Any], errors: tuple[type, ...]
) -> None:
    q, lease, cluster = frozen
    started = time.monotonic()
    with pytest.raises(errors) as raised:
        result = call(q, lease)
        states = [(n.node_id, n.paused, n.is_running) for n in cluster.nodes]
        leader = cluster._leader_once()
        raise AssertionError(
            f"returned {result!r} after {time.monotonic() - started:.2f}s; requests "
            f"{q.client.requests}, resent {q.resent}; nodes {states}; leader {leader}"
        )
    elapsed = time.monotonic() - started
    assert elapsed <= DEADLINE + SLACK, f"{elapsed:.2f}s: {raised.value!r}"
    if call is not READ and not isinstance(raised.value, OutcomeUnknown):
        # "Not applied" may only be said of a write none of whose requests was delivered.
        assert "reach" in str(raised.value) or isinstance(raised.value, NoLeader), raised.value


def test_a_write_sent_and_unanswered_is_outcome_unknown_not_unavailable(frozen: Any) -> None:
    q, _, _ = frozen
    with pytest.raises(OutcomeUnknown):
        q.publish("g", 1)  # sent to a frozen node, no reply: it may be in the log


def test_a_write_that_cannot_be_resent_waits_for_a_slow_node(
    rqlite_cluster_factory: Callable[..., Cluster],
) -> None:
    """A node that answers late (here a follower frozen for 1.5 s, with the request on its
    socket) still answers: a publish without a dedup id, which cannot be sent again, waits
    for it up to `timeout` rather than give it up after a second and raise `OutcomeUnknown`
    for a publish that applies (the write that failed the harel test on a loaded machine)."""
    cluster = rqlite_cluster_factory(3)
    leader = cluster.leader()
    follower = next(node for node in cluster.nodes if node is not leader)
    q = RqliteTransport(follower.http_url, queue=f"dl_{uuid.uuid4().hex[:8]}", timeout=5.0)
    try:
        q.publish("g", 0)  # the tables exist before the node is frozen
        follower.pause()
        thaw = threading.Timer(1.5, follower.resume)
        thaw.start()
        try:
            started = time.monotonic()
            seq = q.publish("g", 1)
            waited = time.monotonic() - started
        finally:
            thaw.join()
        assert waited >= 1.2, f"answered after {waited:.2f}s, before the node was thawed?"
        assert [payload for _, payload in q.peek("g")] == [0, 1]
        assert q.peek("g")[-1][0] == seq
    finally:
        follower.resume()
        q.close()
