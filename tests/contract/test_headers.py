"""Message headers (docs/howto/tracing.md), on every backend, sharded queues included, sync and
async: given to every publish path, stored with the message, returned on `Lease.headers` and
`DeadLetter.headers` (read-only, empty when none), kept through a dead letter's requeue, a
debounced replacement, a follow-up forwarded from another shard's outbox; bad ones refused
with `InvalidHeaders` before anything is written."""

from __future__ import annotations

from typing import Any

import pytest

from rqlite_queue.errors import InvalidArgument, InvalidHeaders
from rqlite_queue.types import MAX_HEADERS, MAX_HEADERS_BYTES


async def claim_all(q: Any) -> dict[str, Any]:
    return {lease.group_id: lease for lease in await q.claim_many("w", 30, 100)}


async def test_headers_go_with_their_message_on_every_publish_path(q: Any) -> None:
    await q.publish("one", 1, headers={"trace": "t-1", "é": "ü"})
    await q.publish_many(
        [
            {"group_id": "many", "event": 2, "headers": {"k": "v"}},
            ("bare", 3),
            {"group_id": "debounced", "event": "first", "debounce": "d", "headers": {"n": "1"}},
        ]
    )
    # A debounced publish replaces its pending message: its headers too.
    await q.publish("debounced", "last", debounce="d", headers={"n": "2"})
    async with q.transaction() as tx:
        tx.publish("in-tx", 4, headers={"tx": "yes"})
    claimed = await claim_all(q)
    assert {g: dict(lease.headers) for g, lease in claimed.items()} == {
        "one": {"trace": "t-1", "é": "ü"},
        "many": {"k": "v"},
        "bare": {},
        "debounced": {"n": "2"},
        "in-tx": {"tx": "yes"},
    }
    assert claimed["debounced"].event == "last"
    with pytest.raises(TypeError):
        claimed["one"].headers["trace"] = "changed"  # read-only
    # Follow-ups keep theirs: to groups spread over the shards of a sharded queue (those of
    # another shard go through the outbox).
    follow = [{"group_id": f"f{i}", "event": i, "headers": {"i": str(i)}} for i in range(8)]
    await q.ack(claimed["one"], publish=follow)
    # A dead letter keeps its message's headers, and so does its requeue.
    await q.dead_letter(claimed["many"], "boom")
    [dead] = await q.dead_letters()
    assert (dead.reason, dict(dead.headers)) == ("boom", {"k": "v"})
    assert await q.requeue_dead() == 1
    again = await claim_all(q)
    assert dict(again["many"].headers) == {"k": "v"}
    assert {g: dict(again[g].headers) for g in again if g.startswith("f")} == {
        f"f{i}": {"i": str(i)} for i in range(8)
    }


@pytest.mark.parametrize(
    "bad",
    [
        ["not", "a mapping"],
        {"k": 1},
        {1: "v"},
        {"": "v"},
        {"k": "a\x00b"},
        {"k": "\ud800"},
        {str(i): "" for i in range(MAX_HEADERS + 1)},
        {"k": "v" * MAX_HEADERS_BYTES},
    ],
    ids=["list", "int-value", "int-key", "empty-key", "nul", "surrogate", "count", "size"],
)
async def test_bad_headers_are_refused_before_anything_is_written(q: Any, bad: Any) -> None:
    with pytest.raises(InvalidHeaders):
        await q.publish("g", 1, headers=bad)
    with pytest.raises(InvalidHeaders) as refused:
        await q.publish_many([("g", 1), {"group_id": "g", "event": 2, "headers": bad}])
    assert refused.value.index == 1
    assert isinstance(refused.value, InvalidArgument)
    stats = await q.stats()
    assert (stats.depth, stats.last_seq) == (0, 0)
    # As a follow-up: the ack is refused with it, and its lease still holds.
    await q.publish("h", 1)
    lease = await q.claim("w", 30)
    with pytest.raises(InvalidHeaders):
        await q.ack(lease, publish=[{"group_id": "next", "event": 1, "headers": bad}])
    await q.ack(lease)
    assert (await q.stats()).depth == 0


async def test_headers_at_the_limits_are_taken(q: Any) -> None:
    most = {f"k{i:02}": "" for i in range(MAX_HEADERS)}
    # {"k":"vvv..."}: 8 bytes of JSON around the value.
    largest = {"k": "v" * (MAX_HEADERS_BYTES - 8)}
    await q.publish_many(
        [
            {"group_id": "most", "event": 1, "headers": most},
            {"group_id": "largest", "event": 2, "headers": largest},
        ]
    )
    claimed = await claim_all(q)
    assert dict(claimed["most"].headers) == most
    assert dict(claimed["largest"].headers) == largest
