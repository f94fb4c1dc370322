"""Every settlement's outcome is exact, whatever reply was lost (docs/contract.md, "After an
unknown outcome"), on every backend, sharded queues included, sync and async.

The backends are real; only replies are dropped, by a wrapper around each cluster's executor
(`LoseReplies`): `apply` a write and lose its reply (the leader committed and died before
answering), or `drop` it unsent (held by a frozen node; it never applies). The transport then
resends the same batch, and what the call reports must be what happened: an ack whose first
send applied returns (its own record says so), an ack whose lease went to another holder in
between raises `LeaseLost`; each message settled once."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from rqlite_queue import LeaseLost, OutcomeUnknown, Transport

from .conftest import FakeClock, MakeQueue


class LoseReplies:
    """Wraps one cluster's executor; shared by the shards of a queue (`plan`)."""

    def __init__(self, inner: Any, plan: list[tuple[str, Callable[[], Any] | None]]) -> None:
        self.inner = inner
        self.plan = plan
        """What to do with the next writes: ("apply" | "drop", then run this before the
        resend)."""
        self.sent = 0
        if inspect.iscoroutinefunction(inner.execute):
            self.execute = self._execute_async  # type: ignore[method-assign]

    def _next(self, batch: Any) -> tuple[str, Callable[[], Any] | None] | None:
        if batch.write and self.plan:
            return self.plan.pop(0)
        return None

    def execute(self, batch: Any, deadline: float, **hints: Any) -> Any:
        self.sent += 1
        step = self._next(batch)
        if step is None:
            return self.inner.execute(batch, deadline, **hints)
        if step[0] == "apply":
            self.inner.execute(batch, deadline, **hints)
        if step[1] is not None:
            step[1]()
        raise OutcomeUnknown(f"reply lost (test: {step[0]})")

    async def _execute_async(self, batch: Any, deadline: float, **hints: Any) -> Any:
        self.sent += 1
        step = self._next(batch)
        if step is None:
            return await self.inner.execute(batch, deadline, **hints)
        if step[0] == "apply":
            await self.inner.execute(batch, deadline, **hints)
        if step[1] is not None:
            step[1]()
        raise OutcomeUnknown(f"reply lost (test: {step[0]})")

    def close(self) -> Any:
        return self.inner.close()  # the inner one's: a coroutine for an async executor


def lose(q: Any, *steps: tuple[str, Callable[[], Any] | None]) -> list[Any]:
    """Make the next writes of `q` (on whichever cluster) lose their replies as `steps` say."""
    transport = getattr(q, "sync", q)
    router = transport.router
    backends = router.backends.values() if hasattr(router, "backends") else [router.backend]
    plan = list(steps)
    for backend in backends:
        if not isinstance(backend.executor, LoseReplies):
            backend.executor = LoseReplies(backend.executor, plan)
        else:
            backend.executor.plan = plan
    return plan


def taken_over(make_other: Callable[[], Any], clock: FakeClock, group: str) -> Callable[[], Any]:
    """Before the resend: the lease lapses, and another worker takes its group over."""

    def act() -> None:
        clock.advance(31)
        other = make_other()
        lease = other.claim("other", 30)
        assert lease is not None and lease.group_id == group

    return act


@pytest.fixture
async def q_and_other(
    make_queue: MakeQueue, url: str, clock: FakeClock
) -> AsyncIterator[tuple[Any, Transport]]:
    """The transport under test, and a sync transport of the same queue for another worker
    (sync, so that it can act from inside a lost reply, on the event loop's thread too)."""
    q = await make_queue()
    options: dict[str, Any] = {"queue": getattr(q, "sync", q).queue, "clock": clock}
    if not url.startswith("sqlite"):
        options["max_skew"] = None  # the fake clock is years from rqlite's
    other = Transport.from_url(url, **options)
    yield q, other
    other.close()


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
