# The two commands: `make demo` and `make test`. Everything they need is set up here.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: django6 screenshots setup rqlited toxiproxy browser chaos-deps monitoring-deps test test-all test-install lint typecheck unit unit-fast docs demo bench chaos generate clean

setup: $(STAMP) rqlited toxiproxy browser chaos-deps monitoring-deps

# Debian's Chromium for the dashboard's browser tests (scripts/browser-deps).
browser:
	@scripts/browser-deps

# promtool for the checks of the docs' alert rules (scripts/monitoring-deps; without root they
# are skipped with one printed line).
monitoring-deps:
	@scripts/monitoring-deps

# iproute2 and iptables for the chaos tests' network partitions (scripts/chaos-deps; without
# root they are skipped with one printed line).
chaos-deps:
	@scripts/chaos-deps

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# A usable rqlited: $$RQLITED, the user cache or PATH, else built from rqlite's Go module into
# the cache. The same code path as a user's `rqlite-queue rqlited` (src/rqlite_queue/rqlited.py).
RQLITED_PATH = $$($(BIN)/rqlite-queue rqlited)

rqlited: $(STAMP)
	@$(BIN)/rqlite-queue rqlited >/dev/null

# Toxiproxy (v2.5.0 and the package's own toxics) for the clusters' links: the latency bench
# and the link faults. Found in or built into the same cache (src/rqlite_queue/toxiproxy.py).
toxiproxy: $(STAMP)
	@$(BIN)/rqlite-queue toxiproxy >/dev/null

generate: $(STAMP)
	$(BIN)/python scripts/gen_sync.py

# ruff (with the private-member rule on the library), and the import layers of
# docs/architecture.md (import-linter, configured in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: setup
	RQLITED="$(RQLITED_PATH)" $(BIN)/pytest -q $(PYTEST_ARGS)

# Seconds, without Go or rqlited: the pure core on canned results, the embedded backend.
unit-fast: $(STAMP)
	$(BIN)/pytest -q -m "not rqlite and not slow" $(PYTEST_ARGS)

# The documentation site (mkdocs.yml, docs/): fails on any warning; output in site/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The slow path of a new user: the wheel into a fresh virtualenv with an empty HOME, rqlited
# found or built by the installed command, a kept cluster, the demo, a user's tests on the
# plugin's fixtures (tests/install, about two minutes).
test-install: setup
	RQLITED="$(RQLITED_PATH)" $(BIN)/pytest -q -m slow tests/install $(PYTEST_ARGS)

# The Django backend's tests on Django 6 (Python 3.12+, a venv of their own); `make unit` runs
# them on the django-tasks backport under the project's Python.
django6: setup
	RQLITED="$(RQLITED_PATH)" scripts/django6-tests $(PYTEST_ARGS)

test: setup lint typecheck docs unit django6 test-install

# Everything `make test` runs and the slow tier with it (`-m slow`: the long chaos runs, which
# write docs/reliability.md, the contract suite on every topology and in both flavours, the
# long Hypothesis runs, the upgrades from every version on 3 nodes, tests/install): hours.
test-all: setup lint typecheck docs django6
	RQLITED="$(RQLITED_PATH)" $(BIN)/pytest -q -m "" $(PYTEST_ARGS)

# A first run anywhere: the 3-node cluster when an rqlited is found or can be built (Go and gcc),
# else the embedded queue, saying why and how to get the 3-node demo (`--backend auto`).
demo: $(STAMP)
	$(BIN)/rqlite-queue demo --backend auto $(DEMO_ARGS)

BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# Quick (a few minutes): `make bench`; 1M-message backlogs: `make bench FULL=1`.
# Tables in bench/results/latest.md, plots beside it; see BENCHMARKS.md.
bench: setup $(BENCH_STAMP)
	RQLITED="$(RQLITED_PATH)" $(BIN)/python bench/run.py $(if $(FULL),--full,) $(BENCH_ARGS)

# The long chaos run (a short one is part of `make test`); writes docs/reliability.md.
# Its network partitions need root, iproute2 and iptables (scripts/chaos-deps installs the
# tools when missing); without them the partitions are skipped with one printed line.
chaos: setup
	RQLITED="$(RQLITED_PATH)" $(BIN)/pytest -q -s -m slow tests/chaos $(PYTEST_ARGS)

# The dashboard's pictures in docs/img/, taken by its browser tests.
screenshots: setup
	RQLITE_QUEUE_SCREENSHOTS=1 RQLITED="$(RQLITED_PATH)" $(BIN)/pytest -q tests/test_dashboard.py -k staged_demo

clean:
	rm -rf $(VENV) .venv-django6 .mypy_cache .ruff_cache .pytest_cache
