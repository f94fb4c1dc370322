"""The session's shared clusters kept small: every table a test module made on one of them is
dropped when the module ends (`tests/conftest.py`), and the contract suite drops each test's
queues as it ends (`tests/contract/conftest.py`).

A queue is 15 tables and 42 schema objects, and a cluster's every later schema change costs
more for each one left: a queue's setup, publish, claim and ack took 0.25 s on a fresh 1-node
cluster, 0.8 s beside 25 left-over queues, 1.3 s beside 50, and 30 modules leave hundreds."""

from __future__ import annotations

import json
import time
from typing import Any

import urllib3

from rqlite_queue.testing import Cluster

STARTED: list[Cluster] = []
"""The shared clusters started so far in this session (each registers as it starts)."""


def nodes_of(url: str) -> list[list[str]]:
    """The nodes of each cluster of a queue URL (one cluster, or `a=URL;b=URL` shards)."""
    parts = url.split(";")
    return [
        [n.rstrip("/") for n in (part.partition("=")[2] if ";" in url else part).split(",")]
        for part in parts
    ]


ALL_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
"""(`sqlite_sequence` may not be dropped, and one refused statement undoes the transaction.)"""


def tables(http: urllib3.PoolManager, nodes: list[str]) -> set[str]:
    reply = post(http, nodes, "/db/query?level=strong", [[ALL_TABLES]])
    return {name for (name,) in reply["results"][0].get("values") or []}


def drop(http: urllib3.PoolManager, nodes: list[str], names: set[str]) -> None:
    if names:
        drops = [f'DROP TABLE IF EXISTS "{name}"' for name in sorted(names)]
        reply = post(http, nodes, "/db/execute?transaction", drops)
        errors = [result["error"] for result in reply["results"] if "error" in result]
        assert not errors, f"the tests' tables were not dropped: {errors}"


def post(http: urllib3.PoolManager, nodes: list[str], path: str, body: object) -> Any:
    """POST to the first node that answers with JSON results: right after a test's faults, or
    under load, a node may say 'leader not found' (in plain text) while its cluster elects."""
    deadline = time.monotonic() + 30.0
    while True:
        for node in nodes:
            try:
                reply = http.request(
                    "POST",
                    node + path,
                    body=json.dumps(body),
                    headers={"Content-Type": "application/json"},
                    retries=False,
                )
                answer = json.loads(reply.data) if reply.status == 200 else None
                # A 200 can still carry no result (seen under load, after a test's faults):
                # asked again, the cluster answers.
                if isinstance(answer, dict) and answer.get("results"):
                    return answer
                problem = f"{reply.status} {reply.data[:200]!r}"
            except urllib3.exceptions.HTTPError as error:
                problem = repr(error)
        if time.monotonic() > deadline:
            raise AssertionError(f"could not clean the session's clusters up: {problem}")
        time.sleep(0.2)
