"""Jobs under faults: messages that keep their outcome (`keep=`), some quick, some failing for
good, some long (reporting progress, waiting on their cancel signal), run by Worker processes
on a queue over two clusters (shards), while a nemesis SIGKILLs worker processes (restarted
at once), kills a cluster's leader, and takes a whole cluster down for a while; a canceller
cancels jobs, queued and running, and an observer reads every job's `result()` over and over.

Checked at the end:

- every job is over, with the outcome its kind calls for (or `cancelled`);
- an outcome once reported final never changes, and never vanishes before its time;
- no cancelled job (`cancel()` returned "cancelled" or "cancelling") is ever reported
  succeeded, nor claimed again after its cancel returned (retried);
- every cancel of a running job reached its handler or its outcome."""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rqlite_queue import Lease, QueueError, Transport, Worker
from rqlite_queue.testing import Cluster
from rqlite_queue.types import JobResult
from rqlite_queue.worker import current_job

from .harness import (
    KILL_LEADER,
    KILL_WORKER,
    SHARD_OUTAGE,
    WorkerProcesses,
    log_lines,
    open_clusters,
    run_faults,
    shard_fault,
    stop_when,
)

QUICK, FAIL, LONG = "quick", "fail", "long"
CLAIM_SLACK = 0.05
"""A claim logged this long after a cancel returned still counts as before it (the two
processes' clocks are the machine's; the claim's time is its lease's deadline less its
visibility, computed a moment before the claim's request)."""


@dataclass
class JobsConfig:
    seed: int = 1
    jobs: int = 60
    groups: int = 30
    processes: int = 3
    concurrency: int = 4
    visibility: float = 1.0
    """Shorter than the faults: leases lapse and messages come back."""
    heartbeat: float = 0.2
    long_for: float = 4.0
    """How long a long job runs unless cancelled."""
    kinds: tuple[str, ...] = (QUICK, QUICK, FAIL, LONG, LONG)
    cancel_share: float = 0.4
    faults: int = 4
    fault_kinds: tuple[str, ...] = (KILL_WORKER, KILL_LEADER, KILL_WORKER, SHARD_OUTAGE)
    outage: float = 3.0
    gap: tuple[float, float] = (0.5, 1.5)
    keep: float = 3600.0
    time_limit: float = 180.0


@dataclass
class Cancel:
    job: int
    returned: str | None
    at: float
    """When `cancel()` returned (time.time())."""


@dataclass
class JobsReport:
    config: JobsConfig
    faults: list[str] = field(default_factory=list)
    finals: dict[int, JobResult | None] = field(default_factory=dict)
    cancels: list[Cancel] = field(default_factory=list)
    unanswered: set[int] = field(default_factory=set)
    """Jobs whose cancel never got an answer (it may have applied)."""
    observations: int = 0
    told: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        c = self.config
        statuses = defaultdict(int)
        for job in self.finals.values():
            statuses[job.status if job is not None else "missing"] += 1
        running = sum(cancel.returned == "cancelling" for cancel in self.cancels)
        queued = sum(cancel.returned == "cancelled" for cancel in self.cancels)
        return "\n".join(
            [
                f"{c.jobs} jobs on 2 clusters, {c.processes} worker processes x "
                f"{c.concurrency}, leases of {c.visibility:g} s, heartbeat {c.heartbeat:g} s",
                f"faults: {', '.join(self.faults) or 'none'}",
                f"cancels: {queued} queued (removed), {running} running (flagged; "
                f"{self.told} handlers told), "
                f"{sum(cancel.returned is None for cancel in self.cancels)} too late",
                f"outcomes: {dict(sorted(statuses.items()))}; {self.observations} result() reads",
                f"violations: {len(self.violations)}"
                + "".join(f"\n  {v}" for v in self.violations[:20]),
            ]
        )


def jobs_worker(url: str, queue: str, config: JobsConfig, log_path: str, stop_path: str) -> None:
    """A worker process: one log line per handler start, per cancel signal, until `stop_path`."""
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    q = Transport.from_url(url, queue=queue, timeout=1.0)

    def handle(lease: Lease) -> Any:
        job_id, kind = lease.event["job"], lease.event["kind"]
        claimed_at = lease.expires_at - config.visibility
        os.write(fd, f"start {job_id} {lease.attempts} {claimed_at:.6f}\n".encode())
        job = current_job()
        if kind == FAIL:
            raise ValueError(f"job {job_id} fails")
        if kind == LONG:
            for step in range(int(config.long_for / 0.05)):
                if job.wait_cancelled(0.05):
                    os.write(fd, f"told {job_id} {time.time():.6f}\n".encode())
                    return "stopped"
                job.progress({"step": step})
        return {"job": job_id, "double": 2 * job_id}

    worker = Worker(
        q,
        handle,
        concurrency=config.concurrency,
        visibility=config.visibility,
        heartbeat_interval=config.heartbeat,
        max_attempts=2,
    )
    threading.Thread(target=stop_when, args=(stop_path, worker), daemon=True).start()
    worker.run(handle_signals=False)
    q.close()


def run_jobs(config: JobsConfig, rqlited: str, tmp: Path) -> JobsReport:
    report = JobsReport(config)
    with contextlib.ExitStack() as stack:
        clusters, url = open_clusters(stack, rqlited, 2)
        _run(config, clusters, url, tmp, report)
    return report


def _run(
    config: JobsConfig, clusters: list[Cluster], url: str, tmp: Path, report: JobsReport
) -> None:
    rng = random.Random(config.seed)
    queue = f"jobs_{uuid.uuid4().hex[:8]}"
    kinds = {j: config.kinds[rng.randrange(len(config.kinds))] for j in range(config.jobs)}
    items = [
        {
            "group_id": f"g{rng.randrange(config.groups)}",
            "event": {"job": j, "kind": kinds[j]},
            "keep": config.keep,
        }
        for j in range(config.jobs)
    ]
    with Transport.from_url(url, queue=queue) as q:
        seqs = q.publish_many(items)
        shard_of = {j: q.shard_of(items[j]["group_id"]) for j in range(config.jobs)}  # type: ignore[attr-defined]
    where = {j: (str(items[j]["group_id"]), seqs[j]) for j in range(config.jobs)}
    stop_path = str(tmp / "stop")
    logs = [str(tmp / f"w{k}.log") for k in range(config.processes)]
    workers = WorkerProcesses(
        jobs_worker, lambda k: (url, queue, config, logs[k], stop_path), config.processes, stop_path
    )
    done = threading.Event()
    seen: dict[int, list[tuple[float, JobResult | None]]] = defaultdict(list)
    observer = threading.Thread(target=_observe, args=(url, queue, where, seen, done, report))
    canceller = threading.Thread(
        target=_cancel, args=(url, queue, where, config, rng.random(), done, report)
    )
    observer.start()
    canceller.start()

    def inject(i: int, kind: str) -> None:
        shard_fault(kind, i, workers, clusters, rng, config.outage)

    try:
        run_faults(
            config.fault_kinds, config.faults, config.gap, rng, inject, report.faults, started=1.0
        )
        _wait_final(url, queue, where, time.monotonic() + config.time_limit, report)
    finally:
        done.set()
        observer.join(60)
        canceller.join(60)
        workers.stop()
    _check(report, kinds, shard_of, seen, logs)


def _observe(
    url: str,
    queue: str,
    where: dict[int, tuple[str, int]],
    seen: dict[int, list[tuple[float, JobResult | None]]],
    done: threading.Event,
    report: JobsReport,
) -> None:
    """Read every job's state over and over (a shard down: its jobs skipped meanwhile)."""
    with Transport.from_url(url, queue=queue, deadline=2.0) as q:
        while not done.is_set():
            for job_id, (group, seq) in where.items():
                try:
                    found = q.result(group, seq)
                except QueueError:
                    continue
                seen[job_id].append((time.time(), found))
                report.observations += 1


def _cancel(
    url: str,
    queue: str,
    where: dict[int, tuple[str, int]],
    config: JobsConfig,
    seed: float,
    done: threading.Event,
    report: JobsReport,
) -> None:
    """Cancel a share of the jobs, spread over the run (queued, running or over by then)."""
    rng = random.Random(seed)
    chosen = [j for j in where if rng.random() < config.cancel_share]
    rng.shuffle(chosen)
    with Transport.from_url(url, queue=queue, deadline=5.0) as q:
        for job_id in chosen:
            if done.wait(rng.uniform(0.05, 0.4)):
                return
            group, seq = where[job_id]
            report.unanswered.add(job_id)
            for _ in range(20):  # sent again after a lost reply or an outage: it is safe to
                try:
                    returned = q.cancel(group, seq, f"cancel {job_id}")
                except QueueError:
                    time.sleep(0.5)
                    continue
                report.cancels.append(Cancel(job_id, returned, time.time()))
                report.unanswered.discard(job_id)
                break


def _wait_final(
    url: str, queue: str, where: dict[int, tuple[str, int]], give_up: float, report: JobsReport
) -> None:
    with Transport.from_url(url, queue=queue, deadline=20) as q:
        while time.monotonic() < give_up:
            try:
                found = {j: q.result(group, seq) for j, (group, seq) in where.items()}
            except QueueError:
                time.sleep(0.5)
                continue
            report.finals = found
            if all(job is not None and job.final for job in found.values()):
                return
            time.sleep(0.5)


def _check(
    report: JobsReport,
    kinds: dict[int, str],
    shard_of: dict[int, str],
    seen: dict[int, list[tuple[float, JobResult | None]]],
    logs: list[str],
) -> None:
    starts: dict[int, list[float]] = defaultdict(list)
    told: set[int] = set()
    for parts in log_lines(logs):
        if len(parts) == 4 and parts[0] == "start":
            starts[int(parts[1])].append(float(parts[3]))
        elif len(parts) == 3 and parts[0] == "told":
            told.add(int(parts[1]))
    report.told = len(told)
    cancels = {c.job: c for c in report.cancels if c.returned is not None}
    bad = report.violations
    for job_id, kind in kinds.items():
        final = report.finals.get(job_id)
        if final is None or not final.final:
            bad.append(f"job {job_id} ({kind}, shard {shard_of[job_id]}): not over: {final}")
            continue
        cancel = cancels.get(job_id)
        if cancel is not None:
            if final.status != "cancelled":
                bad.append(f"job {job_id}: cancelled ({cancel.returned}), but {final.status}")
            late = [at for at in starts[job_id] if at > cancel.at + CLAIM_SLACK]
            if late:
                bad.append(f"job {job_id}: claimed again {late[0] - cancel.at:.3f} s after cancel")
        elif final.status == "cancelled" and job_id not in report.unanswered:
            bad.append(f"job {job_id}: cancelled, but no cancel() said so")
        elif final.status == "cancelled":
            pass  # its cancel applied, its reply lost
        elif kind == FAIL and (final.status != "failed" or not final.errors):
            bad.append(f"job {job_id}: should have failed with its errors: {final}")
        elif kind != FAIL and final.status != "succeeded":
            bad.append(f"job {job_id}: should have succeeded: {final}")
        elif kind == QUICK and final.result != {"job": job_id, "double": 2 * job_id}:
            bad.append(f"job {job_id}: wrong result {final.result!r}")
        # A final outcome never changes, never vanishes before its time.
        first_final: JobResult | None = None
        for at, found in seen[job_id]:
            if first_final is None:
                if found is not None and found.final:
                    first_final = found
                continue
            same = found is not None and (found.status, found.result, found.reason) == (
                first_final.status,
                first_final.result,
                first_final.reason,
            )
            if not same and (first_final.kept_until is None or at < first_final.kept_until):
                bad.append(f"job {job_id}: final {first_final.status}, then read {found}")
                break
        if cancel is not None and any(
            found is not None and found.status == "succeeded" and at > cancel.at
            for at, found in seen[job_id]
        ):
            bad.append(f"job {job_id}: reported succeeded after its cancel")
    for job_id, cancel in cancels.items():
        final = report.finals.get(job_id)
        if (
            cancel.returned == "cancelling"
            and job_id not in told
            and (final is None or final.status != "cancelled")
        ):
            bad.append(f"job {job_id}: a running job's cancel reached neither handler nor outcome")
