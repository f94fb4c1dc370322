"""The worker runtime: `Worker` (threads) and `AsyncWorker` (asyncio tasks); what a handler
may raise (`Park`), return (`Result`: a result and follow-ups) and ask (`current_job()`: its
`Job`, cancelled or not, and where to report progress; `JobCancelled`); the retry policy of
failed messages (`Backoff`); the counters a worker keeps (`WorkerStats`, with the
claim-latency histogram's `CLAIM_BUCKETS`); which of the two a handler needs
(`is_async_handler`: a coroutine function, or an object whose `__call__` is one, runs on
`AsyncWorker`)."""

from ._async.worker import CLAIM_BUCKETS, AsyncWorker, WorkerStats
from ._job import Job, JobCancelled, Result, current_job
from ._protocol.retry import Backoff
from ._protocol.worker_policy import Park
from ._runtime import is_async_handler
from ._sync.worker import Worker

__all__ = [
    "CLAIM_BUCKETS",
    "AsyncWorker",
    "Backoff",
    "Job",
    "JobCancelled",
    "Park",
    "Result",
    "Worker",
    "WorkerStats",
    "current_job",
    "is_async_handler",
]
