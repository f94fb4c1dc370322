"""Running one task message: what the worker's handler does (Django's signals, the task's
context, database connections, the result or the error)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from traceback import format_exception
from typing import Any

from django.db import close_old_connections
from django.utils import timezone

from .. import Transport
from ..errors import QueueError
from ..types import JobResult, Lease
from . import compat, results

log = logging.getLogger("rqlite_queue.django")


class TaskRunner:
    """The Worker's handler for a backend's messages: rebuilds the task and its result, sends
    `task_started`, runs the task (with its `TaskContext` when it takes one), then
    `task_finished` when the run is final (succeeded, or failed for the last time: a failure
    that will be retried leaves the result READY). A failure re-raises, so that the Worker
    retries the message (with backoff) or dead-letters it; a success returns the task's
    return value (JSON-normalized). The signals' result carries every attempt's error and
    worker, as `get_result` does: for a retried message whose outcome is kept (the backend's
    OPTIONS["keep"]), the earlier ones are read from the queue first (one read, on a retry
    only); without it, only this attempt's are known."""

    def __init__(
        self,
        backend: Any,
        worker_id: str,
        *,
        max_attempts: int,
        non_retryable: tuple[type[BaseException], ...] = (),
    ) -> None:
        self.backend = backend
        self.worker_id = worker_id
        self.max_attempts = max_attempts
        self.non_retryable = non_retryable

    def __call__(self, lease: Lease) -> Any:
        close_old_connections()
        try:
            return self._run(lease)
        finally:
            close_old_connections()

    def _run(self, lease: Lease) -> Any:
        event = lease.event
        task = results.task_of(event)
        now = timezone.now()
        earlier = self._earlier(lease)
        enqueued = event.get("enqueued_at")
        result = compat.TaskResult(
            task=task,
            id=results.result_id(event["queue"], lease.group_id, lease.seq),
            status=compat.TaskResultStatus.RUNNING,
            enqueued_at=None if enqueued is None else datetime.fromtimestamp(enqueued, UTC),
            started_at=now,
            finished_at=None,
            last_attempted_at=now,
            args=event.get("args") or [],
            kwargs=event.get("kwargs") or {},
            backend=event.get("backend") or self.backend.alias,
            errors=[] if earlier is None else results.errors_of(earlier),
            worker_ids=(
                [results.UNKNOWN_WORKER] * (lease.attempts - 1) + [self.worker_id]
                if earlier is None
                else results.workers_of(earlier)
            ),
        )
        sender = type(self.backend)
        compat.task_started.send(sender=sender, task_result=result)
        try:
            if task.takes_context:
                value = task.call(
                    compat.TaskContext(task_result=result), *result.args, **result.kwargs
                )
            else:
                value = task.call(*result.args, **result.kwargs)
            value = compat.normalize_json(value)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            final = lease.attempts >= self.max_attempts or isinstance(exc, self.non_retryable)
            kind = type(exc)
            result.errors.append(
                compat.TaskError(
                    exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                    traceback="".join(format_exception(exc)),
                )
            )
            if final:
                object.__setattr__(result, "status", compat.TaskResultStatus.FAILED)
                object.__setattr__(result, "finished_at", timezone.now())
                compat.task_finished.send(sender=sender, task_result=result)
            else:
                object.__setattr__(result, "status", compat.TaskResultStatus.READY)
            raise
        object.__setattr__(result, "status", compat.TaskResultStatus.SUCCESSFUL)
        object.__setattr__(result, "finished_at", timezone.now())
        object.__setattr__(result, "_return_value", value)
        compat.task_finished.send(sender=sender, task_result=result)
        return value

    def _earlier(self, lease: Lease) -> JobResult | None:
        """A retried message's state as the queue keeps it (the errors and workers of its
        earlier attempts, and this one's worker), if it keeps its outcome; None for a first
        attempt, a message that keeps none, or a read that failed (logged: the task runs)."""
        if lease.attempts <= 1 or not lease.keep:
            return None
        try:
            queue: Transport = self.backend.queue(lease.event["queue"])
            job = queue.result(lease.group_id, lease.seq)
        except QueueError as exc:
            log.warning("task %s: its earlier attempts could not be read: %s", lease.seq, exc)
            return None
        if job is None or job.status != "running" or job.attempts != lease.attempts:
            return None  # (no longer this attempt's: its lease lapsed meanwhile)
        return job
