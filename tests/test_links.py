"""The harness's real links (`Cluster(links=...)`, toxiproxy): the nodes reach each other and the
clients reach them through the proxies, and the toxics a test sets really act on the traffic
(a round trip, a silent link, a reply broken off, a node cut off) and go away when cleared."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from rqlite_queue import AsyncTransport, Transport
from rqlite_queue.errors import OutcomeUnknown, Unavailable
from rqlite_queue.testing import Cluster, Links, ToxiproxyNotFound, find_toxiproxy, live_pids
from rqlite_queue.toxiproxy import check_toxiproxy

Make = Callable[..., Cluster]


def get(url: str, timeout: float = 5.0) -> httpx.Response:
    return httpx.get(url, timeout=timeout, trust_env=False)


def test_nodes_advertise_their_links_and_clients_use_them(rqlite_cluster_factory: Make) -> None:
    cluster = rqlite_cluster_factory(3, links=Links())
    assert cluster.links is not None
    leader = cluster.leader()
    status = leader.status()
    # Peers know each node by its Raft link, and the clients' URLs are the HTTP links.
    assert status["store"]["leader"]["addr"] == cluster.links.raft[leader.node_id].listen
    assert cluster.urls == [f"http://{cluster.links.http[n.node_id].listen}" for n in cluster.nodes]
    nodes = get(f"{cluster.urls[0]}/nodes?ver=2").json()["nodes"]
    assert {n["api_addr"] for n in nodes} == set(cluster.urls)
    with Transport.from_url(cluster.url, queue="links") as transport:
        transport.publish("g", "through the proxies")
        lease = transport.claim("w", 30)
        assert lease is not None and lease.event == "through the proxies"


def test_a_round_trip_is_added_to_each_link(rqlite_cluster_factory: Make) -> None:
    cluster = rqlite_cluster_factory(1, links=Links(rtt=0.2, jitter=0.1))
    url = cluster.urls[0]
    get(f"{url}/status")  # the connection, so that its own round trips do not count
    with httpx.Client(trust_env=False, timeout=5) as client:
        client.get(f"{url}/status")
        started = time.perf_counter()
        client.get(f"{url}/status")
        slow = time.perf_counter() - started
        assert cluster.links is not None
        cluster.links.latency(0)
        client.get(f"{url}/status")
        started = time.perf_counter()
        client.get(f"{url}/status")
        fast = time.perf_counter() - started
    assert slow >= 0.2 * 0.9  # at least the round trip less its jitter
    assert fast < slow - 0.1


def test_a_silent_link_answers_nothing_until_cleared(rqlite_cluster_factory: Make) -> None:
    cluster = rqlite_cluster_factory(1, links=Links())
    assert cluster.links is not None
    link = cluster.links.http["n1"]
    link.silent()
    with pytest.raises(httpx.ReadTimeout):
        get(f"{cluster.urls[0]}/status", timeout=0.5)
    assert cluster.nodes[0].is_ready()  # the node itself is fine: only its link is silent
    cluster.links.clear()
    assert get(f"{cluster.urls[0]}/status").status_code == 200


@pytest.mark.parametrize("keep", [0, 20, -3], ids=["whole", "in-headers", "in-body"])
def test_a_reply_cut_in_its_middle_is_counted_and_seen_as_unknown(
    rqlite_cluster_factory: Make, keep: int
) -> None:
    cluster = rqlite_cluster_factory(1, links=Links())
    assert cluster.links is not None
    link = cluster.links.http["n1"]
    with Transport.from_url(cluster.url, queue="cut", timeout=5) as transport:
        transport.publish("g", "before")  # tables made, connection open
        link.counted("cut", "downstream", every=1, keep=keep)
        with pytest.raises(OutcomeUnknown):
            transport.publish("g", "cut")
        assert link.toxic("cut_downstream")["attributes"]["cuts"] == 1
        assert link.tallied("downstream")["messages"] == 1  # the node replied once
        cluster.links.clear()
        # The write was done: the node replied; only the reply was lost.
        assert [event for _, event in transport.peek("g")] == ["before", "cut"]


@pytest.mark.parametrize("keep", [0, 20, -3], ids=["whole", "in-headers", "in-body"])
async def test_an_async_client_sees_a_cut_reply_as_unknown(
    rqlite_cluster_factory: Make, keep: int
) -> None:
    cluster = rqlite_cluster_factory(1, links=Links())
    assert cluster.links is not None
    link = cluster.links.http["n1"]
    async with await AsyncTransport.from_url(cluster.url, queue="cut", timeout=5) as transport:
        await transport.publish("g", "before")
        link.add("cut", "downstream", every=1, keep=keep)
        with pytest.raises(OutcomeUnknown):
            await transport.publish("g", "cut")
        cluster.links.clear()
        assert [event for _, event in await transport.peek("g")] == ["before", "cut"]


def test_an_isolated_leader_is_replaced_and_rejoins(rqlite_cluster_factory: Make) -> None:
    cluster = rqlite_cluster_factory(3, links=Links())
    assert cluster.links is not None
    old = cluster.leader()
    cluster.links.isolate(old.node_id)
    deadline = time.monotonic() + 15
    new = None
    while time.monotonic() < deadline:
        others = [n for n in cluster.nodes if n is not old]
        states = []
        for node in others:
            try:
                states.append(node.status()["store"]["raft"]["state"])
            except Exception:
                states.append("?")
        if "Leader" in states:
            new = others[states.index("Leader")]
            break
        time.sleep(0.05)
    assert new is not None, "no new leader among the others"
    with pytest.raises(httpx.ReadTimeout):  # its clients' link answers nothing either
        get(f"http://{cluster.links.http[old.node_id].listen}/status", timeout=0.5)
    cluster.links.clear()
    # Every node ready and one leader agreed on: the old leader has rejoined. Not always the
    # new one: the old leader's elections while cut off raised its term, and its return can
    # start one more election, which any node may win (seen once at load 8.7).
    assert cluster.wait_ready(20) is not None
    with Transport.from_url(cluster.url, queue="iso") as transport:
        transport.publish("g", "after")


def test_the_toxiproxy_is_stopped_with_its_cluster(rqlited_path: str, toxiproxy_path: str) -> None:
    before = live_pids()
    with Cluster(1, binary=rqlited_path, links=Links()) as cluster:
        assert cluster._toxiproxy is not None
        pid = cluster._toxiproxy.pid
        assert pid in live_pids()
    assert pid not in live_pids()
    assert live_pids() <= before


def test_only_this_packages_build_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "toxiproxy-server"
    fake.write_text("#!/bin/sh\necho 'toxiproxy-server version v2.5.0'\n")
    fake.chmod(0o755)
    with pytest.raises(ToxiproxyNotFound, match="this package's build"):
        check_toxiproxy(fake)
    monkeypatch.setenv("TOXIPROXY", str(fake))
    with pytest.raises(ToxiproxyNotFound, match="TOXIPROXY"):
        find_toxiproxy()
    monkeypatch.setenv("TOXIPROXY", str(tmp_path / "missing"))
    with pytest.raises(ToxiproxyNotFound, match="not an executable"):
        find_toxiproxy()


def test_the_built_server_has_the_packages_toxics(toxiproxy_path: str) -> None:
    out = subprocess.run(
        [toxiproxy_path, "-version"], capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout.startswith("toxiproxy-server version v2.5.0+rqlite-queue.")


def test_unavailable_is_what_a_refused_link_gives(rqlite_cluster_factory: Make) -> None:
    cluster = rqlite_cluster_factory(1, links=Links())
    assert cluster.links is not None
    # (the call's deadline short: a refusal after the node was reached is retried until then)
    with Transport.from_url(cluster.url, queue="refused", timeout=1.5, deadline=2) as transport:
        transport.publish("g", "x")
        cluster.links.http["n1"].disable()
        with pytest.raises(Unavailable):
            transport.peek("g")
        cluster.links.clear()
        assert transport.peek("g")


def test_the_command_prints_the_server_it_finds(toxiproxy_path: str) -> None:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "rqlite-queue"), "toxiproxy", "--no-build"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == toxiproxy_path
