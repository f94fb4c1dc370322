"""The contract (docs/contract.md), guarantee by guarantee, on every backend, sync and async.

`q` is a transport on a fresh queue; `clock` is the fake clock it reads, so leases lapse when
the test says so."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from rqlite_queue import InvalidArgument, Lease, LeaseLost
from rqlite_queue.codec import ModelCodec, RawCodec
from rqlite_queue.errors import EncodeError, PayloadTooLarge

from .conftest import FakeClock, MakeQueue, per_shard


async def drain_order(q: Any, worker: str = "w") -> list[tuple[str, Any]]:
    """Claim and ack until empty; the (group, event) sequence served."""
    served = []
    while (lease := await q.claim(worker, 30)) is not None:
        served.append((lease.group_id, lease.event))
        await q.ack(lease)
    return served


# ------------------------------------------------------------------ 1. FIFO per group


async def test_fifo_within_a_group(q: Any) -> None:
    for i in range(5):
        await q.publish("g", {"i": i})
    assert [e["i"] for _, e in await drain_order(q)] == [0, 1, 2, 3, 4]


async def test_next_message_waits_for_the_head_to_be_acked(q: Any) -> None:
    await q.publish("g", 1)
    await q.publish("g", 2)
    head = await q.claim("w1", 30)
    assert head.event == 1
    assert await q.claim("w2", 30) is None  # message 2 is not deliverable yet
    await q.ack(head)
    second = await q.claim("w2", 30)
    assert second.event == 2


async def test_dead_lettering_the_head_unblocks_the_next(q: Any) -> None:
    await q.publish("g", 1)
    await q.publish("g", 2)
    await q.dead_letter(await q.claim("w", 30), "poison")
    assert (await q.claim("w", 30)).event == 2


# ------------------------------------------------------------------- 2. exclusivity


async def test_claim_many_takes_distinct_groups_and_skips_in_flight_ones(q: Any) -> None:
    await q.publish_many([(f"g{i % 3}", i) for i in range(9)])
    first = await q.claim("w", 30)
    leases = await q.claim_many("w", 30, 10)
    groups = [lease.group_id for lease in leases]
    assert len(groups) == len(set(groups)) == 2
    assert first.group_id not in groups
    assert await q.claim_many("w", 30, 10) == []


# ----------------------------------------------------------------- 4. lease recovery


async def test_a_lapsed_lease_is_claimable_again_with_attempts_plus_one(
    q: Any, clock: FakeClock
) -> None:
    await q.publish("g", "m")
    lease = await q.claim("w1", 10)
    assert lease.attempts == 1
    assert lease.expires_at == pytest.approx(clock.now + 10)
    clock.advance(9.9)
    assert await q.claim("w2", 10) is None
    clock.advance(0.2)
    again = await q.claim("w2", 10)
    assert (again.seq, again.event, again.attempts) == (lease.seq, "m", 2)


# ----------------------------------------------------------------------- 5. fencing


async def test_a_lapsed_and_taken_over_lease_is_fenced(q: Any, clock: FakeClock) -> None:
    await q.publish("g", "m")
    await q.publish("g", "next")
    old = await q.claim("w1", 10)
    clock.advance(11)
    new = await q.claim("w2", 10)
    assert new.seq == old.seq
    for call in (
        q.ack(old),
        q.nack(old),
        q.nack(old, 5),
        q.extend(old, 30),
        q.dead_letter(old, "x"),
    ):
        with pytest.raises(LeaseLost):
            await call
    # Nothing changed: the new holder still holds, and acks.
    assert (await q.stats()).depth == 2
    await q.ack(new)
    assert (await q.claim("w3", 10)).event == "next"


async def test_a_lapsed_lease_nobody_took_over_may_still_be_acked(q: Any, clock: FakeClock) -> None:
    await q.publish("g", "m")
    lease = await q.claim("w1", 10)
    clock.advance(11)
    await q.ack(lease)
    assert (await q.stats()).depth == 0


async def test_a_lapsed_lease_nobody_took_over_may_be_extended(q: Any, clock: FakeClock) -> None:
    await q.publish("g", "m")
    lease = await q.claim("w1", 10)
    clock.advance(11)
    extended = await q.extend(lease, 30)
    assert extended.expires_at == pytest.approx(clock.now + 30)
    assert await q.claim("w2", 10) is None
    await q.ack(extended)


async def test_calls_on_a_finished_lease_raise_lease_lost(q: Any) -> None:
    """A settlement applies once per lease: the same settlement again reports what happened
    (it applied: the lease's own record), any other raises `LeaseLost` and changes nothing."""
    await q.publish("g", 1)
    lease = await q.claim("w", 30)
    await q.ack(lease)
    await q.ack(lease)  # the same ack again: it applied (once)
    with pytest.raises(LeaseLost):
        await q.nack(lease)
    with pytest.raises(LeaseLost):
        await q.dead_letter(lease, "late")
    with pytest.raises(LeaseLost):
        await q.extend(lease, 30)
    await q.publish_many([("g", 2), ("g", 3)])
    lease = await q.claim("w", 30)
    await q.nack(lease)
    with pytest.raises(LeaseLost):
        await q.ack(lease)  # given back: not acked
    again = await q.claim("w", 30)
    assert again.seq == lease.seq and again.attempts == 2
    await q.dead_letter(again, "boom")
    await q.dead_letter(again, "boom")  # the same dead letter again: it applied (once)
    with pytest.raises(LeaseLost):
        await q.ack(again)
    assert [d.seq for d in await q.dead_letters()] == [again.seq]
    assert [e for _, e in await q.peek("g")] == [3]


async def test_ack_many_acks_what_holds_and_names_what_did_not(q: Any, clock: FakeClock) -> None:
    await q.publish_many([("a", 1), ("b", 2)])
    a = await q.claim("w", 10)
    b = await q.claim("w", 100)
    clock.advance(11)
    await q.claim("other", 10)  # takes a over
    with pytest.raises(LeaseLost) as lost:
        await q.ack_many([a, b])
    assert [lease.group_id for lease in lost.value.leases] == ["a"]
    assert (await q.stats()).depth == 1


# -------------------------------------------------------------------- 6. round robin


async def test_groups_are_served_round_robin(q: Any) -> None:
    await q.publish_many([(g, i) for i in range(3) for g in ("a", "b", "c")])
    served = [g for g, _ in await drain_order(q)]
    assert per_shard(q, served) == per_shard(q, list("abcabcabc"))


async def test_never_claimed_groups_come_first_and_a_hot_group_cannot_starve_others(
    q: Any,
) -> None:
    await q.publish_many([("hot", i) for i in range(50)])
    lease = await q.claim("w", 30)
    await q.ack(lease)
    await q.publish("cold", "c")
    # "cold" was never claimed: it is served before "hot" comes round again.
    assert (await q.claim("w", 30)).group_id == "cold"


async def test_a_group_refilled_after_each_ack_does_not_starve_the_others(q: Any) -> None:
    """A workflow that publishes its next event after acking the last one empties its group
    each time; the recreated group keeps its place in the round robin."""
    await q.publish_many([("a", 1), ("a", 2), ("b", 1), ("b", 2), ("hot", 0)])
    served = []
    for step in range(6):
        lease = await q.claim("w", 30)
        served.append(lease.group_id)
        await q.ack(lease)
        if lease.group_id == "hot":
            await q.publish("hot", step)
    assert per_shard(q, served) == per_shard(q, ["a", "b", "hot", "a", "b", "hot"])


async def test_a_hand_made_lease_cannot_remove_a_later_message(q: Any) -> None:
    await q.publish("g", 1)
    second = await q.publish("g", 2)
    lease = await q.claim("w", 30)
    forged = Lease(second, "g", 2, lease.token)
    with pytest.raises(LeaseLost):
        await q.ack(forged)
    with pytest.raises(LeaseLost):
        await q.dead_letter(forged, "x")
    assert [e for _, e in await q.peek("g")] == [1, 2]
    await q.ack(lease)


async def test_least_recently_claimed_group_is_served_first(q: Any) -> None:
    await q.publish_many([(g, i) for i in range(3) for g in ("a", "b")])
    a = await q.claim("w", 30)
    b = await q.claim("w", 30)
    await q.ack(b)
    await q.ack(a)  # acked last, but claimed first: still served first next
    assert (await q.claim("w", 30)).group_id == "a"


# ------------------------------------------------------------------- 7. priority floor


async def test_min_priority_only_considers_groups_at_or_above_it(q: Any) -> None:
    await q.publish_many([(f"low{i}", i) for i in range(20)])
    await q.publish("mid", "m", priority=2)
    await q.publish("high", "h", priority=4)
    assert (await q.claim("w", 30, min_priority=4)).group_id == "high"
    assert (await q.claim("w", 30, min_priority=2)).group_id == "mid"
    assert await q.claim("w", 30, min_priority=2) is None
    first = (await q.claim("w", 30)).group_id  # the first created (on its shard)
    assert first in [groups[0] for groups in per_shard(q, [f"low{i}" for i in range(20)]).values()]


async def test_a_groups_priority_is_fixed_by_its_first_publish(q: Any) -> None:
    await q.publish("g", 1, priority=1)
    await q.publish("g", 2, priority=4)  # ignored while g has messages
    assert await q.claim("w", 30, min_priority=2) is None
    await q.ack(await q.claim("w", 30, min_priority=1))
    await q.ack(await q.claim("w", 30, min_priority=1))
    await q.publish("g", 3, priority=4)  # g was empty: this publish sets it anew
    assert (await q.claim("w", 30, min_priority=4)).event == 3


# ---------------------------------------------------------------------------- 8. park


async def test_nack_with_delay_parks_the_group_and_keeps_order(q: Any, clock: FakeClock) -> None:
    await q.publish("g", 1)
    await q.publish("g", 2)
    lease = await q.claim("w", 30)
    await q.nack(lease, delay=5)
    stats = await q.stats()
    assert (stats.parked, stats.in_flight) == (1, 0)
    clock.advance(4.9)
    assert await q.claim("w", 30) is None
    clock.advance(0.2)
    again = await q.claim("w", 30)
    assert (again.seq, again.event, again.attempts) == (lease.seq, 1, 2)


async def test_nack_without_delay_frees_the_group_now(q: Any) -> None:
    await q.publish("g", 1)
    lease = await q.claim("w", 30)
    await q.nack(lease)
    again = await q.claim("w", 30)
    assert (again.seq, again.attempts) == (lease.seq, 2)


# ----------------------------------------------------------------- 9. idempotent publish


async def test_publish_with_a_dedup_id_inserts_once_per_window(q: Any, clock: FakeClock) -> None:
    first = await q.publish("g", "m", dedup_id="d-1")
    assert await q.publish("g", "m", dedup_id="d-1") == first
    assert (await q.stats()).depth == 1
    await q.ack(await q.claim("w", 30))
    # The group emptied: a repeat inside the window must not bring it back.
    assert await q.publish("g", "m", dedup_id="d-1") == first
    assert (await q.stats()).groups == 0
    clock.advance(301)
    assert await q.publish("g", "m", dedup_id="d-1") != first
    assert (await q.stats()).depth == 1


async def test_publish_many_mixes_dedup_and_plain_items_in_order(q: Any) -> None:
    seqs = await q.publish_many(
        [
            ("g", 0),
            {"group_id": "g", "event": 1, "dedup_id": "x"},
            ("g", 2),
            {"group_id": "g", "event": 3, "dedup_id": "x"},
        ]
    )
    assert seqs[1] == seqs[3] and seqs[0] < seqs[1] < seqs[2]
    assert [e for _, e in await drain_order(q)] == [0, 1, 2]


# ---------------------------------------------------------------- batches and others


async def test_publish_many_is_ordered_and_spans_several_statements(q: Any) -> None:
    items = [("g", i) for i in range(700)]
    seqs = await q.publish_many(items)
    assert seqs == sorted(seqs) and len(set(seqs)) == 700
    peeked = await q.peek("g", 1000)
    assert [e for _, e in peeked] == list(range(700))
    assert [s for s, _ in peeked] == seqs


async def test_extend_pushes_the_deadline(q: Any, clock: FakeClock) -> None:
    await q.publish("g", 1)
    lease = await q.claim("w", 10)
    clock.advance(8)
    lease = await q.extend(lease, 10)
    clock.advance(8)
    assert await q.claim("w2", 10) is None
    await q.ack(lease)


async def test_dead_letters_are_listed_requeued_and_purged(q: Any) -> None:
    await q.publish("g", "a", priority=3)
    await q.publish("g", "b")
    lease = await q.claim("w", 30)
    await q.nack(lease)
    lease = await q.claim("w", 30)
    await q.dead_letter(lease, "ValueError: bad")
    [dead] = await q.dead_letters()
    assert (dead.seq, dead.group_id, dead.event, dead.priority, dead.attempts) == (
        lease.seq,
        "g",
        "a",
        3,
        2,
    )
    assert dead.reason == "ValueError: bad"
    assert (await q.stats()).dead == 1
    assert await q.requeue_dead() == 1
    assert await q.dead_letters() == []
    # Requeued at the tail: b first, then a.
    assert [e for _, e in await drain_order(q)] == ["b", "a"]
    await q.publish("h", "c")
    await q.dead_letter(await q.claim("w", 30), "x")
    assert await q.purge_dead() == 1
    assert (await q.stats()).dead == 0


async def test_stats(q: Any, clock: FakeClock) -> None:
    await q.publish_many([("a", 1), ("a", 2), ("b", 3, 2), ("c", 4)])
    clock.advance(5)
    await q.claim("w", 30)  # a
    await q.nack(await q.claim("w", 30), 60)  # b parked
    stats = await q.stats()
    assert (stats.depth, stats.groups, stats.in_flight, stats.parked, stats.dead) == (
        4,
        3,
        1,
        1,
        0,
    )
    assert stats.by_priority == {0: 3, 2: 1}
    assert stats.oldest_age == pytest.approx(5)


async def test_named_queues_are_independent(make_queue: MakeQueue) -> None:
    one = await make_queue()
    two = await make_queue(queue=one.queue + "_b")
    await one.publish("g", 1)
    assert await two.claim("w", 30) is None
    assert (await one.claim("w", 30)).event == 1


async def test_two_clients_share_one_queue(make_queue: MakeQueue) -> None:
    one = await make_queue()
    two = await make_queue(queue=one.queue)
    await one.publish("g", 1)
    await one.publish("g", 2)
    lease = await two.claim("w", 30)
    assert await one.claim("w", 30) is None
    await one.ack(lease)  # a lease is data: any client may finish it
    assert (await two.claim("w", 30)).event == 2


# ---------------------------------------------------------------------------- codecs


class Order(pydantic.BaseModel):
    id: int
    items: list[str]


async def test_models_round_trip_with_a_model_codec(make_queue: MakeQueue) -> None:
    q = await make_queue(codec=Order)
    await q.publish("g", Order(id=1, items=["a"]))
    lease = await q.claim("w", 30)
    assert lease.event == Order(id=1, items=["a"])
    with pytest.raises(EncodeError):
        await q.publish("g", {"id": 1})
    plain = await make_queue(queue=q.queue + "_j")
    with pytest.raises(EncodeError, match="codec=Order"):
        await plain.publish("g", Order(id=3, items=[]))
    q2 = await make_queue(codec=ModelCodec(Order), queue=q.queue + "_m")
    await q2.publish("g", Order(id=2, items=[]))
    assert (await q2.claim("w", 30)).event.id == 2


async def test_raw_codec_keeps_str_and_bytes(make_queue: MakeQueue) -> None:
    q = await make_queue(codec=RawCodec())
    await q.publish_many([("g", "text ü"), ("g", b"\x00\xffbin"), ("g", "x'00'")])
    assert [e for _, e in await drain_order(q)] == ["text ü", b"\x00\xffbin", "x'00'"]


async def test_json_payloads_of_every_kind(q: Any) -> None:
    payloads = [{"a": [1, 2.5, None, True]}, [1, "two"], "s", 3, 2.5, None, False, "é" * 10]
    await q.publish_many([("g", p) for p in payloads])
    assert [e for _, e in await drain_order(q)] == payloads


async def test_any_text_is_a_group_id_and_a_dedup_id(q: Any) -> None:
    """Even text shaped like an SQL hex literal, which rqlite would turn into a BLOB if it
    were bound as a plain parameter: ids travel as JSON."""
    groups = ["x'00ab'", "X'FF'", "é ü 漢字 🙂", "a'; DROP TABLE x; --", " ", "%s"]
    for group in groups:
        await q.publish(group, group, dedup_id=group)
        assert await q.publish(group, group, dedup_id=group) == (await q.peek(group))[0][0]
        assert [e for _, e in await q.peek(group)] == [group]
    await q.hold_group(groups[0])
    leases = await q.claim_many("w", 30, 10)
    assert sorted(lease.group_id for lease in leases) == sorted(groups[1:])
    assert all(lease.event == lease.group_id for lease in leases)
    assert await q.release_group(groups[0])


# ------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda q: q.publish("", 1), InvalidArgument),
        (lambda q: q.publish(None, 1), InvalidArgument),
        (lambda q: q.publish(7, 1), InvalidArgument),
        (lambda q: q.publish("g", 1, priority=-1), InvalidArgument),
        (lambda q: q.publish("g", 1, priority=5), InvalidArgument),
        (lambda q: q.publish("g", 1, priority=True), InvalidArgument),
        (lambda q: q.publish("g", 1, priority="1"), InvalidArgument),
        (lambda q: q.publish("g", object()), EncodeError),
        (lambda q: q.publish("g", float("nan")), EncodeError),
        (lambda q: q.publish("g", "x" * 2_000_000), PayloadTooLarge),
        (lambda q: q.publish("g", 1, dedup_id=""), InvalidArgument),
        (lambda q: q.publish_many([("g", 1), ("", 2)]), InvalidArgument),
        (lambda q: q.publish_many([("g",)]), InvalidArgument),
        (lambda q: q.publish_many([{"group": "g"}]), InvalidArgument),
        (lambda q: q.claim("w", 0), InvalidArgument),
        (lambda q: q.claim("w", -1), InvalidArgument),
        (lambda q: q.claim("", 10), InvalidArgument),
        (lambda q: q.claim("w", 10, min_priority=5), InvalidArgument),
        (lambda q: q.claim_many("w", 10, 0), InvalidArgument),
        (lambda q: q.dead_letters(0), InvalidArgument),
        (lambda q: q.requeue_dead([]), InvalidArgument),
    ],
)
async def test_bad_input_is_refused_and_writes_nothing(q: Any, call: Any, error: type) -> None:
    await q.publish("keep", 0)
    with pytest.raises(error):
        await call(q)
    stats = await q.stats()
    assert (stats.depth, stats.groups) == (1, 1)


async def test_bad_calls_on_a_lease_are_refused(q: Any) -> None:
    await q.publish("g", 1)
    lease = await q.claim("w", 30)
    with pytest.raises(InvalidArgument):
        await q.nack(lease, -1)
    with pytest.raises(InvalidArgument):
        await q.extend(lease, 0)
    with pytest.raises(InvalidArgument):
        await q.ack("not a lease")
    await q.ack(lease)


@pytest.mark.parametrize("name", ["", "Upper", "has-dash", "x" * 41, "a b"])
async def test_bad_queue_names_are_refused(make_queue: MakeQueue, name: str) -> None:
    with pytest.raises(InvalidArgument):
        await make_queue(queue=name)
