"""A backend for Django's Tasks framework (`django.tasks`, Django 6; the `django-tasks`
backport on Django 5.2): tasks as messages of the queue, run by `manage.py
rqlite_queue_worker`.

```python
TASKS = {
    "default": {
        "BACKEND": "rqlite_queue.django.RqliteQueueBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"url": "http://10.0.0.1:4001,http://10.0.0.2:4001"},
    }
}
INSTALLED_APPS = [..., "rqlite_queue.django"]  # the worker command
```

`rqlite_queue.django.Task` (the backend's task class) adds `group`: tasks of one group run in
order, one at a time. See the how-to "Use it from Django"."""

from __future__ import annotations

from .backend import RqliteQueueBackend, Task, queue_priority

__all__ = ["RqliteQueueBackend", "Task", "queue_priority"]
