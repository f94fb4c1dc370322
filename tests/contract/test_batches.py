"""Batches (docs/batches.md), on every backend, sharded queues included, sync and async: a
block's messages written with their batch at its end (all or none), counted once each when
they settle (acked, dead-lettered, cancelled, expired), the callbacks published once by the
settlement that leaves none unsettled, in its own transaction (never before); batches that grow
through their messages' follow-ups and batches within batches; `batch_status` and `batches`;
what a lost reply leaves; bad arguments refused with nothing written."""

from __future__ import annotations

from typing import Any

import pytest

from rqlite_queue import InvalidArgument, LeaseLost, QueueError
from rqlite_queue.errors import BatchDone, CrossShard
from rqlite_queue.types import (
    BATCH_HEADER,
    MAX_BATCH_DEPTH,
    MAX_BATCH_FAILURES,
    MAX_BATCH_REASON,
    BatchStatus,
    Lease,
    batch_shard,
)

from .conftest import FakeClock, lose

DONE = ("done", {"batch": "callback"})
"""A callback: to the group `done`."""


async def claim_all(q: Any, n: int = 1000, *, skip: tuple[str, ...] = ()) -> list[Lease]:
    """Every claimable head, one per group (the callbacks' groups left alone)."""
    leases = [lease for lease in await q.claim_many("w", 30, n) if lease.group_id not in skip]
    return leases


async def drain(
    q: Any, *, dead: frozenset[str] | set[str] = frozenset(), skip: tuple[str, ...] = ("done", "ok")
) -> int:
    """Settle every message but those of `skip` (the groups in `dead` dead-lettered), as a
    worker would, until none is left; how many were settled."""
    settled = 0
    while True:
        leases = await q.claim_many("w", 30, 1000)
        mine = [lease for lease in leases if lease.group_id not in skip]
        others = [lease for lease in leases if lease.group_id in skip]
        if others:
            await q.settle_and_claim(nack=[(lease, 0.0) for lease in others])
        if not mine:
            return settled
        await q.settle_and_claim(
            ack=[lease for lease in mine if lease.group_id not in dead],
            dead=[(lease, f"failed: {lease.group_id}") for lease in mine if lease.group_id in dead],
        )
        settled += len(mine)


async def callbacks(q: Any, group: str = "done") -> list[Any]:
    return [event for _, event in await q.peek(group, 100)]


async def status(q: Any, batch_id: str) -> BatchStatus:
    found = await q.batch_status(batch_id)
    assert found is not None, f"batch {batch_id} not found"
    return found


# ------------------------------------------------------------------ a block, its callback


async def test_a_block_writes_its_messages_with_the_batch_when_it_ends(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        first = batch.publish("a", 1)
        many = batch.publish_many([("b", 2), ("a", 3), {"group_id": "c", "event": 4}])
        assert await q.peek("a") == []  # nothing before the block ends
        assert await q.batch_status(batch.id) is None
    assert [e for _, e in await q.peek("a")] == [1, 3]
    assert (first.seq, len(many.seqs)) == (first.seqs[0], 3)
    found = await status(q, batch.id)
    assert (found.state, found.total, found.pending, found.succeeded) == ("closed", 4, 4, 0)
    assert not found.open and not found.done and found.parent is None
    leases = {lease.group_id: lease for lease in await q.claim_many("w", 30, 10)}
    assert {g: lease.batch for g, lease in leases.items()} == dict.fromkeys("abc", batch.id)


async def test_the_callback_comes_with_the_last_settlement_and_only_then(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish_many([(g, g) for g in "abcd"])
    leases = await q.claim_many("w", 30, 10)
    for lease in leases[:-1]:
        await q.ack(lease)
        assert await callbacks(q) == []
        assert (await status(q, batch.id)).pending == 4 - leases.index(lease) - 1
    await q.ack(leases[-1])
    assert await callbacks(q) == [DONE[1]]
    found = await status(q, batch.id)
    assert (found.state, found.done, found.pending, found.succeeded) == ("done", True, 0, 4)
    assert found.done_at is not None and found.kept_until is not None
    (callback,) = await q.claim_many("w", 30, 10)
    done = callback.completed_batch
    assert done is not None and callback.batch is None
    assert (done.id, done.succeeded, done.failed, done.cancelled, done.done) == (
        batch.id,
        4,
        0,
        0,
        True,
    )
    assert json_header(callback)["id"] == batch.id
    await q.ack(callback)
    assert await callbacks(q) == []  # once


def json_header(lease: Lease) -> dict[str, Any]:
    import json

    return dict(json.loads(lease.headers[BATCH_HEADER]))


async def test_a_round_that_settles_the_last_ones_publishes_the_callback_once(q: Any) -> None:
    async with q.batch(on_complete=DONE, on_success=("ok", "all")) as batch:
        batch.publish_many([(f"g{i}", i) for i in range(30)])
    leases = await q.claim_many("w", 30, 100)
    result = await q.settle_and_claim("w", 30, 10, ack=leases)
    assert result.lost == []
    claimed = {lease.group_id: lease for lease in result.leases}
    assert set(claimed) == {"done", "ok"}  # published in the round's transaction, claimable in it
    assert claimed["done"].completed_batch == claimed["ok"].completed_batch
    assert (await status(q, batch.id)).succeeded == 30


async def test_other_messages_of_a_callback_group_keep_their_order(q: Any) -> None:
    await q.publish("done", "before")
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    await q.publish("done", "between")
    await drain(q)
    assert await callbacks(q) == ["before", "between", DONE[1]]
    assert batch.id


async def test_a_callback_keeps_its_options_and_headers(q: Any, clock: FakeClock) -> None:
    complete = {
        "group_id": "done",
        "event": {"x": 1},
        "priority": 3,
        "delay": 60,
        "headers": {"trace": "t-1"},
    }
    async with q.batch(on_complete=complete) as batch:
        batch.publish("a", 1)
    await drain(q)
    assert await callbacks(q) == [{"x": 1}]
    assert await claim_all(q) == []  # delayed
    clock.advance(61)
    (callback,) = await q.claim_many("w", 30, 10)
    assert callback.headers["trace"] == "t-1" and BATCH_HEADER in callback.headers
    assert (await q.stats()).by_priority.get(3) == 1
    assert callback.completed_batch is not None and callback.completed_batch.id == batch.id


async def test_a_callback_keeps_its_outcome_for_its_keep(q: Any, clock: FakeClock) -> None:
    """A callback takes `keep` as a publish does: its outcome (its handler's result) is kept
    that long after it settles; one without it keeps none (the transport's default: none)."""
    complete = {"group_id": "done", "event": "all", "keep": 60}
    async with q.batch(on_complete=complete, on_success=("ok", "fine")) as batch:
        batch.publish("a", 1)
    await drain(q)
    made = {lease.group_id: lease for lease in await q.claim_many("w", 30, 10)}
    assert set(made) == {"done", "ok"}
    assert (await q.result("done", made["done"].seq)).status == "running"
    await q.ack(made["done"], result={"summed": 1})
    await q.ack(made["ok"], result="not kept")
    found = await q.result("done", made["done"].seq)
    assert (found.status, found.result) == ("succeeded", {"summed": 1})
    assert await q.result("ok", made["ok"].seq) is None
    clock.advance(61)
    assert await q.result("done", made["done"].seq) is None


async def test_callbacks_keep_their_outcomes_for_the_transports_keep(make_queue: Any) -> None:
    q = await make_queue(keep=600)
    async with q.batch(
        on_complete=DONE, on_success={"group_id": "ok", "event": 1, "keep": 0}
    ) as batch:
        batch.publish("a", 1)
    await drain(q)
    made = {lease.group_id: lease for lease in await q.claim_many("w", 30, 10)}
    for lease in made.values():
        await q.ack(lease, result=lease.group_id)
    assert (await q.result("done", made["done"].seq)).result == "done"
    assert await q.result("ok", made["ok"].seq) is None  # keep 0: not kept


async def test_an_exception_in_the_block_writes_nothing(q: Any) -> None:
    with pytest.raises(RuntimeError):
        async with q.batch(on_complete=DONE) as batch:
            batch.publish("a", 1)
            raise RuntimeError("the import failed")
    assert await q.peek("a") == []
    assert await q.batch_status(batch.id) is None
    assert (await q.stats()).depth == 0


async def test_an_empty_batch_is_done_at_once(q: Any) -> None:
    async with q.batch(on_complete=DONE, on_success=("ok", "empty")) as batch:
        pass
    assert await callbacks(q) == [DONE[1]]
    assert await callbacks(q, "ok") == ["empty"]
    found = await status(q, batch.id)
    assert (found.state, found.total, found.succeeded_all) == ("done", 0, True)


async def test_a_batch_without_callbacks_is_counted_all_the_same(q: Any) -> None:
    async with q.batch() as batch:
        batch.publish_many([("a", 1), ("b", 2)])
    await drain(q, skip=())
    found = await status(q, batch.id)
    assert (found.done, found.succeeded) == (True, 2)
    assert (await q.stats()).depth == 0


# ------------------------------------------------------------------ success, failures


async def test_on_success_only_when_none_failed_and_the_failures_keep_their_reasons(
    q: Any,
) -> None:
    async with q.batch(on_complete=DONE, on_success=("ok", "never")) as batch:
        batch.publish_many([("a", 1), ("b", 2), ("c", 3)])
    await drain(q, dead={"b"})
    assert await callbacks(q) == [DONE[1]]
    assert await callbacks(q, "ok") == []
    found = await status(q, batch.id)
    assert (found.succeeded, found.failed, found.cancelled, found.total) == (2, 1, 0, 3)
    (failure,) = found.failures
    assert (failure.group_id, failure.reason, failure.batch) == ("b", "failed: b", None)
    assert failure.seq > 0 and not found.succeeded_all
    (callback,) = await q.claim_many("w", 30, 10)
    assert callback.completed_batch.failures == found.failures


async def test_the_first_failures_are_kept_all_are_counted(q: Any) -> None:
    groups = [f"g{i:02d}" for i in range(MAX_BATCH_FAILURES + 5)]
    async with q.batch(on_complete=DONE) as batch:
        batch.publish_many([(g, g) for g in groups])
    leases = await q.claim_many("w", 30, 100)
    long_reason = "x" * (MAX_BATCH_REASON + 50)
    for lease in leases:
        await q.dead_letter(lease, long_reason)
    found = await status(q, batch.id)
    assert found.failed == len(groups) and len(found.failures) == MAX_BATCH_FAILURES
    assert {len(f.reason) for f in found.failures} == {MAX_BATCH_REASON}
    assert [f.group_id for f in found.failures] == [lease.group_id for lease in leases][
        :MAX_BATCH_FAILURES
    ]
    assert len(await q.dead_letters()) == len(groups)  # the dead letters themselves: whole


async def test_an_expired_message_fails_its_batch(q: Any, clock: FakeClock) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1, ttl=5)
        batch.publish("b", 2)
    clock.advance(6)
    leases = await claim_all(q)  # the expired one is dead-lettered by the claim
    assert [lease.group_id for lease in leases] == ["b"]
    await q.ack(leases[0])
    found = await status(q, batch.id)
    assert (found.succeeded, found.failed, found.done) == (1, 1, True)
    assert found.failures[0].reason == "expired"


async def test_a_cancelled_group_cancels_its_messages_in_their_batches(q: Any) -> None:
    async with q.batch(on_complete=DONE, on_success=("ok", "no failure")) as batch:
        batch.publish_many([("a", 1), ("a", 2), ("b", 3)])
    assert await q.cancel_group("a", "not needed") == 2
    assert await callbacks(q) == []
    await drain(q)
    found = await status(q, batch.id)
    assert (found.succeeded, found.failed, found.cancelled) == (1, 0, 2)
    assert await callbacks(q) == [DONE[1]]
    assert await callbacks(q, "ok") == ["no failure"]  # cancelled is not failed


async def test_a_queued_message_cancelled_is_cancelled_in_its_batch(q: Any) -> None:
    async with q.batch(on_complete=DONE, on_success=("ok", "no failure")) as batch:
        batch.publish_many([("a", 1), ("a", 2), ("b", 3)])
    [_, (second, _)] = await q.peek("a", 10)
    assert await q.cancel("a", second, "not needed") == "cancelled"
    assert await q.cancel("a", second, "not needed") == "cancelled"  # (counted once)
    found = await status(q, batch.id)
    assert (found.pending, found.cancelled) == (2, 1)
    await drain(q)
    found = await status(q, batch.id)
    assert (found.succeeded, found.failed, found.cancelled, found.done) == (2, 0, 1, True)
    assert await callbacks(q) == [DONE[1]]
    assert await callbacks(q, "ok") == ["no failure"]


async def test_the_last_message_cancelled_while_queued_publishes_the_callback(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    [(seq, _)] = await q.peek("a", 10)
    assert await q.cancel("a", seq) == "cancelled"
    found = await status(q, batch.id)
    assert (found.cancelled, found.done) == (1, True)
    assert await callbacks(q) == [DONE[1]]


@pytest.mark.parametrize("how", ["ack", "nack", "dead_letter"])
async def test_a_running_message_cancelled_counts_as_cancelled_however_it_settles(
    q: Any, how: str
) -> None:
    async with q.batch(on_complete=DONE, on_success=("ok", "no failure")) as batch:
        batch.publish_many([("a", 1), ("b", 2)])
    leases = {lease.group_id: lease for lease in await claim_all(q)}
    assert await q.cancel("a", leases["a"].seq, "stop") == "cancelling"
    assert (await status(q, batch.id)).pending == 2  # (counted when its lease settles)
    if how == "ack":
        await q.ack(leases["a"])
    elif how == "nack":
        await q.nack(leases["a"], 0)
    else:
        await q.dead_letter(leases["a"], "gave up")
    found = await status(q, batch.id)
    assert (found.pending, found.succeeded, found.failed, found.cancelled) == (1, 0, 0, 1)
    await q.ack(leases["b"])
    found = await status(q, batch.id)
    assert (found.succeeded, found.cancelled, found.done) == (1, 1, True)
    assert await callbacks(q) == [DONE[1]]
    assert await callbacks(q, "ok") == ["no failure"]


async def test_a_cancelled_message_taken_again_after_a_lapse_counts_once(
    q: Any, clock: FakeClock
) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    lease = await q.claim("w1", 10)
    assert await q.cancel("a", lease.seq) == "cancelling"
    clock.advance(11)
    assert await claim_all(q, skip=("done",)) == []  # settled as cancelled by the claim
    found = await status(q, batch.id)
    assert (found.cancelled, found.done) == (1, True)
    with pytest.raises(LeaseLost):
        await q.ack(lease)
    assert (await status(q, batch.id)).cancelled == 1
    assert await callbacks(q) == [DONE[1]]


async def test_a_batchs_messages_keep_their_outcomes_as_any_message(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1, keep=600)
        batch.publish_many([{"group_id": "b", "event": 2, "keep": 600}, ("c", 3)])
    leases = {lease.group_id: lease for lease in await claim_all(q)}
    assert [leases[g].keep for g in "abc"] == [600.0, 600.0, None]
    await q.ack(leases["a"], result="first")
    await q.dead_letter(leases["b"], "bad")
    await q.ack(leases["c"])
    assert (await q.result("a", leases["a"].seq)).result == "first"
    assert (await q.result("b", leases["b"].seq)).status == "failed"
    assert await q.result("c", leases["c"].seq) is None
    found = await status(q, batch.id)
    assert (found.succeeded, found.failed, found.done) == (2, 1, True)


async def test_a_nack_is_not_a_settlement(q: Any, clock: FakeClock) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    lease = await q.claim("w", 30)
    await q.nack(lease, 10)
    assert (await status(q, batch.id)).pending == 1
    clock.advance(11)
    lease = await q.claim("w", 30)
    assert lease.batch == batch.id and lease.attempts == 2
    await q.ack(lease)
    assert (await status(q, batch.id)).succeeded == 1


async def test_a_lapsed_lease_taken_over_counts_once(q: Any, clock: FakeClock) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    first = await q.claim("w1", 10)
    clock.advance(11)
    second = await q.claim("w2", 30)
    with pytest.raises(LeaseLost):
        await q.ack(first)
    assert (await status(q, batch.id)).pending == 1
    await q.ack(second)
    found = await status(q, batch.id)
    assert (found.succeeded, found.pending) == (1, 0)
    assert await callbacks(q) == [DONE[1]]


async def test_a_requeued_dead_letter_has_left_its_batch(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    lease = await q.claim("w", 30)
    await q.dead_letter(lease, "bad")
    assert (await status(q, batch.id)).failed == 1
    assert await q.requeue_dead() == 1
    again = await claim_all(q, skip=("done",))
    assert [(lease.group_id, lease.batch) for lease in again] == [("a", None)]
    await q.ack(again[0])
    found = await status(q, batch.id)
    assert (found.succeeded, found.failed) == (0, 1)
    assert await callbacks(q) == [DONE[1]]


# ------------------------------------------------------------------ growing


async def test_follow_ups_that_name_the_batch_join_it_before_their_lease_settles(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("root", 0)
    root = await q.claim("w", 30)
    await q.ack(
        root,
        publish=[
            {"group_id": "child-1", "event": 1, "batch": root.batch},
            {"group_id": "child-2", "event": 2, "batch": root.batch},
            ("elsewhere", "not in the batch"),
        ],
    )
    found = await status(q, batch.id)
    assert (found.total, found.pending, found.succeeded) == (3, 2, 1)
    assert await callbacks(q) == []
    leases = {lease.group_id: lease for lease in await q.claim_many("w", 30, 10)}
    assert leases["child-1"].batch == leases["child-2"].batch == batch.id
    assert leases["elsewhere"].batch is None
    await q.ack(
        leases["child-1"], publish=[{"group_id": "grandchild", "event": 3, "batch": batch.id}]
    )
    await q.ack(leases["child-2"])
    await q.ack(leases["elsewhere"])
    assert await callbacks(q) == []
    (grandchild,) = await claim_all(q, skip=("done",))
    await q.ack(grandchild)
    found = await status(q, batch.id)
    assert (found.total, found.succeeded, found.done) == (4, 4, True)
    assert await callbacks(q) == [DONE[1]]


async def test_a_dead_letters_follow_ups_join_the_batch_too(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    lease = await q.claim("w", 30)
    await q.dead_letter(lease, "bad", publish=[{"group_id": "fix", "event": 1, "batch": batch.id}])
    found = await status(q, batch.id)
    assert (found.failed, found.pending) == (1, 1)
    await drain(q)
    assert (await status(q, batch.id)).done


async def test_the_follow_ups_of_a_lost_lease_join_nothing(q: Any, clock: FakeClock) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    lease = await q.claim("w", 10)
    clock.advance(11)
    other = await q.claim("w2", 30)
    with pytest.raises(LeaseLost):
        await q.ack(lease, publish=[{"group_id": "x", "event": 1, "batch": batch.id}])
    assert (await status(q, batch.id)).total == 1
    await q.ack(other)
    assert (await status(q, batch.id)).done and await q.peek("x") == []


async def test_a_follow_up_joins_only_its_own_leases_batch(q: Any) -> None:
    async with q.batch() as first:
        first.publish("a", 1)
    async with q.batch() as second:
        second.publish("b", 2)
    await q.publish("plain", 0)
    leases = {lease.group_id: lease for lease in await q.claim_many("w", 30, 10)}
    with pytest.raises(InvalidArgument, match="batch"):
        await q.ack(leases["a"], publish=[{"group_id": "x", "event": 1, "batch": second.id}])
    with pytest.raises(InvalidArgument, match="batch"):
        await q.ack(leases["plain"], publish=[{"group_id": "x", "event": 1, "batch": first.id}])
    assert await q.peek("x") == []
    assert (await status(q, first.id)).pending == 1  # nothing was settled either


async def test_a_publish_joins_a_batch_that_is_not_done(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    seq = await q.publish("b", 2, batch=batch.id)
    seqs = await q.publish_many([{"group_id": "c", "event": 3, "batch": batch.id}, ("d", 4)])
    assert seq > 0 and len(seqs) == 2
    found = await status(q, batch.id)
    assert (found.total, found.pending) == (3, 3)
    await drain(q)
    assert (await status(q, batch.id)).succeeded == 3
    with pytest.raises(BatchDone):
        await q.publish("e", 5, batch=batch.id)
    with pytest.raises(BatchDone):
        await q.publish_many([("f", 6), {"group_id": "e", "event": 5, "batch": batch.id}])
    assert await q.peek("e") == [] and await q.peek("f") == []
    assert (await status(q, batch.id)).total == 3


async def test_a_publish_to_a_batch_the_queue_does_not_know_is_refused(q: Any) -> None:
    async with q.batch() as made:
        pass
    unknown = made.id[:-6] + ("000000" if not made.id.endswith("000000") else "000001")
    with pytest.raises(BatchDone):
        await q.publish("a", 1, batch=unknown)
    assert await q.peek("a") == []


# ------------------------------------------------------------------ nested


async def test_a_batch_within_a_batch_is_one_of_its_messages(q: Any) -> None:
    async with q.batch(on_complete=("done", "outer")) as outer:
        outer.publish("a", 1)
        async with outer.batch(on_complete=("done", "inner")) as inner:
            inner.publish_many([("b", 2), ("c", 3)])
    assert inner.parent == outer.id
    found = await status(q, outer.id)
    assert (found.total, found.pending) == (2, 2)
    assert (await status(q, inner.id)).parent == outer.id
    leases = {lease.group_id: lease for lease in await q.claim_many("w", 30, 10)}
    await q.ack(leases["a"])
    await q.ack(leases["b"])
    assert await callbacks(q) == []
    await q.ack(leases["c"])  # the inner one done, and so the outer one: in one transaction
    assert await callbacks(q) == ["inner", "outer"]
    outer_found = await status(q, outer.id)
    assert (outer_found.succeeded, outer_found.done) == (2, True)


async def test_a_failed_batch_within_fails_its_parent(q: Any) -> None:
    outer = q.batch(on_complete=("done", "outer"), on_success=("ok", "outer"))
    async with outer, outer.batch(on_complete=("done", "inner")) as inner:
        inner.publish_many([("b", 2), ("c", 3)])
    await drain(q, dead={"c"})
    found = await status(q, outer.id)
    assert (found.succeeded, found.failed) == (0, 1)
    (failure,) = found.failures
    assert (failure.batch, failure.group_id, failure.seq) == (inner.id, "", 0)
    assert await callbacks(q, "ok") == []
    assert await callbacks(q) == ["inner", "outer"]


async def test_a_batch_within_a_running_batch_is_counted_in_it(q: Any) -> None:
    async with q.batch(on_complete=("done", "outer")) as outer:
        outer.publish("a", 1)
    lease = await q.claim("w", 30)
    async with q.batch(parent=lease.batch, on_complete=("done", "inner")) as inner:
        inner.publish("b", 2)
    await q.ack(lease)
    assert (await status(q, outer.id)).pending == 1
    await drain(q)
    assert await callbacks(q) == ["inner", "outer"]


async def test_an_exception_in_a_batch_within_writes_neither(q: Any) -> None:
    with pytest.raises(KeyError):
        async with q.batch(on_complete=DONE) as outer:
            outer.publish("a", 1)
            async with outer.batch() as inner:
                inner.publish("b", 2)
                raise KeyError("row")
    assert await q.batch_status(outer.id) is None and await q.batch_status(inner.id) is None
    assert (await q.stats()).depth == 0


async def test_a_batch_within_a_flushed_one_is_written_with_its_next_write(q: Any) -> None:
    async with q.batch(on_complete=DONE) as outer:
        outer.publish("a", 1)
        await outer.flush()
        async with outer.batch() as inner:
            inner.publish("b", 2)
            with pytest.raises(InvalidArgument, match="flush that one"):
                await inner.flush()
        assert await q.batch_status(inner.id) is None
    assert (await status(q, inner.id)).total == 1
    assert (await status(q, outer.id)).total == 2


async def test_nesting_has_a_depth_limit(q: Any) -> None:
    parent = None
    for _ in range(MAX_BATCH_DEPTH):
        async with q.batch(parent=parent) as batch:
            batch.publish("hold", 0)  # (not done at once: its parent takes one more)
        parent = batch.id
    with pytest.raises(InvalidArgument, match="deep"):
        async with q.batch(parent=parent) as too_deep:
            too_deep.publish("x", 1)
    assert await q.peek("x") == []


async def test_a_done_batch_takes_no_batch_within(q: Any) -> None:
    async with q.batch() as outer:
        pass
    assert (await status(q, outer.id)).done
    with pytest.raises(BatchDone):
        async with q.batch(parent=outer.id) as inner:
            inner.publish("x", 1)
    assert await q.peek("x") == []


# ------------------------------------------------------------------ open: flush


async def test_a_flushed_batch_is_open_until_its_block_ends(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
        await batch.flush()
        found = await status(q, batch.id)
        assert (found.state, found.open, found.total) == ("open", True, 1)
        await drain(q)  # settled while open: not done
        assert await callbacks(q) == []
        assert (await status(q, batch.id)).pending == 0
        batch.publish("b", 2)
    found = await status(q, batch.id)
    assert (found.state, found.total, found.pending) == ("closed", 2, 1)
    await drain(q)
    assert await callbacks(q) == [DONE[1]]


async def test_an_open_batch_with_none_left_is_done_when_its_block_ends(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
        await batch.flush()
        await drain(q)
    assert await callbacks(q) == [DONE[1]]
    assert (await status(q, batch.id)).done


async def test_an_exception_after_a_flush_closes_the_batch_as_aborted(q: Any) -> None:
    with pytest.raises(ValueError):
        async with q.batch(on_complete=DONE, on_success=("ok", "never")) as batch:
            batch.publish("a", 1)
            await batch.flush()
            batch.publish("b", 2)  # not written
            raise ValueError("row 7 is bad")
    found = await status(q, batch.id)
    assert (found.state, found.total) == ("closed", 1)
    assert found.aborted == "ValueError: row 7 is bad"
    assert await q.peek("b") == []
    await drain(q)
    assert await callbacks(q) == [DONE[1]]
    assert await callbacks(q, "ok") == []
    assert not (await status(q, batch.id)).succeeded_all


async def test_a_block_that_has_ended_takes_nothing_more(q: Any) -> None:
    async with q.batch() as batch:
        batch.publish("a", 1)
    with pytest.raises(InvalidArgument, match="ended"):
        batch.publish("b", 2)
    with pytest.raises(InvalidArgument, match="ended"):
        await batch.flush()


# ------------------------------------------------------------------ reading


async def test_status_and_listing(q: Any) -> None:
    made = []
    for n in range(3):
        async with q.batch() as batch:
            batch.publish(f"g{n}", n)
        made.append(batch.id)
    assert made == sorted(made, key=lambda i: i[-32:])  # ids sort by creation
    leases = await q.claim_many("w", 30, 10)
    await q.ack(next(lease for lease in leases if lease.group_id == "g1"))
    listed = await q.batches()
    assert [b.id for b in listed] == made
    assert [b.id for b in await q.batches(state="closed")] == [made[0], made[2]]
    assert [b.id for b in await q.batches(state="done")] == [made[1]]
    assert [b.id for b in await q.batches(limit=2)] == made[:2]
    assert [b.id for b in await q.batches(after=made[0])] == made[1:]
    assert (await q.stats()).open_batches == 2
    assert await q.batch_status(made[1]) == listed[1]


async def test_a_done_batch_is_forgotten_after_its_keep(q: Any, clock: FakeClock) -> None:
    async with q.batch(keep=60) as batch:
        batch.publish("a", 1)
    await drain(q, skip=())
    found = await status(q, batch.id)
    assert found.kept_until == pytest.approx(found.done_at + 60)
    clock.advance(30)
    for n in range(40):  # the queue's ordinary work prunes, now and then (on every shard)
        await q.publish(f"work-{n % 8}", n)
        await q.ack(await q.claim("w", 30))
    assert await q.batch_status(batch.id) is not None
    clock.advance(31)
    for n in range(400):
        await q.publish(f"work-{n % 8}", n)
        await q.ack(await q.claim("w", 30))
        if await q.batch_status(batch.id) is None:
            break
    assert await q.batch_status(batch.id) is None


# ------------------------------------------------------------------ lost replies


async def test_a_batch_written_again_after_a_lost_reply_is_written_once(q: Any) -> None:
    lose(q, ("apply", None))
    async with q.batch(on_complete=DONE) as batch:
        batch.publish_many([("a", 1), ("b", 2)])
    assert [e for _, e in await q.peek("a")] == [1]
    found = await status(q, batch.id)
    assert (found.total, found.pending) == (2, 2)


async def test_a_flush_written_again_after_a_lost_reply_is_written_once(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
        await batch.flush()
        lose(q, ("apply", None))
        batch.publish("b", 2)
        await batch.flush()
        lose(q, ("apply", None))
    assert [e for _, e in await q.peek("b")] == [2]
    found = await status(q, batch.id)
    assert (found.state, found.total) == ("closed", 2)


async def test_the_last_settlement_sent_again_publishes_the_callback_once(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    lease = await q.claim("w", 30)
    lose(q, ("apply", None))
    await q.ack(lease, publish=[{"group_id": "x", "event": 1, "batch": batch.id}])
    found = await status(q, batch.id)
    assert (found.total, found.succeeded, found.pending) == (2, 1, 1)
    (child,) = await claim_all(q, skip=("done",))
    lose(q, ("apply", None))
    await q.ack(child)
    assert await callbacks(q) == [DONE[1]]
    assert (await status(q, batch.id)).succeeded == 2


# ------------------------------------------------------------------ refused


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"on_complete": "not a callback"}, id="a callback of the wrong shape"),
        pytest.param({"on_complete": ("g",)}, id="a callback without its event"),
        pytest.param(
            {"on_success": {"group_id": "g", "event": 1, "dedup_id": "d"}}, id="a dedup id"
        ),
        pytest.param(
            {"on_complete": {"group_id": "g", "event": 1, "batch": "x"}}, id="a batch callback"
        ),
        pytest.param({"on_complete": ("", 1)}, id="an empty group id"),
        pytest.param({"on_complete": ("g", 1, 9)}, id="a bad priority"),
        pytest.param({"on_complete": {"group_id": "g", "event": 1, "keep": -1}}, id="a bad keep"),
        pytest.param(
            {"on_success": {"group_id": "g", "event": 1, "keep": float("inf")}}, id="keep inf"
        ),
        pytest.param({"keep": 0}, id="keep 0"),
        pytest.param({"keep": float("nan")}, id="keep nan"),
        pytest.param({"parent": "not-an-id"}, id="a parent that is no batch id"),
    ],
)
async def test_bad_batch_arguments_are_refused_at_once(q: Any, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        q.batch(**options)


@pytest.mark.parametrize(
    "item",
    [
        pytest.param({"group_id": "a", "event": 1, "dedup_id": "d"}, id="dedup id"),
        pytest.param({"group_id": "a", "event": 1, "debounce": "k"}, id="debounce"),
        pytest.param({"group_id": "a", "event": 1, "batch": "x" * 32}, id="a batch"),
        pytest.param(("", 1), id="a bad group"),
    ],
)
async def test_a_batchs_messages_are_checked_as_they_are_given(q: Any, item: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("ok", 0)
        with pytest.raises(InvalidArgument) as raised:
            batch.publish_many([("fine", 1), item])
        assert raised.value.index == 1
    assert [e for _, e in await q.peek("ok")] == [0]
    assert await q.peek("fine") == []
    assert (await status(q, batch.id)).total == 1


async def test_a_publish_into_a_batch_takes_no_dedup_id(q: Any) -> None:
    async with q.batch() as batch:
        batch.publish("a", 1)
    with pytest.raises(InvalidArgument, match="dedup"):
        await q.publish("b", 2, batch=batch.id, dedup_id="d")
    with pytest.raises(InvalidArgument, match="debounce"):
        await q.publish("b", 2, batch=batch.id, debounce="k")
    with pytest.raises(InvalidArgument):
        await q.publish("b", 2, batch="not an id")
    assert await q.peek("b") == []


async def test_a_transports_dedup_key_does_not_fold_a_batchs_messages(make_queue: Any) -> None:
    q = await make_queue(dedup_key=lambda event: str(event))
    async with q.batch() as batch:
        batch.publish_many([("a", "same"), ("b", "same")])
    assert (await status(q, batch.id)).total == 2
    assert len(await q.peek("b")) == 1


# ------------------------------------------------------------------ transactions


def group_on_batch_shard(q: Any, batch_id: str, *, other: bool = False) -> str:
    """A group whose messages live on the shard of the batch (`other`: on another shard);
    any group on one cluster."""
    transport = getattr(q, "sync", q)
    if not hasattr(transport, "shard_of"):
        return "tx-group"
    home = batch_shard(batch_id)
    return next(f"tx{i}" for i in range(1000) if (transport.shard_of(f"tx{i}") == home) != other)


async def test_a_transaction_publish_joins_a_batch_in_its_own_write(q: Any) -> None:
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    group = group_on_batch_shard(q, batch.id)
    async with q.transaction() as tx:
        one = tx.publish(group, 2, batch=batch.id, keep=60)
        many = tx.publish_many([{"group_id": group, "event": 3, "batch": batch.id}])
    assert [seq for seq, _ in await q.peek(group)] == [one.seq, *many.seqs]
    found = await status(q, batch.id)
    assert (found.total, found.pending) == (3, 3)
    # A statement that fails takes the message and its count with it.
    with pytest.raises(QueueError, match="malformed JSON"):
        async with q.transaction() as tx:
            tx.publish(group, 4, batch=batch.id)
            tx.execute("SELECT json('not json')")
    assert (await status(q, batch.id)).total == 3
    assert await drain(q) == 3
    assert await callbacks(q) == [DONE[1]]
    assert (await q.result(group, one.seq)).status == "succeeded"  # its keep= was taken
    found = await status(q, batch.id)
    assert (found.state, found.succeeded) == ("done", 3)
    with pytest.raises(BatchDone):
        async with q.transaction() as tx:
            tx.publish(group, 5, batch=batch.id)
    assert len(await q.peek(group)) == 0
    assert (await status(q, batch.id)).total == 3


async def test_a_transaction_publish_into_a_batch_takes_no_dedup_id(q: Any) -> None:
    async with q.batch() as batch:
        batch.publish("a", 1)
    async with q.transaction() as tx:
        with pytest.raises(InvalidArgument, match="dedup"):
            tx.publish("b", 2, batch=batch.id, dedup_id="d")
        with pytest.raises(InvalidArgument):
            tx.publish("b", 2, batch="not an id")
    assert await q.peek("b") == []


async def test_a_sharded_transaction_cannot_join_a_batch_of_another_shard(q: Any) -> None:
    """Its message and the batch's count would be writes on two shards: refused, with an
    error that says so (not `BatchDone`: the batch is not done), and nothing is sent."""
    transport = getattr(q, "sync", q)
    if not hasattr(transport, "shard_of"):
        pytest.skip("one cluster: every batch lives with every group")
    async with q.batch(on_complete=DONE) as batch:
        batch.publish("a", 1)
    there = group_on_batch_shard(q, batch.id, other=True)
    before = await q.stats()
    with pytest.raises(CrossShard, match=f"lives on shard {batch_shard(batch.id)!r}"):
        async with q.transaction() as tx:
            tx.publish_many([{"group_id": there, "event": 2, "batch": batch.id}])
    with pytest.raises(CrossShard):
        async with q.transaction() as tx:
            tx.publish(there, 3, batch=batch.id)
    assert await q.stats() == before
    assert (await status(q, batch.id)).total == 1
    # Outside a transaction the same publish goes through the batch's shard.
    await q.publish(there, 4, batch=batch.id)
    assert (await status(q, batch.id)).total == 2
