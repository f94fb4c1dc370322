"""Argument checks shared by the core and the worker: each raises `InvalidArgument` with a
short message (an argument of any size is never echoed whole), before anything is written."""

from __future__ import annotations

import math
import reprlib

from ..errors import InvalidArgument

MAX_SECONDS = 366 * 24 * 3600.0
"""Longest visibility, delay or window accepted: a year."""
MAX_ID_BYTES = 1024
"""Longest group id, dedup id or worker id, encoded."""


def check_id(value: object, what: str, limit: int = MAX_ID_BYTES) -> None:
    """A non-empty str of valid Unicode without NUL, at most `limit` bytes encoded."""
    if type(value) is str and value.isascii() and 0 < len(value) <= limit and "\x00" not in value:
        return  # (the common case, at the cost of a few calls: ASCII's size is its length)
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what} must be a non-empty string, got {show(value)}")
    check_text(value, what, limit)


def check_text(value: str, what: str, limit: int) -> None:
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"{what} is not valid Unicode text: {exc.reason}") from None
    if size > limit:
        raise InvalidArgument(f"{what} is {size} bytes encoded; the limit is {limit}")
    if "\x00" in value:
        # SQLite's text functions stop at a NUL: the two backends would disagree.
        raise InvalidArgument(f"{what} holds a NUL character")


def show(value: object) -> str:
    """A short repr for messages: an argument of any size is never echoed whole."""
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60


def check_int(value: object, name: str, low: int, high: int | None = None) -> None:
    """An int (not a bool) in [low, high]."""
    if type(value) is int and low <= value and (high is None or value <= high):
        return  # (the common case, before the message is made)
    bounds = f"in {low}-{high}" if high is not None else f">= {low}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int {bounds}, got {show(value)}")
    if value < low or (high is not None and value > high):
        raise InvalidArgument(f"{name} must be {bounds}, got {value}")


def check_seconds(value: object, name: str, *, allow_zero: bool, high: float = MAX_SECONDS) -> None:
    """A finite number of seconds, > 0 (or >= 0), at most `high` (a year by default)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{name} must be a number of seconds, got {show(value)}")
    low_ok = value >= 0 if allow_zero else value > 0
    if not (math.isfinite(value) and low_ok and value <= high):
        low = ">= 0" if allow_zero else "> 0"
        raise InvalidArgument(f"{name} must be finite, {low} and <= {high:.0f}, got {show(value)}")


def check_bool(value: object, name: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be True or False, got {show(value)}")
    return value


def check_tenant(name: object) -> str:
    """A tenant's name: an id (the default tenant, '', is never named: leave `tenant` out)."""
    check_id(name, "tenant")
    return str(name)
