"""How the queue waits before trying again. One policy, `Backoff` (doubling, capped, with
jitter), with the numbers of each use: the next node or a resend within one call's deadline
(`FAILOVER`), the probes of a shard that stopped answering (`PROBE`), a Worker whose round
failed (`ROUND_ERRORS`), and, given by the user, a failed handler's message (`Worker(backoff=)`).

`Retry` is one call's retries: it carries the call's deadline, so no wait is started that
would leave too little time for the attempt after it. Pure: the caller gives the time and
the randomness of the jitter (a `random.random`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import InvalidArgument

MIN_ATTEMPT = 0.01
"""No request is started with less time than this left before its call's deadline."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: `base * 2**(attempts-1)`, at most `cap`, minus up to
    `jitter` of itself at random (so retries of many groups, or many clients, spread out)."""

    base: float = 1.0
    cap: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.base <= 0 or self.cap < self.base or not 0 <= self.jitter <= 1:
            raise InvalidArgument("backoff needs base > 0, cap >= base, 0 <= jitter <= 1")

    def ceiling(self, attempts: int) -> float:
        """The wait after `attempts` failures before jitter (its longest)."""
        return float(min(self.cap, self.base * 2.0 ** max(0, attempts - 1)))

    def delay(self, attempts: int, random: Callable[[], float]) -> float:
        """The wait after `attempts` failures (1 for the first); `random` draws the jitter
        (a float in [0, 1))."""
        return self.ceiling(attempts) * (1 - self.jitter * random())


FAILOVER = Backoff(base=0.05, cap=1.0, jitter=0.5)
"""Between the requests of one call: the next node after a failure, a resend after a lost
reply."""
PROBE = Backoff(base=0.5, cap=5.0, jitter=0.0)
"""Between the background probes of a shard that stopped answering."""
ROUND_ERRORS = Backoff(base=0.1, cap=2.0, jitter=0.0)
"""A Worker whose round failed (or whose settlements wait for their shard)."""


@dataclass(slots=True)
class Retry:
    """One call's retries under `backoff`, within its `deadline` (a `time.monotonic()` time)."""

    backoff: Backoff
    deadline: float
    random: Callable[[], float]
    failures: int = 0

    def wait(self, now: float) -> float | None:
        """After a failure at `now`: how long to wait before the next attempt, or None when
        even the shortest wait would leave less than `MIN_ATTEMPT` for it."""
        self.failures += 1
        ceiling = self.backoff.ceiling(self.failures)
        left = self.deadline - now
        if left < MIN_ATTEMPT + ceiling * (1 - self.backoff.jitter):
            return None
        wait = ceiling * (1 - self.backoff.jitter * self.random())
        return max(0.0, min(wait, left - MIN_ATTEMPT))
