"""Batches as a state machine (docs/batches.md): random sequences of calls, each checked
against a model of the batches.

The model knows every message it published (its event names it), the group FIFOs, which batch
each message belongs to, and each batch's counts: a block's messages counted when it is
written (all at its end, or at a `flush()`, the batch open until the block ends; an exception
writes nothing, or closes a flushed batch as aborted), batches made within a block and within a
running batch (`queue.batch(parent=lease.batch)`), follow-ups that join their lease's batch,
publishes that join a batch (`BatchDone` once it is done), settlements (ack, dead letter with
its reason, `cancel_group`: cancelled; a nack counts nothing), lapsed leases taken over, and
replies lost and resent. A batch is done when its block is over and none of its messages is
unsettled; a batch within another is then settled in its parent (failed if any of its own
failed). After every step the machine checks each batch's state and counts (`batches()`), its
first failures, `stats().open_batches`, that every claim took the head of its group with the
batch the model says, and that the callbacks published are exactly those of the batches
done: `on_complete` once each, `on_success` once each of those with no failure, none of a
batch not done (never early).

Callbacks go to the group `cb` at priority 0; the machine's claims take priority 1 and up
only, so the callbacks stay to be counted. Runs: SQLite (short, and a long one marked slow),
two shards of SQLite files (short), and the one-node rqlite (short)."""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import event as note_event
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from rqlite_queue import Lease, RqliteTransport, ShardedTransport, SqliteTransport, Transport
from rqlite_queue.errors import BatchDone, InvalidArgument
from rqlite_queue.testing import Cluster
from rqlite_queue.types import MAX_BATCH_DEPTH, MAX_BATCH_FAILURES, BatchStatus

from .conftest import FakeClock, dropped_when_closed, lose

GROUPS = ("g0", "g1", "g2", "g3", "g4")
VISIBILITY = 30.0
CALLBACKS = "cb"

groups = st.sampled_from(GROUPS)
sizes = st.integers(0, 4)


@dataclasses.dataclass
class Msg:
    mid: int
    group: str
    batch: str | None
    seq: int = 0
    leased: bool = False
    token: bool = False
    """Its group's row holds a lease's token on it (in force, or lapsed and not taken over)."""


@dataclasses.dataclass
class Model:
    """One batch as the model sees it (`name`: the machine's, in its callbacks' events)."""

    name: str
    parent: str | None
    depth: int
    complete: bool
    success: bool
    open: bool = False
    closed: bool = False
    total: int = 0
    pending: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0
    failures: list[tuple[str, int, str, str | None]] = dataclasses.field(default_factory=list)
    aborted: bool = False
    done: bool = False
    id: str = ""

    @property
    def state(self) -> str:
        return "done" if self.done else "open" if self.open else "closed"


class BatchMachine(RuleBasedStateMachine):
    def open(self, clock: FakeClock) -> Transport:
        raise NotImplementedError

    @initialize()
    def start(self) -> None:
        self.clock = FakeClock()
        self.q = self.open(self.clock)
        self.q.setup()
        self.sharded = isinstance(self.q, ShardedTransport)
        self.batches: dict[str, Model] = {}
        self.fifo: dict[str, deque[Msg]] = {g: deque() for g in GROUPS}
        self.by_mid: dict[int, Msg] = {}
        self.held: dict[int, Lease] = {}
        self.next_mid = 0
        self.callbacks: Counter[tuple[str, str]] = Counter()
        """(batch name, kind) of the callbacks the batches done have published."""
        self.next_name = 0
        self.names: dict[str, str] = {}
        self.open_handle: tuple[Any, Model] | None = None

    def teardown(self) -> None:
        if getattr(self, "open_handle", None) is not None:
            handle, _ = self.open_handle  # type: ignore[misc]
            handle.__exit__(None, None, None)
        if hasattr(self, "q"):
            self.q.close()

    # ----------------------------------------------------------------- model helpers

    def new_msg(self, group: str, batch: str | None) -> Msg:
        self.next_mid += 1
        msg = Msg(self.next_mid, group, batch)
        self.by_mid[msg.mid] = msg
        return msg

    def queued(self, msgs: list[Msg], seqs: list[int]) -> None:
        for msg, seq in zip(msgs, seqs, strict=True):
            msg.seq = seq
            self.fifo[msg.group].append(msg)

    def count_in(self, batch_id: str, n: int) -> None:
        b = self.batches[batch_id]
        b.total += n
        b.pending += n

    def settle(self, batch_id: str | None, kind: str, failure: Any = None) -> None:
        if batch_id is None:
            return
        b = self.batches[batch_id]
        b.pending -= 1
        setattr(b, kind, getattr(b, kind) + 1)
        if failure is not None and len(b.failures) < MAX_BATCH_FAILURES:
            b.failures.append(failure)
        self.maybe_done(b)

    def maybe_done(self, b: Model) -> None:
        if b.done or b.open or not b.closed or b.pending:
            return
        b.done = True
        note_event(f"a batch done, depth {b.depth}" + (", failed" if b.failed else ""))
        if b.complete:
            self.callbacks[(b.name, "complete")] += 1
        if b.success and b.failed == 0 and not b.aborted:
            self.callbacks[(b.name, "success")] += 1
        if b.parent is not None:
            failed = b.failed > 0
            reason = f"batch {b.id}: {b.failed} of {b.total} failed"
            self.settle(
                b.parent,
                "failed" if failed else "succeeded",
                ("", 0, reason, b.id) if failed else None,
            )

    def not_done(self) -> list[Model]:
        return [b for b in self.batches.values() if not b.done]

    def spec(self, b: Model) -> dict[str, Any]:
        """The callbacks of `b`, to the group `cb` (at priority 0), named in their events."""
        options: dict[str, Any] = {}
        if b.complete:
            options["on_complete"] = (CALLBACKS, {"b": b.name, "kind": "complete"})
        if b.success:
            options["on_success"] = (CALLBACKS, {"b": b.name, "kind": "success"})
        return options

    def items(self, msgs: list[Msg]) -> list[dict[str, Any]]:
        return [{"group_id": m.group, "event": {"mid": m.mid}, "priority": 1} for m in msgs]

    # ----------------------------------------------------------------- rules: batches

    @rule(
        n=sizes,
        where=st.lists(groups, min_size=4, max_size=4),
        complete=st.booleans(),
        success=st.booleans(),
        within=st.integers(0, 3),
        inner_n=sizes,
        nest=st.integers(0, 3),
        flush=st.booleans(),
        fail=st.sampled_from([False, False, False, True]),
    )
    def make_batch(
        self,
        n: int,
        where: list[str],
        complete: bool,
        success: bool,
        within: int,
        inner_n: int,
        nest: int,
        flush: bool,
        fail: bool,
    ) -> None:
        """A block: `n` messages, maybe a batch made within it (`within` 0: none), maybe a
        flush half way, maybe an exception at its end; nested in a running batch when `nest`
        picks one (refused past the depth limit)."""
        parents = [b for b in self.not_done() if not b.open]
        parent = parents[nest % len(parents)] if parents and nest else None
        depth = 1 if parent is None else parent.depth + 1
        model = self.new_model(None if parent is None else parent.id, depth, complete, success)
        too_deep = depth > MAX_BATCH_DEPTH
        try:
            handle = self.q.batch(parent=model.parent, **self.spec(model))
        except InvalidArgument as exc:
            assert too_deep and "deep" in str(exc), exc
            return
        assert not too_deep, "a batch nested too deep was made"
        model.id = handle.id
        first = [self.new_msg(g, model.id) for g in where[: min(n, 2)]]
        rest = [self.new_msg(g, model.id) for g in where[min(n, 2) : n]]
        inner_model: Model | None = None
        inner_msgs: list[Msg] = []
        inner_seqs: list[int] = []
        flushed = False
        try:
            with handle:
                first_seqs = handle.publish_many(self.items(first))
                if flush:
                    handle.flush()
                    flushed = True
                    self.written(model, first, first_seqs.seqs, open_=True)
                rest_seqs = handle.publish_many(self.items(rest))
                if within and depth < MAX_BATCH_DEPTH:
                    inner_model = self.new_model(model.id, depth + 1, True, within > 1)
                    inner = handle.batch(**self.spec(inner_model))
                    inner_model.id = inner.id
                    inner_msgs = [self.new_msg(g, inner.id) for g in where[:inner_n]]
                    with inner:
                        inner_published = inner.publish_many(self.items(inner_msgs))
                if fail:
                    raise KeyError("the block fails")
        except KeyError:
            assert fail
            if flushed:
                model.open, model.closed, model.aborted = False, True, True
                self.maybe_done(model)
            return
        if not flushed:
            self.written(model, first, first_seqs.seqs, open_=False)
        self.count_in(model.id, len(rest))
        self.queued(rest, rest_seqs.seqs)
        if inner_model is not None:
            inner_seqs = inner_published.seqs
            self.written(inner_model, inner_msgs, inner_seqs, open_=False)
            inner_model.closed = True
        model.open, model.closed = False, True
        if inner_model is not None:
            self.maybe_done(inner_model)
        self.maybe_done(model)

    def new_model(self, parent: str | None, depth: int, complete: bool, success: bool) -> Model:
        self.next_name += 1
        return Model(f"b{self.next_name}", parent, depth, complete, success)

    def written(self, model: Model, msgs: list[Msg], seqs: list[int], *, open_: bool) -> None:
        """A batch's first write: its row, its parent's count, its messages."""
        self.names[model.name] = model.id
        self.batches[model.id] = model
        model.open = open_
        if model.parent is not None:
            self.count_in(model.parent, 1)
        self.count_in(model.id, len(msgs))
        self.queued(msgs, seqs)

    @precondition(lambda self: self.open_handle is None)
    @rule(group=groups, complete=st.booleans())
    def open_a_batch(self, group: str, complete: bool) -> None:
        """A block left open across steps (after a flush): its messages settle meanwhile."""
        model = self.new_model(None, 1, complete, False)
        handle = self.q.batch(**self.spec(model))
        model.id = handle.id
        handle.__enter__()
        msg = self.new_msg(group, model.id)
        published = handle.publish_many(self.items([msg]))
        handle.flush()
        self.written(model, [msg], published.seqs, open_=True)
        self.open_handle = (handle, model)

    @precondition(lambda self: self.open_handle is not None)
    @rule(group=groups, fail=st.booleans())
    def close_the_open_batch(self, group: str, fail: bool) -> None:
        assert self.open_handle is not None
        handle, model = self.open_handle
        self.open_handle = None
        msg = self.new_msg(group, model.id)
        published = handle.publish_many(self.items([msg]))
        if fail:
            handle.__exit__(KeyError, KeyError("late"), None)
            model.aborted = True
        else:
            handle.__exit__(None, None, None)
            self.count_in(model.id, 1)
            self.queued([msg], published.seqs)
        model.open, model.closed = False, True
        self.maybe_done(model)

    @rule(group=groups, pick=st.integers(0, 20))
    def join(self, group: str, pick: int) -> None:
        """A publish that names a batch: counted, or `BatchDone`."""
        if not self.batches:
            return
        b = list(self.batches.values())[pick % len(self.batches)]
        msg = self.new_msg(group, b.id)
        if b.done:
            try:
                self.q.publish(group, {"mid": msg.mid}, 1, batch=b.id)
            except BatchDone:
                return
            raise AssertionError(f"a done batch took a message: {b}")
        seq = self.q.publish(group, {"mid": msg.mid}, 1, batch=b.id)
        self.count_in(b.id, 1)
        self.queued([msg], [seq])

    @rule(group=groups, plain=st.booleans())
    def publish_plain(self, group: str, plain: bool) -> None:
        msg = self.new_msg(group, None)
        self.queued([msg], [self.q.publish(group, {"mid": msg.mid}, 1)])

    # ----------------------------------------------------------------- rules: the round

    @rule(n=st.integers(1, 5))
    def claim(self, n: int) -> None:
        leases = self.q.claim_many("w", VISIBILITY, n, min_priority=1)
        free = [g for g, q in self.fifo.items() if q and not q[0].leased]
        assert len(leases) == min(n, len(free)), (leases, free)
        for lease in leases:
            msg = self.by_mid[lease.event["mid"]]
            assert self.fifo[msg.group][0] is msg, "a claim took a message that is not the head"
            assert not msg.leased
            assert lease.batch == msg.batch, (lease.batch, msg.batch)
            assert msg.seq in (0, lease.seq), (msg.seq, lease.seq)
            msg.seq = lease.seq  # (a follow-up's seq is learnt here: its ack does not say it)
            msg.leased = msg.token = True
            self.held[msg.mid] = lease

    def pick_held(self, pick: int) -> tuple[Msg, Lease] | None:
        if not self.held:
            return None
        mid = sorted(self.held)[pick % len(self.held)]
        return self.by_mid[mid], self.held.pop(mid)

    def finish(self, msg: Msg) -> None:
        assert self.fifo[msg.group].popleft() is msg

    @rule(
        pick=st.integers(0, 20),
        children=st.lists(groups, max_size=2),
        lost=st.sampled_from([False, False, False, True]),
    )
    def ack(self, pick: int, children: list[str], lost: bool) -> None:
        """An ack, with follow-ups that join its lease's batch (plain ones for a message of
        none), maybe with its reply lost (the transport sends it again)."""
        found = self.pick_held(pick)
        if found is None:
            return
        msg, lease = found
        kids = [self.new_msg(g, msg.batch) for g in children]
        items = [
            {"group_id": k.group, "event": {"mid": k.mid}, "priority": 1, "batch": lease.batch}
            if lease.batch
            else {"group_id": k.group, "event": {"mid": k.mid}, "priority": 1}
            for k in kids
        ]
        if lost:
            lose(self.q, ("apply", None))
        self.q.ack(lease, publish=items)
        self.finish(msg)
        for kid in kids:
            self.fifo[kid.group].append(kid)
        if msg.batch is not None:
            self.count_in(msg.batch, len(kids))
        self.settle(msg.batch, "succeeded")

    @rule(pick=st.integers(0, 20))
    def dead_letter(self, pick: int) -> None:
        found = self.pick_held(pick)
        if found is None:
            return
        msg, lease = found
        reason = f"bad {msg.mid}"
        self.q.dead_letter(lease, reason)
        self.finish(msg)
        self.settle(msg.batch, "failed", (msg.group, lease.seq, reason, None))

    @rule(pick=st.integers(0, 20))
    def nack(self, pick: int) -> None:
        found = self.pick_held(pick)
        if found is None:
            return
        msg, lease = found
        self.q.nack(lease)
        msg.leased = msg.token = False

    @rule(mask=st.integers(0, 31))
    def work(self, mask: int) -> None:
        """A worker's turn: claim up to five, then settle them all in one round, each acked or
        dead-lettered as `mask`'s bits say."""
        self.claim(5)
        held = sorted(self.held.items())[:5]
        acks, dead = [], []
        for bit, (mid, lease) in enumerate(held):
            (dead if mask >> bit & 1 else acks).append((mid, lease))
            del self.held[mid]
        if not held:
            return
        result = self.q.settle_and_claim(
            ack=[lease for _, lease in acks],
            dead=[(lease, f"bad {mid}") for mid, lease in dead],
        )
        assert result.lost == []
        for mid, _ in acks:
            msg = self.by_mid[mid]
            self.finish(msg)
            self.settle(msg.batch, "succeeded")
        for mid, lease in dead:
            msg = self.by_mid[mid]
            self.finish(msg)
            self.settle(msg.batch, "failed", (msg.group, lease.seq, f"bad {mid}", None))

    @rule(group=groups)
    def cancel_group(self, group: str) -> None:
        cancelled = self.q.cancel_group(group, "cancelled")
        assert cancelled == len(self.fifo[group])
        for msg in self.fifo[group]:
            self.held.pop(msg.mid, None)
            self.settle(msg.batch, "cancelled")
        self.fifo[group].clear()

    @rule(
        group=groups,
        pick=st.integers(0, 20),
        how=st.sampled_from(["ack", "nack", "dead_letter"]),
    )
    def cancel(self, group: str, pick: int, how: str) -> None:
        """`cancel()` of one message: a queued one is cancelled at once; a leased one is
        flagged, and then its lease settled (acked, given back or dead-lettered: cancelled
        all the same)."""
        fifo = self.fifo[group]
        if not fifo:
            return
        msg = fifo[pick % len(fifo)]
        if msg.mid in self.held:
            lease = self.held.pop(msg.mid)
            assert self.q.cancel(group, lease.seq, "stop") == "cancelling"
            if how == "ack":
                self.q.ack(lease)
            elif how == "nack":
                self.q.nack(lease)
            else:
                self.q.dead_letter(lease, "gave up")
        elif msg.token:
            return  # (a lapsed lease's: settled as cancelled by whichever claim takes it)
        elif not msg.seq:
            return  # (a follow-up no claim has taken yet: the model does not know its seq)
        else:
            assert self.q.cancel(group, msg.seq, "stop") == "cancelled"
        note_event(f"a {'leased' if msg.leased else 'queued'} message cancelled")
        fifo.remove(msg)
        self.settle(msg.batch, "cancelled")

    @rule()
    def lapse(self) -> None:
        """Every lease lapses: its message goes back (it is claimed again, later)."""
        self.clock.advance(VISIBILITY + 1)
        for mid in self.held:
            self.by_mid[mid].leased = False
        self.held.clear()

    # ----------------------------------------------------------------- checks

    @invariant()
    def batches_are_as_the_model_says(self) -> None:
        if not hasattr(self, "q"):
            return
        found: dict[str, BatchStatus] = {b.id: b for b in self.q.batches(limit=10_000)}
        assert set(found) == set(self.batches)
        for batch_id, b in self.batches.items():
            got = found[batch_id]
            assert (
                got.state,
                got.total,
                got.pending,
                got.succeeded,
                got.failed,
                got.cancelled,
                got.parent,
                got.aborted is not None,
            ) == (
                b.state,
                b.total,
                b.pending,
                b.succeeded,
                b.failed,
                b.cancelled,
                b.parent,
                b.aborted,
            ), (got, b)
            # The failures of one round come in any order (its statement counts the batches'
            # rows in the order SQLite takes them; on shards, the one of the batch's shard
            # first, the other's with its forward).
            failures = [(f.group_id, f.seq, f.reason, f.batch) for f in got.failures]
            if len(b.failures) < MAX_BATCH_FAILURES:
                assert sorted(failures, key=repr) == sorted(b.failures, key=repr)
            else:  # (which ones are the first depends on that order too)
                assert len(failures) == MAX_BATCH_FAILURES
        assert self.q.stats().open_batches == len(self.not_done())

    @invariant()
    def callbacks_come_once_and_never_early(self) -> None:
        if not hasattr(self, "q"):
            return
        published = Counter(
            (event["b"], event["kind"]) for _, event in self.q.peek(CALLBACKS, 10_000)
        )
        assert published == self.callbacks


def on_sqlite(tmp_path: Path) -> Callable[[FakeClock], Transport]:
    def open_transport(clock: FakeClock) -> Transport:
        return SqliteTransport(os.fspath(tmp_path / f"sb_{uuid.uuid4().hex[:12]}.db"), clock=clock)

    return open_transport


def on_two_sqlite_shards(tmp_path: Path) -> Callable[[FakeClock], Transport]:
    def open_transport(clock: FakeClock) -> Transport:
        name = uuid.uuid4().hex[:12]
        url = ";".join(f"{s}=sqlite:///{tmp_path}/sb_{name}_{s}.db" for s in "ab")
        return ShardedTransport(url, clock=clock)

    return open_transport


def run(open_transport: Callable[[FakeClock], Transport], examples: int, steps: int) -> None:
    class Machine(BatchMachine):
        def open(self, clock: FakeClock) -> Transport:
            return open_transport(clock)

    run_state_machine_as_test(
        Machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )


def test_batches_hold_on_sqlite(tmp_path: Path) -> None:
    run(on_sqlite(tmp_path), examples=60, steps=30)


@pytest.mark.slow
def test_batches_hold_on_sqlite_long(tmp_path: Path) -> None:
    run(on_sqlite(tmp_path), examples=300, steps=50)


def test_batches_hold_on_two_shards(tmp_path: Path) -> None:
    run(on_two_sqlite_shards(tmp_path), examples=30, steps=30)


def test_batches_hold_on_rqlite(rqlite_cluster: Cluster) -> None:
    url = rqlite_cluster.url

    def open_transport(clock: FakeClock) -> Transport:
        queue = f"sb_{uuid.uuid4().hex[:12]}"
        return dropped_when_closed(
            RqliteTransport(url, clock=clock, queue=queue, max_skew=None), url
        )

    run(open_transport, examples=10, steps=20)


def test_a_follow_ups_seq_is_learnt_from_its_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shrunk example: a message acked with a follow-up into a batch, then a cancel of that
    follow-up while queued. Its ack does not say the follow-up's seq, so the model had it as 0
    and cancelled seq 0 (`InvalidArgument`); it now learns the seq from the claim that takes
    the follow-up, and leaves a follow-up no claim has taken alone."""
    monkeypatch.setattr(sys.modules[__name__], "note_event", lambda _: None)
    open_transport = on_sqlite(tmp_path)

    class Machine(BatchMachine):
        def open(self, clock: FakeClock) -> Transport:
            return open_transport(clock)

    machine = Machine()

    def checked() -> None:
        machine.batches_are_as_the_model_says()
        machine.callbacks_come_once_and_never_early()

    try:
        machine.start()
        checked()
        machine.make_batch(
            complete=False, fail=False, flush=False, inner_n=0, n=1, nest=0,
            success=False, where=["g0", "g0", "g0", "g0"], within=0,
        )  # fmt: skip
        checked()
        machine.join(group="g1", pick=0)
        checked()
        machine.claim(n=2)
        checked()
        machine.ack(children=[], lost=False, pick=0)
        checked()
        machine.cancel(group="g0", how="ack", pick=0)
        checked()
        machine.ack(children=["g0"], lost=False, pick=0)
        checked()
        machine.cancel(group="g0", how="ack", pick=0)
        checked()
        machine.claim(n=2)
        checked()
        machine.cancel(group="g0", how="ack", pick=0)
        checked()
    finally:
        machine.teardown()
