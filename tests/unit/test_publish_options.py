"""One set of publish keywords (`types.MessageOptions`, `types.PublishOptions`) for every
publish path: the queue's, a transaction's and a batch's `publish` take them from there, and
they are the keys a `publish_many` item takes, so no path can take a keyword another lacks."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

import rqlite_queue
from rqlite_queue._async.batch import AsyncBatch
from rqlite_queue._async.transaction import AsyncTransaction
from rqlite_queue._protocol.messages import ITEM_KEYS
from rqlite_queue._sync.batch import Batch
from rqlite_queue._sync.transaction import Transaction
from rqlite_queue.types import MessageOptions, PublishOptions

ALL_OPTIONS = PublishOptions.__optional_keys__
MESSAGE_OPTIONS = MessageOptions.__optional_keys__


def test_the_publish_keywords_are_the_keys_of_a_publish_item() -> None:
    assert ITEM_KEYS - {"group_id", "event", "priority"} == ALL_OPTIONS
    assert {"dedup_id", "debounce", "max_wait", "batch"} == ALL_OPTIONS - MESSAGE_OPTIONS


@pytest.mark.parametrize(
    ("publish", "options"),
    [
        (rqlite_queue.AsyncTransport.publish, "PublishOptions"),
        (rqlite_queue.Transport.publish, "PublishOptions"),
        (AsyncTransaction.publish, "PublishOptions"),
        (Transaction.publish, "PublishOptions"),
        (AsyncBatch.publish, "MessageOptions"),
        (Batch.publish, "MessageOptions"),
    ],
)
def test_every_publish_takes_its_keywords_from_the_one_set(
    publish: Callable[..., Any], options: str
) -> None:
    parameters = inspect.signature(publish).parameters
    assert list(parameters)[:4] == ["self", "group_id", "event", "priority"]
    keywords = [p for p in parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert [(p.name, p.annotation) for p in keywords] == [("options", f"Unpack[{options}]")]
    named = {p.name for p in parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert not named & ALL_OPTIONS  # none of them listed again beside the set
