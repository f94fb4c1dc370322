"""rqlite's HTTP API without I/O: the request for a `Batch`, and the reading of the reply.

Writes go to `/db/request?transaction`: one Raft entry, one SQLite transaction on every node,
and the `SELECT`s inside it come back as rows. Reads go to `/db/query?level=linearizable`.
Followers forward both to the leader (rqlite v8 does not redirect unless asked)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from .errors import AuthError, BackendError, InvalidArgument, NoLeader, Unavailable
from .sql import Batch, Result

# A top-level error that proves the request was not applied: safe to send elsewhere.
_NOT_APPLIED = ("not leader", "leader not found")


@dataclass(frozen=True, slots=True)
class HttpRequest:
    path: str
    params: Mapping[str, str]
    body: list[list[Any]]


def request_for(batch: Batch) -> HttpRequest:
    body: list[list[Any]] = []
    for statement in batch.statements:
        if isinstance(statement.params, Mapping):
            body.append([statement.sql, dict(statement.params)])
        else:
            body.append([statement.sql, *statement.params])
    if batch.write:
        return HttpRequest("/db/request", {"transaction": ""}, body)
    return HttpRequest("/db/query", {"level": "linearizable"}, body)


def parse_reply(status: int, content: bytes, statements: int) -> list[Result]:
    """One `Result` per statement, or a typed error. An SQL error fails the whole batch (the
    transaction was rolled back). `NoLeader` means the request certainly was not applied, so
    another node may take it; any other `Unavailable` leaves a write's outcome unknown."""
    if status in (401, 403):
        raise AuthError(f"rqlite refused the credentials (HTTP {status})")
    text = content.decode("utf-8", "replace").strip()
    if status == 503 or (status >= 500 and _mentions_not_applied(text)):
        raise NoLeader(f"rqlite: {text or status}")
    if status >= 500:
        raise Unavailable(f"rqlite answered HTTP {status}: {text[:200]}")
    if status != 200:
        raise BackendError(f"rqlite answered HTTP {status}: {text[:200]}")
    try:
        reply = json.loads(content)
    except ValueError as exc:
        raise BackendError(f"rqlite reply is not JSON: {text[:200]!r}") from exc
    if not isinstance(reply, dict):
        raise BackendError(f"rqlite reply has the wrong shape: {text[:200]!r}")
    if "error" in reply:
        error = str(reply["error"])
        if _mentions_not_applied(error):
            raise NoLeader(f"rqlite: {error}")
        # e.g. "leadership lost while committing log": the write may or may not have happened.
        raise Unavailable(f"rqlite: {error}")
    results = reply.get("results")
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        raise BackendError(f"rqlite reply has the wrong shape: {text[:200]!r}")
    for result in results:
        if "error" in result:
            raise BackendError(f"rqlite SQL error: {result['error']}")
    if len(results) != statements:
        raise BackendError(f"rqlite returned {len(results)} results for {statements} statements")
    return [_result(r) for r in results]


def _mentions_not_applied(text: str) -> bool:
    lowered = text.lower()
    return any(marker in lowered for marker in _NOT_APPLIED)


def _result(raw: Mapping[str, Any]) -> Result:
    values = raw.get("values") or []
    if not isinstance(values, list):
        raise BackendError(f"rqlite result has the wrong shape: {raw!r}")
    return Result(
        rows=values,
        rows_affected=int(raw.get("rows_affected", 0)),
        last_insert_id=raw.get("last_insert_id"),
    )


@dataclass(frozen=True, slots=True)
class Endpoints:
    """The nodes of one rqlite cluster and the credentials, parsed from a URL like
    `http://user:pass@h1:4001,h2:4001`."""

    urls: tuple[str, ...]
    auth: tuple[str, str] | None


def parse_endpoints(url: str, auth: tuple[str, str] | None = None) -> Endpoints:
    """`http://h1:4001,h2:4001` or `http://h1:4001,http://h2:4001` (each part may repeat the
    scheme); credentials in the URL apply to every node, `auth` overrides them."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidArgument(f"not an rqlite URL: {url!r}")
    scheme = url.split("://", 1)[0]
    if scheme not in ("http", "https"):
        raise InvalidArgument(f"unknown URL scheme {scheme!r} (use http, https or sqlite)")
    credentials = None
    urls = []
    for part in url.split(","):
        part = part.strip()
        if not part:
            continue
        if "://" in part:
            part_scheme, part = part.split("://", 1)
            if part_scheme != scheme:
                raise InvalidArgument(f"mixed schemes in rqlite URL: {url!r}")
        host = part.split("/", 1)[0]
        if "@" in host:
            userinfo, host = host.rsplit("@", 1)
            user, _, password = userinfo.partition(":")
            credentials = (unquote(user), unquote(password))
        try:
            parsed = urlsplit(f"{scheme}://{host}")
            parsed.port  # noqa: B018 - raises on a bad port
        except ValueError as exc:
            raise InvalidArgument(f"bad host in rqlite URL: {host!r}: {exc}") from exc
        if not parsed.hostname:
            raise InvalidArgument(f"bad host in rqlite URL: {host!r}")
        urls.append(f"{scheme}://{host}")
    if not urls:
        raise InvalidArgument(f"no host in rqlite URL: {url!r}")
    return Endpoints(tuple(urls), auth if auth is not None else credentials)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    return re.sub(r"(://[^:/@,]*):[^@/]*@", r"\1:***@", url)
