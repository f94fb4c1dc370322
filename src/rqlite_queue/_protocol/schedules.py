"""Schedules: periodic publishes stored in the queue, each tick published once by whichever
client fires it first (the workers fire them between claims): the arguments of `schedule()`
and their check, the statements, and the plans."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..types import Schedule
from .cadence import check_cadence, missed, next_after
from .checks import MAX_SECONDS, check_bool, check_id, check_seconds
from .core import QueueCore
from .messages import Message, checked_message
from .names import Fields, Names, Sql, as_json
from .outcomes import check_keep
from .plan import NOTHING, Batch, Builder, Plan, Reply, changed_one, nothing, single
from .publish import forget_expired, upsert_groups
from .tenants import float_or_none


class ScheduleRow(NamedTuple):
    """A schedule as stored (its columns, in this order)."""

    name: str
    group_id: str
    event: str
    priority: int
    every: float | None
    cron: str | None
    catch_up: bool
    next_at: float
    keep: float | None = None
    """How long its ticks' messages keep their outcome (None: not kept)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """A periodic publish, as given to `schedule()`."""

    name: Any
    group_id: Any
    event: Any
    every: Any = None
    cron: Any = None
    priority: Any = 0
    catch_up: Any = False
    start_at: Any = None
    keep: Any = None

    def checked(
        self, now: float, encode: Callable[[Any], str], keep_default: float | None = None
    ) -> ScheduleRow:
        """The row to store: every field checked, the event encoded, the first tick set, how
        long its ticks keep their outcome (given, or `keep_default`; 0: not kept)."""
        check_id(self.name, "name")
        check_cadence(self.every, self.cron)
        check_bool(self.catch_up, "catch_up")
        message = Message(group_id=self.group_id, event=self.event, priority=self.priority)
        event = checked_message(message, now, encode, None).event
        if self.start_at is None:
            first = next_after(now, every=self.every, cron=self.cron, anchor=now)
        else:
            check_seconds(self.start_at, "start_at", allow_zero=True, high=now + MAX_SECONDS)
            first = float(self.start_at)
        return ScheduleRow(
            self.name,
            self.group_id,
            event,
            self.priority,
            self.every,
            self.cron,
            self.catch_up,
            first,
            keep_default if self.keep is None else check_keep(self.keep, allow_zero=True),
        )


class Fire(NamedTuple):
    """Publish `ticks` messages of schedule `name`, whose tick due at `due` moves to
    `next_at` (as its JSON item, `ticks` is a list of as many)."""

    name: str
    due: float
    next_at: float
    ticks: int


F = Fields("f", Fire._fields)
_COLUMNS = ", ".join(ScheduleRow._fields)

# `every` (seconds) or `cron` (an expression, UTC): one of them. `next_at`: the tick to
# publish next.
_PUT = Sql(
    """
    INSERT INTO {schedules} ({columns}, created_at)
    VALUES ({text.name}, {text.g}, {text.e}, :p, :every, :cron, :c, :next, :keep, :now)
    ON CONFLICT (name) DO UPDATE SET group_id = excluded.group_id, event = excluded.event,
      priority = excluded.priority, every = excluded.every, cron = excluded.cron,
      catch_up = excluded.catch_up, next_at = excluded.next_at, keep = excluded.keep
    """,
    columns=_COLUMNS,
)
_DROP = Sql("DELETE FROM {schedules} WHERE name = {text.name}")
_ALL = Sql("SELECT {columns} FROM {schedules} ORDER BY name", columns=_COLUMNS)
_DUE = Sql(
    "SELECT {columns} FROM {schedules} WHERE next_at <= :t ORDER BY next_at, name LIMIT :limit",
    columns=_COLUMNS,
)


def put_batch(n: Names, row: ScheduleRow, *, now: float) -> Batch:
    """Create or replace a schedule (its next tick is `row.next_at`)."""
    b = Builder()
    params = {
        "name": as_json(row.name),
        "g": as_json(row.group_id),
        "e": as_json(row.event),
        "p": row.priority,
        "every": row.every,
        "cron": row.cron,
        "c": int(row.catch_up),
        "next": row.next_at,
        "keep": row.keep,
        "now": now,
    }
    b.add(_PUT(n), params)
    return b.build()


def drop_batch(n: Names, name: str) -> Batch:
    return single(_DROP(n), {"name": as_json(name)}, slot="removed")


def list_batch(n: Names, *, due_by: float | None = None, limit: int = 1000) -> Batch:
    """Every schedule by name, or (with `due_by`) those due by then, earliest first (a
    leader-local read: a stale answer only delays a tick to the next look)."""
    b = Builder(write=False, local=due_by is not None)
    if due_by is None:
        b.add(_ALL(n), slot="schedules")
    else:
        b.add(_DUE(n), {"t": due_by, "limit": limit}, slot="schedules")
    return b.build()


def read_schedules(reply: Reply) -> list[ScheduleRow]:
    """The rows, typed: the columns of `ScheduleRow` in its order."""
    rows = []
    for row in reply["schedules"].rows:
        name, group, event, priority, every, cron, catch_up, next_at, keep = row
        cron_text = None if cron is None else str(cron)
        typed = (str(name), str(group), str(event), int(priority), float_or_none(every))
        rows.append(
            ScheduleRow(*typed, cron_text, bool(catch_up), float(next_at), float_or_none(keep))
        )
    return rows


# Every statement of a fire checks that the schedule's next tick is still the one read (`due`):
# of several clients firing the same tick, the first to commit publishes it and moves it on,
# and the others then find it moved and do nothing; a resend after a lost reply does nothing
# either.
_STILL_DUE = Sql("JOIN {schedules} s ON s.name = {f.name} AND s.next_at = {f.due}", f=F)
_FIRED = (
    forget_expired(Sql("SELECT s.group_id FROM json_each(:fires) f {due}", due=_STILL_DUE)),
    Sql(
        """
        INSERT INTO {messages} (group_id, event, published_at, keep)
        SELECT s.group_id, s.event, :now, s.keep FROM json_each(:fires) f {due}
          JOIN json_each(f.value, '$[{ticks}]') t
        ORDER BY f.key, t.key
        """,
        due=_STILL_DUE,
        ticks=str(Fire._fields.index("ticks")),
    ),
    upsert_groups(
        Sql(
            """
            SELECT f.key k, s.group_id g, s.priority p, 0 d, NULL t FROM json_each(:fires) f {due}
            """,
            due=_STILL_DUE,
        ),
        delays=False,
    ),
    Sql(
        """
        UPDATE {schedules} AS s SET next_at = {f.next_at} FROM json_each(:fires) f
        WHERE s.name = {f.name} AND s.next_at = {f.due}
        """,
        f=F,
    ),
)


def fire_batch(n: Names, fires: Sequence[Fire], *, now: float) -> Batch:
    """Publish the due ticks of these schedules and move each on, in one transaction."""
    items = as_json([[*f[:-1], list(range(f.ticks))] for f in fires])
    forget, published, groups, moved = _FIRED
    b = Builder()
    b.add(forget(n), {"fires": items, "now": now})
    b.add(published(n), {"fires": items, "now": now}, slot="published")
    b.add(groups(n), {"fires": items})
    b.add(moved(n), {"fires": items}, slot="moved")
    return b.build()


# ------------------------------------------------------------------------------ plans


def schedule(core: QueueCore, spec: ScheduleSpec) -> Plan[Schedule]:
    now = core.now()
    row = spec.checked(now, core.encode, core.keep)
    stored = _schedule(core, row)
    batch = put_batch(core.names, row, now=now)
    return Plan(batch, lambda reply: stored, resend_safe=True)


def put_row(core: QueueCore, row: ScheduleRow) -> Plan[None]:
    """Store a schedule row as it is (a sharded queue moving it to its group's shard)."""
    return Plan(put_batch(core.names, row, now=core.now()), nothing, resend_safe=True)


def _schedule(core: QueueCore, row: ScheduleRow) -> Schedule:
    return Schedule(
        row.name,
        row.group_id,
        core.decode(row.event),
        row.priority,
        row.every,
        row.cron,
        row.catch_up,
        row.next_at,
        row.keep,
    )


def unschedule(core: QueueCore, name: str) -> Plan[bool]:
    """Whether there was a schedule of that name."""
    check_id(name, "name")
    core.now()
    return changed_one(drop_batch(core.names, name), "removed")


def schedules(core: QueueCore) -> Plan[list[Schedule]]:
    core.now()
    return Plan(
        list_batch(core.names),
        lambda reply: [_schedule(core, row) for row in read_schedules(reply)],
    )


def due_schedules(core: QueueCore) -> Plan[list[ScheduleRow]]:
    """The schedules due now (a leader-local read)."""
    now = core.now()
    return Plan(list_batch(core.names, due_by=now), read_schedules)


def fire(core: QueueCore, due: Sequence[ScheduleRow]) -> Plan[int]:
    """Publish the due ticks of these schedules and move each on (one message for all the
    ticks missed, or one per tick with `catch_up`); returns how many messages went out. Safe
    to resend: a resend finds each schedule moved on and does nothing."""
    now = core.now()
    fires = []
    for row in due:
        if row.next_at <= now:
            count, next_at = missed(row.next_at, now, every=row.every, cron=row.cron)
            fires.append(Fire(row.name, row.next_at, next_at, count if row.catch_up else 1))

    def read(reply: Reply) -> int:
        return reply["published"].rows_affected if "published" in reply else 0

    batch = fire_batch(core.names, fires, now=now) if fires else NOTHING
    return Plan(batch, read, resend_safe=True)
