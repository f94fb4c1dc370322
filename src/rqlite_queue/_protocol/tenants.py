"""Tenants: each group belongs to one (`groups.tenant`, '' the default); `tenants` holds each
tenant's weight, its virtual time `vt` (the fair share's clock), its limits and, once tenants
are on (`meta.tenants`), `ready`, how many of its groups are claimable now.

Tenants are off until a call needs them (`set_tenant`, `set_tenant_rule`, a publish naming a
tenant): turning them on makes the indexes and triggers they need (`COUNTING`), so a queue
that never uses them pays nothing. A client learns that they are on from the last column of
a claim's rows and of a probe; a claim or a publish of a client that has not learnt it fails
on a tripwire (the row of token '*' in `claims`: `MARK`) and is made again, sharing by weight
within the limits (`TenantsTurnedOn`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

from ..errors import BackendError, InvalidArgument
from ..types import MAX_BATCH, TenantInfo
from .checks import check_int, check_tenant, show
from .core import QueueCore
from .names import Names, Sql, as_json
from .plan import Batch, Builder, Plan, Reply, nothing

PAUSED_UNTIL = 1e15
"""The expiry of the rows of `claims` that are marks, not tokens (the pause, tenants on): far
beyond any time, so pruning never drops them."""


class TenantsTurnedOn(BackendError):
    """A claim or a publish that assumed the queue's tenants off found them on (it changed
    nothing): the client now knows, and makes it again (never reaches the caller)."""


# A claimable group that a tenant gains (a trigger's): a tenant that gets claimable groups
# after having none starts at the queue's virtual time: it banks no credit.
_GAINS = Sql(
    """
    INSERT INTO {tenants} (name, ready, vt)
    SELECT new.tenant, 1, (SELECT value FROM {meta} WHERE "key" = 'vtime') WHERE {new.claimable}
    ON CONFLICT (name) DO UPDATE SET
      vt = CASE WHEN ready = 0 THEN max(vt, excluded.vt) ELSE vt END, ready = ready + 1;
    """
)
_LOSES = Sql("UPDATE {tenants} SET ready = ready - 1 WHERE name = old.tenant AND {old.claimable};")

COUNTING = (
    # The claimable groups per tenant (the fair claim walks it).
    Sql(
        "CREATE INDEX IF NOT EXISTS {groups_ready_by_tenant} ON {groups} (tenant, turn) "
        "WHERE {claimable}"
    ),
    # Groups by tenant (`tenants()` counts through it).
    Sql("CREATE INDEX IF NOT EXISTS {groups_by_tenant} ON {groups} (tenant)"),
    # A capped tenant's leases in flight are counted through it (at most its cap).
    Sql("CREATE INDEX IF NOT EXISTS {groups_busy_by_tenant} ON {groups} (tenant) WHERE {leased}"),
    # Triggers that keep each tenant's count of claimable groups exact, whatever statement
    # makes a group claimable or not, now and later.
    Sql(
        """
        CREATE TRIGGER IF NOT EXISTS {groups_in} AFTER INSERT ON {groups} WHEN {new.claimable}
        BEGIN {gains} END
        """,
        gains=_GAINS,
    ),
    Sql(
        """
        CREATE TRIGGER IF NOT EXISTS {groups_up} AFTER UPDATE OF ready, held, tenant ON {groups}
        WHEN ({old.claimable}) != ({new.claimable}) OR old.tenant != new.tenant
        BEGIN {loses} {gains} END
        """,
        gains=_GAINS,
        loses=_LOSES,
    ),
    Sql(
        "CREATE TRIGGER IF NOT EXISTS {groups_out} AFTER DELETE ON {groups} "
        "WHEN {old.claimable} BEGIN {loses} END",
        loses=_LOSES,
    ),
)
"""What tenants need once on."""

MARK = Sql(
    """
    INSERT OR IGNORE INTO {claims} (token, expires_at) SELECT '*', {forever} FROM {meta}
    WHERE "key" = 'tenants' AND value = 1
    """,
    forever=repr(PAUSED_UNTIL),
)
"""The row of token '*' in `claims` (never pruned) once tenants are on: a claim or a publish
of a client that has not learnt it fails (`TenantsTurnedOn`)."""

# Turning them on, once (each statement does nothing when they are on already): every tenant
# of a group gets its row and its count of claimable groups, which the triggers keep from then
# on. `f`: the flag's row while it is off, the outer loop of each statement: once they are on,
# it is empty and nothing is scanned.
_TURN_ON = (
    *COUNTING,
    Sql(
        """
        INSERT OR IGNORE INTO {tenants} (name, vt)
        SELECT DISTINCT all_groups.tenant, (SELECT value FROM {meta} WHERE "key" = 'vtime')
        FROM {meta} f JOIN {groups} all_groups WHERE f."key" = 'tenants' AND f.value = 0
        """
    ),
    Sql(
        """
        UPDATE {tenants} SET ready = (
          SELECT count(*) FROM {groups} g WHERE g.tenant = name AND {g.claimable})
        WHERE name IN (
          SELECT all_tenants.name FROM {meta} f JOIN {tenants} all_tenants
          WHERE f."key" = 'tenants' AND f.value = 0)
        """
    ),
    Sql("""UPDATE {meta} SET value = 1 WHERE "key" = 'tenants'"""),
)


def turn_on(b: Builder, n: Names) -> None:
    """Turn the queue's tenants on (nothing, if they are)."""
    for statement in (*_TURN_ON, MARK):
        b.add(statement(n))


BOUNDED = "max_queued IS NOT NULL OR max_group_queued IS NOT NULL"
"""A tenant with a bound on queued messages (a publish checks them only if there are)."""

# A tenant row `x`'s limits at `:now`, for one claim of at most `:n` groups.
BUCKET = Sql("min(x.burst, x.tokens + max(0, :now - x.stamp) * x.rate)")
"""The tokens in its bucket (refilled at its rate since `stamp`, up to its burst; a clock
behind `stamp` adds nothing)."""
ROOM = Sql(
    """
    CASE WHEN x.cap IS NULL THEN :n
    ELSE x.cap - (SELECT count(*) FROM {groups} b WHERE b.tenant = x.name AND {b.leased}) END
    """
)
"""How many more groups it may have in flight (`:n` when not capped)."""
ALLOWANCE = Sql(
    """
    min(:n, {room}, CASE WHEN x.rate IS NULL THEN :n ELSE CAST({bucket} + 1e-9 AS INTEGER) END)
    """,
    room=ROOM,
    bucket=BUCKET,
)
"""How many groups it may be given: at most `:n`, its cap less its leases in flight
(counted only when capped), the whole tokens its bucket holds (only when rate limited)."""


# --------------------------------------------------------------------------- settings

SETTINGS = ("weight", "cap", "rate", "burst", "max_queued", "max_group_queued")
"""The columns of a tenant's row that `set_tenant` sets (NULL: no limit)."""


def check_weight(weight: object) -> float:
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise InvalidArgument(f"weight must be a number, got {show(weight)}")
    if not 0.001 <= weight <= 1_000_000:
        raise InvalidArgument(f"weight must be in [0.001, 1000000], got {show(weight)}")
    return float(weight)


def settings(
    weight: object = None,
    rate: object = None,
    burst: object = None,
    max_in_flight: object = None,
    max_queued: object = None,
    max_group_queued: object = None,
) -> dict[str, float | None]:
    """`set_tenant`'s arguments as the columns to set: those given (None: keep as stored),
    `math.inf` standing for no limit (stored as NULL). A rate without a burst gets one
    second's worth (at least 1)."""
    given: dict[str, float | None] = {}
    if weight is not None:
        given["weight"] = check_weight(weight)
    if rate is not None:
        given["rate"] = _limit(rate, "rate", 0.001, 1_000_000, whole=False)
        if burst is None:  # one second's worth (no rate: no burst)
            per_second = given["rate"]
            given["burst"] = None if per_second is None else max(1.0, per_second)
    if burst is not None:
        if burst == math.inf:
            raise InvalidArgument("burst must be a number in [1, 1000000000], not inf")
        given["burst"] = _limit(burst, "burst", 1, 1_000_000_000, whole=False)
    for key, column, value in (
        ("max_in_flight", "cap", max_in_flight),
        ("max_queued", "max_queued", max_queued),
        ("max_group_queued", "max_group_queued", max_group_queued),
    ):
        if value is not None:
            given[column] = _limit(value, key, 0, 1_000_000_000, whole=True)
    if not given:
        raise InvalidArgument("set_tenant: give at least one setting")
    return given


def _limit(value: object, name: str, low: float, high: float, *, whole: bool) -> float | None:
    """A limit's value, None for `math.inf` (no limit)."""
    kinds = int if whole else int | float
    if value == math.inf and not isinstance(value, bool):
        return None
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        what = "a whole number" if whole else "a number"
        raise InvalidArgument(
            f"{name} must be {what} in [{low:g}, {high:g}] (or math.inf: no limit), "
            f"got {show(value)}"
        )
    return int(value) if whole else float(value)


@functools.cache
def _store(columns: tuple[str, ...]) -> Sql:
    """The upsert of a tenant's row that sets `columns` (one text per set of columns)."""
    return Sql(
        """
        INSERT INTO {tenants} (name, vt, {columns})
        VALUES ({text.t}, (SELECT value FROM {meta} WHERE "key" = 'vtime'), {values})
        ON CONFLICT (name) DO UPDATE SET {updates}
        """,
        columns=", ".join(columns),
        values=", ".join(f":{c}" for c in columns),
        updates=", ".join(f"{c} = excluded.{c}" for c in columns),
    )


def store(n: Names, tenant: str, given: Mapping[str, float | None], *, now: float) -> Batch:
    """Store some of a tenant's settings (`SETTINGS`; the others are kept; a tenant not
    stored weighs 1 and has no limits), turning tenants on. A new rate or burst fills the
    bucket."""
    if not given or not set(given) <= set(SETTINGS):
        raise ValueError(f"tenant settings: {sorted(given)}")
    values: dict[str, Any] = dict(given)
    if "rate" in values or "burst" in values:
        values["tokens"] = values.get("burst") or 0
        values["stamp"] = now
    b = Builder()
    turn_on(b, n)
    b.add(_store(tuple(values))(n), {"t": as_json(tenant), **values})
    return b.build()


def set_tenant(core: QueueCore, name: object, given: Mapping[str, float | None]) -> Plan[None]:
    """`store` a tenant's settings (safe to resend: it sets, it does not add)."""
    tenant = "" if name == "" else check_tenant(name)
    batch = store(core.names, tenant, given, now=core.now())
    return Plan(batch, nothing, resend_safe=True, tenants_on=True)


_SEPARATOR = Sql("""UPDATE {meta} SET value = :c WHERE "key" = 'tenant_sep'""")


def set_tenant_separator(core: QueueCore, separator: object) -> Plan[None]:
    """Groups created from now on without a tenant take the part of their id before the
    first `separator` (None: the default tenant)."""
    if separator is not None and (
        not isinstance(separator, str) or len(separator) != 1 or separator == "\0"
    ):
        raise InvalidArgument(
            f"the tenant separator is one character (or None), got {show(separator)}"
        )
    core.now()
    b = Builder()
    turn_on(b, core.names)
    b.add(_SEPARATOR(core.names), {"c": 0 if separator is None else ord(separator)})
    return Plan(b.build(), nothing, resend_safe=True, tenants_on=True)


# ------------------------------------------------------------------------------ the list

# A page of the tenants (stored ones: every tenant that had a group claimable, or was given a
# weight), by name, with their weight, claimable groups, groups with messages, leases in
# flight and messages (counted through the index of groups by tenant).
_PAGE = """
    SELECT x.name, x.weight,
      (SELECT count(*) FROM {groups} g WHERE g.tenant = x.name AND {g.not_empty} AND {g.claimable}),
      (SELECT count(*) FROM {groups} g WHERE g.tenant = x.name AND {g.not_empty}),
      (SELECT count(*) FROM {groups} g WHERE g.tenant = x.name AND {g.not_empty} AND {g.leased}
        AND g.token IS NOT NULL AND g.until > :now),
      (SELECT count(*) FROM {messages} m WHERE m.group_id IN (
        SELECT g.group_id FROM {groups} g WHERE g.tenant = x.name AND {g.not_empty})),
      x.rate, x.burst, CASE WHEN x.rate IS NOT NULL THEN {bucket} END, x.cap,
      x.max_queued, x.max_group_queued
    FROM {tenants} x WHERE {after} ORDER BY x.name LIMIT :limit
    """
_FIRST_PAGE = Sql(_PAGE, bucket=BUCKET, after="true")
_NEXT_PAGE = Sql(_PAGE, bucket=BUCKET, after=Sql("x.name > {text.a}"))


def tenants(core: QueueCore, limit: int, after: object) -> Plan[list[TenantInfo]]:
    check_int(limit, "limit", 1, MAX_BATCH)
    start = None if after is None else check_tenant(after)
    params: dict[str, Any] = {"now": core.now(), "limit": limit}
    b = Builder(write=False)
    if start is None:
        b.add(_FIRST_PAGE(core.names), params, slot="tenants")
    else:
        b.add(_NEXT_PAGE(core.names), {**params, "a": as_json(start)}, slot="tenants")
    return Plan(b.build(), read_tenants)


def read_tenants(reply: Reply) -> list[TenantInfo]:
    return [
        TenantInfo(
            str(r[0]),
            float(r[1]),
            int(r[2]),
            int(r[3]),
            int(r[4]),
            int(r[5]),
            rate=float_or_none(r[6]),
            burst=float_or_none(r[7]),
            tokens=float_or_none(r[8]),
            max_in_flight=int_or_none(r[9]),
            max_queued=int_or_none(r[10]),
            max_group_queued=int_or_none(r[11]),
        )
        for r in reply["tenants"].rows
    ]


def float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)
