"""Markdown tables, target verdicts and PNG plots from the points of a run.

Ratios are computed per repetition (ours and the baseline of the same repetition ran one right
after the other on the same cluster), then summarised as median [min-max]."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import report_worker
import river_bench
from measure import Results
from tables import Ratio, _num, cell, ratio, table

# ------------------------------------------------------------------------------------ targets


@dataclass
class Target:
    name: str
    measured: str
    met: bool | None  # None: not measured in this run


def _verdict(r: Ratio, limit: float, at_most: bool) -> bool | None:
    if not r.values:
        return None
    return r.median <= limit if at_most else r.median >= limit


def targets(res: Results, env: str) -> list[Target]:
    out: list[Target] = []
    cyc, split = f"{env}.cycle", f"{env}.split"
    for w in (1, 8, 32):
        r = ratio(res.get(cyc, "ours", w), res.get(cyc, "floor", w), invert=True)
        out.append(
            Target(
                f"claim+ack per message ≤ 2.5 x floor write ({w} worker{'s' * (w > 1)})",
                f"{r}",
                _verdict(r, 2.5, at_most=True),
            )
        )
    for w in (1, 8):
        r = ratio(res.get(cyc, "ours", w), res.get(cyc, "seed", w))
        out.append(
            Target(
                f"claim+ack throughput ≥ 2.5 x seed ({w} worker{'s' * (w > 1)})",
                f"{r}",
                _verdict(r, 2.5, at_most=False),
            )
        )
    big = f"{env}.cycle_big"
    for w in (1, 8):
        if res.get(big, "ours", w) is None:
            continue
        r = ratio(res.get(big, "ours", w), res.get(big, "seed", w))
        out.append(
            Target(
                f"claim+ack throughput ≥ 2.5 x seed ({w} worker{'s' * (w > 1)}), "
                "behind a 10k backlog",
                f"{r}",
                _verdict(r, 2.5, at_most=False),
            )
        )
    sweep = [p for p in res.section(f"{env}.sweep") if p.system.startswith("ours:")]
    for spread in sorted({p.system for p in sweep}):
        pts = sorted((p for p in sweep if p.system == spread), key=lambda p: int(p.x))
        if len(pts) >= 2:
            r = ratio(pts[-1], pts[0])
            out.append(
                Target(
                    f"claim latency at {int(pts[-1].x):,} ≤ 1.5 x at {int(pts[0].x):,} "
                    f"({spread.split(':', 1)[1]})",
                    f"{r}",
                    _verdict(r, 1.5, at_most=True),
                )
            )
    prio = [p for p in res.section(f"{env}.priority") if p.system.startswith("ours:")]
    behind = [p for p in prio if int(p.x) > 0]
    empty = [p for p in prio if int(p.x) == 0]
    if behind and empty:
        r = ratio(behind[0], empty[0])
        out.append(
            Target(
                f"claim(min_priority=4) behind {int(behind[0].x):,} priority-0 groups ≤ 1.5 x "
                "on a queue of only those",
                f"{r}",
                _verdict(r, 1.5, at_most=True),
            )
        )
    delayed = [p for p in res.section(f"{env}.delayed") if p.system.startswith("ours:")]
    loaded = [p for p in delayed if int(p.x) > 0]
    plain = [p for p in delayed if int(p.x) == 0]
    if loaded and plain:
        r = ratio(loaded[0], plain[0])
        out.append(
            Target(
                f"claim with {int(loaded[0].x):,} delayed messages queued ≤ 1.5 x with none",
                f"{r}",
                _verdict(r, 1.5, at_most=True),
            )
        )
    pub = f"{env}.publish"
    r = ratio(res.get(pub, "ours", 100), res.get(pub, "ours", 1))
    out.append(
        Target(
            "publish_many(100) ≥ 50 x single publish, per message",
            f"{r}",
            _verdict(r, 50, at_most=False),
        )
    )
    r = ratio(res.get(split, "ours/claim", 1), res.get(split, "ours_many/claim", 1))
    out.append(
        Target(
            "claim_many(32) ≥ 10 x claim, per message (claim time only, 1 worker)",
            f"{r}",
            _verdict(r, 10, at_most=False),
        )
    )
    return out


def targets_table(ts: list[Target]) -> str:
    mark = {True: "met", False: "**missed**", None: "not measured"}
    return table(
        ["target", "measured (median [min-max] of per-repetition ratios)", "verdict"],
        [(t.name, t.measured, mark[t.met]) for t in ts],
    )


# ------------------------------------------------------------------------------------ sections


def publish_md(res: Results, env: str) -> str:
    sec = f"{env}.publish"
    rows = []
    single = res.get(sec, "ours", 1)
    batches = sorted({int(p.x) for p in res.section(sec) if p.system == "ours" and p.x != 1})
    bare = {int(p.x): p for p in res.section(sec) if p.system == "floor_rows"}
    entries = [
        ("floor", 1, "floor: one UPDATE per request"),
        ("seed", 1, "seed: publish"),
        ("ours", 1, "ours: publish"),
    ] + [("ours", b, f"ours: publish_many({b})") for b in batches]
    entries += [("floor_rows", b, f"bare {b}-row INSERT (one request)") for b in sorted(bare)]
    for system, x, label in entries:
        p = res.get(sec, system, x)
        vs_bare = ratio(p, bare[x]) if system == "ours" and x in bare else None
        rows.append(
            (
                label,
                str(ratio(p, single)),
                str(ratio(p, res.get(sec, "seed", 1))),
                str(vs_bare) if vs_bare else "",
                cell(p),
            )
        )
    return table(
        [
            "",
            "per-message throughput vs our single publish",
            "vs the seed's publish",
            "vs the bare INSERT of as many rows",
            "msg/s",
        ],
        rows,
    )


def cycle_md(res: Results, env: str, sec: str = "") -> str:
    sec = sec or f"{env}.cycle"
    workers = sorted({int(p.x) for p in res.section(sec)})
    rows = []
    for w in workers:
        ours, seed_, floor = (res.get(sec, s, w) for s in ("ours", "seed", "floor"))
        row = [w, str(ratio(ours, seed_)), str(ratio(ours, floor, invert=True))]
        if res.get(sec, "ours_async", w) is not None:
            row += [
                str(ratio(res.get(sec, "ours_async", w), seed_)),
                str(
                    ratio(
                        res.get(sec, "ours_async", w), res.get(sec, "floor_async", w), invert=True
                    )
                ),
            ]
        row += [cell(floor), cell(seed_), cell(ours)]
        if res.get(sec, "ours_async", w) is not None:
            row += [cell(res.get(sec, "ours_async", w)), cell(res.get(sec, "floor_async", w))]
        rows.append(row)
    header = ["workers", "ours / seed (throughput)", "ours cost / floor cost"]
    if any(len(r) > 6 for r in rows):
        header += ["async ours / seed", "async ours cost / async floor cost"]
    header += ["floor writes/s", "seed msg/s", "ours msg/s"]
    if any(len(r) > 6 for r in rows):
        header += ["async ours msg/s", "async floor writes/s"]
    return table(header, rows)


def many_md(res: Results, env: str) -> str:
    sec, split = f"{env}.cycle", f"{env}.split"
    rows = []
    for system, label in (
        ("seed", "seed: claim + ack"),
        ("ours", "ours: claim + ack"),
        ("ours_many", "ours: claim_many(32) + ack_many"),
    ):
        c, a = res.get(split, f"{system}/claim", 1), res.get(split, f"{system}/ack", 1)
        rows.append(
            (
                label,
                str(ratio(res.get(sec, system, 1), res.get(sec, "ours", 1))),
                cell(c),
                cell(a),
                cell(res.get(sec, system, 1)),
            )
        )
    return table(
        ["one worker", "throughput vs ours claim + ack", "claim ms/msg", "ack ms/msg", "msg/s"],
        rows,
    )


def cpu_md(res: Results, env: str, sec: str = "") -> str:
    sec = sec or f"{env}.cpu"
    pts = res.section(sec)
    if not pts:
        return ""
    systems = sorted({p.system.split("/")[0] for p in pts})
    workers = sorted({int(p.x) for p in pts})
    rows = []
    for s in systems:
        for w in workers:
            c, v = res.get(sec, f"{s}/client", w), res.get(sec, f"{s}/server", w)
            if c is None:
                continue
            total = c.median + (v.median if v else 0.0)
            rows.append((s, w, cell(c), cell(v), _num(total)))
    return table(
        [
            "system",
            "workers",
            "client CPU ms/msg",
            "rqlited CPU ms/msg (3 nodes)",
            "total CPU ms/msg",
        ],
        rows,
    )


def latency_md(res: Results, sec: str) -> str:
    pts = res.section(sec)
    notes = sorted({p.system.split(":", 1)[1] for p in pts})
    xs = sorted({int(p.x) for p in pts})
    rows = []
    for note in notes:
        base = res.get(sec, f"ours:{note}", xs[0])
        for x in xs:
            o, s = res.get(sec, f"ours:{note}", x), res.get(sec, f"seed:{note}", x)
            if o is None:
                continue
            rows.append(
                (
                    f"{x:,}",
                    note,
                    str(ratio(o, base)),
                    str(ratio(s, o)),
                    cell(o),
                    cell(s),
                    (s.note if s else "") or "",
                )
            )
    return table(
        [
            "backlog",
            "groups",
            "ours vs ours at the smallest",
            "seed / ours",
            "ours claim ms",
            "seed claim ms",
            "note",
        ],
        rows,
    )


def delayed_md(res: Results, sec: str) -> str:
    pts = sorted(res.section(sec), key=lambda p: int(p.x))
    base = pts[0]
    rows = [(f"{int(p.x):,}", p.system.split(":", 1)[1], str(ratio(p, base)), cell(p)) for p in pts]
    return table(["delayed", "queue", "vs nothing delayed", "claim ms"], rows)


def timings_md(res: Results, env: str) -> str:
    sec = f"{env}.timings"
    ops = []
    for p in res.section(sec):
        if p.system not in ops:
            ops.append(p.system)
    rows = []
    for op in ops:
        wall, server, sql_ = (res.get(sec, op, k) for k in ("wall", "server", "sql"))
        w = wall.median if wall else float("nan")
        s = server.median if server else float("nan")
        q = sql_.median if sql_ else float("nan")
        if ", statement" in op:
            rows.append((f"&nbsp;&nbsp;{op}", "", "", _num(q), "", ""))
            continue
        rows.append(
            (
                op,
                _num(w),
                _num(s),
                _num(q),
                _num(s - q) if server else "-",
                _num(w - s) if server else "-",
            )
        )
    return table(
        [
            "request",
            "client wall ms",
            "rqlite time ms",
            "of which SQL ms",
            "Raft + rqlite ms (time - SQL)",
            "HTTP + client ms (wall - time)",
        ],
        rows,
    )


def size_md(res: Results, env: str) -> str:
    sec = f"{env}.size"
    variants = []
    for p in res.section(sec):
        v = p.system.rsplit("/", 1)[0]
        if v not in variants:
            variants.append(v)
    floor_wall = res.get(sec, "floor write/wall", _x(res, sec, "floor write"))
    floor_cpu = res.get(sec, "floor write/cpu", _x(res, sec, "floor write"))
    rows = []
    for v in variants:
        x = _x(res, sec, v)
        wall, cpu = res.get(sec, f"{v}/wall", x), res.get(sec, f"{v}/cpu", x)
        rows.append(
            (v, x, str(ratio(wall, floor_wall)), str(ratio(cpu, floor_cpu)), cell(wall), cell(cpu))
        )
    return table(
        [
            "operation",
            "SQL bytes",
            "wall vs floor write",
            "rqlited CPU vs floor write",
            "wall ms/op",
            "rqlited CPU ms/op (3 nodes)",
        ],
        rows,
    )


def _x(res: Results, sec: str, variant: str) -> int | str:
    for p in res.section(sec):
        if p.system.rsplit("/", 1)[0] == variant:
            return p.x
    return 0


def prepare_md(res: Results) -> str:
    sec = "sqlite.prepare"
    rows = []
    for k in sorted({int(p.x) for p in res.section(sec)}):
        once, every = res.get(sec, "compiled once", k), res.get(sec, "compiled every call", k)
        rows.append((k, cell(once), cell(every), str(ratio(every, once))))
    return table(["claim statement", "compiled once, ms", "compiled every call, ms", "ratio"], rows)


def memory_md(res: Results, env: str) -> str:
    pts = sorted(res.section(f"{env}.memory"), key=lambda p: int(p.x))
    if not pts:
        return ""
    rate = res.section(f"{env}.memory.rate")
    first, last = pts[0].values[0], pts[-1].values[0]
    peak = max(p.values[0] for p in pts)
    after_first = [p.values[0] for p in pts if int(p.x) > 0]
    lo = min(after_first) if after_first else first
    return table(
        [
            "messages drained",
            "RSS at start MiB",
            "RSS after the first batch MiB",
            "peak MiB",
            "at the end MiB",
            "drain msg/s (claim_many(32) + ack_many)",
        ],
        [
            (
                f"{int(pts[-1].x):,}",
                _num(first),
                _num(lo),
                _num(peak),
                _num(last),
                cell(rate[0]) if rate else "-",
            )
        ],
    )


# -------------------------------------------------------------------------------------- plots


def plots(res: Results, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    style = {
        "floor": ("tab:gray", "o", "floor (bare rqlite write)"),
        "floor_async": ("tab:gray", "x", "floor, asyncio"),
        "seed": ("tab:red", "s", "seed claim + ack"),
        "ours": ("tab:blue", "o", "ours claim + ack (threads)"),
        "ours_async": ("tab:cyan", "^", "ours claim + ack (asyncio)"),
        "ours_many": ("tab:green", "*", "ours claim_many(32) + ack_many"),
    }
    for env in ("rqlite", "sqlite"):
        sec = f"{env}.cycle"
        if res.section(sec):
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for system, (color, marker, label) in style.items():
                pts = sorted(
                    (p for p in res.section(sec) if p.system == system), key=lambda p: int(p.x)
                )
                if not pts:
                    continue
                xs = [int(p.x) for p in pts]
                ys = [p.median for p in pts]
                err = [
                    [y - p.low for y, p in zip(ys, pts, strict=True)],
                    [p.high - y for y, p in zip(ys, pts, strict=True)],
                ]
                ls = "--" if system.startswith("floor") else "-"
                ax.errorbar(
                    xs, ys, yerr=err, color=color, marker=marker, ls=ls, label=label, capsize=3
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("concurrent workers")
            ax.set_ylabel("messages (or floor writes) per second")
            ax.set_title(f"{env}: throughput vs workers (median, min-max)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
            name = f"{env}_throughput_vs_workers.png"
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            made.append(name)
        for kind in ("sweep", "priority"):
            sec = f"{env}.{kind}"
            if kind == "priority" or not res.section(sec):
                continue
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for p_sys in sorted({p.system for p in res.section(sec)}):
                pts = sorted(
                    (p for p in res.section(sec) if p.system == p_sys), key=lambda p: int(p.x)
                )
                who, note = p_sys.split(":", 1)
                color = "tab:blue" if who == "ours" else "tab:red"
                ls = "-" if note.startswith("10") else "--"
                xs = [int(p.x) for p in pts]
                ys = [p.median for p in pts]
                ax.plot(xs, ys, color=color, ls=ls, marker="o", label=f"{who}, {note}")
                for p in pts:
                    ax.vlines(int(p.x), p.low, p.high, color=color, alpha=0.5)
                    if p.note:
                        ax.plot([int(p.x)], [p.median], marker="o", mfc="white", color=color, ms=9)
            floor = res.get(f"{env}.cycle", "floor", 1)
            if floor is not None and floor.values:
                ax.axhline(
                    1e3 / floor.median, color="tab:gray", ls=":", label="floor: one bare write"
                )
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("queued messages")
            ax.set_ylabel("claim latency, ms (median)")
            ax.set_title(f"{env}: claim latency vs backlog (hollow: seed capped by time budget)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
            name = f"{env}_claim_latency_vs_backlog.png"
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            made.append(name)
        sec = f"{env}.publish"
        if res.section(sec):
            fig, ax = plt.subplots(figsize=(7, 4.5))
            pts = sorted(
                (p for p in res.section(sec) if p.system == "ours"), key=lambda p: int(p.x)
            )
            ax.plot(
                [int(p.x) for p in pts],
                [p.median for p in pts],
                "o-",
                color="tab:blue",
                label="ours: publish / publish_many(n)",
            )
            for system, color in (("seed", "tab:red"), ("floor", "tab:gray")):
                p = res.get(sec, system, 1)
                if p is not None:
                    ax.axhline(p.median, color=color, ls="--", label=f"{system}, one per request")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("messages per request")
            ax.set_ylabel("messages per second")
            ax.set_title(f"{env}: publish throughput per message")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
            name = f"{env}_publish.png"
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            plt.close(fig)
            made.append(name)
        sec = f"{env}.memory"
        if res.section(sec):
            made += _memory_plot(plt, res, sec, env, out)
    return made + report_worker.plot(res, out)


def _memory_plot(plt: Any, res: Results, sec: str, env: str, out: Path) -> list[str]:
    pts = sorted(res.section(sec), key=lambda p: int(p.x))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([int(p.x) for p in pts], [p.values[0] for p in pts], "o-", ms=3)
    ax.set_ylim(0, max(p.values[0] for p in pts) * 1.3)
    ax.set_xlabel("messages drained")
    ax.set_ylabel("client RSS, MiB")
    ax.set_title(f"{env}: client memory while draining (claim_many(32) + ack_many)")
    ax.grid(True, alpha=0.3)
    name = f"{env}_memory.png"
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return [name]


# ------------------------------------------------------------------------------------ document


def markdown(res: Results, meta: dict[str, str], images: list[str]) -> str:
    parts = ["# Benchmark results (generated by bench/run.py)\n"]
    parts.append(table(["", ""], [(k, v) for k, v in meta.items()]))
    parts.append(report_worker.markdown(res, meta))
    worker_imgs = [i for i in images if i.startswith("rqlite_worker")]
    if worker_imgs:
        parts.append("\n" + "\n".join(f"![{i}]({i})" for i in worker_imgs) + "\n")
    river = res.get("river", "river", river_bench.JOBS)
    if river is not None:
        version = meta.get("river_pg", "PostgreSQL")
        parts.append("\n" + river_bench.river_md(river.values, river.note, version, meta["river"]))
    elif meta.get("river", "").startswith("river skipped"):
        parts.append(f"\n_{meta['river']}_\n")
    for env, title in (
        ("rqlite", "The transport's calls, rqlite (local 3-node cluster)"),
        ("sqlite", "The transport's calls, embedded SQLite"),
    ):
        if not any(p.section.startswith(env + ".") for p in res.points):
            continue
        parts.append(f"\n## {title}\n")
        heading = (
            "Earlier targets (claim + ack against the floor and the seed; for reference)"
            if env == "rqlite"
            else "The same measures (the targets are set for the rqlite cluster; here they "
            "are for information)"
        )
        parts.append(f"\n### {heading}\n\n" + targets_table(targets(res, env)))
        if res.section(f"{env}.publish"):
            parts.append("\n### Publish\n\n" + publish_md(res, env))
        if res.section(f"{env}.cycle"):
            parts.append(
                "\n### claim + ack, throughput vs workers (backlog: 1,000 messages, 100 groups)"
                "\n\n"
                "Cost ratio = floor throughput / ours (2.0 would be exactly two bare "
                "writes per message).\n\n" + cycle_md(res, env)
            )
            parts.append("\n### Batching and where one worker's time goes\n\n" + many_md(res, env))
            cpu = cpu_md(res, env)
            if cpu:
                parts.append("\n### CPU per message (client process; rqlited processes)\n\n" + cpu)
        if res.section(f"{env}.cycle_big"):
            parts.append(
                "\n### claim + ack behind a 10,000-message backlog (1,000 groups)\n\n"
                + cycle_md(res, env, f"{env}.cycle_big")
            )
            cpu = cpu_md(res, env, f"{env}.cpu_big")
            if cpu:
                parts.append("\n(CPU per message, same runs)\n\n" + cpu)
        if res.section(f"{env}.timings"):
            parts.append(
                "\n### Where a request's time goes (rqlite `?timings`, medians)\n\n"
                + timings_md(res, env)
            )
        if res.section(f"{env}.size"):
            parts.append(
                "\n### Request size: rqlite gzips a Raft command over 1024 bytes of SQL\n\n"
                + size_md(res, env)
            )
        if res.section(f"{env}.sweep"):
            parts.append("\n### Claim latency vs backlog\n\n" + latency_md(res, f"{env}.sweep"))
        if res.section(f"{env}.priority"):
            parts.append(
                "\n### claim(min_priority=4): behind low-priority groups (backlog) vs "
                "only the priority-4 groups queued (0)\n\n" + latency_md(res, f"{env}.priority")
            )
        if res.section(f"{env}.delayed"):
            parts.append(
                "\n### Claim behind delayed messages (each the head of its own group, due in a "
                "day) vs nothing delayed (0)\n\n" + delayed_md(res, f"{env}.delayed")
            )
        if res.section(f"{env}.prepare"):
            parts.append(
                "\n### Compiling the claim's statements (sqlite3; rqlite compiles every "
                "statement it applies, on every node)\n\n" + prepare_md(res)
            )
        mem = memory_md(res, env)
        if mem:
            parts.append("\n### Client memory while draining\n\n" + mem)
        imgs = [i for i in images if i.startswith(env) and i not in worker_imgs]
        if imgs:
            parts.append("\n### Plots\n\n" + "\n".join(f"![{i}]({i})" for i in imgs) + "\n")
    return "\n".join(parts)
