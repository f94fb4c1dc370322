"""Batches under faults (docs/batches.md): `batches` batches of `size` messages on a queue over
two 3-node clusters (shards), the messages in groups of both shards, some failing for good,
some adding a message to their batch with their ack (a follow-up that joins it); Worker
processes handle them and the callbacks, while a nemesis SIGKILLs worker processes (restarted
at once), kills a cluster's leader, and takes the second cluster down whole for a while.
Leases are shorter than the faults: messages come back, handlers run again.

Checked at the end, from the handlers' logs and the queue:

- every batch has exactly one `on_complete` callback message, and one `on_success` if and
  only if none of its messages failed (distinct messages: a callback handled twice after a
  kill is one message);
- never early: every message of a batch had a run that ended (returned, or failed for good)
  before its batch's callback was first claimed, and none started after;
- the counts the callback carries, and `batch_status`, are exact: succeeded, failed, total
  (the follow-ups that joined included).

The counter-example (`mode=COUNTER`): the same workload without batches, each handler
counting its batch down in a table of its own (a SQLite file the worker processes share: the
usual "decrement, and publish the callback at zero"), and adding its follow-up to the count
before it returns it. Under the same faults it publishes callbacks early (a message counted
twice when it ran twice), twice, or never (a count that never reaches zero)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rqlite_queue import Lease, Transport, Worker
from rqlite_queue.testing import Cluster

from .harness import (
    KILL_LEADER,
    KILL_WORKER,
    SHARD_OUTAGE,
    WorkerProcesses,
    drained,
    log_lines,
    open_clusters,
    run_faults,
    shard_fault,
    stop_when,
)

BATCHES, COUNTER = "batches", "counter"
QUICK, FAIL, GROW = "quick", "fail", "grow"
CALLBACKS = "callbacks"
CLAIM_SLACK = 0.05
"""A run of a message logged this long after its batch's callback was claimed still counts as
before it (the lease's claim time is its deadline less its visibility, computed a moment
before the claim's request)."""


@dataclass
class BatchesConfig:
    mode: str = BATCHES
    seed: int = 1
    batches: int = 200
    size: int = 20
    groups: int = 120
    processes: int = 3
    concurrency: int = 8
    visibility: float = 1.0
    """Shorter than the faults: leases lapse and messages come back."""
    work: float = 0.01
    """How long a handler works (the window a kill lands in)."""
    fail_share: float = 0.03
    grow_share: float = 0.05
    faults: int = 6
    fault_kinds: tuple[str, ...] = (KILL_WORKER, KILL_LEADER, KILL_WORKER, SHARD_OUTAGE)
    outage: float = 3.0
    gap: tuple[float, float] = (0.5, 1.5)
    max_attempts: int = 3
    time_limit: float = 240.0


@dataclass
class BatchesReport:
    config: BatchesConfig
    faults: list[str] = field(default_factory=list)
    runs: int = 0
    again: int = 0
    """Runs of a message after its first (a lapse, a kill)."""
    callbacks: int = 0
    missing: list[str] = field(default_factory=list)
    doubled: list[str] = field(default_factory=list)
    early: list[str] = field(default_factory=list)
    wrong_counts: list[str] = field(default_factory=list)
    seconds: float = 0.0
    remaining: int = -1

    @property
    def anomalies(self) -> int:
        return len(self.missing) + len(self.doubled) + len(self.early) + len(self.wrong_counts)

    @property
    def ok(self) -> bool:
        return self.anomalies == 0 and self.remaining == 0

    def summary(self) -> str:
        c = self.config
        what = (
            "batches (counted by the queue, in the settlements' transactions)"
            if c.mode == BATCHES
            else "a counter in the handler (decrement, then publish the callback at zero)"
        )
        return "\n".join(
            [
                f"{what}: {c.batches} batches x {c.size} messages on 2 clusters, "
                f"{c.processes} worker processes x {c.concurrency}, leases of "
                f"{c.visibility:g} s",
                f"faults: {', '.join(self.faults) or 'none'}",
                f"runs {self.runs} (again after a lapse or a kill: {self.again}); callback "
                f"messages {self.callbacks}; {self.seconds:.0f} s; left in the queue "
                f"{self.remaining}",
                f"callbacks missing {len(self.missing)}, doubled {len(self.doubled)}, early "
                f"{len(self.early)}; batches with wrong counts {len(self.wrong_counts)}",
                *(f"  {line}" for line in (*self.missing, *self.doubled, *self.early)[:10]),
                *(f"  {line}" for line in self.wrong_counts[:5]),
            ]
        )


@dataclass(frozen=True)
class Plan:
    """The workload: each batch's messages (group, kind), the same in both modes."""

    members: dict[int, list[tuple[str, str]]]

    @classmethod
    def of(cls, config: BatchesConfig) -> Plan:
        rng = random.Random(config.seed)
        members = {}
        for b in range(config.batches):
            kinds = []
            for _ in range(config.size):
                roll = rng.random()
                kind = (
                    FAIL
                    if roll < config.fail_share
                    else GROW
                    if roll < config.fail_share + config.grow_share
                    else QUICK
                )
                kinds.append((f"g{rng.randrange(config.groups)}", kind))
            members[b] = kinds
        return cls(members)

    def expected(self, b: int) -> tuple[int, int]:
        """(succeeded, failed) of batch `b`: a GROW message adds one QUICK one."""
        kinds = [kind for _, kind in self.members[b]]
        failed = kinds.count(FAIL)
        return len(kinds) - failed + kinds.count(GROW), failed


def batch_worker(
    url: str,
    queue: str,
    config: BatchesConfig,
    log_path: str,
    counter_path: str,
    stop_path: str,
    seed: float,
) -> None:
    """A worker process: one log line per run of a message (`run`), per end of a run
    (`end`: returned; `fail`: its last attempt failed), per callback run (`cb`)."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    q = Transport.from_url(url, queue=queue, timeout=1.0)
    local = threading.local()  # (a connection per handler thread: sqlite3's rule)

    def counters() -> sqlite3.Connection:
        if not hasattr(local, "db"):
            local.db = sqlite3.connect(counter_path, timeout=30, isolation_level=None)
        return local.db  # type: ignore[no-any-return]

    def log(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    def handle(lease: Lease) -> Any:
        event = lease.event
        claimed = lease.expires_at - config.visibility
        where = f"{lease.shard or '-'}:{lease.seq}"
        if lease.group_id == CALLBACKS:
            done = lease.completed_batch
            counts = (
                [done.succeeded, done.failed, done.total]
                if done is not None
                else [event.get("succeeded", -1), event.get("failed", -1), -1]
            )
            log(f"cb {event['batch']} {event['kind']} {where} {claimed:.6f} {json.dumps(counts)}")
            return None
        mid, b, kind = event["mid"], event["batch"], event["kind"]
        log(f"run {b} {mid} {where} {lease.attempts} {claimed:.6f}")
        time.sleep(config.work)
        if kind == FAIL:
            if lease.attempts >= config.max_attempts:
                log(f"fail {b} {mid} {time.time():.6f}")
                if config.mode == COUNTER:  # its last attempt: counted out as failed
                    count(b, 0, failed=True)
            raise ValueError(f"message {mid} fails")
        follow: list[dict[str, Any]] = []
        if kind == GROW:
            child = {"mid": f"{mid}.1", "batch": b, "kind": QUICK}
            item: dict[str, Any] = {"group_id": lease.group_id, "event": child}
            if config.mode == BATCHES:
                item["batch"] = lease.batch
            follow.append(item)
        log(f"end {b} {mid} {time.time():.6f}")
        if config.mode == COUNTER:
            count(b, len(follow), failed=False)
        return follow

    def count(b: int, added: int, *, failed: bool) -> None:
        """The usual pattern: count the follow-ups in, this message out; at zero, publish the
        callbacks. A run killed after this, or whose lease lapsed, runs again and counts
        again; one killed between the count and the publish never publishes."""
        left, succeeded, failures = (
            counters()
            .execute(
                "UPDATE counts SET left = left + ? - 1, succeeded = succeeded + ?, failed = failed "
                "+ ? WHERE batch = ? RETURNING left, succeeded, failed",
                (added, int(not failed), int(failed), b),
            )
            .fetchone()
        )
        if left == 0:
            publish_callbacks(q, b, succeeded, failures)

    worker = Worker(
        q,
        handle,
        concurrency=config.concurrency,
        visibility=config.visibility,
        follow_ups=True,
        max_attempts=config.max_attempts,
        worker_id=f"p{seed}",
    )
    threading.Thread(target=stop_when, args=(stop_path, worker), daemon=True).start()
    worker.run(handle_signals=False)
    q.close()


def publish_callbacks(q: Transport, b: int, succeeded: int, failed: int) -> None:
    """The counter mode's callbacks, as the batches' are published."""
    items = [
        (CALLBACKS, {"batch": b, "kind": "complete", "succeeded": succeeded, "failed": failed})
    ]
    if failed == 0:
        items.append(
            (CALLBACKS, {"batch": b, "kind": "success", "succeeded": succeeded, "failed": 0})
        )
    q.publish_many(items)


def run_batches(config: BatchesConfig, rqlited: str, tmp: Path) -> BatchesReport:
    report = BatchesReport(config)
    with contextlib.ExitStack() as stack:
        clusters, url = open_clusters(stack, rqlited, 2)
        _run(config, clusters, url, tmp, report)
    return report


def _publish(
    config: BatchesConfig, plan: Plan, url: str, queue: str, counter_path: str
) -> dict[int, str]:
    """The batches (or, in the counter mode, their messages and counters); each batch's id."""
    ids: dict[int, str] = {}
    with Transport.from_url(url, queue=queue) as q:
        if config.mode == BATCHES:
            for b, members in plan.members.items():
                complete = (CALLBACKS, {"batch": b, "kind": "complete"})
                success = (CALLBACKS, {"batch": b, "kind": "success"})
                with q.batch(on_complete=complete, on_success=success) as batch:
                    batch.publish_many(
                        [
                            (group, {"mid": f"{b}.{k}", "batch": b, "kind": kind})
                            for k, (group, kind) in enumerate(members)
                        ]
                    )
                ids[b] = batch.id
            return ids
        with sqlite3.connect(counter_path, isolation_level=None) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE counts (batch INTEGER PRIMARY KEY, left INTEGER, succeeded "
                "INTEGER DEFAULT 0, failed INTEGER DEFAULT 0)"
            )
            db.executemany(
                "INSERT INTO counts (batch, left) VALUES (?, ?)",
                [(b, len(m)) for b, m in plan.members.items()],
            )
        for b, members in plan.members.items():
            q.publish_many(
                [
                    (group, {"mid": f"{b}.{k}", "batch": b, "kind": kind})
                    for k, (group, kind) in enumerate(members)
                ]
            )
    return ids


def _run(
    config: BatchesConfig, clusters: list[Cluster], url: str, tmp: Path, report: BatchesReport
) -> None:
    rng = random.Random(config.seed)
    plan = Plan.of(config)
    queue = f"ba_{uuid.uuid4().hex[:8]}"
    counter_path = str(tmp / "counts.db")
    started = time.monotonic()
    ids = _publish(config, plan, url, queue, counter_path)
    stop_path = str(tmp / "stop")
    logs = [str(tmp / f"w{k}.log") for k in range(config.processes)]
    workers = WorkerProcesses(
        batch_worker,
        lambda k: (
            url,
            queue,
            config,
            logs[k],
            counter_path,
            stop_path,
            config.seed * 100 + k + rng.random(),
        ),
        config.processes,
        stop_path,
    )

    def inject(i: int, kind: str) -> None:
        shard_fault(kind, i, workers, clusters, rng, config.outage)

    try:
        run_faults(
            config.fault_kinds, config.faults, config.gap, rng, inject, report.faults, started=1.5
        )
        report.remaining = drained(
            url, queue, time.monotonic() + config.time_limit, again_after=1.0
        )
        report.seconds = time.monotonic() - started
    finally:
        workers.stop()
    statuses = _statuses(url, queue, ids) if config.mode == BATCHES else {}
    _check(report, plan, logs, statuses)


def _statuses(url: str, queue: str, ids: dict[int, str]) -> dict[int, Any]:
    with Transport.from_url(url, queue=queue, deadline=20) as q:
        return {b: q.batch_status(batch_id) for b, batch_id in ids.items()}


def _check(report: BatchesReport, plan: Plan, logs: list[str], statuses: dict[int, Any]) -> None:
    runs: dict[str, list[float]] = defaultdict(list)  # mid: claim times of its runs
    ends: dict[str, list[float]] = defaultdict(
        list
    )  # mid: when its runs ended (or failed for good)
    callbacks: dict[tuple[int, str], dict[str, float]] = defaultdict(
        dict
    )  # (b, kind): message: first claim
    counts: dict[tuple[int, str], list[int]] = {}
    for parts in log_lines(logs):
        try:
            if parts[0] == "run" and len(parts) == 6:
                runs[parts[2]].append(float(parts[5]))
                report.runs += 1
                report.again += int(parts[4]) > 1
            elif parts[0] in ("end", "fail") and len(parts) == 4:
                ends[parts[2]].append(float(parts[3]))
            elif parts[0] == "cb" and len(parts) >= 6:
                key = (int(parts[1]), parts[2])
                at = float(parts[4])
                seen = callbacks[key]
                seen[parts[3]] = min(seen.get(parts[3], at), at)
                counts[key] = json.loads(" ".join(parts[5:]))
        except (ValueError, IndexError):
            continue  # a line cut short by a SIGKILL
    report.callbacks = sum(len(seen) for seen in callbacks.values())
    for b, members in plan.members.items():
        succeeded, failed = plan.expected(b)
        mids = [f"{b}.{k}" for k in range(len(members))]
        mids += [f"{b}.{k}.1" for k, (_, kind) in enumerate(members) if kind == GROW]
        for kind in ("complete", "success"):
            want = 1 if kind == "complete" or failed == 0 else 0
            got = len(callbacks.get((b, kind), {}))
            if got < want:
                report.missing.append(f"batch {b}: no {kind} callback")
            elif got > want:
                report.doubled.append(f"batch {b}: {got} {kind} callback messages")
        seen = callbacks.get((b, "complete"), {})
        if seen:
            first = min(seen.values())
            # Before it: a run of each message that ended (a stale run, whose lease lapsed
            # under it, may end later: its ack is refused); after it: no run at all.
            unfinished = [m for m in mids if not any(at <= first + CLAIM_SLACK for at in ends[m])]
            late = [m for m in mids if any(at > first + CLAIM_SLACK for at in runs[m])]
            if unfinished or late:
                report.early.append(
                    f"batch {b}: callback at {first:.3f} before {len(unfinished)} message(s) "
                    f"ended, {len(late)} ran after it"
                )
            got_counts = counts.get((b, "complete"), [])
            if got_counts[:2] != [succeeded, failed]:
                report.wrong_counts.append(
                    f"batch {b}: callback says {got_counts}, the logs: {succeeded} succeeded, "
                    f"{failed} failed"
                )
        status = statuses.get(b)
        if statuses and (
            status is None
            or not status.done
            or (status.succeeded, status.failed, status.total)
            != (succeeded, failed, succeeded + failed)
        ):
            report.wrong_counts.append(f"batch {b}: batch_status {status}")
