"""The rqlite nodes behind a transport, as the dashboard shows them: which answer, which one
leads, how far each has applied the Raft log. Read from rqlite's `/nodes` (the cluster's view,
asked of the first node that answers) and each node's `/status`."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._async.sharded import AsyncShardedTransport
from .._async.transport import AsyncRqliteTransport, AsyncTransport
from ..http_async import AiohttpClient

STATUS_TIMEOUT = 1.0


@dataclass(frozen=True, slots=True)
class NodeView:
    node_id: str
    api_addr: str
    reachable: bool
    leader: bool
    applied_index: int | None
    """The last Raft log entry this node has applied (None: unknown, it did not answer)."""


def parse_nodes(reply: Any) -> list[tuple[str, str, bool, bool]]:
    """(id, API address, reachable, leader) per node, from `/nodes` (v8's object keyed by node
    id, or the `{"nodes": [...]}` list of `?ver=2`), sorted by id."""
    if isinstance(reply, Mapping) and isinstance(reply.get("nodes"), list):
        entries = [(str(e.get("id", "")), e) for e in reply["nodes"] if isinstance(e, Mapping)]
    elif isinstance(reply, Mapping):
        entries = [(str(k), e) for k, e in reply.items() if isinstance(e, Mapping)]
    else:
        return []
    return sorted(
        (node_id, str(e.get("api_addr", "")), bool(e.get("reachable")), bool(e.get("leader")))
        for node_id, e in entries
    )


def applied_index(status: Any) -> int | None:
    try:
        return int(status["store"]["raft"]["applied_index"])
    except (KeyError, TypeError, ValueError):
        return None


async def cluster_nodes(transport: AsyncTransport) -> list[NodeView]:
    """Empty for the embedded SQLite backend. A sharded queue's nodes are each shard's, named
    `shard/node`."""
    if isinstance(transport, AsyncShardedTransport):
        per_shard = await asyncio.gather(
            *(cluster_nodes(transport.shard(name)) for name in transport.names)
        )
        return [
            dataclasses.replace(node, node_id=f"{name}/{node.node_id}")
            for name, nodes in zip(transport.names, per_shard, strict=True)
            for node in nodes
        ]
    if not isinstance(transport, AsyncRqliteTransport):
        return []
    client = transport.client
    nodes: list[tuple[str, str, bool, bool]] = []
    for url in client.endpoints.urls:
        nodes = parse_nodes(await client.get_json(url, "/nodes?nonvoters", STATUS_TIMEOUT))
        if nodes:
            break
    if not nodes:  # no node answered: show the configured ones as unreachable
        return [NodeView(url, url, False, False, None) for url in client.endpoints.urls]
    indexes = await asyncio.gather(*(_applied(client, addr) for _, addr, _, _ in nodes))
    return [
        NodeView(node_id, addr, reachable, leader, index)
        for (node_id, addr, reachable, leader), index in zip(nodes, indexes, strict=True)
    ]


async def _applied(client: AiohttpClient, api_addr: str) -> int | None:
    if not api_addr.startswith(("http://", "https://")):
        return None
    return applied_index(await client.get_json(api_addr, "/status", STATUS_TIMEOUT))
