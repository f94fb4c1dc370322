"""The Celery app of the tests (`celery -A tasks_app worker`): its broker is the queue, through
`rqlite_queue.kombu`; results go to Celery's file backend (the broker is what is tested)."""

from __future__ import annotations

import os
import time

from celery import Celery

import rqlite_queue.kombu  # noqa: F401  (registers the `rqlite` transport alias)

app = Celery("tasks_app")
app.conf.update(
    broker_url=os.environ["TEST_BROKER_URL"],
    broker_transport_options={
        "visibility_timeout": float(os.environ.get("TEST_VISIBILITY", "3")),
        "polling_interval": 0.02,
    },
    result_backend="file://" + os.environ["TEST_RESULTS"],
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)
EVENTS = os.environ.get("TEST_EVENTS", "")


def _note(*fields: object) -> None:
    """One line per event, appended in one write (O_APPEND: lines from processes never mix)."""
    line = " ".join(str(f) for f in fields) + "\n"
    fd = os.open(EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.task
def step(key: str, n: int, seconds: float = 0.0) -> list[object]:
    """Step n of key: noted as it starts and ends, with the time and the worker's pid."""
    _note("start", key, n, os.getpid(), f"{time.time():.6f}")
    time.sleep(seconds)
    _note("end", key, n, os.getpid(), f"{time.time():.6f}")
    return [key, n]


@app.task
def noop() -> None:
    return None
