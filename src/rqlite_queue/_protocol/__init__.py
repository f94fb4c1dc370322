"""The queue without I/O (sans-I/O, as h11), one module per family of operations: `schema` (the
tables, their migrations, the fence, the setup), `publish` with `messages`, `rounds` with
`round_spec` (settle and claim), `settlements` and `one_settlement` (the settlements'
statements), `probes` (the probe), `jobs` (a message as a job: its outcome, its cancel),
`batches` with `batch_tables`, `batch_counts`, `batch_status`, `batch_ids`, `batch_joins`,
`admin`, `tenants`, `schedules`, `shard_tables`. Each holds its arguments' checks, its
statements, the reading of their results and its plan functions, which take the queue's
configuration (`core.QueueCore`) and return a `plan.Plan`. They share `plan` (the values a plan
is made of), `names` (a queue's names, and `Sql`: a statement written once and rendered once per
queue), `states` (the group states of `group_states` as the words of the statements) and
`refusals` (a refused batch's typed error). Beside them: rqlite's HTTP protocol and the retry
policy of one request (`http`, `retry`), where a group lives on a sharded queue and how shards'
answers combine (`sharding`), a worker's decisions (`worker_policy`), backups (`backup`).
Nothing here opens a socket, reads the clock or draws a random number of its own.

Every statement runs as the same text on the embedded SQLite and on rqlite (which replicates
the SQL text and re-executes it on every node), so:

- times and tokens are parameters from the client, never `julianday('now')` or `random()`;
- group ids and payloads are always bound parameters; a batch of many items binds them as one
  JSON array read with `json_each` (its items' fields named by the item type's own fields:
  `names.Fields`), so a batch costs a fixed number of statements whatever its size, and every
  statement's text stays short (rqlite gzips a request when one statement is 1 KiB or longer,
  or when it has 50 statements; `tests/unit/test_core_plans.py` checks both); on the embedded
  SQLite, a publish binds its rows instead (`publish._bound`: SQLite parses a JSON item once
  per field it reads);
- rows come back from plain `SELECT`s placed inside the write transaction (rqlite's
  `/db/request` runs them as queries within the transaction), not from `RETURNING`, which
  rqlite only honours when its own SQL parser accepts the statement and silently drops
  otherwise; the one exception, the claim's, is written for that parser and read back by a
  `SELECT` where rqlite dropped its rows (`rounds`); a write that reads no rows goes to
  rqlite's cheaper `/db/execute` (`plan.Batch.selects`);
- every statement is driven by an index, so its cost does not grow with the backlog (each one
  says which index it uses; `tests/test_query_plans.py` checks the plans);
- a guard fails its own transaction on purpose (a NOT NULL or UNIQUE constraint of one of the
  queue's tables, each guard its own: the schema fence, the tenants' tripwires, the bounds,
  the shard list's epoch, a transaction that applied already), and `refusals` tells which."""
