"""A worker's round trip: settle the leases it is done with (ack, nack, park, extend, dead
letter: `settlements`, `one_settlement`) and claim new ones, in one transaction: one Raft
entry however many leases; before it, where a claim alone found nothing last time, the probe
(`probes`).

The claim takes the heads of the claimable groups claimed least recently (round robin; by
weight between tenants once they are on) and returns them with `RETURNING` where rqlite's own
parser takes the statement, else with a `SELECT` in the same transaction (which also serves a
resend: it finds what the token took)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ..errors import OutcomeUnknown, QueueError, Unavailable
from ..types import MAX_PRIORITY, Headers, Lease, Probe, Round
from . import probes
from .batch_counts import ACKED as BATCH_ACKED
from .batch_counts import BACK as BATCH_BACK
from .batch_counts import FAILED as BATCH_FAILED
from .batch_counts import Settled
from .batch_tables import PRUNE as PRUNE_BATCHES
from .core import QueueCore
from .names import Names, Sql
from .one_settlement import settle_one
from .outcomes import error_text
from .plan import Batch, Builder, Known, Plan, Reply, Steps
from .publish import PRUNE_CHANCE
from .round_spec import EXTEND, FINISH, GIVE_BACK, CheckedRound, Held, RoundSpec, Settlement
from .round_spec import check as check_round
from .schema import RETIRE_WINDOW
from .settlements import Settle, follow_ups, settle_many
from .tenants import ALLOWANCE, BUCKET, TenantsTurnedOn, float_or_none

TENANTS_ON_ERROR = "NOT NULL constraint failed: {claims}.expires_at"
"""How a claim that assumed tenants off fails once they are on (its claim token's tripwire)."""


@dataclass(frozen=True, slots=True)
class Claim:
    token: str
    until: float
    count: int
    min_priority: int = 0
    fair: bool = False
    """Share between tenants by weight (the queue's tenants are on); else plain round-robin."""


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
_NOTHING_TO_SETTLE = Settle()


def round_trip(
    n: Names,
    *,
    now: float,
    settle: Settle = _NOTHING_TO_SETTLE,
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
    follow_ups(b, n, settle, now)
    if settle.count == 1:
        settle_one(b, n, settle, now)
    else:
        settle_many(b, n, settle, now)
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
    """Whether the queue's tenants are on, as a claim's rows said (None: no row said it; a
    probe's: `probes.read_tenants_on`)."""
    rows = reply["leased"].rows if "leased" in reply else []
    return bool(rows[0][TENANTS_COLUMN]) if rows else None


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
        found: Probe = yield probes.plan(core, floor, known.learn, tenants=known.tenants_on)
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
