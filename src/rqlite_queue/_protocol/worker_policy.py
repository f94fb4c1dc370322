"""What a worker decides, without I/O: what to do with a finished handler's message, retry
delays, when to heartbeat, which priority floor to claim with. Shared by `Worker` (threads) and
`AsyncWorker` (asyncio)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import InvalidArgument
from ..types import Lease
from .retry import Backoff


class Park(Exception):
    """Raise it from a handler to put the message back for `delay` seconds: its group is
    parked (nothing of it runs meanwhile, order kept), then the same message comes back.
    It does not count as a failure: it is never dead-lettered for it."""

    def __init__(self, delay: float, reason: str = "") -> None:
        super().__init__(reason or f"parked for {delay:g}s")
        self.delay = delay


@dataclass(frozen=True, slots=True)
class Verdict:
    """What becomes of a message whose handler finished: `ack`, `nack` (after `delay`), or
    `dead` (with `reason`)."""

    kind: str
    delay: float = 0.0
    reason: str = ""


ACK = Verdict("ack")


@dataclass(frozen=True, slots=True)
class FailurePolicy:
    max_attempts: int = 5
    backoff: Backoff = field(default_factory=Backoff)
    non_retryable: tuple[type[BaseException], ...] = ()

    def verdict(
        self, lease: Lease, exc: BaseException | None, random: Callable[[], float]
    ) -> Verdict:
        if exc is None:
            return ACK
        if isinstance(exc, Park):
            return Verdict("nack", max(0.0, float(exc.delay)), failure_reason(exc))
        if isinstance(exc, self.non_retryable) or lease.attempts >= self.max_attempts:
            return Verdict("dead", reason=failure_reason(exc))
        return Verdict("nack", self.backoff.delay(lease.attempts, random), failure_reason(exc))


@dataclass
class PriorityShare:
    """Claim with `min_priority=floor` in a `share` of the claim rounds (falling back to no
    floor when that finds too little), so high-priority groups go first part of the time
    without starving the rest (the seed's `high_ratio`). Deterministic: every round whose
    running share would fall below `share` is a high-priority round."""

    share: float = 0.0
    floor: int = 3
    _rounds: int = field(default=0, init=False)
    _high: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.share <= 1:
            raise InvalidArgument("priority share must be in [0, 1]")
        if not 0 <= self.floor <= 4:
            raise InvalidArgument("priority floor must be in 0-4")

    def next_floor(self) -> int:
        self._rounds += 1
        if self.share > 0 and self._high < self.share * self._rounds:
            self._high += 1
            return self.floor
        return 0


def heartbeat_due(lease: Lease, now: float, visibility: float) -> bool:
    """Extend once a third of the lease's visibility has gone by since it was taken or last
    extended, leaving two thirds of it to get the extension through."""
    return lease.expires_at - now <= visibility * 2 / 3


def failure_reason(exc: BaseException) -> str:
    text = f"{type(exc).__qualname__}: {exc}"
    return text if len(text) <= 2000 else text[:1997] + "..."
