"""The probe: the read that tells an idle worker whether a claim would find anything (and
when to look again), without a Raft write."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..types import MAX_PRIORITY, Probe
from .checks import check_int
from .core import QueueCore
from .names import Names, Sql
from .plan import Batch, Builder, Plan, Reply
from .tenants import ALLOWANCE, ROOM, float_or_none

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


def read_tenants_on(reply: Reply) -> bool | None:
    """Whether the queue's tenants are on, as the probe's last column says (None: no row)."""
    rows = reply["probe"].rows
    return bool(rows[0][-1]) if rows else None


# ------------------------------------------------------------------------------- the plan


def plan(
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
