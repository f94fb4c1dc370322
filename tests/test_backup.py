"""Backup and restore (`rqlite_queue.backup`, `rqlite-queue backup` / `restore`) on real
rqlited clusters and SQLite files: the restored queue is the same queue (messages in order,
leases, parks, dead letters, schedules, dedup ids, tenants, shard epochs), a Worker drains it,
and what must be refused is refused before anything is replaced."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rqlite_queue import AsyncSqliteTransport, AsyncTransport, SqliteTransport, Transport
from rqlite_queue._io.backup_files import write_whole
from rqlite_queue._protocol.schema import SCHEMA_VERSION
from rqlite_queue.backup import backup, backup_async, restore, restore_async, shard_file
from rqlite_queue.cli import main
from rqlite_queue.errors import (
    BackendError,
    InvalidArgument,
    SchemaError,
    TargetNotEmpty,
    Unavailable,
)
from rqlite_queue.testing import Cluster
from rqlite_queue.types import Lease
from rqlite_queue.worker import Worker

MIGRATION_FIXTURES = Path(__file__).parent / "migration" / "fixtures"
TIMELESS = {"head_age", "oldest_age", "oldest_by_priority", "tokens"}
"""Fields that move with the clock between two looks (ages, a tenant's refilling tokens)."""


def fill(q: Transport, groups: list[str]) -> dict[str, Any]:
    """Every kind of state in five groups: a lease held, a parked group, a dead letter, a
    held group, a plain one; a schedule, a dedup id, a tenant with a weight, headers."""
    a, b, c, d, e = groups
    q.set_tenant("acme", weight=3)
    q.publish(a, {"n": 1}, dedup_id="first")
    q.publish_many(
        [
            {"group_id": a, "event": {"n": 2}, "headers": {"traceparent": "00-a2"}},
            (a, {"n": 3}),
            (b, {"n": 1}),
            {"group_id": c, "event": {"n": 1}, "headers": {"why": "dead"}},
        ]
    )
    q.publish_many([(d, {"n": 1}), (d, {"n": 2}), (e, {"n": 1})])
    leases: dict[str, Lease] = {}
    for _ in range(20):  # a sharded queue's claims take from either shard: until a, b, c
        lease = q.claim("w1", visibility=600)
        assert lease is not None
        if lease.group_id in (a, b, c):
            leases[lease.group_id] = lease
        else:
            q.nack(lease)
        if len(leases) == 3:
            break
    q.nack(leases[b], delay=600)  # parked
    q.dead_letter(leases[c], "bad input")
    q.hold_group(d)
    q.schedule("nightly", e, {"tick": True}, every=3600)
    return {"lease": leases[a]}


def look(q: Transport) -> dict[str, Any]:
    """What an operator sees of the queue, without the fields that move with the clock."""

    def plain(value: Any) -> dict[str, Any]:
        fields = dataclasses.fields(value)
        return {f.name: getattr(value, f.name) for f in fields if f.name not in TIMELESS}

    return {
        "stats": plain(q.stats()),
        "groups": [plain(g) for g in q.groups(limit=100)],
        "dead": [plain(d) for d in q.dead_letters()],
        "schedules": [plain(s) for s in q.schedules()],
        "tenants": [plain(t) for t in q.tenants()],
    }


def drain_in_order(q: Transport, groups: list[str], state: dict[str, Any]) -> None:
    """After the restore: the lease taken before the backup is still held (and acks), the
    dedup id still dedupes, and a Worker delivers the rest in order; the parked group waits."""
    a, b, _c, d, e = groups
    assert q.groups(state="parked")[0].group_id == b
    q.ack(state["lease"])
    depth = q.stats().depth
    assert q.publish(a, {"n": 99}, dedup_id="first") == state["lease"].seq
    assert q.stats().depth == depth
    q.release_group(d)
    seen: list[tuple[str, int]] = []
    headers: dict[tuple[str, int], dict[str, str]] = {}

    def handle(lease: Lease) -> None:
        seen.append((lease.group_id, lease.event["n"]))
        headers[seen[-1]] = dict(lease.headers)

    Worker(q, handle, visibility=10).run(handle_signals=False, until_empty=True)
    assert [n for g, n in seen if g == a] == [2, 3]
    assert headers[(a, 2)] == {"traceparent": "00-a2"} and headers[(a, 3)] == {}
    assert dict(q.dead_letters()[0].headers) == {"why": "dead"}
    assert [n for g, n in seen if g == d] == [1, 2]
    assert sorted(g for g, _ in seen) == sorted([a, a, d, d, e])
    assert q.stats().depth == 1  # b's message, parked
    assert [s.name for s in q.schedules()] == ["nightly"]


def test_rqlite_round_trip_into_a_3_node_cluster(
    rqlite_cluster_factory: Callable[..., Cluster], tmp_path: Path
) -> None:
    source, target = rqlite_cluster_factory(1), rqlite_cluster_factory(3)
    groups = ["a", "b", "c", "d", "e"]
    file = str(tmp_path / "queue.db")
    with Transport.from_url(source.url, queue="jobs") as q:
        state = fill(q, groups)
        Transport.from_url(source.url, queue="other").close()  # a second queue, empty
        seen = look(q)
        assert backup(q, file) == [file]
    assert Path(file).read_bytes()[:16] == b"SQLite format 3\x00"

    with Transport.from_url(target.url, queue="jobs") as fresh:
        fresh.stats()  # a first client made empty tables: still an empty target
    # Through a follower: the load goes to the leader, and Raft to every node.
    assert restore(target.urls[-1], file, queue="jobs") == [file]
    with Transport.from_url(target.url, queue="jobs") as q:
        assert look(q) == seen
        drain_in_order(q, groups, state)
        with pytest.raises(TargetNotEmpty, match="rq_jobs_"):
            restore(q, file)
        restore(q, file, force=True)
        assert look(q) == seen
    with Transport.from_url(target.url, queue="other") as other:
        assert other.stats().depth == 0


def test_embedded_round_trip(tmp_path: Path) -> None:
    groups = ["a", "b", "c", "d", "e"]
    file = str(tmp_path / "backup.db")
    with SqliteTransport(str(tmp_path / "live.db"), queue="jobs") as q:
        state = fill(q, groups)
        seen = look(q)
        backup(q, file)  # online: the source stays open
        q.publish("late", {"n": 1})  # after the backup: not in it
    with SqliteTransport(str(tmp_path / "restored.db"), queue="jobs") as q:
        restore(q, file)
        assert look(q) == seen
        drain_in_order(q, groups, state)


def test_embedded_restore_refuses_a_file_open_elsewhere(tmp_path: Path) -> None:
    file, live = str(tmp_path / "backup.db"), str(tmp_path / "live.db")
    with SqliteTransport(live, queue="jobs") as q:
        q.publish("g", 1)
        backup(q, file)
        with SqliteTransport(live, queue="jobs") as worker_side:
            worker_side.stats()
            with pytest.raises(Unavailable, match="open in another connection"):
                restore(q, file, force=True)
        assert q.stats().depth == 1
        q.publish("g", 2)
        restore(q, file, force=True)
        assert [event for _, event in q.peek("g")] == [1]


def test_sharded_round_trip_with_the_cli(
    rqlite_cluster_factory: Callable[..., Cluster],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    one, two = rqlite_cluster_factory(1), rqlite_cluster_factory(1)
    url = f"epoch=2;a={one.url};b={two.url}"
    file = str(tmp_path / "queue.db")
    with Transport.from_url(url, queue="jobs") as q:
        groups = [f"g{i}" for i in range(40)]
        on = {g: q.shard_of(g) for g in groups}
        picked = [g for g in groups if on[g] == "a"][:3] + [g for g in groups if on[g] == "b"][:2]
        state = fill(q, picked)
        seen = look(q)
    assert main(["--url", url, "--queue", "jobs", "backup", file]) == 0
    files = [shard_file(file, "a"), shard_file(file, "b")]
    assert files == [str(tmp_path / "queue.a.db"), str(tmp_path / "queue.b.db")]
    assert capsys.readouterr().out.splitlines()[0].startswith(f"wrote {files[0]} (")

    # The list moves on (epoch 3) and the queue changes; the restore takes both back.
    with Transport.from_url(f"epoch=3;a={one.url};b={two.url}", queue="jobs") as newer:
        newer.ack(state["lease"])
        newer.publish_many([(g, {"n": 7}) for g in groups])
        assert [s.epoch for s in newer.shard_status()] == [3, 3]
    assert main(["--url", url, "--queue", "jobs", "restore", file]) == 1
    assert "holds data a restore would replace" in capsys.readouterr().err
    assert main(["--url", url, "--queue", "jobs", "restore", file, "--force"]) == 0
    assert capsys.readouterr().out.split() == ["restored", files[0], "restored", files[1]]
    with Transport.from_url(url, queue="jobs") as q:
        assert [s.epoch for s in q.shard_status()] == [2, 2]
        assert look(q) == seen
        drain_in_order(q, picked, state)
    # One shard alone, from its own file.
    assert main(["--url", url, "--queue", "jobs", "restore", file, "--shard", "b", "--force"]) == 0
    assert capsys.readouterr().out.split() == ["restored", files[1]]


def test_what_a_restore_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    file, target = str(tmp_path / "backup.db"), str(tmp_path / "target.db")
    with SqliteTransport(str(tmp_path / "live.db"), queue="jobs") as q:
        q.publish("g", 1)
    url = f"sqlite:///{tmp_path}/live.db"
    assert main(["--url", url, "backup", file]) == 0
    with SqliteTransport(target, queue="jobs") as q:
        q.publish("g", "kept")

        def refused(path: str, error: type[Exception], match: str) -> None:
            with pytest.raises(error, match=match):
                restore(q, path, force=True)
            assert [event for _, event in q.peek("g")] == ["kept"]

        refused(str(tmp_path / "missing.db"), InvalidArgument, "No such file")
        Path(tmp_path / "text.sql").write_text("DROP TABLE rq_jobs_messages;")
        refused(str(tmp_path / "text.sql"), InvalidArgument, "not a SQLite database")
        Path(tmp_path / "backup.db.gz").write_bytes(gzip.compress(Path(file).read_bytes()))
        refused(str(tmp_path / "backup.db.gz"), InvalidArgument, "gunzip")
        truncated = tmp_path / "truncated.db"
        truncated.write_bytes(Path(file).read_bytes()[:5000])
        refused(str(truncated), InvalidArgument, "damaged|not a readable")
        sqlite3.connect(tmp_path / "empty.db").execute("CREATE TABLE t (x)").connection.close()
        refused(str(tmp_path / "empty.db"), InvalidArgument, "holds no rqlite-queue queue")
        newer = tmp_path / "newer.db"
        shutil.copy(file, newer)
        with sqlite3.connect(newer) as conn:
            conn.execute(
                "UPDATE rq_jobs_meta SET value = ? WHERE key = 'schema_version'",
                (SCHEMA_VERSION + 1,),
            )
        refused(str(newer), SchemaError, f"newer rqlite-queue.*v{SCHEMA_VERSION + 1}")
    # The CLI says the same, on one line, exit 1.
    assert main(["--url", f"sqlite:///{target}", "restore", str(newer), "--force"]) == 1
    assert capsys.readouterr().err.startswith("error: ")
    with pytest.raises(InvalidArgument, match="not sharded"):
        backup(url, file, shard="a")


def test_an_older_schema_is_upgraded_on_first_use(tmp_path: Path) -> None:
    older = tmp_path / "v4.db"
    shutil.copy(MIGRATION_FIXTURES / "v4.db", older)
    target = str(tmp_path / "target.db")
    restore(f"sqlite:///{target}", str(older), queue="default")
    with SqliteTransport(target, queue="default", clock=lambda: 1800000001.0) as q:
        assert q.stats().depth == 13
    with sqlite3.connect(target) as conn:
        version = conn.execute(
            "SELECT value FROM rq_default_meta WHERE key = 'schema_version'"
        ).fetchone()
    assert version == (SCHEMA_VERSION,)


def test_async_round_trip_on_rqlite(
    rqlite_cluster_factory: Callable[..., Cluster], tmp_path: Path
) -> None:
    """`backup_async` / `restore_async`: the aiohttp requests, on one cluster restored onto
    itself (with force) after the queue changed; then rqlite's file into an embedded queue,
    and back out of it."""
    cluster = rqlite_cluster_factory(1)
    file = str(tmp_path / "queue.db")

    async def run() -> None:
        async with await AsyncTransport.from_url(cluster.url, queue="jobs") as q:
            await q.publish_many([("g", 1), ("g", 2)])
            assert await backup_async(q, file, vacuum=True) == [file]
            lease = await q.claim("w", visibility=60)
            assert lease is not None
            await q.ack(lease)
            await q.publish("h", 3)
            with pytest.raises(TargetNotEmpty):
                await restore_async(q, file)
            await restore_async(q, file, force=True)
            assert [event for _, event in await q.peek("g")] == [1, 2]
            assert await q.peek("h") == []
        async with AsyncSqliteTransport(str(tmp_path / "embedded.db"), queue="jobs") as q:
            await restore_async(q, file)  # rqlite's file into an embedded queue
            assert [event for _, event in await q.peek("g")] == [1, 2]
            assert await backup_async(q, tmp_path / "again.db") == [str(tmp_path / "again.db")]
        with SqliteTransport(str(tmp_path / "again.db"), queue="jobs") as copy:
            assert copy.stats().depth == 2

    asyncio.run(run())


def test_a_backup_cut_short_never_replaces_a_good_one(tmp_path: Path) -> None:
    """rqlite streams a backup after its 200: a copy cut short by a failure on the leader
    reads as a success. It is checked before it is renamed onto the file."""
    file = tmp_path / "backup.db"
    with SqliteTransport(str(tmp_path / "live.db"), queue="jobs") as q:
        q.publish_many([("g", "x" * 1000) for _ in range(50)])
        backup(q, file)
    good = file.read_bytes()
    with pytest.raises(BackendError, match="not a sound database"):
        write_whole(str(file), good[: len(good) // 2])
    assert file.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []
