"""A group's states, as data (in the manner of h11's `_state.py`): each state with the values
of the `groups` columns that encode it, and each transition with the states it leaves and
enters. The protocol renders its SQL from this table (`_protocol/states.py`), `types.
GROUP_STATES` and the dashboard show its names, and the contract's stateful model predicts
`groups()` with `shown`.

A group row has two independent parts: where its messages stand (`Flow`: the columns `ready`
and `parked`, with `until` ending the timed ones) and whether it is held (`Hold`: the column
`held`). A held group is never claimed, whatever its flow; a lease in flight on it finishes
normally."""

from __future__ import annotations

from typing import NamedTuple


class Flow(NamedTuple):
    name: str
    ready: int
    """`groups.ready`: 1 claimable, 0 busy until `until`, 2 empty."""
    parked: int
    """`groups.parked`, which tells the busy states apart."""
    meaning: str


READY = Flow("ready", 1, 0, "claimable: a claim may take its head")
LEASED = Flow("leased", 0, 0, "a worker holds its head until `until` (lapsed: ready again)")
PARKED = Flow("parked", 0, 1, "given back with a delay (a nack): claimable after `until`")
DELAYED = Flow("delayed", 0, 2, "its head is a delayed message, not due before `until`")
EMPTY = Flow(
    "empty",
    2,
    0,
    "no messages; its row (its place in the round robin) is kept until `until`, so that a "
    "group refilled soon after takes its place back",
)
FLOWS = (READY, LEASED, PARKED, DELAYED, EMPTY)
TIMED = (LEASED, PARKED, DELAYED)
"""The busy flows: each lasts until `until`; then the next claim makes the group ready."""


class Hold(NamedTuple):
    name: str
    held: int
    """`groups.held`."""
    meaning: str


FREE = Hold("free", 0, "not held")
HELD = Hold(
    "held",
    1,
    "an operator's hold (`hold_group`, or a dead letter that holds its group): never claimed "
    "until released",
)
WAITING = Hold(
    "waiting",
    2,
    "a group moving to this shard, held here until its old shard has delivered its messages "
    "(shown as held)",
)
HOLDS = (FREE, HELD, WAITING)

NEW = "new"
"""Not a state: a group without a row (never published to, or its empty row pruned)."""
GONE = "gone"
"""Not a state: the row deleted."""


class Transition(NamedTuple):
    event: str
    leaves: tuple[str, ...]
    enters: tuple[str, ...]
    how: str


TRANSITIONS = (
    Transition(
        "publish",
        (NEW, "empty"),
        ("ready", "delayed"),
        "a message creates or refills the group (delayed while its head is not due)",
    ),
    Transition("claim", ("ready",), ("leased",), "a claim leases its head"),
    Transition(
        "lapse",
        ("leased", "parked", "delayed"),
        ("ready",),
        "`until` has passed: the next claim makes it claimable again (a lapsed lease keeps "
        "its token: it may still be acked if nobody took the group over)",
    ),
    Transition(
        "finish",
        ("leased",),
        ("ready", "delayed", "empty"),
        "an ack or a dead letter: the next message becomes its head",
    ),
    Transition(
        "give back", ("leased",), ("ready", "parked"), "a nack: at once, or parked for a delay"
    ),
    Transition("extend", ("leased",), ("leased",), "a heartbeat: the lease lasts longer"),
    Transition(
        "debounce",
        ("ready", "delayed"),
        ("ready", "delayed"),
        "a debounced publish replaced its head, and with it the head's due time",
    ),
    Transition(
        "cancel",
        ("ready", "leased", "parked", "delayed"),
        ("empty",),
        "every message dead-lettered; the lease in flight fenced",
    ),
    Transition("retire", ("empty",), (GONE,), "the empty row pruned once `until` has passed"),
    Transition("hold", ("free",), ("held",), "`hold_group` (a group without a row gets one)"),
    Transition("release", ("held",), ("free",), "`release_group`"),
    Transition("wait", ("free",), ("waiting",), "a moving group's first publish on its new shard"),
    Transition("stop waiting", ("waiting",), ("free",), "its old shard has no messages left"),
)

SHOWN = (READY, LEASED, PARKED, DELAYED)
"""The flows `groups()` shows by name (an empty group is listed only when held)."""
GROUP_STATES = (*(flow.name for flow in SHOWN), HELD.name)
"""The values of `GroupInfo.state` (and of `groups(state=...)`)."""
MEANINGS = {**{flow.name: flow.meaning for flow in SHOWN}, HELD.name: HELD.meaning}
"""What each of GROUP_STATES means (the dashboard shows it)."""


def shown(flow: Flow, hold: Hold, until: float, now: float) -> str:
    """A group's state as `groups()` shows it: `held` first (a waiting group too), whatever
    else holds; then its lease, park or delayed head while not over (a lapsed one is `ready`:
    the next claim takes it)."""
    if hold is not FREE:
        return HELD.name
    if flow is READY or until <= now:
        return READY.name
    return flow.name
