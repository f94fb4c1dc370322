"""The worker runtime: `Worker` (threads) and `AsyncWorker` (asyncio tasks)."""

from ._async.worker import AsyncWorker, WorkerStats
from ._sync.worker import Worker
from .worker_policy import Backoff, IdlePoll

__all__ = ["AsyncWorker", "Backoff", "IdlePoll", "Worker", "WorkerStats"]
