"""The operator's tools on a sharded queue (issue 24): every `rqlite-queue` command and every
dashboard action, run on one queue over two real 1-node rqlite clusters (shards `a` and `b`)."""

from __future__ import annotations

import html
import io
import json
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_dashboard import dashboard

from rqlite_queue import Transport
from rqlite_queue.cli import main
from rqlite_queue.testing import Cluster

EXE = shutil.which("rqlite-queue", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def shard_b(rqlited_path: str) -> Iterator[Cluster]:
    with Cluster(1, binary=rqlited_path) as cluster:
        yield cluster


@pytest.fixture
def url(rqlite_cluster: Cluster, shard_b: Cluster) -> str:
    return f"a={rqlite_cluster.url};b={shard_b.url}"


@pytest.fixture
def queue_name() -> str:
    return f"tools_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def q(url: str, queue_name: str) -> Iterator[Transport]:
    with Transport.from_url(url, queue=queue_name) as transport:
        yield transport


def on_shard(q: Transport, shard: str, prefix: str = "g") -> str:
    return next(f"{prefix}{i}" for i in range(1000) if q.shard_of(f"{prefix}{i}") == shard)


class Cli:
    """`rqlite-queue --url URL --queue NAME ...`, run in this process (a subprocess each
    would cost a second of imports)."""

    def __init__(self, url: str, queue: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.base = ["--url", url, "--queue", queue]
        self.capsys = capsys

    def __call__(self, *args: str, status: int = 0, stdin: str = "") -> str:
        self.capsys.readouterr()
        saved = sys.stdin
        sys.stdin = io.StringIO(stdin)
        try:
            got = main([*self.base, *args])
        finally:
            sys.stdin = saved
        out, err = self.capsys.readouterr()
        assert got == status, (args, out, err)
        return out if status == 0 else err


@pytest.fixture
def rq(
    url: str, queue_name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    monkeypatch.setenv("COLUMNS", "200")
    return Cli(url, queue_name, capsys)


def test_every_cli_command_on_two_shards(rq: Cli, q: Transport, tmp_path: Path) -> None:
    ga, gb = on_shard(q, "a"), on_shard(q, "b")
    # publish: one message, and JSON lines from stdin
    assert rq("publish", ga, '{"n": 1}').strip().isdigit()
    lines = [{"group_id": gb, "event": {"n": 2}}, {"group_id": ga, "event": {"n": 3}}]
    rq("publish", stdin="\n".join(json.dumps(line) for line in lines))
    assert q.stats().by_shard == {"a": 2, "b": 1}
    # stats, peek, groups
    assert json.loads(rq("stats", "--json"))["depth"] == 3
    assert "messages (depth)" in rq("stats")
    assert '{"n":3}' in rq("peek", ga)
    listed = [json.loads(line) for line in rq("groups", "--json").splitlines()]
    assert {(g["group_id"], g["shard"]) for g in listed} == {(ga, "a"), (gb, "b")}
    table = rq("groups")
    assert re.search(rf"{ga}\s*│\s*a\s*│", table) and re.search(rf"{gb}\s*│\s*b\s*│", table)
    # publish's options route to the group's shard too; groups filters and pages
    gd, gt = on_shard(q, "b", "d"), on_shard(q, "a", "t")
    rq("publish", gd, "1", "--delay", "3600", "--ttl", "7200")
    rq("publish", gt, "1", "--tenant", "acme", "--debounce", "k", "--delay", "3600")
    rq("publish", gt, "2", "--tenant", "acme", "--debounce", "k", "--delay", "3600")
    assert q.stats().by_shard == {"a": 3, "b": 2}
    stats = json.loads(rq("stats", "--json"))
    assert stats["delayed_groups"] == 2 and set(stats["oldest_by_priority"]) == {"0"}
    assert re.search(r"delayed groups\s*│\s*2\b", rq("stats"))
    assert re.search(r"priority 0\s*│\s*5 \(oldest \d", rq("stats"))
    delayed = [
        json.loads(line) for line in rq("groups", "--state", "delayed", "--json").splitlines()
    ]
    assert {(g["group_id"], g["shard"], g["depth"]) for g in delayed} == {
        (gd, "b", 1),
        (gt, "a", 1),
    }
    first = rq("groups", "--limit", "1")
    after = re.search(r"--after '([^']+)'", first)
    assert after, first
    rest = [
        json.loads(line)["group_id"]
        for line in rq("groups", "--after", after.group(1), "--json").splitlines()
    ]
    assert len(rest) == 3 and after.group(1) not in rest
    rq("group", "cancel", gd, "--yes")
    rq("group", "cancel", gt, "--yes")
    rq("dlq", "purge", "--yes")
    # pause, resume
    rq("pause")
    assert q.stats().paused and q.claim("w", 30) is None
    rq("resume")
    assert not q.stats().paused
    # group hold, release, priority, cancel
    rq("group", "hold", gb)
    assert [g.state for g in q.groups() if g.group_id == gb] == ["held"]
    assert "released" in rq("group", "release", gb)
    rq("group", "priority", ga, "3")
    assert [g.priority for g in q.groups() if g.group_id == ga] == [3]
    assert "2 messages dead-lettered" in rq("group", "cancel", ga, "--yes")
    lease = q.claim("w", 30)
    assert lease is not None and lease.group_id == gb
    q.dead_letter(lease, "poison")
    # dlq list: every row names its shard
    letters = [json.loads(line) for line in rq("dlq", "list", "--json").splitlines()]
    assert sorted(d["shard"] for d in letters) == ["a", "a", "b"]
    only = [json.loads(line) for line in rq("dlq", "list", "--group", gb, "--json").splitlines()]
    assert [(d["group_id"], d["shard"]) for d in only] == [(gb, "b")]
    table = rq("dlq", "list")
    assert re.search(r"shard", table) and re.search(r"\ba\b.*" + ga, table)
    assert [d["cursor"] for d in letters] == [f"{d['shard']}/{d['seq']}" for d in letters]
    # dlq list --after: pages of one, each title naming the next page's cursor
    cursors: list[str] = []
    more: list[str] = []
    while "no dead letters after that" not in (page := rq("dlq", "list", "--limit", "1", *more)):
        found = re.search(r"more after: --after (\S+)\)", page)
        assert found and len(cursors) < 3, page
        cursors.append(found.group(1))
        more = ["--after", found.group(1)]
    assert cursors == [d["cursor"] for d in letters]
    # dlq requeue, purge: seqs are per shard, --shard says which
    on_a = [d["seq"] for d in letters if d["shard"] == "a"]
    on_b = [d["seq"] for d in letters if d["shard"] == "b"]
    assert "--shard" in rq("dlq", "requeue", str(on_a[0]), status=2)
    assert "requeued 1" in rq("dlq", "requeue", str(on_a[0]), "--shard", "a")
    assert "purged 1" in rq("dlq", "purge", str(on_b[0]), "--shard", "b", "--yes")
    assert "no shard named 'c'" in rq("dlq", "purge", "1", "--shard", "c", "--yes", status=1)
    assert [(d.shard, d.seq) for d in q.dead_letters()] == [("a", on_a[1])]
    assert "purged 1" in rq("dlq", "purge", "--yes")
    # tenants
    rq("tenant", "weight", "acme", "2")
    rq("tenant", "limits", "acme", "--max-in-flight", "3")
    rq("tenant", "rule", ":")
    tenants = [json.loads(line) for line in rq("tenants", "--json").splitlines()]
    assert {t["name"]: t["weight"] for t in tenants}["acme"] == 2
    assert "acme" in rq("tenants")
    rq("tenant", "rule", "--none")
    # schedules, scheduler
    rq("schedule", "add", "tick", gb, '"t"', "--every", "3600")
    assert "tick" in rq("schedule", "list")
    assert [s["name"] for s in map(json.loads, rq("schedule", "list", "--json").splitlines())] == [
        "tick"
    ]
    rq("scheduler", "--burst")
    assert "removed" in rq("schedule", "remove", "tick") or q.schedules() == []
    assert q.schedules() == []
    # shards status
    status = [json.loads(line) for line in rq("shards", "status", "--json").splitlines()]
    assert [s["name"] for s in status if "name" in s] == ["a", "b"]
    assert "no change under way" in rq("shards", "status")
    # shards drain: b marked draining in a list of a higher epoch
    a_url, b_url = (part.split("=", 1)[1] for part in rq.base[1].split(";"))
    rq.base[1] = f"epoch=1;a={a_url};-b={b_url}"
    assert "shard b is empty: remove it from the list" in rq(
        "shards", "drain", "b", "--timeout", "5"
    )
    assert "draining" in rq("shards", "status")


def test_the_worker_command_on_two_shards(
    url: str, queue_name: str, q: Transport, tmp_path: Path
) -> None:
    groups = [on_shard(q, "a"), on_shard(q, "b")]
    for group in groups:
        q.publish_many([(group, 1), (group, 2)])
    (tmp_path / "handlers.py").write_text(
        "import json, os\n"
        "def handle(lease):\n"
        "    with open(os.environ['OUT'], 'a') as out:\n"
        "        out.write(json.dumps([lease.group_id, lease.event]) + '\\n')\n"
    )
    out = tmp_path / "handled.jsonl"
    result = subprocess.run(
        [EXE or "", "--url", url, "--queue", queue_name, "worker", "handlers:handle", "--burst"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"OUT": str(out), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    handled = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(handled) == sorted([g, n] for g in groups for n in (1, 2))
    assert q.stats().depth == 0


# ------------------------------------------------------------------------------ the dashboard


def forms(page: str) -> list[tuple[str, dict[str, str]]]:
    """Every action form of a page: (its action's name, its hidden fields), as a browser
    would post them."""
    found = []
    for form in re.findall(r"<form[^>]*method=\"post\".*?</form>", page, re.DOTALL):
        name = re.search(r'action="[^"]*/action/(\w+)"', form)
        assert name, form
        fields = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', form))
        found.append((name.group(1), {k: html.unescape(v) for k, v in fields.items()}))
    return found


def row_forms(page: str, shard: str, seq: int) -> dict[str, dict[str, str]]:
    """The action forms of the dead-letter row of (shard, seq)."""
    row = re.search(rf'<tr data-seq="{seq}" data-shard="{shard}">.*?</tr>', page, re.DOTALL)
    assert row, f"no row for {shard}/{seq} in {page}"
    return dict(forms(row.group(0)))


def test_every_dashboard_page_and_action_on_two_shards(
    url: str, queue_name: str, q: Transport
) -> None:
    ga, gb = on_shard(q, "a"), on_shard(q, "b")
    q.publish_many([(ga, 1), (ga, 2), (gb, 3)])
    q.schedule("tick", gb, "t", every=3600)
    q.publish(on_shard(q, "a", "acme:"), "x", tenant="acme")
    with (
        dashboard(url, queue_name, "--allow-actions") as base,
        httpx.Client(base_url=base, headers={"Origin": base}) as http,
    ):

        def post(action: str, fields: dict[str, str]) -> None:
            done = http.post(f"/action/{action}", data=fields)
            if done.status_code == 200:  # a destructive action's confirmation step
                assert 'name="confirmed" value="yes"' in done.text, done.text
                done = http.post(f"/action/{action}", data={**fields, "confirmed": "yes"})
            assert done.status_code == 303, (action, done.text)

        for path in ("/", "/groups", f"/group?id={ga}", "/dead", "/tenants", "/schedules"):
            page = http.get(path)
            assert page.status_code == 200, (path, page.text)
        for path in ("/fragments/overview", "/fragments/groups", "/fragments/dead"):
            assert http.get(path).status_code == 200, path
        # which shard each group lives on, in the groups table and on the group's page
        listing = http.get("/fragments/groups").text
        assert '<th scope="col">shard</th>' in listing
        assert re.search(rf"{ga}</a></td>\s*<td>a</td>", listing), listing
        assert '<td data-field="shard">a</td>' in http.get(f"/group?id={ga}").text
        token = re.search(r'name="csrf" value="([^"]+)"', http.get("/").text)
        assert token
        csrf = {"csrf": token.group(1), "next": "/"}
        # the groups' actions
        post("hold", {**csrf, "group_id": gb})
        assert [g.state for g in q.groups() if g.group_id == gb] == ["held"]
        post("release", {**csrf, "group_id": gb})
        post("priority", {**csrf, "group_id": ga, "priority": "2"})
        assert [g.priority for g in q.groups() if g.group_id == ga] == [2]
        post("pause", csrf)
        assert q.stats().paused
        post("resume", csrf)
        assert not q.stats().paused
        post("set_tenant_weight", {**csrf, "tenant": "acme", "weight": "3"})
        assert {t.name: t.weight for t in q.tenants()}["acme"] == 3
        post("cancel", {**csrf, "group_id": ga})
        post("cancel", {**csrf, "group_id": gb})
        letters = q.dead_letters()
        assert sorted(d.shard for d in letters) == ["a", "a", "b"]
        # each dead letter's buttons send its shard
        a1, a2 = [d for d in letters if d.shard == "a"]
        (b1,) = [d for d in letters if d.shard == "b"]
        page = http.get("/dead").text
        assert '<th scope="col">shard</th>' in page
        # the next-page links walk every dead letter once
        rows: list[tuple[str, str]] = []
        path = "/dead?limit=1"
        while True:
            got = http.get(path)
            assert got.status_code == 200 and len(rows) <= 3, got.text
            rows += re.findall(r'<tr data-seq="(\d+)" data-shard="(\w+)">', got.text)
            link = re.search(r'<a id="next-page" href="([^"]+)"', got.text)
            if link is None:
                assert "No dead letters after this point" in got.text
                break
            path = html.unescape(link.group(1))
        assert rows == [(str(d.seq), d.shard) for d in letters]
        assert http.get("/dead", params={"after": "7"}).status_code == 400  # no shard
        post("requeue", row_forms(page, "a", a1.seq)["requeue"])
        purge_b1 = row_forms(page, "b", b1.seq)["purge"]
        asked = http.post("/action/purge", data=purge_b1)  # the confirmation names the shard
        assert asked.status_code == 200 and f"dead letter {b1.seq} of shard b" in asked.text
        post("purge", purge_b1)
        assert [(d.shard, d.seq) for d in q.dead_letters()] == [("a", a2.seq)]
        assert [event for _, event in q.peek(ga)] == [1]
        post("requeue_all", csrf)
        assert q.dead_letters() == [] and q.stats().depth == 3
        post("cancel", {**csrf, "group_id": ga})
        post("purge_all", csrf)
        assert q.dead_letters() == []
