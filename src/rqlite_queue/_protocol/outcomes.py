"""Jobs' outcomes without I/O: the checks of what a settlement keeps (how long, a progress
value), an error as a job keeps it (`JobError`: its class, message and a bounded traceback;
the traceback's text is made where the exception was caught, `_job.error_of`: formatting one
reads source files), and how a waiter for an outcome polls (`poll_delays`)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from ..errors import InvalidArgument
from ..types import MAX_ERRORS, MAX_PROGRESS_BYTES, MAX_TRACEBACK_BYTES, JobError
from .checks import check_seconds, show

MAX_MESSAGE_BYTES = 2000
"""Most bytes of an error's message kept (as a dead letter's reason keeps it)."""
FIRST_POLL = 0.01
LONGEST_POLL = 0.5
"""A waiter for an outcome reads after 0.01 s, then twice as late each time, up to every
0.5 s: at most 7 reads in its first second, then 2 a second."""


def check_keep(keep: object, *, allow_zero: bool = False) -> float | None:
    """How long to keep a message's outcome after it settles: seconds (> 0, at most a year),
    or None (not kept; with `allow_zero`, 0 too: not kept whatever the transport's default)."""
    if keep is None:
        return None
    check_seconds(keep, "keep", allow_zero=allow_zero)
    return float(keep) if keep else None  # type: ignore[arg-type]


class ProgressText(str):
    """A progress value as `check_progress` made it (a Worker's jobs keep theirs so): taken
    as it is."""

    __slots__ = ()


def check_progress(value: object) -> str:
    """A progress value as stored: compact JSON of at most MAX_PROGRESS_BYTES."""
    if type(value) is ProgressText:
        return value
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgument(f"progress must be a JSON value, got {show(value)}: {exc}") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidArgument(f"progress is not valid Unicode text: {exc.reason}") from None
    if size > MAX_PROGRESS_BYTES:
        raise InvalidArgument(
            f"progress is {size} bytes as JSON; the limit is {MAX_PROGRESS_BYTES}"
        )
    if "\x00" in text:
        raise InvalidArgument("progress holds a NUL character")
    return ProgressText(text)


def read_progress(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def job_error(kind: str, message: str, traceback: str, attempt: int) -> JobError:
    """An error as a job keeps it: its texts valid Unicode without NUL, its class and message
    at most MAX_MESSAGE_BYTES, its traceback at most MAX_TRACEBACK_BYTES (its first line and
    its end: the innermost frames and the error)."""
    return JobError(
        _clip(_text(kind), MAX_MESSAGE_BYTES),
        _clip(_text(message), MAX_MESSAGE_BYTES),
        _tail(_text(traceback), MAX_TRACEBACK_BYTES),
        attempt,
    )


def check_error(error: object, attempt: int) -> JobError:
    """An error given to a settlement, as a `JobError` (an exception is described by
    `_job.error_of` first), bounded as `job_error` bounds it."""
    if not isinstance(error, JobError):
        raise InvalidArgument(f"error must be an exception or a JobError, got {show(error)}")
    for what, text in (("type", error.type), ("message", error.message)):
        if not isinstance(text, str):
            raise InvalidArgument(f"JobError.{what} must be a string, got {show(text)}")
    if not isinstance(error.traceback, str):
        raise InvalidArgument(f"JobError.traceback must be a string, got {show(error.traceback)}")
    return job_error(error.type, error.message, error.traceback, attempt)


def error_text(error: JobError) -> str:
    """An error as stored: a compact JSON object."""
    return json.dumps(
        {"type": error.type, "message": error.message, "tb": error.traceback, "n": error.attempt},
        ensure_ascii=False,
        separators=(",", ":"),
    )


def read_errors(text: str | None) -> tuple[JobError, ...]:
    """A stored list of errors (a JSON array of `error_text` objects), the last MAX_ERRORS."""
    if not text:
        return ()
    return tuple(
        JobError(str(e["type"]), str(e["message"]), str(e.get("tb", "")), int(e.get("n", 0)))
        for e in json.loads(text)[-MAX_ERRORS:]
    )


def worker_ids(tokens: Sequence[str]) -> tuple[str, ...]:
    """The worker ids of lease tokens (`worker_id:random`)."""
    return tuple(token.rpartition(":")[0] for token in tokens)


def poll_delays() -> Iterator[float]:
    """The waits of a waiter for an outcome between its reads (see LONGEST_POLL)."""
    delay = FIRST_POLL
    while True:
        yield delay
        delay = min(LONGEST_POLL, delay * 2)


def _text(text: str) -> str:
    """Text that every backend stores as it is: no NUL, no lone surrogate."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def _clip(text: str, limit: int) -> str:
    """The start of `text`, at most `limit` bytes encoded."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


def _tail(text: str, limit: int) -> str:
    """`text`, or its first line and as much of its end as fits in `limit` bytes (a
    traceback's innermost frames and the error are at its end)."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    first, _, _ = text.partition("\n")
    head = (first + "\n  ...\n").encode("utf-8")[: limit // 4]
    rest = data[len(data) - (limit - len(head)) :]
    cut = rest.find(b"\n")
    if 0 <= cut < len(rest) // 2:
        rest = rest[cut + 1 :]  # from a whole line
    return (head + rest).decode("utf-8", "ignore")
