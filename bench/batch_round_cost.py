"""What counting batches adds to a Worker's round, in SQLite's own work: the round's batch (128
acks and a claim of 128) run on a fresh connection that caches no statement (as rqlite runs
every statement it is sent: compiled each time), `--rounds` times, each in a transaction
rolled back; the same round on messages that belong to batches of `--size` and on plain ones.

    PYTHONPATH=src .venv/bin/python bench/batch_round_cost.py

Microseconds per round (the least of `--runs`) move with the machine's load; instructions do
not: the difference between 11 rounds and 1, with valgrind,

    for rounds in 1 11; do for mode in plain batches; do PYTHONPATH=src valgrind \\
        --tool=callgrind --callgrind-out-file=/dev/null .venv/bin/python \\
        bench/batch_round_cost.py --mode $mode --rounds $rounds --runs 1 2>&1 \\
        | grep Collected; done; done"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time

from rqlite_queue import SqliteTransport
from rqlite_queue._protocol import round_spec, rounds
from rqlite_queue._protocol.round_spec import RoundSpec


def setup(mode: str, size: int, messages: int, groups: int) -> tuple[str, list[tuple[str, object]]]:
    """A queue's file with the backlog, and one round's statements (acking the first claim's
    leases, claiming as many)."""
    path = f"{tempfile.mkdtemp()}/q.db"
    queue = SqliteTransport(path, queue="bench")
    items = [(f"g{i % groups}", i) for i in range(messages)]
    if mode == "plain":
        queue.publish_many(items)
    else:
        for start in range(0, messages, size):
            with queue.batch(on_complete=(f"done-{start}", start)) as batch:
                batch.publish_many(items[start : start + size])
    leases = queue.claim_many("w", 3600, 128)
    core = queue._core
    core.chance = lambda: 1.0  # (no pruning by chance: the same round every time)
    checked = round_spec.check(core, RoundSpec(worker_id="w", visibility=3600, n=128, ack=leases))
    plan = rounds.plan(core, checked)
    queue.close()
    return path, [(s.sql, s.params) for s in plan.batch.statements]


def run(path: str, statements: list[tuple[str, object]], count: int) -> float:
    """Seconds for `count` rounds, each compiled anew and rolled back."""
    db = sqlite3.connect(path, cached_statements=0, isolation_level=None)
    t0 = time.perf_counter()
    for _ in range(count):
        db.execute("BEGIN")
        for sql, params in statements:
            db.execute(sql, params).fetchall()  # type: ignore[arg-type]
        db.execute("ROLLBACK")
    seconds = time.perf_counter() - t0
    db.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["plain", "batches", "both"], default="both")
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--size", type=int, default=20)
    args = parser.parse_args()
    modes = ["plain", "batches"] if args.mode == "both" else [args.mode]
    for mode in modes:
        path, statements = setup(mode, args.size, 4000, 800)
        best = min(run(path, statements, args.rounds) for _ in range(args.runs))
        print(f"{mode}: {len(statements)} statements, {best / args.rounds * 1e6:.0f} us a round")


if __name__ == "__main__":
    main()
