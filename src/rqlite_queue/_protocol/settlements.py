"""A round's settlements: what to do with the leases a worker is done with (ack, nack, park,
extend, dead letter), as the statements of its transaction, with the follow-ups published
only if their leases hold and the counts of their batches (`batch_counts`). Each statement
walks a JSON array of the leases (`json_each`); a round with one settlement takes
`one_settlement`'s statements instead (`rounds.round_trip` chooses).

Every settlement names its lease as (seq, group, token), and acts only if that lease still
holds its group (the fencing check), so a stale lease, or a hand-made one naming another
message, changes nothing. A settlement sent again after its reply was lost finds its own
record (`settled`) and reports its outcome exactly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..group_states import LEASED, PARKED, READY
from .batch_counts import Settled, count_settled
from .messages import NewMessage
from .names import Fields, Names, Sql, as_json
from .plan import Builder
from .publish import insert_messages
from .round_spec import Held
from .schema import ACKED, DEAD_LETTERED, EXPIRED, GIVEN_BACK, RETIRE_WINDOW, errors_after
from .tenants import turn_on

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
    """The finished and given-back leases of messages of batches: counted there (batch_counts.py;
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


def follow_ups(b: Builder, n: Names, s: Settle, now: float) -> None:
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


COUNT_EXPIRED = Sql("""UPDATE {meta} SET value = value + :k WHERE "key" = 'expired'""")
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


def giving_back(b: Builder, n: Names, s: Settle, now: float) -> None:
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


def settle_many(b: Builder, n: Names, s: Settle, now: float) -> None:
    """The settlements of `s` (none, or more than one: `one_settlement.settle_one` takes one),
    after their follow-ups (`follow_ups`)."""
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
        b.add(COUNT_EXPIRED(n), {"k": s.expired})
    giving_back(b, n, s, now)
    if s.give_back or s.extend:
        changes = [[*h, until, parked_after(until), 0] for h, until in s.give_back]
        changes += [[*h, s.extend_until, LEASED.parked, 1] for h in s.extend]
        b.add(_CHANGED(n), {"changes": as_json(changes)}, slot="changed")


_NONE_KEPT = (None, None)


def parked_after(until: float) -> int:
    """`groups.parked` of a lease given back until `until` (0: claimable now)."""
    return PARKED.parked if until > 0 else READY.parked
