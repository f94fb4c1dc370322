"""The example alert rules of docs/alerts.md: well formed, naming only metrics a real worker
serves (scraped from a worker of a queue over two real rqlite shards), and, where promtool is
installed (Debian's `prometheus` package), valid rules that fire on the series each is for
(`promtool test rules`)."""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from rqlite_queue import Transport
from rqlite_queue.metrics import serve_metrics
from rqlite_queue.testing import Cluster
from rqlite_queue.worker import Worker

DOC = Path(__file__).resolve().parent.parent / "docs" / "alerts.md"
PROMTOOL = shutil.which("promtool")

PROMQL_WORDS = {"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring"}
"""The identifiers of an expression that name no series."""


def rules_text() -> str:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert len(blocks) == 1, "docs/alerts.md holds one rules file"
    return blocks[0]


def rules() -> list[dict[str, Any]]:
    loaded = yaml.safe_load(rules_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def series_names(expr: str) -> set[str]:
    """The metric names an expression reads: its identifiers, less functions (followed by
    `(`), label matchers and values (`{...}`), grouping labels (`by (...)`, `on (...)`),
    durations (`[5m]`), numbers and PromQL's keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    names = set()
    for found in re.finditer(r"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[found.end() :].lstrip()
        if rest.startswith("(") or found.group(0) in PROMQL_WORDS:
            continue
        names.add(found.group(0))
    return names


def unserved(served: set[str], expressions: list[str]) -> dict[str, set[str]]:
    return {e: series_names(e) - served for e in expressions if series_names(e) - served}


# ------------------------------------------------------------------------------ the rules


def test_every_rule_is_well_formed() -> None:
    found = rules()
    names = [rule["alert"] for rule in found]
    assert len(names) == len(set(names)) >= 10
    for rule in found:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule
        assert rule["annotations"]["summary"], rule
        assert series_names(rule["expr"]), rule


@pytest.fixture(scope="module")
def shard_b(rqlited_path: str) -> Iterator[Cluster]:
    with Cluster(1, binary=rqlited_path) as cluster:
        yield cluster


@pytest.fixture
def served(rqlite_cluster: Cluster, shard_b: Cluster) -> set[str]:
    """Every series name a worker of a sharded queue serves (its histogram's `_bucket`, ...)."""
    url = f"a={rqlite_cluster.url};b={shard_b.url}"
    with Transport.from_url(url, queue=f"alerts_{uuid.uuid4().hex[:8]}") as queue:
        worker = Worker(queue, lambda lease: None)
        with serve_metrics(worker, 0, host="127.0.0.1", stats_interval=0) as server:
            text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_metric_the_rules_name_is_served(served: set[str]) -> None:
    assert {"rqlite_queue_paused", "rqlite_queue_shard_up", "rqlite_queue_outbox"} <= served
    expressions = [rule["expr"] for rule in rules()]
    named = set().union(*map(series_names, expressions))
    assert {"rqlite_queue_priority_oldest_age_seconds", "rqlite_queue_held_groups"} <= named
    assert unserved(served, expressions) == {}
    # The check sees a name no worker serves, and the parts of an expression that are not names.
    wrong = (
        'max by (queue) (rqlite_queue_oldest_age{priority="4", x=~"a b"}[5m] offset 1h) > bool 1e3'
    )
    assert unserved(served, [wrong]) == {wrong: {"rqlite_queue_oldest_age"}}


# ------------------------------------------------------------------------------ promtool

# Each alert on series made to fire it, and on series that must not. Values are sampled every
# minute; `for:` runs from the first sample above the threshold.
PROMTOOL_TESTS = """
rule_files: [rules.yml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'rqlite_queue_paused{queue="q", instance="w1"}'
        values: '0 1x40'
      - series: 'rqlite_queue_paused{queue="q", instance="w2"}'
        values: '0 1x40'
      - series: 'rqlite_queue_oldest_age_seconds{queue="q", instance="w1"}'
        values: '0+60x20'
      - series: 'rqlite_queue_dead_letters{queue="q", instance="w1"}'
        values: '3x20 4x20'
      - series: 'rqlite_queue_held_groups{queue="q", instance="w1"}'
        values: '2x70'
      - series: 'rqlite_queue_shard_up{queue="q", shard="b", instance="w1"}'
        values: '1x5 0x10'
    alert_rule_test:
      - eval_time: 29m
        alertname: RqliteQueuePausedTooLong
        exp_alerts: []
      - eval_time: 31m
        alertname: RqliteQueuePausedTooLong
        exp_alerts:
          - exp_labels: {queue: q, severity: warning}
            exp_annotations:
              summary: "queue q has been paused for 30 minutes ('rqlite-queue resume')"
      - eval_time: 12m
        alertname: RqliteQueueBacklogOld
        exp_alerts: []
      - eval_time: 16m
        alertname: RqliteQueueBacklogOld
        exp_alerts:
          - exp_labels: {queue: q, severity: warning}
            exp_annotations:
              summary: "queue q: its oldest message is 16m 0s old"
      - eval_time: 20m
        alertname: RqliteQueueDeadLettersGrowing
        exp_alerts: []
      - eval_time: 22m
        alertname: RqliteQueueDeadLettersGrowing
        exp_alerts:
          - exp_labels: {queue: q, severity: warning}
            exp_annotations:
              summary: "queue q: 1 dead letters more than 15 minutes ago ('rqlite-queue dlq list')"
      - eval_time: 59m
        alertname: RqliteQueueGroupsHeld
        exp_alerts: []
      - eval_time: 61m
        alertname: RqliteQueueGroupsHeld
        exp_alerts:
          - exp_labels: {queue: q, severity: info}
            exp_annotations:
              summary: "queue q: 2 groups held ('rqlite-queue groups --state held')"
      - eval_time: 7m
        alertname: RqliteQueueShardDown
        exp_alerts: []
      - eval_time: 9m
        alertname: RqliteQueueShardDown
        exp_alerts:
          - exp_labels: {queue: q, shard: b, severity: critical}
            exp_annotations:
              summary: "queue q: shard b does not answer"
      - eval_time: 10m
        alertname: RqliteQueueWorkersAbsent
        exp_alerts:
          - exp_labels: {queue: default, severity: critical}
            exp_annotations:
              summary: "no worker of queue default reports metrics"

  # Work waits and nothing is claimed: fires, unless the queue is paused or workers claim.
  - interval: 1m
    input_series:
      - series: 'rqlite_queue_depth{queue="stuck", priority="0", instance="w1"}'
        values: '5x30'
      - series: 'rqlite_queue_depth{queue="stuck", priority="0", instance="w2"}'
        values: '5x30'
      - series: 'rqlite_queue_worker_claimed_total{queue="stuck", instance="w1"}'
        values: '7x30'
      - series: 'rqlite_queue_paused{queue="stuck", instance="w1"}'
        values: '0x30'
      - series: 'rqlite_queue_depth{queue="paused", priority="0", instance="w1"}'
        values: '5x30'
      - series: 'rqlite_queue_worker_claimed_total{queue="paused", instance="w1"}'
        values: '7x30'
      - series: 'rqlite_queue_paused{queue="paused", instance="w1"}'
        values: '1x30'
      - series: 'rqlite_queue_depth{queue="busy", priority="0", instance="w1"}'
        values: '5x30'
      - series: 'rqlite_queue_worker_claimed_total{queue="busy", instance="w1"}'
        values: '0+10x30'
      - series: 'rqlite_queue_worker_rounds_total{queue="default", instance="w1"}'
        values: '0+1x30'
    alert_rule_test:
      - eval_time: 25m
        alertname: RqliteQueueNotClaiming
        exp_alerts:
          - exp_labels: {queue: stuck, severity: critical}
            exp_annotations:
              summary: "queue stuck: messages wait, and no worker claimed one in 10 minutes"
      - eval_time: 25m
        alertname: RqliteQueueWorkersAbsent
        exp_alerts: []
"""


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian: prometheus)")
def test_promtool_checks_the_rules_and_each_alert_fires_on_its_series(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    (tmp_path / "rules.yml").write_text(rules_text())
    (tmp_path / "tests.yml").write_text(PROMTOOL_TESTS)
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules())} rules found" in checked.stdout
    tested = subprocess.run(
        [PROMTOOL, "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
