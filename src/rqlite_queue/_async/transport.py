"""The transports: thin shells that run `core` plans on a backend. This file is the source;
`_sync/transport.py` is generated from it (`scripts/gen_sync.py`): edit here, then
`make generate`."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from ..codec import Codec
from ..core import DEFAULT_DEDUP_WINDOW, DEFAULT_MAX_PAYLOAD_BYTES, Plan, PublishItem, QueueCore
from ..errors import InvalidArgument, SchemaError, Unavailable
from ..lease import DeadLetter, Lease, Stats
from ..rqlite_http import parse_endpoints, redact
from ..sql import SCHEMA_VERSION, Batch, Result
from ..sqlite_backend import AsyncSqliteExecutor
from .rqlite_client import AsyncRqliteClient

T = TypeVar("T")


class AsyncExecutor(Protocol):
    async def execute(self, batch: Batch) -> list[Result]: ...

    async def close(self) -> None: ...


class AsyncTransport:
    """A queue with per-group exclusivity on one backend (see the contract in the docs).

    Build one with `from_url`, or `AsyncRqliteTransport(url)` / `AsyncSqliteTransport(path)`.
    The tables are created on first use."""

    def __init__(
        self, executor: AsyncExecutor, core: QueueCore, *, replay_deadline: float = 15.0
    ) -> None:
        self._executor = executor
        self._core = core
        self._schema_checked = False
        self.replay_deadline = replay_deadline
        self.resent = 0
        """How many batches were sent again after an unknown outcome (for tests, metrics)."""

    @property
    def queue(self) -> str:
        return self._core.names.queue

    @property
    def clock(self) -> Callable[[], float]:
        """The clock lease deadlines are computed with."""
        return self._core.clock

    @classmethod
    async def from_url(
        cls, url: str, *, connect_timeout: float = 30.0, **options: Any
    ) -> AsyncTransport:
        """`sqlite:///path.db` (embedded) or `http(s)://host:port[,host:port...]` (rqlite).
        Waits until the backend answers and, for rqlite, has a leader; then creates the
        tables if missing. Raises `Unavailable` after `connect_timeout` seconds."""
        transport: AsyncTransport
        if not isinstance(url, str):
            raise InvalidArgument(f"not a URL: {url!r}")
        if url.startswith("sqlite://"):
            transport = AsyncSqliteTransport(_sqlite_path(url), **options)
        elif url.startswith(("http://", "https://")):
            transport = AsyncRqliteTransport(url, **options)
        else:
            raise InvalidArgument(f"unknown URL scheme in {url!r} (use sqlite, http or https)")
        give_up = time.monotonic() + connect_timeout
        while True:
            try:
                # No single attempt may outlast what is left of connect_timeout.
                await transport._with_deadline(max(0.1, give_up - time.monotonic()))
                return transport
            except Unavailable as exc:
                if time.monotonic() >= give_up:
                    await transport.close()
                    raise Unavailable(
                        f"{redact(url)}: not available after {connect_timeout:g}s: {exc}"
                    ) from exc
                await asyncio.sleep(0.2)
            except BaseException:
                await transport.close()
                raise

    async def _with_deadline(self, seconds: float) -> None:
        """`setup()`, with the backend's own retry deadline capped at `seconds`."""
        await self.setup()

    async def setup(self) -> None:
        """Create the queue's tables if missing, and check their version."""
        version = await self._send(self._core.setup())
        if version > SCHEMA_VERSION:
            raise SchemaError(
                f"queue {self.queue!r} has schema version {version}; this library knows "
                f"{SCHEMA_VERSION}: upgrade rqlite-queue"
            )
        self._schema_checked = True

    async def _send(self, plan: Plan[T]) -> T:
        return plan.read(await self._executor.execute(plan.batch))

    async def _run(self, plan: Plan[T]) -> T:
        if not self._schema_checked:
            await self.setup()
        try:
            return await self._send(plan)
        except Unavailable:
            if plan.replay is None:
                raise
            return await self._replay(plan, plan.replay)

    async def _replay(self, plan: Plan[T], read: Callable[[Sequence[Result]], T]) -> T:
        """Send a retry-safe batch again after an unknown outcome, until `replay_deadline`."""
        give_up = time.monotonic() + self.replay_deadline
        backoff = 0.1
        while True:
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            self.resent += 1
            try:
                return read(await self._executor.execute(plan.batch))
            except Unavailable:
                if time.monotonic() + backoff > give_up:
                    raise
                backoff = min(backoff * 2, 1.0)

    # ------------------------------------------------------------------------ the seed's calls

    async def publish(
        self, group_id: str, event: Any, priority: int = 0, *, dedup_id: str | None = None
    ) -> int:
        """Append `event` to `group_id`'s FIFO; returns its seq. `priority` (0-4) is fixed by
        the publish that creates the group. With `dedup_id`, a repeat within the dedup window
        publishes nothing and returns the first seq."""
        return await self._run(self._core.publish(group_id, event, priority, dedup_id))

    async def claim(self, worker_id: str, visibility: float, min_priority: int = 0) -> Lease | None:
        """Lease the head of the claimable group claimed least recently, for `visibility`
        seconds; None when nothing is claimable."""
        leases = await self._run(self._core.claim(worker_id, visibility, 1, min_priority))
        return leases[0] if leases else None

    async def ack(self, lease: Lease) -> None:
        """Done: remove the message and free its group. `LeaseLost` if the lease no longer
        holds the group."""
        await self._run(self._core.ack([lease]))

    async def nack(self, lease: Lease, delay: float = 0.0) -> None:
        """Give the message back: claimable now (`delay=0`) or its group parked for `delay`
        seconds. The message stays its group's head."""
        await self._run(self._core.nack(lease, delay))

    async def close(self) -> None:
        await self._executor.close()

    async def __aenter__(self: _Self) -> _Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------------ beyond the seed

    async def publish_many(self, items: Iterable[PublishItem]) -> list[int]:
        """Publish many messages in one round trip, atomically, in order. Items are
        `(group_id, event)`, `(group_id, event, priority)` or mappings with those keys and
        optionally `dedup_id`."""
        return await self._run(self._core.publish_many(items))

    async def claim_many(
        self, worker_id: str, visibility: float, n: int, min_priority: int = 0
    ) -> list[Lease]:
        """Up to `n` leases from `n` distinct groups, in one round trip."""
        return await self._run(self._core.claim(worker_id, visibility, n, min_priority))

    async def ack_many(self, leases: Sequence[Lease]) -> None:
        """Ack several leases in one round trip. Those that still hold are acked; if any did
        not, `LeaseLost` lists them."""
        if leases:
            await self._run(self._core.ack(list(leases)))

    async def extend(self, lease: Lease, visibility: float) -> Lease:
        """Heartbeat: the lease now lapses `visibility` seconds from now. Returns the lease
        with its new `expires_at`."""
        return await self._run(self._core.extend(lease, visibility))

    async def dead_letter(self, lease: Lease, reason: str) -> None:
        """Move the message to the dead-letter table, with `reason`, and free its group."""
        await self._run(self._core.dead_letter(lease, reason))

    async def dead_letters(
        self, limit: int = 100, *, group_id: str | None = None
    ) -> list[DeadLetter]:
        return await self._run(self._core.dead_letters(limit, group_id))

    async def requeue_dead(self, seqs: Sequence[int] | None = None) -> int:
        """Put dead letters (all, or those seqs) back at the tail of their groups."""
        return await self._run(self._core.requeue_dead(seqs))

    async def purge_dead(self, seqs: Sequence[int] | None = None) -> int:
        """Delete dead letters (all, or those seqs) for good."""
        return await self._run(self._core.purge_dead(seqs))

    async def stats(self) -> Stats:
        return await self._run(self._core.stats())

    async def peek(self, group_id: str, limit: int = 10) -> list[tuple[int, Any]]:
        """The next messages of a group, as (seq, event), without leasing them."""
        return await self._run(self._core.peek(group_id, limit))


_Self = TypeVar("_Self", bound=AsyncTransport)


class AsyncRqliteTransport(AsyncTransport):
    """The queue on an rqlite cluster: `url` is `http(s)://[user:pass@]host:port[,host:port]`.
    Each operation is one HTTP request."""

    def __init__(
        self,
        url: str,
        timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        *,
        queue: str = "default",
        codec: Codec | type[Any] | None = None,
        auth: tuple[str, str] | None = None,
        verify: bool | str = True,
        deadline: float = 15.0,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
        event_hooks: dict[str, list[Any]] | None = None,
    ) -> None:
        core = QueueCore(
            queue=queue,
            codec=codec,
            clock=clock,
            max_payload_bytes=max_payload_bytes,
            dedup_window=dedup_window,
        )
        self.client = AsyncRqliteClient(
            parse_endpoints(url, auth),
            timeout=timeout,
            deadline=deadline,
            verify=verify,
            event_hooks=event_hooks,
        )
        super().__init__(self.client, core, replay_deadline=deadline)

    async def _with_deadline(self, seconds: float) -> None:
        saved = self.client.deadline
        self.client.deadline = min(saved, seconds)
        try:
            await self.setup()
        finally:
            self.client.deadline = saved


class AsyncSqliteTransport(AsyncTransport):
    """The embedded queue on a local SQLite file, shared safely by threads and processes."""

    def __init__(
        self,
        path: str,
        clock: Callable[[], float] = time.time,
        *,
        queue: str = "default",
        codec: Codec | type[Any] | None = None,
        busy_timeout: float = 30.0,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        dedup_window: float = DEFAULT_DEDUP_WINDOW,
    ) -> None:
        core = QueueCore(
            queue=queue,
            codec=codec,
            clock=clock,
            max_payload_bytes=max_payload_bytes,
            dedup_window=dedup_window,
        )
        super().__init__(AsyncSqliteExecutor(path, busy_timeout=busy_timeout), core)


def _sqlite_path(url: str) -> str:
    path = url.removeprefix("sqlite://")
    if not path.startswith("/") or path == "/":
        raise InvalidArgument("sqlite URL needs a path: sqlite:///relative.db or sqlite:////abs.db")
    return path[1:] or ":memory:"
