"""The few primitives where threads and asyncio really differ: running handlers concurrently,
an interruptible sleep, waiting for what is running, signals. The worker loop itself is
written once (in `_async/worker.py`, with `_sync/worker.py` generated from it) on top of these.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class AsyncRuntime:
    def __init__(self, concurrency: int) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._installed: list[signal.Signals] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    def spawn(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        self._loop = asyncio.get_running_loop()
        task: asyncio.Task[Any] = self._loop.create_task(fn(*args))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def call(self, handler: Callable[..., Any], *args: Any) -> Any:
        """An async handler is awaited; a sync one runs in a thread, off the event loop."""
        if inspect.iscoroutinefunction(handler):
            return await handler(*args)
        result = await asyncio.to_thread(handler, *args)
        if inspect.isawaitable(result):
            return await result
        return result

    async def sleep(self, seconds: float) -> None:
        """Sleep, or return early when `wake` is called."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()

    def wake(self) -> None:
        # May be called from another thread (e.g. `stop()`): hand the set to the loop.
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    async def wait_all(self, timeout: float) -> bool:
        """Wait until every spawned task is done; False if some still run after `timeout`."""
        pending = {t for t in self._tasks if not t.done()}
        if not pending:
            return True
        _, still = await asyncio.wait(pending, timeout=timeout)
        return not still

    def cancel_all(self) -> None:
        for task in self._tasks:
            task.cancel()

    def install_signals(self, on_signal: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        for sig in _SIGNALS:
            try:
                loop.add_signal_handler(sig, on_signal)
                self._installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or no signals here

    def remove_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._installed:
            loop.remove_signal_handler(sig)
        self._installed.clear()


class SyncRuntime:
    def __init__(self, concurrency: int) -> None:
        # Daemon threads, not a pool: after the grace period a stuck handler is abandoned
        # (its lease nacked), and it must not keep the process from exiting.
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._previous: dict[signal.Signals, Any] = {}

    def spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        def run() -> None:
            try:
                fn(*args)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, name="rqlite-queue-worker", daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def call(self, handler: Callable[..., Any], *args: Any) -> Any:
        if inspect.iscoroutinefunction(handler):
            raise TypeError("Worker takes a sync handler; use AsyncWorker for a coroutine")
        return handler(*args)

    def sleep(self, seconds: float) -> None:
        self._wake.wait(seconds)
        self._wake.clear()

    def wake(self) -> None:
        self._wake.set()

    def wait_all(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                pending = [t for t in self._threads if t.is_alive()]
            if not pending:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            pending[0].join(left)

    def cancel_all(self) -> None:
        # Threads cannot be cancelled: handlers still running finish on their own (daemon
        # threads: they do not hold the process) and find their leases nacked.
        pass

    def install_signals(self, on_signal: Callable[[], None]) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            self._previous[sig] = signal.signal(sig, lambda *_: on_signal())

    def remove_signals(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
