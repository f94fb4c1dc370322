"""rqlite-queue: a per-group FIFO work queue replicated by Raft on rqlite, or embedded on SQLite.

Inside a group, messages are delivered in publish order, one at a time; across groups, workers
run in parallel, served round-robin with a priority floor.

What users reach for is here; the rest has a documented home: every error in
`rqlite_queue.errors`, the values the queue returns in `rqlite_queue.types`, codecs in
`rqlite_queue.codec`, the worker's counters in `rqlite_queue.worker`, test fixtures and local
clusters in `rqlite_queue.testing`, the dashboard in `rqlite_queue.dashboard`, Prometheus
metrics in `rqlite_queue.metrics`."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from ._async.queue import (
    AsyncRqliteTransport,
    AsyncShardedTransport,
    AsyncSqliteTransport,
    AsyncTransport,
)
from ._async.worker import AsyncWorker
from ._protocol.retry import Backoff
from ._protocol.worker_policy import Park
from ._sync.queue import RqliteTransport, ShardedTransport, SqliteTransport, Transport
from ._sync.worker import Worker
from .errors import InvalidArgument, LeaseLost, OutcomeUnknown, QueueError, Unavailable
from .types import Lease

__all__ = [
    "AsyncRqliteTransport",
    "AsyncShardedTransport",
    "AsyncSqliteTransport",
    "AsyncTransport",
    "AsyncWorker",
    "Backoff",
    "InvalidArgument",
    "Lease",
    "LeaseLost",
    "OutcomeUnknown",
    "Park",
    "QueueError",
    "RqliteTransport",
    "ShardedTransport",
    "SqliteTransport",
    "Transport",
    "Unavailable",
    "Worker",
    "from_url",
]

from_url = Transport.from_url

_MOVED = {
    **dict.fromkeys(
        (
            "AuthError",
            "BackendError",
            "ClockSkew",
            "DecodeError",
            "EncodeError",
            "NoLeader",
            "PartialRound",
            "PayloadTooLarge",
            "SchemaError",
            "ShardDown",
            "StaleShardList",
            "TransportClosed",
        ),
        "errors",
    ),
    **dict.fromkeys(
        ("DeadLetter", "GroupInfo", "Probe", "Round", "Schedule", "ShardStatus", "Stats"),
        "types",
    ),
    **dict.fromkeys(("Codec", "JsonCodec", "ModelCodec", "RawCodec"), "codec"),
}


def __getattr__(name: str) -> Any:
    """The names that lived here before they got a home of their own: still found, with a
    warning that says where they are now."""
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'rqlite_queue' has no attribute {name!r}")
    warnings.warn(
        f"rqlite_queue.{name} is now rqlite_queue.{home}.{name}", DeprecationWarning, stacklevel=2
    )
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
