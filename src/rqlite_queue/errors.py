"""The queue's errors: one small hierarchy, so callers can catch as broadly as they like. Each
says whether the call applied, and so what to do next:

- not applied, fix the input: `InvalidArgument` (`PayloadTooLarge`, `EncodeError`,
  `InvalidHeaders`, `TenantMismatch`, `BatchDone`, `CrossShard`);
- not applied, retry later: `Unavailable` (`NoLeader`, `ShardDown`, `NothingListens`),
  `QueueFull`;
- may have applied: `OutcomeUnknown` (retry only what is safe to repeat);
- partly applied: `PartialRound` (resend what it lists);
- applied, not yet where it goes: `ForwardPending` (do not send it again);
- not applied, and retrying cannot help: `LeaseLost` (drop the result), `StaleShardList`,
  `ClockSkew`, `AuthError`, `SchemaError`, `TransportClosed`, `BackendError`, `DecodeError`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .types import Lease


class QueueError(Exception):
    """Base of every error this library raises on purpose."""


class InvalidArgument(QueueError, ValueError):
    """Bad input: nothing was written. Fix the call. `index`: for a `publish_many` item, its
    position in the list (None otherwise)."""

    index: int | None = None


class TenantMismatch(InvalidArgument):
    """A publish named a tenant other than the one its group has: a group's tenant is set by
    the publish that creates (or refills) it and never changes while it has messages.
    Nothing was written."""


class QueueFull(QueueError):
    """A publish would take a tenant's queued messages, or one of its groups', over the bound
    `set_tenant(max_queued=, max_group_queued=)` set: nothing was written (nothing of a
    `publish_many`). Retry later, or shed the work. `tenant`, `group_id` (None: the tenant's
    bound) and `limit` say which bound, as read just after the refusal."""

    def __init__(
        self,
        message: str,
        *,
        tenant: str | None = None,
        group_id: str | None = None,
        limit: int | None = None,
    ) -> None:
        super().__init__(message)
        self.tenant = tenant
        self.group_id = group_id
        self.limit = limit


class BatchDone(InvalidArgument):
    """A publish named a batch that is done (its callbacks were published), or one this
    queue does not know (never made, or forgotten after its `keep`): nothing can join it, and
    nothing was written."""


class CrossShard(InvalidArgument):
    """A sharded queue was asked for one transaction on two shards: `transaction()` publishes
    to groups of one shard, and into batches that live on that shard (a message and its
    batch's count are one write). Nothing was sent."""


class PayloadTooLarge(InvalidArgument):
    """The encoded payload is over the transport's `max_payload_bytes`: nothing was written."""


class EncodeError(InvalidArgument):
    """The codec cannot encode this payload: nothing was written."""


class InvalidHeaders(InvalidArgument):
    """A message's headers are not a mapping of non-empty str keys to str values, or are
    over the limits (`types.MAX_HEADERS` entries, `types.MAX_HEADERS_BYTES` bytes as
    stored): nothing was written."""


class DecodeError(QueueError):
    """A stored payload cannot be decoded by this transport's codec (a codec that changed, or
    a message written by another program): use the codec that wrote it."""


class LeaseLost(QueueError):
    """The lease no longer holds its group (it lapsed and another worker claimed the group,
    or it was already acked, nacked or dead-lettered, or an operator cancelled its group):
    nothing was changed. Drop the result: the message is (or will be) another holder's."""

    def __init__(self, message: str, leases: Sequence[Lease] = ()) -> None:
        super().__init__(message)
        self.leases = list(leases)


class BackendError(QueueError):
    """The backend answered, but not as expected (an SQL error, a reply of the wrong shape):
    nothing was applied (a failed statement rolls its transaction back). A bug, or a damaged
    database: not worth retrying as it is."""


REFUSED = "connection refused"
"""What `Unavailable.nodes` says of a node that accepted no connection (nothing listens)."""


class Unavailable(QueueError):
    """Not applied: no node could be reached, or none could commit, within the deadline.
    Safe to retry later. `nodes`: when the cluster's nodes were tried, what each did at its
    last attempt, by URL (never with credentials): `"connection refused"`, `"timed out
    connecting"`, `"no reply (timed out)"`, `"TLS: ..."`, `"no leader: ..."`, `"not tried"`..."""

    def __init__(self, message: str = "", nodes: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.nodes: dict[str, str] = dict(nodes or {})

    @property
    def refused(self) -> bool:
        """Every node refused the connection: nothing listens at any of the URL's addresses
        (a cluster that is not running, or a wrong port)."""
        return bool(self.nodes) and all(seen == REFUSED for seen in self.nodes.values())


class NothingListens(Unavailable):
    """Every node of the cluster refused connections, and none had ever accepted one, for
    the transport's `refused_timeout`: nothing listens at the URL (the cluster is not
    running, or the port is wrong). Not applied; raised at once instead of after the
    deadline (`refused_timeout=None`, the default: never)."""


def no_cluster_answered(message: str, failures: Mapping[str, BaseException]) -> Unavailable:
    """One error for several clusters none of which answered (the shards of a queue, by
    name): `message`, then each one's own error; `nodes` holds what every node of every one
    did, so that `refused` says whether nothing listens anywhere. NothingListens when each
    one said so."""
    nodes: dict[str, str] = {}
    for failure in failures.values():
        nodes.update(failure.nodes if isinstance(failure, Unavailable) else {})
    said = "; ".join(f"{name}: {failure}" for name, failure in failures.items())
    every_one_empty = bool(failures) and all(
        isinstance(f, NothingListens) for f in failures.values()
    )
    kind = NothingListens if every_one_empty else Unavailable
    return kind(f"{message}: {said}" if said else message, nodes)


class NoLeader(Unavailable):
    """rqlite is up but has no leader (election under way, or no quorum): not applied; retry
    later."""


class ShardDown(Unavailable):
    """Refused at once by a sharded queue: the group's shard did not answer a moment ago and
    is being probed in the background (the other shards' groups are unaffected). Not
    applied; retry once the shard answers."""


class OutcomeUnknown(QueueError):
    """May have applied: the request was sent but its reply was lost (a leader that died
    while committing, a timeout, a dropped connection). The transport has already resent
    what is safe to resend (see the contract); what reaches you is what it could not settle:
    a publish without a dedup id (retrying could publish twice: give publishes a `dedup_id`,
    or the transport a `dedup_key`), or any call whose deadline ran out while the outcome was
    still unknown. Retry only what is safe to repeat."""


class PartialRound(QueueError):
    """Partly applied: a sharded `settle_and_claim` whose settlements on some shard were not
    applied (the shard did not answer). `round` is what the other shards did (their
    settlements applied, their new leases), with the unapplied settlements in
    `round.unsettled`: send those again. A caller that treats it as a plain failure loses
    nothing: the leases in `round` lapse and come back."""

    def __init__(self, message: str, round: Any) -> None:
        super().__init__(message)
        self.round = round


class ForwardPending(QueueError):
    """Applied, not yet on its group's shard: on a sharded queue, messages that join a batch
    living on another shard than their group's are written with the batch's count on the
    batch's shard, in its outbox, and forwarded from there (exactly once); their group's
    shard did not answer in time. They will be published when it does: do not publish them
    again. `seqs` holds the seqs known (None for each message still on its way)."""

    def __init__(self, message: str, seqs: Sequence[int | None] = ()) -> None:
        super().__init__(message)
        self.seqs = list(seqs)


class StaleShardList(QueueError):
    """A sharded queue's shard list is older than the one a shard has been given (its
    `epoch=` is lower): nothing was published. Give the client the new list."""


class AuthError(QueueError):
    """rqlite refused the credentials (HTTP 401/403): not applied, and not retried. Fix the
    credentials."""


class ClockSkew(QueueError):
    """This client's clock is too far from the cluster's for the lease asked for: other
    clients would see it lapse early (or late). Nothing was written. Fix the clock (NTP), or
    ask for a longer visibility, or allow more skew (`max_skew`)."""


class TransportClosed(QueueError):
    """The transport was closed: make a new one."""


class SchemaError(QueueError):
    """The queue's tables were written by a newer version of this library, or are damaged:
    upgrade this library."""


class TargetNotEmpty(QueueError):
    """A restore was refused, nothing changed: its target holds data, and a restore replaces
    the whole database (every queue in it, and any other table). Restore with `force=True`
    (`--force`) to replace it anyway."""
