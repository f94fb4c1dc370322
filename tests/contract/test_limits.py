"""Limits per tenant (docs/contract.md, guarantee 24), on every backend, sync and async, with
the fake clock: a cap on groups in flight (a lapsed lease frees its slot), a rate limit (a token
bucket every claim draws from; the probe says when the next token comes), settings kept until
changed, `math.inf` removing a limit. On a sharded queue each shard enforces them on its own
groups: the expectations are per shard."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import pytest

from rqlite_queue import InvalidArgument
from rqlite_queue.errors import QueueFull

from .conftest import FakeClock, per_shard
from .test_tenants import by_tenant, tenant_of


def allowed(q: Any, groups: list[str], limit: int) -> int:
    """How many of `groups` a per-shard limit of `limit` lets through at once."""
    return sum(min(limit, len(mine)) for mine in per_shard(q, groups).values())


def names(tenant: str, count: int) -> list[str]:
    return [f"{tenant}-{i}" for i in range(count)]


def one_shard(q: Any, tenants: list[str]) -> list[str]:
    """A group name for each of `tenants` ("<tenant>-<i>", distinct), all on one shard."""
    candidates = [f"{t}-{i}" for i in range(64) for t in dict.fromkeys(tenants)]
    mine = max(per_shard(q, candidates).values(), key=len)
    chosen: list[str] = []
    for tenant in tenants:
        chosen.append(next(g for g in mine if tenant_of(g) == tenant and g not in chosen))
    return chosen


async def test_a_cap_bounds_a_tenants_groups_in_flight(q: Any) -> None:
    await q.set_tenant("a", max_in_flight=2)
    await q.publish_many(by_tenant(q, {"a": (6, 2), "b": (3, 2)}))
    leases = await q.claim_many("w", 30, 20)
    taken = Counter(tenant_of(lease.group_id) for lease in leases)
    assert taken == {"a": allowed(q, names("a", 6), 2), "b": 3}
    assert await q.claim_many("w", 30, 20) == []
    # An ack frees its slot (the next claim takes another of a's groups).
    done = next(lease for lease in leases if tenant_of(lease.group_id) == "a")
    await q.ack(done)
    more = await q.claim_many("w", 30, 20)
    assert [tenant_of(lease.group_id) for lease in more] == ["a"]
    info = {t.name: t for t in await q.tenants()}["a"]
    assert info.max_in_flight == 2 and info.in_flight == taken["a"]


async def test_a_lapsed_lease_frees_its_slot(q: Any, clock: FakeClock) -> None:
    await q.set_tenant("a", max_in_flight=1)
    await q.publish_many(by_tenant(q, {"a": (1, 1)}))
    await q.publish_many(by_tenant(q, {"a": (4, 1)})[1:])
    first = await q.claim_many("w", 10, 10)
    assert len(first) == allowed(q, names("a", 4), 1)
    assert await q.claim("w", 10) is None
    clock.advance(10.5)
    again = await q.claim_many("w", 10, 10)
    assert len(again) == len(first)


async def test_a_cap_of_zero_stops_a_tenant_and_inf_removes_it(q: Any) -> None:
    await q.set_tenant("a", max_in_flight=0)
    await q.publish_many(by_tenant(q, {"a": (3, 1)}))
    assert await q.claim("w", 30) is None
    assert not (await q.probe()).claimable
    await q.set_tenant("a", max_in_flight=math.inf)
    assert len(await q.claim_many("w", 30, 10)) == 3
    assert {t.name: t for t in await q.tenants()}["a"].max_in_flight is None


async def test_a_rate_limit_is_a_token_bucket_that_claims_draw_from(
    q: Any, clock: FakeClock
) -> None:
    """Rate 2/s, burst 3: a quiet tenant takes 3 at once, then one every half second; the
    probe says when the next token comes; tokens never pile up past the burst."""
    await q.set_tenant("a", rate=2, burst=3)
    await q.publish_many(by_tenant(q, {"a": (20, 1)}))
    groups = names("a", 20)
    assert len(await q.claim_many("w", 300, 20)) == allowed(q, groups, 3)
    assert await q.claim("w", 300) is None
    probe = await q.probe()
    assert not probe.claimable
    assert probe.next_due == pytest.approx(clock.now + 0.5)
    clock.advance(0.5)
    assert (await q.probe()).claimable
    assert len(await q.claim_many("w", 300, 20)) == allowed(q, groups, 1)
    clock.advance(100)
    assert len(await q.claim_many("w", 300, 20)) == allowed(q, groups, 3)
    info = {t.name: t for t in await q.tenants()}["a"]
    assert (info.rate, info.burst, info.tokens) == (2.0, 3.0, pytest.approx(0.0))


async def test_a_rate_limited_tenant_never_slows_the_others(q: Any) -> None:
    await q.set_tenant("slow", rate=1, burst=1)
    await q.publish_many(by_tenant(q, {"slow": (10, 1), "b": (5, 1), "c": (5, 1)}))
    leases = await q.claim_many("w", 30, 30)
    taken = Counter(tenant_of(lease.group_id) for lease in leases)
    assert taken == {"slow": allowed(q, names("slow", 10), 1), "b": 5, "c": 5}


async def test_the_floor_claim_keeps_to_the_limits(q: Any) -> None:
    await q.set_tenant("a", max_in_flight=1)
    await q.publish_many(
        [{"group_id": g, "event": 0, "priority": 4, "tenant": "a"} for g in names("a", 5)]
    )
    leases = await q.claim_many("w", 30, 10, min_priority=4)
    assert len(leases) == allowed(q, names("a", 5), 1)


async def test_a_tenant_out_of_allowance_never_crowds_the_others_out_of_a_floor_claim(
    q: Any,
) -> None:
    # Its groups come first in the level's round-robin order; the claim passes them over.
    await q.set_tenant("a", max_in_flight=0)
    await q.publish_many(
        [{"group_id": g, "event": 0, "priority": 4, "tenant": "a"} for g in names("a", 8)]
    )
    await q.publish_many(
        [{"group_id": g, "event": 0, "priority": 4, "tenant": "b"} for g in names("b", 3)]
    )
    leases = await q.claim_many("w", 30, 3, min_priority=4)
    assert sorted(lease.group_id for lease in leases) == names("b", 3)


async def test_settings_left_out_are_kept(q: Any) -> None:
    await q.set_tenant("a", weight=3, rate=5, max_in_flight=4, max_queued=100)
    await q.set_tenant("a", max_group_queued=10)
    await q.set_tenant("a", rate=math.inf)
    info = {t.name: t for t in await q.tenants()}["a"]
    assert (info.weight, info.rate, info.burst, info.tokens) == (3.0, None, None, None)
    assert (info.max_in_flight, info.max_queued, info.max_group_queued) == (4, 100, 10)
    await q.set_tenant("a", rate=0.5)  # a burst of at least one claim
    info = {t.name: t for t in await q.tenants()}["a"]
    shards = len(per_shard(q, names("x", 50)))  # each has its own bucket
    assert (info.rate, info.burst, info.tokens) == (0.5, 1.0, pytest.approx(shards))


async def test_a_client_that_has_not_learnt_tenants_are_on_keeps_to_the_limits(
    make_queue: Any,
) -> None:
    """A client set up before tenants were turned on claims as if they were off: that claim
    takes nothing, the client learns, and claims within the limits."""
    worker = await make_queue()
    await worker.publish("warm-up", 0)
    await worker.ack(await worker.claim("w", 30))
    admin = await make_queue()
    await admin.set_tenant("a", max_in_flight=1)
    await admin.publish_many(by_tenant(admin, {"a": (4, 1)}))
    leases = await worker.claim_many("w", 30, 10)
    assert len(leases) == allowed(worker, names("a", 4), 1)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"rate": 0},
        {"rate": -1},
        {"rate": "5"},
        {"rate": math.nan},
        {"burst": 0.5},
        {"burst": math.inf},
        {"max_in_flight": 1.5},
        {"max_in_flight": True},
        {"max_in_flight": -1},
        {"max_queued": "9"},
        {"max_group_queued": 2e9},
        {"weight": math.inf},
    ],
)
async def test_bad_limits_are_refused(q: Any, settings: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        await q.set_tenant("a", **settings)
    assert [t.name for t in await q.tenants()] == [""]


async def test_a_publish_over_a_groups_bound_raises_queue_full_and_writes_nothing(
    q: Any,
) -> None:
    await q.set_tenant("a", max_group_queued=2)
    await q.publish("a-0", 0, tenant="a")
    with pytest.raises(QueueFull) as caught:
        await q.publish_many([{"group_id": "a-0", "event": i, "tenant": "a"} for i in (1, 2)])
    assert (caught.value.tenant, caught.value.group_id, caught.value.limit) == ("a", "a-0", 2)
    assert [e for _, e in await q.peek("a-0")] == [0]
    await q.publish("a-0", 1)  # up to the bound; the group keeps its tenant
    await q.publish("a-1", 0, tenant="a")  # another group of the tenant has its own bound
    with pytest.raises(QueueFull):
        await q.publish("a-0", 2)
    await q.ack(await q.claim("w", 30))  # room again
    await q.publish("a-0", 2)
    assert (await q.stats()).depth == 3


async def test_a_publish_over_a_tenants_bound_raises_queue_full_and_writes_nothing(
    q: Any,
) -> None:
    """(On a sharded queue, the bound holds on each shard: the groups here share one.)"""
    a0, a1, a2, a3, a4, b0 = one_shard(q, ["a"] * 5 + ["b"])
    await q.set_tenant("a", max_queued=3)
    await q.publish_many([{"group_id": g, "event": 0, "tenant": "a"} for g in (a0, a1, a2)])
    before = (await q.stats()).depth
    with pytest.raises(QueueFull) as caught:
        await q.publish_many(
            [{"group_id": b0, "event": 0}, {"group_id": a3, "event": 0, "tenant": "a"}]
        )
    assert (caught.value.tenant, caught.value.group_id, caught.value.limit) == ("a", None, 3)
    assert (await q.stats()).depth == before
    await q.publish(b0, 0)  # other tenants are not bound by it
    # A tenant's bound counts the groups the rule gives it too.
    await q.set_tenant_rule("-")
    with pytest.raises(QueueFull):
        await q.publish(a4, 0)
    await q.set_tenant("a", max_queued=math.inf)
    await q.publish(a4, 0)


async def test_the_default_tenant_can_be_bounded_and_follow_ups_are_not(q: Any) -> None:
    """Follow-ups are work already admitted: a bound never makes an ack fail."""
    await q.set_tenant("", max_group_queued=1)
    await q.publish("g", 0)
    with pytest.raises(QueueFull):
        await q.publish("g", 1)
    lease = await q.claim("w", 30)
    others = [f"x{i}" for i in range(6)]  # on a sharded queue, some on another shard:
    await q.publish_many([(x, 0) for x in others])  # forwarded through the outbox
    await q.ack(lease, publish=[("g", 1), ("g", 2), *[(x, 1) for x in others]])
    assert [e for _, e in await q.peek("g")] == [1, 2]
    for x in others:
        assert [e for _, e in await q.peek(x)] == [0, 1]


async def test_a_paused_queue_does_not_report_a_token_already_there(
    q: Any, clock: FakeClock
) -> None:
    """The probe's next due time is never in the past for a bucket that has tokens: an idle
    Worker would wake (and write an empty claim) over and over while the queue is paused."""
    await q.set_tenant("a", rate=1, burst=1)
    await q.publish_many(by_tenant(q, {"a": (2, 1)}))
    await q.pause()
    clock.advance(5)
    probe = await q.probe()
    assert not probe.claimable and probe.next_due is None


async def test_a_client_that_has_not_learnt_tenants_are_on_keeps_to_the_bounds(
    make_queue: Any,
) -> None:
    """Its publishes assume no bounds (tenants off): once they are on, such a publish fails,
    writes nothing, and is made again with the bounds checked."""
    producer = await make_queue()
    await producer.publish("warm-up", 0)
    admin = await make_queue()
    await admin.set_tenant("", max_group_queued=1)
    with pytest.raises(QueueFull):
        await producer.publish("warm-up", 1)
    assert [e for _, e in await producer.peek("warm-up")] == [0]
