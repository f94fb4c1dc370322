"""A private network for a chaos cluster, so that one node can be cut off from the others.

All nodes on 127.0.0.1 cannot be told apart by a firewall rule (every peer connection comes from
127.0.0.1), so each node gets its own network namespace with its own address, joined by a veth
pair to a bridge in the root namespace. The test process stays in the root namespace and
reaches every node through the bridge. A partition is a pair of DROP rules inside the cut-off
node's namespace (INPUT from and OUTPUT to its peers): the node can no longer talk to the
other nodes, while clients still reach it, the worst case for them (they can keep sending to a
leader that has lost its quorum).

Everything is named after this process's PID and removed when `private_network` exits, even on
failure; what an earlier, killed run left behind (its PID gone) is removed first."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

PREFIX = "rqq"
SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
_OURS = re.compile(rf"{PREFIX}(\d+)(?:br|n\d+|v\d+)")


class NetworkUnavailable(RuntimeError):
    """Namespaces, veths, a bridge or iptables cannot be used here (not root, missing tools)."""


def _run(*cmd: str) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetworkUnavailable(f"{' '.join(cmd)}: {exc}") from exc
    if done.returncode != 0:
        raise NetworkUnavailable(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _quiet(*cmd: str) -> None:
    """Cleanup: the object may already be gone."""
    subprocess.run(cmd, capture_output=True, timeout=30, check=False)


def why_unavailable() -> str | None:
    """Why partitions cannot run here, or None if they can (the tools are present)."""
    if os.geteuid() != 0:
        return "not root (network namespaces and iptables need CAP_NET_ADMIN)"
    missing = [tool for tool in ("ip", "iptables") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (scripts/chaos-deps installs them)"
    return None


@dataclass
class Network:
    """`n` namespaces on one /24; node k (0-based) is `hosts[k]`, run under `wrappers[k]`."""

    n: int
    pid: int = field(default_factory=os.getpid)
    subnet: ipaddress.IPv4Network = field(init=False)
    cut: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.subnet = _free_subnet(self.pid)

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.pid}br"

    def namespace(self, k: int) -> str:
        return f"{PREFIX}{self.pid}n{k + 1}"

    def veth(self, k: int) -> str:
        return f"{PREFIX}{self.pid}v{k + 1}"

    @property
    def hosts(self) -> list[str]:
        return [str(self.subnet[k + 1]) for k in range(self.n)]

    @property
    def wrappers(self) -> list[list[str]]:
        # `ip netns exec` execs the command (no fork), so the node's PID is rqlited's own.
        return [["ip", "netns", "exec", self.namespace(k)] for k in range(self.n)]

    def create(self) -> None:
        gateway = f"{self.subnet[254]}/{self.subnet.prefixlen}"
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", gateway, "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for k in range(self.n):
            ns, veth = self.namespace(k), self.veth(k)
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge, "up")
            address = f"{self.hosts[k]}/{self.subnet.prefixlen}"
            _run("ip", "-n", ns, "addr", "add", address, "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            # Fail now, not at the first partition, if iptables cannot work in a namespace.
            _run("ip", "netns", "exec", ns, "iptables", "-w", "-L", "INPUT", "-n")

    def partition(self, k: int) -> None:
        """Cut node k off from every other node (clients in the root namespace still reach it)."""
        peers = ",".join(h for j, h in enumerate(self.hosts) if j != k)
        iptables = ("ip", "netns", "exec", self.namespace(k), "iptables", "-w")
        self.cut.add(k)
        _run(*iptables, "-A", "INPUT", "-s", peers, "-j", "DROP")
        _run(*iptables, "-A", "OUTPUT", "-d", peers, "-j", "DROP")

    def heal(self, k: int) -> None:
        iptables = ("ip", "netns", "exec", self.namespace(k), "iptables", "-w")
        _run(*iptables, "-F", "INPUT")
        _run(*iptables, "-F", "OUTPUT")
        self.cut.discard(k)

    def destroy(self) -> None:
        """Remove every namespace, veth and the bridge (the rules live in the namespaces)."""
        for k in range(self.n):
            _quiet("ip", "netns", "del", self.namespace(k))
            _quiet("ip", "link", "del", self.veth(k))  # takes its peer with it
        _quiet("ip", "link", "del", self.bridge)


def leftovers(pid: int | None = None) -> list[str]:
    """Namespaces and links of ours still present: of the run with this PID, or of any."""
    if shutil.which("ip") is None:
        return []  # then nothing was made either
    links = re.findall(r"^\d+: ([^:@]+)", _run("ip", "-o", "link", "show"), re.M)
    found = []
    for name in _run("ip", "netns", "list").split() + links:
        match = _OURS.fullmatch(name)
        if match is not None and (pid is None or match.group(1) == str(pid)):
            found.append(name)
    return found


def sweep_stale() -> None:
    """Remove what earlier runs left when they were killed before their cleanup ran."""
    for name in leftovers():
        match = _OURS.fullmatch(name)
        assert match is not None
        if not _alive(int(match.group(1))):
            _quiet("ip", "netns", "del", name)
            _quiet("ip", "link", "del", name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _free_subnet(pid: int) -> ipaddress.IPv4Network:
    """A /24 of 10.213.0.0/16 that no address or route of this machine touches."""
    used = _run("ip", "-4", "-o", "addr", "show") + _run(
        "ip", "-4", "route", "show", "table", "all"
    )
    cidrs = re.findall(r"\d+\.\d+\.\d+\.\d+/\d+", used)
    taken = [ipaddress.IPv4Network(cidr, strict=False) for cidr in cidrs]
    subnets = list(SUBNETS.subnets(new_prefix=24))
    start = pid % len(subnets)
    for net in subnets[start:] + subnets[:start]:
        if not any(net.overlaps(t) for t in taken):
            return net
    raise NetworkUnavailable("no free /24 in 10.213.0.0/16")


def open_network(n: int) -> Network:
    """A new `Network` of `n` nodes (what killed runs left is removed first). If making it
    fails, what was made is removed before the error propagates."""
    sweep_stale()
    net = Network(n)
    try:
        net.create()
    except BaseException:
        net.destroy()
        raise
    return net


@contextlib.contextmanager
def private_network(n: int) -> Iterator[Network]:
    """A `Network` of `n` nodes, torn down on exit whatever happens."""
    net = open_network(n)
    try:
        yield net
    finally:
        net.destroy()
