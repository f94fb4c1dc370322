"""The dashboard (`rqlite-queue dashboard`), served by the real command on a real 3-node
cluster: over plain HTTP (access control, CSRF, read-only mode, escaping), then in headless
Chromium (Debian's package, driven by Playwright): the overview's numbers equal `stats()`, the
page refreshes itself, actions through the UI change the queue as the API would, a payload
made to run script stays text.

The docs' pictures come from one staged demo queue (`stage_demo`: orders, payments and emails
of three tenants, with realistic dead letters, schedules, a held group and minutes of history),
taken by `test_a_staged_demo_queue_page_by_page` with `RQLITE_QUEUE_SCREENSHOTS=1` (`make
screenshots`); the tests with hostile payloads (`a_busy_queue`) check escaping, never pose."""

from __future__ import annotations

import dataclasses
import html
import http.server
import os
import random
import re
import select
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from rqlite_queue import Lease, LeaseLost, Transport
from rqlite_queue.testing import Cluster
from rqlite_queue.types import TenantInfo

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

BIN = Path(sys.executable).parent
EXE = shutil.which("rqlite-queue", path=str(BIN))
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "img"
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'

pytestmark = pytest.mark.skipif(EXE is None, reason="rqlite-queue is not installed")


@contextmanager
def dashboard(url: str, queue: str, *options: str, timeout: float = 15.0) -> Iterator[str]:
    """`rqlite-queue dashboard` on a free port; yields its base URL; stops it with SIGTERM."""
    assert EXE is not None
    process = subprocess.Popen(
        [
            EXE,
            "--url",
            url,
            "--queue",
            queue,
            "--timeout",
            str(timeout),
            "dashboard",
            "--port",
            "0",
            "--refresh",
            "0.5",
            *options,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("RQLITE_QUEUE_DASH")},
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 30)
        line = process.stdout.readline() if ready else ""
        found = re.search(r"on (http://127\.0\.0\.1:\d+)/ ", line)
        if not found:
            process.kill()
            raise AssertionError(f"no address in {line!r}: {process.communicate()[1][-2000:]}")
        yield found.group(1)
    finally:
        process.terminate()
        try:
            assert process.wait(15) == 0
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise


@pytest.fixture
def queue_name() -> str:
    return f"dash_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def q(rqlite_cluster3: Cluster, queue_name: str) -> Iterator[Transport]:
    transport = Transport.from_url(rqlite_cluster3.url, queue=queue_name)
    yield transport
    transport.close()


def a_busy_queue(q: Transport) -> Lease:
    """Messages in every state: ready (order-4), leased (order-1, the lease returned), parked
    (order-2), held (order-3), delayed (later), dead (poison), with an XSS payload among the
    messages and the dead letters."""
    q.publish_many([("order-1", {"step": "charge"}), ("order-1", {"step": "ship"})])
    q.publish_many([("order-2", "a", 2), ("order-3", "b"), ("order-4", XSS), ("poison", XSS)])
    q.publish("later", "c", delay=3600)
    q.hold_group("order-3")
    lease = q.claim("w-lease", 300)
    assert lease is not None and lease.group_id == "order-1"
    parked = q.claim("w", 300)
    assert parked is not None and parked.group_id == "order-2"
    q.nack(parked, delay=600)
    others = {lease.group_id: lease for lease in q.claim_many("w", 300, 5)}
    assert sorted(others) == ["order-4", "poison"]
    q.nack(others["order-4"])
    q.dead_letter(others["poison"], "bad <b>card</b>")
    return lease


def snapshot(q: Transport) -> tuple[Any, ...]:
    """The queue's state, without the ages (they grow with the clock)."""
    return (
        dataclasses.replace(q.stats(), oldest_age=None),
        q.dead_letters(),
        [dataclasses.replace(g, head_age=None) for g in q.groups()],
    )


# ------------------------------------------------------------------------------ plain HTTP


def test_read_only_by_default_and_a_forged_post_changes_nothing(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport
) -> None:
    a_busy_queue(q)
    before = snapshot(q)
    with dashboard(rqlite_cluster3.url, queue_name) as base, httpx.Client(base_url=base) as http:
        page = http.get("/group", params={"id": "order-1"})
        assert page.status_code == 200
        assert "data-action" not in page.text and 'name="csrf"' not in page.text
        for action, data in [
            ("cancel", {"group_id": "order-1"}),
            ("purge_all", {}),
            ("pause", {}),
            ("requeue_all", {}),
        ]:
            forged = http.post(f"/action/{action}", data={**data, "csrf": "anything"})
            assert forged.status_code == 403, action
            assert "read-only" in forged.text
    assert snapshot(q) == before


def test_a_post_without_the_csrf_token_is_refused(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport
) -> None:
    a_busy_queue(q)
    before = snapshot(q)
    with (
        dashboard(rqlite_cluster3.url, queue_name, "--allow-actions") as base,
        httpx.Client(base_url=base) as http,
    ):
        page = http.get("/dead")
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token, "an actions dashboard puts its token in its forms"
        for data in ({}, {"csrf": ""}, {"csrf": "x" + token.group(1)}):
            refused = http.post("/action/purge_all", data=data)
            assert refused.status_code == 403 and "CSRF" in refused.text
        assert snapshot(q) == before
        done = http.post("/action/pause", data={"csrf": token.group(1), "next": "/"})
        assert done.status_code == 303 and done.headers["location"] == "/"
    assert q.stats().paused
    q.resume()


def test_payloads_and_reasons_are_escaped(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport
) -> None:
    a_busy_queue(q)
    with (
        dashboard(rqlite_cluster3.url, queue_name, "--allow-actions") as base,
        httpx.Client(base_url=base) as http,
    ):
        for page in (http.get("/dead"), http.get("/group", params={"id": "order-4"})):
            assert page.status_code == 200
            assert "<script>window.__xss" not in page.text
            assert "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in page.text
        assert "bad &lt;b&gt;card&lt;/b&gt;" in http.get("/dead").text
        policy = http.get("/").headers["content-security-policy"]
        assert policy.startswith("default-src 'self';") and "script-src" not in policy


def test_a_messages_page_shows_its_job_and_cancels_it_once_confirmed(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport
) -> None:
    """A message's page: its status, attempts, worker, progress, headers, payload (escaped);
    then its result, or its error; the cancel button asks to confirm first, then cancels; a
    message it does not know says so."""
    seq, queued = q.publish_many(
        [
            {"group_id": "job", "event": XSS, "keep": 600, "headers": {"trace": "t-1"}},
            {"group_id": "job", "event": "next", "keep": 600},
        ]
    )
    lease = q.claim("w-page", 300)
    assert lease is not None and lease.seq == seq
    q.extend(lease, 300, progress={"done": 3, "of": 7})
    with (
        dashboard(rqlite_cluster3.url, queue_name, "--allow-actions") as base,
        httpx.Client(base_url=base) as http,
    ):
        page = http.get("/message", params={"group": "job", "seq": seq})
        assert page.status_code == 200
        text = html.unescape(re.sub(r"<[^>]+>", " ", page.text))
        for shown in ("running", "w-page", '"done": 3', "trace", "t-1"):
            assert shown in text, shown
        assert "<script>window.__xss" not in page.text and "&lt;script&gt;" in page.text
        assert 'data-action="cancel_job"' in page.text
        group = http.get("/group", params={"id": "job"}).text
        assert f'/message?group=job&amp;seq={queued}"' in group  # the group links its messages
        token = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert token is not None
        form = {"csrf": token.group(1), "group_id": "job", "seq": str(queued), "reason": "no"}
        asked = http.post("/action/cancel_job", data={**form, "next": "/"})
        assert asked.status_code == 200 and "Cancel message" in asked.text
        assert q.result("job", queued).status == "queued"  # nothing done yet
        done = http.post("/action/cancel_job", data={**form, "confirmed": "yes", "next": "/"})
        assert done.status_code == 303
        assert (q.result("job", queued).status, q.result("job", queued).reason) == (
            "cancelled",
            "no",
        )
        q.ack(lease, result={"ok": True})
        page = http.get("/fragments/message", params={"group": "job", "seq": seq})
        assert "succeeded" in page.text and "&#34;ok&#34;: true" in page.text
        gone = http.get("/message", params={"group": "job", "seq": 10**6})
        assert gone.status_code == 200 and 'id="message-unknown"' in gone.text
        stats = http.get("/").text
        assert 'data-stat="outcomes"' in stats


def test_basic_auth_and_bearer_token(rqlite_cluster3: Cluster, queue_name: str) -> None:
    password = "p:w@/,%?#&'\"<>"  # every character a URL or a header might trip on
    with (
        dashboard(
            rqlite_cluster3.url,
            queue_name,
            "--basic-auth",
            f"admin:{password}",
            "--token",
            "s3cret",
        ) as base,
        httpx.Client(base_url=base) as http,
    ):
        refused = http.get("/")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Basic")
        assert http.get("/", auth=("admin", "wrong")).status_code == 401
        assert http.get("/", auth=("admin", password)).status_code == 200
        assert http.get("/static/htmx.min.js").status_code == 401
        bearer = {"Authorization": "Bearer s3cret"}
        assert http.get("/groups", headers=bearer).status_code == 200
        assert http.get("/", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_a_sharded_queues_overview_shows_its_outbox(
    rqlite_cluster_factory: Callable[..., Cluster], queue_name: str
) -> None:
    """The follow-ups waiting in the shards' outboxes (one for a shard that is down)."""
    a, b = rqlite_cluster_factory(1), rqlite_cluster_factory(1)
    url = f"a={a.url};b={b.url}"
    with Transport.from_url(url, queue=queue_name, deadline=2.0) as sharded:
        on_a = next(f"g{i}" for i in range(100) if sharded.shard_of(f"g{i}") == "a")
        on_b = next(f"g{i}" for i in range(100) if sharded.shard_of(f"g{i}") == "b")
        sharded.publish(on_a, 1)
        lease = sharded.claim("w", visibility=60)
        assert lease is not None
        b.nodes[0].stop()
        sharded.ack(lease, publish=[(on_b, "waits")])
    with (
        dashboard(url, queue_name, timeout=2.0) as base,
        httpx.Client(base_url=base, timeout=30) as http,
    ):
        page = http.get("/")
        assert page.status_code == 200
        assert re.search(r'data-stat="outbox">1<', page.text), page.text
    with dashboard(a.url, queue_name) as base, httpx.Client(base_url=base) as http:
        assert 'data-stat="outbox"' not in http.get("/").text  # not a sharded queue


def test_bad_query_arguments_give_an_error_page(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport
) -> None:
    q.publish("g", 1)
    with dashboard(rqlite_cluster3.url, queue_name) as base, httpx.Client(base_url=base) as http:
        for params in ({"state": "stuck"}, {"min_priority": "9"}, {"min_priority": "x"}):
            page = http.get("/groups", params=params)
            assert page.status_code == 400, params
            assert 'id="error"' in page.text


# ------------------------------------------------------------------------------ tenants

TENANT_XSS = "<script>x</script>"


def tenant_rows(page: str) -> list[tuple[str, dict[str, str]]]:
    """The tenants' table of a page: (name, its cells by data-field), unescaped."""
    rows = []
    for name, row in re.findall(r'<tr data-tenant="([^"]*)">(.*?)</tr>', page, re.DOTALL):
        cells = re.findall(r'<td data-field="(\w+)"[^>]*>(.*?)</td>', row, re.DOTALL)
        rows.append((html.unescape(name), {k: html.unescape(v.strip()) for k, v in cells}))
    return rows


def as_cells(t: TenantInfo) -> dict[str, str]:
    """A tenant's row as the page must show it (none of these tenants has limits)."""
    return {
        "weight": f"{t.weight:g}",
        "ready": str(t.ready),
        "groups": str(t.groups),
        "in_flight": str(t.in_flight),
        "depth": str(t.depth),
        "rate": "\u2014",
        "group_bound": "\u2014",
    }


def test_the_tenants_page_lists_escapes_and_pages(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport
) -> None:
    q.publish("plain", 1)
    q.publish_many([{"group_id": f"acme-{i}", "event": i, "tenant": "acme"} for i in range(3)])
    q.publish("acme-0", "second", tenant="acme")
    q.publish("evil", XSS, tenant=TENANT_XSS)
    many = [f"t{i:02d} &?#/=" for i in range(60)]  # each a character a link might trip on
    q.publish_many([{"group_id": f"g-{t}", "event": 1, "tenant": t} for t in many])
    q.set_tenant("acme", weight=4)
    assert len(q.claim_many("w", 300, 3)) == 3  # some leases in flight
    with dashboard(rqlite_cluster3.url, queue_name) as base, httpx.Client(base_url=base) as http:
        assert 'href="/tenants">Tenants</a>' in http.get("/").text
        first = http.get("/tenants")
        assert first.status_code == 200
        expected = q.tenants(limit=50)
        assert [t.name for t in expected][:3] == ["", TENANT_XSS, "acme"]
        assert tenant_rows(first.text) == [(t.name, as_cells(t)) for t in expected]
        assert dict(tenant_rows(first.text))["acme"]["weight"] == "4"
        assert dict(tenant_rows(first.text))["acme"]["depth"] == "4"
        assert "(default)" in first.text and 'id="tenants-off"' not in first.text
        assert TENANT_XSS not in first.text and "<script>window.__xss" not in first.text
        assert html.escape(TENANT_XSS, quote=False) in first.text
        assert 'name="csrf"' not in first.text and "set_tenant_weight" not in first.text
        link = re.search(r'<a id="next-page" href="([^"]+)"', first.text)
        assert link, "a full page links to the next one"
        href = html.unescape(link.group(1))
        assert href == "/tenants?after=" + quote(many[46], safe="")
        second = http.get(href)
        assert second.status_code == 200
        assert tenant_rows(second.text) == [
            (t.name, as_cells(t)) for t in q.tenants(limit=50, after=many[46])
        ]
        assert [name for name, _ in tenant_rows(second.text)] == many[47:]
        assert 'id="next-page"' not in second.text and 'id="first-page"' in second.text
        fragment = http.get("/fragments/tenants", params={"after": many[46]})
        assert fragment.status_code == 200 and "<html" not in fragment.text
        assert [name for name, _ in tenant_rows(fragment.text)] == many[47:]
        page = http.get("/tenants")
        assert re.search(r'hx-get="/fragments/tenants\?[^"]*" hx-trigger="every 500ms"', page.text)
        assert tenant_rows(http.get("/tenants", params={"after": "zzz"}).text) == []


def test_the_tenants_page_explains_when_tenants_are_off(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport
) -> None:
    q.publish("g", 1)
    with dashboard(rqlite_cluster3.url, queue_name) as base, httpx.Client(base_url=base) as http:
        for path in ("/tenants", "/fragments/tenants"):
            page = http.get(path)
            assert page.status_code == 200
            assert 'id="tenants-off"' in page.text and "tenant-table" not in page.text
        q.publish("h", 1, tenant="acme")
        page = http.get("/tenants")
        assert 'id="tenants-off"' not in page.text
        assert [name for name, _ in tenant_rows(page.text)] == ["", "acme"]


def test_setting_a_tenants_weight(rqlite_cluster3: Cluster, queue_name: str, q: Transport) -> None:
    q.publish("g", 1, tenant="acme")

    def weights() -> dict[str, float]:
        return {t.name: t.weight for t in q.tenants()}

    assert weights() == {"": 1.0, "acme": 1.0}
    with dashboard(rqlite_cluster3.url, queue_name) as base, httpx.Client(base_url=base) as http:
        forged = http.post(
            "/action/set_tenant_weight", data={"csrf": "x", "tenant": "acme", "weight": "5"}
        )
        assert forged.status_code == 403 and "read-only" in forged.text
    assert weights() == {"": 1.0, "acme": 1.0}
    with (
        dashboard(rqlite_cluster3.url, queue_name, "--allow-actions") as base,
        httpx.Client(base_url=base) as http,
    ):
        page = http.get("/tenants")
        form = re.search(r'<form[^>]*id="weight-form".*?</form>', page.text, re.DOTALL)
        assert form, "an actions dashboard has the weight form"
        assert 'action="/action/set_tenant_weight"' in form.group(0)
        assert re.findall(r'<option value="([^"]*)"', form.group(0)) == ["", "acme"]
        assert '<label for="weight-value">Weight</label>' in form.group(0)
        assert '<label for="weight-tenant">Tenant</label>' in form.group(0)
        token = re.search(r'name="csrf" value="([^"]+)"', form.group(0))
        assert token
        good = {"csrf": token.group(1), "tenant": "acme", "weight": "2.5", "next": "/tenants"}
        for csrf in (None, "", "x" + token.group(1)):
            data = {k: v for k, v in good.items() if k != "csrf"}
            if csrf is not None:
                data["csrf"] = csrf
            refused = http.post("/action/set_tenant_weight", data=data)
            assert refused.status_code == 403 and "CSRF" in refused.text
        for weight in ("0", "-2", "abc", "", "  ", "nan", "inf", "-inf"):
            bad = http.post("/action/set_tenant_weight", data={**good, "weight": weight})
            assert bad.status_code == 400, weight
            assert "the weight must be a positive number" in bad.text, weight
        no_weight = {k: v for k, v in good.items() if k != "weight"}
        assert http.post("/action/set_tenant_weight", data=no_weight).status_code == 400
        no_tenant = {k: v for k, v in good.items() if k != "tenant"}
        refused = http.post("/action/set_tenant_weight", data=no_tenant)
        assert refused.status_code == 400 and "no tenant chosen" in refused.text
        too_big = http.post("/action/set_tenant_weight", data={**good, "weight": "1e9"})
        assert too_big.status_code == 400 and 'id="error"' in too_big.text
        assert weights() == {"": 1.0, "acme": 1.0}

        done = http.post("/action/set_tenant_weight", data=good)
        assert done.status_code == 303 and done.headers["location"] == "/tenants"
        assert weights() == {"": 1.0, "acme": 2.5}
        done = http.post("/action/set_tenant_weight", data={**good, "tenant": "", "weight": "0.5"})
        assert done.status_code == 303
        assert weights() == {"": 0.5, "acme": 2.5}
        rows = dict(tenant_rows(http.get("/tenants").text))
        assert rows["acme"]["weight"] == "2.5" and rows[""]["weight"] == "0.5"


# ------------------------------------------------------------------------------ the browser


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        pytest.skip("no Chromium: scripts/browser-deps installs Debian's package (needs root)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                # A DNS-rebinding page: its name, in the browser, is the dashboard's address.
                "--host-resolver-rules=MAP rebind.test 127.0.0.1",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


def shot(page: Any, name: str, *, full_page: bool = True) -> None:
    if os.environ.get("RQLITE_QUEUE_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"dashboard-{name}.png"), full_page=full_page)


def stat(page: Any, name: str) -> str:
    return str(page.locator(f'[data-stat="{name}"]').inner_text()).strip()


def wait_until(condition: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_the_overview_shows_stats_and_refreshes_itself(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport, page: Any
) -> None:
    a_busy_queue(q)
    with dashboard(rqlite_cluster3.url, queue_name) as base:
        page.goto(base + "/")
        stats = q.stats()
        for name in ("depth", "groups", "in_flight", "parked", "held", "delayed", "dead"):
            assert stat(page, name) == str(getattr(stats, name)), name
        for priority in range(5):
            cell = page.locator(f'[data-priority="{priority}"]').inner_text()
            assert cell == str(stats.by_priority.get(priority, 0))
        rows = page.locator("#nodes tr[data-node]")
        assert rows.count() == 3
        assert page.locator("#nodes").inner_text().count("leader") == 1
        assert page.locator("[data-action]").count() == 0  # read-only: no buttons
        q.publish_many([("new", i) for i in range(5)])
        page.wait_for_function(
            "n => document.querySelector('[data-stat=depth]').textContent.trim() === n",
            arg=str(stats.depth + 5),
        )
        assert page.evaluate("window.__xss") is None


def test_groups_page_filters_and_opens_a_group(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport, page: Any
) -> None:
    a_busy_queue(q)
    with dashboard(rqlite_cluster3.url, queue_name) as base:
        page.goto(base + "/groups")
        listed = page.locator("#group-table tr[data-group]")
        assert [listed.nth(i).get_attribute("data-group") for i in range(listed.count())] == [
            g.group_id for g in q.groups()
        ]
        page.select_option("select[name=state]", "leased")
        page.click("text=Filter")
        page.wait_for_url(re.compile(r"state=leased"))
        assert page.locator("#group-table tr[data-group]").count() == 1
        page.click("#group-table a")
        page.wait_for_url(re.compile(r"/group\?id=order-1"))
        assert page.locator('[data-field="state"]').inner_text() == "leased"
        assert "w-lease" in page.locator("#group-info").inner_text()
        assert '"step": "charge"' in page.locator("#messages").inner_text()


def test_cancel_and_requeue_through_the_ui(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport, page: Any
) -> None:
    lease = a_busy_queue(q)
    with dashboard(rqlite_cluster3.url, queue_name, "--allow-actions") as base:
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(base + "/group?id=order-1")
        page.get_by_label("Reason for its dead letters").fill("refunded")
        page.wait_for_timeout(1500)  # live refreshes must not wipe what the operator typed
        page.click('[data-action="cancel"]')
        page.wait_for_selector("#confirm")  # a page that asks first: nothing done yet
        assert "its 2 messages become dead letters" in page.locator("#confirm").inner_text()
        assert q.dead_letters(group_id="order-1") == []
        page.click('[data-confirmed="yes"]')
        page.wait_for_url(re.compile(r"/group\?id=order-1"))
        dead = q.dead_letters(group_id="order-1")
        assert [(d.event, d.reason) for d in dead] == [
            ({"step": "charge"}, "refunded"),
            ({"step": "ship"}, "refunded"),
        ]
        assert "no messages" in page.locator("#group").inner_text()

        page.goto(base + "/dead")
        row = page.locator(f'#dead-table tr[data-seq="{dead[0].seq}"]')
        row.locator('[data-action="requeue"]').click()
        page.wait_for_url(re.compile(r"/dead(\?|$)"))
        assert page.locator(f'#dead-table tr[data-seq="{dead[0].seq}"]').count() == 0
        assert [e for _, e in q.peek("order-1")] == [{"step": "charge"}]
        assert page.evaluate("window.__xss") is None
        poison = page.locator('#dead-table tr:has-text("poison")')
        poison.locator("summary").click()
        assert "<script>window.__xss" in poison.locator("pre.payload").inner_text()
        assert page.evaluate("window.__xss") is None

        page.goto(base + "/")
        page.click('[data-action="pause"]')
        page.wait_for_selector("text=paused: claims take nothing")
        assert q.stats().paused and q.claim("w", 30) is None
        page.click('[data-action="resume"]')
        page.wait_for_selector("text=running")
        assert not q.stats().paused
    with pytest.raises(LeaseLost):  # the UI's cancel fenced the lease in flight
        q.ack(lease)


def test_a_rebinding_page_and_another_sites_form_are_refused(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport, page: Any
) -> None:
    """A page of rebind.test, a name that (in this browser) resolves to 127.0.0.1, opens the
    dashboard under its own name: 400. A form of another site posts an action to the dashboard,
    with a good CSRF token even: 403 for its origin, nothing changed."""
    q.publish("g", 1)
    with dashboard(rqlite_cluster3.url, queue_name, "--allow-actions") as base:
        port = base.rsplit(":", 1)[1]
        rebound = page.goto(f"http://rebind.test:{port}/")
        assert rebound is not None and rebound.status == 400
        assert "unknown Host" in page.content()
        page.goto(base + "/")
        token = page.locator('input[name="csrf"]').first.get_attribute("value")
        assert token
        form = (
            f'<form method="post" action="{base}/action/pause">'
            f'<input name="csrf" value="{token}"><button id="go">go</button></form>'
        )
        page.route(
            "http://attacker.test/",
            lambda route: route.fulfill(content_type="text/html", body=form),
        )
        page.goto("http://attacker.test/")
        with page.expect_response(f"{base}/action/pause") as posted:
            page.click("#go")
        assert posted.value.status == 403
        assert "another origin" in posted.value.text()
        assert not q.stats().paused


def test_the_way_back_of_a_confirmation_stays_on_the_site(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport, page: Any
) -> None:
    """Issue 37: the confirmation page's "No, go back" link, for each `next` the review found
    leaving the site, is resolved by Chromium itself to the dashboard, not to evil.example."""
    resolved: dict[str, str] = {}
    with dashboard(rqlite_cluster3.url, queue_name, "--allow-actions") as base:
        for back in ("/\\evil.example", "/\t/evil.example", "/\n/evil.example", "/dead"):
            page.goto(base + "/")
            with page.expect_navigation():
                page.evaluate(
                    """(next) => {
                        const form = document.querySelector('form[action$="/action/pause"]');
                        form.action = form.action.replace("pause", "purge_all");
                        form.querySelector('[name="next"]').value = next;
                        form.submit();
                    }""",
                    back,
                )
            page.wait_for_selector("#confirm")
            resolved[back] = page.evaluate("document.getElementById('confirm-back').href")
        assert not q.stats().paused
    assert resolved == {
        "/\\evil.example": base + "/",
        "/\t/evil.example": base + "/",
        "/\n/evil.example": base + "/",
        "/dead": base + "/dead",
    }


HOSTILE = """<!doctype html><title>hostile</title><script>
let n = 0;
const popup = window.open("about:blank", "victim");
const timer = setInterval(() => {
  n += 1;
  popup.location = "http://admin:guess" + n + "@127.0.0.1:PORT/?guess=" + n;
  if (n >= 60) clearInterval(timer);
}, 150);
</script>"""


@contextmanager
def hostile_site(dashboard_port: int) -> Iterator[int]:
    """Another site on 127.0.0.1 (another port): a page that keeps navigating a popup to the
    dashboard with guessed credentials in the URL. Yields its port."""
    body = HOSTILE.replace("PORT", str(dashboard_port)).encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_another_site_cannot_lock_the_operator_out(
    rqlite_cluster3: Cluster, queue_name: str, browser: Any
) -> None:
    """Issue 37: a page of another site, in the operator's own browser, keeps navigating a
    popup to http://admin:guessN@127.0.0.1:PORT/. Chromium sends each guess (after a first
    request without credentials) with `Sec-Fetch-Site: same-site` from another port of
    127.0.0.1, `cross-site` from localhost: the dashboard locks those out (429), and the
    operator, opening the dashboard in another tab meanwhile, gets in with the right
    credentials, as does a script."""

    def attack(evil: str, base: str) -> list[tuple[int, dict[str, str]]]:
        """Each guess's status and the headers Chromium shows it sent, once the operator got
        in during the attack."""
        context = browser.new_context()
        guesses: list[Any] = []
        context.on("response", lambda r: guesses.append(r) if "guess=" in r.url else None)
        try:
            hostile = context.new_page()
            with context.expect_event(
                "response", lambda r: "guess=" in r.url and r.status == 429, timeout=30_000
            ):
                hostile.goto(evil)
            operator = context.new_page()
            operator.set_default_timeout(15_000)
            with operator.expect_response(lambda r: "/fragments/overview" in r.url) as fragment:
                opened = operator.goto(base.replace("http://", "http://admin:pw@") + "/")
                assert opened is not None and opened.status == 200, evil
                assert opened.request.all_headers()["sec-fetch-site"] == "none"
            assert fragment.value.status == 200  # its page refreshes itself meanwhile
            assert httpx.get(base + "/", auth=("admin", "pw")).status_code == 200
            return [(r.status, r.request.all_headers()) for r in guesses]
        finally:
            context.close()

    for evil_host, site in (("127.0.0.1", "same-site"), ("localhost", "cross-site")):
        with (
            dashboard(rqlite_cluster3.url, queue_name, "--basic-auth", "admin:pw") as base,
            hostile_site(int(base.rsplit(":", 1)[1])) as evil_port,
        ):
            evil = f"http://{evil_host}:{evil_port}/"
            guesses = attack(evil, base)
            assert {h.get("sec-fetch-site") for _, h in guesses} == {site}, evil
            assert {h.get("sec-fetch-mode") for _, h in guesses} == {"navigate"}, evil
            # Playwright shows neither the retry with the URL's credentials after the first 401
            # nor every navigation the next one cut short; but only a request with credentials
            # is a failed login, and a 429 needs 5 of them: the guesses were sent and counted.
            assert {status for status, _ in guesses} == {401, 429}, evil


def test_the_schedules_page_lists_every_schedule(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport, page: Any
) -> None:
    q.schedule("nightly-report", "reports", {"kind": "daily"}, cron="0 3 * * *", priority=2)
    q.schedule("heartbeat", "health", XSS, every=300)
    with dashboard(rqlite_cluster3.url, queue_name) as base:
        page.goto(base + "/schedules")
        table = page.locator("#schedules").inner_text()
        assert "nightly-report" in table and "0 3 * * *" in table and "300.0 s" in table
        assert XSS.split(">")[0] in table  # the payload is text
        assert page.evaluate("window.__xss") is None


def test_the_tenants_page_sets_a_weight_and_refreshes_itself(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport, page: Any
) -> None:
    q.publish_many([{"group_id": f"acme-{i}", "event": i, "tenant": "acme"} for i in range(4)])
    q.publish_many([{"group_id": f"globex-{i}", "event": i, "tenant": "globex"} for i in range(2)])
    q.publish("evil", 1, tenant=XSS)
    q.publish("plain", 1)
    q.claim_many("w", 300, 3)
    with dashboard(rqlite_cluster3.url, queue_name, "--allow-actions") as base:
        page.goto(base + "/tenants")
        page.select_option("select[name=tenant]", "acme")
        page.fill("input[name=weight]", "3")
        page.wait_for_timeout(1500)  # live refreshes must not wipe what the operator typed
        page.click('[data-action="set_tenant_weight"]')
        page.wait_for_url(re.compile(r"/tenants$"))
        assert {t.name: t.weight for t in q.tenants()}["acme"] == 3.0
        acme = page.locator('#tenant-table tr[data-tenant="acme"] [data-field="weight"]')
        assert acme.inner_text() == "3"
        rows = page.locator("#tenant-table tr[data-tenant]")
        names = [rows.nth(i).get_attribute("data-tenant") for i in range(rows.count())]
        assert names == [t.name for t in q.tenants()]
        assert rows.nth(names.index(XSS)).locator("td").first.inner_text() == XSS  # as text
        assert page.evaluate("window.__xss") is None
        q.publish("initech-1", 1, tenant="initech")
        page.wait_for_selector('#tenant-table tr[data-tenant="initech"]')  # the refresh


# ------------------------------------------------------------------------------ the staged demo

TENANTS = ("acme", "globex", "initech")
DEMO_DEAD = [
    (
        "payment-7719",
        "acme",
        {"invoice": "INV-2026-0419", "amount": "129.00 EUR"},
        "card declined: insufficient funds (processor code 51)",
    ),
    (
        "email-receipt-5531",
        "globex",
        {"to": "j.doe@example.org", "template": "receipt"},
        "SMTP 550 5.1.1 <j.doe@example.org>: mailbox unavailable",
    ),
    (
        "order-1038",
        "initech",
        {"order": 1038, "step": "reserve-stock", "sku": "KB-87-US"},
        "inventory-service timed out after 30 s (5 attempts)",
    ),
    (
        "payment-7724",
        "globex",
        {"invoice": "INV-2026-0424", "amount": "18.50 USD"},
        "HTTP 409 from processor: payment already captured",
    ),
    (
        "order-1041",
        "acme",
        {"order": 1041, "step": "ship", "carrier": "DHL"},
        "address rejected by carrier: postcode 'SW1A 1AA' is not in country 'US'",
    ),
]


class DemoClock:
    """The dashboard's clock in the demo: held at given past instants while the history is
    staged, the real time after."""

    def __init__(self) -> None:
        self.fixed: float | None = None

    def __call__(self) -> float:
        return time.time() if self.fixed is None else self.fixed


@contextmanager
def in_process(url: str, queue: str, clock: Callable[[], float], refresh: float) -> Iterator[str]:
    """`create_app` (actions allowed) on uvicorn in a thread of this process, on a free port,
    with `clock` as its time and its transport's (the staged history's samples are minutes
    old); yields its URL."""
    import asyncio
    import threading

    import uvicorn

    from rqlite_queue import AsyncTransport
    from rqlite_queue.dashboard import create_app

    started = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        transport = await AsyncTransport.from_url(url, queue=queue, clock=clock, max_skew=None)
        try:
            app = create_app(
                transport,
                allow_actions=True,
                refresh=refresh,
                clock=clock,
                allowed_hosts=["127.0.0.1"],
            )
            config = uvicorn.Config(
                app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"
            )
            server = box["server"] = uvicorn.Server(config)
            serving = asyncio.create_task(server.serve())
            while not server.started and not serving.done():
                await asyncio.sleep(0.02)
            box["port"] = server.servers[0].sockets[0].getsockname()[1]
            started.set()
            await serving
        finally:
            started.set()
            await transport.close()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(30) and "port" in box, "the dashboard did not start"
    try:
        yield f"http://127.0.0.1:{box['port']}"
    finally:
        box["server"].should_exit = True
        thread.join(15)


def stage_demo(q: Transport, base: str, clock: DemoClock) -> None:
    """One realistic queue for every picture: orders, payments and emails of three tenants
    (acme weighs 3, initech is capped at 2 leases), five dead letters with the reasons real
    ones have, three schedules, a group held for review, a payment parked for a retry, emails
    delayed, leases in flight; and five minutes of history, one sample every 10 s, taken by
    the dashboard itself, with a minute in the middle when no page was open. `q` and the
    dashboard run on `clock`, held at each past instant while the history is staged (so the
    messages' ages are those of five minutes of traffic), the real time after."""
    end = time.time()
    clock.fixed = end - 330  # the dead letters came first
    q.set_tenant("acme", weight=3)
    q.set_tenant("globex", weight=1, rate=20, burst=40)
    q.set_tenant("initech", weight=1, max_in_flight=2)
    q.publish_many(
        [{"group_id": g, "event": e, "tenant": t, "priority": 2} for g, t, e, _ in DEMO_DEAD]
    )
    reasons = {g: reason for g, _, _, reason in DEMO_DEAD}
    for _ in range(2):  # failed twice and retried, then given up on
        for lease in q.claim_many("worker-a1", 60, len(DEMO_DEAD)):
            q.nack(lease)
    for lease in q.claim_many("worker-a1", 60, len(DEMO_DEAD)):
        q.dead_letter(lease, reasons[lease.group_id])
    assert q.stats().dead == len(DEMO_DEAD)

    rng = random.Random(24)  # the same pictures every time
    order, payment, email = 1042, 7730, 5540
    with httpx.Client(base_url=base) as http:
        for step in range(31):
            clock.fixed = end - 300 + 10 * step
            items: list[dict[str, Any]] = []
            for i in range(3 + rng.randint(0, 5)):
                tenant = TENANTS[(step + i) % 3]
                order += 1
                items.append(
                    {
                        "group_id": f"order-{order}",
                        "tenant": tenant,
                        "priority": 1,
                        "event": {"order": order, "step": "reserve-stock", "items": 1 + i % 3},
                    }
                )
                if i % 2 == 1:  # an order's next step waits behind its first in the group
                    items.append(
                        {
                            "group_id": f"order-{order}",
                            "tenant": tenant,
                            "priority": 1,
                            "event": {"order": order, "step": "confirm-email"},
                        }
                    )
                if i % 2 == 0:
                    payment += 1
                    items.append(
                        {
                            "group_id": f"payment-{payment}",
                            "tenant": tenant,
                            "priority": 3,
                            "event": {
                                "invoice": f"INV-2026-{payment - 7000:04d}",
                                "amount": f"{19 + 7 * i}.90 EUR",
                            },
                        }
                    )
                if i % 3 == 0:
                    email += 1
                    items.append(
                        {
                            "group_id": f"email-receipt-{email}",
                            "tenant": tenant,
                            "priority": 0,
                            "event": {"to": f"customer{email}@example.com", "template": "receipt"},
                        }
                    )
            q.publish_many(items)
            more = step // 3 + rng.randint(0, 4)  # more workers as the backlog grows
            done = q.claim_many(f"worker-{'ab'[step % 2]}{1 + step % 3}", 60, 3 + more)
            q.ack_many(done)
            if 14 <= step <= 19:
                continue  # nobody had a dashboard page open
            assert http.get("/fragments/overview").status_code == 200
    clock.fixed = None

    q.publish(
        "order-1042", {"order": 1042, "step": "fraud-review", "score": 0.91}, 1, tenant="acme"
    )
    q.hold_group("order-1042")
    q.publish_many(
        [
            {
                "group_id": f"email-newsletter-{n}",
                "tenant": "globex",
                "priority": 0,
                "event": {"campaign": "december-sale", "segment": n},
                "delay": 1800,
            }
            for n in range(1, 4)
        ]
    )
    parked = q.claim("worker-b2", 60)
    assert parked is not None
    q.nack(parked, delay=240)  # the processor asked to retry in 4 minutes
    q.claim_many("worker-a1", 120, 4)  # in flight
    q.schedule(
        "nightly-settlement",
        "payments-settlement",
        {"job": "settle", "currency": "EUR"},
        cron="0 2 * * *",
        priority=3,
    )
    q.schedule("abandoned-cart-reminders", "email-cart-reminders", {"template": "cart"}, every=900)
    q.schedule("stock-sync", "inventory-sync", {"warehouse": "FRA-1"}, every=300, catch_up=True)


def test_a_staged_demo_queue_page_by_page(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport, browser: Any
) -> None:
    """Every picture of the docs, from one staged queue (so their numbers agree): the overview's
    cards equal `stats()`, its charts span the 10 minutes they claim with the 5 minutes of
    samples and the gap, the layout uses a wide screen (full-width tables and charts) and fits
    a phone's, the group page's destructive action asks on a page of its own."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15_000)
    clock = DemoClock()
    try:
        with in_process(rqlite_cluster3.url, queue_name, clock, refresh=10) as base:
            with Transport.from_url(
                rqlite_cluster3.url, queue=queue_name, clock=clock, max_skew=None
            ) as staged:
                stage_demo(staged, base, clock)
            page.goto(base + "/")
            stats = q.stats()
            for name in ("depth", "groups", "in_flight", "parked", "held", "delayed", "dead"):
                assert stat(page, name) == str(getattr(stats, name)), name
            assert (stats.held, stats.parked, stats.dead, stats.delayed) == (1, 1, 5, 3)
            covered = page.locator("#covered").inner_text()
            assert re.search(
                r"since \d\d:\d\d:\d\d UTC \(5 min of samples, one every 10 s\)", covered
            )
            depth_chart = page.locator("svg.chart").first
            assert depth_chart.locator("polyline.line.depth").count() >= 2  # the gap
            assert depth_chart.locator("text.time-tick").count() >= 5
            assert "messages" in depth_chart.locator("text.axis-title").first.text_content() or ""
            main = page.locator("main").bounding_box()
            svg = depth_chart.bounding_box()
            assert page.locator("svg.chart").count() == 3  # depth, throughput, oldest's age
            last = page.locator("svg.chart").nth(1).bounding_box()
            assert main and svg and last
            assert last["x"] + last["width"] >= main["x"] + main["width"] - 30  # to the edge
            assert svg["width"] > 0.45 * main["width"]  # two side by side: no fixed 600 px
            shot(page, "overview")

            page.goto(base + "/groups")
            table = page.locator("#group-table").bounding_box()
            assert table and table["width"] > 0.9 * (main["width"] - 48)  # the page's width
            assert page.locator("#group-table tr[data-group]").count() == min(50, stats.groups)
            page.get_by_label("Group id starts with").fill("order-")
            page.click("text=Filter the groups")
            page.wait_for_url(re.compile(r"prefix=order-"))
            orders = q.groups(prefix="order-", limit=50)
            rows = page.locator("#group-table tr[data-group]")
            assert rows.count() == len(orders) and "held" in page.inner_text("#group-table")
            shot(page, "groups", full_page=False)

            page.goto(base + "/group?id=order-1042")
            assert page.locator('[data-field="state"]').inner_text() == "held"
            shot(page, "group")
            page.get_by_label("Reason for its dead letters").fill("fraud confirmed by review")
            page.click('[data-action="cancel"]')
            page.wait_for_selector("#confirm")
            assert "Cancel group order-1042: its 1 message become" in page.inner_text("#confirm")
            shot(page, "confirm")
            page.click("#confirm-back")
            page.wait_for_url(re.compile(r"/group\?id=order-1042"))
            assert q.stats().held == 1  # nothing done

            page.goto(base + "/tenants")
            names = page.locator("#tenant-table tr[data-tenant]")
            assert [names.nth(i).get_attribute("data-tenant") for i in range(names.count())] == [
                "",
                *TENANTS,
            ]
            shot(page, "tenants")
            page.goto(base + "/dead")
            assert page.locator("#dead-table tr[data-seq]").count() == 5
            assert "card declined" in page.locator("#dead-table").inner_text()
            shot(page, "dead-letters")
            page.goto(base + "/schedules")
            assert page.locator("#schedules tr").count() == 4
            shot(page, "schedules")

            page.set_viewport_size({"width": 390, "height": 844})  # a phone
            for path in ("/", "/groups", "/group?id=order-1042", "/dead", "/tenants"):
                page.goto(base + path)
                overflow = page.evaluate(
                    "document.documentElement.scrollWidth - document.documentElement.clientWidth"
                )
                assert overflow <= 1, (path, overflow)
    finally:
        context.close()


def test_a_destructive_action_is_confirmed_without_script(
    rqlite_cluster3: Cluster, queue_name: str, q: Transport, browser: Any
) -> None:
    """With JavaScript off, 'Purge all' leads to a confirmation page; its button (a second
    POST with the CSRF token) purges; 'No, go back' changes nothing."""
    a_busy_queue(q)
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        with dashboard(rqlite_cluster3.url, queue_name, "--allow-actions") as base:
            page.goto(base + "/dead")
            page.click('[data-action="purge_all"]')
            page.wait_for_selector("#confirm")
            assert "Delete every dead letter (1) for good" in page.inner_text("#confirm")
            page.click("#confirm-back")
            page.wait_for_url(re.compile(r"/dead"))
            assert q.stats().dead == 1
            page.click('[data-action="purge_all"]')
            page.click('[data-confirmed="yes"]')
            page.wait_for_url(re.compile(r"/dead"))
            assert q.stats().dead == 0 and "No dead letters" in page.inner_text("#dead")
    finally:
        context.close()
