import os

from django.apps import AppConfig


class StepsConfig(AppConfig):
    name = "steps"

    def ready(self) -> None:
        from . import signals  # noqa: F401
        from .tasks import note

        if os.environ.get("TEST_EVENTS"):
            note("ready", "django", 0, os.getpid(), 0)
