"""The dashboard's pure parts on canned input: the rates its charts draw, its reading of
rqlite's `/nodes` and `/status` replies (the browser tests read real ones), and how the tenants'
page writes numbers and limits and reads a weight."""

from __future__ import annotations

import calendar

import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from rqlite_queue import InvalidArgument
from rqlite_queue._protocol.http import applied_index, parse_nodes
from rqlite_queue.dashboard.app import _num, _rate_limit, _weight
from rqlite_queue.dashboard.history import History, chart, covered
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


T0 = float(calendar.timegm((2026, 12, 2, 1, 0, 0)))  # 01:00:00 UTC


def test_a_chart_spans_its_window_with_clock_ticks_and_a_value_axis() -> None:
    """The samples cover the last 4 minutes of a 10-minute window: the time axis still runs
    over the 10 minutes (the line starts at 60 % of the width), with ticks at round clock
    times; the value axis goes from 0 to a round number above the largest value."""
    points = [(T0 + 360 + 2 * i, float(i)) for i in range(121)]  # 01:06:00 to 01:10:00, 0..120
    c = chart([("depth", points)], start=T0, end=T0 + 600, gap=6, unit="messages")
    assert c.left == 64 and c.plot_width == 640 - 64 - 12
    ((cls, (line,)),) = c.series
    first, last = line.split()[0], line.split()[-1]
    assert cls == "depth" and first == f"{64 + 0.6 * c.plot_width:.1f},{c.plot_bottom:.1f}"
    assert last.startswith(f"{64 + c.plot_width:.1f},")
    assert [t.label for t in c.time_ticks] == ["01:00", "01:02", "01:04", "01:06", "01:08", "01:10"]
    assert c.time_ticks[0].at == 64 and c.time_ticks[-1].at == 64 + c.plot_width
    assert c.top_value == 150 and [t.label for t in c.value_ticks] == ["0", "50", "100", "150"]
    assert c.value_ticks[0].at == c.plot_bottom and c.value_ticks[-1].at == 10
    assert c.unit == "messages"


def test_a_chart_breaks_its_lines_where_no_sample_was_taken() -> None:
    points = [(T0 + t, 1.0) for t in (0, 2, 4, 100, 102, 300)]
    c = chart([("done", points), ("published", [])], start=T0, end=T0 + 600, gap=6, unit="msg/s")
    (_, done), (_, published) = c.series
    assert [len(line.split()) for line in done] == [3, 2, 1] and published == []
    assert c.top_value == 1 and [t.label for t in c.value_ticks] == [
        "0",
        "0.25",
        "0.5",
        "0.75",
        "1",
    ]


def test_a_short_chart_ticks_seconds_and_an_empty_one_has_an_axis() -> None:
    c = chart([("depth", [])], start=T0 + 5, end=T0 + 65, gap=6, unit="messages")
    assert [t.label for t in c.time_ticks] == [
        "01:00:10",
        "01:00:20",
        "01:00:30",
        "01:00:40",
        "01:00:50",
        "01:01:00",
    ]
    assert c.top_value == 1 and c.series == [("depth", [])]


def test_the_history_says_what_it_covers() -> None:
    history = History(window=600, every=2)
    assert covered(history, T0).startswith("no samples yet")
    history.add(T0 + 3, stats(0, 0))
    history.add(T0 + 243, stats(0, 0))
    assert covered(history, T0 + 245) == "since 01:00:03 UTC (4 min of samples, one every 2 s)"
    assert covered(history, T0 + 40) == "since 01:00:03 UTC (37 s of samples, one every 2 s)"


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
