"""The queue's errors: one small hierarchy, so callers can catch as broadly as they like."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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
    or it was already acked, nacked or dead-lettered, or an operator cancelled its group):
    nothing was changed."""

    def __init__(self, message: str, leases: Sequence[Lease] = ()) -> None:
        super().__init__(message)
        self.leases = list(leases)


class BackendError(QueueError):
    """The backend answered, but not as expected (an SQL error, a reply of the wrong shape)."""


class Unavailable(QueueError):
    """The operation was not applied: no node could be reached, or none could commit, within
    the deadline. Safe to retry."""


class NoLeader(Unavailable):
    """rqlite is up but has no leader (election under way, or no quorum): not applied."""


class ShardDown(Unavailable):
    """Refused at once by a sharded transport: the group's shard did not answer a moment ago
    and is being probed in the background (the other shards' groups are unaffected)."""


class PartialRound(Unavailable):
    """A sharded `settle_and_claim` whose settlements on some shard were not applied (the
    shard did not answer): `round` is what the other shards did (their settlements applied,
    their new leases), with the unapplied settlements in `round.unsettled`. A caller that
    treats it as a plain failure loses nothing: the leases in `round` lapse and come back."""

    def __init__(self, message: str, round: Any) -> None:
        super().__init__(message)
        self.round = round


class OutcomeUnknown(Unavailable):
    """The request was sent but its reply was lost (a leader that died while committing, a
    timeout, a dropped connection): it may or may not have been applied. The transport has
    already resent what is safe to resend (see the contract); what reaches you is what it
    could not settle: a publish without a dedup id (retrying could publish twice: give
    publishes a `dedup_id`, or the transport a `dedup_key`), or any call whose deadline ran
    out while the outcome was still unknown."""


class StaleShardList(QueueError):
    """A sharded transport's shard list is older than the one a shard has been given (its
    `epoch=` is lower): nothing was published. Give the client the new list."""


class AuthError(QueueError):
    """rqlite refused the credentials (HTTP 401/403). Not retried."""


class ClockSkew(QueueError):
    """This client's clock is too far from the cluster's for the lease asked for: other
    clients would see it lapse early (or late). Nothing was written. Fix the clock (NTP), or
    ask for a longer visibility, or allow more skew (`max_skew`)."""


class TransportClosed(QueueError):
    """The transport was closed: make a new one."""


class SchemaError(QueueError):
    """The queue's tables were written by a newer version of this library, or are damaged."""
