"""The dashboard and the admin calls behind a large queue: each page's answer time, and each
admin call's, with 1M messages in 100k groups on a fresh local 3-node cluster (`--quick`: 100k
in 10k). Some groups are leased, parked and held, some messages dead-lettered, as in a
production queue. The dashboard is the real command (`rqlite-queue dashboard`); pages are
fetched over HTTP, several times each, after one warm-up.

    .venv/bin/python bench/dashboard_bench.py [--quick]

Writes bench/results/dashboard.md."""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from systems import RqliteAdmin, build_ours, reset_ours

from rqlite_queue import RqliteTransport
from rqlite_queue.testing import Cluster

QUEUE = "dash"
RESULTS = Path(__file__).resolve().parent / "results"
TARGET_MS = 300.0
REPEATS = 7


def timed(call: object, repeats: int = REPEATS) -> list[float]:
    assert callable(call)
    call()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(1e3 * (time.perf_counter() - start))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k messages in 10k groups")
    args = parser.parse_args()
    messages, groups = (100_000, 10_000) if args.quick else (1_000_000, 100_000)
    exe = shutil.which("rqlite-queue", path=str(Path(sys.executable).parent))
    assert exe, "rqlite-queue is not installed in this environment"
    rows: list[tuple[str, list[float]]] = []
    started = time.time()
    with Cluster(3, fast=False) as cluster:
        admin = RqliteAdmin(cluster.leader().http_url)
        reset_ours(admin, QUEUE)
        t0 = time.perf_counter()
        build_ours(admin, QUEUE, messages, groups)
        print(
            f"built {messages:,} messages in {groups:,} groups in {time.perf_counter() - t0:.0f}s"
        )
        q = RqliteTransport(cluster.url, queue=QUEUE, deadline=120, timeout=120)
        q.setup()
        leases = q.claim_many("bench-worker", 3600, 2000)
        for lease in leases[:500]:
            q.nack(lease, delay=3600)
        q.settle_and_claim(dead=[(lease, "bench: poison") for lease in leases[500:1500]])
        for i in range(0, 100):
            q.hold_group(f"g{i * 7 + 3}")
        stats = q.stats()
        print(f"queue: {stats}")

        rows.append(("stats()", timed(q.stats)))
        rows.append(("groups(limit=100)", timed(lambda: q.groups(limit=100))))
        rows.append(("groups(after=, limit=100)", timed(lambda: q.groups(after="g5", limit=100))))
        rows.append(("groups(prefix='g777')", timed(lambda: q.groups(prefix="g777"))))
        rows.append(("groups(state='parked')", timed(lambda: q.groups(state="parked"))))
        rows.append(("groups(state='held', limit=100)", timed(lambda: q.groups(state="held"))))
        rows.append(("groups(min_priority=4) (none)", timed(lambda: q.groups(min_priority=4))))
        rows.append(("peek(group, 50)", timed(lambda: q.peek("g12345", 50))))
        rows.append(("dead_letters(50)", timed(lambda: q.dead_letters(50))))
        rows.append(("set_priority", timed(lambda: q.set_priority("g4242", 2))))
        rows.append(
            (
                "hold_group + release_group",
                timed(lambda: (q.hold_group("g99"), q.release_group("g99"))),
            )
        )
        victims = iter(f"g{i}" for i in range(50_000, 60_000))
        rows.append(
            ("cancel_group (10 messages)", timed(lambda: q.cancel_group(next(victims), "bench")))
        )

        process = subprocess.Popen(
            [
                exe,
                "--url",
                cluster.url,
                "--queue",
                QUEUE,
                "--timeout",
                "120",
                "dashboard",
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            found = re.search(r"on (http://\S+?)/ ", process.stdout.readline())
            assert found, "the dashboard did not start"
            with httpx.Client(base_url=found.group(1), timeout=120) as http:
                for label, path in [
                    ("page: overview", "/"),
                    ("page: overview, live refresh", "/fragments/overview"),
                    ("page: groups", "/groups"),
                    ("page: groups, state=parked", "/groups?state=parked"),
                    ("page: groups, prefix=g777", "/groups?prefix=g777"),
                    ("page: a group", "/group?id=g12345"),
                    ("page: dead letters", "/dead"),
                    ("page: schedules", "/schedules"),
                ]:

                    def get(path: str = path) -> None:
                        assert http.get(path).status_code == 200

                    rows.append((label, timed(get)))
        finally:
            process.terminate()
            process.wait(30)
        q.close()
        admin.close()

    lines = [
        "# The dashboard and the admin calls behind a large queue",
        "",
        f"`.venv/bin/python bench/dashboard_bench.py{' --quick' if args.quick else ''}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}: {messages:,} messages in "
        f"{groups:,} groups on a fresh local 3-node cluster (2,000 groups leased, 500 of them "
        f"parked, 1,000 dead letters, 100 held groups). Milliseconds per call from this "
        f"process (the pages: over HTTP from the real `rqlite-queue dashboard`), {REPEATS} "
        f"calls after a warm-up. Target: every page ≤ {TARGET_MS:.0f} ms.",
        "",
        "| call | median ms | max ms | ≤ 300 ms |",
        "| --- | ---: | ---: | --- |",
    ]
    for label, times in rows:
        verdict = (
            "" if not label.startswith("page") else ("yes" if max(times) <= TARGET_MS else "**no**")
        )
        lines.append(f"| {label} | {statistics.median(times):.1f} | {max(times):.1f} | {verdict} |")
    text = "\n".join(lines) + "\n"
    out = RESULTS / ("dashboard_quick.md" if args.quick else "dashboard.md")
    out.write_text(text)
    print(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
