"""Each operation whose arguments travel through several layers, as one typed value with its
checks beside it: a publish (`Message`, with the one parser of `publish_many` items), a
schedule (`ScheduleSpec`) and a round (`RoundSpec`, checked into a `CheckedRound`). The queue
builds one from its method's arguments; the core turns the checked value into a plan; routers
pass it on untouched. So a new keyword is two edits: the public method's signature, and a
field here with its check and meaning (plus the SQL, if it is stored)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import InvalidArgument
from . import sql
from .cadence import check_cadence, next_after
from .checks import (
    MAX_SECONDS,
    check_bool,
    check_id,
    check_seconds,
)
from .messages import Message, checked_message

T = TypeVar("T")
R = TypeVar("R", bound=tuple[Any, ...])


MAX_REASON_BYTES = 64 * 1024
TOKEN_SUFFIX_BYTES = 64
"""A lease token is its worker id, ':' and a random part of at most this many bytes."""
EXPIRED = "expired"
"""The reason of the dead letters of messages whose ttl passed before they were delivered."""


def at_index(index: int, check: Callable[[Any], T], item: Any) -> T:
    """`check(item)`, its `InvalidArgument` marked with the item's position in its list."""
    try:
        return check(item)
    except InvalidArgument as exc:
        exc.index = index
        raise


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """A periodic publish, as given to `schedule()`."""

    name: Any
    group_id: Any
    event: Any
    every: Any = None
    cron: Any = None
    priority: Any = 0
    catch_up: Any = False
    start_at: Any = None

    def checked(self, now: float, encode: Callable[[Any], str]) -> sql.ScheduleRow:
        """The row to store: every field checked, the event encoded, the first tick set."""
        check_id(self.name, "name")
        check_cadence(self.every, self.cron)
        check_bool(self.catch_up, "catch_up")
        message = Message(group_id=self.group_id, event=self.event, priority=self.priority)
        event = checked_message(message, now, encode, None).event
        if self.start_at is None:
            first = next_after(now, every=self.every, cron=self.cron, anchor=now)
        else:
            check_seconds(self.start_at, "start_at", allow_zero=True, high=now + MAX_SECONDS)
            first = float(self.start_at)
        return sql.ScheduleRow(
            self.name,
            self.group_id,
            event,
            self.priority,
            self.every,
            self.cron,
            self.catch_up,
            first,
        )
