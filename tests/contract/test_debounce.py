"""Debounce (docs/contract.md, guarantee 25), on every backend, sync and async, with the fake
clock: a publish with a debounce key replaces its group's pending message with the same key
(its seq and place kept; its event, ttl and due time replaced), never one the group has
delivered; with a delay, each publish pushes delivery back, never past `max_wait` after the
run's first; FIFO, exclusivity and fencing unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from rqlite_queue import InvalidArgument

from .conftest import FakeClock


async def events(q: Any, group_id: str) -> list[Any]:
    return [event for _, event in await q.peek(group_id, 100)]


async def test_a_debounced_publish_replaces_the_pending_message_in_its_place(q: Any) -> None:
    await q.publish("g", "first")
    seq = await q.publish("g", {"v": 1}, debounce="refresh")
    await q.publish("g", "after")
    assert await q.publish("g", {"v": 2}, debounce="refresh") == seq
    assert await q.publish("g", {"v": 3}, debounce="other") != seq
    assert await events(q, "g") == ["first", {"v": 2}, "after", {"v": 3}]
    assert await q.publish("h", {"v": 1}, debounce="refresh") != seq  # per group


async def test_a_delivered_message_is_never_replaced(q: Any) -> None:
    first = await q.publish("g", {"v": 1}, debounce="k")
    lease = await q.claim("w", 30)
    assert lease.seq == first
    second = await q.publish("g", {"v": 2}, debounce="k")
    assert second != first
    await q.nack(lease)  # delivered once: still not replaceable
    assert await q.publish("g", {"v": 3}, debounce="k") == second
    lease = await q.claim("w", 30)
    assert (lease.seq, lease.event, lease.attempts) == (first, {"v": 1}, 2)
    await q.ack(lease)
    lease = await q.claim("w", 30)
    assert (lease.seq, lease.event) == (second, {"v": 3})


async def test_each_publish_of_a_run_pushes_delivery_back_up_to_max_wait(
    q: Any, clock: FakeClock
) -> None:
    start = clock.now
    seq = await q.publish("g", 1, debounce="k", delay=10, max_wait=25)
    for step in range(1, 4):
        clock.advance(8)
        assert await q.claim("w", 30) is None
        assert await q.publish("g", step + 1, debounce="k", delay=10, max_wait=25) == seq
    # Published last at start + 24: due at start + 34 without the bound, at start + 25 with it.
    probe = await q.probe()
    assert probe.next_due == pytest.approx(start + 25)
    clock.advance(start + 25 - clock.now)
    lease = await q.claim("w", 30)
    assert (lease.seq, lease.event) == (seq, 4)


async def test_an_undelayed_replacement_makes_a_waiting_head_claimable(
    q: Any, clock: FakeClock
) -> None:
    await q.publish("g", 1, debounce="k", delay=60)
    assert await q.claim("w", 30) is None
    await q.publish("g", 2, debounce="k")
    lease = await q.claim("w", 30)
    assert lease is not None and lease.event == 2
    # And a delayed replacement makes a claimable head wait.
    await q.publish("h", 1, debounce="k")
    await q.publish("h", 2, debounce="k", delay=5)
    await q.ack(lease)
    assert await q.claim("w", 30) is None
    clock.advance(5)
    assert (await q.claim("w", 30)).event == 2


async def test_publish_many_folds_a_key_repeated_in_a_group(q: Any) -> None:
    seqs = await q.publish_many(
        [
            {"group_id": "g", "event": 1, "debounce": "k"},
            {"group_id": "g", "event": "plain"},
            {"group_id": "g", "event": 2, "debounce": "k"},
            {"group_id": "h", "event": 3, "debounce": "k"},
        ]
    )
    assert seqs[0] == seqs[2] and len(set(seqs)) == 3
    assert await events(q, "g") == [2, "plain"]
    again = await q.publish_many([{"group_id": "g", "event": 4, "debounce": "k"}, ("g", "x")])
    assert again[0] == seqs[0]
    assert await events(q, "g") == [4, "plain", "x"]


async def test_publish_many_never_folds_a_debounce_key_into_a_dedup_id(q: Any) -> None:
    # Found by the stateful model: keyed ("d", id) and (group, key), group "d"'s key "x"
    # folded into dedup id "x" and the second message was lost.
    seqs = await q.publish_many(
        [
            {"group_id": "d", "event": 1, "debounce": "x"},
            {"group_id": "g", "event": 2, "dedup_id": "x"},
        ]
    )
    assert seqs[0] != seqs[1]
    assert await events(q, "d") == [1]
    assert await events(q, "g") == [2]


async def test_a_replacement_takes_the_new_ttl(q: Any, clock: FakeClock) -> None:
    await q.publish("g", 1, debounce="k", ttl=5)
    await q.publish("g", 2, debounce="k", ttl=50)
    clock.advance(10)
    lease = await q.claim("w", 30)
    assert lease is not None and lease.event == 2


@pytest.mark.parametrize(
    "options",
    [
        {"debounce": "k", "dedup_id": "d"},
        {"max_wait": 5},
        {"debounce": "", "delay": 1},
        {"debounce": 7},
        {"debounce": "k", "max_wait": -1},
    ],
)
async def test_bad_debounce_arguments_are_refused(q: Any, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        await q.publish("g", 1, **options)
    assert (await q.stats()).depth == 0


async def test_follow_ups_cannot_debounce(q: Any) -> None:
    await q.publish("g", 1)
    lease = await q.claim("w", 30)
    with pytest.raises(InvalidArgument):
        await q.ack(lease, publish=[{"group_id": "h", "event": 2, "debounce": "k"}])
    await q.ack(lease)
