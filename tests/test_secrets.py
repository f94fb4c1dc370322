"""Passwords in rqlite URLs never leak: not in an exception message, not in repr() of the parsed
`Endpoints` or of a transport, not in a log line; and a password is read as the one intended.

Every password holds one of the characters that mean something in a URL (or all of them) between
two markers unique to it, `Kx<n>q` and `Vz<n>w`: a leak of the whole password, of its
percent-encoded form, of its HTTP Basic encoding, or of either half (a password cut at the
special character), in any letter case, is found by looking for those. Each is tried raw and
percent-encoded, in the single-node URL and in both multi-node forms."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import traceback
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import quote, unquote

import pytest

from rqlite_queue import (
    AsyncRqliteTransport,
    AsyncTransport,
    InvalidArgument,
    OutcomeUnknown,
    RqliteTransport,
    Transport,
    Unavailable,
)
from rqlite_queue._protocol.http import Endpoints, parse_endpoints, redact
from rqlite_queue.testing import free_port

USER = "alice"
SPECIALS = ":/?#[]@!$&'()*+,;=% "
DEADLINE = 0.5
LOGGERS = ("rqlite_queue", "urllib3", "aiohttp", "asyncio")


def password(n: int, inside: str) -> str:
    return f"Kx{n:02d}q{inside}Vz{n:02d}w"


PASSWORDS: dict[str, str] = {f"{c!r}": password(n, c) for n, c in enumerate(SPECIALS)}
PASSWORDS["all of them"] = password(99, SPECIALS)


def secret_forms(pw: str) -> list[str]:
    """What must not appear anywhere, compared case-insensitively."""
    markers = re.findall(r"Kx\d\dq|Vz\d\dw", pw)
    basic = base64.b64encode(f"{USER}:{pw}".encode()).decode()
    return [pw, quote(pw, safe=""), quote(pw), basic, *markers]


def leaks(text: str, pw: str) -> list[str]:
    lowered = text.lower()
    return [form for form in secret_forms(pw) if form.lower() in lowered]


def assert_no_leak(where: str, text: str, pw: str) -> None:
    found = leaks(text, pw)
    assert not found, f"the password leaks in {where}: {found} in {text[:500]!r}"


def exception_text(exc: BaseException) -> str:
    """The message, repr and whole printed traceback (the chain of causes included)."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


# ------------------------------------------------------------------------------ URLs


@dataclass(frozen=True)
class Variant:
    label: str
    password: str
    raw: bool
    form: str

    def url(self, port1: int = 4001, port2: int = 4002) -> str:
        pw = self.password if self.raw else quote(self.password, safe="")
        userinfo = f"{USER}:{pw}@"
        if self.form == "one node":
            return f"http://{userinfo}127.0.0.1:{port1}"
        if self.form == "h1,h2":
            return f"http://{userinfo}127.0.0.1:{port1},127.0.0.1:{port2}"
        return f"http://{userinfo}127.0.0.1:{port1},http://{userinfo}127.0.0.1:{port2}"

    @property
    def nodes(self) -> int:
        return 1 if self.form == "one node" else 2

    @property
    def intended(self) -> str:
        """The password the library reads: the userinfo is percent-decoded, raw or not, so a
        raw password is read as typed unless it holds a valid %XX escape (none here does:
        after '%' comes 'V'); `test_a_raw_percent_escape_is_decoded` shows the other case."""
        return unquote(self.password) if self.raw else self.password

    def __str__(self) -> str:
        return f"{self.label}-{'raw' if self.raw else 'encoded'}-{self.form}"


FORMS = ("one node", "h1,h2", "h1,http://h2")
VARIANTS = [
    Variant(label, pw, raw, form)
    for label, pw in PASSWORDS.items()
    for raw in (True, False)
    for form in FORMS
]

AWKWARD = [
    pytest.param(
        Variant("'://' inside", "Kx50q://Vz50w", raw, form),
        id=f"'://' inside-{'raw' if raw else 'encoded'}-{form}",
    )
    for raw in (True, False)
    for form in FORMS
] + [
    pytest.param(
        Variant("starts with http://", "http://Kx51qVz51w", raw, form),
        id=f"starts with http---{'raw' if raw else 'encoded'}-{form}",
    )
    for raw in (True, False)
    for form in FORMS
]


def check_parsed(variant: Variant, url: str) -> Endpoints | None:
    """Parse `url` (and build both transports from it, which does no I/O): it must either
    work, with the intended credentials, or raise InvalidArgument; nothing shows the
    password. Returns the endpoints, or None if refused."""
    pw = variant.password
    assert_no_leak("redact(url)", redact(url), pw)
    try:
        endpoints = parse_endpoints(url)
    except InvalidArgument as exc:
        assert_no_leak("the InvalidArgument of parse_endpoints", exception_text(exc), pw)
        for make in (RqliteTransport, AsyncRqliteTransport):
            with pytest.raises(InvalidArgument) as error:
                make(url)
            assert_no_leak(
                f"the InvalidArgument of {make.__name__}", exception_text(error.value), pw
            )
        return None
    assert_no_leak("repr(Endpoints)", repr(endpoints), pw)
    assert_no_leak("str(Endpoints)", str(endpoints), pw)
    assert endpoints.auth == (USER, variant.intended), endpoints.urls
    assert len(endpoints.urls) == variant.nodes, endpoints.urls
    transport = RqliteTransport(url)
    async_transport = AsyncRqliteTransport(url)
    try:
        for shown in (transport, transport.client, async_transport, async_transport.client):
            assert_no_leak(f"repr({type(shown).__name__})", repr(shown), pw)
    finally:
        transport.close()
    return endpoints


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_a_password_is_read_as_intended_and_never_shown(variant: Variant) -> None:
    assert check_parsed(variant, variant.url()) is not None


@pytest.mark.parametrize("variant", AWKWARD)
def test_a_password_that_looks_like_a_url_is_read_as_intended_or_refused_unshown(
    variant: Variant,
) -> None:
    check_parsed(variant, variant.url())


def test_a_raw_percent_escape_is_decoded() -> None:
    """What the library does with a raw password that holds a valid %XX escape: it reads the
    escape (userinfo is percent-decoded whether or not it needed to be), so a password that
    really contains '%41' must be written '%2541'."""
    assert parse_endpoints("http://alice:Kx60q%41Vz60w@h:1").auth == ("alice", "Kx60qAVz60w")
    assert parse_endpoints("http://alice:a%2Fb%25c@h:1").auth == ("alice", "a/b%c")
    assert parse_endpoints("http://alice:Kx60q%2541Vz60w@h:1").auth == ("alice", "Kx60q%41Vz60w")
    assert parse_endpoints("http://alice:100%@h:1").auth == ("alice", "100%")  # not an escape
    assert parse_endpoints("http://alice:%zz%4@h:1").auth == ("alice", "%zz%4")


# ----------------------------------------------------------------------- malformed URLs

PW = password(98, SPECIALS)
PW_ENCODED = quote(PW, safe="")
MALFORMED = [
    ("mixed schemes", f"http://alice:{PW_ENCODED}@h:1,https://alice:{PW_ENCODED}@h:2"),
    ("mixed schemes, raw", f"http://alice:{PW}@h:1,https://alice:{PW}@h:2"),
    ("port not a number", f"http://alice:{PW_ENCODED}@h:port"),
    ("port not a number, raw", f"http://alice:{PW}@h:port"),
    ("port out of range", f"http://alice:{PW_ENCODED}@h:99999"),
    ("negative port", f"http://alice:{PW_ENCODED}@h:-1"),
    ("two ports", f"http://alice:{PW_ENCODED}@h:1:2"),
    ("second node's port bad", f"http://alice:{PW_ENCODED}@h:1,h:x"),
    ("second node's port bad, schemes", f"http://alice:{PW}@h:1,http://alice:{PW}@h:x"),
    ("bad IPv6", f"http://alice:{PW_ENCODED}@[::1"),
    ("no host", f"http://alice:{PW_ENCODED}@"),
    ("no host, raw", f"http://alice:{PW}@"),
    ("only a comma", f"http://alice:{PW_ENCODED}@,"),
    ("different credentials", f"http://alice:{PW_ENCODED}@h:1,http://alice:x@h:2"),
    ("unknown scheme", f"redis://alice:{PW_ENCODED}@h:1"),
    ("unknown scheme, raw", f"ftp://alice:{PW}@h:1"),
    ("no scheme", f"alice:{PW_ENCODED}@h:1"),
    ("scheme without //", f"http:alice:{PW_ENCODED}@h:1"),
    ("scheme typo", f"http//alice:{PW_ENCODED}@h:1"),
    ("sqlite scheme", f"sqlite://alice:{PW_ENCODED}@h:1"),
    ("a shard's port bad", f"a=http://alice:{PW_ENCODED}@h:port;b=http://h:2"),
    ("an unnamed shard's port bad", f"http://alice:{PW_ENCODED}@h:port;http://h:2"),
    ("an unnamed shard's port bad, raw", f"http://alice:{PW}@h:port;http://h:2"),
]
MISSING_HOST = [
    ("no @host", f"http://alice:{PW_ENCODED}"),
    ("no @host, a letter password", "http://alice:Kx98qVz98w"),
]
MALFORMED_PARAMS = [pytest.param(url, id=label) for label, url in MALFORMED + MISSING_HOST]


@pytest.mark.parametrize("url", MALFORMED_PARAMS)
def test_a_malformed_url_is_refused_without_showing_the_password(url: str) -> None:
    assert_no_leak("redact(url)", redact(url), PW)
    with pytest.raises(InvalidArgument) as error:
        Transport.from_url(url, connect_timeout=DEADLINE, deadline=DEADLINE)
    assert_no_leak("the InvalidArgument of from_url", exception_text(error.value), PW)
    try:
        endpoints = parse_endpoints(url)
    except InvalidArgument as exc:
        assert_no_leak("the InvalidArgument of parse_endpoints", exception_text(exc), PW)
    else:  # from_url refused it for its scheme: parsing alone may accept it
        assert_no_leak("repr(Endpoints)", repr(endpoints), PW)


async def test_async_from_url_refuses_a_malformed_url_without_showing_the_password() -> None:
    for label, url in MALFORMED:
        with pytest.raises(InvalidArgument) as error:
            await AsyncTransport.from_url(url, connect_timeout=DEADLINE, deadline=DEADLINE)
        assert_no_leak(
            f"the InvalidArgument of from_url ({label})", exception_text(error.value), PW
        )


# --------------------------------------------- failing calls against a port where nothing listens


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every log record of the library and of the HTTP clients, at DEBUG."""
    caplog.set_level(logging.DEBUG)
    for name in LOGGERS:
        caplog.set_level(logging.DEBUG, logger=name)
    yield caplog


def log_text(records: Iterable[logging.LogRecord]) -> str:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return "\n".join(formatter.format(record) for record in records)


@dataclass(frozen=True)
class Attempt:
    """One way of reaching a dead node with a password: a URL, or a URL and `auth=`."""

    label: str
    password: str
    url: str
    auth: tuple[str, str] | None = None


def attempts() -> list[Attempt]:
    port1, port2 = free_port(), free_port()
    made = [Attempt(str(v), v.password, v.url(port1, port2)) for v in VARIANTS]
    made += [
        Attempt(f"auth= {label}", pw, f"http://127.0.0.1:{port1},127.0.0.1:{port2}", (USER, pw))
        for label, pw in PASSWORDS.items()
    ]
    return made


NOT_DONE = (Unavailable, OutcomeUnknown)
"""A port where nothing listened when it was picked may be another test's by the time it is
tried (a write sent there and not answered: OutcomeUnknown)."""


def check_failure(
    attempt: Attempt, exc: BaseException, expected: type[BaseException] | tuple[type, ...]
) -> None:
    assert isinstance(exc, expected), f"{attempt.label}: {exception_text(exc)}"
    assert_no_leak(f"the error of {attempt.label}", exception_text(exc), attempt.password)


def call_sync(attempt: Attempt) -> tuple[BaseException | None, BaseException | None]:
    """A publish on a transport, then a from_url: each must fail (Unavailable)."""
    failures: list[BaseException | None] = []
    transport = RqliteTransport(attempt.url, auth=attempt.auth, deadline=DEADLINE)
    try:
        assert_no_leak("repr(transport)", repr(transport), attempt.password)
        transport.publish("g", "e")
        failures.append(None)
    except Exception as exc:
        failures.append(exc)
    finally:
        transport.close()
    try:
        Transport.from_url(
            attempt.url, auth=attempt.auth, connect_timeout=DEADLINE, deadline=DEADLINE
        ).close()
        failures.append(None)
    except Exception as exc:
        failures.append(exc)
    return failures[0], failures[1]


async def call_async(attempt: Attempt) -> tuple[BaseException | None, BaseException | None]:
    failures: list[BaseException | None] = []
    transport = AsyncRqliteTransport(attempt.url, auth=attempt.auth, deadline=DEADLINE)
    try:
        assert_no_leak("repr(transport)", repr(transport), attempt.password)
        await transport.publish("g", "e")
        failures.append(None)
    except Exception as exc:
        failures.append(exc)
    finally:
        await transport.close()
    try:
        opened = await AsyncTransport.from_url(
            attempt.url, auth=attempt.auth, connect_timeout=DEADLINE, deadline=DEADLINE
        )
        await opened.close()
        failures.append(None)
    except Exception as exc:
        failures.append(exc)
    return failures[0], failures[1]


def check_outcomes(
    tried: list[Attempt],
    outcomes: list[tuple[BaseException | None, BaseException | None]],
    logs: pytest.LogCaptureFixture,
) -> None:
    for attempt, (call_error, from_url_error) in zip(tried, outcomes, strict=True):
        assert call_error is not None and from_url_error is not None, attempt.label
        check_failure(attempt, call_error, NOT_DONE)
        check_failure(attempt, from_url_error, NOT_DONE)
    text = log_text(logs.records)
    for attempt in tried:
        assert_no_leak(f"the logs ({attempt.label})", text, attempt.password)


def test_no_password_in_errors_or_logs_of_failing_sync_calls(
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    """All at once (in threads), so that the 0.5 s deadlines run side by side."""
    tried = attempts()
    with ThreadPoolExecutor(max_workers=len(tried)) as pool:
        outcomes = list(pool.map(call_sync, tried))
    check_outcomes(tried, outcomes, debug_logs)


async def test_no_password_in_errors_or_logs_of_failing_async_calls(
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    tried = attempts()
    outcomes = await asyncio.gather(*(call_async(attempt) for attempt in tried))
    check_outcomes(tried, list(outcomes), debug_logs)


def test_the_logs_were_captured(debug_logs: pytest.LogCaptureFixture) -> None:
    """The log check above is not vacuous: a failing call logs (urllib3, at DEBUG)."""
    with pytest.raises(Unavailable):
        RqliteTransport(f"http://127.0.0.1:{free_port()}", deadline=0.2).publish("g", "e")
    assert any(r.name.startswith("urllib3") for r in debug_logs.records)
