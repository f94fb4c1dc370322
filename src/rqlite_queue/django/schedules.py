"""Periodic tasks: `OPTIONS["schedules"]`, stored as the queue's schedules by the worker
command (each tick published once, whichever workers run)."""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from . import compat
from .backend import queue_priority


def schedule_group(name: str) -> str:
    """A periodic task's group: its runs are in order and never overlap."""
    return f"schedule-{name}"


def install_schedules(backend: Any) -> list[str]:
    """Store the backend's `OPTIONS["schedules"]` on their queues: `{name: {"task": path,
    "every": seconds | "cron": expression, "args": [...], "kwargs": {...}}}` (the task's own
    queue and priority). A schedule stored as it is already is left alone (its next tick
    kept); a changed one is replaced. Returns the names stored."""
    stored: list[str] = []
    for name, spec in (backend.options.get("schedules") or {}).items():
        task = import_string(spec["task"])
        if not isinstance(task, compat.Task):
            raise compat.InvalidTask(f"schedule {name!r}: {spec['task']} is not a task")
        event = {
            "task": task.module_path,
            "args": compat.normalize_json(list(spec.get("args", []))),
            "kwargs": compat.normalize_json(dict(spec.get("kwargs", {}))),
            "queue": task.queue_name,
            "priority": task.priority,
            "group": schedule_group(name),
            "run_after": None,
            "backend": backend.alias,
            "enqueued_at": None,
            "schedule": name,
        }
        queue = backend.queue(task.queue_name)
        every, cron = spec.get("every"), spec.get("cron")
        priority = queue_priority(task.priority)
        same = [
            s
            for s in queue.schedules()
            if s.name == name
            and (s.group_id, s.event, s.every, s.cron, s.priority, s.keep)
            == (schedule_group(name), event, every, cron, priority, backend.keep)
        ]
        if not same:
            queue.schedule(
                name,
                schedule_group(name),
                event,
                every=every,
                cron=cron,
                priority=priority,
                keep=backend.keep,
            )
        stored.append(name)
    return stored
