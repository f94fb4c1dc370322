"""Changing the shard list of a live queue (docs/sharding.md): a third shard added, and a shard
drained, while publishers and workers run; FIFO and exclusivity hold for every group through
the change, a client still on the old list is refused (StaleShardList) and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rqlite_queue import InvalidArgument, ShardedTransport
from rqlite_queue._protocol.sharding import home
from rqlite_queue.errors import StaleShardList
from rqlite_queue.testing import Cluster

GROUPS = [f"wf{i}" for i in range(40)]
EXE = Path(sys.executable).parent / "rqlite-queue"


class Observer:
    """What the workers saw: per group, the events in the order handled, the shards they came
    from, and any moment two workers held the same group."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active: set[str] = set()
        self.seen: dict[str, list[int]] = defaultdict(list)
        self.shards: dict[str, list[str]] = defaultdict(list)
        self.overlaps: list[str] = []

    def begin(self, group: str) -> None:
        with self.lock:
            if group in self.active:
                self.overlaps.append(group)
            self.active.add(group)

    def end(self, group: str, event: int, shard: str) -> None:
        with self.lock:
            self.active.discard(group)
            self.seen[group].append(event)
            self.shards[group].append(shard)


class Clients:
    """Publishers and workers in threads, each using the shard list it is given (and told to
    switch to another one at any time)."""

    def __init__(self, url: str, queue: str) -> None:
        self.queue = queue
        self.lists: dict[str, str] = {}
        self.stop = threading.Event()
        self.stop_publishing = threading.Event()
        self.published: dict[str, int] = defaultdict(int)
        self.stale: list[str] = []
        self.errors: list[BaseException] = []
        self.observer = Observer()
        self.threads: list[threading.Thread] = []
        self.default = url

    def use(self, client: str, url: str) -> None:
        self.lists[client] = url

    def _transport(
        self, client: str, current: tuple[str, ShardedTransport] | None
    ) -> tuple[str, ShardedTransport]:
        url = self.lists.get(client, self.default)
        if current is not None and current[0] == url:
            return current
        if current is not None:
            current[1].close()
        transport = ShardedTransport(url, queue=self.queue, deadline=10.0)
        transport.setup()
        return url, transport

    def publisher(self, client: str, groups: list[str]) -> None:
        current = None
        try:
            n = 0
            while not self.stop_publishing.is_set():
                for group in groups:
                    while True:  # one publish at a time per group: its order is this loop's
                        current = self._transport(client, current)
                        try:
                            current[1].publish(group, n)
                            break
                        except StaleShardList:
                            self.stale.append(client)  # nothing written: publish it again
                            time.sleep(0.05)
                    self.published[group] = n + 1
                n += 1
                time.sleep(0.01)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            if current is not None:
                current[1].close()

    def worker(self, client: str) -> None:
        current = None
        try:
            while not self.stop.is_set():
                current = self._transport(client, current)
                lease = current[1].claim(client, 30)
                if lease is None:
                    time.sleep(0.01)
                    continue
                self.observer.begin(lease.group_id)
                time.sleep(0.002)
                self.observer.end(lease.group_id, lease.event, lease.shard)
                current[1].ack(lease)
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            if current is not None:
                current[1].close()

    def start(self, publishers: int, workers: int) -> None:
        for i in range(publishers):
            mine = GROUPS[i::publishers]
            self.threads.append(threading.Thread(target=self.publisher, args=(f"p{i}", mine)))
        for i in range(workers):
            self.threads.append(threading.Thread(target=self.worker, args=(f"w{i}",)))
        for thread in self.threads:
            thread.start()

    def finish(self, drain_timeout: float = 60) -> None:
        self.stop_publishing.set()
        deadline = time.monotonic() + drain_timeout
        while time.monotonic() < deadline and not self.errors:
            with self.observer.lock:
                done = all(len(self.observer.seen[g]) == self.published[g] for g in self.published)
            if done:
                break
            time.sleep(0.1)
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def check(self) -> None:
        assert not self.errors, self.errors
        assert self.observer.overlaps == []
        for group in GROUPS:
            assert self.observer.seen[group] == list(range(self.published[group])), group


def wait_until(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    state: Callable[[], str] = lambda: "",
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what} {state()}"
        time.sleep(0.2)


@pytest.fixture
def three(rqlite_cluster_factory: Callable[..., Cluster]) -> list[str]:
    return [rqlite_cluster_factory(1).url for _ in range(3)]


def test_a_shard_added_under_load_keeps_fifo_and_exclusivity(three: list[str]) -> None:
    a, b, c = three
    old = f"a={a};b={b}"
    joining = f"epoch=1;a={a};b={b};+c={c}"
    done = f"epoch=1;a={a};b={b};c={c}"
    clients = Clients(old, "grow")
    clients.start(publishers=3, workers=3)
    time.sleep(1.5)
    for client in ["p0", "p1", "w0", "w1", "w2"]:  # every client but p2 gets the new list
        clients.use(client, joining)
    time.sleep(1.0)
    clients.use("p2", joining)  # the late one: refused until then, nothing written
    time.sleep(2.0)
    with ShardedTransport(joining, queue="grow") as admin:
        statuses: list[Any] = []

        def moved_or_failed() -> bool:  # (a client's error ends the wait: it says why)
            statuses[:] = admin.shard_status()
            return bool(clients.errors) or all(s.leaving == 0 and s.waiting == 0 for s in statuses)

        wait_until(
            moved_or_failed,
            60,
            "every moving group to leave its old shard",
            lambda: f"shards {statuses}, client errors {clients.errors!r}",
        )
        assert not clients.errors, clients.errors
        assert {s.name: s.epoch for s in admin.shard_status()} == {"a": 1, "b": 1, "c": 1}
    for client in ["p0", "p1", "p2", "w0", "w1", "w2"]:  # the change is over: plain list
        clients.use(client, done)
    time.sleep(1.0)
    clients.finish()
    clients.check()

    moved = [
        g for g, shards in clients.observer.shards.items() if shards[0] != "c" and "c" in shards
    ]
    assert moved, "no group moved to the new shard"
    for group in moved:  # once on c, never back: the old shard had delivered all it held
        shards = clients.observer.shards[group]
        assert shards[shards.index("c") :] == ["c"] * (len(shards) - shards.index("c"))
    assert "p2" in clients.stale, "the client on the old list was never refused"


def test_a_group_held_while_its_old_shard_delivers_its_last_message_is_released(
    rqlite_cluster_factory: Callable[..., Cluster],
) -> None:
    """The race the test above met under load (the new shard showing `waiting=1`, the old
    ones `leaving=0`, until its timeout): a publish finds the moving group's last message
    still on its old shard; the ack of that message then looks for a hold to release on the
    new shard before the publish has written it; the publish writes it. Nothing else would
    release it (only a Worker's periodic sweep): the publish looks again once its hold is
    written."""
    a, c = (rqlite_cluster_factory(1).url for _ in range(2))
    joining = f"epoch=1;a={a};+c={c}"
    group = next(g for g in GROUPS if home(g, ["a", "c"]) == "c")
    with (
        ShardedTransport(f"a={a}", queue="race") as old,
        ShardedTransport(joining, queue="race") as worker,
        ShardedTransport(joining, queue="race") as publisher,
    ):
        old.setup()
        old.publish(group, "on the old shard")
        lease = worker.claim("w", 30)
        assert lease is not None and lease.shard == "a"
        new_shard = publisher.router.backend("c")
        run = new_shard.run

        def ack_first(plan: Any, deadline: float) -> Any:  # after the look, before the write
            new_shard.run = run
            worker.ack(lease)
            return run(plan, deadline)

        new_shard.run = ack_first
        publisher.publish(group, "on the new shard")
        assert new_shard.run is run, "the publish did not go to the new shard"
        assert {s.name: s.waiting for s in publisher.shard_status()} == {"a": 0, "c": 0}
        moved = worker.claim("w", 30)
        assert moved is not None and (moved.shard, moved.event) == ("c", "on the new shard")


def test_cancelling_a_moving_group_on_its_old_shard_lets_its_new_shard_serve_it(
    tmp_path: Path,
) -> None:
    """A cancel empties the group where its messages are (the old shard): the hold that kept
    its new shard waiting for them is released by that call (the plan says it may empty its
    group: `Plan.empties_group`), not left to a Worker's sweep."""
    a, c = (f"sqlite:///{tmp_path}/{name}.db" for name in "ac")
    joining = f"epoch=1;a={a};+c={c}"
    group = next(g for g in GROUPS if home(g, ["a", "c"]) == "c")
    with (
        ShardedTransport(f"a={a}", queue="cancel") as old,
        ShardedTransport(joining, queue="cancel") as q,
    ):
        old.setup()
        old.publish(group, "on the old shard")
        q.publish(group, "on the new shard")
        assert {s.name: s.waiting for s in q.shard_status()} == {"a": 0, "c": 1}
        assert q.cancel_group(group, "reset") == 1
        assert {s.name: s.waiting for s in q.shard_status()} == {"a": 0, "c": 0}
        lease = q.claim("w", 30)
        assert lease is not None and (lease.shard, lease.event) == ("c", "on the new shard")


def test_a_drained_shard_empties_and_can_be_removed(three: list[str]) -> None:
    a, b, c = three
    start = f"a={a};b={b};c={c}"
    draining = f"epoch=1;a={a};b={b};-c={c}"
    final = f"epoch=1;a={a};b={b}"
    clients = Clients(start, "shrink")
    clients.start(publishers=2, workers=3)
    time.sleep(1.5)
    for client in ["p0", "p1", "w0", "w1", "w2"]:
        clients.use(client, draining)
    drained = subprocess.run(
        [EXE, "--url", draining, "--queue", "shrink", "shards", "drain", "c", "--timeout", "60"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert drained.returncode == 0, drained.stderr
    assert "shard c is empty: remove it from the list" in drained.stdout
    status = subprocess.run(
        [EXE, "--url", draining, "--queue", "shrink", "shards", "status", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    rows = {row["name"]: row for row in map(json.loads, status.stdout.splitlines())}
    assert rows["c"]["state"] == "draining" and rows["c"]["epoch"] == 1
    with (
        ShardedTransport(draining, queue="shrink") as admin,
        pytest.raises(InvalidArgument, match="shard list"),
    ):
        admin.requeue_dead()
    for client in ["p0", "p1", "w0", "w1", "w2"]:
        clients.use(client, final)
    time.sleep(1.0)
    clients.finish()
    clients.check()
    with ShardedTransport(final, queue="shrink") as q:
        assert all(q.shard_of(g) in ("a", "b") for g in GROUPS)


def test_bad_changes_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="epoch"):
        ShardedTransport("a=sqlite:///a.db;+b=sqlite:///b.db")
    with pytest.raises(InvalidArgument, match="draining"):
        ShardedTransport("epoch=1;-a=sqlite:///a.db")
    with pytest.raises(InvalidArgument, match="epoch"):
        ShardedTransport("epoch=x;a=sqlite:///a.db")
