"""The framework integrations side by side, in one run (issue 35, item 5):

- Celery 5 on this broker (`rqlite_queue.kombu`: the embedded file, a local 3-node cluster)
  against Celery on a local Redis (no persistence, Debian's redis-server): tasks/s of one
  `celery worker` (prefork, concurrency 8, acks late) draining a backlog of no-op tasks,
  without and with per-key ordering (`MessageGroupId` over `--keys` keys; Redis has no such
  ordering: its keyed row is the same work, unordered);
- the Django worker (`manage.py rqlite_queue_worker`, embedded file) against django-tasks-db's
  `db_worker` on SQLite: tasks/s draining a backlog of no-op tasks (`--batch` /
  `--until-empty`), and enqueues/s.

    .venv/bin/python bench/frameworks_bench.py [--tasks 2000] [--reps 2] [--keys 64]
        [--only celery|django] [--out PATH]

Needs the bench extra (redis, django-tasks-db) and the dev extra (celery, django 5.2 with the
django-tasks backport). Medians [min-max] of `--reps` runs; each drain is timed from the
first task taken off the backlog to the last one settled (a poller reads the backlog every
10 ms), not counting the worker's start. Writes bench/results/frameworks.md (or --out)."""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers.redis_server import LocalRedis

from rqlite_queue import from_url
from rqlite_queue.rqlited import find_rqlited
from rqlite_queue.testing import Cluster

RESULTS = Path(__file__).resolve().parent / "results" / "frameworks.md"

CELERY_APP = """
import os
from celery import Celery
import rqlite_queue.kombu  # noqa: F401

app = Celery("bench_app")
app.conf.update(
    broker_url=os.environ["BENCH_BROKER"],
    broker_transport_options={"polling_interval": 0.01},
    task_acks_late=True,
    task_ignore_result=True,
    worker_hijack_root_logger=False,
)


@app.task
def noop():
    return None
"""

DJANGO_SETTINGS = """
import os
SECRET_KEY = "bench"
USE_TZ = True
INSTALLED_APPS = ["django_tasks", "django_tasks_db", "rqlite_queue.django", "benchapp"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                         "NAME": os.environ["BENCH_DIR"] + "/django.db"}}
TASKS = {
    "rq": {"BACKEND": "rqlite_queue.django.RqliteQueueBackend",
           "OPTIONS": {"url": "sqlite:///" + os.environ["BENCH_DIR"] + "/tasks.db"}},
    "rqn": {"BACKEND": "rqlite_queue.django.RqliteQueueBackend",
            "OPTIONS": {"url": "sqlite:///" + os.environ["BENCH_DIR"] + "/tasks-n.db",
                        "keep": None}},
    "db": {"BACKEND": "django_tasks_db.DatabaseBackend"},
}
"""

DJANGO_TASKS = """
from django_tasks import task


@task(backend="rq")
def noop_rq():
    return None


@task(backend="rqn")
def noop_rqn():
    return None


@task(backend="db")
def noop_db():
    return None
"""

MANAGE = """import os, sys
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings")
from django.core.management import execute_from_command_line
execute_from_command_line(sys.argv)
"""


def median(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}-{max(values):,.0f}]"


def timed_drain(backlog: Callable[[], int], total: int, timeout: float = 600) -> float:
    """Seconds from the first task taken off the backlog to an empty backlog."""
    deadline = time.monotonic() + timeout
    while backlog() >= total:
        if time.monotonic() > deadline:
            raise RuntimeError("the worker took nothing")
        time.sleep(0.002)
    started = time.monotonic()
    while backlog() > 0:
        if time.monotonic() > deadline:
            raise RuntimeError("the worker did not drain the backlog")
        time.sleep(0.01)
    return time.monotonic() - started


@contextmanager
def process(argv: list[str], cwd: Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    log = (cwd / "worker.log").open("ab")
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# ------------------------------------------------------------------------------- Celery


def celery_run(
    broker: str, backlog: Callable[[], int], tasks: int, keys: int, where: Path
) -> float:
    """tasks/s of one worker (prefork, concurrency 8) draining `tasks` no-op tasks."""
    env = {**os.environ, "BENCH_BROKER": broker, "PYTHONPATH": str(where)}
    publisher = f"""
import bench_app
for i in range({tasks}):
    if {keys}:
        bench_app.noop.apply_async(MessageGroupId=f"key-{{i % {keys}}}")
    else:
        bench_app.noop.apply_async()
"""
    subprocess.run([sys.executable, "-c", publisher], cwd=where, env=env, check=True)
    if backlog() != tasks:
        raise RuntimeError(f"published {backlog()} of {tasks}")
    argv = [
        sys.executable, "-m", "celery", "-A", "bench_app", "worker", "--pool", "prefork",
        "-c", "8", "--without-mingle", "--without-gossip", "--without-heartbeat", "-l", "WARNING",
    ]  # fmt: skip
    with process(argv, where, env):
        seconds = timed_drain(backlog, tasks)
    return tasks / seconds


def celery_section(tasks: int, reps: int, keys: int) -> list[str]:
    rows: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-celery-") as tmp:
        where = Path(tmp)
        (where / "bench_app.py").write_text(CELERY_APP)
        with LocalRedis() as redis_server, Cluster(3, binary=find_rqlited().path) as cluster:
            import redis

            client = redis.Redis.from_url(redis_server.url)

            def redis_backlog() -> int:
                return int(client.llen("celery")) + int(client.hlen("unacked"))

            cluster_broker = ";".join(f"rqlite://{n.http_addr}" for n in cluster.nodes)
            for rep in range(reps):
                for ordering in ("unordered", "per key"):
                    n_keys = keys if ordering == "per key" else 0
                    client.flushall()
                    redis_name = "Redis " + redis_server.version.split("v=")[-1].split()[0]
                    rows.setdefault((redis_name, ordering), []).append(
                        celery_run(redis_server.url, redis_backlog, tasks, n_keys, where)
                    )
                    for name, url, broker in (
                        ("rqlite-queue, embedded file", f"sqlite:///{tmp}/b{rep}{n_keys}.db",
                         f"rqlite+sqlite:///{tmp}/b{rep}{n_keys}.db"),
                        ("rqlite-queue, 3-node cluster", cluster.url, cluster_broker),
                    ):  # fmt: skip
                        queue = from_url(url, queue="celery")
                        try:
                            if queue.stats().depth:
                                raise RuntimeError(f"{name}: the last run left messages")

                            def backlog(q=queue) -> int:  # type: ignore[no-untyped-def]
                                return int(q.stats().depth)

                            rows.setdefault((name, ordering), []).append(
                                celery_run(broker, backlog, tasks, n_keys, where)
                            )
                        finally:
                            queue.close()
    redis_key = next(k for k in rows if k[0].startswith("Redis") and k[1] == "unordered")
    redis_unordered = statistics.median(rows[redis_key])
    lines = [
        f"## Celery {version('celery')} (kombu {version('kombu')}): one worker, prefork, "
        f"concurrency 8, acks late, no-op task, {tasks} tasks, {reps} runs",
        "",
        "| broker | ordering | tasks/s | vs Redis, unordered |",
        "| --- | --- | ---: | ---: |",
    ]
    for (name, ordering), values in rows.items():
        note = (
            ordering
            if not name.startswith("Redis") or ordering == "unordered"
            else ("keys ignored (no per-key order)")
        )
        ratio = statistics.median(values) / redis_unordered
        lines.append(f"| {name} | {note} | {median(values)} | {ratio:.2f}x |")
    lines.append("")
    lines.append(
        f"Per key: `MessageGroupId` over {keys} keys (one task of a key in flight at a time, in "
        "publish order); Redis has no per-key order, the same publishes run unordered."
    )
    return lines


# ------------------------------------------------------------------------------- Django


def django_section(tasks: int, reps: int) -> list[str]:
    rows: dict[str, list[float]] = {}
    enqueues: dict[str, list[float]] = {}
    for _ in range(reps):
        with tempfile.TemporaryDirectory(prefix="bench-django-") as tmp:
            where = Path(tmp)
            (where / "settings.py").write_text(DJANGO_SETTINGS)
            (where / "benchapp").mkdir()
            (where / "benchapp" / "__init__.py").write_text("")
            (where / "benchapp" / "tasks.py").write_text(DJANGO_TASKS)
            (where / "manage.py").write_text(MANAGE)
            env = {**os.environ, "BENCH_DIR": tmp, "PYTHONPATH": tmp}
            env.pop("DJANGO_SETTINGS_MODULE", None)
            subprocess.run(
                [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=where, env=env, check=True
            )
            env_s = {**env, "DJANGO_SETTINGS_MODULE": "settings"}

            def enqueue(backend: str, where: Path = where, env_s: dict[str, str] = env_s) -> float:
                script = f"""
import time, django
django.setup()
from benchapp.tasks import noop_{backend}
t = time.perf_counter()
for _ in range({tasks}):
    noop_{backend}.enqueue()
print({tasks} / (time.perf_counter() - t))
"""
                out = subprocess.run(
                    [sys.executable, "-c", script], cwd=where, env=env_s, capture_output=True,
                    text=True, check=True,
                ).stdout  # fmt: skip
                return float(out.strip())

            for backend in ("rq", "rqn", "db"):
                enqueues.setdefault(backend, []).append(enqueue(backend))
            commands = {
                "rqlite_queue_worker, concurrency 1": ["rqlite_queue_worker", "--backend", "rq",
                                                       "--until-empty", "--concurrency", "1"],
                "rqlite_queue_worker, concurrency 1, no results (keep None)": [
                    "rqlite_queue_worker", "--backend", "rqn", "--until-empty",
                    "--concurrency", "1"],
                "db_worker (django-tasks-db)": ["db_worker", "--backend", "db", "--batch",
                                                "--interval", "0", "--no-startup-delay",
                                                "--no-reload", "-v", "0"],
            }  # fmt: skip
            for name, command in commands.items():
                t = time.perf_counter()
                subprocess.run(
                    [sys.executable, "manage.py", *command], cwd=where, env=env, check=True,
                    capture_output=True,
                )  # fmt: skip
                rows.setdefault(name, []).append(tasks / (time.perf_counter() - t))
            # Concurrency 8 on a fresh backlog of the same size.
            enqueue("rq")
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "manage.py", "rqlite_queue_worker", "--backend", "rq",
                 "--until-empty", "--concurrency", "8"],
                cwd=where, env=env, check=True, capture_output=True,
            )  # fmt: skip
            rows.setdefault("rqlite_queue_worker, concurrency 8", []).append(
                tasks / (time.perf_counter() - t)
            )
    db = statistics.median(rows["db_worker (django-tasks-db)"])
    lines = [
        f"## Django {version('django')} (django-tasks {version('django-tasks')}, "
        f"django-tasks-db {version('django-tasks-db')}): no-op task, {tasks} tasks, {reps} runs, "
        "both on SQLite files",
        "",
        "| worker | tasks/s (process start to exit) | vs db_worker |",
        "| --- | ---: | ---: |",
    ]
    for name, values in rows.items():
        lines.append(f"| {name} | {median(values)} | {statistics.median(values) / db:.2f}x |")
    lines += [
        "",
        "| enqueue | enqueues/s |",
        "| --- | ---: |",
        f"| RqliteQueueBackend (embedded file) | {median(enqueues['rq'])} |",
        f"| RqliteQueueBackend, no results (keep None) | {median(enqueues['rqn'])} |",
        f"| django-tasks-db DatabaseBackend (SQLite) | {median(enqueues['db'])} |",
        "",
        "The workers' times include their start (Django's setup, about a few hundred ms, the "
        "same for both); db_worker runs one task at a time and claims without a lease.",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--keys", type=int, default=64)
    parser.add_argument("--only", choices=["celery", "django"], default=None)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the tables go")
    args = parser.parse_args()
    command = "bench/frameworks_bench.py " + " ".join(sys.argv[1:])
    lines = [
        "# The framework integrations, side by side",
        "",
        f"`.venv/bin/python {command.strip()}` on this machine "
        f"({os.cpu_count()} cores), {time.strftime('%Y-%m-%d %H:%M')}, Python "
        f"{platform.python_version()}.",
        "",
    ]
    if args.only in (None, "celery"):
        lines += [*celery_section(args.tasks, args.reps, args.keys), ""]
    if args.only in (None, "django"):
        lines += [*django_section(args.tasks // 2, args.reps), ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
