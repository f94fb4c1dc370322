"""Makes `fixtures/v7.db`: a queue database written by the schema-v7 code, kept in the repo so
the upgrade path is always tested from a real older database. The same content as
`fixtures/v6.db` (`make_v2_fixture.make`), written by v7, plus what only v7 has: a queue `jobs`
whose messages keep their outcomes (one acked with a result, one leased, one queued, one
cancelled while leased), before batches (v8).

It was run once, against the v7 code (the commit before schema v8):

    git archive <commit> src | tar -x -C /tmp/v7
    PYTHONPATH=/tmp/v7/src python tests/migration/make_v7_fixture.py

and its output committed. `fixtures/v7.json` records what the upgrade tests expect to find."""

from __future__ import annotations

from make_v2_fixture import make

if __name__ == "__main__":
    raise SystemExit(make(7))
