"""What every family of the protocol shares: a statement, the batch it travels in (one round
trip, one transaction), what comes back, and a plan: the batch to send, how to read its reply,
whether it may be sent again after a lost reply, and what to run instead when it is refused.

Nothing here does I/O. A family's plan function (`publish.plan`, `rounds.plan`, ...) builds a
`Plan`; a backend runs it (`_async/cluster.py`): it sends the batch, resends it where the plan
says that is safe, and hands a refusal to `Plan.instead`. An operation of several steps (a
round that claims again after leasing expired messages, the setup of the tables) is a
generator of plans (`Steps`), which the backend drives: each plan's result, or its error, is
sent back into it."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Generic, TypeVar

from ..errors import QueueError

T = TypeVar("T")

Params = Mapping[str, Any] | Sequence[Any]


@dataclass(frozen=True, slots=True)
class Statement:
    sql: str
    params: Params = ()


# How statements that may return rows begin (a `WITH` may begin a write too: counted as a read,
# which only costs the write its cheaper path).
READS = ("SELECT", "WITH", "VALUES")


@dataclass(frozen=True, slots=True)
class Batch:
    """Statements sent together. `write=True`: one transaction through the leader (rqlite
    `/db/request?transaction`, SQLite `BEGIN IMMEDIATE`); `write=False`: a fresh read of one
    snapshot (rqlite `/db/query?level=linearizable`, with `&transaction` for more than one
    statement; SQLite `BEGIN`), or with `local=True` the leader's own copy, without a Raft
    round (rqlite `level=weak`: it may miss a write committed a moment ago by a leader that
    lost its place, never one this client made).

    `slots` names the statements whose results a reader uses."""

    statements: tuple[Statement, ...]
    write: bool = True
    local: bool = False
    slots: Mapping[str, int] = field(default_factory=dict)
    returning: bool = False
    """A write whose only rows come from `RETURNING` (no `SELECT`): rqlite runs it on
    `/db/execute`, which, unlike `/db/request`, does not compile every statement once more to
    learn whether it reads or writes."""
    selects: bool = True
    """A write with a statement that reads rows (`SELECT`, `WITH`): it must go to rqlite's
    `/db/request`, which returns them. A write without one (an ack, a nack) needs no rows
    but the counts, and goes to `/db/execute`: on `/db/request` rqlite compiles every statement
    twice more on the leader and once more on each node, to learn that it writes (a claim()
    then ack() costs rqlited's 3 nodes 23% less CPU with the ack on `/db/execute`:
    bench/statement_cost.py)."""

    def first(self, statements: Sequence[Statement]) -> Batch:
        """This batch with `statements` before its own (its slots moved along)."""
        shift = len(statements)
        return Batch(
            (*statements, *self.statements),
            self.write,
            self.local,
            {slot: index + shift for slot, index in self.slots.items()},
            self.returning,
            self.selects or any(s.sql.startswith(READS) for s in statements),
        )

    def last(self, statement: Statement, slot: str | None = None) -> Batch:
        """This batch with `statement` after its own (named `slot`, if given)."""
        slots = self.slots if slot is None else {**self.slots, slot: len(self.statements)}
        return Batch(
            (*self.statements, statement),
            self.write,
            self.local,
            slots,
            self.returning,
            self.selects,
        )


class Builder:
    """A batch, statement by statement."""

    __slots__ = ("local", "returning", "selects", "slots", "statements", "write")

    def __init__(self, *, write: bool = True, local: bool = False, returning: bool = False) -> None:
        self.write = write
        self.local = local
        self.returning = returning
        self.statements: list[Statement] = []
        self.slots: dict[str, int] = {}
        self.selects = False

    def add(self, sql: str, params: Params = (), *, slot: str | None = None) -> None:
        if slot is not None:
            self.slots[slot] = len(self.statements)
        if sql.startswith(READS):
            self.selects = True
        self.statements.append(Statement(sql, params))

    def build(self) -> Batch:
        return Batch(
            tuple(self.statements),
            self.write,
            self.local,
            self.slots,
            self.returning,
            self.selects,
        )


def single(
    sql: str,
    params: Params = (),
    *,
    slot: str | None = None,
    write: bool = True,
    local: bool = False,
) -> Batch:
    """A batch of one statement (`slot`: its name for the reader)."""
    b = Builder(write=write, local=local)
    b.add(sql, params, slot=slot)
    return b.build()


@dataclass(frozen=True, slots=True)
class Result:
    """One statement's outcome, the same shape from every backend."""

    rows: list[list[Any]] = field(default_factory=list)
    rows_affected: int = 0
    last_insert_id: int | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    """A batch's results, read by slot name."""

    batch: Batch
    results: Sequence[Result]

    def __getitem__(self, slot: str) -> Result:
        return self.results[self.batch.slots[slot]]

    def __contains__(self, slot: str) -> bool:
        return slot in self.batch.slots


@dataclass(frozen=True, slots=True)
class Plan(Generic[T]):
    """One operation on one cluster: the batch to send and how to read its reply."""

    batch: Batch
    read: Callable[[Reply], T]
    _: KW_ONLY
    resend_safe: bool = False
    """Sent again after a first send whose outcome is unknown (its reply was lost): only where
    a second application does no harm (it sets rather than adds, or finds what the first
    did); otherwise the caller learns `OutcomeUnknown`."""
    resend: Callable[[], Batch] | None = None
    """What to send again, if not `batch` itself (made only then)."""
    read_resent: Callable[[Reply], T] | None = None
    """How to read the reply of a resend, if not as `read` (a resend that cannot tell whether
    the first send applied)."""
    idempotent: bool = False
    """Its batch applied again changes nothing and reads the same (`CREATE ... IF NOT
    EXISTS`, `INSERT OR IGNORE`, reads: the setup's bootstrap): after a lost reply the client
    sends it again on the way, as it does a read, until the deadline; given up, it raises
    `Unavailable` with what each node did, never `OutcomeUnknown` (its outcome does not
    matter to the caller)."""
    lease_for: float | None = None
    """The visibility of the leases this plan takes or extends: the backend that runs it
    first checks that its cluster's clock is close enough to this client's for them."""
    tenants_on: bool = False
    """Once applied, the queue's tenants are on (its claims share by weight from then on)."""
    empties_group: bool = False
    """It may leave its group with no messages (a cancel): on a sharded queue, a group moving
    between shards then lets its new shard serve it."""
    instead: Callable[[QueueError], Plan[T] | None] | None = None
    """When the batch is refused (a guard statement's typed error: `refusals.refined`), the
    plan to run in its place (None: the error stands)."""

    @staticmethod
    def done(value: T) -> Plan[T]:
        """A plan with nothing to send, whose result is `value`."""
        return Plan(NOTHING, lambda reply: value)


@dataclass(slots=True)
class Known:
    """What this client has learnt of one cluster's queue (its backend keeps one; plans read
    it, and the replies that say more update it): whether its tenants are on (claims then
    share by weight, publishes check the tenants' bounds), and which claim floors last found
    nothing (the next claim on one first asks with a read)."""

    tenants_on: bool = False
    idle: dict[int, bool] = field(default_factory=dict)
    sharded: bool = False
    """The cluster is a shard of a sharded queue (its settlements send the counts of batches
    that live elsewhere through its outbox)."""

    def learn(self, tenants_on: bool) -> None:
        self.tenants_on = tenants_on


NOTHING = Batch(())
"""An empty batch: the backend sends nothing and reads an empty reply."""

Steps = Generator[Plan[Any], Any, T]
"""An operation of several plans: it yields each plan, is sent its result (or thrown its
error), and returns the operation's result."""


def nothing(reply: Reply) -> None:
    """The reading of a plan whose reply says nothing the caller needs."""
    return None


def changed_one(batch: Batch, slot: str) -> Plan[bool]:
    """Whether the statement in `slot` changed a row (a release, a removal). Safe to resend;
    a resend cannot tell whether its first send did it, and says it did."""

    def read(reply: Reply) -> bool:
        return reply[slot].rows_affected == 1

    return Plan(batch, read, resend_safe=True, read_resent=lambda reply: True)
