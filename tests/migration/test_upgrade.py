"""The upgrade path, tested from real older databases: `fixtures/v1.db` to `v8.db` were
written by the schema-v1 to v8 code (see `make_v1_fixture.py` to `make_v8_fixture.py`), with a
message leased, one parked, one lapsed, one dead-lettered and deduplicated publishes in them
(and, since v2, a schedule and a held group; since v4, a queue whose tenants are on; since v5, a
tenant's limits and a debounced message; since v6, headers; since v7, jobs; in v8, batches).
Opened by this
code (several clients racing to upgrade it, on SQLite and on a 3-node rqlite), every one of
them behaves as before."""

from __future__ import annotations

import json
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rqlite_queue import Lease, LeaseLost, RqliteTransport, SqliteTransport, Transport
from rqlite_queue._protocol.plan import Batch, Statement
from rqlite_queue.errors import QueueFull
from rqlite_queue.testing import Cluster

FIXTURES = Path(__file__).resolve().parent / "fixtures"
VERSIONS = ["v1", "v2", "v3", "v4", "v5", "v6", "v7", "v8"]
RACERS = 4


def facts(version: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FIXTURES / f"{version}.json").read_text())
    return loaded


@pytest.fixture(params=VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["sqlite", "rqlite3"])
def open_v1(
    request: pytest.FixtureRequest, tmp_path: Path, version: str
) -> Iterator[Callable[..., Transport]]:
    """`open_v1(clock, queue=...)`: a transport on a copy of the older database (v1 or v2)."""
    opened: list[Transport] = []
    if request.param == "sqlite":
        path = tmp_path / f"{version}.db"
        shutil.copy(FIXTURES / f"{version}.db", path)

        def make(clock: Clock, queue: str = "default") -> Transport:
            opened.append(SqliteTransport(str(path), clock, queue=queue))
            return opened[-1]

    else:
        rqlite_cluster_factory: Callable[..., Cluster] = request.getfixturevalue(
            "rqlite_cluster_factory"
        )
        cluster = rqlite_cluster_factory(3)
        reply = httpx.post(
            cluster.leader().http_url + "/db/load",
            content=(FIXTURES / f"{version}.db").read_bytes(),
            headers={"Content-Type": "application/octet-stream"},
            timeout=30,
        )
        assert reply.status_code == 200, reply.text

        def make(clock: Clock, queue: str = "default") -> Transport:
            opened.append(RqliteTransport(cluster.url, clock=clock, queue=queue, max_skew=None))
            return opened[-1]

    yield make
    for transport in opened:
        transport.close()


def test_clients_racing_to_open_an_older_database_find_every_message_as_it_was(
    open_v1: Callable[..., Transport], version: str
) -> None:
    FACTS = facts(version)
    clock = Clock(FACTS["clock"] + 1)
    racers = [open_v1(clock) for _ in range(RACERS)]
    errors: list[BaseException] = []

    def setup(q: Transport) -> None:
        try:
            q.setup()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=setup, args=(q,)) for q in racers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    q = racers[0]
    stats = q.stats()
    assert {k: getattr(stats, k) for k in FACTS["stats"]} == FACTS["stats"]
    assert [d.reason for d in q.dead_letters()] == ["boom"]
    assert [e for _, e in open_v1(clock, queue="other").peek("o")] == [{"n": 0}, {"n": 1}]


def test_after_the_upgrade_leases_parks_dedup_and_order_behave_as_before(
    open_v1: Callable[..., Transport], version: str
) -> None:
    FACTS = facts(version)
    clock = Clock(FACTS["clock"] + 10)  # the lapsed lease has lapsed; the park still holds
    q = open_v1(clock)
    q.setup()
    held = FACTS["leased"]
    lease = Lease(
        held["seq"],
        held["group_id"],
        held["event"],
        held["token"],
        held["attempts"],
        held["expires_at"],
    )
    # The dedup ids still hold within their window.
    assert q.publish("dedup", {"n": 0}, dedup_id="d-0") == q.peek("dedup")[0][0]
    assert len(q.peek("dedup")) == 2
    # What is claimable now, round robin: the never-claimed "ready" group, the lapsed one
    # (second attempt), "dead"'s next message, "dedup". Not "leased", not "parked".
    claimed = {}
    while (next_lease := q.claim("new", 30)) is not None:
        claimed[next_lease.group_id] = next_lease
    assert set(claimed) == {"ready", "lapsed", "dead", "dedup"}
    assert claimed["lapsed"].attempts == 2
    assert claimed["lapsed"].event == {"n": 0}
    assert claimed["dead"].event == {"n": 1}
    # The older lease still holds its group and acks (the same ack again reports that it
    # applied); any other call on it is fenced.
    q.ack(lease)
    q.ack(lease)
    with pytest.raises(LeaseLost):
        q.nack(lease)
    # The park ends on time, not before: the same head comes back, second attempt.
    clock.now = FACTS["parked_until"] - 0.5
    for lease_ in claimed.values():
        q.ack(lease_)
    assert {lease_.group_id for lease_ in q.claim_many("new", 30, 10)} == {
        "leased",
        "ready",
        "lapsed",
        "dedup",
    }
    clock.now = FACTS["parked_until"]
    parked = q.claim("new", 30)
    assert parked is not None and parked.group_id == "parked"
    assert (parked.event, parked.attempts) == ({"n": 0}, 2)
    # FIFO held through all of it: each group's messages come back in publish order.
    clock.now += 3600
    order: dict[str, list[Any]] = {}
    while leases := q.claim_many("drain", 30, 10):
        for lease_ in leases:
            order.setdefault(lease_.group_id, []).append(lease_.event["n"])
        q.ack_many(leases)
    assert all(events == sorted(events) for events in order.values()), order
    assert q.stats().depth == 0
    # The dead letter can still be requeued and claimed.
    assert q.requeue_dead() == 1
    back = q.claim("new", 30)
    assert back is not None and (back.group_id, back.event) == ("dead", {"n": 0})


@pytest.mark.parametrize("version", VERSIONS)
def test_an_upgraded_database_has_the_same_tables_as_a_new_one(
    tmp_path: Path, version: str
) -> None:
    """Columns, their order and defaults, and indexes: what `migrate` makes of an older
    database is what `create` makes of an empty one."""
    upgraded, fresh = tmp_path / "upgraded.db", tmp_path / "fresh.db"
    shutil.copy(FIXTURES / f"{version}.db", upgraded)
    for path in (upgraded, fresh):
        q = SqliteTransport(str(path), queue="default")
        q.setup()
        q.close()
    assert _shape(upgraded) == _shape(fresh)


def _shape(path: Path) -> dict[str, Any]:
    """Each table's columns (name, type, not null, default, key); each index's columns and
    condition (the text of its CREATE statement, spacing aside)."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name LIKE 'rq_default_%'"
        ).fetchall()
        return {
            name: db.execute(f"PRAGMA table_info({name})").fetchall()
            if kind == "table"
            else " ".join(sql.replace("IF NOT EXISTS ", "").split())
            for kind, name, sql in rows
        }
    finally:
        db.close()


def test_a_v2_schedule_and_hold_survive_the_upgrade(
    open_v1: Callable[..., Transport], version: str
) -> None:
    if version == "v1":
        pytest.skip("schedules and holds came with v2")
    FACTS = facts(version)
    clock = Clock(FACTS["schedule_next_at"] + 1)
    other = open_v1(clock, queue="other")
    other.setup()
    [schedule] = other.schedules()
    assert (schedule.name, schedule.group_id, schedule.next_at) == (
        "tick",
        "ticks",
        FACTS["schedule_next_at"],
    )
    assert other.fire_schedules() == 1
    assert [e for _, e in other.peek("ticks")] == [{"tick": True}]
    assert {info.group_id: info.state for info in other.groups()}["held"] == "held"
    claimed = {lease.group_id for lease in other.claim_many("w", 30, 10)}
    assert claimed == {"o", "ticks"}  # not the held group
    assert other.release_group("held")


def test_upgraded_groups_are_the_default_tenants_and_fair_share_counts_them(
    open_v1: Callable[..., Transport], version: str
) -> None:
    """Schema v4: every group of an older queue is in the default tenant, whose count of
    claimable groups starts right (the triggers keep it from then on), and a new tenant's
    groups share the claims with it by weight."""
    FACTS = facts(version)
    clock = Clock(FACTS["lapsed_at"] + 1)  # the lapsed lease is claimable again
    q = open_v1(clock)
    q.setup()
    [default] = q.tenants()
    ready = {g.group_id for g in q.groups() if g.state == "ready"}
    assert default.name == "" and default.groups == FACTS["stats"]["groups"]
    assert default.depth == FACTS["stats"]["depth"]
    q.set_tenant("new", weight=3)
    q.publish_many([{"group_id": f"n{i}", "event": i, "tenant": "new"} for i in range(6)])
    leases = q.claim_many("w", 30, 4)
    assert sorted(lease.group_id[0] == "n" for lease in leases) == [False, True, True, True]
    counts = {t.name: (t.ready, t.in_flight) for t in q.tenants()}
    # In flight in the default tenant: the fixture's hour-long lease and the one just taken.
    assert counts == {"": (len(ready) - 1, 2), "new": (3, 3)}


def test_a_v4_queue_with_tenants_on_keeps_them_and_takes_limits(
    open_v1: Callable[..., Transport], version: str
) -> None:
    """Schema v5: a queue whose tenants were on keeps its weights and counts, and its claims
    keep to limits set after the upgrade, even those of a client that assumes tenants off
    (the upgrade marks the queue so that such a claim fails and is made again)."""
    if version not in ("v4", "v5", "v6", "v7", "v8"):
        pytest.skip("tenants came with v4")
    clock = Clock(facts(version)["clock"] + 1)
    q = open_v1(clock, queue="tenanted")
    q.setup()
    assert q.stats().tenants_on
    tenants = {t.name: t for t in q.tenants()}
    assert tenants["acme"].weight == 2.0
    assert (tenants["acme"].groups, tenants[""].groups) == (3, 2)
    assert tenants["acme"].in_flight + tenants[""].in_flight == 1  # the fixture's lease
    mark = Statement("SELECT token FROM rq_tenanted_claims WHERE token = '*'", {})
    executor = q.router.backend.executor  # type: ignore[attr-defined]
    [found] = executor.execute(Batch((mark,), write=False), time.monotonic() + 30)
    assert found.rows == [["*"]]
    q.set_tenant("acme", max_in_flight=1)
    q.set_tenant("", max_in_flight=1)
    q.router.backend.known.tenants_on = False  # type: ignore[attr-defined]
    leases = q.claim_many("w", 30, 10)
    assert len(leases) == 1  # the tenant without the fixture's lease, once
    assert q.router.backend.known.tenants_on  # type: ignore[attr-defined]
    assert q.claim_many("w", 30, 10) == []


def test_a_v5_queue_keeps_its_limits_and_debounce_and_its_messages_take_headers(
    open_v1: Callable[..., Transport], version: str
) -> None:
    """Schema v6: a v5 queue's tenant limits and pending debounced message are kept; its
    messages have no headers (an empty mapping, claimed or dead-lettered), and messages
    published after the upgrade keep theirs, through a debounced replacement, a claim, a dead
    letter and its requeue."""
    if version not in ("v5", "v6", "v7", "v8"):
        pytest.skip("limits and debounce came with v5")
    clock = Clock(facts(version)["clock"] + 1)
    q = open_v1(clock, queue="limited")
    q.setup()
    acme = {t.name: t for t in q.tenants()}["acme"]
    assert (acme.max_in_flight, acme.rate, acme.max_queued, acme.max_group_queued) == (
        1,
        10.0,
        3,
        2,
    )
    with pytest.raises(QueueFull):  # a0 holds one: two more go over its group's bound
        q.publish_many([{"group_id": "a0", "event": 9, "tenant": "acme"}] * 2)
    [(pending, event)] = q.peek("deb")
    assert event == {"v": 1}
    replaced = q.publish("deb", {"v": 2}, debounce="k", delay=60, headers={"h": "2"})
    assert replaced == pending
    clock.now += 120  # past the run's max_wait: due
    leases = {lease.group_id: lease for lease in q.claim_many("w", 30, 10)}
    assert set(leases) in ({"deb", "a0"}, {"deb", "a1"})  # acme: one in flight at most
    assert (leases["deb"].event, dict(leases["deb"].headers)) == ({"v": 2}, {"h": "2"})
    old = leases.get("a0") or leases["a1"]
    assert old.headers == {} and len(old.headers) == 0
    q.dead_letter(old, "old")
    q.dead_letter(leases["deb"], "new")
    assert {d.reason: dict(d.headers) for d in q.dead_letters()} == {"old": {}, "new": {"h": "2"}}
    assert q.requeue_dead() == 2
    again = {lease.group_id: lease for lease in q.claim_many("w", 30, 10)}
    assert dict(again["deb"].headers) == {"h": "2"}


def test_a_v6_queue_keeps_its_headers_and_its_jobs_keep_outcomes(
    open_v1: Callable[..., Transport], version: str
) -> None:
    """Schema v7: a v6 queue's headers are kept (queued, leased, dead-lettered); its older
    messages keep no outcome, but are read as jobs (queued, running) and cancelled (the
    leased one flagged, and cancelled by its ack); messages published after the upgrade keep
    theirs; its older dead letter, requeued, keeps none."""
    if version not in ("v6", "v7", "v8"):
        pytest.skip("headers came with v6")
    clock = Clock(facts(version)["clock"] + 1)
    q = open_v1(clock, queue="headed")
    q.setup()
    assert q.stats().outcomes == 0
    [(queued, _)] = q.peek("h")[1:]
    assert [(d.reason, dict(d.headers)) for d in q.dead_letters()] == [
        ("bad headers", {"why": "dead"})
    ]
    job = q.result("h", queued - 1)
    assert (job.status, job.attempts, dict(job.headers)) == ("running", 1, {"trace": "t-0"})
    assert q.result("h", queued).status == "queued"
    assert q.cancel("h", queued - 1, "after the upgrade") == "cancelling"
    clock.now += 3600  # the fixture's lease lapses: a claim settles it as cancelled
    new = q.publish("n", {"new": True}, keep=600, headers={"k": "v"})
    leases = {lease.group_id: lease for lease in q.claim_many("w", 30, 10)}
    assert set(leases) == {"h", "n"} and leases["h"].seq == queued  # the cancelled one skipped
    assert q.result("h", queued - 1) is None  # it kept no outcome
    q.ack(leases["n"], result="kept")
    assert (q.result("n", new).result, dict(q.result("n", new).headers)) == ("kept", {"k": "v"})
    assert q.requeue_dead() == 1
    [old] = [lease for lease in q.claim_many("w", 30, 10) if lease.group_id == "hd"]
    assert old.keep is None and dict(old.headers) == {"why": "dead"}


def test_a_v7_queue_keeps_its_jobs_and_takes_batches(
    open_v1: Callable[..., Transport], version: str
) -> None:
    """Schema v8: a v7 queue's jobs keep their outcomes and states (acked with a result,
    leased, queued, cancelled while leased), its messages belong to no batch, and batches made
    after the upgrade count their messages (those that keep outcomes too) and publish their
    callback once."""
    if version not in ("v7", "v8"):
        pytest.skip("jobs came with v7")
    kept = facts(version)["kept"]
    clock = Clock(facts(version)["clock"] + 1)
    q = open_v1(clock, queue="jobs")
    q.setup()
    assert q.stats().open_batches == 0 and q.batches() == []
    done = q.result("k", kept["acked"])
    assert (done.status, done.result) == ("succeeded", {"done": 0})
    assert q.result("k", kept["leased"]).status == "running"
    assert q.result("q", kept["queued"]).status == "queued"
    assert q.result("c", kept["cancelling"]).cancelling == "stopped"
    with q.batch(on_complete=("done", "all of them")) as batch:
        batch.publish("b1", 1, keep=600)
        batch.publish("k", 2)  # behind the leased one, FIFO kept
    clock.now += 7200  # the fixture's leases lapse
    leases = {lease.group_id: lease for lease in q.claim_many("w", 30, 10)}
    assert set(leases) == {"k", "q", "b1"}  # the cancelled one settled so by the claim
    assert q.result("c", kept["cancelling"]).status == "cancelled"
    assert leases["k"].seq == kept["leased"] and leases["k"].batch is None
    assert leases["q"].batch is None and leases["b1"].batch == batch.id
    q.ack(leases["k"], result="old")
    q.ack(leases["q"])
    q.ack(leases["b1"], result="new")
    [last] = q.claim_many("w", 30, 10)
    assert (last.group_id, last.batch) == ("k", batch.id)
    q.ack(last)
    found = q.batch_status(batch.id)
    assert found is not None and (found.done, found.succeeded) == (True, 2)
    assert [event for _, event in q.peek("done")] == ["all of them"]
    assert q.result("b1", leases["b1"].seq).result == "new"
    assert q.result("k", kept["leased"]).result == "old"


def test_a_v8_queues_batches_go_on_and_callbacks_made_after_keep_their_outcomes(
    open_v1: Callable[..., Transport], version: str
) -> None:
    """Schema v9: a v8 batch not done publishes its callbacks once when its last messages
    settle (the trigger that publishes them was made again with the upgrade), without keeping
    their outcomes (they were made without `keep`); a done one keeps its status; a callback
    made after the upgrade keeps its outcome for its `keep`."""
    if version != "v8":
        pytest.skip("batches came with v8")
    made = facts(version)["batched"]
    clock = Clock(facts(version)["clock"] + 1)
    q = open_v1(clock, queue="batched")
    q.setup()
    old = q.batch_status(made["open"])
    assert old is not None and (old.total, old.succeeded, old.pending) == (3, 1, 2)
    done = q.batch_status(made["done"])
    assert done is not None and done.done
    kept = {"group_id": "kept", "event": "new", "keep": 600}
    with q.batch(on_complete=kept) as new:
        new.publish("y", 0)
    leases = {lease.group_id: lease for lease in q.claim_many("w", 30, 10)}
    assert set(leases) == {"m", "n", "y"}
    q.settle_and_claim(ack=list(leases.values()))
    assert [event for _, event in q.peek("done")] == ["complete"]
    assert [event for _, event in q.peek("ok")] == ["success"]
    callbacks = {lease.group_id: lease for lease in q.claim_many("w", 30, 10)}
    assert set(callbacks) == {"done", "ok", "kept"}
    for lease in callbacks.values():
        q.ack(lease, result=f"handled {lease.event}")
    assert q.result("kept", callbacks["kept"].seq).result == "handled new"
    assert q.result("done", callbacks["done"].seq) is None  # made at v8: not kept
    found = q.batch_status(made["open"])
    assert found is not None and (found.done, found.succeeded) == (True, 3)
    assert q.claim("w", 30) is None


def test_a_v8_shard_writes_its_callbacks_to_its_outbox_with_their_keep(tmp_path: Path) -> None:
    """Schema v9 on a shard of a sharded queue (the trigger that writes callbacks to the
    outbox, made again): a v8 batch's callback is forwarded once, a new one's with its keep."""
    from rqlite_queue import ShardedTransport

    made = facts("v8")["batched"]
    path = tmp_path / "v8.db"
    shutil.copy(FIXTURES / "v8.db", path)
    clock = Clock(facts("v8")["clock"] + 1)
    q = ShardedTransport(
        f"a=sqlite:///{path};b=sqlite:///{tmp_path / 'b.db'}",
        queue="sharded",
        clock=clock,
        max_skew=None,
    )
    try:
        q.setup()
        on_b = next(f"k{i}" for i in range(100) if q.shard_of(f"k{i}") == "b")
        callback = {"group_id": on_b, "event": "new", "keep": 600}
        with q.batch(on_complete=callback, parent=made["sharded"]) as new:  # (on a, with it)
            new.publish("fresh", 0)
        assert new.id.startswith("a/")
        group = made["sharded_group"]
        leases = q.claim_many("w", 30, 10)
        assert {group, "fresh"} <= {lease.group_id for lease in leases}  # (and the `cb` ones)
        q.settle_and_claim(ack=leases)
        give_up = time.monotonic() + 10
        while (not q.peek(group) or not q.peek(on_b)) and time.monotonic() < give_up:
            q.fire_schedules()  # (forwards what the outboxes hold)
        assert [event for _, event in q.peek(group)] == ["sharded complete"]
        assert [event for _, event in q.peek(on_b)] == ["new"]
        callbacks = {lease.group_id: lease for lease in q.claim_many("w", 30, 10)}
        for lease in callbacks.values():
            q.ack(lease, result="handled")
        assert q.result(on_b, callbacks[on_b].seq).result == "handled"
        assert q.result(group, callbacks[group].seq) is None
        old = q.batch_status(made["sharded"])
        assert old is not None and (old.done, old.succeeded) == (True, 2)
    finally:
        q.close()
