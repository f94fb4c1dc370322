"""A rolling upgrade under load: clients of two library versions, each in processes of its own
(`rolling_client.py` with `PYTHONPATH` set to that version's `src/`), share one queue on a
real rqlite cluster while the newer one migrates the schema mid-run. Producers and workers of
both versions run; the first client of the newer version migrates on its first call; a client
of the older version started after that is refused with `SchemaError`. Then:

- nothing is lost: every publish that returned was handled, the queue ends empty, no dead
  letters; a message is handled twice only when its holder was refused before its ack could
  apply (its lease lapsed, the message went to another worker);
- FIFO within each group: a group's messages start in publish order (a repeat is only ever the
  current head, handled again);
- exclusivity: no two handlers of one group overlap (from the shared log's start and end
  lines, in the order they were written, across processes);
- the older clients: refused cleanly once they can no longer run (the late one at its first
  call; the running ones at their next call if their version has the schema fence, which
  versions before it lack: those go on, as the notes of the schema change allow).

Two pairs of versions:

- `previous`: the code of the previous schema version, built from git at `PREVIOUS` (skipped
  when this is not a git checkout with that commit, e.g. an sdist), beside this checkout's;
- `next`: this checkout's code beside the same code with one more, additive, schema step (what
  the next release's migration will look like): this checkout's running clients must be
  refused by the fence."""

from __future__ import annotations

import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

import rqlite_queue
from rqlite_queue._protocol import schema
from rqlite_queue.testing import Cluster

PREVIOUS = "fcabb10bd754b01a05ef3694edd6b1625c62fa34"
"""The commit whose code is the previous schema version's (its SCHEMA_VERSION is this one's
less one; the test checks). Choose the last commit before the one that raised SCHEMA_VERSION:
`git log -S "SCHEMA_VERSION = N" --oneline -- src/rqlite_queue/_protocol/` names the
commit that raised it to N; take its parent, if its code runs. For v6 that is not so: the
parent of 6f35214 (which raised it) is cfc8ae6, and it and eaf7b3e are v5 commits whose sql.py
and core.py lag their params.py (a publish fails there), so PREVIOUS is eaf7b3e's parent,
7d8bf89: the last v5 code that runs. It predates the schema fence (eaf7b3e), so its running
clients are not refused. For v8 (batches) it is a579fd2, issue 32's last code change at v7;
for v9 (callbacks keep their outcomes) fcabb10, the last commit at v8."""

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).resolve().parent / "rolling_client.py"
THIS_SRC = Path(rqlite_queue.__file__).resolve().parents[1]
REFUSED = 3


# ---------------------------------------------------------------------- the two versions


@pytest.fixture(scope="session")
def previous_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`src/` of the PREVIOUS commit, extracted once a session."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (an sdist?): the previous version is built from git")
    found = subprocess.run(
        [git, "-C", str(ROOT), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], capture_output=True
    )
    if found.returncode != 0:
        pytest.skip(f"commit {PREVIOUS[:12]} is not in this checkout's history (a shallow clone?)")
    archive = subprocess.run(
        [git, "-C", str(ROOT), "archive", "--format=tar", PREVIOUS, "src"],
        capture_output=True,
        check=True,
    ).stdout
    target = tmp_path_factory.mktemp("previous")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):  # (Python 3.11.4 and later)
            tar.extractall(target, filter="data")
        else:
            tar.extractall(target)  # (our own repository's archive)
    return target / "src"


@pytest.fixture(scope="session")
def next_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's `src/` with one more schema step, additive (a column), as the next
    release's migration would be."""
    target = tmp_path_factory.mktemp("next") / "src"
    shutil.copytree(
        THIS_SRC / "rqlite_queue",
        target / "rqlite_queue",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    schema_py = target / "rqlite_queue" / "_protocol" / "schema.py"
    schema_py.write_text(
        schema_py.read_text()
        + "\n\nSCHEMA_VERSION += 1\n"
        + "MIGRATIONS[SCHEMA_VERSION] = "
        + '(Sql("ALTER TABLE {messages} ADD COLUMN rolling_test TEXT"),)\n'
    )
    return target


def _schema_module(src: Path) -> str:
    """The text of the module that holds SCHEMA_VERSION (schema.py; sql.py before it)."""
    protocol = src / "rqlite_queue" / "_protocol"
    schema_py = protocol / "schema.py"
    return (schema_py if schema_py.exists() else protocol / "sql.py").read_text()


def schema_version(src: Path) -> int:
    text = _schema_module(src)
    found = re.search(r"^SCHEMA_VERSION = (\d+)$", text, re.MULTILINE)
    assert found is not None
    return int(found.group(1)) + ("\nSCHEMA_VERSION += 1\n" in text)


def has_fence(src: Path) -> bool:
    text = _schema_module(src)
    return "SCHEMA_FENCE_ERROR" in text or "FENCE_ERROR = " in text


# ------------------------------------------------------------------------------ the run


@dataclass
class Load:
    """How much: one producer of each version, on `groups` groups of its own, `rate`
    messages a second; two workers of each version at `concurrency`; the producers run on for
    `after` seconds once the old client started late was refused."""

    groups: int
    rate: float
    after: float = 1.0
    concurrency: int = 4
    visibility: float = 2.0
    """Short: a refused worker's leases lapse, and go to another, within it."""


@dataclass
class Run:
    cluster: Cluster
    queue: str
    log: Path
    out: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, src: Path, role: str, who: str, *args: object) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(src)}
        with open(self.out / f"{who}.err", "wb") as err:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(CLIENT),
                    role,
                    self.cluster.url,
                    self.queue,
                    str(self.log),
                    who,
                    *map(str, args),
                ],
                env=env,
                stdout=err,
                stderr=subprocess.STDOUT,
            )
        self.procs[who] = proc
        return proc

    def lines(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [line.split(" ", 5) for line in self.log.read_text().splitlines()]

    def mark(self, text: str) -> None:
        with open(self.log, "a") as f:
            f.write(f"{text} test {os.getpid()} - -\n")

    def query(self, statement: str) -> int:
        """One number, read from the queue's tables beside the clients (whatever version)."""
        reply = httpx.post(
            f"{self.cluster.leader().http_url}/db/query?level=strong",
            json=[statement.format(q=f"rq_{self.queue}")],
            timeout=10,
        ).json()
        values = reply["results"][0].get("values") or [[0]]
        return int(values[0][0])

    def version(self) -> int:
        return self.query("SELECT value FROM {q}_meta WHERE key = 'schema_version'")

    def count(self, table: str) -> int:
        return self.query(f"SELECT count(*) FROM {{q}}_{table}")

    def wait(self, what: str, ready: Callable[[], bool], timeout: float) -> None:
        end = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > end:
                pytest.fail(f"timed out waiting for {what}\n{self.explain()}")
            time.sleep(0.05)

    def explain(self) -> str:
        parts = [f"{who}: exit {p.poll()}" for who, p in self.procs.items()]
        for path in sorted(self.out.glob("*.err")):
            text = path.read_text().strip()
            if text:
                parts.append(f"--- {path.name}\n{text[-2000:]}")
        parts.append("--- log tail\n" + "\n".join(" ".join(x) for x in self.lines()[-40:]))
        return "\n".join(parts)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def run(
    tmp_path: Path, rqlite_cluster_factory: Callable[..., Cluster]
) -> Iterator[Callable[..., Run]]:
    made: list[Run] = []

    def make(nodes: int) -> Run:
        out = tmp_path / f"run{len(made)}"
        out.mkdir()
        made.append(
            Run(rqlite_cluster_factory(nodes), "roll_" + uuid.uuid4().hex[:8], out / "log", out)
        )
        return made[-1]

    yield make
    for r in made:  # every process stopped, whatever happened
        r.stop()


def rolling_upgrade(r: Run, old: Path, new: Path, load: Load) -> None:
    old_version, new_version = schema_version(old), schema_version(new)
    fenced = has_fence(old)
    # The old version creates the queue and works it under load.
    probe = r.start(old, "probe", "old-setup")
    assert probe.wait(30) == 0, r.explain()
    assert r.version() == old_version
    for i in range(2):
        r.start(old, "work", f"old-w{i}", load.concurrency, load.visibility)
    r.start(old, "produce", "old-p", load.groups, load.rate)
    r.wait("the old workers to handle messages", lambda: ends(r, "old-w") >= 10, 30)

    # The new version's producer and workers start; the first of them migrates, under load.
    r.start(new, "produce", "new-p", load.groups, load.rate)
    for i in range(2):
        r.start(new, "work", f"new-w{i}", load.concurrency, load.visibility)
    r.wait("the migration", lambda: r.version() == new_version, 30)
    r.mark("migrated")

    # An old client started now is refused at its first call.
    late = r.start(old, "probe", "old-late")
    assert late.wait(30) == REFUSED, r.explain()

    # The producers go on a while (the old one refused at its next publish, if its version
    # has the fence), then stop; every message published is handled and the queue is empty.
    time.sleep(load.after)
    for who in ("old-p", "new-p"):
        r.procs[who].send_signal(signal.SIGTERM)
        r.procs[who].wait(30)
    if fenced:
        r.wait(
            "the old workers' refusal",
            lambda: all(r.procs[f"old-w{i}"].poll() is not None for i in range(2)),
            30,
        )
    r.wait("every message handled", lambda: handled(r) >= published(r), 60)
    r.wait("the queue to empty", lambda: r.count("messages") == 0, 30)
    r.stop()

    lines = r.lines()
    assert r.count("dead") == 0, r.explain()
    assert handled(r) == published(r), r.explain()
    codes = {who: p.returncode for who, p in r.procs.items()}
    assert codes["new-p"] == 0 and codes["new-w0"] == 0 and codes["new-w1"] == 0, r.explain()
    refused = {line[1] for line in lines if line[0] == "refused"}
    assert {"old-late"} <= refused and not {w for w in refused if w.startswith("new")}
    for line in lines:
        if line[0] == "refused":
            assert f"schema version {new_version}" in line[5], line
    after = lines[[line[0] for line in lines].index("migrated") :]
    if fenced:
        # The running old clients were refused at their next call: the producer's last
        # publish failed (nothing written), the workers stopped; none of them published
        # after its refusal. (A handler of an older Worker may still start then, from a
        # lease claimed ahead before it: rolling_client.py keeps it from doing anything.)
        assert codes["old-p"] == REFUSED and codes["old-w0"] == codes["old-w1"] == REFUSED
        assert {"old-p", "old-w0", "old-w1"} <= refused, r.explain()
        done: set[str] = set()
        for line in lines:
            if line[0] == "refused":
                done.add(line[1])
            elif line[0] == "pub" and line[1] in done:
                pytest.fail(f"{line} after its refusal\n{r.explain()}")
    else:
        # A version without the fence goes on working on the new schema until it restarts.
        assert codes["old-p"] == 0 and codes["old-w0"] == codes["old-w1"] == 0, r.explain()
        assert any(line[0] == "pub" and line[1] == "old-p" for line in after), r.explain()
    # Both versions' workers handled messages, and new ones after the migration.
    assert ends(r, "old-w") > 0 and ends(r, "new-w") > 0
    assert any(line[0] == "end" and line[1].startswith("new-w") for line in after)
    check_fifo_and_exclusivity(lines, repeats_allowed=fenced)


def published(r: Run) -> set[tuple[str, int]]:
    return {(line[3], int(line[4])) for line in r.lines() if line[0] == "pub"}


def handled(r: Run) -> set[tuple[str, int]]:
    return {(line[3], int(line[4])) for line in r.lines() if line[0] == "end"}


def ends(r: Run, who: str) -> int:
    return sum(1 for line in r.lines() if line[0] == "end" and line[1].startswith(who))


def check_fifo_and_exclusivity(lines: list[list[str]], *, repeats_allowed: bool) -> None:
    """In the log's order: a group's handlers never overlap (a handler is over at its end
    line, or when its process exits), and start in publish order: the next message, or the
    same one again (only after its holder was refused: `repeats_allowed`)."""
    holder: dict[str, tuple[str, int]] = {}
    last: dict[str, int] = defaultdict(lambda: -1)
    exited: set[str] = set()
    for line in lines:
        kind, _, pid, group = line[:4]
        if kind == "exit":
            exited.add(pid)
            for g in [g for g, (p, _) in holder.items() if p == pid]:
                del holder[g]
        elif kind == "start":
            k = int(line[4])
            assert group not in holder, f"two holders of {group}: {holder[group]} and {line}"
            holder[group] = (pid, k)
            assert k == last[group] + 1 or (repeats_allowed and k == last[group]), (
                f"{group}: {k} started after {last[group]} (FIFO)"
            )
            last[group] = k
        elif kind == "end":
            assert pid not in exited, f"{line}: after its process exited"
            assert holder.pop(group, None) == (pid, int(line[4])), f"{line}: not the holder"


# ------------------------------------------------------------------------------ the tests


def test_previous_version_beside_this_one(run: Callable[..., Run], previous_src: Path) -> None:
    this = schema.SCHEMA_VERSION
    assert schema_version(previous_src) == this - 1, (
        f"PREVIOUS ({PREVIOUS[:12]}) is at schema v{schema_version(previous_src)}, this code "
        f"at v{this}: pin PREVIOUS to the last commit of v{this - 1}"
    )
    rolling_upgrade(run(1), previous_src, THIS_SRC, Load(groups=6, rate=60))


def test_this_version_beside_the_next(run: Callable[..., Run], next_src: Path) -> None:
    assert has_fence(THIS_SRC)
    rolling_upgrade(run(1), THIS_SRC, next_src, Load(groups=6, rate=60))


@pytest.mark.slow
@pytest.mark.parametrize("pair", ["previous", "next"])
def test_rolling_upgrade_long(
    run: Callable[..., Run], request: pytest.FixtureRequest, pair: str
) -> None:
    if pair == "previous":
        old, new = request.getfixturevalue("previous_src"), THIS_SRC
    else:
        old, new = THIS_SRC, request.getfixturevalue("next_src")
    rolling_upgrade(run(3), old, new, Load(groups=20, rate=150, concurrency=8, after=20.0))


def test_the_log_check_finds_overlaps_reordering_and_repeats() -> None:
    def log(text: str) -> list[list[str]]:
        return [line.split(" ", 5) for line in text.strip().splitlines()]

    good = "start a 1 g 0\nend a 1 g 0\nstart b 2 g 1\nstart a 1 h 0\nend b 2 g 1\nend a 1 h 0"
    check_fifo_and_exclusivity(log(good), repeats_allowed=False)
    # A holder refused mid-handler, its process gone: the next holder takes the same message.
    redelivered = "start a 1 g 0\nexit a 1 - -\nstart b 2 g 0\nend b 2 g 0"
    check_fifo_and_exclusivity(log(redelivered), repeats_allowed=True)
    bad = {
        "two holders": "start a 1 g 0\nstart b 2 g 1",
        "out of order": "start a 1 g 1\nend a 1 g 1",
        "skipped": "start a 1 g 0\nend a 1 g 0\nstart a 1 g 2",
        "repeated": redelivered,
        "after exit": "start a 1 g 0\nexit a 1 - -\nend a 1 g 0",
    }
    for name, text in bad.items():
        with pytest.raises(AssertionError):
            check_fifo_and_exclusivity(log(text), repeats_allowed=False)
            pytest.fail(f"{name}: not found")
