"""`python manage.py rqlite_queue_worker`: runs the tasks of a rqlite-queue task backend."""

from __future__ import annotations

import os
import signal
import socket
import threading
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.utils.module_loading import import_string

from ....worker import Backoff, Worker
from ...backend import BACKEND_OPTIONS, RqliteQueueBackend
from ...compat import task_backends
from ...runner import TaskRunner
from ...schedules import install_schedules


class Command(BaseCommand):
    help = (
        "Run the tasks of a rqlite-queue task backend: the queue's Worker (leases, heartbeats, "
        "retries with backoff, dead letters, periodic tasks); SIGTERM or Ctrl-C stops it "
        "gracefully (running tasks finish, the rest is given back)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--backend", default="default", help="the TASKS alias (default)")
        parser.add_argument(
            "--queue-name",
            default=None,
            help="the queues to run, comma-separated (default: every queue of the backend)",
        )
        parser.add_argument("--concurrency", type=int, default=None, help="tasks at once")
        parser.add_argument("--max-attempts", type=int, default=None, help="tries per task")
        parser.add_argument(
            "--visibility", type=float, default=None, help="lease seconds (extended while running)"
        )
        parser.add_argument("--worker-id", default=None, help="default: host-pid-random")
        parser.add_argument(
            "--until-empty", action="store_true", help="stop once nothing is left to run"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        # SIGTERM and Ctrl-C stop it gracefully from the start: while it connects (a cluster
        # that is not up yet), it leaves at once with nothing to give back; then its workers
        # wind down.
        stopping = threading.Event()
        workers: list[Worker] = []

        def stop(signum: int, frame: object) -> None:
            stopping.set()
            if not workers:
                raise SystemExit(0)
            for worker in workers:
                worker.stop()

        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            workers.extend(self._workers(options))
            if not stopping.is_set():
                self._run(workers, stopping, until_empty=options["until_empty"])
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _workers(self, options: dict[str, Any]) -> list[Worker]:
        alias = options["backend"]
        backend = task_backends[alias]
        if not isinstance(backend, RqliteQueueBackend):
            raise CommandError(f"backend {alias!r} is not a RqliteQueueBackend")
        settings = backend.options
        queues = (
            options["queue_name"].split(",") if options["queue_name"] else sorted(backend.queues)
        )
        option = {**BACKEND_OPTIONS, **settings}
        concurrency = options["concurrency"] or int(option["concurrency"])
        max_attempts = options["max_attempts"] or int(option["max_attempts"])
        visibility = options["visibility"] or float(option["visibility"])
        non_retryable = tuple(import_string(path) for path in option["non_retryable"])
        backoff = Backoff(**option["backoff"])
        install_schedules(backend)
        worker_id = options["worker_id"] or f"{socket.gethostname()}-{os.getpid()}"
        runner = TaskRunner(
            backend, worker_id, max_attempts=max_attempts, non_retryable=non_retryable
        )
        workers = [
            Worker(
                backend.queue(name),
                runner,
                concurrency=concurrency,
                visibility=visibility,
                max_attempts=max_attempts,
                backoff=backoff,
                non_retryable=non_retryable,
                worker_id=worker_id,
                grace=float(option["grace"]),
            )
            for name in queues
        ]
        self.stdout.write(
            f"rqlite_queue_worker: {', '.join(queues)} on {backend.url} "
            f"(worker {worker_id}, concurrency {concurrency}, max attempts {max_attempts})"
        )
        return workers

    @staticmethod
    def _run(workers: list[Worker], stopping: threading.Event, *, until_empty: bool) -> None:
        """Each queue's Worker in a thread of its own until all have stopped."""
        threads = [
            threading.Thread(
                target=w.run, kwargs={"handle_signals": False, "until_empty": until_empty}
            )
            for w in workers
        ]
        for thread in threads:
            thread.start()
        for worker, thread in zip(workers, threads, strict=True):
            while thread.is_alive():
                if stopping.is_set():  # (again: a stop made before its run began is lost)
                    worker.stop()
                thread.join(0.5)
