"""The group states of `group_states` as SQL: the words the statements are written with.

A statement says `WHERE {claimable}` or `WHERE {g.leased}` (of the groups row aliased `g`),
`SET {to_ready}`, or `THEN {DELAYED.ready}`; `names.Sql` renders them once, from the table,
so that no column value of a state is written by hand anywhere else."""

from __future__ import annotations

from ..group_states import (
    DELAYED,
    EMPTY,
    FREE,
    HELD,
    LEASED,
    PARKED,
    READY,
    SHOWN,
    TIMED,
    WAITING,
)

(BUSY,) = {flow.ready for flow in TIMED}
"""`groups.ready` of every timed flow (the busy index's condition): one value."""


def _predicates(row: str) -> dict[str, str]:
    """The conditions on a groups row, its columns prefixed with `row`."""
    r = row
    return {
        # Claimable: ready, and not held. (The partial indexes of ready groups have this very
        # condition: a statement that says it uses them.)
        "claimable": f"{r}ready = {READY.ready} AND {r}held = {FREE.held}",
        "busy": f"{r}ready = {BUSY}",
        "empty": f"{r}ready = {EMPTY.ready}",
        "not_empty": f"{r}ready != {EMPTY.ready}",
        "leased": f"{r}ready = {LEASED.ready} AND {r}parked = {LEASED.parked}",
        "parked": f"{r}ready = {PARKED.ready} AND {r}parked = {PARKED.parked}",
        "delayed": f"{r}ready = {DELAYED.ready} AND {r}parked = {DELAYED.parked}",
        "free": f"{r}held = {FREE.held}",
        "held": f"{r}held != {FREE.held}",
        "waiting": f"{r}held = {WAITING.held}",
    }


class Row:
    """The conditions on the groups row aliased `alias` (`{g.claimable}`)."""

    def __init__(self, alias: str) -> None:
        self.__dict__.update(_predicates(alias + "."))


def _shown(row: str) -> str:
    """`group_states.shown` as an SQL expression over the groups row `row`, at `:now`."""
    busy = " ".join(
        f"WHEN {row}.parked = {flow.parked} THEN '{flow.name}'" for flow in SHOWN if flow in TIMED
    )
    return (
        f"CASE WHEN {row}.held != {FREE.held} THEN '{HELD.name}' WHEN {row}.ready = "
        f"{READY.ready} OR {row}.until <= :now THEN '{READY.name}' {busy} END"
    )


WORDS: dict[str, object] = {
    **_predicates(""),
    **{alias: Row(alias) for alias in ("g", "b", "h", "new", "old")},
    **{flow.name.upper(): flow for flow in (READY, LEASED, PARKED, DELAYED, EMPTY)},
    **{hold.name.upper(): hold for hold in (FREE, HELD, WAITING)},
    "to_ready": f"ready = {READY.ready}, parked = {READY.parked}",
    "shown": _shown("g"),
}
"""Every word of the states that `names.Sql` knows."""
