"""The queue's errors: one small hierarchy, so callers can catch as broadly as they like."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .lease import Lease


class QueueError(Exception):
    """Base of every error this library raises on purpose."""


class InvalidArgument(QueueError, ValueError):
    """Bad input: nothing was written."""


class PayloadTooLarge(InvalidArgument):
    """The encoded payload is over the transport's `max_payload_bytes`."""


class EncodeError(InvalidArgument):
    """The codec cannot encode this payload."""


class DecodeError(QueueError):
    """A stored payload cannot be decoded by this transport's codec."""


class LeaseLost(QueueError):
    """The lease no longer holds its group (it lapsed and another worker claimed the group,
    or it was already acked, nacked or dead-lettered): nothing was changed."""

    def __init__(self, message: str, leases: Sequence[Lease] = ()) -> None:
        super().__init__(message)
        self.leases = list(leases)


class BackendError(QueueError):
    """The backend answered, but not as expected (an SQL error, a reply of the wrong shape)."""


class Unavailable(QueueError):
    """The backend could not be reached, or could not commit, within the deadline."""


class NoLeader(Unavailable):
    """rqlite is up but has no leader (election under way, or no quorum)."""


class AuthError(QueueError):
    """rqlite refused the credentials (HTTP 401/403). Not retried."""


class SchemaError(QueueError):
    """The queue's tables were written by a newer version of this library, or are damaged."""
