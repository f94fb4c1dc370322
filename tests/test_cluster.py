"""Tests of the cluster harness against real rqlited processes (no mocks).

Fault tests (kill, pause, restart) use their own clusters from `rqlite_cluster_factory`, never
the shared session clusters.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rqlite_queue.testing import (
    Cluster,
    Node,
    NodeStartError,
    PortInUse,
    live_pids,
)

REPLICATION_TIMEOUT = 10.0


def table_name() -> str:
    """A table name no other test uses, so tests can share the session clusters."""
    return f"t_{uuid.uuid4().hex[:12]}"


def execute(node: Node, statements: list[list[Any]], timeout: float = 5.0) -> dict[str, Any]:
    """POST /db/execute; raise unless every statement succeeded."""
    r = httpx.post(f"{node.http_url}/db/execute", json=statements, timeout=timeout, trust_env=False)
    r.raise_for_status()
    body: dict[str, Any] = r.json()
    errors = [res["error"] for res in body["results"] if "error" in res]
    if errors or "error" in body:
        raise RuntimeError(f"execute on {node.node_id} failed: {errors or body['error']}")
    return body


def query_local(node: Node, sql: str) -> list[list[Any]]:
    """Rows of `sql` read from this node's own copy (level=none: no leader round-trip)."""
    r = httpx.post(
        f"{node.http_url}/db/query",
        params={"level": "none"},
        json=[[sql]],
        timeout=5.0,
        trust_env=False,
    )
    r.raise_for_status()
    result = r.json()["results"][0]
    if "error" in result:
        raise RuntimeError(result["error"])
    rows: list[list[Any]] = result.get("values", [])
    return rows


def wait_for(
    predicate: Callable[[], bool], timeout: float = REPLICATION_TIMEOUT, what: str = ""
) -> float:
    """Poll `predicate` until true; return the time it took. Errors count as not-yet."""
    start = time.monotonic()
    while True:
        try:
            if predicate():
                return time.monotonic() - start
        except (httpx.HTTPError, RuntimeError, KeyError):
            pass
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def wait_rows(node: Node, table: str, expected: list[list[Any]]) -> float:
    sql = f"SELECT id, v FROM {table} ORDER BY id"
    return wait_for(
        lambda: query_local(node, sql) == expected, what=f"{node.node_id} to have {expected}"
    )


def create_table(node: Node, table: str) -> None:
    execute(node, [[f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, v TEXT)"]])


# ---------------------------------------------------------------------------------------------
# Healthy cluster (shared session cluster)


def test_three_nodes_elect_one_leader(rqlite_cluster3: Cluster) -> None:
    leader = rqlite_cluster3.leader()
    followers = rqlite_cluster3.followers()
    assert leader in rqlite_cluster3.nodes
    assert len(followers) == 2
    assert leader not in followers
    assert {leader, *followers} == set(rqlite_cluster3.nodes)
    assert {n.node_id for n in rqlite_cluster3.nodes} == {"n1", "n2", "n3"}
    # Every node agrees, via rqlite's own view of the cluster.
    for node in rqlite_cluster3.nodes:
        assert node.status()["store"]["leader"]["node_id"] == leader.node_id
        assert node.is_ready()


def test_addresses(rqlite_cluster3: Cluster) -> None:
    assert rqlite_cluster3.urls == [n.http_url for n in rqlite_cluster3.nodes]
    assert rqlite_cluster3.url == ",".join(rqlite_cluster3.urls)
    assert all(u.startswith("http://127.0.0.1:") for u in rqlite_cluster3.urls)
    ports = {n.http_port for n in rqlite_cluster3.nodes} | {
        n.raft_port for n in rqlite_cluster3.nodes
    }
    assert len(ports) == 6
    nodes = httpx.get(f"{rqlite_cluster3.nodes[0].http_url}/nodes?ver=2", trust_env=False).json()
    by_id = {n["id"]: n for n in nodes["nodes"]}
    for node in rqlite_cluster3.nodes:
        assert by_id[node.node_id]["api_addr"] == node.http_url
        assert by_id[node.node_id]["addr"] == node.raft_addr


def test_single_node_cluster(rqlite_cluster: Cluster) -> None:
    assert rqlite_cluster.leader() is rqlite_cluster.nodes[0]
    assert rqlite_cluster.followers() == []
    table = table_name()
    create_table(rqlite_cluster.nodes[0], table)
    execute(rqlite_cluster.nodes[0], [[f"INSERT INTO {table} (id, v) VALUES (?, ?)", 1, "a"]])
    assert query_local(rqlite_cluster.nodes[0], f"SELECT id, v FROM {table}") == [[1, "a"]]


def test_write_to_follower_replicates_everywhere(rqlite_cluster3: Cluster) -> None:
    follower = rqlite_cluster3.followers()[0]
    table = table_name()
    execute(
        follower,
        [
            [f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, v TEXT)"],
            [f"INSERT INTO {table} (id, v) VALUES (?, ?)", 1, "from-follower"],
        ],
    )
    for node in rqlite_cluster3.nodes:
        wait_rows(node, table, [[1, "from-follower"]])


# ---------------------------------------------------------------------------------------------
# Faults (private clusters)


def test_leader_kill_failover_and_restart(rqlite_cluster_factory: Callable[..., Cluster]) -> None:
    cluster = rqlite_cluster_factory(3)
    old = cluster.leader()
    table = table_name()
    create_table(old, table)
    execute(old, [[f"INSERT INTO {table} (id, v) VALUES (?, ?)", 1, "before"]])

    old.kill()
    killed_at = time.monotonic()
    assert not old.is_running
    assert old.process is not None and old.process.returncode is not None
    survivors = [n for n in cluster.nodes if n is not old]

    def write_succeeds() -> bool:
        execute(survivors[0], [[f"INSERT OR REPLACE INTO {table} (id, v) VALUES (2, 'after')"]])
        return True

    wait_for(write_succeeds, timeout=10.0, what="a write after the leader was killed")
    failover = time.monotonic() - killed_at
    new = cluster.leader()
    assert new in survivors
    assert failover < 10.0, f"failover took {failover:.2f}s"
    print(f"failover to {new.node_id} serving writes in {failover:.2f}s")

    # Same data dir and ports: the node rejoins from its own Raft state and catches up.
    ports = (old.http_port, old.raft_port)
    old.restart()
    assert (old.http_port, old.raft_port) == ports
    execute(new, [[f"INSERT INTO {table} (id, v) VALUES (?, ?)", 3, "after-restart"]])
    took = wait_rows(old, table, [[1, "before"], [2, "after"], [3, "after-restart"]])
    print(f"restarted {old.node_id} caught up in {took:.2f}s")
    cluster.wait_ready()
    assert old in cluster.followers()


def test_paused_follower_catches_up(rqlite_cluster_factory: Callable[..., Cluster]) -> None:
    cluster = rqlite_cluster_factory(3)
    leader = cluster.leader()
    follower = cluster.followers()[0]
    table = table_name()
    create_table(leader, table)
    wait_rows(follower, table, [])

    follower.pause()
    try:
        assert follower.is_running and follower.paused
        # A majority (leader + the other follower) remains: writes still commit.
        for i in range(1, 6):
            execute(leader, [[f"INSERT INTO {table} (id, v) VALUES (?, ?)", i, f"p{i}"]])
        assert cluster.leader() is leader
    finally:
        follower.resume()
    assert not follower.paused
    took = wait_rows(follower, table, [[i, f"p{i}"] for i in range(1, 6)])
    print(f"resumed {follower.node_id} caught up in {took:.2f}s")
    cluster.wait_ready()


# ---------------------------------------------------------------------------------------------
# No leaks, start failures, binary lookup


def test_stop_leaves_no_process(rqlited_path: str) -> None:
    before = live_pids()
    cluster = Cluster(3, binary=rqlited_path)
    with cluster:
        procs = [n.process for n in cluster.nodes]
        pids = {p.pid for p in procs if p is not None}
        assert len(pids) == 3
        assert pids <= live_pids()
        assert cluster.dir is not None and cluster.dir.is_dir()
        # Leave the nodes in awkward states: stop() must still end them all.
        cluster.followers()[0].pause()
        cluster.followers()[1].kill()
    cluster.stop()  # idempotent
    assert live_pids() == before
    assert live_pids().isdisjoint(pids)
    for proc in procs:
        assert proc is not None and proc.returncode is not None
    assert not cluster.dir.exists()


def test_failed_start_stops_what_it_started(rqlited_path: str, tmp_path: Path) -> None:
    before = live_pids()
    # hashicorp/raft refuses a leader lease longer than the heartbeat timeout (200ms when fast);
    # the later flag wins, so node 1 starts its HTTP server and then exits at store open.
    cluster = Cluster(
        3,
        binary=rqlited_path,
        base_dir=tmp_path,
        extra_args=("-raft-leader-lease-timeout", "300ms"),
    )
    with pytest.raises(NodeStartError) as raised:
        cluster.start(timeout=10)
    # The first line says why, in rqlited's words (a fixture's error, `cluster up`, the demo).
    first = str(raised.value).splitlines()[0]
    assert first.startswith("rqlited n1 exited with code 1")
    assert ": failed to open store: creating the raft system failed: " in first
    assert "LeaderLeaseTimeout (300ms) cannot be larger than heartbeat timeout" in first
    assert live_pids() == before
    assert all(not n.is_running for n in cluster.nodes)
    assert list(tmp_path.iterdir()) == []


def test_port_clash_is_retried_with_new_ports(rqlited_path: str, tmp_path: Path) -> None:
    node = Node("n1", tmp_path / "n1", binary=rqlited_path)
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        squatter.bind(("127.0.0.1", node.raft_port))
        squatter.listen()
        clashed = node.raft_port
        node.start()
        assert node.is_running
        assert node.raft_port != clashed
    finally:
        squatter.close()
        node.stop()
    assert not node.is_running


def test_explicit_port_clash_raises(rqlited_path: str, tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        node = Node("n1", tmp_path / "n1", binary=rqlited_path, http_port=port)
        with pytest.raises(PortInUse) as raised:
            node.start()
    assert raised.value.address == f"127.0.0.1:{port}"
    first = str(raised.value).splitlines()[0]
    assert f"127.0.0.1:{port}: bind: address already in use" in first
    assert not node.is_running
