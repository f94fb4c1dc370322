"""Makes `fixtures/v3.db`: a queue database written by the schema-v3 code, kept in the repo so
the upgrade path is always tested from a real older database. The same content as
`fixtures/v2.db` (`make_v2_fixture.make`, so the upgrade tests expect the same of all three),
written by v3 (whose acks and dead letters also leave their settlement records), before
tenants (v4).

It was run once, against the v3 code (the commit before schema v4):

    git worktree add /tmp/v3 <commit>
    PYTHONPATH=/tmp/v3/src python tests/migration/make_v3_fixture.py

and its output committed. `fixtures/v3.json` records what the upgrade tests expect to find."""

from __future__ import annotations

from make_v2_fixture import make

if __name__ == "__main__":
    raise SystemExit(make(3))
