"""HTTP Basic auth and TLS against rqlited started with `-auth` and `-http-cert/-http-key`."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import trustme

from rqlite_queue import RqliteTransport, Transport, Unavailable
from rqlite_queue.errors import AuthError
from rqlite_queue.testing import Cluster


@pytest.fixture(scope="module")
def auth_cluster(rqlited_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    users = tmp_path_factory.mktemp("auth") / "users.json"
    users.write_text(
        json.dumps(
            [
                {"username": "alice", "password": "s3cret", "perms": ["all"]},
                {"username": "reader", "password": "r", "perms": ["query", "status", "ready"]},
                # Anonymous probes (the harness's readiness checks) may only see status.
                {"username": "*", "perms": ["status", "ready"]},
            ]
        )
    )
    with Cluster(1, binary=rqlited_path, extra_args=["-auth", str(users)]) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tls_cluster(rqlited_path: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    d = tmp_path_factory.mktemp("tls")
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    tls = (str(d / "cert.pem"), str(d / "key.pem"), str(d / "ca.pem"))
    with Cluster(3, binary=rqlited_path, tls=tls) as cluster:
        yield cluster


def test_credentials_in_the_url_or_as_arguments(auth_cluster: Cluster) -> None:
    host = auth_cluster.urls[0].removeprefix("http://")
    with Transport.from_url(f"http://alice:s3cret@{host}", queue="auth1") as q:
        q.publish("g", 1)
    with RqliteTransport(auth_cluster.url, queue="auth1", auth=("alice", "s3cret")) as q2:
        lease = q2.claim("w", 30)
        assert lease is not None and lease.event == 1
        q2.ack(lease)


@pytest.mark.parametrize("auth", [("alice", "wrong"), ("nobody", "x"), None])
def test_wrong_credentials_fail_at_once_without_retrying(
    auth_cluster: Cluster, auth: tuple[str, str] | None
) -> None:
    q = RqliteTransport(auth_cluster.url, queue="auth2", auth=auth)
    start = time.monotonic()
    with pytest.raises(AuthError) as refused:
        q.publish("g", 1)
    # the node that refused, and what to check
    assert str(refused.value).startswith(f"{auth_cluster.urls[0]}: rqlite refused the credentials")
    assert "check the URL's user and password" in str(refused.value)
    assert time.monotonic() - start < 2
    assert q.client.requests == 1
    q.close()
    with pytest.raises(AuthError):
        Transport.from_url(auth_cluster.url, queue="auth2", auth=auth, connect_timeout=30)


def test_a_user_without_write_permission_is_refused(auth_cluster: Cluster) -> None:
    with pytest.raises(AuthError):
        RqliteTransport(auth_cluster.url, queue="auth3", auth=("reader", "r")).setup()


def test_tls_with_a_ca_file(tls_cluster: Cluster) -> None:
    assert tls_cluster.url.startswith("https://")
    ca = tls_cluster.tls[2] if tls_cluster.tls else ""
    with Transport.from_url(tls_cluster.url, queue="tls1", verify=ca) as q:
        q.publish("g", {"secure": True})
        lease = q.claim("w", 30)
        assert lease is not None and lease.event == {"secure": True}
        q.ack(lease)
    with RqliteTransport(tls_cluster.url, queue="tls1", verify=False) as q2:
        assert q2.stats().depth == 0


def test_tls_with_an_unknown_ca_is_refused(tls_cluster: Cluster) -> None:
    with pytest.raises(Unavailable, match=r"(?i)certificate") as refused:
        RqliteTransport(tls_cluster.url, queue="tls2", deadline=1).setup()
    # what each node did, by URL: the handshake failed (issue 36)
    assert refused.value.nodes, str(refused.value)
    for url, seen in refused.value.nodes.items():
        assert url in tls_cluster.urls and (seen.startswith("TLS: ") or seen == "not tried")
    assert "TLS: " in str(refused.value)
