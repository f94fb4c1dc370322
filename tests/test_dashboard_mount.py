"""The dashboard mounted inside another ASGI app, under a path prefix: its links, forms and
redirects keep the prefix. In-process (httpx's ASGI transport) on the embedded backend: what
is under test is the app's routing, not a backend."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

from starlette.applications import Starlette
from starlette.routing import Mount

from rqlite_queue import AsyncSqliteTransport, InvalidArgument
from rqlite_queue.dashboard import create_app


@pytest.fixture
async def transport(tmp_path: Path) -> AsyncIterator[AsyncSqliteTransport]:
    queue = AsyncSqliteTransport(str(tmp_path / "q.db"))
    await queue.setup()
    await queue.publish_many([("order-1", 1), ("order-1", 2)])
    yield queue
    await queue.close()


async def test_links_forms_and_redirects_keep_the_mount_path(
    transport: AsyncSqliteTransport,
) -> None:
    outer = Starlette(routes=[Mount("/ops/queue", app=create_app(transport, allow_actions=True))])
    asgi = httpx.ASGITransport(app=outer)
    async with httpx.AsyncClient(transport=asgi, base_url="http://dash") as http:
        page = await http.get("/ops/queue/groups")
        assert page.status_code == 200
        assert 'href="/ops/queue/group?id=order-1"' in page.text
        assert 'src="/ops/queue/static/htmx.min.js"' in page.text
        assert 'hx-get="/ops/queue/fragments/groups?' in page.text
        group = await http.get("/ops/queue/group", params={"id": "order-1"})
        assert 'action="/ops/queue/action/cancel"' in group.text
        token = re.search(r'name="csrf" value="([^"]+)"', group.text)
        assert token
        form = {"csrf": token.group(1), "group_id": "order-1", "next": "/group?id=order-1"}
        done = await http.post("/ops/queue/action/hold", data=form)
        assert done.status_code == 303
        assert done.headers["location"] == "/ops/queue/group?id=order-1"
        assert (await transport.stats()).held == 1
        elsewhere = await http.post(
            "/ops/queue/action/release", data={**form, "next": "//evil.example/"}
        )
        assert elsewhere.headers["location"] == "/ops/queue/"  # never off-site
        assert (await transport.stats()).held == 0


def test_bad_arguments_to_create_app(tmp_path: Path) -> None:
    transport = AsyncSqliteTransport(str(tmp_path / "q.db"))
    for kwargs in (
        {"allow_actions": "yes"},
        {"refresh": 0},
        {"basic_auth": ("user", "")},
        {"basic_auth": ("us:er", "pw")},
        {"bearer_token": ""},
        {"bearer_token": "  "},
        {"allowed_hosts": "dash.example"},  # a string, not a list of them
        {"allowed_hosts": [""]},
        {"allowed_hosts": ["dash.example/x"]},
        {"allowed_hosts": ["dash.example:0"]},
        {"allowed_origins": ["dash.example"]},  # no scheme
        {"allowed_origins": ["ftp://dash.example"]},
        {"allowed_origins": "https://dash.example"},
    ):
        with pytest.raises(InvalidArgument):
            create_app(transport, **kwargs)  # type: ignore[arg-type]


async def test_allowed_hosts_origins_and_redirects_under_a_mount_path(
    transport: AsyncSqliteTransport,
) -> None:
    """`allowed_hosts` refuses other Host names (400); an action from another origin is refused
    (403) unless it is one of `allowed_origins`; a trailing slash redirects, relatively, with
    the mount path; every answer has the security headers."""
    app = create_app(
        transport,
        allow_actions=True,
        allowed_hosts=["dash", "ops.example:8443"],
        allowed_origins=["https://ops.example:8443"],
    )
    outer = Starlette(routes=[Mount("/ops/queue", app=app)])
    asgi = httpx.ASGITransport(app=outer)
    async with httpx.AsyncClient(transport=asgi, base_url="http://dash") as http:
        assert (await http.get("/ops/queue/")).status_code == 200
        ok = await http.get("/ops/queue/", headers={"Host": "ops.example:8443"})
        assert ok.status_code == 200
        for host in ("evil.example", "ops.example", "ops.example:8444", "dash.evil"):
            refused = await http.get("/ops/queue/", headers={"Host": host})
            assert refused.status_code == 400, host
            assert refused.headers["cache-control"] == "no-store"
            assert "frame-ancestors 'none'" in refused.headers["content-security-policy"]
        moved = await http.get("/ops/queue/groups/?state=ready")
        assert moved.status_code == 307
        assert moved.headers["location"] == "/ops/queue/groups?state=ready"
        group = await http.get("/ops/queue/group", params={"id": "order-1"})
        token = re.search(r'name="csrf" value="([^"]+)"', group.text)
        assert token
        form = {"csrf": token.group(1), "group_id": "order-1", "next": "/group?id=order-1"}
        for origin in ("http://evil.example", "https://dash", "null", "https://ops.example"):
            refused = await http.post(
                "/ops/queue/action/hold", data=form, headers={"Origin": origin}
            )
            assert refused.status_code == 403, origin
        assert (await transport.stats()).held == 0
        for origin in ("http://dash", "https://ops.example:8443"):
            done = await http.post("/ops/queue/action/hold", data=form, headers={"Origin": origin})
            assert done.status_code == 303, origin
        assert (await transport.stats()).held == 1
    anywhere = Starlette(routes=[Mount("/q", app=create_app(transport))])
    asgi = httpx.ASGITransport(app=anywhere)
    async with httpx.AsyncClient(transport=asgi, base_url="http://any.example") as http:
        assert (await http.get("/q/")).status_code == 200  # allowed_hosts=None: any Host
