"""Failover at real latencies against rqlited's Raft timers (issue 34, item 4): which heartbeat
and election timeouts keep the Workers' acks stopped for at most 2 s when the leader is cut off,
at round trips of 0, 1 and 4 ms on every link.

    .venv/bin/python bench/failover_settings.py [--rtts 0 1 4] [--isolations 3]

For each round trip and each setting: a 3-node cluster whose links go through toxiproxy, the
load of the link-fault suite (tests/chaos/link_faults.py: two Workers at concurrency 16 with the
library's defaults and leases of 30 s, a producer), and the leader isolated through the proxies
(its links silent, its open connections into the others' Raft links silenced) for 6 s,
`--isolations` times. Per isolation: the new leader (from the cut to one of the other nodes
saying it leads) and the failover (from the cut to the end of the first Worker round trip that
applied acks after the new leader). Writes bench/results/failover_settings.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rqlite_queue.rqlited import find_rqlited  # noqa: E402
from tests.chaos.link_faults import ISOLATE, LinkConfig, run_link_faults  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "failover_settings.md"
SETTINGS: dict[str, tuple[str, ...]] = {
    "rqlite's defaults (heartbeat 1 s, election 1 s)": (
        "-raft-timeout",
        "1s",
        "-raft-election-timeout",
        "1s",
        "-raft-leader-lease-timeout",
        "0s",
    ),
    "heartbeat 500 ms, election 1 s, lease 500 ms": (
        "-raft-timeout",
        "500ms",
        "-raft-election-timeout",
        "1s",
        "-raft-leader-lease-timeout",
        "500ms",
    ),
    "heartbeat 200 ms, election 400 ms, lease 200 ms": (
        "-raft-timeout",
        "200ms",
        "-raft-election-timeout",
        "400ms",
        "-raft-leader-lease-timeout",
        "200ms",
    ),
}


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} s (max {max(values):.2f})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtts", type=float, nargs="+", default=[0, 1, 4], help="ms")
    parser.add_argument("--isolations", type=int, default=3)
    parser.add_argument("--length", type=float, default=6.0, help="seconds of each isolation")
    args = parser.parse_args(argv)
    rqlited = find_rqlited().path
    rows: list[str] = []
    for rtt in args.rtts:
        for name, flags in SETTINGS.items():
            config = LinkConfig(seed=int(rtt * 10) + len(rows), rtt=rtt / 1e3, extra_args=flags)
            config.lengths = {**config.lengths, ISOLATE: args.length}
            config.gap = (3.0, 4.0)
            report = run_link_faults(config, rqlited, [ISOLATE] * args.isolations)
            elected = [f.elected for f in report.link_faults if f.elected is not None]
            failover = [
                f.elected + f.resumed
                for f in report.link_faults
                if f.elected is not None and f.resumed is not None
            ]
            misses = args.isolations - len(failover)
            within = sum(1 for v in failover if v <= 2.0)
            checks = "ok" if report.ok and not report.overlaps else "FAILED"
            rows.append(
                f"| {rtt:g} ms | {name} | {cell(elected)} | {cell(failover)} | "
                f"{within} of {args.isolations}"
                + (f" ({misses} without a new leader during the cut)" if misses else "")
                + f" | {checks} |"
            )
            print(rows[-1], flush=True)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = " ".join(["python bench/failover_settings.py", *argv])
    text = "\n".join(
        [
            "# Failover at real latencies, against rqlited's Raft timers",
            "",
            f"`{command}`, {when}. A 3-node cluster with every link through toxiproxy (the "
            "round trip +/- 10 %), the link-fault suite's load (two Workers at concurrency 16 "
            "with the library's defaults, leases of 30 s, a producer), the leader isolated "
            f"through the proxies for {args.length:g} s, {args.isolations} times per row. "
            "**New leader**: from the cut to one of the other nodes saying it leads. "
            "**Failover**: from the cut to the end of the first Worker round trip that applied "
            "acks after the new leader. Medians (max). **Checks**: nothing lost, FIFO, no two "
            "handlers of a group at once.",
            "",
            "| round trip | rqlited's Raft timers | new leader | failover | within 2 s | checks |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
        ]
    )
    RESULTS.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
