"""Makes `fixtures/v4.db`: a queue database written by the schema-v4 code, kept in the repo so
the upgrade path is always tested from a real older database. The same content as
`fixtures/v3.db` (`make_v2_fixture.make`), written by v4, plus what only v4 has: a queue
`tenanted` whose tenants are on (a weight, a tenant's lease in flight), before limits and
debounce (v5).

It was run once, against the v4 code (the commit before schema v5):

    git worktree add /tmp/v4 <commit>
    PYTHONPATH=/tmp/v4/src python tests/migration/make_v4_fixture.py

and its output committed. `fixtures/v4.json` records what the upgrade tests expect to find."""

from __future__ import annotations

from make_v2_fixture import make

if __name__ == "__main__":
    raise SystemExit(make(4))
