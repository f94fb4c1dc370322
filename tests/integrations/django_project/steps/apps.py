from django.apps import AppConfig


class StepsConfig(AppConfig):
    name = "steps"

    def ready(self) -> None:
        from . import signals  # noqa: F401
