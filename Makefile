# `make run` and `make test` are the whole setup on a fresh machine.
PYTHON ?= python3.12
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The package's subpackages, floors from the ground up, cli and api side by side on top
# (pyproject.toml's package-dir); the package's own __init__.py is in towerbench/.
FLOORS := core config model ingest speed tasks flows serve overhead cli api
TYPECHECK := build/typecheck

.PHONY: install run test bench ui lint clean

install: $(STAMP)

# Re-install only when the dependency list changes; a .venv of another Python (a clone made
# before the project moved to 3.12) is made again.
$(STAMP): pyproject.toml
	want="$$($(PYTHON) -V)" && { test "$$($(BIN)/python -V 2>&1)" = "$$want" || \
		{ rm -rf $(VENV) && $(PYTHON) -m venv $(VENV); }; }
	$(BIN)/python -m pip install -qq --upgrade pip
	$(BIN)/python -m pip install -qq -e '.[test]'
	touch $(STAMP)

run: install
	$(BIN)/towerbench pipeline --params params.yaml

# Two workers, a file each at a time (module fixtures stay in one process), longest files first;
# line coverage of the package in them and in the processes they start (pyproject.toml's
# [tool.coverage]): its total last, the run failing below the floor, each line in build/coverage/.
test: install
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=15 \
		--cov --cov-report=html:build/coverage

bench: install
	$(BIN)/towerbench bench

ui: install
	$(BIN)/towerbench ui

# mypy finds `towerbench.<floor>` only under a folder named towerbench, so it reads the floors
# through links rebuilt each time in build/typecheck/towerbench/ (its cache, kept, makes a second
# run take seconds).
lint: install
	$(BIN)/ruff check $(FLOORS) towerbench examples tests
	$(BIN)/ruff format --check $(FLOORS) towerbench examples tests
	rm -rf $(TYPECHECK)
	mkdir -p $(TYPECHECK)/towerbench
	for floor in $(FLOORS); do ln -s ../../../$$floor $(TYPECHECK)/towerbench/$$floor; done
	ln -s ../../../towerbench/__init__.py $(TYPECHECK)/towerbench/__init__.py
	cd $(TYPECHECK) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml \
		--cache-dir $(CURDIR)/build/mypy-cache -p towerbench

clean:
	rm -rf $(VENV) build *.egg-info
