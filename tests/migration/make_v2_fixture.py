"""Makes `fixtures/v2.db`: a queue database written by the schema-v2 code, kept in the repo so
the upgrade path is always tested from a real older database. The same messages, leases, parks
and dead letters as `fixtures/v1.db` (so the upgrade tests expect the same of both), and in the
queue `other` what only v2 has: a schedule and a held group.

It was run once, against the v2 code (the commit before schema v3):

    git worktree add /tmp/v2 <commit>
    PYTHONPATH=/tmp/v2/src python tests/migration/make_v2_fixture.py

and its output committed. `fixtures/v2.json` records what the upgrade tests expect to find."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from rqlite_queue import SqliteTransport

try:
    from rqlite_queue._protocol.sql import SCHEMA_VERSION  # the v2 to v6 code's module
except ImportError:
    from rqlite_queue._protocol.schema import SCHEMA_VERSION  # (since v7)

HERE = Path(__file__).resolve().parent / "fixtures"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def main() -> int:
    return make(2)


def make(version: int) -> int:
    """Writes `fixtures/v{version}.db` and `.json` (`make_v3_fixture.py` to
    `make_v6_fixture.py` run it at v3 to v6)."""
    if version != SCHEMA_VERSION:
        print(
            f"this is schema v{SCHEMA_VERSION} code: run it against the v{version} code",
            file=sys.stderr,
        )
        return 1
    HERE.mkdir(exist_ok=True)
    path = HERE / f"v{version}.db"
    path.unlink(missing_ok=True)
    clock = Clock()
    q = SqliteTransport(str(path), clock, queue="default")
    q.setup()
    # A group emptied by an ack: its turn is kept in the retired table.
    q.publish("gone", {"n": 0})
    q.ack(_claim(q, "gone", "w0", 30))
    clock.now += 1
    # Lapsed: claimed for 5 s; it lapses, nobody takes it over.
    q.publish_many([("lapsed", {"n": i}) for i in range(2)])
    _claim(q, "lapsed", "w0", 5)
    # Leased for an hour, head of three.
    q.publish_many([("leased", {"n": i}, 2) for i in range(3)])
    leased = _claim(q, "leased", "w1", 3600)
    # Parked for 60 s after a failed attempt.
    q.publish_many([("parked", {"n": i}) for i in range(2)])
    q.nack(_claim(q, "parked", "w2", 30), 60)
    # Dead-lettered head; one message left behind it.
    q.publish_many([("dead", {"n": i}) for i in range(2)])
    q.dead_letter(_claim(q, "dead", "w3", 30), "boom")
    # Deduplicated publishes: the second is a repeat within the window.
    first = q.publish("dedup", {"n": 0}, dedup_id="d-0")
    again = q.publish("dedup", {"n": 0}, dedup_id="d-0")
    assert first == again
    q.publish("dedup", {"n": 1}, dedup_id="d-1")
    # Never claimed, at priority 3.
    q.publish_many([("ready", {"n": i}, 3) for i in range(3)])
    # A second named queue in the same file.
    other = SqliteTransport(str(path), clock, queue="other")
    other.publish_many([("o", {"n": i}) for i in range(2)])
    # What only v2 has: a schedule, and a held group.
    other.schedule("tick", "ticks", {"tick": True}, every=60, start_at=clock.now + 30)
    other.publish("held", {"n": 0})
    other.hold_group("held")
    other.close()
    if version >= 4:
        # What only v4 has: a queue whose tenants are on, a weight, a tenant's lease in flight.
        tenanted = SqliteTransport(str(path), clock, queue="tenanted")
        tenanted.set_tenant("acme", weight=2)
        tenanted.publish_many(
            [{"group_id": f"a{i}", "event": i, "tenant": "acme"} for i in range(3)]
        )
        tenanted.publish_many([(f"d{i}", i) for i in range(2)])
        tenanted.claim_many("w4", 3600, 1)
        tenanted.close()
    if version >= 5:
        # What only v5 has: a tenant's limits (a cap, a rate, bounds on queued messages) and a
        # debounced message pending (delayed 60 s, at most 120 s after its run's first publish).
        limited = SqliteTransport(str(path), clock, queue="limited")
        limited.set_tenant("acme", max_in_flight=1, rate=10, max_queued=3, max_group_queued=2)
        limited.publish_many(
            [{"group_id": f"a{i}", "event": i, "tenant": "acme"} for i in range(2)]
        )
        limited.publish("deb", {"v": 1}, debounce="k", delay=60, max_wait=120)
        limited.close()
    if version >= 6:
        # What only v6 has: headers, on a queued message, a leased one and a dead letter.
        headed = SqliteTransport(str(path), clock, queue="headed")
        headed.publish_many(
            [
                {"group_id": "h", "event": 0, "headers": {"trace": "t-0"}},
                {"group_id": "h", "event": 1, "headers": {"trace": "t-1"}},
                {"group_id": "hd", "event": 2, "headers": {"why": "dead"}},
            ]
        )
        first = headed.claim("w5", 3600)
        assert first is not None and first.group_id == "h", first
        poison = headed.claim("w5", 30)
        assert poison is not None and poison.group_id == "hd", poison
        headed.dead_letter(poison, "bad headers")
        headed.close()
    kept: dict[str, int] = {}
    if version >= 7:
        # What only v7 has: jobs. A message whose outcome is kept (acked with a result), one
        # leased that keeps its outcome, one queued that will, and one cancelled while leased.
        jobs = SqliteTransport(str(path), clock, queue="jobs")
        kept["acked"] = jobs.publish("k", {"n": 0}, keep=86_400)
        kept["leased"] = jobs.publish("k", {"n": 1}, keep=86_400)
        kept["queued"] = jobs.publish("q", {"n": 2}, keep=86_400)
        kept["cancelling"] = jobs.publish("c", {"n": 3}, keep=86_400)
        jobs.ack(_claim(jobs, "k", "w6", 30), result={"done": 0})
        claimed = {lease.group_id: lease for lease in jobs.claim_many("w6", 3600, 3)}
        assert set(claimed) == {"k", "q", "c"}, claimed
        jobs.nack(claimed["q"], 0)
        assert jobs.cancel("c", kept["cancelling"], "stopped") == "cancelling"
        jobs.close()
    batched: dict[str, Any] = {}
    if version >= 8:
        batched = _batches(path, clock)
    stats = q.stats()
    q.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode=DELETE")
    with sqlite3.connect(path) as db:
        db.execute("VACUUM")
    facts = {
        "made_by": f"tests/migration/make_v{version}_fixture.py at commit {_commit()} "
        f"(schema v{version})",
        "clock": clock.now,
        "queues": [
            "default",
            "other",
            *(["tenanted"] if version >= 4 else []),
            *(["limited"] if version >= 5 else []),
            *(["headed"] if version >= 6 else []),
            *(["jobs"] if version >= 7 else []),
            *(["batched", "sharded"] if version >= 8 else []),
        ],
        "leased": {
            "seq": leased.seq,
            "group_id": leased.group_id,
            "event": leased.event,
            "token": leased.token,
            "attempts": leased.attempts,
            "expires_at": leased.expires_at,
        },
        "parked_until": clock.now + 60,
        "lapsed_at": clock.now + 5,
        "dedup_window_ends": clock.now + 300,
        "schedule_next_at": T0 + 1 + 30,
        **({"kept": kept} if version >= 7 else {}),
        **({"batched": batched} if version >= 8 else {}),
        "stats": {
            "depth": stats.depth,
            "groups": stats.groups,
            "in_flight": stats.in_flight,
            "parked": stats.parked,
            "dead": stats.dead,
        },
    }
    (HERE / f"v{version}.json").write_text(json.dumps(facts, indent=2) + "\n")
    print(json.dumps(facts, indent=2))
    return 0


def _batches(path: Path, clock: Clock) -> dict[str, Any]:
    """What only v8 has: batches. In the queue `batched` (one cluster: the trigger that
    publishes callbacks here), a batch with both callbacks, one of its three messages acked,
    and a batch done (its callback published); in `sharded`, the tables of shard `a` of a
    sharded queue (the trigger that writes callbacks to the outbox), a batch living there with
    a message pending."""
    from rqlite_queue import ShardedTransport

    found: dict[str, Any] = {}
    batched = SqliteTransport(str(path), clock, queue="batched")
    with batched.batch(on_complete=("done", "early")) as finished:
        finished.publish("x", 0)
    batched.ack(_claim(batched, "x", "w7", 30))
    assert [e for _, e in batched.peek("done")] == ["early"]
    with batched.batch(on_complete=("done", "complete"), on_success=("ok", "success")) as open_:
        open_.publish_many([("m", 0), ("m", 1), ("n", 2)])
    batched.ack(_claim(batched, "done", "w7", 30))  # the first callback, handled
    batched.ack(_claim(batched, "m", "w7", 30))
    found["open"], found["done"] = open_.id, finished.id
    batched.close()
    other = path.with_name("v8-shard-b.db")
    sharded = ShardedTransport(
        f"a=sqlite:///{path};b=sqlite:///{other}", queue="sharded", clock=clock, max_skew=None
    )
    for _ in range(100):  # a batch on shard a (the one kept), its message in a group there
        with sharded.batch(on_complete=("cb", "sharded complete")) as made:
            pass
        if made.id.startswith("a/"):
            break
    else:
        raise AssertionError("no batch on shard a")
    group = next(f"s{i}" for i in range(100) if sharded.shard_of(f"s{i}") == "a")
    with sharded.batch(on_complete=(group, "sharded complete")) as on_a:
        on_a.publish(group, 0)
    assert on_a.id.startswith("a/"), on_a.id
    found["sharded"], found["sharded_group"] = on_a.id, group
    sharded.close()
    other.unlink()
    return found


def _commit() -> str:
    import subprocess

    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    )
    return done.stdout.strip()


def _claim(q: SqliteTransport, group: str, worker: str, visibility: float) -> object:
    lease = q.claim(worker, visibility)
    assert lease is not None and lease.group_id == group, (group, lease)
    return lease


if __name__ == "__main__":
    raise SystemExit(main())
