"""The last minutes of a queue, as the dashboard charts them: samples of `stats()` taken while
a page is open (the page's live refresh takes them, so a dashboard mounted in another app
needs no background task), and the rates between them."""

from __future__ import annotations

import math
import time
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
    oldest_age: float | None = None
    """Seconds the oldest message has waited (None: the queue was empty)."""


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
        self.samples.append(
            Sample(now, stats.depth, stats.in_flight, stats.dead, stats.last_seq, stats.oldest_age)
        )
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


def covered(history: History, now: float) -> str:
    """What the charts cover, said in words: 'since 01:02:03 UTC (4 min of samples, one every
    2 s)', or that there is no sample yet."""
    if not history.samples:
        return "no samples yet: they are taken while a dashboard page is open"
    first = history.samples[0].at
    return (
        f"since {_clock(first, seconds=True)} UTC ({_span(now - first)} of samples, "
        f"one every {_seconds(history.every)})"
    )


@dataclass(frozen=True, slots=True)
class Tick:
    at: float
    """Where on its axis, in the chart's coordinates."""
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """A time chart drawn by the server (SVG: no script, nothing fetched): the time axis spans
    the whole window, whatever the samples cover; each series is a list of line segments,
    broken where no sample was taken."""

    width: int
    height: int
    left: int
    bottom: int
    top_value: float
    unit: str
    series: list[tuple[str, list[str]]]
    """(CSS class, polylines' points)."""
    time_ticks: list[Tick]
    value_ticks: list[Tick]

    @property
    def plot_width(self) -> int:
        return self.width - self.left - RIGHT

    @property
    def plot_bottom(self) -> int:
        return self.height - self.bottom


RIGHT = 12
TOP = 10


def chart(
    series: list[tuple[str, list[tuple[float, float]]]],
    *,
    start: float,
    end: float,
    gap: float,
    unit: str,
    width: int = 640,
    height: int = 200,
    left: int = 64,
    bottom: int = 34,
) -> Chart:
    """`series`: (CSS class, (time, value) points in time order). Points further apart than
    `gap` seconds are not joined. The value axis goes from 0 to a round number at least the
    largest value; the time axis from `start` to `end`, ticks at round clock times."""
    largest = max((v for _, points in series for _, v in points), default=0.0)
    top_value, step = _nice_top(largest)
    plot_w = width - left - RIGHT
    plot_h = height - bottom - TOP
    span = max(end - start, 1e-9)

    def x(t: float) -> float:
        return left + (t - start) / span * plot_w

    def y(v: float) -> float:
        return TOP + plot_h - v / top_value * plot_h

    drawn = []
    for cls, points in series:
        segments: list[list[tuple[float, float]]] = []
        for t, v in points:
            if t < start or t > end:
                continue
            if segments and t - segments[-1][-1][0] <= gap:
                segments[-1].append((t, v))
            else:
                segments.append([(t, v)])
        lines = [" ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in seg) for seg in segments]
        drawn.append((cls, lines))
    every = _time_step(span)
    first = math.ceil(start / every) * every
    time_ticks = [
        Tick(round(x(t), 1), _clock(t, seconds=every < 60)) for t in _frange(first, end, every)
    ]
    value_ticks = [
        Tick(round(y(v), 1), _number(v)) for v in _frange(0.0, top_value + step / 2, step)
    ]
    return Chart(width, height, left, bottom, top_value, unit, drawn, time_ticks, value_ticks)


def _frange(first: float, last: float, step: float) -> list[float]:
    count = math.floor((last - first) / step + 1e-9) + 1
    return [first + i * step for i in range(max(0, count))]


def _nice_top(largest: float) -> tuple[float, float]:
    """A round top for the value axis (at least `largest`, at least 1) and its tick step:
    about four ticks of 1, 2 or 5 times a power of ten."""
    if not largest > 0:
        return 1.0, 0.25
    raw = largest / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    return math.ceil(largest / step - 1e-9) * step, step


def _time_step(span: float) -> float:
    """Seconds between time ticks: about six over the span, at round clock times."""
    for step in (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600):
        if span / step <= 7:
            return float(step)
    return 3600.0 * math.ceil(span / 3600 / 7)


def _clock(epoch: float, *, seconds: bool) -> str:
    return time.strftime("%H:%M:%S" if seconds else "%H:%M", time.gmtime(epoch))


def _number(value: float) -> str:
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return text or "0"


def _seconds(value: float) -> str:
    return f"{_number(value)} s"


def _span(seconds: float) -> str:
    """'45 s', '4 min', '1 h 5 min'."""
    if seconds < 60:
        return f"{max(0, round(seconds))} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"
