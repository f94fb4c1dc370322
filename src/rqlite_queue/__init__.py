"""rqlite-queue: a per-group FIFO work queue replicated by Raft on rqlite, or embedded on SQLite.

Inside a group, messages are delivered in publish order, one at a time; across groups, workers
run in parallel, served round-robin with a priority floor."""

from ._async.sharded import AsyncShardedTransport
from ._async.transport import AsyncRqliteTransport, AsyncSqliteTransport, AsyncTransport
from ._async.worker import AsyncWorker
from ._sync.sharded import ShardedTransport
from ._sync.transport import RqliteTransport, SqliteTransport, Transport
from ._sync.worker import Worker
from .codec import Codec, JsonCodec, ModelCodec, RawCodec
from .core import Probe, Round
from .errors import (
    AuthError,
    BackendError,
    ClockSkew,
    DecodeError,
    EncodeError,
    InvalidArgument,
    LeaseLost,
    NoLeader,
    OutcomeUnknown,
    PartialRound,
    PayloadTooLarge,
    QueueError,
    SchemaError,
    ShardDown,
    StaleShardList,
    TransportClosed,
    Unavailable,
)
from .lease import DeadLetter, GroupInfo, Lease, Schedule, Stats
from .worker_policy import Backoff, Park

__all__ = [
    "AsyncRqliteTransport",
    "AsyncShardedTransport",
    "AsyncSqliteTransport",
    "AsyncTransport",
    "AsyncWorker",
    "AuthError",
    "BackendError",
    "Backoff",
    "ClockSkew",
    "Codec",
    "DeadLetter",
    "DecodeError",
    "EncodeError",
    "GroupInfo",
    "InvalidArgument",
    "JsonCodec",
    "Lease",
    "LeaseLost",
    "ModelCodec",
    "NoLeader",
    "OutcomeUnknown",
    "Park",
    "PartialRound",
    "PayloadTooLarge",
    "Probe",
    "QueueError",
    "RawCodec",
    "Round",
    "RqliteTransport",
    "Schedule",
    "SchemaError",
    "ShardDown",
    "ShardedTransport",
    "SqliteTransport",
    "StaleShardList",
    "Stats",
    "Transport",
    "TransportClosed",
    "Unavailable",
    "Worker",
    "from_url",
]

from_url = Transport.from_url
