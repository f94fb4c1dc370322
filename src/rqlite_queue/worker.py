"""The worker runtime: `Worker` (threads) and `AsyncWorker` (asyncio tasks); what a handler
may raise (`Park`); the retry policy of failed messages (`Backoff`); the counters a worker
keeps (`WorkerStats`, with the claim-latency histogram's `CLAIM_BUCKETS`); which of the two a
handler needs (`is_async_handler`: a coroutine function, or an object whose `__call__` is one,
runs on `AsyncWorker`)."""

from ._async.worker import CLAIM_BUCKETS, AsyncWorker, WorkerStats
from ._protocol.retry import Backoff
from ._protocol.worker_policy import Park
from ._runtime import is_async_handler
from ._sync.worker import Worker

__all__ = [
    "CLAIM_BUCKETS",
    "AsyncWorker",
    "Backoff",
    "Park",
    "Worker",
    "WorkerStats",
    "is_async_handler",
]
