# The two commands: `make demo` and `make test`. Everything they need is set up here.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup rqlited test lint typecheck unit demo bench chaos generate clean

setup: $(STAMP) rqlited

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Builds rqlited v8.43.4 into the user cache when missing (see scripts/build-rqlited).
rqlited:
	@scripts/build-rqlited >/dev/null

generate: $(STAMP)
	$(BIN)/python scripts/gen_sync.py

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy

unit: setup
	RQLITED="$$(scripts/build-rqlited)" $(BIN)/pytest -q $(PYTEST_ARGS)

test: setup lint typecheck unit

demo: setup
	RQLITED="$$(scripts/build-rqlited)" $(BIN)/python -m rqlite_queue.demo $(DEMO_ARGS)

bench: setup
	@echo "bench: not written yet (see the performance issue)"; exit 1

# The long chaos run (a short one is part of `make test`); writes docs/reliability.md.
chaos: setup
	RQLITED="$$(scripts/build-rqlited)" $(BIN)/pytest -q -s -m slow tests/chaos $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
