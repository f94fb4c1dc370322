"""A batch's id, made by the client: 32 hex digits, after `shard/` on a sharded queue (the
shard it lives on). The first 12 are the creation time in milliseconds and the 13th its depth
(1: a batch within none; a batch within another is one deeper, and lives on its parent's
shard), so ids sort by creation and a settlement knows how deep its batch's completion may
cascade without asking."""

from __future__ import annotations

import re

from ..errors import InvalidArgument
from ..types import MAX_BATCH_DEPTH
from .checks import show

BATCH_ID = re.compile(r"(?:([a-z0-9][a-z0-9_.:-]{0,62})/)?([0-9a-f]{12})([1-9])([0-9a-f]{19})")


class BatchIds:
    """Fresh batch ids: the time in milliseconds (never going back within one client), the
    depth, a count of the ids made within that millisecond (3 hex digits), then 16 of a random
    token. So a client's ids sort in the order it made them, and any two clients' by the
    millisecond."""

    def __init__(self) -> None:
        self.last = 0
        self.count = 0

    def next(self, now: float, token: str, *, shard: str = "", depth: int = 1) -> str:
        ms = max(self.last, int(now * 1000) & (2**48 - 1))
        self.count = self.count + 1 if ms == self.last else 0
        if self.count > 0xFFF:  # (4,096 ids in one millisecond: borrow the next one)
            ms, self.count = ms + 1, 0
        self.last = ms
        hexed = f"{ms:012x}{depth:x}{self.count:03x}{token[:16]:0>16}"
        return f"{shard}/{hexed}" if shard else hexed


def check_batch_id(value: object, *, sharded: bool) -> str:
    """A batch id as this queue makes them (`InvalidArgument` otherwise)."""
    match = BATCH_ID.fullmatch(value) if isinstance(value, str) else None
    if match is None or int(match.group(3)) > MAX_BATCH_DEPTH:
        raise InvalidArgument(f"not a batch id: {show(value)}")
    if sharded and match.group(1) is None:
        raise InvalidArgument(f"batch id {show(value)} names no shard: not one of a sharded queue")
    if not sharded and match.group(1) is not None:
        raise InvalidArgument(f"batch id {show(value)} is a sharded queue's")
    return value  # type: ignore[return-value]


def depth_of(batch_id: str) -> int:
    """How deep a (checked) batch id's batch is: 1 for a batch within none."""
    return int(batch_id.rpartition("/")[2][12])
