"""The table of group states (`group_states`) is consistent, and the SQL rendered from it says
what the model's `shown` says: the dashboard, the stateful model and the statements read one
table, so a state changed there changes all three or fails here."""

from __future__ import annotations

import itertools
import sqlite3

import pytest

from rqlite_queue import group_states
from rqlite_queue._protocol import states

STATES = {s.name for s in (*group_states.FLOWS, *group_states.HOLDS)}


def test_every_transition_names_states_of_the_table() -> None:
    outside = {group_states.NEW, group_states.GONE}
    for t in group_states.TRANSITIONS:
        assert set(t.leaves) | set(t.enters) <= STATES | outside, t.event


def test_every_state_is_entered_and_left() -> None:
    entered = {s for t in group_states.TRANSITIONS for s in t.enters}
    left = {s for t in group_states.TRANSITIONS for s in t.leaves}
    assert entered >= STATES and left >= STATES


def test_the_states_encode_distinct_column_values() -> None:
    flows = [(f.ready, f.parked) for f in group_states.FLOWS]
    holds = [h.held for h in group_states.HOLDS]
    assert len(set(flows)) == len(flows) and len(set(holds)) == len(holds)


def test_the_shown_states_are_the_public_ones_and_each_has_a_meaning() -> None:
    assert set(group_states.MEANINGS) == set(group_states.GROUP_STATES)
    assert all(group_states.MEANINGS.values())


# Every listed row: `groups()` lists the groups with messages, and the held ones.
LISTED = [
    (flow, hold, lapsed)
    for flow, hold, lapsed in itertools.product(
        group_states.FLOWS, group_states.HOLDS, [False, True]
    )
    if flow is not group_states.EMPTY or hold is not group_states.FREE
]


@pytest.mark.parametrize(("flow", "hold", "lapsed"), LISTED)
def test_the_sql_shows_what_the_model_shows(
    flow: group_states.Flow, hold: group_states.Hold, lapsed: bool
) -> None:
    now, until = 100.0, 50.0 if lapsed else 150.0
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE groups (ready INTEGER, parked INTEGER, held INTEGER, until REAL)")
    db.execute(
        "INSERT INTO groups VALUES (?, ?, ?, ?)", (flow.ready, flow.parked, hold.held, until)
    )
    (shown_by_sql,) = db.execute(f"SELECT {states.WORDS['shown']} FROM groups g", {"now": now})
    assert shown_by_sql[0] == group_states.shown(flow, hold, until, now)
