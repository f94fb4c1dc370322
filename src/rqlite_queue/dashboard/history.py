"""The last minutes of a queue, as the dashboard charts them: samples of `stats()` taken while
a page is open (the page's live refresh takes them, so a dashboard mounted in another app
needs no background task), and the rates between them."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..types import Stats


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    depth: int
    in_flight: int
    dead: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class Rate:
    """Between two samples: messages published per second, and messages that left the queue
    (acked, dead-lettered, expired or cancelled) per second."""

    at: float
    published: float
    done: float


class History:
    def __init__(self, window: float = 600.0, every: float = 2.0) -> None:
        self.window = window
        self.every = every
        self.samples: deque[Sample] = deque()

    def due(self, now: float) -> bool:
        return not self.samples or now - self.samples[-1].at >= self.every

    def add(self, now: float, stats: Stats) -> None:
        self.samples.append(Sample(now, stats.depth, stats.in_flight, stats.dead, stats.last_seq))
        while self.samples and self.samples[0].at < now - self.window:
            self.samples.popleft()

    def rates(self) -> list[Rate]:
        """A requeued dead letter is published again and adds to the depth: it is not counted
        as done. A gap of more than three sampling periods (no page was open) is skipped."""
        rates = []
        for before, after in zip(self.samples, list(self.samples)[1:], strict=False):
            seconds = after.at - before.at
            if seconds <= 0 or seconds > 3 * self.every:
                continue
            published = after.last_seq - before.last_seq
            done = published - (after.depth - before.depth)
            rates.append(Rate(after.at, max(0, published) / seconds, max(0, done) / seconds))
        return rates


def polyline(points: list[tuple[float, float]], width: int, height: int, top: float) -> str:
    """SVG polyline coordinates for (time, value) points, time left to right over the points'
    span, value 0 at the bottom and `top` at the top."""
    if not points:
        return ""
    start, end = points[0][0], points[-1][0]
    span = max(end - start, 1e-9)
    scale = height / top if top > 0 else 0.0
    return " ".join(f"{(t - start) / span * width:.1f},{height - v * scale:.1f}" for t, v in points)
