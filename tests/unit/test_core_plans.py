"""The core's plans read with canned results, as h11 is tested with plain values: no backend.
Also the shape rules every batch must keep on rqlite (short statement texts, few statements)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from rqlite_queue import InvalidArgument, Lease, OutcomeUnknown
from rqlite_queue._protocol import admin, messages, probes, round_spec, rounds, schema
from rqlite_queue._protocol import publish as publishing
from rqlite_queue._protocol.core import QueueCore
from rqlite_queue._protocol.messages import Message
from rqlite_queue._protocol.plan import Batch, Plan, Reply, Result
from rqlite_queue._protocol.round_spec import RoundSpec
from rqlite_queue.errors import EncodeError, TransportClosed
from rqlite_queue.types import Round

NOW = 1_800_000_000.0
BATCH_ID = "01a3185c500010008177ffc572164643"
LONGEST_QUEUE = "q" * 40
RQLITE_GZIP_TEXT = 1024  # rqlite gzips a request with a statement this long...
RQLITE_GZIP_COUNT = 50  # ...or this many statements


def core(queue: str = "t", chance: float = 0.99, **options: Any) -> QueueCore:
    tokens = itertools.count(1)
    return QueueCore(
        queue=queue,
        clock=lambda: NOW,
        token=lambda: f"T{next(tokens)}",
        chance=lambda: chance,
        **options,
    )


def round_(c: QueueCore, **spec: Any) -> Plan[Round]:
    return rounds.plan(c, round_spec.check(c, RoundSpec(**spec)))


def claim(c: QueueCore, worker: str, visibility: float, n: int, floor: int) -> Plan[Round]:
    return round_(c, worker_id=worker, visibility=visibility, n=n, min_priority=floor)


def publish_many(c: QueueCore, items: Any) -> Plan[list[int]]:
    return publishing.plan(c, messages.checked(c, Message.parse_many(items), scoped=False))


def publish(c: QueueCore, group_id: str, event: Any, **options: Any) -> Plan[list[int]]:
    return publish_many(c, [{"group_id": group_id, "event": event, **options}])


def reply(batch: Batch, **by_slot: Result) -> Reply:
    """Results for `batch`: the named slots as given, every other statement empty."""
    results = [Result() for _ in batch.statements]
    for slot, result in by_slot.items():
        results[batch.slots[slot]] = result
    return Reply(batch, results)


def lease(seq: int, group: str, token: str = "w:T0") -> Lease:
    return Lease(seq, group, {"n": seq}, token, 1, NOW + 30)


def test_a_claim_reads_its_leases_and_a_resend_reads_the_same() -> None:
    plan = claim(core(), "w", 30, 2, 0)
    # (seq, group, event, attempts, lease's end, message's end, rowid, headers, batch,
    # tenants on)
    rows = [
        [9, "b", '{"n":9}', 2, NOW + 30, None, 12, '{"k":"v"}', None, 0, 60.0, None],
        [
            7,
            "a",
            '{"n":7}',
            1,
            NOW + 30,
            None,
            3,
            None,
            "01a3185c500010008177ffc572164643",
            0,
            None,
            None,
        ],
    ]
    canned = reply(plan.batch, leased=Result(rows=rows))
    leases = plan.read(canned).leases
    assert [(x.seq, x.group_id, x.event, x.attempts, dict(x.headers), x.batch) for x in leases] == [
        (7, "a", {"n": 7}, 1, {}, BATCH_ID),
        (9, "b", {"n": 9}, 2, {"k": "v"}, None),
    ]
    assert {x.token for x in leases} == {"w:T1"}
    assert [x.keep for x in leases] == [None, 60.0]
    assert plan.resend_safe and plan.resend is not None and plan.read_resent is None
    resent = reply(plan.resend(), leased=Result(rows=rows))
    assert plan.read(resent).leases == leases  # in the groups' creation order, as first


def test_a_lease_on_an_expired_message_is_set_apart() -> None:
    plan = claim(core(), "w", 30, 2, 0)
    rows = [
        [7, "a", "1", 1, NOW + 30, NOW - 1, 1, None, None, 0, None, None],
        [9, "b", "2", 1, NOW + 30, NOW + 60, 2, None, None, 0, None, None],
        [8, "c", "3", 2, NOW + 30, None, 4, None, None, 0, None, "stop"],
    ]
    result = plan.read(reply(plan.batch, leased=Result(rows=rows)))
    assert [x.seq for x in result.leases] == [9]
    assert [x.seq for x in result.expired] == [7]
    assert [x.seq for x in result.cancelled] == [8]  # cancelled while a lapsed lease held it


def test_a_claim_without_a_floor_reads_its_leases_from_returning() -> None:
    """The cheaper batch for rqlite: no SELECT, so it can go to /db/execute; its resend is
    the SELECT form, which finds the groups the token took."""
    plan = claim(core(), "w", 30, 2, 0)
    assert plan.batch.returning and plan.resend is not None
    assert not plan.resend().returning
    assert not any(s.sql.startswith("SELECT") for s in plan.batch.statements)
    assert claim(core(), "w", 30, 2, 1).batch.returning is False  # a floor: a SELECT


def test_returning_rows_dropped_by_the_server_send_the_select_form() -> None:
    """Rows changed, none returned: the server did not keep the RETURNING rows; the claim's
    outcome is then unknown to the reader, which lets the transport resend the SELECT form."""
    plan = claim(core(), "w", 30, 2, 0)
    dropped = reply(plan.batch, leased=Result(rows_affected=2))
    with pytest.raises(OutcomeUnknown):
        plan.read(dropped)
    assert plan.read(reply(plan.batch, leased=Result())).leases == []  # nothing claimable


def test_the_same_sources_make_the_same_batch() -> None:
    first = round_(core(), worker_id="w", n=3, ack=[lease(1, "a")])
    second = round_(core(), worker_id="w", n=3, ack=[lease(1, "a")])
    assert first.batch == second.batch


def test_one_settlement_reads_its_outcome_from_its_record_on_any_send() -> None:
    """The record statement counts the settlement if its lease held, or if an earlier send of
    the same settlement applied (its record was there): lost only otherwise, first send or
    resend alike."""
    held = lease(1, "a")
    plan = round_(core(), ack=[held])
    assert plan.resend_safe and plan.read_resent is None  # a resend is read as a first send
    assert plan.read(reply(plan.batch, recorded=Result(rows_affected=0))).lost == [held]
    assert plan.read(reply(plan.batch, recorded=Result(rows_affected=1))).lost == []
    record = next(s for s in plan.batch.statements if "INSERT INTO rq_t_settled" in s.sql)
    # group, token, seq, kind (acked), as plain parameters: one settlement's statements
    assert {k: record.params[k] for k in "gtq"} == {"g": "a", "t": "w:T0", "q": 1}
    assert record.params["kind"] == schema.ACKED


def test_the_record_says_how_a_lease_was_settled() -> None:
    """An ack sent again finds the record of an ack, not of a nack or a dead letter."""
    a, b, c = lease(1, "a"), lease(2, "b"), lease(3, "c")
    plan = round_(core(), ack=[a], dead=[(b, "why")], nack=[(c, 0)])
    record = next(s for s in plan.batch.statements if "INSERT INTO rq_t_settled" in s.sql)
    kinds = [item[3] for item in __import__("json").loads(record.params["rec"])]
    assert kinds == [schema.ACKED, schema.DEAD_LETTERED, schema.GIVEN_BACK]


def test_an_extension_found_gone_is_lost_on_any_send() -> None:
    """An extension never releases its lease: one found gone was taken over."""
    held = lease(1, "a")
    plan = round_(core(), extend=[held])
    assert plan.resend_safe and plan.read_resent is None
    resent = plan.read(reply(plan.batch, changed=Result(rows_affected=0)))
    assert resent.lost == [held] and resent.extended == []


def test_a_round_names_the_settlements_that_did_not_hold_in_the_order_given() -> None:
    a, b, c = lease(1, "a"), lease(2, "b"), lease(3, "c")
    plan = round_(core(), ack=[a, b, a], nack=[(c, 5)])
    canned = reply(plan.batch, lost=Result(rows=[[1]]))  # b (index 1 of the unique ones)
    assert plan.read(canned).lost == [b, a]  # a's repeat never holds


def test_publish_reads_new_and_deduplicated_seqs() -> None:
    plan = publish_many(
        core(),
        [
            ("g", 1),
            {"group_id": "g", "event": 2, "dedup_id": "old"},
            {"group_id": "g", "event": 3, "dedup_id": "new"},
            {"group_id": "h", "event": 4, "dedup_id": "new"},  # repeat within the batch
            ("h", 5),
        ],
    )
    canned = reply(
        plan.batch,
        inserted=Result(rows_affected=3, last_insert_id=12),
        dedup=Result(rows=[["old", 4], ["new", 11]]),
    )
    assert plan.read(canned) == [10, 4, 11, 11, 12]
    assert not plan.resend_safe  # not every item has a dedup id: a resend could duplicate


def test_a_publish_with_dedup_ids_everywhere_is_resent() -> None:
    plan = publish(core(dedup_key=lambda event: f"id-{event}"), "g", 5)
    assert plan.resend_safe


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: publish(c, "g\ud800", 1), InvalidArgument),
        (lambda c: publish(c, "g", "\ud800"), EncodeError),
        (lambda c: publish(c, "g", 1, dedup_id="\udfff"), InvalidArgument),
        (lambda c: claim(c, "w", float("inf"), 1, 0), InvalidArgument),
        (lambda c: claim(c, "w", float("nan"), 1, 0), InvalidArgument),
        (lambda c: round_(c, nack=[(lease(1, "a"), float("nan"))]), InvalidArgument),
        (lambda c: round_(c, nack=[(lease(1, "a"), -1)]), InvalidArgument),
        (lambda c: claim(c, "w", 30, 2**70, 0), InvalidArgument),
        (lambda c: round_(c, dead=[(lease(1, "a"), "\ud800")]), InvalidArgument),
        (lambda c: publish(c, "g" * 2000, 1), InvalidArgument),
    ],
)
def test_bad_input_is_refused_before_any_statement(call: Any, error: type) -> None:
    with pytest.raises(error):
        call(core())


def test_a_closed_core_refuses_every_plan() -> None:
    c = core()
    c.closed = True
    for call in (
        lambda: publish(c, "g", 1),
        lambda: claim(c, "w", 30, 1, 0),
        lambda: admin.stats(c),
    ):
        with pytest.raises(TransportClosed):
            call()


def every_batch(c: QueueCore) -> dict[str, Batch]:
    many = [lease(i, f"g{i}") for i in range(1, 501)]
    return {
        "setup": schema.bootstrap(c).batch,
        "create": schema.create(c.names),
        "migrate": schema.migrate(c.names, 1),
        "reopen": schema.reopen(c.names, tenants_were_on=True),
        "publish_many": publish_many(
            c, [{"group_id": f"g{i}", "event": i, "dedup_id": f"d{i}"} for i in range(500)]
        ).batch,
        "publish_many debounced": publish_many(
            c, [{"group_id": f"g{i}", "event": i, "debounce": f"k{i}"} for i in range(500)]
        ).batch,
        "round": round_(
            c,
            worker_id="w" * 500,
            n=64,
            min_priority=1,
            ack=many[:100],
            nack=[(x, 5) for x in many[100:200]],
            extend=many[200:300],
            dead=[(x, "why") for x in many[300:400]],
            hold_dead=True,
        ).batch,
        "claim floor 1": claim(c, "w", 30, 64, 1).batch,
        "probe": probes.plan(c, 1).batch,
        "stats": admin.stats(c).batch,
        "requeue": admin.requeue_dead(c, [1, 2, 3]).batch,
        "hold": admin.hold_group(c, "g").batch,
        "peek": admin.peek(c, "g", 10).batch,
    }


@pytest.mark.parametrize("name", list(every_batch(core(LONGEST_QUEUE, chance=0.0))))
def test_batches_stay_under_rqlites_compression_thresholds(name: str) -> None:
    """A batch of any size keeps every statement's text short and the statements few (the
    prune coin is forced to land, so the optional statements are in)."""
    batch = every_batch(core(LONGEST_QUEUE, chance=0.0))[name]
    if name in ("create", "migrate", "reopen"):
        return  # run once per database, not on the hot path
    assert len(batch.statements) < RQLITE_GZIP_COUNT
    for statement in batch.statements:
        assert len(statement.sql) < RQLITE_GZIP_TEXT, statement.sql
