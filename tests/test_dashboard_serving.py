"""The dashboard served safely (issue 24), by the real command (`rqlite-queue dashboard`) on a
real rqlite node, over HTTP(S): only its own Host names are served (DNS rebinding), an action
from another origin is refused, empty credentials and an open public dashboard with actions
are refused at start, redirects are relative, every response carries the security headers and
`Cache-Control: no-store`, a client that hangs up mid-body costs one log line, the CSRF token
is per session, failed logins are throttled, the token may come from a file, and TLS works."""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import re
import select
import shutil
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rqlite_queue import Transport
from rqlite_queue.testing import Cluster

pytest.importorskip("starlette", reason="the dashboard extra is not installed")

BIN = Path(sys.executable).parent
EXE = shutil.which("rqlite-queue", path=str(BIN))

pytestmark = pytest.mark.skipif(EXE is None, reason="rqlite-queue is not installed")


@dataclass
class Served:
    base: str  # the first address it printed
    port: int
    urls: list[str]  # every address it printed
    log: str = ""  # the command's stderr, once it has stopped


def command(url: str, queue: str, *options: str) -> list[str]:
    assert EXE is not None
    return [EXE, "--url", url, "--queue", queue, "dashboard", "--port", "0", *options]


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RQLITE_QUEUE_DASH")}
    return {**env, **extra}


@contextmanager
def serve(
    url: str, queue: str, *options: str, env: dict[str, str] | None = None
) -> Iterator[Served]:
    """`rqlite-queue dashboard` on a free port until the block ends (SIGTERM, exit 0)."""
    process = subprocess.Popen(
        command(url, queue, *options),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment(**(env or {})),
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], 30)
    line = process.stdout.readline() if ready else ""
    found = re.search(r" on ((https?://[^/ ]+?:(\d+))/.*) \(", line)
    if not found:
        process.kill()
        raise AssertionError(f"no address in {line!r}: {process.communicate()[1][-2000:]}")
    served = Served(found.group(2), int(found.group(3)), found.group(1).split(", "))
    try:
        yield served
    finally:
        process.terminate()
        try:
            _, served.log = process.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        assert process.returncode == 0, served.log[-2000:]


def refused(url: str, queue: str, *options: str, env: dict[str, str] | None = None) -> str:
    """Runs a dashboard command that must refuse to start; returns what it said."""
    try:
        done = subprocess.run(
            command(url, queue, *options),
            capture_output=True,
            text=True,
            env=environment(**(env or {})),
            timeout=20,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{options} started a dashboard: {exc.stdout!r}") from None
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    return done.stderr


def csrf_token(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, "an actions dashboard puts its token in its forms"
    return found.group(1)


@pytest.fixture
def queue_name() -> str:
    return f"serve_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def q(rqlite_cluster: Cluster, queue_name: str) -> Iterator[Transport]:
    transport = Transport.from_url(rqlite_cluster.url, queue=queue_name)
    transport.publish("g", 1)
    yield transport
    transport.close()


# ------------------------------------------------------------------------------ (a) rebinding


def test_only_the_dashboards_own_host_names_are_served(
    rqlite_cluster: Cluster, queue_name: str, q: Transport
) -> None:
    """A DNS-rebinding page reaches 127.0.0.1 with its own name in `Host`: refused."""
    with serve(rqlite_cluster.url, queue_name) as served, httpx.Client() as http:
        url = f"http://127.0.0.1:{served.port}/"
        for host in ("127.0.0.1", "localhost", "[::1]", "localhost."):
            page = http.get(url, headers={"Host": f"{host}:{served.port}"})
            assert page.status_code == 200, host
        assert http.get(url, headers={"Host": "localhost"}).status_code == 200
        for host in ("evil.example", "127.0.0.1.evil.example", "localhost.evil.example", "x"):
            page = http.get(url, headers={"Host": f"{host}:{served.port}"})
            assert page.status_code == 400, host
            assert page.text.startswith("unknown Host"), page.text
            assert page.headers["cache-control"] == "no-store"
        assert http.get(url + "static/htmx.min.js", headers={"Host": "evil"}).status_code == 400
    with (
        serve(
            rqlite_cluster.url,
            queue_name,
            "--allowed-host",
            "dash.internal",
            "--allowed-host",
            "ops.internal:9000",
            "--public-url",
            "https://dash.example.com/queue",
        ) as served,
        httpx.Client() as http,
    ):
        url = f"http://127.0.0.1:{served.port}/"
        for host in (
            "dash.internal",
            f"dash.internal:{served.port}",
            "ops.internal:9000",
            "dash.example.com",
            "DASH.example.com",
            f"127.0.0.1:{served.port}",
        ):
            assert http.get(url, headers={"Host": host}).status_code == 200, host
        for host in ("ops.internal", "ops.internal:9001", "example.com", "evil.example"):
            assert http.get(url, headers={"Host": host}).status_code == 400, host


def test_an_action_from_another_origin_is_refused(
    rqlite_cluster: Cluster, queue_name: str, q: Transport
) -> None:
    with (
        serve(
            rqlite_cluster.url,
            queue_name,
            "--allow-actions",
            "--public-url",
            "https://dash.example.com/queue",
        ) as served,
        httpx.Client(base_url=served.base) as http,
    ):
        token = csrf_token(http.get("/"))
        form = {"csrf": token, "next": "/"}
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": f"http://evil.example:{served.port}"},
            {"Origin": "null"},
            {"Origin": f"https://127.0.0.1:{served.port}"},  # another scheme
            {"Origin": "http://127.0.0.1:1"},  # another port
            {"Referer": f"http://evil.example:{served.port}/"},
            {"Origin": "http://evil.example", "Referer": f"{served.base}/"},
        ):
            forged = http.post("/action/pause", data=form, headers=headers)
            assert forged.status_code == 403, headers
            assert "origin" in forged.text.lower(), headers
            assert not q.stats().paused
        for headers in (
            {"Origin": served.base},
            {"Referer": f"{served.base}/groups?state=ready"},
            {"Origin": "https://dash.example.com"},
            {},  # not a browser (curl, a script): the CSRF token alone
        ):
            q.resume()
            done = http.post("/action/pause", data=form, headers=headers)
            assert done.status_code == 303, headers
            assert q.stats().paused
    q.resume()


# ------------------------------------------------------------------------------ (b), (c) at start


def test_empty_credentials_are_refused_at_start(
    rqlite_cluster: Cluster, queue_name: str, tmp_path: Path
) -> None:
    url = rqlite_cluster.url
    assert "--token" in refused(url, queue_name, "--token", "")
    assert "--token" in refused(url, queue_name, "--token", "  ")
    assert "--basic-auth" in refused(url, queue_name, "--basic-auth", "")
    said = refused(url, queue_name, env={"RQLITE_QUEUE_DASHBOARD_TOKEN": ""})
    assert "RQLITE_QUEUE_DASHBOARD_TOKEN" in said and "empty" in said
    said = refused(url, queue_name, env={"RQLITE_QUEUE_DASHBOARD_AUTH": ""})
    assert "RQLITE_QUEUE_DASHBOARD_AUTH" in said and "empty" in said
    empty = tmp_path / "empty"
    empty.write_text("\n")
    assert "--token-file" in refused(url, queue_name, "--token-file", str(empty))
    missing = str(tmp_path / "missing")
    assert "--token-file" in refused(url, queue_name, "--token-file", missing)
    secret = tmp_path / "secret"
    secret.write_text("s3cret\n")
    said = refused(url, queue_name, "--token-file", str(secret), "--token", "other")
    assert "--token-file" in said


def test_actions_on_a_public_address_need_auth(rqlite_cluster: Cluster, queue_name: str) -> None:
    url = rqlite_cluster.url
    for host in ("0.0.0.0", "::", "192.0.2.1", "dash.example.com"):
        said = refused(url, queue_name, "--host", host, "--allow-actions")
        assert "--allow-actions" in said and "auth" in said, host
    with (
        serve(url, queue_name, "--host", "0.0.0.0", "--allow-actions", "--token", "s3cret") as s,
        httpx.Client() as http,
    ):
        local = http.get(f"http://127.0.0.1:{s.port}/", headers={"Authorization": "Bearer s3cret"})
        assert local.status_code == 200
    assert "warning" not in s.log  # with auth: nothing to warn of
    with serve(url, queue_name, "--host", "0.0.0.0") as s, httpx.Client() as http:
        assert http.get(f"http://127.0.0.1:{s.port}/").status_code == 200  # read-only: fine


def machine_addresses(version: int) -> list[str]:
    """The machine's addresses of one IP version, as iproute2 reads them (not the command's
    way), without IPv6 link-local ones."""
    ip = shutil.which("ip")
    if ip is None:
        pytest.skip("no `ip` (iproute2) to read the machine's addresses with")
    shown = subprocess.run(
        [ip, "-j", f"-{version}", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    found = [a["local"] for link in json.loads(shown) for a in link.get("addr_info", [])]
    return [a for a in found if not ipaddress.ip_address(a).is_link_local or version == 4]


def test_on_every_address_the_machines_own_are_answered_and_shown(
    rqlite_cluster: Cluster, queue_name: str, q: Transport
) -> None:
    """Issue 37: on `--host 0.0.0.0` the machine's own addresses are its names too (opening
    http://<lan-ip>:PORT/ got 400), the startup line shows an address to open for each, loopback
    first (it showed http://0.0.0.0:PORT/), and, without auth, a warning says that anyone who
    reaches it sees the payloads. Connected through loopback only, the Host naming each."""
    url = rqlite_cluster.url
    v4 = machine_addresses(4)
    assert "127.0.0.1" in v4
    with serve(url, queue_name, "--host", "0.0.0.0") as served, httpx.Client() as http:
        for address in v4:
            host = {"Host": f"{address}:{served.port}"}
            page = http.get(f"http://127.0.0.1:{served.port}/", headers=host)
            assert page.status_code == 200, address
        for other in ("203.0.113.254", "evil.example"):
            host = {"Host": f"{other}:{served.port}"}
            assert http.get(f"http://127.0.0.1:{served.port}/", headers=host).status_code == 400
        assert served.urls[0] == f"http://127.0.0.1:{served.port}/"
        assert sorted(served.urls) == sorted(f"http://{a}:{served.port}/" for a in v4)
    warning = [line for line in served.log.splitlines() if line.startswith("warning")]
    assert len(warning) == 1 and "every address" in warning[0] and "payloads" in warning[0]

    if socket.has_ipv6 and "::1" in machine_addresses(6):
        v6 = machine_addresses(6)
        with serve(url, queue_name, "--host", "::") as served, httpx.Client() as http:
            assert served.urls[0] == f"http://[::1]:{served.port}/"
            assert sorted(served.urls) == sorted(f"http://[{a}]:{served.port}/" for a in v6)
            for address in v6:
                host = {"Host": f"[{address}]:{served.port}"}
                page = http.get(f"http://[::1]:{served.port}/", headers=host)
                assert page.status_code == 200, address

    with serve(url, queue_name, "--trusted-proxy", "127.0.0.1") as served:
        assert served.urls == [f"http://127.0.0.1:{served.port}/"]
    assert "warning" in served.log and "proxy" in served.log


RESOLVER = """
import socket

_getaddrinfo = socket.getaddrinfo


def getaddrinfo(host, port, *args, **kwargs):
    # localhost as most machines' /etc/hosts name it: ::1 and 127.0.0.1 (IPv6 sorted first)
    if host == "localhost":
        return [*_getaddrinfo("::1", port, *args, **kwargs),
                *_getaddrinfo("127.0.0.1", port, *args, **kwargs)]
    return _getaddrinfo(host, port, *args, **kwargs)


socket.getaddrinfo = getaddrinfo
"""


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6")
def test_a_name_of_several_addresses_is_served_on_each(tmp_path: Path) -> None:
    """Issue 36: `--host localhost` where localhost names ::1 and 127.0.0.1 (most machines;
    this one's /etc/hosts names 127.0.0.1 alone, so the command's resolver is given both, in
    the order glibc sorts them) listens on both, on one port: one socket from the first
    answer served ::1 alone, and a client trying 127.0.0.1 was refused."""
    if "::1" not in machine_addresses(6):
        pytest.skip("no ::1 on this machine")
    (tmp_path / "sitecustomize.py").write_text(RESOLVER)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    url = f"sqlite:///{tmp_path}/queue.db"
    with (
        serve(url, "q", "--host", "localhost", env={"PYTHONPATH": path}) as served,
        httpx.Client() as http,
    ):
        assert served.urls == [f"http://localhost:{served.port}/"]
        for address in ("127.0.0.1", "[::1]"):
            page = http.get(f"http://{address}:{served.port}/")
            assert page.status_code == 200, address


# ------------------------------------------------------------------------------ (d), (e), headers


def test_trailing_slash_redirects_are_relative(
    rqlite_cluster: Cluster, queue_name: str, q: Transport
) -> None:
    with serve(rqlite_cluster.url, queue_name) as served, httpx.Client() as http:
        url = f"http://127.0.0.1:{served.port}"
        moved = http.get(f"{url}/groups/?state=ready", headers={"Host": "localhost"})
        assert moved.status_code in (307, 308)
        assert moved.headers["location"] == "/groups?state=ready"
        assert http.get(f"{url}/nowhere/").status_code == 404
        assert http.get(f"{url}//evil.example/").status_code == 404


HEADERS = {
    "cache-control": "no-store",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}


def assert_security_headers(response: httpx.Response) -> None:
    for name, value in HEADERS.items():
        assert response.headers.get(name) == value, (response.request.url, name)
    policy = response.headers["content-security-policy"]
    for part in ("default-src 'self'", "frame-ancestors 'none'", "form-action 'self'"):
        assert part in policy, (response.request.url, part)
    assert "base-uri 'none'" in policy and "script-src" not in policy


def test_every_response_carries_the_security_headers(
    rqlite_cluster: Cluster, queue_name: str, q: Transport
) -> None:
    with serve(rqlite_cluster.url, queue_name) as served, httpx.Client() as http:
        url = f"http://127.0.0.1:{served.port}"
        for response, status in [
            (http.get(f"{url}/"), 200),
            (http.get(f"{url}/fragments/overview"), 200),
            (http.get(f"{url}/static/htmx.min.js"), 200),
            (http.get(f"{url}/groups", params={"state": "stuck"}), 400),
            (http.get(f"{url}/", headers={"Host": "evil.example"}), 400),
            (http.get(f"{url}/nowhere"), 404),
            (http.post(f"{url}/action/pause", data={}), 403),
            (http.get(f"{url}/groups/"), 307),
        ]:
            assert response.status_code == status, response.request.url
            assert_security_headers(response)
    with (
        serve(rqlite_cluster.url, queue_name, "--token", "s3cret", "--allow-actions") as served,
        httpx.Client(base_url=served.base) as http,
    ):
        for response, status in [
            (http.get("/"), 401),
            (http.get("/", headers={"Authorization": "Bearer s3cret"}), 200),
            (http.post("/action/pause", headers={"Origin": "http://evil.example"}), 401),
            (
                http.post(
                    "/action/pause",
                    headers={"Origin": "http://evil.example", "Authorization": "Bearer s3cret"},
                ),
                403,
            ),
        ]:
            assert response.status_code == status, response.request.url
            assert_security_headers(response)


# ------------------------------------------------------------------------------ (f) hang-ups


def test_a_client_hanging_up_mid_body_costs_one_log_line(
    rqlite_cluster: Cluster, queue_name: str, q: Transport
) -> None:
    with serve(rqlite_cluster.url, queue_name, "--allow-actions") as served:
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
                conn.sendall(
                    b"POST /action/pause HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    b"Content-Type: application/x-www-form-urlencoded\r\n"
                    b"Content-Length: 1000\r\n\r\ncsrf=abc"
                )
                time.sleep(0.3)
        time.sleep(0.5)
        with httpx.Client(base_url=served.base) as http:
            assert http.get("/").status_code == 200  # still serving
    assert "Traceback" not in served.log, served.log[-3000:]
    lines = [line for line in served.log.splitlines() if line.strip()]
    assert len(lines) == 3, served.log
    assert all("hung up" in line and "/action/pause" in line for line in lines), lines
    assert not q.stats().paused


# ------------------------------------------------------------------------------ sessions, logins


def test_the_csrf_token_is_per_session(
    rqlite_cluster: Cluster, queue_name: str, q: Transport
) -> None:
    with (
        serve(rqlite_cluster.url, queue_name, "--allow-actions") as served,
        httpx.Client(base_url=served.base) as alice,
        httpx.Client(base_url=served.base) as bob,
        httpx.Client(base_url=served.base) as mallory,
    ):
        page = alice.get("/")
        cookie = page.headers["set-cookie"]
        assert "httponly" in cookie.lower() and "samesite=lax" in cookie.lower()
        assert "secure" not in cookie.lower()  # plain HTTP
        token_a, token_b = csrf_token(page), csrf_token(bob.get("/"))
        assert token_a != token_b
        again = alice.get("/group", params={"id": "g"})
        assert csrf_token(again) == token_a  # the same all through a session
        assert "set-cookie" not in again.headers
        for who, token in ((bob, token_a), (alice, token_b), (mallory, token_a)):
            refused = who.post("/action/pause", data={"csrf": token})
            assert refused.status_code == 403 and "CSRF" in refused.text
        assert not q.stats().paused
        assert bob.post("/action/pause", data={"csrf": token_b}).status_code == 303
        assert q.stats().paused
        assert alice.post("/action/resume", data={"csrf": token_a}).status_code == 303
        assert not q.stats().paused


def test_the_token_from_a_file_or_the_environment(
    rqlite_cluster: Cluster, queue_name: str, tmp_path: Path
) -> None:
    secret = tmp_path / "token"
    secret.write_text("fr0m-a-file\n")
    with (
        serve(rqlite_cluster.url, queue_name, "--token-file", str(secret)) as served,
        httpx.Client(base_url=served.base) as http,
    ):
        assert http.get("/").status_code == 401
        ok = http.get("/", headers={"Authorization": "Bearer fr0m-a-file"})
        assert ok.status_code == 200
    with (
        serve(
            rqlite_cluster.url, queue_name, env={"RQLITE_QUEUE_DASHBOARD_TOKEN": "fr0m-the-env"}
        ) as served,
        httpx.Client(base_url=served.base) as http,
    ):
        assert http.get("/").status_code == 401
        ok = http.get("/", headers={"Authorization": "Bearer fr0m-the-env"})
        assert ok.status_code == 200


def test_failed_logins_are_throttled(rqlite_cluster: Cluster, queue_name: str) -> None:
    with (
        serve(rqlite_cluster.url, queue_name, "--basic-auth", "admin:pw") as served,
        httpx.Client(base_url=served.base) as http,
    ):
        for _ in range(10):  # a browser asking before it prompts is no failed login
            assert http.get("/").status_code == 401
        for _ in range(5):
            assert http.get("/", auth=("admin", "guess")).status_code == 401
        locked = http.get("/", auth=("admin", "pw"))
        assert locked.status_code == 429  # even the right password, while locked out
        assert_security_headers(locked)
        wait = int(locked.headers["retry-after"])
        assert 1 <= wait <= 2
        time.sleep(wait + 0.2)
        assert http.get("/", auth=("admin", "guess")).status_code == 401
        again = http.get("/", auth=("admin", "pw"))
        assert again.status_code == 429  # one more failure: locked out again, for longer
        assert int(again.headers["retry-after"]) >= wait
        time.sleep(int(again.headers["retry-after"]) + 0.2)
        assert http.get("/", auth=("admin", "pw")).status_code == 200
        for _ in range(4):  # a success forgets the failures
            assert http.get("/", auth=("admin", "guess")).status_code == 401
        assert http.get("/", auth=("admin", "pw")).status_code == 200


def test_forwarded_headers_are_not_believed_by_default(
    rqlite_cluster: Cluster, queue_name: str
) -> None:
    """Issue 37: 30 wrong tokens, each naming another client in X-Forwarded-For (and
    Forwarded): all count against the peer, 127.0.0.1, which is locked out after the fifth, as
    without the headers. (uvicorn, left to its default, believed the header from loopback: 401
    every time.)"""
    with (
        serve(rqlite_cluster.url, queue_name, "--token", "s3cret") as served,
        httpx.Client(base_url=served.base) as http,
    ):
        statuses = [
            http.get(
                "/",
                headers={
                    "Authorization": "Bearer guess",
                    "X-Forwarded-For": f"203.0.113.{i}",
                    "Forwarded": f"for=198.51.100.{i}",
                },
            ).status_code
            for i in range(30)
        ]
        assert statuses[:6] == [401] * 5 + [429], statuses
        # A lockout that runs out on a slow machine lets one failure through, which locks the
        # address again, for twice as long.
        assert all(b == 429 for a, b in itertools.pairwise(statuses[5:]) if a == 401), statuses
        assert statuses.count(401) <= 8, statuses
        right = {"Authorization": "Bearer s3cret", "X-Forwarded-For": "192.0.2.99"}
        assert http.get("/", headers=right).status_code == 429


def session_cookie(page: httpx.Response) -> str:
    found = re.search(r"rqlite_queue_session=([^;]+)", page.headers["set-cookie"])
    assert found
    return found.group(1)


def test_a_trusted_proxy_names_the_client(
    rqlite_cluster: Cluster, queue_name: str, q: Transport
) -> None:
    """`--trusted-proxy`: the client a trusted proxy names in X-Forwarded-For is the one
    throttled (the rightmost address not of a trusted proxy: what a client writes itself before
    is not believed), X-Forwarded-Proto: https makes the request an HTTPS one (a `Secure`
    cookie, its origin https://...); `Forwarded` is never read. Without the option,
    X-Forwarded-Proto changes nothing either."""
    url = rqlite_cluster.url
    for bad in ("nonsense", "10.0.0.0/33", "*", "127.0.0.1:80"):
        assert "--trusted-proxy" in refused(url, queue_name, "--trusted-proxy", bad), bad
    proxies = ("--trusted-proxy", "127.0.0.1", "--trusted-proxy", "10.9.8.7/8")
    with (
        serve(url, queue_name, "--token", "s3cret", *proxies) as served,
        httpx.Client(base_url=served.base) as http,
    ):

        def via(client: str, token: str, **headers: str) -> int:
            sent = {"Authorization": f"Bearer {token}", "X-Forwarded-For": client, **headers}
            return http.get("/", headers=sent).status_code

        for _ in range(5):
            assert via("203.0.113.7", "guess") == 401
        assert via("203.0.113.7", "s3cret") == 429  # that client is locked out
        assert via("203.0.113.7, 10.1.2.3", "s3cret") == 429  # through a second proxy too
        assert via("198.51.100.1, 203.0.113.7", "s3cret") == 429  # its own first entry: no
        assert via("203.0.113.8", "s3cret") == 200  # the others are not
        assert http.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        for i in range(5):
            assert via("203.0.113.9", "guess", Forwarded=f"for=198.51.100.{i}") == 401
        assert via("203.0.113.9", "s3cret", Forwarded="for=198.51.100.77") == 429

    https = {"X-Forwarded-Proto": "https"}
    for options, believed in (((), False), (proxies[:2], True)):
        with (
            serve(url, queue_name, "--allow-actions", *options) as served,
            httpx.Client(base_url=served.base) as http,
        ):
            page = http.get("/", headers=https)
            assert ("secure" in page.headers["set-cookie"].lower()) is believed, options
            posted = http.post(
                "/action/pause",
                data={"csrf": csrf_token(page)},
                headers={
                    **https,
                    "Origin": f"https://127.0.0.1:{served.port}",
                    "Cookie": f"rqlite_queue_session={session_cookie(page)}",
                },
            )
            assert posted.status_code == (303 if believed else 403), options
            assert q.stats().paused is believed
            q.resume()


def test_failed_logins_from_other_sites_are_counted_apart(
    rqlite_cluster: Cluster, queue_name: str
) -> None:
    """Issue 37: wrong credentials a browser says another site's page made it send
    (`Sec-Fetch-Site: cross-site` or `same-site`; without fetch metadata, an `Origin` or
    `Referer` of another origin) lock out only such requests; the operator's own (typed:
    `none`, the dashboard's pages: `same-origin`, a script: no header) still get in. A success
    from another site forgets none of their failures."""
    with (
        serve(rqlite_cluster.url, queue_name, "--basic-auth", "admin:pw") as served,
        httpx.Client(base_url=served.base) as http,
    ):
        foreign = [
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
            {"Sec-Fetch-Site": "CROSS-SITE", "Origin": served.base},  # the header decides
            {"Origin": "http://evil.example"},
            {"Referer": f"http://localhost:{served.port + 1}/"},
            {"Origin": "null"},
        ]
        own = [
            {},
            {"Sec-Fetch-Site": "none"},
            {"Sec-Fetch-Site": "same-origin", "Referer": f"{served.base}/groups"},
            {"Origin": served.base},
        ]
        for headers in foreign[:5]:
            assert http.get("/", auth=("admin", "guess"), headers=headers).status_code == 401
        for headers in foreign:
            locked = http.get("/", auth=("admin", "pw"), headers=headers)
            assert locked.status_code == 429, headers
            assert "other sites" in locked.text
        for headers in own:
            assert http.get("/", auth=("admin", "pw"), headers=headers).status_code == 200, headers
        time.sleep(int(locked.headers["retry-after"]) + 0.2)
        assert http.get("/", auth=("admin", "pw"), headers=foreign[0]).status_code == 200
        assert http.get("/", auth=("admin", "guess"), headers=foreign[0]).status_code == 401
        again = http.get("/", auth=("admin", "pw"), headers=foreign[0])
        assert again.status_code == 429  # the success forgot nothing: locked again, for longer
        assert int(again.headers["retry-after"]) > int(locked.headers["retry-after"])
        for _ in range(5):  # the operator's own failures: the usual lockout
            assert http.get("/", auth=("admin", "guess")).status_code == 401
        assert http.get("/", auth=("admin", "pw")).status_code == 429


# ------------------------------------------------------------------------------ TLS


def test_tls(rqlite_cluster: Cluster, queue_name: str, q: Transport, tmp_path: Path) -> None:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    url = rqlite_cluster.url
    tls = ("--cert", str(tmp_path / "cert.pem"), "--key", str(tmp_path / "key.pem"))
    assert "--key" in refused(url, queue_name, *tls[:2])
    assert "--cert" in refused(url, queue_name, *tls[2:])
    with serve(url, queue_name, "--allow-actions", *tls) as served:
        assert served.base.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
        with httpx.Client(base_url=served.base, verify=trusted) as http:
            page = http.get("/")
            assert page.status_code == 200
            assert_security_headers(page)
            assert "secure" in page.headers["set-cookie"].lower()
            done = http.post(
                "/action/pause", data={"csrf": csrf_token(page)}, headers={"Origin": served.base}
            )
            assert done.status_code == 303 and q.stats().paused
        with httpx.Client(base_url=served.base) as unknown, pytest.raises(httpx.ConnectError):
            unknown.get("/")
        plain = f"http://127.0.0.1:{served.port}/"
        with httpx.Client() as http, pytest.raises(httpx.HTTPError):
            http.get(plain)
    q.resume()
