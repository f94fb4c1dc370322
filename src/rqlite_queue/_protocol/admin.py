"""What operators do to a queue and read of it: hold and release a group, change its
priority, cancel it, pause the queue; list the groups; the dead letters (list, requeue,
purge); the counts of `stats()`; `peek`."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument
from ..types import GROUP_STATES, MAX_BATCH, MAX_PRIORITY, DeadLetter, GroupInfo, Headers, Stats
from .batch_counts import count_cancelled_group
from .batch_tables import OPEN_COUNT
from .checks import check_id, check_int, show
from .core import QueueCore
from .names import Names, Sql, as_json
from .plan import Batch, Builder, Plan, Reply, changed_one, nothing, single
from .publish import forget_expired, upsert_groups
from .round_spec import check_reason
from .schema import RETIRE_WINDOW
from .tenants import PAUSED_UNTIL

# ------------------------------------------------------------------------------ holds

_THE_GROUP = Sql("SELECT {text.g}")
_FORGET_THE_GROUP = forget_expired(_THE_GROUP)
# A group with no messages yet gets an empty, held row, so its next message waits too.
_HOLD = Sql(
    """
    INSERT INTO {groups} (group_id, priority, ready, held) VALUES ({text.g}, 0, {EMPTY.ready},
      {HELD.held})
    ON CONFLICT (group_id) DO UPDATE SET held = {HELD.held}
    """
)
_RELEASE = Sql(
    "UPDATE {groups} SET held = {FREE.held} WHERE group_id = {text.g} AND held = {HELD.held}"
)


def hold_batch(n: Names, group_id: str, *, now: float) -> Batch:
    """Hold a group: no claim takes it until released (a lease in flight finishes normally)."""
    b = Builder()
    g = {"g": as_json(group_id)}
    b.add(_FORGET_THE_GROUP(n), {**g, "now": now})
    b.add(_HOLD(n), g)
    return b.build()


def release_batch(n: Names, group_id: str) -> Batch:
    return single(_RELEASE(n), {"g": as_json(group_id)}, slot="released")


def hold_group(core: QueueCore, group_id: str) -> Plan[None]:
    check_id(group_id, "group_id")
    return Plan(hold_batch(core.names, group_id, now=core.now()), nothing, resend_safe=True)


def release_group(core: QueueCore, group_id: str) -> Plan[bool]:
    """Whether the group was held."""
    check_id(group_id, "group_id")
    core.now()
    return changed_one(release_batch(core.names, group_id), "released")


# ----------------------------------------------------------------------------- groups

# A page of the groups that have messages (or are held), in group id order (keyset
# pagination: a walk of the primary key, which a prefix bounds as a range; `{where}` filters
# the rows walked). Per group: its state as operators see it, its depth and its head, from
# the group's range of the messages index; its lease's deadline and holder while in force.
_PAGE = """
    SELECT g.group_id, g.priority, {shown},
      (SELECT count(*) FROM {messages} m WHERE m.group_id = g.group_id), h.seq, g.attempts,
      CASE WHEN {g.busy} AND g.until > :now THEN g.until END,
      CASE WHEN {g.leased} AND g.until > :now THEN g.token END, h.published_at
    FROM {groups} g LEFT JOIN {messages} h
      ON h.seq = (SELECT min(seq) FROM {messages} m WHERE m.group_id = g.group_id)
    WHERE ({g.not_empty} OR {g.held}) {where} ORDER BY g.group_id LIMIT :limit
    """
_FILTERS = {
    "after": Sql("AND g.group_id > {text.after}"),
    "lo": Sql("AND g.group_id >= {text.lo}"),
    "hi": Sql("AND g.group_id < {text.hi}"),
    "p": Sql("AND g.priority >= :p"),
    "state": Sql("AND {shown} = :state"),
}


@functools.cache
def _page(filters: tuple[str, ...]) -> Sql:
    """The page of groups filtered by `filters` (keys of `_FILTERS`)."""
    where = Sql(" ".join(f"{{{key}}}" for key in filters), **{k: _FILTERS[k] for k in filters})
    return Sql(_PAGE, where=where)


def groups_batch(
    n: Names,
    *,
    now: float,
    limit: int,
    after: str | None = None,
    prefix: tuple[str, str | None] | None = None,
    state: str | None = None,
    min_priority: int = 0,
) -> Batch:
    """A page of the groups from after `after`, those whose id is in [prefix[0], prefix[1])
    (a prefix's range), in `state`, of at least `min_priority`."""
    params: dict[str, Any] = {"now": now, "limit": limit}
    if after is not None:
        params["after"] = as_json(after)
    if prefix is not None:
        params["lo"] = as_json(prefix[0])
        if prefix[1] is not None:
            params["hi"] = as_json(prefix[1])
    if min_priority:
        params["p"] = min_priority
    if state is not None:
        params["state"] = state
    return single(
        _page(tuple(k for k in _FILTERS if k in params))(n), params, slot="groups", write=False
    )


def groups(
    core: QueueCore,
    *,
    state: str | None,
    prefix: str | None,
    min_priority: int,
    limit: int,
    after: str | None,
) -> Plan[list[GroupInfo]]:
    if state is not None and state not in GROUP_STATES:
        raise InvalidArgument(f"state must be one of {', '.join(GROUP_STATES)} or None")
    if prefix is not None:
        check_id(prefix, "prefix")
    if after is not None:
        check_id(after, "after")
    check_int(min_priority, "min_priority", 0, MAX_PRIORITY)
    check_int(limit, "limit", 1, MAX_BATCH)
    now = core.now()
    batch = groups_batch(
        core.names,
        now=now,
        limit=limit,
        after=after,
        prefix=None if prefix is None else (prefix, prefix_end(prefix)),
        state=state,
        min_priority=min_priority,
    )

    def read(reply: Reply) -> list[GroupInfo]:
        return [
            GroupInfo(
                group_id=str(r[0]),
                priority=int(r[1]),
                state=str(r[2]),
                depth=int(r[3]),
                head_seq=None if r[4] is None else int(r[4]),
                attempts=int(r[5]),
                until=None if r[6] is None else float(r[6]),
                holder=None if r[7] is None else str(r[7]).rpartition(":")[0],
                head_age=None if r[8] is None else max(0.0, now - float(r[8])),
            )
            for r in reply["groups"].rows
        ]

    return Plan(batch, read)


def prefix_end(prefix: str) -> str | None:
    """The least text above every text that starts with `prefix` (SQLite compares text as
    UTF-8 bytes, i.e. by code point): its last code point raised by one (None: no bound)."""
    while prefix:
        last = ord(prefix[-1]) + 1
        if last == 0xD800:
            last = 0xE000  # surrogates are not text
        if last <= 0x10FFFF:
            return prefix[:-1] + chr(last)
        prefix = prefix[:-1]
    return None


# Every message of a group to the dead letters, with `:reason`, in publish order; the lease in
# flight on it fenced (its token goes: the lease's ack finds it lost); its row an empty one (a
# hold stays). (The outcomes of those that keep theirs: cancelled, with the reason: written by
# `messages_kept` as they go, from their dead letters.)
_CANCEL = (
    Sql(
        """
        INSERT INTO {dead} (seq, group_id, event, priority, attempts, reason, published_at,
          dead_at, headers, keep)
        SELECT m.seq, m.group_id, m.event, g.priority,
          CASE WHEN m.seq = g.head THEN g.attempts ELSE 0 END, :reason, m.published_at, :now,
          m.headers, m.keep
        FROM {messages} m JOIN {groups} g ON g.group_id = m.group_id
        WHERE m.group_id = {text.g} ORDER BY m.seq
        """
    ),
    Sql("DELETE FROM {messages} WHERE group_id = {text.g}"),
    Sql(
        """
        UPDATE {groups} SET ready = {EMPTY.ready}, until = :retire, parked = {EMPTY.parked},
          attempts = 0, token = NULL, head = NULL
        WHERE group_id = {text.g} AND {not_empty}
        """
    ),
)


def cancel_batch(
    n: Names, group_id: str, reason: str, *, now: float, sharded: bool = False
) -> Batch:
    """Its messages that belong to batches are counted there as cancelled first (on shards,
    those of batches elsewhere through the outbox)."""
    g = {"g": as_json(group_id)}
    dead, gone, emptied = _CANCEL
    b = Builder()
    count_cancelled_group(b, n, group_id, now, sharded=sharded)
    b.add(dead(n), {**g, "reason": reason, "now": now}, slot="cancelled")
    b.add(gone(n), g)
    b.add(emptied(n), {**g, "retire": now + RETIRE_WINDOW})
    return b.build()


def cancel_group(
    core: QueueCore, group_id: str, reason: str, *, sharded: bool = False
) -> Plan[int]:
    check_id(group_id, "group_id")
    reason = check_reason(reason)
    batch = cancel_batch(core.names, group_id, reason, now=core.now(), sharded=sharded)
    # Not resent: a second application would also cancel what was published since.
    return Plan(batch, lambda reply: reply["cancelled"].rows_affected, empties_group=True)


# A group with messages (an empty group's next publish sets its priority afresh).
_PRIORITY = Sql("UPDATE {groups} SET priority = :p WHERE group_id = {text.g} AND {not_empty}")


def priority_batch(n: Names, group_id: str, priority: int) -> Batch:
    return single(_PRIORITY(n), {"g": as_json(group_id), "p": priority}, slot="changed")


def set_priority(core: QueueCore, group_id: str, priority: int) -> Plan[bool]:
    check_id(group_id, "group_id")
    check_int(priority, "priority", 0, MAX_PRIORITY)
    core.now()

    def read(reply: Reply) -> bool:
        return reply["changed"].rows_affected == 1

    return Plan(priority_batch(core.names, group_id, priority), read, resend_safe=True)


# Pause (or resume) every claim of the queue: the row of the empty token in `claims` (never
# pruned: it expires at `PAUSED_UNTIL`) makes a claim's `UPDATE` take nothing and the probe
# find nothing claimable.
_PAUSE = Sql("INSERT OR IGNORE INTO {claims} (token, expires_at) VALUES ('', :e)")
_RESUME = Sql("DELETE FROM {claims} WHERE token = ''")


def paused_batch(n: Names, paused: bool) -> Batch:
    b = Builder()
    if paused:
        b.add(_PAUSE(n), {"e": PAUSED_UNTIL})
    else:
        b.add(_RESUME(n))
    return b.build()


def set_paused(core: QueueCore, paused: bool) -> Plan[None]:
    core.now()
    return Plan(paused_batch(core.names, paused), nothing, resend_safe=True)


# ------------------------------------------------------------------------ dead letters

# A page of the dead letters in seq order, from after seq `:after` (keyset pagination: a range
# of the primary key).
_DEAD_PAGE = """
    SELECT seq, group_id, event, priority, attempts, reason, published_at, dead_at, headers
    FROM {dead} WHERE seq > :after {of_group} ORDER BY seq LIMIT :limit
    """
_DEAD = Sql(_DEAD_PAGE, of_group="")
_DEAD_OF_GROUP = Sql(_DEAD_PAGE, of_group=Sql("AND group_id = {text.g}"))


def dead_batch(n: Names, *, limit: int, group_id: str | None, after: int = 0) -> Batch:
    params: dict[str, Any] = {"after": after, "limit": limit}
    b = Builder(write=False)
    if group_id is None:
        b.add(_DEAD(n), params, slot="dead")
    else:
        b.add(_DEAD_OF_GROUP(n), {**params, "g": as_json(group_id)}, slot="dead")
    return b.build()


def dead_letters(
    core: QueueCore, limit: int, group_id: str | None, after: tuple[int, str] | None = None
) -> Plan[list[DeadLetter]]:
    """A page from after the cursor `after` (`sharding.parse_dead_cursor`). A sharded
    cursor's seq is read again on every shard (it comes after the cursor on the shards named
    after the cursor's; `sharding.dead_letters_of` drops it from the others)."""
    check_int(limit, "limit", 1, MAX_BATCH)
    if group_id is not None:
        check_id(group_id, "group_id")
    core.now()
    seq, shard = after if after is not None else (0, "")
    if shard:
        seq, limit = seq - 1, limit + 1

    def read(reply: Reply) -> list[DeadLetter]:
        return [
            DeadLetter(
                int(r[0]),
                str(r[1]),
                core.decode(str(r[2])),
                int(r[3]),
                int(r[4]),
                str(r[5]),
                float(r[6]),
                float(r[7]),
                headers=Headers.stored(r[8]),
            )
            for r in reply["dead"].rows
        ]

    return Plan(dead_batch(core.names, limit=limit, group_id=group_id, after=seq), read)


# Dead letters back at the tail of their groups (new seqs; the priority of the first when the
# group has to be created again), then gone from the dead letters; all of them, or the seqs
# `:seqs`.
_SEQS = Sql("WHERE seq IN (SELECT j.value FROM json_each(:seqs) j)")


@functools.cache
def _requeue(some: bool) -> tuple[Sql, ...]:
    which = _SEQS if some else ""
    return (
        Sql(
            """
            INSERT INTO {messages} (group_id, event, published_at, headers, keep)
            SELECT group_id, event, :now, headers, keep FROM {dead} {which} ORDER BY seq
            """,
            which=which,
        ),
        forget_expired(Sql("SELECT group_id FROM {dead} {which}", which=which)),
        upsert_groups(
            Sql(
                """
                SELECT min(seq) k, group_id g, max(priority) p, 0 d, NULL t FROM {dead} {which}
                GROUP BY group_id
                """,
                which=which,
            ),
            delays=False,
        ),
        Sql("DELETE FROM {dead} {which}", which=which),
    )


def requeue_batch(n: Names, seqs: Sequence[int] | None, *, now: float) -> Batch:
    params = {} if seqs is None else {"seqs": as_json(list(seqs))}
    back, forget, groups, gone = _requeue(seqs is not None)
    b = Builder()
    b.add(back(n), {**params, "now": now})
    b.add(forget(n), {**params, "now": now})
    b.add(groups(n), params)
    b.add(gone(n), params, slot="requeued")
    return b.build()


@functools.cache
def _purge(some: bool) -> Sql:
    return Sql("DELETE FROM {dead} {which}", which=_SEQS if some else "")


def purge_batch(n: Names, seqs: Sequence[int] | None) -> Batch:
    b = Builder()
    params = {} if seqs is None else {"seqs": as_json(list(seqs))}
    b.add(_purge(seqs is not None)(n), params, slot="purged")
    return b.build()


def requeue_dead(core: QueueCore, seqs: Sequence[int] | None) -> Plan[int]:
    batch = requeue_batch(core.names, check_seqs(seqs), now=core.now())
    return Plan(batch, lambda reply: reply["requeued"].rows_affected)


def purge_dead(core: QueueCore, seqs: Sequence[int] | None) -> Plan[int]:
    checked = check_seqs(seqs)
    core.now()
    return Plan(purge_batch(core.names, checked), lambda reply: reply["purged"].rows_affected)


def check_seqs(seqs: Sequence[int] | None) -> list[int] | None:
    if seqs is None:
        return None
    if not isinstance(seqs, list | tuple | range):
        raise InvalidArgument(f"seqs must be a list of ints, or None for all; got {show(seqs)}")
    seqs = list(seqs)
    if not seqs or len(seqs) > MAX_BATCH:
        raise InvalidArgument(f"seqs must name 1-{MAX_BATCH} dead letters, or be None for all")
    for s in seqs:
        check_int(s, "seq", 1, 2**63 - 1)
    return seqs


# ------------------------------------------------------------------------------ reads

# The counts (statements kept short: rqlite gzips one of 1 KiB or more, so the counters apart).
_COUNTS = Sql(
    """
    SELECT (SELECT count(*) FROM {messages}),
      (SELECT count(*) FROM {groups}) - (SELECT count(*) FROM {groups} WHERE {empty}),
      (SELECT count(*) FROM {groups} WHERE {leased} AND until > :now),
      (SELECT count(*) FROM {groups} WHERE {parked} AND until > :now),
      (SELECT count(*) FROM {dead}),
      (SELECT published_at FROM {messages} ORDER BY seq LIMIT 1),
      (SELECT count(*) FROM {groups} WHERE {held}),
      (SELECT count(*) FROM {messages} WHERE due > :now)
    """
)
# The groups waiting for a delayed head: a range of the busy index.
_DELAYED_GROUPS = Sql("SELECT count(*) FROM {groups} WHERE {delayed} AND until > :now")
_COUNTERS = Sql(
    """
    SELECT (SELECT value FROM {meta} WHERE "key" = 'expired'),
      EXISTS (SELECT 1 FROM {claims} WHERE token = ''),
      (SELECT seq FROM sqlite_sequence WHERE name = '{messages}'),
      (SELECT count(*) FROM {outbox}), (SELECT value FROM {meta} WHERE "key" = 'tenants'),
      (SELECT count(*) FROM {outcomes})
    """
)
# Per group, its range of the messages index (index-only, no table row read): 2.7x cheaper
# than joining every message to its group, at 1M messages in 100k groups. And the oldest head
# per priority, from the same range (its first entry): the seq, then once per priority the
# message's row.
_BY_PRIORITY = Sql(
    """
    SELECT priority, c, (SELECT published_at FROM {messages} WHERE seq = h) FROM (
      SELECT priority,
        sum((SELECT count(*) FROM {messages} m WHERE m.group_id = g.group_id)) c,
        min((SELECT min(seq) FROM {messages} m WHERE m.group_id = g.group_id)) h
      FROM {groups} g WHERE {not_empty} GROUP BY priority HAVING c > 0)
    ORDER BY priority
    """
)


_OPEN_BATCHES = Sql("SELECT {open_count}", open_count=OPEN_COUNT)


def stats_batch(n: Names, *, now: float) -> Batch:
    b = Builder(write=False)
    b.add(_COUNTS(n), {"now": now}, slot="counts")
    b.add(_DELAYED_GROUPS(n), {"now": now}, slot="delayed_groups")
    b.add(_COUNTERS(n), slot="counters")
    b.add(_BY_PRIORITY(n), slot="by_priority")
    b.add(_OPEN_BATCHES(n), slot="open_batches")
    return b.build()


def stats(core: QueueCore) -> Plan[Stats]:
    now = core.now()

    def read(reply: Reply) -> Stats:
        depth, groups, in_flight, parked, dead, oldest, held, delayed = reply["counts"].rows[0]
        expired, paused, last_seq, outbox, tenants_on, outcomes = reply["counters"].rows[0]
        return Stats(
            depth=int(depth),
            groups=int(groups),
            in_flight=int(in_flight),
            parked=int(parked),
            dead=int(dead),
            oldest_age=None if oldest is None else max(0.0, now - float(oldest)),
            by_priority={int(p): int(c) for p, c, _ in reply["by_priority"].rows},
            held=int(held),
            delayed=int(delayed),
            expired=int(expired or 0),
            paused=bool(paused),
            last_seq=int(last_seq or 0),
            outbox=int(outbox or 0),
            tenants_on=bool(tenants_on),
            outcomes=int(outcomes or 0),
            delayed_groups=int(reply["delayed_groups"].rows[0][0]),
            open_batches=int(reply["open_batches"].rows[0][0]),
            oldest_by_priority={
                int(p): max(0.0, now - float(at))
                for p, _, at in reply["by_priority"].rows
                if at is not None
            },
        )

    return Plan(stats_batch(core.names, now=now), read)


_PEEK = Sql("SELECT seq, event FROM {messages} WHERE group_id = {text.g} ORDER BY seq LIMIT :limit")


def peek_batch(n: Names, group_id: str, *, limit: int) -> Batch:
    return single(_PEEK(n), {"g": as_json(group_id), "limit": limit}, slot="messages", write=False)


def peek(core: QueueCore, group_id: str, limit: int) -> Plan[list[tuple[int, Any]]]:
    check_id(group_id, "group_id")
    check_int(limit, "limit", 1, MAX_BATCH)
    core.now()
    return Plan(
        peek_batch(core.names, group_id, limit=limit),
        lambda reply: [(int(r[0]), core.decode(str(r[1]))) for r in reply["messages"].rows],
    )
