"""kombu's own integration tests, run against `rqlite_queue.kombu`: the suite's shared classes
(`t/integration/common.py` of the installed kombu's source distribution, downloaded from the
package index at test time into the user cache, never copied into this repository),
subclassed with this transport's connections, on the embedded file and on a 1-node cluster.

Which classes pass is stated below (`PASSING`, in docs/howto/celery.md too); the test fails if
one of them stops passing, or if another starts to (then the list and the docs are updated)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("kombu")

from sdists import sdist_files

from rqlite_queue.testing import Cluster

CLASSES = (
    "BasicFunctionality",
    "BaseExchangeTypes",
    "BaseTimeToLive",
    "BasePriority",
    "BaseMessage",
    "BaseEventLoop",
    "BaseFailover",
)
PASSING = {"BasicFunctionality", "BaseTimeToLive", "BaseMessage"}
"""kombu's classes whose every test passes on this transport."""
FAILING = {
    "BaseExchangeTypes::test_fanout": "no fanout: bindings are kept per process, as for SQS",
    "BasePriority::test_publish_requeue_consume": "priorities are a floor (priority_floor): "
    "groups at or above it go first, in round-robin order among them, not highest first",
    "BaseEventLoop::test_ack_from_another_thread": "kombu's event loop drives asynchronous "
    "transports only; this one polls",
    "BaseFailover::test_failover_switches_to_alternate_url": "every node of the list goes to "
    "the queue's client, which fails over by itself: kombu never switches URLs",
}
"""The tests of the other classes that fail, and why (the rest of each class passes)."""

SUITE = """
import os

import kombu
import pytest

import rqlite_queue.kombu  # the rqlite alias

from . import common

URL = os.environ["KOMBU_SUITE_URL"]
LIVE = os.environ.get("KOMBU_SUITE_LIVE")
OPTIONS = {
    "queue_name_prefix": os.environ["KOMBU_SUITE_PREFIX"],
    "polling_interval": 0.01,
    "visibility_timeout": 10,
    "priority_floor": 3,
}


@pytest.fixture
def connection():
    return kombu.Connection(URL, transport_options=dict(OPTIONS))


@pytest.fixture
def invalid_connection():
    return kombu.Connection(
        "rqlite://127.0.0.1:1", transport_options=dict(OPTIONS), connect_timeout=1
    )


@pytest.fixture
def failover_connection():
    if LIVE is None:
        pytest.skip("kombu's failover is between rqlite nodes")
    return kombu.Connection(
        ["rqlite://127.0.0.1:1", LIVE], transport_options=dict(OPTIONS), connect_timeout=1
    )

"""


def kombu_common() -> str:
    """`t/integration/common.py` of the installed kombu's sdist (downloaded once)."""
    path = "t/integration/common.py"
    return sdist_files("kombu", [path])[path]


SHORT = "not TimeToLive and not Failover and not failed_ and not empty and not routing_keys"
"""The default run's selection: the tests that do not wait seconds on purpose."""


def start_suite(
    where: Path, url: str, live: str | None, select: str | None = None
) -> subprocess.Popen[str]:
    """kombu's classes on `url`, in a pytest of their own (report in `where`/report.xml)."""
    package = where / "kombu_suite"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "common.py").write_text(kombu_common())
    (package / "test_rqlite_queue.py").write_text(
        SUITE + "".join(f"\nclass test_{name}(common.{name}):\n    pass\n" for name in CLASSES)
    )
    env = {**os.environ, "KOMBU_SUITE_URL": url, "KOMBU_SUITE_PREFIX": f"k{uuid.uuid4().hex[:6]}_"}
    if live:
        env["KOMBU_SUITE_LIVE"] = live
    argv = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
        "-o", "python_classes=test_*", "--timeout", "60", f"--junitxml={where / 'report.xml'}",
        "--rootdir", str(where), str(package), *(["-k", select] if select else []),
    ]  # fmt: skip
    return subprocess.Popen(
        argv, cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def outcomes_of(where: Path, proc: subprocess.Popen[str]) -> dict[str, dict[str, str]]:
    """class -> test -> passed, failed or skipped."""
    out, _ = proc.communicate(timeout=600)
    report = where / "report.xml"
    assert report.exists(), out[-4000:]
    outcomes: dict[str, dict[str, str]] = {name: {} for name in CLASSES}
    for case in ET.parse(report).iter("testcase"):
        name = case.get("classname", "").rsplit(".", 1)[-1].removeprefix("test_")
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        outcome = "skipped" if skipped else "failed" if failed else "passed"
        outcomes[name][case.get("name", "")] = outcome
    print(out[-3000:])
    return outcomes


def check(outcomes: dict[str, dict[str, str]], live: bool, full: bool = True) -> None:
    table = "\n".join(
        f"  {name}: " + ", ".join(f"{t} {o}" for t, o in sorted(tests.items()) if o != "passed")
        for name, tests in outcomes.items()
    )
    ran = {f"{n}::{t}" for n, tests in outcomes.items() for t in tests}
    failing = {
        f"{n}::{t}" for n, tests in outcomes.items() for t, o in tests.items() if o == "failed"
    }
    expected = {f for f in FAILING if f in ran and (live or "Failover" not in f)}
    assert failing == expected, f"kombu's tests on this transport, other than passed:\n{table}"
    if full:
        passing = {name for name, tests in outcomes.items() if set(tests.values()) == {"passed"}}
        if live:
            assert passing == PASSING, f"kombu's tests on this transport:\n{table}"
        assert all(outcomes[name] for name in CLASSES), outcomes
    assert len(ran) >= 15, outcomes


def test_kombu_suite_short(tmp_path: Path, rqlite_cluster: Cluster) -> None:
    """The default run's share: kombu's tests that do not wait on purpose, on a 1-node cluster."""
    node = rqlite_cluster.nodes[0].http_addr
    proc = start_suite(tmp_path, f"rqlite://{node}", f"rqlite://{node}", SHORT)
    check(outcomes_of(tmp_path, proc), live=True, full=False)


@pytest.mark.slow
def test_kombu_suite_on_the_embedded_queue_and_rqlite(
    tmp_path: Path, rqlite_cluster: Cluster
) -> None:
    """Both at once (kombu's tests mostly wait: about a minute each, a minute together)."""
    node = rqlite_cluster.nodes[0].http_addr
    embedded = start_suite(tmp_path / "sqlite", f"rqlite+sqlite:///{tmp_path}/broker.db", None)
    on_rqlite = start_suite(tmp_path / "rqlite", f"rqlite://{node}", f"rqlite://{node}")
    check(outcomes_of(tmp_path / "rqlite", on_rqlite), live=True)
    check(outcomes_of(tmp_path / "sqlite", embedded), live=False)
