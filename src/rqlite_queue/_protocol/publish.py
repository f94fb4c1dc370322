"""Publishing: messages appended to their groups in order, atomically, in a fixed number of
statements whatever their number (the items bound as one JSON array read with `json_each`;
on the embedded SQLite, bound rows), and the caller's own transaction with its publishes.

A group's priority and tenant are set by the publish that creates (or refills) its row and
kept while it has messages. A message with a dedup id is inserted only if the id is not
remembered, unexpired; the seqs of deduplicated messages (new or earlier) are read back. A
message with a debounce key replaces its group's pending message with the same key instead.
A publish checks the tenants' bounds on queued messages only once tenants are on; a client
that has not learnt they are sends the cheaper statements with a tripwire instead (its insert
fails if they are on: `tenants.TenantsTurnedOn`, then the checking form is sent)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from ..errors import QueueError, QueueFull, TenantMismatch
from .batch_joins import count_joins, joins
from .checks import show
from .core import QueueCore
from .messages import NewMessage
from .names import Fields, Names, Sql, as_json
from .plan import Batch, Builder, Plan, Reply, Statement
from .tenants import BOUNDED, TenantsTurnedOn, int_or_none, turn_on

PRUNE_CHANCE = 1 / 16
"""Pruning forgotten rows on a sixteenth of the calls that could leave some keeps the tables
small at a sixteenth of the cost (every statement costs rqlite a parse on each node)."""
BOUND_ROWS = 4000
"""Most messages `_bound` inserts at once: at 6 parameters a row, under SQLite's default
limit of 32,766 parameters per statement."""

TENANTS_ON_ERROR = "NOT NULL constraint failed: {messages}.published_at"
"""How a publish that assumed tenants off fails once they are on (its tripwire)."""
QUEUE_FULL_ERROR = "NOT NULL constraint failed: {tenants}.vt"
"""How a publish fails when it would take a tenant, or one of its groups, over its bound on
queued messages (`_WITHIN_BOUNDS`)."""
TENANT_CHANGE_ERROR = "NOT NULL constraint failed: {tenants}.weight"
"""How a publish fails when an item names a tenant other than its group's (`_SAME_TENANT`)."""
TRANSACTION_DONE_ERROR = "UNIQUE constraint failed: {dedup}.dedup_id"
"""How a transaction's batch fails when its id is remembered: it applied already."""

J = Fields("j", NewMessage._fields)
"""A message to publish, as its JSON item: its fields in order (`list(message)`)."""

# ------------------------------------------------------------------------- the statements

_PRUNE_DEDUP = Sql("DELETE FROM {dedup} WHERE expires_at < :t")
# `meta.mark`: the last seq given so far. Rows inserted after have seqs above it
# (AUTOINCREMENT), so a publish finds its own rows by a key range.
_MARK_LAST_SEQ = Sql(
    """
    UPDATE {meta} SET value = coalesce(
      (SELECT seq FROM sqlite_sequence WHERE name = '{messages}'), 0)
    WHERE "key" = 'mark'
    """
)
# Items with a debounce key replace their group's pending message with the same key (its seq,
# its place and its first publish time kept): its event, ttl and due time become theirs, the
# due time never past the run's `due_by`. Pending: not the head a lease took (`groups.head`
# keeps the seq of the message a claim took until it is acked or dead-lettered).
_DEBOUNCE = Sql(
    """
    UPDATE {messages} SET event = {j.event}, expires = {j.expires},
      due = min({j.due}, coalesce(due_by, 9e18)), headers = {j.headers}, keep = {j.keep}
    FROM json_each(:items) j
    WHERE {messages}.group_id = {j.group_id} AND {messages}.debounce = {j.debounce}
      AND {messages}.seq IS NOT (SELECT head FROM {groups} WHERE group_id = {j.group_id})
    """,
    j=J,
)
# The groups whose head was replaced: not leased (its head never taken), so claimable now or
# waiting for the head's due time (`d`).
_DEBOUNCED_HEADS = Sql(
    """
    UPDATE {groups} AS g SET ready = iif(d > :now, {DELAYED.ready}, {READY.ready}),
      until = iif(d > :now, d, 0), parked = iif(d > :now, {DELAYED.parked}, {READY.parked})
    FROM (
      SELECT m.group_id i, m.due d FROM json_each(:items) j JOIN {messages} m
        ON m.seq = (SELECT min(seq) FROM {messages} WHERE group_id = {j.group_id})
      WHERE {j.debounce} IS NOT NULL AND m.debounce = {j.debounce})
    WHERE g.group_id = i AND g.head IS NOT (SELECT min(seq) FROM {messages} WHERE group_id = i)
      AND (g.ready = {READY.ready} OR g.parked = {DELAYED.parked})
    """,
    j=J,
)
# An item that replaced no message that was there before this publish (`meta.mark`): it is
# inserted, and may create or refill its group.
_NOT_REPLACED = Sql(
    """
    AND ({j.debounce} IS NULL OR NOT EXISTS (
      SELECT 1 FROM {messages} p WHERE p.group_id = {j.group_id} AND p.debounce = {j.debounce}
        AND p.seq IS NOT (SELECT head FROM {groups} WHERE group_id = {j.group_id})
        AND p.seq <= (SELECT value FROM {meta} WHERE "key" = 'mark')))
    """,
    j=J,
)
# A dedup id not remembered, unexpired.
_UNSEEN = Sql(
    """
    AND ({j.dedup_id} IS NULL OR NOT EXISTS (
      SELECT 1 FROM {dedup} WHERE dedup_id = {j.dedup_id} AND expires_at >= :now))
    """,
    j=J,
)
# A client that has not learnt that tenants are on (the row of token '*'): its insert fails
# (TENANTS_ON_ERROR), so that it learns it and publishes again, checking the bounds.
_TRIPWIRE = Sql("iif(EXISTS (SELECT 1 FROM {claims} WHERE token = '*'), NULL, :now)")

ALWAYS = Sql("true")
"""The condition of a plain publish's items (a settlement's follow-ups have theirs)."""


@functools.cache
def _insert(
    condition: Sql,
    unseen: bool,
    replaced: bool,
    tripwire: bool,
    columns: tuple[str, ...],
    batch: Sql | None = None,
) -> Sql:
    """Insert the items for which `condition` holds (of those with a dedup id, the unseen
    ones; with a debounce key, those that replaced nothing), in order; `columns`: the
    optional ones the items set (their fields of the same names). `batch`: the value of
    their batch column (a message that joins a batch; None: none does)."""
    return Sql(
        """
        INSERT INTO {messages} (group_id, event, published_at, dedup_id, due, expires{extra}
          {batch_column})
        SELECT {j.group_id}, {j.event}, {published_at}, {j.dedup_id}, {j.due}, {j.expires}{values}
          {batch_value}
        FROM json_each(:items) j WHERE {condition} {unseen} {replaced} ORDER BY j.key
        """,
        j=J,
        extra="".join(f", {column}" for column in columns),
        values=Sql("".join(f", {{j.{column}}}" for column in columns), j=J),
        batch_column=", batch" if batch is not None else "",
        batch_value=Sql(", {value}", value=batch) if batch is not None else "",
        published_at=_TRIPWIRE if tripwire else ":now",
        condition=condition,
        unseen=_UNSEEN if unseen else "",
        replaced=_NOT_REPLACED if replaced else "",
    )


@functools.cache
def _same_tenant(condition: Sql) -> Sql:
    """A group's tenant never changes while it has messages: an item naming another one fails
    the transaction (TENANT_CHANGE_ERROR: the weight of the default tenant's row set to
    NULL, which NOT NULL refuses)."""
    return Sql(
        """
        UPDATE {tenants} SET weight = NULL WHERE name = '' AND EXISTS (
          SELECT 1 FROM json_each(:items) j JOIN {groups} g
            ON g.group_id = {j.group_id} AND {g.not_empty} AND g.tenant != {j.tenant}
          WHERE {condition})
        """,
        j=J,
        condition=condition,
    )


_RECORD_DEDUP = Sql(
    """
    INSERT OR REPLACE INTO {dedup} (dedup_id, seq, expires_at)
    SELECT dedup_id, seq, :until FROM {messages}
    WHERE seq > (SELECT value FROM {meta} WHERE "key" = 'mark') AND dedup_id IS NOT NULL
    """
)


@functools.cache
def forget_expired(groups: Sql) -> Sql:
    """Drop the rows of the groups `groups` selects that emptied more than RETIRE_WINDOW ago
    (and are not held), so that such a group starts afresh: never claimed, last in creation
    order (the pruning of the others is left to chance, which must not decide where a group
    goes)."""
    return Sql(
        "DELETE FROM {groups} WHERE group_id IN ({source}) AND {empty} AND {free} AND until < :now",
        source=groups,
    )


GROUPS_OF_ITEMS = Sql("SELECT j.value FROM json_each(:groups) j")
"""The groups of a publish, as `forget_expired` takes them (`:groups`: their ids, JSON)."""
_FORGET = forget_expired(GROUPS_OF_ITEMS)


@functools.cache
def upsert_groups(
    rows: Sql, *, tenants: bool = True, delays: bool = True, now: str = ":now"
) -> Sql:
    """A group's row, created (turn 0: never claimed) or brought back from empty (its turn and
    place kept), at the priority and in the tenant of the publish that does it; a row with
    messages keeps both. `rows` (a SELECT, in order of `k`) names for each group `g` its
    priority `p`, the due time `d` of the message that becomes its head (a head due later
    makes the group wait until then, as a park does) and its tenant `t` or NULL (no tenant
    given: the part of the group id before the queue's tenant separator, if one is set and
    the part is not empty; else the default tenant ''). `now`: the time's parameter.

    `tenants=False`, for a publish whose tripwire fails it if tenants are on: then every
    group's tenant is the default one, and the statement leaves it out (and, without a WITH,
    a write of no SELECT goes to rqlite's cheaper `/db/execute`). `delays=False`, for heads
    all due at once: ready, whatever `now`."""
    if delays:
        states = Sql(
            """
            iif(d > {now}, {DELAYED.ready}, {READY.ready}), iif(d > {now}, d, 0),
            iif(d > {now}, {DELAYED.parked}, {READY.parked})
            """,
            now=now,
        )
    else:
        states = Sql("{READY.ready}, 0, {READY.parked}")
    if not tenants:
        return Sql(
            """
            INSERT INTO {groups} (group_id, priority, ready, until, parked)
            SELECT g, p, {states} FROM ({rows}) WHERE true ORDER BY k
            ON CONFLICT (group_id) DO UPDATE SET ready = excluded.ready, until = excluded.until,
              parked = excluded.parked, priority = excluded.priority
            WHERE {empty}
            """,
            rows=rows,
            states=states,
        )
    return Sql(
        """
        WITH x(k, g, p, d, t) AS ({rows}), y AS (
          SELECT *, instr(g, (SELECT char(value) FROM {meta} WHERE "key" = 'tenant_sep')) i
          FROM x)
        INSERT INTO {groups} (group_id, priority, ready, until, parked, tenant)
        SELECT g, p, {states}, coalesce(t, iif(i > 1, substr(g, 1, i - 1), ''))
        FROM y WHERE true ORDER BY k
        ON CONFLICT (group_id) DO UPDATE SET ready = excluded.ready, until = excluded.until,
          parked = excluded.parked, priority = excluded.priority, tenant = excluded.tenant
        WHERE {empty}
        """,
        rows=rows,
        states=states,
    )


@functools.cache
def _items_rows(condition: Sql, deduplicated: bool) -> Sql:
    """The groups' rows from the items (of those for which `condition` holds): only the items
    inserted now create or refill their group's row (a duplicate must not bring back a group
    that has since emptied, nor set a priority); of those, the first of each group (the ones
    after it would find its row refilled and change nothing). (An item without a dedup id
    finds no row in dedup: the coalesce lets it through.)"""
    inserted_now = Sql(
        """
        AND coalesce((SELECT seq FROM {dedup} WHERE dedup_id = {j.dedup_id}), 9e18)
          > (SELECT value FROM {meta} WHERE "key" = 'mark')
        """,
        j=J,
    )
    return Sql(
        """
        SELECT min(j.key) k, {j.group_id} g, {j.priority} p, {j.due} d, {j.tenant} t
        FROM json_each(:items) j WHERE {condition} {inserted_now} GROUP BY 2
        """,
        j=J,
        condition=condition,
        inserted_now=inserted_now if deduplicated else "",
    )


# Fail the transaction (QUEUE_FULL_ERROR) if, with this publish's messages in, a group or a
# tenant of theirs holds more messages than its tenant's bound. A queue without bounds pays
# one probe of an empty index; counting a group's or a tenant's messages costs what they hold,
# at most about the bound.
_WITHIN_BOUNDS = Sql(
    """
    WITH x(i, e) AS (
      SELECT g.group_id, g.tenant FROM json_each(:groups) j JOIN {groups} g
      ON g.group_id = j.value)
    UPDATE {tenants} SET vt = NULL WHERE name = ''
      AND EXISTS (SELECT 1 FROM {tenants} INDEXED BY {tenants_bounded} WHERE {bounded})
      AND EXISTS (SELECT 1 FROM {tenants} t WHERE t.name IN (SELECT e FROM x) AND (
        (t.max_group_queued IS NOT NULL AND EXISTS (
          SELECT 1 FROM x WHERE e = t.name
          AND (SELECT count(*) FROM {messages} WHERE group_id = i) > t.max_group_queued))
        OR (t.max_queued IS NOT NULL AND (
          SELECT sum((SELECT count(*) FROM {messages} WHERE group_id = h.group_id))
          FROM {groups} h WHERE h.tenant = t.name) > t.max_queued)))
    """,
    bounded=BOUNDED,
)
_DEBOUNCED = Sql(
    """
    SELECT j.key, max(m.seq) FROM json_each(:items) j JOIN {messages} m
      ON m.group_id = {j.group_id} AND m.debounce = {j.debounce}
    GROUP BY j.key
    """,
    j=J,
)
DEDUP_SEQS = Sql(
    "SELECT d.dedup_id, d.seq FROM json_each(:ids) j JOIN {dedup} d ON d.dedup_id = j.value"
)
"""The seqs the dedup ids `:ids` published."""


def publish(
    n: Names,
    messages: Sequence[NewMessage],
    *,
    now: float,
    dedup_until: float,
    prune_before: float | None,
    bounds: str = "check",
    bind_rows: bool = False,
    joined: Sequence[tuple[str, int]] = (),
) -> Batch:
    """Append messages in order, in a fixed number of statements. `messages` must not repeat a
    dedup id (the plan folds repeats). `prune_before`: first forget dedup ids that expired
    before it. `bounds`: "check" the tenants' bounds on queued messages (`_WITHIN_BOUNDS`);
    "tripwire" (a client that has not learnt that tenants are on: bounds need them on) fail
    with TENANTS_ON_ERROR if they are; "skip" them (follow-ups forwarded from an outbox:
    never bounded). `bind_rows`: the backend binds parameters for less than SQL parses them
    out of JSON (`_bound`). `joined`: the batches its messages join, each with how many:
    counted there (`batch_joins.count_joins`; forwarded messages were counted on their batch's
    shard: none)."""
    if bind_rows and 0 < len(messages) <= BOUND_ROWS and not joined:
        bound = _bound(n, messages, now, prune_before, bounds)
        if bound is not None:
            return bound
    named = debounced = deduplicated = False
    for m in messages:  # (one pass)
        named = named or m.tenant is not None
        debounced = debounced or m.debounce is not None
        deduplicated = deduplicated or m.dedup_id is not None
    items = as_json(messages)
    b = Builder()
    if named:
        turn_on(b, n)
    if prune_before is not None:
        b.add(_PRUNE_DEDUP(n), {"t": prune_before})
    if debounced:
        b.add(_MARK_LAST_SEQ(n))
        b.add(_DEBOUNCE(n), {"items": items})
        b.add(_DEBOUNCED_HEADS(n), {"items": items, "now": now})
    if bounds == "tripwire" and named:
        bounds = "check"  # this publish turns them on (above), if they were not
    tripwire = bounds == "tripwire"
    count_joins(b, n, joined, now)
    insert_messages(
        b,
        n,
        messages,
        items,
        now=now,
        dedup_until=dedup_until,
        replaced=debounced,
        tripwire=tripwire,
    )
    if bounds == "check":
        b.add(
            _WITHIN_BOUNDS(n),
            {"groups": as_json(list(dict.fromkeys(m.group_id for m in messages)))},
        )
    if debounced:
        b.add(_DEBOUNCED(n), {"items": items}, slot="debounced")
    if deduplicated:
        ids = as_json([m.dedup_id for m in messages if m.dedup_id is not None])
        b.add(DEDUP_SEQS(n), {"ids": ids}, slot="dedup")
    return b.build()


BATCH_OF_ITEM = Sql("{j.batch}", j=J)
"""The batch column of an inserted message: its item's."""


def insert_messages(
    b: Builder,
    n: Names,
    messages: Sequence[NewMessage],
    items: str,
    *,
    now: float,
    dedup_until: float,
    condition: Sql = ALWAYS,
    replaced: bool = False,
    tripwire: bool = False,
    params: Mapping[str, Any] | None = None,
    batch: Sql = BATCH_OF_ITEM,
) -> None:
    """Insert `items` (a JSON array of items whose first fields are a `NewMessage`'s), those
    for which `condition` holds (an `Sql` condition over `j`: a follow-up's lease holds), and
    create or refill their groups' rows. `replaced`: a debounced item that replaced its
    group's pending message is not inserted (its group has one, so its row is neither created
    nor refilled). `tripwire`: the insert fails if tenants are on (so the groups' rows are
    made without them: `upsert_groups`). `params`: those `condition` names, besides the
    items. `batch`: the value of a message's batch column (`{j.batch}`; a follow-up's is its
    lease's message's), named only where a message joins a batch."""
    deduplicated = headers = named = delayed = kept = joining = False
    for m in messages:  # (one pass)
        deduplicated = deduplicated or m.dedup_id is not None
        headers = headers or m.headers is not None
        named = named or m.tenant is not None
        delayed = delayed or bool(m.due)
        kept = kept or m.keep is not None
        joining = joining or m.batch is not None
    given = {} if params is None else dict(params)
    if named:
        b.add(_same_tenant(condition)(n), {"items": items, **given})
    if deduplicated:
        b.add(_MARK_LAST_SEQ(n))
    # The headers' and keep's columns are named only where a message sets them (only then: a
    # v5 or v6 client's text); the debounce columns only where a publish may replace; the
    # batch column only where a message joins a batch (a v8 client's text).
    columns = (
        *(("debounce", "due_by") if replaced else ()),
        *(("headers",) if headers else ()),
        *(("keep",) if kept else ()),
    )
    insert = _insert(
        condition, deduplicated, replaced, tripwire, columns, batch if joining else None
    )
    b.add(insert(n), {"items": items, "now": now, **given}, slot="inserted")
    groups = as_json(list(dict.fromkeys(m.group_id for m in messages)))
    b.add(_FORGET(n), {"groups": groups, "now": now})
    if deduplicated:
        b.add(_RECORD_DEDUP(n), {"until": dedup_until})
    rows = _items_rows(condition, deduplicated)
    upsert = upsert_groups(rows, tenants=not tripwire, delays=delayed)
    upsert_params = {"items": items, "now": now} if delayed else {"items": items}
    b.add(upsert(n), {**upsert_params, **given})


# -------------------------------------------------------------- the embedded SQLite's form

_BOUND_TRIPWIRE = Sql(
    """
    INSERT INTO {messages} (group_id, event, published_at) SELECT '', '', NULL
    WHERE EXISTS (SELECT 1 FROM {claims} WHERE token = '*')
    """
)
"""The tripwire of `publish`, once rather than once per row."""


@functools.lru_cache(maxsize=64)
def _bound_insert(count: int, extra: tuple[str, ...]) -> Sql:
    """The insert of `count` rows of (group id, event, `extra`..., published at)."""
    row = f"({', '.join(['?'] * (len(extra) + 3))})"
    return Sql(
        "INSERT INTO {messages} (group_id, event, {extra}published_at) VALUES {rows}",
        extra="".join(c + ", " for c in extra),
        rows=", ".join([row] * count),
    )


@functools.lru_cache(maxsize=64)
def _bound_groups(count: int, tenants: bool, delays: bool) -> Sql:
    """The groups' rows of `_bound`: `count` rows of (order, group, priority, due), numbered
    (`?` and a named `:now` cannot be bound together), the time last."""
    rows = ", ".join(
        f"(?{4 * k + 1}, ?{4 * k + 2}, ?{4 * k + 3}, ?{4 * k + 4}, NULL)" for k in range(count)
    )
    values = Sql(
        "SELECT column1 k, column2 g, column3 p, column4 d, column5 t FROM (VALUES {rows})",
        rows=rows,
    )
    return upsert_groups(values, tenants=tenants, delays=delays, now=f"?{4 * count + 1}")


_BOUND_FIELDS = attrgetter(*(f for f in NewMessage._fields if f != "due_by"))
"""What `_bound` reads of each message (by name, in one call)."""


def _bound(
    n: Names,
    messages: Sequence[NewMessage],
    now: float,
    prune_before: float | None,
    bounds: str,
) -> Batch | None:
    """`publish` for the embedded backend, of messages without a tenant, dedup id or debounce
    key (the common case; None for others): the rows as bound parameters of one multi-row
    INSERT, and the groups' rows from the first message of each group, picked here. The same
    statements as JSON cost SQLite about twice as much: it parses a JSON item once per field
    it reads. (Not for rqlite: it turns every parameter into a value of its own in the
    request, the Raft log and each node's binding, so that one JSON text is cheaper there:
    bench/bound_rows.py.)"""
    # Only the columns some message sets (the others' defaults are theirs): each bound value
    # costs about as much as the row's share of the index.
    params: list[Any] = []
    first: dict[str, tuple[int, float]] = {}  # group id: its first message's priority, due
    wide = delayed = False
    for (
        group_id,
        event,
        priority,
        dedup_id,
        due,
        expires,
        tenant,
        debounce,
        head,
        keep,
        batch,
    ) in map(_BOUND_FIELDS, messages):
        if dedup_id is not None or tenant is not None or debounce is not None or batch is not None:
            return None
        params += (group_id, event, now)
        if due or expires is not None or head is not None or keep is not None:
            wide = True
            delayed = delayed or bool(due)
        if group_id not in first:
            first[group_id] = (priority, due)
    extra: tuple[str, ...] = ()
    if wide:
        extra = tuple(
            column
            for column, given in (
                ("due", delayed),
                ("expires", any(m.expires is not None for m in messages)),
                ("headers", any(m.headers is not None for m in messages)),
                ("keep", any(m.keep is not None for m in messages)),
            )
            if given
        )
        fields = attrgetter("group_id", "event", *extra)
        params = []
        for m in messages:
            params += (*fields(m), now)
    b = Builder()
    if prune_before is not None:
        b.add(_PRUNE_DEDUP(n), {"t": prune_before})
    tripwire = bounds == "tripwire"
    if tripwire:
        b.add(_BOUND_TRIPWIRE(n))
    b.add(_bound_insert(len(messages), extra)(n), params, slot="inserted")
    b.add(_FORGET(n), {"groups": as_json(list(first)), "now": now})
    group_params: list[Any] = []
    for k, (group_id, (priority, due)) in enumerate(first.items()):
        group_params += (k, group_id, priority, due)
    if delayed:  # (the time is the last parameter: heads due at once need none)
        group_params.append(now)
    b.add(_bound_groups(len(first), not tripwire, delayed)(n), group_params)
    if bounds == "check":
        b.add(_WITHIN_BOUNDS(n), {"groups": as_json(list(first))})
    return b.build()


# ------------------------------------------------------------------------------ reading


def read_published(reply: Reply, messages: Sequence[NewMessage]) -> list[int]:
    """The seq of each published message, in order (for a deduplicated one, the seq of the
    message its id first published)."""
    inserted = reply["inserted"]
    count = inserted.rows_affected
    next_seq = (_require_int(inserted.last_insert_id) - count + 1) if count else 0
    if "dedup" not in reply and "debounced" not in reply:  # (each message is a new row)
        if count != len(messages):
            raise ValueError(f"{len(messages)} messages published, {count} rows inserted")
        return list(range(next_seq, next_seq + count))
    first_new = next_seq
    known = {str(r[0]): int(r[1]) for r in reply["dedup"].rows} if "dedup" in reply else {}
    debounced = (
        {int(r[0]): int(r[1]) for r in reply["debounced"].rows} if "debounced" in reply else {}
    )
    seqs = []
    for index, m in enumerate(messages):
        if m.debounce is not None:
            # Inserted now (numbered in order with the others) or the pending one replaced.
            seq = debounced[index]
            if seq >= next_seq and count:
                if seq != next_seq:
                    raise ValueError(f"debounced item {index}: seq {seq} != {next_seq}")
                next_seq += 1
            seqs.append(seq)
            continue
        if m.dedup_id is None or known.get(m.dedup_id, -1) >= first_new > 0:
            # A multi-row INSERT numbers its rows consecutively (AUTOINCREMENT, one writer).
            seq = next_seq
            next_seq += 1
            if m.dedup_id is not None and known[m.dedup_id] != seq:
                raise ValueError(f"dedup id {m.dedup_id!r}: seq {known[m.dedup_id]} != {seq}")
        elif m.dedup_id in known:
            seq = known[m.dedup_id]
        else:
            raise ValueError(f"dedup id {m.dedup_id!r} was neither inserted nor known")
        seqs.append(seq)
    if next_seq - first_new != count:
        raise ValueError(f"{count} rows inserted, {next_seq - first_new} accounted for")
    return seqs


def _require_int(value: int | None) -> int:
    if value is None:
        raise ValueError("missing last_insert_id")
    return value


# After a publish failed with QUEUE_FULL_ERROR (and wrote nothing): for each of its groups
# whose tenant has a bound, the tenant (its stored one while it has messages, else the one the
# publish gives or the rule derives, as `upsert_groups` decides), the messages the publish
# adds to it, its bounds, and the messages the group and the tenant hold.
_BOUNDS_REACHED = Sql(
    """
    WITH x(g, t) AS (SELECT {j.group_id}, {j.tenant} FROM json_each(:items) j),
    y AS (
      SELECT g, t, count(*) c,
        instr(g, (SELECT char(value) FROM {meta} WHERE "key" = 'tenant_sep')) i
      FROM x GROUP BY g),
    z AS (
      SELECT g, c, coalesce(
        (SELECT tenant FROM {groups} WHERE group_id = g AND ready != {EMPTY.ready}), t,
        iif(i > 1, substr(g, 1, i - 1), '')) e
      FROM y)
    SELECT z.g, z.e, z.c, t.max_group_queued,
      (SELECT count(*) FROM {messages} m WHERE m.group_id = z.g), t.max_queued,
      (SELECT count(*) FROM {groups} h JOIN {messages} m ON m.group_id = h.group_id
        WHERE h.tenant = z.e)
    FROM z JOIN {tenants} t ON t.name = z.e
    WHERE t.max_queued IS NOT NULL OR t.max_group_queued IS NOT NULL
    """,
    j=J,
)


def bounds_reached(n: Names, messages: Sequence[NewMessage]) -> Batch:
    b = Builder(write=False)
    b.add(_BOUNDS_REACHED(n), {"items": as_json(messages)}, slot="bounds")
    return b.build()


@dataclass(frozen=True, slots=True)
class BoundReached:
    tenant: str
    group_id: str | None
    """None: the tenant's bound."""
    limit: int


def read_bounds_reached(reply: Reply) -> BoundReached | None:
    """The first bound the refused publish would have gone over (None: none now)."""
    added: dict[str, int] = {}
    tenants: dict[str, tuple[int | None, int]] = {}
    for group_id, tenant, count, group_bound, held, tenant_bound, tenant_held in reply[
        "bounds"
    ].rows:
        if group_bound is not None and int(held) + int(count) > int(group_bound):
            return BoundReached(str(tenant), str(group_id), int(group_bound))
        added[tenant] = added.get(tenant, 0) + int(count)
        tenants[tenant] = (int_or_none(tenant_bound), int(tenant_held))
    for tenant, (bound, held) in tenants.items():
        if bound is not None and held + added[tenant] > bound:
            return BoundReached(str(tenant), None, bound)
    return None


# ---------------------------------------------------------------------------------- plans

FULL = "this publish would go over a bound on queued messages (nothing was written)"


def plan(
    core: QueueCore,
    messages: Sequence[NewMessage],
    *,
    tenants_on: bool | None = True,
    bind_rows: bool = False,
    counted: bool = False,
) -> Plan[list[int]]:
    """Publish checked messages atomically; the plan reads their seqs, in order.
    `tenants_on`: what the client knows of the queue's tenants (bounds need them on): True,
    check the bounds; False, fail if they are on (and then publish checking them: `instead`);
    None, skip bounds (follow-ups forwarded from an outbox). `bind_rows`: the backend is the
    embedded SQLite (`publish`). `counted`: the messages that join batches were counted in
    them already (forwarded from their batch's shard's outbox); else they are counted now,
    in the publish's transaction (their batches must live here)."""
    now = core.now()
    plain = not any(
        m.tenant is not None or m.dedup_id is not None or m.debounce is not None for m in messages
    )
    joined = () if counted else joins(messages)
    unique, where = (list(messages), None) if plain else _folded(messages)
    seen = () if plain else {m.dedup_id for m in unique if m.dedup_id is not None}
    # Forget ids a whole window after they expired: a publisher whose clock runs ahead of
    # another's by up to the window cannot prune ids the other still relies on.
    prune = bool(seen) and core.chance() < PRUNE_CHANCE
    batch = publish(
        core.names,
        unique,
        now=now,
        dedup_until=now + core.dedup_window,
        prune_before=now - core.dedup_window if prune else None,
        bounds="check" if tenants_on else "skip" if tenants_on is None else "tripwire",
        bind_rows=bind_rows,
        joined=joined,
    )

    def read(reply: Reply) -> list[int]:
        seqs = read_published(reply, unique)
        return seqs if where is None else [seqs[at] for at in where]

    def instead(error: QueueError) -> Plan[list[int]] | None:
        if isinstance(error, QueueFull):
            return _queue_full(core, unique)
        if isinstance(error, TenantsTurnedOn) and tenants_on is False:
            return plan(core, messages, tenants_on=True, bind_rows=bind_rows, counted=counted)
        return None

    named = not plain and any(m.tenant is not None for m in unique)
    return Plan(
        batch,
        read,
        resend_safe=resend_safe(messages),
        tenants_on=named,
        instead=instead,
    )


def resend_safe(messages: Sequence[NewMessage]) -> bool:
    """Whether a publish of `messages` may be sent again after its reply was lost: only dedup
    ids make a second send harmless (it then finds the ids and inserts nothing)."""
    return all(m.dedup_id is not None for m in messages)


def _folded(messages: Sequence[NewMessage]) -> tuple[list[NewMessage], list[int]]:
    """The messages to insert, and where each given one went among them: a dedup id repeated
    within one batch is one message (its repeats get its seq), and so is a debounce key
    repeated in a group (the first's place, the last's content). A group given two tenants is
    refused (`TenantMismatch`)."""
    unique: list[NewMessage] = []
    where: list[int] = []  # each message's index in `unique`
    first: dict[tuple[str, ...], int] = {}
    tenants: dict[str, str] = {}
    for index, m in enumerate(messages):
        if m.tenant is not None and tenants.setdefault(m.group_id, m.tenant) != m.tenant:
            exc = TenantMismatch(f"group {show(m.group_id)} is given two tenants")
            exc.index = index
            raise exc
        # Two key spaces: a debounce key never folds into an equal dedup id.
        key = (
            ("dedup", m.dedup_id)
            if m.dedup_id is not None
            else ("debounce", m.group_id, m.debounce)
            if m.debounce is not None
            else None
        )
        if key is not None and key in first:
            at = first[key]
            if m.debounce is not None:
                run = unique[at]
                due = m.due if run.due_by is None else min(m.due, run.due_by)
                unique[at] = run._replace(
                    event=m.event,
                    due=due,
                    expires=m.expires,
                    tenant=m.tenant or run.tenant,
                    headers=m.headers,
                    keep=m.keep,
                )
            where.append(at)
            continue
        if key is not None:
            first[key] = len(unique)
        where.append(len(unique))
        unique.append(m)
    return unique, where


def _queue_full(core: QueueCore, messages: Sequence[NewMessage]) -> Plan[list[int]]:
    """The read that names the bound a refused publish would have gone over (and raises its
    `QueueFull`)."""

    def read(reply: Reply) -> list[int]:
        reached = read_bounds_reached(reply)
        if reached is None:
            raise QueueFull(FULL + " (since the refusal, messages were taken)")
        tenant = show(reached.tenant) if reached.tenant else "the default tenant"
        where = (
            f"group {show(reached.group_id)} of tenant {tenant}"
            if reached.group_id is not None
            else f"tenant {tenant}"
        )
        raise QueueFull(
            f"{FULL}: {where} may hold at most {reached.limit} messages",
            tenant=reached.tenant,
            group_id=reached.group_id,
            limit=reached.limit,
        )

    return Plan(bounds_reached(core.names, messages), read)


# ---------------------------------------------------------------- the caller's transaction

# The first statement of a transaction sent again after a lost reply: it fails the whole
# transaction (a duplicate key) if an earlier send applied it; remembered like a dedup id.
_TRANSACTION_ID = Sql("INSERT INTO {dedup} (dedup_id, seq, expires_at) VALUES (:id, 0, :until)")


def transaction(
    core: QueueCore, statements: Sequence[Statement], messages: Sequence[NewMessage]
) -> Plan[list[int]]:
    """The caller's statements and these publishes, in one transaction; the plan reads the
    publishes' seqs. Sent again after a lost reply only if every publish has a dedup id: the
    transaction then carries an id of its own (made from theirs), which fails a second
    application whole: the plan then reads its seqs from the publishes' dedup ids."""
    publishing = plan(core, messages)
    ids = sorted(m.dedup_id for m in messages if m.dedup_id is not None)
    first: list[Statement] = []
    if messages and len(ids) == len(messages):
        digest = hashlib.blake2b("\0".join(ids).encode(), digest_size=16).hexdigest()
        until = core.now() + core.dedup_window
        first = [Statement(_TRANSACTION_ID(core.names), {"id": f"tx:{digest}", "until": until})]
    done = TRANSACTION_DONE_ERROR.format(dedup=core.names.dedup)
    publish_instead = publishing.instead

    def instead(error: QueueError) -> Plan[list[int]] | None:
        if first and done in str(error):
            return _done_transaction(core, messages)
        return None if publish_instead is None else publish_instead(error)

    batch = publishing.batch.first([*first, *statements])
    if not {"dedup", "debounced"} & set(batch.slots):
        # Its reads are counts: it goes to rqlite's /db/execute, which rolls the transaction
        # back when one of the caller's statements does not compile (a missing table, a
        # typo); v8's /db/request reports that statement's error but runs and commits the
        # others (rqlite's db.Request: fixed after v8, rqlite#2792).
        batch = dataclasses.replace(batch, selects=False)
    return Plan(
        batch,
        publishing.read,
        resend_safe=bool(first),
        tenants_on=publishing.tenants_on,
        instead=instead,
    )


def _done_transaction(core: QueueCore, messages: Sequence[NewMessage]) -> Plan[list[int]]:
    """The seqs of a transaction that applied already, from its publishes' dedup ids."""
    core.now()
    ids = [m.dedup_id for m in messages if m.dedup_id is not None]

    def read(reply: Reply) -> list[int]:
        known = {str(r[0]): int(r[1]) for r in reply["dedup"].rows}
        return [known[m.dedup_id] for m in messages if m.dedup_id is not None]

    b = Builder(write=False)
    b.add(DEDUP_SEQS(core.names), {"ids": as_json(ids)}, slot="dedup")
    return Plan(b.build(), read)
