"""The chaos run's log and its checker: what every actor saw, and what must hold of it.

Every actor logs each call with its start and end times (one machine, one clock) and outcome.
The checker orders the leases of a group the way the database did: by seq (a group's messages
are claimed in publish order), then by `attempts` (each claim of a message adds one). That
order is exact, so a verdict never depends on which of two overlapping calls "came first":
two consecutive leases of one message mean the second claim took the message over, which the
database only allows once the first lease has lapsed."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

APPLIED = ("ok", "resent", "unknown")
"""Ack outcomes after which the ack may have applied (`resent`: reported done after a resend,
`unknown`: an `OutcomeUnknown` reached the worker)."""
EPSILON = 1e-3
"""Slack for float round trips of times through JSON and SQLite (they are exact to ~1e-6)."""


@dataclass
class Op:
    """One call and its outcome, as a worker or publisher saw it."""

    kind: str  # publish | claim | ack
    actor: str
    t0: float
    t1: float
    outcome: str  # ok | resent | lease_lost | unavailable | unknown | error:<type>
    group: str = ""
    i: int = -1
    seq: int = -1
    attempts: int = 0
    expires_at: float = 0.0
    token: str = ""
    shard: str = ""


@dataclass
class Fault:
    kind: str
    node: str
    t0: float
    t1: float = 0.0
    elected: float | None = None
    """Partitions: seconds until the side with the majority had a leader (not the cut one)."""
    stepped_down: float | None = None
    """Partitions of the leader: seconds until the cut-off leader no longer said Leader."""


@dataclass
class Takeovers:
    """Leases that lapsed and were claimed by another worker, by what their holder's ack got."""

    lease_lost: int = 0
    """Fenced: the ack raised LeaseLost (or `settle_and_claim` listed the lease as lost)."""
    resent_done: int = 0
    """The ack's first reply was lost; its resend found the lease gone and reported the ack
    done (at-least-once; the message was delivered again, so the ack did not delete it)."""
    failed: int = 0
    """The ack itself failed (Unavailable / OutcomeUnknown): it changed nothing either."""
    never_acked: int = 0
    """The holder never sent an ack (the run ended first)."""
    unfenced: list[str] = field(default_factory=list)
    """The ack succeeded on its first send after the takeover: a fencing failure."""

    @property
    def total(self) -> int:
        return (
            self.lease_lost + self.resent_done + self.failed + self.never_acked + len(self.unfenced)
        )


@dataclass
class Report:
    config: Any
    operations: int
    faults: list[Fault]
    published: int
    acked: int
    lost: list[tuple[str, int]]
    remaining: int
    """Messages still queued when the run ended (must be 0)."""
    duplicates_delivered: int
    ghost_leases: int
    """Leases that no worker received (gaps in `attempts`): a claim applied but its reply was
    lost and the call failed, or a resent claim's first send applied late (after the resend)."""
    order_violations: list[str]
    exclusivity_violations: list[str]
    takeovers: Takeovers
    errors: list[str]
    """Outcomes that are neither success nor a documented failure (a BackendError, say)."""
    recoveries: list[float]
    replicas_identical: bool
    replica_detail: str
    elapsed: float
    network: str = "loopback"
    outcomes: dict[str, int] = field(default_factory=dict)
    outages: list[str] = field(default_factory=list)
    """Sharded runs: each shard outage, and the other shards' claims during it."""

    @property
    def ok(self) -> bool:
        return (
            not self.lost
            and self.remaining == 0
            and not self.order_violations
            and not self.exclusivity_violations
            and not self.takeovers.unfenced
            and not self.errors
            and self.replicas_identical
            and self.published == self.config.groups * self.config.messages
        )

    def summary(self) -> str:
        c = self.config
        t = self.takeovers
        lines = [
            f"seed {c.seed}: {c.groups} groups x {c.messages} messages, workers: "
            f"{c.thread_workers} threads, {c.task_workers} asyncio tasks, "
            f"{c.process_workers} processes (half claim+ack, half settle_and_claim x{c.batch}); "
            f"publishes paced {c.publish_pace * 1000:.0f} ms apart per publisher",
            f"leases: visibility {c.visibility:g} s; {c.slow_chance:.0%} of handlers sleep "
            f"{c.slow[0]:g}-{c.slow[1]:g} x the visibility; network: {self.network}",
            f"operations: {self.operations} ({dict(sorted(self.outcomes.items()))})",
            f"faults injected: {len(self.faults)} ({dict(sorted(self._kinds().items()))})",
            *self._partition_lines(),
            *self.outages,
            f"published: {self.published}, acked: {self.acked}, lost: {len(self.lost)}, "
            f"left in the queue: {self.remaining}",
            f"duplicates delivered: {self.duplicates_delivered} (redeliveries after a lapsed "
            f"lease or a failed ack); leases no worker got (gaps in attempts): "
            f"{self.ghost_leases}",
            f"order violations: {len(self.order_violations)}",
            f"exclusivity violations (a message leased again before its lease lapsed): "
            f"{len(self.exclusivity_violations)}",
            f"overlaps after a lapsed lease (taken over while its holder still worked): "
            f"{t.total}; the old holder's ack: LeaseLost {t.lease_lost}, resent and reported "
            f"done {t.resent_done}, failed {t.failed}, never sent {t.never_acked}; "
            f"succeeded (unfenced): {len(t.unfenced)}",
            f"unexpected errors: {len(self.errors)}",
            f"time to recover after a leader kill: {self._recovery()}",
            f"replicas identical: {self.replicas_identical} ({self.replica_detail})",
            f"elapsed: {self.elapsed:.1f} s",
        ]
        bad = (self.order_violations, self.exclusivity_violations, t.unfenced, self.errors)
        for found in bad:
            lines += [f"  ! {v}" for v in found[:10]]
        lines += [f"  ! lost {g}/{i}" for g, i in self.lost[:10]]
        return "\n".join(lines)

    def _kinds(self) -> Counter[str]:
        return Counter(f.kind for f in self.faults)

    def _recovery(self) -> str:
        rec = sorted(self.recoveries)
        if not rec:
            return "no leader kill with writes after it"
        return (
            f"{len(rec)} leader kills with writes after them: median "
            f"{statistics.median(rec):.2f} s, max {rec[-1]:.2f} s"
        )

    def _partition_lines(self) -> list[str]:
        cuts = [f for f in self.faults if f.kind.startswith("partition")]
        if not cuts:
            return []
        leaders = [f for f in cuts if f.kind == "partition_leader"]
        elected = [f.elected for f in leaders if f.elected is not None]
        down = [f for f in leaders if f.stepped_down is not None]
        followers = [f for f in cuts if f.kind == "partition_follower"]
        kept = [f for f in followers if f.elected is not None]
        median = f", median {statistics.median(elected):.2f} s" if elected else ""
        return [
            f"partitions: {len(leaders)} of the leader (the majority elected a new leader "
            f"during the cut in {len(elected)}{median}; the cut-off leader stepped down in "
            f"{len(down)}), {len(followers)} of a follower (the majority kept a leader in "
            f"{len(kept)})"
        ]


# ---------------------------------------------------------------------------- the checker


def check(
    config: Any,
    log: Iterable[Op],
    faults: list[Fault],
    *,
    remaining: int = 0,
    identical: bool = True,
    detail: str = "",
    elapsed: float = 0.0,
    network: str = "loopback",
) -> Report:
    """From the log alone (and the queue's depth at the end):

    - lost: published (publish returned) but no ack of it may have applied;
    - order: a group's messages are leased in publish order, each first lease of message i
      ending after an ack of message i-1 that may have applied started; first-send acks of
      a group do not finish before the previous message's ack started;
    - exclusivity: where a message was leased again, the earlier lease had lapsed before the
      new claim returned, and no two leases of one message share an `attempts` count;
    - fencing: where a lapsed lease was taken over, its holder's ack did not succeed on its
      first send (a success would mean an ack acted on a lease another worker held, or a
      message acked and then delivered again).
    """
    ops = sorted(log, key=lambda op: op.t0)
    published = {(o.group, o.i) for o in ops if o.kind == "publish" and o.outcome == "ok"}
    acks: dict[tuple[str, int], list[Op]] = defaultdict(list)
    for o in ops:
        if o.kind == "ack":
            acks[(o.token, o.seq)].append(o)
    leases = _leases(ops)
    # A message counts as acked when some ack of it may have applied.
    acked = {(o.group, o.i) for o in ops if o.kind == "ack" and o.outcome in APPLIED}
    delivered = {(o.group, o.seq) for o in ops if o.kind == "claim" and o.outcome == "ok"}
    order = _order(leases, acks)
    exclusivity: list[str] = []
    takeovers = Takeovers()
    ghosts = 0
    for group_leases in leases.values():
        for _, same in itertools.groupby(group_leases, key=lambda c: c.seq):
            found = list(same)
            ghosts += max(0, found[-1].attempts - len(found))
            for a, b in itertools.pairwise(found):
                _check_takeover(a, b, acks, exclusivity, takeovers)
    errors = [f"{o.actor} {o.kind} {o.group}/{o.i}: {o.outcome}" for o in ops
              if o.outcome.startswith("error:")]  # fmt: skip
    return Report(
        config=config,
        operations=len(ops),
        faults=faults,
        published=len(published),
        acked=len(acked & published),
        lost=sorted(published - acked),
        remaining=remaining,
        duplicates_delivered=sum(map(len, leases.values())) - len(delivered),
        ghost_leases=ghosts,
        order_violations=order,
        exclusivity_violations=exclusivity,
        takeovers=takeovers,
        errors=errors,
        recoveries=_recoveries(ops, faults),
        replicas_identical=identical,
        replica_detail=detail,
        elapsed=elapsed,
        network=network,
        outcomes=dict(Counter(f"{o.kind}:{o.outcome}" for o in ops)),
    )


def _leases(ops: list[Op]) -> dict[str, list[Op]]:
    """Each group's leases in the database's order: by seq, then by attempts."""
    by_group: dict[str, list[Op]] = defaultdict(list)
    for o in ops:
        if o.kind == "claim" and o.outcome == "ok":
            by_group[o.group].append(o)
    for group_leases in by_group.values():
        group_leases.sort(key=lambda c: (c.seq, c.attempts, c.t0))
    return by_group


def _order(leases: dict[str, list[Op]], acks: dict[tuple[str, int], list[Op]]) -> list[str]:
    found: list[str] = []
    for group, group_leases in leases.items():
        firsts = [next(same) for _, same in itertools.groupby(group_leases, key=lambda c: c.seq)]
        for prev, nxt in itertools.pairwise(firsts):
            if nxt.i <= prev.i:
                found.append(f"{group}: message {nxt.i} has a later seq than message {prev.i}")
                continue
            done = [a for c in group_leases if c.seq == prev.seq
                    for a in acks.get((c.token, c.seq), []) if a.outcome in APPLIED]  # fmt: skip
            if not done or min(a.t0 for a in done) > nxt.t1:
                found.append(f"{group}: message {nxt.i} leased by {nxt.actor} at {nxt.t1:.3f} "
                             f"before an ack of message {prev.i} started")  # fmt: skip
            if nxt.i != prev.i + 1:
                found.append(f"{group}: message {nxt.i} leased right after message {prev.i}")
        first_send = [a for c in group_leases for a in acks.get((c.token, c.seq), [])
                      if a.outcome == "ok"]  # fmt: skip
        first_send.sort(key=lambda a: a.i)
        for a, b in itertools.pairwise(first_send):
            if b.t1 < a.t0:
                found.append(f"{group}: ack of message {b.i} done before message {a.i}'s began")
    return found


def _check_takeover(
    a: Op,
    b: Op,
    acks: dict[tuple[str, int], list[Op]],
    exclusivity: list[str],
    takeovers: Takeovers,
) -> None:
    """`b` leased the message `a` had leased before (the next claim of it that a worker saw)."""
    where = f"{a.group}/{a.i} (seq {a.seq})"
    if a.attempts == b.attempts:
        exclusivity.append(f"{where}: {a.actor} and {b.actor} both hold attempt {a.attempts}")
        return
    # b's claim applied somewhere in [b.t0, b.t1]: if a's lease ran past b.t1, two valid
    # leases coexisted. (Not b's own `now`: any claim whose clock has passed a lease's end
    # returns the group to the ready set, and a claim computed a moment earlier may take it.)
    if a.expires_at > b.t1 + EPSILON:
        exclusivity.append(
            f"{where}: {b.actor}'s claim returned at {b.t1:.3f} while {a.actor}'s lease ran "
            f"until {a.expires_at:.3f}"
        )
        return
    outcomes = {o.outcome for o in acks.get((a.token, a.seq), [])}
    if "ok" in outcomes:
        takeovers.unfenced.append(
            f"{where}: {a.actor}'s lease (until {a.expires_at:.3f}) acked on its first send, "
            f"and {b.actor} leased it again at {b.t0:.3f}-{b.t1:.3f}"
        )
    elif "lease_lost" in outcomes:
        takeovers.lease_lost += 1
    elif "resent" in outcomes:
        takeovers.resent_done += 1
    elif outcomes:
        takeovers.failed += 1
    else:
        takeovers.never_acked += 1


def _recoveries(ops: list[Op], faults: list[Fault]) -> list[float]:
    """For each leader kill, how long until the first write started after it succeeded."""
    found = []
    for f in faults:
        if f.kind != "kill_leader":
            continue
        after = [o.t1 for o in ops if o.t0 >= f.t0 and o.outcome in ("ok", "resent")
                 and o.kind in ("ack", "publish")]  # fmt: skip
        if after:
            found.append(min(after) - f.t0)
    return found
