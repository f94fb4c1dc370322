"""The dashboard's pure parts on canned input: the rates its charts draw, its reading of
rqlite's `/nodes` and `/status` replies (the browser tests read real ones), and how the tenants'
page writes numbers and limits and reads a weight."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from rqlite_queue import InvalidArgument
from rqlite_queue._protocol.http import applied_index, parse_nodes
from rqlite_queue.dashboard.app import _num, _rate_limit, _weight
from rqlite_queue.dashboard.history import History, polyline
from rqlite_queue.types import Stats, TenantInfo


def stats(depth: int, last_seq: int, dead: int = 0) -> Stats:
    return Stats(depth, 1, 0, 0, dead, None, {}, last_seq=last_seq)


def test_rates_count_published_and_done_and_skip_gaps() -> None:
    history = History(window=600, every=2)
    history.add(100.0, stats(depth=10, last_seq=10))
    history.add(102.0, stats(depth=14, last_seq=20))  # 10 published, 6 done in 2 s
    history.add(104.0, stats(depth=18, last_seq=24, dead=-4))  # 4 requeued: 4 "published"
    history.add(120.0, stats(depth=0, last_seq=24))  # after a gap: no rate
    rates = history.rates()
    assert [(r.at, r.published, r.done) for r in rates] == [(102.0, 5.0, 3.0), (104.0, 2.0, 0.0)]


def test_history_keeps_its_window_and_samples_at_its_pace() -> None:
    history = History(window=10, every=2)
    assert history.due(0.0)
    for t in range(0, 30, 2):
        history.add(float(t), stats(0, 0))
    assert [s.at for s in history.samples] == [18.0, 20.0, 22.0, 24.0, 26.0, 28.0]
    assert not history.due(29.0) and history.due(30.0)


def test_polyline_spans_the_box() -> None:
    assert polyline([], 600, 120, 1.0) == ""
    assert polyline([(0.0, 0.0), (5.0, 5.0), (10.0, 10.0)], 600, 120, 10.0) == (
        "0.0,120.0 300.0,60.0 600.0,0.0"
    )


def test_nodes_in_both_of_rqlites_shapes() -> None:
    keyed = {
        "n2": {"api_addr": "http://h2:4001", "reachable": True, "leader": False},
        "n1": {"api_addr": "http://h1:4001", "reachable": True, "leader": True},
        "bad": "not a node",
    }
    listed = {"nodes": [{"id": "n1", "api_addr": "http://h1:4001", "reachable": False}]}
    assert parse_nodes(keyed) == [
        ("n1", "http://h1:4001", True, True),
        ("n2", "http://h2:4001", True, False),
    ]
    assert parse_nodes(listed) == [("n1", "http://h1:4001", False, False)]
    assert parse_nodes(None) == [] and parse_nodes([1, 2]) == []


def test_applied_index_from_status() -> None:
    assert applied_index({"store": {"raft": {"applied_index": 42}}}) == 42
    assert applied_index({"store": {}}) is None
    assert applied_index(None) is None


def tenant(
    rate: float | None = None, burst: float | None = None, tokens: float | None = None
) -> TenantInfo:
    return TenantInfo("acme", 1.0, 0, 0, 0, 0, rate=rate, burst=burst, tokens=tokens)


def test_a_tenants_rate_limit_reads_as_a_sentence() -> None:
    assert _rate_limit(tenant()) == "\u2014"
    assert _rate_limit(tenant(rate=50.0, burst=10.0, tokens=3.2345)) == "50/s, burst 10, 3.2 left"
    assert _rate_limit(tenant(rate=0.5, burst=1.0, tokens=0.0)) == "0.5/s, burst 1, 0 left"
    assert _rate_limit(tenant(rate=2.0)) == "2/s"


def test_numbers_without_noise() -> None:
    assert [_num(v) for v in (4.0, 0.5, 2.25, 1_000_000.0, 0.001, None)] == [
        "4",
        "0.5",
        "2.25",
        "1000000",
        "0.001",
        "",
    ]
    assert _num(-0.01, 1) == "0" and _num(3.25, 1) == "3.2"


def test_a_weight_from_a_form_is_a_positive_number() -> None:
    assert _weight(" 2.5 ") == 2.5 and _weight("4") == 4.0
    for bad in (None, "", "0", "-1", "x", "nan", "inf", "1,5"):
        with pytest.raises(InvalidArgument, match="positive number"):
            _weight(bad)
