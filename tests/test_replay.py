"""Retry safety after an unknown outcome: the reply to a write is lost after the write applied
(as when a leader commits and dies before answering). Each operation then either resends its
batch safely or says it cannot know (`Unavailable`).

The backends are real (SQLite file, 3-node rqlite); only the reply is dropped, by a wrapper
around the transport's own executor."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from rqlite_queue import OutcomeUnknown, RqliteTransport, SqliteTransport, Transport
from rqlite_queue._protocol.plan import Batch, Result
from rqlite_queue.testing import Cluster


class LoseReplies:
    """Applies the batch, then loses the reply, for the next `count` writes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.count = 0
        self.sent = 0

    def execute(self, batch: Batch, deadline: float, **hints: Any) -> list[Result]:
        self.sent += 1
        results: list[Result] = self.inner.execute(batch, deadline, **hints)
        if batch.write and self.count > 0:
            self.count -= 1
            raise OutcomeUnknown("reply lost (test)")
        return results

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(params=["sqlite", "rqlite3"])
def q(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    queue = f"r_{uuid.uuid4().hex[:10]}"
    transport: Transport
    if request.param == "sqlite":
        transport = SqliteTransport(str(tmp_path / "q.db"), queue=queue)
    else:
        cluster: Cluster = request.getfixturevalue("rqlite_cluster3")
        transport = RqliteTransport(cluster.url, queue=queue)
    transport.setup()
    lossy = LoseReplies(transport.router.backend.executor)
    transport.router.backend.executor = lossy
    transport.lossy = lossy  # type: ignore[attr-defined]
    yield transport
    transport.close()


def test_a_resent_claim_returns_the_lease_it_took(q: Any) -> None:
    q.publish_many([("a", 1), ("b", 2)])
    q.lossy.count, q.lossy.sent = 1, 0
    lease = q.claim("w", 30)
    assert q.lossy.sent == 2  # sent twice...
    assert lease.group_id == "a"
    assert q.stats().in_flight == 1  # ...but only one group taken
    assert q.claim("w", 30).group_id == "b"
    q.ack(lease)


def test_resent_ack_nack_extend_dead_letter_find_their_record_and_report_success(q: Any) -> None:
    q.publish_many([("a", 1), ("a", 2), ("b", 3), ("c", 4)])
    first = q.claim("w", 30)
    q.lossy.count = 1
    q.ack(first)  # the resend found the lease gone, and the ack's own record
    assert q.stats().depth == 3
    lease = q.claim_many("w", 30, 3)
    q.lossy.count = 1
    extended = q.extend(lease[0], 60)
    assert extended.expires_at > lease[0].expires_at
    q.lossy.count = 1
    q.nack(lease[0], 10)
    assert q.stats().parked == 1
    q.lossy.count = 1
    q.dead_letter(lease[1], "boom")
    assert [d.event for d in q.dead_letters()] == [lease[1].event]
    q.lossy.count = 1
    q.ack_many([lease[2]])
    assert q.stats().depth == 1  # only the parked one is left


def test_a_resent_publish_with_dedup_id_publishes_once(q: Any) -> None:
    q.lossy.count = 1
    seq = q.publish("g", "m", dedup_id="once")
    assert q.lossy.sent == 2
    assert q.stats().depth == 1
    assert q.peek("g") == [(seq, "m")]
    q.lossy.count = 1
    seqs = q.publish_many([{"group_id": "g", "event": i, "dedup_id": f"d{i}"} for i in range(3)])
    assert [e for _, e in q.peek("g")] == ["m", 0, 1, 2]
    assert [s for s, _ in q.peek("g")][1:] == seqs


def test_a_publish_without_dedup_id_is_not_resent(q: Any) -> None:
    q.lossy.count, q.lossy.sent = 1, 0
    with pytest.raises(OutcomeUnknown):
        q.publish("g", "m")
    assert q.lossy.sent == 1  # not sent again: that could publish twice
    assert q.stats().depth == 1  # it did apply; the caller could not know
