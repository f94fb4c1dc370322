"""The Python cost per message of an embedded `publish_many(1000)`: checking, encoding and
planning the batch (no SQL), the least of 60 runs, in microseconds per message.

    PYTHONPATH=src .venv/bin/python bench/publish_many_cost.py
    git worktree add /tmp/before REV && PYTHONPATH=/tmp/before/src .venv/bin/python \\
        bench/publish_many_cost.py                  # the same for another version

Run the two versions alternately, a few times each: the least of 60 is steadier than a mean
on a shared machine, not immune to it."""

from __future__ import annotations

import tempfile
import time

from rqlite_queue import Transport
from rqlite_queue._protocol.params import Message


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        q = Transport.from_url(f"sqlite:///{tmp}/q.db", queue="p")
        items = [(f"g{i % 100}", {"i": i, "x": "payload"}) for i in range(1000)]
        core = q._core  # (the pure half: no SQL)
        best = float("inf")
        for _ in range(60):
            started = time.perf_counter()
            checked = core.messages(Message.parse_many(items), scoped=False)
            core.publish(checked, tenants_on=False)
            best = min(best, time.perf_counter() - started)
        q.close()
    print(f"{best * 1e3:.2f} us/msg (least of 60 runs of 1,000)")


if __name__ == "__main__":
    main()
