"""Makes `fixtures/v8.db`: a queue database written by the schema-v8 code, kept in the repo so
the upgrade path is always tested from a real older database. The same content as
`fixtures/v7.db` (`make_v2_fixture.make`), written by v8, plus what only v8 has: batches, in
the queue `batched` (one cluster: a batch with both callbacks and a message of three acked, a
batch done) and in `sharded` (the tables of shard `a` of a sharded queue, a batch there with a
message pending), before callbacks kept their outcomes (v9).

It was run once, against the v8 code (the commit before schema v9):

    git archive <commit> src | tar -x -C /tmp/v8
    PYTHONPATH=/tmp/v8/src python tests/migration/make_v8_fixture.py

and its output committed. `fixtures/v8.json` records what the upgrade tests expect to find."""

from __future__ import annotations

from make_v2_fixture import make

if __name__ == "__main__":
    raise SystemExit(make(8))
