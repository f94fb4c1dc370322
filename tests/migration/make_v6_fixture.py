"""Makes `fixtures/v6.db`: a queue database written by the schema-v6 code, kept in the repo so
the upgrade path is always tested from a real older database. The same content as
`fixtures/v5.db` (`make_v2_fixture.make`), written by v6, plus what only v6 has: a queue
`headed` with message headers on a queued message, a leased one and a dead letter, before
jobs' outcomes (v7).

It was run once, against the v6 code (the commit before schema v7):

    git worktree add /tmp/v6 <commit>
    PYTHONPATH=/tmp/v6/src python tests/migration/make_v6_fixture.py

and its output committed. `fixtures/v6.json` records what the upgrade tests expect to find."""

from __future__ import annotations

from make_v2_fixture import make

if __name__ == "__main__":
    raise SystemExit(make(6))
