"""Faults on the links under load (link_faults.py): a short run (a silent leader, replies cut in
their middle) in every test run; every fault with `make chaos`, which writes its summary into
docs/reliability.md."""

from __future__ import annotations

import os
import time

import pytest

from .link_faults import (
    ALL,
    CUT,
    RESUME_WITHIN,
    SILENT,
    LinkConfig,
    check_link_faults,
    run_link_faults,
)
from .test_chaos import LINKS_BEGIN, LINKS_END, _commit, _put_section


def test_short_link_faults(rqlited_path: str) -> None:
    config = LinkConfig(seed=int(os.environ.get("CHAOS_SEED", "5")), groups=30)
    config.lengths = {**config.lengths, SILENT: 3.0, CUT: 2.0}
    report = run_link_faults(config, rqlited_path, [SILENT, CUT])
    print(report.summary())
    assert not check_link_faults(report), report.summary()
    assert any(f.lost.workers or f.lost.producer for f in report.link_faults), (
        "the proxies cut nothing: the run proves nothing\n" + report.summary()
    )


@pytest.mark.slow
def test_link_faults(rqlited_path: str) -> None:
    config = LinkConfig(seed=int(os.environ.get("CHAOS_SEED", "20261203")))
    order = list(ALL) * int(os.environ.get("LINK_ROUNDS", "2"))
    report = run_link_faults(config, rqlited_path, order)
    summary = report.summary()
    print(summary)
    problems = check_link_faults(report)
    _write_section(config, summary, problems)
    assert not problems, summary


def _write_section(config: LinkConfig, summary: str, problems: list[str]) -> None:
    verdict = "all held" if not problems else "FAILED: " + "; ".join(problems)
    rounds = os.environ.get("LINK_ROUNDS", "2")
    section = (
        f"{LINKS_BEGIN}\n## Faults on the links\n\n"
        f"Command: `make chaos CHAOS_SEED={config.seed}"
        + (f" LINK_ROUNDS={rounds}` (every fault {rounds} times; " if rounds != "2" else "` (")
        + "`tests/chaos/test_link_faults.py::test_link_faults`; a short version, a silent "
        f"leader and replies cut in their middle, runs in `make test`), at commit {_commit()}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores.\n\n"
        "A 3-node cluster (fast Raft timers: heartbeat 200 ms, election 400 ms) whose every "
        "link goes through toxiproxy (`Cluster(links=...)`, [Testing](testing.md#real-links-"
        f"latency-and-broken-connections)), with a round trip of {config.rtt * 1000:g} ms "
        "(+/- 10 %) on each. Two Workers (threads and asyncio), 16 slots each, leases of "
        f"{config.visibility:g} s (longer than any fault: a duplicate or an overlap would be a "
        "bug), the library's defaults otherwise; a producer on links of its own publishes "
        f"into {config.groups} groups without dedup ids, so an `OutcomeUnknown` reaches it. "
        "One fault at a time: on the **leader's** links, **silent** (toxiproxy's `timeout`: "
        "nothing passes, no reset, on its Raft link and its clients' links, "
        f"{config.lengths['silent']:g} s) and **isolate** (its links silent and what it "
        "sends into the others' Raft links dropped, so the others elect a leader); on "
        "every client link (clients stay on the node they last reached), "
        "**cut_replies** (one reply in three broken off 3 bytes before its end: the node did "
        "the work), **reset_peer** (every connection reset on its next reply, the reply "
        "dropped), **slow_close** (one request in five broken off before its end, the close "
        "of its connection then taking 2 s to reach the client); on every link, "
        f"**bandwidth_64k** (64 KB/s each way, {config.lengths['bandwidth_64k']:g} s).\n\n"
        "Per fault: **new leader**, from the fault to one of the other nodes saying it leads; "
        "**acks resumed**, from the fault clearing (or the new leader, if sooner) to the end "
        "of the first Worker round trip started after it that applied acks (must be within "
        f"{RESUME_WITHIN:g} s); **acks during**, rounds that applied acks while it lasted. "
        "**OutcomeUnknown seen / lost by the proxies**: the calls that raised it (the "
        "producer's publishes, the Workers' round trips; each put down to the last fault "
        "that began before it) against what the proxies dropped or broke off during the "
        "fault, counted by the proxies themselves (HTTP messages given to a dropping toxic, "
        "replies `cut`; Raft chunks dropped, since a client's request forwarded by a follower "
        "is lost there): a caller must never see more than was really lost.\n\n"
        f"Verdict: {verdict}.\n\n```\n{summary}\n```\n{LINKS_END}\n"
    )
    _put_section(LINKS_BEGIN, LINKS_END, section)
