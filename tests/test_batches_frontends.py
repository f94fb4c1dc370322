"""Batches in the front ends (docs/batches.md#reading-a-batch): `rqlite-queue batch ID` (its
table, `--json`, `--wait` and its exit statuses), `rqlite-queue batches`, `publish --batch`,
the dashboard's batch pages, and the metric of the batches not done. On the embedded queue,
in-process."""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rqlite_queue import AsyncSqliteTransport, SqliteTransport, Worker
from rqlite_queue.cli import main
from rqlite_queue.metrics import serve_metrics


@dataclass
class Ran:
    exit_code: int
    output: str


def run(url: str, *args: str) -> Ran:
    """The command in this process (`main`: its exit status as the console script's), its
    stdout and stderr together."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = main(["--url", url, *args])
    return Ran(status, out.getvalue())


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/q.db"


def made(url: str, *, fail: bool = False) -> str:
    """A batch of two messages (in groups of its own), one of them settled (acked, or
    dead-lettered with `fail`)."""
    tag = uuid.uuid4().hex[:6]
    with SqliteTransport(url.removeprefix("sqlite:///")) as queue:
        with queue.batch(on_complete=("reports", "done")) as batch:
            batch.publish_many([(f"a-{tag}", 1), (f"b-{tag}", 2)])
        leases = queue.claim_many("w", 30, 100)
        for other in leases:
            if other.group_id != f"a-{tag}":
                queue.nack(other)
        lease = next(lease for lease in leases if lease.group_id == f"a-{tag}")
        if fail:
            queue.dead_letter(lease, "row 1 is bad")
        else:
            queue.ack(lease)
        return batch.id


def settle_the_other(url: str, batch_id: str, *, later: float = 0.0) -> None:
    """Ack the batch's message left (after `later` seconds, in a thread)."""

    def ack() -> None:
        with SqliteTransport(url.removeprefix("sqlite:///")) as queue:
            for lease in queue.claim_many("w", 30, 100):
                if lease.batch == batch_id:
                    queue.ack(lease)
                else:
                    queue.nack(lease)

    threading.Timer(later, ack).start() if later else ack()


def test_batch_prints_a_batch_and_its_failures(url: str) -> None:
    batch_id = made(url, fail=True)
    shown = run(url, "batch", batch_id)
    assert shown.exit_code == 0, shown.output
    assert f"batch {batch_id}" in shown.output
    for field, value in (("state", "closed"), ("total", "2"), ("pending", "1"), ("failed", "1")):
        assert re.search(rf"\b{field}\s+│?\s*{value}\b", shown.output), (field, shown.output)
    assert "row 1 is bad" in shown.output
    data = json.loads(run(url, "batch", batch_id, "--json").output)
    assert (data["id"], data["state"], data["failed"], data["pending"]) == (
        batch_id,
        "closed",
        1,
        1,
    )
    assert data["failures"][0]["reason"] == "row 1 is bad"


def test_batch_wait_says_how_it_ended(url: str) -> None:
    failed = made(url, fail=True)
    assert run(url, "batch", failed, "--wait", "0.2").exit_code == 124
    settle_the_other(url, failed, later=0.3)
    waited = run(url, "batch", failed, "--wait", "10")
    assert waited.exit_code == 1, waited.output  # done, with a failure
    ok = made(url)
    settle_the_other(url, ok)
    assert run(url, "batch", ok, "--wait").exit_code == 0


def test_batch_of_an_unknown_id_fails(url: str) -> None:
    batch_id = made(url)
    unknown = batch_id[:-4] + ("0000" if not batch_id.endswith("0000") else "0001")
    shown = run(url, "batch", unknown)
    assert shown.exit_code == 1 and "not known" in shown.output
    assert run(url, "batch", "not-an-id").exit_code == 1


def test_batches_lists_them_and_publish_joins_one(url: str) -> None:
    first, second = made(url), made(url)
    listed = run(url, "batches", "--json")
    assert [json.loads(line)["id"] for line in listed.output.splitlines()] == [first, second]
    closed = run(url, "batches", "--state", "closed", "--json").output.splitlines()
    assert [json.loads(line)["id"] for line in closed] == [first, second]
    assert "2 batches" in run(url, "batches").output
    joined = run(url, "publish", "c", '{"n": 3}', "--batch", first)
    assert joined.exit_code == 0, joined.output
    with SqliteTransport(url.removeprefix("sqlite:///")) as queue:
        status = queue.batch_status(first)
        assert status is not None and status.total == 3


async def test_the_dashboard_shows_a_batch_and_lists_those_not_done(tmp_path: Path) -> None:
    pytest.importorskip("starlette", reason="the dashboard extra is not installed")
    from rqlite_queue.dashboard import create_app

    transport = AsyncSqliteTransport(str(tmp_path / "d.db"))
    await transport.setup()
    async with transport.batch(on_complete=("reports", 1)) as batch:
        batch.publish_many([("a", 1), ("b", 2), ("c", 3)])
    lease = await transport.claim("w", 30)
    assert lease is not None
    await transport.dead_letter(lease, "card <declined>")
    app = create_app(transport)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")  # type: ignore[arg-type]
    async with http:
        page = (await http.get("/batch", params={"id": batch.id})).text
        listing = (await http.get("/batches")).text
        fragment = (await http.get("/fragments/batches", params={"state": "done"})).text
        other = batch.id[:-1] + ("e" if batch.id.endswith("f") else "f")
        unknown = (await http.get("/batch", params={"id": other})).text
    await transport.close()
    assert 'data-field="state">closed<' in page and 'data-field="failed">1<' in page
    assert 'data-field="pending">2<' in page and "card &lt;declined&gt;" in page
    assert f'data-batch="{batch.id}"' in listing
    assert "No batch is done." in fragment
    assert "does not know this batch" in unknown


def test_the_open_batches_metric(tmp_path: Path) -> None:
    with SqliteTransport(str(tmp_path / "m.db")) as queue:
        for _ in range(2):
            with queue.batch() as batch:
                batch.publish("a", 1)
        worker = Worker(queue, lambda lease: None, poll_interval=0.02)
        with serve_metrics(worker, 0, host="127.0.0.1", stats_interval=0) as server:
            text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text
            assert 'rqlite_queue_open_batches{queue="default"} 2.0' in text
            worker.run(handle_signals=False, until_empty=True)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5).text
                if 'rqlite_queue_open_batches{queue="default"} 0.0' in text:
                    break
            assert 'rqlite_queue_open_batches{queue="default"} 0.0' in text
