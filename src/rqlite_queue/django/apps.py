"""The Django app (`"rqlite_queue.django"` in INSTALLED_APPS): it brings the
`rqlite_queue_worker` command."""

from __future__ import annotations

from django.apps import AppConfig


class RqliteQueueConfig(AppConfig):
    name = "rqlite_queue.django"
    label = "rqlite_queue"
    verbose_name = "rqlite-queue"
