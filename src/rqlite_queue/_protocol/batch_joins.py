"""Publishes that join batches: the messages of a publish that name a batch are counted in it
in the publish's own transaction, and the publish fails (`BatchDone`, nothing written) if one
of their batches is done or unknown here (see batches.py)."""

from __future__ import annotations

from collections.abc import Sequence

from .messages import NewMessage
from .names import Fields, Names, Sql, as_json
from .plan import Builder

BATCH_DONE_ERROR = "NOT NULL constraint failed: {batch_sources}.last_id"
"""How a write fails when it names a batch that is done, or that this cluster does not know
(`BatchDone`)."""
TRIPWIRE = "INSERT INTO {batch_sources} (source, last_id) SELECT '', NULL"
"""The start of a statement that fails its write (BATCH_DONE_ERROR) where it selects a row."""


# ------------------------------------------------------------------ publishes that join

JOIN = Fields("j", ("batch", "count"))
_JOIN_TRIPWIRE = Sql(
    TRIPWIRE
    + """
    FROM json_each(:joins) j WHERE NOT EXISTS (
      SELECT 1 FROM {batches} WHERE id = {j.batch} AND done_at IS NULL)
    """,
    j=JOIN,
)
_JOINED = Sql(
    """
    UPDATE {batches} AS b SET pending = b.pending + x.c, total = b.total + x.c, stamp = :now
    FROM (SELECT {j.batch} i, {j.count} c FROM json_each(:joins) j) x WHERE b.id = x.i
    """,
    j=JOIN,
)


def joins(messages: Sequence[NewMessage]) -> list[tuple[str, int]]:
    """The batches these messages join, each with how many of them."""
    counts: dict[str, int] = {}
    for m in messages:
        if m.batch is not None:
            counts[m.batch] = counts.get(m.batch, 0) + 1
    return list(counts.items())


def count_joins(b: Builder, n: Names, joined: Sequence[tuple[str, int]], now: float) -> None:
    """Messages of a publish joining batches of this cluster: counted in them, or the
    publish fails (BATCH_DONE_ERROR) if one of them is done or unknown."""
    if not joined:
        return
    items = as_json(joined)
    b.add(_JOIN_TRIPWIRE(n), {"joins": items})
    b.add(_JOINED(n), {"joins": items, "now": now})
