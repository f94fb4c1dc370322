"""Makes `fixtures/v5.db`: a queue database written by the schema-v5 code, kept in the repo so
the upgrade path is always tested from a real older database. The same content as
`fixtures/v4.db` (`make_v2_fixture.make`), written by v5, plus what only v5 has: a queue
`limited` with a tenant's limits (a cap on leases in flight, a rate, bounds on queued
messages) and a debounced message pending, before message headers (v6).

It was run once, against the v5 code (the commit before schema v6):

    git worktree add /tmp/v5 <commit>
    PYTHONPATH=/tmp/v5/src python tests/migration/make_v5_fixture.py

and its output committed. `fixtures/v5.json` records what the upgrade tests expect to find."""

from __future__ import annotations

from make_v2_fixture import make

if __name__ == "__main__":
    raise SystemExit(make(5))
