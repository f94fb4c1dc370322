"""The Python cost per message of an embedded `publish_many(1000)`: checking, encoding and
planning the batch (no SQL), the least of `--runs` runs (60), in microseconds per message.

    PYTHONPATH=src .venv/bin/python bench/publish_many_cost.py
    git worktree add /tmp/before REV && PYTHONPATH=/tmp/before/src .venv/bin/python \\
        bench/publish_many_cost.py                  # the same for another version

Run the two versions alternately, a few times each: the least of 60 is steadier than a mean
on a shared machine, not immune to it. Steadier still, instructions (valgrind counts them the
same on a busy machine): the difference between 11 runs and 1, over 10,000 messages,

    for runs in 1 11; do PYTHONPATH=src valgrind --tool=callgrind \\
        --callgrind-out-file=/dev/null .venv/bin/python bench/publish_many_cost.py \\
        --runs $runs 2>&1 | grep Collected; done"""

from __future__ import annotations

import argparse
import inspect
import tempfile
import time
from typing import Any

from rqlite_queue import Transport


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        q = Transport.from_url(f"sqlite:///{tmp}/q.db", queue="p")
        items = [(f"g{i % 100}", {"i": i, "x": "payload"}) for i in range(1000)]
        core = q._core  # (the pure half: no SQL)
        check, publish = _embedded_publish(core)
        best = float("inf")
        for _ in range(runs):
            started = time.perf_counter()
            publish(check(items))
            best = min(best, time.perf_counter() - started)
        q.close()
    print(f"{best * 1e3:.2f} us/msg (least of {runs} runs of 1,000)")


def _embedded_publish(core: Any) -> tuple[Any, Any]:
    """(the check of the items, the plan of their publish) as the embedded backend makes them:
    this version's functions of `_protocol.messages` and `_protocol.publish`, or an older
    version's methods of the core (versions before bound rows had no such argument: their plan
    is the same for every backend)."""
    try:
        from rqlite_queue._protocol import messages, publish
    except ImportError:
        from rqlite_queue._protocol.params import Message  # type: ignore[attr-defined]

        def check(items: Any) -> Any:
            return core.messages(Message.parse_many(items), scoped=False)

        if "bind_rows" in inspect.signature(core.publish).parameters:
            return check, lambda checked: core.publish(checked, tenants_on=False, bind_rows=True)
        return check, lambda checked: core.publish(checked, tenants_on=False)

    def checked(items: Any) -> Any:
        return messages.checked(core, messages.Message.parse_many(items), scoped=False)

    return checked, lambda rows: publish.plan(core, rows, tenants_on=False, bind_rows=True)


if __name__ == "__main__":
    main()
