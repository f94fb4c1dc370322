"""The Worker section's tables, targets and plot (see worker_bench.py for what is measured)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from measure import Point, Results
from tables import cell, ratio, table

LABELS = {
    "worker": "Worker (threads)",
    "worker_async": "AsyncWorker",
    "floor": "floor: bare write, urllib3",
    "floor_async": "floor: bare write, aiohttp",
    "many": "claim_many(32) + ack_many loop",
    "procrastinate": "Procrastinate, lock per group",
    "harel": "harel RqliteTransport loop",
    "harel_redis": "harel RedisTransport loop",
    "harel_pg": "harel PostgresTransport loop",
}
ORDER = list(LABELS)


@dataclass
class Target:
    name: str
    measured: str
    met: bool | None  # None: not measured in this run
    info: bool = False  # a figure to report, with no threshold


def _at_most(value: float, limit: float) -> bool | None:
    return None if value != value else value <= limit


def _at_least(value: float, limit: float) -> bool | None:
    return None if value != value else value >= limit


def _median(p: Point | None) -> float:
    return p.median if p is not None and p.values else float("nan")


def _value_targets(res: Results) -> list[Target]:
    sec = "rqlite.worker"
    out = []
    kinds = (("worker", "Worker"), ("worker_async", "AsyncWorker"))
    for system, name in kinds:
        p = res.get(f"{sec}.raft", system, 1)
        out.append(
            Target(
                f"{name}, concurrency 1: ≤ 1.05 Raft entries per message",
                cell(p),
                _at_most(_median(p), 1.05),
            )
        )
    for system, name in kinds:
        floor = "floor" if system == "worker" else "floor_async"
        client = "urllib3" if system == "worker" else "aiohttp"
        r = ratio(res.get(sec, system, 1), res.get(sec, floor, 1))
        out.append(
            Target(
                f"{name}, concurrency 1: throughput ≥ 0.8x the bare write over {client}",
                str(r),
                _at_least(r.median, 0.8) if r.values else None,
            )
        )
    for system, name in kinds:
        p = res.get(sec, system, 64)
        out.append(
            Target(
                f"{name}, concurrency 64: ≥ 3,000 msg/s claimed + acked (no-op handler)",
                cell(p) + " msg/s" * (p is not None),
                _at_least(_median(p), 3000),
            )
        )
    for system, name in kinds:
        r = ratio(res.get(sec, system, 64), res.get(sec, "procrastinate", 64))
        out.append(
            Target(
                f"{name}, concurrency 64: ≥ 5x Procrastinate with a lock per group",
                str(r),
                _at_least(r.median, 5) if r.values else None,
            )
        )
    for system, name in kinds:
        r = ratio(res.get(sec, system, 8), res.get(sec, "harel_redis", 8))
        out.append(
            Target(
                f"{name}, concurrency 8: ≥ 1.5x harel's Redis transport (issue 23)",
                str(r),
                _at_least(r.median, 1.5) if r.values else None,
            )
        )
    for system, name in kinds:
        p = res.get(f"{sec}.raft", system, 64)
        out.append(
            Target(
                f"{name}, concurrency 64: ≤ 0.1 Raft entries per message",
                cell(p),
                _at_most(_median(p), 0.1),
            )
        )
    return out


def _idle_targets(res: Results) -> list[Target]:
    sec = "rqlite.idle"
    out = []
    for system, name in (("worker", "Worker"), ("worker_async", "AsyncWorker")):
        p = res.get(sec, system, "raft entries/min")
        out.append(
            Target(
                f"idle {name}: 0 Raft entries per minute",
                cell(p) + " per minute" * (p is not None),
                None if p is None else p.median == 0,
            )
        )
    for system, name in (("worker", "Worker"), ("worker_async", "AsyncWorker")):
        p50, p99 = res.get(sec, system, "pickup p50"), res.get(sec, system, "pickup p99")
        out.append(
            Target(
                f"idle {name}: pickup p50 ≤ 100 ms (default poll_interval)",
                f"p50 {cell(p50)} ms, p99 {cell(p99)} ms" if p50 else "-",
                _at_most(_median(p50), 100),
            )
        )
    return out


def _batched_targets(res: Results) -> list[Target]:
    sec = "rqlite.worker"
    out = []
    for c in (8, 32):
        r = ratio(res.get(sec, "worker_async", c), res.get(sec, "worker", c))
        out.append(
            Target(
                f"AsyncWorker ≥ 1.0x Worker at concurrency {c}",
                str(r),
                _at_least(r.median, 1.0) if r.values else None,
            )
        )
    for system, name in (("worker", "Worker"), ("worker_async", "AsyncWorker")):
        p = res.get(f"{sec}.client_cpu", system, 64)
        out.append(
            Target(
                f"{name}: client CPU per message (batched: concurrency 64) ≤ 0.1 ms",
                cell(p) + " ms" * (p is not None),
                _at_most(_median(p), 0.1),
            )
        )
    for system, name in (("worker", "Worker"), ("worker_async", "AsyncWorker")):
        p = res.get("sqlite.worker", system, 64)
        out.append(
            Target(
                f"embedded SQLite {name}: ≥ 10,000 msg/s at concurrency 64",
                cell(p) + " msg/s" * (p is not None),
                _at_least(_median(p), 10_000),
            )
        )
    for env, where in (("rqlite", "rqlite"), ("sqlite", "embedded SQLite")):
        sec = f"{env}.publish"
        big = max((int(p.x) for p in res.section(sec) if p.system == "floor_rows"), default=0)
        r = ratio(res.get(sec, "ours", big), res.get(sec, "floor_rows", big))
        out.append(
            Target(
                f"{where}: publish_many({big:,}) rows/s against a bare {big:,}-row INSERT "
                "(was 0.16x)",
                str(r),
                None if not r.values else True,
                info=True,
            )
        )
    return out


def targets(res: Results) -> list[Target]:
    return _value_targets(res) + _idle_targets(res) + _batched_targets(res)


def targets_table(ts: list[Target]) -> str:
    def verdict(t: Target) -> str:
        if t.met is None:
            return "not measured"
        if t.info:
            return "reported (no threshold)"
        return "met" if t.met else "**missed**"

    return table(
        ["target", "measured: median [min-max] over the repetitions", "verdict"],
        [(t.name, t.measured, verdict(t)) for t in ts],
    )


# -------------------------------------------------------------------------------- tables


def _systems(res: Results, sec: str) -> list[str]:
    found = {p.system for p in res.section(sec)}
    return [s for s in ORDER if s in found]


def throughput_md(res: Results, env: str = "rqlite") -> str:
    sec = f"{env}.worker"
    cs = sorted({int(p.x) for p in res.section(sec)})
    has = set(_systems(res, sec))

    def r(a: str, b: str, c: int) -> str:
        return str(ratio(res.get(sec, a, c), res.get(sec, b, c))) if {a, b} <= has else ""

    header = ["concurrency", "Worker msg/s", "AsyncWorker msg/s", "async / sync"]
    peers = [s for s in ("procrastinate", "harel", "harel_redis", "harel_pg") if s in has]
    for peer in peers:
        header += [f"{LABELS[peer]} msg/s", f"Worker / {peer}", f"AsyncWorker / {peer}"]
    rows = []
    for c in cs:
        row = [
            c,
            cell(res.get(sec, "worker", c)),
            cell(res.get(sec, "worker_async", c)),
            r("worker_async", "worker", c),
        ]
        for peer in peers:
            row += [
                cell(res.get(sec, peer, c)),
                r("worker", peer, c) if res.get(sec, peer, c) else "",
                r("worker_async", peer, c) if res.get(sec, peer, c) else "",
            ]
        rows.append(row)
    return table(header, rows)


def _label(system: str, env: str) -> str:
    if env == "sqlite" and system == "floor":
        return "floor: bare SQLite write (sqlite3)"
    return LABELS[system]


def cost_md(res: Results, env: str = "rqlite") -> str:
    sec = f"{env}.worker"
    server = "PostgreSQL" if env == "rqlite" else ""
    rows = []
    for system in _systems(res, sec):
        for c in sorted({int(p.x) for p in res.section(sec) if p.system == system}):
            p = res.get(sec, system, c)
            raft = res.get(f"{sec}.raft", system, c)
            commits = res.get(f"{sec}.commits", system, c)
            rows.append(
                (
                    _label(system, env),
                    c,
                    cell(p),
                    cell(raft) if raft else (f"{cell(commits)} commits" if commits else "-"),
                    cell(res.get(f"{sec}.per_round", system, c)),
                    cell(res.get(f"{sec}.server_cpu", system, c)),
                    cell(res.get(f"{sec}.client_cpu", system, c)),
                    (p.note if p else "") or "",
                )
            )
    cpu = (
        f"rqlited CPU ms/msg (3 nodes; {server} for Procrastinate)"
        if env == "rqlite"
        else "server CPU ms/msg"
    )
    return table(
        [
            "system",
            "concurrency",
            "msg/s",
            "Raft entries/msg",
            "msg per round trip",
            cpu,
            "client CPU ms/msg",
            "note",
        ],
        rows,
    )


def idle_md(res: Results) -> str:
    sec = "rqlite.idle"
    rows = []
    for system in ("no client", "worker", "worker_async"):
        if not any(p.system == system for p in res.section(sec)):
            continue

        def g(x: str, s: str = system) -> str:
            return cell(res.get(sec, s, x))

        rows.append(
            (
                {"no client": "cluster, no client"}.get(system, LABELS.get(system, system)),
                g("raft entries/min"),
                g("writes/min"),
                g("probes/min"),
                g("rqlited CPU ms/s"),
                g("client CPU ms/s"),
                g("pickup p50"),
                g("pickup p99"),
                g("pickup max"),
            )
        )
    return table(
        [
            "",
            "Raft entries/min",
            "write round trips/min",
            "probes (reads)/min",
            "rqlited CPU ms/s",
            "client CPU ms/s",
            "pickup p50 ms",
            "pickup p99 ms",
            "pickup max ms",
        ],
        rows,
    )


def drift_md(res: Results) -> str:
    pts = [p for p in res.section("rqlite.drift") if p.system == "floor"]
    rows = [(p.x, cell(p), cell(res.get("rqlite.drift", "floor cpu", p.x))) for p in pts]
    return table(["before the section", "bare writes/s", "rqlited CPU ms/write"], rows)


def markdown(res: Results, meta: dict[str, str]) -> str:
    if not res.section("rqlite.worker") and not res.section("sqlite.worker"):
        return ""
    parts = ["\n## The Worker\n"]
    parts.append(f"\nPeers in this run: {meta.get('peers', 'n/a')}.\n")
    parts.append("\n### Targets (the issue's, FULL bench)\n\n" + targets_table(targets(res)))
    if res.section("rqlite.worker"):
        parts.append(
            "\n### Throughput against concurrency (rqlite, no-op handler)\n\n"
            "Each ratio is taken per repetition, between runs of the same repetition.\n\n"
            + throughput_md(res)
        )
        parts.append(
            "\n### Cost per message (rqlite)\n\nRaft entries: the leader's `last_log_index` "
            "before and after the window. msg per round trip: messages acked per write round "
            "of the Worker.\n\n" + cost_md(res)
        )
    if res.section("rqlite.idle"):
        parts.append(
            "\n### Idle Worker (empty queue, default poll_interval 0.05 s), and pickup latency\n\n"
            "Pickup: single messages published 100-300 ms apart while the worker idles; "
            "publish returned -> handler started.\n\n" + idle_md(res)
        )
    if res.section("sqlite.worker"):
        parts.append("\n### Embedded SQLite Worker\n\n" + cost_md(res, "sqlite"))
    if res.section("rqlite.drift"):
        parts.append(
            "\n### The cluster's speed over the run\n\n500 bare writes (urllib3, one at a "
            "time) before each section, on the same cluster.\n\n" + drift_md(res)
        )
    return "\n".join(parts)


# ---------------------------------------------------------------------------------- plot

STYLE: dict[str, tuple[str, str]] = {
    "worker": ("tab:blue", "o"),
    "worker_async": ("tab:cyan", "^"),
    "procrastinate": ("tab:purple", "s"),
    "harel": ("tab:red", "D"),
    "harel_redis": ("tab:orange", "v"),
    "harel_pg": ("tab:brown", "P"),
    "floor": ("tab:gray", "x"),
    "floor_async": ("dimgray", "+"),
    "many": ("tab:green", "*"),
}


def _series(ax: Any, res: Results, sec: str, system: str) -> None:
    pts = sorted((p for p in res.section(sec) if p.system == system), key=lambda p: int(p.x))
    if not pts:
        return
    color, marker = STYLE[system]
    xs = [int(p.x) for p in pts]
    ys = [p.median for p in pts]
    err = [
        [y - p.low for y, p in zip(ys, pts, strict=True)],
        [p.high - y for y, p in zip(ys, pts, strict=True)],
    ]
    ls = "-" if len(pts) > 1 else "none"
    ax.errorbar(xs, ys, yerr=err, color=color, marker=marker, ls=ls, label=LABELS[system], ms=7)


def plot(res: Results, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    panels = [
        ("rqlite.worker", "messages per second"),
        ("rqlite.worker.raft", "Raft entries per message"),
    ]
    if not res.section("rqlite.worker"):
        return made
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    _series(axes[1], res, "rqlite.worker.commits", "procrastinate")
    for ax, (sec, ylabel) in zip(axes, panels, strict=True):
        for system in STYLE:
            _series(ax, res, sec, system)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("concurrency (handler slots, threads or tasks)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_title("rqlite: throughput vs concurrency (median, min-max)")
    axes[1].set_title("Raft log entries (Procrastinate: PostgreSQL commits) per message")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    name = "rqlite_worker_throughput.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    made.append(name)
    return made
