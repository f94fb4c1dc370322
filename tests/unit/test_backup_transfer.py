"""The retries of one backup or load (`_protocol.backup.transfer`), on canned outcomes: what
moves on to the next node, what is refused at once, and the deadline."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from rqlite_queue._protocol.backup import Transfer, shard_file, transfer
from rqlite_queue._protocol.http import HttpReply, Nodes, NoReply, NotSent, Outcome, Send, Sleep
from rqlite_queue.errors import AuthError, BackendError, Unavailable


def drive(
    outcomes: Sequence[Outcome], nodes: int = 3, deadline: float = 10.0
) -> tuple[bytes, list[int]]:
    """Run a transfer on these outcomes, in order; return its body and the nodes it sent to."""
    clock = [0.0]
    steps = transfer(
        Transfer("POST", "/db/load", b"SQLite format 3\x00"),
        nodes=Nodes(nodes, lambda: 0.0),
        deadline=deadline,
        monotonic=lambda: clock[0],
        jitter=lambda: 0.0,
    )
    sent: list[int] = []
    given = iter(outcomes)
    action = next(steps)
    try:
        while True:
            if isinstance(action, Send):
                sent.append(action.node)
                clock[0] += 0.1
                action = steps.send(next(given))
            else:
                assert isinstance(action, Sleep)
                clock[0] += action.seconds
                action = steps.send(None)
    except StopIteration as done:
        return done.value, sent


def test_a_node_without_a_leader_or_down_is_left_for_the_next() -> None:
    body, sent = drive(
        [
            HttpReply(503, b"leader not found"),
            NotSent("connection refused"),
            NoReply("timed out"),
            HttpReply(200, b'{"results":[]}'),
        ]
    )
    assert body == b'{"results":[]}'
    assert sent == [0, 1, 2, 0]


def test_refusals_are_not_retried() -> None:
    with pytest.raises(AuthError, match="'load' permission"):
        drive([HttpReply(401, b"")])
    with pytest.raises(BackendError, match="HTTP 400"):
        drive([HttpReply(400, b"invalid")])


def test_the_deadline_ends_it_with_the_last_failure() -> None:
    with pytest.raises(Unavailable, match="HTTP 500: disk full"):
        drive([HttpReply(500, b"disk full")] * 1000, deadline=2.0)


def test_a_shard_file_has_the_shard_name_before_its_suffix() -> None:
    assert shard_file("/b/queue.db", "a") == "/b/queue.a.db"
    assert shard_file("queue", "h1:4001") == "queue.h1:4001"
