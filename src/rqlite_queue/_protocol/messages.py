"""A message: as given to `publish` (a `Message`, or the `(group_id, event)` pair of a
`publish_many` item kept as it came), checked and encoded into the row it is stored as
(`NewMessage`: its fields name the JSON items the publishing statements read, in order).
`checked` is the one check of every publish, `publish_many`, transaction publish and
follow-up; a new publish keyword is a field of `Message`, its check here, and its column (a
field of `NewMessage`, a migration)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, TypeVar

from ..errors import InvalidArgument, InvalidHeaders
from ..types import MAX_HEADERS, MAX_HEADERS_BYTES, MAX_PRIORITY, CheckedItems, PublishItem
from .batch_ids import check_batch_id
from .checks import MAX_SECONDS, check_id, check_int, check_seconds, check_tenant, show
from .core import QueueCore
from .outcomes import check_keep

R = TypeVar("R", bound=tuple[Any, ...])


class NewMessage(NamedTuple):
    """A message to insert, checked and encoded. (A named tuple: a frozen dataclass's
    `__init__` sets each field through `object.__setattr__`, which `publish_many` pays per
    field of every message.)"""

    group_id: str
    event: str
    priority: int
    dedup_id: str | None = None
    due: float = 0.0
    """Not delivered before (epoch seconds; 0: at once)."""
    expires: float | None = None
    """Dead-lettered instead of delivered after (None: never)."""
    tenant: str | None = None
    """The tenant of the group this message creates or refills (None: the queue's rule's,
    or the default tenant '')."""
    debounce: str | None = None
    """Replaces its group's pending message with the same key, if there is one."""
    due_by: float | None = None
    """With `debounce`: its due time never moves past this (None: no bound)."""
    headers: str | None = None
    """Its headers, encoded (a JSON object; None: none)."""
    keep: float | None = None
    """Seconds its outcome is kept after it settles (None: not kept)."""
    batch: str | None = None
    """The batch it joins (counted there when it is written: see batches.py; None: none)."""


class _MakeRow(Protocol):
    def __call__(self, cls: type[R], fields: tuple[Any, ...], /) -> R: ...


_new_row: _MakeRow = tuple.__new__
"""Makes a named tuple from a tuple of all its fields, without its `__new__`'s call."""
_CHECKED = NewMessage._fields.index("batch") + 1
_LATER = tuple(NewMessage._field_defaults[f] for f in NewMessage._fields[_CHECKED:])
"""The defaults of the fields of `NewMessage` after those `checked_message` sets (none yet):
a field added at its end needs no change here."""

MAX_PUBLISH = 100_000
"""Most messages in one publish_many."""


class Message(NamedTuple):
    """One message to publish, as given. (A named tuple: made for half of what a dataclass's
    `__init__` costs. A `(group_id, event)` item of `publish_many` is not made into one at all:
    `GivenMessage`.)"""

    group_id: Any
    event: Any
    priority: Any = 0
    dedup_id: Any = None
    delay: Any = None
    not_before: Any = None
    ttl: Any = None
    tenant: Any = None
    debounce: Any = None
    max_wait: Any = None
    headers: Any = None
    keep: Any = None
    batch: Any = None

    @classmethod
    def parse(cls, item: PublishItem) -> Message:
        """A `publish_many` item: `(group_id, event)`, `(group_id, event, priority)`, or a
        mapping with the keys of this class's fields (group_id and event required)."""
        if isinstance(item, Mapping):
            unknown = set(item) - ITEM_KEYS
            if unknown or "group_id" not in item or "event" not in item:
                raise InvalidArgument(
                    f"publish item needs group_id and event (and optionally "
                    f"{', '.join(sorted(ITEM_KEYS - {'group_id', 'event'}))}), got keys "
                    f"{show(sorted(map(str, item)))}"
                )
            return cls(**item)
        if isinstance(item, tuple) and len(item) in (2, 3):
            return cls(item[0], item[1], item[2] if len(item) == 3 else 0)
        raise InvalidArgument(
            f"publish item must be (group_id, event[, priority]) or a mapping, got {show(item)}"
        )

    @classmethod
    def parse_many(cls, items: Iterable[PublishItem]) -> list[GivenMessage]:
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise InvalidArgument(f"publish_many takes a list of items, got {show(items)}")
        items = list(items)
        if len(items) > MAX_PUBLISH:
            raise InvalidArgument(f"at most {MAX_PUBLISH} messages per publish_many")
        parsed: list[GivenMessage] = []
        try:  # (one try for the list: a call per item to mark its index costs more)
            for item in items:
                if type(item) is tuple and len(item) == 2:  # the common case, kept as it is
                    parsed.append(item)
                else:
                    parsed.append(cls.parse(item))
        except InvalidArgument as exc:
            exc.index = len(parsed)
            raise
        return parsed


ITEM_KEYS = frozenset(Message._fields)
_DEFAULTS = tuple(Message._field_defaults[name] for name in Message._fields[2:])
"""A message's fields after group_id and event, when not given."""

GivenMessage = Message | tuple[Any, Any]
"""A message to publish as given: a `Message`, or a `(group_id, event)` item of
`publish_many` kept as it came (the common case: a `Message` made of it would cost more than
the rest of its checks)."""


def checked_message(
    given: GivenMessage,
    now: float,
    encode: Callable[[Any], str],
    dedup_id: Callable[[Any], str | None] | None,
    trace: TraceHeaders | None = None,
    keep_default: float | None = None,
    *,
    sharded: bool = False,
) -> NewMessage:
    """The row to insert: every field checked, the event encoded, the dedup id (given, or
    `dedup_id(event)`; None: no such function) checked, the headers checked and encoded (with
    `trace`'s, the trace context of the publish, over the given ones), how long its outcome is
    kept (given, or `keep_default` when not; 0: not kept), the batch it joins checked (a batch
    id of this queue's kind: `sharded`)."""
    if len(given) == 2:
        group_id, event = given
        priority, given_dedup, delay, not_before, ttl, tenant, debounce, wait, head, keep, batch = (
            _DEFAULTS
        )
    else:
        (
            group_id,
            event,
            priority,
            given_dedup,
            delay,
            not_before,
            ttl,
            tenant,
            debounce,
            wait,
            head,
            keep,
            batch,
        ) = given  # (one unpacking: cheaper than twelve attribute reads)
    check_id(group_id, "group_id")
    check_int(priority, "priority", 0, MAX_PRIORITY)
    if delay is None and not_before is None and ttl is None and debounce is wait is None:
        due, expires, due_by = 0.0, None, None
        if tenant is not None:
            check_tenant(tenant)
    else:
        due, expires, due_by = _timed(
            now, delay, not_before, ttl, tenant, debounce, wait, given_dedup
        )
    text = encode(event)
    dedup = None
    if batch is not None:
        _check_joining(batch, given_dedup, debounce, sharded)
    elif debounce is None:
        dedup = given_dedup if given_dedup is not None or dedup_id is None else dedup_id(event)
    if dedup is not None:
        check_id(dedup, "dedup_id")
    if head is not None:
        headers = check_headers(head, trace)
    else:
        headers = None if trace is None else trace.text
    if keep is None:
        keep = keep_default
    elif type(keep) is not float or not 0 < keep <= MAX_SECONDS:  # (the common case first)
        keep = check_keep(keep, allow_zero=True)
    return _new_row(  # (`tuple.__new__`: a third of what the named tuple's own costs)
        NewMessage,
        (
            group_id,
            text,
            priority,
            dedup,
            due,
            expires,
            tenant,
            debounce,
            due_by,
            headers,
            keep,
            batch,
            *_LATER,
        ),
    )


def _check_joining(batch: object, dedup_id: object, debounce: object, sharded: bool) -> None:
    """A message that joins a batch: each one counts once there, so it takes no dedup id
    (and the transport's `dedup_key` is not asked) and no debounce key."""
    check_batch_id(batch, sharded=sharded)
    if dedup_id is not None:
        raise InvalidArgument("a message that joins a batch takes no dedup_id: it counts once")
    if debounce is not None:
        raise InvalidArgument("a message that joins a batch takes no debounce key")


def _timed(
    now: float,
    delay: Any,
    not_before: Any,
    ttl: Any,
    tenant: Any,
    debounce: Any,
    wait: Any,
    given_dedup: Any,
) -> tuple[float, float | None, float | None]:
    """A message's due time, expiry and due-by bound (debounce's max_wait), checked (and its
    tenant, in between, as ever)."""
    due = 0.0
    if delay is not None and not_before is not None:
        raise InvalidArgument("give delay= or not_before=, not both")
    if delay is not None:
        check_seconds(delay, "delay", allow_zero=True)
        due = now + delay if delay > 0 else 0.0
    if not_before is not None:
        check_seconds(not_before, "not_before", allow_zero=True, high=now + MAX_SECONDS)
        due = float(not_before) if not_before > now else 0.0
    expires = None
    if ttl is not None:
        check_seconds(ttl, "ttl", allow_zero=False)
        expires = now + ttl
    if tenant is not None:
        check_tenant(tenant)
    due_by = None
    if debounce is not None:
        check_id(debounce, "debounce")
        if given_dedup is not None:
            raise InvalidArgument(
                "give dedup_id= or debounce=, not both (a debounced publish replaces its "
                "pending message: sent again, it replaces it again)"
            )
        if wait is not None:
            check_seconds(wait, "max_wait", allow_zero=True)
            due_by = now + wait
            due = min(due, due_by)
    elif wait is not None:
        raise InvalidArgument("max_wait= goes with debounce=")
    return due, expires, due_by


@dataclass(frozen=True, slots=True)
class TraceHeaders:
    """The headers a publish adds to each of its messages (OpenTelemetry's trace context), as
    given and encoded once for all of them."""

    given: Mapping[str, str]
    text: str

    @classmethod
    def of(cls, given: Mapping[str, str] | None) -> TraceHeaders | None:
        return cls(dict(given), _encoded(given)) if given else None


def check_headers(given: object, trace: TraceHeaders | None = None) -> str | None:
    """A message's headers as stored (compact JSON; None: none): a mapping of non-empty str
    keys to str values, neither holding a NUL, at most MAX_HEADERS of them and
    MAX_HEADERS_BYTES encoded (`InvalidHeaders` otherwise). `trace`'s headers are added over
    them after the check (they are not counted against the limits)."""
    if not isinstance(given, Mapping):
        raise InvalidHeaders(f"headers must be a mapping of str to str, got {show(given)}")
    if len(given) > MAX_HEADERS:
        raise InvalidHeaders(f"at most {MAX_HEADERS} headers per message, got {len(given)}")
    for key, value in given.items():
        if not isinstance(key, str) or not key:
            raise InvalidHeaders(f"header names must be non-empty strings, got {show(key)}")
        if not isinstance(value, str):
            raise InvalidHeaders(f"header {show(key)}: values must be strings, got {show(value)}")
        if "\x00" in key or "\x00" in value:
            raise InvalidHeaders(f"header {show(key)} holds a NUL character")
    if not given:
        return None if trace is None else trace.text
    text = _encoded(given)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidHeaders(f"headers are not valid Unicode text: {exc.reason}") from None
    if size > MAX_HEADERS_BYTES:
        raise InvalidHeaders(f"headers are {size} bytes encoded; the limit is {MAX_HEADERS_BYTES}")
    return text if trace is None else _encoded({**given, **trace.given})


def _encoded(headers: Mapping[str, str]) -> str:
    return json.dumps(dict(headers), ensure_ascii=False, separators=(",", ":"))


def scoped_dedup_id(group_id: str, dedup_id: str) -> str:
    """A dedup id scoped to its group: the same id in two groups is two publishes (on one
    cluster or many), and the stored text stays short whatever the ids' lengths."""
    key = group_id.encode("utf-8", "surrogatepass") + b"\0" + dedup_id.encode()
    return "g:" + hashlib.blake2b(key, digest_size=16).hexdigest()


def checked(core: QueueCore, given: Sequence[GivenMessage], *, scoped: bool) -> list[NewMessage]:
    """Check and encode messages to publish. `scoped`: dedup ids are scoped to their group (a
    sharded queue's: the same id in two groups is two messages)."""
    now = core.now()
    hook = core.trace_headers
    trace = None if hook is None else TraceHeaders.of(hook())
    encode, dedup_id = core.encode, None if core.dedup_key is None else core.dedup_id
    keep = core.keep
    rows: list[NewMessage] = []
    try:  # (one try for the list: a call per message to mark its index costs more)
        for m in given:
            row = checked_message(m, now, encode, dedup_id, trace, keep, sharded=scoped)
            if scoped and row.dedup_id is not None:
                row = row._replace(dedup_id=scoped_dedup_id(row.group_id, row.dedup_id))
            rows.append(row)
    except InvalidArgument as exc:
        exc.index = len(rows)
        raise
    return rows


def checked_items(core: QueueCore, items: Iterable[PublishItem], *, scoped: bool) -> CheckedItems:
    """`items` checked and encoded once, for a later round's follow-ups."""
    rows = tuple(_follow_up_rows(core, Message.parse_many(items), scoped))
    ids = frozenset(m.dedup_id for m in rows if m.dedup_id is not None)
    return CheckedItems(rows, ids, core)


def follow_ups(core: QueueCore, items: object, *, scoped: bool) -> Sequence[NewMessage]:
    """A lease's follow-ups, checked and encoded (or as `checked_items` made them)."""
    if isinstance(items, CheckedItems):
        if items.origin is not core:
            raise InvalidArgument("these items were checked by another queue")
        return items.rows
    return _follow_up_rows(core, Message.parse_many(items), scoped)  # type: ignore[arg-type]


def _follow_up_rows(
    core: QueueCore, given: Sequence[GivenMessage], scoped: bool
) -> list[NewMessage]:
    """Follow-ups are published as they are: a debounce key has no pending message to replace
    in an ack's transaction that it could name (refused)."""
    rows = checked(core, given, scoped=scoped)
    for index, row in enumerate(rows):
        if row.debounce is not None:
            exc = InvalidArgument("debounce= is for publish and publish_many, not follow-ups")
            exc.index = index
            raise exc
    return rows
