"""Which rqlite endpoint each write goes to: `/db/request` returns the rows of a `SELECT` in a
write transaction, `/db/execute` does not (it runs the statement and returns counts), and costs
rqlite less (it does not compile every statement again to learn whether it reads). A write
that reads rows must never go to `/db/execute`: its rows would be silently lost."""

from __future__ import annotations

import itertools
from typing import Any

from rqlite_queue import Lease
from rqlite_queue._protocol import jobs, messages, round_spec, rounds
from rqlite_queue._protocol import publish as publishing
from rqlite_queue._protocol.core import QueueCore
from rqlite_queue._protocol.http import request_for
from rqlite_queue._protocol.messages import Message
from rqlite_queue._protocol.plan import Batch, Plan, Statement
from rqlite_queue._protocol.round_spec import RoundSpec

NOW = 1_800_000_000.0
EXECUTE = "/db/execute?transaction"
REQUEST = "/db/request?transaction"


def core() -> QueueCore:
    tokens = itertools.count(1)
    return QueueCore(
        queue="t", clock=lambda: NOW, token=lambda: f"T{next(tokens)}", chance=lambda: 0.99
    )


def lease(seq: int, group: str) -> Lease:
    return Lease(seq, group, {"n": seq}, "w:T0", 1, NOW + 30)


def round_(**spec: Any) -> Plan[Any]:
    c = core()
    return rounds.plan(c, round_spec.check(c, RoundSpec(**spec)))


def test_a_single_settlement_goes_to_execute() -> None:
    """The single calls' settlements (harel's runner acks one lease a call) read only counts."""
    for spec in (
        {"ack": [lease(1, "a")]},
        {"nack": [(lease(1, "a"), 0.0)]},
        {"nack": [(lease(1, "a"), 5.0)]},
        {"extend": [lease(1, "a")]},
        {"dead": [(lease(1, "a"), "bad")]},
    ):
        plan = round_(worker_id="w", **spec)
        assert request_for(plan.batch).path == EXECUTE, spec


def test_a_write_that_reads_rows_goes_to_request() -> None:
    """Several settlements read which ones were lost (a SELECT); a claim with a floor reads its
    leases with a SELECT; a publish reads its seqs."""
    c = core()
    plans = [
        round_(worker_id="w", ack=[lease(1, "a"), lease(2, "b")]),
        round_(worker_id="w", n=2, min_priority=1),
        publishing.plan(c, messages.checked(c, Message.parse_many([("g", 1)]), scoped=False)),
    ]
    for plan in plans:
        assert any(s.sql.startswith(("SELECT", "WITH")) for s in plan.batch.statements)
        assert request_for(plan.batch).path == REQUEST


def test_every_write_with_a_select_goes_to_request() -> None:
    """Whatever builds the batch: a SELECT anywhere in a write (not a RETURNING claim) sends it
    to /db/request, also when a guard placed first is the SELECT."""
    plain = round_(worker_id="w", ack=[lease(1, "a")]).batch
    assert request_for(plain).path == EXECUTE
    read = Statement("SELECT 1")
    assert request_for(plain.first([read])).path == REQUEST
    write = Statement("UPDATE rq_t_meta SET value = value WHERE 0")
    assert request_for(plain.first([write])).path == EXECUTE
    assert request_for(Batch((read,))).path == REQUEST  # a batch made by hand: by default


def test_a_publish_of_a_client_that_knows_tenants_off_goes_to_execute() -> None:
    """Its tripwire fails it if tenants are on, so its groups' rows are the default tenant's
    and made without a WITH: a write with no SELECT, which reads only counts and the last
    insert id. With a dedup id it reads the ids' seqs (a SELECT): /db/request."""
    c = core()
    plain = publishing.plan(c, messages.checked(c, [("g", 1)], scoped=False), tenants_on=False)
    assert request_for(plain.batch).path == EXECUTE
    deduplicated = messages.checked(c, [Message("g", 1, dedup_id="d")], scoped=False)
    assert request_for(publishing.plan(c, deduplicated, tenants_on=False).batch).path == REQUEST


def test_a_read_of_several_statements_is_one_snapshot() -> None:
    """rqlite runs the SELECTs of one /db/query each on its own unless asked for a transaction:
    a job read (its outcome, then its message) beside the settlement moving the one to the
    other saw neither, and said the job never existed. A read of one statement needs none."""
    c = core()
    job = jobs.job(c, "g", 1).batch
    assert len(job.statements) == 2
    assert request_for(job).path == "/db/query?level=linearizable&transaction"
    polled = jobs.job(c, "g", 1, local=True).batch
    assert request_for(polled).path == "/db/query?level=weak&transaction"
    assert request_for(Batch((Statement("SELECT 1"),), write=False)).path == (
        "/db/query?level=linearizable"
    )
