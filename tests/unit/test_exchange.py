"""The retry policy of one request (`rqlite_http.exchange`), driven with scripted outcomes and a
fake clock: no server, no sockets, milliseconds."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rqlite_queue import OutcomeUnknown, Unavailable
from rqlite_queue._protocol.http import (
    DISCOVERY_POLL,
    MIN_ATTEMPT,
    Action,
    Discover,
    HttpReply,
    HttpRequest,
    Nodes,
    NoReply,
    NotSent,
    Outcome,
    Send,
    Sleep,
    Statuses,
    exchange,
    framed,
)
from rqlite_queue._protocol.plan import Result
from rqlite_queue.errors import REFUSED, AuthError, NoLeader, NothingListens

OK = HttpReply(200, json.dumps({"results": [{"rows_affected": 1}]}).encode())
NO_LEADER = HttpReply(503, b"leader not found")
LEADERSHIP_LOST = HttpReply(200, b'{"error": "leadership lost while committing log"}')
UNAUTHORIZED = HttpReply(401, b"")
REQUEST = HttpRequest("/db/request?transaction", b"[]", 1)


def jitter() -> float:
    return 0.5


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def drive(
    outcomes: Iterator[Outcome] | Callable[[Send], Outcome],
    *,
    write: bool = True,
    deadline: float = 5.0,
    timeout: float = 1.0,
    nodes: int | Nodes = 3,
    request_time: Callable[[Send], float] = lambda send: 0.01,
    patience: float | None = None,
    clock: Clock | None = None,
    names: tuple[str, ...] = (),
    refused_patience: float | None = None,
    discover: float | None = None,
    statuses: Callable[[Discover], Statuses] | None = None,
    asking_time: float = 0.01,
) -> tuple[list[Result] | BaseException, list[Send | Sleep | Discover], Clock, Nodes]:
    """Run one exchange; each Send takes `request_time(send)` (never more than its timeout),
    each Sleep its seconds, each Discover `asking_time` (at most its timeout) and is
    answered by `statuses`. Returns the results or the exception, the actions, the clock."""
    clock = clock or Clock()
    cursor = nodes if isinstance(nodes, Nodes) else Nodes(nodes, jitter)
    steps = exchange(
        REQUEST,
        write=write,
        nodes=cursor,
        deadline=clock.now + deadline,
        timeout=timeout,
        monotonic=clock,
        jitter=jitter,
        patience=patience,
        names=names,
        refused_patience=refused_patience,
        discover=discover,
    )
    actions: list[Send | Sleep | Discover] = []
    try:
        action = next(steps)
        while True:
            actions.append(action)
            if isinstance(action, Send):
                clock.now += min(request_time(action), action.timeout)
                outcome = outcomes(action) if callable(outcomes) else next(outcomes)
                action = steps.send(outcome)
            elif isinstance(action, Discover):
                assert statuses is not None, "asked who leads"
                clock.now += min(asking_time, action.timeout)
                action = steps.send(statuses(action))
            else:
                clock.now += action.seconds
                action = steps.send(None)
    except StopIteration as done:
        return done.value, actions, clock, cursor
    except Exception as exc:
        return exc, actions, clock, cursor


def sends(actions: list[Send | Sleep | Discover]) -> list[Send]:
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


def test_an_idempotent_write_is_retried_as_a_read_is() -> None:
    """The setup's bootstrap (`Plan.idempotent`): its lost replies (a leader that lost its
    place while committing it, a reply cut off) are sent again on the way, and given up at
    the deadline it says what each node did, as a read's does: never `OutcomeUnknown`."""
    from rqlite_queue._protocol.http import ClientState, Endpoints
    from rqlite_queue._protocol.plan import Batch, Statement

    def run(answers: list[Outcome], deadline: float) -> tuple[object, int]:
        clock = Clock()
        state = ClientState(
            Endpoints(URLS), timeout=1.0, clock=clock, monotonic=clock, random=jitter
        )
        batch = Batch((Statement("CREATE TABLE IF NOT EXISTS t (x)"),))
        _, steps = state.steps(batch, clock.now + deadline, idempotent=True)
        sent = 0
        try:
            action = next(steps)
            while True:
                if isinstance(action, Send):
                    clock.now += 0.01
                    sent += 1
                    action = steps.send(answers[min(sent, len(answers)) - 1])
                elif isinstance(action, Discover):  # who leads: no node says
                    clock.now += 0.01
                    action = steps.send(Statuses((None,) * len(URLS)))
                else:
                    clock.now += action.seconds
                    action = steps.send(None)
        except StopIteration as done:
            return done.value, sent
        except Unavailable as exc:
            return exc, sent

    lost = NoReply("read timed out", "no reply within 1.0s")
    result, sent = run([LEADERSHIP_LOST, lost, OK], deadline=5.0)
    assert isinstance(result, list) and result[0].rows_affected == 1 and sent == 3
    given_up, _ = run([LEADERSHIP_LOST], deadline=2.0)
    assert isinstance(given_up, Unavailable) and not isinstance(given_up, OutcomeUnknown)
    assert "leadership lost while committing log" in str(given_up)


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
    discover=st.sampled_from([None, 0.5, 5.0]),
)
def test_no_exchange_outlives_its_deadline(
    script: list[Outcome],
    deadline: float,
    timeout: float,
    write: bool,
    slow: bool,
    discover: float | None,
) -> None:
    """Whatever fails and however slowly (a request may use its whole timeout, asking the
    nodes who leads the whole time allowed), the exchange ends by its deadline, and no
    request is given more time than is left."""
    outcomes = iter([*script, *[NO_LEADER] * 10_000])
    start = Clock().now
    result, actions, clock, _ = drive(
        outcomes,
        write=write,
        deadline=deadline,
        timeout=timeout,
        request_time=(lambda send: send.timeout) if slow else (lambda send: 0.001),
        discover=discover,
        statuses=lambda ask: Statuses((None, None, None)),
        asking_time=99.0,
    )
    assert clock.now <= start + deadline + 1e-9
    elapsed = 0.0
    for action in actions:
        if isinstance(action, Send):
            assert action.timeout <= timeout
            assert action.timeout <= deadline - elapsed + 1e-9
            elapsed += action.timeout if slow else min(0.001, action.timeout)
        elif isinstance(action, Discover):
            elapsed += action.timeout
        else:
            elapsed += action.seconds
    if isinstance(result, BaseException):
        assert isinstance(result, (Unavailable, OutcomeUnknown))
        if not write:
            assert not isinstance(result, OutcomeUnknown)


# -------------------------------------------------------------- failover within a second


def test_a_frozen_node_is_given_up_after_the_calls_patience_not_the_timeout() -> None:
    """A frozen leader holds the request: the write waits `patience`, not `timeout`, then
    raises OutcomeUnknown (for the transport to resend where safe) and leaves the node."""
    result, actions, clock, cursor = drive(
        iter([NoReply("timed out")]), timeout=10.0, patience=0.6, request_time=lambda s: 99
    )
    assert isinstance(result, OutcomeUnknown)
    assert sends(actions) == [Send(0, 0.6)]
    assert clock.now == pytest.approx(100.6)
    assert cursor.current == 1 and 0 in cursor.suspects


def test_a_read_waits_twice_as_long_on_each_node_that_did_not_answer() -> None:
    """A read may just be slow: each attempt after one with no reply waits twice as long
    (up to `timeout`), so a slow answer is still had."""
    slow = iter([NoReply("timed out"), NoReply("timed out"), OK])
    result, actions, _, _ = drive(
        slow, write=False, timeout=3.0, patience=1.0, deadline=10, request_time=lambda s: s.timeout
    )
    assert isinstance(result, list)
    assert [s.timeout for s in sends(actions)] == [1.0, 2.0, 3.0]


def test_a_suspected_node_is_skipped_until_it_answers_or_its_suspicion_lapses() -> None:
    clock = Clock()
    nodes = Nodes(3, jitter)
    nodes.failed(0, clock.now)  # frozen: the first call gave it up
    assert nodes.current == 1
    nodes.failed(0, clock.now)  # another call in flight on it gives it up too...
    assert nodes.current == 1  # ...and the choice does not move on twice
    nodes.failed(1, clock.now)
    assert nodes.current == 2  # not back to the suspected node 0
    nodes.failed(2, clock.now)  # every node suspected: the one suspected longest ago
    assert nodes.current in (0, 1)
    nodes.answered(0)
    assert 0 not in nodes.suspects
    clock.now += 60  # suspicions lapse
    nodes.moved_on(nodes.current, clock.now)
    assert nodes.current == (nodes.current) % 3


def test_a_call_after_a_failover_starts_on_the_node_that_answered() -> None:
    nodes = Nodes(3, jitter)
    result, _, clock, _ = drive(iter([NoReply("frozen")]), nodes=nodes, patience=0.5)
    assert isinstance(result, OutcomeUnknown)
    result, actions, _, _ = drive(iter([OK]), nodes=nodes, clock=clock)
    assert isinstance(result, list) and [s.node for s in sends(actions)] == [1]
    assert 1 not in nodes.suspects


@pytest.mark.parametrize(
    ("lease_for", "resend", "slow", "bytes_", "expected"),
    [
        (None, 0, 0.0, 0, 1.0),  # the floor
        (None, 0, 0.5, 0, 2.0),  # slow lately: four times that
        (None, 0, 0.0, 3_000_000, 4.0),  # a large body: a second more per MB
        (None, 2, 0.0, 0, 4.0),  # the third send of the call: twice, twice
        (2.0, 0, 0.0, 0, 2 / 3),  # leases of 2 s: a third of that
        (30.0, 0, 0.0, 0, 1.0),  # leases of 30 s: the floor
        (None, 5, 0.0, 0, 10.0),  # never more than the timeout
    ],
)
def test_patience(
    lease_for: float | None, resend: int, slow: float, bytes_: int, expected: float
) -> None:
    from rqlite_queue._protocol.http import ClientState, Endpoints

    state = ClientState(
        Endpoints(("http://h:1",)), timeout=10.0, clock=Clock(), monotonic=Clock(), random=jitter
    )
    state.slow = slow
    request = HttpRequest("/db/request?transaction", b"x" * bytes_, 1)
    assert state.patience(request, lease_for, resend) == pytest.approx(expected)


def test_a_write_that_cannot_be_resent_is_given_the_whole_timeout() -> None:
    """Giving up a slow node early helps a call that can send again elsewhere; a final write
    (a publish without dedup ids) would only turn a slow success into `OutcomeUnknown`."""
    from rqlite_queue._protocol.http import ClientState, Endpoints

    state = ClientState(
        Endpoints(("http://h:1",)), timeout=10.0, clock=Clock(), monotonic=Clock(), random=jitter
    )
    request = HttpRequest("/db/request?transaction", b"x", 1)
    assert state.patience(request, None, 0, final=True) == 10.0
    assert state.patience(request, 2.0, 0, final=True) == 10.0


# ------------------------------------------------------------ what the give-up error says

URLS = ("http://h1:4001", "http://h2:4001", "http://h3:4001")
REFUSAL = NotSent("[Errno 111] Connection refused", REFUSED)


def test_the_error_after_the_deadline_says_what_each_node_did() -> None:
    """Issue 36: not "the deadline passed before any request was sent", but each node's
    last answer, by its URL."""
    answers = [REFUSAL, NoReply("read timed out", "no reply within 1.0s"), NO_LEADER]
    result, _, _, _ = drive(lambda send: answers[send.node], write=False, deadline=3.0, names=URLS)
    assert isinstance(result, NoLeader)
    assert result.nodes == {
        "http://h1:4001": REFUSED,
        "http://h2:4001": "no reply within 1.0s",
        "http://h3:4001": "leader not found",
    }
    assert str(result) == (
        "no rqlite node took the request: http://h1:4001: connection refused; "
        "http://h2:4001: no reply within 1.0s; http://h3:4001: leader not found"
    )
    assert not result.refused


def test_a_call_with_no_time_left_says_what_the_nodes_did_last() -> None:
    nodes = Nodes(1, jitter)
    first, _, clock, _ = drive(iter([REFUSAL] * 100), nodes=nodes, deadline=1.0, names=URLS[:1])
    assert isinstance(first, Unavailable) and first.refused
    late, actions, _, _ = drive(
        iter([]), nodes=nodes, clock=clock, deadline=MIN_ATTEMPT / 2, names=URLS[:1]
    )
    assert actions == [] and isinstance(late, Unavailable)
    assert "before any request was sent" not in str(late)
    assert str(late) == (
        "nothing answers at http://h1:4001 (connection refused): is the cluster running?"
    )


def test_wrong_credentials_name_the_node() -> None:
    result, _, _, _ = drive(iter([UNAUTHORIZED]), names=URLS)
    assert isinstance(result, AuthError)
    assert str(result).startswith("http://h1:4001: rqlite refused the credentials (HTTP 401)")


# ------------------------------------------------- a cluster that refuses every connection


def test_every_node_refusing_for_the_patience_raises_nothing_listens() -> None:
    result, actions, clock, _ = drive(
        iter([REFUSAL] * 1000), deadline=15.0, names=URLS, refused_patience=0.5
    )
    assert isinstance(result, NothingListens) and result.refused
    assert 100.5 <= clock.now < 101.5  # not the deadline, 15 s
    assert {s.node for s in sends(actions)} == {0, 1, 2}
    assert str(result).startswith("nothing answers at http://h1:4001, http://h2:4001, ")


@pytest.mark.parametrize(
    "other",
    [NoReply("read timed out", "no reply within 1.0s"), NO_LEADER, NotSent("x", "timed out")],
    ids=["timed out", "no leader", "connect timeout"],
)
def test_one_node_that_does_not_refuse_keeps_the_deadline(other: Outcome) -> None:
    """Only refusals everywhere are an answer: a node that times out, or has no leader yet,
    may come through (the call is a read: a write's lost reply raises OutcomeUnknown)."""
    answers = [REFUSAL, other, REFUSAL]
    result, _, clock, _ = drive(
        lambda send: answers[send.node], write=False, deadline=5.0, names=URLS, refused_patience=0.5
    )
    assert not isinstance(result, NothingListens)
    assert clock.now > 104.0


def test_a_cluster_once_reached_keeps_its_failover_patience() -> None:
    """A Worker's transport answered at its first contact: a node (or all of them) refusing
    later, during a restart or an election, is tried again until the deadline."""
    nodes = Nodes(1, jitter)
    first, _, clock, _ = drive(iter([OK]), nodes=nodes, refused_patience=0.5)
    assert isinstance(first, list) and nodes.reached
    result, _, clock, _ = drive(
        iter([REFUSAL] * 8 + [OK]), nodes=nodes, clock=clock, deadline=15, refused_patience=0.5
    )
    assert isinstance(result, list)


def test_without_a_refused_patience_refusals_are_tried_until_the_deadline() -> None:
    result, _, clock, _ = drive(iter([REFUSAL] * 1000), deadline=5.0, names=URLS)
    assert isinstance(result, Unavailable) and not isinstance(result, NothingListens)
    assert result.refused and clock.now > 104.0


def test_a_reply_that_does_not_say_where_it_ends_was_cut_off() -> None:
    # urllib3 hands on a reply cut in its headers as a 200 with an empty body (tests/test_links.py
    # cuts real ones): it must count as no reply, not as an answer.
    assert framed(200, "12", None)
    assert framed(200, None, "chunked")
    assert framed(204, None, None)
    assert not framed(200, None, None)
    assert not framed(503, None, "identity")


# ------------------------------------------- after a node that did not answer: who leads?

FOLLOWER = {"state": "Follower", "term": 3}


def leader(term: int = 3) -> dict[str, object]:
    return {"state": "Leader", "term": term}


def used(count: int = 3) -> Nodes:
    """The nodes of a client past its first use (it has asked them who leads once)."""
    return Nodes(count, jitter, looked=True)


def test_a_node_that_did_not_answer_is_left_for_the_node_that_says_it_leads() -> None:
    """Issue 34: a follower forwarding to an isolated leader holds the request; moving on
    blindly to the next node landed on that leader about half the time, and a whole attempt
    (twice as long: a resend) was lost there. The nodes are asked who leads instead."""
    result, actions, _, cursor = drive(
        iter([NoReply("timed out")]),
        nodes=used(),
        patience=1.0,
        request_time=lambda s: 99,
        discover=0.5,
        statuses=lambda ask: Statuses((FOLLOWER, None, leader())),
    )
    assert isinstance(result, OutcomeUnknown)  # the write is the transport's to resend
    assert actions == [Send(0, 1.0), Discover(0.5)]
    assert cursor.current == 2  # not node 1, which said nothing
    assert cursor.leader == (2, 3) and 0 in cursor.suspects


def test_a_read_goes_on_to_the_leader_the_nodes_name() -> None:
    answers: Iterator[Outcome] = iter([NoReply("timed out"), OK])
    result, actions, _, _ = drive(
        answers,
        write=False,
        nodes=used(),
        discover=0.5,
        statuses=lambda ask: Statuses((FOLLOWER, None, leader())),
    )
    assert isinstance(result, list)
    assert [s.node for s in sends(actions)] == [0, 2]


def test_of_two_nodes_that_say_they_lead_the_later_term_is_chosen() -> None:
    """A deposed leader may not know yet."""
    _, _, _, cursor = drive(
        iter([NotSent("timed out connecting", "timed out connecting")]),
        write=False,
        nodes=used(),
        deadline=0.5,
        discover=0.2,
        statuses=lambda ask: Statuses((None, leader(4), leader(3))),
    )
    assert cursor.current == 1 and cursor.leader == (1, 4)


def test_without_a_leader_a_node_that_answered_is_chosen() -> None:
    """During an election: a node that answers can take the request once a leader exists
    (it forwards), one that is silent cannot."""
    _, _, _, cursor = drive(
        iter([NoReply("timed out")]),
        nodes=used(),
        discover=0.5,
        statuses=lambda ask: Statuses((None, None, {"state": "Candidate", "term": 5})),
    )
    assert cursor.current == 2


def test_when_no_node_answers_the_choice_moves_on_as_before() -> None:
    _, _, _, cursor = drive(
        iter([NoReply("timed out")]),
        nodes=used(),
        discover=0.5,
        statuses=lambda ask: Statuses((None,) * 3),
    )
    assert cursor.current == 1


def discovering(
    nodes: Nodes, clock: Clock, *, write: bool
) -> Generator[Action, Outcome | Statuses | None, list[Result]]:
    """An exchange on shared `nodes` that asks who leads after a failure (5 s to go)."""
    return exchange(
        REQUEST,
        write=write,
        nodes=nodes,
        deadline=clock.now + 5,
        timeout=1.0,
        monotonic=clock,
        jitter=jitter,
        discover=0.5,
    )


def test_one_call_asks_for_all_that_meet_the_failure() -> None:
    """Calls in flight on the node that failed wait for the answer of the one that asks;
    none asks again."""
    clock = Clock()
    nodes = used()
    asking = discovering(nodes, clock, write=True)
    assert next(asking) == Send(0, 1.0)
    assert asking.send(NoReply("timed out")) == Discover(0.5)
    # Meanwhile a second call's request on node 0 fails too.
    waiting = discovering(nodes, clock, write=False)
    assert next(waiting) == Send(0, 1.0)
    assert waiting.send(NoReply("timed out")) == Sleep(DISCOVERY_POLL)
    clock.now += DISCOVERY_POLL
    assert waiting.send(None) == Sleep(DISCOVERY_POLL)  # still asking
    with pytest.raises(OutcomeUnknown):
        asking.send(Statuses((None, None, leader())))
    clock.now += DISCOVERY_POLL
    assert isinstance(waiting.send(None), Sleep)  # the failover backoff...
    assert waiting.send(None) == Send(2, 1.0)  # ...then the leader the first call found


def test_a_call_cancelled_while_it_asks_lets_the_next_one_ask() -> None:
    clock = Clock()
    nodes = used()
    steps = drive_until_discover(nodes, clock)
    steps.close()  # (asyncio cancelled the call, say)
    assert nodes.asking_until == float("-inf")
    drive_until_discover(nodes, clock)  # asks, instead of waiting for an answer to come


def drive_until_discover(
    nodes: Nodes, clock: Clock
) -> Generator[Action, Outcome | Statuses | None, list[Result]]:
    steps = discovering(nodes, clock, write=False)
    assert next(steps) == Send(nodes.current, 1.0)
    assert steps.send(NoReply("timed out")) == Discover(0.5)
    return steps


def test_a_client_asks_who_leads_at_its_first_use_and_starts_there() -> None:
    """No forwarding hop from a follower."""
    nodes = Nodes(3, jitter)
    result, actions, clock, _ = drive(
        iter([OK]),
        nodes=nodes,
        discover=0.5,
        statuses=lambda ask: Statuses((FOLLOWER, leader(), FOLLOWER)),
    )
    assert isinstance(result, list)
    assert actions == [Discover(0.5), Send(1, 1.0)]
    _, actions, _, _ = drive(iter([OK]), nodes=nodes, clock=clock, discover=0.5)
    assert actions == [Send(1, 1.0)]  # asked once per client


def test_a_first_use_with_no_answer_starts_on_the_first_node() -> None:
    _, actions, _, cursor = drive(
        iter([OK]), discover=0.5, statuses=lambda ask: Statuses((None,) * 3)
    )
    assert actions == [Discover(0.5), Send(0, 1.0)] and cursor.leader is None
