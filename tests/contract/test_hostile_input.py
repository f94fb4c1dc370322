"""Hostile input: every argument of every public call of the transport, fed what it must refuse,
on every backend, sync and async (docs/contract.md, "Bad input": clear typed errors, nothing
written).

Each row of `HOSTILE` is a call and the error it must raise, with its arguments (`Arg`) left
open one at a time and the values to try there. Every value must raise that error: a
`QueueError` (`InvalidArgument`, `EncodeError`, `PayloadTooLarge`, `LeaseLost`), never a bare
ValueError, TypeError, UnicodeEncodeError, RecursionError or sqlite3 error, with a message that
is valid UTF-8 and short (an error that echoes a 10 MB argument floods the logs). And it must
write nothing: the queue's stats are compared after each value that reached the backend, and a
whole snapshot (stats, probe, dead letters, the messages of the groups involved, then a claim
of everything) at the end of the row. A failure lists every offending value.

`test_every_call_after_close_raises_transport_closed` and
`test_legitimate_extremes_are_accepted_and_kept_exactly` (the other side: what must *not* be
refused, nor silently changed) follow the table."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pydantic
import pytest

from rqlite_queue import InvalidArgument, Lease, LeaseLost, QueueError
from rqlite_queue._protocol.checks import MAX_ID_BYTES, MAX_SECONDS
from rqlite_queue._protocol.round_spec import MAX_REASON_BYTES
from rqlite_queue.codec import JsonCodec, RawCodec
from rqlite_queue.errors import EncodeError, PayloadTooLarge, TransportClosed
from rqlite_queue.testing import Cluster
from rqlite_queue.types import MAX_BATCH, Round

from .conftest import FakeClock, MakeQueue, backend_url

MAX_MESSAGE = 2_000
"""Longest error message accepted: long enough for any explanation, far too short to hold a
10 MB argument."""

# ---------------------------------------------------------------------------- fixtures

_followers: dict[int, str] = {}


@pytest.fixture
def url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The contract suite's `url`, except that the follower of the 3-node cluster is looked up
    once per session rather than once per test (that lookup polls every node and would make
    this module's hundreds of tests several times slower). Should leadership move meanwhile,
    the tests still run, through the new leader."""
    if backend != "rqlite3-follower":
        return backend_url(backend, request, tmp_path)
    cluster: Cluster = request.getfixturevalue("rqlite_cluster3")
    if id(cluster) not in _followers:
        _followers[id(cluster)] = cluster.followers()[0].http_url
    return _followers[id(cluster)]


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock that starts at the real time, not at conftest's fixed date: rqlite
    transports compare their clock with the nodes' (the `Date` of their replies) and refuse
    leases (ClockSkew) when it is off by more than a quarter of the visibility. It stands
    still, so snapshots taken a moment apart are equal."""
    return FakeClock(time.time())


# ------------------------------------------------------------------- the starting state

GROUPS = ("a", "g")
"""The groups whose messages a snapshot lists: `a` (the leased group) and `g`, where hostile
publishes aim (it stays empty). `b` is checked by the final claim, `d` by `dead_letters`."""


@dataclasses.dataclass(frozen=True)
class World:
    """The queue every test starts from: group `a` leased (`lease` holds `a1`; `a2` waits
    behind it), group `b` claimable (`b1`, claimed once and given back), and group `d`'s only
    message dead-lettered (seq `dead_seq`)."""

    lease: Lease
    b_seq: int
    dead_seq: int


async def make_world(q: Any) -> World:
    # With dedup ids, the transport may resend the publish should its reply be lost.
    messages = [("d", "d1"), ("a", "a1"), ("a", "a2"), ("b", "b1")]
    seqs = await q.publish_many([{"group_id": g, "event": e, "dedup_id": e} for g, e in messages])
    leases = {lease.group_id: lease for lease in await q.claim_many("w", 30, 3)}
    assert sorted(leases) == ["a", "b", "d"]
    done = await q.settle_and_claim(dead=[(leases["d"], "poison")], nack=[(leases["b"], 0)])
    assert done.lost == []
    return World(leases["a"], b_seq=seqs[3], dead_seq=seqs[0])


async def snapshot(q: Any) -> tuple[Any, ...]:
    return (
        await q.stats(),
        await q.probe(),
        await q.dead_letters(),
        await q.groups(),
        *[await q.peek(group) for group in GROUPS],
    )


async def assert_world_unchanged(q: Any, world: World, before: tuple[Any, ...]) -> None:
    """The snapshot is as it was, and a claim of everything finds exactly `b1` (`a` is still
    leased, `d` still dead, and no group appeared)."""
    assert await snapshot(q) == before
    claimed = await q.claim_many("check", 30, 100)
    assert [(x.seq, x.group_id, x.event, x.attempts) for x in claimed] == [
        (world.b_seq, "b", "b1", 2)
    ]


# ---------------------------------------------------------------------- hostile values


@dataclasses.dataclass(frozen=True)
class FromWorld:
    """A value made from the test's `World` (a lease with a field changed, the dead seq...)."""

    make: Callable[[World], Any]


def forge(lease: Lease, **fields: Any) -> Lease:
    """A copy of `lease` with these fields, of whatever type."""
    return dataclasses.replace(lease, **fields)


def lease_with(**fields: Any) -> FromWorld:
    """The world's lease with these fields replaced. A callable replaces the field with itself
    applied to the field's own value: `seq=str` is the right seq as a str."""

    def make(world: World) -> Lease:
        lease = world.lease
        changes = {k: v(getattr(lease, k)) if callable(v) else v for k, v in fields.items()}
        return forge(lease, **changes)

    return FromWorld(make)


def in_a_list(value: FromWorld) -> FromWorld:
    return FromWorld(lambda w: [value.make(w)])


BIG = "x" * 10_000_000
"""10 MB of text."""
MB = "x" * 1_000_000
LONE = "\ud800"
"""A lone surrogate: a str that no UTF-8 encoder accepts."""
NAN, INF = math.nan, math.inf


def _nested(depth: int) -> list[Any]:
    outer: list[Any] = []
    inner = outer
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return outer


CIRCULAR: list[Any] = []
CIRCULAR.append(CIRCULAR)


class AModel(pydantic.BaseModel):
    x: int


@dataclasses.dataclass(frozen=True)
class LookAlike:
    """Has every field of a `Lease`, but is not one."""

    seq: int
    group_id: str
    event: Any
    token: str
    attempts: int
    expires_at: float
    shard: str
    headers: Any
    keep: Any
    batch: Any


WRONG_TYPES: dict[str, Any] = {
    "None": None,
    "True": True,
    "False": False,
    "str": "1",
    "bytes": b"1",
    "list": [1],
    "dict": {"1": 1},
    "object": object(),
    "complex": 1j,
}
NOT_FINITE = {"nan": NAN, "+inf": INF, "-inf": -INF}
HUGE = {"1e300": 1e300, "2**70": 2**70, "-2**70": -(2**70), "-1e300": -1e300}


def ints_outside(low: int, high: int) -> dict[str, Any]:
    """What an int argument in [low, high] must refuse."""
    return {
        **WRONG_TYPES,
        "float 1.0": 1.0,
        "float 2.5": 2.5,
        **NOT_FINITE,
        **HUGE,
        "-1": -1,
        str(low - 1): low - 1,
        str(high + 1): high + 1,
    }


def seconds_refused(*, zero_ok: bool) -> dict[str, Any]:
    """What a number of seconds (> 0, or >= 0 with `zero_ok`; at most a year) must refuse."""
    refused = {
        **WRONG_TYPES,
        **NOT_FINITE,
        **HUGE,
        "-1": -1,
        "-1e-9": -1e-9,
        "a year and a second": MAX_SECONDS + 1,
    }
    if not zero_ok:
        refused |= {"0": 0, "0.0": 0.0, "-0.0": -0.0}
    return refused


NOT_TEXT: dict[str, Any] = {
    "None": None,
    "int": 7,
    "True": True,
    "float": 1.5,
    "bytes": b"g",
    "list": ["g"],
    "dict": {"g": 1},
    "object": object(),
}
BAD_TEXT: dict[str, Any] = {
    "lone surrogate": LONE,
    "surrogate inside": "g\udfffg",
    "lone low surrogate": "\udc80",
    "10 MB": BIG,
}
NOT_AN_ID = {
    **NOT_TEXT,
    **BAD_TEXT,
    "empty": "",
    "one byte too long": "é" * (MAX_ID_BYTES // 2) + "x",
}
NOT_A_DEDUP_ID = {k: v for k, v in NOT_AN_ID.items() if k != "None"}  # None: no dedup id
NOT_A_CURSOR = {
    **{k: v for k, v in NOT_TEXT.items() if k != "None"},  # None: the first page
    **BAD_TEXT,
    "empty": "",
    "the dead seq as an int": FromWorld(lambda w: w.dead_seq),
    "negative": "-1",
    "a shard alone": "a/",
    "a bad shard name": "A/1",
    "19 digits": "9" * 19,
    "spaces": " 1",
}
NOT_A_REASON = {
    **NOT_TEXT,
    **BAD_TEXT,
    "one byte too long": "r" * (MAX_REASON_BYTES + 1),
}

NOT_A_LEASE: dict[str, Any] = {
    "None": None,
    "str": "lease",
    "int": 1,
    "bytes": b"lease",
    "object": object(),
    "a dict of its fields": FromWorld(lambda w: dataclasses.asdict(w.lease)),
    "a tuple of its fields": FromWorld(lambda w: dataclasses.astuple(w.lease)),
    "a list holding it": FromWorld(lambda w: [w.lease]),
    "a look-alike class": FromWorld(lambda w: LookAlike(**dataclasses.asdict(w.lease))),
    # hand-made leases, with wrong field types or values
    "seq None": lease_with(seq=None),
    "seq as str": lease_with(seq=str),
    "seq as float": lease_with(seq=float),
    "seq True": lease_with(seq=True),
    "seq 0": lease_with(seq=0),
    "seq -1": lease_with(seq=-1),
    "seq nan": lease_with(seq=NAN),
    "seq 2**63": lease_with(seq=2**63),
    "seq 2**70": lease_with(seq=2**70),
    "group_id None": lease_with(group_id=None),
    "group_id as bytes": lease_with(group_id=str.encode),
    "group_id empty": lease_with(group_id=""),
    "group_id with a lone surrogate": lease_with(group_id=lambda g: g + LONE),
    "group_id of 10 MB": lease_with(group_id=BIG),
    "token None": lease_with(token=None),
    "token as bytes": lease_with(token=str.encode),
    "token empty": lease_with(token=""),
    "token with a lone surrogate": lease_with(token=lambda t: t + LONE),
    "token of 10 MB": lease_with(token=BIG),
}
FORGED_LEASES: dict[str, Any] = {
    "another token": lease_with(token="w:forged"),
    "another group": lease_with(group_id="b"),
    "the next message's seq": lease_with(seq=lambda s: s + 1),
    "the dead letter's seq and group": FromWorld(
        lambda w: forge(w.lease, seq=w.dead_seq, group_id="d")
    ),
    "seq 2**63 - 1": lease_with(seq=2**63 - 1),
}
NOT_A_LEASE_LIST: dict[str, Any] = {
    "None": None,
    "a lease, not a list": FromWorld(lambda w: w.lease),
    "str": "leases",
    "bytes": b"leases",
    "int": 3,
    "object": object(),
    "[None]": [None],
    "[str]": ["lease"],
    "[a dict of its fields]": FromWorld(lambda w: [dataclasses.asdict(w.lease)]),
    "[the lease, None]": FromWorld(lambda w: [w.lease, None]),
    "[the lease, one with seq as str]": FromWorld(
        lambda w: [w.lease, forge(w.lease, seq=str(w.lease.seq))]
    ),
    "[one with a lone surrogate in its token]": FromWorld(
        lambda w: [forge(w.lease, token=w.lease.token + LONE)]
    ),
}
NOT_NACK_PAIRS: dict[str, Any] = {
    "a pair, not a list of pairs": FromWorld(lambda w: (w.lease, 0)),
    "str": "ab",
    "bytes": b"ab",
    "[the lease]": FromWorld(lambda w: [w.lease]),
    "[(the lease,)]": FromWorld(lambda w: [(w.lease,)]),
    "[(the lease, 0, 0)]": FromWorld(lambda w: [(w.lease, 0, 0)]),
    "[(the lease, None)]": FromWorld(lambda w: [(w.lease, None)]),
    "[(the lease, '0')]": FromWorld(lambda w: [(w.lease, "0")]),
    "[(the lease, nan)]": FromWorld(lambda w: [(w.lease, NAN)]),
    "[(the lease, inf)]": FromWorld(lambda w: [(w.lease, INF)]),
    "[(the lease, -1)]": FromWorld(lambda w: [(w.lease, -1)]),
    "[(the lease, 1e300)]": FromWorld(lambda w: [(w.lease, 1e300)]),
    "[(None, 0)]": [(None, 0)],
    "[(a lease with seq as str, 0)]": FromWorld(
        lambda w: [(forge(w.lease, seq=str(w.lease.seq)), 0)]
    ),
}
NOT_DEAD_PAIRS: dict[str, Any] = {
    "a pair, not a list of pairs": FromWorld(lambda w: (w.lease, "why")),
    "str": "ab",
    "[the lease]": FromWorld(lambda w: [w.lease]),
    "[(the lease,)]": FromWorld(lambda w: [(w.lease,)]),
    "[(the lease, None)]": FromWorld(lambda w: [(w.lease, None)]),
    "[(the lease, 1)]": FromWorld(lambda w: [(w.lease, 1)]),
    "[(the lease, b'why')]": FromWorld(lambda w: [(w.lease, b"why")]),
    "[(the lease, lone surrogate)]": FromWorld(lambda w: [(w.lease, LONE)]),
    "[(the lease, 10 MB)]": FromWorld(lambda w: [(w.lease, BIG)]),
    "[(None, 'why')]": [(None, "why")],
    "[(a lease with token None, 'why')]": FromWorld(
        lambda w: [(forge(w.lease, token=None), "why")]
    ),
}
NOT_SEQS: dict[str, Any] = {
    "str": "1",
    "bytes": b"\x01",
    "int": FromWorld(lambda w: w.dead_seq),
    "float": 1.0,
    "object": object(),
    "[]": [],
    "[0]": [0],
    "[-1]": [-1],
    "[True]": [True],
    "[the seq as str]": FromWorld(lambda w: [str(w.dead_seq)]),
    "[the seq as float]": FromWorld(lambda w: [float(w.dead_seq)]),
    "[nan]": [NAN],
    "[None]": [None],
    "[2**63]": [2**63],
    "[2**70]": [2**70],
    "[the dead seq, 'x']": FromWorld(lambda w: [w.dead_seq, "x"]),
    "[the dead seq, 0]": FromWorld(lambda w: [w.dead_seq, 0]),
    f"{MAX_BATCH + 1} seqs": list(range(1, MAX_BATCH + 2)),
}
SEQS_AS_KEYS_OR_BYTES: dict[str, Any] = {
    "{the dead seq: 'x'}": FromWorld(lambda w: {w.dead_seq: "x"}),
    "bytearray([the dead seq])": FromWorld(lambda w: bytearray([w.dead_seq])),
}
NOT_PUBLISH_ITEMS: dict[str, Any] = {
    "None": None,
    "str": "g",
    "bytes": b"g",
    "int": 1,
    "object": object(),
    "one item, not a list": ("g", "e"),
    "one mapping item, not a list": {"group_id": "g", "event": "e"},
    "[None]": [None],
    "[str]": ["g"],
    "[(g,)]": [("g",)],
    "[(g, e, 0, extra)]": [("g", "e", 0, "x")],
    "[('', e)]": [("", "e")],
    "[(None, e)]": [(None, "e")],
    "[(b'g', e)]": [(b"g", "e")],
    "[(lone surrogate, e)]": [(LONE, "e")],
    "[(10 MB, e)]": [(BIG, "e")],
    "[(g, e, None)]": [("g", "e", None)],
    "[(g, e, True)]": [("g", "e", True)],
    "[(g, e, '1')]": [("g", "e", "1")],
    "[(g, e, nan)]": [("g", "e", NAN)],
    "[(g, e, 5)]": [("g", "e", 5)],
    "[(g, e, 2**70)]": [("g", "e", 2**70)],
    "[{group_id}]": [{"group_id": "g"}],
    "[{event}]": [{"event": "e"}],
    "[{group_id, event, extra}]": [{"group_id": "g", "event": "e", "extra": 1}],
    "[{..., priority: None}]": [{"group_id": "g", "event": "e", "priority": None}],
    "[{..., dedup_id: ''}]": [{"group_id": "g", "event": "e", "dedup_id": ""}],
    "[{..., dedup_id: 7}]": [{"group_id": "g", "event": "e", "dedup_id": 7}],
    "[{..., dedup_id: lone surrogate}]": [{"group_id": "g", "event": "e", "dedup_id": LONE}],
    "[{..., dedup_id: 10 MB}]": [{"group_id": "g", "event": "e", "dedup_id": BIG}],
    "[{group_id: 1, event}]": [{"group_id": 1, "event": "e"}],
    "a good item, then a bad one": [("g", "e"), ("", "e")],
    "a good mapping, then a bad one": [{"group_id": "g", "event": "e"}, {"group_id": "g"}],
}
NOT_JSON: dict[str, Any] = {
    "object": object(),
    "a class": object,
    "nan": NAN,
    "+inf": INF,
    "-inf": -INF,
    "nan deep inside": {"k": [1, {"j": NAN}]},
    "set": {1},
    "bytes": b"e",
    "complex": 1j,
    "a dict with tuple keys": {(1, 2): 3},
    "lone surrogate": LONE,
    "surrogate inside": "e\udfffe",
    "surrogate in a key": {LONE: 1},
    "surrogate deep inside": {"k": [1, {"j": "x\udc00"}]},
    "a circular list": CIRCULAR,
    "an int of 5000 digits": 10**5000,
    "a pydantic model": AModel(x=1),
}
NOT_RAW: dict[str, Any] = {
    "None": None,
    "int": 1,
    "float": 1.5,
    "True": True,
    "list": ["x"],
    "dict": {"x": 1},
    "object": object(),
    "lone surrogate": LONE,
    "surrogate inside": "e\udfffe",
}


@dataclasses.dataclass(frozen=True)
class Raises:
    """An event `HostileCodec` fails to encode, with this exception."""

    error: Exception


@dataclasses.dataclass(frozen=True)
class EncodesTo:
    """An event `HostileCodec` encodes to this (not necessarily a str)."""

    text: Any


class HostileCodec(JsonCodec):
    """A user's codec: JSON, except for `Raises` and `EncodesTo` events."""

    def encode(self, payload: Any) -> str:
        if isinstance(payload, Raises):
            raise payload.error
        if isinstance(payload, EncodesTo):
            return payload.text  # type: ignore[no-any-return]
        return super().encode(payload)


DEDUP_KEYS = dict(NOT_A_DEDUP_ID)
"""What `dedup_key_of` returns for an event `{"key": label}`."""


def dedup_key_of(event: Any) -> Any:
    """A transport's `dedup_key` that returns hostile ids: the event names which (its other
    events have no key)."""
    if not isinstance(event, dict):
        return None
    if event["key"] == "raises":
        raise RuntimeError("this event has no key")
    return DEDUP_KEYS[event["key"]]


# ------------------------------------------------------------------------------ the table

Run = Callable[[Any, World, Any], Awaitable[Any]]


@dataclasses.dataclass(frozen=True)
class Arg:
    """One argument of a call, left open: `run(q, world, value)` makes the call with `value`
    there (and good values elsewhere); `values` are what it must refuse."""

    name: str
    values: Mapping[str, Any]
    run: Run


def row(
    call: str,
    *args: Arg,
    error: type[QueueError] = InvalidArgument,
    options: Mapping[str, Any] | None = None,
) -> Any:
    """`call` raises `error` for every value of every `args`, on a transport opened with
    `options`."""
    test_id = f"{call} -> {error.__name__}"
    return pytest.param(args, error, dict(options or {}), id=test_id)


HOSTILE = [
    row(
        "publish",
        Arg("group_id", NOT_AN_ID, lambda q, w, v: q.publish(v, "e")),
        Arg("priority", ints_outside(0, 4), lambda q, w, v: q.publish("g", "e", v)),
        Arg("dedup_id", NOT_A_DEDUP_ID, lambda q, w, v: q.publish("g", "e", dedup_id=v)),
    ),
    row(
        "publish(event), JSON",
        Arg("event", NOT_JSON, lambda q, w, v: q.publish("g", v)),
        error=EncodeError,
    ),
    row(
        "publish(event), JSON",
        Arg(
            "event",
            {"10 MB string": BIG, "2 MB in 2000 pieces": ["x" * 1000] * 2000},
            lambda q, w, v: q.publish("g", v),
        ),
        error=PayloadTooLarge,
    ),
    row(
        "publish(event), JSON, nested too deep",
        Arg("event", {"nested 100 000 deep": _nested(100_000)}, lambda q, w, v: q.publish("g", v)),
        error=EncodeError,
    ),
    row(
        "publish(event), RawCodec",
        Arg("event", NOT_RAW, lambda q, w, v: q.publish("g", v)),
        error=EncodeError,
        options={"codec": RawCodec()},
    ),
    row(
        "publish(event), RawCodec",
        Arg(
            "event",
            {"10 MB str": BIG, "10 MB bytes": BIG.encode()},
            lambda q, w, v: q.publish("g", v),
        ),
        error=PayloadTooLarge,
        options={"codec": RawCodec()},
    ),
    row(
        "publish(event), a codec that encodes to something else than text",
        Arg(
            "event",
            {
                "bytes": EncodesTo(b"e"),
                "None": EncodesTo(None),
                "int": EncodesTo(1),
                "a lone surrogate": EncodesTo(LONE),
            },
            lambda q, w, v: q.publish("g", v),
        ),
        error=EncodeError,
        options={"codec": HostileCodec()},
    ),
    row(
        "publish(event), a codec whose encode raises its own error",
        Arg(
            "event",
            {
                "TypeError": Raises(TypeError("not serialisable")),
                "ValueError": Raises(ValueError("out of range")),
                "KeyError": Raises(KeyError("k")),
                "RuntimeError": Raises(RuntimeError("codec bug")),
            },
            lambda q, w, v: q.publish("g", v),
        ),
        error=EncodeError,
        options={"codec": HostileCodec()},
    ),
    row(
        "publish(event), a dedup_key that returns a bad id or raises",
        Arg(
            "event",
            {label: {"key": label} for label in [*DEDUP_KEYS, "raises"]},
            lambda q, w, v: q.publish("g", v),
        ),
        options={"dedup_key": dedup_key_of},
    ),
    row(
        "publish_many",
        Arg("items", NOT_PUBLISH_ITEMS, lambda q, w, v: q.publish_many(v)),
        Arg(
            "items",
            {f"{MAX_BATCH * 10 + 1} items": [("g", "e")] * (MAX_BATCH * 10 + 1)},
            lambda q, w, v: q.publish_many(v),
        ),
    ),
    row(
        "publish_many",
        Arg(
            "items",
            {
                "[(g, object())]": [("g", object())],
                "[(g, nan)]": [("g", NAN)],
                "[(g, lone surrogate)]": [("g", LONE)],
                "[(g, e), (g, {1j})]": [("g", "e"), ("g", {"k": 1j})],
            },
            lambda q, w, v: q.publish_many(v),
        ),
        error=EncodeError,
    ),
    row(
        "claim",
        Arg("worker_id", NOT_AN_ID, lambda q, w, v: q.claim(v, 30)),
        Arg("visibility", seconds_refused(zero_ok=False), lambda q, w, v: q.claim("w", v)),
        Arg("min_priority", ints_outside(0, 4), lambda q, w, v: q.claim("w", 30, v)),
    ),
    row(
        "claim_many",
        Arg("worker_id", NOT_AN_ID, lambda q, w, v: q.claim_many(v, 30, 2)),
        Arg(
            "visibility",
            seconds_refused(zero_ok=False),
            lambda q, w, v: q.claim_many("w", v, 2),
        ),
        Arg("n", ints_outside(1, MAX_BATCH), lambda q, w, v: q.claim_many("w", 30, v)),
        Arg("min_priority", ints_outside(0, 4), lambda q, w, v: q.claim_many("w", 30, 2, v)),
    ),
    row("ack", Arg("lease", NOT_A_LEASE, lambda q, w, v: q.ack(v))),
    row("ack", Arg("lease", FORGED_LEASES, lambda q, w, v: q.ack(v)), error=LeaseLost),
    row("ack_many", Arg("leases", NOT_A_LEASE_LIST, lambda q, w, v: q.ack_many(v))),
    row(
        "ack_many",
        Arg(
            "leases",
            {label: in_a_list(forged) for label, forged in FORGED_LEASES.items()},
            lambda q, w, v: q.ack_many(v),
        ),
        error=LeaseLost,
    ),
    row(
        "ack_many(a mapping)",
        Arg(
            "leases",
            {"{the lease: 'done'}": FromWorld(lambda w: {w.lease: "done"})},
            lambda q, w, v: q.ack_many(v),
        ),
    ),
    row(
        "nack",
        Arg("lease", NOT_A_LEASE, lambda q, w, v: q.nack(v, 0)),
        Arg("delay", seconds_refused(zero_ok=True), lambda q, w, v: q.nack(w.lease, v)),
    ),
    row("nack", Arg("lease", FORGED_LEASES, lambda q, w, v: q.nack(v, 0)), error=LeaseLost),
    row(
        "extend",
        Arg("lease", NOT_A_LEASE, lambda q, w, v: q.extend(v, 60)),
        Arg("visibility", seconds_refused(zero_ok=False), lambda q, w, v: q.extend(w.lease, v)),
    ),
    row("extend", Arg("lease", FORGED_LEASES, lambda q, w, v: q.extend(v, 60)), error=LeaseLost),
    row(
        "dead_letter",
        Arg("lease", NOT_A_LEASE, lambda q, w, v: q.dead_letter(v, "why")),
        Arg("reason", NOT_A_REASON, lambda q, w, v: q.dead_letter(w.lease, v)),
    ),
    row(
        "dead_letter",
        Arg(
            "lease",
            # Not "the dead letter's seq and group": that is the very lease that dead-lettered
            # it (one token for the world's claim), and the same settlement again reports
            # that it applied (the contract suite tests it).
            {k: v for k, v in FORGED_LEASES.items() if k != "the dead letter's seq and group"},
            lambda q, w, v: q.dead_letter(v, "why"),
        ),
        error=LeaseLost,
    ),
    row(
        "dead_letter(hold)",
        Arg(
            "hold",
            {"str 'no'": "no", "int 2": 2, "list": [False]},
            lambda q, w, v: q.dead_letter(w.lease, "why", hold=v),
        ),
    ),
    row(
        "settle_and_claim",
        Arg("worker_id (n=1)", NOT_AN_ID, lambda q, w, v: q.settle_and_claim(v, 30, 1)),
        Arg(
            "visibility",
            seconds_refused(zero_ok=False),
            lambda q, w, v: q.settle_and_claim("w", v, 1),
        ),
        Arg("n", ints_outside(0, MAX_BATCH), lambda q, w, v: q.settle_and_claim("w", 30, v)),
        Arg(
            "min_priority",
            ints_outside(0, 4),
            lambda q, w, v: q.settle_and_claim("w", 30, 1, min_priority=v),
        ),
        Arg("ack", NOT_A_LEASE_LIST, lambda q, w, v: q.settle_and_claim(ack=v)),
        Arg("extend", NOT_A_LEASE_LIST, lambda q, w, v: q.settle_and_claim(extend=v)),
        Arg("nack", NOT_NACK_PAIRS, lambda q, w, v: q.settle_and_claim(nack=v)),
        Arg("dead", NOT_DEAD_PAIRS, lambda q, w, v: q.settle_and_claim(dead=v)),
    ),
    row(
        "settle_and_claim(worker_id, n=0)",
        Arg(
            "worker_id (n=0)",
            {"int": 7, "bytes": b"w", "lone surrogate": LONE, "10 MB": BIG},
            lambda q, w, v: q.settle_and_claim(v, 30, 0),
        ),
    ),
    row(
        "settle_and_claim(nack or dead not iterable)",
        Arg("nack", {"None": None, "int": 5}, lambda q, w, v: q.settle_and_claim(nack=v)),
        Arg("dead", {"None": None, "int": 5}, lambda q, w, v: q.settle_and_claim(dead=v)),
    ),
    row(
        "settle_and_claim(hold_dead)",
        Arg(
            "hold_dead",
            {"str 'no'": "no", "int 2": 2},
            lambda q, w, v: q.settle_and_claim(dead=[(w.lease, "why")], hold_dead=v),
        ),
    ),
    row("probe", Arg("min_priority", ints_outside(0, 4), lambda q, w, v: q.probe(v))),
    row(
        "hold_group, release_group",
        Arg("hold_group(group_id)", NOT_AN_ID, lambda q, w, v: q.hold_group(v)),
        Arg("release_group(group_id)", NOT_AN_ID, lambda q, w, v: q.release_group(v)),
    ),
    row(
        "groups",
        Arg(
            "state",
            {**NOT_A_DEDUP_ID, "unknown": "stuck", "upper": "READY"},
            lambda q, w, v: q.groups(state=v),
        ),
        Arg("prefix", NOT_A_DEDUP_ID, lambda q, w, v: q.groups(prefix=v)),
        Arg("after", NOT_A_DEDUP_ID, lambda q, w, v: q.groups(after=v)),
        Arg("min_priority", ints_outside(0, 4), lambda q, w, v: q.groups(min_priority=v)),
        Arg("limit", ints_outside(1, MAX_BATCH), lambda q, w, v: q.groups(limit=v)),
    ),
    row(
        "cancel_group, set_priority",
        Arg("cancel_group(group_id)", NOT_AN_ID, lambda q, w, v: q.cancel_group(v, "r")),
        Arg("cancel_group(reason)", NOT_A_REASON, lambda q, w, v: q.cancel_group("b", v)),
        Arg("set_priority(group_id)", NOT_AN_ID, lambda q, w, v: q.set_priority(v, 1)),
        Arg("set_priority(priority)", ints_outside(0, 4), lambda q, w, v: q.set_priority("b", v)),
    ),
    row(
        "dead_letters",
        Arg("limit", ints_outside(1, MAX_BATCH), lambda q, w, v: q.dead_letters(v)),
        # None is allowed for group_id here too (all groups)
        Arg("group_id", NOT_A_DEDUP_ID, lambda q, w, v: q.dead_letters(group_id=v)),
        Arg("after", NOT_A_CURSOR, lambda q, w, v: q.dead_letters(after=v)),
    ),
    row(
        "requeue_dead, purge_dead",
        Arg("requeue_dead(seqs)", NOT_SEQS, lambda q, w, v: q.requeue_dead(v)),
        Arg("purge_dead(seqs)", NOT_SEQS, lambda q, w, v: q.purge_dead(v)),
    ),
    row(
        "requeue_dead, purge_dead (a mapping or a bytearray)",
        Arg("requeue_dead(seqs)", SEQS_AS_KEYS_OR_BYTES, lambda q, w, v: q.requeue_dead(v)),
        Arg("purge_dead(seqs)", SEQS_AS_KEYS_OR_BYTES, lambda q, w, v: q.purge_dead(v)),
    ),
    row(
        "peek",
        Arg("group_id", NOT_AN_ID, lambda q, w, v: q.peek(v)),
        Arg("limit", ints_outside(1, MAX_BATCH), lambda q, w, v: q.peek("a", v)),
    ),
    row(
        "any call, with a 1 MB argument of the wrong type",
        Arg(
            "the call",
            {
                "publish(group_id=1 MB of bytes)": lambda q: q.publish(MB.encode(), "e"),
                "publish_many(items=1 MB str)": lambda q: q.publish_many(MB),
                "ack(lease=1 MB str)": lambda q: q.ack(MB),
                "requeue_dead(seqs=1 MB of bytes)": lambda q: q.requeue_dead(MB.encode()),
            },
            lambda q, w, v: v(q),
        ),
    ),
]


async def problem_with(call: Awaitable[Any], error: type[QueueError]) -> str | None:
    """What is wrong with how `call` failed (None: it raised `error`, with a short message
    that is valid UTF-8)."""
    try:
        result = await call
    except error as exc:
        message = str(exc)
        if len(message) > MAX_MESSAGE:
            return f"{type(exc).__name__} with a message of {len(message)} characters"
        try:
            message.encode("utf-8")
        except UnicodeEncodeError:
            return f"{type(exc).__name__} with a message that is not valid UTF-8: {message!r}"
        return None
    except QueueError as exc:
        return f"raised {type(exc).__name__}, not {error.__name__}: {exc}"
    except Exception as exc:
        return f"raised a bare {type(exc).__name__}: {exc}"
    return f"accepted: returned {result!r}"


@pytest.mark.parametrize(("args", "error", "options"), HOSTILE)
async def test_hostile_input_is_refused_with_a_typed_error_and_writes_nothing(
    make_queue: MakeQueue,
    args: tuple[Arg, ...],
    error: type[QueueError],
    options: dict[str, Any],
) -> None:
    q = await make_queue(**options)
    world = await make_world(q)
    before = await snapshot(q)
    stats = before[0]
    problems = []
    for arg in args:
        for label, value in arg.values.items():
            argument = value.make(world) if isinstance(value, FromWorld) else value
            sent = requests_sent(q)
            problem = await problem_with(arg.run(q, world, argument), error)
            if sent is None or requests_sent(q) != sent:  # it reached the backend: did it write?
                now = await q.stats()
                if now != stats:
                    problem = f"{problem or 'refused'}, but it wrote: {stats} -> {now}"
                    stats = now
            if problem is not None:
                problems.append(f"{arg.name}={label}: {problem[:300]}")
    assert not problems, "\n".join(problems)
    await assert_world_unchanged(q, world, before)


def requests_sent(q: Any) -> int | None:
    """How many requests an rqlite transport has sent (None for the embedded SQLite, whose
    stats cost next to nothing). A call that sent none cannot have written anything."""
    client = getattr(q, "client", None)
    return None if client is None else int(client.requests)


# ------------------------------------------------------------------------ after close()

CALLS: dict[str, Callable[[Any, World], Awaitable[Any]]] = {
    "publish": lambda q, w: q.publish("g", "e"),
    "publish(dedup_id=)": lambda q, w: q.publish("g", "e", dedup_id="x"),
    "publish(delay=, ttl=)": lambda q, w: q.publish("g", "e", delay=5, ttl=60),
    "publish_many": lambda q, w: q.publish_many([("g", "e")]),
    "publish_many([])": lambda q, w: q.publish_many([]),
    "claim": lambda q, w: q.claim("w", 30),
    "claim_many": lambda q, w: q.claim_many("w", 30, 5),
    "ack": lambda q, w: q.ack(w.lease),
    "ack_many": lambda q, w: q.ack_many([w.lease]),
    "ack_many([])": lambda q, w: q.ack_many([]),
    "nack": lambda q, w: q.nack(w.lease, 5),
    "extend": lambda q, w: q.extend(w.lease, 60),
    "dead_letter": lambda q, w: q.dead_letter(w.lease, "why", hold=True),
    "settle_and_claim": lambda q, w: q.settle_and_claim("w", 30, 5, ack=[w.lease]),
    "settle_and_claim()": lambda q, w: q.settle_and_claim(),
    "probe": lambda q, w: q.probe(),
    "hold_group": lambda q, w: q.hold_group("b"),
    "release_group": lambda q, w: q.release_group("b"),
    "groups": lambda q, w: q.groups(),
    "cancel_group": lambda q, w: q.cancel_group("b", "why"),
    "set_priority": lambda q, w: q.set_priority("b", 2),
    "pause": lambda q, w: q.pause(),
    "resume": lambda q, w: q.resume(),
    "dead_letters": lambda q, w: q.dead_letters(),
    "requeue_dead": lambda q, w: q.requeue_dead(),
    "purge_dead": lambda q, w: q.purge_dead([w.dead_seq]),
    "peek": lambda q, w: q.peek("a"),
    "stats": lambda q, w: q.stats(),
    "setup": lambda q, w: q.setup(),
    "schedule": lambda q, w: q.schedule("s", "g", "e", every=60),
    "unschedule": lambda q, w: q.unschedule("s"),
    "schedules": lambda q, w: q.schedules(),
    "fire_schedules": lambda q, w: q.fire_schedules(),
}


async def test_every_call_after_close_raises_transport_closed(make_queue: MakeQueue) -> None:
    """Every call (with good arguments) raises TransportClosed; with hostile arguments, either
    that or InvalidArgument. Nothing is written: the queue, opened anew, is as it was."""
    q = await make_queue()
    world = await make_world(q)
    before = await snapshot(q)
    await q.close()
    await q.close()  # closing again is harmless
    problems = []
    for label, call in CALLS.items():
        if (problem := await problem_with(call(q, world), TransportClosed)) is not None:
            problems.append(f"{label}: {problem[:300]}")
    hostile = await problem_with(q.publish(None, object(), NAN), QueueError)
    if hostile is not None:
        problems.append(f"publish(None, object(), nan): {hostile[:300]}")
    assert not problems, "\n".join(problems)
    again = await make_queue(queue=q.queue)  # the same queue (and file), opened anew
    await assert_world_unchanged(again, world, before)


# ------------------------------------------------- what must be accepted, and kept exactly


async def _refused_or_kept(call: Awaitable[Any]) -> bool:
    """True if `call` was refused with InvalidArgument; False if it went through."""
    try:
        await call
    except InvalidArgument:
        return True
    return False


async def ids_at_the_byte_limit(make_queue: MakeQueue) -> None:
    q = await make_queue()
    group, dedup = "é" * (MAX_ID_BYTES // 2), "d" * MAX_ID_BYTES
    seq = await q.publish(group, "e", dedup_id=dedup)
    assert await q.publish(group, "other", dedup_id=dedup) == seq
    assert await q.peek(group) == [(seq, "e")]
    lease = await q.claim("w" * 64, 30)
    assert lease is not None and lease.group_id == group
    await q.ack(lease)


async def worker_id_at_the_byte_limit(make_queue: MakeQueue) -> None:
    q = await make_queue()
    await q.publish("g", "e")
    lease = await q.claim("w" * MAX_ID_BYTES, 30)
    assert lease is not None
    await q.ack(lease)
    assert (await q.stats()).depth == 0


async def reason_and_payload_at_their_limits(make_queue: MakeQueue) -> None:
    q = await make_queue(max_payload_bytes=4096)
    payload = "p" * 4094  # JSON adds the two quotes: exactly the limit
    await q.publish("g", payload)
    lease = await q.claim("w", 30)
    assert lease is not None and lease.event == payload
    reason = "r" * MAX_REASON_BYTES
    await q.dead_letter(lease, reason)
    [dead] = await q.dead_letters()
    assert (dead.reason, dead.event) == (reason, payload)


async def seconds_at_a_year_and_near_zero(make_queue: MakeQueue) -> None:
    # The real clock: a fake one that stands still drifts from the nodes' by a fraction of a
    # second, and that is more than a quarter of a tiny visibility (ClockSkew).
    q = await make_queue(clock=time.time)
    await q.publish_many([("a", 1), ("b", 2)])
    a = await q.claim("w", MAX_SECONDS)
    assert a is not None
    assert (await q.extend(a, MAX_SECONDS)).expires_at >= a.expires_at
    await q.nack(a, MAX_SECONDS)
    b = await q.claim("w", 1e-9)
    assert b is not None and b.group_id == "b"
    await q.nack(b, -0.0)
    assert (await q.stats()).parked == 1


async def counts_and_seqs_at_their_limits(make_queue: MakeQueue) -> None:
    q = await make_queue()
    await q.publish_many([(f"g{i}", i, 4) for i in range(3)])
    assert len(await q.claim_many("w", 30, MAX_BATCH, 4)) == 3
    assert await q.dead_letters(MAX_BATCH) == []
    assert await q.peek("g0", MAX_BATCH) == [(1, 0)]
    # Seqs are per shard on a sharded queue: its dead-letter calls by seq name the shard.
    shard = {"shard": q.names[0]} if hasattr(q, "names") else {}
    assert await q.requeue_dead(list(range(1, MAX_BATCH + 1)), **shard) == 0
    assert await q.purge_dead([2**63 - 1], **shard) == 0
    with pytest.raises(LeaseLost):
        await q.ack(Lease(2**63 - 1, "g0", 0, "w:forged"))


UNUSUAL = ["🙂", "\U0010ffff", "\uffff", "\ufeff", "\u2028", "e\u0301", "\x7f", "\t\r\n", "\x01"]
JSONISH = ["null", "1", "true", '"q"', "[]", "{}", "$", "$[0]", "\\", "\\u0000"]


async def unusual_text_as_ids_and_payloads(make_queue: MakeQueue) -> None:
    q = await make_queue()
    raw = await make_queue(codec=RawCodec(), queue=q.queue + "_raw")
    texts = UNUSUAL + JSONISH
    items = [{"group_id": t, "event": t, "dedup_id": t} for t in texts]
    for transport in (q, raw):
        seqs = await transport.publish_many(items)
        assert await transport.publish_many(items) == seqs  # the dedup ids are found again
        leases = await transport.claim_many("w", 30, 100)
        assert sorted((x.group_id, x.event) for x in leases) == sorted((t, t) for t in texts)


async def nul_in_a_group_id(make_queue: MakeQueue) -> None:
    q = await make_queue()
    await q.publish("a", "plain")
    if await _refused_or_kept(q.publish("a\x00b", "nul")):
        assert (await q.stats()).depth == 1
        return
    assert await q.peek("a") == [(1, "plain")]
    assert await q.peek("a\x00b") == [(2, "nul")]
    leases = await q.claim_many("w", 30, 10)
    assert sorted((x.group_id, x.event) for x in leases) == [("a", "plain"), ("a\x00b", "nul")]


async def nul_in_a_dedup_id(make_queue: MakeQueue) -> None:
    q = await make_queue()
    first = await q.publish("g", "plain", dedup_id="d")
    if await _refused_or_kept(q.publish("g", "nul", dedup_id="d\x00e")):
        assert (await q.stats()).depth == 1
        return
    second = await q.publish("g", "nul again", dedup_id="d\x00e")
    assert first != second
    assert [event for _, event in await q.peek("g")] == ["plain", "nul"]


async def nul_in_a_worker_id(make_queue: MakeQueue) -> None:
    q = await make_queue()
    await q.publish("g", "e")
    try:
        lease = await q.claim("w\x00x", 30)
    except InvalidArgument:
        assert (await q.stats()).in_flight == 0
        return
    assert lease is not None
    await q.ack(lease)
    assert (await q.stats()).depth == 0


async def nul_in_a_reason(make_queue: MakeQueue) -> None:
    q = await make_queue()
    await q.publish("g", "e")
    lease = await q.claim("w", 30)
    if await _refused_or_kept(q.dead_letter(lease, "r\x00s")):
        assert (await q.stats()).in_flight == 1
        return
    assert [d.reason for d in await q.dead_letters()] == ["r\x00s"]


async def nul_in_a_raw_payload(make_queue: MakeQueue) -> None:
    q = await make_queue(codec=RawCodec())
    if await _refused_or_kept(q.publish("g", "s\x00t")):
        assert (await q.stats()).depth == 0
        return
    await q.publish("g", b"\x00")
    assert [event for _, event in await q.peek("g")] == ["s\x00t", b"\x00"]


async def nul_in_a_held_group_id(make_queue: MakeQueue) -> None:
    q = await make_queue()
    await q.publish("h", "e")
    if await _refused_or_kept(q.hold_group("h\x00z")):
        assert (await q.stats()).held == 0
    lease = await q.claim("w", 30)
    assert lease is not None, "holding group 'h\\0z' held group 'h'"
    assert lease.group_id == "h"


async def settle_and_claim_with_nothing_to_do(make_queue: MakeQueue) -> None:
    q = await make_queue()
    assert await q.settle_and_claim() == Round()
    assert await q.settle_and_claim("w", 30, 0, ack=[], nack=[], extend=[], dead=[]) == Round()


LEGIT = [
    pytest.param(ids_at_the_byte_limit, id="ids_at_the_byte_limit"),
    pytest.param(worker_id_at_the_byte_limit, id="worker_id_at_the_byte_limit"),
    pytest.param(reason_and_payload_at_their_limits, id="reason_and_payload_at_their_limits"),
    pytest.param(seconds_at_a_year_and_near_zero, id="seconds_at_a_year_and_near_zero"),
    pytest.param(counts_and_seqs_at_their_limits, id="counts_and_seqs_at_their_limits"),
    pytest.param(unusual_text_as_ids_and_payloads, id="unusual_text_as_ids_and_payloads"),
    pytest.param(settle_and_claim_with_nothing_to_do, id="settle_and_claim_with_nothing_to_do"),
    pytest.param(nul_in_a_group_id, id="nul_in_a_group_id"),
    pytest.param(nul_in_a_dedup_id, id="nul_in_a_dedup_id"),
    pytest.param(nul_in_a_worker_id, id="nul_in_a_worker_id"),
    pytest.param(nul_in_a_reason, id="nul_in_a_reason"),
    pytest.param(nul_in_a_raw_payload, id="nul_in_a_raw_payload"),
    pytest.param(nul_in_a_held_group_id, id="nul_in_a_held_group_id"),
]


@pytest.mark.parametrize("check", LEGIT)
async def test_legitimate_extremes_are_accepted_and_kept_exactly(
    make_queue: MakeQueue, check: Callable[[MakeQueue], Awaitable[None]]
) -> None:
    """Values at the limits, and unusual but valid text, are accepted and come back as they
    went in. For a NUL inside a string, refusing it (InvalidArgument, nothing written) is
    fine too; cutting it short is not."""
    await check(make_queue)
