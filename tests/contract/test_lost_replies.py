"""Every settlement's outcome is exact, whatever reply was lost (docs/contract.md, "After an
unknown outcome"), on every backend, sharded queues included, sync and async.

The backends are real; only replies are dropped, by a wrapper around each cluster's executor
(`LoseReplies`): `apply` a write and lose its reply (the leader committed and died before
answering), or `drop` it unsent (held by a frozen node; it never applies). The transport then
resends the same batch, and what the call reports must be what happened: an ack whose first
send applied returns (its own record says so), an ack whose lease went to another holder in
between raises `LeaseLost`; each message settled once."""

from __future__ import annotations

from typing import Any

import pytest

from rqlite_queue import LeaseLost

from .conftest import FakeClock, lose, taken_over


async def test_an_ack_whose_reply_was_lost_after_it_applied_returns(q: Any) -> None:
    await q.publish_many([("g", 1), ("g", 2)])
    lease = await q.claim("w", 30)
    plan = lose(q, ("apply", None))
    await q.ack(lease)  # resent: finds its own record
    assert plan == []
    assert [e for _, e in await q.peek("g")] == [2]  # acked once
    assert (await q.stats()).depth == 1


async def test_an_ack_whose_lease_went_to_another_holder_raises_lease_lost(
    q_and_other: tuple[Any, Any], clock: FakeClock
) -> None:
    q, other = q_and_other
    await q.publish_many([("g", 1), ("g", 2)])
    lease = await q.claim("w", 30)
    lose(q, ("drop", taken_over(lambda: other, clock, "g")))
    with pytest.raises(LeaseLost) as lost:
        await q.ack(lease)
    assert lost.value.leases == [lease]
    assert [e for _, e in await q.peek("g")] == [1, 2]  # nothing acked: the new holder has it


@pytest.mark.parametrize("call", ["nack", "dead_letter", "extend", "ack_many"])
async def test_every_settlement_resent_after_it_applied_reports_success_once(
    q: Any, clock: FakeClock, call: str
) -> None:
    await q.publish_many([("g", 1), ("g", 2)])
    lease = await q.claim("w", 30)
    lose(q, ("apply", None))
    if call == "nack":
        await q.nack(lease, 60)
        assert (await q.stats()).parked == 1
    elif call == "dead_letter":
        await q.dead_letter(lease, "boom")
        assert [d.seq for d in await q.dead_letters()] == [lease.seq]
    elif call == "extend":
        extended = await q.extend(lease, 90)
        assert extended.expires_at == clock.now + 90
        clock.advance(60)  # past the first lease, within the extended one
        assert await q.claim("w2", 30) is None
    else:
        await q.ack_many([lease])
        assert [e for _, e in await q.peek("g")] == [2]


@pytest.mark.parametrize("call", ["nack", "dead_letter", "extend"])
async def test_every_settlement_of_a_lease_taken_over_raises_lease_lost(
    q_and_other: tuple[Any, Any], clock: FakeClock, call: str
) -> None:
    q, other = q_and_other
    await q.publish_many([("g", 1), ("g", 2)])
    lease = await q.claim("w", 30)
    lose(q, ("drop", taken_over(lambda: other, clock, "g")))
    with pytest.raises(LeaseLost):
        if call == "nack":
            await q.nack(lease, 60)
        elif call == "dead_letter":
            await q.dead_letter(lease, "boom")
        else:
            await q.extend(lease, 90)
    assert await q.dead_letters() == []
    assert [e for _, e in await q.peek("g")] == [1, 2]


async def test_a_round_resent_reports_exactly_the_settlements_that_did_not_apply(
    q_and_other: tuple[Any, Any], clock: FakeClock
) -> None:
    """Two acks in one round, whose request was held up: meanwhile one lease was taken over.
    The resend applies the other, and reports only the taken-over one lost."""
    q, other = q_and_other
    await q.publish_many([("a", 1), ("a", 2), ("b", 3)])
    a = await q.claim("w", 10)
    b = await q.claim("w", 100)
    assert (a.group_id, b.group_id) == ("a", "b")

    def a_taken_over() -> None:
        clock.advance(11)  # a's lease lapses (10 s), b's holds (100 s)
        lease = other.claim("other", 30)
        assert lease is not None and lease.group_id == "a"

    lose(q, ("drop", a_taken_over))
    round_ = await q.settle_and_claim("w", 30, 0, ack=[a, b])
    assert round_.lost == [a]
    assert (await q.stats()).depth == 2  # a's message (now other's) and a2; b's acked


async def test_a_round_whose_reply_was_lost_after_it_applied_reports_nothing_lost(q: Any) -> None:
    await q.publish_many([("a", 1), ("b", 2), ("c", 3), ("d", 4)])
    leases = await q.claim_many("w", 30, 3)
    lose(q, ("apply", None))
    round_ = await q.settle_and_claim(
        "w", 30, 1, ack=leases[:1], nack=[(leases[1], 0)], dead=[(leases[2], "x")]
    )
    assert round_.lost == []
    assert len(round_.leases) == 1  # the claim too was taken once, and returned
    stats = await q.stats()
    assert (stats.depth, stats.dead, stats.in_flight) == (2, 1, 1)
