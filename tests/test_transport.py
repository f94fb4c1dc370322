"""Transport-level promises: one HTTP request per operation, schema versions, from_url, the
generated sync code."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from rqlite_queue import (
    AsyncRqliteTransport,
    AsyncTransport,
    InvalidArgument,
    RqliteTransport,
    SqliteTransport,
    Transport,
    Unavailable,
)
from rqlite_queue._protocol import round_spec, rounds
from rqlite_queue._protocol.http import parse_endpoints
from rqlite_queue._protocol.plan import Batch, Statement
from rqlite_queue._protocol.round_spec import RoundSpec
from rqlite_queue.errors import BackendError, SchemaError
from rqlite_queue.testing import Cluster, Links, Node, free_port

ROOT = Path(__file__).resolve().parent.parent


def fresh_queue() -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def test_every_operation_is_one_http_request(rqlite_cluster3: Cluster) -> None:
    url = rqlite_cluster3.followers()[0].http_url  # a follower forwards; still one request from us
    q = RqliteTransport(url, queue=fresh_queue())
    q.setup()

    def requests(call: Any) -> int:
        before = q.client.requests
        call()
        return q.client.requests - before

    assert requests(lambda: q.publish("g", 1)) == 1
    assert requests(lambda: q.publish("g", 2, dedup_id="d")) == 1
    assert requests(lambda: q.publish_many([("h", i) for i in range(1000)])) == 1
    leases: list[Any] = []
    assert requests(lambda: leases.append(q.claim("w", 30))) == 1
    assert requests(lambda: leases.append(q.extend(leases[-1], 30))) == 1
    assert requests(lambda: q.nack(leases[-1])) == 1
    assert requests(lambda: leases.append(q.claim("w", 30))) == 1
    assert requests(lambda: q.ack(leases[-1])) == 1
    assert requests(lambda: leases.extend(q.claim_many("w", 30, 2))) == 1
    assert requests(lambda: q.ack_many(leases[-2:])) == 1
    assert requests(lambda: leases.append(q.claim("w", 30))) == 1
    assert requests(lambda: q.dead_letter(leases[-1], "why")) == 1
    assert requests(lambda: q.settle_and_claim("w", 30, 5, ack=leases[2:3])) == 1
    assert requests(lambda: q.stats()) == 1
    assert requests(lambda: q.probe()) == 1
    assert requests(lambda: q.claim("w", 30, min_priority=4)) == 1  # a write: found nothing
    # After a claim that found nothing, a claim only reads (no write) while nothing is there.
    assert requests(lambda: q.claim("w", 30, min_priority=4)) == 1
    # Operators' calls.
    assert requests(lambda: q.groups(state="ready", prefix="h", limit=10)) == 1
    assert requests(lambda: q.hold_group("h1")) == 1
    assert requests(lambda: q.release_group("h1")) == 1
    assert requests(lambda: q.set_priority("h2", 3)) == 1
    assert requests(lambda: q.cancel_group("h3", "why")) == 1
    assert requests(lambda: q.pause()) == 1
    assert requests(lambda: q.resume()) == 1
    assert requests(lambda: q.dead_letters()) == 1
    assert requests(lambda: q.requeue_dead()) == 1
    assert requests(lambda: q.purge_dead()) == 1
    assert requests(lambda: q.peek("h4")) == 1
    q.close()


@pytest.mark.parametrize("tenants", [False, True])
def test_rqlite_keeps_the_rows_of_the_claims_returning_form(
    rqlite_cluster3: Cluster, tenants: bool
) -> None:
    """A claim without a priority floor, settling at most one lease, reads its leases from its
    own `UPDATE ... RETURNING`. rqlite keeps those rows only for statements its SQL parser
    takes (an unquoted `key` column, an `UPDATE t AS g` were not); when it drops them the
    transport falls back to a resend, correct but one more request: none must happen here,
    in plain round-robin or sharing between tenants within their limits."""
    url = rqlite_cluster3.followers()[0].http_url
    q = RqliteTransport(url, queue=fresh_queue())
    if tenants:
        q.set_tenant("", weight=2, rate=100, max_in_flight=5)
    q.publish_many([("a", 1), ("b", 2), ("a", 3)])
    core = q.router.backend.core
    spec = RoundSpec(worker_id="w", visibility=30, n=1)
    plan = rounds.plan(core, round_spec.check(core, spec), tenants)
    assert plan.batch.returning  # the form under test
    first = q.settle_and_claim("w", 30, 1)
    assert [(lease.group_id, lease.event, lease.attempts) for lease in first.leases] == [
        ("a", 1, 1)
    ]
    second = q.settle_and_claim("w", 30, 1, ack=first.leases)
    assert [(lease.group_id, lease.event) for lease in second.leases] == [("b", 2)]
    third = q.settle_and_claim("w", 30, 1, ack=second.leases)
    assert [(lease.group_id, lease.event) for lease in third.leases] == [("a", 3)]
    assert q.settle_and_claim("w", 30, 1, ack=third.leases).leases == []
    assert q.resent == 0
    assert q.stats().depth == 0
    q.close()


def test_an_idle_claim_does_not_write_to_raft(rqlite_cluster3: Cluster) -> None:
    q = RqliteTransport(rqlite_cluster3.url, queue=fresh_queue())
    q.setup()
    assert q.claim("w", 30) is None  # one write, finding nothing
    leader = rqlite_cluster3.leader()
    before = leader.status()["store"]["raft"]["last_log_index"]
    for _ in range(20):
        assert q.claim("w", 30) is None
    assert leader.status()["store"]["raft"]["last_log_index"] == before
    q.publish("g", 1)
    lease = q.claim("w", 30)  # a read finds it, then the write takes it
    assert lease is not None and lease.event == 1
    q.close()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "q.db")
    q = SqliteTransport(path, queue="v")
    q.setup()
    q.router.backend.executor.execute(  # what a future version of the library would have written
        Batch((Statement("UPDATE rq_v_meta SET value = 99 WHERE key = 'schema_version'"),)),
        time.monotonic() + 10,
    )
    q.close()
    with pytest.raises(SchemaError, match="99"):
        SqliteTransport(path, queue="v").setup()
    with pytest.raises(SchemaError):
        Transport.from_url(f"sqlite:///{path}", queue="v")


def test_setup_is_idempotent_and_safe_from_several_clients(tmp_path: Path) -> None:
    path = str(tmp_path / "q.db")
    clients = [SqliteTransport(path) for _ in range(3)]
    for client in clients + clients:
        client.setup()
    clients[0].publish("g", 1)
    assert clients[2].stats().depth == 1
    for client in clients:
        client.close()


@pytest.fixture(scope="module")
def first_node_cut(rqlited_path: str, toxiproxy_path: str) -> Any:
    """A 3-node cluster whose first node (the one a client tries first) does every request
    it is sent but has its reply cut off in the middle, as a leader does that loses its place
    while committing ("leadership lost while committing log"): for a write, its outcome is
    unknown to the client."""
    with Cluster(3, binary=rqlited_path, links=Links()) as cluster:
        assert cluster.links is not None
        cluster.links.http["n1"].add("cut", "downstream", every=1, keep=20)
        yield cluster


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_setup_whose_reply_is_lost_is_sent_again(
    first_node_cut: Cluster, flavour: str
) -> None:
    """The first setup of a queue (create the tables if missing, read what is there: the
    same effect however many times it applies) goes on to another node after a lost reply,
    within its deadline, rather than raising `OutcomeUnknown` to the caller."""
    queue = fresh_queue()
    link = first_node_cut.links.http["n1"]  # type: ignore[union-attr]
    cuts = link.toxic("cut_downstream")["attributes"]["cuts"]
    if flavour == "sync":
        with RqliteTransport(first_node_cut.url, queue=queue, deadline=20) as sync:
            sync.setup()
            sync.publish("g", 1)
            assert sync.stats().depth == 1
    else:
        async with AsyncRqliteTransport(first_node_cut.url, queue=queue, deadline=20) as q:
            await q.setup()
            await q.publish("g", 1)
            assert (await q.stats()).depth == 1
    assert link.toxic("cut_downstream")["attributes"]["cuts"] > cuts, "no reply was cut"


@pytest.mark.parametrize(
    "url", ["redis://localhost:6379", "ftp://x", "localhost:4001", "sqlite://", "http://"]
)
def test_from_url_refuses_unknown_or_malformed_urls(url: str) -> None:
    with pytest.raises(InvalidArgument):
        Transport.from_url(url, connect_timeout=0.1)


def test_from_url_waits_then_raises_unavailable_when_nothing_listens() -> None:
    start = time.monotonic()
    with pytest.raises(Unavailable, match=r"not available after 1\.5s") as error:
        Transport.from_url(f"http://alice:pw@127.0.0.1:{free_port()}", connect_timeout=1.5)
    assert 1.4 < time.monotonic() - start < 4  # connect_timeout, not the 15 s op deadline
    assert "pw" not in str(error.value)  # the password is not in the message


def test_from_url_waits_for_a_node_that_starts_late(rqlited_path: str, tmp_path: Path) -> None:
    node = Node("late", str(tmp_path / "data"), binary=rqlited_path, http_port=free_port())
    starter = threading.Timer(1.0, node.start)
    starter.start()
    try:
        q = Transport.from_url(node.http_url, connect_timeout=30)
        q.publish("g", 1)
        assert q.stats().depth == 1
        q.close()
    finally:
        starter.join()
        node.stop()


async def test_async_from_url_and_context_manager(rqlite_cluster: Cluster) -> None:
    async with await AsyncTransport.from_url(rqlite_cluster.url, queue=fresh_queue()) as q:
        assert isinstance(q, AsyncRqliteTransport)
        await q.publish("g", {"x": 1})
        lease = await q.claim("w", 30)
        assert lease is not None and lease.event == {"x": 1}
        await q.ack(lease)


def test_sync_context_manager_closes(tmp_path: Path) -> None:
    with Transport.from_url(f"sqlite:///{tmp_path}/q.db") as q:
        q.publish("g", 1)
    with pytest.raises(Exception):  # noqa: B017 - closed: any use fails
        q.publish("g", 2)


def test_malformed_rqlite_urls_are_typed_errors(rqlite_cluster: Cluster) -> None:
    q = RqliteTransport(rqlite_cluster.url + "/", queue=fresh_queue())  # a trailing slash is fine
    q.setup()
    q.close()
    for url in ("http://[bad", "http://127.0.0.1:notaport", "http://,"):
        with pytest.raises(InvalidArgument):
            RqliteTransport(url, queue=fresh_queue())


def test_generated_sync_code_is_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_sync.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def test_a_dead_node_in_the_list_is_skipped(rqlite_cluster3: Cluster) -> None:
    url = f"http://127.0.0.1:{free_port()}," + rqlite_cluster3.url
    with RqliteTransport(url, queue=fresh_queue()) as q:
        q.publish("g", 1)
        lease = q.claim("w", 30)
        assert lease is not None
        q.ack(lease)


@pytest.mark.parametrize(
    ("url", "urls", "auth"),
    [
        ("http://a:1", ("http://a:1",), None),
        ("http://a:1,b:2", ("http://a:1", "http://b:2"), None),
        ("http://a:1,http://b:2/", ("http://a:1", "http://b:2"), None),
        ("https://u:p%40ss@a:1,b:2", ("https://a:1", "https://b:2"), ("u", "p@ss")),
    ],
)
def test_endpoint_parsing(url: str, urls: tuple[str, ...], auth: Any) -> None:
    endpoints = parse_endpoints(url)
    assert (endpoints.urls, endpoints.auth) == (urls, auth)


@pytest.mark.parametrize("url", ["http://a:1,https://b:2", "http://a:x", "http://@", "mailto:x"])
def test_bad_endpoints(url: str) -> None:
    with pytest.raises(InvalidArgument):
        parse_endpoints(url)


def test_a_server_that_is_not_rqlite_gives_a_clear_error() -> None:
    """Something else answers on the port (a proxy's error page, a web server)."""
    import http.server

    class NotRqlite(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = b"<html>502 Bad Gateway</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotRqlite)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(BackendError, match="not JSON"):
            Transport.from_url(url, connect_timeout=2)
    finally:
        server.shutdown()
        server.server_close()
