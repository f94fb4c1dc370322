"""rqlite-queue: a per-group FIFO work queue replicated by Raft on rqlite, or embedded on SQLite.

Inside a group, messages are delivered in publish order, one at a time; across groups, workers
run in parallel, served round-robin with a priority floor."""

from ._async.transport import AsyncRqliteTransport, AsyncSqliteTransport, AsyncTransport
from ._sync.transport import RqliteTransport, SqliteTransport, Transport
from .codec import Codec, JsonCodec, ModelCodec, RawCodec
from .errors import (
    AuthError,
    BackendError,
    DecodeError,
    EncodeError,
    InvalidArgument,
    LeaseLost,
    NoLeader,
    PayloadTooLarge,
    QueueError,
    SchemaError,
    Unavailable,
)
from .lease import DeadLetter, Lease, Stats

__all__ = [
    "AsyncRqliteTransport",
    "AsyncSqliteTransport",
    "AsyncTransport",
    "AuthError",
    "BackendError",
    "Codec",
    "DeadLetter",
    "DecodeError",
    "EncodeError",
    "InvalidArgument",
    "JsonCodec",
    "Lease",
    "LeaseLost",
    "ModelCodec",
    "NoLeader",
    "PayloadTooLarge",
    "QueueError",
    "RawCodec",
    "RqliteTransport",
    "SchemaError",
    "SqliteTransport",
    "Stats",
    "Transport",
    "Unavailable",
    "from_url",
]

from_url = Transport.from_url
