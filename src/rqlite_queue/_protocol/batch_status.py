"""The status of batches: one batch, or a page of them (reads)."""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidArgument
from ..types import BATCH_STATES, MAX_BATCH, BatchFailure, BatchStatus, batch_shard
from .batch_ids import check_batch_id
from .checks import check_id, check_int, show
from .core import QueueCore
from .names import Sql
from .plan import Builder, Plan, Reply


def check_state(state: object) -> str | None:
    if state is None:
        return None
    if not isinstance(state, str) or state not in BATCH_STATES:
        raise InvalidArgument(f"state must be one of {', '.join(BATCH_STATES)}, got {show(state)}")
    return state


_COLUMNS = """
    id, open, done_at, total, pending, succeeded, failed, cancelled, failures, parent,
    aborted, created_at, expires_at
    """
_STATUS = Sql("SELECT " + _COLUMNS + " FROM {batches} WHERE id = {text.b}")


@functools.cache
def _listing(state: str | None) -> Sql:
    where = {
        None: "",
        "open": "AND open = 1 AND done_at IS NULL",
        "closed": "AND open = 0 AND done_at IS NULL",
        "done": "AND done_at IS NOT NULL",
    }[state]
    return Sql(
        "SELECT "
        + _COLUMNS
        + " FROM {batches} WHERE substr(id, -32) > :after {where} ORDER BY substr(id, -32) "
        "LIMIT :n",
        where=where,
    )


def _status(row: Sequence[Any], shard: str = "") -> BatchStatus:
    (
        batch_id,
        open_,
        done_at,
        total,
        pending,
        ok,
        bad,
        gone,
        failures,
        parent,
        aborted,
        created_at,
        expires_at,
    ) = row
    batch_id = str(batch_id)
    home = batch_shard(batch_id)
    return BatchStatus(
        id=batch_id,
        open=bool(open_) and done_at is None,
        done=done_at is not None,
        total=int(total),
        pending=int(pending),
        succeeded=int(ok),
        failed=int(bad),
        cancelled=int(gone),
        failures=tuple(
            BatchFailure(str(f[0]), int(f[1]), str(f[2]), str(f[3] or home), f[4] or None)
            for f in json.loads(failures or "[]")
        ),
        parent=None if parent is None else str(parent),
        aborted=None if aborted is None else str(aborted),
        created_at=float(created_at),
        done_at=None if done_at is None else float(done_at),
        kept_until=None if expires_at is None else float(expires_at),
        shard=home,
    )


def status_plan(core: QueueCore, batch_id: object, *, sharded: bool) -> Plan[BatchStatus | None]:
    """One batch (a read)."""
    checked = check_batch_id(batch_id, sharded=sharded)
    core.now()
    b = Builder(write=False)
    b.add(_STATUS(core.names), {"b": json.dumps(checked)}, slot="batch")

    def read(reply: Reply) -> BatchStatus | None:
        rows = reply["batch"].rows
        return _status(rows[0]) if rows else None

    return Plan(b.build(), read, resend_safe=True)


def list_plan(
    core: QueueCore, *, state: object, limit: object, after: object
) -> Plan[list[BatchStatus]]:
    """A page of the batches, oldest first (a read)."""
    chosen = check_state(state)
    check_int(limit, "limit", 1, MAX_BATCH)
    cursor = ""
    if after is not None:
        check_id(after, "after")
        cursor = str(after)[-32:]
    core.now()
    b = Builder(write=False)
    b.add(_listing(chosen)(core.names), {"after": cursor, "n": limit}, slot="batches")

    def read(reply: Reply) -> list[BatchStatus]:
        return [_status(row) for row in reply["batches"].rows]

    return Plan(b.build(), read, resend_safe=True)
