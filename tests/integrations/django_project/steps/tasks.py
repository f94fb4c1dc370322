"""The test project's tasks: each notes its runs (`start|end KEY N PID TIME`) in the events
file, for tests/integrations/framework_checks.py."""

import asyncio
import os
import time

from rqlite_queue.django.compat import task  # django.tasks' or the backport's


def note(*fields: object) -> None:
    line = " ".join(str(f) for f in fields) + "\n"
    fd = os.open(os.environ["TEST_EVENTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


class Fatal(Exception):
    """Not retried (OPTIONS["non_retryable"])."""


@task()
def step(key: str, n: int, seconds: float = 0.0) -> list[object]:
    note("start", key, n, os.getpid(), f"{time.time():.6f}")
    time.sleep(seconds)
    note("end", key, n, os.getpid(), f"{time.time():.6f}")
    return [key, n]


@task(takes_context=True)
def flaky(context, key: str) -> int:
    """Fails on its first attempt, succeeds on the second."""
    note("attempt", key, context.attempt, os.getpid(), f"{time.time():.6f}")
    if context.attempt < 2:
        raise RuntimeError(f"{key}: first attempt fails")
    return context.attempt


@task()
def fatal(key: str) -> None:
    note("fatal", key, 0, os.getpid(), f"{time.time():.6f}")
    raise Fatal(key)


@task()
async def asleep(key: str) -> str:
    note("start", key, 0, os.getpid(), f"{time.time():.6f}")
    await asyncio.sleep(0.01)
    note("end", key, 0, os.getpid(), f"{time.time():.6f}")
    return key


@task()
def tick() -> None:
    note("tick", "tick", 0, os.getpid(), f"{time.time():.6f}")


@task()
def doomed(key: str) -> None:
    """Fails on every attempt (retried until max_attempts)."""
    raise ValueError(f"{key}: never works")


@task()
def hold(path: str) -> str:
    """Runs until the file `path` exists."""
    while not os.path.exists(path):
        time.sleep(0.02)
    return "released"
