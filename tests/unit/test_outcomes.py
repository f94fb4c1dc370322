"""The pure parts of jobs' outcomes: an error as a job keeps it (class, message, a bounded
traceback), progress values, how long an outcome is kept, a waiter's polls; and a handler's
`Job` (its cancel signal, its progress), without a queue."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from rqlite_queue._job import Job, error_of, in_job
from rqlite_queue._protocol.outcomes import (
    check_error,
    check_keep,
    check_progress,
    error_text,
    poll_delays,
    read_errors,
)
from rqlite_queue.errors import InvalidArgument
from rqlite_queue.types import MAX_PROGRESS_BYTES, MAX_TRACEBACK_BYTES, JobError, Lease
from rqlite_queue.worker import JobCancelled, current_job


def _raise(depth: int) -> None:
    if depth:
        _and_again(depth - 1)  # (two functions in turn: Python folds a frame repeated alone)
    raise ValueError("the bottom \x00 of it \ud800")


def _and_again(depth: int) -> None:
    _raise(depth)


def test_an_error_keeps_its_class_message_and_innermost_frames_within_the_bound() -> None:
    try:
        _raise(300)  # a traceback far over the bound
    except ValueError as exc:
        error = error_of(exc, attempt=3)
    assert error.type == "builtins.ValueError"
    assert error.attempt == 3
    assert "\x00" not in error.message and error.message.startswith("the bottom")
    data = error.traceback.encode("utf-8")  # valid text: no lone surrogate left
    assert len(data) <= MAX_TRACEBACK_BYTES
    assert error.traceback.startswith("Traceback (most recent call last):\n  ...\n")
    assert error.traceback.rstrip().endswith("of it \\ud800")  # the error line, at the end
    assert "_and_again(depth - 1)" in error.traceback
    assert read_errors("[" + error_text(error) + "]") == (error,)


def test_a_short_traceback_is_kept_whole() -> None:
    try:
        raise KeyError("k")
    except KeyError as exc:
        error = error_of(exc)
    assert error.type == "builtins.KeyError" and error.message == "'k'"
    assert error.traceback.startswith("Traceback") and error.traceback.endswith("KeyError: 'k'\n")


def test_a_given_error_is_bounded_and_anything_else_refused() -> None:
    given = JobError("my.Error", "m" * 5000, "t" * (MAX_TRACEBACK_BYTES * 2))
    checked = check_error(given, 2)
    assert checked.attempt == 2 and len(checked.message.encode()) <= 2000
    assert len(checked.traceback.encode()) <= MAX_TRACEBACK_BYTES
    for bad in ("text", 3, ValueError("an exception: error_of first"), JobError("t", 4, "")):  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument):
            check_error(bad, 1)


def test_progress_is_small_json() -> None:
    assert check_progress({"done": 3, "of": 10}) == '{"done":3,"of":10}'
    assert check_progress("é") == '"é"'
    for bad in (object(), float("nan"), {"x": "y" * MAX_PROGRESS_BYTES}, {1, 2}):
        with pytest.raises(InvalidArgument):
            check_progress(bad)


def test_keep_is_seconds_or_none() -> None:
    assert check_keep(None) is None
    assert check_keep(3600) == 3600.0
    for bad in (0, -1, float("inf"), "60", True, 10**9):
        with pytest.raises(InvalidArgument):
            check_keep(bad)


def test_a_waiter_reads_at_most_seven_times_in_its_first_second_then_twice_a_second() -> None:
    delays = list(itertools.islice(poll_delays(), 40))
    reads_at = list(itertools.accumulate(delays))
    assert sum(at <= 1.0 for at in reads_at) <= 7
    assert delays[-1] == 0.5 and all(a <= b for a, b in itertools.pairwise(delays))


def _lease() -> Lease:
    return Lease(7, "g", {"n": 1}, "w:abc")


def test_a_job_tells_its_handler_of_a_cancel_once_and_wakes_a_wait() -> None:
    job = Job(_lease())
    told: list[str] = []
    job.on_cancel(lambda: told.append("cancel"))
    assert not job.cancelled and job.cancel_reason is None
    assert job.wait_cancelled(0.01) is False
    job.raise_if_cancelled()
    waited: list[bool] = []
    waiter = threading.Thread(target=lambda: waited.append(job.wait_cancelled(10)))
    waiter.start()
    time.sleep(0.05)
    started = time.monotonic()
    assert job.tell_cancelled("stop") is True
    waiter.join(5)
    assert waited == [True] and time.monotonic() - started < 1
    assert job.tell_cancelled("again") is False  # told once, the first reason kept
    assert told == ["cancel"] and job.cancel_reason == "stop"
    with pytest.raises(JobCancelled) as raised:
        job.raise_if_cancelled()
    assert raised.value.reason == "stop"


def test_progress_waits_to_be_sent_and_is_sent_once() -> None:
    job = Job(_lease())
    reported: list[int] = []
    job.on_progress(lambda: reported.append(1))
    assert job.progress_to_send() is None
    job.progress({"p": 1})
    assert job.progress_to_send() == '{"p":1}' and reported == [1]
    job.progress_sent('{"p":1}', 5.0)
    assert job.progress_to_send() is None and job.sent_at == 5.0
    job.progress({"p": 1})  # the same value again: nothing new to send
    assert job.progress_to_send() is None
    with pytest.raises(InvalidArgument):
        job.progress(object())


async def test_current_job_is_the_handlers_own_in_threads_and_tasks() -> None:
    with pytest.raises(LookupError):
        current_job()
    job = Job(_lease())

    def sync(lease: Lease) -> Job:
        return current_job()

    async def coroutine(lease: Lease) -> Job:
        return current_job()

    assert in_job(job, sync, False)(job.lease) is job
    with pytest.raises(LookupError):
        current_job()  # reset after the handler
    assert await in_job(job, coroutine, True)(job.lease) is job
