"""The worker runtime: `Worker` (threads) and `AsyncWorker` (asyncio tasks), what a handler
may raise (`Park`), the retry policy of failed messages (`Backoff`), and the counters a worker
keeps (`WorkerStats`, with the claim-latency histogram's `CLAIM_BUCKETS`)."""

from ._async.worker import CLAIM_BUCKETS, AsyncWorker, WorkerStats
from ._protocol.retry import Backoff
from ._protocol.worker_policy import Park
from ._sync.worker import Worker

__all__ = ["CLAIM_BUCKETS", "AsyncWorker", "Backoff", "Park", "Worker", "WorkerStats"]
