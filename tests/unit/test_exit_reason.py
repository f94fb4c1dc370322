"""Which line of a failed rqlited's log says why it failed (`local_cluster.exit_reason`), on
logs as rqlited v8.43.4 writes them."""

from __future__ import annotations

from rqlite_queue.local_cluster import exit_reason

BIND = """=== 09:16:12 rqlited -node-id n1 -http-addr 127.0.0.1:4001 -raft-addr 127.0.0.1:4002 d
[rqlited] 2026/12/03 09:16:12 rqlited starting, version v8.43.4, SQLite 3.50.4
[rqlited] 2026/12/03 09:16:12 go1.26.8, target architecture is amd64
[rqlited] 2026/12/03 09:16:12 failed to listen on 127.0.0.1:4002: listen tcp 127.0.0.1:4002: \
bind: address already in use
"""

BAD_FLAG = """=== 09:17:39 rqlited -bogus d
flag provided but not defined: -bogus

rqlite is a lightweight, distributed relational database, which uses SQLite as its
  -write-queue-tx
    \tUse a transaction when processing a queued write
"""


def test_the_reason_is_the_last_failure_without_its_prefix() -> None:
    assert exit_reason(BIND) == (
        "failed to listen on 127.0.0.1:4002: listen tcp 127.0.0.1:4002: "
        "bind: address already in use"
    )


def test_a_bad_flag_is_the_reason_not_the_usage_printed_after_it() -> None:
    assert exit_reason(BAD_FLAG) == "flag provided but not defined: -bogus"


def test_only_the_last_start_counts() -> None:
    restarted = BIND + "=== 09:20:00 rqlited -node-id n1 d\n[store] 2026/12/03 09:20:00 open\n"
    assert exit_reason(restarted) == "open"
    assert exit_reason("") == "(nothing in its log)"
