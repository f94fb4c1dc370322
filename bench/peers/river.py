"""Context line: River (Go, on PostgreSQL) working no-op jobs as fast as it can, unordered.

River has no per-group FIFO and no exclusivity: this is not a peer on our workload, only the
fast-unordered line beside it. The ideal is River's own `river bench` (its CLI, module
`github.com/riverqueue/river/cmd/river`). When that module can be installed with the machine's
Go, it is used as is. When it cannot (the Go module proxy that this bench can reach serves the
main module `github.com/riverqueue/river` but not the separate `cmd/river` module), the same
benchmark is built from `RIVER_BENCH_GO` below: a short port of River's
`cmd/river/riverbench` in `--num-total-jobs` mode over the main module's public API, with
River's own settings (pgx pool with River CLI's session timeouts, `FetchCooldown` 2 ms,
`FetchPollInterval` 20 ms, one queue of `MaxWorkers` 2,000, jobs inserted with `InsertMany` in
batches of 5,000 before the client starts, a no-op worker, timed from `client.Start` to the
last completion event seen on a subscription), printing River's own summary line.

Either binary is cached under ~/.cache/rqlite-queue/ and reused. Every failure (no Go, a
module refused, no PostgreSQL, a run that fails) is a `RiverUnavailable` with one line.

    python bench/peers/river.py [--jobs N]    # builds, starts a PostgreSQL, runs once
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

RIVER_VERSION = "v0.51.2"
CLI_MODULE = "github.com/riverqueue/river/cmd/river"
MAIN_MODULE = "github.com/riverqueue/river"
PGX_DRIVER_MODULE = "github.com/riverqueue/river/riverdriver/riverpgxv5"
CACHE = Path.home() / ".cache" / "rqlite-queue" / f"river-{RIVER_VERSION}"
BUILD_TIMEOUT_S = 1200
RUN_TIMEOUT_S = 600

# River's own summary line (riverbench.Run's deferred Printf), from both binaries.
SUMMARY = re.compile(
    r"total jobs worked \[\s*(\d+)\s*\], total jobs inserted \[\s*(\d+)\s*\], "
    r"overall job/sec \[\s*([\d.]+)\s*\], running (\S+)"
)


class RiverUnavailable(RuntimeError):
    """River cannot be built or run here; the message is one line saying why."""


@dataclass(frozen=True)
class RiverBinary:
    path: Path
    kind: str  # "cli": River's own `river`; "port": RIVER_BENCH_GO built on the main module
    describe: str  # what it is, for the report


@dataclass(frozen=True)
class RiverRun:
    jobs_per_s: float
    jobs_worked: int
    running: str  # River's own duration string, from client start to the last job worked
    command: str  # the bench's command line as shown (shown_command)
    output: str


def _one_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = " | ".join(dict.fromkeys(lines[-2:])) if lines else "no output"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _go() -> str:
    go = shutil.which("go") or next(
        (p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if os.access(p, os.X_OK)),
        None,
    )
    if go is None:
        raise RiverUnavailable("no Go toolchain (go) on PATH: River's bench is built with Go")
    return go


def _go_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOFLAGS", "-buildvcs=false")
    env["GOBIN"] = str(CACHE)
    env["GOTOOLCHAIN"] = env.get("GOTOOLCHAIN", "local")
    env["PWD"] = str(workdir)
    return env


def _go_run(args: list[str], workdir: Path, what: str) -> None:
    try:
        proc = subprocess.run(
            args,
            cwd=workdir,
            env=_go_env(workdir),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RiverUnavailable(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        raise RiverUnavailable(f"{what} failed: {_one_line(proc.stderr or proc.stdout)}")


def _install_cli(go: str) -> Path:
    """`go install .../cmd/river@v0.51.2` into CACHE: River's own CLI."""
    with tempfile.TemporaryDirectory(prefix="river-cli-") as tmp:
        _go_run(
            ["nice", "-n", "10", go, "install", "-p", "1", f"{CLI_MODULE}@{RIVER_VERSION}"],
            Path(tmp),
            f"go install {CLI_MODULE}@{RIVER_VERSION}",
        )
    return CACHE / "river"


def _build_port(go: str) -> Path:
    """Build RIVER_BENCH_GO against the main module at RIVER_VERSION into CACHE."""
    src = CACHE / "port-src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "main.go").write_text(RIVER_BENCH_GO)
    (src / "go.mod").write_text("module riverbenchport\n\ngo 1.26.0\n")
    get = [go, "get", f"{MAIN_MODULE}@{RIVER_VERSION}", f"{PGX_DRIVER_MODULE}@{RIVER_VERSION}"]
    _go_run(get, src, f"go get {MAIN_MODULE}@{RIVER_VERSION}")
    _go_run([go, "mod", "tidy"], src, "go mod tidy (River bench port)")
    out = CACHE / "river-bench-port"
    _go_run(
        ["nice", "-n", "10", go, "build", "-p", "1", "-o", str(out), "."],
        src,
        "go build (River bench port)",
    )
    return out


def river_binary() -> RiverBinary:
    """River's `river` CLI if it is (or can be) installed, else the port; built once, cached."""
    CACHE.mkdir(parents=True, exist_ok=True)
    cli, port = CACHE / "river", CACHE / "river-bench-port"
    cli_text = f"River's own `river bench` ({CLI_MODULE}@{RIVER_VERSION})"
    port_text = (
        f"River {RIVER_VERSION}'s `river bench` workload, rebuilt from bench/peers/river.py on "
        f"{MAIN_MODULE}@{RIVER_VERSION} (the `cmd/river` module is not served here)"
    )
    if os.access(cli, os.X_OK):
        return RiverBinary(cli, "cli", cli_text)
    port_src = CACHE / "port-src" / "main.go"
    if os.access(port, os.X_OK) and port_src.exists() and port_src.read_text() == RIVER_BENCH_GO:
        return RiverBinary(port, "port", port_text)  # built from this very source
    go = _go()
    refused = CACHE / "cli-refused.txt"
    if not refused.exists():
        try:
            return RiverBinary(_install_cli(go), "cli", cli_text)
        except RiverUnavailable as exc:
            # Remember the refusal (delete the file to ask again): asking the proxy on every
            # run would only fail again.
            refused.write_text(f"{exc}\n")
    return RiverBinary(_build_port(go), "port", port_text)


def _with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{name}"))


def shown_command(total_jobs: int) -> str:
    """The bench's command line as the report shows it: the port and the fresh database's name
    are picked at run time and say nothing."""
    url = "postgresql://postgres@127.0.0.1:PORT/river_FRESH"
    return shlex.join(
        ["river", "bench", "--database-url", url, "--num-total-jobs", f"{total_jobs}"]
    )


def _run(binary: Path, args: list[str], what: str, timeout: float = RUN_TIMEOUT_S) -> str:
    try:
        proc = subprocess.run(
            [str(binary), *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RiverUnavailable(f"{what} failed: {exc}") from exc
    if proc.returncode != 0:
        raise RiverUnavailable(f"{what} failed (exit {proc.returncode}): {_one_line(proc.stderr)}")
    return proc.stdout + proc.stderr


def run_river_bench(
    dsn: str, total_jobs: int = 20_000, binary: RiverBinary | None = None
) -> RiverRun:
    """One `river bench --num-total-jobs N` on a fresh database of the server at `dsn`.

    The database is created (by the port itself over pgx, so the bench needs no Python
    PostgreSQL driver; for River's CLI by createdb), migrated with `river migrate-up`,
    benchmarked, and dropped.
    """
    binary = binary or river_binary()
    name = f"river_{uuid.uuid4().hex[:12]}"
    url = _with_database(dsn, name)
    _database(binary, dsn, name, create=True)
    try:
        _run(binary.path, ["migrate-up", "--database-url", url], "river migrate-up")
        bench = ["bench", "--database-url", url, "--num-total-jobs", str(total_jobs)]
        t0 = time.monotonic()
        output = _run(binary.path, bench, "river bench")
        wall = time.monotonic() - t0
    finally:
        _database(binary, dsn, name, create=False)
    match = SUMMARY.search(output)
    if match is None:
        raise RiverUnavailable(f"river bench printed no summary line: {_one_line(output)}")
    worked = int(match.group(1))
    if worked != total_jobs:
        raise RiverUnavailable(f"river bench worked {worked} of {total_jobs} jobs ({wall:.1f}s)")
    return RiverRun(
        float(match.group(3)), worked, match.group(4), shown_command(total_jobs), output
    )


def _database(binary: RiverBinary, dsn: str, name: str, create: bool) -> None:
    """Create or drop the bench's own database: the port does it over pgx; River's CLI has no
    such command, so then PostgreSQL's createdb/dropdb (from the server's packages) do."""
    tool = "createdb" if create else "dropdb"
    if binary.kind == "port":
        _run(binary.path, [f"{'create' if create else 'drop'}-database", "--database-url", dsn,
                           "--name", name], tool, timeout=60)  # fmt: skip
        return
    found = shutil.which(tool) or next(
        iter(sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"), reverse=True)), None
    )
    if found is None:
        raise RiverUnavailable(f"no {tool} for River's database")
    try:
        proc = subprocess.run(
            [str(found), "--maintenance-db", dsn, name],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RiverUnavailable(f"{tool} {name} failed: {exc}") from exc
    if proc.returncode != 0:
        raise RiverUnavailable(f"{tool} {name} failed: {_one_line(proc.stderr)}")


# A port of River's cmd/river/riverbench (`river bench --num-total-jobs N`), River's settings,
# plus the CLI's `migrate-up` and a create/drop of the bench's database. River is MPL-2.0.
RIVER_BENCH_GO = r"""// Built by rqlite-queue's bench/peers/river.py: River's `river bench` in
// --num-total-jobs mode (cmd/river/riverbench), on github.com/riverqueue/river's API.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"
)

type BenchmarkArgs struct {
	Num int `json:"num"`
}

func (BenchmarkArgs) Kind() string { return "benchmark" }

type BenchmarkWorker struct {
	river.WorkerDefaults[BenchmarkArgs]
}

func (w *BenchmarkWorker) Work(ctx context.Context, j *river.Job[BenchmarkArgs]) error {
	return nil
}

const (
	insertBatchSize = 5_000
	minJobs         = 75_000
)

// The pool as River's CLI opens it (openPgxV5DBPool): its session timeouts.
func openPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	params := cfg.ConnConfig.RuntimeParams
	if params["statement_timeout"] == "" {
		params["statement_timeout"] = "10000"
	}
	if params["idle_in_transaction_session_timeout"] == "" {
		params["idle_in_transaction_session_timeout"] = "11000"
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

func database(ctx context.Context, url, name string, create bool) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	sql := "DROP DATABASE IF EXISTS " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)"
	if create {
		sql = "CREATE DATABASE " + pgx.Identifier{name}.Sanitize()
	}
	_, err = conn.Exec(ctx, sql)
	return err
}

func migrateUp(ctx context.Context, pool *pgxpool.Pool) error {
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	res, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return err
	}
	for _, v := range res.Versions {
		fmt.Printf("applied migration %03d [%s] [%s]\n", v.Version, v.Name, v.Duration)
	}
	return nil
}

func bench(ctx context.Context, pool *pgxpool.Pool, numTotalJobs, maxWorkers int) error {
	// As riverbench's resetJobsTable: an empty, vacuumed job table.
	if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "VACUUM FULL river_job"); err != nil {
		return fmt.Errorf("error vacuuming: %w", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &BenchmarkWorker{})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Queues: map[string]river.QueueConfig{
			river.QueueDefault: {MaxWorkers: maxWorkers},
		},
		Workers:           workers,
	})
	if err != nil {
		return err
	}
	events, cancelEvents := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: max(minJobs, numTotalJobs),
		Kinds: []river.EventKind{
			river.EventKindJobCancelled, river.EventKindJobCompleted, river.EventKindJobFailed,
		},
	})
	defer cancelEvents()

	// Insert every job before the client starts, in batches of 5,000.
	var inserted int
	batch := make([]river.InsertManyParams, 0, insertBatchSize)
	for inserted < numTotalJobs {
		batch = batch[:0]
		for i := 0; i < insertBatchSize && inserted+len(batch) < numTotalJobs; i++ {
			args := BenchmarkArgs{Num: inserted + i + 1}
			batch = append(batch, river.InsertManyParams{Args: args})
		}
		if _, err := client.InsertMany(ctx, batch); err != nil {
			return fmt.Errorf("error inserting jobs: %w", err)
		}
		inserted += len(batch)
	}

	var worked, unexpected atomic.Int64
	var lastWorkedAt atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for event := range events {
			discarded := event.Kind == river.EventKindJobFailed &&
				event.Job.State == rivertype.JobStateDiscarded
			if event.Kind != river.EventKindJobCompleted && !discarded {
				unexpected.Add(1)
			}
			lastWorkedAt.Store(time.Now().UnixNano())
			if worked.Add(1) >= int64(numTotalJobs) {
				return
			}
		}
	}()

	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return err
	}
	ticker := time.NewTicker(2 * time.Second)
	defer ticker.Stop()
	var workedLast int64
	for waiting := true; waiting; {
		select {
		case <-done:
			waiting = false
		case <-ctx.Done():
			return ctx.Err()
		case <-ticker.C:
			w := worked.Load()
			fmt.Printf("bench: jobs worked [ %10d ], inserted [ %10d ], job/sec [ %10.1f ] [2s]\n",
				w-workedLast, 0, float64(w-workedLast)/2)
			workedLast = w
		}
	}
	runPeriod := time.Unix(0, lastWorkedAt.Load()).Sub(start)
	fmt.Printf("bench: total jobs worked [ %10d ], total jobs inserted [ %10d ], "+
		"overall job/sec [ %10.1f ], running %s\n",
		worked.Load(), inserted, float64(worked.Load())/runPeriod.Seconds(), runPeriod)
	if err := client.Stop(ctx); err != nil {
		return err
	}
	if n := unexpected.Load(); n > 0 {
		return fmt.Errorf("%d jobs were not completed (cancelled or discarded)", n)
	}
	return nil
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: river-bench-port "+
			"create-database|drop-database|migrate-up|bench --database-url URL ...")
		os.Exit(2)
	}
	cmd := os.Args[1]
	flags := flag.NewFlagSet(cmd, flag.ExitOnError)
	url := flags.String("database-url", "", "URL of the database")
	name := flags.String("name", "", "database to create or drop")
	numTotalJobs := flags.Int("num-total-jobs", 20_000, "jobs inserted, then worked down")
	maxWorkers := flags.Int("max-workers", 2_000, "MaxWorkers of the queue (river bench: 2,000)")
	timeout := flags.Duration("timeout", 9*time.Minute, "give up after this long")
	_ = flags.Parse(os.Args[2:])
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	var err error
	switch cmd {
	case "create-database", "drop-database":
		err = database(ctx, *url, *name, cmd == "create-database")
	case "migrate-up", "bench":
		var pool *pgxpool.Pool
		if pool, err = openPool(ctx, *url); err == nil {
			defer pool.Close()
			if cmd == "bench" {
				err = bench(ctx, pool, *numTotalJobs, *maxWorkers)
			} else {
				err = migrateUp(ctx, pool)
			}
		}
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", cmd, err)
		os.Exit(1)
	}
}
"""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args(argv)
    try:
        from .postgres import LocalPostgres, PostgresUnavailable
    except ImportError:  # run as a script: this file's folder is on sys.path
        from postgres import LocalPostgres, PostgresUnavailable  # type: ignore[no-redef,import-not-found]
    try:
        binary = river_binary()
        print(binary.describe)
        with LocalPostgres() as pg:
            run = run_river_bench(pg.dsn, args.jobs, binary)
    except (RiverUnavailable, PostgresUnavailable) as exc:
        print(f"River skipped: {exc}")
        return 1
    print(run.output.rstrip())
    print(f"{run.jobs_per_s:.1f} jobs/s  ({run.command})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
