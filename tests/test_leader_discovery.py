"""After a node fails to answer, the client goes on to the node that says it leads (issue 34).

A client on a follower whose leader is cut off waits its attempt out (the follower holds the
request it forwards), then used to move on to the next node of its URL, which may be the very
leader that was cut off: a second, longer attempt lost there, and acks 2.6-3.7 s after a new
leader existed in the link-fault suite. Here the URL puts the isolated leader right after the
follower, so the blind choice is the wrong one every time: the client must ask the nodes
(`_protocol.http.Discover`) and send its next attempt to the new leader. (A client starts on
the leader, which it asks for at its first use; one that was moved to a follower by an earlier
failover is put there by hand.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rqlite_queue import AsyncTransport, Transport
from rqlite_queue._protocol.http import Send
from rqlite_queue.testing import Cluster, Links

Make = Callable[..., Cluster]


def _on_a_follower(cluster: Cluster) -> tuple[str, int, list[int]]:
    """The URL (a follower, the leader, the other follower) and where the leader is in it."""
    leader = cluster.leader()
    followers = [n for n in cluster.nodes if n is not leader]
    order = [followers[0], leader, followers[1]]
    urls = [cluster.urls[cluster.nodes.index(n)] for n in order]
    return ",".join(urls), 1, [cluster.nodes.index(n) for n in order]


def _record(client: Any, sent: list[int]) -> None:
    """Note the node of each request the client sends (a wrapper of its own `_post`)."""
    post = client._post

    def recorded(send: Send, path: str, body: bytes) -> Any:
        sent.append(send.node)
        return post(send, path, body)

    client._post = recorded


def test_a_write_after_its_leader_is_cut_off_goes_to_the_new_leader(
    rqlite_cluster_factory: Make,
) -> None:
    cluster = rqlite_cluster_factory(3, links=Links(rtt=0.001))
    assert cluster.links is not None
    url, isolated, order = _on_a_follower(cluster)
    old = cluster.nodes[order[isolated]]
    with Transport.from_url(url, queue="discovery") as transport:
        transport.publish("g", "before", dedup_id="before")
        client = transport.router.cluster.executor  # type: ignore[union-attr]
        assert client.nodes.current == isolated  # it started on the leader
        client.nodes.current = 0  # (moved to a follower by an earlier failover)
        sent: list[int] = []
        _record(client, sent)
        cluster.links.isolate(old.node_id)
        transport.publish("g", "during", dedup_id="during")  # resent after the lost reply
        new = cluster.leader(timeout=10)
        assert new is not old
        assert isolated not in sent, f"a request went to the isolated leader: {sent}"
        assert sent[0] == 0 and order[client.nodes.current] == cluster.nodes.index(new)
        cluster.links.clear()
        assert [event for _, event in transport.peek("g")] == ["before", "during"]


async def test_an_async_write_after_its_leader_is_cut_off_goes_to_the_new_leader(
    rqlite_cluster_factory: Make,
) -> None:
    cluster = rqlite_cluster_factory(3, links=Links(rtt=0.001))
    assert cluster.links is not None
    url, isolated, order = _on_a_follower(cluster)
    old = cluster.nodes[order[isolated]]
    async with await AsyncTransport.from_url(url, queue="discovery") as transport:
        await transport.publish("g", "before", dedup_id="before")
        client = transport.router.cluster.executor  # type: ignore[union-attr]
        assert client.nodes.current == isolated  # it started on the leader
        client.nodes.current = 0  # (moved to a follower by an earlier failover)
        sent: list[int] = []
        post = client._post

        async def recorded(send: Send, path: str, body: bytes) -> Any:
            sent.append(send.node)
            return await post(send, path, body)

        client._post = recorded
        cluster.links.isolate(old.node_id)
        await transport.publish("g", "during", dedup_id="during")
        new = cluster.leader(timeout=10)
        assert isolated not in sent, f"a request went to the isolated leader: {sent}"
        assert order[client.nodes.current] == cluster.nodes.index(new)
        cluster.links.clear()
        assert [event for _, event in await transport.peek("g")] == ["before", "during"]
