"""Tables that fit their output without cutting what identifies a row: ids, seqs, states and
counts are never wrapped or shortened (nor their headers); prose (a dead letter's reason)
wraps at its spaces, and JSON is shortened with "…" (`--json` prints it whole). When even so
the table is wider than the terminal (or than `$COLUMNS`, or 80 columns in a pipe), it is
printed at the width it needs: the lines run on, nothing is cut."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text


class Cell(Enum):
    KEEP = "keep"
    """An id, a seq, a state, a count or a time: whole, on one line."""
    WRAP = "wrap"
    """Prose: wrapped at its spaces (a word too long for the column is shortened)."""
    SHORT = "short"
    """JSON or headers: one line per row, shortened with "…" to fit."""


# The narrowest a column that may wrap or shorten is made (unless its content is narrower):
# prose down to its longest word (within these bounds), JSON to a dozen characters.
_WRAP_FLOOR = (8, 16)
_SHORT_FLOOR = 12

Justify = Literal["left", "right"]


class Listing(Table):
    """A table of (header, kind[, justify]) columns."""

    def __init__(self, *columns: tuple[str, Cell] | tuple[str, Cell, Justify]) -> None:
        super().__init__()
        self.kinds: list[Cell] = []
        for header, kind, *justify in columns:
            self.add_column(
                header,
                justify=justify[0] if justify else "left",
                no_wrap=kind is not Cell.WRAP,
                overflow="fold" if kind is Cell.KEEP else "ellipsis",
            )
            self.kinds.append(kind)

    def _widths(self) -> tuple[list[int], list[int]]:
        """Each column's widest content (with its header), and the narrowest it may be made."""
        widest, floors = [], []
        for column, kind in zip(self.columns, self.kinds, strict=True):
            header = _width(column.header)
            most = max([header, *(_width(cell) for cell in column.cells)])
            widest.append(most)
            if kind is Cell.KEEP:
                floor = most
            elif kind is Cell.WRAP:
                word = max((_word(cell) for cell in column.cells), default=0)
                floor = min(most, max(_WRAP_FLOOR[0], min(word, _WRAP_FLOOR[1])))
            else:
                floor = min(most, _SHORT_FLOOR)
            floors.append(max(header, floor))
        return widest, floors

    def needed_width(self) -> int:
        """The narrowest the table can be without cutting a KEEP column or its header."""
        return sum(self._widths()[1]) + self._rules()

    def _rules(self) -> int:
        return 3 * len(self.columns) + 1  # a space each side of a cell, and the rules

    def fit(self, width: int) -> int:
        """Size the columns for `width` (or for the least that cuts nothing, if more): prose
        wraps first (wrapping loses nothing), then JSON is shortened, the widest column
        given up first in each. Returns the width the table takes."""
        widest, floors = self._widths()
        room = max(width, sum(floors) + self._rules()) - self._rules()
        sizes = list(widest)
        for kind in (Cell.WRAP, Cell.SHORT):
            if sum(sizes) <= room:
                break
            these = [i for i, k in enumerate(self.kinds) if k is kind]
            others = sum(size for i, size in enumerate(sizes) if i not in these)

            def used(level: int, these: list[int] = these, others: int = others) -> int:
                return others + sum(max(floors[i], min(widest[i], level)) for i in these)

            low, high = 0, max(widest, default=0)
            while low < high:  # the highest level at which these columns fit the room
                middle = (low + high + 1) // 2
                low, high = (middle, high) if used(middle) <= room else (low, middle - 1)
            for i in these:
                sizes[i] = max(floors[i], min(widest[i], low))
        for i, kind in enumerate(self.kinds):
            if kind is not Cell.KEEP:
                self.columns[i].width = sizes[i]
        return sum(sizes) + self._rules()

    def print(self, *before: RenderableType) -> None:
        """Print `before` (titles), then the table, each on its own line."""
        out = Console(highlight=False, soft_wrap=False)
        width = self.fit(out.width)
        if width > out.width:
            out = Console(highlight=False, soft_wrap=False, width=width, file=out.file)
        out.print(*before, self, sep="\n")


def _width(cell: object) -> int:
    if isinstance(cell, Text):
        return max((line.cell_len for line in cell.split()), default=0)
    if isinstance(cell, str):
        return max((Text.from_markup(line).cell_len for line in cell.splitlines()), default=0)
    return 1


def _word(cell: object) -> int:
    text = cell.plain if isinstance(cell, Text) else str(cell)
    return max((len(word) for word in text.split()), default=0)
