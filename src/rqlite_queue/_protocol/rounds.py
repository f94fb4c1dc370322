"""A worker's round trip: settle the leases it is done with (ack, nack, park, extend, dead
letter) and claim new ones, in one transaction: one Raft entry however many leases; and the
probe, the read that tells an idle worker whether a claim would find anything.

Every settlement names its lease as (seq, group, token), and acts only if that lease still
holds its group (the fencing check), so a stale lease, or a hand-made one naming another
message, changes nothing. A settlement sent again after its reply was lost finds its own
record (`settled`) and reports its outcome exactly. The claim takes the heads of the
claimable groups claimed least recently (round robin; by weight between tenants once they
are on) and returns them with `RETURNING` where rqlite's own parser takes the statement, else
with a `SELECT` in the same transaction (which also serves a resend: it finds what the token
took)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import OutcomeUnknown, QueueError, Unavailable
from ..group_states import LEASED, PARKED, READY
from ..types import MAX_PRIORITY, Headers, Lease, Probe, Round
from .batches import ACKED as BATCH_ACKED
from .batches import BACK as BATCH_BACK
from .batches import FAILED as BATCH_FAILED
from .batches import PRUNE as PRUNE_BATCHES
from .batches import Settled, count_settled
from .checks import check_int
from .core import QueueCore
from .messages import NewMessage
from .names import Fields, Names, Sql, as_json
from .outcomes import error_text
from .plan import Batch, Builder, Known, Plan, Reply, Steps
from .publish import PRUNE_CHANCE, insert_messages
from .round_spec import EXTEND, FINISH, GIVE_BACK, CheckedRound, Held, RoundSpec, Settlement
from .round_spec import check as check_round
from .schema import ACKED, DEAD_LETTERED, EXPIRED, GIVEN_BACK, RETIRE_WINDOW, errors_after
from .tenants import ALLOWANCE, BUCKET, ROOM, TenantsTurnedOn, float_or_none, turn_on

TENANTS_ON_ERROR = "NOT NULL constraint failed: {claims}.expires_at"
"""How a claim that assumed tenants off fails once they are on (its claim token's tripwire)."""


# The JSON items of a round's statements: a lease's fields first, then what the statement
# needs of it.
HELD = Fields("j", Held._fields)
SETTLEMENT = Fields("j", (*Held._fields, "kind"))
KEPT_SETTLEMENT = Fields("j", (*Held._fields, "kind", "result", "error"))
"""A settlement with what its message's outcome takes from it (an ack's result, an error)."""
NOTE = Fields("j", (*Held._fields, "text"))
"""A lease's error (a give-back's) or progress (an extension's), as JSON text."""
FINISHED = Fields("j", (*Held._fields, "hold"))
DEAD = Fields("j", (*Held._fields, "reason"))
CHANGE = Fields("j", (*Held._fields, "until", "parked", "keep"))
FOLLOW_UP = Fields("j", (*NewMessage._fields, *(f"lease_{f}" for f in Held._fields)))
"""A follow-up: its message's fields, then its lease's."""


@dataclass(frozen=True, slots=True)
class Settle:
    """What to do with leases, all in one transaction.

    `finish`: acked or dead-lettered (the message goes; `dead` ones are copied to the dead
    letters first, with their reason); `hold` (per finished lease): the group is held after.
    `give_back`: nacked (`until` 0: claimable now; > 0: parked until then). `extend`: the lease
    now lapses at `extend_until`."""

    finish: Sequence[Held] = ()
    dead: Mapping[int, str] = field(default_factory=dict)
    """seq -> reason, for the finished leases that are dead-lettered."""
    hold: frozenset[int] = frozenset()
    """seqs of finished leases whose group is held afterwards."""
    give_back: Sequence[tuple[Held, float]] = ()
    extend: Sequence[Held] = ()
    extend_until: float = 0.0
    expired: int = 0
    """How many of the dead letters are messages that expired (counted in `meta`)."""
    follow_ups: Sequence[tuple[Held, NewMessage]] = ()
    """Messages published with a finished lease's settlement, only if it applies."""
    outboxed: Sequence[tuple[Held, NewMessage]] = ()
    """The same, for groups on other shards: written to the outbox, forwarded later."""
    dedup_until: float = 0.0
    kept: Mapping[int, tuple[str | None, str | None]] = field(default_factory=dict)
    """seq -> (result, error) of a finished lease whose message keeps its outcome (encoded,
    JSON; None: none): its settlement's record carries them to the outcome."""
    expired_seqs: frozenset[int] = frozenset()
    """seqs of the finished leases on messages whose ttl passed (recorded as EXPIRED)."""
    errors: Sequence[tuple[Held, str]] = ()
    """The errors (JSON) of given-back leases whose messages keep their outcome."""
    progress: Sequence[tuple[Held, str]] = ()
    """The progress (JSON) of extended leases."""
    batches: Sequence[Settled] = ()
    """The finished and given-back leases of messages of batches: counted there (batches.py;
    one given back only if its message was cancelled)."""
    sharded: bool = False
    """A shard's part of a round (the counts of batches elsewhere go to its outbox)."""

    @property
    def count(self) -> int:
        return len(self.finish) + len(self.give_back) + len(self.extend)

    def all(self) -> list[Held]:
        return [*self.finish, *(h for h, _ in self.give_back), *self.extend]

    def kinds(self) -> list[int]:
        """The `settled.kind` of each of `all()` (0: an extension, never recorded)."""
        finished = [
            ACKED
            if h.seq not in self.dead
            else EXPIRED
            if h.seq in self.expired_seqs
            else DEAD_LETTERED
            for h in self.finish
        ]
        return [*finished, *[GIVEN_BACK] * len(self.give_back), *[0] * len(self.extend)]


@dataclass(frozen=True, slots=True)
class Claim:
    token: str
    until: float
    count: int
    min_priority: int = 0
    fair: bool = False
    """Share between tenants by weight (the queue's tenants are on); else plain round-robin."""


# -------------------------------------------------------------------------- follow-ups

_LEASE_HOLDS = Sql(
    """
    EXISTS (SELECT 1 FROM {groups} g WHERE g.group_id = {j.lease_group_id}
      AND g.token = {j.lease_token} AND g.head = {j.lease_seq})
    """,
    j=FOLLOW_UP,
)
# A follow-up that joins its lease's batch joins the batch of the lease's message (its row's:
# the lease's word is not taken for it), counted with the lease's settlement.
_JOINS = Sql(
    """
    CASE WHEN {j.batch} IS NOT NULL THEN (
      SELECT batch FROM {messages} WHERE seq = {j.lease_seq}) END
    """,
    j=FOLLOW_UP,
)
_OUTBOXED = Sql(
    """
    INSERT INTO {outbox} (group_id, event, priority, dedup_id, due, expires, tenant, created_at,
      headers, keep, batch)
    SELECT {j.group_id}, {j.event}, {j.priority}, {j.dedup_id}, {j.due}, {j.expires},
      {j.tenant}, :now, {j.headers}, {j.keep}, {joins}
    FROM json_each(:o) j WHERE {holds} ORDER BY j.key
    """,
    j=FOLLOW_UP,
    holds=_LEASE_HOLDS,
    joins=_JOINS,
)
_OUTBOXED_PLAIN = Sql(
    """
    INSERT INTO {outbox} (group_id, event, priority, dedup_id, due, expires, tenant, created_at,
      headers, keep)
    SELECT {j.group_id}, {j.event}, {j.priority}, {j.dedup_id}, {j.due}, {j.expires},
      {j.tenant}, :now, {j.headers}, {j.keep}
    FROM json_each(:o) j WHERE {holds} ORDER BY j.key
    """,
    j=FOLLOW_UP,
    holds=_LEASE_HOLDS,
)


def _follow_ups(b: Builder, n: Names, s: Settle, now: float) -> None:
    """The follow-ups of settlements, each published (or written to the outbox) only if its
    lease holds: placed before the settlements change the leases. A resend after the first
    send applied finds the lease gone and publishes nothing again."""
    if s.outboxed:
        items = as_json([[*m, *h] for h, m in s.outboxed])
        joining = any(m.batch is not None for _, m in s.outboxed)
        outboxed = _OUTBOXED if joining else _OUTBOXED_PLAIN  # (no batch column to fill)
        b.add(outboxed(n), {"o": items, "now": now}, slot="outboxed")
    count_settled(b, n, s.batches, now, sharded=s.sharded)
    if not s.follow_ups:
        return
    messages = [m for _, m in s.follow_ups]
    if any(m.tenant is not None for m in messages):
        turn_on(b, n)
    items = as_json([[*m, *h] for h, m in s.follow_ups])
    insert_messages(
        b,
        n,
        messages,
        items,
        now=now,
        dedup_until=s.dedup_until,
        condition=_LEASE_HOLDS,
        batch=_JOINS,
    )


# ------------------------------------------------------------------------- settlements

# The lease named by a settlement's item `j` holds its group `g`.
_HOLDS = Sql("g.group_id = {j.group_id} AND g.token = {j.token} AND g.head = {j.seq}", j=HELD)
# An earlier send of the same settlement applied (its record).
_EARLIER = Sql(
    """
    EXISTS (SELECT 1 FROM {settled} s WHERE s.token = {j.token} AND s.seq = {j.seq}
      AND s.kind = {j.kind} AND s.expires_at >= :now)
    """,
    j=SETTLEMENT,
)
# Which settlements do not hold (before any of them changes anything), and were not applied by
# an earlier send of the same settlement.
_LOST = Sql(
    """
    SELECT j.key FROM json_each(:all) j
    WHERE NOT EXISTS (SELECT 1 FROM {groups} g WHERE {holds}) AND NOT {earlier}
    """,
    holds=_HOLDS,
    earlier=_EARLIER,
)
# The record of each settlement that holds (or of one an earlier send applied); with what the
# outcomes of messages that keep theirs take from it (the variant for a round with such).
_RECORDED_TEXT = """
    INSERT INTO {settled} (token, seq, kind, expires_at{columns})
    SELECT {j.token}, {j.seq}, {j.kind}, :e{values} FROM json_each(:rec) j
    WHERE EXISTS (SELECT 1 FROM {groups} g WHERE {holds}) OR {earlier}
    ON CONFLICT (token, seq) DO UPDATE SET expires_at = excluded.expires_at
    """
_RECORDED = Sql(_RECORDED_TEXT, j=SETTLEMENT, holds=_HOLDS, earlier=_EARLIER, columns="", values="")
_RECORDED_KEPT = Sql(
    _RECORDED_TEXT,
    j=KEPT_SETTLEMENT,
    holds=_HOLDS,
    earlier=_EARLIER,
    columns=", result, error",
    values=Sql(", {j.result}, {j.error}", j=KEPT_SETTLEMENT),
)
# (A message cancelled while leased is not dead-lettered: it is cancelled.)
_DEAD = Sql(
    """
    INSERT INTO {dead} (seq, group_id, event, priority, attempts, reason, published_at,
      dead_at, headers, keep)
    SELECT m.seq, m.group_id, m.event, g.priority, g.attempts, {j.reason}, m.published_at,
      :now, m.headers, m.keep
    FROM json_each(:dead) j JOIN {groups} g ON {holds} JOIN {messages} m ON m.seq = g.head
    WHERE m.cancel IS NULL
    """,
    j=DEAD,
    holds=_HOLDS,
)
_DONE = Sql(
    """
    DELETE FROM {messages} WHERE seq IN (
      SELECT g.head FROM json_each(:done) j JOIN {groups} g ON {holds})
    """,
    holds=_HOLDS,
)
# A finished lease's group: free again; or waiting for its next message, due later (`d`); or
# empty (its row kept for RETIRE_WINDOW, see schema.py).
FREED = Sql(
    """
    ready = CASE WHEN d IS NULL THEN {EMPTY.ready} WHEN d > :now THEN {DELAYED.ready}
      ELSE {READY.ready} END,
    until = CASE WHEN d IS NULL THEN :retire WHEN d > :now THEN d ELSE 0 END,
    parked = CASE WHEN d > :now THEN {DELAYED.parked} ELSE {READY.parked} END,
    attempts = 0, token = NULL, head = NULL
    """
)


# The finished leases' groups freed (`d`: the due of its new head), held after where the
# settlement says so (`h`).
_FINISHED = Sql(
    """
    UPDATE {groups} AS g SET {freed}, held = max(held, h) FROM (
      SELECT {j.group_id} i, {j.token} t, {j.seq} q, {j.hold} h, (
        SELECT due FROM {messages} m WHERE m.group_id = {j.group_id} ORDER BY seq LIMIT 1) d
      FROM json_each(:done) j)
    WHERE g.group_id = i AND g.token = t AND g.head = q
    """,
    j=FINISHED,
    freed=FREED,
)


_EXPIRED = Sql("""UPDATE {meta} SET value = value + :k WHERE "key" = 'expired'""")
# Before leases are given back: the errors of their attempts join their messages' (those that
# keep their outcome); a message cancelled while leased is not given back but settled as
# cancelled (gone: its outcome written by `messages_kept`; its group free for its next).
_ERRORS = Sql(
    """
    UPDATE {messages} SET errors = {errors} FROM json_each(:errs) j
    WHERE seq = {j.seq} AND keep IS NOT NULL AND EXISTS (SELECT 1 FROM {groups} g WHERE {holds})
    """,
    j=NOTE,
    errors=errors_after("errors", Sql("{j.text}", j=NOTE)),
    holds=_HOLDS,
)
_CANCELLED_BACK = Sql(
    """
    DELETE FROM {messages} WHERE seq IN (
      SELECT g.head FROM json_each(:back) j JOIN {groups} g ON {holds}
      JOIN {messages} m ON m.seq = g.head WHERE m.cancel IS NOT NULL)
    """,
    holds=_HOLDS,
)
_CANCELLED_FREED = Sql(
    """
    UPDATE {groups} AS g SET {freed} FROM (
      SELECT {j.group_id} i, {j.token} t, {j.seq} q, (
        SELECT due FROM {messages} m WHERE m.group_id = {j.group_id} ORDER BY seq LIMIT 1) d
      FROM json_each(:back) j)
    WHERE g.group_id = i AND g.token = t AND g.head = q
      AND NOT EXISTS (SELECT 1 FROM {messages} WHERE seq = q)
    """,
    j=HELD,
    freed=FREED,
)
# The progress of extended leases, on their messages (before the extension: its check of the
# lease is the same).
_PROGRESS = Sql(
    """
    UPDATE {messages} SET progress = {j.text} FROM json_each(:prog) j
    WHERE seq = {j.seq} AND EXISTS (SELECT 1 FROM {groups} g WHERE {holds})
    """,
    j=NOTE,
    holds=_HOLDS,
)


def _giving_back(b: Builder, n: Names, s: Settle, now: float) -> None:
    """The statements before the give-backs change their groups (`_ERRORS`, then the cancelled
    messages settled as such), and the extensions' progress."""
    if s.errors:
        b.add(_ERRORS(n), {"errs": as_json([[*h, e] for h, e in s.errors])})
    if s.give_back:
        back = as_json([h for h, _ in s.give_back])
        b.add(_CANCELLED_BACK(n), {"back": back})
        b.add(_CANCELLED_FREED(n), {"back": back, "retire": now + RETIRE_WINDOW, "now": now})
    if s.progress:
        b.add(_PROGRESS(n), {"prog": as_json([[*h, text] for h, text in s.progress])})


# Nack now, park, or extend: `until` (0: claimable now), `parked`, `keep` the token.
_CHANGED = Sql(
    """
    UPDATE {groups} AS g SET ready = iif({j.until} <= 0, {READY.ready}, {LEASED.ready}),
      until = {j.until}, parked = {j.parked}, token = CASE WHEN {j.keep} THEN token END
    FROM json_each(:changes) j WHERE {holds}
    """,
    j=CHANGE,
    holds=_HOLDS,
)


def _settle(b: Builder, n: Names, s: Settle, now: float) -> None:
    _follow_ups(b, n, s, now)
    if s.count == 1:
        _settle_one(b, n, s, now)
        return
    pairs = list(zip(s.all(), s.kinds(), strict=True))
    every = [[*h, kind] for h, kind in pairs]
    recorded: list[list[object]] = [item for item in every if item[-1]]
    if s.count > 1:
        b.add(_LOST(n), {"all": as_json(every), "now": now}, slot="lost")
    if recorded:
        record = _RECORDED
        if s.kept:  # what the outcomes of kept messages take from their settlements' records
            record = _RECORDED_KEPT
            recorded = [[*h, kind, *s.kept.get(h.seq, _NONE_KEPT)] for h, kind in pairs if kind]
        params = {"rec": as_json(recorded), "e": now + RETIRE_WINDOW, "now": now}
        b.add(record(n), params, slot="recorded")
    if s.finish:
        done = as_json([[*h, int(h.seq in s.hold)] for h in s.finish])
        if s.dead:
            dead = as_json([[*h, s.dead[h.seq]] for h in s.finish if h.seq in s.dead])
            b.add(_DEAD(n), {"dead": dead, "now": now})
        b.add(_DONE(n), {"done": done})
        params = {"done": done, "retire": now + RETIRE_WINDOW, "now": now}
        b.add(_FINISHED(n), params, slot="finished")
    if s.expired:
        b.add(_EXPIRED(n), {"k": s.expired})
    _giving_back(b, n, s, now)
    if s.give_back or s.extend:
        changes = [[*h, until, _parked(until), 0] for h, until in s.give_back]
        changes += [[*h, s.extend_until, LEASED.parked, 1] for h in s.extend]
        b.add(_CHANGED(n), {"changes": as_json(changes)}, slot="changed")


_NONE_KEPT = (None, None)


def _parked(until: float) -> int:
    """`groups.parked` of a lease given back until `until` (0: claimable now)."""
    return PARKED.parked if until > 0 else READY.parked


# One settlement (the single calls', and a Worker round's with one): the statements of
# `_settle` with the lease as plain parameters (:g, :t, :q) instead of a JSON array walked by
# `json_each`. The same effects; SQLite compiles them in about half the time, and rqlite
# compiles every statement on every node for every request.
_HOLDS_ONE = Sql("EXISTS (SELECT 1 FROM {groups} WHERE group_id = :g AND token = :t AND head = :q)")
# The record of the settlement if it holds (or if an earlier send applied it: it counts, so
# that the settlement reads its outcome from this statement).
_RECORDED_ONE_TEXT = """
    INSERT INTO {settled} (token, seq, kind, expires_at{columns}) SELECT :t, :q, :kind, :e{values}
    WHERE {holds} OR EXISTS (
      SELECT 1 FROM {settled} WHERE token = :t AND seq = :q AND kind = :kind
      AND expires_at >= :now)
    ON CONFLICT (token, seq) DO UPDATE SET expires_at = excluded.expires_at
    """
_RECORDED_ONE = Sql(_RECORDED_ONE_TEXT, holds=_HOLDS_ONE, columns="", values="")
_RECORDED_ONE_KEPT = Sql(
    _RECORDED_ONE_TEXT, holds=_HOLDS_ONE, columns=", result, error", values=", :res, :err"
)
_DEAD_ONE = Sql(
    """
    INSERT INTO {dead} (seq, group_id, event, priority, attempts, reason, published_at,
      dead_at, headers, keep)
    SELECT m.seq, m.group_id, m.event, g.priority, g.attempts, :reason, m.published_at, :now,
      m.headers, m.keep
    FROM {groups} g JOIN {messages} m ON m.seq = g.head
    WHERE g.group_id = :g AND g.token = :t AND g.head = :q AND m.cancel IS NULL
    """
)
_DONE_ONE = Sql("DELETE FROM {messages} WHERE seq = :q AND {holds}", holds=_HOLDS_ONE)


_FINISHED_ONE = Sql(
    """
    UPDATE {groups} SET {freed}, held = max(held, :h) FROM (
      SELECT (SELECT due FROM {messages} WHERE group_id = :g ORDER BY seq LIMIT 1) d)
    WHERE group_id = :g AND token = :t AND head = :q
    """,
    freed=FREED,
)


_CHANGED_ONE = Sql(
    """
    UPDATE {groups} SET ready = iif(:u <= 0, {READY.ready}, {LEASED.ready}), until = :u,
      parked = :p, token = CASE WHEN :keep THEN token END
    WHERE group_id = :g AND token = :t AND head = :q
    """
)


def _settle_one(b: Builder, n: Names, s: Settle, now: float) -> None:
    (held,) = s.all()
    (kind,) = s.kinds()
    lease = {"g": held.group_id, "t": held.token, "q": held.seq}
    if kind:
        params = {**lease, "kind": kind, "e": now + RETIRE_WINDOW, "now": now}
        kept = s.kept.get(held.seq)
        if kept is None:
            b.add(_RECORDED_ONE(n), params, slot="recorded")
        else:
            params["res"], params["err"] = kept
            b.add(_RECORDED_ONE_KEPT(n), params, slot="recorded")
    if s.finish:
        if s.dead:
            b.add(_DEAD_ONE(n), {**lease, "reason": s.dead[held.seq], "now": now})
        b.add(_DONE_ONE(n), lease)
        params = {**lease, "h": int(held.seq in s.hold), "retire": now + RETIRE_WINDOW, "now": now}
        b.add(_FINISHED_ONE(n), params, slot="finished")
    if s.expired:
        b.add(_EXPIRED(n), {"k": s.expired})
    _giving_back(b, n, s, now)
    if s.give_back or s.extend:
        if s.give_back:
            until, parked, keep = s.give_back[0][1], _parked(s.give_back[0][1]), 0
        else:
            until, parked, keep = s.extend_until, LEASED.parked, 1
        b.add(_CHANGED_ONE(n), {**lease, "u": until, "p": parked, "keep": keep}, slot="changed")


# ----------------------------------------------------------------------------- the claim

# Lapsed leases and ended parks rejoin the ready index (token kept: a lapsed lease that nobody
# takes over may still be acked).
_LAPSED = Sql("UPDATE {groups} SET {to_ready} WHERE {busy} AND until <= :now")
_TURN = Sql("""UPDATE {meta} SET value = value + 1 WHERE "key" = 'turn'""")

# Every claimable group, in round-robin order: one probe of the all-ready index.
_PICK_ROUND_ROBIN = Sql(
    "SELECT rowid FROM {groups} WHERE {claimable} ORDER BY turn, rowid LIMIT :n"
)
# Weighted fair share between tenants (stride scheduling): a tenant's k-th group in
# round-robin order (its own index) is due at virtual time vt + (k - 1) / weight; the claim
# takes the `n` groups due first (ties: round-robin order). Only the `n` tenants with work,
# something left of their limits and the least `vt` can hold them, and each at most its
# allowance. (`_rowid_`, not `g.rowid`: rqlite's parser refuses a qualified `rowid`, and then
# drops RETURNING.)
_PICK_FAIR = Sql(
    """
    SELECT i FROM (
      SELECT g._rowid_ i, g.turn u, t.vt s, t.weight w, t.a,
        row_number() OVER (PARTITION BY t.name ORDER BY g.turn, g._rowid_) k
      FROM (
        SELECT x.name, x.vt, x.weight, {allowance} a FROM {tenants} x
        WHERE x.ready > 0 AND a > 0 ORDER BY x.vt LIMIT :n) t
      JOIN {groups} g ON g._rowid_ IN (
        SELECT rowid FROM {groups} WHERE tenant = t.name AND {claimable}
        ORDER BY turn, rowid LIMIT :n))
    WHERE k <= a ORDER BY s + (k - 1) / w, u, i LIMIT :n
    """,
    allowance=ALLOWANCE,
)


# A level's groups of tenants with allowance left (the fair claim from a floor).
_ALLOWED = Sql(
    "AND coalesce((SELECT {allowance} FROM {tenants} x WHERE x.name = e), 1) > 0",
    allowance=ALLOWANCE,
)


@functools.cache
def _pick_from_floor(min_priority: int, fair: bool) -> tuple[Sql, Sql]:
    """(the claim's leading `WITH`, its pick) with a priority floor: one probe of the
    per-priority index for each level >= the floor, each already in round-robin order; the
    union of those few rows is then ordered. (`r` is inlined in each, never materialised: it
    only keeps the text short.) The floor wins over fair share, not over the tenants' limits:
    a level's groups of tenants with no allowance left are passed over (so they never crowd
    the others out of a level's `n`), and each tenant's groups past its allowance are left
    out."""
    tenant = ", e" if fair else ""
    lead = Sql(
        """
        WITH r(i, t, p{e}) AS NOT MATERIALIZED (
          SELECT rowid, turn, priority{tenant} FROM {groups} WHERE {claimable})
        """,
        e=tenant,
        tenant=", tenant" if fair else "",
    )
    levels = range(MAX_PRIORITY, min_priority - 1, -1)
    level = {
        f"level{p}": Sql(
            "SELECT * FROM (SELECT i, t{e} FROM r WHERE p = {p} {allowed} ORDER BY t, i LIMIT :n)",
            e=tenant,
            p=str(p),
            allowed=_ALLOWED if fair else "",
        )
        for p in levels
    }
    union = Sql(" UNION ALL ".join(f"{{level{p}}}" for p in levels), **level)
    if fair:
        union = Sql(
            """
            SELECT i, t FROM (
              SELECT i, t, row_number() OVER (PARTITION BY e ORDER BY t, i) k,
                (SELECT {allowance} FROM {tenants} x WHERE x.name = e) a
              FROM ({union}))
            WHERE k <= coalesce(a, :n)
            """,
            allowance=ALLOWANCE,
            union=union,
        )
    return lead, Sql("SELECT i FROM ({union}) ORDER BY t, i LIMIT :n", union=union)


# No alias for the table, and `"key"` quoted: rqlite keeps a statement's RETURNING rows only
# when its own SQL parser accepts the statement, and that parser refuses both `UPDATE t AS g`
# and a bare `key` column (a keyword to it). The columns: `Leased`'s, in its order.
_HEADS = Sql(
    """
    head, group_id, (SELECT event FROM {messages} WHERE seq = head), attempts, until,
    (SELECT expires FROM {messages} WHERE seq = head), rowid,
    (SELECT headers FROM {messages} WHERE seq = head),
    (SELECT batch FROM {messages} WHERE seq = head),
    (SELECT value FROM {meta} WHERE "key" = 'tenants'),
    (SELECT keep FROM {messages} WHERE seq = head),
    (SELECT cancel FROM {messages} WHERE seq = head)
    """
)


class Leased(NamedTuple):
    """A row of the claim's `RETURNING` or `SELECT` (`_HEADS`, in this order)."""

    seq: int
    group_id: str
    event: str
    attempts: int
    expires_at: float
    message_expires: float | None
    """When the message itself expires (its ttl), or None."""
    rowid: int
    """The group's: its creation order."""
    headers: str | None
    """Its headers, as stored (None: none)."""
    batch: str | None
    """The batch it belongs to (None: none)."""
    tenants_on: int
    keep: float | None
    """How long its outcome is kept (None: not kept)."""
    cancel: str | None
    """A cancel's reason: it was cancelled while a lease that lapsed held it."""


TENANTS_COLUMN = Leased._fields.index("tenants_on")


@functools.cache
def _claim(kind: str, min_priority: int, returning: bool) -> Sql:
    """Lease the heads of the picked groups (`kind`: round robin, fair, or from the floor)."""
    lead, pick = (
        (Sql(""), _PICK_ROUND_ROBIN)
        if kind == "round robin"
        else (Sql(""), _PICK_FAIR)
        if kind == "fair"
        else _pick_from_floor(min_priority, kind == "fair floor")
    )
    # Paused (the row of token ''): nothing. A client that has not learnt that tenants are on
    # (the row of token '*') takes nothing either: it would pass by their shares and limits
    # (and its batch fails, below).
    stops = "" if kind in ("fair", "fair floor") else ", '*'"
    return Sql(
        """
        {lead} UPDATE {groups} SET ready = {LEASED.ready}, until = :u, token = :k,
          attempts = attempts + 1,
          head = (SELECT min(seq) FROM {messages} m WHERE m.group_id = {groups}.group_id),
          turn = (SELECT value FROM {meta} WHERE "key" = 'turn')
        WHERE rowid IN ({pick})
          AND NOT EXISTS (SELECT 1 FROM {claims} WHERE token IN (:k, ''{stops})) {returning}
        """,
        lead=lead,
        pick=pick,
        stops=stops,
        returning=Sql("RETURNING {heads}", heads=_HEADS) if returning else "",
    )


# The groups a token just took (found through the busy index on `until`).
_TAKEN = Sql("SELECT tenant FROM {groups} WHERE {busy} AND until = :u AND token = :k")
# Each tenant's clock moves on by what it was given (1 / weight a group), its bucket loses a
# token a group, and the queue's clock moves to the latest due time served; a resend (its
# token known) moves nothing.
_FIRST_SEND = Sql("NOT EXISTS (SELECT 1 FROM {claims} WHERE token IN (:k, ''))")
_TENANTS_SERVED = Sql(
    """
    UPDATE {tenants} AS x SET vt = vt + c / weight,
      tokens = CASE WHEN rate IS NULL THEN tokens ELSE {bucket} - c END,
      stamp = max(stamp, :now)
    FROM (SELECT tenant, count(*) c FROM ({taken}) GROUP BY tenant)
    WHERE name = tenant AND {first_send}
    """,
    bucket=BUCKET,
    taken=_TAKEN,
    first_send=_FIRST_SEND,
)
_VTIME_SERVED = Sql(
    """
    UPDATE {meta} SET value = max(value, (
      SELECT max(vt - 1 / weight) FROM {tenants} WHERE name IN ({taken})))
    WHERE "key" = 'vtime' AND {first_send} AND EXISTS ({taken})
    """,
    taken=_TAKEN,
    first_send=_FIRST_SEND,
)
# A token claims once; it is remembered until RETIRE_WINDOW after its leases' deadline.
_TOKEN_FAIR = Sql("INSERT OR IGNORE INTO {claims} (token, expires_at, at) VALUES (:k, :e, :now)")
# Tenants on (the row of token '*'): the batch fails (TENANTS_ON_ERROR), so that the client
# learns it and claims again, sharing by weight within the limits.
_TOKEN = Sql(
    """
    INSERT INTO {claims} (token, expires_at, at)
    VALUES (:k, iif(EXISTS (SELECT 1 FROM {claims} WHERE token = '*'), NULL, :e), :now)
    ON CONFLICT DO NOTHING
    """
)
_LEASED = Sql(
    "SELECT {heads} FROM {groups} WHERE {busy} AND until = :u AND token = :k", heads=_HEADS
)


def _claim_statements(b: Builder, n: Names, c: Claim, now: float, returning: bool) -> None:
    """Lease the heads of up to `count` groups: the claimable ones with priority >=
    `min_priority` that were claimed least recently (never-claimed first, then creation
    order). A token claims once: a resend (same token and `until`) takes nothing and returns
    the groups the token holds; so does a first send that applies late, after its resend.
    Tokens are remembered until RETIRE_WINDOW after their leases' deadline."""
    mine = {"u": c.until, "k": c.token}
    kind = (
        ("fair" if c.fair else "round robin")
        if c.min_priority == 0
        else ("fair floor" if c.fair else "floor")
    )
    b.add(_LAPSED(n), {"now": now})
    b.add(_TURN(n))
    params = {**mine, "n": c.count, **({"now": now} if c.fair else {})}
    claim = _claim(kind, c.min_priority, returning)(n)
    b.add(claim, params, slot="leased" if returning else None)
    token = {"k": c.token, "e": c.until + RETIRE_WINDOW, "now": now}
    if c.fair:
        b.add(_TENANTS_SERVED(n), {**mine, "now": now})
        b.add(_VTIME_SERVED(n), mine)
        b.add(_TOKEN_FAIR(n), token)
    else:
        b.add(_TOKEN(n), token)
    if not returning:
        b.add(_LEASED(n), mine, slot="leased")


# Forget the rows of groups that emptied more than RETIRE_WINDOW ago, the claim tokens and the
# settlement records past theirs (on a fraction of the rounds that settle).
_PRUNE = (
    Sql("DELETE FROM {groups} WHERE {empty} AND until < :now AND {free}"),
    Sql("DELETE FROM {claims} WHERE expires_at < :now"),
    Sql("DELETE FROM {settled} WHERE expires_at < :now"),
    Sql("DELETE FROM {outcomes} WHERE expires_at < :now"),
    *PRUNE_BATCHES,
)


def round_trip(
    n: Names,
    *,
    now: float,
    settle: Settle = Settle(),
    claim: Claim | None = None,
    prune: bool = False,
    returning: bool = False,
) -> Batch:
    """Settle, then claim (either may be empty). With `prune`, also forget the rows of groups
    that emptied more than RETIRE_WINDOW ago (the caller prunes on a fraction of its calls).
    With `returning`, where the batch can (a claim without a priority floor, at most one
    settlement), the claim's `UPDATE` returns its leases itself and the batch has no `SELECT`:
    it is the cheaper batch for rqlite (see `Batch.returning`). Otherwise a `SELECT` reads the
    leases; that form also serves a resend, which finds the groups its token took."""
    returning = returning and claim is not None and claim.min_priority == 0 and settle.count <= 1
    b = Builder(returning=returning)
    _settle(b, n, settle, now)
    if prune:
        for statement in _PRUNE:
            b.add(statement(n), {"now": now})
    if claim is not None:
        _claim_statements(b, n, claim, now, returning)
    return b.build()


# --------------------------------------------------------------------------- reading


def read_lost(reply: Reply, settle: Settle) -> list[Held]:
    """The settlements whose lease no longer held and that no earlier send of theirs applied
    (they changed nothing)."""
    every = settle.all()
    if "lost" in reply:
        return [every[int(row[0])] for row in reply["lost"].rows]
    if not every:
        return []
    # One settlement: an extension applied if it changed its group; any other if its record
    # was written (it held) or found (an earlier send applied it).
    slot = "recorded" if "recorded" in reply else "changed"
    return [] if reply[slot].rows_affected == 1 else every


def returned_nothing(reply: Reply) -> bool:
    """The claim's `UPDATE ... RETURNING` changed rows but returned none: rqlite only keeps
    RETURNING rows of statements its own SQL parser accepts."""
    if not reply.batch.returning or "leased" not in reply:
        return False
    leased = reply["leased"]
    return leased.rows_affected > 0 and not leased.rows


def read_leased(reply: Reply) -> list[Leased]:
    """The claim's leases, in their groups' creation order."""
    if "leased" not in reply:
        return []
    rows = [Leased._make(row) for row in reply["leased"].rows]
    return sorted(rows, key=lambda row: int(row.rowid))


def read_tenants_on(reply: Reply) -> bool | None:
    """Whether the queue's tenants are on, as a claim's rows or a probe said (None: no row
    said it)."""
    if "probe" in reply:
        rows = reply["probe"].rows
        return bool(rows[0][-1]) if rows else None
    rows = reply["leased"].rows if "leased" in reply else []
    return bool(rows[0][TENANTS_COLUMN]) if rows else None


# ---------------------------------------------------------------------------- the probe

# Is anything claimable, when does the earliest lease, park or delayed head end or a
# rate-limited tenant with work get its next token, and when is the next schedule due? A
# leader-local read (no Raft round): a claim that would find nothing costs no Raft write (a
# stale answer only delays a claim to the next poll). min() over the column an index is
# ordered by: one probe of the all-ready index, or of the per-priority one from the floor up.
# Once tenants are on, a claim without a floor finds something if a tenant with claimable
# groups has something left of its limits. A token still to come counts (one already there is
# a claimable tenant's, or one that cannot claim for another reason: a pause, a cap; as a time
# past, it would wake an idle worker over and over). Its last column: whether tenants are on.
_FIRST_READY = Sql("(SELECT min(turn) FROM {groups} WHERE {claimable})")
_FIRST_FROM_FLOOR = Sql("(SELECT min(priority) FROM {groups} WHERE {claimable} AND priority >= :p)")
_PAUSED = Sql("EXISTS (SELECT 1 FROM {claims} WHERE token = '')")
_TENANTS_FLAG = Sql("""(SELECT value FROM {meta} WHERE "key" = 'tenants')""")
_PROBE = """
    SELECT {claimable_now} AND NOT {paused}, (
      SELECT min(w) FROM (
        SELECT min(until) w FROM {groups} WHERE {busy} {tokens})),
      (SELECT min(next_at) FROM {schedules}), {tenants_on}
    """
_NEXT_TOKEN = Sql(
    """
    UNION ALL SELECT min(x.stamp + (1 - x.tokens) / x.rate) FROM {tenants} x
      INDEXED BY {tenants_rated}
      WHERE x.rate IS NOT NULL AND x.ready > 0 AND x.stamp + (1 - x.tokens) / x.rate > :now
      AND {room} > 0
    """,
    room=ROOM,
)
_CLAIMABLE_FAIR = Sql(
    """
    CASE WHEN {tenants_on} THEN EXISTS (
      SELECT 1 FROM {tenants} x WHERE x.ready > 0 AND {allowance} > 0)
    ELSE {first} IS NOT NULL END
    """,
    tenants_on=_TENANTS_FLAG,
    allowance=ALLOWANCE,
    first=_FIRST_READY,
)


@functools.cache
def _probe(floor: bool, tenants: bool) -> Sql:
    """The probe without a priority floor or with one; for a client that knows tenants are
    off (`tenants=False`: neither their allowances nor their next tokens: if they were turned
    on meanwhile, its next claim fails on their tripwire, and both tell it)."""
    claimable = (
        Sql("{first} IS NOT NULL", first=_FIRST_FROM_FLOOR)
        if floor
        else _CLAIMABLE_FAIR
        if tenants
        else Sql("{first} IS NOT NULL", first=_FIRST_READY)
    )
    return Sql(
        _PROBE,
        claimable_now=claimable,
        paused=_PAUSED,
        tokens=_NEXT_TOKEN if tenants else "",
        tenants_on=_TENANTS_FLAG,
    )


def probe_batch(n: Names, *, min_priority: int, now: float, tenants: bool = True) -> Batch:
    b = Builder(write=False, local=True)
    params: dict[str, Any] = {"now": now} if tenants else {}
    if tenants:
        params["n"] = 1
    if min_priority:
        params["p"] = min_priority
    b.add(_probe(bool(min_priority), tenants)(n), params, slot="probe")
    return b.build()


def read_probe(reply: Reply) -> Probe:
    ready, due, tick, _ = reply["probe"].rows[0]
    return Probe(bool(ready), float_or_none(due), float_or_none(tick))


# ------------------------------------------------------------------------------- plans


def plan(
    core: QueueCore,
    checked: CheckedRound,
    fair: bool = False,
    learn: Callable[[bool], None] | None = None,
    *,
    sharded: bool = False,
) -> Plan[Round]:
    """Settle leases and claim up to `n` new ones, in one transaction (`round_trip`).

    Resending after an unknown outcome is safe, and its outcome exact: the claim returns what
    the first send took (same token); a settlement that an earlier send applied finds its
    record (`Settle`, table `settled`) and is not reported lost; one whose lease went to
    another holder is; an extension never releases its lease, so one found gone was taken
    over. `fair`: the claim shares between tenants by weight (their cluster has them on);
    `learn` is told whether it has, when the claim's rows say."""
    now = core.now()
    settling = [s for s in checked.settlements if not s.repeat]
    extends = [s for s in settling if s.kind == EXTEND]
    until = now + checked.visibility
    token = f"{checked.worker_id}:{core.token()}" if checked.n else ""
    claim = Claim(token, until, checked.n, checked.min_priority, fair) if checked.n else None
    by_held = {id(s.held): s for s in settling}
    finish = [s for s in settling if s.kind == FINISH]
    settle = Settle(
        finish=[s.held for s in finish],
        dead={s.held.seq: s.reason for s in finish if s.reason is not None},
        hold=frozenset(s.held.seq for s in finish if s.reason is not None and checked.hold_dead),
        give_back=[
            (s.held, now + s.delay if s.delay > 0 else 0.0) for s in settling if s.kind == GIVE_BACK
        ],
        extend=[s.held for s in extends],
        extend_until=until,
        expired=sum(s.expired for s in settling),
        follow_ups=[(s.held, m) for s in finish for m in s.follow_ups],
        outboxed=[(s.held, m) for s in finish for m in s.outboxed],
        dedup_until=now + core.dedup_window,
        kept={
            s.held.seq: (s.result, None if s.error is None else error_text(s.error))
            for s in finish
            if s.lease.keep is not None
        },
        expired_seqs=frozenset(s.held.seq for s in finish if s.expired),
        errors=[
            (s.held, error_text(s.error))
            for s in settling
            if s.kind == GIVE_BACK and s.error is not None and s.lease.keep is not None
        ],
        progress=[(s.held, s.progress) for s in extends if s.progress is not None],
        batches=[
            Settled(
                *s.held,
                BATCH_BACK
                if s.kind == GIVE_BACK
                else BATCH_ACKED
                if s.reason is None
                else BATCH_FAILED,
                s.reason,
                sum(m.batch is not None for m in (*s.follow_ups, *s.outboxed)),
            )
            for s in settling
            if s.lease.batch is not None and s.kind != EXTEND
        ],
        sharded=sharded,
    )
    prune = bool(settle.finish) and core.chance() < PRUNE_CHANCE
    names = core.names
    batch = round_trip(names, now=now, settle=settle, claim=claim, prune=prune, returning=True)
    repeats = [s for s in checked.settlements if s.repeat]

    def read(reply: Reply) -> Round:
        if returned_nothing(reply):
            # rqlite ran the claim but kept none of its RETURNING rows (its SQL parser did
            # not take the statement): the resend form reads what the token took.
            raise OutcomeUnknown("rqlite dropped the rows of a claim's RETURNING")
        if learn is not None:
            on = read_tenants_on(reply)
            if on is not None:
                learn(on)
        lost_settlements = [by_held[id(h)] for h in read_lost(reply, settle)]
        lost = [s.lease for s in sorted([*lost_settlements, *repeats], key=_by_index)]
        lost_ids = {id(s) for s in lost_settlements}
        leases: list[Lease] = []
        expired: list[Lease] = []
        cancelled: list[Lease] = []
        read_at = core.clock()
        for r in read_leased(reply):
            lease = Lease(
                int(r.seq),
                str(r.group_id),
                core.decode(str(r.event)),
                token,
                int(r.attempts),
                float(r.expires_at),
                headers=Headers.stored(r.headers),
                keep=float_or_none(r.keep),
                batch=None if r.batch is None else str(r.batch),
            )
            if r.cancel is not None:
                cancelled.append(lease)
            elif r.message_expires is not None and float(r.message_expires) <= read_at:
                expired.append(lease)
            else:
                leases.append(lease)
        return Round(
            leases=leases,
            expired=expired,
            cancelled=cancelled,
            lost=lost,
            extended=[
                dataclasses.replace(s.lease, expires_at=until)
                for s in extends
                if id(s) not in lost_ids
            ],
        )

    def resend() -> Batch:
        # The SELECT form: it finds the groups the token took (the same batch where the first
        # send could not return its rows).
        if not batch.returning:
            return batch
        return round_trip(names, now=now, settle=settle, claim=claim, prune=prune)

    def instead(error: QueueError) -> Plan[Round] | None:
        # Another client turned tenants on since this one last looked: nothing was written;
        # the same round again, sharing by weight within the tenants' limits.
        if isinstance(error, TenantsTurnedOn) and not fair:
            return plan(core, checked, True, learn, sharded=sharded)
        return None

    return Plan(
        batch,
        read,
        resend_safe=True,
        resend=resend,
        lease_for=checked.visibility if checked.n or extends else None,
        tenants_on=any(m.tenant is not None for _, m in settle.follow_ups),
        instead=instead,
    )


def _by_index(settlement: Settlement) -> int:
    return settlement.index


def probe(
    core: QueueCore,
    min_priority: int,
    learn: Callable[[bool], None] | None = None,
    *,
    tenants: bool = True,
) -> Plan[Probe]:
    """`probe_batch` (`tenants`: the client does not know them off)."""
    check_int(min_priority, "min_priority", 0, MAX_PRIORITY)
    batch = probe_batch(core.names, min_priority=min_priority, now=core.now(), tenants=tenants)

    def read(reply: Reply) -> Probe:
        if learn is not None:
            on = read_tenants_on(reply)
            if on is not None:
                learn(on)
        return read_probe(reply)

    return Plan(batch, read)


def steps(
    core: QueueCore,
    checked: CheckedRound,
    known: Known,
    *,
    probe_when_idle: bool,
    guard: Callable[[Plan[Round]], Plan[Round]] | None = None,
    settled: Callable[[Sequence[Lease]], None] | None = None,
) -> Steps[Round]:
    """A round on one cluster, as the plans its backend runs one after the other.

    `probe_when_idle`: a claim without settlements after one that found nothing first asks
    with a read (no Raft write) whether anything is claimable. `guard`: what the round's plan
    must pass (a sharded queue's epoch check). Leases taken on messages whose ttl had passed
    are never handed out: they are dead-lettered (reason `expired`), and as many leases
    claimed again in the same call (if that fails, they lapse, and the next claim expires
    them); so are leases taken on messages cancelled while a lease that lapsed held them,
    settled as cancelled (an ack of such a message cancels it). `settled` is told of the
    leases whose messages this round settled (and so of the outcomes it wrote), once it
    applied."""
    floor = checked.min_priority
    claims_alone = probe_when_idle and not checked.settlements
    if claims_alone and known.idle.get(floor):
        found: Probe = yield probe(core, floor, known.learn, tenants=known.tenants_on)
        due = found.next_due is not None and found.next_due <= core.clock()
        if not (found.claimable or due):
            return Round()
    first = plan(core, checked, known.tenants_on, known.learn, sharded=known.sharded)
    result: Round = yield first if guard is None else guard(first)
    leases, expired, cancelled = list(result.leases), result.expired, result.cancelled
    done = [s.lease for s in checked.settlements if s.kind != EXTEND]
    dead: list[Lease] = []
    gone: list[Lease] = []
    while expired or cancelled:
        spec = RoundSpec(
            worker_id=checked.worker_id,
            visibility=checked.visibility,
            n=len(expired) + len(cancelled),
            min_priority=floor,
            expired=expired,
            ack=cancelled,
        )
        try:
            more: Round = yield plan(
                core, check_round(core, spec), known.tenants_on, known.learn, sharded=known.sharded
            )
        except (Unavailable, OutcomeUnknown):
            break
        done += [*expired, *cancelled]
        dead += expired
        gone += cancelled
        leases += more.leases
        expired, cancelled = more.expired, more.cancelled
    if settled is not None and done:
        settled(done)
    if claims_alone:
        known.idle[floor] = not leases
    return Round(
        leases=leases, lost=result.lost, extended=result.extended, expired=dead, cancelled=gone
    )
