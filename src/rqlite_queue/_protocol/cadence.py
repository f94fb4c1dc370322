"""When a schedule ticks: every N seconds, or at the times of a cron expression (UTC, parsed
by `cronsim`). Pure: no clock of its own."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime

from cronsim import CronSim, CronSimError

from ..errors import InvalidArgument
from .checks import check_seconds

MAX_CATCH_UP = 1000
"""Most missed ticks published at once by a schedule that catches up on each of them."""


def check_cadence(every: float | None, cron: str | None) -> None:
    if (every is None) == (cron is None):
        raise InvalidArgument("a schedule needs exactly one of every= (seconds) or cron=")
    if every is not None:
        check_seconds(every, "every", allow_zero=False)
    if cron is not None:
        if not isinstance(cron, str):
            raise InvalidArgument(f"cron must be a string, got {type(cron).__name__}")
        try:
            next(_cron(cron, 0.0))
        except (CronSimError, StopIteration, ValueError) as exc:
            raise InvalidArgument(f"cron expression {cron[:100]!r}: {exc}") from None


def next_after(t: float, *, every: float | None, cron: str | None, anchor: float) -> float:
    """The first tick strictly after `t`; `every` ticks fall on `anchor` + k * every."""
    if every is not None:
        return anchor + (math.floor((t - anchor) / every) + 1) * every
    assert cron is not None
    return next(_cron(cron, t))


def missed(due: float, now: float, *, every: float | None, cron: str | None) -> tuple[int, float]:
    """For a tick due at `due` <= `now`: how many ticks fell in [due, now] (at most
    MAX_CATCH_UP counted), and the first tick after `now`."""
    count, t = 0, due
    while t <= now and count < MAX_CATCH_UP:
        count += 1
        t = next_after(t, every=every, cron=cron, anchor=due)
    return count, next_after(now, every=every, cron=cron, anchor=due) if t <= now else t


def _cron(expression: str, t: float) -> Iterator[float]:
    start = datetime.fromtimestamp(t, tz=UTC).replace(microsecond=0)
    for moment in CronSim(expression, start):
        if moment.timestamp() > t:
            yield moment.timestamp()
