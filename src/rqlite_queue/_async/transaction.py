"""Publishing inside the caller's own transaction: `async with queue.transaction() as tx:`
collects the caller's statements (`tx.execute`) and publishes (`tx.publish`), and sends them
as one transaction when the block ends: one request, one Raft entry on rqlite, all of it or
none. This file is the source; `_sync/transaction.py` is generated from it."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Unpack

from .._protocol import messages
from .._protocol.core import QueueCore
from .._protocol.messages import GivenMessage, Message, NewMessage
from .._protocol.plan import Params, Statement
from ..errors import InvalidArgument
from ..types import PublishItem, PublishOptions
from .router import AsyncRouter


@dataclass
class Published:
    """What a publish of a transaction gave, once the transaction committed."""

    seqs: list[int] = field(default_factory=list)

    @property
    def seq(self) -> int:
        """The seq of a single `publish` (the first of a `publish_many`)."""
        if not self.seqs:
            raise InvalidArgument("the transaction has not committed (yet)")
        return self.seqs[0]


class AsyncTransaction:
    """Your statements and publishes, sent as one transaction when the `async with` block ends
    without an exception (an exception sends nothing): all of them apply, or none. Your
    tables live in the same database as the queue (on a sharded queue: the shard of the
    publishes' groups, which must be one). A lost reply raises `OutcomeUnknown`, unless every
    publish carries a dedup id: then the transaction is sent again, and applies once (a
    transaction whose publishes all repeat dedup ids seen within the dedup window is one that
    applied already: nothing of it applies again, and `Published` has the first seqs)."""

    def __init__(self, core: QueueCore, router: AsyncRouter, deadline: float) -> None:
        self._core = core
        self._router = router
        self._deadline = deadline
        self._statements: list[Statement] = []
        self._messages: list[NewMessage] = []
        self._published: list[tuple[Published, int, int]] = []
        self._done = False

    def execute(self, sql: str, params: Params = ()) -> None:
        """One statement of yours (a write: its rows are not returned), run in order with the
        publishes, when the transaction commits."""
        self._open()
        if not isinstance(sql, str) or not sql.strip():
            raise InvalidArgument("execute takes an SQL statement (a non-empty string)")
        self._statements.append(Statement(sql, params))

    def publish(
        self, group_id: str, event: Any, priority: int = 0, **options: Unpack[PublishOptions]
    ) -> Published:
        """As `queue.publish` (its keywords: `PublishOptions`), when the transaction commits
        (checked now). `batch`: the message joins that batch in this transaction, counted in
        it as the transaction applies (`BatchDone` if it is done: nothing applies); on a
        sharded queue the batch must live on the transaction's shard (`CrossShard`
        otherwise: nothing is sent), since its count and the message are one write."""
        return self._add([Message(group_id, event, priority, **options)])

    def publish_many(self, items: Iterable[PublishItem]) -> Published:
        """As `queue.publish_many`, when the transaction commits (checked now)."""
        return self._add(Message.parse_many(items))

    def _add(self, given: Sequence[GivenMessage]) -> Published:
        self._open()
        checked = messages.checked(self._core, given, scoped=self._router.scoped_dedup)
        published = Published()
        self._published.append((published, len(self._messages), len(checked)))
        self._messages += checked
        return published

    def _open(self) -> None:
        if self._done:
            raise InvalidArgument("this transaction has ended: start another")

    async def commit(self) -> None:
        """Send it (the end of the `async with` block does)."""
        self._open()
        self._done = True
        if not self._statements and not self._messages:
            return
        deadline = time.monotonic() + self._deadline
        seqs = await self._router.transaction(self._statements, self._messages, deadline)
        for published, start, count in self._published:
            published.seqs = seqs[start : start + count]

    async def __aenter__(self) -> AsyncTransaction:
        return self

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            await self.commit()
        else:
            self._done = True
