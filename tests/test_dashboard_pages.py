"""What the dashboard's pages say and ask, read from their HTML: the charts' axes and what
their history covers, a label for every input, buttons that say what they do, and the
confirmation page of every destructive action (a second POST, no script needed). In-process
(httpx's ASGI transport) on the embedded backend, with the dashboard's clock in the test's
hands; the browser tests (tests/test_dashboard.py) do the same through Chromium on a real
cluster."""

from __future__ import annotations

import calendar
import html
import re
from collections.abc import AsyncIterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from rqlite_queue import AsyncSqliteTransport
from rqlite_queue.dashboard import create_app

T0 = float(calendar.timegm((2026, 12, 2, 1, 0, 0)))  # 01:00:00 UTC


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def transport(tmp_path: Path) -> AsyncIterator[AsyncSqliteTransport]:
    queue = AsyncSqliteTransport(str(tmp_path / "q.db"))
    await queue.setup()
    yield queue
    await queue.close()


def client(app: object) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")  # type: ignore[arg-type]


class Controls(HTMLParser):
    """A page's form controls, labels and buttons."""

    def __init__(self) -> None:
        super().__init__()
        self.controls: list[dict[str, str | None]] = []
        self.label_for: list[str] = []
        self.buttons: list[tuple[dict[str, str | None], str]] = []
        self._button: dict[str, str | None] | None = None
        self._text = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag in ("input", "select", "textarea") and found.get("type") != "hidden":
            self.controls.append(found)
        elif tag == "label" and found.get("for"):
            self.label_for.append(str(found["for"]))
        elif tag == "button":
            self._button, self._text = found, ""

    def handle_data(self, data: str) -> None:
        if self._button is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "button" and self._button is not None:
            self.buttons.append((self._button, " ".join(self._text.split())))
            self._button = None


def controls(page: str) -> Controls:
    parser = Controls()
    parser.feed(page)
    return parser


def section(page: str, element_id: str) -> str:
    found = re.search(rf'<section[^>]*id="{element_id}".*?</section>', page, re.DOTALL)
    assert found, f"no section {element_id}"
    return found.group(0)


async def test_the_charts_have_time_and_value_axes_over_the_window_they_claim(
    transport: AsyncSqliteTransport,
) -> None:
    """Samples over 4 minutes (a page open from 01:06 to 01:10 UTC, one every 2 s, none for a
    minute in between): the caption says since when and how often, the time axis still spans
    the 10 minutes it claims with ticks at clock times, the value axes name their units, and
    the lines break where no sample was taken."""
    clock = Clock(T0 + 360)
    async with client(create_app(transport, clock=clock)) as http:
        empty = (await http.get("/")).text
        assert "no samples yet" not in empty  # this request took the first sample
        for second in range(2, 241, 2):
            clock.now = T0 + 360 + second
            if 60 < second < 120:
                continue  # nobody had a page open
            await transport.publish_many([(f"order-{second}", {"n": i}) for i in range(3)])
            assert (await http.get("/fragments/overview")).status_code == 200
        page = (await http.get("/")).text
    covered = re.search(r'<p class="covered" id="covered">(.*?)</p>', page, re.DOTALL)
    assert covered
    assert " ".join(covered.group(1).split()) == (
        "Last 10 minutes: since 01:06:00 UTC (4 min of samples, one every 2 s)"
    )
    charts = re.findall(r'<svg viewBox="0 0 640 200" class="chart".*?</svg>', page, re.DOTALL)
    assert len(charts) == 3
    for svg in charts:
        ticks = re.findall(r'class="tick time-tick"[^>]*>([^<]+)<', svg)
        assert ticks == ["01:00", "01:02", "01:04", "01:06", "01:08", "01:10"]
        assert "time (UTC)" in svg
    depth, rate, age = charts
    assert 'data-unit="seconds"' in age and ">seconds</text>" in age
    assert 'class="line age"' in age
    assert 'data-unit="messages"' in depth and ">messages</text>" in depth
    assert 'data-unit="msg/s"' in rate and ">msg/s</text>" in rate
    assert re.findall(r'class="tick value-tick"[^>]*>([^<]+)<', depth)[-1] == "300"  # 273 messages
    assert len(re.findall(r'<polyline points="[^"]+" class="line depth"', depth)) == 2
    assert len(re.findall(r'class="line published"', rate)) == 2  # the gap breaks it
    first_x = float(re.findall(r'class="tick time-tick" x="([\d.]+)"', depth)[0])
    line_x = float(re.search(r'<polyline points="([\d.]+),', depth).group(1))  # type: ignore[union-attr]
    assert line_x > first_x + 200  # the line starts 6 minutes into the window, not at its edge


async def test_the_first_sample_says_so(transport: AsyncSqliteTransport) -> None:
    async with client(create_app(transport, clock=Clock(T0))) as http:
        page = (await http.get("/")).text
    assert "since 01:00:00 UTC (0 s of samples, one every 2 s)" in page


async def test_every_input_has_a_label_and_every_button_says_what_it_does(
    transport: AsyncSqliteTransport,
) -> None:
    await transport.publish_many([("order-1", 1), ("order-2", 2)])
    await transport.publish("acme-1", 1, tenant="acme")
    lease = await transport.claim("w", 60)
    assert lease is not None
    await transport.dead_letter(lease, "card declined")
    async with transport.batch(on_complete=("reports", 1)) as made:
        made.publish("row-1", 1)
    async with client(create_app(transport, allow_actions=True)) as http:
        for path in (
            "/",
            "/groups",
            "/group?id=order-2",
            "/dead",
            "/tenants",
            "/schedules",
            "/batches",
            f"/batch?id={made.id}",
        ):
            page = controls((await http.get(path)).text)
            for control in page.controls:
                assert control.get("id"), (path, control)
                assert control["id"] in page.label_for, (path, control)
            for button, text in page.buttons:
                assert text and text not in ("Go", "OK", "Submit"), (path, button)
            vague = [t for b, t in page.buttons if t in ("Hold", "Release", "Filter")]
            assert not vague, (path, vague)
        dead = controls((await http.get("/dead")).text)
        current = {"/": "Overview", "/groups": "Groups", "/group?id=order-2": "Groups"}
        current |= {"/dead": "Dead letters", "/tenants": "Tenants", "/schedules": "Schedules"}
        current |= {"/batches": "Batches", f"/batch?id={made.id}": "Batches"}
        for path, name in current.items():
            text = (await http.get(path)).text
            assert len(re.findall(r"<h1>", text)) == 1, path  # each page says what it is
            assert re.findall(r'<a href="[^"]*" aria-current="page">([^<]+)</a>', text) == [name]
        names = {b.get("aria-label") or t for b, t in dead.buttons}
        assert f"Purge dead letter {lease.seq} (asks to confirm)" in names
        assert f"Requeue dead letter {lease.seq}" in names


async def test_destructive_actions_are_set_apart_from_the_others(
    transport: AsyncSqliteTransport,
) -> None:
    await transport.publish("order-1", 1)
    lease = await transport.claim("w", 60)
    assert lease is not None
    await transport.dead_letter(lease, "card declined")
    await transport.publish("order-1", 2)
    async with client(create_app(transport, allow_actions=True)) as http:
        group = (await http.get("/group", params={"id": "order-1"})).text
        dead = (await http.get("/dead")).text
    danger = section(group, "group-danger")
    harmless = section(group, "group-actions")
    assert 'data-action="cancel"' in danger and 'data-action="hold"' not in danger
    assert 'data-action="cancel"' not in harmless
    assert all(f'data-action="{a}"' in harmless for a in ("hold", "release", "priority"))
    bulk = section(dead, "dead-bulk")
    assert 'data-action="purge_all"' in bulk and 'data-action="requeue_all"' in bulk
    assert 'class="danger-zone"' in bulk and 'class="danger-zone"' in danger


@pytest.mark.parametrize(
    ("action", "fields", "says"),
    [
        ("cancel", {"group_id": "order-1", "reason": "refunded"}, "Cancel group order-1: its 2"),
        ("purge", {"seq": "SEQ"}, "Delete dead letter SEQ for good"),
        ("purge_all", {}, "Delete every dead letter (1) for good"),
        ("requeue_all", {}, "Publish every dead letter (1) again"),
    ],
)
async def test_a_destructive_action_asks_to_confirm_on_a_page_of_its_own(
    transport: AsyncSqliteTransport, action: str, fields: dict[str, str], says: str
) -> None:
    """The first POST (with the CSRF token) changes nothing and answers a page that says what
    will happen; its form posts the same fields with `confirmed=yes` and the token: that one
    does it. No script involved."""
    await transport.publish("poison", 1)
    lease = await transport.claim("w", 60)
    assert lease is not None
    await transport.dead_letter(lease, "card declined")
    await transport.publish_many([("order-1", 1), ("order-1", 2)])
    fields = {k: v.replace("SEQ", str(lease.seq)) for k, v in fields.items()}
    says = says.replace("SEQ", str(lease.seq))

    async def state() -> tuple[object, ...]:
        return (await transport.stats()).depth, await transport.dead_letters()

    before = await state()
    async with client(create_app(transport, allow_actions=True)) as http:
        token = re.search(r'name="csrf" value="([^"]+)"', (await http.get("/dead")).text)
        assert token
        first = await http.post(
            f"/action/{action}", data={"csrf": token.group(1), "next": "/dead", **fields}
        )
        assert first.status_code == 200 and 'id="confirm"' in first.text
        assert says in html.unescape(first.text)
        assert await state() == before  # nothing done yet
        form = re.search(
            r'<form method="post" action="/action/(\w+)">(.*?)</form>', first.text, re.S
        )
        assert form and form.group(1) == action
        hidden = dict(
            re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form.group(2))
        )
        hidden = {k: html.unescape(v) for k, v in hidden.items()}
        assert hidden == {"csrf": token.group(1), "next": "/dead", "confirmed": "yes", **fields}
        assert 'id="confirm-back" href="/dead"' in form.group(2)
        forged = await http.post(f"/action/{action}", data={**hidden, "csrf": "x"})
        assert forged.status_code == 403 and await state() == before
        done = await http.post(f"/action/{action}", data=hidden)
        assert done.status_code == 303 and done.headers["location"] == "/dead"
    assert await state() != before


async def test_the_confirmation_page_escapes_what_it_repeats_and_stays_on_site(
    transport: AsyncSqliteTransport,
) -> None:
    hostile = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'
    await transport.publish(hostile, 1)
    async with client(create_app(transport, allow_actions=True)) as http:
        token = re.search(r'name="csrf" value="([^"]+)"', (await http.get("/")).text)
        assert token
        form = {"csrf": token.group(1), "group_id": hostile, "reason": hostile}
        page = await http.post("/action/cancel", data={**form, "next": "//evil.example/"})
        assert page.status_code == 200 and 'id="confirm"' in page.text
        assert "<script>alert" not in page.text and "<img src=x" not in page.text
        assert hostile in html.unescape(page.text)  # said, as text
        assert 'id="confirm-back" href="/"' in page.text  # never off-site
        assert '<input type="hidden" name="next" value="/">' in page.text
        assert (await transport.stats()).depth == 1


OFF_SITE = [
    "/\\evil.example",  # issue 37: a browser reads the backslash as a slash
    "/\t/evil.example",  # issue 37: the WHATWG URL parser drops tabs ...
    "/\n/evil.example",  # issue 37: ... and newlines
    "/\r/evil.example",
    "/\\/evil.example",
    "/%5Cevil.example",  # a server unescaping the path on the way makes it /\\evil.example
    "/%5cevil.example",
    "/%2F%2Fevil.example",  # ... or //evil.example
    "/%2f/evil.example",
    "/.//evil.example",  # dot segments removed: //evil.example
    "/./%2E/evil.example",
    "/x/..//evil.example",
    "/\x00/evil.example",
    "/ /evil.example",
    "/dead?x=\\",
    "/dead?x=\n",
    "/dead#x",
    "//evil.example",  # refused before issue 37 too
    "//",
    "///evil.example",
    "https://evil.example/",
    "javascript:alert(1)",
    "\\/evil.example",
    " //evil.example",
    "",
]


@pytest.mark.parametrize("back", OFF_SITE, ids=repr)
async def test_the_way_back_never_leaves_the_site(
    transport: AsyncSqliteTransport, back: str
) -> None:
    """Issue 37: a `next` a browser could read as another site's address (or an address a
    server that unescapes paths could make into one) is replaced by `/`: in the confirmation
    page's "No, go back" link, in its form, and in the redirect after an action."""
    await transport.publish("order-1", 1)
    async with client(create_app(transport, allow_actions=True)) as http:
        token = re.search(r'name="csrf" value="([^"]+)"', (await http.get("/")).text)
        assert token
        form = {"csrf": token.group(1), "next": back}
        page = await http.post("/action/purge_all", data=form)
        assert page.status_code == 200 and 'id="confirm"' in page.text
        assert '<a class="button" id="confirm-back" href="/">' in page.text
        assert '<input type="hidden" name="next" value="/">' in page.text
        done = await http.post("/action/hold", data={**form, "group_id": "order-1"})
        assert done.status_code == 303 and done.headers["location"] == "/"


@pytest.mark.parametrize(
    "back",
    [
        "/",
        "/dead",
        "/groups/",
        "/group?id=order%201%5C%2F%3F",  # the group's pages quote its id whole
        "/dead?group=a%5Cb&limit=50&after=",
        "/tenants?after=acme",
        "/groups?prefix=a|b{c}[d]^",
        "/a/b.c/~d/:e@f!$&'()*+,;=",
    ],
)
async def test_a_way_back_on_the_site_is_kept(transport: AsyncSqliteTransport, back: str) -> None:
    async with client(create_app(transport, allow_actions=True)) as http:
        token = re.search(r'name="csrf" value="([^"]+)"', (await http.get("/")).text)
        assert token
        form = {"csrf": token.group(1), "next": back}
        page = await http.post("/action/purge_all", data=form)
        link = re.search(r'id="confirm-back" href="([^"]*)"', page.text)
        assert link and html.unescape(link.group(1)) == back
        done = await http.post("/action/pause", data=form)
        assert done.status_code == 303 and unquote(done.headers["location"]) == unquote(back)


async def test_a_dead_letters_headers_are_shown_escaped(transport: AsyncSqliteTransport) -> None:
    await transport.publish("order-1", 1, headers={"trace": "<script>alert(1)</script>"})
    lease = await transport.claim("w", 60)
    assert lease is not None
    await transport.dead_letter(lease, "card declined")
    async with client(create_app(transport)) as http:
        dead = (await http.get("/dead")).text
    assert "<script>alert(1)</script>" not in dead
    [shown] = re.findall(r'<pre class="headers">(.*?)</pre>', dead, re.S)
    assert html.unescape(shown).split() == ["{", '"trace":', '"<script>alert(1)</script>"', "}"]
