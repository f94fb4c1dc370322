"""Jobs (docs/howto/results.md), on every backend, sharded queues included, sync and async:
outcomes kept on request (`keep=`) and read with `result()` (queued, running with its
progress and attempt, then final until its time), written in the settlement's own
transaction; cancellation of queued and running messages, and of their group; progress
riding on extensions; what every publish path keeps; bad arguments refused with nothing
written."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any

import pytest

from rqlite_queue import InvalidArgument, LeaseLost
from rqlite_queue._protocol import outcomes as outcome_rules
from rqlite_queue.errors import EncodeError, PayloadTooLarge
from rqlite_queue.types import FINAL_STATUSES, JobError

from .conftest import FakeClock, lose

KEEP = 100.0


async def status(q: Any, group: str, seq: int) -> str | None:
    job = await q.result(group, seq)
    return None if job is None else str(job.status)


async def test_an_outcome_is_queued_then_running_then_kept_for_its_time(
    q: Any, clock: FakeClock
) -> None:
    published = clock.now
    seq = await q.publish("g", {"n": 1}, keep=KEEP, headers={"h": "v"})
    job = await q.result("g", seq)
    assert (job.status, job.event, dict(job.headers), job.attempts) == (
        "queued",
        {"n": 1},
        {"h": "v"},
        0,
    )
    assert (job.enqueued_at, job.started_at, job.finished_at) == (published, None, None)
    assert not job.final and job.kept_until is None and job.workers == ()
    clock.advance(1)
    lease = await q.claim("w1", 30)
    assert lease.keep == KEEP
    job = await q.result("g", seq)
    assert (job.status, job.attempts, job.workers, job.started_at) == (
        "running",
        1,
        ("w1",),
        clock.now,
    )
    clock.advance(2)
    await q.ack(lease, result={"rows": [1, 2]})
    job = await q.result("g", seq)
    assert (job.status, job.result, job.final) == ("succeeded", {"rows": [1, 2]}, True)
    assert (job.attempts, job.workers, job.finished_at) == (1, ("w1",), clock.now)
    assert job.kept_until == clock.now + KEEP and job.event == {"n": 1}
    assert (await q.stats()).outcomes == 1
    clock.advance(KEEP - 1)
    assert await status(q, "g", seq) == "succeeded"  # kept until its time...
    clock.advance(2)
    assert await q.result("g", seq) is None  # ...and not after it


async def test_a_message_without_keep_has_no_outcome_once_settled(q: Any) -> None:
    seq = await q.publish("g", 1)
    assert await status(q, "g", seq) == "queued"
    lease = await q.claim("w", 30)
    assert lease.keep is None
    assert await status(q, "g", seq) == "running"
    await q.ack(lease, result="dropped: nothing keeps it")
    assert await q.result("g", seq) is None
    assert (await q.stats()).outcomes == 0
    assert await q.result("g", 10**6) is None  # never published
    assert await q.result("nowhere", seq) is None


async def test_the_transports_keep_is_every_messages_default(make_queue: Any, clock: Any) -> None:
    q = await make_queue(keep=50)
    kept = await q.publish("a", 1)
    not_kept = await q.publish("b", 2, keep=0)  # 0: not kept, whatever the default
    longer = await q.publish("c", 3, keep=500)
    for lease in await q.claim_many("w", 30, 3):
        await q.ack(lease)
    assert (await q.result("a", kept)).kept_until == clock.now + 50
    assert await q.result("b", not_kept) is None
    assert (await q.result("c", longer)).kept_until == clock.now + 500


async def test_failures_keep_each_attempts_error_and_the_reason(q: Any) -> None:
    seq = await q.publish("g", "poison", keep=KEEP)
    lease = await q.claim("w1", 30)
    await q.nack(lease, 0, error=ValueError("first"))
    job = await q.result("g", seq)
    assert (job.status, job.attempts, [e.message for e in job.errors]) == ("queued", 1, ["first"])
    lease = await q.claim("w2", 30)
    try:
        raise KeyError("second")
    except KeyError as exc:
        await q.dead_letter(lease, "gave up", error=exc)
    job = await q.result("g", seq)
    assert (job.status, job.reason, job.attempts, job.workers) == (
        "failed",
        "gave up",
        2,
        ("w1", "w2"),
    )
    assert [(e.type, e.message, e.attempt) for e in job.errors] == [
        ("builtins.ValueError", "first", 1),
        ("builtins.KeyError", "'second'", 2),
    ]
    assert job.error is job.errors[-1] and "KeyError: 'second'" in job.error.traceback
    assert job.result is None
    assert [d.reason for d in await q.dead_letters()] == ["gave up"]  # a dead letter as ever
    # A JobError of the caller's own, and a dead letter without one.
    other = await q.publish("h", 1, keep=KEEP)
    lease = await q.claim("w", 30)
    await q.dead_letter(lease, "by hand", error=JobError("app.Refused", "no", "tb"))
    assert [(e.type, e.traceback) for e in (await q.result("h", other)).errors] == [
        ("app.Refused", "tb")
    ]


async def test_an_expired_message_keeps_an_expired_outcome(q: Any, clock: FakeClock) -> None:
    seq = await q.publish("g", 1, ttl=5, keep=KEEP)
    clock.advance(6)
    assert await q.claim("w", 30) is None
    job = await q.result("g", seq)
    assert (job.status, job.reason, job.final) == ("expired", "expired", True)


async def test_results_go_with_settle_and_claim_and_bad_ones_write_nothing(
    make_queue: Any,
) -> None:
    q = await make_queue(max_payload_bytes=1000)
    a = await q.publish("a", 1, keep=KEEP)
    b = await q.publish("b", 2, keep=KEEP)
    leases = {lease.group_id: lease for lease in await q.claim_many("w", 30, 2)}
    checked = q.check_result({"checked": True})
    if inspect.isawaitable(checked):  # the sync queue, seen through the async wrapper
        checked = await checked
    for bad, error in (({1, 2}, EncodeError), ("x" * 2000, PayloadTooLarge)):
        with pytest.raises(error):
            await q.ack(leases["a"], result=bad)
    with pytest.raises(InvalidArgument):  # a result for a lease not acked in this round
        await q.settle_and_claim("w", 30, 0, ack=[leases["a"]], results=[(leases["b"], 1)])
    assert (await q.stats()).in_flight == 2  # nothing was written
    result = await q.settle_and_claim(
        "w",
        30,
        0,
        ack=[leases["a"], leases["b"]],
        results=[(leases["a"], 7), (leases["b"], checked)],
    )
    assert result.lost == []
    assert ((await q.result("a", a)).result, (await q.result("b", b)).result) == (
        7,
        {"checked": True},
    )


async def test_outcomes_of_settlements_resent_after_a_lost_reply_are_written_once(
    q: Any,
) -> None:
    seq = await q.publish("g", 1, keep=KEEP)
    lease = await q.claim("w", 30)
    lose(q, ("apply", None))
    await q.ack(lease, result="once")
    job = await q.result("g", seq)
    assert (job.status, job.result) == ("succeeded", "once")
    assert (await q.stats()).outcomes == 1


async def test_outcomes_are_pruned_by_the_queues_own_work_after_their_time(
    q: Any, clock: FakeClock
) -> None:
    for i in range(3):
        await q.publish(f"old{i}", i, keep=10)
    for lease in await q.claim_many("w", 30, 3):
        await q.ack(lease)
    assert (await q.stats()).outcomes == 3
    clock.advance(11)
    assert (await q.stats()).outcomes == 3  # reads prune nothing
    # Settling rounds prune now and then (a sixteenth of them): 200 make it near sure.
    await q.publish_many([(f"new{i}", i) for i in range(200)])
    for _ in range(200):
        lease = await q.claim("w", 30)
        await q.ack(lease)
        if (await q.stats()).outcomes == 0:
            break
    assert (await q.stats()).outcomes == 0


# ---------------------------------------------------------------------------- cancel


async def test_cancelling_a_queued_message_removes_it_and_keeps_the_order(q: Any) -> None:
    seqs = await q.publish_many(
        [{"group_id": "g", "event": i, "keep": KEEP} for i in range(4)] + [("g", 4)]
    )
    assert await q.cancel("g", seqs[1], "not needed") == "cancelled"
    job = await q.result("g", seqs[1])
    assert (job.status, job.reason, job.final) == ("cancelled", "not needed", True)
    # Again (or sent again after a lost reply): its record says it was cancelled.
    assert await q.cancel("g", seqs[1], "again") == "cancelled"
    assert (await q.result("g", seqs[1])).reason == "not needed"
    assert await q.cancel("g", seqs[4]) == "cancelled"  # not kept: removed all the same
    assert await q.result("g", seqs[4]) is None
    # The head, queued: removed, and its group goes on with its next message.
    assert await q.cancel("g", seqs[0]) == "cancelled"
    lease = await q.claim("w", 30)
    assert (lease.seq, lease.event) == (seqs[2], 2)
    await q.ack(lease)
    lease = await q.claim("w", 30)
    assert lease.seq == seqs[3]
    await q.ack(lease)
    assert await q.cancel("g", seqs[3]) is None  # over: nothing to cancel
    assert await q.cancel("g", 10**6) is None and await q.cancel("other", seqs[2]) is None
    assert (await q.stats()).depth == 0


async def test_cancelling_a_parked_or_delayed_head_frees_its_group(
    q: Any, clock: FakeClock
) -> None:
    parked, after = await q.publish_many(
        [{"group_id": "p", "event": "retry me", "keep": KEEP}, ("p", "next")]
    )
    lease = await q.claim("w", 30)
    await q.nack(lease, 1000)
    assert await q.claim("w", 30) is None
    assert await q.cancel("p", parked) == "cancelled"
    job = await q.result("p", parked)
    assert (job.status, job.attempts) == ("cancelled", 1)
    lease = await q.claim("w", 30)
    assert lease.seq == after
    await q.ack(lease)
    delayed = await q.publish("d", "later", delay=1000, keep=KEEP)
    now = await q.publish("d", "now")
    assert await q.claim("w", 30) is None
    assert await q.cancel("d", delayed) == "cancelled"
    assert (await q.claim("w", 30)).seq == now


async def test_cancelling_a_running_message_flags_it_and_its_settlement_cancels_it(
    q: Any,
) -> None:
    seq, nxt = await q.publish_many(
        [{"group_id": "g", "event": 1, "keep": KEEP}, {"group_id": "g", "event": 2, "keep": KEEP}]
    )
    lease = await q.claim("w", 30)
    assert await q.cancel("g", seq, "stop it") == "cancelling"
    assert await q.cancel("g", seq, "stop it") == "cancelling"  # (again: the same)
    job = await q.result("g", seq)
    assert (job.status, job.cancelling, job.final) == ("running", "stop it", False)
    check = await q.check_leases([lease])
    assert check.cancelled == [(lease, "stop it")] and check.lost == []
    await q.ack(lease, result="done anyway")  # however it ends: cancelled, never succeeded
    job = await q.result("g", seq)
    assert (job.status, job.reason, job.result) == ("cancelled", "stop it", "done anyway")
    # A nack of a cancelled message does not retry it: it settles as cancelled.
    lease = await q.claim("w", 30)
    assert lease.seq == nxt
    await q.cancel("g", nxt, "stop")
    await q.nack(lease, 0)
    assert await status(q, "g", nxt) == "cancelled"
    assert await q.claim("w", 30) is None and (await q.stats()).depth == 0


async def test_a_dead_letter_of_a_cancelled_message_cancels_it(q: Any) -> None:
    seq = await q.publish("g", 1, keep=KEEP)
    lease = await q.claim("w", 30)
    await q.cancel("g", seq, "stop")
    await q.dead_letter(lease, "it failed too", error=ValueError("x"))
    assert await status(q, "g", seq) == "cancelled"
    assert await q.dead_letters() == []  # cancelled, not failed: no dead letter
    # Several in one round (its statement for many): only the one not cancelled is dead.
    a, b = await q.publish_many(
        [{"group_id": "a", "event": 1, "keep": KEEP}, {"group_id": "b", "event": 2, "keep": KEEP}]
    )
    leases = await q.claim_many("w", 30, 2)
    assert await q.cancel("a", a, "stop") == "cancelling"
    await q.settle_and_claim("w", 30, dead=[(lease, "failed") for lease in leases])
    assert (await status(q, "a", a), await status(q, "b", b)) == ("cancelled", "failed")
    assert [d.group_id for d in await q.dead_letters()] == ["b"]


async def test_a_cancelled_message_whose_lease_lapsed_is_never_handed_out_again(
    q: Any, clock: FakeClock
) -> None:
    seq, nxt = await q.publish_many([{"group_id": "g", "event": 1, "keep": KEEP}, ("g", 2)])
    lease = await q.claim("w", 10)
    assert await q.cancel("g", seq) == "cancelling"
    clock.advance(11)  # the holder died: its lease lapses
    again = await q.claim("other", 30)
    assert again is not None and again.seq == nxt  # the cancelled one settled in its place
    assert await status(q, "g", seq) == "cancelled"
    with pytest.raises(LeaseLost):
        await q.ack(lease)


async def test_cancel_group_reaches_its_running_lease(q: Any) -> None:
    seq, queued = await q.publish_many(
        [{"group_id": "g", "event": 1, "keep": KEEP}, {"group_id": "g", "event": 2, "keep": KEEP}]
    )
    lease = await q.claim("w", 30)
    assert await q.cancel_group("g", "whole workflow") == 2
    check = await q.check_leases([lease])
    assert check.cancelled == [] and [held for held, _ in check.lost] == [lease]
    assert "whole workflow" in check.lost[0][1]
    for s in (seq, queued):
        job = await q.result("g", s)
        assert (job.status, job.reason) == ("cancelled", "whole workflow")
    with pytest.raises(LeaseLost):
        await q.ack(lease)


async def test_check_leases_finds_a_lease_taken_over(q: Any, clock: FakeClock) -> None:
    await q.publish("g", 1)
    lease = await q.claim("w", 10)
    assert await q.check_leases([lease]) == type(await q.check_leases([]))()
    clock.advance(11)
    taker = await q.claim("other", 30)
    check = await q.check_leases([lease, taker])
    assert [held for held, _ in check.lost] == [lease] and check.cancelled == []


# ---------------------------------------------------------------------------- progress


async def test_progress_rides_on_an_extension_and_stays_with_the_outcome(q: Any) -> None:
    seq = await q.publish("g", 1, keep=KEEP)
    lease = await q.claim("w", 30)
    assert (await q.result("g", seq)).progress is None
    lease = await q.extend(lease, 30, progress={"done": 1, "of": 3})
    assert (await q.result("g", seq)).progress == {"done": 1, "of": 3}
    await q.settle_and_claim("w", 30, 0, extend=[lease], progress=[(lease, {"done": 2})])
    assert (await q.result("g", seq)).progress == {"done": 2}
    for bad in (object(), {"x": "y" * 9000}):
        with pytest.raises(InvalidArgument):
            await q.extend(lease, 30, progress=bad)
    with pytest.raises(InvalidArgument):  # progress for a lease not extended in the round
        await q.settle_and_claim("w", 30, 0, progress=[(lease, 3)])
    assert (await q.result("g", seq)).progress == {"done": 2}  # nothing was written
    await q.ack(lease)
    job = await q.result("g", seq)
    assert (job.status, job.progress) == ("succeeded", {"done": 2})


# ---------------------------------------------------------------------------- publish paths


async def test_every_publish_path_keeps_what_it_is_given(q: Any, clock: FakeClock) -> None:
    seqs = await q.publish_many(
        [
            {"group_id": "many", "event": 1, "keep": 10},
            {"group_id": "debounced", "event": "first", "debounce": "k", "keep": 20},
        ]
    )
    await q.publish("debounced", "last", debounce="k", keep=30)  # the last of a run says
    async with q.transaction() as tx:
        tx.publish("tx", 1, keep=40)
    await q.schedule("every", "ticks", "tick", every=5, keep=50)
    clock.advance(5)
    assert await q.fire_schedules() == 1
    claimed = {lease.group_id: lease for lease in await q.claim_many("w", 30, 10)}
    assert {g: lease.keep for g, lease in claimed.items()} == {
        "many": 10,
        "debounced": 30,
        "tx": 40,
        "ticks": 50,
    }
    await q.ack(claimed["many"], publish=[{"group_id": "follow", "event": 1, "keep": 60}])
    assert (await q.claim("w", 30)).keep == 60  # (a follow-up on another shard: its outbox)
    assert seqs[0] == claimed["many"].seq


async def test_bad_keep_and_cancel_arguments_are_refused_before_anything_is_written(
    q: Any,
) -> None:
    for bad in (-1, float("nan"), "60", True, 10**9):
        with pytest.raises(InvalidArgument):
            await q.publish("g", 1, keep=bad)
        with pytest.raises(InvalidArgument) as refused:
            await q.publish_many([("g", 1), {"group_id": "g", "event": 2, "keep": bad}])
        assert refused.value.index == 1
    assert (await q.stats()).last_seq == 0
    seq = await q.publish("g", 1)
    for call in (
        lambda: q.cancel("g", 0),
        lambda: q.cancel("g", "1"),
        lambda: q.cancel("", seq),
        lambda: q.cancel("g", seq, 7),
        lambda: q.result("g", -1),
        lambda: q.result("g", seq, wait=-1),
        lambda: q.result("g", seq, wait=float("inf")),
        lambda: q.check_leases(["not a lease"]),
    ):
        with pytest.raises(InvalidArgument):
            await call()
    assert await status(q, "g", seq) == "queued"


# ---------------------------------------------------------------------------- waiting


async def test_wait_returns_once_the_job_is_over_or_when_its_time_is_up(q: Any) -> None:
    seq = await q.publish("g", 1, keep=KEEP)
    started = time.monotonic()
    job = await q.result("g", seq, wait=0.3)
    assert job.status == "queued" and 0.3 <= time.monotonic() - started < 3
    lease = await q.claim("w", 30)
    await q.ack(lease, result=5)
    started = time.monotonic()
    job = await q.result("g", seq, wait=30)
    assert job.status in FINAL_STATUSES and time.monotonic() - started < 1
    assert await q.result("g", 10**6, wait=30) is None  # unknown: at once


async def test_a_waiter_in_the_settling_process_wakes_at_once(
    q: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outcome_rules, "LONGEST_POLL", 20.0)  # a poll would come far later
    seq = await q.publish("g", 1, keep=KEEP)
    lease = await q.claim("w", 30)
    acked_at: list[float] = []
    sync = getattr(q, "sync", None)

    def ack_later() -> None:  # (sync: the waiter holds the event loop's thread)
        time.sleep(1.5)  # the waiter's polls are 20 s apart by then
        sync.ack(lease, result="now")
        acked_at.append(time.monotonic())

    async def ack_soon() -> None:
        await asyncio.sleep(1.5)
        await q.ack(lease, result="now")
        acked_at.append(time.monotonic())

    if sync is not None:
        acking = threading.Thread(target=ack_later)
        acking.start()
        job = await q.result("g", seq, wait=60)
        woke = time.monotonic()
        acking.join()
    else:
        task = asyncio.create_task(ack_soon())
        job = await q.result("g", seq, wait=60)
        woke = time.monotonic()
        await task
    assert job.status == "succeeded" and woke - acked_at[0] < 1.0
