"""rqlite_queue.kombu through kombu's own API, on the embedded file: what its mapping promises
beyond kombu's suite (leases of held messages extended, per-key exclusivity across
connections, eta as a delayed message, reject as a dead letter, a killed consumer's messages
coming back)."""

from __future__ import annotations

import time
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

kombu = pytest.importorskip("kombu")

import rqlite_queue.kombu  # noqa: E402
from rqlite_queue import from_url  # noqa: E402


def connection(url: str, visibility: float = 1.0) -> object:
    return kombu.Connection(
        f"rqlite+{url}",
        transport_options={"visibility_timeout": visibility, "polling_interval": 0.01},
    )


def test_a_held_message_keeps_its_lease_and_its_key_stays_exclusive(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/b.db"
    with (
        connection(url) as holder,
        connection(url) as other,
        closing(holder.SimpleQueue("q")) as mine,
        closing(other.SimpleQueue("q")) as theirs,
    ):
        mine.put({"n": 1}, MessageGroupId="k")
        mine.put({"n": 2}, MessageGroupId="k")
        first = mine.get(timeout=2)
        assert first.payload == {"n": 1}
        mine.put({"n": 3})
        # Held 3.5 visibilities: its lease is extended, so neither it nor the next of its
        # key is delivered elsewhere; the unkeyed one is.
        deadline = time.monotonic() + 3.5
        seen = []
        while time.monotonic() < deadline:
            try:
                message = theirs.get_nowait()
            except theirs.Empty:
                time.sleep(0.1)
                continue
            seen.append(message.payload)
            message.ack()
        assert seen == [{"n": 3}]
        first.ack()
        second = theirs.get(timeout=3)
        assert second.payload == {"n": 2} and not second.delivery_info["redelivered"]
        second.ack()
    queue = from_url(url, queue="q")
    try:
        assert queue.stats().depth == 0
    finally:
        queue.close()


def test_a_dead_consumers_message_comes_back_redelivered(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/b.db"
    dead = connection(url)
    queue = dead.SimpleQueue("q")
    queue.put({"n": 1})
    assert queue.get(timeout=2).payload == {"n": 1}
    # A crash: the channel's keeper stops and nothing is given back (no close).
    queue.channel._stop.set()
    with connection(url) as alive, closing(alive.SimpleQueue("q")) as again:
        with pytest.raises(again.Empty):
            again.get_nowait()
        message = again.get(timeout=5)  # after the lease (1 s) lapsed
        assert message.payload == {"n": 1} and message.delivery_info["redelivered"]
        message.ack()


def test_eta_is_a_delayed_message_and_reject_a_dead_letter(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/b.db"
    eta = (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat()
    with connection(url) as conn, closing(conn.SimpleQueue("q")) as q:
        q.put({"n": 1}, headers={"eta": eta})
        with pytest.raises(q.Empty):
            q.get(timeout=0.8)
        message = q.get(timeout=3)
        assert message.payload == {"n": 1}
        message.reject(requeue=False)
        with pytest.raises(q.Empty):
            q.get(timeout=0.3)
    queue = from_url(url, queue="q")
    try:
        assert [(d.reason, d.event["headers"]["eta"]) for d in queue.dead_letters()] == [
            ("rejected", eta)
        ]
    finally:
        queue.close()


def test_url_spellings() -> None:
    assert rqlite_queue.kombu.queue_name("celery") == "celery"
    assert rqlite_queue.kombu.queue_name("Celery.pidbox").startswith("celery_pidbox_")
    with pytest.raises(ValueError, match="Invalid transport scheme"):
        kombu.Connection("rqlite.queue://127.0.0.1:4001")
    with pytest.raises(KeyError, match="No such transport: "):
        kombu.Connection("rqlite_queue.kombu:Transport://127.0.0.1:4001").connect()
    conn = kombu.Connection("rqlite://10.0.0.1:4001;rqlite://10.0.0.2:4002")
    assert conn.transport.url == "http://10.0.0.1:4001,http://10.0.0.2:4002"
    conn = kombu.Connection("rqlites://u:p@10.0.0.1:4001")
    assert conn.transport.url == "https://10.0.0.1:4001"
    assert conn.transport._options()["auth"] == ("u", "p")
    conn = kombu.Connection("http://10.0.0.1:4001", transport="rqlite_queue.kombu:Transport")
    assert conn.transport.url == "http://10.0.0.1:4001"
