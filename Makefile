# Two commands do all the set-up: `make demo` runs the main job on the embedded
# backend, `make test` runs the tests (starting the local cluster they need).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install demo test unit cluster-start cluster-stop cluster-status

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

demo: install
	$(BIN)/scheduler demo

# The local cluster is left running afterwards, so the next run starts in seconds;
# `make cluster-stop` ends it.
test: install cluster-start
	$(BIN)/ruff check
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest

unit: install
	$(BIN)/ruff check
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -m "not integration"

cluster-start: install
	$(BIN)/python deploy/local/cluster.py start

cluster-stop:
	$(BIN)/python deploy/local/cluster.py stop

cluster-status:
	$(BIN)/python deploy/local/cluster.py status
