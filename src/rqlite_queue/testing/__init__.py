"""Real rqlite clusters on loopback, for your tests and for local development.

`rqlite_queue.testing.plugin` is a pytest plugin (loaded automatically once rqlite-queue is
installed: it only defines fixtures, and starts nothing until a test asks for one); the harness
below is what its fixtures, `rqlite-queue cluster up` and the demo run on. Importing this package
starts nothing and registers nothing.
"""

from ..local_cluster import (
    FAST_RAFT_ARGS,
    Cluster,
    ClusterError,
    Links,
    Node,
    NodeStartError,
    PortInUse,
    RqlitedNotFound,
    free_port,
    kill_leftovers,
    live_pids,
    rqlited_path,
)
from ..toxiproxy import ClusterLinks, Link, ToxiproxyNotFound, find_toxiproxy

__all__ = [
    "FAST_RAFT_ARGS",
    "Cluster",
    "ClusterError",
    "ClusterLinks",
    "Link",
    "Links",
    "Node",
    "NodeStartError",
    "PortInUse",
    "RqlitedNotFound",
    "ToxiproxyNotFound",
    "find_toxiproxy",
    "free_port",
    "kill_leftovers",
    "live_pids",
    "rqlited_path",
]
