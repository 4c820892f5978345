# `make run` and `make test` are the whole setup on a fresh machine.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test bench ui lint clean

install: $(STAMP)

# Re-install only when the dependency list changes.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq -e '.[test]'
	touch $(STAMP)

run: install
	$(BIN)/towerbench pipeline --params params.yaml

# Two workers, a file each at a time (module fixtures stay in one process), longest files first.
test: install
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

bench: install
	$(BIN)/towerbench bench

ui: install
	$(BIN)/towerbench ui

lint: install
	$(BIN)/ruff check core config model ingest tasks flows speed serve overhead cli examples tests
	$(BIN)/ruff format --check core config model ingest tasks flows speed serve overhead cli examples tests

clean:
	rm -rf $(VENV) build *.egg-info
