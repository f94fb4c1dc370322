"""The dashboard: an ASGI app (Starlette) over an `AsyncTransport`, server-rendered with Jinja2
(autoescaped: a payload is shown as text, never run), live-refreshed by htmx (vendored in
`static/`, with its license). Run it with `rqlite-queue dashboard`, or mount it in an app of
your own:

    from starlette.routing import Mount
    from rqlite_queue.dashboard import create_app
    routes = [Mount("/queue", app=create_app(transport, allow_actions=True))]
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import quote

import jinja2
from starlette.applications import Starlette
from starlette.datastructures import FormData, MutableHeaders
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Match, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .. import AsyncTransport, group_states
from ..errors import InvalidArgument, LeaseLost, QueueError, Unavailable
from ..timefmt import duration, utc
from ..types import BATCH_STATES, GROUP_STATES, MAX_BATCH, MAX_PRIORITY, TenantInfo
from .history import History, chart, covered
from .security import Access, Csrf, Hosts, Throttle, origin_of, origins, same_site_path

PAGE = 50
"""Rows per page of groups, tenants and dead letters."""

DESTRUCTIVE = {
    "cancel": "Yes, cancel the group",
    "cancel_job": "Yes, cancel the message",
    "purge": "Yes, delete the dead letter",
    "purge_all": "Yes, delete every dead letter",
    "requeue_all": "Yes, requeue every dead letter",
}
"""Actions that cannot be undone (or move everything): a first POST shows a page asking to
confirm, the second (`confirmed=yes`) does it. Each one's confirm button."""

_HERE = __file__.rsplit("/", 1)[0]

_log = logging.getLogger("rqlite_queue.dashboard")

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
"""On every response, whatever its status: the pages show payloads, so none is stored."""


def create_app(
    transport: AsyncTransport,
    *,
    allow_actions: bool = False,
    basic_auth: tuple[str, str] | None = None,
    bearer_token: str | None = None,
    refresh: float = 2.0,
    allowed_hosts: Iterable[str] | None = None,
    allowed_origins: Iterable[str] = (),
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The dashboard of `transport`'s queue. Read-only unless `allow_actions`; behind HTTP
    Basic (`basic_auth=(user, password)`) or a bearer token when given (failed logins are
    throttled per client address, the one the server gives in `scope["client"]`: 429; those a
    browser says a page of another site made it send are counted apart, so such a page cannot
    lock out the operator's own requests); pages refresh every `refresh` seconds.

    `allowed_hosts`: the `Host` names it answers to (`name` for any port, `name:port`); any
    other gets 400 (the defence against DNS rebinding). None (the default) answers to any: for
    an app that checks them itself. An action (a POST) whose `Origin` (else `Referer`) is
    neither the request's own origin nor one of `allowed_origins` (`https://host[:port]`: the
    public address behind a proxy that changes `Host`) is refused with 403."""
    if not isinstance(allow_actions, bool):
        raise InvalidArgument("allow_actions must be True or False")
    if isinstance(refresh, bool) or not isinstance(refresh, int | float) or not refresh >= 0.2:
        raise InvalidArgument("refresh must be a number of seconds >= 0.2")
    dashboard = _Dashboard(
        transport,
        allow_actions,
        Access(basic_auth, bearer_token),
        refresh,
        Hosts(allowed_hosts),
        origins(allowed_origins),
        clock,
    )
    return dashboard.app


class _Dashboard:
    def __init__(
        self,
        transport: AsyncTransport,
        allow_actions: bool,
        access: Access,
        refresh: float,
        hosts: Hosts,
        allowed_origins: frozenset[tuple[str, str, int]],
        clock: Callable[[], float],
    ) -> None:
        self.q = transport
        self.allow_actions = allow_actions
        self.access = access
        self.refresh = refresh
        self.hosts = hosts
        self.allowed_origins = allowed_origins
        self.clock = clock
        self.csrf = Csrf()
        self.throttle = Throttle()
        self.history = History(every=refresh)
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(f"{_HERE}/templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        self.templates.filters["when"] = lambda epoch: "" if epoch is None else utc(epoch)
        self.templates.filters["ago"] = lambda s: "" if s is None else duration(s)
        self.templates.filters["pretty"] = _pretty
        self.templates.filters["q"] = lambda value: quote(str(value), safe="")
        self.templates.filters["num"] = _num
        self.templates.filters["rate_limit"] = _rate_limit
        self.app = Starlette(
            routes=[
                Route("/", self.overview),
                Route("/fragments/overview", self.overview_fragment),
                Route("/groups", self.groups),
                Route("/fragments/groups", self.groups_fragment),
                Route("/group", self.group),
                Route("/fragments/group", self.group_fragment),
                Route("/message", self.message),
                Route("/fragments/message", self.message_fragment),
                Route("/batches", self.batches),
                Route("/fragments/batches", self.batches_fragment),
                Route("/batch", self.batch),
                Route("/fragments/batch", self.batch_fragment),
                Route("/dead", self.dead),
                Route("/fragments/dead", self.dead_fragment),
                Route("/tenants", self.tenants),
                Route("/fragments/tenants", self.tenants_fragment),
                Route("/schedules", self.schedules),
                Route("/action/{name}", self.action, methods=["POST"]),
                Mount("/static", StaticFiles(directory=f"{_HERE}/static"), name="static"),
            ],
            middleware=[Middleware(_Guard, dashboard=self)],
            exception_handlers={
                QueueError: self._queue_error,
                404: self._not_found,
                Exception: self._crash,
            },
        )
        # Starlette's own redirect builds an absolute URL from the Host header: ours is relative.
        self.app.router.redirect_slashes = False

    # ------------------------------------------------------------------ plumbing

    def refusal(self, conn: HTTPConnection) -> Response | None:
        """The answer to a request that may not reach a page, if it is one: a foreign `Host`
        (400), a client locked out by failed logins (429), missing credentials (401)."""
        if not self.hosts.allows(conn.headers.get("host"), conn.url.scheme):
            return PlainTextResponse(
                "unknown Host: this dashboard answers to its own names only "
                "(rqlite-queue dashboard --allowed-host NAME adds one)",
                status_code=400,
            )
        if not self.access.required:
            return None
        # Failed logins are counted per client address and, apart, those a browser was made to
        # send by a page of another site (`http://user:guess@host/` in a popup): such a page
        # locks out only what other sites send, never the operator's own requests.
        foreign = self._from_another_site(conn)
        who = (conn.client.host if conn.client else "", foreign)
        wait = self.throttle.wait(who)
        if wait:
            return PlainTextResponse(
                "too many failed logins from pages of other sites: try again later, or open "
                "the dashboard's address yourself (that is counted apart)"
                if foreign
                else "too many failed logins: try again later",
                status_code=429,
                headers={"Retry-After": str(wait)},
            )
        authorization = conn.headers.get("authorization")
        if self.access.allows(authorization):
            # Not from another site: that page could clear its own count with a navigation the
            # browser authenticates with the credentials it saved for the operator.
            if not foreign:
                self.throttle.succeeded(who)
            return None
        if authorization:  # a browser's first request, without credentials, is no failure
            self.throttle.failed(who)
        return PlainTextResponse(
            "authentication required",
            status_code=401,
            headers={"WWW-Authenticate": 'Basic realm="rqlite-queue", charset="UTF-8"'},
        )

    async def _not_found(self, request: Request, exc: Exception) -> Response:
        """404, or a relative redirect from `/page/` to `/page`."""
        root = request.scope.get("root_path", "")
        path = request.scope["path"]
        route_path = path[len(root) :] if root and path.startswith(root) else path
        if request.method in ("GET", "HEAD") and len(route_path) > 1 and path.endswith("/"):
            scope = {**request.scope, "path": root + route_path.rstrip("/")}
            if any(
                isinstance(route, Route) and route.matches(scope)[0] is not Match.NONE
                for route in self.app.routes
            ):
                location = quote(scope["path"], safe="/:@!$&'()*+,;=-._~")
                if request.url.query:
                    location += "?" + request.url.query
                if same_site_path(location):
                    return RedirectResponse(location, status_code=307)
        return self._page(request, "error.html", status=404, error="no such page")

    async def _crash(self, request: Request, exc: Exception) -> Response:
        """A bug's 500 (the error middleware, outside ours, sends it: it gets our headers here;
        the traceback is logged as usual)."""
        return PlainTextResponse("internal error", status_code=500, headers=SECURITY_HEADERS)

    async def _queue_error(self, request: Request, exc: Exception) -> Response:
        status = 503 if isinstance(exc, Unavailable) else 400
        if isinstance(exc, LeaseLost):
            status = 409
        return self._page(request, "error.html", status=status, error=str(exc))

    def _page(self, request: Request, template: str, status: int = 200, **values: Any) -> Response:
        session = self.csrf.session(request.cookies.get(Csrf.COOKIE))
        new_session = self.allow_actions and session is None
        if new_session:
            session = self.csrf.new_session()
        html = self.templates.get_template(template).render(
            base=request.scope.get("root_path", ""),
            queue=self.q.queue,
            allow_actions=self.allow_actions,
            csrf=self.csrf.token(session) if session is not None and self.allow_actions else "",
            refresh_ms=int(self.refresh * 1000),
            path=request.url.path,
            page=_route_path(request),
            **values,
        )
        response = HTMLResponse(html, status_code=status)
        if new_session and session is not None:
            response.set_cookie(
                Csrf.COOKIE,
                session,
                path=request.scope.get("root_path", "") or "/",
                secure=request.url.scheme == "https",
                httponly=True,
                samesite="lax",
            )
        return response

    def _from_another_site(self, conn: HTTPConnection) -> bool:
        """Whether a browser says a page of another site made the request: its
        `Sec-Fetch-Site` is neither `same-origin` nor `none` (typed, bookmarked, reloaded); a
        browser without fetch metadata (or a script) sends none, then an `Origin` or `Referer`
        of another origin says so. (A dashboard on another port of the same host is
        `same-site`: another site too.)"""
        site = conn.headers.get("sec-fetch-site")
        if site is not None:
            return site.strip().lower() not in ("same-origin", "none")
        return not self._same_origin(conn)

    def _same_origin(self, request: HTTPConnection) -> bool:
        """Whether a POST comes from the dashboard's own pages: its `Origin` (else its
        `Referer`) is the request's own origin or an allowed one. A request with neither is no
        browser's (curl, a script): its CSRF token decides."""
        sent = request.headers.get("origin") or request.headers.get("referer")
        if sent is None:
            return True
        origin = origin_of(sent)
        own = origin_of(f"{request.url.scheme}://{request.headers.get('host', '')}")
        return origin is not None and (origin == own or origin in self.allowed_origins)

    # ------------------------------------------------------------------ overview

    async def _overview(self) -> dict[str, Any]:
        stats, nodes = await asyncio.gather(self.q.stats(), self.q.nodes())
        now = self.clock()
        if self.history.due(now):
            self.history.add(now, stats)
        rates = self.history.rates()
        start, gap = now - self.history.window, 3 * self.history.every
        return {
            "stats": stats,
            "priorities": [(p, stats.by_priority.get(p, 0)) for p in range(MAX_PRIORITY + 1)],
            "nodes": nodes,
            "depth_chart": chart(
                [("depth", [(s.at, float(s.depth)) for s in self.history.samples])],
                start=start,
                end=now,
                gap=gap,
                unit="messages",
            ),
            "rate_chart": chart(
                [
                    ("published", [(r.at, r.published) for r in rates]),
                    ("done", [(r.at, r.done) for r in rates]),
                ],
                start=start,
                end=now,
                gap=gap,
                unit="msg/s",
            ),
            "age_chart": chart(
                [("age", [(s.at, s.oldest_age or 0.0) for s in self.history.samples])],
                start=start,
                end=now,
                gap=gap,
                unit="seconds",
            ),
            "last_rate": rates[-1] if rates else None,
            "minutes": self.history.window / 60,
            "covered": covered(self.history, now),
        }

    async def overview(self, request: Request) -> Response:
        return self._page(request, "overview.html", **await self._overview())

    async def overview_fragment(self, request: Request) -> Response:
        return self._page(request, "_overview.html", **await self._overview())

    # ------------------------------------------------------------------ groups

    async def _groups(self, request: Request) -> dict[str, Any]:
        params = request.query_params
        state = params.get("state") or None
        prefix = params.get("prefix") or None
        after = params.get("after") or None
        min_priority = _int(params.get("min_priority"), 0, 0, MAX_PRIORITY)
        infos = await self.q.groups(
            state=state, prefix=prefix, min_priority=min_priority, limit=PAGE, after=after
        )
        return {
            "groups": infos,
            "states": GROUP_STATES,
            "meanings": group_states.MEANINGS,
            "state": state or "",
            "prefix": prefix or "",
            "min_priority": min_priority,
            "after": after or "",
            "next_after": infos[-1].group_id if len(infos) == PAGE else None,
            "query": request.url.query,
        }

    async def groups(self, request: Request) -> Response:
        return self._page(request, "groups.html", **await self._groups(request))

    async def groups_fragment(self, request: Request) -> Response:
        return self._page(request, "_groups.html", **await self._groups(request))

    async def _group(self, request: Request) -> dict[str, Any]:
        group_id = request.query_params.get("id", "")
        found = await self.q.groups(prefix=group_id, limit=1) if group_id else []
        info = found[0] if found and found[0].group_id == group_id else None
        messages = await self.q.peek(group_id, PAGE) if group_id else []
        dead = await self.q.dead_letters(PAGE, group_id=group_id) if group_id else []
        return {
            "group_id": group_id,
            "info": info,
            "messages": [(seq, _pretty(event)) for seq, event in messages],
            "dead": dead,
            "query": request.url.query,
        }

    async def group(self, request: Request) -> Response:
        return self._page(request, "group.html", **await self._group(request))

    async def group_fragment(self, request: Request) -> Response:
        return self._page(request, "_group.html", **await self._group(request))

    # ------------------------------------------------------------------ one message

    async def _message(self, request: Request) -> dict[str, Any]:
        group_id = request.query_params.get("group", "")
        seq = _int(request.query_params.get("seq"), 0, 0, 2**63 - 1)
        job = await self.q.result(group_id, seq) if group_id and seq else None
        return {"group_id": group_id, "seq": seq, "job": job, "query": request.url.query}

    async def message(self, request: Request) -> Response:
        return self._page(request, "message.html", **await self._message(request))

    async def message_fragment(self, request: Request) -> Response:
        return self._page(request, "_message.html", **await self._message(request))

    # ------------------------------------------------------------------ batches

    async def _batches(self, request: Request) -> dict[str, Any]:
        params = request.query_params
        state = params.get("state") or None
        after = params.get("after") or None
        found = await self.q.batches(state=state, limit=PAGE, after=after)
        return {
            "batches": found,
            "states": BATCH_STATES,
            "state": state or "",
            "next_after": found[-1].id if len(found) == PAGE else None,
            "query": request.url.query,
        }

    async def batches(self, request: Request) -> Response:
        return self._page(request, "batches.html", **await self._batches(request))

    async def batches_fragment(self, request: Request) -> Response:
        return self._page(request, "_batches.html", **await self._batches(request))

    async def _batch(self, request: Request) -> dict[str, Any]:
        batch_id = request.query_params.get("id", "").strip()
        found = await self.q.batch_status(batch_id) if batch_id else None
        return {"batch_id": batch_id, "batch": found, "query": request.url.query}

    async def batch(self, request: Request) -> Response:
        return self._page(request, "batch.html", **await self._batch(request))

    async def batch_fragment(self, request: Request) -> Response:
        return self._page(request, "_batch.html", **await self._batch(request))

    # ------------------------------------------------------------------ dead letters

    async def _dead(self, request: Request) -> dict[str, Any]:
        group_id = request.query_params.get("group") or None
        limit = _int(request.query_params.get("limit"), PAGE, 1, MAX_BATCH)
        after = request.query_params.get("after") or None
        letters = await self.q.dead_letters(limit, group_id=group_id, after=after)
        return {
            "letters": letters,
            "group": group_id or "",
            "limit": limit,
            "after": after or "",
            "next_after": letters[-1].cursor if len(letters) == limit else None,
            "query": request.url.query,
        }

    async def dead(self, request: Request) -> Response:
        return self._page(request, "dead.html", **await self._dead(request))

    async def dead_fragment(self, request: Request) -> Response:
        return self._page(request, "_dead.html", **await self._dead(request))

    # ------------------------------------------------------------------ tenants

    async def _tenants(self, request: Request) -> dict[str, Any]:
        after = request.query_params.get("after") or None
        stats, tenants = await asyncio.gather(
            self.q.stats(), self.q.tenants(limit=PAGE, after=after)
        )
        shown = tenants if stats.tenants_on else []  # off: an explanation, not a table
        return {
            "tenants_on": stats.tenants_on,
            "tenants": shown,
            "after": after or "",
            "next_after": shown[-1].name if len(shown) == PAGE else None,
            "query": request.url.query,
        }

    async def tenants(self, request: Request) -> Response:
        return self._page(request, "tenants.html", **await self._tenants(request))

    async def tenants_fragment(self, request: Request) -> Response:
        return self._page(request, "_tenants.html", **await self._tenants(request))

    async def schedules(self, request: Request) -> Response:
        return self._page(request, "schedules.html", schedules=await self.q.schedules())

    # ------------------------------------------------------------------ actions

    async def action(self, request: Request) -> Response:
        if not self.allow_actions:
            return PlainTextResponse(
                "read-only dashboard: start it with --allow-actions to change the queue",
                status_code=403,
            )
        if not self._same_origin(request):
            return PlainTextResponse("refused: the request comes from another origin", 403)
        try:
            form = await request.form()
        except ClientDisconnect:
            client = f"{request.client.host}:{request.client.port}" if request.client else "?"
            _log.warning(
                "client %s hung up before the whole body of POST %s", client, request.url.path
            )
            return Response(status_code=400)
        session = self.csrf.session(request.cookies.get(Csrf.COOKIE))
        if not self.csrf.valid(session, form.get("csrf")):
            return PlainTextResponse("missing or wrong CSRF token", status_code=403)
        name = request.path_params["name"]
        run = self._actions().get(name)
        if run is None:
            return PlainTextResponse(f"no such action: {name}", status_code=404)
        back = same_site_path(form.get("next")) or "/"
        if name in DESTRUCTIVE and form.get("confirmed") != "yes":
            return await self._confirm(request, name, form, back)
        await run(form)
        return RedirectResponse(request.scope.get("root_path", "") + back, status_code=303)

    async def _confirm(self, request: Request, name: str, form: FormData, back: str) -> Response:
        """The confirmation step of a destructive action, without script: a page saying what
        it will do, whose form posts the same fields again with `confirmed=yes` (and the
        session's CSRF token); nothing changed yet."""
        fields = [
            (key, str(value))
            for key, value in form.multi_items()
            if key not in ("csrf", "confirmed", "next") and isinstance(value, str)
        ]
        group_id = str(form.get("group_id", ""))
        what: str
        if name == "cancel":
            found = await self.q.groups(prefix=group_id, limit=1) if group_id else []
            depth = found[0].depth if found and found[0].group_id == group_id else 0
            reason = str(form.get("reason") or "cancelled")
            what = (
                f"Cancel group {group_id}: its {depth} message{'s' * (depth != 1)} become dead "
                f"letters with the reason “{reason}”, and a lease in flight on it is lost."
            )
        elif name == "cancel_job":
            seq = str(form.get("seq", ""))
            reason = str(form.get("reason") or "cancelled")
            what = (
                f"Cancel message {seq} of group {group_id} with the reason “{reason}”: queued, "
                f"it is removed at once (its group goes on with its next message); running, its "
                f"worker is told to stop, and it settles as cancelled. It is not retried."
            )
        elif name == "purge":
            seqs = ", ".join(str(v) for v in form.getlist("seq"))
            if form.get("shard"):  # a sharded queue's seqs are per shard
                seqs += f" of shard {form.get('shard')}"
            what = f"Delete dead letter {seqs} for good: it cannot be requeued afterwards."
        else:
            dead = (await self.q.stats()).dead
            what = (
                f"Delete every dead letter ({dead}) for good: none can be requeued afterwards."
                if name == "purge_all"
                else f"Publish every dead letter ({dead}) again to its group, at the back."
            )
        return self._page(
            request,
            "confirm.html",
            action=name,
            label=DESTRUCTIVE[name],
            what=what,
            fields=fields,
            back=back,
        )

    def _actions(self) -> dict[str, Callable[[FormData], Awaitable[Any]]]:
        q = self.q

        def group(form: FormData) -> str:
            return str(form.get("group_id", ""))

        def seqs(form: FormData) -> list[int] | None:
            values = form.getlist("seq")
            try:
                return [int(str(v)) for v in values] if values else None
            except ValueError:
                raise InvalidArgument("seq must be whole numbers") from None

        def shard(form: FormData) -> str | None:
            """A dead letter's shard (a sharded queue's seqs are per shard)."""
            name = form.get("shard")
            return str(name) if name else None

        def tenant(form: FormData) -> str:
            name = form.get("tenant")
            if name is None:
                raise InvalidArgument("no tenant chosen")
            return str(name)

        return {
            "hold": lambda f: q.hold_group(group(f)),
            "release": lambda f: q.release_group(group(f)),
            "cancel": lambda f: q.cancel_group(group(f), str(f.get("reason") or "cancelled")),
            "cancel_job": lambda f: q.cancel(
                group(f), _required(seqs(f))[0], str(f.get("reason") or "cancelled")
            ),
            "priority": lambda f: q.set_priority(
                group(f), _int(f.get("priority"), -1, 0, MAX_PRIORITY, strict=True)
            ),
            "requeue": lambda f: q.requeue_dead(_required(seqs(f)), shard=shard(f)),
            "purge": lambda f: q.purge_dead(_required(seqs(f)), shard=shard(f)),
            "requeue_all": lambda f: q.requeue_dead(None),
            "purge_all": lambda f: q.purge_dead(None),
            "pause": lambda f: q.pause(),
            "resume": lambda f: q.resume(),
            "set_tenant_weight": lambda f: q.set_tenant(tenant(f), weight=_weight(f.get("weight"))),
        }


class _Guard:
    """Around every request: refuses what `_Dashboard.refusal` refuses, and puts the security
    headers on every response, whatever its status."""

    def __init__(self, app: ASGIApp, dashboard: _Dashboard) -> None:
        self.app = app
        self.dashboard = dashboard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(raw=list(message.get("headers", [])))
                for name, value in SECURITY_HEADERS.items():
                    headers[name] = value
                message = {**message, "headers": headers.raw}
            await send(message)

        refusal = self.dashboard.refusal(HTTPConnection(scope))
        if refusal is not None:
            await refusal(scope, receive, secured)
        else:
            await self.app(scope, receive, secured)


def _route_path(request: Request) -> str:
    """The request's path inside the dashboard (without the path it is mounted at)."""
    root = request.scope.get("root_path", "")
    path = str(request.scope["path"])
    return path[len(root) :] if root and path.startswith(root) else path


def _required(seqs: list[int] | None) -> list[int]:
    if not seqs:
        raise InvalidArgument("no dead letter chosen")
    return seqs


def _int(value: Any, default: int, low: int, high: int, *, strict: bool = False) -> int:
    if value is None or value == "":
        if strict:
            raise InvalidArgument(f"a number from {low} to {high} is needed")
        return default
    try:
        number = int(str(value))
    except ValueError:
        raise InvalidArgument(f"not a whole number: {str(value)[:40]!r}") from None
    if not low <= number <= high:
        raise InvalidArgument(f"{number} is not from {low} to {high}")
    return number


def _weight(value: Any) -> float:
    """A tenant's weight as typed in the form: a positive number (`set_tenant` checks its
    range)."""
    text = "" if value is None else str(value).strip()
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise InvalidArgument(f"the weight must be a positive number, got {text[:40]!r}")
    return number


def _num(value: float | None, places: int = 6) -> str:
    """A number without noise or exponent, to `places` decimals at most: 4, 0.5, 1000000;
    '' for None."""
    if value is None:
        return ""
    text = f"{value:.{places}f}"
    text = text.rstrip("0").rstrip(".") if "." in text else text
    return "0" if text == "-0" else text


def _rate_limit(tenant: TenantInfo) -> str:
    """'50/s, burst 10, 3.2 left', or '—' for a tenant without a rate limit."""
    if tenant.rate is None:
        return "—"
    parts = [f"{_num(tenant.rate)}/s"]
    if tenant.burst is not None:
        parts.append(f"burst {_num(tenant.burst)}")
    if tenant.tokens is not None:
        parts.append(f"{_num(tenant.tokens, 1)} left")
    return ", ".join(parts)


def _pretty(event: Any) -> str:
    if isinstance(event, bytes | bytearray):
        return repr(bytes(event))
    try:
        return json.dumps(event, indent=2, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        return repr(event)
