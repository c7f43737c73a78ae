# Two commands on a fresh machine with only Python: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.metadist-installed
RUN_DIR ?= runs/demo

.PHONY: setup run test test-slow test-all lint format bench clean

setup: $(STAMP)

# torch is pinned and installed first so that no other requirement pulls a different build.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,datasets,ucr,ets,tensorboard,docs]'
	touch $(STAMP)

run: setup
	$(BIN)/metadist demo --out $(RUN_DIR)

test: setup
	$(BIN)/python -m pytest -m "not slow" -q -n 2 --dist loadfile --durations=15

test-slow: setup
	$(BIN)/python -m pytest -m "slow" -q

test-all: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) runs .pytest_cache
