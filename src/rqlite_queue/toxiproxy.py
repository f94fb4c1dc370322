"""Finding, building and driving toxiproxy: the proxy that gives local clusters real links
(latency and jitter, a trickle, a silent link, a reset), for `Cluster(links=...)`.

The binary is toxiproxy v2.5.0's server (Shopify's Go module `github.com/Shopify/toxiproxy/v2`)
with a few toxics of our own (`toxiproxy_server/toxics.go`): `latency_us` (toxiproxy's own
latency counts whole milliseconds, too coarse for 1 ms links with 10 % jitter), `tally` and `cut`
(they count what they saw and what they broke off, so a test can match what a client saw with
what was really lost), `sever` (silences the connections open when it is added). Its source is
in the package, so `rqlite-queue toxiproxy` builds the same binary for a checkout and a wheel
user, into the cache beside rqlited's, once.

The API is toxiproxy's HTTP API, spoken with urllib3 (the one Python client on PyPI,
toxiproxy-python 0.1.1, was last released in 2019 and would bring in requests)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3

from .errors import QueueError
from .rqlited import cache_dir

__all__ = [
    "VERSION",
    "ClusterLinks",
    "Link",
    "Links",
    "Toxiproxy",
    "ToxiproxyError",
    "ToxiproxyNotFound",
    "build_toxiproxy",
    "find_toxiproxy",
]

VERSION = "v2.5.0"
_MODULE = "github.com/Shopify/toxiproxy/v2"
_SOURCE = Path(__file__).parent / "toxiproxy_server"
_SOURCE_FILES = ("go.mod", "go.sum", "main.go", "toxics.go")


class ToxiproxyNotFound(QueueError):
    """No usable toxiproxy server: missing, not runnable, or not this package's build."""


class ToxiproxyError(RuntimeError):
    """Toxiproxy's API refused a request (a bad toxic, a port in use...)."""


def _source_digest() -> str:
    digest = hashlib.sha256()
    for name in _SOURCE_FILES:
        digest.update((_SOURCE / name).read_bytes())
    return digest.hexdigest()[:12]


def _build_tag() -> str:
    """What our build's `-version` prints after toxiproxy's version (main.go's Build)."""
    for line in (_SOURCE / "main.go").read_text().splitlines():
        if line.startswith("const Build = "):
            return line.split('"')[1]
    raise ToxiproxyNotFound("toxiproxy_server/main.go has no Build constant")


def cached_path() -> Path:
    """The binary built from this package's source: its own folder per source digest, so a
    changed toxic is never run from an older build."""
    return cache_dir() / f"toxiproxy-{VERSION}-{_source_digest()}" / "toxiproxy-server"


def check_toxiproxy(path: str | os.PathLike[str]) -> str:
    """`path` if it runs and is this package's build of toxiproxy (its toxics are needed)."""
    path = str(path)
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise ToxiproxyNotFound(f"{path} is not an executable file")
    try:
        out = subprocess.run(
            [path, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToxiproxyNotFound(f"cannot run {path} -version: {exc}") from exc
    text = (out.stdout + out.stderr).strip()
    expected = f"toxiproxy-server version {VERSION}+{_build_tag()}"
    if text != expected:
        raise ToxiproxyNotFound(
            f"{path} says {text[:120]!r}, not {expected!r}: the links need this package's "
            "build of toxiproxy (its extra toxics); `rqlite-queue toxiproxy` builds it"
        )
    return path


def find_toxiproxy(*, build: bool = False, log: Callable[[str], None] | None = None) -> str:
    """The toxiproxy server's path: $TOXIPROXY if set (and only it), else the cache; with
    `build`, built from toxiproxy's Go module when the cache has none and Go is here."""
    explicit = os.environ.get("TOXIPROXY")
    if explicit:
        try:
            return check_toxiproxy(explicit)
        except ToxiproxyNotFound as exc:
            raise ToxiproxyNotFound(f"TOXIPROXY: {exc}") from exc
    cached = cached_path()
    if cached.is_file():
        return check_toxiproxy(cached)
    if build and shutil.which("go"):
        if log is not None:
            log(f"no toxiproxy in {cached.parent.parent}")
        return check_toxiproxy(build_toxiproxy(log=log))
    how = (
        "Go is not installed, so it cannot be built here"
        if build
        else ("`rqlite-queue toxiproxy` builds it when Go is installed")
    )
    raise ToxiproxyNotFound(
        f"no toxiproxy server: $TOXIPROXY is unset and {cached} is missing; {how}"
    )


def build_toxiproxy(*, log: Callable[[str], None] | None = None) -> str:
    """Build the server (toxiproxy's module at VERSION and our toxics) into the cache; returns
    its path. Needs Go (no C compiler); Go's caches make rebuilds quick."""
    go = shutil.which("go")
    if go is None:
        raise ToxiproxyNotFound("Go is not installed: cannot build toxiproxy")
    out = cached_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOTOOLCHAIN": "local", "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    if log is not None:
        log(f"building toxiproxy {VERSION} from {_MODULE} (the first build takes a minute)")
    with tempfile.TemporaryDirectory(prefix="toxiproxy-build-") as work:
        # A copy: the package may be installed read-only, and go may touch go.sum.
        for name in _SOURCE_FILES:
            shutil.copyfile(_SOURCE / name, Path(work) / name)
        tmp = f"{out}.tmp"
        args = [
            go,
            "build",
            "-trimpath",
            "-ldflags",
            f"-s -w -X {_MODULE}.Version={VERSION}",
            "-o",
            tmp,
            ".",
        ]
        proc = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ToxiproxyNotFound(
                f"building toxiproxy failed: `{' '.join(args)}` exited {proc.returncode}:\n"
                + (proc.stderr or proc.stdout).strip()[-2000:]
            )
    os.replace(tmp, out)
    if log is not None:
        log(f"built {out}")
    return str(out)


# ---------------------------------------------------------------------------------------------
# The API


class Toxiproxy:
    """A running toxiproxy server's API (`http://127.0.0.1:PORT`)."""

    def __init__(
        self, url: str, timeout: float = 5.0, context: Callable[[], str] | None = None
    ) -> None:
        """`context`: what to add to an error when the API does not answer (the server's
        state and the end of its log)."""
        self.url = url.rstrip("/")
        self.context = context
        self._pool = urllib3.PoolManager(
            timeout=urllib3.Timeout(total=timeout), retries=False, maxsize=4
        )

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        try:
            reply = self._pool.request(
                method, self.url + path, body=data, headers={"Content-Type": "application/json"}
            )
        except urllib3.exceptions.HTTPError as exc:
            more = f"\n{self.context()}" if self.context is not None else ""
            raise ToxiproxyError(f"toxiproxy {method} {path}: no answer: {exc}{more}") from exc
        if reply.status >= 300:
            raise ToxiproxyError(
                f"toxiproxy {method} {path}: HTTP {reply.status}: {reply.data[:300]!r}"
            )
        return json.loads(reply.data) if reply.data.strip() else None

    def version(self) -> str:
        reply = self._pool.request("GET", self.url + "/version")
        return reply.data.decode().strip()

    def create(self, name: str, listen: str, upstream: str) -> Link:
        """A new proxy: connections to `listen` (`host:0`: a free port, picked by the
        server) are passed on to `upstream`."""
        made = self.request(
            "POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream}
        )
        return Link(self, name, made["listen"], upstream)

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed."""
        self.request("POST", "/reset")

    def close(self) -> None:
        self._pool.clear()


class Link:
    """One proxy: a link into a node's port. Toxics act on one direction of it: `upstream` is
    what callers send to the node, `downstream` what the node sends back."""

    def __init__(self, api: Toxiproxy, name: str, listen: str, upstream: str) -> None:
        self.api = api
        self.name = name
        self.listen = listen
        self.upstream = upstream

    def __repr__(self) -> str:
        return f"Link({self.name!r}, {self.listen} -> {self.upstream})"

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    def add(
        self,
        kind: str,
        stream: str = "downstream",
        *,
        name: str | None = None,
        toxicity: float = 1.0,
        **attributes: float | str,
    ) -> str:
        """Add a toxic of `kind` with `attributes`; returns its name (default KIND_STREAM)."""
        return self.add_toxic(kind, stream, attributes, name=name, toxicity=toxicity)

    def add_toxic(
        self,
        kind: str,
        stream: str,
        attributes: Mapping[str, float | str],
        *,
        name: str | None = None,
        toxicity: float = 1.0,
    ) -> str:
        """`add`, with the attributes as a mapping."""
        if stream not in ("upstream", "downstream"):
            raise ValueError(f"stream must be 'upstream' or 'downstream', not {stream!r}")
        toxic = name or f"{kind}_{stream}"
        body = {
            "name": toxic,
            "type": kind,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": dict(attributes),
        }
        self.api.request("POST", f"/proxies/{self.name}/toxics", body)
        return toxic

    def update(self, toxic: str, **attributes: float) -> None:
        """Change attributes of a toxic in place (e.g. `cut`'s `every=0`: it stops cutting)."""
        self.api.request("POST", f"/proxies/{self.name}/toxics/{toxic}", {"attributes": attributes})

    def remove(self, toxic: str) -> None:
        self.api.request("DELETE", f"/proxies/{self.name}/toxics/{toxic}")

    def toxics(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api.request("GET", f"/proxies/{self.name}/toxics")
        return found

    def toxic(self, name: str) -> dict[str, Any]:
        """One toxic as the API shows it (`attributes` holds the counters of tally and cut)."""
        found: dict[str, Any] = self.api.request("GET", f"/proxies/{self.name}/toxics/{name}")
        return found

    def clear(self, keep: tuple[str, ...] = ()) -> None:
        """Remove every toxic of this link but those named in `keep`, and enable it."""
        for toxic in self.toxics():
            if toxic["name"] not in keep:
                self.remove(toxic["name"])
        if not self.api.request("GET", f"/proxies/{self.name}")["enabled"]:
            self.enable()

    def retarget(self, upstream: str) -> None:
        """Pass connections on to `upstream` from now on."""
        self.api.request("POST", f"/proxies/{self.name}", {"upstream": upstream})
        self.upstream = upstream

    def enable(self, enabled: bool = True) -> None:
        """Disabled, a link closes its connections and refuses new ones (a node gone from the
        network, as far as its callers can tell); enabled again, it listens again."""
        self.api.request("POST", f"/proxies/{self.name}", {"enabled": enabled})

    def disable(self) -> None:
        self.enable(False)

    # -- the usual toxics --

    def latency(self, rtt: float, jitter: float = 0.1) -> None:
        """A round trip of `rtt` seconds through this link, half of it each way, each half
        varied by +/- `jitter` of itself (10 % by default). Replaces any latency set before."""
        for stream in ("upstream", "downstream"):
            with contextlib.suppress(ToxiproxyError):
                self.remove(f"latency_{stream}")
            if rtt > 0:
                half = rtt / 2 * 1e6
                self.add(
                    "latency_us",
                    stream,
                    name=f"latency_{stream}",
                    latency=round(half),
                    jitter=round(half * jitter),
                )

    def silent(self, stream: str | None = None, close_after: float = 0.0) -> list[str]:
        """Nothing passes (toxiproxy's `timeout`: the data is dropped and no reset is sent, as
        on a link that died without a word); `close_after` > 0 closes the connections after
        that many seconds. Both ways unless `stream` is given."""
        streams = [stream] if stream else ["upstream", "downstream"]
        return [self.add("timeout", s, timeout=round(close_after * 1000)) for s in streams]

    def counted(self, kind: str, stream: str = "downstream", **attributes: float | str) -> str:
        """Toxic `kind`, with a `tally` in front of it that counts what it was given
        (`tallied(stream)`)."""
        self.add("tally", stream, name=f"tally_{stream}")
        return self.add_toxic(kind, stream, attributes)

    def tallied(self, stream: str = "downstream") -> dict[str, int]:
        """The counters (chunks, bytes, HTTP messages begun) of this link's tally on `stream`."""
        found: dict[str, int] = self.toxic(f"tally_{stream}")["attributes"]
        return found


@contextlib.contextmanager
def toxic(
    link: Link, kind: str, stream: str = "downstream", **attributes: float | str
) -> Iterator[str]:
    """A toxic on `link` for the duration of the block."""
    name = link.add_toxic(kind, stream, attributes)
    try:
        yield name
    finally:
        link.remove(name)


# ---------------------------------------------------------------------------------------------
# The server process and a cluster's links


def spawn(binary: str, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    """Start the server with its API on 127.0.0.1:`port`, its log in `log_path` (a file, never
    a pipe that could fill). The caller owns the process: it stops it by its PID."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [binary, "-host", "127.0.0.1", "-port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            close_fds=True,
        )


def wait_api(api: Toxiproxy, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """Until the API of *our* process answers (it exits at once if its port was taken)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise ToxiproxyError(f"toxiproxy exited with code {proc.returncode} at start")
        with contextlib.suppress(urllib3.exceptions.HTTPError, OSError):
            if api.version():
                return
        if time.monotonic() > deadline:
            raise ToxiproxyError(f"toxiproxy's API did not answer within {timeout}s")
        time.sleep(0.02)


@dataclass(frozen=True)
class Links:
    """What of a local cluster goes through toxiproxy (`Cluster(links=Links(...))`): each
    node's Raft port always (the node advertises the proxy with `-raft-adv-addr`, so every
    peer reaches it through it), and its HTTP port when `http` (advertised with
    `-http-adv-addr`; the cluster's `urls` are then the proxies'). `rtt`: a round trip of that
    many seconds on every link from the start, varied by +/- `jitter` of itself."""

    http: bool = True
    rtt: float = 0.0
    jitter: float = 0.1


LATENCY = ("latency_upstream", "latency_downstream")
SETTLE = 0.2


class ClusterLinks:
    """The links of a running cluster, by node id: `raft[node_id]` (into its Raft port) and
    `http[node_id]` (into its HTTP port, when the clients' HTTP goes through the proxy). A
    round trip between two nodes crosses one Raft link (the callee's); a client's crosses the
    node's HTTP link."""

    def __init__(self, api: Toxiproxy, spec: Links) -> None:
        self.api = api
        self.spec = spec
        self.raft: dict[str, Link] = {}
        self.http: dict[str, Link] = {}
        self.rtt = spec.rtt
        self.jitter = spec.jitter

    def all(self) -> list[Link]:
        return [*self.raft.values(), *self.http.values()]

    def of(self, node_id: str) -> list[Link]:
        """The links into node `node_id`: its Raft link, and its HTTP link if any."""
        return [links[node_id] for links in (self.raft, self.http) if node_id in links]

    def latency(self, rtt: float, jitter: float = 0.1) -> None:
        """A round trip of `rtt` seconds (+/- `jitter` of it) on every link; it stays through
        `clear()`."""
        self.rtt, self.jitter = rtt, jitter
        for link in self.all():
            link.latency(rtt, jitter)

    def clear(self) -> None:
        """Every link enabled again and every toxic removed, except the round trip set by
        `latency` (or `Links.rtt`), which stays in place."""
        for link in self.all():
            link.clear(keep=LATENCY)
        # Toxiproxy 2.5.0 panics when a toxic is added to a connection whose last toxic
        # closed it (timeout, reset_peer, limit_data, cut do) before the connection is
        # dropped from its proxy, which takes a moment after the removal.
        time.sleep(SETTLE)

    def isolate(self, node_id: str) -> None:
        """Cut `node_id` off through the proxies, as a partition does (packets dropped, no
        reset): its own links silent (nothing reaches it, and it answers no one), and what it
        sends into the others' Raft links dropped (`sever`, on the messages that carry its
        Raft address, as every Raft message names its sender: a proxy cannot tell its callers
        apart, and the others must still reach each other to elect a new leader). `clear()`
        ends it."""
        for link in self.of(node_id):
            link.silent()
        marker = self.raft[node_id].listen  # its advertised Raft address
        for other, link in self.raft.items():
            if other != node_id:
                link.add("sever", "upstream", marker=marker)
