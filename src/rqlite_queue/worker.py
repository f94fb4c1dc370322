"""The worker runtime: `Worker` (threads) and `AsyncWorker` (asyncio tasks)."""

from ._async.worker import CLAIM_BUCKETS, AsyncWorker, WorkerStats
from ._sync.worker import Worker
from .worker_policy import Backoff, Park

__all__ = ["CLAIM_BUCKETS", "AsyncWorker", "Backoff", "Park", "Worker", "WorkerStats"]
