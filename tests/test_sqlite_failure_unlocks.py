"""A failure inside the embedded SQLite backend never leaves the file locked for another process
(sqlite_backend.py: whatever goes wrong inside a batch, the transaction is rolled back before
the error leaves).

Each test opens a transport on a file, makes one call fail in one way (hostile input, a codec
that raises, a statement or a parameter that fails in the middle of a write batch, an
interrupt-like BaseException there, a decode failure after a claim committed, a busy file),
and then, with that transport still open, another process publishes and claims on the same
file with a 0.2 s busy timeout: it must succeed at once. The transport that failed must still
work too, and a batch that failed half-way must have written nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import select
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rqlite_queue import AsyncSqliteTransport, InvalidArgument, SqliteTransport, Unavailable
from rqlite_queue._protocol import publish as publishing
from rqlite_queue._protocol.plan import Batch, Statement
from rqlite_queue.codec import JsonCodec
from rqlite_queue.errors import BackendError
from rqlite_queue.types import Stats

QUEUE = "locks"
BUSY_TIMEOUT = 0.2
"""The other process's busy timeout: a file still locked makes it fail (Unavailable)."""

OTHER_PROCESS = textwrap.dedent(
    f"""
    import json, sys, time
    from rqlite_queue import SqliteTransport

    for line in sys.stdin:
        path, queue = json.loads(line)
        start = time.monotonic()
        try:
            with SqliteTransport(path, queue=queue, busy_timeout={BUSY_TIMEOUT}, deadline=2) as q:
                q.publish("other", "from the other process")
                leases = q.claim_many("other-process", 30, 100)
                assert any(lease.group_id == "other" for lease in leases), leases
                q.ack_many(leases)
            answer = {{"ok": True}}
        except Exception as exc:
            answer = {{"ok": False, "error": f"{{type(exc).__name__}}: {{exc}}"}}
        answer["seconds"] = time.monotonic() - start
        print(json.dumps(answer), flush=True)
    """
)


class OtherProcess:
    """A second Python process (`python -c`) that, for each file it is sent, opens its own
    transport on it, publishes, claims and acks. Started once for the module: it pays for
    importing the package once."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", OTHER_PROCESS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def publish_and_claim(self, path: Path, timeout: float = 20.0) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps([str(path), QUEUE]) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        assert ready, f"the other process did not answer within {timeout} s"
        answer: dict[str, Any] = json.loads(self.process.stdout.readline())
        return answer

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def other_process() -> Iterator[OtherProcess]:
    other = OtherProcess()
    try:
        yield other
    finally:
        other.close()


# ------------------------------------------------------------------- ways to fail


class Interrupt(BaseException):
    """Like KeyboardInterrupt: not an Exception, so only `except BaseException` sees it."""


class Exploding(Sequence[Any]):
    """Statement parameters that raise `error` when sqlite3 reads them (one `?`)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: Any) -> Any:
        raise self.error


class FailingCodec(JsonCodec):
    """JSON, except that it cannot encode "poison" and cannot decode what it encoded for
    "undecodable": both raise errors of the codec's own, not the library's."""

    def encode(self, payload: Any) -> str:
        if payload == "poison":
            raise RuntimeError("the codec cannot encode this")
        return super().encode(payload)

    def decode(self, text: str) -> Any:
        if text == '"undecodable"':
            raise RuntimeError("the codec cannot decode this")
        return super().decode(text)


def a_statement_after_the_insert(statement: Statement) -> Callable[..., Batch]:
    """`publish.publish`, with `statement` run right after the INSERT of the messages: the
    write transaction is open and holds the new rows when it fails."""
    publish = publishing.publish

    def patched(*args: Any, **kwargs: Any) -> Batch:
        batch = publish(*args, **kwargs)
        statements = list(batch.statements)
        statements.insert(batch.slots["inserted"] + 1, statement)
        return dataclasses.replace(batch, statements=tuple(statements))

    return patched


@dataclasses.dataclass(frozen=True)
class Failure:
    """How to make `call(q)` fail; `patch`: statement to slip into the next publish batch."""

    call: Callable[[Any], Awaitable[Any]]
    error: type[BaseException]
    patch: Statement | None = None
    writes: bool = False
    """The failed call did write (a claim whose reply could not be decoded)."""


FAILURES = {
    "hostile input": Failure(lambda q: q.publish(None, "e"), InvalidArgument),
    "a codec whose encode raises": Failure(lambda q: q.publish("g", "poison"), Exception),
    "a failing statement in the middle of a batch": Failure(
        lambda q: q.publish("g", "e"),
        BackendError,
        patch=Statement("SELECT no_such_function()"),
    ),
    "a parameter that raises inside sqlite3, mid-batch": Failure(
        lambda q: q.publish("g", "e"),
        BackendError,
        patch=Statement("SELECT ?", Exploding(RuntimeError("cannot read this parameter"))),
    ),
    "an interrupt (a BaseException) inside sqlite3, mid-batch": Failure(
        lambda q: q.publish("g", "e"),
        Interrupt,
        patch=Statement("SELECT ?", Exploding(Interrupt())),
    ),
    "a decode that raises after the claim committed": Failure(
        lambda q: q.claim("w", 30), Exception, writes=True
    ),
}


class Sync:
    """A sync transport with awaitable methods, so one test body drives both flavours."""

    def __init__(self, transport: SqliteTransport) -> None:
        self.transport = transport

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.transport, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return method(*args, **kwargs)

        return call


async def open_transport(flavour: str, path: Path, **options: Any) -> Any:
    if flavour == "async":
        transport = AsyncSqliteTransport(str(path), queue=QUEUE, codec=FailingCodec(), **options)
        await transport.setup()
        return transport
    sync = Sync(SqliteTransport(str(path), queue=QUEUE, codec=FailingCodec(), **options))
    await sync.setup()
    return sync


def counts(stats: Stats) -> Stats:
    """The stats without the age of the oldest message (the clock moves)."""
    return dataclasses.replace(stats, oldest_age=None)


async def assert_other_process_gets_through(other: OtherProcess, path: Path) -> None:
    # Not on the event loop's thread: the async transport runs its batches in threads.
    answer = await asyncio.to_thread(other.publish_and_claim, path)
    assert answer["ok"], f"the other process failed: {answer['error']}"
    assert answer["seconds"] < 1.5, answer


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
async def test_a_failed_call_leaves_the_file_unlocked(
    other_process: OtherProcess,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    flavour: str,
    failure: Failure,
) -> None:
    path = tmp_path / "q.db"
    q = await open_transport(flavour, path)
    try:
        await q.publish_many([("a", "before"), ("u", "undecodable")])
        if failure.writes:
            await q.claim("w", 30)  # takes "a", so that the failing claim takes "u"
        before = counts(await q.stats())
        with monkeypatch.context() as patched:
            if failure.patch is not None:
                patched.setattr(publishing, "publish", a_statement_after_the_insert(failure.patch))
            with pytest.raises(failure.error):
                await failure.call(q)
        if not failure.writes:
            assert counts(await q.stats()) == before  # a batch that failed half-way wrote nothing
        await assert_other_process_gets_through(other_process, path)
        # The transport that failed still works.
        await q.publish("after", "e")
        lease = await q.claim("w", 30)
        assert lease is not None and lease.group_id == "after"
        await q.ack(lease)
    finally:
        await q.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_call_that_found_the_file_busy_leaves_it_unlocked(
    other_process: OtherProcess, tmp_path: Path, flavour: str
) -> None:
    """Another connection holds the write lock: the call gives up (Unavailable) after its
    busy timeout; once the lock is released, nothing of the failed call remains in the way."""
    path = tmp_path / "q.db"
    q = await open_transport(flavour, path, busy_timeout=0.1)
    try:
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(Unavailable):
                await q.publish("g", "e")
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        await assert_other_process_gets_through(other_process, path)
        await q.publish("after", "e")
        assert [lease.group_id for lease in await q.claim_many("w", 30, 10)] == ["after"]
    finally:
        await q.close()
