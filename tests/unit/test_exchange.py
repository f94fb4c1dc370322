"""The retry policy of one request (`rqlite_http.exchange`), driven with scripted outcomes and a
fake clock: no server, no sockets, milliseconds."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rqlite_queue import OutcomeUnknown, Unavailable
from rqlite_queue._protocol.http import (
    MIN_ATTEMPT,
    HttpReply,
    HttpRequest,
    NodeCursor,
    NoReply,
    NotSent,
    Outcome,
    Send,
    Sleep,
    exchange,
)
from rqlite_queue._protocol.sql import Result
from rqlite_queue.errors import AuthError, NoLeader

OK = HttpReply(200, json.dumps({"results": [{"rows_affected": 1}]}).encode())
NO_LEADER = HttpReply(503, b"leader not found")
LEADERSHIP_LOST = HttpReply(200, b'{"error": "leadership lost while committing log"}')
UNAUTHORIZED = HttpReply(401, b"")
REQUEST = HttpRequest("/db/request?transaction", b"[]", 1)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def drive(
    outcomes: Iterator[Outcome],
    *,
    write: bool = True,
    deadline: float = 5.0,
    timeout: float = 1.0,
    nodes: int = 3,
    request_time: Callable[[Send], float] = lambda send: 0.01,
) -> tuple[list[Result] | BaseException, list[Send | Sleep], Clock, NodeCursor]:
    """Run one exchange; each Send takes `request_time(send)` (never more than its timeout),
    each Sleep its seconds. Returns the results or the exception, the actions, the clock."""
    clock = Clock()
    cursor = NodeCursor(nodes)
    steps = exchange(
        REQUEST,
        write=write,
        nodes=cursor,
        deadline=clock.now + deadline,
        timeout=timeout,
        monotonic=clock,
        jitter=lambda: 0.5,
    )
    actions: list[Send | Sleep] = []
    try:
        action = next(steps)
        while True:
            actions.append(action)
            if isinstance(action, Send):
                clock.now += min(request_time(action), action.timeout)
                action = steps.send(next(outcomes))
            else:
                clock.now += action.seconds
                action = steps.send(None)
    except StopIteration as done:
        return done.value, actions, clock, cursor
    except Exception as exc:
        return exc, actions, clock, cursor


def sends(actions: list[Send | Sleep]) -> list[Send]:
    return [a for a in actions if isinstance(a, Send)]


def test_an_answer_is_returned_after_one_request() -> None:
    result, actions, _, _ = drive(iter([OK]))
    assert isinstance(result, list) and result[0].rows_affected == 1
    assert actions == [Send(0, 1.0)]


def test_not_applied_moves_to_the_next_node_after_a_backoff() -> None:
    result, actions, _, cursor = drive(iter([NotSent("refused"), NO_LEADER, OK]))
    assert isinstance(result, list)
    assert [s.node for s in sends(actions)] == [0, 1, 2]
    assert [type(a) for a in actions] == [Send, Sleep, Send, Sleep, Send]
    assert cursor.current == 2  # stays on the node that answered


@pytest.mark.parametrize(
    "outcome", [NoReply("read timeout"), LEADERSHIP_LOST, HttpReply(500, b"x")]
)
def test_a_write_whose_outcome_is_unknown_is_not_resent_here(outcome: Outcome) -> None:
    result, actions, _, cursor = drive(iter([outcome, OK]))
    assert isinstance(result, OutcomeUnknown)
    assert len(sends(actions)) == 1
    assert cursor.current == 1  # the next request will not wait on the same node


def test_a_read_is_retried_whatever_happened() -> None:
    result, actions, _, _ = drive(iter([NoReply("reset"), HttpReply(500, b"x"), OK]), write=False)
    assert isinstance(result, list) and len(sends(actions)) == 3


def test_wrong_credentials_are_not_retried() -> None:
    result, actions, _, _ = drive(iter([UNAUTHORIZED, OK]))
    assert isinstance(result, AuthError) and len(sends(actions)) == 1


def test_no_leader_until_the_deadline_raises_no_leader_in_time() -> None:
    result, actions, clock, _ = drive(iter([NO_LEADER] * 1000), deadline=3.0)
    assert isinstance(result, NoLeader)
    assert clock.now <= 100.0 + 3.0
    assert len(sends(actions)) > 3


def test_nothing_is_sent_once_the_deadline_has_passed() -> None:
    result, actions, _, _ = drive(iter([OK]), deadline=MIN_ATTEMPT / 2)
    assert isinstance(result, Unavailable) and not isinstance(result, OutcomeUnknown)
    assert actions == []


failures = st.sampled_from(
    [NotSent("refused"), NO_LEADER, NoReply("timeout"), HttpReply(500, b"x"), LEADERSHIP_LOST, OK]
)


@given(
    script=st.lists(failures, min_size=1, max_size=60),
    deadline=st.floats(0.05, 20.0),
    timeout=st.floats(0.05, 10.0),
    write=st.booleans(),
    slow=st.booleans(),
)
def test_no_exchange_outlives_its_deadline(
    script: list[Outcome], deadline: float, timeout: float, write: bool, slow: bool
) -> None:
    """Whatever fails and however slowly (a request may use its whole timeout), the exchange
    ends by its deadline, and no request is given more time than is left."""
    outcomes = iter([*script, *[NO_LEADER] * 10_000])
    start = Clock().now
    result, actions, clock, _ = drive(
        outcomes,
        write=write,
        deadline=deadline,
        timeout=timeout,
        request_time=(lambda send: send.timeout) if slow else (lambda send: 0.001),
    )
    assert clock.now <= start + deadline + 1e-9
    elapsed = 0.0
    for action in actions:
        if isinstance(action, Send):
            assert action.timeout <= timeout
            assert action.timeout <= deadline - elapsed + 1e-9
            elapsed += action.timeout if slow else min(0.001, action.timeout)
        else:
            elapsed += action.seconds
    if isinstance(result, BaseException):
        assert isinstance(result, (Unavailable, OutcomeUnknown))
        if not write:
            assert not isinstance(result, OutcomeUnknown)
