"""Faults on the links, under load (issue 34): two Workers (threads and asyncio), 16 slots each,
and a producer, on a 3-node cluster whose links all go through toxiproxy (`Cluster(links=...)`,
a round trip on every link); the leader's links are made silent, cut replies in their middle,
reset connections, drop to a trickle, close slowly, and the leader is isolated, one fault at a
time.

What is checked (failover.py's checks, on the deliveries the handlers saw): nothing lost, FIFO
per group, no two handlers of a group at once; acks resume within `RESUME_WITHIN` of the fault
clearing or of a new leader existing. And every `OutcomeUnknown` a caller saw is matched with
what the proxies really lost: the producer has links of its own (so what they cut is its
alone), publishes without dedup ids and counts its `OutcomeUnknown`s; the Workers count theirs
(a round trip that failed with it); the proxies count, per fault, the HTTP messages they were
given and dropped (`tally` in front of the dropping toxic), the replies they broke off (`cut`),
and the Raft link's chunks (a forwarded request lost there is a reply lost to a client). An
election during a fault (the leader's term moved: a loaded machine's, or the trickle's) makes
unknown outcomes of its own, which rqlite reports ("leadership lost while committing log", a
follower's "failed to process ... on remote node"): those, and only when the term moved, may
exceed what the proxies lost."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from rqlite_queue import (
    AsyncTransport,
    AsyncWorker,
    Lease,
    OutcomeUnknown,
    QueueError,
    Transport,
    Worker,
)
from rqlite_queue.testing import Cluster, Link, Links, Node
from rqlite_queue.toxiproxy import LATENCY

from .failover import (
    AsyncRecorded,
    FailoverConfig,
    FailoverReport,
    FaultRecord,
    Recorded,
    _check,
    _delivery,
    _wait_for_leader,
)

ELECTION_MARKERS = ("leadership lost", "on remote node")
"""What rqlite says of a write caught by an election (on the leader; on a follower that
forwarded it)."""
SILENT, CUT, RESET, TRICKLE, SLOW_CLOSE, ISOLATE = (
    "silent",
    "cut_replies",
    "reset_peer",
    "bandwidth_64k",
    "slow_close",
    "isolate",
)
ALL = (SILENT, CUT, RESET, TRICKLE, SLOW_CLOSE, ISOLATE)
RESUME_WITHIN = 2.0


@dataclass
class LinkConfig(FailoverConfig):
    rtt: float = 0.001
    kinds: tuple[str, ...] = ALL
    lengths: dict[str, float] = field(
        default_factory=lambda: {
            SILENT: 3.0,
            CUT: 3.0,
            RESET: 3.0,
            TRICKLE: 5.0,
            SLOW_CLOSE: 3.0,
            ISOLATE: 4.0,
        }
    )
    visibility: float = 30.0
    """Longer than any fault: no lease lapses, so a duplicate or an overlap is a bug."""
    gap: tuple[float, float] = (2.0, 3.0)
    publish_pace: float = 0.01
    extra_args: tuple[str, ...] = ()
    """rqlited flags beyond the harness's fast Raft timers."""


@dataclass
class Lost:
    """What the proxies dropped or cut during one fault, by whose links."""

    producer: int = 0
    """HTTP messages dropped on, or replies cut off from, the producer's own links."""
    workers: int = 0
    """The same on the Workers' links."""
    raft_chunks: int = 0
    """Chunks dropped on the leader's Raft link (forwarded requests and their replies)."""

    @property
    def total(self) -> int:
        return self.producer + self.workers + self.raft_chunks


@dataclass
class LinkFault(FaultRecord):
    lost: Lost = field(default_factory=Lost)
    producer_unknown: int = 0
    worker_unknown: int = 0
    acks_during: int = 0
    """Acks applied while the fault lasted."""
    began: float = 0.0
    """When its toxics started to be put in (calls from then on may meet them)."""
    elections: int = 0
    """How far the leader's Raft term moved from before the fault to after it."""
    reported: int = 0
    """Of the OutcomeUnknowns seen, those rqlite itself reported as an election's
    (`ELECTION_MARKERS`), not a reply lost on the way."""


@dataclass
class LinkReport(FailoverReport):
    link_faults: list[LinkFault] = field(default_factory=list)
    producer_outcomes: Counter[str] = field(default_factory=Counter)
    unknown_published: int = 0
    """Publishes that raised OutcomeUnknown and whose message was delivered (they applied)."""
    unknown_before_faults: int = 0
    """OutcomeUnknowns before the first fault (nothing was lost then: must be 0)."""

    def summary(self) -> str:
        lines = [
            f"published {self.published} (+ {self.unknown_published} whose publish raised "
            f"OutcomeUnknown and were applied), handled "
            f"{len({d.seq for d in self.deliveries})}, left in the queue {self.remaining}, "
            f"lost {len(self.lost)}",
            f"order violations {len(self.order_violations)}, two handlers of a group at once "
            f"{len(self.overlaps)}, settlements reported lost by the Workers {self.leases_lost}",
            "duplicates delivered: "
            + (", ".join(f"{n} ({cause})" for cause, n in self.duplicates.items()) or "0"),
            "producer's publishes: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.producer_outcomes.items())),
            "fault          node length new leader acks resumed acks during  OutcomeUnknown "
            "seen / lost by the proxies: producer, Workers (+ Raft chunks dropped)"
            "  [elections: seen as such]",
        ]
        for f in self.link_faults:
            elected = "-" if f.elected is None else f"{f.elected:.2f} s"
            resumed = "never" if f.resumed is None else f"{f.resumed:.2f} s"
            election = f"  [{f.elections}: {f.reported}]" if f.elections or f.reported else ""
            lines.append(
                f"{f.kind:<14} {f.node:<4} {f.ended - f.started:4.1f} s {elected:>10} "
                f"{resumed:>12} {f.acks_during:>11}  {f.producer_unknown} / {f.lost.producer}, "
                f"{f.worker_unknown} / {f.lost.workers} (+ {f.lost.raft_chunks}){election}"
            )
        return "\n".join(lines)


class UnknownRounds(logging.Handler):
    """Counts the Workers' round trips that failed with OutcomeUnknown (they log each)."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        unknown = [a for a in args if isinstance(a, OutcomeUnknown)]
        if "round trip failed" in str(record.msg) and unknown:
            self.times.append((time.monotonic(), str(unknown[0])))


def run_link_faults(config: LinkConfig, rqlited: str, order: list[str]) -> LinkReport:
    report = LinkReport(config)
    extra = (*config.extra_args,)
    with Cluster(3, binary=rqlited, links=Links(rtt=config.rtt), extra_args=extra) as cluster:
        assert cluster.links is not None
        api = cluster.links.api
        producer_links = {
            n.node_id: api.create(f"producer-{n.node_id}", "127.0.0.1:0", n.http_addr)
            for n in cluster.nodes
        }
        for link in producer_links.values():
            link.latency(config.rtt)
        producer_url = ",".join(f"http://{link.listen}" for link in producer_links.values())
        cluster.wait_ready()
        _run(config, order, cluster, producer_url, producer_links, report)
    return report


def _run(
    config: LinkConfig,
    order: list[str],
    cluster: Cluster,
    producer_url: str,
    producer_links: dict[str, Link],
    report: LinkReport,
) -> None:
    rng = random.Random(config.seed)
    queue = f"lf_{uuid.uuid4().hex[:8]}"
    url = cluster.url
    lock = threading.Lock()
    rounds: list[tuple[float, float]] = []
    published: list[tuple[str, int]] = []
    unknown: list[int] = []  # the `i` of publishes that raised OutcomeUnknown
    unknown_at: list[tuple[float, float, str]] = []  # when each began and ended, what it said
    stop_publishing = threading.Event()
    done_publishing = threading.Event()
    counter = UnknownRounds()
    worker_log = logging.getLogger("rqlite_queue.worker")
    worker_log.addHandler(counter)

    def handler_time() -> float:
        with lock:
            return rng.uniform(*config.handler_time)

    def handle_sync(lease: Lease) -> None:
        started = time.monotonic()
        time.sleep(handler_time())
        with lock:
            report.deliveries.append(_delivery("sync", lease, started))

    async def handle_async(lease: Lease) -> None:
        started = time.monotonic()
        await asyncio.sleep(handler_time())
        with lock:
            report.deliveries.append(_delivery("async", lease, started))

    def publisher() -> None:
        # No dedup ids: an OutcomeUnknown reaches this caller, as it reaches many users.
        groups = [f"g{i}" for i in range(config.groups)]
        with Transport.from_url(producer_url, queue=queue) as q:
            i = 0
            while not stop_publishing.is_set():
                group = groups[i % len(groups)]
                sent = time.monotonic()
                try:
                    seq = q.publish(group, {"i": i})
                    published.append((group, seq))
                    report.producer_outcomes["ok"] += 1
                except OutcomeUnknown as exc:
                    unknown.append(i)
                    unknown_at.append((sent, time.monotonic(), str(exc)))
                    report.producer_outcomes["OutcomeUnknown"] += 1
                except QueueError as exc:  # not applied: nothing to check
                    report.producer_outcomes[type(exc).__name__] += 1
                    time.sleep(0.05)
                i += 1
                time.sleep(config.publish_pace)
        done_publishing.set()

    sync_q = Transport.from_url(url, queue=queue)
    sync_worker = Worker(
        Recorded(sync_q, rounds),  # type: ignore[arg-type]
        handle_sync,
        concurrency=config.concurrency,
        visibility=config.visibility,
        worker_id="sync",
    )
    async_state: dict[str, Any] = {}
    async_started = threading.Event()

    def run_async_worker() -> None:
        async def main() -> None:
            q = await AsyncTransport.from_url(url, queue=queue)
            worker = AsyncWorker(
                AsyncRecorded(q, rounds),  # type: ignore[arg-type]
                handle_async,
                concurrency=config.concurrency,
                visibility=config.visibility,
                worker_id="async",
            )
            async_state["worker"] = worker
            async_started.set()
            await worker.run(handle_signals=False)
            await q.close()

        asyncio.run(main())

    threads = [
        threading.Thread(target=publisher, name="producer"),
        threading.Thread(
            target=sync_worker.run, kwargs={"handle_signals": False}, name="sync-worker"
        ),
        threading.Thread(target=run_async_worker, name="async-worker"),
    ]
    for thread in threads:
        thread.start()
    async_started.wait(30)
    try:
        time.sleep(2.0)  # the stream runs
        for kind in order:
            report.link_faults.append(_fault(kind, cluster, producer_links, config))
            time.sleep(rng.uniform(*config.gap))
    finally:
        stop_publishing.set()
        done_publishing.wait(60)
        try:
            if cluster.links is not None:
                cluster.links.clear()
        finally:
            with Transport.from_url(url, queue=queue) as q:
                give_up = time.monotonic() + 60
                while q.stats().depth and time.monotonic() < give_up:
                    time.sleep(0.2)
                report.remaining = q.stats().depth
            sync_worker.stop()
            if "worker" in async_state:
                async_state["worker"].stop()
            for thread in threads:
                thread.join(60)
            sync_q.close()
            worker_log.removeHandler(counter)
    report.published = len(published)
    report.leases_lost = sync_worker.stats.leases_lost + async_state["worker"].stats.leases_lost
    # Each OutcomeUnknown is put down to the last fault that began before its call started (a
    # publish without dedup ids waits its whole timeout on a link that went silent, and fails
    # after the fault cleared, maybe during the next one); one that began before the first
    # fault, to the fault that began while it waited.
    for sent, ended, said in unknown_at:
        fault = _last_before(report.link_faults, sent) or _last_before(report.link_faults, ended)
        if fault is None:
            report.unknown_before_faults += 1
        else:
            fault.producer_unknown += 1
            fault.reported += any(marker in said for marker in ELECTION_MARKERS)
    for t, said in counter.times:
        fault = _last_before(report.link_faults, t)
        if fault is None:
            report.unknown_before_faults += 1
        else:
            fault.worker_unknown += 1
            fault.reported += any(marker in said for marker in ELECTION_MARKERS)
    for fault in report.link_faults:
        # From the fault clearing (or a new leader existing, if sooner) to the end of the
        # first round trip started after that which applied acks.
        since = fault.ended if fault.elected is None else fault.started + fault.elected
        since = min(since, fault.ended)
        after = [end for start, end in rounds if start >= since]
        fault.resumed = min(after) - since if after else None
        fault.acks_during = sum(1 for start, end in rounds if fault.started < end < fault.ended)
    report.faults = list(report.link_faults)
    _check(report, published)
    delivered = {d.seq for d in report.deliveries}
    known = {seq for _, seq in published}
    report.unknown_published = len(delivered - known)


def _last_before(faults: list[LinkFault], t: float) -> LinkFault | None:
    before = [f for f in faults if f.began <= t]
    return before[-1] if before else None


def _fault(
    kind: str, cluster: Cluster, producer_links: dict[str, Link], config: LinkConfig
) -> LinkFault:
    """One fault: the leader's links for a silence and an isolation; every client link for
    cut replies, resets and slow closes (clients stay on the node they last reached, which
    need not be the leader); every link for the trickle."""
    links = cluster.links
    assert links is not None
    leader = cluster.leader(timeout=30)
    term = _term(leader)
    others = [n for n in cluster.nodes if n is not leader]
    raft = links.raft[leader.node_id]
    ours = leader.node_id
    workers_http = [links.http[ours]] if kind in (SILENT, ISOLATE) else list(links.http.values())
    producer_http = (
        [producer_links[ours]] if kind in (SILENT, ISOLATE) else list(producer_links.values())
    )
    http = [*workers_http, *producer_http]
    streams = ("upstream", "downstream")
    counted: list[tuple[Link, str]] = []  # the tallies to read at the end
    began = time.monotonic()

    def tally(link: Link, stream: str) -> None:
        link.add("tally", stream, name=f"tally_{stream}")
        counted.append((link, stream))

    # Tallies first: a toxic counts what is given to it, and the dropping toxic comes after.
    if kind in (SILENT, ISOLATE):
        for link in [*http, raft]:
            for stream in streams:
                tally(link, stream)
    elif kind == RESET:
        for link in http:
            tally(link, "downstream")
    if kind == SILENT:
        for link in [*http, raft]:
            link.silent()
    elif kind == CUT:
        for link in http:
            link.add("cut", "downstream", every=3, keep=-3)  # a third of the replies
    elif kind == RESET:
        for link in http:
            link.add("reset_peer", "downstream", timeout=0)
    elif kind == TRICKLE:
        for link in [*links.all(), *producer_links.values()]:
            for stream in streams:
                link.add("bandwidth", stream, rate=64)
    elif kind == SLOW_CLOSE:
        for link in http:
            # One request in five broken off before its end: the node drops the connection,
            # and its close takes 2 s to reach the client.
            link.add("slow_close", "downstream", delay=2000)
            link.add("cut", "upstream", every=5, keep=-10)
    elif kind == ISOLATE:
        links.isolate(ours)
        producer_links[ours].silent()
    else:
        raise ValueError(kind)
    started = time.monotonic()
    length = config.lengths[kind]
    elected = _wait_for_leader(others, started + length) if kind == ISOLATE else None
    remaining = started + length - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
    # Stop the losses before counting them (what passes a tally afterwards is counted too:
    # the count can only be too high, never too low).
    for link in {id(link): link for link, _ in counted}.values():
        for toxic in link.toxics():
            if toxic["type"] in ("timeout", "reset_peer"):
                link.remove(toxic["name"])
    if kind in (CUT, SLOW_CLOSE):
        name = "cut_downstream" if kind == CUT else "cut_upstream"
        for link in http:
            link.update(name, every=0)
    lost = Lost()
    for link, stream in counted:
        seen = link.tallied(stream)
        if link is raft:
            lost.raft_chunks += seen["chunks"]
        elif link in producer_http:
            lost.producer += seen["messages"]
        else:
            lost.workers += seen["messages"]
    if kind in (CUT, SLOW_CLOSE):
        name = "cut_downstream" if kind == CUT else "cut_upstream"
        lost.workers += sum(link.toxic(name)["attributes"]["cuts"] for link in workers_http)
        lost.producer += sum(link.toxic(name)["attributes"]["cuts"] for link in producer_http)
    links.clear()
    for link in producer_links.values():
        link.clear(keep=LATENCY)
    ended = time.monotonic()
    after = cluster.leader(timeout=30)
    return LinkFault(
        kind,
        leader.node_id,
        started,
        ended,
        None if elected is None else elected - started,
        lost=lost,
        began=began,
        elections=_term(after) - term,
    )


def _term(node: Node) -> int:
    term: int = node.status(timeout=5)["store"]["raft"]["term"]
    return term


def check_link_faults(report: LinkReport) -> list[str]:
    """What failed, in words (empty: all held)."""
    problems: list[str] = []
    if not report.ok:
        problems.append("lost, out of order, or left in the queue")
    if report.overlaps:
        problems.append("two handlers of a group at once")
    if report.duplicates:
        problems.append("a message delivered twice (no lease lapses in this run)")
    if report.unknown_before_faults:
        problems.append(f"{report.unknown_before_faults} OutcomeUnknown before any fault")
    for f in report.link_faults:
        if f.resumed is None or f.resumed > RESUME_WITHIN:
            problems.append(f"{f.kind}: acks did not resume within {RESUME_WITHIN:g} s")
        # A request forwarded by a follower is lost on the leader's Raft link, whoever sent
        # it: those losses count for both callers.
        if f.producer_unknown > f.lost.producer + f.lost.raft_chunks:
            problems.append(
                f"{f.kind}: the producer saw {f.producer_unknown} OutcomeUnknown, its links "
                f"lost {f.lost.producer} exchanges (+ {f.lost.raft_chunks} Raft chunks)"
            )
        if f.worker_unknown > f.lost.workers + f.lost.raft_chunks:
            problems.append(
                f"{f.kind}: the Workers saw {f.worker_unknown} OutcomeUnknown, their links "
                f"lost {f.lost.workers} exchanges (+ {f.lost.raft_chunks} Raft chunks)"
            )
        seen, lost = f.producer_unknown + f.worker_unknown, f.lost.total
        if seen > lost + (f.reported if f.elections else 0):
            problems.append(
                f"{f.kind}: {seen} OutcomeUnknown seen, {lost} exchanges lost"
                + (f" and {f.reported} reported by rqlite in an election" if f.elections else "")
            )
    return problems
