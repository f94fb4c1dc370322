"""What only a sharded queue writes on its shards: the shard list's epoch, the waits of the
groups that move, and the outbox of follow-ups to other shards' groups.

While a sharded queue's shard list changes (sharding.py), every publish batch of a sharded
client starts with the list's epoch (`guarded`): the stored one is raised to the client's,
and a client with an older list fails on NOT NULL of `meta.value` (STALE_EPOCH_ERROR: told
apart from the schema fence's), so it cannot put a message on the shard a group has left. A
group that moves publishes on its new shard, held there (`group_states.WAITING`) while its
old shard still has its messages; the hold ends when the old shard has none left.

A settlement's follow-ups whose group lives on another shard are written to the settling
shard's outbox in the settlement's transaction (`rounds`), then forwarded to their shard in
id order with a dedup id made from their id (`sharding.outbox_message`), then deleted
(`forwarded`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..errors import QueueError
from .core import QueueCore
from .messages import NewMessage
from .names import Names, Sql, as_json
from .plan import Batch, Builder, Plan, Reply, Statement, nothing

T = TypeVar("T")

STALE_EPOCH_ERROR = "NOT NULL constraint failed: {meta}.value"
"""How a guarded batch fails on a shard that was given a newer shard list."""

# The stored epoch raised to this client's, or, if the stored one is higher, set to NULL,
# which NOT NULL refuses, failing the transaction.
_EPOCH = Sql(
    """
    INSERT INTO {meta} (key, value) VALUES ('shard_epoch', :e)
    ON CONFLICT ("key") DO UPDATE SET value = CASE WHEN value > excluded.value THEN NULL
      ELSE excluded.value END
    """
)
# Hold these groups (until `release_waits`) unless an operator holds them already.
_WAIT = Sql(
    """
    INSERT INTO {groups} (group_id, priority, ready, held)
    SELECT value, 0, {EMPTY.ready}, {WAITING.held} FROM json_each(:gs) WHERE true
    ON CONFLICT (group_id) DO UPDATE SET held = {WAITING.held} WHERE {free}
    """
)
_PRESENT = Sql(
    """
    SELECT DISTINCT group_id FROM {messages}
    WHERE group_id IN (SELECT value FROM json_each(:gs))
    """
)
_RELEASE_WAITS = Sql(
    """
    UPDATE {groups} SET held = {FREE.held}
    WHERE {waiting} AND group_id IN (SELECT value FROM json_each(:gs))
    """
)
_WAITING = Sql("SELECT group_id FROM {groups} WHERE {waiting} LIMIT :limit")
_STORED_EPOCH = Sql("""SELECT value FROM {meta} WHERE "key" = 'shard_epoch'""")


def epoch_guard(n: Names, epoch: int) -> Statement:
    """The statement a sharded client's write starts with (see the top)."""
    return Statement(_EPOCH(n), {"e": epoch})


def guarded(core: QueueCore, plan: Plan[T], epoch: int, held: Sequence[str] = ()) -> Plan[T]:
    """`plan` behind the shard list's epoch; the groups in `held` wait on this shard until
    their old shard has delivered their messages. (A read goes as it is: it changes nothing a
    stale list could get wrong.)"""
    if not plan.batch.write:
        return plan
    guards = [epoch_guard(core.names, epoch)]
    if held:
        guards.append(Statement(_WAIT(core.names), {"gs": as_json(list(held))}))
    resend, instead = plan.resend, plan.instead

    def guarded_instead(error: QueueError) -> Plan[T] | None:
        alternative = None if instead is None else instead(error)
        return None if alternative is None else guarded(core, alternative, epoch, held)

    return dataclasses.replace(
        plan,
        batch=plan.batch.first(guards),
        resend=None if resend is None else lambda: resend().first(guards),
        instead=None if instead is None else guarded_instead,
    )


def is_stale_epoch(core: QueueCore, error: QueueError) -> bool:
    """Whether a guarded batch failed because its shard has a newer shard list."""
    return STALE_EPOCH_ERROR.format(meta=core.names.meta) in str(error)


def present_batch(n: Names, group_ids: Sequence[str], *, epoch: int) -> Batch:
    """Which of `group_ids` have messages here: a write (it raises the stored epoch), so that
    from then on no client with an older list adds any."""
    b = Builder()
    b.add(_EPOCH(n), {"e": epoch})
    b.add(_PRESENT(n), {"gs": as_json(list(group_ids))}, slot="present")
    return b.build()


def groups_present(core: QueueCore, group_ids: Sequence[str], epoch: int) -> Plan[set[str]]:
    def read(reply: Reply) -> set[str]:
        return {row[0] for row in reply["present"].rows}

    return Plan(present_batch(core.names, group_ids, epoch=epoch), read, resend_safe=True)


def release_waits(core: QueueCore, group_ids: Sequence[str]) -> Plan[None]:
    b = Builder()
    b.add(_RELEASE_WAITS(core.names), {"gs": as_json(list(group_ids))})
    return Plan(b.build(), nothing)


def waiting_groups(core: QueueCore, limit: int) -> Plan[list[str]]:
    b = Builder(write=False)
    b.add(_WAITING(core.names), {"limit": limit}, slot="waiting")
    return Plan(b.build(), lambda reply: [row[0] for row in reply["waiting"].rows])


def shard_epoch(core: QueueCore) -> Plan[int]:
    b = Builder(write=False)
    b.add(_STORED_EPOCH(core.names), slot="epoch")

    def read(reply: Reply) -> int:
        rows = reply["epoch"].rows
        return int(rows[0][0]) if rows else 0

    return Plan(b.build(), read)


# --------------------------------------------------------------------------- the outbox


@dataclass(frozen=True, slots=True)
class OutboxRow:
    id: int
    message: NewMessage
    counts: str | None = None
    """A settlement's counts for a batch of another shard (batch_counts.Counts; then `message` is
    none)."""

    @property
    def counts_batch(self) -> str:
        """The batch its counts are for."""
        return str(json.loads(self.counts or "[]")[0])


# The oldest follow-ups waiting to be forwarded, in the order they were written: `id`, then a
# message's fields as far as the outbox keeps them (NewMessage's names).
_KEPT = (*(f for f in NewMessage._fields if f not in ("debounce", "due_by")), "counts")
_OLDEST = Sql("SELECT id, {columns} FROM {outbox} ORDER BY id LIMIT :n", columns=", ".join(_KEPT))
_FORWARDED = Sql("DELETE FROM {outbox} WHERE id IN (SELECT value FROM json_each(:ids))")


def read_outbox(core: QueueCore, limit: int) -> Plan[list[OutboxRow]]:
    """The oldest follow-ups (and batches' counts) waiting to be forwarded (the leader's own
    copy: a row committed a moment ago may be missed, and is found next time)."""
    core.now()
    b = Builder(write=False, local=True)
    b.add(_OLDEST(core.names), {"n": limit}, slot="outbox")
    return Plan(b.build(), outbox_rows)


def outbox_rows(reply: Reply) -> list[OutboxRow]:
    rows = []
    for r in reply["outbox"].rows:
        kept = dict(zip(_KEPT, r[1:], strict=True))
        rows.append(
            OutboxRow(
                int(r[0]),
                NewMessage(
                    str(kept["group_id"]),
                    str(kept["event"]),
                    int(kept["priority"]),
                    _text_or_none(kept["dedup_id"]),
                    float(kept["due"]),
                    None if kept["expires"] is None else float(kept["expires"]),
                    _text_or_none(kept["tenant"]),
                    headers=_text_or_none(kept["headers"]),
                    keep=None if kept["keep"] is None else float(kept["keep"]),
                    batch=_text_or_none(kept["batch"]),
                ),
                _text_or_none(kept["counts"]),
            )
        )
    return rows


def _text_or_none(value: object) -> str | None:
    return None if value is None else str(value)


def forwarded(core: QueueCore, ids: Sequence[int]) -> Plan[int]:
    """Forget the follow-ups that reached their shard (safe to resend: a second delete finds
    none)."""
    b = Builder()
    b.add(_FORWARDED(core.names), {"ids": as_json(list(ids))}, slot="forwarded")

    def read(reply: Reply) -> int:
        return reply["forwarded"].rows_affected

    return Plan(b.build(), read, resend_safe=True)
