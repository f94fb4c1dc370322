"""A queue's table names, and its statements rendered once.

Every statement is written once, whole, as an `Sql` text with named placeholders:

- the queue's tables and indexes (`{groups}`, `{messages_by_group}`): filled per queue, the
  first time the queue uses the statement (`Sql.__call__`), then kept;
- the fields of the JSON items a statement binds (`{j.dedup_id}`, with `j=Fields(...)`: the
  position is the field's place among the item type's own fields, so that a new field shifts
  nothing by hand), text parameters (`{text.g}`: `:g`, bound as JSON), the group states
  (`{claimable}`, `{g.leased}`, `{EMPTY.ready}`: `states.WORDS`) and the few real variants of
  a statement (a placeholder given a whole text): filled once, when the module is imported.

So no statement is assembled per call: a plan looks its texts up and binds its parameters."""

from __future__ import annotations

import json
import string
from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import Any

from . import states


@dataclass(frozen=True, slots=True)
class Names:
    """The table and index names of one named queue."""

    queue: str
    meta: str
    messages: str
    messages_by_group: str
    groups: str
    groups_ready: str
    groups_ready_by_priority: str
    groups_busy: str
    groups_empty: str
    dead: str
    dedup: str
    dedup_expiry: str
    claims: str
    claims_expiry: str
    schedules: str
    schedules_due: str
    settled: str
    settled_expiry: str
    outbox: str
    tenants: str
    tenants_ready: str
    tenants_rated: str
    tenants_bounded: str
    groups_ready_by_tenant: str
    groups_by_tenant: str
    groups_busy_by_tenant: str
    messages_debounced: str
    groups_in: str
    groups_up: str
    groups_out: str
    """The triggers that keep the tenants' counts of claimable groups (once tenants are on)."""
    outcomes: str
    outcomes_expiry: str
    groups_holders: str
    messages_kept: str
    """The triggers that record a kept message's holders, and write its outcome (schema.py)."""
    batches: str
    batches_open: str
    batches_expiry: str
    batches_order: str
    batch_sources: str
    batch_callbacks: str
    batches_done_1: str
    batches_done_2: str
    batches_done_3: str
    batches_done_4: str
    """The triggers that finish the batches of each depth (batch_tables.py)."""
    batches_finished_here: str
    batches_finished_elsewhere: str
    """The triggers that publish a finished batch's callbacks (one cluster; shards)."""
    retired: str
    """Schema v1 only (its job is done by the empty rows of `groups` since v2)."""

    @classmethod
    def of(cls, queue: str) -> Names:
        p = f"rq_{queue}_"
        return cls(queue, *(p + f.name for f in fields(cls)[1:]))

    @property
    def tables(self) -> tuple[str, ...]:
        return (
            self.meta,
            self.messages,
            self.groups,
            self.dead,
            self.dedup,
            self.claims,
            self.schedules,
            self.settled,
            self.outbox,
            self.tenants,
            self.outcomes,
            self.batches,
            self.batch_sources,
            self.batch_callbacks,
        )


NAMES = frozenset(f.name for f in fields(Names)) - {"queue"}
"""The placeholders a queue fills."""


class Fields:
    """The fields of the JSON items a statement binds, as `json_each` rows aliased `alias`:
    `{j.dedup_id}` is `json_extract(j.value, '$[3]')` when `dedup_id` is the fourth of
    `names`. Items travel as compact arrays (rqlite replicates the text: names in every item
    would cost), in the order of `names` (a type's `_fields`: `list(item)` makes one)."""

    def __init__(self, alias: str, names: Iterable[str]) -> None:
        for at, name in enumerate(names):
            setattr(self, name, f"json_extract({alias}.value, '$[{at}]')")


class _TextParameters:
    """`{text.g}`: the text parameter `:g`, bound as JSON and read back as text. (rqlite turns
    a string parameter shaped like an SQL hex literal, x'00ff', into a BLOB (its
    http/request_parser.go), but never looks inside a JSON text, so every group id travels as
    JSON and comes back as the same text.)"""

    def __getattr__(self, name: str) -> str:
        return f"json_extract(:{name}, '$')"


WORDS: dict[str, object] = {**states.WORDS, "text": _TextParameters()}
"""What every statement may say besides its table names and its own parts."""


class _Later(dict[str, Any]):
    """The words known when a module is imported; a queue's names are kept for later."""

    def __missing__(self, key: str) -> str:
        if key not in NAMES:
            raise KeyError(f"{key!r} is neither a word of the statements nor a table's name")
        return "{" + key + "}"


class Sql:
    """One statement's text, whole: rendered at import with `parts` (its variants' texts,
    its items' `Fields`) and `states.WORDS`, then once per queue with the queue's names.
    Written as SQL reads, over lines (sent as one line, `_one_line`: so no `--` comments:
    they go beside the text, in Python)."""

    __slots__ = ("_by_queue", "template")
    template: str
    """The text, the queue's names still to fill."""

    def __init__(self, text: str, **parts: object) -> None:
        if "--" in text:
            raise ValueError("an Sql text holds no comment: write it beside, in Python")
        words = _Later(WORDS)
        for key, part in parts.items():
            if isinstance(part, str) and "{" in part:
                raise ValueError(f"{key}: a part with placeholders is an Sql, not a str")
            words[key] = part.template if isinstance(part, Sql) else part
        self.template = _one_line(text.format_map(words))
        self._by_queue: dict[str, str] = {}

    def __call__(self, names: Names) -> str:
        """The text for the queue of `names` (rendered the first time)."""
        text = self._by_queue.get(names.queue)
        if text is None:
            text = self.template.format_map({k: getattr(names, k) for k in self.placeholders()})
            self._by_queue[names.queue] = text
        return text

    def placeholders(self) -> set[str]:
        return {name for _, name, _, _ in string.Formatter().parse(self.template) if name}

    def __repr__(self) -> str:
        return f"Sql({self.template!r})"


def _one_line(text: str) -> str:
    """`text` on one line, its spaces collapsed, none inside parentheses' ends (the bytes of a
    statement count: rqlite gzips one of 1 KiB or more)."""
    return " ".join(text.split()).replace("( ", "(").replace(" )", ")")


def as_json(value: Any) -> str:
    """A parameter bound as JSON text. (ensure_ascii: the text is pure ASCII whatever the
    payloads hold, text that is not valid Unicode having been refused before, so no backend
    has to agree on an encoding.)"""
    return json.dumps(value, separators=(",", ":"))
