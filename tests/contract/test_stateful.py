"""The contract as a state machine: random sequences of calls, each checked against a small
in-memory model of the queue (docs/contract.md).

The model predicts exactly which lease every `claim` returns (round robin: the eligible group
claimed least recently, never-claimed groups first, ties in group creation order; priority
floor; in flight = leased and not lapsed, or parked and not yet free), when a call on a lease
must raise `LeaseLost` (fencing), what `publish` returns (seqs, dedup ids within the window),
and what `stats()` and `peek` report. The clock is a `FakeClock` that only the machine moves.

A lease holds while its token is its group's current token: a later claim of the group
replaces the token; ack, nack and dead_letter of that lease clear it; a lapsed lease nobody
took over still holds (a claim frees lapsed groups but keeps their token). A group whose last
message goes (ack or dead letter) keeps its place (turn and creation order) for RETIRE_WINDOW:
published again within it, it takes that place back; after it, it starts afresh: last in
creation order, never claimed. Either way its priority is set by that publish.

Runs: a short one on SQLite by default (100 examples x 30 steps), a long one on SQLite marked
slow (300 x 50), and a short one on the real one-node rqlite (20 x 25, a fresh queue per
example)."""

from __future__ import annotations

import itertools
import math
import os
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as note_event
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rqlite_queue import Lease, LeaseLost, RqliteTransport, SqliteTransport, Transport
from rqlite_queue._protocol.sql import RETIRE_WINDOW
from rqlite_queue.testing import Cluster

from .conftest import FakeClock

GROUPS = ("a", "b", "c", "d")
DEDUP_IDS = ("d1", "d2", "d3")
DEDUP_WINDOW = 50.0

groups = st.sampled_from(GROUPS)
priorities = st.integers(0, 4)
# Claims mostly take every priority; a floor now and then.
floors = st.sampled_from([0, 0, 0, 1, 2, 3, 4])
# Mostly plain publishes; an id from a small pool now and then, so that some repeat.
dedup_ids = st.sampled_from([None] * 8 + list(DEDUP_IDS))
visibilities = st.sampled_from([3.0, 5.0, 10.0, 30.0])
delays = st.sampled_from([0, 0, 2.5, 10])
advances = st.sampled_from([0.5, 2.5, 3.0, 5.0, 10.0, 30.0, 60.0])
# Publishes: mostly at once, now and then delayed or with a ttl.
delays_ = st.sampled_from([None, None, None, None, 2.5, 10.0])
ttls = st.sampled_from([None, None, None, None, 3.0, 30.0])
follow_ups = st.lists(st.tuples(groups, priorities, dedup_ids, delays_), max_size=2)
"""A settlement's follow-ups: (group, priority, dedup id, delay)."""


# --------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Message:
    seq: int
    event: Any
    published_at: float
    due: float = 0.0
    """Not delivered before (0: at once)."""
    expires: float | None = None
    """Dead-lettered (reason `expired`) instead of delivered from then on."""


@dataclass
class Group:
    priority: int
    created: int
    """Creation order: the round-robin tie-break."""
    messages: deque[Message] = field(default_factory=deque)
    """Head first."""
    turn: int = 0
    """The claim counter at the group's last claim; 0: never claimed."""
    attempts: int = 0
    """Claims of the current head."""
    token: str | None = None
    """The lease that holds the group (or held it and lapsed, with nobody taking over)."""
    state: str = "free"
    """free, leased or parked; leased and parked last until `until`."""
    until: float = 0.0


@dataclass(frozen=True)
class Predicted:
    group_id: str
    seq: int
    event: Any
    attempts: int
    expires_at: float
    expires: float | None = None


class Model:
    def __init__(self, now: float, dedup_window: float) -> None:
        self.now = now
        self.dedup_window = dedup_window
        self.groups: dict[str, Group] = {}
        self.dedup: dict[str, tuple[int, float]] = {}  # id -> (seq, expires_at)
        self.dead: list[tuple[int, str, Any, int, int]] = []
        self._seq = itertools.count(1)
        self._created = itertools.count()
        self._turn = itertools.count(1)
        # emptied group -> (turn, creation order, expires_at)
        self.retired: dict[str, tuple[int, int, float]] = {}
        self.held: set[str] = set()
        self.paused = False
        self.last_seq = 0
        self.expired = 0
        # name -> [group, event, priority, every, catch_up, next_at]
        self.schedules: dict[str, list[Any]] = {}
        # (token, seq) -> (how it was settled, until when the record counts)
        self.settled: dict[tuple[str, int], tuple[str, float]] = {}

    # -------------------------------------------------------------------------- reading

    def busy(self, g: Group) -> bool:
        """In flight: leased and not lapsed, or parked and not yet free."""
        return g.state != "free" and g.until > self.now

    def holds(self, lease: Lease) -> bool:
        g = self.groups.get(lease.group_id)
        held = g is not None and g.token == lease.token
        if held and g is not None and g.until <= self.now:
            note_event("a lapsed lease nobody took over still holds")
        return held

    def settled_before(self, lease: Lease, how: str) -> bool:
        """The same settlement of this lease applied earlier (its record counts for
        RETIRE_WINDOW): sent again, it reports success and changes nothing."""
        kind, until = self.settled.get((lease.token, lease.seq), ("", 0.0))
        if kind == how and until >= self.now:
            note_event("a settlement sent again finds its own record")
            return True
        return False

    def _record(self, lease: Lease, how: str) -> None:
        self.settled[(lease.token, lease.seq)] = (how, self.now + RETIRE_WINDOW)

    # -------------------------------------------------------------------------- writing

    def publish(
        self,
        group_id: str,
        event: Any,
        priority: int,
        dedup_id: str | None,
        delay: float | None = None,
        ttl: float | None = None,
    ) -> int:
        if dedup_id is not None:
            self.dedup = {d: v for d, v in self.dedup.items() if v[1] >= self.now}
            if dedup_id in self.dedup:
                note_event("a dedup id repeats within the window")
                return self.dedup[dedup_id][0]
        seq = self.last_seq = next(self._seq)
        if group_id not in self.groups:
            turn, created, expires_at = self.retired.get(group_id, (0, 0, 0.0))
            if expires_at >= self.now or group_id in self.held:
                # Emptied lately: it takes its place in the round robin back.
                self.groups[group_id] = Group(priority, created, turn=turn)
            else:
                self.groups[group_id] = Group(priority, next(self._created))
        due = self.now + delay if delay else 0.0
        expires = self.now + ttl if ttl else None
        self.groups[group_id].messages.append(Message(seq, event, self.now, due, expires))
        if dedup_id is not None:
            self.dedup[dedup_id] = (seq, self.now + self.dedup_window)
        return seq

    def claim(self, n: int, min_priority: int, visibility: float) -> list[Predicted]:
        """As the transport claims: leases on messages whose ttl passed are dead-lettered
        (`expired`) instead of handed out, and as many claimed again, until none expired."""
        leased: list[Predicted] = []
        while n:
            taken = self._claim_once(n, min_priority, visibility)
            expired = [p for p in taken if self._expired(p)]
            for p in expired:
                note_event("a claimed message had expired")
                self._dead_letter_head(p.group_id, p.seq)
                self.expired += 1
            leased += [p for p in taken if not self._expired(p)]
            n = len(expired)
        return leased

    def _expired(self, p: Predicted) -> bool:
        return p.expires is not None and p.expires <= self.now

    def eligible(self, min_priority: int) -> list[tuple[str, Group]]:
        """The groups a claim could take now, in the order it takes them."""
        found = [
            (gid, g)
            for gid, g in self.groups.items()
            if not self.paused
            and g.messages
            and not self.busy(g)
            and g.priority >= min_priority
            and gid not in self.held
            and g.messages[0].due <= self.now
        ]
        found.sort(key=lambda item: (item[1].turn, item[1].created))
        return found

    def _claim_once(self, n: int, min_priority: int, visibility: float) -> list[Predicted]:
        turn = next(self._turn)
        eligible = self.eligible(min_priority)
        out = []
        for gid, g in eligible[:n]:
            g.turn = turn
            g.attempts += 1
            g.state, g.until = "leased", self.now + visibility
            g.token = None  # set to the real token once the claim has returned
            head = g.messages[0]
            out.append(Predicted(gid, head.seq, head.event, g.attempts, g.until, head.expires))
        return out

    def _dead_letter_head(self, group_id: str, seq: int, hold: bool = False) -> None:
        g = self.groups[group_id]
        head = g.messages[0]
        self.dead.append((seq, group_id, head.event, g.priority, g.attempts))
        if hold:
            self.held.add(group_id)
        self._finish_head(group_id, seq)

    def _finish(self, lease: Lease) -> None:
        self._finish_head(lease.group_id, lease.seq)

    def _finish_head(self, group_id: str, seq: int) -> None:
        """The held head goes; the group is free again, or forgotten if now empty."""
        g = self.groups[group_id]
        head = g.messages.popleft()
        assert head.seq == seq, "model: a holding lease is always on its group's head"
        g.attempts, g.token, g.state, g.until = 0, None, "free", 0.0
        if not g.messages:
            self.retired[group_id] = (g.turn, g.created, self.now + RETIRE_WINDOW)
            del self.groups[group_id]

    def ack(self, lease: Lease) -> bool:
        if not self.holds(lease):
            return self.settled_before(lease, "ack")
        self._finish(lease)
        self._record(lease, "ack")
        return True

    def dead_letter(self, lease: Lease, hold: bool = False) -> bool:
        if not self.holds(lease):
            return self.settled_before(lease, "dead")
        self._dead_letter_head(lease.group_id, lease.seq, hold)
        self._record(lease, "dead")
        return True

    def hold(self, group_id: str) -> None:
        if group_id not in self.groups and group_id not in self.held:
            expires_at = self.retired.get(group_id, (0, 0, 0.0))[2]
            if expires_at < self.now:
                # A group with no kept place gets one now: never claimed, last created.
                self.retired[group_id] = (0, next(self._created), float("-inf"))
        self.held.add(group_id)

    def cancel(self, group_id: str) -> int:
        """Every message of the group goes to the dead letters (the head with its attempts);
        the group empties (its place kept for RETIRE_WINDOW), so its lease no longer holds."""
        g = self.groups.pop(group_id, None)
        if g is None:
            return 0
        for i, message in enumerate(g.messages):
            attempts = g.attempts if i == 0 else 0
            self.dead.append((message.seq, group_id, message.event, g.priority, attempts))
        self.retired[group_id] = (g.turn, g.created, self.now + RETIRE_WINDOW)
        return len(g.messages)

    def set_priority(self, group_id: str, priority: int) -> bool:
        if group_id not in self.groups:
            return False
        self.groups[group_id].priority = priority
        return True

    def listing(self) -> list[tuple[Any, ...]]:
        """What `groups()` lists: (id, priority, state, depth, head seq, attempts, until,
        holder) of every group with messages, in id order (held ones without: id and state)."""
        rows: list[tuple[Any, ...]] = []
        for gid in sorted(set(self.groups) | self.held):
            g = self.groups.get(gid)
            if g is None:
                rows.append((gid, "held", 0))
                continue
            head = g.messages[0]
            if self.busy(g):
                state, until = g.state, g.until
            elif head.due > self.now:
                state, until = "delayed", head.due
            else:
                state, until = "ready", None
            holder = "w" if state == "leased" else None
            state = "held" if gid in self.held else state
            rows.append(
                (gid, g.priority, state, len(g.messages), head.seq, g.attempts, until, holder)
            )
        return rows

    def schedule(
        self, name: str, group_id: str, event: Any, priority: int, every: float, catch_up: bool
    ) -> float:
        self.schedules[name] = [group_id, event, priority, every, catch_up, self.now + every]
        return self.now + every

    def unschedule(self, name: str) -> bool:
        return self.schedules.pop(name, None) is not None

    def fire(self) -> int:
        """Each due schedule publishes one message for the ticks it missed (one per tick with
        catch_up), in the order of their next tick, then name; and moves on past now."""
        due = sorted((v[5], name) for name, v in self.schedules.items() if v[5] <= self.now)
        published = 0
        for next_at, name in due:
            group_id, event, priority, every, catch_up, _ = self.schedules[name]
            missed = math.floor((self.now - next_at) / every) + 1
            for _ in range(missed if catch_up else 1):
                self.publish(group_id, event, priority, None)
                published += 1
            self.schedules[name][5] = next_at + missed * every
        return published

    def release(self, group_id: str) -> bool:
        held = group_id in self.held
        self.held.discard(group_id)
        return held

    def nack(self, lease: Lease, delay: float) -> bool:
        if not self.holds(lease):
            return self.settled_before(lease, "nack")
        g = self.groups[lease.group_id]
        g.token = None
        g.state, g.until = ("parked", self.now + delay) if delay > 0 else ("free", 0.0)
        self._record(lease, "nack")
        return True

    def extend(self, lease: Lease, visibility: float) -> bool:
        if not self.holds(lease):
            return False
        g = self.groups[lease.group_id]
        g.state, g.until = "leased", self.now + visibility
        return True


# -------------------------------------------------------------------------- state machine


class QueueMachine(RuleBasedStateMachine):
    """Drives one transport and the model side by side. Subclasses say which transport."""

    leases = Bundle("leases")

    def open(self, clock: FakeClock) -> Transport:
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.q = self.open(self.clock)
        self.model = Model(self.clock.now, DEDUP_WINDOW)
        self.events = itertools.count()

    def teardown(self) -> None:
        self.q.close()

    def in_listing_order(self, dead: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Dead letters as listed (one cluster lists them in seq order)."""
        return dead

    def expect(self, held: bool, call: Callable[[], Any]) -> Any:
        """Run a fenced call: it must succeed exactly when the model says the lease holds."""
        if held:
            return call()
        note_event("a stale lease is fenced")
        with pytest.raises(LeaseLost):
            call()
        return None

    # -------------------------------------------------------------------------- publish

    @rule(group_id=groups, priority=priorities, dedup_id=dedup_ids, delay=delays_, ttl=ttls)
    def publish(
        self,
        group_id: str,
        priority: int,
        dedup_id: str | None,
        delay: float | None,
        ttl: float | None,
    ) -> None:
        event = next(self.events)
        seq = self.q.publish(group_id, event, priority, dedup_id=dedup_id, delay=delay, ttl=ttl)
        if delay:
            note_event("a delayed publish")
        assert seq == self.model.publish(group_id, event, priority, dedup_id, delay, ttl)

    @initialize(items=st.lists(st.tuples(groups, priorities, dedup_ids), max_size=12))
    def a_backlog(self, items: list[tuple[str, int, str | None]]) -> None:
        if items:
            self.publish_many(items)

    @rule(items=st.lists(st.tuples(groups, priorities, dedup_ids), min_size=1, max_size=6))
    def publish_many(self, items: list[tuple[str, int, str | None]]) -> None:
        batch: list[Any] = []
        for group_id, priority, dedup_id in items:
            event = next(self.events)
            if dedup_id is None and priority == 0:
                batch.append((group_id, event))
            elif dedup_id is None:
                batch.append((group_id, event, priority))
            else:
                batch.append(
                    {
                        "group_id": group_id,
                        "event": event,
                        "priority": priority,
                        "dedup_id": dedup_id,
                    }
                )
        seqs = self.q.publish_many(batch)
        # The model publishes them one by one: same order, same `now`.
        expected = [self.model.publish(*unpack(item)) for item in batch]
        assert seqs == expected

    # ---------------------------------------------------------------------------- claim

    def _claimed(
        self, leases: Sequence[Lease], predicted: list[Predicted]
    ) -> MultipleResults[Lease]:
        got = {
            lease.group_id: (lease.seq, lease.event, lease.attempts, lease.expires_at)
            for lease in leases
        }
        want = {p.group_id: (p.seq, p.event, p.attempts, p.expires_at) for p in predicted}
        assert got == want
        assert len(leases) == len(got), "one lease per group"
        note_event(f"claim took {len(leases)} groups")
        if any(p.attempts > 1 for p in predicted):
            note_event("a message is claimed again")
        for lease in leases:
            self.model.groups[lease.group_id].token = lease.token
        return multiple(*leases)

    def predict_claim(self, n: int, min_priority: int, visibility: float) -> list[Predicted]:
        """What a claim of `n` just took, by the model (after the real call)."""
        return self.model.claim(n, min_priority, visibility)

    @rule(target=leases, min_priority=floors, visibility=visibilities)
    def claim(self, min_priority: int, visibility: float) -> MultipleResults[Lease]:
        lease = self.q.claim("w", visibility, min_priority)
        predicted = self.predict_claim(1, min_priority, visibility)
        return self._claimed([] if lease is None else [lease], predicted)

    @rule(target=leases, n=st.integers(1, 4), min_priority=floors, visibility=visibilities)
    def claim_many(self, n: int, min_priority: int, visibility: float) -> MultipleResults[Lease]:
        leases = self.q.claim_many("w", visibility, n, min_priority)
        return self._claimed(leases, self.predict_claim(n, min_priority, visibility))

    # ------------------------------------------------------------------ calls on a lease

    def _settle_in_one_round(self, settlements: list[tuple[Lease, str, float]]) -> list[Lease]:
        """Settle in the model as one round does: in order; a lease named again in the same
        round is reported lost (it was settled by its first mention)."""
        seen: set[tuple[str, str, int]] = set()
        lost: list[Lease] = []
        for lease, how, delay in settlements:
            key = (lease.group_id, lease.token, lease.seq)
            if key in seen:
                lost.append(lease)
                continue
            seen.add(key)
            applied = self.model.ack(lease) if how == "ack" else self.model.nack(lease, delay)
            if not applied:
                lost.append(lease)
        return lost

    def _follow_ups(self, given: list[tuple[str, int, str | None, float | None]]) -> list[Any]:
        """Follow-up items (with fresh events) for a settlement."""
        items: list[Any] = []
        for group_id, priority, dedup_id, delay in given:
            item = {"group_id": group_id, "event": next(self.events), "priority": priority}
            if dedup_id is not None:
                item["dedup_id"] = dedup_id
            if delay is not None:
                item["delay"] = delay
            items.append(item)
        if len({i.get("dedup_id") for i in items if "dedup_id" in i}) < sum(
            "dedup_id" in i for i in items
        ):
            note_event("a dedup id repeated among one settlement's follow-ups")
        return items

    def publish_follow_ups(self, lease: Lease, items: list[Any], *, before: bool) -> None:
        """The model publishes a settlement's follow-ups: in its transaction, before it
        changes the lease's group (`before`); a sharded queue forwards those of other shards
        after the round (`before=False`)."""
        if before:
            for item in items:
                self.model.publish(
                    item["group_id"],
                    item["event"],
                    item["priority"],
                    item.get("dedup_id"),
                    item.get("delay"),
                )
        if items:
            note_event("a settlement publishes follow-ups")

    @rule(lease=leases, follow=follow_ups)
    def ack(self, lease: Lease, follow: list[tuple[str, int, str | None, float | None]]) -> None:
        items = self._follow_ups(follow)
        holds = self.model.holds(lease)
        applies = holds or self.model.settled_before(lease, "ack")
        self.expect(applies, lambda: self.q.ack(lease, publish=items))
        if holds:
            self.publish_follow_ups(lease, items, before=True)
        self.model.ack(lease)
        if holds:
            self.publish_follow_ups(lease, items, before=False)

    @rule(leases=st.lists(leases, min_size=1, max_size=3))
    def ack_many(self, leases: list[Lease]) -> None:
        lost = self._settle_in_one_round([(lease, "ack", 0.0) for lease in leases])
        if not lost:
            self.q.ack_many(leases)
            return
        with pytest.raises(LeaseLost) as raised:
            self.q.ack_many(leases)
        assert raised.value.leases == lost

    @rule(lease=leases, delay=delays)
    def nack(self, lease: Lease, delay: float) -> None:
        applies = self.model.holds(lease) or self.model.settled_before(lease, "nack")
        self.expect(applies, lambda: self.q.nack(lease, delay))
        self.model.nack(lease, delay)

    @rule(lease=leases, visibility=visibilities)
    def extend(self, lease: Lease, visibility: float) -> None:
        extended = self.expect(self.model.holds(lease), lambda: self.q.extend(lease, visibility))
        if self.model.extend(lease, visibility):
            assert extended.expires_at == self.clock.now + visibility
            assert (extended.seq, extended.token) == (lease.seq, lease.token)

    @rule(lease=leases, hold=st.booleans(), follow=follow_ups)
    def dead_letter(
        self, lease: Lease, hold: bool, follow: list[tuple[str, int, str | None, float | None]]
    ) -> None:
        items = self._follow_ups(follow)
        holds = self.model.holds(lease)
        applies = holds or self.model.settled_before(lease, "dead")
        self.expect(applies, lambda: self.q.dead_letter(lease, "poison", hold=hold, publish=items))
        if hold and holds:
            note_event("a dead letter holds its group")
        if holds:
            self.publish_follow_ups(lease, items, before=True)
        applied = self.model.dead_letter(lease, hold)
        if holds:
            self.publish_follow_ups(lease, items, before=False)
        if applied:
            dead = self.q.dead_letters(1000)
            got = [(d.seq, d.group_id, d.event, d.priority, d.attempts) for d in dead]
            assert self.in_listing_order(got) == sorted(self.model.dead)  # listed in seq order

    @rule(
        target=leases,
        acks=st.lists(leases, max_size=3),
        nacks=st.lists(st.tuples(leases, delays), max_size=2),
        n=st.integers(0, 3),
        min_priority=floors,
        visibility=visibilities,
        follow=st.lists(st.tuples(groups, priorities), max_size=2),
    )
    def settle_and_claim(
        self,
        acks: list[Lease],
        nacks: list[tuple[Lease, float]],
        n: int,
        min_priority: int,
        visibility: float,
        follow: list[tuple[str, int]],
    ) -> MultipleResults[Lease]:
        """Acks (the first one with follow-ups), then nacks, then a claim, in one
        transaction: each settlement that no longer holds (or names a lease already settled
        in this round) is reported, not raised; only the follow-ups of the acks that applied
        are published."""
        items = self._follow_ups([(g, p, None, None) for g, p in follow])
        publish = [(acks[0], items)] if acks and items else []
        holds = bool(publish) and self.model.holds(acks[0])
        result = self.q.settle_and_claim(
            "w", visibility, n, ack=acks, nack=nacks, min_priority=min_priority, publish=publish
        )
        if holds:
            self.publish_follow_ups(acks[0], items, before=True)
        lost = self._settle_in_one_round(
            [(lease, "ack", 0.0) for lease in acks]
            + [(lease, "nack", delay) for lease, delay in nacks]
        )
        if lost:
            note_event("a round reports lost settlements")
        assert result.lost == lost
        predicted = self.predict_claim(n, min_priority, visibility)
        if holds:
            self.publish_follow_ups(acks[0], items, before=False)
        if not n:
            assert result.leases == [] == predicted
            return multiple()
        return self._claimed(result.leases, predicted)

    @rule(
        name=st.sampled_from(["s1", "s2"]),
        group_id=groups,
        priority=priorities,
        every=st.sampled_from([2.5, 10.0, 30.0]),
        catch_up=st.booleans(),
    )
    def schedule(
        self, name: str, group_id: str, priority: int, every: float, catch_up: bool
    ) -> None:
        event = next(self.events)
        made = self.q.schedule(
            name, group_id, event, every=every, priority=priority, catch_up=catch_up
        )
        assert made.next_at == self.model.schedule(name, group_id, event, priority, every, catch_up)

    @rule(name=st.sampled_from(["s1", "s2"]))
    def unschedule(self, name: str) -> None:
        assert self.q.unschedule(name) == self.model.unschedule(name)

    @rule()
    def fire_schedules(self) -> None:
        published = self.q.fire_schedules()
        assert published == self.model.fire()
        if published:
            note_event("a schedule ticked")
        assert {s.name: s.next_at for s in self.q.schedules()} == {
            name: v[5] for name, v in self.model.schedules.items()
        }

    @rule(group_id=groups)
    def hold(self, group_id: str) -> None:
        self.q.hold_group(group_id)
        self.model.hold(group_id)

    @rule(group_id=groups)
    def release(self, group_id: str) -> None:
        assert self.q.release_group(group_id) == self.model.release(group_id)

    @rule(group_id=groups)
    def cancel_group(self, group_id: str) -> None:
        cancelled = self.q.cancel_group(group_id, "cancelled")
        assert cancelled == self.model.cancel(group_id)
        if cancelled:
            note_event("a group is cancelled")
        # The model's dead letters carry no reason: the kinds are checked in the contract suite.
        dead = self.q.dead_letters(1000)
        got = [(d.seq, d.group_id, d.event, d.priority, d.attempts) for d in dead]
        assert self.in_listing_order(got) == sorted(self.model.dead)

    @rule(group_id=groups, priority=priorities)
    def set_priority(self, group_id: str, priority: int) -> None:
        assert self.q.set_priority(group_id, priority) == self.model.set_priority(
            group_id, priority
        )

    @rule(paused=st.booleans())
    def pause_or_resume(self, paused: bool) -> None:
        if paused:
            self.q.pause()
        else:
            self.q.resume()
        self.model.paused = paused

    @invariant()
    def groups_listed_match_the_model(self) -> None:
        listed = []
        for info in self.q.groups(limit=100):
            if info.depth == 0:
                assert info.head_seq is None and info.head_age is None
                listed.append((info.group_id, info.state, info.depth))
                continue
            listed.append(
                (
                    info.group_id,
                    info.priority,
                    info.state,
                    info.depth,
                    info.head_seq,
                    info.attempts,
                    info.until,
                    info.holder,
                )
            )
        assert listed == self.model.listing()

    # ------------------------------------------------------------------------ time, reads

    @rule(seconds=advances)
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.model.now = self.clock.now

    @precondition(lambda self: bool(self.model.groups))
    @rule(data=st.data())
    def peek(self, data: st.DataObject) -> None:
        group_id = data.draw(st.sampled_from(sorted(self.model.groups)))
        want = [(m.seq, m.event) for m in self.model.groups[group_id].messages]
        assert self.q.peek(group_id, 100) == want

    @invariant()
    def stats_match_the_model(self) -> None:
        m = self.model
        stats = self.q.stats()
        live = list(m.groups.values())
        in_flight = sum(1 for g in live if g.state == "leased" and m.busy(g))
        parked = sum(1 for g in live if g.state == "parked" and m.busy(g))
        by_priority: dict[int, int] = {}
        for g in live:
            by_priority[g.priority] = by_priority.get(g.priority, 0) + len(g.messages)
        assert (
            stats.depth,
            stats.groups,
            stats.in_flight,
            stats.parked,
            stats.dead,
            stats.held,
            stats.delayed,
            stats.expired,
            stats.paused,
            stats.last_seq,
        ) == (
            sum(len(g.messages) for g in live),
            len(live),
            in_flight,
            parked,
            len(m.dead),
            len(m.held),
            sum(msg.due > m.now for g in live for msg in g.messages),
            m.expired,
            m.paused,
            m.last_seq,
        )
        assert stats.by_priority == by_priority
        oldest = min((m.published_at for g in live for m in g.messages), default=None)
        if oldest is None:
            assert stats.oldest_age is None
        else:
            assert stats.oldest_age == pytest.approx(m.now - oldest)


def unpack(item: Any) -> tuple[str, Any, int, str | None]:
    if isinstance(item, dict):
        return item["group_id"], item["event"], item["priority"], item["dedup_id"]
    if len(item) == 2:
        return item[0], item[1], 0, None
    return item[0], item[1], item[2], None


def machine(open_transport: Callable[[FakeClock], Transport]) -> type[QueueMachine]:
    class Machine(QueueMachine):
        def open(self, clock: FakeClock) -> Transport:
            return open_transport(clock)

    return Machine


def on_sqlite(tmp_path: Path) -> Callable[[FakeClock], Transport]:
    def open_transport(clock: FakeClock) -> Transport:
        path = os.fspath(tmp_path / f"sm_{uuid.uuid4().hex[:12]}.db")
        return SqliteTransport(path, clock=clock, dedup_window=DEDUP_WINDOW)

    return open_transport


def run(machine_class: type[QueueMachine], examples: int, steps: int) -> None:
    run_state_machine_as_test(
        machine_class,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


# --------------------------------------------------------------------------------- runs


def test_the_contract_holds_on_sqlite(tmp_path: Path) -> None:
    run(machine(on_sqlite(tmp_path)), examples=100, steps=30)


@pytest.mark.slow
def test_the_contract_holds_on_sqlite_long(tmp_path: Path) -> None:
    run(machine(on_sqlite(tmp_path)), examples=300, steps=50)


def test_the_contract_holds_on_rqlite(rqlite_cluster: Cluster) -> None:
    url = rqlite_cluster.url

    def open_transport(clock: FakeClock) -> Transport:
        # A fresh queue (tables created on the first call) per example.
        queue = f"sm_{uuid.uuid4().hex[:12]}"
        return RqliteTransport(
            url, clock=clock, queue=queue, dedup_window=DEDUP_WINDOW, max_skew=None
        )

    run(machine(open_transport), examples=20, steps=25)
