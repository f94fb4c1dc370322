"""A Worker's handler and the message it works on: `current_job()` gives the handler its `Job`
(is it cancelled? report progress), and a handler may return a `Result` to give both a result
and follow-ups. The Worker (threads or asyncio) makes one `Job` per lease and tells it what
the queue said (a cancel); the handler's thread or task sees it through a context variable."""

from __future__ import annotations

import contextvars
import threading
import traceback
from collections.abc import Callable
from typing import Any

from ._protocol.outcomes import check_progress, job_error
from .types import FollowUps, JobError, Lease

_current: contextvars.ContextVar[Job] = contextvars.ContextVar("rqlite_queue_job")
_TELLING = threading.Lock()
"""Orders a cancel against a handler's first wait for one (an event is made only then: most
jobs never wait, and an event costs more than the rest of a job)."""


class JobCancelled(Exception):
    """Raised by `Job.raise_if_cancelled()` in a handler whose message was cancelled (a sync
    handler's way to stop; an async handler's task is cancelled instead). However a handler
    ends after a cancel, its message settles as `cancelled`, and is not retried."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Result:
    """What a handler may return to give its message a result and follow-ups both:
    `return Result(total, publish=[("billing", {"total": total})])`. `value` is kept as the
    message's result (if the message keeps its outcome: `publish(keep=...)`); `publish` is
    published with its ack, as the follow-ups of a handler with `follow_ups=True` are (with
    or without that option)."""

    __slots__ = ("publish", "value")

    def __init__(self, value: Any = None, *, publish: FollowUps = ()) -> None:
        self.value = value
        self.publish = publish

    def __repr__(self) -> str:
        return f"Result({self.value!r}, publish={self.publish!r})"


class Job:
    """The message a Worker's handler is working on, as the handler sees it
    (`current_job()`): its lease, whether it was cancelled, and a place to report progress.
    Thread-safe: the Worker tells it of a cancel from its own thread."""

    __slots__ = (
        "_event",
        "_on_cancel",
        "_on_progress",
        "_progress",
        "_reason",
        "_sent",
        "lease",
        "sent_at",
    )

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        """The lease the handler was given."""
        self._event: threading.Event | None = None
        self._reason: str | None = None
        self._progress: str | None = None
        self._sent: str | None = None
        self.sent_at = 0.0
        """When (monotonic) a progress of this job last reached the queue (0: never)."""
        self._on_cancel: Callable[[], None] | None = None
        self._on_progress: Callable[[], None] | None = None

    def __repr__(self) -> str:
        state = f"cancelled: {self._reason!r}" if self.cancelled else "running"
        return f"Job({self.lease.group_id!r}, {self.lease.seq}, {state})"

    # ------------------------------------------------------------------ the handler's

    @property
    def cancelled(self) -> bool:
        """Whether the message was cancelled (`cancel()`, `cancel_group()`) or its lease lost
        while the handler runs: stop when you can; whatever the handler does next, the
        message settles as cancelled (or, its lease lost, not at all here)."""
        return self._reason is not None

    @property
    def cancel_reason(self) -> str | None:
        """Why (None: not cancelled)."""
        return self._reason

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block until the message is cancelled or `timeout` seconds pass (a sync handler's
        interruptible sleep); True if it was cancelled."""
        if self._reason is not None:
            return True
        with _TELLING:
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout) or self._reason is not None

    def raise_if_cancelled(self) -> None:
        """Raise `JobCancelled` if the message was cancelled."""
        reason = self._reason
        if reason is not None:
            raise JobCancelled(reason)

    def progress(self, value: Any) -> None:
        """Report how far the job has come: a small JSON value (at most MAX_PROGRESS_BYTES
        as JSON; `InvalidArgument` otherwise). The latest one goes to the queue with the
        lease's next extension (no write of its own), where `result()` shows it."""
        self._progress = check_progress(value)
        if self._on_progress is not None:
            self._on_progress()

    # ------------------------------------------------------------------ the Worker's

    def tell_cancelled(self, reason: str) -> bool:
        """The Worker learnt that the message was cancelled: tell the handler (once). False
        if it knew already."""
        with _TELLING:
            if self._reason is not None:
                return False
            self._reason = reason
            event = self._event
        if event is not None:
            event.set()
        if self._on_cancel is not None:
            self._on_cancel()
        return True

    def on_cancel(self, call: Callable[[], None]) -> None:
        """Call `call` when the job is told of a cancel (the Worker cancels an async
        handler's task with it)."""
        self._on_cancel = call

    def on_progress(self, call: Callable[[], None]) -> None:
        """Call `call` (on the handler's thread) when the handler reports progress."""
        self._on_progress = call

    def progress_to_send(self) -> str | None:
        """The progress reported since the last that reached the queue (None: none)."""
        progress = self._progress
        return progress if progress is not None and progress != self._sent else None

    def progress_sent(self, text: str, at: float) -> None:
        """This progress reached the queue (with an extension that applied) at `at`."""
        self._sent = text
        self.sent_at = at


def current_job() -> Job:
    """The `Job` of the Worker handler that calls it (its thread, or its task). Raises
    `LookupError` outside a handler."""
    try:
        return _current.get()
    except LookupError:
        raise LookupError("current_job() is for a Worker's handler, while it runs") from None


def in_job(job: Job, handler: Callable[[Lease], Any], is_async: bool) -> Callable[[Lease], Any]:
    """`handler`, run with `job` as its `current_job()`."""
    if is_async:

        async def run_async(lease: Lease) -> Any:
            _current.set(job)  # (a task runs in a context of its own)
            return await handler(lease)

        return run_async

    def run(lease: Lease) -> Any:
        token = _current.set(job)  # (a pool's thread runs one handler after another)
        try:
            return handler(lease)
        finally:
            _current.reset(token)

    return run


def error_of(exc: BaseException, attempt: int = 0) -> JobError:
    """`exc` as a job keeps it: its class (`module.QualifiedName`), its message and its
    traceback as Python prints it, bounded (`_protocol.outcomes.job_error`)."""
    kind = type(exc)
    lines = traceback.format_exception(kind, exc, exc.__traceback__)
    return job_error(f"{kind.__module__}.{kind.__qualname__}", str(exc), "".join(lines), attempt)
