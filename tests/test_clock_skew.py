"""Clocks: each client measures the rqlite node's clock against its own from the `Date` of the
replies (no extra request), warns when they differ, and refuses a lease that other clients
would see lapse early; dedup ids survive a publisher whose clock runs ahead."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

import pytest

from rqlite_queue import RqliteTransport
from rqlite_queue.errors import ClockSkew
from rqlite_queue.testing import Cluster


def skewed(seconds: float) -> Callable[[], float]:
    return lambda: time.time() + seconds


@pytest.fixture
def queue() -> str:
    return f"skew_{uuid.uuid4().hex[:10]}"


@pytest.mark.parametrize("skew", [-5.0, 5.0])
def test_a_lease_is_refused_when_the_clock_is_off_by_more_than_a_quarter_of_it(
    rqlite_cluster3: Cluster, queue: str, skew: float, caplog: pytest.LogCaptureFixture
) -> None:
    with RqliteTransport(rqlite_cluster3.url, clock=skewed(skew), queue=queue) as q:
        with caplog.at_level(logging.WARNING, logger="rqlite_queue"):
            q.publish("g", 1)  # the first replies measure the skew
        assert "behind" in caplog.text if skew > 0 else "ahead of" in caplog.text
        assert 4.0 < abs(q.client.clock_skew()) < 6.0
        with pytest.raises(ClockSkew, match=r"(?i)ntp"):
            q.claim("w", 10)  # 5 s off is more than a quarter of 10 s
        assert q.stats().in_flight == 0  # nothing was leased
        lease = q.claim("w", 30)  # 5 s is less than a quarter of 30 s
        assert lease is not None
        with pytest.raises(ClockSkew):
            q.extend(lease, 10)
        q.ack(lease)


def test_the_allowed_skew_is_configurable(rqlite_cluster3: Cluster, queue: str) -> None:
    with RqliteTransport(rqlite_cluster3.url, clock=skewed(-5), queue=queue, max_skew=0.9) as q:
        q.publish("g", 1)
        assert q.claim("w", 10) is not None


def test_a_publisher_whose_clock_runs_ahead_does_not_forget_the_others_dedup_ids(
    rqlite_cluster3: Cluster, queue: str
) -> None:
    honest = RqliteTransport(rqlite_cluster3.url, queue=queue)
    ahead = RqliteTransport(rqlite_cluster3.url, clock=skewed(400), queue=queue)
    first = honest.publish("g", "pay order 42", dedup_id="order-42/pay")
    ahead.router.backend.core.chance = lambda: 0.0  # this publish prunes expired dedup ids
    ahead.publish("h", "other", dedup_id="order-7/pay")
    # The honest client's reply was lost, say: it publishes again, within its window.
    assert honest.publish("g", "pay order 42", dedup_id="order-42/pay") == first
    assert honest.stats().depth == 2
    honest.close()
    ahead.close()
