"""The few primitives where threads and asyncio really differ: running handlers concurrently on
reused threads or tasks, an interruptible wait, signals, calls to several shards at once. The
worker loop and the shard router are written once (in `_async/`, with `_sync/` generated from
it) on top of these."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import queue
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Executor, Future
from typing import Annotated, Any, TypeVar

from .errors import InvalidArgument

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
T = TypeVar("T")

Same = Annotated[T, "what Awaitable[T] becomes in the generated sync code: T itself"]
__all__ = [
    "LOCAL_CANCELS",
    "LOCAL_OUTCOMES",
    "LOCAL_PUBLISHES",
    "SKIPPED",
    "AsyncFanOut",
    "AsyncHandoff",
    "AsyncMutex",
    "AsyncRuntime",
    "AsyncWaiter",
    "Awaitable",
    "FanOut",
    "Handoff",
    "Mutex",
    "Same",
    "SyncRuntime",
    "Waiter",
]

Done = Callable[[Any, BaseException | None, Any], None]
"""Called with (key, the handler's exception or None, what it returned) when a handler
finishes."""
Admit = Callable[[Any, Any], bool]
"""Called with (key, lease) when a slot is free and the handler is about to run: False skips it
(its message was given back while it waited), and `done` then gets SKIPPED."""


class _Skipped:
    def __repr__(self) -> str:
        return "SKIPPED"


SKIPPED: Any = _Skipped()
"""What `done` gets for a handler that `admit` skipped."""


def is_async_handler(handler: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


async def _then(awaitable: Awaitable[Any], finish: Callable[[Any], Any]) -> Any:
    return finish(await awaitable)


class DaemonPool(Executor):
    """Up to `size` reused daemon threads. Daemons, so that a handler stuck past the grace
    period (its lease nacked) does not keep the process from exiting."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None]
        self._jobs = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
            elif self._threads < self._size:
                self._threads += 1
                threading.Thread(
                    target=self._work, name="rqlite-queue-handler", daemon=True
                ).start()
        self._jobs.put((future, lambda: fn(*args, **kwargs)))
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            threads, self._threads, self._idle = self._threads, 0, 0
        for _ in range(threads):
            self._jobs.put(None)


def _report(key: Any, done: Done) -> Callable[[Future[Any]], None]:
    def callback(future: Future[Any]) -> None:
        if future.cancelled():
            done(key, asyncio.CancelledError(), None)
        elif future.exception() is not None:
            done(key, future.exception(), None)
        else:
            done(key, None, future.result())

    return callback


class AsyncRuntime:
    def __init__(self, concurrency: int) -> None:
        self._tasks: set[asyncio.Future[Any]] = set()
        self._coroutines: dict[Any, asyncio.Future[Any]] = {}
        """The tasks of coroutine handlers, by key (the ones `cancel` can stop)."""
        self._wake = asyncio.Event()
        self._installed: list[signal.Signals] = []
        self._loop = asyncio.get_running_loop()
        self._pool = DaemonPool(concurrency)
        self._slots = asyncio.Semaphore(concurrency)
        """Coroutine handlers running at once (sync ones: the pool's threads)."""
        self._done = asyncio.Event()
        self._kept: asyncio.Task[None] | None = None

    def keep(self, job: Callable[[AsyncRuntime], Coroutine[Any, Any, None]]) -> None:
        """Run `job(self)` beside the caller (a task) until `abandon`; it waits with `pause`."""
        self._kept = self._loop.create_task(job(self))

    async def pause(self, seconds: float) -> bool:
        """A kept job's wait; True once the runtime is abandoned."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._done.wait(), max(0.0, seconds))
        return self._done.is_set()

    @staticmethod
    def check_handler(handler: Callable[..., Any]) -> None:
        if not callable(handler):
            raise InvalidArgument(f"the handler must be callable, got {handler!r}")

    def start(
        self,
        handler: Callable[..., Any],
        lease: Any,
        key: Any,
        done: Done,
        finish: Callable[[Any], Any] | None = None,
        admit: Admit | None = None,
    ) -> None:
        """Run `handler(lease)` once one of the `concurrency` slots is free (those started
        beyond them wait, in order): a coroutine function as a task, a sync one on a reused
        thread, off the event loop. `admit`, if given, is asked first (see `Admit`). `finish`,
        if given, turns what it returned into what `done` gets, where the handler ran (its
        thread, or its task). `done` is called on the loop when it finishes."""
        future: asyncio.Future[Any]
        if is_async_handler(handler):
            future = self._loop.create_task(self._in_slot(handler, lease, key, finish, admit))
            self._coroutines[key] = future
            future.add_done_callback(lambda f: self._forget(key, f))
        else:
            future = self._loop.create_task(self._in_thread(handler, lease, key, finish, admit))
        self._tasks.add(future)
        future.add_done_callback(self._tasks.discard)
        future.add_done_callback(_report(key, done))  # type: ignore[arg-type]

    def _forget(self, key: Any, future: asyncio.Future[Any]) -> None:
        if self._coroutines.get(key) is future:
            del self._coroutines[key]

    def cancel(self, key: Any) -> None:
        """Cancel the task of the coroutine handler started with `key` (a sync handler's
        thread cannot be stopped: it sees its job cancelled, and finishes on its own). May be
        called from another thread."""
        future = self._coroutines.get(key)
        if future is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(future.cancel)

    async def _in_slot(
        self,
        handler: Callable[..., Any],
        lease: Any,
        key: Any,
        finish: Callable[[Any], Any] | None,
        admit: Admit | None,
    ) -> Any:
        async with self._slots:
            if admit is not None and not admit(key, lease):
                return SKIPPED
            result = await handler(lease)
            return result if finish is None else finish(result)

    async def _in_thread(
        self,
        handler: Callable[..., Any],
        lease: Any,
        key: Any,
        finish: Callable[[Any], Any] | None,
        admit: Admit | None,
    ) -> Any:
        def call() -> Any:
            if admit is not None and not admit(key, lease):
                return SKIPPED
            result = handler(lease)
            if finish is None or inspect.isawaitable(result):
                return result
            return finish(result)

        result = await self._loop.run_in_executor(self._pool, call)
        if inspect.isawaitable(result):
            return await (result if finish is None else _then(result, finish))
        return result

    async def wait(self, seconds: float) -> None:
        """Wait `seconds`, or until `wake` is called."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), max(0.0, seconds))
        self._wake.clear()

    def wake(self) -> None:
        # May be called from another thread (e.g. `stop()`): hand the set to the loop.
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    def abandon(self) -> None:
        """Cancel handler tasks still running (threads cannot be cancelled: a sync handler
        finishes on its own, and finds its lease given back), and the kept job."""
        self._done.set()
        if self._kept is not None:
            self._kept.cancel()
        for task in self._tasks:
            task.cancel()
        self._pool.shutdown(wait=False)

    def install_signals(self, on_signal: Callable[[], None]) -> None:
        for sig in _SIGNALS:
            try:
                self._loop.add_signal_handler(sig, on_signal)
                self._installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread, or no signals here

    def remove_signals(self) -> None:
        for sig in self._installed:
            self._loop.remove_signal_handler(sig)
        self._installed.clear()


class SyncRuntime:
    def __init__(self, concurrency: int) -> None:
        self._wake = threading.Event()
        self._previous: dict[signal.Signals, Any] = {}
        self._pool = DaemonPool(concurrency)
        self._done = threading.Event()

    def keep(self, job: Callable[[SyncRuntime], None]) -> None:
        """Run `job(self)` beside the caller (a daemon thread) until `abandon`; it waits with
        `pause`."""
        threading.Thread(target=job, args=(self,), name="rqlite-queue-keeper", daemon=True).start()

    def pause(self, seconds: float) -> bool:
        """A kept job's wait; True once the runtime is abandoned."""
        return self._done.wait(max(0.0, seconds))

    @staticmethod
    def check_handler(handler: Callable[..., Any]) -> None:
        if not callable(handler):
            raise InvalidArgument(f"the handler must be callable, got {handler!r}")
        if is_async_handler(handler):
            raise InvalidArgument("Worker takes a sync handler; use AsyncWorker for a coroutine")

    def start(
        self,
        handler: Callable[..., Any],
        lease: Any,
        key: Any,
        done: Done,
        finish: Callable[[Any], Any] | None = None,
        admit: Admit | None = None,
    ) -> None:
        """As `AsyncRuntime.start`, on the pool's threads (jobs beyond them wait in order)."""

        def run() -> Any:
            if admit is not None and not admit(key, lease):
                return SKIPPED
            result = handler(lease)
            if inspect.isawaitable(result):
                close = getattr(result, "close", None)
                if close is not None:
                    close()  # never awaited: do not leave a warning behind
                raise InvalidArgument("the handler returned an awaitable: use AsyncWorker")
            return result if finish is None else finish(result)

        self._pool.submit(run).add_done_callback(_report(key, done))

    def cancel(self, key: Any) -> None:
        """Threads cannot be cancelled: a sync handler sees its job cancelled, and finishes on
        its own."""

    def wait(self, seconds: float) -> None:
        self._wake.wait(max(0.0, seconds))
        self._wake.clear()

    def wake(self) -> None:
        self._wake.set()

    def abandon(self) -> None:
        self._done.set()
        self._pool.shutdown(wait=False)

    def install_signals(self, on_signal: Callable[[], None]) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in _SIGNALS:
            self._previous[sig] = signal.signal(sig, lambda *_: on_signal())

    def remove_signals(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()


class LocalWakes:
    """Callbacks of this process waiting for something of a key, woken by whoever does it in
    this process (any thread), instead of at their next poll: the workers of a queue waiting
    for work, when a publish is made (`LOCAL_PUBLISHES`, by queue name: a queue of the same
    name on another cluster wakes them too, and costs them one claim that finds nothing);
    workers of a queue, when a message of theirs is cancelled (`LOCAL_CANCELS`, by queue
    name); waiters for an outcome, when a settlement of their group applies
    (`LOCAL_OUTCOMES`, by (queue name, group id)). Others poll."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[Any, set[Callable[[], None]]] = {}

    def listen(self, key: Any, wake: Callable[[], None]) -> None:
        with self._lock:
            self._waiting.setdefault(key, set()).add(wake)

    def forget(self, key: Any, wake: Callable[[], None]) -> None:
        with self._lock:
            waiting = self._waiting.get(key)
            if waiting is not None:
                waiting.discard(wake)
                if not waiting:
                    del self._waiting[key]

    def __bool__(self) -> bool:
        return bool(self._waiting)  # (read without the lock: a hint, for the common case)

    def wake(self, keys: Sequence[Any]) -> None:
        if not self._waiting:  # (the common case: nobody waits; no lock)
            return
        with self._lock:
            wakes = [wake for key in keys for wake in self._waiting.get(key, ())]
        for wake in wakes:
            wake()


LOCAL_PUBLISHES = LocalWakes()
LOCAL_CANCELS = LocalWakes()
LOCAL_OUTCOMES = LocalWakes()


class AsyncWaiter:
    """A wait that another thread (or task) can cut short, again and again (a waiter for an
    outcome: `LOCAL_OUTCOMES` wakes it)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._event = asyncio.Event()

    def wake(self) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self, seconds: float) -> None:
        """Wait `seconds`, or until `wake` (since the last wait)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), max(0.0, seconds))
        self._event.clear()


class Waiter:
    def __init__(self) -> None:
        self._event = threading.Event()

    def wake(self) -> None:
        self._event.set()

    def wait(self, seconds: float) -> None:
        self._event.wait(max(0.0, seconds))
        self._event.clear()


class AsyncHandoff:
    """A value handed from one task to another, once."""

    def __init__(self) -> None:
        self._future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def put(self, value: Any) -> None:
        if not self._future.done():
            self._future.set_result(value)

    async def get(self) -> Any:
        return await self._future

    def peek(self) -> Any:
        """The value if it was put, else None."""
        done = self._future.done() and not self._future.cancelled()
        return self._future.result() if done else None


class Handoff:
    """A value handed from one thread to another, once."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._value: Any = None

    def put(self, value: Any) -> None:
        self._value = value
        self._event.set()

    def get(self) -> Any:
        self._event.wait()
        return self._value

    def peek(self) -> Any:
        return self._value if self._event.is_set() else None


class AsyncMutex:
    """What guards state shared by concurrent callers: nothing on one event loop (no await
    inside the guarded blocks), a lock between threads (`Mutex`)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


class Mutex:
    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self._lock.release()


class AsyncFanOut:
    """Calls to several shards at once (tasks), and one background job (a task) that keeps
    running until `close`."""

    def __init__(self, size: int) -> None:
        self._background: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def all(self, calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T | BaseException]:
        """Every call's result or exception, in order."""
        if len(calls) == 1:  # no task for the common case of one shard to ask
            try:
                return [await calls[0]()]
            except Exception as exc:
                return [exc]
        return list(await asyncio.gather(*(call() for call in calls), return_exceptions=True))

    def background(self, job: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Start `job` unless it runs already."""
        if self._background is None or self._background.done():
            self._background = asyncio.get_running_loop().create_task(job())

    async def pause(self, seconds: float) -> bool:
        """Sleep `seconds` (a background job's wait); True once `close` was called."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), max(0.0, seconds))
        return self._stop.is_set()

    async def close(self) -> None:
        self._stop.set()
        if self._background is not None and not self._background.done():
            self._background.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._background


class FanOut:
    """Calls to several shards at once (threads), and one background job (a daemon thread)
    that keeps running until `close`."""

    def __init__(self, size: int) -> None:
        self._pool = DaemonPool(max(1, size))
        self._background: threading.Thread | None = None
        self._stop = threading.Event()

    def all(self, calls: Sequence[Callable[[], T]]) -> list[T | BaseException]:
        """Every call's result or exception, in order."""
        if len(calls) == 1:
            try:
                return [calls[0]()]
            except Exception as exc:
                return [exc]
        futures = [self._pool.submit(call) for call in calls]
        results: list[T | BaseException] = []
        for future in futures:
            try:
                results.append(future.result())
            except Exception as exc:
                results.append(exc)
        return results

    def background(self, job: Callable[[], None]) -> None:
        """Start `job` unless it runs already."""
        if self._background is None or not self._background.is_alive():
            self._background = threading.Thread(target=job, name="rqlite-queue-shards", daemon=True)
            self._background.start()

    def pause(self, seconds: float) -> bool:
        """Sleep `seconds` (a background job's wait); True once `close` was called."""
        return self._stop.wait(max(0.0, seconds))

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False)
