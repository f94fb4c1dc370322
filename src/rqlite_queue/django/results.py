"""Task results as the queue keeps them: a result's id names its message (the Django queue,
the group, the seq), and `get_result` reads that message's outcome (`Transport.result`) back
as Django's `TaskResult`."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime
from typing import Any

from django.utils.module_loading import import_string

from ..types import JobResult
from ..worker import JobCancelled
from . import compat

UNKNOWN_WORKER = "unknown"
"""In `TaskResult.worker_ids`, an attempt whose worker is not recorded (a claim made by a
client that is not a Worker)."""

_STATUSES = {
    "queued": "READY",
    "running": "RUNNING",
    "succeeded": "SUCCESSFUL",
    "failed": "FAILED",
    "cancelled": "FAILED",
    "expired": "FAILED",
}
"""Django has no status for a job cancelled (`rqlite-queue job --cancel`) or expired: both
failed, as Django's backends report a task that did not run to its end."""

_ID = re.compile(r"([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)\.(0|[1-9][0-9]{0,18})")


def _encoded(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decoded(part: str) -> str:
    padded = part + "=" * (-len(part) % 4)
    text = base64.urlsafe_b64decode(padded.encode()).decode()
    if _encoded(text) != part:  # one spelling per id
        raise ValueError(part)
    return text


def result_id(queue_name: str, group_id: str, seq: int) -> str:
    """The id of the task run that is message `seq` of `group_id` on Django's queue
    `queue_name`: URL-safe (letters, digits, `-`, `_` and two dots), the seq last."""
    return f"{_encoded(queue_name)}.{_encoded(group_id)}.{seq}"


def message_of(task_result_id: str) -> tuple[str, str, int] | None:
    """The (Django queue, group, seq) a result id names; None for a string that is not one."""
    found = _ID.fullmatch(task_result_id) if isinstance(task_result_id, str) else None
    if found is None:
        return None
    try:
        return _decoded(found.group(1)), _decoded(found.group(2)), int(found.group(3))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        return None


def _when(epoch: float | None) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC)


def task_of(event: dict[str, Any]) -> Any:
    """The task of a task message, as it was enqueued: the module's task with the message's
    queue, priority, run_after, backend and group."""
    task = import_string(event["task"])
    if not isinstance(task, compat.Task):
        raise TypeError(f"{event['task']} is not a task")
    changes: dict[str, Any] = {"queue_name": event["queue"], "priority": event["priority"]}
    if event.get("backend"):
        changes["backend"] = event["backend"]
    if event.get("run_after") is not None:
        changes["run_after"] = _when(event["run_after"])
    if event.get("group") is not None:
        changes["group"] = event["group"]
    return task.using(**changes)


def errors_of(job: JobResult) -> list[Any]:
    """Django's `TaskError`s of a job: every failed attempt's, oldest first (and, for a job
    cancelled, the cancel)."""
    errors = [
        compat.TaskError(exception_class_path=error.type, traceback=error.traceback)
        for error in job.errors
    ]
    if job.status == "cancelled":
        kind = JobCancelled
        errors.append(
            compat.TaskError(
                exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                traceback=f"{kind.__qualname__}: {job.reason or 'cancelled'}\n",
            )
        )
    return errors


def workers_of(job: JobResult) -> list[str]:
    """The worker of each of a job's attempts, oldest first (UNKNOWN_WORKER where none is
    recorded)."""
    workers = list(job.workers)
    return [UNKNOWN_WORKER] * (job.attempts - len(workers)) + workers


def task_result(job: JobResult, task_result_id: str, alias: str) -> Any:
    """Django's `TaskResult` of the task message `job`: its status, args, times, the workers
    of its attempts, its errors (every failed attempt's, oldest first), its return value."""
    event = job.event
    status = compat.TaskResultStatus[_STATUSES[job.status]]
    enqueued = event.get("enqueued_at")
    result = compat.TaskResult(
        task=task_of(event),
        id=task_result_id,
        status=status,
        enqueued_at=_when(job.enqueued_at if enqueued is None else enqueued),
        started_at=_when(job.started_at),
        finished_at=_when(job.finished_at),
        last_attempted_at=_when(job.started_at),
        args=event.get("args") or [],
        kwargs=event.get("kwargs") or {},
        backend=event.get("backend") or alias,
        errors=errors_of(job),
        worker_ids=workers_of(job),
    )
    if job.status == "succeeded":
        object.__setattr__(result, "_return_value", job.result)
    return result


def is_task_message(event: Any) -> bool:
    """Whether a message's payload is a task run (not another producer's message on the same
    queue)."""
    return isinstance(event, dict) and isinstance(event.get("task"), str) and "queue" in event
