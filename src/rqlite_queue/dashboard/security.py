"""Who may see the dashboard, and which requests may change the queue.

- Which `Host` names it answers to (`Hosts`): a page of another site whose name was made to
  resolve to the dashboard's address (DNS rebinding) sends its own name, and is refused.
- Optional access control for the whole dashboard: HTTP Basic (a browser asks for it) or a
  bearer token (scripts); both compared in constant time; failed logins are throttled per
  client address (`Throttle`), those another site's page made a browser send counted apart.
- Where a form may send a browser back to (`same_site_path`): a path of this site only.
- State-changing requests are POSTs from the dashboard's own origin (`origin_of`) that carry
  the CSRF token of their session: an HMAC, under a key of this dashboard process, of a random
  session id held in an HttpOnly cookie (`Csrf`). Another site's page can neither read the
  token nor make one for its own cookie. A dashboard started read-only refuses every POST."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import math
import re
import secrets
import time
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from ..errors import InvalidArgument

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
"""The names of the machine itself, answered to when the dashboard listens on a loopback
address."""


@dataclass(frozen=True)
class Access:
    basic: tuple[str, str] | None = field(default=None, repr=False)
    bearer: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.basic is not None and not (
            isinstance(self.basic, tuple)
            and len(self.basic) == 2
            and all(isinstance(part, str) and part for part in self.basic)
            and ":" not in self.basic[0]
        ):
            raise InvalidArgument("basic auth must be a (user, password) pair of non-empty strings")
        if self.bearer is not None and (
            not isinstance(self.bearer, str) or not self.bearer.strip()
        ):
            raise InvalidArgument("the bearer token must be a non-empty string")

    @property
    def required(self) -> bool:
        return self.basic is not None or self.bearer is not None

    def allows(self, authorization: str | None) -> bool:
        """Whether an `Authorization` header value grants access."""
        if not self.required:
            return True
        if not authorization:
            return False
        scheme, _, value = authorization.partition(" ")
        value = value.strip()
        if scheme.lower() == "bearer" and self.bearer is not None:
            return hmac.compare_digest(value.encode(), self.bearer.encode())
        if scheme.lower() == "basic" and self.basic is not None:
            try:
                decoded = base64.b64decode(value, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return False
            user, _, password = decoded.partition(":")
            return hmac.compare_digest(user.encode(), self.basic[0].encode()) & hmac.compare_digest(
                password.encode(), self.basic[1].encode()
            )
        return False


class Throttle:
    """Failed logins per client (an address, or what the caller counts apart): from the
    `limit`-th failure in a row on, the client is locked out for `first` seconds, doubled with
    each further failure up to `longest`; a success forgets its failures, and so does an hour
    without one. At most `size` clients are remembered (the least recently failed are forgotten
    first)."""

    def __init__(
        self,
        limit: int = 5,
        first: float = 1.0,
        longest: float = 900.0,
        size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.first, self.longest, self.size = limit, first, longest, size
        self.clock = clock
        self._failures: dict[Hashable, tuple[int, float, float]] = {}  # count, until, last

    def wait(self, who: Hashable) -> int:
        """Whole seconds until `who` may try again; 0 when it may now."""
        entry = self._failures.get(who)
        left = 0.0 if entry is None else entry[1] - self.clock()
        return math.ceil(left) if left > 0 else 0

    def failed(self, who: Hashable) -> None:
        now = self.clock()
        count, _, last = self._failures.pop(who, (0, 0.0, now))
        count = 1 if now - last > 3600 else count + 1
        until = now
        if count >= self.limit:
            until = now + min(self.longest, self.first * 2 ** min(count - self.limit, 30))
        while len(self._failures) >= self.size:
            del self._failures[next(iter(self._failures))]
        self._failures[who] = (count, until, now)

    def succeeded(self, who: Hashable) -> None:
        self._failures.pop(who, None)


def authority(text: str) -> tuple[str, int | None] | None:
    """The (name, port or None) of a `Host` header or of an allow-list entry (`name`,
    `name:port`, `[v6]:port`, a bare IPv6 address): lowercased, without a final dot. None when
    it is none of these."""
    text = text.strip().lower()
    if text.count(":") > 1 and not text.startswith("["):
        text = f"[{text}]"  # a bare IPv6 address (never in a Host header)
    port: int | None = None
    if text.startswith("["):
        name, _, rest = text.partition("]")
        name += "]"
        try:
            ipaddress.IPv6Address(name[1:-1])
        except ValueError:
            return None
    else:
        name, colon, rest = text.partition(":")
        rest = colon + rest
        name = name.removesuffix(".")
        if not re.fullmatch(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?", name):
            return None
    if rest:
        if not re.fullmatch(r":[0-9]{1,5}", rest) or not 0 < int(rest[1:]) < 65536:
            return None
        port = int(rest[1:])
    return name, port


class Hosts:
    """The `Host` names a dashboard answers to: each entry a name (any port) or `name:port`.
    None: any (the app it is mounted in checks them)."""

    def __init__(self, entries: Iterable[str] | None) -> None:
        self.any = entries is None
        self.entries: set[tuple[str, int | None]] = set()
        if entries is None:
            return
        if isinstance(entries, str | bytes) or not isinstance(entries, Iterable):
            raise InvalidArgument("allowed_hosts must be a list of host names (or None)")
        for entry in entries:
            parsed = authority(entry) if isinstance(entry, str) else None
            if parsed is None:
                raise InvalidArgument(f"not a host name or host:port: {entry!r}")
            self.entries.add(parsed)

    def allows(self, host: str | None, scheme: str) -> bool:
        if self.any:
            return True
        parsed = authority(host) if host else None
        if parsed is None:
            return False
        name, port = parsed
        port = port if port is not None else (443 if scheme in ("https", "wss") else 80)
        return (name, None) in self.entries or (name, port) in self.entries


def origin_of(url: str) -> tuple[str, str, int] | None:
    """The (scheme, host, port) of an `Origin` header, a `Referer` or a public URL; None for
    `null` or what is not an http(s) URL."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        return None
    parsed = authority(parts.netloc.rpartition("@")[2])
    if parsed is None:
        return None
    return scheme, parsed[0], port if port is not None else (443 if scheme == "https" else 80)


_SEGMENTS = re.compile(r"(?:/(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|%[0-9A-Fa-f]{2})+)*/?")
_QUERY = re.compile(r"[!-~]*")  # printable ASCII: no blank, no control character
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def same_site_path(value: object) -> str | None:
    """`value` when it is a path of this site to send a browser to (a form's `next`, a
    redirect), else None. A path: `/`, or segments each `/` then URL characters (RFC 3986's,
    `%` only to start an escape), perhaps a final `/`; unescaped, no segment may be empty, `.`
    or `..`, nor hold a backslash or a control character. Then perhaps `?` and a query of
    printable ASCII without backslash or `#`.

    What a browser makes of the rest may be another site: the WHATWG URL parser drops every tab
    and newline and reads a backslash as `/`, so `/\\evil.example`, `/<tab>/evil.example` and
    `/<newline>/evil.example` are `//evil.example`, a path on evil.example; and a server that
    unescapes a path on the way may turn `/%5Cevil.example` or `/%2F%2Fevil.example` into
    one."""
    if not isinstance(value, str):
        return None
    path, mark, query = value.partition("?")
    if not path.startswith("/") or not _SEGMENTS.fullmatch(path):
        return None
    if mark and (not _QUERY.fullmatch(query) or "\\" in query or "#" in query):
        return None
    segments = unquote(path.removesuffix("/")).split("/")[1:]
    for segment in segments:
        if segment in ("", ".", "..") or "\\" in segment or _CONTROL.search(segment):
            return None
    return value


def origins(entries: Iterable[str]) -> frozenset[tuple[str, str, int]]:
    if isinstance(entries, str | bytes) or not isinstance(entries, Iterable):
        raise InvalidArgument("allowed_origins must be a list of origins (scheme://host[:port])")
    found = set()
    for entry in entries:
        parsed = origin_of(entry) if isinstance(entry, str) else None
        if parsed is None:
            raise InvalidArgument(f"not an origin (http[s]://host[:port]): {entry!r}")
        found.add(parsed)
    return frozenset(found)


# ------------------------------------------------------------------------------ CSRF

_SESSION = re.compile(r"[A-Za-z0-9_-]{43}")


class Csrf:
    """A CSRF token per session: the session is a random id in a cookie; its token, put in the
    session's forms, is the id's HMAC under a key of this process (so a restart voids every
    token, and no token is good for another session)."""

    COOKIE = "rqlite_queue_session"

    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    @staticmethod
    def session(cookie: str | None) -> str | None:
        """The session id of a cookie value, if it is one."""
        return cookie if cookie is not None and _SESSION.fullmatch(cookie) else None

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(32)

    def token(self, session: str) -> str:
        mac = hmac.new(self._key, session.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def valid(self, session: str | None, submitted: object) -> bool:
        if session is None or not isinstance(submitted, str):
            return False
        return hmac.compare_digest(submitted.encode(), self.token(session).encode())
