"""rqlite's HTTP API without I/O: the request for a `Batch`, the reading of the reply, and the
whole retry policy of one request (which node, how long to wait, when to give up, what a
failure means), as a generator that the sync and async clients drive.

Writes go to `/db/request?transaction`: one Raft entry, one SQLite transaction on every node,
and the `SELECT`s inside it come back as rows. Fresh reads go to
`/db/query?level=linearizable`; reads that need no Raft round (an idle worker's polls) to
`/db/query?level=weak`, the leader's own copy; a read of several statements adds
`&transaction`, so that they see one snapshot. Followers forward all of them to the leader
(rqlite v8 does not redirect unless asked)."""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import unquote, urlsplit

from ..errors import (
    REFUSED,
    AuthError,
    BackendError,
    InvalidArgument,
    NoLeader,
    NothingListens,
    OutcomeUnknown,
    Unavailable,
)
from .plan import Batch, Result
from .retry import FAILOVER, MIN_ATTEMPT, PROBE, Retry

log = logging.getLogger("rqlite_queue.rqlite")

POOL_SIZE = 32
"""Keep-alive connections kept per node."""
# A top-level error that proves the request was not applied: safe to send elsewhere.
_NOT_APPLIED = ("not leader", "leader not found")


@dataclass(frozen=True, slots=True)
class HttpRequest:
    path: str
    """With its query string."""
    body: bytes
    statements: int


def request_for(batch: Batch) -> HttpRequest:
    body: list[list[Any]] = []
    for statement in batch.statements:
        if isinstance(statement.params, Mapping):
            body.append([statement.sql, dict(statement.params)])
        else:
            body.append([statement.sql, *statement.params])
    if batch.write:
        execute = batch.returning or not batch.selects
        path = "/db/execute?transaction" if execute else "/db/request?transaction"
    else:
        path = "/db/query?level=" + ("weak" if batch.local else "linearizable")
        if len(body) > 1:
            # One snapshot for all of them, as SQLite's BEGIN gives the embedded transport:
            # without it rqlite runs each SELECT on its own, and a write committing between
            # two (a settlement moving a message to its outcome) is seen half done.
            path += "&transaction"
    encoded = json.dumps(body, separators=(",", ":")).encode("utf-8")
    return HttpRequest(path, encoded, len(body))


def parse_reply(status: int, content: bytes, statements: int) -> list[Result]:
    """One `Result` per statement, or a typed error. An SQL error fails the whole batch (the
    transaction was rolled back). `NoLeader` means the request certainly was not applied, so
    another node may take it; `OutcomeUnknown` that a write may or may not have applied."""
    if status in (401, 403):
        raise AuthError(f"rqlite refused the credentials (HTTP {status})")
    text = content.decode("utf-8", "replace").strip()
    if status == 503 or (status >= 500 and _mentions_not_applied(text)):
        raise NoLeader(f"rqlite: {text[:200] or status}")
    if status >= 500:
        raise OutcomeUnknown(f"rqlite answered HTTP {status}: {text[:200]}")
    if status != 200:
        raise BackendError(f"rqlite answered HTTP {status}: {text[:200]}")
    try:
        reply = json.loads(content)
    except ValueError as exc:
        raise BackendError(f"rqlite reply is not JSON: {text[:200]!r}") from exc
    if not isinstance(reply, dict):
        raise BackendError(f"rqlite reply has the wrong shape: {text[:200]!r}")
    if "error" in reply:
        error = str(reply["error"])
        if _mentions_not_applied(error):
            raise NoLeader(f"rqlite: {error}")
        # e.g. "leadership lost while committing log": the write may or may not have happened.
        raise OutcomeUnknown(f"rqlite: {error}")
    results = reply.get("results")
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        raise BackendError(f"rqlite reply has the wrong shape: {text[:200]!r}")
    for result in results:
        if "error" in result:
            raise BackendError(f"rqlite SQL error: {result['error']}")
    if len(results) != statements:
        raise BackendError(f"rqlite returned {len(results)} results for {statements} statements")
    return [_result(r) for r in results]


def _mentions_not_applied(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in _NOT_APPLIED)


def _result(raw: Mapping[str, Any]) -> Result:
    values = raw.get("values") or []
    if not isinstance(values, list):
        raise BackendError(f"rqlite result has the wrong shape: {raw!r}")
    try:
        return Result(
            rows=values,
            rows_affected=int(raw.get("rows_affected", 0)),
            last_insert_id=raw.get("last_insert_id"),
        )
    except (TypeError, ValueError) as exc:
        raise BackendError(f"rqlite result has the wrong shape: {raw!r}") from exc


# ------------------------------------------------------------------- one request's retries
#
# The clients drive `exchange`: it yields `Send` (post the request to this node, with this
# timeout), `Sleep` and `Discover` (ask the nodes who leads), and is sent back what happened
# (`HttpReply`, `NotSent`, `NoReply`; `Statuses`). It returns the results, or raises the typed
# error the caller gets.


@dataclass(frozen=True, slots=True)
class Send:
    node: int
    timeout: float


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Discover:
    """Ask every node whether it leads (`GET STATUS_RAFT`), each within `timeout`, and send
    back what they said (`Statuses`). The driver may stop asking once a node says it leads."""

    timeout: float


@dataclass(frozen=True, slots=True)
class Statuses:
    raft: tuple[Any, ...]
    """Per node, its Raft status (the parsed JSON of `STATUS_RAFT`), or None: no answer."""


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    content: bytes
    date: str | None = None
    """The `Date` header (the node's clock)."""
    sent_at: float = 0.0
    received_at: float = 0.0
    """The client's wall clock around the request (for the clock-skew estimate)."""


@dataclass(frozen=True, slots=True)
class NotSent:
    """The request never reached the node (cannot connect): certainly not applied. `cause`:
    why, in a few words (`errors.REFUSED`, "timed out connecting", "TLS: ...")."""

    error: str
    cause: str = "cannot connect"


@dataclass(frozen=True, slots=True)
class NoReply:
    """The request was sent, and no reply came (timeout, connection dropped). `cause`: which,
    in a few words."""

    error: str
    cause: str = "no reply"


Outcome = HttpReply | NotSent | NoReply

STATUS_RAFT = "/status?key=store.raft"
"""A node's own Raft state and term (about 1 KB, answered without asking the other nodes)."""
DISCOVERY_TIMEOUT = 0.5
"""How long a client waits for the nodes to say which of them leads."""
DISCOVERY_POLL = 0.01
"""A call whose node failed while another call of the client asks the nodes who leads waits
for that answer in steps of this."""


def leader_term(raft: Any) -> int | None:
    """The term of a node whose Raft status says it leads; None if it does not."""
    if not isinstance(raft, Mapping) or raft.get("state") != "Leader":
        return None
    term = raft.get("term")
    return term if isinstance(term, int) else 0


def framed(status: int, content_length: str | None, transfer_encoding: str | None) -> bool:
    """Whether a reply says where it ends (a `Content-Length`, or chunks), as every reply of
    rqlite's with a body does. One that does not was cut off in its headers: an HTTP library
    may hand it on as a reply with an empty body (urllib3 does, with a logged warning), and
    its request may have been applied."""
    if status < 200 or status in (204, 304):
        return True
    return content_length is not None or "chunked" in (transfer_encoding or "").lower()


Action = Send | Sleep | Discover


ATTEMPT_FLOOR = 1.0
"""The least a request is given before its node is given up on (a frozen or cut-off node
answers nothing: the request moves to the next node after this, not after `timeout`)."""
SLOW_FACTOR = 4.0
"""...unless this client's requests have been slow lately: then this many times that."""
SLOW_DECAY = 0.95
"""How fast the memory of a slow request fades, per reply."""
SECONDS_PER_BYTE = 1e-6
"""A large request is given a second more per MB of its body."""
LEASE_SHARE = 1 / 3
"""A request that takes or extends leases of `v` seconds is given at most `v / 3`: a node
that holds it longer is given up on while the leases still hold."""
LEASE_ATTEMPT_MIN = 0.1


@dataclass(slots=True)
class Nodes:
    """Which node a client sends to next, and which it suspects. It stays on one node until a
    failure moves it on. A node that did not answer (no connection, no reply) is suspected:
    the next choices skip it until it answers, or its suspicion lapses (`retry.PROBE`, longer
    each time it fails again); one failure moves the choice on once, however many calls in
    flight meet it. What the nodes say of themselves when asked (`Discover`: at the client's
    first use, and when a node failed to answer) moves the choice to the one that leads.
    Shared by every call of a client. `random` draws the jitter of the suspicions
    (`random.random`: this module has no dice)."""

    count: int
    random: Callable[[], float]
    current: int = 0
    suspects: dict[int, tuple[float, int]] = field(default_factory=dict)
    """node -> (suspected until, failures in a row)."""
    seen: dict[int, str] = field(default_factory=dict)
    """node -> what it did at its last failed attempt, in words (for the errors: forgotten
    once it answers)."""
    reached: bool = False
    """Whether any node ever accepted a connection (answered, or took a request)."""
    leader: tuple[int, int] | None = None
    """(node, term) of the last node that said it leads; None before any did."""
    looked: bool = False
    """Whether a call asked the nodes who leads at the client's first use."""
    asking_until: float = float("-inf")
    """While a call asks the nodes who leads after a failure: when it gives up asking."""

    def failed(self, node: int, now: float) -> None:
        """`node` did not answer: suspect it, and move on if it was the current one."""
        self.suspect(node, now)
        self.moved_on(node, now)

    def suspect(self, node: int, now: float) -> None:
        _, failures = self.suspects.get(node, (0.0, 0))
        self.suspects[node] = (now + PROBE.delay(failures + 1, self.random), failures + 1)

    def learn(self, statuses: Statuses) -> bool:
        """What the nodes said: the one that leads (the later term, if two say
        they do: the other may not know yet that it was deposed) is the next choice. Whether
        one did."""
        terms = [leader_term(raft) for raft in statuses.raft[: self.count]]
        leaders = [(term, n) for n, term in enumerate(terms) if term is not None]
        if not leaders:
            return False
        term, node = max(leaders)
        self.leader = (node, term)
        self.current = node
        return True

    def discovered(self, node: int, statuses: Statuses, now: float) -> None:
        """What the nodes said when `node` failed: the next choice is the node that says it
        leads, else one that answered (it can forward to a leader once there is one), else
        the next one, as after any failure."""
        self.asking_until = float("-inf")
        if self.learn(statuses) or node != self.current:
            return  # (another call has moved on from it already)
        order = [(node + i) % self.count for i in range(1, self.count)]
        alive = [n for n in order if n < len(statuses.raft) and statuses.raft[n] is not None]
        if alive:
            self.current = alive[0]
        else:
            self.moved_on(node, now)

    def moved_on(self, node: int, now: float) -> None:
        """`node` answered, but could not take the request (no leader yet): try another."""
        if node != self.current:
            return  # another call has moved on from it already
        order = [(node + i) % self.count for i in range(1, self.count + 1)]
        trusted = [n for n in order if self.suspects.get(n, (0.0, 0))[0] <= now]
        self.current = trusted[0] if trusted else min(order, key=lambda n: self.suspects[n][0])

    def answered(self, node: int) -> None:
        self.suspects.pop(node, None)
        self.seen.pop(node, None)
        self.reached = True

    def nothing_listens(
        self, tried: Mapping[int, str], patience: float | None, elapsed: float
    ) -> bool:
        """Whether a call that has tried for `elapsed` seconds, and whose attempts went as
        `tried`, should stop: with `patience` given, no node ever reached, every node
        refused (this call), and for at least `patience` seconds."""
        return (
            patience is not None
            and not self.reached
            and elapsed >= patience
            and len(tried) == self.count
            and all(seen == REFUSED for seen in tried.values())
        )

    def report(self, names: Sequence[str], tried: Mapping[int, str]) -> dict[str, str]:
        """What each node did, by name: in this call (`tried`), else at its last attempt
        (another call's), else "not tried"."""
        return {
            names[i] if i < len(names) else f"node {i + 1}": tried.get(i)
            or self.seen.get(i, "not tried")
            for i in range(self.count)
        }


def leave(
    nodes: Nodes,
    node: int,
    *,
    deadline: float,
    monotonic: Callable[[], float],
    discover: float | None,
) -> Generator[Action, Outcome | Statuses | None, None]:
    """`node` did not answer (no connection, no reply): suspect it and move on. With
    `discover` (a timeout), the next node is the one that says it leads (`Discover`): moving
    on blindly may land on the node that just failed the cluster (an isolated leader that a
    follower was forwarding to) and wait a whole attempt there. One call asks for all the
    calls of the client that meet the failure; the others wait for its answer."""
    now = monotonic()
    nodes.suspect(node, now)
    timeout = min(discover or 0.0, deadline - now - MIN_ATTEMPT)
    if timeout < MIN_ATTEMPT or node != nodes.current:
        nodes.moved_on(node, now)
        return
    if now >= nodes.asking_until:
        mine = nodes.asking_until = now + timeout
        try:
            statuses = yield Discover(timeout)
        finally:
            if nodes.asking_until == mine:
                nodes.asking_until = float("-inf")  # (a call cancelled while it asked)
        if isinstance(statuses, Statuses):
            nodes.discovered(node, statuses, monotonic())
            return
    while node == nodes.current and monotonic() < min(nodes.asking_until, deadline):
        yield Sleep(DISCOVERY_POLL)  # another call asks the nodes: its answer moves us on
    nodes.moved_on(node, monotonic())


def exchange(
    request: HttpRequest,
    *,
    write: bool,
    nodes: Nodes,
    deadline: float,
    timeout: float,
    monotonic: Callable[[], float],
    jitter: Callable[[], float],
    on_reply: Callable[[HttpReply, int, float], None] | None = None,
    patience: float | None = None,
    names: Sequence[str] = (),
    refused_patience: float | None = None,
    discover: float | None = None,
) -> Generator[Action, Outcome | Statuses | None, list[Result]]:
    """Send `request` until it is answered or `deadline` (a `monotonic` time) passes. Each
    attempt waits at most `patience` (default `timeout`; doubled after each attempt that had
    no reply, up to `timeout`) for its node, then gives that node up. A failure that proves
    the request was not applied moves to the next node and tries again after a backoff; a
    write whose outcome is unknown is not resent here (the transport knows which writes are
    safe to resend) but raises `OutcomeUnknown`, after moving on to the next node (the one
    that failed may be frozen); `write=False` (a read, or a write that changes nothing when
    applied again) tries again instead, as after a failure. No request is given more time
    than is left. Given up, the error says what each node did (`names`: the nodes' URLs, for
    it). With `refused_patience`, until a node is reached (`Nodes.reached`), every node
    refusing connections for that long raises `NothingListens` at once. With `discover` (a
    timeout), the nodes are asked who leads at the client's first use, and a node that did
    not answer is left for the one that says it leads (`leave`)."""
    retry = Retry(FAILOVER, deadline, jitter)
    started = monotonic()
    last: Unavailable | None = None
    tried: dict[int, str] = {}  # node -> what it did at this call's last attempt on it
    wait_for = min(timeout, patience) if patience is not None else timeout
    if discover is not None and not nodes.looked:
        nodes.looked = True  # (once per client: the others go on meanwhile)
        ask = min(discover, deadline - started - MIN_ATTEMPT)
        if ask >= MIN_ATTEMPT:
            statuses = yield Discover(ask)
            if isinstance(statuses, Statuses):
                nodes.learn(statuses)

    def name(node: int) -> str:
        return names[node] if node < len(names) else f"rqlite node {node + 1}"

    while True:
        left = deadline - monotonic()
        if left < MIN_ATTEMPT:
            raise gave_up(last, nodes.report(names, tried))
        node = nodes.current
        sent = monotonic()
        outcome = yield Send(node, min(wait_for, left))
        failure: Unavailable
        if isinstance(outcome, HttpReply):
            nodes.answered(node)
            if on_reply is not None:
                on_reply(outcome, node, monotonic() - sent)
            try:
                return parse_reply(outcome.status, outcome.content, request.statements)
            except AuthError as exc:
                raise AuthError(f"{name(node)}: {exc}: check the URL's user and password") from None
            except NoLeader as exc:
                failure = exc
            except OutcomeUnknown as exc:
                if write:
                    nodes.moved_on(node, monotonic())
                    raise
                failure = Unavailable(str(exc))  # a read changes nothing: simply not done
            tried[node] = nodes.seen[node] = str(failure).removeprefix("rqlite: ")[:120]
            nodes.moved_on(node, monotonic())
        elif isinstance(outcome, NotSent):
            failure = Unavailable(f"cannot reach {name(node)}: {outcome.error}")
            tried[node] = nodes.seen[node] = outcome.cause
            if nodes.nothing_listens(tried, refused_patience, monotonic() - started):
                nodes.failed(node, monotonic())
                raise nothing_listens(nodes.report(names, tried))
            yield from leave(nodes, node, deadline=deadline, monotonic=monotonic, discover=discover)
        elif isinstance(outcome, NoReply):
            tried[node] = nodes.seen[node] = outcome.cause
            nodes.reached = True  # it took the request
            yield from leave(nodes, node, deadline=deadline, monotonic=monotonic, discover=discover)
            if write:
                raise OutcomeUnknown(f"{name(node)}: {outcome.cause}: {outcome.error}")
            failure = Unavailable(f"{name(node)}: {outcome.cause}: {outcome.error}")
            wait_for = min(timeout, wait_for * 2)  # maybe only slow: more time next
        else:
            raise TypeError(f"exchange was sent {outcome!r}")
        last = failure
        wait = retry.wait(monotonic())
        if wait is None:
            raise gave_up(failure, nodes.report(names, tried))
        yield Sleep(wait)


def gave_up(last: Unavailable | None, nodes: dict[str, str]) -> Unavailable:
    """The error of a call that ran out of time: what each node did, in one line, as the
    type of the last failure (`NoLeader` stays `NoLeader`)."""
    if all(seen == "not tried" for seen in nodes.values()):
        return last or Unavailable("rqlite: the deadline passed before any request was sent")
    if all(seen == REFUSED for seen in nodes.values()):
        return nothing_listens(nodes, Unavailable)
    kind = type(last) if last is not None else Unavailable
    each = "; ".join(f"{url}: {seen}" for url, seen in nodes.items())
    return kind(f"no rqlite node took the request: {each}", nodes)


def nothing_listens(nodes: dict[str, str], kind: type[Unavailable] = NothingListens) -> Unavailable:
    """Every node refused connections."""
    where = ", ".join(nodes)
    return kind(f"nothing answers at {where} ({REFUSED}): is the cluster running?", nodes)


def request_headers(endpoints: Endpoints) -> dict[str, str]:
    """The headers of every request: JSON, and Basic auth when there are credentials."""
    headers = {"Content-Type": "application/json"}
    if endpoints.auth is not None:
        user, password = endpoints.auth
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        headers["Authorization"] = f"Basic {token}"
    return headers


class ClientState:
    """What the sync and async clients share: the nodes, which one is current, the clock-skew
    estimate per node, the request count; and the `exchange` for a batch. The clocks and the
    jitter are given by the I/O layer (`time.time`, `time.monotonic`, `random.random`)."""

    def __init__(
        self,
        endpoints: Endpoints,
        *,
        timeout: float,
        skew_warning: float = 1.0,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
        random: Callable[[], float],
        refused_timeout: float | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.refused_timeout = refused_timeout
        """Until a node accepts a connection, give up once every node refused for this long
        (`NothingListens`)."""
        self.clock = clock
        """The clock whose skew from the nodes' is measured (the one leases are computed with)."""
        self.monotonic = monotonic
        """The clock of deadlines and waits (`time.monotonic`)."""
        self.random = random
        """The jitter of the waits (`random.random`)."""
        self.timeout = timeout
        self.nodes = Nodes(len(endpoints.urls), random)
        self.slow = 0.0
        """The slowest recent reply (seconds), fading by SLOW_DECAY a reply."""
        self.skew = [SkewEstimate() for _ in endpoints.urls]
        self.skew_warning = skew_warning
        self._warned_at = float("-inf")
        self.requests = 0
        """HTTP requests sent (for tests and metrics)."""

    def clock_skew(self) -> float:
        """How far (seconds, signed: the node's clock minus this client's) the node we talk to
        is proven to be from this client, from the `Date` of its replies."""
        return self.skew[self.nodes.current].proven

    @property
    def url(self) -> str:
        """The node requests go to now."""
        return self.endpoints.urls[self.nodes.current]

    def patience(
        self, request: HttpRequest, lease_for: float | None, resend: int, final: bool = False
    ) -> float:
        """How long an attempt waits for its node before giving it up: at least a second,
        more for a client whose requests are slow lately and for a large request, doubled for
        each resend of the call; at most a third of the visibility of the leases it takes or
        extends (they must still hold after the next attempt), and at most `timeout`. A
        `final` write (one its caller cannot send again, such as a publish without dedup ids)
        waits the whole `timeout`: giving its node up early could only turn a slow success
        into `OutcomeUnknown`."""
        if final:
            return self.timeout
        wait = max(ATTEMPT_FLOOR, SLOW_FACTOR * self.slow) + len(request.body) * SECONDS_PER_BYTE
        wait *= 2.0**resend
        if lease_for is not None:
            wait = min(wait, max(LEASE_ATTEMPT_MIN, lease_for * LEASE_SHARE))
        return min(self.timeout, wait)

    def steps(
        self,
        batch: Batch,
        deadline: float,
        lease_for: float | None = None,
        resend: int = 0,
        final: bool = False,
        idempotent: bool = False,
    ) -> tuple[HttpRequest, Generator[Action, Outcome | Statuses | None, list[Result]]]:
        """The exchange of `batch` (`idempotent`: a write applied again changes nothing, so
        its lost reply is sent again here as a read's is, not raised: `Plan.idempotent`)."""
        request = request_for(batch)
        return request, exchange(
            request,
            write=batch.write and not idempotent,
            nodes=self.nodes,
            deadline=deadline,
            timeout=self.timeout,
            monotonic=self.monotonic,
            jitter=self.random,
            on_reply=self._on_reply,
            patience=self.patience(request, lease_for, resend, final and batch.write),
            names=self.endpoints.urls,
            refused_patience=self.refused_timeout,
            discover=DISCOVERY_TIMEOUT if len(self.endpoints.urls) > 1 else None,
        )

    def _on_reply(self, reply: HttpReply, node: int, took: float) -> None:
        self.slow = max(took, self.slow * SLOW_DECAY)
        date = http_date(reply.date) if reply.date else None
        if date is None:
            return
        estimate = self.skew[node]
        estimate.add(date, reply.sent_at, reply.received_at)
        skew = estimate.proven
        if abs(skew) > self.skew_warning and reply.received_at - self._warned_at > 60:
            self._warned_at = reply.received_at
            log.warning(
                "the clock of rqlite node %s is %.1f s %s this client's: leases, parks and "
                "dedup windows are computed with client clocks; keep them in sync (NTP)",
                self.endpoints.urls[node],
                abs(skew),
                "ahead of" if skew > 0 else "behind",
            )


# --------------------------------------------------------------------------- clock skew


@dataclass(slots=True)
class SkewEstimate:
    """How far a node's clock is from this client's, from the `Date` header of its replies (no
    extra request). The header has whole seconds, so each reply only bounds the offset (node
    minus client): the node stamped the reply between `sent_at` and `received_at`, at a time
    whose whole seconds are the header's. Intersecting those bounds over replies narrows the
    estimate to a fraction of a second once replies have crossed a few second boundaries."""

    low: float = float("-inf")
    high: float = float("inf")
    samples: int = 0

    def add(self, date: float, sent_at: float, received_at: float) -> None:
        low, high = date - received_at, date + 1 - sent_at
        if low > self.high or high < self.low:
            # The clock moved (a step by NTP, say): start over from this reply.
            self.low, self.high, self.samples = low, high, 0
        self.low = max(self.low, low)
        self.high = min(self.high, high)
        self.samples += 1

    @property
    def offset(self) -> float:
        """The best estimate of node clock minus client clock, in seconds."""
        return (self.low + self.high) / 2

    @property
    def proven(self) -> float:
        """The smallest offset the replies prove, with its sign (0 if they allow none)."""
        if self.low > 0:
            return self.low
        if self.high < 0:
            return self.high
        return 0.0


def http_date(value: str) -> float | None:
    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


# ------------------------------------------------------------------ the cluster's nodes

STATUS_TIMEOUT = 1.0
"""How long `nodes()` waits for each node's `/nodes` or `/status`."""


def parse_nodes(reply: Any) -> list[tuple[str, str, bool, bool]]:
    """(id, API address, reachable, leader) per node, from `/nodes` (v8's object keyed by node
    id, or the `{"nodes": [...]}` list of `?ver=2`), sorted by id."""
    if isinstance(reply, Mapping) and isinstance(reply.get("nodes"), list):
        entries = [(str(e.get("id", "")), e) for e in reply["nodes"] if isinstance(e, Mapping)]
    elif isinstance(reply, Mapping):
        entries = [(str(k), e) for k, e in reply.items() if isinstance(e, Mapping)]
    else:
        return []
    return sorted(
        (node_id, str(e.get("api_addr", "")), bool(e.get("reachable")), bool(e.get("leader")))
        for node_id, e in entries
    )


def applied_index(status: Any) -> int | None:
    """The last Raft entry a node applied, from its `/status`."""
    try:
        return int(status["store"]["raft"]["applied_index"])
    except (KeyError, TypeError, ValueError):
        return None


# ------------------------------------------------------------------------------ URLs


@dataclass(frozen=True, slots=True)
class Endpoints:
    """The nodes of one rqlite cluster and the credentials, parsed from a URL like
    `http://user:pass@h1:4001,h2:4001`. The password never appears in its repr."""

    urls: tuple[str, ...]
    auth: tuple[str, str] | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        user = f", user={self.auth[0]!r}" if self.auth else ""
        return f"Endpoints(urls={self.urls!r}{user})"


# A node's part of the URL starts with a scheme, at the start or after a comma: "://" anywhere
# else belongs to a password.
_SCHEME = re.compile(r"(?:^|,)\s*([A-Za-z][A-Za-z0-9+.-]*)://")
_HOSTNAME = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]")


def parse_endpoints(url: str, auth: tuple[str, str] | None = None) -> Endpoints:
    """`http://h1:4001,h2:4001` or `http://h1:4001,http://h2:4001` (each part may repeat the
    scheme). Credentials (`user:password@`) apply to every node; `auth` overrides them. A
    password may hold any character (what stands before the last `@` of a node's part is
    its user and password); its `%XX` escapes are decoded. No message raised here shows it."""
    if not isinstance(url, str):
        raise InvalidArgument(f"an rqlite URL must be a string, got {type(url).__name__}")
    segments = _segments(url)
    schemes = {scheme for scheme, _ in segments}
    unknown = schemes - {"http", "https"}
    if unknown:
        raise InvalidArgument(
            f"unknown URL scheme {sorted(unknown)[0]!r} (use http, https or sqlite)"
        )
    if len(schemes) > 1:
        raise InvalidArgument("mixed schemes (http and https) in the rqlite URL")
    scheme = schemes.pop()
    credentials: set[tuple[str, str]] = set()
    urls = []
    for _, rest in segments:
        if "@" in rest:
            userinfo, rest = rest.rsplit("@", 1)
            user, _, password = userinfo.partition(":")
            credentials.add((unquote(user), unquote(password)))
        for part in rest.split(","):
            host = part.strip().split("/", 1)[0]
            if host:
                urls.append(f"{scheme}://{_check_host(scheme, host)}")
    if len(credentials) > 1:
        raise InvalidArgument("the rqlite URL gives different credentials for different nodes")
    if not urls:
        raise InvalidArgument(f"no host in rqlite URL {redact(url)!r}")
    found = credentials.pop() if credentials else None
    return Endpoints(tuple(urls), auth if auth is not None else found)


def _segments(url: str) -> list[tuple[str, str]]:
    """[(scheme, the text up to the next node's scheme)], for a URL that starts with one."""
    starts = list(_SCHEME.finditer(url))
    if not starts or starts[0].start() != 0:
        raise InvalidArgument(f"not an rqlite URL: {redact(url)!r}")
    ends = [m.start() for m in starts[1:]] + [len(url)]
    return [(m.group(1).lower(), url[m.end() : end]) for m, end in zip(starts, ends, strict=True)]


def _check_host(scheme: str, host: str) -> str:
    """`host[:port]`; the messages never repeat what is not a host name or a port (a URL cut
    in the wrong place can leave a password there)."""
    name, colon, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    if not colon:
        name, port = host, ""
    if not _HOSTNAME.fullmatch(name):
        raise InvalidArgument("bad host in the rqlite URL (not a host name or address)")
    if colon and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise InvalidArgument(f"bad port for host {name!r} in the rqlite URL")
    try:
        if not urlsplit(f"{scheme}://{host}").hostname:
            raise ValueError
    except ValueError:
        raise InvalidArgument(f"bad host {name!r} in the rqlite URL") from None
    return host


def redact(url: str) -> str:
    """The URL without its credentials, for messages and logs: in each node's part, whatever
    stands between `://` and the last `@` is replaced; a part with a `:` but no `@` (a URL
    whose `@host` is missing) loses everything after the scheme."""
    if not isinstance(url, str):
        return "<not a string>"
    starts = list(_SCHEME.finditer(url))
    if not starts:
        return url if _hosts_only(url) else "***"
    out = [url[: starts[0].start()]]
    ends = [m.start() for m in starts[1:]] + [len(url)]
    for m, end in zip(starts, ends, strict=True):
        rest = url[m.end() : end]
        if "@" in rest:
            rest = "***@" + rest.rsplit("@", 1)[1]
        elif not all(_check_quietly(m.group(1), part) for part in rest.split(",")):
            rest = "***"
        out.append(url[m.start() : m.end()] + rest)
    return "".join(out)


def _hosts_only(text: str) -> bool:
    """Whether `text` (without a scheme) can hold no password: no `@`, and host[:port]
    parts (or no `:` at all)."""
    if "@" in text:
        return False
    return ":" not in text or all(_check_quietly("http", part) for part in text.split(","))


def unknown_scheme(url: str) -> InvalidArgument:
    """The error for a URL that is neither rqlite's nor SQLite's, with what to write: a bare
    `host:port` (the scheme forgotten) gets its `http://` form, a file name its `sqlite:///`."""
    shown = redact(url)
    if not url.strip():
        return InvalidArgument("the URL is empty: give http(s)://host:port or sqlite:///file.db")
    _, at, hosts = url.rpartition("@")
    if "://" not in url and at and _hosts_only(hosts):
        return InvalidArgument(
            f"no scheme in the URL '***@{hosts}': for rqlite, write "
            f"'http://USER:PASSWORD@{hosts}' (or https://)"
        )
    if "://" not in url and _hosts_only(url):
        bare = url.strip()
        if ":" in bare or "," in bare or not _looks_like_a_file(bare):
            nodes = ",".join(f"http://{part.strip()}" for part in bare.split(",") if part.strip())
            return InvalidArgument(
                f"no scheme in the URL {shown!r}: for rqlite, write {nodes!r} (or https://)"
            )
        return InvalidArgument(
            f"no scheme in the URL {shown!r}: for an embedded queue in that file, write "
            f"'sqlite:///{bare}'"
        )
    return InvalidArgument(
        f"unknown URL scheme in {shown!r}: use http:// or https:// (rqlite) or sqlite:/// "
        "(an embedded file)"
    )


def _looks_like_a_file(text: str) -> bool:
    return "/" in text or text.endswith((".db", ".sqlite", ".sqlite3"))


def _check_quietly(scheme: str, part: str) -> bool:
    host = part.strip().split("/", 1)[0]
    if not host:
        return True
    try:
        _check_host(scheme, host)
    except InvalidArgument:
        return False
    return True
