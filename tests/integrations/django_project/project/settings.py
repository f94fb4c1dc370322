"""The test project: its tasks on the queue of TEST_TASKS_URL (the embedded file or a
cluster), the worker's settings small enough for a test (short leases, quick retries)."""

import os

SECRET_KEY = "tests-only"
USE_TZ = True
INSTALLED_APPS = ["rqlite_queue.django", "steps"]
DATABASES: dict[str, dict[str, str]] = {}
TASKS = {
    "default": {
        "BACKEND": "rqlite_queue.django.RqliteQueueBackend",
        "QUEUES": ["default", "urgent"],
        "OPTIONS": {
            "url": os.environ.get("TEST_TASKS_URL", "sqlite:///django-tasks.db"),
            "queue_prefix": os.environ.get("TEST_QUEUE_PREFIX", ""),
            "concurrency": 4,
            "max_attempts": 3,
            "visibility": 2.0,
            "backoff": {"base": 0.1, "cap": 0.5},
            "non_retryable": ["steps.tasks.Fatal"],
            "grace": 5.0,
            "schedules": {"tick": {"task": "steps.tasks.tick", "every": 1.0}}
            if os.environ.get("TEST_SCHEDULES")
            else {},
        },
    }
}
LOGGING = {
    "version": 1,
    # Django's default (True) silences every logger made before setup: in the test run, the
    # library's own, which other tests read with caplog.
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
}
