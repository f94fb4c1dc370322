"""Exactly-once effects inside the queue (docs/effects.md), on every backend, sharded queues
included, sync and async: follow-ups published with a settlement, only if it applies, once
whatever reply was lost; and publishes inside the caller's own transaction."""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
import time
import uuid
from typing import Any

import pytest

from rqlite_queue import InvalidArgument, LeaseLost, OutcomeUnknown, QueueError, Transport

from .conftest import FakeClock, lose, taken_over


async def peek_all(q: Any, *groups: str) -> dict[str, list[Any]]:
    return {g: [e for _, e in await q.peek(g, 100)] for g in groups}


async def test_an_ack_publishes_its_follow_ups_in_the_same_transaction(q: Any) -> None:
    await q.publish("order", "charge")
    lease = await q.claim("w", 30)
    await q.ack(
        lease,
        publish=[
            ("order", "ship"),  # its own group: after the acked message
            ("billing", {"invoice": 1}, 3),
            {"group_id": "mail", "event": "sent", "dedup_id": "mail-1"},
            {"group_id": "later", "event": "remind", "delay": 60},
        ],
    )
    assert await peek_all(q, "order", "billing", "mail", "later") == {
        "order": ["ship"],
        "billing": [{"invoice": 1}],
        "mail": ["sent"],
        "later": ["remind"],
    }
    stats = await q.stats()
    assert (stats.depth, stats.delayed, stats.by_priority.get(3)) == (4, 1, 1)
    claimed = {lease.group_id: lease for lease in await q.claim_many("w", 30, 10)}
    assert set(claimed) == {"order", "billing", "mail"}  # "later" waits for its delay
    # The follow-up's dedup id is remembered, as a publish's is.
    assert await q.publish("mail", "sent", dedup_id="mail-1") == claimed["mail"].seq


async def test_a_lost_lease_publishes_no_follow_up(q: Any, clock: FakeClock) -> None:
    await q.publish("g", 1)
    lease = await q.claim("w", 10)
    clock.advance(11)
    taker = await q.claim("other", 30)
    assert taker is not None
    with pytest.raises(LeaseLost):
        await q.ack(lease, publish=[("next", "should not exist")])
    with pytest.raises(LeaseLost):
        await q.dead_letter(lease, "x", publish=[("next", "nor this")])
    assert await q.peek("next") == []
    await q.ack(taker, publish=[("next", "from the holder")])
    assert [e for _, e in await q.peek("next")] == ["from the holder"]


async def test_a_dead_letter_publishes_its_follow_ups(q: Any) -> None:
    await q.publish("g", "poison")
    lease = await q.claim("w", 30)
    await q.dead_letter(lease, "bad input", publish=[("alerts", {"seq": lease.seq})])
    assert [d.reason for d in await q.dead_letters()] == ["bad input"]
    assert [e for _, e in await q.peek("alerts")] == [{"seq": lease.seq}]


async def test_follow_ups_sent_again_after_a_lost_reply_are_published_once(q: Any) -> None:
    await q.publish("g", 1)
    lease = await q.claim("w", 30)
    lose(q, ("apply", None))
    await q.ack(lease, publish=[("next", "once"), ("g", "again")])
    assert await peek_all(q, "next", "g") == {"next": ["once"], "g": ["again"]}


async def test_follow_ups_of_a_lease_taken_over_before_the_resend_are_not_published(
    q_and_other: tuple[Any, Transport], clock: FakeClock
) -> None:
    q, other = q_and_other
    await q.publish("g", 1)
    lease = await q.claim("w", 30)
    lose(q, ("drop", taken_over(lambda: other, clock, "g")))
    with pytest.raises(LeaseLost):
        await q.ack(lease, publish=[("next", "never")])
    assert await q.peek("next") == []


async def test_a_round_publishes_the_follow_ups_of_the_settlements_that_applied(
    q: Any, clock: FakeClock
) -> None:
    await q.publish_many([("a", 1), ("b", 2)])
    a = await q.claim("w", 10)
    b = await q.claim("w", 100)
    clock.advance(11)
    await q.claim("other", 30)  # takes a over
    result = await q.settle_and_claim(
        "w", 30, 0, ack=[a, b], publish=[(a, [("from-a", 1)]), (b, [("from-b", 2)])]
    )
    assert result.lost == [a]
    assert await peek_all(q, "from-a", "from-b") == {"from-a": [], "from-b": [2]}


async def test_a_lease_named_again_in_a_round_publishes_its_follow_ups_once(q: Any) -> None:
    """A lease acked three times in one round (and dead-lettered too): its first mention
    settles it and publishes its follow-ups (to its own group, and to others: on a sharded
    queue, some through the outbox to the other shard), once; the others are reported lost."""
    await q.publish("a", "first")
    lease = await q.claim("w", 30)
    follow = [("a", "next"), ("b", 1), ("c", 2), ("d", 3), ("e", 4)]
    result = await q.settle_and_claim(
        "w",
        30,
        3,
        ack=[lease, lease, lease],
        dead=[(lease, "again")],
        publish=[(lease, follow)],
    )
    assert result.lost == [lease] * 3
    assert await q.dead_letters() == []
    claimed = [(x.group_id, x.event) for x in result.leases]
    claimed += [(x.group_id, x.event) for x in await q.claim_many("w", 30, 10)]
    assert sorted(claimed) == sorted(follow)
    assert await q.claim_many("w", 30, 10) == []
    stats = await q.stats()
    assert (stats.depth, stats.outbox) == (5, 0)


@pytest.mark.parametrize(
    "publish",
    [
        pytest.param(lambda a, b: [(b, [("x", 1)])], id="a lease not settled in the round"),
        pytest.param(
            lambda a, b: [
                (a, [{"group_id": "x", "event": 1, "dedup_id": "d"}]),
                (b, [{"group_id": "y", "event": 2, "dedup_id": "d"}]),
            ],
            id="one dedup id in two leases' follow-ups",
        ),
        pytest.param(lambda a, b: [(a, "not items")], id="not a list of items"),
        pytest.param(lambda a, b: [(a, [("x", object())])], id="an event the codec refuses"),
        pytest.param(lambda a, b: [(a, [("x", 1)]), (a, [("y", 2)])], id="a lease named twice"),
    ],
)
async def test_bad_follow_ups_are_refused_before_anything_is_written(q: Any, publish: Any) -> None:
    await q.publish_many([("a", 1), ("b", 2)])
    a = await q.claim("w", 30)
    b = await q.claim("w", 30)
    before = await q.stats()
    with pytest.raises(InvalidArgument):
        await q.settle_and_claim("w", 30, 0, ack=[a], nack=[(b, 0)], publish=publish(a, b))
    assert await q.stats() == before
    await q.ack(a)  # still held: nothing happened


async def test_checked_follow_ups_are_taken_as_they_are(q: Any) -> None:
    """`check_publish_many` returns the items checked and encoded; `publish=` takes them
    without checking again (a Worker checks its handlers' follow-ups when they return). Only
    the queue that checked them takes them."""
    checked = q.check_publish_many(
        [("next", {"n": 1}), {"group_id": "mail", "event": "m", "dedup_id": "mail-7"}]
    )
    if inspect.isawaitable(checked):  # the sync queue, seen through the async wrapper
        checked = await checked
    assert len(checked) == 2 and len(checked.dedup_ids) == 1
    await q.publish_many([("g", 1), ("g", 2)])
    lease = await q.claim("w", 30)
    with Transport.from_url("sqlite:///:memory:", queue="other") as other:
        foreign = other.check_publish_many([("next", "from another queue")])
    with pytest.raises(InvalidArgument, match="another queue"):
        await q.ack(lease, publish=foreign)
    await q.ack(lease, publish=checked)
    assert await peek_all(q, "next", "mail") == {"next": [{"n": 1}], "mail": ["m"]}
    assert await q.publish("mail", "again", dedup_id="mail-7") == (await q.peek("mail"))[0][0]
    [lease] = [x for x in await q.claim_many("w", 30, 10) if x.group_id == "g"]
    result = await q.settle_and_claim("w", 30, 0, ack=[lease], publish=[(lease, checked)])
    assert not result.lost
    assert len(await q.peek("next")) == 2  # the same checked items, published again


async def test_chained_follow_ups_keep_each_groups_order(q: Any) -> None:
    """Hops that each publish the next step of several chains: every chain's steps arrive in
    order, once (on a sharded queue, across shards through the outbox)."""
    chains = [f"chain-{i}" for i in range(6)]
    await q.publish_many([(c, 0) for c in chains])
    seen: dict[str, list[int]] = {c: [] for c in chains}
    while leases := await q.claim_many("w", 30, 10):
        for lease in leases:
            seen[lease.group_id].append(lease.event)
            follow = [(lease.group_id, lease.event + 1)] if lease.event < 4 else []
            await q.ack(lease, publish=follow)
    assert seen == {c: [0, 1, 2, 3, 4] for c in chains}
    assert (await q.stats()).outbox == 0


# ------------------------------------------------------------------ the caller's transaction


async def create_table(q: Any, ddl: str) -> None:
    """The caller's table, in the queue's database (on a sharded queue: on every shard, since
    a transaction runs on the shard of its publishes' groups)."""
    transport = getattr(q, "sync", q)
    if not hasattr(transport, "names"):
        async with q.transaction() as tx:
            tx.execute(ddl)
        return
    for name in transport.names:
        shard = transport.shard(name)
        if transport is q and not hasattr(q, "sync"):
            async with shard.transaction() as tx:
                tx.execute(ddl)
        else:
            with shard.transaction() as tx:
                tx.execute(ddl)


async def test_a_transaction_applies_its_statements_and_publishes_together(q: Any) -> None:
    table = f"app_{uuid.uuid4().hex[:8]}"
    await create_table(q, f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, what TEXT)")
    async with q.transaction() as tx:
        tx.execute(f"INSERT INTO {table} (what) VALUES (?)", ["book"])
        one = tx.publish("order-1", {"charge": 1})
        many = tx.publish_many([("order-1", {"ship": 1}), ("order-1", {"mail": 1})])
    assert [seq for seq, _ in await q.peek("order-1")] == [one.seq, *many.seqs]
    with pytest.raises(RuntimeError):
        async with q.transaction() as tx:
            tx.execute(f"INSERT INTO {table} (what) VALUES (?)", ["pen"])
            tx.publish("order-1", {"never": 1})
            raise RuntimeError("the application failed: nothing is sent")
    assert len(await q.peek("order-1")) == 3
    # A statement that fails takes the publishes with it.
    with pytest.raises(Exception, match=r"(?i)constraint|unique"):
        async with q.transaction() as tx:
            tx.publish("order-1", {"never": 2})
            tx.execute(f"INSERT INTO {table} (id, what) VALUES (1, 'duplicate key')")
    assert len(await q.peek("order-1")) == 3


async def test_a_statement_that_does_not_compile_takes_the_publishes_with_it(q: Any) -> None:
    """All or nothing, whatever fails: on rqlite v8, /db/request went on past a statement that
    does not compile and committed the rest (the publish was in the queue, the caller told
    the transaction failed)."""
    with pytest.raises(QueueError, match="no such table"):
        async with q.transaction() as tx:
            tx.publish("order-0", "never")
            tx.execute("INSERT INTO no_such_table (what) VALUES ('book')")
    assert await q.peek("order-0") == []
    assert (await q.stats()).depth == 0


async def test_a_transaction_with_dedup_ids_applies_once(q: Any) -> None:
    """Sent again (a lost reply, or the caller's retry): it applied already, so none of it
    applies again, and its publishes report their first seqs."""
    table = f"app_{uuid.uuid4().hex[:8]}"
    await create_table(q, f"CREATE TABLE {table} (what TEXT)")

    async def order() -> Any:
        async with q.transaction() as tx:
            tx.execute(f"INSERT INTO {table} (what) VALUES ('book')")
            published = tx.publish("order-2", "charge", dedup_id="order-2/charge")
        return published

    lose(q, ("apply", None))
    first = await order()
    again = await order()
    assert first.seq == again.seq
    assert [e for _, e in await q.peek("order-2")] == ["charge"]
    async with q.transaction() as tx:  # the table's rows: one book
        tx.execute(f"DELETE FROM {table} WHERE what = 'book'")
        gone = tx.publish("counted", 1)
    assert gone.seq > 0


async def test_a_transaction_without_dedup_ids_is_not_sent_again(q: Any) -> None:
    lose(q, ("apply", None))
    with pytest.raises(OutcomeUnknown):
        async with q.transaction() as tx:
            tx.publish("order-3", "charge")
    await answering_again(q)
    assert [e for _, e in await q.peek("order-3")] == ["charge"]  # it did apply


async def answering_again(q: Any) -> None:
    """A sharded queue marks a shard whose reply was lost as down, until a background probe
    finds it answering (half a second): wait for that."""
    transport = getattr(q, "sync", q)
    give_up = time.monotonic() + 10
    while getattr(transport, "down_shards", list)() and time.monotonic() < give_up:
        await asyncio.sleep(0.05)


async def test_a_sharded_transaction_stays_on_one_shard(q: Any) -> None:
    transport = getattr(q, "sync", q)
    if not hasattr(transport, "shard_of"):
        pytest.skip("one cluster: any groups")
    here = "g0"
    there = next(
        f"g{i}" for i in range(1, 100) if transport.shard_of(f"g{i}") != transport.shard_of(here)
    )
    before = await q.stats()
    with pytest.raises(InvalidArgument, match="one shard"):
        async with q.transaction() as tx:
            tx.publish(here, 1)
            tx.publish(there, 2)
    assert await q.stats() == before


async def test_publish_in_the_callers_connection_is_for_the_embedded_queue(
    q: Any, url: str, tmp_path: Any
) -> None:
    if not url.startswith("sqlite") or hasattr(getattr(q, "sync", q), "shard_of"):
        with pytest.raises(InvalidArgument, match="embedded"):
            await q.publish("g", 1, connection=sqlite3.connect(":memory:"))
        return
    path = url.removeprefix("sqlite:///")
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE IF NOT EXISTS orders (what TEXT)")
    conn.commit()
    conn.execute("INSERT INTO orders VALUES ('book')")
    seq = await q.publish("g", "charge", connection=conn)
    assert await q.peek("g") == []  # not before the caller commits
    conn.commit()
    assert await q.peek("g") == [(seq, "charge")]
    conn.execute("INSERT INTO orders VALUES ('pen')")
    await q.publish_many([("g", "x"), ("h", "y")], connection=conn)
    conn.rollback()
    assert [e for _, e in await q.peek("g")] == ["charge"] and await q.peek("h") == []
    with conn:  # the first write in Python's default transaction mode: it begins one
        first = await q.publish("g", "first write", connection=conn)
        conn.execute("INSERT INTO orders VALUES ('cup')")
    assert (first, "first write") in await q.peek("g")
    with pytest.raises(RuntimeError), conn:  # ... and an exception in the block takes it back
        await q.publish("g", "taken back", connection=conn)
        raise RuntimeError
    assert "taken back" not in [e for _, e in await q.peek("g")]
    autocommit = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(InvalidArgument, match="no open transaction"):
        await q.publish("g", 1, connection=autocommit)
    autocommit.close()
    other = sqlite3.connect(str(tmp_path / "other.db"))
    other.execute("CREATE TABLE t (x)")
    other.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(InvalidArgument, match="not to the queue's file"):
        await q.publish("g", 1, connection=other)
