"""The schema fence: every batch a client sends after it checked the tables' version carries
that version, so a client whose tables were migrated by a newer library while it ran is
refused at its next call with `SchemaError`, and nothing of that call applies (before the
fence, a client checked the version once, at its first call, and went on writing to tables it
did not know). A client whose data was restored from an older copy upgrades it again and goes
on. On SQLite and on rqlite; a newer migration is played by raising the stored version, as
the next library's `schema.migrate` does last."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from rqlite_queue import AsyncSqliteTransport, RqliteTransport, SqliteTransport, Transport
from rqlite_queue._protocol import schema
from rqlite_queue._protocol.names import Names
from rqlite_queue._protocol.shard_tables import STALE_EPOCH_ERROR
from rqlite_queue.errors import SchemaError
from rqlite_queue.testing import Cluster

FIXTURES = Path(__file__).resolve().parent / "fixtures"

Sql = Callable[[str], list[list[object]]]
"""Runs one statement on the queue's database, beside the clients (a write or a query)."""


@pytest.fixture(params=["sqlite", "rqlite"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[Callable[[], Transport], Sql, Callable[[Path], None]]]:
    """(a new client on the default queue, a statement run beside it, a restore of a file)."""
    opened: list[Transport] = []
    if request.param == "sqlite":
        path = tmp_path / "q.db"

        def make() -> Transport:
            opened.append(SqliteTransport(str(path)))
            return opened[-1]

        def run(statement: str) -> list[list[object]]:
            with sqlite3.connect(path) as conn:
                return [list(row) for row in conn.execute(statement)]

        def restore(copy: Path) -> None:
            with sqlite3.connect(copy) as source, sqlite3.connect(path) as target:
                source.backup(target)

    else:
        factory: Callable[..., Cluster] = request.getfixturevalue("rqlite_cluster_factory")
        cluster = factory(1)
        leader = cluster.leader().http_url

        def make() -> Transport:
            opened.append(RqliteTransport(cluster.url, max_skew=None))
            return opened[-1]

        def run(statement: str) -> list[list[object]]:
            verb = "query" if statement.startswith("SELECT") else "execute"
            reply = httpx.post(f"{leader}/db/{verb}", json=[statement], timeout=30).json()
            result = reply["results"][0]
            assert "error" not in result, result
            return [list(row) for row in result.get("values", [])]

        def restore(copy: Path) -> None:
            reply = httpx.post(
                f"{leader}/db/load",
                content=copy.read_bytes(),
                headers={"Content-Type": "application/octet-stream"},
                timeout=30,
            )
            assert reply.status_code == 200, reply.text

    yield make, run, restore
    for transport in opened:
        transport.close()


def migrated_by_newer_library(run: Sql) -> None:
    newer = schema.SCHEMA_VERSION + 1
    run(f"UPDATE rq_default_meta SET value = {newer} WHERE key = 'schema_version'")


def test_a_running_client_is_refused_once_a_newer_library_migrated(
    backend: tuple[Callable[[], Transport], Sql, Callable[[Path], None]],
) -> None:
    make, run, _ = backend
    old = make()
    old.publish("g", 1)
    old.publish("h", 2)
    (lease,) = old.settle_and_claim("w", 30, 1).leases
    migrated_by_newer_library(run)

    with pytest.raises(SchemaError, match=f"has schema version {schema.SCHEMA_VERSION + 1}"):
        old.publish("g", 3)
    with pytest.raises(SchemaError):
        old.settle_and_claim("w", 30, 1, ack=[lease])
    with pytest.raises(SchemaError):
        old.settle_and_claim("w", 30, 1)
    with pytest.raises(SchemaError):
        old.stats()
    # Nothing of the refused calls applied: the two messages, one of them still leased.
    assert run("SELECT seq FROM rq_default_messages ORDER BY seq") == [[1], [2]]
    assert run("SELECT count(*) FROM rq_default_groups WHERE ready = 0") == [[1]]
    # And it stays refused (it does not go back to trusting what it checked once).
    with pytest.raises(SchemaError):
        old.publish("g", 4)
    # A client starting now is refused as before, at its first call.
    with pytest.raises(SchemaError):
        make().publish("g", 5)


def test_a_client_upgrades_data_restored_from_an_older_copy_and_goes_on(
    backend: tuple[Callable[[], Transport], Sql, Callable[[Path], None]], tmp_path: Path
) -> None:
    make, run, restore = backend
    client = make()
    client.publish("before", 1)
    older = FIXTURES / f"v{schema.SCHEMA_VERSION - 1}.db"
    copy = tmp_path / older.name
    shutil.copy(older, copy)
    restore(copy)
    assert run("SELECT value FROM rq_default_meta WHERE key = 'schema_version'") == [
        [schema.SCHEMA_VERSION - 1]
    ]

    seq = client.publish("after", 2)  # the fence fails it; upgraded; sent again

    assert run("SELECT value FROM rq_default_meta WHERE key = 'schema_version'") == [
        [schema.SCHEMA_VERSION]
    ]
    assert run(f"SELECT group_id FROM rq_default_messages WHERE seq = {seq}") == [["after"]]
    assert run("SELECT count(*) FROM rq_default_messages WHERE group_id = 'before'") == [[0]]


def test_an_async_client_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "q.db"

    async def main() -> None:
        old = AsyncSqliteTransport(str(path))
        try:
            await old.publish("g", 1)
            with sqlite3.connect(path) as conn:
                conn.execute(
                    "UPDATE rq_default_meta SET value = value + 1 WHERE key = 'schema_version'"
                )
            with pytest.raises(SchemaError):
                await old.publish("g", 2)
            with pytest.raises(SchemaError):
                await old.settle_and_claim("w", 30, 1)
        finally:
            await old.close()

    asyncio.run(main())
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM rq_default_messages").fetchone() == (1,)


def test_a_publish_in_the_callers_own_transaction_is_refused_too(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    old = SqliteTransport(str(path))
    try:
        old.setup()
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE orders (id INTEGER)")
            conn.execute("INSERT INTO orders VALUES (1)")
            old.publish("g", 1, connection=conn)
        with sqlite3.connect(path) as conn:
            conn.execute(
                "UPDATE rq_default_meta SET value = value + 1 WHERE key = 'schema_version'"
            )
        conn = sqlite3.connect(path)
        conn.execute("INSERT INTO orders VALUES (2)")
        with pytest.raises(SchemaError):
            old.publish("g", 2, connection=conn)
        conn.rollback()
        conn.close()
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT count(*) FROM rq_default_messages").fetchone() == (1,)
    finally:
        old.close()


def test_the_fence_fails_otherwise_than_a_shard_epoch_guard() -> None:
    """A sharded client on an old shard list is told so (StaleShardList), not that the schema
    changed: the two guards fail with different errors (they once shared one, and a stale
    client was sent to re-check a schema that had not moved)."""
    names = Names.of("q")
    fence = schema.FENCE_ERROR.format(meta=names.meta)
    assert fence != STALE_EPOCH_ERROR.format(meta=names.meta)
    db = sqlite3.connect(":memory:")
    for statement in [
        *schema.bootstrap_batch(names).statements,
        *schema.create(names).statements,
    ]:
        db.execute(statement.sql, statement.params)
    db.execute(f"UPDATE {names.meta} SET value = value + 1 WHERE \"key\" = 'schema_version'")
    guard, _ = schema.fence(names, write=True)
    with pytest.raises(sqlite3.IntegrityError, match=fence):
        db.execute(guard.sql, guard.params)
