"""The embedded backend publishes messages as bound rows (`publish._bound`: one multi-row
INSERT of bound parameters) where rqlite gets one JSON text (`json_each`). The two forms must
leave the same database behind, publish after publish, and fall back to the JSON form for what
the bound one does not carry (tenants, dedup ids, debounce keys, batches past its size)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rqlite_queue import SqliteTransport
from rqlite_queue._protocol import publish as publishing
from rqlite_queue._protocol.messages import Message, checked_message
from rqlite_queue._protocol.names import Names
from rqlite_queue._protocol.plan import Batch

NOW = 1_800_000_000.0

# Batches published in turn on each queue: plain pairs, priorities, delays, ttls, headers,
# groups that empty and come back, one group per message, a group given many times.
BATCHES: list[list[Any]] = [
    [("a", 1), ("b", 2), ("a", 3)],
    [("c", {"x": 1}, 3), ("a", 4, 1), {"group_id": "d", "event": 5, "priority": 2}],
    [{"group_id": "e", "event": 6, "delay": 30}, ("e", 7), {"group_id": "f", "event": 8}],
    [{"group_id": "g", "event": 9, "ttl": 60}, {"group_id": "a", "event": 10, "headers": {}}],
    [{"group_id": "h", "event": 11, "headers": {"k": "v"}}, ("h", 12)],
    [(f"n{i}", i) for i in range(300)],
    [("same", i) for i in range(200)],
    [{"group_id": "later", "event": 1, "not_before": NOW + 100}, ("later", 2)],
]


def _queue(path: Path, *, bound: bool) -> SqliteTransport:
    q = SqliteTransport(str(path), clock=lambda: NOW, queue="t")
    q.router.backend.binds_rows = bound  # type: ignore[attr-defined]
    return q


def _tables(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    with sqlite3.connect(path) as conn:
        return {
            table: conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("rq_t_messages", "rq_t_groups", "sqlite_sequence")
        }


@pytest.fixture
def queues(tmp_path: Path) -> Iterator[tuple[SqliteTransport, SqliteTransport]]:
    bound, json_ = (
        _queue(tmp_path / "bound.db", bound=True),
        _queue(tmp_path / "json.db", bound=False),
    )
    yield bound, json_
    bound.close()
    json_.close()


def test_bound_rows_leave_what_json_leaves(
    queues: tuple[SqliteTransport, SqliteTransport], tmp_path: Path
) -> None:
    bound, json_ = queues
    for batch in BATCHES:
        assert bound.publish_many(batch) == json_.publish_many(batch)
        assert _tables(tmp_path / "bound.db") == _tables(tmp_path / "json.db")
    # Claimed and acked alike, then refilled: the groups' rows come back the same way.
    for q in queues:
        leases = q.claim_many("w", 30, 50)
        for lease in leases:
            q.ack(lease)
    for batch in BATCHES[:3]:
        assert bound.publish_many(batch) == json_.publish_many(batch)
    assert _tables(tmp_path / "bound.db") == _tables(tmp_path / "json.db")


def _plan(items: list[Any], **publish: Any) -> Batch:
    rows = [checked_message(m, NOW, str, None) for m in Message.parse_many(items)]
    return publishing.publish(
        Names.of("t"), rows, now=NOW, dedup_until=NOW + 60, prune_before=None, **publish
    )


def _bound(batch: Batch) -> bool:
    return any(
        s.sql.startswith("INSERT INTO rq_t_messages") and "VALUES (?" in s.sql
        for s in batch.statements
    )


def test_what_the_bound_form_carries() -> None:
    assert _bound(_plan([("g", 1), {"group_id": "h", "event": 2, "ttl": 5}], bind_rows=True))
    assert not _bound(_plan([("g", 1)], bind_rows=False))  # (rqlite)
    for other in ({"dedup_id": "d"}, {"tenant": "t"}, {"debounce": "k"}):
        assert not _bound(_plan([("g", 1), {"group_id": "g", "event": 2, **other}], bind_rows=True))
    assert _bound(_plan([("g", i) for i in range(publishing.BOUND_ROWS)], bind_rows=True))
    assert not _bound(_plan([("g", i) for i in range(publishing.BOUND_ROWS + 1)], bind_rows=True))


def test_a_bound_publish_trips_on_tenants_turned_on(tmp_path: Path) -> None:
    """A client that has not learnt that tenants are on still checks their bounds: the
    bound form's tripwire fails the batch, and the publish is made again with the check."""
    path = tmp_path / "q.db"
    late, other = _queue(path, bound=True), _queue(path, bound=True)
    try:
        assert late.publish_many([("a", 1)]) == [1]  # (it has learnt: tenants off)
        other.set_tenant("t", max_queued=1)
        other.set_tenant_rule(":")
        other.publish("t:x", 0)
        with pytest.raises(Exception, match="at most 1"):
            late.publish_many([("t:y", 1)])
        assert late.publish_many([("u:y", 1)]) == [3]
    finally:
        late.close()
        other.close()
