"""The task backend: `TASKS = {"default": {"BACKEND": "rqlite_queue.django.RqliteQueueBackend",
...}}`. Enqueueing publishes a message on the queue of the task's `queue_name`; the worker
(`manage.py rqlite_queue_worker`) runs them."""

from __future__ import annotations

import math
import os
import threading
import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from .. import Transport
from ..errors import InvalidArgument
from ..naming import queue_name_for
from . import compat, results

DEFAULT_URL = "sqlite:///django-tasks.db"
"""Without `OPTIONS["url"]`: the embedded queue on a file beside the project (BASE_DIR when
the settings have one, else the working directory)."""


BACKEND_OPTIONS: dict[str, Any] = {
    "url": None,
    "queue_prefix": "",
    "queue_options": {},
    "concurrency": 4,
    "max_attempts": 3,
    "visibility": 30.0,
    "backoff": {},
    "non_retryable": [],
    "grace": 30.0,
    "schedules": {},
    "keep": 86400.0,
}
"""The OPTIONS the backend and its worker read, with their defaults
(docs/reference/configuration.md)."""


def queue_priority(priority: int) -> int:
    """Django's priority (-100 to 100, default 0) on the queue's scale (0-4): 0 and below are
    the queue's default, 0; above it, a band of 25 per level (1-25: 1, ..., 76-100: 4)."""
    return 0 if priority <= 0 else min(4, math.ceil(priority / 25))


@dataclass(frozen=True, slots=True, kw_only=True)
class Task(compat.Task):
    """Django's Task, with the queue's group: tasks that name the same `group` run in the
    order they were enqueued, one at a time (whatever the number of workers); tasks without
    one run in parallel, each its own group. `@task(group="reports")`, or per call:
    `charge.using(group=f"order-{order.pk}").enqueue(order.pk)`."""

    group: str | None = None

    def using(self, *, group: str | None = None, **changes: Any) -> Task:
        task: Task = compat.Task.using(self, **changes)
        return task if group is None else replace(task, group=group)


class RqliteQueueBackend(compat.BaseTaskBackend):
    """Tasks as messages of the queue: deferred (`run_after` -> a delayed message), with
    priorities (mapped onto 0-4, `queue_priority`), in order per `Task.group`; run by
    `manage.py rqlite_queue_worker` (the queue's Worker: leases, heartbeats, retries with
    backoff, dead letters); their results read back by id (`get_result`: the outcome the
    queue keeps with each message).

    OPTIONS: `url` (any URL `from_url` takes; default the embedded file `django-tasks.db`
    beside the project), `queue_prefix` (put before each queue's name), `queue_options`
    (given to `from_url`), `keep` (seconds a finished task's result is kept; None: not
    kept, no `get_result`), and the worker's: `concurrency`, `max_attempts`, `visibility`,
    `backoff` (`{"base": 1, "cap": 300, "jitter": 0.5}`), `non_retryable` (exception classes'
    paths), `grace`, `schedules` (periodic tasks)."""

    task_class = Task
    supports_defer = True
    supports_async_task = True
    supports_priority = True
    supports_get_result = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.url = str(self.options.get("url") or self._default_url())
        self.queue_prefix = str(self.options.get("queue_prefix") or "")
        self.queue_options = dict(self.options.get("queue_options") or {})
        self.keep = _keep(self.options.get("keep", BACKEND_OPTIONS["keep"]))
        if self.keep is None:  # (an instance's flag: Django reads it from the backend)
            self.supports_get_result = False
        self._queues: dict[str, Transport] = {}
        self._pid = os.getpid()
        self._lock = threading.Lock()

    @staticmethod
    def _default_url() -> str:
        base = getattr(settings, "BASE_DIR", None)
        if base is None:
            return DEFAULT_URL
        return f"sqlite:///{os.path.join(str(base), 'django-tasks.db')}"

    def queue(self, name: str) -> Transport:
        """The open queue of Django's queue `name` (opened on first use in this process)."""
        with self._lock:
            if os.getpid() != self._pid:  # a forked child: its parent's clients are not its
                self._queues, self._pid = {}, os.getpid()
            target = queue_name_for(name, self.queue_prefix)
            found = self._queues.get(target)
            if found is None:
                found = self._queues[target] = Transport.from_url(
                    self.url, queue=target, **self.queue_options
                )
            return found

    def close(self) -> None:
        with self._lock:
            queues, self._queues = list(self._queues.values()), {}
        for queue in queues:
            queue.close()

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        group = getattr(task, "group", None)
        if group is not None and (not isinstance(group, str) or not group):
            raise compat.InvalidTask("group must be a non-empty string")

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        args, kwargs = compat.normalize_json(list(args)), compat.normalize_json(dict(kwargs))
        run = uuid.uuid4().hex
        group = getattr(task, "group", None) or f"task-{run}"
        enqueued_at = timezone.now()
        seq = self.queue(task.queue_name).publish(
            group,
            task_event(task, args, kwargs, self.alias, enqueued_at),
            queue_priority(task.priority),
            not_before=_epoch(task.run_after),
            dedup_id=run,  # a publish whose reply was lost is sent again safely
            keep=self.keep,
        )
        result = compat.TaskResult(
            task=task,
            id=results.result_id(task.queue_name, group, seq),
            status=compat.TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        compat.task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> Any:
        """The task run `result_id` as the queue knows it: READY (queued, or waiting for a
        retry), RUNNING, SUCCESSFUL (its return value) or FAILED (its errors); kept for
        OPTIONS["keep"] seconds once finished. TaskResultDoesNotExist for an id this backend
        never gave, or whose result was pruned."""
        if self.keep is None:
            return super().get_result(result_id)  # (NotImplementedError, as Django's own)
        found = results.message_of(result_id)
        if found is None or (self.queues and found[0] not in self.queues):
            raise compat.TaskResultDoesNotExist(result_id)
        queue_name, group, seq = found
        try:
            job = self.queue(queue_name).result(group, seq)
        except InvalidArgument:  # (a group name the queue would never have taken)
            job = None
        if job is None or not results.is_task_message(job.event):
            raise compat.TaskResultDoesNotExist(result_id)
        return results.task_result(job, result_id, self.alias)

    async def aget_result(self, result_id: str) -> Any:
        """`get_result` in a thread of its own (the queue's client is thread-safe): the event
        loop goes on meanwhile."""
        return await sync_to_async(self.get_result, thread_sensitive=False)(result_id)


def _keep(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ImproperlyConfigured(
            f"TASKS OPTIONS['keep'] must be a number of seconds > 0, or None: {value!r}"
        )
    return float(value)


def task_event(
    task: Any, args: list[Any], kwargs: dict[str, Any], alias: str, enqueued_at: datetime
) -> dict[str, Any]:
    """The message of a task run: what the worker needs to run it, and `get_result` to
    report it as it was enqueued."""
    return {
        "task": task.module_path,
        "args": args,
        "kwargs": kwargs,
        "queue": task.queue_name,
        "priority": task.priority,
        "group": getattr(task, "group", None),
        "run_after": None if task.run_after is None else task.run_after.timestamp(),
        "backend": alias,
        "enqueued_at": enqueued_at.timestamp(),
    }


def _epoch(when: datetime | None) -> float | None:
    if when is None:
        return None
    return when.timestamp() if when.timestamp() > time.time() else None
