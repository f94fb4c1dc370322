"""docs/install.md's three-machine cluster, run as written on 127.0.0.1.

The commands are read from the page (the block after its `install-three-machines` marker); each
machine's address becomes 127.0.0.1 with ports of its own, its data directory a temporary one.
Everything else (flags, bootstrap, joins) is what the page says to type."""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from pathlib import Path

import httpx

from rqlite_queue import Transport
from rqlite_queue.testing import free_port

PAGE = Path(__file__).resolve().parent.parent / "docs" / "install.md"


def documented_commands() -> tuple[list[list[str]], str]:
    text = PAGE.read_text()
    block = text.split("<!-- install-three-machines", 1)[1].split("```sh\n", 1)[1]
    block = block.split("```", 1)[0]
    commands = [
        shlex.split(line)
        for line in block.replace("\\\n", " ").splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    export = re.search(r"export RQLITE_QUEUE_URL=(\S+)", text)
    assert export is not None
    return commands, export.group(1)


def test_the_three_machine_cluster_of_the_install_page(rqlited_path: str, tmp_path: Path) -> None:
    commands, url = documented_commands()
    assert len(commands) == 3 and all(c[0] == "rqlited" for c in commands)
    machines = sorted(set(re.findall(r"10\.0\.0\.\d+", " ".join(map(" ".join, commands)))))
    assert len(machines) == 3
    ports = {(ip, port): free_port() for ip in machines for port in ("4001", "4002")}

    def local(arg: str, ip: str) -> str:
        arg = arg.replace("0.0.0.0:", f"{ip}:")  # each machine binds its own address here
        for (host, port), mapped in ports.items():
            arg = arg.replace(f"{host}:{port}", f"127.0.0.1:{mapped}")
        return arg

    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, command in enumerate(commands):
            ip = next(m for m in machines if f"-http-adv-addr {m}:" in " ".join(command))
            args = [local(arg, ip) for arg in command[1:]]
            assert args[-1] == "/var/lib/rqlite"
            args[-1] = str(tmp_path / f"node{i}")
            log = (tmp_path / f"node{i}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [rqlited_path, *args], stdout=log, stderr=subprocess.STDOUT, env={"TZ": "UTC"}
                )
            )
        local_url = ",".join(
            "http://" + local(part.removeprefix("http://"), "") for part in url.split(",")
        )
        deadline = time.monotonic() + 60
        with httpx.Client(trust_env=False, timeout=2) as client:
            for base in local_url.split(","):
                while True:
                    try:
                        if client.get(base + "/readyz").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    assert time.monotonic() < deadline, (tmp_path / "node0.log").read_text()
                    time.sleep(0.1)
            nodes = client.get(local_url.split(",")[0] + "/nodes?ver=2").json()["nodes"]
        assert len(nodes) == 3 and all(n["voter"] for n in nodes)
        assert sum(n["leader"] for n in nodes) == 1
        with Transport.from_url(local_url, queue="install_page") as queue:
            queue.publish("g", {"n": 1})
            lease = queue.claim("w", visibility=30)
            assert lease is not None and lease.event == {"n": 1}
            queue.ack(lease)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
