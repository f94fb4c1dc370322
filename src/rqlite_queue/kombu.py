"""A kombu transport on the queue, so that Celery (5.x, on kombu 5.7) runs on it.

Select it, once this module is imported (importing it registers the `rqlite` and `rqlites`
aliases in kombu's table of transports), with `broker_url` set to:

- `"rqlite://10.0.0.1:4001;rqlite://10.0.0.2:4001;rqlite://10.0.0.3:4001"`: a cluster, its
  nodes as kombu's list of broker URLs (all of them given to the queue's client, which fails
  over between them by itself); `rqlites://` for HTTPS, `rqlite://user:password@host:port`;
- `"rqlite+sqlite:///tasks.db"`: the embedded queue on a file (`rqlite+http://host:4001` for one
  node);
- or any URL `from_url` takes (a sharded one too) as the `url` transport option.

kombu 5.7 refuses a dotted URL scheme (`rqlite.queue://...` raises `ValueError: Invalid
transport scheme`; `rqlite_queue.kombu:Transport://...` is no URL scheme at all, `KeyError: 'No
such transport: '`); without the import, name the class instead:
`broker_transport = "rqlite_queue.kombu:Transport"` with `broker_url = "rqlite://host:4001"`.

How kombu's model maps onto the queue:

- Each kombu queue is a queue of its own (`queue=` of `from_url`; its name made into 1-40
  lower-case letters, digits and `_`, with a hash when it had to change).
- A message's group: its `MessageGroupId` property (as Celery users of SQS FIFO write it,
  `apply_async(..., MessageGroupId="order-42")`) or header (the header's name is the
  `group_header` transport option); without one, a group of its own. Inside a group: FIFO and
  one message in flight at a time, across workers.
- Acks are the queue's: `ack` acks the lease, `reject(requeue=True)` nacks it (claimable again
  at once), `reject(requeue=False)` dead-letters it (reason `rejected`: nothing is dropped).
  A channel closed with messages unacked gives them back; a worker that dies leaves its leases
  to lapse after `visibility_timeout` seconds and its messages come back (`redelivered`).
- Messages received and not yet acked (prefetched, running, ETA tasks held by Celery) keep
  their leases extended by a keeper thread, a third of the visibility before they lapse.
- Priorities 0-9 (kombu's, higher first) become the group's 0-4 (`priority // 2`); the queue
  serves groups round-robin, and priorities act as a floor: with the `priority_floor`
  transport option (0-4), a poll first claims the groups at that priority or above.
- `eta`/`countdown` (Celery's `eta` header), the `DelaySeconds` property (SQS's spelling) and
  kombu's `expiration` become a delayed message (`not_before`, not delivered before its time)
  and a `ttl` (dead-lettered as `expired` when not delivered in time).

Acks (and requeues) are batched: the next poll of the queue carries them with its claim, in
one round trip, or the keeper thread sends them at once when no poll comes first. Exchanges are
kombu's virtual ones (direct and topic, bindings kept per process, as for SQS): no fanout, so
Celery's remote control and broadcast commands are not available.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, virtual
from kombu.utils.url import parse_url

from . import Transport as Queue
from .errors import OutcomeUnknown, QueueError, TransportClosed, Unavailable
from .naming import queue_name_for
from .types import Lease

__all__ = ["ALIAS", "TLS_ALIAS", "Channel", "Transport", "group_of", "priority_of", "queue_name"]

log = logging.getLogger("rqlite_queue.kombu")

ALIAS = "rqlite"
"""The name kombu knows this transport by, once this module is imported."""
TLS_ALIAS = "rqlites"
"""The same, over HTTPS."""
TRANSPORT_ALIASES.setdefault(ALIAS, "rqlite_queue.kombu:Transport")
TRANSPORT_ALIASES.setdefault(TLS_ALIAS, "rqlite_queue.kombu:Transport")

DEFAULT_PORT = 4001
DEFAULT_VISIBILITY = 30.0
MAX_CLAIM = 100
"""Most messages one poll claims (when the consumer's prefetch does not say)."""
GROUP_PROPERTY = "MessageGroupId"
DEDUP_PROPERTY = "MessageDeduplicationId"
TRANSPORT_OPTIONS: dict[str, Any] = {
    "visibility_timeout": DEFAULT_VISIBILITY,
    "polling_interval": 0.05,
    "group_header": GROUP_PROPERTY,
    "priority_floor": None,
    "queue_name_prefix": "",
    "url": None,
}
"""The transport options this transport reads (`broker_transport_options`), with their
defaults (docs/reference/configuration.md); and `QUEUE_OPTIONS`, given on to `from_url`."""
QUEUE_OPTIONS = (
    "timeout",
    "deadline",
    "verify",
    "busy_timeout",
    "max_payload_bytes",
    "dedup_window",
    "max_skew",
)
"""Transport options given on to `from_url` as they are."""


queue_name = queue_name_for
"""The queue that holds kombu's queue `name` (`rqlite_queue.naming.queue_name_for`)."""


def priority_of(message: dict[str, Any]) -> int:
    """kombu's priority (0-9, higher first; anything else 0) on the queue's scale, 0-4."""
    try:
        value = int(message["properties"].get("priority") or 0)
    except (TypeError, ValueError):
        return 0
    return min(max(value, 0), 9) // 2


def group_of(message: dict[str, Any], header: str) -> str | None:
    """The group a message names: its `MessageGroupId` property, else its `header` header."""
    value = message["properties"].get(GROUP_PROPERTY)
    if value is None:
        value = (message.get("headers") or {}).get(header)
    return None if value is None else str(value)


def _not_before(message: dict[str, Any]) -> float | None:
    """When the message is due: Celery's `eta` header (ISO 8601; naive is UTC), or now plus
    the `DelaySeconds` property; None: now."""
    headers = message.get("headers") or {}
    eta = headers.get("eta")
    if isinstance(eta, str) and eta:
        try:
            when = datetime.fromisoformat(eta)
        except ValueError:
            log.warning("message with an unreadable eta %r: delivered now", eta)
        else:
            return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    delay = message["properties"].get("DelaySeconds")
    if delay is not None:
        try:
            seconds = float(delay)
        except (TypeError, ValueError):
            log.warning("message with an unreadable DelaySeconds %r: delivered now", delay)
        else:
            return time.time() + seconds if seconds > 0 else None
    return None


def _ttl(message: dict[str, Any]) -> float | None:
    """kombu's `expiration` (milliseconds, as text) in seconds."""
    expiration = message["properties"].get("expiration")
    if expiration is None:
        return None
    try:
        ms = float(expiration)
    except (TypeError, ValueError):
        return None
    return max(ms / 1000.0, 0.001)


@dataclass
class _Settlements:
    """What the next round trip of one queue carries."""

    ack: list[Lease] = field(default_factory=list)
    nack: list[tuple[Lease, float]] = field(default_factory=list)
    dead: list[tuple[Lease, str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.ack or self.nack or self.dead)

    def put_back(self, other: _Settlements) -> None:
        self.ack += other.ack
        self.nack += other.nack
        self.dead += other.dead


class Channel(virtual.Channel):
    """A kombu channel: the queues it consumes, the leases of the messages it delivered and
    has not settled yet (by delivery tag), the settlements waiting for a round trip."""

    connection: Transport

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, Lease]] = {}
        """Delivery tag -> (kombu queue, lease) of every message delivered and not settled."""
        self._settle: dict[str, _Settlements] = {}
        """Kombu queue -> the settlements its next round trip carries."""
        self._noack_queues: set[str] = set()
        self._keeper: threading.Thread | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        super().__init__(connection, **kwargs)
        self.transport = connection
        options = {**TRANSPORT_OPTIONS, **connection.client.transport_options}
        self.visibility = float(options["visibility_timeout"])
        self.group_header = str(options["group_header"])
        floor = options["priority_floor"]
        self.priority_floor: int | None = None if floor is None else int(floor)
        self.worker_id = f"{socket.gethostname()}-kombu-{uuid.uuid4().hex[:8]}"

    # ------------------------------------------------------------------ publishing

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        group = group_of(message, self.group_header) or f"~{uuid.uuid4().hex}"
        dedup = message["properties"].get(DEDUP_PROPERTY)
        self.transport.queue(queue).publish(
            group,
            message,
            priority_of(message),
            not_before=_not_before(message),
            ttl=_ttl(message),
            dedup_id=None if dedup is None else str(dedup),
        )

    # ------------------------------------------------------------------ consuming

    def basic_consume(
        self, queue: str, no_ack: bool, callback: Any, consumer_tag: str, **kwargs: Any
    ) -> Any:
        if no_ack:
            self._noack_queues.add(queue)
        return super().basic_consume(queue, no_ack, callback, consumer_tag, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        if queue is not None:
            self._noack_queues.discard(queue)
        return super().basic_cancel(consumer_tag)

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        payloads = self._claim(queue, 1, no_ack=no_ack)
        if not payloads:
            return None
        message = self.Message(payloads[0], channel=self)
        if not no_ack:
            self.qos.append(message, message.delivery_tag)
        return message

    def drain_events(
        self, timeout: float | None = None, callback: Any = None, **kwargs: Any
    ) -> Any:
        if not self._consumers or not self.qos.can_consume():
            raise Empty()
        return self.cycle.get(callback, timeout=timeout)

    def _reset_cycle(self) -> None:
        self._cycle = self.connection.Cycle(self._get_bulk, self._active_queues, Empty)

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        payloads = self._claim(queue, 1)
        if not payloads:
            raise Empty()
        return payloads[0]

    def _get_bulk(self, queue: str, callback: Any = None, timeout: float | None = None) -> None:
        room = self.qos.can_consume_max_estimate()
        n = MAX_CLAIM if room is None else min(max(room, 1), MAX_CLAIM)
        payloads = self._claim(queue, n, no_ack=queue in self._noack_queues)
        if not payloads:
            raise Empty()
        for payload in payloads:
            self.connection._deliver(payload, queue)  # noqa: SLF001  (kombu's own hook)

    def _claim(self, queue: str, n: int, *, no_ack: bool = False) -> list[dict[str, Any]]:
        """Claim up to n messages of `queue`, in the round trip that settles what waits for
        it; their payloads as kombu takes them (each with a delivery tag of its own)."""
        target = self.transport.queue(queue)
        settle = self._take(queue)
        leases: list[Lease] = []
        try:
            leases = self._claim_round(queue, target, n, settle)
        except (Unavailable, OutcomeUnknown) as exc:
            # The next poll tries again (a claim whose reply was lost lapses and comes back).
            self._put_back(queue, settle)
            log.warning("claim on %r failed, tried again at the next poll: %s", queue, exc)
            return []
        if no_ack and leases:
            self._queue_settlements(queue, _Settlements(ack=list(leases)))
        return [self._delivered(queue, lease, hold=not no_ack) for lease in leases]

    def _claim_round(self, queue: str, target: Queue, n: int, settle: _Settlements) -> list[Lease]:
        """One round trip (two with a priority floor: the groups at the floor or above first,
        when a read says one is claimable, then the others for the slots left)."""
        floor = 0
        if self.priority_floor and target.probe(self.priority_floor).claimable:
            floor = self.priority_floor
        if settle:
            result = target.settle_and_claim(
                self.worker_id,
                self.visibility,
                n,
                ack=settle.ack,
                nack=settle.nack,
                dead=settle.dead,
                min_priority=floor,
            )
            self._report_lost(queue, result.lost)
            leases = result.leases
        else:
            leases = target.claim_many(self.worker_id, self.visibility, n, floor)
        if floor and len(leases) < n:
            leases += target.claim_many(self.worker_id, self.visibility, n - len(leases))
        return leases

    def _delivered(self, queue: str, lease: Lease, *, hold: bool) -> dict[str, Any]:
        payload = dict(lease.event)
        properties = dict(payload.get("properties") or {})
        tag = uuid.uuid4().hex
        info = dict(properties.get("delivery_info") or {})
        info["redelivered"] = lease.attempts > 1
        properties["delivery_tag"] = tag
        properties["delivery_info"] = info
        payload["properties"] = properties
        payload["redelivered"] = lease.attempts > 1
        if hold:
            with self._lock:
                self._held[tag] = (queue, lease)
            self._start_keeper()
        return payload

    # ------------------------------------------------------------------ settling

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        held = self._release(delivery_tag)
        if held is not None:
            self._queue_settlements(held[0], _Settlements(ack=[held[1]]))
        super().basic_ack(delivery_tag, multiple=multiple)

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        held = self._release(delivery_tag)
        if held is not None:
            queue, lease = held
            if requeue:
                self._queue_settlements(queue, _Settlements(nack=[(lease, 0.0)]))
            else:
                self._queue_settlements(queue, _Settlements(dead=[(lease, "rejected")]))
        self.qos.reject(delivery_tag, requeue=False)

    def _restore(self, message: Any) -> None:
        """A message delivered and not acked when the channel closes (or `recover`): given
        back, claimable again at once."""
        held = self._release(message.delivery_tag)
        if held is not None:
            self._queue_settlements(held[0], _Settlements(nack=[(held[1], 0.0)]))

    def _restore_at_beginning(self, message: Any) -> None:
        self._restore(message)

    def _release(self, tag: str) -> tuple[str, Lease] | None:
        with self._lock:
            return self._held.pop(tag, None)

    def _queue_settlements(self, queue: str, settlements: _Settlements) -> None:
        with self._lock:
            self._settle.setdefault(queue, _Settlements()).put_back(settlements)
        self._start_keeper()
        self._wake.set()

    def _take(self, queue: str) -> _Settlements:
        with self._lock:
            return self._settle.pop(queue, None) or _Settlements()

    def _put_back(self, queue: str, settle: _Settlements) -> None:
        if settle:
            with self._lock:
                self._settle.setdefault(queue, _Settlements()).put_back(settle)

    def _report_lost(self, queue: str, lost: Iterable[Lease]) -> None:
        for lease in lost:
            log.warning(
                "queue %r: the lease on %s#%d lapsed before it was settled (the message was "
                "delivered again)",
                queue,
                lease.group_id,
                lease.seq,
            )

    def flush(self) -> None:
        """Send every settlement waiting for a round trip, now."""
        with self._lock:
            queues = list(self._settle)
        for queue in queues:
            settle = self._take(queue)
            if not settle:
                continue
            try:
                result = self.transport.queue(queue).settle_and_claim(
                    ack=settle.ack, nack=settle.nack, dead=settle.dead
                )
            except (Unavailable, OutcomeUnknown) as exc:
                self._put_back(queue, settle)
                log.warning("settling on %r failed, tried again: %s", queue, exc)
                raise
            self._report_lost(queue, result.lost)

    # ------------------------------------------------------------------ the lease keeper

    def _start_keeper(self) -> None:
        if self._keeper is not None or self._stop.is_set():
            return
        with self._lock:
            if self._keeper is not None:
                return
            self._keeper = threading.Thread(
                target=self._keep, name=f"rqlite-queue kombu keeper {self.channel_id}", daemon=True
            )
        self._keeper.start()

    def _keep(self) -> None:
        """Send the settlements no poll took, and extend the leases of the messages held, a
        third of the visibility before they would lapse."""
        tick = max(0.05, self.visibility / 6)
        while not self._stop.is_set():
            self._wake.wait(tick)
            self._wake.clear()
            try:
                self.flush()
                self._extend_due()
            except (Unavailable, OutcomeUnknown):
                self._stop.wait(min(1.0, tick))
            except TransportClosed:
                return
            except QueueError:
                log.exception("the lease keeper's round failed")
                self._stop.wait(min(1.0, tick))

    def _extend_due(self) -> None:
        now = time.time()
        due: dict[str, list[Lease]] = {}
        with self._lock:
            for queue, lease in self._held.values():
                if lease.expires_at - now <= self.visibility * 2 / 3:
                    due.setdefault(queue, []).append(lease)
        for queue, leases in due.items():
            result = self.transport.queue(queue).settle_and_claim(
                visibility=self.visibility, extend=leases
            )
            renewed = {(lease.group_id, lease.seq, lease.token): lease for lease in result.extended}
            with self._lock:
                for tag, (q, lease) in list(self._held.items()):
                    new = renewed.get((lease.group_id, lease.seq, lease.token))
                    if q == queue and new is not None:
                        self._held[tag] = (q, new)
            self._report_lost(queue, result.lost)

    # ------------------------------------------------------------------ queues

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        self.transport.queue(queue)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return True

    def _size(self, queue: str) -> int:
        return self.transport.queue(queue).stats().depth

    def _purge(self, queue: str) -> int:
        """Remove every message of the queue (its groups cancelled, those dead letters
        deleted); returns how many."""
        target = self.transport.queue(queue)
        reason = f"purged by kombu {uuid.uuid4().hex}"
        removed = 0
        after: str | None = None
        while page := target.groups(limit=100, after=after):
            for group in page:
                removed += target.cancel_group(group.group_id, reason)
            after = page[-1].group_id
        cursor: str | None = None
        by_shard: dict[str, list[int]] = {}
        while letters := target.dead_letters(500, after=cursor):
            for letter in letters:
                if letter.reason == reason:
                    by_shard.setdefault(letter.shard, []).append(letter.seq)
            cursor = letters[-1].cursor
        for shard, seqs in by_shard.items():
            target.purge_dead(seqs, shard=shard or None)
        return removed

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self._purge(queue)

    def close(self) -> None:
        if self.closed:
            return
        super().close()  # gives back what was delivered and not acked (`_restore`)
        self._stop.set()
        self._wake.set()
        if self._keeper is not None and self._keeper is not threading.current_thread():
            self._keeper.join(timeout=5)
        try:
            self.flush()
        except (Unavailable, OutcomeUnknown, TransportClosed) as exc:
            log.warning("closing: settlements not sent (their leases lapse): %s", exc)


class Transport(virtual.Transport):
    """The kombu transport: one open queue per kombu queue, shared by the connection's
    channels."""

    Channel = Channel
    can_parse_url = False
    default_port = DEFAULT_PORT
    driver_type = "rqlite"
    driver_name = "rqlite-queue"
    polling_interval = TRANSPORT_OPTIONS["polling_interval"]
    """Seconds an idle consumer waits between polls (a poll after an empty one is a read)."""
    implements = virtual.Transport.implements.extend(
        asynchronous=False, exchange_type=frozenset(["direct", "topic"]), heartbeats=False
    )
    connection_errors = (*virtual.Transport.connection_errors, Unavailable, OutcomeUnknown)
    channel_errors = (*virtual.Transport.channel_errors, QueueError)

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        self._queues: dict[str, Queue] = {}
        self._queues_lock = threading.Lock()
        self.url = self._url()
        self.queue_prefix = str(client.transport_options.get("queue_name_prefix") or "")

    def _url(self) -> str:
        """The queue's URL: the `url` transport option; the rest of an `rqlite+...` URL
        (`rqlite+sqlite:///tasks.db`, `rqlite+http://h:4001`); or the nodes of every
        `rqlite://` (`rqlites://`: HTTPS) URL of the broker's list, as one cluster."""
        options = self.client.transport_options
        if options.get("url"):
            return str(options["url"])
        host = self.client.hostname or "localhost"
        if "://" in host:
            return str(host)
        nodes: list[str] = []
        for url in [u for u in self.client.alt if isinstance(u, str)] or [""]:
            parts = parse_url(url) if "://" in url else {}
            scheme = parts.get("transport") or self.client.transport_cls
            node_host = parts.get("hostname") or host
            port = parts.get("port") or self.client.port or DEFAULT_PORT
            if scheme in (ALIAS, TLS_ALIAS) or not parts:
                http = "https" if scheme == TLS_ALIAS else "http"
                nodes.append(f"{http}://{node_host}:{port}")
        return ",".join(dict.fromkeys(nodes))

    def _options(self) -> dict[str, Any]:
        options = self.client.transport_options
        given = {name: options[name] for name in QUEUE_OPTIONS if name in options}
        if self.client.userid and not self.url.startswith("sqlite:"):
            given["auth"] = (self.client.userid, self.client.password or "")
        return given

    def queue(self, name: str) -> Queue:
        """The open queue of kombu's queue `name` (opened, its tables created, on first use)."""
        target = queue_name(name, self.queue_prefix)
        with self._queues_lock:
            found = self._queues.get(target)
            if found is None:
                found = self._queues[target] = Queue.from_url(
                    self.url,
                    queue=target,
                    connect_timeout=float(self.client.connect_timeout or 5),
                    **self._options(),
                )
            return found

    def establish_connection(self) -> Any:
        self.queue("kombu")  # the backend answers (Unavailable otherwise)
        return super().establish_connection()

    def close_connection(self, connection: Any) -> None:
        try:
            super().close_connection(connection)
        finally:
            with self._queues_lock:
                queues, self._queues = list(self._queues.values()), {}
            for queue in queues:
                queue.close()

    def verify_connection(self, connection: Any) -> bool:
        try:
            self.queue("kombu").probe()
        except QueueError:
            return False
        return True

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        started = time.monotonic()
        while True:
            try:
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                waited = time.monotonic() - started
                if timeout is not None and waited >= timeout:
                    raise TimeoutError() from None
                pause = self.polling_interval
                if timeout is not None:
                    pause = min(pause, timeout - waited)
                time.sleep(max(pause, 0.0))

    def driver_version(self) -> str:
        from importlib.metadata import version

        return version("rqlite-queue")
