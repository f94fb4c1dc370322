"""Tenants and weighted fair share (docs/contract.md, guarantee 16), on every backend, sync and
async: a group's tenant (given, by the queue's rule, or the default), kept while the group has
messages; claims shared between tenants by weight whatever their numbers of groups (exactly, in
the order stride scheduling gives, within each shard of a sharded queue); an idle tenant banks
no credit; the priority floor before fairness."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from rqlite_queue import InvalidArgument
from rqlite_queue.errors import TenantMismatch

from .conftest import per_shard


def tenant_of(group_id: str) -> str:
    return group_id.split("-")[0]


async def drain_one_by_one(q: Any, rounds: int) -> list[str]:
    """Claim one message at a time and ack it at once: the groups served, in order."""
    served = []
    for _ in range(rounds):
        lease = await q.claim("w", 30)
        assert lease is not None
        served.append(lease.group_id)
        await q.ack(lease)
    return served


def by_tenant(q: Any, tenants: dict[str, tuple[int, int]]) -> list[dict[str, Any]]:
    """`tenants`: name -> (groups, messages per group); the items publishing them, groups
    named "<tenant>-<i>", interleaved so that no tenant is first by creation order."""
    items = []
    most = max(groups for groups, _ in tenants.values())
    for i in range(most):
        for name, (groups, per_group) in tenants.items():
            if i < groups:
                items += [
                    {"group_id": f"{name}-{i}", "event": k, "tenant": name}
                    for k in range(per_group)
                ]
    return items


async def test_a_groups_tenant_is_given_or_derived_by_the_rule_or_the_default(q: Any) -> None:
    await q.publish("plain", 1)
    await q.publish("acme:a", 2)  # no rule yet: the default tenant
    await q.set_tenant_rule(":")
    await q.publish("acme:b", 3)
    await q.publish("globex:c", 4, tenant="initech")  # given beats the rule
    await q.publish(":d", 5)  # nothing before the separator: the default
    await q.publish_many([{"group_id": "x", "event": 6, "tenant": "hooli"}])
    tenants = {t.name: t for t in await q.tenants()}
    assert {name: t.groups for name, t in tenants.items() if t.groups} == {
        "": 3,
        "acme": 1,
        "initech": 1,
        "hooli": 1,
    }
    assert {name: (t.depth, t.ready, t.in_flight) for name, t in tenants.items()}["acme"] == (
        1,
        1,
        0,
    )
    await q.set_tenant_rule(None)
    await q.publish("acme:e", 7)
    assert {t.name: t.groups for t in await q.tenants()}[""] == 4


async def test_a_group_keeps_its_tenant_while_it_has_messages(q: Any) -> None:
    await q.publish("g", 1, tenant="a")
    await q.publish("g", 2)  # no tenant named: the group's
    await q.publish("g", 3, tenant="a")
    with pytest.raises(TenantMismatch):
        await q.publish("g", 4, tenant="b")
    with pytest.raises(TenantMismatch):
        await q.publish_many([("other", 5), {"group_id": "g", "event": 6, "tenant": "b"}])
    with pytest.raises(TenantMismatch) as raised:
        await q.publish_many(
            [
                {"group_id": "n", "event": 7, "tenant": "a"},
                {"group_id": "n", "event": 8, "tenant": "b"},
            ]
        )
    assert raised.value.index == 1
    assert [e for _, e in await q.peek("g")] == [1, 2, 3]
    assert await q.peek("n") == []
    if len(per_shard(q, ["other", "g"])) == 1:  # publish_many is atomic per shard
        assert await q.peek("other") == []
    while await q.peek("g"):
        lease = await q.claim("w", 30)
        await q.ack(lease)
    await q.publish("g", 9, tenant="b")  # emptied: the publish that refills it decides
    assert {t.name: t.groups for t in await q.tenants()}.get("b") == 1


async def test_claims_are_shared_by_weight_whatever_the_number_of_groups(q: Any) -> None:
    """Tenant a has 50 groups, b, c and d 5 each; weights 1, 1, 2, 4. Claimed one at a time:
    each window of 8 claims (a whole turn of the weights) gives each its weight exactly, as
    long as all have work (within each shard of a sharded queue, whose order is its own)."""
    await q.set_tenant("c", weight=2)
    await q.set_tenant("d", weight=4)
    await q.publish_many(by_tenant(q, {"a": (50, 1), "b": (5, 8), "c": (5, 8), "d": (5, 8)}))
    served = await drain_one_by_one(q, 64)
    for shard, groups in per_shard(q, served).items():
        windows = [Counter(map(tenant_of, groups[i : i + 8])) for i in range(0, len(groups) - 7, 8)]
        assert windows, shard
        for window in windows:
            assert window == {"a": 1, "b": 1, "c": 2, "d": 4}, (shard, windows)


async def test_within_a_tenant_groups_stay_round_robin(q: Any) -> None:
    await q.publish_many(by_tenant(q, {"a": (3, 3), "b": (1, 9)}))
    served = await drain_one_by_one(q, 12)
    for _, groups in per_shard(q, served).items():
        mine = [g for g in groups if tenant_of(g) == "a"]
        assert mine == sorted(set(mine), key=mine.index) * (len(mine) // len(set(mine)))


async def test_an_idle_tenant_banks_no_credit(q: Any) -> None:
    """b has no work while a is served 40 times; then b publishes to 20 groups: from then on
    the two alternate (b does not get 40 claims in a row to catch up)."""
    await q.publish_many(by_tenant(q, {"a": (10, 10)}))
    await drain_one_by_one(q, 40)
    await q.publish_many(by_tenant(q, {"b": (20, 1)}))
    served = await drain_one_by_one(q, 20)
    for _, groups in per_shard(q, served).items():
        tenants = "".join(map(tenant_of, groups))
        assert "bbb" not in tenants and "aaa" not in tenants, tenants


async def test_the_priority_floor_comes_before_fair_share(q: Any) -> None:
    """A claim with `min_priority` takes the high-priority group whatever its tenant's share;
    the claim counts toward that share."""
    await q.set_tenant("heavy", weight=100)
    await q.publish_many(by_tenant(q, {"heavy": (5, 1)}))
    await q.publish("light-0", 1, 3, tenant="light")
    lease = await q.claim("w", 30, min_priority=3)
    assert lease.group_id == "light-0"
    lease = await q.claim("w", 30)
    assert tenant_of(lease.group_id) == "heavy"


async def test_follow_ups_and_transactions_name_tenants(q: Any) -> None:
    await q.publish("in", 1)
    lease = await q.claim("w", 30)
    await q.ack(lease, publish=[{"group_id": "out", "event": 2, "tenant": "t"}])
    assert {t.name: t.groups for t in await q.tenants()}.get("t") == 1


async def test_tenants_are_paged_by_name(q: Any) -> None:
    await q.publish_many([{"group_id": f"g{i}", "event": i, "tenant": f"t{i}"} for i in range(5)])
    first = await q.tenants(limit=3)
    assert [t.name for t in first] == ["", "t0", "t1"]
    rest = await q.tenants(limit=10, after=first[-1].name)
    assert [t.name for t in rest] == ["t2", "t3", "t4"]


@pytest.mark.parametrize(
    "call",
    [
        lambda q: q.publish("g", 1, tenant=""),
        lambda q: q.publish("g", 1, tenant=7),
        lambda q: q.publish("g", 1, tenant="a\x00b"),
        lambda q: q.publish_many([{"group_id": "g", "event": 1, "tenant": ["x"]}]),
        lambda q: q.set_tenant("t", weight=0),
        lambda q: q.set_tenant("t", weight=float("nan")),
        lambda q: q.set_tenant("t", weight="2"),
        lambda q: q.set_tenant(None, weight=2),
        lambda q: q.set_tenant_rule("::"),
        lambda q: q.set_tenant_rule(""),
        lambda q: q.tenants(limit=0),
        lambda q: q.tenants(after=3),
    ],
)
async def test_bad_tenant_arguments_are_refused(q: Any, call: Any) -> None:
    with pytest.raises(InvalidArgument):
        await call(q)
    assert (await q.stats()).depth == 0
    assert [(t.name, t.weight) for t in await q.tenants()] == [("", 1.0)]


async def test_a_client_learns_from_its_claims_that_another_turned_tenants_on(
    make_queue: Any,
) -> None:
    """Tenants cost nothing until used: a client claims in plain round-robin order until its
    claims' rows say the queue's tenants are on (here another client turned them on), then
    shares by weight."""
    worker, admin = await make_queue(), await make_queue()
    await admin.set_tenant("heavy", weight=100)
    await admin.publish_many(by_tenant(admin, {"heavy": (10, 3), "light": (10, 3)}))
    served = [tenant_of(g) for g in await drain_one_by_one(worker, 14)]
    # One claim per shard may be plain; after that, light gets about one claim in 101.
    assert served[2:].count("light") <= 2, served
