"""The chaos suite: a short run in every test run; the long one with `make chaos`, which also
writes its summary to docs/reliability.md. Leases are shorter than the faults, so they lapse
under frozen, cut-off or slow holders, and fencing is exercised, not only assumed."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from rqlite_queue.testing import Cluster, Node

from .batches import COUNTER, BatchesConfig, run_batches
from .chains import PUBLISH_THEN_ACK, ChainConfig, run_chains
from .checker import Op, Report, check
from .engine import Config, run
from .failover import FREEZE, PARTITION, FailoverConfig, FailoverReport, run_failover
from .jobs import JobsConfig, run_jobs
from .network import NetworkUnavailable, leftovers, private_network, why_unavailable

ROOT = Path(__file__).resolve().parents[2]


def test_short_chaos_run(rqlited_path: str, tmp_path: Path) -> None:
    config = Config(
        seed=int(os.environ.get("CHAOS_SEED", "7")),
        groups=40,
        messages=8,
        thread_workers=3,
        task_workers=2,
        process_workers=2,
        publishers=2,
        faults=6,
        fault_gap=(0.8, 1.5),
        publish_pace=0.1,  # publishing lasts about as long as the faults
        time_limit=240,
        visibility=0.5,
        slow_chance=0.05,
    )
    report = run(config, rqlited_path, tmp_path)
    print(report.summary())
    assert report.ok, report.summary()
    assert report.faults, "the nemesis injected nothing: the run proves nothing"
    assert report.takeovers.lease_lost > 0, "no lapsed lease was taken over and fenced"
    assert not leftovers(os.getpid()), "the private network was not removed"


@pytest.mark.slow
def test_long_chaos_run(rqlited_path: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED", "20261129"))
    config = Config(
        seed=seed,
        faults=int(os.environ.get("CHAOS_FAULTS", "30")),
        publish_pace=0.05,  # publishing lasts about as long as the faults
        visibility=0.5,
        slow_chance=0.02,
    )
    report = run(config, rqlited_path, tmp_path)
    summary = report.summary()
    print(summary)
    page = _reliability_page(config, summary)
    kept = _kept_sections()
    (ROOT / "docs" / "reliability.md").write_text(page + ("\n" + kept if kept else ""))
    assert report.ok, summary
    assert report.takeovers.lease_lost > 0, "no lapsed lease was taken over and fenced"
    assert not leftovers(os.getpid()), "the private network was not removed"


def _reliability_page(config: Config, summary: str) -> str:
    commit = _commit()
    return (
        "# Reliability: the latest long chaos run\n\n"
        f"Command: `make chaos CHAOS_SEED={config.seed}` (at commit {commit}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores).\n\n"
        "A 3-node rqlite cluster (fast Raft timers: heartbeat 200 ms, election 400 ms), each "
        "node in its own network namespace; publishers with dedup ids; workers in threads, "
        "asyncio tasks and processes, half of them claiming and acking one lease at a time, "
        "half acking and claiming in one write (`settle_and_claim`). A nemesis injects one "
        "fault at a time: kill -9 of the leader (restarted 0.5-2 s later); SIGSTOP of the "
        f"leader or a follower for {config.pause[0]:g}-{config.pause[1]:g} s; a network "
        "partition that cuts the leader or a follower off from the other two nodes for "
        f"{config.partition[0]:g}-{config.partition[1]:g} s (iptables DROP rules in its "
        "namespace; clients still reach it); SIGSTOP of a worker process for "
        f"{config.pause[0]:g}-{config.pause[1]:g} s.\n\n"
        f"Leases are **shorter than the faults** (visibility {config.visibility:g} s), and "
        f"{config.slow_chance:.0%} of the handlers sleep "
        f"{config.slow[0]:g}-{config.slow[1]:g} times the visibility, so leases lapse while "
        "their holder is frozen, cut off or slow, and another worker takes the group over.\n\n"
        "How to read the numbers (the checker is `check` in `tests/chaos/checker.py`; it "
        "orders each group's leases as the database did, by seq then by `attempts`):\n\n"
        "- **lost** / **left in the queue**: published messages that no ack may have "
        "deleted, and messages still queued at the end. Both must be 0.\n"
        "- **duplicates delivered**: a message leased again, after its lease lapsed or its ack "
        "failed (delivery is at least once). **Leases no worker got** are the gaps in "
        "`attempts`: a claim applied but no worker received that lease, because its reply was "
        "lost and the call failed, or because a resent claim's first send, held by a frozen or "
        "cut-off node, applied after the resend had succeeded "
        "(`tests/chaos/test_delayed_writes.py`); such a lease blocks its group until it "
        "lapses.\n"
        "- **order violations**: a message leased before an ack of the previous one started, "
        "or out of publish order. Must be 0.\n"
        "- **exclusivity violations**: a message leased again, the new claim returning before the "
        "earlier lease lapsed: two valid leases on one group. Must be 0.\n"
        "- **overlaps after a lapsed lease**: a lease lapsed while its holder still worked on "
        "it, and another worker claimed the message; for a while both believed they held it. "
        "These are expected with short leases; what matters is the old holder's ack: "
        "**LeaseLost** (fenced: it raised `LeaseLost`, or `settle_and_claim` listed the lease "
        "in `Round.lost`, and changed nothing); **resent and reported done** (its first reply "
        "was lost, the transport resent it, the resend found the lease gone and reported "
        "success, as the contract's at-least-once rule for acks says; the message was "
        "delivered again, so the ack did not delete it); **failed** (the ack raised "
        "`Unavailable`); **never sent**. **Succeeded (unfenced)** would be an ack that acted "
        "on a lease another worker held, and must be 0.\n"
        "- **partitions**: for each cut of the leader, whether the two other nodes elected a "
        "new leader and the cut-off leader stepped down while the cut lasted.\n\n"
        "```\n" + summary + "\n```\n"
    )


# ------------------------------------------------------------------- the partition itself


def test_a_partition_cuts_a_node_off(rqlited_path: str) -> None:
    """Cutting the leader off makes it step down and the other two elect a leader, which
    takes writes while the cut-off node refuses them; once healed it catches up; nothing of
    the private network is left behind."""
    reason = why_unavailable()
    if reason is not None:
        pytest.skip(f"network partitions skipped: {reason}")
    try:
        with (
            private_network(3) as net,
            Cluster(3, binary=rqlited_path, hosts=net.hosts, wrappers=net.wrappers) as c,
        ):
            old = c.leader()
            k = c.nodes.index(old)
            net.partition(k)
            majority = [n for n in c.nodes if n is not old]
            assert _leader_among(majority, timeout=10) is not None, "the majority elected no one"
            assert _eventually(lambda: _state(old) != "Leader", timeout=5)
            # On a crowded machine the new leader can lose its term to the other node of the
            # majority before the write commits (HTTP 500): the majority must take the write
            # within the deadline, from whichever of the two leads by then.
            assert _eventually(lambda: _majority_takes(majority, "during_cut"), timeout=10)
            assert _write(old, "CREATE TABLE on_the_cut_node (x)").status_code != 200
            net.heal(k)
            assert _eventually(lambda: _has_table(old, "during_cut"), timeout=10)
            c.leader(timeout=10)  # one leader, agreed on by all three
    except NetworkUnavailable as exc:
        pytest.skip(f"network partitions skipped: {exc}")
    assert not leftovers(os.getpid())


def test_the_private_network_is_removed_even_on_failure() -> None:
    reason = why_unavailable()
    if reason is not None:
        pytest.skip(f"network partitions skipped: {reason}")
    with pytest.raises(RuntimeError, match="boom"), private_network(3) as net:
        net.partition(0)
        assert leftovers(os.getpid())
        raise RuntimeError("boom")
    assert not leftovers(os.getpid())


def _state(node: Node) -> str:
    try:
        return str(node.status(timeout=1)["store"]["raft"]["state"])
    except httpx.HTTPError:
        return "unknown"


def _leader_among(nodes: list[Node], timeout: float) -> Node | None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        for node in nodes:
            if _state(node) == "Leader":
                return node
        time.sleep(0.1)
    return None


def _eventually(test: Callable[[], bool], timeout: float) -> bool:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if test():
            return True
        time.sleep(0.1)
    return False


def _write(node: Node, sql: str) -> httpx.Response:
    with httpx.Client(timeout=5, trust_env=False) as http:
        return http.post(node.http_url + "/db/execute", json=[[sql]])


def _majority_takes(majority: list[Node], table: str) -> bool:
    leader = _leader_among(majority, timeout=2)
    if leader is None:
        return False
    try:
        reply = _write(leader, f"CREATE TABLE IF NOT EXISTS {table} (x)")
    except httpx.HTTPError:
        return False
    return reply.status_code == 200 and "error" not in reply.json()["results"][0]


def _has_table(node: Node, name: str) -> bool:
    with httpx.Client(timeout=2, trust_env=False) as http:
        r = http.post(
            node.http_url + "/db/query",
            params={"level": "none"},
            json=[["SELECT name FROM sqlite_master"]],
        )
    return [name] in r.json()["results"][0].get("values", [])


# ----------------------------------------------------------- the checker must be able to fail

VIS = 1.0


def _claim(actor: str, i: int, t: float, seq: int, attempts: int = 1, token: str = "") -> Op:
    """A lease taken at `t` (so it lapses at t + VIS)."""
    token = token or f"{actor}:{seq}:{attempts}"
    return Op("claim", actor, t, t + 0.01, "ok", "g", i, seq, attempts, t + VIS, token)


def _ack(claim: Op, t: float, outcome: str = "ok") -> Op:
    return Op("ack", claim.actor, t, t + 0.01, outcome, "g", claim.i, claim.seq, token=claim.token)


def _publish(i: int) -> Op:
    return Op("publish", "pub", 0, 0.001, "ok", "g", i, i + 1)


def _report(ops: list[Op]) -> Report:
    return check(Config(groups=1, messages=2, visibility=VIS), ops, [])


def test_checker_passes_a_clean_log() -> None:
    a, b = _claim("a", 0, 1, 1), _claim("b", 1, 1.2, 2)
    assert _report([_publish(0), _publish(1), a, _ack(a, 1.1), b, _ack(b, 1.3)]).ok


def test_checker_counts_a_fenced_takeover_and_passes_it() -> None:
    # a's lease lapses at 2; b claims at 2.5 (attempt 2); a's late ack gets LeaseLost.
    a, b, c = _claim("a", 0, 1, 1), _claim("b", 0, 2.5, 1, attempts=2), _claim("b", 1, 2.7, 2)
    ops = [_publish(0), _publish(1), a, b, _ack(a, 2.6, "lease_lost"), _ack(b, 2.65), c,
           _ack(c, 2.8)]  # fmt: skip
    report = _report(ops)
    assert report.ok, report.summary()
    assert report.takeovers.lease_lost == 1 and report.takeovers.total == 1
    assert report.duplicates_delivered == 1


def test_checker_catches_an_unfenced_overlap() -> None:
    # a's lease lapsed and b took the message over, yet a's ack succeeded on its first send.
    a, b, c = _claim("a", 0, 1, 1), _claim("b", 0, 2.5, 1, attempts=2), _claim("b", 1, 2.7, 2)
    ops = [_publish(0), _publish(1), a, b, _ack(a, 2.6, "ok"), _ack(b, 2.65), c, _ack(c, 2.8)]
    report = _report(ops)
    assert not report.ok
    assert len(report.takeovers.unfenced) == 1, report.summary()
    assert "unfenced): 1" in report.summary()


def test_checker_catches_loss_order_and_exclusivity() -> None:
    a = _claim("a", 0, 1, 1)
    assert _report([_publish(0), _publish(1), a, _ack(a, 1.1)]).lost == [("g", 1)]
    a, b = _claim("a", 0, 1, 1), _claim("b", 1, 1.05, 2)  # message 1 before 0 was acked
    early = [_publish(0), _publish(1), a, b, _ack(a, 1.1), _ack(b, 1.2)]
    assert _report(early).order_violations
    # b takes message 0 at 1.5 while a's lease runs until 2.
    a, b, c = _claim("a", 0, 1, 1), _claim("b", 0, 1.5, 1, attempts=2), _claim("b", 1, 2.2, 2)
    double = [_publish(0), _publish(1), a, b, _ack(a, 2, "lease_lost"), _ack(b, 2.1), c,
              _ack(c, 2.3)]  # fmt: skip
    assert _report(double).exclusivity_violations
    # Two leases of one message at the same attempt: two claims took it at once.
    a, b, c = _claim("a", 0, 1, 1), _claim("b", 0, 3, 1), _claim("b", 1, 3.2, 2)
    same = [_publish(0), _publish(1), a, b, _ack(a, 3.1, "lease_lost"), _ack(b, 3.1), c,
            _ack(c, 3.3)]  # fmt: skip
    assert _report(same).exclusivity_violations
    # Everything acked, but the queue was not empty at the end.
    a, b = _claim("a", 0, 1, 1), _claim("b", 1, 1.2, 2)
    clean = [_publish(0), _publish(1), a, _ack(a, 1.1), b, _ack(b, 1.3)]
    assert not check(Config(groups=1, messages=2, visibility=VIS), clean, [], remaining=1).ok


# -------------------------------------------------------------------------- sharded queues


def _sharded_config(seed: int, faults: int) -> Config:
    return Config(
        seed=seed,
        groups=40,
        messages=8,
        thread_workers=3,
        task_workers=2,
        process_workers=1,
        publishers=2,
        faults=faults,
        fault_gap=(0.8, 1.5),
        publish_pace=0.1,
        time_limit=300,
        visibility=0.5,
        slow_chance=0.05,
        shards=2,
        kinds=("kill_leader", "pause_leader", "pause_follower", "shard_down", "pause_worker"),
        outage=(3.0, 5.0),
    )


@pytest.mark.slow  # (the short unsharded run stays in the default run; make chaos runs both)
def test_short_sharded_chaos_run(rqlited_path: str, tmp_path: Path) -> None:
    """Two clusters of three nodes; leader kills and pauses in both, one shard's whole
    cluster down for seconds: nothing lost, no order, exclusivity or fencing violation, and
    the other shard's groups keep being claimed while it is down."""
    report = run(
        _sharded_config(int(os.environ.get("CHAOS_SEED", "11")), 5), rqlited_path, tmp_path
    )
    print(report.summary())
    assert report.ok, report.summary()
    kinds = {f.kind for f in report.faults}
    assert "shard_down" in kinds, report.summary()
    assert report.outages and all("n/a" not in line for line in report.outages), report.outages
    for line in report.outages:  # the healthy shard was served during the outage, near speed
        ratio = float(line.rsplit(", ", 1)[1].rstrip("x)"))
        assert ratio >= 0.5, line


@pytest.mark.slow
def test_long_sharded_chaos_run(rqlited_path: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED", "20261130"))
    config = _sharded_config(seed, int(os.environ.get("CHAOS_FAULTS", "20")))
    config.groups, config.messages, config.publish_pace = 200, 20, 0.03
    report = run(config, rqlited_path, tmp_path)
    summary = report.summary()
    print(summary)
    (ROOT / "docs" / "reliability-sharded.md").write_text(_sharded_page(config, summary))
    assert report.ok, summary
    assert report.outages, summary


def _sharded_page(config: Config, summary: str) -> str:
    commit = _commit()
    return (
        "# Reliability: the latest long chaos run on a sharded queue\n\n"
        f"Command: `make chaos CHAOS_SEED={config.seed}` (at commit {commit}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores).\n\n"
        "One queue over two 3-node rqlite clusters (shards s0 and s1, fast Raft timers), the "
        "same publishers and workers as [the single-cluster run](reliability.md), and a "
        "nemesis that hits the clusters in turn: kill -9 of a leader (restarted 0.5-2 s "
        "later), SIGSTOP of a leader or follower, SIGSTOP of a worker process, and "
        f"**shard_down**: every node of one cluster killed for {config.outage[0]:g}-"
        f"{config.outage[1]:g} s, then restarted. The lines `shard sN down` give the other "
        "shard's claims per second during the outage against the same span before it. The "
        "numbers read as in [reliability.md](reliability.md).\n\n"
        "```\n" + summary + "\n```\n"
    )


# -------------------------------------------------------- failover with the library's defaults

RESUME_WITHIN = 2.0


def _check_failover(report: FailoverReport) -> None:
    summary = report.summary()
    assert report.ok, summary
    assert report.faults, summary
    assert report.leases_lost == 0, summary
    assert not report.duplicates, summary  # handlers are shorter than the visibility
    assert not report.overlaps, summary  # no lease lapsed, so no two holders at once
    for fault in report.faults:
        assert fault.elected is not None, summary
        assert fault.resumed is not None and fault.resumed <= RESUME_WITHIN, summary


def test_failover_with_the_defaults(rqlited_path: str, tmp_path: Path) -> None:
    """Two Workers (threads and asyncio) with the library's defaults and leases of 2 s: a
    3 s freeze of the leader and a 4 s cut of the leader: acks resume within 2 s of each,
    no message is delivered twice, nothing is lost, FIFO and exclusivity hold."""
    config = FailoverConfig(seed=int(os.environ.get("CHAOS_SEED", "3")), faults=2)
    config.kinds = (FREEZE, PARTITION)
    report = run_failover(config, rqlited_path, tmp_path, order=[FREEZE, PARTITION])
    print(report.summary())
    _check_failover(report)


@pytest.mark.slow
def test_long_failover_with_the_defaults(rqlited_path: str, tmp_path: Path) -> None:
    faults = int(os.environ.get("CHAOS_FAULTS", "12"))
    config = FailoverConfig(seed=int(os.environ.get("CHAOS_SEED", "20261201")), faults=faults)
    order = [FREEZE, PARTITION] * (faults // 2)
    report = run_failover(config, rqlited_path, tmp_path, order=order)
    summary = report.summary()
    print(summary)
    _write_failover_section(config, summary)
    _check_failover(report)


FAILOVER_BEGIN, FAILOVER_END = "<!-- failover: begin -->", "<!-- failover: end -->"
LINKS_BEGIN, LINKS_END = "<!-- links: begin -->", "<!-- links: end -->"
"""The link faults' section (test_link_faults.py writes it)."""


def _write_failover_section(config: FailoverConfig, summary: str) -> None:
    """The failover run's section of docs/reliability.md (the long chaos run keeps it)."""
    commit = _commit()
    section = (
        f"{FAILOVER_BEGIN}\n## Failover with the library's defaults\n\n"
        f"Command: `make chaos CHAOS_SEED={config.seed}` "
        "(`tests/chaos/test_chaos.py::test_long_failover_with_the_defaults`; a short version, "
        f"one freeze and one cut, runs in `make test`), at commit {commit}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, {os.cpu_count()} cores.\n\n"
        "Two Workers, one on threads and one on asyncio, 16 slots each, leases of "
        f"{config.visibility:g} s, and nothing else tuned: the transports' default `timeout` "
        "(10 s), `deadline` (15 s) and the rest. A 3-node cluster (fast Raft timers: "
        "heartbeat 200 ms, election 400 ms), each node in its own network namespace; a "
        "publisher streams messages (with dedup ids) into "
        f"{config.groups} groups; handlers take {config.handler_time[0] * 1000:g}-"
        f"{config.handler_time[1] * 1000:g} ms. The nemesis alternates a freeze of the leader "
        f"(SIGSTOP, {config.freeze:g} s) and a cut of the leader from its peers (iptables DROP "
        f"in its namespace, {config.partition:g} s; clients still reach it), "
        f"{config.gap[0]:g}-{config.gap[1]:g} s apart.\n\n"
        "Per fault: **new leader after**, from the fault to the first of the other nodes "
        "saying it leads (polled every 20 ms); **acks resumed after**, from the fault to the "
        "end of the first Worker round trip that started after it and applied acks. "
        "**Duplicates** are messages delivered more than once, by cause; **settlements "
        "reported lost** are the Workers' `LeaseLost` (their leases lapsed and were taken "
        "over). A request gives its node up after at most a third of the leases' visibility "
        "(or a second), so a frozen or cut-off leader costs that much, not the 10 s "
        "`timeout`; the node is then suspected and skipped, and the round is resent (it is "
        "safe to: claims by their token, settlements by their records); meanwhile the "
        "Worker's lease keeper extends the leases a stuck round would have.\n\n"
        "```\n" + summary + "\n```\n" + FAILOVER_END + "\n"
    )
    _put_section(FAILOVER_BEGIN, FAILOVER_END, section)


def _commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()


def _put_section(begin: str, end: str, section: str) -> None:
    """Put `section` (marked by `begin` and `end`) in docs/reliability.md, in place of the
    one there, else at the end."""
    page = ROOT / "docs" / "reliability.md"
    text = page.read_text()
    if begin in text:
        before, rest = text.split(begin, 1)
        text = before + section + rest.split(end, 1)[1].lstrip("\n")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    page.write_text(text)


def _kept_sections() -> str:
    """The sections of the current docs/reliability.md that other runs wrote (failover,
    chains): kept when the long chaos run makes the page anew."""
    page = ROOT / "docs" / "reliability.md"
    text = page.read_text() if page.exists() else ""
    kept = [
        begin + text.split(begin, 1)[1].split(end, 1)[0] + end + "\n"
        for begin, end in (
            (FAILOVER_BEGIN, FAILOVER_END),
            (CHAINS_BEGIN, CHAINS_END),
            (LINKS_BEGIN, LINKS_END),
            (BATCHES_BEGIN, BATCHES_END),
        )
        if begin in text
    ]
    return "\n".join(kept)


# ------------------------------------------------------- exactly-once effects: chains of hops


def test_chains_of_follow_ups_have_exactly_one_message_per_hop(
    rqlited_path: str, tmp_path: Path
) -> None:
    """Each hop's handler returns the next hop (follow-ups): under leader kills, freezes and
    cuts, and worker processes killed, with leases shorter than the faults, every hop of every
    chain is one message: none lost, none doubled."""
    config = ChainConfig(
        seed=int(os.environ.get("CHAOS_SEED", "5")),
        chains=10,
        hops=25,
        after_publish=0.25,
        faults=4,
    )
    report = run_chains(config, rqlited_path, tmp_path)
    print(report.summary())
    assert report.exactly_once, report.summary()
    assert report.redelivered > 0, "no message came back: the faults proved nothing"


@pytest.mark.slow
@pytest.mark.parametrize("shards", [1, 2])
def test_long_chains_of_follow_ups(rqlited_path: str, tmp_path: Path, shards: int) -> None:
    config = ChainConfig(
        seed=int(os.environ.get("CHAOS_SEED", "21")),
        chains=40,
        hops=30,
        after_publish=0.1,
        faults=12,
        shards=shards,
    )
    report = run_chains(config, rqlited_path, tmp_path)
    print(report.summary())
    _CHAIN_RUNS[f"follow-ups, {shards} cluster(s)"] = report.summary()
    assert report.exactly_once, report.summary()


@pytest.mark.slow
def test_publish_then_ack_doubles_hops_under_the_same_faults(
    rqlited_path: str, tmp_path: Path
) -> None:
    """The counter-example: the handler publishes the next hop, then returns (its ack). A
    handler killed, or whose lease lapsed, between the two publishes again when the message
    comes back."""
    config = ChainConfig(
        mode=PUBLISH_THEN_ACK,
        seed=int(os.environ.get("CHAOS_SEED", "21")),
        chains=40,
        hops=30,
        after_publish=0.1,
        faults=12,
    )
    report = run_chains(config, rqlited_path, tmp_path)
    print(report.summary())
    _CHAIN_RUNS["publish then ack, 1 cluster"] = report.summary()
    _write_chain_section()
    assert report.doubled, "the counter-example doubled nothing: the faults missed it"
    assert not report.lost


_CHAIN_RUNS: dict[str, str] = {}
CHAINS_BEGIN, CHAINS_END = "<!-- chains: begin -->", "<!-- chains: end -->"


def _write_chain_section() -> None:
    """The chain runs' section of docs/reliability.md."""
    commit = _commit()
    runs = "\n\n".join(f"{name}:\n{summary}" for name, summary in _CHAIN_RUNS.items())
    section = (
        f"{CHAINS_BEGIN}\n## Exactly-once effects: chains of hops\n\n"
        "Command: `make chaos` (`tests/chaos/test_chaos.py`, the chain tests; a short one runs "
        f"in `make test`), at commit {commit}, {time.strftime('%Y-%m-%d', time.gmtime())}.\n\n"
        "Chains of messages: each hop's handler produces the chain's next hop into a random "
        "group (on either shard of the sharded run), in Worker processes, while leaders are "
        "killed, frozen and cut off and worker processes are SIGKILLed; leases (1 s) are "
        "shorter than the faults, so messages come back. With follow-ups (the handler returns "
        "the next hop, published with its ack) every hop of every chain is one message. With "
        "the handler publishing the next hop and then returning, the same faults double hops: "
        "a handler killed, or whose lease lapsed, after its publish and before its ack "
        "publishes again when its message comes back ([Exactly-once effects](effects.md)).\n\n"
        "```\n" + runs + "\n```\n" + CHAINS_END + "\n"
    )
    _put_section(CHAINS_BEGIN, CHAINS_END, section)


# ------------------------------------------------------- jobs: outcomes and cancels


def test_jobs_keep_their_outcomes_and_cancels_through_faults(
    rqlited_path: str, tmp_path: Path
) -> None:
    """Jobs on two clusters under worker SIGKILLs, a leader kill and one cluster down whole,
    cancelled while queued and running, read over and over: every outcome as its job's kind
    calls for, final outcomes never change or vanish, no cancelled job succeeded or retried,
    every cancel of a running job reached its handler or its outcome."""
    config = JobsConfig(seed=int(os.environ.get("CHAOS_SEED", "3")), jobs=40, faults=4)
    report = run_jobs(config, rqlited_path, tmp_path)
    print(report.summary())
    assert report.ok, report.summary()
    assert any(c.returned == "cancelling" for c in report.cancels), "no running job cancelled"
    assert report.observations > config.jobs * 5


@pytest.mark.slow
def test_long_jobs_run(rqlited_path: str, tmp_path: Path) -> None:
    config = JobsConfig(
        seed=int(os.environ.get("CHAOS_SEED", "32")), jobs=200, faults=12, time_limit=300
    )
    report = run_jobs(config, rqlited_path, tmp_path)
    print(report.summary())
    assert report.ok, report.summary()


# ------------------------------------------------------- batches: callbacks exactly once


def test_batch_callbacks_come_once_through_faults(rqlited_path: str, tmp_path: Path) -> None:
    """Batches on two clusters under worker SIGKILLs, a leader kill and one cluster down
    whole: each callback exactly once, never before its batch's last settlement, the counts
    exact."""
    config = BatchesConfig(
        seed=int(os.environ.get("CHAOS_SEED", "11")),
        batches=20,
        size=10,
        faults=4,
        fail_share=0.1,
        grow_share=0.1,
    )
    report = run_batches(config, rqlited_path, tmp_path)
    print(report.summary())
    assert report.ok, report.summary()
    assert report.again > 0, "no message ran twice: the faults proved nothing"


@pytest.mark.slow
def test_long_batch_run(rqlited_path: str, tmp_path: Path) -> None:
    config = BatchesConfig(seed=int(os.environ.get("CHAOS_SEED", "33")), faults=12)
    report = run_batches(config, rqlited_path, tmp_path)
    print(report.summary())
    _BATCH_RUNS["batches"] = report.summary()
    assert report.ok, report.summary()


@pytest.mark.slow
def test_a_counter_in_the_handler_under_the_same_faults(rqlited_path: str, tmp_path: Path) -> None:
    """The counter-example: the same workload and faults, the handler counting its batch
    down and publishing the callback at zero."""
    config = BatchesConfig(mode=COUNTER, seed=int(os.environ.get("CHAOS_SEED", "33")), faults=12)
    report = run_batches(config, rqlited_path, tmp_path)
    print(report.summary())
    _BATCH_RUNS["counter in the handler"] = report.summary()
    _write_batches_section()
    assert report.anomalies, "the counter-example went wrong nowhere: the faults missed it"


_BATCH_RUNS: dict[str, str] = {}
BATCHES_BEGIN, BATCHES_END = "<!-- batches: begin -->", "<!-- batches: end -->"


def _write_batches_section() -> None:
    """The batch runs' section of docs/reliability.md."""
    runs = "\n\n".join(f"{name}:\n{summary}" for name, summary in _BATCH_RUNS.items())
    section = (
        f"{BATCHES_BEGIN}\n## Batches\n\n"
        "Command: `make chaos` (`tests/chaos/test_chaos.py`, the batch tests; a short one runs "
        f"in `make test`), at commit {_commit()}, {time.strftime('%Y-%m-%d', time.gmtime())}.\n\n"
        "200 batches of 20 messages on a queue over two 3-node clusters, in groups of both, "
        "some failing for good, some adding a message to their batch with their ack; Worker "
        "processes handle them and the callbacks while worker processes are SIGKILLed, a "
        "leader is killed and the second cluster goes down whole; leases (1 s) are shorter "
        "than the faults, so messages run again. With batches every batch had exactly one "
        "`on_complete` message (and one `on_success` when none failed), each claimed after "
        "every message of its batch had run for the last time, with exact counts. The same "
        "workload with the handler counting its batch down in a table of its own, publishing "
        "the callback at zero, under the same faults: see what it did "
        "([Batches](batches.md)).\n\n"
        "```\n" + runs + "\n```\n" + BATCHES_END + "\n"
    )
    _put_section(BATCHES_BEGIN, BATCHES_END, section)
