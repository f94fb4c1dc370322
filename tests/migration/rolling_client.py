"""One client of the rolling-upgrade test (`test_rolling_upgrade.py`), run in a process of its
own with `PYTHONPATH` set to one version's `src/`: the library it imports is that version's.
It uses only calls that every version under test has (`RqliteTransport(url, queue=)`,
`publish`, `stats`, `Worker(transport, handler, concurrency=, visibility=)`, `run`).

Every line it appends to the shared log is one `write` of a line opened with O_APPEND (under
PIPE_BUF: lines of processes never mix), so the log's order is the order things happened:

    pub WHO PID GROUP K          a publish that returned (the message is in the queue)
    start WHO PID GROUP K        a handler began (its worker holds the group's lease)
    end WHO PID GROUP K          the handler returned (its ack follows in the next round)
    refused WHO PID - - ERROR    a call raised SchemaError (the process then exits, status 3)
    exit WHO PID - -             the process is done (its handlers, if any, finished or died)

    python rolling_client.py produce URL QUEUE LOG WHO GROUPS RATE     (until SIGTERM)
    python rolling_client.py work URL QUEUE LOG WHO CONCURRENCY VISIBILITY   (SIGTERM: stop)
    python rolling_client.py probe URL QUEUE LOG WHO
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from typing import Any

from rqlite_queue import RqliteTransport, Worker
from rqlite_queue.errors import SchemaError

REFUSED = 3


class Log:
    def __init__(self, path: str, who: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.who = who
        self.refused = threading.Event()
        self.lock = threading.Lock()
        """Held from a handler's look at `refused` to its start line, and while the refusal
        is written: no start line follows the refused one."""

    def line(self, kind: str, group: str = "-", k: object = "-", rest: str = "") -> None:
        text = f"{kind} {self.who} {os.getpid()} {group} {k}"
        os.write(self.fd, ((f"{text} {rest}" if rest else text)[:400] + "\n").encode())


def produce(url: str, queue: str, log: Log, groups: int, rate: float) -> None:
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    transport = RqliteTransport(url, queue=queue)
    try:
        n = 0
        while not stopping:
            group, k = f"{log.who}-{n % groups}", n // groups
            transport.publish(group, {"g": group, "k": k})
            log.line("pub", group, k)
            n += 1
            time.sleep(1 / rate)
    finally:
        transport.close()


def work(url: str, queue: str, log: Log, concurrency: int, visibility: float) -> None:
    transport = RqliteTransport(url, queue=queue)

    def handler(lease: Any) -> None:
        group, k = lease.event["g"], lease.event["k"]
        with log.lock:
            # Versions before the Worker dropped its waiting leases at a permanent error
            # (test_worker.py::test_no_handler_starts_once_run_has_raised) went on starting
            # the handlers of leases claimed ahead after `run` raised: they do nothing here.
            if log.refused.is_set():
                return
            log.line("start", group, k)
        time.sleep(random.uniform(0.001, 0.008))
        log.line("end", group, k)

    try:
        worker = Worker(transport, handler, concurrency=concurrency, visibility=visibility)
        worker.run()  # until SIGTERM (or a permanent error: SchemaError)
    finally:
        transport.close()


def probe(url: str, queue: str, log: Log) -> None:
    transport = RqliteTransport(url, queue=queue)
    try:
        transport.stats()
    finally:
        transport.close()


def main(argv: list[str]) -> int:
    role, url, queue, path, who, *rest = argv
    log = Log(path, who)
    try:
        if role == "produce":
            produce(url, queue, log, int(rest[0]), float(rest[1]))
        elif role == "work":
            work(url, queue, log, int(rest[0]), float(rest[1]))
        else:
            probe(url, queue, log)
    except SchemaError as exc:
        with log.lock:
            log.refused.set()
            log.line("refused", rest=" ".join(str(exc).split()))
        time.sleep(0.1)  # handlers under way end (within 8 ms) before the exit line
        return REFUSED
    finally:
        log.line("exit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
