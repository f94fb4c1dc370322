"""The values the queue hands out and takes: leases, dead letters, schedules, snapshots, what a
round did, a job's state and outcome, a batch's state, the shape of a `publish_many` item, and
the limits callers check against."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from . import group_states

MAX_PRIORITY = 4
"""Priorities are 0 (the default) to 4."""
MAX_BATCH = 10_000
"""Most messages claimed, settled, listed, or named by seq in one call."""
GROUP_STATES = group_states.GROUP_STATES
"""The values of `GroupInfo.state` (and of `groups(state=...)`): `group_states` says what each
means."""

PublishItem = tuple[str, Any] | tuple[str, Any, int] | Mapping[str, Any]
"""`(group_id, event)`, `(group_id, event, priority)`, or a mapping with those keys (and
optionally `dedup_id`, `delay`, `not_before`, `ttl`, `tenant`, `debounce`, `max_wait`,
`headers`, `keep`, `batch`)."""


class MessageOptions(TypedDict, total=False):
    """The keywords every publish of a message takes, beside `group_id`, `event` and
    `priority` (`publish`, a transaction's `publish`, a batch's `publish`), as `publish`
    says: one set, so that no publish path drifts from the others."""

    delay: float | None
    not_before: float | None
    ttl: float | None
    tenant: str | None
    headers: Mapping[str, str] | None
    keep: float | None


class PublishOptions(MessageOptions, total=False):
    """`MessageOptions`, and those of a publish outside a batch's block (`publish`, a
    transaction's `publish`; a batch's messages take none of them: each counts once, in its
    batch). With `group_id`, `event` and `priority`: the keys of a `publish_many` item."""

    dedup_id: str | None
    debounce: str | None
    max_wait: float | None
    batch: str | None


MAX_HEADERS = 64
"""Most headers on one message."""
MAX_HEADERS_BYTES = 8 * 1024
"""Most bytes of a message's headers, keys and values, as stored (compact JSON, UTF-8)."""


class Headers(Mapping[str, str]):
    """A message's headers: a read-only mapping of str to str (empty when it has none). Given
    to `publish(headers=...)`, returned on `Lease.headers` and `DeadLetter.headers`."""

    __slots__ = ("_items",)
    _items: dict[str, str]

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        object.__setattr__(self, "_items", dict(items) if items else {})

    @classmethod
    def stored(cls, text: str | None) -> Headers:
        """The headers as the queue stores them (a JSON object; None: none)."""
        return NO_HEADERS if text is None else cls(json.loads(text))

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._items == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("headers are read-only")

    def __reduce__(self) -> tuple[type[Headers], tuple[dict[str, str]]]:
        return (Headers, (self._items,))  # (copied and pickled as made)

    def __repr__(self) -> str:
        return f"Headers({self._items!r})"


NO_HEADERS = Headers()

JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled", "expired")
"""The values of `JobResult.status`: `queued` (waiting: for its turn, a delay, a retry after a
failure, a held group), `running` (leased to a worker), then one of the final ones."""
FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "expired"})
"""The statuses of a job that is over: they never change afterwards."""
MAX_PROGRESS_BYTES = 8 * 1024
"""Most bytes of a job's progress value, as stored (compact JSON, UTF-8)."""
MAX_TRACEBACK_BYTES = 16 * 1024
"""Most bytes of an error's traceback text kept with a job (its end: the innermost frames)."""
MAX_ERRORS = 16
"""Most errors kept with a job (its last attempts'; older ones are dropped)."""
BATCH_STATES = ("open", "closed", "done")
"""The values of `BatchStatus.state` (and of `batches(state=...)`)."""
BATCH_HEADER = "rqlite-queue-batch"
"""The header a batch's callback message carries: the batch as it was when it was done (JSON;
`Lease.completed_batch` reads it)."""
MAX_BATCH_FAILURES = 20
"""Most failures a batch keeps with their reasons (its first ones; all are counted)."""
MAX_BATCH_REASON = 200
"""Most characters of a failure's reason a batch keeps."""
MAX_BATCH_DEPTH = 4
"""Most levels of nested batches: a batch, and three levels of batches within it."""
DEFAULT_BATCH_KEEP = 86_400.0
"""How long `batch_status()` keeps a batch after it is done, unless `batch(keep=...)` says."""


@dataclass(frozen=True, slots=True, eq=False)
class CheckedItems:
    """Publish items one queue checked and encoded (`check_publish_many` returns them). Give
    them as a lease's follow-ups on the same queue (`ack(lease, publish=checked)`,
    `settle_and_claim(publish=[(lease, checked)])`): they are taken as they are, not checked
    again. Their delays and ttls count from the check."""

    rows: tuple[Any, ...] = field(repr=False)
    """The messages as they will be written (the events encoded)."""
    dedup_ids: frozenset[str]
    """Their dedup ids (as the queue stores them)."""
    origin: object = field(repr=False)
    """The queue that checked them (another refuses them)."""

    def __len__(self) -> int:
        return len(self.rows)


FollowUps = Iterable[PublishItem] | CheckedItems
"""What a settlement publishes with it: items as `publish_many` takes them, or as
`check_publish_many` returned them."""


@dataclass(frozen=True, slots=True)
class Lease:
    """A claimed message. The first four fields are the seed protocol's; `token` fences every
    later call on this lease (`ack`, `nack`, `extend`, `dead_letter`)."""

    seq: int
    group_id: str
    event: Any
    token: str = ""
    attempts: int = 1
    """How many times this message has been claimed, this time included."""
    expires_at: float = 0.0
    """When the lease lapses (epoch seconds, the client's clock)."""
    shard: str = ""
    """The shard the message is on (a sharded transport's; "" on one cluster). Seqs are per
    shard."""
    headers: Headers = NO_HEADERS
    """The message's headers (`publish(headers=...)`; with OpenTelemetry, the trace context
    of its publish): a read-only mapping, empty when it has none."""
    keep: float | None = None
    """How long the message's outcome is kept after it settles (`publish(keep=...)`, seconds;
    None: not kept). A Worker keeps a handler's return value as the result of such a message."""
    batch: str | None = None
    """The batch the message belongs to (None: none). Its follow-ups that name it
    (`{"batch": lease.batch, ...}`) join it in the settlement's own transaction: the batch
    grows before this message counts as settled."""

    @property
    def completed_batch(self) -> BatchStatus | None:
        """On a batch's callback message (`batch(on_complete=..., on_success=...)`): the batch
        as it was when it was done (its counts, its first failures). None on other messages."""
        text = self.headers.get(BATCH_HEADER)
        return None if text is None else BatchStatus.from_header(text)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message moved aside by `dead_letter`, with why."""

    seq: int
    group_id: str
    event: Any
    priority: int
    attempts: int
    reason: str
    published_at: float
    dead_at: float
    shard: str = ""
    """The shard it is on (a sharded transport's; "" on one cluster): seqs are per shard."""
    headers: Headers = NO_HEADERS
    """The message's headers (a read-only mapping, empty when it had none)."""

    @property
    def cursor(self) -> str:
        """Where this dead letter stands in the listing: pass the last one's as
        `dead_letters(after=...)` for the next page. Opaque; it names the shard on a sharded
        queue (`"a/42"`), and is the seq on one cluster (`"42"`)."""
        return f"{self.shard}/{self.seq}" if self.shard else str(self.seq)


@dataclass(frozen=True, slots=True)
class Stats:
    """A snapshot of one queue."""

    depth: int
    """Messages waiting or in flight."""
    groups: int
    in_flight: int
    """Groups whose head is leased (lease not lapsed)."""
    parked: int
    """Groups parked by `nack(delay>0)`, delay not yet over."""
    dead: int
    oldest_age: float | None
    """Seconds since the first message still queued (the lowest seq) was published."""
    by_priority: dict[int, int]
    """Messages per group priority."""
    held: int = 0
    """Groups held (`hold_group`, or a dead letter with `hold_group_on_dead_letter`)."""
    delayed: int = 0
    """Messages published with a delay that is not over yet."""
    expired: int = 0
    """Messages that expired (their `ttl` passed before they were delivered) and were moved to
    the dead letters, since the queue was created."""
    paused: bool = False
    """An operator paused the queue's claims (`pause()`; publishes go on)."""
    last_seq: int = 0
    """The last seq given: how many messages were ever published to the queue (a requeued
    dead letter counts again). Its growth against the depth's is the flow through the queue.
    On a sharded queue, the sum of the shards' last seqs."""
    shards_down: tuple[str, ...] = ()
    """A sharded queue's shards that did not answer: the counts above leave them out."""
    by_shard: dict[str, int] = field(default_factory=dict)
    """A sharded queue's depth on each shard that answered."""
    outbox: int = 0
    """A sharded queue's follow-ups written on one shard for groups on another, not yet
    forwarded (0 on one cluster)."""
    tenants_on: bool = False
    """The queue's tenants are on: its claims share by weight (`set_tenant`,
    `set_tenant_rule` or a publish naming a tenant turned them on)."""
    delayed_groups: int = 0
    """Groups whose head is a delayed message not due yet (the `delayed` state of
    `groups()`)."""
    oldest_by_priority: dict[int, float] = field(default_factory=dict, compare=False)
    """Seconds since the oldest message still queued (the lowest seq) of each group priority
    was published, for the priorities that have messages. Left out of `==`: it changes with
    the clock alone."""
    outcomes: int = 0
    """Outcomes of settled messages kept for `result()` (`publish(keep=...)`), not yet pruned
    (an outcome past its time may still count until the queue's work next prunes)."""
    open_batches: int = 0
    """Batches not done yet (open or closed: some of their messages are not settled)."""


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One group, as `groups()` lists it for operators."""

    group_id: str
    priority: int
    state: str
    """`ready` (claimable, or its lease or park is over), `leased`, `parked` (by a nack with a
    delay), `delayed` (its head is a delayed message not due yet) or `held` (by
    `hold_group`, or a dead letter with `hold_group_on_dead_letter`)."""
    depth: int
    """Messages in the group, its head included."""
    head_seq: int | None
    attempts: int
    """Claims of the current head so far."""
    until: float | None
    """When the lease, park or delay in force ends (None: none in force)."""
    holder: str | None
    """The worker id of the lease in force (None: not leased)."""
    head_age: float | None
    """Seconds since the head was published (None: no message)."""
    shard: str = ""
    """The shard the group lives on (a sharded transport's; "" on one cluster)."""


@dataclass(frozen=True, slots=True)
class TenantInfo:
    """A tenant, as `tenants()` reports it (on a sharded queue, summed over the shards)."""

    name: str
    """'' for the default tenant (groups given no tenant, when no rule names one)."""
    weight: float
    """Its share of claims relative to the other tenants with claimable work (default 1)."""
    ready: int
    """Its groups claimable now."""
    groups: int
    """Its groups with messages."""
    in_flight: int
    """Its leases not lapsed."""
    depth: int
    """Its messages."""
    rate: float | None = None
    """Its rate limit: claims per second, cluster-wide (None: none)."""
    burst: float | None = None
    """How many claims it may take at once after a quiet spell (with `rate`)."""
    tokens: float | None = None
    """What is left of its burst now: claims it may take before waiting (with `rate`)."""
    max_in_flight: int | None = None
    """At most this many of its groups are leased at once (None: no cap)."""
    max_queued: int | None = None
    """A publish that would take its messages over this raises `QueueFull` (None: none)."""
    max_group_queued: int | None = None
    """The same bound for each of its groups' messages (None: none)."""


@dataclass(frozen=True, slots=True)
class Schedule:
    """A periodic job: `event` is published to `group_id` every `every` seconds, or at the
    times of the `cron` expression (UTC), next at `next_at`."""

    name: str
    group_id: str
    event: Any
    priority: int
    every: float | None
    cron: str | None
    catch_up: bool
    """After a stretch with no worker running: True, one message per missed tick; False (the
    default), one message for them all."""
    next_at: float
    keep: float | None = None
    """How long each tick's message keeps its outcome (`publish(keep=)`; None: not kept)."""


@dataclass(frozen=True, slots=True)
class Round:
    """What `settle_and_claim` did: the new leases, the settlements whose lease no longer held
    (they changed nothing), and the extended leases (with their new deadline)."""

    leases: list[Lease] = field(default_factory=list)
    lost: list[Lease] = field(default_factory=list)
    extended: list[Lease] = field(default_factory=list)
    expired: list[Lease] = field(default_factory=list)
    """Leases taken on messages whose ttl had passed: not to be handled, but dead-lettered
    (the transport does that before it returns: then they are those it dead-lettered)."""
    cancelled: list[Lease] = field(default_factory=list)
    """Leases taken again on messages cancelled while a lease that lapsed held them: not to be
    handled, but settled as cancelled (the transport does that before it returns: then they
    are those it settled so)."""
    unsettled: list[Lease] = field(default_factory=list)
    """Settlements and extensions whose shard did not answer (a sharded transport's; on one
    cluster the call raises instead): not known to be applied, to be sent again."""
    forwarded: int = 0
    """Follow-ups this round wrote to an outbox and forwarded to their shards at its end (a
    sharded queue's): new messages that its own claim could not see yet."""


@dataclass(frozen=True, slots=True)
class Probe:
    """A look at the queue without a Raft round: is a group claimable now, when does the
    earliest lease, park or delayed head end or a rate-limited tenant with work get its next
    token (None: none), when is the next schedule due."""

    claimable: bool
    next_due: float | None
    next_tick: float | None = None
    """When the earliest schedule is due (None: no schedule)."""


@dataclass(frozen=True, slots=True)
class ShardStatus:
    """One shard, as `shard_status()` reports it during a change of the shard list (None:
    the shard did not answer)."""

    name: str
    state: str
    up: bool
    epoch: int | None
    """The shard list epoch this shard has been given (by the publishes of clients)."""
    depth: int | None
    groups: int | None
    leaving: int | None
    """Groups with messages here whose new messages go to another shard: the change is done
    for this shard when it is 0."""
    waiting: int | None
    """Groups moved here, held until their old shard has delivered their messages."""
    dead: int | None
    schedules_elsewhere: int | None
    """Schedules here whose group lives on another shard (moved when next due)."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """One rqlite node behind a queue, as `nodes()` reports it (a sharded queue's are named
    `shard/node`)."""

    node_id: str
    api_addr: str
    reachable: bool
    leader: bool
    applied_index: int | None
    """The last Raft log entry this node has applied (None: unknown, it did not answer)."""


@dataclass(frozen=True, slots=True)
class JobError:
    """An error a handler raised while working on a message (or a failure given to `nack` or
    `dead_letter` with `error=`)."""

    type: str
    """The exception's class, as `module.QualifiedName` (`builtins.ValueError`)."""
    message: str
    """`str()` of the exception."""
    traceback: str = ""
    """Its traceback as Python prints it, at most MAX_TRACEBACK_BYTES (the innermost frames
    kept; '' when none was given)."""
    attempt: int = 0
    """The attempt it ended (`Lease.attempts`)."""


@dataclass(frozen=True, slots=True)
class JobResult:
    """A job's state, as `result(group_id, seq)` reads it: queued, running (with its progress
    and attempt), or its final outcome (kept for `publish(keep=...)` seconds after it
    settled)."""

    group_id: str
    seq: int
    status: str
    """One of JOB_STATUSES: `queued`, `running`, `succeeded`, `failed` (dead-lettered: see
    `reason` and `errors`), `cancelled` (`cancel()`, `cancel_group()`), `expired` (its ttl
    passed before it was delivered)."""
    event: Any = None
    """The message's payload."""
    headers: Headers = NO_HEADERS
    result: Any = None
    """What its handler returned (a Worker's; `ack(lease, result=...)`), decoded by the
    queue's codec; None when it has none (or has not succeeded)."""
    reason: str | None = None
    """Why it failed (its dead letter's reason), was cancelled, or expired."""
    errors: tuple[JobError, ...] = ()
    """The errors of its failed attempts, oldest first (at most MAX_ERRORS: the last ones)."""
    progress: Any = None
    """The last progress its handler reported (`current_job().progress(...)`) that reached the
    queue (with a lease extension), or None."""
    attempts: int = 0
    """How many times it was claimed."""
    workers: tuple[str, ...] = ()
    """The ids of the workers that held it, one per attempt, oldest first."""
    enqueued_at: float = 0.0
    """When it was published (epoch seconds)."""
    started_at: float | None = None
    """When its last attempt was claimed (None: never)."""
    finished_at: float | None = None
    """When it settled (None: not yet)."""
    kept_until: float | None = None
    """When its outcome will be pruned (None: not settled, or not kept)."""
    cancelling: str | None = None
    """A cancel's reason, while it runs: its worker is told, and it will settle as
    `cancelled` whatever its handler does."""

    @property
    def final(self) -> bool:
        """Whether it is over (its status never changes again)."""
        return self.status in FINAL_STATUSES

    @property
    def error(self) -> JobError | None:
        """The error of its last failed attempt (None: none)."""
        return self.errors[-1] if self.errors else None


@dataclass(frozen=True, slots=True)
class LeaseCheck:
    """What `check_leases` found of leases a worker holds (a read, no Raft entry)."""

    cancelled: list[tuple[Lease, str]] = field(default_factory=list)
    """Leases that still hold, whose message was cancelled (`cancel()`), with the reason:
    tell the handler; any settlement of it now settles it as `cancelled`."""
    lost: list[tuple[Lease, str]] = field(default_factory=list)
    """Leases that no longer hold their group (cancelled with it by `cancel_group`, or taken
    over by another worker after they lapsed), with why: their handler's work will be
    refused."""


@dataclass(frozen=True, slots=True, eq=False)
class CheckedResult:
    """A result value one queue checked and encoded (`check_result` returns it): its
    settlements take it as it is."""

    text: str | None = field(repr=False)
    """The value as stored (None: no value)."""
    origin: object = field(repr=False)


@dataclass(frozen=True, slots=True)
class BatchFailure:
    """One failed message of a batch (dead-lettered: it failed for good, or expired), or one
    of its batches that failed (`batch` names it)."""

    group_id: str
    seq: int
    reason: str
    """Its dead letter's reason (at most MAX_BATCH_REASON characters)."""
    shard: str = ""
    """The shard it was on (a sharded queue's; "" on one cluster)."""
    batch: str | None = None
    """A batch within this one that failed (then `group_id` is "" and `seq` 0)."""


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """A batch, as `batch_status()` reads it (or as it was when it was done, on its callback:
    `Lease.completed_batch`). Its messages are counted once each, when they settle:
    `succeeded` (acked), `failed` (dead-lettered, or expired), `cancelled` (`cancel()`,
    `cancel_group()`); a batch within it counts as one of its messages, settled when it is
    done (succeeded if none of its own failed)."""

    id: str
    open: bool
    """Its `with` block is still under way (after a `flush()`): it cannot be done before the
    block ends, whatever its counts."""
    done: bool
    """Every message settled and the block ended: its callbacks were published (once)."""
    total: int
    """Messages (and batches within it) it was given, its messages' follow-ups that joined it
    included."""
    pending: int
    """Those not settled yet (on a sharded queue, also those settled on another shard whose
    count is still on its way)."""
    succeeded: int
    failed: int
    cancelled: int
    failures: tuple[BatchFailure, ...] = ()
    """The first MAX_BATCH_FAILURES failures, with their reasons (all are counted in
    `failed`)."""
    parent: str | None = None
    """The batch this one is a message of (`batch(parent=...)`), or None."""
    aborted: str | None = None
    """Why its `with` block ended with an exception after a `flush()` (the batch was then
    closed with the messages written so far; `on_success` is not published), or None."""
    created_at: float = 0.0
    done_at: float | None = None
    kept_until: float | None = None
    """When `batch_status()` forgets it (its `keep` after it was done)."""
    shard: str = ""
    """The shard it lives on (a sharded queue's; "" on one cluster)."""

    @property
    def state(self) -> str:
        """One of BATCH_STATES: `open`, `closed` (only its messages' follow-ups and its
        batches can still add to it), `done`."""
        return "done" if self.done else "open" if self.open else "closed"

    @property
    def succeeded_all(self) -> bool:
        """Done, none of its messages failed and its block ran to its end: what `on_success`
        is published for."""
        return self.done and self.failed == 0 and self.aborted is None

    @classmethod
    def from_header(cls, text: str) -> BatchStatus:
        """The batch a callback's BATCH_HEADER describes (as the settlement that finished it
        wrote it)."""
        data = json.loads(text)
        shard = batch_shard(str(data["id"]))
        failures = tuple(
            BatchFailure(str(f[0]), int(f[1]), str(f[2]), str(f[3] or shard), f[4] or None)
            for f in data.get("failures") or ()
        )
        counts = [int(data.get(k) or 0) for k in ("succeeded", "failed", "cancelled")]
        return cls(
            id=str(data["id"]),
            open=False,
            done=True,
            total=sum(counts),
            pending=0,
            succeeded=counts[0],
            failed=counts[1],
            cancelled=counts[2],
            failures=failures,
            parent=data.get("parent"),
            aborted=data.get("aborted"),
            created_at=float(data.get("created_at") or 0.0),
            done_at=float(data["done_at"]) if data.get("done_at") is not None else None,
            kept_until=float(data["kept_until"]) if data.get("kept_until") is not None else None,
            shard=shard,
        )


def batch_shard(batch_id: str) -> str:
    """The shard a batch lives on, as its id names it (`shard/hex` on a sharded queue; ""
    for the plain ids of one cluster)."""
    return batch_id.rpartition("/")[0]
