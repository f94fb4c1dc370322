"""Time in the queue, on every backend, sync and async, with the fake clock (no sleeps): delayed
messages (FIFO kept around them), expiry, periodic schedules."""

from __future__ import annotations

from typing import Any

import pytest

from rqlite_queue import InvalidArgument

from .conftest import FakeClock
from .test_contract import drain_order

# ------------------------------------------------------------------------ delayed messages


async def test_a_delayed_message_is_not_delivered_a_moment_before_its_time(
    q: Any, clock: FakeClock
) -> None:
    await q.publish("g", "later", delay=10)
    await q.publish("h", "at", not_before=clock.now + 20)
    assert (await q.stats()).delayed == 2
    clock.advance(9.999)
    assert await q.claim("w", 30) is None
    probe = await q.probe()
    assert not probe.claimable and probe.next_due == pytest.approx(clock.now + 0.001)
    clock.advance(0.001)
    lease = await q.claim("w", 30)
    assert lease is not None and lease.event == "later"
    clock.advance(10)
    lease = await q.claim("w", 30)
    assert lease is not None and lease.event == "at"
    assert (await q.stats()).delayed == 0


async def test_a_delayed_head_holds_the_messages_after_it(q: Any, clock: FakeClock) -> None:
    await q.publish_many([{"group_id": "g", "event": 1, "delay": 10}, ("g", 2), ("other", "x")])
    assert await drain_order(q) == [("other", "x")]  # 2 waits behind its delayed head
    clock.advance(10)
    assert await drain_order(q) == [("g", 1), ("g", 2)]


async def test_a_delayed_message_waits_when_it_becomes_the_head(q: Any, clock: FakeClock) -> None:
    await q.publish("g", 1)
    await q.publish("g", 2, delay=10)
    await q.publish("g", 3)
    head = await q.claim("w", 30)
    clock.advance(4)
    await q.ack(head)
    assert await q.claim("w", 30) is None  # 2 is due in 6 s; 3 waits behind it
    clock.advance(6)
    assert [e for _, e in await drain_order(q)] == [2, 3]


async def test_a_past_not_before_is_at_once(q: Any, clock: FakeClock) -> None:
    await q.publish("g", 1, not_before=clock.now - 60)
    lease = await q.claim("w", 30)
    assert lease is not None and lease.event == 1


async def test_a_delayed_message_sent_to_a_group_that_emptied_keeps_its_place(
    q: Any, clock: FakeClock
) -> None:
    await q.publish_many([("a", 1), ("b", 1)])
    await q.ack(await q.claim("w", 30))  # a: claimed at turn 1, then emptied
    await q.publish("a", 2, delay=5)
    assert [g for g, _ in await drain_order(q)] == ["b"]
    clock.advance(5)
    assert await drain_order(q) == [("a", 2)]


# ------------------------------------------------------------------------------- expiry


async def test_a_message_not_delivered_before_its_ttl_is_dead_lettered_instead(
    q: Any, clock: FakeClock
) -> None:
    await q.publish_many(
        [{"group_id": "g", "event": "stale", "ttl": 5}, ("g", "next"), ("h", "fresh")]
    )
    await q.publish("h", "kept", ttl=60)
    clock.advance(5)
    assert await drain_order(q) == [("h", "fresh"), ("g", "next"), ("h", "kept")]
    [dead] = await q.dead_letters()
    assert (dead.event, dead.reason, dead.attempts) == ("stale", "expired", 1)
    assert (await q.stats()).expired == 1


async def test_a_message_is_never_delivered_after_its_ttl_not_even_as_a_retry(
    q: Any, clock: FakeClock
) -> None:
    await q.publish("g", "job", ttl=10)
    lease = await q.claim("w", 30)
    assert lease is not None
    await q.nack(lease, 0)
    clock.advance(20)  # delivered once in time; its ttl passes before the retry
    assert await q.claim("w", 30) is None
    assert (await q.stats()).expired == 1


# ------------------------------------------------------------------------------ schedules


async def test_a_schedule_publishes_each_tick_once(q: Any, clock: FakeClock) -> None:
    made = await q.schedule("beat", "jobs", {"job": "beat"}, every=60, priority=2)
    assert made.next_at == clock.now + 60
    assert await q.fire_schedules() == 0  # not due yet
    clock.advance(60)
    assert await q.fire_schedules() == 1
    assert await q.fire_schedules() == 0  # fired, and moved on
    [schedule] = await q.schedules()
    assert schedule.next_at == made.next_at + 60
    lease = await q.claim("w", 30, min_priority=2)
    assert lease is not None and (lease.group_id, lease.event) == ("jobs", {"job": "beat"})


async def test_missed_ticks_give_one_catch_up_message_or_one_each(q: Any, clock: FakeClock) -> None:
    await q.schedule("one", "a", "tick", every=10)
    await q.schedule("each", "b", "tick", every=10, catch_up=True)
    clock.advance(35)  # ticks at +10, +20, +30 missed
    assert await q.fire_schedules() == 1 + 3
    assert [len(await q.peek(g)) for g in ("a", "b")] == [1, 3]
    assert {s.name: s.next_at for s in await q.schedules()} == {
        "each": clock.now + 5,
        "one": clock.now + 5,
    }


async def test_cron_schedules_tick_at_the_times_of_the_expression(q: Any, clock: FakeClock) -> None:
    made = await q.schedule("hourly", "g", "h", cron="0 * * * *")
    assert made.next_at > clock.now and made.next_at % 3600 == 0
    clock.now = made.next_at
    assert await q.fire_schedules() == 1
    assert (await q.schedules())[0].next_at == made.next_at + 3600


async def test_schedules_are_replaced_and_removed_by_name(q: Any, clock: FakeClock) -> None:
    await q.schedule("s", "g", 1, every=10)
    await q.schedule("s", "g", 2, every=20)
    [schedule] = await q.schedules()
    assert (schedule.event, schedule.every) == (2, 20)
    assert await q.unschedule("s") is True
    assert await q.unschedule("s") is False
    assert await q.schedules() == []


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({}, InvalidArgument),
        ({"every": 10, "cron": "* * * * *"}, InvalidArgument),
        ({"every": 0}, InvalidArgument),
        ({"every": float("nan")}, InvalidArgument),
        ({"cron": "every tuesday"}, InvalidArgument),
        ({"cron": 5}, InvalidArgument),
        ({"every": 10, "catch_up": "yes"}, InvalidArgument),
        ({"every": 10, "start_at": float("inf")}, InvalidArgument),
    ],
)
async def test_bad_schedules_are_refused(q: Any, options: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        await q.schedule("s", "g", 1, **options)
    assert await q.schedules() == []


@pytest.mark.parametrize(
    "options",
    [
        {"delay": 5, "not_before": 1.0},
        {"delay": -1},
        {"delay": float("nan")},
        {"not_before": float("inf")},
        {"ttl": 0},
        {"ttl": float("nan")},
        {"ttl": "5"},
    ],
)
async def test_bad_times_are_refused_and_publish_nothing(q: Any, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        await q.publish("g", 1, **options)
    with pytest.raises(InvalidArgument):
        await q.publish_many([{"group_id": "g", "event": 1, **options}])
    assert (await q.stats()).depth == 0
