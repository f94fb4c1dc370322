"""How a queue reaches its cluster(s): the interface the queue (`queue.py`) and its
transactions (`transaction.py`) are written against. Two routers implement it: the router of a
queue on one cluster (`cluster.AsyncClusterRouter`: every call to its one backend) and the
router of a sharded queue (`shards.AsyncShardRouter`: each call to the shard or shards it
concerns, answers merged). This file is the source; `_sync/router.py` is generated from it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from .._protocol.batches import BatchWrite
from .._protocol.messages import NewMessage
from .._protocol.plan import Plan, Statement
from .._protocol.round_spec import CheckedRound
from ..types import Lease, NodeView, Round
from .cluster import AsyncBackend, Merge

T = TypeVar("T")


class AsyncRouter(Protocol):
    """Each method takes its call's plan (or checked arguments) and its deadline (a
    `time.monotonic()` time)."""

    @property
    def scoped_dedup(self) -> bool:
        """Whether dedup ids are scoped to their group (a sharded queue's are: the same id in
        two groups is two messages) or the caller's own."""
        ...

    @property
    def cluster(self) -> AsyncBackend | None:
        """The backend of a queue on one cluster (for a backup, a publish on the caller's
        connection, a shard given to a sharded queue); None on shards."""
        ...

    @property
    def resent(self) -> int:
        """Batches sent again after an unknown outcome (for tests and metrics)."""
        ...

    @property
    def tenants_on(self) -> bool:
        """Whether this client has learnt that the queue's tenants are on (on a sharded
        queue: on a shard), from its setup and its claims' replies."""
        ...

    async def setup(self, deadline: float) -> None:
        """Create or upgrade the tables (on a sharded queue: of every shard that answers)."""
        ...

    async def on_group(
        self, group_id: str, plan: Plan[T], deadline: float, *, merge: Merge[T] | None = None
    ) -> T:
        """Where the group's messages are (merged by `merge`, if given, as `gather` merges).
        A plan that `empties_group` may let a moving group's new shard serve it."""
        ...

    async def everywhere(self, plan: Plan[T], deadline: float, what: str) -> list[T]:
        """On every shard, each answer (`what` names the call in errors)."""
        ...

    async def gather(
        self, plan: Plan[T], deadline: float, merge: Merge[T], *, workers: bool = False
    ) -> T:
        """From every shard that answers, merged; `workers`: a call of the workers' loop."""
        ...

    async def publish(
        self, messages: Sequence[NewMessage], deadline: float, *, bounded: bool = True
    ) -> list[int]:
        """The seqs of `messages`; `bounded`: False for follow-ups forwarded from an outbox."""
        ...

    async def round(
        self, checked: CheckedRound, deadline: float, *, probe_when_idle: bool
    ) -> Round:
        """A Worker's round: its settlements and its claim, in one round trip per cluster."""
        ...

    async def settle(self, checked: CheckedRound, deadline: float, what: str) -> Round:
        """Settlements alone (`ack`, `nack`, `extend`, `dead_letter`, `ack_many`)."""
        ...

    async def on_leases(
        self, leases: Sequence[Lease], plan: Callable[[Sequence[Lease]], Plan[T]], deadline: float
    ) -> list[T]:
        """`plan` of the leases of each cluster, on it (a sharded queue's: each shard's at
        once; a shard that does not answer is left out)."""
        ...

    async def schedule(self, plan: Plan[T], name: str, group_id: str, deadline: float) -> T:
        """Store a schedule (on its group's shard)."""
        ...

    async def fire_schedules(self, deadline: float) -> int:
        """Fire the schedules that are due; how many ticks were published."""
        ...

    async def dead(
        self, plan: Plan[int], deadline: float, *, seqs: object, shard: str | None, what: str
    ) -> int:
        """Requeue or purge dead letters (those seqs of `shard` on a sharded queue)."""
        ...

    async def transaction(
        self, statements: Sequence[Statement], messages: Sequence[NewMessage], deadline: float
    ) -> list[int]:
        """The caller's statements and publishes, as one transaction; the publishes' seqs."""
        ...

    def batch_shard(self, parent: str | None) -> str:
        """The shard a new batch lives on ("" on one cluster): its parent's, or one chosen
        among the shards that take new groups."""
        ...

    async def write_batch(self, write: BatchWrite, deadline: float) -> list[int | None]:
        """A batch's write (its row, its messages, its close) in one transaction on its
        cluster; its messages' seqs (None for those still on their way to their shard)."""
        ...

    async def on_batch(self, batch_id: str, plan: Plan[T], deadline: float) -> T:
        """On the cluster the batch lives on."""
        ...

    async def nodes(self) -> list[NodeView]: ...

    async def close(self) -> None: ...
