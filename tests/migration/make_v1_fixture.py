"""Makes `fixtures/v1.db`: a queue database written by the schema-v1 code, kept in the repo so
the upgrade path is always tested from a real older database.

It was run once, against the v1 code (commit 6bbd137):

    git worktree add /tmp/v1 6bbd137
    PYTHONPATH=/tmp/v1/src python tests/migration/make_v1_fixture.py

and its output committed. Running it against newer code would make a database of the newer
schema, which is not what the upgrade tests need. `fixtures/v1.json` records what the upgrade
tests expect to find (the clock, the leases and their tokens)."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

from rqlite_queue import SqliteTransport
from rqlite_queue.sql import SCHEMA_VERSION  # the v1 code's own module

HERE = Path(__file__).resolve().parent / "fixtures"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def main() -> int:
    if SCHEMA_VERSION != 1:
        print(f"this is schema v{SCHEMA_VERSION} code: run it against the v1 code", file=sys.stderr)
        return 1
    HERE.mkdir(exist_ok=True)
    path = HERE / "v1.db"
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
    other.close()
    stats = q.stats()
    q.close()
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode=DELETE")
    with sqlite3.connect(path) as db:
        db.execute("VACUUM")
    facts = {
        "made_by": "tests/migration/make_v1_fixture.py at commit 6bbd137 (schema v1)",
        "clock": clock.now,
        "queues": ["default", "other"],
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
        "stats": {
            "depth": stats.depth,
            "groups": stats.groups,
            "in_flight": stats.in_flight,
            "parked": stats.parked,
            "dead": stats.dead,
        },
    }
    (HERE / "v1.json").write_text(json.dumps(facts, indent=2) + "\n")
    print(json.dumps(facts, indent=2))
    return 0


def _claim(q: SqliteTransport, group: str, worker: str, visibility: float) -> object:
    lease = q.claim(worker, visibility)
    assert lease is not None and lease.group_id == group, (group, lease)
    return lease


if __name__ == "__main__":
    raise SystemExit(main())
