"""A queue whose tables were emptied with `DELETE FROM` on every one of them (as many test
suites reset a database between tests) opens again: its version record is gone with the rest,
but its tables are this library's, so the setup recognises them and makes its counters anew
(it used to try to create them again: "table rq_default_messages already exists", on SQLite
and rqlite). Emptied tables of another shape are refused with a `SchemaError` that names what
repairs them, and that repair works. On SQLite and on a real rqlite."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from rqlite_queue import RqliteTransport, SqliteTransport, Transport
from rqlite_queue._protocol import schema
from rqlite_queue.errors import SchemaError
from rqlite_queue.testing import Cluster

FIXTURES = Path(__file__).resolve().parent / "fixtures"
QUEUE = "reset"
PREFIX = f"rq_{QUEUE}_"

Sql = Callable[[str], list[list[object]]]


@pytest.fixture(params=["sqlite", "rqlite"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Callable[[], Transport], Sql]]:
    """(a new client on the queue, a statement run beside it)."""
    opened: list[Transport] = []
    if request.param == "sqlite":
        path = tmp_path / "q.db"

        def make() -> Transport:
            opened.append(SqliteTransport(str(path), queue=QUEUE))
            return opened[-1]

        def run(statement: str) -> list[list[object]]:
            with sqlite3.connect(path) as conn:
                return [list(row) for row in conn.execute(statement)]

    else:
        cluster: Cluster = request.getfixturevalue("rqlite_cluster_factory")(1)
        leader = cluster.leader().http_url

        def make() -> Transport:
            opened.append(RqliteTransport(cluster.url, queue=QUEUE, max_skew=None))
            return opened[-1]

        def run(statement: str) -> list[list[object]]:
            verb = "query" if statement.startswith("SELECT") else "execute"
            reply = httpx.post(f"{leader}/db/{verb}", json=[statement], timeout=30).json()
            result = reply["results"][0]
            assert "error" not in result, result
            return [list(row) for row in result.get("values", [])]

    yield make, run
    for transport in opened:
        transport.close()


def tables(run: Sql) -> list[str]:
    rows = run(f"SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '{PREFIX}%'")
    return sorted(str(row[0]) for row in rows)


def empty_every_table(run: Sql) -> None:
    for table in tables(run):
        run(f"DELETE FROM {table}")


@pytest.mark.parametrize("tenants", [False, True])
def test_a_queue_whose_every_table_was_emptied_opens_again_and_works(
    backend: tuple[Callable[[], Transport], Sql], tenants: bool
) -> None:
    make, run = backend
    q = make()
    if tenants:
        q.set_tenant("acme", weight=2)
    q.publish("g", 1)
    assert q.claim("w", 30) is not None
    q.publish("h", 2)
    q.close()
    empty_every_table(run)
    assert run(f"SELECT count(*) FROM {PREFIX}meta") == [[0]]

    again = make()
    seqs = [again.publish("a", "first"), again.publish("b", "second", tenant="acme")]
    assert seqs[0] > 2 and seqs[1] == seqs[0] + 1  # AUTOINCREMENT goes on: no seq is reused
    assert again.stats().depth == 2
    assert again.stats().tenants_on  # the publish naming a tenant turned them on
    first = again.claim("w", 30)
    second = again.claim("w", 30)
    assert first is not None and second is not None
    assert [first.event, second.event] == ["first", "second"]  # round robin as for new groups
    again.ack(first)
    again.ack(second)
    assert again.stats().depth == 0
    versions = run(f"SELECT value FROM {PREFIX}meta WHERE key = 'schema_version'")
    assert versions == [[schema.SCHEMA_VERSION]]


def test_tenants_that_were_on_are_on_again_with_their_counts(
    backend: tuple[Callable[[], Transport], Sql],
) -> None:
    """Their triggers stayed with the tables: the reopened queue turns them on again, and its
    tenants' claimable counts are exact (the fair claim relies on them)."""
    make, run = backend
    q = make()
    q.set_tenant("acme", weight=2)
    q.close()
    empty_every_table(run)
    again = make()
    assert again.stats().tenants_on
    again.publish("acme:1", 1, tenant="acme")
    again.publish("other", 2)
    by_name = {t.name: t for t in again.tenants()}
    assert by_name["acme"].ready == 1 and by_name[""].ready == 1
    assert again.claim("w", 30) is not None


def test_emptied_tables_of_another_shape_are_refused_with_the_repair_named(
    backend: tuple[Callable[[], Transport], Sql],
) -> None:
    make, run = backend
    make().setup()
    empty_every_table(run)
    run(f"ALTER TABLE {PREFIX}messages ADD COLUMN not_ours TEXT")
    with pytest.raises(SchemaError, match=f"differ in {PREFIX}messages") as refused:
        make().setup()
    message = str(refused.value)
    assert "rqlite-queue restore" in message
    drops = message[message.index("(DROP TABLE") + 1 : message.index(") and open it again")]
    for statement in drops.split("; "):
        run(statement)  # the repair as the error names it
    assert tables(run) == []
    q = make()
    q.publish("g", 1)
    assert q.stats().depth == 1


@pytest.mark.parametrize("version", ["new", "v1", "v2", "v3", "v4", "v5"])
def test_the_shape_is_what_create_and_migrate_make(tmp_path: Path, version: str) -> None:
    """`schema.SHAPE` (what a reopened queue must be) is the columns of a new queue and of
    one upgraded from each older version."""
    path = tmp_path / "q.db"
    if version != "new":
        shutil.copy(FIXTURES / f"{version}.db", path)
    q = SqliteTransport(str(path), queue="default")
    q.setup()
    q.close()
    with sqlite3.connect(path) as db:
        found = {
            table: frozenset(row[1] for row in db.execute(f"PRAGMA table_info(rq_default_{table})"))
            for table in schema.SHAPE
        }
    assert found == schema.SHAPE
