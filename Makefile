# Two commands do all the set-up: `make demo` runs the main job on the embedded
# backend, `make test` runs the tests (starting the local cluster they need).
# `make docs` builds the site (docs/ and the API reference) into site/.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# --strict: any warning (a cross-reference in a docstring that names nothing, a dead
# link) fails the build. Not --quiet: it drops the warnings before --strict counts them.
# DISABLE_MKDOCS_2_WARNING: no notice about mkdocs 2.0 on every build; pyproject's docs
# extra keeps it out (mkdocs<2).
MKDOCS := DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict

.PHONY: install demo test unit docs chaos cluster-start cluster-stop cluster-status

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,docs]'
	touch $@

demo: install
	$(BIN)/scheduler demo

# The local cluster is left running afterwards, so the next run starts in seconds;
# `make cluster-stop` ends it.
test: install cluster-start
	$(BIN)/ruff check
	$(BIN)/python -m mypy
	$(MKDOCS)
	$(BIN)/python -m pytest --durations=25  # the slowest, to keep the run within its budget

unit: install
	$(BIN)/ruff check
	$(BIN)/python -m mypy
	$(MKDOCS)
	$(BIN)/python -m pytest -m "not integration"

docs: install
	$(MKDOCS)

# One server fault at a time on a three-node cluster (started, and stopped again, by the
# bench) during a burst: about 20 minutes. The figures are in docs/reliability.md.
chaos: install
	$(BIN)/python bench/chaos.py --start-cluster --out bench/results/chaos.json

cluster-start: install
	$(BIN)/python deploy/local/cluster.py start

cluster-stop:
	$(BIN)/python deploy/local/cluster.py stop
	$(BIN)/python deploy/local/cluster.py stop --secure

cluster-status:
	$(BIN)/python deploy/local/cluster.py status
