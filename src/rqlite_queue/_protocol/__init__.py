"""The queue without I/O (sans-I/O, as h11): the SQL (`sql`), the plans that run it and read
its results (`core`), each operation's arguments (`params`), rqlite's HTTP protocol and the
retry policy of one request (`http`, `retry`), where a group lives on a sharded queue and how
shards' answers combine (`sharding`), a worker's decisions (`worker_policy`). Nothing here
opens a socket, reads the clock or draws a random number of its own."""
