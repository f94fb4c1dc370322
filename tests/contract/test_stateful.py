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

Tenants, limits, bounds and debounce (guarantees 22-26; not on the sharded machine): in two
examples out of three, publishes name tenants (a group's own while it has no messages, now and
then another: `TenantMismatch` for a group with messages of another tenant) and `set_tenant`
sets weights, caps, rate limits and bounds (`math.inf` removes one). Once tenants are on, the
model predicts each claim as the SQL makes it: stride scheduling within each tenant's allowance
(its cap less its leases in flight, the whole tokens of its bucket), a tenant's virtual time
lifted to the queue's when it gets a claimable group after having none (`Group.ready` follows
the SQL's `ready` flag, which a lapse or a delayed head's due time sets only at the next claim,
when the SQL's triggers lift), ties between tenants in the order their rows were made; a floor
claim in round-robin order within the allowances. A publish that leaves a group, or a tenant of
its groups, over its tenant's bound raises `QueueFull` (the model rolls back). A debounced
publish replaces its group's pending message with that key (not the head a claim took): seq
and place kept, event, ttl and due replaced, due never past the run's first publish plus its
`max_wait`. (The model found two bugs, fixed: `publish_many` folded a debounce key into an
equal dedup id, and a floor claim let a tenant with no allowance left crowd the others out of
a level.) `tenants()` is checked by a rule (a read after every step costs too much time).

Runs: a short one on SQLite by default (100 examples x 30 steps), a long one on SQLite marked
slow (300 x 50), and a short one on the real one-node rqlite (20 x 25, a fresh queue per
example); marked slow too, a long one of `FairShareMachine` (the calls that make tenants' claims
compete, without schedules, priorities, pauses: 300 x 50)."""

from __future__ import annotations

import copy
import itertools
import math
import os
import uuid
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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

from rqlite_queue import Lease, LeaseLost, RqliteTransport, SqliteTransport, Transport, group_states
from rqlite_queue._protocol.schema import RETIRE_WINDOW
from rqlite_queue.errors import QueueError, QueueFull, TenantMismatch
from rqlite_queue.testing import Cluster

from .conftest import FakeClock, dropped_when_closed

GROUPS = ("a", "b", "c", "d")
DEDUP_IDS = ("d1", "d2", "d3")
DEDUP_WINDOW = 50.0
HOMES = {"a": "t1", "b": "t1", "c": "t2", "d": "t2"}
"""Each group's own tenant (the default one, '', gets those published without one)."""
HOME = "home"
"""A publish naming its group's own tenant (HOMES) if the group has no messages, else none
(it keeps its tenant; a publish naming a tenant costs the library more statements)."""

FLOWS = {flow.name: flow for flow in group_states.FLOWS}
"""The model's `Group.state` of a busy group (leased, parked) as the table's flow."""

groups = st.sampled_from(GROUPS)
priorities = st.integers(0, 4)
# Claims mostly take every priority; a floor now and then.
floors = st.sampled_from([0, 0, 0, 0, 0, 1, 2, 3, 4])
# Mostly plain publishes; an id from a small pool now and then, so that some repeat.
dedup_ids = st.sampled_from([None] * 8 + list(DEDUP_IDS))
visibilities = st.sampled_from([3.0, 5.0, 10.0, 30.0])
delays = st.sampled_from([0, 0, 2.5, 10])
advances = st.sampled_from([0.5, 2.5, 3.0, 5.0, 10.0, 30.0, 60.0])
# Publishes: mostly at once, now and then delayed or with a ttl.
delays_ = st.sampled_from([None, None, None, None, 2.5, 10.0])
ttls = st.sampled_from([None, None, None, None, 3.0, 30.0])
follow_ups = st.lists(st.tuples(groups, priorities, dedup_ids, delays_), max_size=2)
keeps = st.sampled_from([None, 20.0, 100.0, 100.0])
"""How long a publish keeps its messages' outcomes."""
results = st.sampled_from([None, None, 1, {"r": [2]}])
progresses = st.sampled_from([None, None, 1, {"p": "half"}])
reasons = st.sampled_from(["r1", "r2"])
"""A settlement's follow-ups: (group, priority, dedup id, delay)."""
# Tenants: mostly the group's own, now and then none or another one. Debounce keys: "d1" is
# also a dedup id (the two never fold into one another). (Drawn together: fewer draws,
# shorter runs.)
DEBOUNCE_KEYS = [None, None, "k1", "k2", "d1"]
debounce_keys = st.sampled_from(DEBOUNCE_KEYS)
publish_options = st.sampled_from(
    list(
        itertools.product(
            [HOME] * 8 + [None, None, "t1", "t2"], DEBOUNCE_KEYS, [None, None, 4.0, 20.0]
        )
    )
)
"""A publish's (tenant, debounce key, max_wait)."""
batch_tenants = st.sampled_from([HOME] * 10 + ["t1", "t2"])
item_options = st.sampled_from(list(itertools.product([True, False], DEBOUNCE_KEYS)))
"""A `publish_many` item's (whether it names a tenant, debounce key)."""
tenant_names = st.sampled_from(["", "t1", "t1", "t2", "t2"])
TENANT_SETTINGS: list[dict[str, float]] = [
    *({"weight": w} for w in (0.5, 2, 3)),
    *({"max_in_flight": c} for c in (0, 0, 1, 1, 1, 2, math.inf)),
    *({"rate": r} for r in (0.1, 0.1, 0.5, 2.0, math.inf)),
    *({"rate": r, "burst": b} for r in (0.1, 0.5) for b in (2, 3)),
    {"burst": 2},
    *({"max_queued": q} for q in (3, 6, math.inf)),
    *({"max_group_queued": q} for q in (1, 2, 3, math.inf)),
    {"weight": 2, "max_in_flight": 1},
    {"weight": 0.5, "rate": 0.5, "burst": 2},
    {"weight": 3, "max_queued": 4, "max_group_queued": 2},
    {
        "weight": 1,
        "rate": math.inf,
        "max_in_flight": math.inf,
        "max_queued": math.inf,
        "max_group_queued": math.inf,
    },
]
tenant_settings = st.sampled_from(TENANT_SETTINGS)
"""`set_tenant`'s settings (never changed: shared by the examples); `math.inf` removes a
limit."""


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
    debounce: str | None = None
    """A later publish with this key replaces it while it is pending (not taken by a claim)."""
    due_by: float | None = None
    """Its run's bound on `due` (the first publish of the run plus its max_wait)."""
    keep: float | None = None
    """How long its outcome is kept once it settles (None: not kept)."""
    cancel: str | None = None
    """A cancel's reason: cancelled while leased (its settlement cancels it)."""
    progress: Any = None
    """The last progress an extension of its lease carried."""


@dataclass(frozen=True)
class Outcome:
    """A settled message's outcome, as `result()` reads it until `kept_until`."""

    status: str
    result: Any
    reason: str | None
    attempts: int
    progress: Any
    kept_until: float


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
    tenant: str = ""
    ready: bool = True
    """The SQL's `ready` flag: set by the statement that last changed the group (a claim
    clears it; a lapse, the end of a park or a delayed head's due time sets it again only at
    the next claim). Claimable (for the tenants' counts) = ready and not held."""


@dataclass
class Tenant:
    """A tenant's row: weight, limits (None: none), virtual time, token bucket."""

    vt: float = 0.0
    weight: float = 1.0
    cap: int | None = None
    rate: float | None = None
    burst: float | None = None
    tokens: float = 0.0
    stamp: float = 0.0
    max_queued: int | None = None
    max_group_queued: int | None = None


@dataclass(frozen=True)
class Item:
    """One message to publish, as the client checks it (due and expiry at `now`)."""

    group_id: str
    event: Any
    priority: int = 0
    dedup_id: str | None = None
    due: float = 0.0
    expires: float | None = None
    tenant: str | None = None
    debounce: str | None = None
    due_by: float | None = None
    keep: float | None = None


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
        self._seq = 0
        self._created = 0
        self._turn = 0
        # emptied group -> (turn, creation order, expires_at, tenant)
        self.retired: dict[str, tuple[int, int, float, str]] = {}
        self.held: set[str] = set()
        self.paused = False
        self.last_seq = 0
        self.expired = 0
        # name -> [group, event, priority, every, catch_up, next_at]
        self.schedules: dict[str, list[Any]] = {}
        # (token, seq) -> (how it was settled, until when the record counts)
        self.settled: dict[tuple[str, int], tuple[str, float]] = {}
        self.tenants_on = False
        self.tenants: dict[str, Tenant] = {"": Tenant()}
        """The tenants' rows, in the order they were made (ties in `vt` go by it)."""
        self.vtime = 0.0
        """The queue's virtual time: the latest due time served."""
        self.outcomes: dict[int, tuple[str, Outcome]] = {}
        """seq -> (group, outcome) of the settled messages that keep theirs, not yet pruned
        (the machine's transport prunes on every round that settles a lease for good)."""
        self.cancelled: dict[int, float] = {}
        """seq -> until when the record of its cancel (queued: removed) counts."""
        self.known: set[tuple[str, int]] = set()
        """Every (group, seq) published: what `result` and `cancel` are asked about."""
        self.settled_by_claims: list[tuple[str, int]] = []
        """The messages the last claim settled instead of handing out (expired, cancelled):
        the machine reads their outcomes."""

    def _next_created(self) -> int:
        self._created += 1
        return self._created

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
            self._record(lease, how)  # (written again: it counts RETIRE_WINDOW from now)
            return True
        return False

    def _record(self, lease: Lease, how: str) -> None:
        self.settled[(lease.token, lease.seq)] = (how, self.now + RETIRE_WINDOW)

    # -------------------------------------------------------------------------- tenants

    def claimable(self, group_id: str, g: Group) -> bool:
        """Counted in its tenant's claimable groups (the SQL's `ready = 1 AND held = 0`)."""
        return g.ready and group_id not in self.held

    def _set_ready(self, group_id: str, g: Group, ready: bool) -> None:
        was = self.claimable(group_id, g)
        g.ready = ready
        if not was and self.claimable(group_id, g):
            self._gains(g.tenant)

    def _gains(self, tenant: str) -> None:
        """A group of `tenant` just became claimable (the SQL's trigger): a tenant that had
        none starts at the queue's virtual time, if it was behind it (no banked credit)."""
        if not self.tenants_on:
            return
        row = self.tenants.get(tenant)
        if row is None:
            self.tenants[tenant] = Tenant(vt=self.vtime)
            return
        ready = sum(self.claimable(gid, g) for gid, g in self.groups.items() if g.tenant == tenant)
        if ready == 1 and row.vt < self.vtime:
            note_event("an idle tenant is lifted to the queue's virtual time")
            row.vt = self.vtime

    def _leased(self, tenant: str) -> int:
        """The tenant's leases in flight, as a claim counts them (after it freed lapsed
        ones): `ready = 0 AND parked = 0`."""
        return sum(
            1
            for g in self.groups.values()
            if g.tenant == tenant and not g.ready and g.state == "leased"
        )

    def bucket(self, t: Tenant) -> float:
        """The tokens of a rate-limited tenant's bucket now."""
        assert t.rate is not None and t.burst is not None
        return min(t.burst, t.tokens + max(0.0, self.now - t.stamp) * t.rate)

    def allowance(self, tenant: str, n: int) -> int:
        """How many groups a claim of `n` may give the tenant now."""
        t = self.tenants[tenant]
        allowed = n
        if t.cap is not None:
            allowed = min(allowed, t.cap - self._leased(tenant))
        if t.rate is not None:
            allowed = min(allowed, int(self.bucket(t) + 1e-9))
        return allowed

    def set_tenant(self, name: str, settings: dict[str, float]) -> None:
        """As `set_tenant(name, **settings)` stores them: those given, `math.inf` as none; a
        rate without a burst gets one second's worth (at least 1); a new rate or burst fills
        the bucket."""
        self.tenants_on = True
        t = self.tenants.get(name)
        if t is None:
            t = self.tenants[name] = Tenant(vt=self.vtime)

        def limit(value: float) -> Any:
            return None if value == math.inf else value

        if "weight" in settings:
            t.weight = float(settings["weight"])
        if "rate" in settings:
            t.rate = limit(float(settings["rate"]))
            if "burst" not in settings:
                t.burst = None if t.rate is None else max(1.0, t.rate)
        if "burst" in settings:
            t.burst = float(settings["burst"])
        if "rate" in settings or "burst" in settings:
            t.tokens, t.stamp = t.burst or 0.0, self.now
        if "max_in_flight" in settings:
            t.cap = limit(settings["max_in_flight"])
        if "max_queued" in settings:
            t.max_queued = limit(settings["max_queued"])
        if "max_group_queued" in settings:
            t.max_group_queued = limit(settings["max_group_queued"])

    def tenant_rows(self) -> list[tuple[Any, ...]]:
        """What `tenants()` lists (less the tokens): name, weight, claimable groups, groups,
        leases in flight, messages, rate, burst, cap, bounds; by name."""
        rows = []
        for name in sorted(self.tenants):
            t = self.tenants[name]
            mine = [(gid, g) for gid, g in self.groups.items() if g.tenant == name]
            rows.append(
                (
                    name,
                    t.weight,
                    sum(self.claimable(gid, g) for gid, g in mine),
                    len(mine),
                    sum(1 for _, g in mine if g.state == "leased" and self.busy(g)),
                    sum(len(g.messages) for _, g in mine),
                    t.rate,
                    t.burst,
                    t.cap,
                    t.max_queued,
                    t.max_group_queued,
                )
            )
        return rows

    # -------------------------------------------------------------------------- writing

    def item(
        self,
        group_id: str,
        event: Any,
        priority: int = 0,
        dedup_id: str | None = None,
        delay: float | None = None,
        ttl: float | None = None,
        tenant: str | None = None,
        debounce: str | None = None,
        max_wait: float | None = None,
        keep: float | None = None,
    ) -> Item:
        """A message to publish as the client checks it now."""
        due = self.now + delay if delay else 0.0
        due_by = None
        if debounce is not None and max_wait is not None:
            due_by = self.now + max_wait
            due = min(due, due_by)
        expires = self.now + ttl if ttl else None
        return Item(
            group_id,
            event,
            priority,
            dedup_id,
            due,
            expires,
            tenant,
            debounce,
            due_by,
            keep or None,
        )

    def publish(
        self,
        group_id: str,
        event: Any,
        priority: int,
        dedup_id: str | None,
        delay: float | None = None,
        ttl: float | None = None,
        keep: float | None = None,
    ) -> int:
        """One message, as follow-ups and schedules publish them (never refused)."""
        return self._put(self.item(group_id, event, priority, dedup_id, delay, ttl, keep=keep))

    def publish_many(self, given: Sequence[Any]) -> list[int] | type[QueueError]:
        """A `publish` or `publish_many` call: the seqs, or the error it raises (nothing
        written). The client refuses two tenants for a group and folds repeats (a dedup id:
        one message; a debounce key in a group: the first's place, the last's content);
        the SQL refuses another tenant for a group with messages, then applies the items in
        order, then refuses the call if a group or tenant of its groups holds more than its
        tenant's bound."""
        items = [self.item(**as_item(x)) for x in given]
        named: dict[str, str] = {}
        for it in items:
            if it.tenant is not None and named.setdefault(it.group_id, it.tenant) != it.tenant:
                return TenantMismatch
        unique: list[Item] = []
        where: list[int] = []
        first: dict[tuple[str, ...], int] = {}
        for it in items:
            key: tuple[str, ...] | None = None
            if it.dedup_id is not None:
                key = ("dedup", it.dedup_id)
            elif it.debounce is not None:
                key = ("debounce", it.group_id, it.debounce)
            if key is not None and key in first:
                at = first[key]
                if it.debounce is not None:
                    run = unique[at]
                    due = it.due if run.due_by is None else min(it.due, run.due_by)
                    unique[at] = replace(
                        run,
                        event=it.event,
                        due=due,
                        expires=it.expires,
                        tenant=it.tenant or run.tenant,
                        keep=it.keep,
                    )
                    note_event("publish_many folds a debounce key repeated in a group")
                where.append(at)
                continue
            if key is not None:
                first[key] = len(unique)
            where.append(len(unique))
            unique.append(it)
        for it in unique:
            g = self.groups.get(it.group_id)
            if it.tenant is not None and g is not None and g.tenant != it.tenant:
                return TenantMismatch
        bounded = any(
            t.max_queued is not None or t.max_group_queued is not None
            for t in self.tenants.values()
        )
        before = copy.deepcopy(self.__dict__) if bounded else None
        if any(it.tenant is not None for it in unique):
            self.tenants_on = True
        seqs = [self._put(it) for it in unique]
        if before is not None and self._over_bounds(unique):
            self.__dict__.clear()
            self.__dict__.update(before)
            return QueueFull
        return [seqs[at] for at in where]

    def _over_bounds(self, items: list[Item]) -> bool:
        """A group of the call, or a tenant of its groups (their rows' tenants, empty kept
        rows included), holds more messages than its tenant's bound."""
        rows: dict[str, str] = {}
        for gid in dict.fromkeys(it.group_id for it in items):
            if gid in self.groups:
                rows[gid] = self.groups[gid].tenant
            elif gid in self.retired and (self.retired[gid][2] >= self.now or gid in self.held):
                rows[gid] = self.retired[gid][3]
        for name in set(rows.values()):
            t = self.tenants.get(name)
            if t is None:
                continue
            mine = [gid for gid, tenant in rows.items() if tenant == name]
            depth = {
                gid: len(self.groups[gid].messages) if gid in self.groups else 0 for gid in mine
            }
            if t.max_group_queued is not None and max(depth.values()) > t.max_group_queued:
                note_event("a publish goes over a group's bound")
                return True
            queued = sum(len(g.messages) for g in self.groups.values() if g.tenant == name)
            if t.max_queued is not None and queued > t.max_queued:
                note_event("a publish goes over a tenant's bound")
                return True
        return False

    def _pending(self, g: Group, key: str) -> int | None:
        """Where the group's message with this debounce key that no claim took is."""
        for i, m in enumerate(g.messages):
            if m.debounce == key and not (i == 0 and g.attempts):
                return i
        return None

    def _put(self, item: Item) -> int:
        group_id = item.group_id
        if item.debounce is not None and group_id in self.groups:
            g = self.groups[group_id]
            at = self._pending(g, item.debounce)
            if at is not None:
                # Replaced in its place (seq, first publish time and run's bound kept).
                old = g.messages[at]
                due = item.due if old.due_by is None else min(item.due, old.due_by)
                g.messages[at] = replace(
                    old, event=item.event, due=due, expires=item.expires, keep=item.keep
                )
                note_event("a debounced publish replaces a pending message")
                if at == 0:
                    self._set_ready(group_id, g, due <= self.now)
                return old.seq
        if item.dedup_id is not None:
            self.dedup = {d: v for d, v in self.dedup.items() if v[1] >= self.now}
            if item.dedup_id in self.dedup:
                note_event("a dedup id repeats within the window")
                return self.dedup[item.dedup_id][0]
        self._seq += 1
        seq = self.last_seq = self._seq
        if group_id not in self.groups:
            turn, created, expires_at, _ = self.retired.get(group_id, (0, 0, 0.0, ""))
            ready = item.due <= self.now
            tenant = item.tenant or ""
            if expires_at >= self.now or group_id in self.held:
                # Emptied lately: it takes its place in the round robin back.
                g = Group(item.priority, created, turn=turn, tenant=tenant, ready=ready)
            else:
                g = Group(item.priority, self._next_created(), tenant=tenant, ready=ready)
            self.groups[group_id] = g
            if self.claimable(group_id, g):
                self._gains(tenant)
        message = Message(
            seq,
            item.event,
            self.now,
            item.due,
            item.expires,
            item.debounce,
            item.due_by,
            item.keep,
        )
        self.groups[group_id].messages.append(message)
        self.known.add((group_id, seq))
        if item.dedup_id is not None:
            self.dedup[item.dedup_id] = (seq, self.now + self.dedup_window)
        return seq

    def claim(self, n: int, min_priority: int, visibility: float) -> list[Predicted]:
        """As the transport claims: leases on messages whose ttl passed are dead-lettered
        (`expired`) instead of handed out, and as many claimed again, until none expired."""
        leased: list[Predicted] = []
        self.settled_by_claims = []
        while n:
            taken = self._claim_once(n, min_priority, visibility)
            cancelled = [p for p in taken if self.groups[p.group_id].messages[0].cancel]
            expired = [p for p in taken if p not in cancelled and self._expired(p)]
            for p in cancelled:  # settled as cancelled (an ack), never handed out
                note_event("a cancelled message whose lease lapsed is claimed again")
                self._finish_head(p.group_id, p.seq, "succeeded")
            for p in expired:
                note_event("a claimed message had expired")
                self._dead_letter_head(p.group_id, p.seq, status="expired", reason="expired")
                self.expired += 1
            leased += [p for p in taken if p not in cancelled and p not in expired]
            self.settled_by_claims += [(p.group_id, p.seq) for p in (*cancelled, *expired)]
            n = len(expired) + len(cancelled)
            if n:
                self.prune()
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
        self._turn += 1
        turn = self._turn
        # Lapsed leases, ended parks and delayed heads now due rejoin the claimable groups (in
        # the order of their deadlines, then creation: the order their tenants' rows are made).
        waiting = {
            gid: g.until if g.state != "free" else g.messages[0].due
            for gid, g in self.groups.items()
            if not g.ready
        }
        for gid in sorted(waiting, key=lambda gid: (waiting[gid], self.groups[gid].created)):
            if waiting[gid] <= self.now:
                self._set_ready(gid, self.groups[gid], True)
        if not self.tenants_on:
            chosen = self.eligible(min_priority)[:n]
        elif min_priority == 0:
            chosen = self._fair(n)
        else:
            chosen = self._floor(n, min_priority)
        out = []
        for gid, g in chosen:
            assert g.ready, "model: a claimable group is ready"
            g.turn = turn
            g.attempts += 1
            g.state, g.until = "leased", self.now + visibility
            g.ready = False
            g.token = None  # set to the real token once the claim has returned
            head = g.messages[0]
            out.append(Predicted(gid, head.seq, head.event, g.attempts, g.until, head.expires))
        if self.tenants_on and chosen:
            self._served(Counter(g.tenant for _, g in chosen))
        return out

    def _fair(self, n: int) -> list[tuple[str, Group]]:
        """Stride scheduling: the `n` tenants with claimable groups, allowance left and the
        least `vt` (ties: their rows' order); each one's k-th group (round robin) due at
        vt + (k - 1) / weight, at most its allowance; the `n` due first (ties: round robin)."""
        mine: dict[str, list[tuple[str, Group]]] = {}
        for gid, g in self.eligible(0):
            mine.setdefault(g.tenant, []).append((gid, g))
        assert set(mine) <= set(self.tenants), "model: a tenant with claimable groups has a row"
        allowed = {name: self.allowance(name, n) for name in self.tenants if name in mine}
        if any(a <= 0 for a in allowed.values()):
            note_event("a tenant with claimable groups has no allowance left")
        candidates = [name for name in allowed if allowed[name] > 0]
        candidates.sort(key=lambda name: self.tenants[name].vt)
        due = []
        for name in candidates[:n]:
            t = self.tenants[name]
            for k, (gid, g) in enumerate(mine[name][: allowed[name]]):
                due.append((t.vt + k / t.weight, g.turn, g.created, gid))
        due.sort()
        if len(candidates) > 1:
            note_event("a fair claim chooses between tenants")
        return [(gid, self.groups[gid]) for *_, gid in due[:n]]

    def _floor(self, n: int, min_priority: int) -> list[tuple[str, Group]]:
        """Round robin over the groups at or above the floor: each level's first `n` of
        tenants with allowance left (the SQL walks each level's index), each tenant's groups
        past its allowance left out. (A tenant with some allowance left can still fill more of
        a level's `n` than it may take: docs/fairness.md.)"""
        eligible = self.eligible(min_priority)
        allowed = {
            name: self.allowance(name, n) if name in self.tenants else n
            for name in {g.tenant for _, g in eligible}
        }
        rows = []
        for level in range(4, min_priority - 1, -1):
            at_level = [(gid, g) for gid, g in eligible if g.priority == level]
            if any(allowed[g.tenant] <= 0 for _, g in at_level[:n]):
                note_event("a floor claim passes over a tenant with no allowance left")
            rows += [(gid, g) for gid, g in at_level if allowed[g.tenant] > 0][:n]
        rows.sort(key=lambda item: (item[1].turn, item[1].created))
        rank: Counter[str] = Counter()
        chosen = []
        for gid, g in rows:
            rank[g.tenant] += 1
            if rank[g.tenant] <= allowed[g.tenant]:
                chosen.append((gid, g))
            else:
                note_event("a floor claim leaves out a tenant's groups past its allowance")
        return chosen[:n]

    def _served(self, taken: Counter[str]) -> None:
        """Each tenant's `vt` moves on by what it was given, its bucket loses a token a group;
        the queue's virtual time moves to the latest due time served."""
        served = []
        for name, count in taken.items():
            t = self.tenants.get(name)
            if t is None:
                continue
            if t.rate is not None:
                t.tokens = self.bucket(t) - count
            t.stamp = max(t.stamp, self.now)
            t.vt = t.vt + count / t.weight
            served.append(t)
        if served:
            self.vtime = max(self.vtime, max(t.vt - 1 / t.weight for t in served))

    def _dead_letter_head(
        self,
        group_id: str,
        seq: int,
        hold: bool = False,
        status: str = "failed",
        reason: str = "poison",
    ) -> None:
        """Dead-lettered, unless it was cancelled while leased: then cancelled, no dead
        letter (its group held all the same, with `hold`)."""
        g = self.groups[group_id]
        head = g.messages[0]
        if head.cancel is None:
            self.dead.append((seq, group_id, head.event, g.priority, g.attempts))
        if hold:
            self.held.add(group_id)
        self._finish_head(group_id, seq, status, reason=reason)

    def _finish(self, lease: Lease, result: Any = None) -> None:
        self._finish_head(lease.group_id, lease.seq, "succeeded", result)

    def _keep_outcome(
        self,
        group_id: str,
        message: Message,
        status: str,
        result: Any = None,
        reason: str | None = None,
        attempts: int = 0,
    ) -> None:
        """A message that keeps its outcome settles: kept (cancelled while leased: cancelled,
        with the cancel's reason, whatever its settlement)."""
        if message.keep is None:
            return
        if message.cancel is not None:
            status, reason = "cancelled", message.cancel
        elif status != "succeeded":
            result = None
        outcome = Outcome(
            status, result, reason, attempts, message.progress, self.now + message.keep
        )
        self.outcomes[message.seq] = (group_id, outcome)
        note_event(f"an outcome is kept: {status}")

    def pruned_by(self, leases: Sequence[Lease]) -> None:
        """A round that named these leases' settlements for good (acks, dead letters) prunes,
        whether they held or not."""
        if leases:
            self.prune()

    def prune(self) -> None:
        """What a round that settles a lease for good prunes (the machine's transport prunes
        on every such round): the outcomes past their time."""
        for seq in [s for s, (_, o) in self.outcomes.items() if o.kept_until < self.now]:
            note_event("an outcome past its time is pruned")
            del self.outcomes[seq]

    def _finish_head(
        self,
        group_id: str,
        seq: int,
        status: str = "succeeded",
        result: Any = None,
        reason: str | None = None,
    ) -> None:
        """The held head goes (its outcome kept, if it keeps one); the group is free again
        (waiting for its next head if that is delayed), or forgotten if now empty."""
        g = self.groups[group_id]
        head = g.messages.popleft()
        assert head.seq == seq, "model: a holding lease is always on its group's head"
        self._keep_outcome(group_id, head, status, result, reason, g.attempts)
        g.attempts, g.token, g.state, g.until = 0, None, "free", 0.0
        if not g.messages:
            self.retired[group_id] = (g.turn, g.created, self.now + RETIRE_WINDOW, g.tenant)
            del self.groups[group_id]
            return
        self._set_ready(group_id, g, g.messages[0].due <= self.now)

    def ack(self, lease: Lease, result: Any = None) -> bool:
        if not self.holds(lease):
            return self.settled_before(lease, "ack")
        self._finish(lease, result)
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
            expires_at = self.retired.get(group_id, (0, 0, 0.0, ""))[2]
            if expires_at < self.now:
                # A group with no kept place gets one now: never claimed, last created, in
                # the default tenant.
                self.retired[group_id] = (0, self._next_created(), float("-inf"), "")
        self.held.add(group_id)

    def cancel(self, group_id: str) -> int:
        """Every message of the group goes to the dead letters (the head with its attempts;
        those that keep their outcome: cancelled, with the reason of a cancel of the running
        head, which came first); the group empties (its place kept for RETIRE_WINDOW), so its
        lease no longer holds."""
        g = self.groups.pop(group_id, None)
        if g is None:
            return 0
        for i, message in enumerate(g.messages):
            attempts = g.attempts if i == 0 else 0
            self.dead.append((message.seq, group_id, message.event, g.priority, attempts))
            if message.keep is not None:
                kept_until = self.now + message.keep
                reason = message.cancel or "cancelled"
                outcome = Outcome("cancelled", None, reason, attempts, message.progress, kept_until)
                self.outcomes[message.seq] = (group_id, outcome)
        self.retired[group_id] = (g.turn, g.created, self.now + RETIRE_WINDOW, g.tenant)
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
                rows.append((gid, group_states.HELD.name, 0))
                continue
            # The group's state as the table of states says `groups()` shows it: its hold
            # first, then its lease, park or delayed head while in force.
            head = g.messages[0]
            if self.busy(g):
                flow, until = FLOWS[g.state], g.until
            elif head.due > self.now:
                flow, until = group_states.DELAYED, head.due
            else:
                flow, until = group_states.READY, None
            hold = group_states.HELD if gid in self.held else group_states.FREE
            state = group_states.shown(flow, hold, until or 0.0, self.now)
            holder = "w" if flow is group_states.LEASED else None
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
        g = self.groups.get(group_id)
        if held and g is not None and g.ready:
            self._gains(g.tenant)
        return held

    def nack(self, lease: Lease, delay: float) -> bool:
        if not self.holds(lease):
            return self.settled_before(lease, "nack")
        g = self.groups[lease.group_id]
        if g.messages[0].cancel is not None:  # cancelled while leased: not retried
            note_event("a nack of a cancelled message cancels it")
            self._finish_head(lease.group_id, lease.seq, "cancelled")
            self._record(lease, "nack")
            return True
        g.token = None
        g.state, g.until = ("parked", self.now + delay) if delay > 0 else ("free", 0.0)
        self._set_ready(lease.group_id, g, delay <= 0)
        self._record(lease, "nack")
        return True

    def extend(self, lease: Lease, visibility: float, progress: Any = None) -> bool:
        if not self.holds(lease):
            return False
        g = self.groups[lease.group_id]
        g.state, g.until = "leased", self.now + visibility
        g.ready = False
        if progress is not None:
            g.messages[0] = replace(g.messages[0], progress=progress)
        return True

    # -------------------------------------------------------------------------- jobs

    def cancel_one(self, group_id: str, seq: int, reason: str) -> str | None:
        """`cancel(group_id, seq)`: leased (its group's head, with a token): flagged,
        "cancelling"; queued: its outcome kept (cancelled), removed (its group, if it was the
        head, goes on with its next message), "cancelled"; neither: "cancelled" if a cancel
        removed it within RETIRE_WINDOW (its record), else None."""
        g = self.groups.get(group_id)
        at = next((i for i, m in enumerate(g.messages) if m.seq == seq), None) if g else None
        if g is None or at is None:
            if self.cancelled.get(seq, -math.inf) >= self.now:
                return "cancelled"
            return None
        message = g.messages[at]
        if at == 0 and g.token is not None:
            note_event("a running message is cancelled")
            g.messages[0] = replace(message, cancel=reason)
            return "cancelling"
        note_event("a queued message is cancelled" + (" (the head)" if at == 0 else ""))
        self.cancelled[seq] = self.now + RETIRE_WINDOW
        if at == 0:  # its group goes on with its next message
            self._finish_head(group_id, seq, "cancelled", reason=reason)
            return "cancelled"
        self._keep_outcome(group_id, message, "cancelled", reason=reason)
        del g.messages[at]
        return "cancelled"

    def result(self, group_id: str, seq: int) -> tuple[Any, ...] | None:
        """What `result()` reads: (status, result, reason, attempts, progress, kept_until,
        cancelling)."""
        kept = self.outcomes.get(seq)
        if kept is not None and kept[0] == group_id and kept[1].kept_until > self.now:
            o = kept[1]
            return (o.status, o.result, o.reason, o.attempts, o.progress, o.kept_until, None)
        g = self.groups.get(group_id)
        for at, m in enumerate(g.messages if g is not None else ()):
            if m.seq == seq:
                assert g is not None
                running = at == 0 and g.token is not None
                attempts = g.attempts if at == 0 else 0
                status = "running" if running else "queued"
                return (status, None, None, attempts, m.progress, None, m.cancel)
        return None

    def lease_news(self, lease: Lease) -> tuple[str, str | None] | None:
        """What `check_leases` says of a lease: ("lost", None), ("cancelled", reason), or
        None (it holds, not cancelled)."""
        if not self.holds(lease):
            return ("lost", None)
        cancel = self.groups[lease.group_id].messages[0].cancel
        return None if cancel is None else ("cancelled", cancel)


# -------------------------------------------------------------------------- state machine


class QueueMachine(RuleBasedStateMachine):
    """Drives one transport and the model side by side. Subclasses say which transport."""

    leases = Bundle("leases")
    tenants = True
    """Tenants, limits, bounds and debounce in the calls (the sharded machine leaves them
    out: its model is one model per shard). Then two examples out of three name tenants and
    set them up (`naming`, drawn with the backlog); the others leave tenants off throughout."""
    everything = True
    """Every call (FairShareMachine leaves out those that do not make tenants compete, and
    names tenants in every example)."""

    def open(self, clock: FakeClock) -> Transport:
        raise NotImplementedError

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.q = self.open(self.clock)
        # Prune on every round that could (not a sixteenth of them): the model knows when.
        self.q._core.chance = lambda: 0.0
        self.model = Model(self.clock.now, DEDUP_WINDOW)
        self.events = itertools.count()
        self.naming = self.tenants

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

    def expect_published(self, call: Callable[[], list[int]], items: list[Any]) -> None:
        """Run a publish: it returns the seqs the model says, or raises its error."""
        want = self.model.publish_many(items)
        if isinstance(want, list):
            assert call() == want
            return
        note_event(f"a publish raises {want.__name__}")
        with pytest.raises(want):
            call()

    @rule(
        group_id=groups,
        priority=priorities,
        dedup_id=dedup_ids,
        delay=delays_,
        ttl=ttls,
        options=publish_options,
        keep=keeps,
    )
    def publish(
        self,
        group_id: str,
        priority: int,
        dedup_id: str | None,
        delay: float | None,
        ttl: float | None,
        options: tuple[str | None, str | None, float | None],
        keep: float | None,
    ) -> None:
        tenant, debounce, max_wait = options
        item = {
            "group_id": group_id,
            "event": next(self.events),
            "priority": priority,
            "dedup_id": dedup_id,
            "delay": delay,
            "ttl": ttl,
            "keep": keep,
        }
        if self.naming:
            item["tenant"] = self.tenant_of(group_id) if tenant == HOME else tenant
        if self.tenants and dedup_id is None and debounce is not None:
            item.update(debounce=debounce, max_wait=max_wait)
        if delay:
            note_event("a delayed publish")
        self.expect_published(lambda: [self.q.publish(**item)], [item])

    publish_again = publish
    """(Twice the weight: tenants, bounds and debounce come with publishes.)"""

    def tenant_of(self, group_id: str) -> str | None:
        """The tenant a publish names for the group (HOME)."""
        return HOMES[group_id] if group_id not in self.model.groups else None

    @initialize(
        items=st.lists(st.tuples(groups, priorities, dedup_ids, debounce_keys), max_size=12),
        naming=st.sampled_from([True, True, False]),
        setup=st.lists(st.tuples(tenant_names, tenant_settings), max_size=3),
        keep=keeps,
    )
    def a_backlog(
        self,
        items: list[tuple[str, int, str | None, str | None]],
        naming: bool,
        setup: list[tuple[str, dict[str, float]]],
        keep: float | None = None,
    ) -> None:
        """A backlog (keeping its outcomes for `keep` seconds); with `naming`, in the groups'
        own tenants, then tenants set up."""
        self.naming = self.tenants and (naming or not self.everything)
        if items:
            self.publish_many(
                [(g, p, d, (True, k)) for g, p, d, k in items], HOME, keep, every=True
            )
        if self.naming:
            for name, settings in setup:
                self.set_tenant(name, settings)

    @rule(
        items=st.lists(
            st.tuples(groups, priorities, dedup_ids, item_options),
            min_size=1,
            max_size=6,
        ),
        tenant=batch_tenants,
        keep=keeps,
    )
    def publish_many(
        self,
        items: list[tuple[str, int, str | None, tuple[bool, str | None]]],
        tenant: str,
        keep: float | None = None,
        every: bool = False,
    ) -> None:
        """Items (group, priority, dedup id, (whether it names a tenant, debounce key)): named
        ones name their group's own tenant (HOME) or all the same one; the first (`every`: each
        of them) keeps its outcome for `keep` seconds (if given)."""
        batch: list[Any] = []
        for group_id, priority, dedup_id, (named, debounce) in items:
            event = next(self.events)
            item: dict[str, Any] = {"group_id": group_id, "event": event, "priority": priority}
            if keep is not None and (every or not batch):
                item["keep"] = keep
            if dedup_id is not None:
                item["dedup_id"] = dedup_id
            name = self.tenant_of(group_id) if tenant == HOME else tenant
            if self.naming and named and name is not None:
                item["tenant"] = name
            if self.tenants and debounce is not None and dedup_id is None:
                item["debounce"] = debounce
            if len(item) > 3:
                batch.append(item)
            elif priority == 0:
                batch.append((group_id, event))
            else:
                batch.append((group_id, event, priority))
        self.expect_published(lambda: self.q.publish_many(batch), batch)

    @precondition(lambda self: self.naming)
    @rule(name=tenant_names, settings=tenant_settings)
    def set_tenant(self, name: str, settings: dict[str, float]) -> None:
        self.q.set_tenant(name, **settings)
        self.model.set_tenant(name, settings)

    set_tenant_again = set_tenant

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
        for group_id, seq in self.model.settled_by_claims:  # (expired, or cancelled: kept?)
            self.check_job(group_id, seq)
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

    claim_many_again = claim_many
    """(Twice the weight: the claims are where fair share and the limits show.)"""

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

    @rule(lease=leases, follow=follow_ups, result=results)
    def ack(
        self,
        lease: Lease,
        follow: list[tuple[str, int, str | None, float | None]],
        result: Any,
    ) -> None:
        items = self._follow_ups(follow)
        holds = self.model.holds(lease)
        applies = holds or self.model.settled_before(lease, "ack")
        self.expect(applies, lambda: self.q.ack(lease, publish=items, result=result))
        if holds:
            self.publish_follow_ups(lease, items, before=True)
        self.model.ack(lease, result)
        self.model.pruned_by([lease])
        if holds:
            self.publish_follow_ups(lease, items, before=False)
        self.check_job(lease.group_id, lease.seq)

    @rule(leases=st.lists(leases, min_size=1, max_size=3))
    def ack_many(self, leases: list[Lease]) -> None:
        lost = self._settle_in_one_round([(lease, "ack", 0.0) for lease in leases])
        self.model.pruned_by(leases)
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
        self.check_job(lease.group_id, lease.seq)

    @rule(lease=leases, visibility=visibilities, progress=progresses)
    def extend(self, lease: Lease, visibility: float, progress: Any) -> None:
        extended = self.expect(
            self.model.holds(lease), lambda: self.q.extend(lease, visibility, progress=progress)
        )
        if self.model.extend(lease, visibility, progress):
            assert extended.expires_at == self.clock.now + visibility
            assert (extended.seq, extended.token) == (lease.seq, lease.token)
        self.check_job(lease.group_id, lease.seq)

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
        self.model.pruned_by([lease])
        if holds:
            self.publish_follow_ups(lease, items, before=False)
        self.check_job(lease.group_id, lease.seq)
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
        self.model.pruned_by(acks)
        predicted = self.predict_claim(n, min_priority, visibility)
        if holds:
            self.publish_follow_ups(acks[0], items, before=False)
        if not n:
            assert result.leases == [] == predicted
            return multiple()
        return self._claimed(result.leases, predicted)

    @precondition(lambda self: self.everything)
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

    @precondition(lambda self: self.everything)
    @rule(name=st.sampled_from(["s1", "s2"]))
    def unschedule(self, name: str) -> None:
        assert self.q.unschedule(name) == self.model.unschedule(name)

    @precondition(lambda self: self.everything)
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

    @precondition(lambda self: self.everything)
    @rule(group_id=groups, priority=priorities)
    def set_priority(self, group_id: str, priority: int) -> None:
        assert self.q.set_priority(group_id, priority) == self.model.set_priority(
            group_id, priority
        )

    @precondition(lambda self: self.everything)
    @rule(paused=st.booleans())
    def pause_or_resume(self, paused: bool) -> None:
        if paused:
            self.q.pause()
        else:
            self.q.resume()
        self.model.paused = paused

    # ------------------------------------------------------------------------------ jobs

    @precondition(lambda self: bool(self.model.known))
    @rule(data=st.data())
    def result(self, data: st.DataObject) -> None:
        group_id, seq = data.draw(st.sampled_from(sorted(self.model.known)))
        self.check_job(group_id, seq)

    def check_job(self, group_id: str, seq: int) -> None:
        """`result()` of one message is what the model says (after each call on a lease, on
        the lease's message)."""
        found = self.q.result(group_id, seq)
        want = self.model.result(group_id, seq)
        got = (
            None
            if found is None
            else (
                found.status,
                found.result,
                found.reason,
                found.attempts,
                found.progress,
                found.kept_until,
                found.cancelling,
            )
        )
        assert got == want
        if found is not None:
            note_event(f"result() reads a job {found.status}")

    @precondition(lambda self: bool(self.model.known))
    @rule(data=st.data(), reason=reasons)
    def cancel(self, data: st.DataObject, reason: str) -> None:
        group_id, seq = data.draw(st.sampled_from(sorted(self.model.known)))
        assert self.q.cancel(group_id, seq, reason) == self.model.cancel_one(group_id, seq, reason)
        self.check_job(group_id, seq)

    @rule(lease=leases, reason=reasons)
    def cancel_a_lease(self, lease: Lease, reason: str) -> None:
        """A cancel of a message that was leased (still, or no longer): drawn from the leases,
        so that cancels of running messages are common, and their settlements follow."""
        got = self.q.cancel(lease.group_id, lease.seq, reason)
        assert got == self.model.cancel_one(lease.group_id, lease.seq, reason)
        note_event(f"a leased message's cancel: {got}")
        self.check_job(lease.group_id, lease.seq)

    @rule(leases=st.lists(leases, max_size=3))
    def check_leases(self, leases: list[Lease]) -> None:
        check = self.q.check_leases(leases)
        want = [self.model.lease_news(lease) for lease in leases]
        assert check.cancelled == [
            (lease, news[1])
            for lease, news in zip(leases, want, strict=True)
            if news and news[0] == "cancelled"
        ]
        assert [lease for lease, _ in check.lost] == [
            lease for lease, news in zip(leases, want, strict=True) if news and news[0] == "lost"
        ]

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

    @precondition(lambda self: self.everything and bool(self.model.groups))
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
            stats.outcomes,
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
            len(m.outcomes),
        )
        assert stats.by_priority == by_priority
        if self.tenants:
            assert stats.tenants_on == m.tenants_on
        oldest = min((m.published_at for g in live for m in g.messages), default=None)
        if oldest is None:
            assert stats.oldest_age is None
        else:
            assert stats.oldest_age == pytest.approx(m.now - oldest)

    @precondition(lambda self: self.tenants and self.model.tenants_on)
    @rule()
    def tenants_listed(self) -> None:
        """`tenants()` (a rule, not an invariant: a read per step costs too much time)."""
        listed = self.q.tenants(limit=100)
        got = [
            (
                t.name,
                t.weight,
                t.ready,
                t.groups,
                t.in_flight,
                t.depth,
                t.rate,
                t.burst,
                t.max_in_flight,
                t.max_queued,
                t.max_group_queued,
            )
            for t in listed
        ]
        assert got == self.model.tenant_rows()
        for t in listed:
            row = self.model.tenants[t.name]
            if row.rate is None:
                assert t.tokens is None
            else:
                assert t.tokens == pytest.approx(self.model.bucket(row))


def as_item(item: Any) -> dict[str, Any]:
    """A `publish_many` item as the keyword arguments of `Model.item`."""
    if isinstance(item, dict):
        return dict(item)
    if len(item) == 2:
        return {"group_id": item[0], "event": item[1]}
    return {"group_id": item[0], "event": item[1], "priority": item[2]}


def machine(open_transport: Callable[[FakeClock], Transport]) -> type[QueueMachine]:
    class Machine(QueueMachine):
        def open(self, clock: FakeClock) -> Transport:
            return open_transport(clock)

    return Machine


class FairShareMachine(QueueMachine):
    """The calls that make tenants compete for claims (publishes, claims, settlements,
    holds, cancels, time, `set_tenant`), tenants named in every example, and a worker's turns:
    longer stretches of fair claims (idle tenants lifted, weights spacing a tenant's groups,
    allowances) than the whole machine makes."""

    everything = False

    @rule(target=QueueMachine.leases, n=st.integers(1, 3), acks=st.integers(0, 3))
    def work(self, n: int, acks: int) -> MultipleResults[Lease]:
        """Claim up to `n` (no floor), then ack the first `acks` of them at once."""
        leases = self.q.claim_many("w", 30.0, n)
        self._claimed(leases, self.predict_claim(n, 0, 30.0))
        for lease in leases[:acks]:
            self.q.ack(lease)
            assert self.model.ack(lease)
        return multiple(*leases[acks:])

    work_again = work


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


@pytest.mark.slow
def test_fair_share_holds_on_sqlite_long(tmp_path: Path) -> None:
    open_transport = on_sqlite(tmp_path)

    class Machine(FairShareMachine):
        def open(self, clock: FakeClock) -> Transport:
            return open_transport(clock)

    run(Machine, examples=300, steps=50)


def test_the_contract_holds_on_rqlite(rqlite_cluster: Cluster) -> None:
    url = rqlite_cluster.url

    def open_transport(clock: FakeClock) -> Transport:
        # A fresh queue (tables created on the first call) per example.
        queue = f"sm_{uuid.uuid4().hex[:12]}"
        transport = RqliteTransport(
            url, clock=clock, queue=queue, dedup_window=DEDUP_WINDOW, max_skew=None
        )
        return dropped_when_closed(transport, url)

    run(machine(open_transport), examples=20, steps=25)
