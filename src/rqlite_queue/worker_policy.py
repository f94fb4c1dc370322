"""What a worker decides, without I/O: retry delays, when to give up, when to heartbeat, how
long to wait when idle, which priority floor to claim with. Shared by `Worker` (threads) and
`AsyncWorker` (asyncio)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .errors import InvalidArgument
from .lease import Lease


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: `base * 2**(attempts-1)`, at most `cap`, minus up to
    `jitter` of itself at random (so retries of many groups spread out)."""

    base: float = 1.0
    cap: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.base <= 0 or self.cap < self.base or not 0 <= self.jitter <= 1:
            raise InvalidArgument("backoff needs base > 0, cap >= base, 0 <= jitter <= 1")

    def delay(self, attempts: int, rng: random.Random | None = None) -> float:
        raw = min(self.cap, self.base * 2.0 ** max(0, attempts - 1))
        return float(raw * (1 - self.jitter * (rng or random).random()))


@dataclass
class IdlePoll:
    """How long to sleep after an empty claim: doubling from `first` up to `cap`, back to
    `first` as soon as a claim finds work. Never a busy spin."""

    first: float = 0.05
    cap: float = 2.0
    _next: float = field(default=0.0, init=False)

    def empty(self) -> float:
        self._next = self.first if self._next == 0 else min(self.cap, self._next * 2)
        return self._next

    def found(self) -> None:
        self._next = 0.0


@dataclass
class PriorityShare:
    """Claim with `min_priority=floor` in a `share` of the claim rounds (falling back to no
    floor when that finds nothing), so high-priority groups go first part of the time without
    starving the rest (the seed's `high_ratio`). Deterministic: every round whose running
    share would fall below `share` is a high-priority round."""

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
