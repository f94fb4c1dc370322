"""Backup and restore without I/O: rqlite's `/db/backup` and `/db/load` and the retries of one
transfer, the checks of a backup file, and the look at a restore's target.

What rqlite v8 does (its http/service.go and store/store.go): `GET /db/backup` is answered
by the leader (a follower fetches it from the leader for the caller) with the database
file: the leader first checkpoints its WAL into the file (a Raft snapshot) so the copy holds
every committed write, then streams it while writes go on into the WAL. `?vacuum` sends a
VACUUMed copy (smaller, built in a scratch file on the leader). `POST /db/load` with a SQLite
file (`Content-Type: application/octet-stream`) is one Raft entry that carries the whole file:
every node swaps its database for it. So a load replaces *the whole database*: every queue in
it and any other table. A body that does not start with SQLite's header is not refused: it is
run as SQL statements; so a file is checked here before it is sent.

Both are safe to send again, which makes their retries simple: a backup only reads, and a
load of the same bytes leaves the same database however many times it applies (provided no
client writes in between, which is why the workers are stopped for a restore)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import AuthError, BackendError, InvalidArgument, SchemaError, Unavailable
from .http import (
    HttpReply,
    Nodes,
    NoReply,
    NotSent,
    Outcome,
    Send,
    Sleep,
    gave_up,
    nothing_listens,
)
from .plan import Batch, Statement
from .retry import FAILOVER, MIN_ATTEMPT, Retry
from .schema import SCHEMA_VERSION

SQLITE_HEADER = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
LOAD_PATH = "/db/load"
COMPOUND = 200
"""Tables looked at by one statement (SQLite allows 500 terms in a compound SELECT)."""
_META = re.compile(r"rq_([a-z0-9_]{1,40})_meta")
_TENANTS = re.compile(r"rq_[a-z0-9_]{1,40}_tenants")


def backup_path(vacuum: bool = False) -> str:
    """The request of a backup: the leader's copy (the default; never `?noleader`, which would
    read a follower's copy, maybe behind), as a SQLite file (not `?fmt=sql`), uncompressed
    (so the file opens with any SQLite, and is checked on restore like any other)."""
    return "/db/backup?vacuum" if vacuum else "/db/backup"


def shard_file(path: str, shard: str) -> str:
    """The file of one shard in the backup `path` of a sharded queue: the shard's name before
    the file's suffix (`queue.db` -> `queue.a.db`; `queue` -> `queue.a`)."""
    file = Path(path)
    return str(file.with_name(f"{file.stem}.{shard}{file.suffix}"))


def check_header(head: bytes, where: str) -> None:
    """`InvalidArgument` unless `head` (a file's first bytes) is a SQLite database's."""
    if head.startswith(SQLITE_HEADER):
        return
    if head.startswith(GZIP_MAGIC):
        raise InvalidArgument(f"{where}: compressed (gzip): decompress it first (gunzip)")
    raise InvalidArgument(f"{where}: not a SQLite database file")


def queue_of_meta(table: str) -> str | None:
    """The queue whose `meta` table this is, or None."""
    match = _META.fullmatch(table)
    return match.group(1) if match else None


def check_versions(versions: Mapping[str, int | None], where: str) -> None:
    """`SchemaError` if a queue in the file is at a schema newer than this library's (an
    older one is upgraded by the first client after the restore, as any older queue is)."""
    newer = {q: v for q, v in versions.items() if v is not None and v > SCHEMA_VERSION}
    if newer:
        listed = ", ".join(f"{q!r} at v{v}" for q, v in sorted(newer.items()))
        raise SchemaError(
            f"{where}: written by a newer rqlite-queue (queue {listed}; this library knows "
            f"schema v{SCHEMA_VERSION}): restore it with that version or newer"
        )
    if not versions:
        raise InvalidArgument(f"{where}: holds no rqlite-queue queue (no rq_<queue>_meta table)")


# --------------------------------------------------------------- what a target holds


def tables() -> Batch:
    """The tables of a database (not SQLite's own)."""
    return Batch(
        (
            Statement(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
            ),
        ),
        write=False,
    )


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _compound(names: Sequence[str], term: Callable[[int, str], str], write: bool = False) -> Batch:
    statements = []
    for start in range(0, len(names), COMPOUND):
        part = names[start : start + COMPOUND]
        sql = " UNION ALL ".join(term(start + i, name) for i, name in enumerate(part))
        statements.append(Statement(sql))
    return Batch(tuple(statements), write=write)


def with_rows(names: Sequence[str]) -> Batch:
    """(index in `names`, 1 if the table has a row) for each table; for a queue's `tenants`,
    a row other than the default tenant's (which its first client writes)."""

    def term(i: int, name: str) -> str:
        other = " WHERE name <> ''" if _TENANTS.fullmatch(name) else ""
        return f"SELECT {i}, EXISTS (SELECT 1 FROM {_quoted(name)}{other} LIMIT 1)"

    return _compound(names, term)


def versions(meta_tables: Sequence[str]) -> Batch:
    """(index in `meta_tables`, schema version) for each queue's `meta` table."""
    return _compound(
        meta_tables,
        lambda i, name: (
            f"SELECT {i}, (SELECT value FROM {_quoted(name)} WHERE \"key\" = 'schema_version')"
        ),
    )


def holding(names: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    """The tables that hold something a restore would lose: every table with a row, but the
    queues' `meta` tables and default tenants (the first client of a queue writes them, and
    nothing else: a target that only met clients is empty)."""
    return [
        names[int(str(index))]
        for index, has in rows
        if has and queue_of_meta(names[int(str(index))]) is None
    ]


# ------------------------------------------------------------------ one transfer's retries


@dataclass(frozen=True, slots=True)
class Transfer:
    """A backup (`GET`, no body) or a load (`POST` of a file)."""

    method: str
    path: str
    body: bytes | None = None

    @property
    def what(self) -> str:
        return "backup" if self.method == "GET" else "load"


def transfer(
    request: Transfer,
    *,
    nodes: Nodes,
    deadline: float,
    monotonic: Callable[[], float],
    jitter: Callable[[], float],
    names: Sequence[str] = (),
    refused_patience: float | None = None,
) -> Generator[Send | Sleep, Outcome | None, bytes]:
    """Send `request` until a node answers it with 200, or `deadline` passes; returns the
    reply's body. Every failure but a refusal (credentials, a bad request) moves on to the
    next node and tries again after a backoff: both transfers are safe to send again. An
    attempt may take all the time left (a large file's transfer is not cut short only to be
    started again). Given up, the error says what each node did (as `http.exchange`'s,
    `refused_patience` too)."""
    retry = Retry(FAILOVER, deadline, jitter)
    last: Unavailable | None = None
    tried: dict[int, str] = {}
    started = monotonic()
    while True:
        left = deadline - monotonic()
        if left < MIN_ATTEMPT:
            if last is None:
                raise Unavailable(f"rqlite {request.what}: the deadline passed")
            raise gave_up(last, nodes.report(names, tried))
        node = nodes.current
        outcome = yield Send(node, left)
        if isinstance(outcome, HttpReply):
            nodes.answered(node)
            text = outcome.content[:300].decode("utf-8", "replace").strip()
            if outcome.status == 200:
                return outcome.content
            if outcome.status in (401, 403):
                raise AuthError(
                    f"rqlite refused the {request.what} (HTTP {outcome.status}): the user needs "
                    f"the '{request.what}' permission"
                )
            if 400 <= outcome.status < 500:
                raise BackendError(
                    f"rqlite refused the {request.what}: HTTP {outcome.status}: {text}"
                )
            last = Unavailable(f"rqlite {request.what}: HTTP {outcome.status}: {text}")
            tried[node] = nodes.seen[node] = f"HTTP {outcome.status}: {text[:80]}"
            nodes.moved_on(node, monotonic())
        elif isinstance(outcome, NotSent | NoReply):
            last = Unavailable(f"rqlite {request.what}: node {node + 1}: {outcome.error}")
            tried[node] = nodes.seen[node] = outcome.cause
            nodes.reached = nodes.reached or isinstance(outcome, NoReply)
            nodes.failed(node, monotonic())
            if nodes.nothing_listens(tried, refused_patience, monotonic() - started):
                raise nothing_listens(nodes.report(names, tried))
        else:
            raise TypeError(f"transfer was sent {outcome!r}")
        wait = retry.wait(monotonic())
        if wait is None:
            raise gave_up(last, nodes.report(names, tried))
        yield Sleep(wait)


def check_load_reply(content: bytes) -> None:
    """A load answered 200 may still carry an error (rqlite's JSON `error`)."""
    try:
        reply = json.loads(content or b"{}")
    except ValueError:
        return
    if isinstance(reply, dict) and reply.get("error"):
        raise BackendError(f"rqlite load: {reply['error']}")
