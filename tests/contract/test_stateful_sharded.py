"""The stateful model (test_stateful.py) on a queue over two shards: one model per shard, each
call routed to the model of its group's shard, as the transport routes it.

What a sharded claim takes depends on where it starts (a rotation) and on what each shard
had; the machine records which shard each claim was sent to, and for how many, and checks that
each shard's leases are exactly what that shard's model predicts for those calls (round robin,
fencing, priority floor within the shard), and that a claim that took fewer than asked for left
nothing claimable on any shard. Dedup ids are scoped to their group on a sharded queue: the
models get (group, id) as the id. A settlement's follow-ups to the other shard's groups reach
it when the router forwards the outboxes: once a round's first wave (its settlements, and the
claim of the first shard in its rotation) is done, before it asks the other shard for what the
first lacked; else at the end of the call. Tenants, limits, bounds and debounce are left out here
(`QueueMachine.tenants`): tests/contract/test_tenants.py, test_limits.py and test_debounce.py
check them on two shards."""

from __future__ import annotations

import functools
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event as note_event

from rqlite_queue import Lease, ShardedTransport
from rqlite_queue._protocol.sharding import home
from rqlite_queue.testing import Cluster

from . import test_stateful as stateful
from .conftest import FakeClock, dropped_when_closed
from .test_stateful import (
    DEDUP_WINDOW,
    GROUPS,
    Group,
    Model,
    Predicted,
    QueueMachine,
    as_item,
    run,
)

SHARDS = ("a", "b")
assert {home(g, SHARDS) for g in GROUPS} == set(SHARDS), "the groups must span both shards"


class ShardedModel:
    """The models of the shards, seen as one queue where the machine reads the whole of it."""

    def __init__(self, now: float, dedup_window: float) -> None:
        self.shards = {name: Model(now, dedup_window) for name in SHARDS}

    def of(self, group_id: str) -> Model:
        return self.shards[home(group_id, SHARDS)]

    # The machine's reads of the whole queue.
    @property
    def now(self) -> float:
        return self.shards[SHARDS[0]].now

    @now.setter
    def now(self, value: float) -> None:
        for model in self.shards.values():
            model.now = value

    @property
    def paused(self) -> bool:
        return any(m.paused for m in self.shards.values())

    @paused.setter
    def paused(self, value: bool) -> None:
        for model in self.shards.values():
            model.paused = value

    @property
    def groups(self) -> dict[str, Group]:
        return {g: group for m in self.shards.values() for g, group in m.groups.items()}

    @property
    def dead(self) -> list[tuple[Any, ...]]:
        return [d for m in self.shards.values() for d in m.dead]

    @property
    def held(self) -> set[str]:
        return set().union(*(m.held for m in self.shards.values()))

    @property
    def expired(self) -> int:
        return sum(m.expired for m in self.shards.values())

    @property
    def last_seq(self) -> int:
        return sum(m.last_seq for m in self.shards.values())

    @property
    def schedules(self) -> dict[str, list[Any]]:
        return {n: v for m in self.shards.values() for n, v in m.schedules.items()}

    def busy(self, g: Group) -> bool:
        return self.shards[SHARDS[0]].busy(g)

    def listing(self) -> list[tuple[Any, ...]]:
        return sorted(row for m in self.shards.values() for row in m.listing())

    # Calls about one group, on its shard's model.
    def publish(
        self,
        group_id: str,
        event: Any,
        priority: int,
        dedup_id: str | None,
        delay: float | None = None,
        ttl: float | None = None,
        keep: float | None = None,
    ) -> int:
        scoped = None if dedup_id is None else f"{group_id}\0{dedup_id}"
        return self.of(group_id).publish(group_id, event, priority, scoped, delay, ttl, keep)

    def publish_many(self, items: list[Any]) -> list[int]:
        """One by one (the machine names no tenants and debounces nothing here)."""
        seqs = []
        for item in map(as_item, items):
            group_id, event = item["group_id"], item["event"]
            priority, dedup_id = item.get("priority", 0), item.get("dedup_id")
            seqs.append(
                self.publish(
                    group_id,
                    event,
                    priority,
                    dedup_id,
                    item.get("delay"),
                    item.get("ttl"),
                    item.get("keep"),
                )
            )
        return seqs

    def holds(self, lease: Lease) -> bool:
        return self.of(lease.group_id).holds(lease)

    def settled_before(self, lease: Lease, how: str) -> bool:
        return self.of(lease.group_id).settled_before(lease, how)

    def ack(self, lease: Lease, result: Any = None) -> bool:
        return self.of(lease.group_id).ack(lease, result)

    def nack(self, lease: Lease, delay: float) -> bool:
        return self.of(lease.group_id).nack(lease, delay)

    def extend(self, lease: Lease, visibility: float, progress: Any = None) -> bool:
        return self.of(lease.group_id).extend(lease, visibility, progress)

    # Jobs: each on its group's shard (seqs are per shard); a round prunes the shards whose
    # part of it settled leases for good.
    @property
    def known(self) -> set[tuple[str, int]]:
        return set().union(*(m.known for m in self.shards.values()))

    @property
    def outcomes(self) -> dict[tuple[str, int], Any]:
        return {(name, seq): o for name, m in self.shards.items() for seq, o in m.outcomes.items()}

    @property
    def settled_by_claims(self) -> list[tuple[str, int]]:
        return [settled for m in self.shards.values() for settled in m.settled_by_claims]

    def pruned_by(self, leases: Sequence[Lease]) -> None:
        for name in {home(lease.group_id, SHARDS) for lease in leases}:
            self.shards[name].prune()

    def cancel_one(self, group_id: str, seq: int, reason: str) -> str | None:
        return self.of(group_id).cancel_one(group_id, seq, reason)

    def result(self, group_id: str, seq: int) -> tuple[Any, ...] | None:
        return self.of(group_id).result(group_id, seq)

    def lease_news(self, lease: Lease) -> tuple[str, str | None] | None:
        return self.of(lease.group_id).lease_news(lease)

    def dead_letter(self, lease: Lease, hold: bool = False) -> bool:
        return self.of(lease.group_id).dead_letter(lease, hold)

    def hold(self, group_id: str) -> None:
        self.of(group_id).hold(group_id)

    def release(self, group_id: str) -> bool:
        return self.of(group_id).release(group_id)

    def cancel(self, group_id: str) -> int:
        return self.of(group_id).cancel(group_id)

    def set_priority(self, group_id: str, priority: int) -> bool:
        return self.of(group_id).set_priority(group_id, priority)

    def schedule(
        self, name: str, group_id: str, event: Any, priority: int, every: float, catch_up: bool
    ) -> float:
        for model in self.shards.values():
            model.schedules.pop(name, None)
        return self.of(group_id).schedule(name, group_id, event, priority, every, catch_up)

    def unschedule(self, name: str) -> bool:
        return any([m.unschedule(name) for m in self.shards.values()])

    def fire(self) -> int:
        return sum(m.fire() for m in self.shards.values())


class ShardedMachine(QueueMachine):
    tenants = False

    def open(self, clock: FakeClock) -> Any:
        raise NotImplementedError

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.outboxed: list[Any] = []
        """Follow-ups written to an outbox and not yet forwarded (in the model)."""
        super().__init__()
        self.model = ShardedModel(self.clock.now, DEDUP_WINDOW)  # type: ignore[assignment]
        assert isinstance(self.q, ShardedTransport)
        for name in SHARDS:  # record each round sent to a shard: (shard, n)
            backend = self.q.router.backend(name)
            backend.round = self._recorder(name, backend.round)
        # ... and when the outboxes a round wrote to are forwarded: ("", 0)
        outbox = self.q.router.outbox
        outbox.forward_soon = self._forwarder(outbox.forward_soon)  # type: ignore[method-assign]
        # A claim's prediction replays the calls of its own round only: a settlement alone
        # (ack, nack, extend, dead_letter) records its calls too, but its follow-ups are
        # forwarded in the model when it returns; replayed at the next claim, its forward
        # would deliver that claim's own follow-ups early.
        router = self.q.router
        router.round = self._fresh_calls(router.round)  # type: ignore[method-assign]

    def _recorder(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def recorded(checked: Any, *args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, checked.n))
            return call(checked, *args, **kwargs)

        return recorded

    def _fresh_calls(self, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls = []
            return call(*args, **kwargs)

        return recorded

    def _forwarder(self, call: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(call)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(("", 0))
            return call(*args, **kwargs)

        return recorded

    def publish_follow_ups(self, lease: Lease, items: list[Any], *, before: bool) -> None:
        """Those of the lease's shard in its transaction (`before`); those of groups of the
        other shard go through its outbox, forwarded once the rounds of the first wave are
        done (before a sharded round asks other shards for what the first lacked), or at the
        end of the call (`before=False`)."""
        model: ShardedModel = self.model  # type: ignore[assignment]
        here = self.q.shard_list.shard_of_lease(lease)
        for item in items if before else []:
            if self.q.shard_of(item["group_id"]) != here:
                self.outboxed.append(item)
                continue
            model.publish(
                item["group_id"],
                item["event"],
                item["priority"],
                item.get("dedup_id"),
                item.get("delay"),
            )
        if not before:
            self.forward()

    def forward(self) -> None:
        """The follow-ups waiting in the outboxes reach their shards (in the model)."""
        model: ShardedModel = self.model  # type: ignore[assignment]
        forwarded, self.outboxed = self.outboxed, []
        for item in forwarded:
            note_event("a follow-up goes through the outbox to the other shard")
            model.publish(
                item["group_id"],
                item["event"],
                item["priority"],
                item.get("dedup_id"),
                item.get("delay"),
            )

    def predict_claim(self, n: int, min_priority: int, visibility: float) -> list[Predicted]:
        calls, self.calls = self.calls, []
        model: ShardedModel = self.model  # type: ignore[assignment]
        predicted: list[Predicted] = []
        short: set[str] = set()  # the shards that had fewer than asked for
        for name, k in calls:
            if not name:
                self.forward()
                continue
            taken = model.shards[name].claim(k, min_priority, visibility)
            if len(taken) < k:
                short.add(name)
            predicted += taken
        if len(predicted) < n:
            # Took fewer than asked: nothing claimable was left on any shard, but on one that
            # came up short before its outbox's follow-ups were forwarded (not asked again).
            for name, shard_model in model.shards.items():
                if name in short and shard_model.eligible(min_priority):
                    note_event("follow-ups forwarded to a shard after it came up short")
                    continue
                assert shard_model.eligible(min_priority) == []
        return predicted

    def in_listing_order(self, dead: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        return sorted(dead)  # seqs are per shard: the shards' lists are merged by time


def on_shards(urls: Callable[[], tuple[str, str]]) -> type[ShardedMachine]:
    class Machine(ShardedMachine):
        def open(self, clock: FakeClock) -> Any:
            first, second = urls()
            queue = f"ss_{uuid.uuid4().hex[:12]}"
            url = f"a={first};b={second}"
            transport = ShardedTransport(
                url, queue=queue, clock=clock, dedup_window=DEDUP_WINDOW, max_skew=None
            )
            return transport if "sqlite" in url else dropped_when_closed(transport, url)

    return Machine


@pytest.mark.slow  # (the rqlite shards run the same machine in the default run)
def test_the_contract_holds_on_two_sqlite_shards(tmp_path: Path) -> None:
    def urls() -> tuple[str, str]:
        tag = uuid.uuid4().hex[:12]
        return (
            "sqlite:///" + os.fspath(tmp_path / f"a_{tag}.db"),
            "sqlite:///" + os.fspath(tmp_path / f"b_{tag}.db"),
        )

    run(on_shards(urls), examples=60, steps=30)


def test_the_contract_holds_on_two_rqlite_shards(
    rqlite_cluster: Cluster, second_cluster: Cluster
) -> None:
    run(on_shards(lambda: (rqlite_cluster.url, second_cluster.url)), examples=15, steps=25)


@pytest.mark.slow
def test_the_contract_holds_on_two_3_node_shards(
    rqlite_cluster3: Cluster, second_cluster3: Cluster
) -> None:
    run(on_shards(lambda: (rqlite_cluster3.url, second_cluster3.url)), examples=15, steps=25)


def test_a_settlements_forward_is_not_replayed_by_the_next_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shrunk example the rqlite shards found: an `extend` (a settlement alone: its round
    and its forward are recorded, but no claim reads them), then a round whose ack writes a
    follow-up to the other shard's outbox while the first shard of its rotation (that other
    shard) claims. The real queue forwarded it after that claim, as documented; the model
    replayed the extend's forward first, so it predicted the claim had taken the follow-up.
    A round's prediction reads only the calls of that round."""
    for module in (stateful, sys.modules[__name__]):  # (events: only inside a Hypothesis run)
        monkeypatch.setattr(module, "note_event", lambda _: None)
    tag = uuid.uuid4().hex[:12]
    machine = on_shards(
        lambda: (
            "sqlite:///" + os.fspath(tmp_path / f"a_{tag}.db"),
            "sqlite:///" + os.fspath(tmp_path / f"b_{tag}.db"),
        )
    )()

    def checked() -> None:
        machine.groups_listed_match_the_model()
        machine.stats_match_the_model()

    try:
        machine.a_backlog(items=[], naming=True, setup=[])
        checked()
        machine.claim(min_priority=0, visibility=3.0)
        checked()
        machine.settle_and_claim(acks=[], nacks=[], n=0, min_priority=0, visibility=3.0, follow=[])
        checked()
        options = ("home", None, None)
        machine.publish("a", 0, None, None, None, options, None)  # group "a": on shard b
        checked()
        (lease,) = machine.claim(min_priority=0, visibility=3.0).values
        checked()
        machine.extend(lease=lease, visibility=3.0, progress=None)
        checked()
        machine.settle_and_claim(  # shard a claims first; "d" is on shard a
            acks=[lease, lease, lease],
            nacks=[],
            n=3,
            min_priority=0,
            visibility=3.0,
            follow=[("d", 0)],
        )
        checked()
        assert machine.q.stats().by_shard == {"a": 1, "b": 0}
    finally:
        machine.teardown()
