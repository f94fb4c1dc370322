"""What the client spends making a plan, before and after a change: each operation's plan made
and serialised as the rqlite client sends it (`request_for`), in-process, no I/O: the part of
the client's CPU per message that is the library's own (the rest is the HTTP client's).

    .venv/bin/python bench/plan_cost.py --before fb162d1            # against the working tree
    .venv/bin/python bench/plan_cost.py --before REV --after REV2 --reps 5

Each version runs from its own `git worktree` (as bench/before_after.py makes them) in a child
process of its own; the child finds the version's API (the protocol by family, or the core's
methods before it). Per repetition the two versions run back to back, in an order that
alternates; a cell is the least time of `--runs` timeit runs, in microseconds per plan; the
ratio is after/before within each repetition. Writes bench/results/plan_cost.md.

With `--instructions`, each plan's cost is counted in instructions instead (valgrind's
callgrind, which counts the same on a busy machine: the difference between 1 + `--count`
and 1 plans, over `--count`), once per version: steady where a shared machine's clock swings.

    .venv/bin/python bench/plan_cost.py --before fb162d1 --instructions --count 200"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from before_after import ROOT, run_child, worktree

CHILD = r"""
import itertools, json, sys, timeit
from rqlite_queue import Lease
from rqlite_queue._protocol.core import QueueCore
from rqlite_queue._protocol.http import request_for

runs, op, count = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
tokens = itertools.count()
core = QueueCore(queue="bench", clock=lambda: 1.8e9, token=lambda: str(next(tokens)),
                 chance=lambda: 0.9)
leases = [Lease(i, f"g{i}", None, "w:x", 1, 1.8e9 + 30) for i in range(1, 9)]
try:  # the protocol by family
    from rqlite_queue._protocol import messages, publish, round_spec, rounds
    from rqlite_queue._protocol.messages import Message
    from rqlite_queue._protocol.round_spec import RoundSpec

    def round_plan(**spec):
        return rounds.plan(core, round_spec.check(core, RoundSpec(**spec)))

    def publish_plan(items):
        checked = messages.checked(core, Message.parse_many(items), scoped=False)
        return publish.plan(core, checked, tenants_on=False)
except ImportError:  # the core's methods
    from rqlite_queue._protocol.params import Message, RoundSpec

    def round_plan(**spec):
        return core.round(core.check_round(RoundSpec(**spec)))

    def publish_plan(items):
        return core.publish(core.messages(Message.parse_many(items), scoped=False),
                            tenants_on=False)

many = [(f"g{i}", i) for i in range(1000)]
ops = {
    "Worker round, ack 1 + claim 1": (lambda: round_plan(worker_id="w", visibility=30, n=1,
                                                        ack=leases[:1]), 3000),
    "Worker round, ack 8 + claim 8": (lambda: round_plan(worker_id="w", visibility=30, n=8,
                                                        ack=leases), 2000),
    "claim()": (lambda: round_plan(worker_id="w", visibility=30, n=1), 3000),
    "ack()": (lambda: round_plan(ack=leases[:1]), 3000),
    "publish()": (lambda: publish_plan([("g1", {"a": 1})]), 3000),
    "publish_many(1,000)": (lambda: publish_plan(many), 30),
}
if op:  # (counted from outside: this op, `count` times after one)
    make = ops[op][0]
    for _ in range(1 + count):
        request_for(make().batch)
    raise SystemExit(0)
out = {}
for name, (make, number) in ops.items():
    def once(make=make):
        request_for(make().batch)
    once()
    out[name] = min(timeit.repeat(once, number=number, repeat=runs)) / number * 1e6
print(json.dumps(out))
print(json.dumps(list(ops)), file=sys.stderr)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the git revision to compare against")
    parser.add_argument("--after", default=None, help="default: the working tree")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--instructions", action="store_true", help="count them (valgrind)")
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "plan_cost.md"))
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": worktree(args.before, Path(tmp) / "before") / "src"}
        trees["after"] = (
            worktree(args.after, Path(tmp) / "after") / "src" if args.after else ROOT / "src"
        )
        try:
            if args.instructions:
                text = instructions(trees, args)
                Path(args.out).write_text(text)
                print(text)
                return 0
            for rep in range(args.reps):
                for version in ["before", "after"] if rep % 2 == 0 else ["after", "before"]:
                    child = run_child(trees[version], CHILD, [str(args.runs), "", "0"])
                    for name, us in json.loads(child.stdout.strip().splitlines()[-1]).items():
                        results[version].setdefault(name, []).append(us)
                    print(f"rep {rep + 1} {version}: done", flush=True)
        finally:
            for name in ("before", "after"):
                if (Path(tmp) / name).exists():
                    subprocess.run(
                        ["git", "-C", str(ROOT), "worktree", "remove", "--force", tmp + "/" + name],
                        check=False,
                        capture_output=True,
                    )
    label = args.after or "working tree"
    lines = [
        "# Making a plan, before and after",
        "",
        f"`{' '.join(['bench/plan_cost.py', *sys.argv[1:]])}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: before = `{args.before}`, "
        f"after = `{label}`. In-process, no I/O: each plan made and serialised as the rqlite "
        f"client sends it; {args.reps} repetitions, the versions back to back in alternating "
        f"order; cells: microseconds per plan, median [min-max] of the repetitions (each the "
        f"least of {args.runs} timeit runs); the ratio is after/before within each repetition.",
        "",
        "| plan | before us | after us | after/before |",
        "| --- | --- | --- | --- |",
    ]
    for name, before in results["before"].items():
        after = results["after"][name]
        ratios = [a / b for a, b in zip(after, before, strict=True)]
        lines.append(
            f"| {name} | {_cell(before, '.1f')} | {_cell(after, '.1f')} | {_cell(ratios, '.2f')} |"
        )
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


def instructions(trees: dict[str, Path], args: argparse.Namespace) -> str:
    """Instructions per plan of each version, counted by callgrind."""
    import os
    import re

    ops = json.loads(
        run_child(trees["after"], CHILD, ["1", "", "0"]).stderr.strip().splitlines()[-1]
    )

    def counted(src: Path, op: str, count: int) -> int:
        ran = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                "-c",
                CHILD,
                "1",
                op,
                str(count),
            ],
            env={**os.environ, "PYTHONPATH": str(src)},
            capture_output=True,
            text=True,
            check=True,
        )
        found = re.search(r"Collected : (\d+)", ran.stderr)
        if found is None:
            raise SystemExit(f"callgrind said nothing countable:\n{ran.stderr[-2000:]}")
        return int(found.group(1))

    lines = [
        "# Making a plan, before and after: instructions",
        "",
        f"`{' '.join(['bench/plan_cost.py', *sys.argv[1:]])}`, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: before = `{args.before}`, "
        f"after = `{args.after or 'working tree'}`. Instructions per plan (callgrind: the "
        f"difference between 1 + {args.count} plans and 1, over {args.count}), each plan made "
        "and serialised as the rqlite client sends it.",
        "",
        "| plan | before | after | after/before |",
        "| --- | --- | --- | --- |",
    ]
    for op in ops:
        per = {}
        for version in ("before", "after"):
            many = counted(trees[version], op, args.count)
            one = counted(trees[version], op, 0)
            per[version] = (many - one) / args.count
            print(f"{op} {version}: {per[version]:,.0f} instructions a plan", flush=True)
        ratio = per["after"] / per["before"]
        lines.append(f"| {op} | {per['before']:,.0f} | {per['after']:,.0f} | {ratio:.2f} |")
    return "\n".join(lines) + "\n"


def _cell(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


if __name__ == "__main__":
    raise SystemExit(main())
