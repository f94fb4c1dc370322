"""Operators' calls (docs/contract.md, "Operating a queue"), on every backend, sync and async:
listing groups, cancelling one, changing its priority, pausing the whole queue."""

from __future__ import annotations

from typing import Any

import pytest

from rqlite_queue import InvalidArgument, LeaseLost
from rqlite_queue.types import GroupInfo

from .conftest import FakeClock, MakeQueue


def by_id(infos: list[GroupInfo]) -> dict[str, GroupInfo]:
    return {info.group_id: info for info in infos}


# ----------------------------------------------------------------------------- groups()


async def test_groups_lists_each_state_with_its_head_lease_and_holder(
    q: Any, clock: FakeClock
) -> None:
    await q.publish_many([("leased", 1, 2), ("leased", 2), ("nacked", 3, 1), ("untouched", 4)])
    await q.publish("delayed", 5, delay=60)
    await q.publish("held", 6)
    await q.hold_group("held")
    await q.hold_group("held-empty")
    lease = await q.claim("worker-7", 30, min_priority=2)  # takes "leased" (priority 2)
    nacked = await q.claim("w", 30, min_priority=1)
    assert (lease.group_id, nacked.group_id) == ("leased", "nacked")
    await q.nack(nacked, delay=45)
    clock.advance(10)

    groups = by_id(await q.groups())
    assert list(groups) == sorted(groups)  # in group id order
    assert set(groups) == {"delayed", "held", "held-empty", "leased", "nacked", "untouched"}
    leased = groups["leased"]
    assert (leased.state, leased.priority, leased.depth, leased.head_seq) == ("leased", 2, 2, 1)
    assert (leased.attempts, leased.until, leased.holder) == (1, lease.expires_at, "worker-7")
    assert leased.head_age == pytest.approx(10)
    nacked_info, untouched = groups["nacked"], groups["untouched"]
    assert (nacked_info.state, nacked_info.until, nacked_info.holder) == (
        "parked",
        clock.now + 35,
        None,
    )
    assert nacked_info.attempts == 1
    assert (untouched.state, untouched.until, untouched.attempts) == ("ready", None, 0)
    assert (groups["delayed"].state, groups["delayed"].until) == ("delayed", clock.now + 50)
    assert (groups["held"].state, groups["held"].depth) == ("held", 1)
    empty = groups["held-empty"]
    assert (empty.state, empty.depth, empty.head_seq, empty.head_age) == ("held", 0, None, None)


async def test_a_lapsed_lease_or_an_ended_park_lists_as_ready(q: Any, clock: FakeClock) -> None:
    await q.publish_many([("a", 1), ("b", 2)])
    await q.claim("w", 5)
    await q.nack(await q.claim("w", 30), delay=5)
    clock.advance(5)
    assert {g.group_id: (g.state, g.until, g.holder) for g in await q.groups()} == {
        "a": ("ready", None, None),
        "b": ("ready", None, None),
    }


async def test_groups_pages_through_every_group_once_in_id_order(q: Any) -> None:
    ids = [f"g{i:03}" for i in range(25)]
    await q.publish_many([(g, 0) for g in reversed(ids)])
    seen: list[str] = []
    after = None
    while page := await q.groups(limit=10, after=after):
        assert len(page) <= 10
        seen += [g.group_id for g in page]
        after = page[-1].group_id
    assert seen == ids


async def test_groups_filters_by_prefix_state_and_priority(q: Any) -> None:
    await q.publish_many(
        [("order-1", 0), ("order-2", 0, 3), ("order-10", 0), ("order", 0), ("orders", 0)]
    )
    await q.publish_many([("ordeR", 0), ("invoice-1", 0, 4), ("é-1", 0), ("é-2", 0), ("f", 0)])
    await q.claim("w", 30, min_priority=4)  # leases invoice-1

    def ids(infos: list[GroupInfo]) -> list[str]:
        return [g.group_id for g in infos]

    assert ids(await q.groups(prefix="order-")) == ["order-1", "order-10", "order-2"]
    assert ids(await q.groups(prefix="order")) == [
        "order",
        "order-1",
        "order-10",
        "order-2",
        "orders",
    ]
    assert ids(await q.groups(prefix="é")) == ["é-1", "é-2"]
    assert ids(await q.groups(prefix="order-", after="order-10")) == ["order-2"]
    assert ids(await q.groups(min_priority=3)) == ["invoice-1", "order-2"]
    assert ids(await q.groups(state="leased")) == ["invoice-1"]
    assert ids(await q.groups(state="ready", prefix="order-1")) == ["order-1", "order-10"]
    assert await q.groups(state="parked") == []


async def test_a_prefix_ending_in_the_last_code_point_has_no_upper_bound(q: Any) -> None:
    last = "\U0010ffff"
    await q.publish_many([("a" + last, 0), ("a" + last + "x", 0), ("b", 0)])
    assert [g.group_id for g in await q.groups(prefix="a" + last)] == ["a" + last, "a" + last + "x"]


async def test_an_emptied_group_is_not_listed(q: Any) -> None:
    await q.publish("g", 1)
    await q.ack(await q.claim("w", 30))
    assert await q.groups() == []


# ------------------------------------------------------------------------ cancel_group


async def test_cancel_group_dead_letters_every_message_in_order_and_fences_the_lease(
    q: Any,
) -> None:
    await q.publish_many([("order", "charge"), ("order", "ship"), ("order", "mail")])
    await q.publish("other", "x")
    lease = await q.claim("w", 30)
    assert lease.group_id == "order"
    assert await q.cancel_group("order", "customer cancelled") == 3
    dead = await q.dead_letters(group_id="order")
    assert [(d.event, d.reason, d.attempts) for d in dead] == [
        ("charge", "customer cancelled", 1),
        ("ship", "customer cancelled", 0),
        ("mail", "customer cancelled", 0),
    ]
    for call in (q.ack(lease), q.nack(lease), q.extend(lease, 30)):
        with pytest.raises(LeaseLost, match="cancelled"):
            await call
    assert [g.group_id for g in await q.groups()] == ["other"]
    assert (await q.stats()).depth == 1


async def test_a_cancelled_group_takes_new_messages_and_serves_them(q: Any) -> None:
    await q.publish("order", 1)
    assert await q.cancel_group("order", "stop") == 1
    assert await q.cancel_group("order", "stop") == 0
    assert await q.cancel_group("never-seen", "stop") == 0
    await q.publish("order", 2)
    lease = await q.claim("w", 30)
    assert (lease.group_id, lease.event, lease.attempts) == ("order", 2, 1)
    await q.ack(lease)


async def test_cancelling_a_held_group_keeps_it_held(q: Any) -> None:
    await q.publish("order", 1)
    await q.hold_group("order")
    await q.cancel_group("order", "stop")
    await q.publish("order", 2)
    assert await q.claim("w", 30) is None
    assert await q.release_group("order")
    assert (await q.claim("w", 30)).event == 2


async def test_cancelled_messages_can_be_requeued(q: Any) -> None:
    await q.publish_many([("order", 1), ("order", 2)])
    await q.cancel_group("order", "by mistake")
    assert await q.requeue_dead() == 2
    lease = await q.claim("w", 30)
    assert (lease.group_id, lease.event) == ("order", 1)


# ------------------------------------------------------------------------ set_priority


async def test_set_priority_moves_a_group_above_the_floor(q: Any) -> None:
    await q.publish_many([("low", 1), ("low", 2), ("other", 3)])
    assert await q.claim("w", 30, min_priority=3) is None
    assert await q.set_priority("low", 3)
    lease = await q.claim("w", 30, min_priority=3)
    assert (lease.group_id, lease.event) == ("low", 1)
    assert by_id(await q.groups())["low"].priority == 3
    await q.ack(lease)
    assert (await q.claim("w", 30, min_priority=3)).event == 2  # kept for its later messages


async def test_set_priority_of_a_group_without_messages_is_false(q: Any) -> None:
    assert not await q.set_priority("nothing", 2)
    await q.publish("g", 1)
    await q.ack(await q.claim("w", 30))
    assert not await q.set_priority("g", 2)
    await q.publish("g", 2, priority=1)  # an empty group's next publish sets its priority
    assert by_id(await q.groups())["g"].priority == 1


async def test_publishing_keeps_the_priority_of_a_group_with_messages(q: Any) -> None:
    await q.publish("g", 1, priority=1)
    await q.publish("g", 2, priority=4)
    assert by_id(await q.groups())["g"].priority == 1
    assert (await q.stats()).by_priority == {1: 2}


# ------------------------------------------------------------------------ pause/resume


async def test_pause_stops_every_clients_claims_and_resume_restarts_them(
    make_queue: MakeQueue,
) -> None:
    operator, worker = await make_queue(), await make_queue()
    await operator.publish_many([("a", 1), ("b", 2)])
    lease = await worker.claim("w", 30)
    await operator.pause()
    assert (await worker.stats()).paused
    assert await worker.claim("w", 30) is None
    assert await worker.claim_many("w", 30, 5) == []
    assert not (await worker.probe()).claimable
    await operator.publish("c", 3)  # publishes go on
    done = await worker.settle_and_claim("w", 30, 5, ack=[lease])  # settling goes on
    assert (done.lost, done.leases) == ([], [])
    await operator.resume()
    assert not (await worker.stats()).paused
    assert (await worker.probe()).claimable
    assert sorted(lease.group_id for lease in await worker.claim_many("w", 30, 5)) == ["b", "c"]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call",
    [
        lambda q: q.groups(state="stuck"),
        lambda q: q.groups(state=1),
        lambda q: q.groups(prefix=""),
        lambda q: q.groups(prefix="\ud800"),
        lambda q: q.groups(after=3),
        lambda q: q.groups(limit=0),
        lambda q: q.groups(limit=True),
        lambda q: q.groups(min_priority=5),
        lambda q: q.cancel_group("", "r"),
        lambda q: q.cancel_group("g", None),
        lambda q: q.cancel_group("g", "bad \ud800"),
        lambda q: q.set_priority("g", 5),
        lambda q: q.set_priority("g", 1.0),
        lambda q: q.set_priority(None, 1),
    ],
)
async def test_admin_calls_refuse_bad_input_and_change_nothing(q: Any, call: Any) -> None:
    await q.publish("g", 1)
    with pytest.raises(InvalidArgument):
        await call(q)
    assert [(g.group_id, g.priority, g.depth) for g in await q.groups()] == [("g", 0, 1)]
    assert (await q.stats()).dead == 0


# ----------------------------------------------------------------------------- dead_letters()


async def test_dead_letters_page_by_cursor(q: Any) -> None:
    """Pages from `after=` the last one's `DeadLetter.cursor` list every dead letter once, in
    (seq, shard) order (seqs are per shard: two shards have the same seqs, and a page may end
    between them), whatever is purged or requeued meanwhile."""
    transport = getattr(q, "sync", q)
    sharded = hasattr(transport, "shard_of")
    await q.publish_many([(f"g{i % 12}", i) for i in range(24)])
    while leases := await q.claim_many("w", 30, 12):
        for lease in leases:
            await q.dead_letter(lease, f"r{lease.event}")
    everything = await q.dead_letters(1000)
    assert len(everything) == 24
    assert [(d.seq, d.shard) for d in everything] == sorted((d.seq, d.shard) for d in everything)
    if sharded:
        assert {d.shard for d in everything} == {"a", "b"}
        assert everything[0].cursor == f"{everything[0].shard}/{everything[0].seq}"
    else:
        assert everything[0].cursor == str(everything[0].seq)

    async def walk(size: int, **options: Any) -> list[list[Any]]:
        pages, after = [], None
        while page := await q.dead_letters(size, after=after, **options):
            pages.append(page)
            after = page[-1].cursor
            assert len(pages) <= 24, "a page came back again"
        return pages

    for size in (1, 5, 24, 100):
        pages = await walk(size)
        assert [d for page in pages for d in page] == everything, size
        assert all(len(page) == size for page in pages[:-1])
    g3 = [d for d in everything if d.group_id == "g3"]
    assert [d for page in await walk(1, group_id="g3") for d in page] == g3

    # The cursor's own dead letter gone, and the next page's first requeued: the next page
    # goes on from where the cursor stands.
    first = await q.dead_letters(5)
    gone, requeued = first[-1], everything[5]
    assert await q.purge_dead([gone.seq], shard=gone.shard or None) == 1
    assert await q.requeue_dead([requeued.seq], shard=requeued.shard or None) == 1
    assert await q.dead_letters(5, after=first[-1].cursor) == everything[6:11]
    assert await q.dead_letters(5, after=everything[-1].cursor) == []

    other = "5" if sharded else "a/5"
    for bad in ("", "x", "-1", "5/", "/5", "A/5", "a/b/5", other, 5, b"5"):
        with pytest.raises(InvalidArgument):
            await q.dead_letters(after=bad)
