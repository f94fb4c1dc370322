"""Every hot statement is driven by an index: its cost does not grow with the backlog.

The plans are read with `EXPLAIN QUERY PLAN` behind a backlog of 20 000 priority-0 groups, on
the embedded SQLite and on rqlite's own SQLite (the planners' versions differ)."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from rqlite_queue import sql
from rqlite_queue._sync.rqlite_client import RqliteClient
from rqlite_queue.cluster import Cluster
from rqlite_queue.rqlite_http import parse_endpoints, parse_reply, request_for
from rqlite_queue.sqlite_backend import SqliteExecutor

BACKLOG = 20_000
# A full pass over a table or index: "SCAN t" / "SCAN t USING [COVERING] INDEX i". Fine:
# scans of a subquery's few rows ("SCAN (subquery-2)") or of a constant row, and the walk of
# the all-ready index in its own order under a LIMIT (claim without a priority floor), which
# stops after `count` rows (`test_claim_cost_is_flat` measures that).
FULL_SCAN = re.compile(r"^SCAN (?!\(|CONSTANT ROW|rq_\w+_groups USING INDEX rq_\w+_groups_ready$)")

Execute = Callable[[sql.Batch], list[sql.Result]]


def hot_batches(n: sql.Names) -> dict[str, sql.Batch]:
    held = sql.Held(5, "g5", "token")
    dedup = sql.NewMessage("g", "{}", 0, "dedup-id")
    return {
        "claim": sql.claim(n, token="t", now=5.0, until=10.0, count=1, min_priority=0),
        "claim_many": sql.claim(n, token="t", now=5.0, until=10.0, count=32, min_priority=0),
        "claim min_priority=4": sql.claim(
            n, token="t", now=5.0, until=10.0, count=1, min_priority=4
        ),
        "publish": sql.publish(n, [sql.NewMessage("g", "{}", 0)], 1.0, 2.0).batch,
        "publish dedup": sql.publish(n, [dedup], 1.0, 2.0).batch,
        "ack": sql.ack(n, [held], now=1.0),
        "nack": sql.nack(n, held, now=1.0, delay=0.0),
        "park": sql.nack(n, held, now=1.0, delay=5.0),
        "extend": sql.extend(n, held, until=9.0),
        "dead_letter": sql.dead_letter(n, held, reason="r", now=1.0),
        "requeue_dead": sql.requeue_dead(n, [1, 2], now=1.0),
        "purge_dead": sql.purge_dead(n, [1, 2]),
        "peek": sql.peek(n, "g5", limit=10),
    }


def backlog(n: sql.Names, execute: Execute) -> None:
    execute(sql.schema(n))
    messages = [sql.NewMessage(f"g{i}", "{}", 0) for i in range(BACKLOG)]
    messages.append(sql.NewMessage("urgent", "{}", 4))
    for start in range(0, len(messages), 3000):
        execute(sql.publish(n, messages[start : start + 3000], 1.0, 2.0).batch)


def full_scans(execute: Execute, batch: sql.Batch) -> list[str]:
    found = []
    for statement in batch.statements:
        explain = sql.Batch(
            (sql.Statement("EXPLAIN QUERY PLAN " + statement.sql, statement.params),),
            write=False,
        )
        details = [str(row[3]) for row in execute(explain)[0].rows]
        found += [f"{statement.sql[:60]}...: {d}" for d in details if FULL_SCAN.match(d)]
    return found


@pytest.fixture(scope="module")
def sqlite_execute(tmp_path_factory: pytest.TempPathFactory) -> Execute:
    executor = SqliteExecutor(str(Path(tmp_path_factory.mktemp("plans")) / "q.db"))
    backlog(sql.Names("plans"), executor.execute)
    return executor.execute


@pytest.fixture(scope="module")
def rqlite_execute(cluster1: Cluster) -> Iterator[Execute]:
    client = RqliteClient(parse_endpoints(cluster1.url), timeout=60)
    backlog(sql.Names("plans"), client.execute)
    http = httpx.Client(base_url=cluster1.url, timeout=60)

    def explain(batch: sql.Batch) -> list[sql.Result]:
        # /db/query runs on a read-only connection, where even EXPLAIN of an UPDATE is
        # refused; a strong /db/request runs it on the writable one (as a write would).
        request = request_for(batch)
        reply = http.post("/db/request", params={"level": "strong"}, json=request.body)
        return parse_reply(reply.status_code, reply.content, len(request.body))

    yield explain
    http.close()
    client.close()


@pytest.mark.parametrize("name", list(hot_batches(sql.Names("plans"))))
@pytest.mark.parametrize("backend", ["sqlite", "rqlite"])
def test_no_full_scan(name: str, backend: str, request: pytest.FixtureRequest) -> None:
    execute: Execute = request.getfixturevalue(f"{backend}_execute")
    assert full_scans(execute, hot_batches(sql.Names("plans"))[name]) == []


def test_the_checker_sees_a_full_scan(sqlite_execute: Execute) -> None:
    """The seed's claim scans the messages table: the check above would catch it."""
    n = sql.Names("plans")
    seed_claim = sql.Batch(
        (
            sql.Statement(
                f"SELECT m.seq FROM {n.messages} m JOIN {n.groups} g "
                f"ON g.group_id = m.group_id WHERE g.priority >= 4 ORDER BY g.turn, m.seq"
            ),
        )
    )
    assert full_scans(sqlite_execute, seed_claim)


def vm_steps(path: str, batch: sql.Batch) -> int:
    """SQLite virtual-machine instructions to run the batch (rolled back): a measure of work
    that does not depend on the machine's speed or load."""
    con = sqlite3.connect(path, isolation_level=None)
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    con.set_progress_handler(count, 1)
    con.execute("BEGIN IMMEDIATE")
    for statement in batch.statements:
        con.execute(statement.sql, statement.params).fetchall()
    con.execute("ROLLBACK")
    con.close()
    return steps


SEED_CLAIM = (
    "SELECT m.seq FROM {n.messages} m JOIN {n.groups} g ON g.group_id = m.group_id "
    "WHERE g.priority >= 4 ORDER BY g.turn, m.seq LIMIT 1"
)


@pytest.mark.parametrize("name", [*hot_batches(sql.Names("plans")), "seed claim (must grow)"])
def test_claim_cost_is_flat(name: str, tmp_path: Path) -> None:
    """Each hot batch does about the same work behind 200 or 20 000 groups; the seed's
    claim shows the check can fail."""
    n = sql.Names("plans")
    batches = hot_batches(n)
    batches["seed claim (must grow)"] = sql.Batch((sql.Statement(SEED_CLAIM.format(n=n)),))
    sizes = {}
    for size in (200, BACKLOG):
        path = str(tmp_path / f"q{size}.db")
        executor = SqliteExecutor(path)
        executor.execute(sql.schema(n))
        messages = [sql.NewMessage(f"g{i}", "{}", 0) for i in range(size)]
        messages.append(sql.NewMessage("urgent", "{}", 4))
        executor.execute(sql.publish(n, messages, 1.0, 2.0).batch)
        executor.close()
        sizes[size] = vm_steps(path, batches[name])
    flat = sizes[BACKLOG] <= sizes[200] * 1.2 + 20
    assert flat != name.endswith("(must grow)"), sizes
