"""Django's task signals, as the worker sends them, noted in the events file."""

from rqlite_queue.django import compat
from steps.tasks import note


def _seen(kind: str):
    def receiver(sender, task_result, **kwargs):
        note(
            "signal",
            kind,
            task_result.id,
            task_result.status,
            len(task_result.worker_ids),
            len(task_result.errors),
            ",".join(e.exception_class_path for e in task_result.errors) or "-",
        )

    return receiver


on_started = _seen("started")
on_finished = _seen("finished")
compat.task_started.connect(on_started)
compat.task_finished.connect(on_finished)
