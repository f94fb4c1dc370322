"""One cluster of a queue (an rqlite cluster, or the embedded SQLite file): its backend, which runs
plans and keeps the state that belongs to that cluster, and the router of a queue that lives on
one cluster. This file is the source; `_sync/cluster.py` is generated from it.

A Worker's round passes through here: `AsyncTransport.settle_and_claim` (queue.py) gives the
checked round to `AsyncClusterRouter.round`, whose backend runs the round's steps
(`rounds.steps`: the plan of the round, and the probe before it or the claim after it where
the protocol says so), sending each batch through the executor (`rqlite_client.py` over HTTP,
or `_io/sqlite.py`); each plan reads its reply."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from .._protocol import batches, publish, refusals, rounds, schedules, schema
from .._protocol.batches import BatchWrite
from .._protocol.core import QueueCore
from .._protocol.http import STATUS_TIMEOUT, applied_index, parse_nodes
from .._protocol.messages import MAX_PUBLISH, NewMessage
from .._protocol.plan import Batch, Known, Plan, Reply, Result, Statement, Steps
from .._protocol.retry import FAILOVER, MIN_ATTEMPT, Retry
from .._protocol.round_spec import CheckedRound
from .._protocol.tenants import TenantsTurnedOn
from .._runtime import LOCAL_OUTCOMES, LOCAL_PUBLISHES, AsyncFanOut, Awaitable
from ..errors import (
    BackendError,
    InvalidArgument,
    OutcomeUnknown,
    QueueError,
    QueueFull,
    Unavailable,
)
from ..types import Lease, NodeView, Round
from .coalesce import AsyncCoalescer

T = TypeVar("T")
Merge = Callable[[Mapping[str, T], Sequence[str]], T]
"""How a sharded queue combines the answers of its shards (by name; the names of those that
did not answer): a `_protocol.sharding` function. One cluster's answer is used as it is."""


class AsyncExecutor(Protocol):
    async def execute(
        self,
        batch: Batch,
        deadline: float,
        *,
        lease_for: float | None = None,
        resend: int = 0,
        final: bool = False,
        idempotent: bool = False,
    ) -> list[Result]: ...

    async def close(self) -> None: ...


class AsyncBackend:
    """One cluster of a queue: runs plans on its executor within a deadline (a
    `time.monotonic()` time), and keeps what belongs to the cluster: whether its tables were
    checked (created or upgraded on first use), how many batches were resent after a lost
    reply, which claim floors last found it empty (the next claim asks with a read first), and
    the clock skew its replies prove (`skew`: its clock minus this client's)."""

    def __init__(
        self,
        executor: AsyncExecutor,
        core: QueueCore,
        *,
        skew: Callable[[], float] = lambda: 0.0,
        binds_rows: bool = False,
    ) -> None:
        self.executor = executor
        self.core = core
        self.skew = skew
        self.binds_rows = binds_rows
        """Whether a publish's rows go as bound parameters (the embedded SQLite binds them for
        less than it parses JSON) or as one JSON text (rqlite: `publish.publish`)."""
        self.schema_checked = False
        self.resent = 0
        """Batches sent again after an unknown outcome (for tests and metrics)."""
        self._closed = False
        self._fences: dict[bool, tuple[Statement, str | None]] = {}
        self.known = Known()
        """What this client has learnt of the cluster's queue: whether its tenants are on
        (from claims' and probes' replies, and from calls that turn them on), and which claim
        floors last found it empty."""

    async def setup(self, deadline: float) -> None:
        """Create the queue's tables if missing, or upgrade them, and check their version."""
        await self._drive(schema.setup(self.core, self.known.learn), self._send, deadline)
        self.schema_checked = True

    async def _drive(
        self,
        steps: Steps[T],
        run: Callable[[Plan[Any], float], Awaitable[Any]],
        deadline: float,
    ) -> T:
        """Run (with `run`) each plan `steps` yields, sending its result, or throwing its
        error, back into it, until it returns."""
        try:
            plan = next(steps)
            while True:
                try:
                    result = await run(plan, deadline)
                except QueueError as exc:
                    plan = steps.throw(exc)
                else:
                    plan = steps.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def run(self, plan: Plan[T], deadline: float) -> T:
        """Run `plan`; after a lost reply, send it again where the plan says that is safe; a
        refusal becomes its typed error (`refusals.refined`), and the plan says what to run
        instead, if anything. Every batch carries the schema fence: if the tables' version
        moved since this client checked it, nothing applied, and the version is checked again
        (a newer one: this client is refused with `SchemaError`; an older one, restored:
        upgraded, and the plan run once more)."""
        try:
            return await self._run(plan, deadline)
        except schema.SchemaChanged:
            self.schema_checked = False
            await self.setup(deadline)
            return await self._run(plan, deadline)

    async def _run(self, plan: Plan[T], deadline: float) -> T:
        if not self.schema_checked:
            await self.setup(deadline)
        if plan.lease_for is not None:
            self.core.check_skew(self.skew(), plan.lease_for)
        try:
            result = await self._sent(plan, deadline)
        except BackendError as exc:
            refused = refusals.refined(self.core, exc)
            if isinstance(refused, TenantsTurnedOn):
                self.known.tenants_on = True
            alternative = None if plan.instead is None else plan.instead(refused)
            if alternative is None:
                if refused is exc:
                    raise
                raise refused from None
            return await self._run(alternative, deadline)
        if plan.tenants_on:
            self.known.tenants_on = True
        return result

    async def _sent(self, plan: Plan[T], deadline: float) -> T:
        """`plan` sent, and after a lost reply sent again if the plan says that is safe."""
        try:
            return await self._send(plan, deadline)
        except OutcomeUnknown:
            if not plan.resend_safe:
                raise
            return await self._resend(plan, deadline)

    async def _send(self, plan: Plan[T], deadline: float) -> T:
        if not plan.batch.statements:
            return plan.read(Reply(plan.batch, []))  # nothing to do (an empty settle, say)
        batch = self._fenced(plan.batch) if self.schema_checked else plan.batch
        results = await self.executor.execute(
            batch,
            deadline,
            lease_for=plan.lease_for,
            final=not plan.resend_safe,
            idempotent=plan.idempotent,
        )
        return plan.read(self._checked(batch, results))

    def _fenced(self, batch: Batch) -> Batch:
        """`batch` with the schema fence at its end (`schema.fence`, made once a backend)."""
        fence = self._fences.get(batch.write)
        if fence is None:
            fence = self._fences[batch.write] = schema.fence(self.core.names, batch.write)
        return batch.last(*fence)

    def _checked(self, batch: Batch, results: list[Result]) -> Reply:
        """The reply, once a fenced read's version is checked (a write's fence fails it)."""
        reply = Reply(batch, results)
        if self.schema_checked and not batch.write:
            schema.check_fence(self.core, reply)
        return reply

    async def _resend(self, plan: Plan[T], deadline: float) -> T:
        """Send a retry-safe batch again after an unknown outcome, until `deadline`."""
        batch = self._fenced(plan.batch if plan.resend is None else plan.resend())
        read = plan.read if plan.read_resent is None else plan.read_resent
        retry = Retry(FAILOVER, deadline, random.random)
        while True:
            wait = retry.wait(time.monotonic())
            if wait is None:
                raise OutcomeUnknown(
                    f"queue {self.core.names.queue!r}: the deadline passed while the outcome "
                    f"of a write was unknown"
                )
            await asyncio.sleep(wait)
            self.resent += 1
            try:
                results = await self.executor.execute(
                    batch, deadline, lease_for=plan.lease_for, resend=retry.failures
                )
                return read(self._checked(batch, results))
            except (Unavailable, OutcomeUnknown) as exc:
                # Whatever this attempt met, the first one may have applied.
                if time.monotonic() + MIN_ATTEMPT >= deadline:
                    raise OutcomeUnknown(
                        f"queue {self.core.names.queue!r}: outcome unknown: {exc}"
                    ) from exc

    async def round(
        self,
        checked: CheckedRound,
        deadline: float,
        *,
        probe_when_idle: bool,
        guard: Callable[[Plan[Round]], Plan[Round]] | None = None,
    ) -> Round:
        """Settle and claim (`rounds.steps`: `probe_when_idle`, a claim alone after one that
        found nothing asks with a read first; `guard`, what the round's plan must pass: a
        sharded queue's epoch check). A waiter for an outcome in this process
        (`result(wait=)`) is woken once a round that settled its message applied."""
        steps = rounds.steps(
            self.core,
            checked,
            self.known,
            probe_when_idle=probe_when_idle,
            guard=guard,
            settled=self._settled if LOCAL_OUTCOMES else None,
        )
        return await self._drive(steps, self.run, deadline)

    def _settled(self, leases: Sequence[Lease]) -> None:
        """Wake the waiters for outcomes of these leases' groups in this process."""
        queue = self.core.names.queue
        LOCAL_OUTCOMES.wake([(queue, lease.group_id) for lease in leases])

    def run_in(self, connection: object, plan: Plan[T]) -> T:
        """Run `plan` on the caller's own connection to the embedded file, in its open
        transaction (`publish(..., connection=)`); the tables must be this code's version."""
        run_in = getattr(self.executor, "run_in", None)
        if run_in is None:
            raise InvalidArgument(
                "connection= is for the embedded SQLite queue; on rqlite, publish in "
                "queue.transaction() with your statements"
            )
        if not self.schema_checked:
            check = schema.schema_version(self.core)
            schema.require_current(
                self.core, check.read(Reply(check.batch, run_in(connection, check.batch)))
            )
            self.schema_checked = True
        batch = self._fenced(plan.batch)
        try:
            results: list[Result] = run_in(connection, batch)
        except BackendError as exc:
            refused = refusals.refined(self.core, exc)
            if isinstance(refused, schema.SchemaChanged):
                self.schema_checked = False  # the next call checks the version again
                raise refused from None
            raise
        return plan.read(self._checked(batch, results))

    async def nodes(self) -> list[NodeView]:
        """The rqlite nodes of this cluster (none for the embedded file): which answer, which
        one leads, how far each has applied the Raft log (`/nodes` asked of the first node
        that answers, then each node's `/status`)."""
        get_json = getattr(self.executor, "get_json", None)
        urls: Sequence[str] = getattr(getattr(self.executor, "endpoints", None), "urls", ())
        if get_json is None:
            return []
        found: list[tuple[str, str, bool, bool]] = []
        for url in urls:
            found = parse_nodes(await get_json(url, "/nodes?nonvoters", STATUS_TIMEOUT))
            if found:
                break
        if not found:  # no node answered: show the configured ones as unreachable
            return [NodeView(url, url, False, False, None) for url in urls]

        def status(addr: str) -> Callable[[], Any]:
            async def ask() -> Any:
                if not addr.startswith(("http://", "https://")):
                    return None
                return await get_json(addr, "/status", STATUS_TIMEOUT)

            return ask

        fan = AsyncFanOut(len(found))
        try:
            statuses = await fan.all([status(addr) for _, addr, _, _ in found])
        finally:
            await fan.close()
        return [
            NodeView(node_id, addr, reachable, leader, applied_index(reply))
            for (node_id, addr, reachable, leader), reply in zip(found, statuses, strict=True)
        ]

    async def close(self) -> None:
        # Its own flag: the shards of a queue share one core, each closes its own executor.
        self.core.closed = True
        if not self._closed:
            self._closed = True
            await self.executor.close()


class AsyncClusterRouter:
    """The router of a queue on one cluster: every call goes to its one backend. An
    `AsyncRouter` (`router.py`), as the shard router (`shards.py`) is over several."""

    scoped_dedup = False
    """Dedup ids are the caller's own (a sharded queue scopes them to their group)."""

    def __init__(self, backend: AsyncBackend) -> None:
        self.backend = backend
        self.publishes: AsyncCoalescer[tuple[Sequence[NewMessage], float], list[int]]
        self.publishes = AsyncCoalescer(self._publish_calls, lambda call: len(call[0]), MAX_PUBLISH)
        """Concurrent publishes on this transport go together (group commit)."""

    @property
    def cluster(self) -> AsyncBackend:
        return self.backend

    @property
    def resent(self) -> int:
        return self.backend.resent

    @property
    def tenants_on(self) -> bool:
        return self.backend.known.tenants_on

    async def setup(self, deadline: float) -> None:
        await self.backend.setup(deadline)

    async def on_group(
        self, group_id: str, plan: Plan[T], deadline: float, *, merge: Merge[T] | None = None
    ) -> T:
        return await self.backend.run(plan, deadline)

    async def everywhere(self, plan: Plan[T], deadline: float, what: str) -> list[T]:
        return [await self.backend.run(plan, deadline)]

    async def gather(
        self, plan: Plan[T], deadline: float, merge: Merge[T], *, workers: bool = False
    ) -> T:
        return await self.backend.run(plan, deadline)

    async def publish(
        self, messages: Sequence[NewMessage], deadline: float, *, bounded: bool = True
    ) -> list[int]:
        if not bounded:  # (follow-ups forwarded from an outbox: never many at once)
            seqs = await self._publish_now(messages, deadline, bounded=False)
        else:
            seqs = await self.publishes.submit((messages, deadline))
        LOCAL_PUBLISHES.wake([self.backend.core.names.queue])
        return seqs

    async def _publish_now(
        self, messages: Sequence[NewMessage], deadline: float, *, bounded: bool = True
    ) -> list[int]:
        backend = self.backend
        tenants_on = backend.known.tenants_on if bounded else None
        return await backend.run(
            publish.plan(
                backend.core, messages, tenants_on=tenants_on, bind_rows=backend.binds_rows
            ),
            deadline,
        )

    async def _publish_calls(
        self, calls: list[tuple[Sequence[NewMessage], float]]
    ) -> list[list[int] | BaseException]:
        """Publish the messages of concurrent calls in one batch (atomic, as one call's are),
        within the earliest deadline. Each call gets its own seqs; if the batch is refused for
        what one call carries (a bound, a tenant, a bad value) each is published on its own,
        so each gets its own outcome; after a lost reply, the calls whose every message has a
        dedup id are sent again on their own (harmless), the others learn `OutcomeUnknown`."""
        if len(calls) == 1:
            return [await self._outcome(*calls[0])]
        try:
            seqs = await self._publish_now(
                [m for messages, _ in calls for m in messages], min(d for _, d in calls)
            )
        except (InvalidArgument, QueueFull, BackendError):
            return [await self._outcome(messages, deadline) for messages, deadline in calls]
        except OutcomeUnknown as exc:
            return [
                await self._outcome(messages, deadline) if publish.resend_safe(messages) else exc
                for messages, deadline in calls
            ]
        except QueueError as exc:  # unavailable, closed...: what each call would have met
            return [exc for _ in calls]
        outcomes: list[list[int] | BaseException] = []
        at = 0
        for messages, _ in calls:
            outcomes.append(seqs[at : at + len(messages)])
            at += len(messages)
        return outcomes

    async def _outcome(
        self, messages: Sequence[NewMessage], deadline: float
    ) -> list[int] | BaseException:
        try:
            return await self._publish_now(messages, deadline)
        except QueueError as exc:
            return exc

    async def round(
        self, checked: CheckedRound, deadline: float, *, probe_when_idle: bool
    ) -> Round:
        return await self.backend.round(checked, deadline, probe_when_idle=probe_when_idle)

    async def settle(self, checked: CheckedRound, deadline: float, what: str) -> Round:
        return await self.backend.round(checked, deadline, probe_when_idle=False)

    async def schedule(self, plan: Plan[T], name: str, group_id: str, deadline: float) -> T:
        return await self.backend.run(plan, deadline)

    async def on_leases(
        self, leases: Sequence[Lease], plan: Callable[[Sequence[Lease]], Plan[T]], deadline: float
    ) -> list[T]:
        """`plan(leases)` on the cluster that holds them."""
        return [await self.backend.run(plan(leases), deadline)]

    async def fire_schedules(self, deadline: float) -> int:
        core = self.backend.core
        due = await self.backend.run(schedules.due_schedules(core), deadline)
        return await self.backend.run(schedules.fire(core, due), deadline) if due else 0

    def batch_shard(self, parent: str | None) -> str:
        return ""

    async def write_batch(self, write: BatchWrite, deadline: float) -> list[int | None]:
        written = await self.backend.run(batches.write_plan(self.backend.core, write), deadline)
        LOCAL_PUBLISHES.wake([self.backend.core.names.queue])
        return written.seqs

    async def on_batch(self, batch_id: str, plan: Plan[T], deadline: float) -> T:
        return await self.backend.run(plan, deadline)

    async def dead(
        self, plan: Plan[int], deadline: float, *, seqs: object, shard: str | None, what: str
    ) -> int:
        if shard is not None:
            raise InvalidArgument(f"{what}: shard= is for a sharded queue; this one has one")
        return await self.backend.run(plan, deadline)

    async def transaction(
        self, statements: Sequence[Statement], messages: Sequence[NewMessage], deadline: float
    ) -> list[int]:
        plan = publish.transaction(self.backend.core, statements, messages)
        return await self.backend.run(plan, deadline)

    async def nodes(self) -> list[NodeView]:
        return await self.backend.nodes()

    async def close(self) -> None:
        await self.backend.close()
