"""OpenTelemetry tracing (docs/howto/tracing.md), across processes, on a real rqlited: a
publisher process and a Worker process, each with the SDK's in-memory exporter, report their
spans; together they make one trace per message, publish -> receive -> process (and the
handler's own spans under it), with the messaging attributes, and a handler's exception in
error. Without a tracer provider nothing is added to the headers; without the API installed
nothing imports it."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from typing import Any

import pytest

from rqlite_queue import Transport
from rqlite_queue.testing import Cluster

pytest.importorskip("opentelemetry.sdk")

EXPORTER = """
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
app = trace.get_tracer("app")


def report(**extra):
    spans = [
        {
            "name": s.name,
            "kind": s.kind.name,
            "trace": format(s.context.trace_id, "032x"),
            "id": format(s.context.span_id, "016x"),
            "parent": None if s.parent is None else format(s.parent.span_id, "016x"),
            "status": s.status.status_code.name,
            "attributes": dict(s.attributes),
            "events": [e.name for e in s.events],
        }
        for s in exporter.get_finished_spans()
    ]
    print(json.dumps({"spans": spans, **extra}))
"""

PUBLISHER = (
    EXPORTER
    + """
from rqlite_queue import Transport

url, queue = sys.argv[1], sys.argv[2]
q = Transport.from_url(url, queue=queue)
with app.start_as_current_span("request"):
    one = q.publish("g", "ok", headers={"mine": "kept"})
many = q.publish_many([("h", "fail"), ("i", "ok too")])
q.close()
report(seqs={"ok": one, "fail": many[0], "ok too": many[1]})
"""
)

WORKER = (
    EXPORTER
    + """
import asyncio
from rqlite_queue import AsyncTransport, AsyncWorker, Transport, Worker

url, queue, flavour = sys.argv[1], sys.argv[2], sys.argv[3]
headers = {}


def work(lease):
    headers[lease.event] = dict(lease.headers)
    with app.start_as_current_span("work"):
        if lease.event == "fail":
            raise ValueError("no good")


async def handle(lease):
    work(lease)


if flavour == "sync":
    q = Transport.from_url(url, queue=queue)
    Worker(q, work, max_attempts=1, concurrency=3).run(handle_signals=False, until_empty=True)
    q.close()
else:
    async def main():
        q = await AsyncTransport.from_url(url, queue=queue)
        worker = AsyncWorker(q, handle, max_attempts=1, concurrency=3)
        await worker.run(handle_signals=False, until_empty=True)
        await q.close()

    asyncio.run(main())
report(headers=headers)
"""
)


def run(script: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    reported: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return reported


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_one_trace_from_publish_through_receive_to_the_handler_across_processes(
    rqlite_cluster: Cluster, flavour: str
) -> None:
    queue = f"otel_{uuid.uuid4().hex[:8]}"
    published = run(PUBLISHER, rqlite_cluster.url, queue)
    consumed = run(WORKER, rqlite_cluster.url, queue, flavour)
    spans = published["spans"] + consumed["spans"]
    by_id = {s["id"]: s for s in spans}
    seqs = published["seqs"]

    def chain(span: dict[str, Any]) -> list[str]:
        """The names from the trace's root down to this span."""
        names = [span["name"]]
        while span["parent"] is not None:
            span = by_id[span["parent"]]
            names.append(span["name"])
        return names[::-1]

    processed = {
        s["attributes"]["messaging.message.id"]: s for s in spans if s["kind"] == "CONSUMER"
    }
    assert set(processed) == {str(seq) for seq in seqs.values()}
    # One trace per publish: the app's request, its publish, the claim, the handler, its work.
    [work] = [
        s for s in spans if s["name"] == "work" and s["parent"] == processed[str(seqs["ok"])]["id"]
    ]
    lineage = [by_id[i] for i in _ancestry(work, by_id)]
    assert [s["name"] for s in lineage] == [
        "work",
        f"process {queue}",
        f"receive {queue}",
        f"publish {queue}",
        "request",
    ]
    assert [s["kind"] for s in lineage] == [
        "INTERNAL",
        "CONSUMER",
        "CLIENT",
        "PRODUCER",
        "INTERNAL",
    ]
    assert len({s["trace"] for s in lineage}) == 1
    _, process_ok, receive_ok, publish, _ = lineage
    # The batch: one publish span, each message received and processed under it.
    [batch] = [
        s
        for s in spans
        if s["kind"] == "PRODUCER" and s["attributes"].get("messaging.batch.message_count") == 2
    ]
    assert batch["parent"] is None
    for event in ("fail", "ok too"):
        process = processed[str(seqs[event])]
        receive = by_id[process["parent"]]
        assert (receive["kind"], receive["parent"]) == ("CLIENT", batch["id"])
        assert process["trace"] == receive["trace"] == batch["trace"]
    # The headers carried the publish's context, beside the publisher's own.
    headers = consumed["headers"]["ok"]
    assert headers["mine"] == "kept"
    assert headers["traceparent"].split("-")[1:3] == [publish["trace"], publish["id"]]
    # The messaging conventions.
    assert publish["attributes"] == {
        "messaging.system": "rqlite-queue",
        "messaging.destination.name": queue,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.message.conversation_id": "g",
        "messaging.message.id": str(seqs["ok"]),
    }
    assert process_ok["status"] == "UNSET"
    assert {
        k: process_ok["attributes"][k]
        for k in (
            "messaging.system",
            "messaging.destination.name",
            "messaging.operation.type",
            "messaging.message.conversation_id",
            "messaging.rqlite_queue.message.attempts",
        )
    } == {
        "messaging.system": "rqlite-queue",
        "messaging.destination.name": queue,
        "messaging.operation.type": "process",
        "messaging.message.conversation_id": "g",
        "messaging.rqlite_queue.message.attempts": 1,
    }
    assert receive_ok["attributes"]["messaging.operation.type"] == "receive"
    assert receive_ok["attributes"]["messaging.batch.message_count"] >= 1
    # The handler's exception: its process span in error, the exception recorded.
    failed = processed[str(seqs["fail"])]
    assert (failed["status"], failed["attributes"]["error.type"]) == ("ERROR", "ValueError")
    assert "exception" in failed["events"]


def _ancestry(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> list[str]:
    ids = [span["id"]]
    while span["parent"] is not None:
        span = by_id[span["parent"]]
        ids.append(span["id"])
    return ids


def test_without_a_tracer_provider_publish_adds_no_headers(rqlite_cluster: Cluster) -> None:
    """The API installed but no provider set (this test process sets none): tracing is off."""
    q = Transport.from_url(rqlite_cluster.url, queue=f"otel_{uuid.uuid4().hex[:8]}")
    try:
        q.publish("g", 1)
        q.publish("h", 2, headers={"mine": "only"})
        leases = {lease.group_id: dict(lease.headers) for lease in q.claim_many("w", 30, 10)}
        assert leases == {"g": {}, "h": {"mine": "only"}}
    finally:
        q.close()


HIDDEN = """
import importlib.machinery, sys


class Hide(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            return None
        return super().find_spec(name, path, target)


sys.meta_path[:] = [Hide if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
import importlib.util
assert importlib.util.find_spec("opentelemetry") is None
from rqlite_queue import Transport, Worker

q = Transport.from_url(sys.argv[1], queue=sys.argv[2])
q.publish("g", 1)
q.publish_many([("h", 2)])
seen = []
worker = Worker(q, lambda lease: seen.append(dict(lease.headers)))
worker.run(handle_signals=False, until_empty=True)
q.close()
assert seen == [{}, {}], seen
assert not [m for m in sys.modules if m.startswith("opentelemetry")]
print("ok")
"""


def test_without_the_api_installed_nothing_imports_it(rqlite_cluster: Cluster) -> None:
    done = subprocess.run(
        [sys.executable, "-c", HIDDEN, rqlite_cluster.url, f"otel_{uuid.uuid4().hex[:8]}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
