"""Why the embedded queue publishes rows as bound parameters and rqlite as one JSON text.

`sql.publish` has two forms of the same statements: the rows as one JSON text that SQL walks
with `json_each` (one parameter), or as the bound parameters of one multi-row INSERT (three or
more a row: `sql._publish_bound`). This publishes the same batches both ways, interleaved, with
the library's own planner on each backend (a 3-node and a 1-node local rqlite cluster, and the
embedded SQLite), and reports messages per second, medians of the repetitions. The backend's
choice (`Backend.binds_rows`) follows it.

    .venv/bin/python bench/bound_rows.py [--reps 5] [--batches 10] [--batch 1000]

Writes bench/results/bound_rows.md."""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rqlite_queue import Transport
from rqlite_queue.testing import Cluster

RESULTS = Path(__file__).resolve().parent / "results" / "bound_rows.md"
FORMS = {"JSON text": False, "bound rows": True}


def _rate(q: Transport, batches: list[list[tuple[str, Any]]]) -> float:
    start = time.perf_counter()
    for batch in batches:
        q.publish_many(batch)
    return sum(map(len, batches)) / (time.perf_counter() - start)


def measure(url: str, args: argparse.Namespace) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {form: [] for form in FORMS}
    for rep in range(args.reps):
        forms = list(FORMS.items())
        for form, bound in forms if rep % 2 == 0 else reversed(forms):
            q = Transport.from_url(url, queue=f"b{rep}_{int(bound)}")
            q.router.backend.binds_rows = bound  # type: ignore[attr-defined]
            q.publish("warm", 0)  # (the schema made, outside the clock)
            batches = [
                [(f"g{i % 100}", {"i": i}) for i in range(k * args.batch, (k + 1) * args.batch)]
                for k in range(args.batches)
            ]
            rates[form].append(_rate(q, batches))
            q.close()
            print(f"{url[:30]} {form}: {rates[form][-1]:,.0f} msg/s", file=sys.stderr)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
    for nodes in (3, 1):
        with Cluster(nodes) as cluster:
            results[f"rqlite, {nodes} node{'s' * (nodes > 1)}"] = measure(cluster.url, args)
    with tempfile.TemporaryDirectory() as tmp:
        results["embedded SQLite"] = measure(f"sqlite:///{tmp}/q.db", args)
    lines = [
        "# publish_many: rows as one JSON text or as bound parameters",
        "",
        f"`.venv/bin/python bench/bound_rows.py --reps {args.reps} --batches {args.batches} "
        f"--batch {args.batch}`, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
        f"publish_many({args.batch:,}) of plain messages in 100 groups, "
        f"{args.batches} batches a repetition, both forms interleaved; messages per second, "
        "median [min-max] of the repetitions; the ratio is taken within each repetition.",
        "",
        "| backend | JSON text | bound rows | bound / JSON |",
        "| --- | --- | --- | --- |",
    ]
    for backend, rates in results.items():
        ratios = [b / j for b, j in zip(rates["bound rows"], rates["JSON text"], strict=True)]
        cells = [
            f"{statistics.median(v):,.0f} [{min(v):,.0f}-{max(v):,.0f}]"
            for v in (rates["JSON text"], rates["bound rows"])
        ]
        lines.append(
            f"| {backend} | {cells[0]} | {cells[1]} | {statistics.median(ratios):.2f}x "
            f"[{min(ratios):.2f}-{max(ratios):.2f}] |"
        )
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
