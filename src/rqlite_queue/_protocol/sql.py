"""Every SQL statement of the queue, and every reading of what comes back: pure functions.

Nothing here does I/O. An operation is a `Batch` (statements sent in one round trip, in one
transaction) built by a function below; the backend runs it and hands back one `Result` per
statement; the reader next to the builder turns the results it names (`Batch.slots`) into
values. The same text runs on the embedded SQLite and on rqlite (which replicates the SQL text
and re-executes it on every node), so:

- times and tokens are parameters from the client, never `julianday('now')` or `random()`;
- group ids and payloads are always bound parameters; a batch of many items binds them as one
  JSON array read with `json_each`, so a batch costs a fixed number of statements whatever its
  size, and every statement's text stays short (rqlite gzips a request when one statement is
  1 KiB or longer, or when it has 50 statements);
- rows come back from plain `SELECT`s placed inside the write transaction (rqlite's
  `/db/request` runs them as queries within the transaction), not from `RETURNING`, which rqlite
  only honours when its own SQL parser accepts the statement and silently drops otherwise;
- every statement is driven by an index, so its cost does not grow with the backlog (each one
  says which index it uses; `tests/test_query_plans.py` checks the plans).

Tables, per queue (`rq_<queue>_` prefix):

- `meta`: key/value integers: `schema_version`; `turn`, the claim counter; `mark`, the last
  seq given before the publish under way (so the publish finds its own rows by a key range);
  `expired`, how many messages expired.
- `messages`: one row per queued message; `seq` is the FIFO order and the lease's handle;
  `due`: not delivered before (0: at once); `expires`: dead-lettered instead of delivered
  after (NULL: never).
- `groups`: one row per group. It carries the group's whole state, so that claim never looks at
  the messages of groups it does not take. `ready`: 1 claimable; 0 busy until `until` (leased;
  parked when `parked` = 1; waiting for a delayed head when `parked` = 2); 2 empty (its
  messages are all gone; the row is kept until `until` so a group refilled soon after
  rejoins the round robin where it left it, instead of going first as a never-claimed group
  would). `held` = 1: an operator's (or a dead letter's)
  hold: never claimed until released, whatever `ready` says. `token` and `head`: the lease that
  holds, or last held, the group, and the seq it was given (the fencing check); `attempts`:
  claims of the current head; `turn`: the claim counter at its last claim (0 = never claimed:
  the round-robin key).
- `dead`: dead-lettered messages.
- `dedup`: publish ids seen within the dedup window.
- `claims`: the tokens of recent claims (a claim applies at most once, however late); and,
  while an operator has paused the queue, a row with the empty token (a real token is never
  empty), which every claim finds with the lookup of its own token.
- `schedules`: periodic jobs: what to publish, how often, and when next.
- `settled`: the leases settled recently (token, seq, and how: acked, dead-lettered or given
  back), written in the transaction of the settlement itself: a settlement sent again after
  its reply was lost finds its own record, and so tells "this lease's settlement applied" from
  "the lease went to another holder". Kept RETIRE_WINDOW, pruned like the claim tokens.
- `outbox`: on a sharded queue, the follow-ups of a settlement (messages published with it)
  whose group lives on another shard: written in the settlement's transaction, forwarded to
  their shard with a dedup id made from their id, then deleted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .messages import NewMessage
from .names import Names
from .plan import READS as _READS
from .plan import Batch, Params, Reply, Result, Statement
from .plan import Builder as _Builder
from .schema import RETIRE_WINDOW
from .tenants import PAUSED_UNTIL, float_or_none

__all__ = ["Batch", "Names", "NewMessage", "Params", "Reply", "Result", "Statement"]

QUEUE_NAME = re.compile(r"[a-z0-9_]{1,40}")


def _json(value: Any) -> str:
    # ensure_ascii: the text is pure ASCII whatever the payloads hold (core has already refused
    # text that is not valid Unicode), so no backend has to agree on an encoding.
    return json.dumps(value, separators=(",", ":"))


def _item(field_no: int, alias: str = "j") -> str:
    return f"json_extract({alias}.value, '$[{field_no}]')"


# A text parameter bound as JSON: rqlite turns a string parameter shaped like an SQL hex
# literal (x'00ff') into a BLOB (its http/request_parser.go), but never looks inside a JSON
# text, so every group id travels as JSON and comes back as the same text.
_TEXT = "json_extract(:{name}, '$')"


def _forget_expired(b: _Builder, n: Names, groups: str, params: dict[str, Any], now: float) -> None:
    """Drop the rows of these groups that emptied more than RETIRE_WINDOW ago (and are not
    held), so that such a group starts afresh: never claimed, last in creation order (the
    pruning of the others is left to chance, which must not decide where a group goes)."""
    b.add(
        f"DELETE FROM {n.groups} WHERE group_id IN ({groups}) AND ready = 2 AND held = 0 "
        f"AND until < :now",
        {**params, "now": now},
    )


# A group's row, created (turn 0: never claimed) or brought back from empty (its turn and place
# kept), at the priority and in the tenant of the publish that does it; a row with messages
# keeps both. `{rows}` (a SELECT or a VALUES) gives (order, group id, priority, due of the
# message that becomes its head, tenant or NULL): a head due later makes the group wait until
# then (parked = 2), as a park does. No tenant given: the part of the group id before the
# queue's tenant separator, if one is set and the part is not empty; else the default tenant
# ''. `{now}`: the time's parameter.
_UPSERT_GROUP = (
    "WITH x(k, g, p, d, t) AS ({rows}), y AS (SELECT *, instr(g, (SELECT char(value) "
    "FROM {n.meta} WHERE \"key\" = 'tenant_sep')) i FROM x) "
    "INSERT INTO {n.groups} (group_id, priority, ready, until, parked, tenant) "
    "SELECT g, p, d <= {now}, iif(d > {now}, d, 0), 2 * (d > {now}), "
    "coalesce(t, iif(i > 1, substr(g, 1, i - 1), '')) FROM y WHERE true ORDER BY k "
    "ON CONFLICT (group_id) DO UPDATE SET ready = excluded.ready, until = excluded.until, "
    "parked = excluded.parked, priority = excluded.priority, tenant = excluded.tenant "
    "WHERE ready = 2"
)


# --------------------------------------------------------------------- holds and dead letters


def hold(n: Names, group_id: str, *, now: float) -> Batch:
    """Hold a group: no claim takes it until released (a lease in flight finishes normally). A
    group with no messages yet gets an empty, held row, so its next message waits too."""
    b = _Builder()
    _forget_expired(b, n, _TEXT.format(name="g"), {"g": _json(group_id)}, now)
    b.add(
        f"INSERT INTO {n.groups} (group_id, priority, ready, held) "
        f"VALUES ({_TEXT.format(name='g')}, 0, 2, 1) ON CONFLICT (group_id) DO UPDATE SET held = 1",
        {"g": _json(group_id)},
    )
    return b.build()


def release(n: Names, group_id: str) -> Batch:
    b = _Builder()
    b.add(
        f"UPDATE {n.groups} SET held = 0 WHERE group_id = {_TEXT.format(name='g')} AND held = 1",
        {"g": _json(group_id)},
        slot="released",
    )
    return b.build()


# ------------------------------------------------------------------------------ tenants


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


# A group's state for operators: `held` first (whatever else holds), then its lease, park or
# delayed head while not over (a lapsed one is `ready`: the next claim takes it).
_GROUP_STATE = (
    "CASE WHEN g.held != 0 THEN 'held' WHEN g.ready = 1 OR g.until <= :now THEN 'ready' "
    "WHEN g.parked = 1 THEN 'parked' WHEN g.parked = 2 THEN 'delayed' ELSE 'leased' END"
)


def list_groups(
    n: Names,
    *,
    now: float,
    limit: int,
    after: str | None = None,
    prefix: tuple[str, str | None] | None = None,
    state: str | None = None,
    min_priority: int = 0,
) -> Batch:
    """A page of the groups that have messages (or are held), in group id order from after
    `after` (keyset pagination: a walk of the primary key, which a prefix bounds as the range
    [prefix[0], prefix[1]); `state` and `min_priority` filter the rows walked). Per group: its
    depth and its head, from the group's range of the messages index."""
    where = ["(g.ready != 2 OR g.held != 0)"]
    params: dict[str, Any] = {"now": now, "limit": limit}
    if after is not None:
        where.append(f"g.group_id > {_TEXT.format(name='after')}")
        params["after"] = _json(after)
    if prefix is not None:
        where.append(f"g.group_id >= {_TEXT.format(name='lo')}")
        params["lo"] = _json(prefix[0])
        if prefix[1] is not None:
            where.append(f"g.group_id < {_TEXT.format(name='hi')}")
            params["hi"] = _json(prefix[1])
    if min_priority:
        where.append("g.priority >= :p")
        params["p"] = min_priority
    if state is not None:
        where.append(f"{_GROUP_STATE} = :state")
        params["state"] = state
    b = _Builder(write=False)
    b.add(
        f"SELECT g.group_id, g.priority, {_GROUP_STATE}, (SELECT count(*) FROM {n.messages} m "
        f"WHERE m.group_id = g.group_id), h.seq, g.attempts, "
        f"CASE WHEN g.ready = 0 AND g.until > :now THEN g.until END, "
        f"CASE WHEN g.ready = 0 AND g.parked = 0 AND g.until > :now THEN g.token END, "
        f"h.published_at FROM {n.groups} g LEFT JOIN {n.messages} h ON h.seq = "
        f"(SELECT min(seq) FROM {n.messages} m WHERE m.group_id = g.group_id) "
        f"WHERE {' AND '.join(where)} ORDER BY g.group_id LIMIT :limit",
        params,
        slot="groups",
    )
    return b.build()


def cancel_group(n: Names, group_id: str, reason: str, *, now: float) -> Batch:
    """Move every message of a group to the dead letters, with `reason`, in publish order,
    and fence the lease in flight on it (its token goes: the lease's ack finds it lost). The
    group's row becomes an empty one (a hold stays)."""
    g = {"g": _json(group_id)}
    b = _Builder()
    b.add(
        f"INSERT INTO {n.dead} (seq, group_id, event, priority, attempts, reason, "
        f"published_at, dead_at, headers) SELECT m.seq, m.group_id, m.event, g.priority, "
        f"CASE WHEN m.seq = g.head THEN g.attempts ELSE 0 END, :reason, m.published_at, :now, "
        f"m.headers FROM {n.messages} m JOIN {n.groups} g ON g.group_id = m.group_id "
        f"WHERE m.group_id = {_TEXT.format(name='g')} ORDER BY m.seq",
        {**g, "reason": reason, "now": now},
        slot="cancelled",
    )
    b.add(f"DELETE FROM {n.messages} WHERE group_id = {_TEXT.format(name='g')}", g)
    b.add(
        f"UPDATE {n.groups} SET ready = 2, until = :retire, parked = 0, attempts = 0, "
        f"token = NULL, head = NULL WHERE group_id = {_TEXT.format(name='g')} AND ready != 2",
        {**g, "retire": now + RETIRE_WINDOW},
    )
    return b.build()


def set_priority(n: Names, group_id: str, priority: int) -> Batch:
    """Change the priority of a group that has messages (an empty group's next publish sets
    its priority afresh)."""
    b = _Builder()
    b.add(
        f"UPDATE {n.groups} SET priority = :p WHERE group_id = {_TEXT.format(name='g')} "
        f"AND ready != 2",
        {"g": _json(group_id), "p": priority},
        slot="changed",
    )
    return b.build()


def set_paused(n: Names, paused: bool) -> Batch:
    """Pause (or resume) every claim of the queue: the row of the empty token in `claims`
    (never pruned: it expires at `PAUSED_UNTIL`) makes a claim's `UPDATE` take nothing and the
    probe find nothing claimable."""
    b = _Builder()
    if paused:
        b.add(
            f"INSERT OR IGNORE INTO {n.claims} (token, expires_at) VALUES ('', :e)",
            {"e": PAUSED_UNTIL},
        )
    else:
        b.add(f"DELETE FROM {n.claims} WHERE token = ''")
    return b.build()


def _paused(n: Names) -> str:
    return f"EXISTS (SELECT 1 FROM {n.claims} WHERE token = '')"


def _seq_filter(seqs: Sequence[int] | None) -> tuple[str, dict[str, Any]]:
    if seqs is None:
        return "", {}
    return "WHERE seq IN (SELECT j.value FROM json_each(:seqs) j)", {"seqs": _json(list(seqs))}


def list_dead(n: Names, *, limit: int, group_id: str | None, after: int = 0) -> Batch:
    """A page of the dead letters in seq order, from after seq `after` (keyset pagination:
    a range of the primary key)."""
    where = "seq > :after"
    params: dict[str, Any] = {"after": after, "limit": limit}
    if group_id is not None:
        where += f" AND group_id = {_TEXT.format(name='g')}"
        params["g"] = _json(group_id)
    b = _Builder(write=False)
    b.add(
        f"SELECT seq, group_id, event, priority, attempts, reason, published_at, dead_at, "
        f"headers FROM {n.dead} WHERE {where} ORDER BY seq LIMIT :limit",
        params,
        slot="dead",
    )
    return b.build()


def requeue_dead(n: Names, seqs: Sequence[int] | None, *, now: float) -> Batch:
    """Put dead letters back at the tail of their groups (new seqs, original priority when
    the group has to be created again)."""
    where, params = _seq_filter(seqs)
    b = _Builder()
    b.add(
        f"INSERT INTO {n.messages} (group_id, event, published_at, headers) "
        f"SELECT group_id, event, :now, headers FROM {n.dead} {where} ORDER BY seq",
        {**params, "now": now},
    )
    _forget_expired(b, n, f"SELECT group_id FROM {n.dead} {where}", params, now)
    b.add(
        _UPSERT_GROUP.format(
            n=n,
            now=":now",
            rows=f"SELECT min(seq), group_id, max(priority), 0, NULL FROM {n.dead} {where} "
            f"GROUP BY group_id",
        ),
        {**params, "now": now},
    )
    b.add(f"DELETE FROM {n.dead} {where}", params, slot="requeued")
    return b.build()


def purge_dead(n: Names, seqs: Sequence[int] | None) -> Batch:
    where, params = _seq_filter(seqs)
    b = _Builder()
    b.add(f"DELETE FROM {n.dead} {where}", params, slot="purged")
    return b.build()


# ------------------------------------------------------------------------------- schedules


@dataclass(frozen=True, slots=True)
class ScheduleRow:
    name: str
    group_id: str
    event: str
    priority: int
    every: float | None
    cron: str | None
    catch_up: bool
    next_at: float


_SCHEDULE_COLUMNS = "name, group_id, event, priority, every, cron, catch_up, next_at"


def put_schedule(n: Names, row: ScheduleRow, *, now: float) -> Batch:
    """Create or replace a schedule (its next tick is `row.next_at`)."""
    b = _Builder()
    b.add(
        f"INSERT INTO {n.schedules} ({_SCHEDULE_COLUMNS}, created_at) VALUES "
        f"({_TEXT.format(name='name')}, {_TEXT.format(name='g')}, {_TEXT.format(name='e')}, :p, "
        f":every, :cron, :c, "
        f":next, :now) ON CONFLICT (name) DO UPDATE SET group_id = excluded.group_id, "
        f"event = excluded.event, priority = excluded.priority, every = excluded.every, "
        f"cron = excluded.cron, catch_up = excluded.catch_up, next_at = excluded.next_at",
        {
            "name": _json(row.name),
            "g": _json(row.group_id),
            "e": _json(row.event),
            "p": row.priority,
            "every": row.every,
            "cron": row.cron,
            "c": int(row.catch_up),
            "next": row.next_at,
            "now": now,
        },
    )
    return b.build()


def drop_schedule(n: Names, name: str) -> Batch:
    b = _Builder()
    b.add(
        f"DELETE FROM {n.schedules} WHERE name = {_TEXT.format(name='name')}",
        {"name": _json(name)},
        slot="removed",
    )
    return b.build()


def list_schedules(n: Names, *, due_by: float | None = None, limit: int = 1000) -> Batch:
    """Every schedule by name, or (with `due_by`) those due by then, earliest first (a
    leader-local read: a stale answer only delays a tick to the next look)."""
    b = _Builder(write=False, local=due_by is not None)
    if due_by is None:
        b.add(f"SELECT {_SCHEDULE_COLUMNS} FROM {n.schedules} ORDER BY name", slot="schedules")
    else:
        b.add(
            f"SELECT {_SCHEDULE_COLUMNS} FROM {n.schedules} WHERE next_at <= :t "
            f"ORDER BY next_at, name LIMIT :limit",
            {"t": due_by, "limit": limit},
            slot="schedules",
        )
    return b.build()


def read_schedules(reply: Reply) -> list[ScheduleRow]:
    return [
        ScheduleRow(
            str(r[0]),
            str(r[1]),
            str(r[2]),
            int(r[3]),
            float_or_none(r[4]),
            None if r[5] is None else str(r[5]),
            bool(r[6]),
            float(r[7]),
        )
        for r in reply["schedules"].rows
    ]


@dataclass(frozen=True, slots=True)
class Fire:
    """Publish `ticks` messages of schedule `name`, whose tick due at `due` moves to `next_at`."""

    name: str
    due: float
    next_at: float
    ticks: int


def fire(n: Names, fires: Sequence[Fire], *, now: float) -> Batch:
    """Publish the due ticks of these schedules and move each on, in one transaction. Every
    statement checks that the schedule's next tick is still the one read (`due`): of several
    clients firing the same tick, the first to commit publishes it and moves it on, and the
    others then find it moved and do nothing; a resend after a lost reply does nothing either."""
    items = _json([[f.name, f.due, f.next_at, list(range(f.ticks))] for f in fires])
    due = f"JOIN {n.schedules} s ON s.name = {_item(0, 'f')} AND s.next_at = {_item(1, 'f')}"
    b = _Builder()
    _forget_expired(
        b, n, f"SELECT s.group_id FROM json_each(:fires) f {due}", {"fires": items}, now
    )
    b.add(
        f"INSERT INTO {n.messages} (group_id, event, published_at) SELECT s.group_id, s.event, "
        f":now FROM json_each(:fires) f {due} JOIN json_each(f.value, '$[3]') t "
        f"ORDER BY f.key, t.key",
        {"fires": items, "now": now},
        slot="published",
    )
    b.add(
        _UPSERT_GROUP.format(
            n=n,
            now=":now",
            rows=f"SELECT f.key, s.group_id, s.priority, 0, NULL FROM json_each(:fires) f {due}",
        ),
        {"fires": items, "now": now},
    )
    b.add(
        f"UPDATE {n.schedules} AS s SET next_at = {_item(2, 'f')} FROM json_each(:fires) f "
        f"WHERE s.name = {_item(0, 'f')} AND s.next_at = {_item(1, 'f')}",
        {"fires": items},
        slot="moved",
    )
    return b.build()


# ------------------------------------------------------------------------ reads and stats


def stats(n: Names, *, now: float) -> Batch:
    b = _Builder(write=False)
    b.add(
        f"SELECT (SELECT count(*) FROM {n.messages}), "
        f"(SELECT count(*) FROM {n.groups}) - (SELECT count(*) FROM {n.groups} WHERE ready = 2), "
        f"(SELECT count(*) FROM {n.groups} WHERE ready = 0 AND parked = 0 AND until > :now), "
        f"(SELECT count(*) FROM {n.groups} WHERE ready = 0 AND parked = 1 AND until > :now), "
        f"(SELECT count(*) FROM {n.dead}), "
        f"(SELECT published_at FROM {n.messages} ORDER BY seq LIMIT 1), "
        f"(SELECT count(*) FROM {n.groups} WHERE held != 0), "
        f"(SELECT count(*) FROM {n.messages} WHERE due > :now)",
        {"now": now},
        slot="counts",
    )
    # The groups waiting for a delayed head: a range of the busy index.
    b.add(
        f"SELECT count(*) FROM {n.groups} WHERE ready = 0 AND parked = 2 AND until > :now",
        {"now": now},
        slot="delayed_groups",
    )
    # Short statements (see the top): the counters apart.
    b.add(
        f"SELECT (SELECT value FROM {n.meta} WHERE \"key\" = 'expired'), {_paused(n)}, "
        f"(SELECT seq FROM sqlite_sequence WHERE name = '{n.messages}'), "
        f"(SELECT count(*) FROM {n.outbox}), "
        f"(SELECT value FROM {n.meta} WHERE \"key\" = 'tenants')",
        slot="counters",
    )
    # Per group, its range of the messages index (index-only, no table row read): 2.7x
    # cheaper than joining every message to its group, at 1M messages in 100k groups.
    # And the oldest head per priority, from the same range (its first entry): the seq, then
    # once per priority the message's row.
    b.add(
        f"SELECT priority, c, (SELECT published_at FROM {n.messages} WHERE seq = h) FROM "
        f"(SELECT priority, sum((SELECT count(*) FROM {n.messages} m "
        f"WHERE m.group_id = g.group_id)) c, min((SELECT min(seq) FROM {n.messages} m "
        f"WHERE m.group_id = g.group_id)) h FROM {n.groups} g WHERE ready != 2 "
        f"GROUP BY priority HAVING c > 0) ORDER BY priority",
        slot="by_priority",
    )
    return b.build()


def peek(n: Names, group_id: str, *, limit: int) -> Batch:
    b = _Builder(write=False)
    b.add(
        f"SELECT seq, event FROM {n.messages} WHERE group_id = {_TEXT.format(name='g')} "
        f"ORDER BY seq LIMIT :limit",
        {"g": _json(group_id), "limit": limit},
        slot="messages",
    )
    return b.build()


# ------------------------------------------------------------------------- shard changes
#
# While a sharded queue's shard list changes (sharding.py), every publish batch of a sharded
# client starts with the list's epoch: the stored one is raised to the client's, and a client
# with an older list fails on NOT NULL of `meta.value` (told apart by that error), so it
# cannot put a message on the shard a group has left. A group that moves publishes on its new
# shard, held there (`held` = 2) while its old shard still has its messages; the hold ends
# when the old shard has none left.

STALE_EPOCH_ERROR = "NOT NULL constraint failed: {meta}.value"
WAITING = 2
"""`groups.held` of a group waiting for its old shard to deliver its messages."""


def epoch_guards(n: Names, *, epoch: int) -> list[Statement]:
    """The statement to put first in a sharded client's publish batch (see above): it raises
    the stored epoch to this client's, or, if the stored one is higher, sets it to NULL, which
    NOT NULL refuses, failing the transaction."""
    return [
        Statement(
            f"INSERT INTO {n.meta} (key, value) VALUES ('shard_epoch', :e) "
            f'ON CONFLICT ("key") DO UPDATE SET value = CASE WHEN value > excluded.value '
            f"THEN NULL ELSE excluded.value END",
            {"e": epoch},
        )
    ]


def groups_present(n: Names, group_ids: Sequence[str], *, epoch: int) -> Batch:
    """Which of `group_ids` have messages here: a write (it raises the stored epoch), so that
    from then on no client with an older list adds any."""
    b = _Builder()
    for guard in epoch_guards(n, epoch=epoch):
        b.add(guard.sql, guard.params)
    b.add(
        f"SELECT DISTINCT group_id FROM {n.messages} "
        f"WHERE group_id IN (SELECT value FROM json_each(:gs))",
        {"gs": _json(list(group_ids))},
        slot="present",
    )
    return b.build()


def read_present(reply: Reply) -> set[str]:
    return {row[0] for row in reply["present"].rows}


def wait_for_old_shard(n: Names, group_ids: Sequence[str]) -> Statement:
    """Hold these groups (until `release_waits`) unless an operator holds them already."""
    return Statement(
        f"INSERT INTO {n.groups} (group_id, priority, ready, held) "
        f"SELECT value, 0, 2, {WAITING} FROM json_each(:gs) WHERE true "
        f"ON CONFLICT (group_id) DO UPDATE SET held = {WAITING} WHERE held = 0",
        {"gs": _json(list(group_ids))},
    )


def release_waits(n: Names, group_ids: Sequence[str]) -> Batch:
    b = _Builder()
    b.add(
        f"UPDATE {n.groups} SET held = 0 WHERE held = {WAITING} "
        f"AND group_id IN (SELECT value FROM json_each(:gs))",
        {"gs": _json(list(group_ids))},
    )
    return b.build()


def waiting_groups(n: Names, *, limit: int) -> Batch:
    b = _Builder(write=False)
    b.add(
        f"SELECT group_id FROM {n.groups} WHERE held = {WAITING} LIMIT :limit",
        {"limit": limit},
        slot="waiting",
    )
    return b.build()


def read_waiting(reply: Reply) -> list[str]:
    return [row[0] for row in reply["waiting"].rows]


def guarded(batch: Batch, guards: Sequence[Statement]) -> Batch:
    """`batch` with `guards` first (its slots moved along)."""
    shift = len(guards)
    return Batch(
        (*guards, *batch.statements),
        batch.write,
        batch.local,
        {slot: index + shift for slot, index in batch.slots.items()},
        batch.returning,
        batch.selects or any(g.sql.lstrip().startswith(_READS) for g in guards),
    )


def shard_epoch(n: Names) -> Batch:
    b = _Builder(write=False)
    b.add(
        f"SELECT value FROM {n.meta} WHERE \"key\" = 'shard_epoch'",
        slot="epoch",
    )
    return b.build()


def read_shard_epoch(reply: Reply) -> int:
    rows = reply["epoch"].rows
    return int(rows[0][0]) if rows else 0


# ------------------------------------------------------------------ the outbox (sharded)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    message: NewMessage


def read_outbox(n: Names, *, limit: int) -> Batch:
    """The oldest follow-ups waiting to be forwarded, in the order they were written (the
    leader's own copy: a row committed a moment ago may be missed, and is found next time)."""
    b = _Builder(write=False, local=True)
    b.add(
        f"SELECT id, group_id, event, priority, dedup_id, due, expires, tenant, headers FROM "
        f"{n.outbox} ORDER BY id LIMIT :n",
        {"n": limit},
        slot="outbox",
    )
    return b.build()


def outbox_rows(reply: Reply) -> list[OutboxRow]:
    return [
        OutboxRow(
            int(r[0]),
            NewMessage(
                str(r[1]),
                str(r[2]),
                int(r[3]),
                None if r[4] is None else str(r[4]),
                float(r[5]),
                None if r[6] is None else float(r[6]),
                None if r[7] is None else str(r[7]),
                headers=None if r[8] is None else str(r[8]),
            ),
        )
        for r in reply["outbox"].rows
    ]


def forwarded(n: Names, ids: Sequence[int]) -> Batch:
    """Forget the follow-ups that reached their shard."""
    b = _Builder()
    b.add(
        f"DELETE FROM {n.outbox} WHERE id IN (SELECT value FROM json_each(:ids))",
        {"ids": _json(list(ids))},
        slot="forwarded",
    )
    return b.build()
