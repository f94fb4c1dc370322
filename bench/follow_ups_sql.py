"""What a Worker round's statements cost in SQLite, with and without follow-ups: the round
that acks 64 leases and claims 64 more, built by the library's own core, run on a SQLite file
(as each rqlite node runs it) inside a transaction that is rolled back, many times; the median
time of each statement.

    .venv/bin/python bench/follow_ups_sql.py [--leases 64] [--repeats 200]

The follow-ups are one per lease, each to a new group delayed an hour (`--into groups`) or all
to one held group (`--into held`)."""

from __future__ import annotations

import argparse
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rqlite_queue import SqliteTransport  # noqa: E402
from rqlite_queue._protocol import round_spec  # noqa: E402
from rqlite_queue._protocol import rounds as round_plans  # noqa: E402
from rqlite_queue._protocol.plan import Batch  # noqa: E402
from rqlite_queue._protocol.round_spec import RoundSpec  # noqa: E402


def follow_up(into: str, n: int) -> Any:
    if into == "held":
        return ("sink", n)
    return {"group_id": f"next-{n}", "event": n, "delay": 3600}


def timings(path: str, batch: Batch, repeats: int) -> dict[str, float]:
    """Median milliseconds per statement (keyed by the start of its SQL)."""
    conn = sqlite3.connect(path, isolation_level=None)
    seen: dict[str, list[float]] = {}
    for _ in range(repeats):
        conn.execute("BEGIN")
        for statement in batch.statements:
            started = time.perf_counter()
            conn.execute(statement.sql, statement.params).fetchall()
            key = re.sub(r"\s+", " ", statement.sql)[:70]
            seen.setdefault(key, []).append(time.perf_counter() - started)
        conn.execute("ROLLBACK")
    conn.close()
    return {key: statistics.median(values) * 1e3 for key, values in seen.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leases", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--into", choices=["groups", "held"], default="groups")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "q.db")
        q = SqliteTransport(path, queue="bench")
        q.hold_group("sink")
        q.publish_many([(f"g{i}", i) for i in range(args.leases * 30)])
        leases = q.claim_many("w", 600, args.leases)
        core = q._core  # the round's batch, built as the queue builds it
        specs = {
            "without": RoundSpec(worker_id="w", visibility=60, n=args.leases, ack=leases),
            "with": RoundSpec(
                worker_id="w",
                visibility=60,
                n=args.leases,
                ack=leases,
                publish=[(lease, [follow_up(args.into, lease.event)]) for lease in leases],
            ),
        }
        for name, spec in specs.items():
            batch = round_plans.plan(core, round_spec.check(core, spec)).batch
            times = timings(path, batch, args.repeats)
            print(f"{name} follow-ups: {sum(times.values()):.3f} ms per round")
            for key, ms in times.items():
                print(f"  {ms:7.3f} ms  {key}")
        q.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
