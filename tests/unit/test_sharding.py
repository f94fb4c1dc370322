"""The pure half of sharding (`rqlite_queue._protocol.sharding`): where groups live, parsing shard
lists, combining the shards' answers, the health of shards. No I/O."""

from __future__ import annotations

from collections import Counter

import pytest

from rqlite_queue import InvalidArgument
from rqlite_queue._protocol.retry import PROBE
from rqlite_queue._protocol.sharding import (
    Health,
    ShardSpec,
    home,
    is_sharded_url,
    merge_probes,
    merge_stats,
    parse_shard_list,
    ranking,
    rotation,
    scoped_dedup_id,
    shares,
)
from rqlite_queue.types import Probe, Stats

GROUPS = [f"workflow-{i}" for i in range(20_000)]


def homes(names: list[str]) -> dict[str, str]:
    return {g: home(g, names) for g in GROUPS}


def test_groups_spread_evenly_over_the_shards() -> None:
    counts = Counter(homes(["a", "b", "c"]).values())
    for name in "abc":
        assert abs(counts[name] / len(GROUPS) - 1 / 3) < 0.02, counts


def test_adding_a_shard_moves_only_the_groups_it_wins_about_one_in_k_plus_one() -> None:
    before, after = homes(["a", "b", "c"]), homes(["a", "b", "c", "d"])
    moved = [g for g in GROUPS if before[g] != after[g]]
    assert all(after[g] == "d" for g in moved)  # every moved group goes to the new shard
    assert abs(len(moved) / len(GROUPS) - 1 / 4) < 0.02


def test_removing_a_shard_moves_only_its_groups() -> None:
    before, after = homes(["a", "b", "c", "d"]), homes(["a", "b", "c"])
    assert all(before[g] == "d" for g in GROUPS if before[g] != after[g])


def test_the_order_of_the_shard_list_moves_nothing() -> None:
    assert homes(["a", "b", "c"]) == homes(["c", "a", "b"])


def test_ranking_starts_with_the_home() -> None:
    for group in GROUPS[:100]:
        order = ranking(group, ["a", "b", "c"])
        assert order[0] == home(group, ["a", "b", "c"]) and sorted(order) == ["a", "b", "c"]


def parse_shards(url: str) -> list[ShardSpec]:
    return list(parse_shard_list(url).specs)


def test_parse_named_and_unnamed_shards() -> None:
    assert parse_shards("a=http://h1:4001,http://h2:4001;b=https://h3:4001") == [
        ShardSpec("a", "http://h1:4001,http://h2:4001"),
        ShardSpec("b", "https://h3:4001"),
    ]
    assert parse_shards("http://10.0.0.1:4001,http://10.0.0.2:4001;http://10.0.0.3:4001") == [
        ShardSpec("10.0.0.1:4001", "http://10.0.0.1:4001,http://10.0.0.2:4001"),
        ShardSpec("10.0.0.3:4001", "http://10.0.0.3:4001"),
    ]
    assert parse_shards("x=sqlite:///a.db") == [ShardSpec("x", "sqlite:///a.db")]
    assert is_sharded_url("a=http://h:1") and is_sharded_url("http://h:1;http://h:2")
    assert not is_sharded_url("http://user:pa=ss@h:1") and not is_sharded_url("sqlite:///q.db")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("a=http://h:1;a=http://h:2", "repeated"),
        ("http://h:1;http://h:1", "repeated"),
        ("A=http://h:1", "shard name"),
        ("a=http://h:1;;b=http://h:2", "empty shard"),
        ("a=ftp://h:1", "scheme"),
        ("sqlite:///a.db;sqlite:///b.db", "needs a name"),
    ],
)
def test_bad_shard_lists_are_refused(url: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says):
        parse_shards(url)


def test_dedup_ids_are_scoped_to_their_group() -> None:
    assert scoped_dedup_id("g1", "d") != scoped_dedup_id("g2", "d")
    assert scoped_dedup_id("g1", "d") == scoped_dedup_id("g1", "d")
    assert len(scoped_dedup_id("g" * 1000, "d" * 1000)) < 40


def test_claims_rotate_and_spread_evenly() -> None:
    assert rotation(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert rotation(["a", "b", "c"], 5) == ["c", "a", "b"]
    assert shares(5, ["b", "c", "a"]) == {"b": 2, "c": 2, "a": 1}
    assert shares(1, ["c", "a"]) == {"c": 1, "a": 0}


def stats(**fields: object) -> Stats:
    base: dict[str, object] = dict(
        depth=0, groups=0, in_flight=0, parked=0, dead=0, oldest_age=None, by_priority={}
    )
    base.update(fields)
    return Stats(**base)  # type: ignore[arg-type]


def test_stats_add_up_over_shards() -> None:
    merged = merge_stats(
        [
            stats(
                depth=3,
                groups=2,
                oldest_age=5.0,
                by_priority={0: 3},
                last_seq=10,
                delayed_groups=1,
                oldest_by_priority={0: 5.0},
            ),
            stats(
                depth=4,
                groups=1,
                oldest_age=9.0,
                by_priority={0: 1, 4: 3},
                paused=True,
                delayed_groups=2,
                oldest_by_priority={0: 2.0, 4: 9.0},
            ),
        ]
    )
    assert (merged.depth, merged.groups, merged.oldest_age, merged.last_seq) == (7, 3, 9.0, 10)
    assert merged.by_priority == {0: 4, 4: 3} and merged.paused
    assert merged.delayed_groups == 3 and merged.oldest_by_priority == {0: 5.0, 4: 9.0}


def test_probes_combine() -> None:
    merged = merge_probes([Probe(False, 50.0, None), Probe(False, 20.0, 70.0), Probe(False, None)])
    assert merged == Probe(False, 20.0, 70.0)
    assert merge_probes([Probe(False, None), Probe(True, None)]).claimable


def test_a_down_shard_is_retried_with_a_growing_wait() -> None:
    health = Health(random=lambda: 0.5)  # PROBE has no jitter: it is never drawn
    health.failed("b", now=100.0)
    assert health.is_down("b") and health.down() == ["b"] and health.since("b") == 100.0
    assert health.due(100.1) == [] and health.due(100.5) == ["b"]
    health.failed("b", now=100.5)  # the probe failed too: wait twice as long
    assert health.due(101.4) == [] and health.due(101.5) == ["b"]
    for _ in range(10):
        health.failed("b", now=200.0)
    assert health.next_retry() == 200.0 + PROBE.cap
    health.recovered("b")
    assert not health.is_down("b") and health.next_retry() is None


def test_a_change_of_the_list_is_marked_with_an_epoch() -> None:
    from rqlite_queue._protocol.sharding import DRAINING, JOINING

    adding = parse_shard_list("epoch=3;a=http://h:1;b=http://h:2;+c=http://h:3")
    assert adding.epoch == 3 and adding.changing
    assert [s.state for s in adding.specs] == ["active", "active", JOINING]
    moved = 0
    for group in GROUPS[:5000]:
        target, previous = adding.placement(group)
        assert previous == home(group, ["a", "b"]) and target == home(group, ["a", "b", "c"])
        moved += target != previous
    assert abs(moved / 5000 - 1 / 3) < 0.03

    draining = parse_shard_list("epoch=4;a=http://h:1;b=http://h:2;-c=http://h:3")
    assert draining.specs[2].state == DRAINING
    for group in GROUPS[:2000]:
        target, previous = draining.placement(group)
        assert target in ("a", "b") and previous == home(group, ["a", "b", "c"])
    assert not parse_shard_list("a=http://h:1").changing


def test_lost_settlements_come_back_in_the_order_given() -> None:
    from rqlite_queue._protocol.sharding import in_given_order

    l0, l1, l2 = object(), object(), object()
    given = [l0, l1, l0, l2]
    # shard x had [l0, l0] and lost the second; shard y had [l1, l2] and lost both
    assert in_given_order(given, [[l0], [l1, l2]]) == [l1, l0, l2]
    assert in_given_order(given, [[l1, l2], [l0, l0]]) == [l0, l1, l0, l2]
    assert in_given_order(given, []) == []


@pytest.mark.parametrize("bad", [0, -1, "2", True, float("nan")])
def test_a_bad_claim_deadline_is_refused(bad: object, tmp_path: object) -> None:
    from rqlite_queue import ShardedTransport

    with pytest.raises(InvalidArgument, match="claim_deadline"):
        ShardedTransport(f"a=sqlite:///{tmp_path}/a.db", claim_deadline=bad)  # type: ignore[arg-type]
