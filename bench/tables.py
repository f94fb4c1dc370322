"""Table helpers shared by the reports: ratios per repetition, cells, markdown tables."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from measure import Point


@dataclass
class Ratio:
    values: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def __str__(self) -> str:
        if not self.values:
            return "n/a"
        lo, hi = min(self.values), max(self.values)
        return f"{_num(self.median)}x [{_num(lo)}-{_num(hi)}]"


def ratio(a: Point | None, b: Point | None, invert: bool = False) -> Ratio:
    """a / b per repetition (b / a with `invert`). With unequal counts (a capped baseline),
    every pairing of medians is used instead."""
    if a is None or b is None or not a.values or not b.values:
        return Ratio([])
    if len(a.values) == len(b.values):
        pairs = list(zip(a.values, b.values, strict=True))
    else:
        pairs = [(a.median, b.median)]
    out = [(y / x if invert else x / y) for x, y in pairs if x > 0 and y > 0]
    return Ratio(out)


def _num(x: float) -> str:
    if math.isnan(x):
        return "n/a"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def cell(p: Point | None) -> str:
    if p is None or not p.values:
        return "-"
    if len(p.values) == 1:
        return _num(p.values[0])
    return f"{_num(p.median)} [{_num(p.low)}-{_num(p.high)}]"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
