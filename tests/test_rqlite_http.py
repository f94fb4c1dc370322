"""Reading rqlite's replies (pure: `parse_reply` takes a status and bytes), including the
replies a broken proxy or a wrong server would send."""

from __future__ import annotations

import json

import pytest

from rqlite_queue import OutcomeUnknown
from rqlite_queue._protocol.http import parse_reply, redact
from rqlite_queue.errors import AuthError, BackendError, NoLeader


def reply(body: object, status: int = 200, statements: int = 1) -> object:
    return parse_reply(status, json.dumps(body).encode(), statements)


def test_rows_and_write_results() -> None:
    results = reply(
        {
            "results": [
                {"columns": ["a"], "types": ["integer"], "values": [[1], [2]]},
                {"last_insert_id": 7, "rows_affected": 1},
                {"columns": ["a"], "types": ["integer"]},
            ]
        },
        statements=3,
    )
    assert [(r.rows, r.rows_affected, r.last_insert_id) for r in results] == [  # type: ignore[attr-defined]
        ([[1], [2]], 0, None),
        ([], 1, 7),
        ([], 0, None),
    ]


@pytest.mark.parametrize(
    ("status", "content", "error"),
    [
        (200, b"<html>proxy error</html>", BackendError),  # not JSON
        (200, b"[1, 2]", BackendError),  # JSON of the wrong shape
        (200, b'{"results": "nope"}', BackendError),
        (200, b'{"results": [1]}', BackendError),
        (200, b'{"results": [{"values": 3}]}', BackendError),
        (200, b'{"results": []}', BackendError),  # fewer results than statements
        (200, b'{"results": [{"error": "no such table: x"}]}', BackendError),
        (200, b'{"error": "not leader"}', NoLeader),
        (200, b'{"error": "leadership lost while committing log"}', OutcomeUnknown),
        (401, b"", AuthError),
        (403, b"", AuthError),
        (503, b"leader not found", NoLeader),
        (500, b"leader address: not leader", NoLeader),
        (500, b"boom", OutcomeUnknown),
        (404, b"not found", BackendError),
    ],
)
def test_bad_replies_are_typed_errors(status: int, content: bytes, error: type) -> None:
    with pytest.raises(error):
        parse_reply(status, content, 1)


def test_a_lost_leadership_is_not_mistaken_for_no_leader() -> None:
    """NoLeader means "certainly not applied" (safe to send elsewhere); a lost leadership
    while committing may have applied: OutcomeUnknown."""
    with pytest.raises(OutcomeUnknown):
        reply({"error": "leadership lost while committing log"})


def test_redact() -> None:
    assert redact("https://u:p%40ss@a:1,b:2") == "https://***@a:1,b:2"
    assert redact("http://a:1") == "http://a:1"
    assert redact("http://u:p@a:1,http://u:p@b:2") == "http://***@a:1,http://***@b:2"
