# Tiffany developer entry points. On a fresh machine with Python >= 3.11:
#
#   make run     create .venv if needed, install what running needs, run the main job
#   make test    the same setup plus the dev extras, then the test suite
#
# Each install is recorded in a stamp file inside .venv that depends on
# pyproject.toml, so a second `make run` or `make test` does not touch pip.

.DEFAULT_GOAL := help
SHELL := /bin/bash

# First interpreter on PATH that is Python >= 3.11 (override: make PYTHON=...).
PYTHON ?= $(shell for p in python3 python3.13 python3.12 python3.11; do \
	command -v $$p >/dev/null 2>&1 && \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && \
	{ echo $$p; break; }; done)

VENV := .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.tiffany-run.stamp
DEV_STAMP := $(VENV)/.tiffany-dev.stamp
BENCH_STAMP := $(VENV)/.tiffany-bench.stamp
PIP_INSTALL := $(BIN)/python -m pip install --disable-pip-version-check -q
PYTEST_ARGS ?=
# Test processes (pytest-xdist; 1 runs the suite in this process). A file's
# tests stay in one process (--dist loadfile: they share its fixtures), files
# in collection order, the slowest first (tests/conftest.py). Three
# on 2 cores: much of the suite waits on subprocesses, sockets and a browser.
TEST_WORKERS ?= 3
# make run: the API's port, and tools to enable besides the defaults (e.g. TOOLS="shell").
PORT ?= 8000
TOOLS ?=
# Byte-compile the package before run and test: an editable install leaves it
# uncompiled, and where PYTHONDONTWRITEBYTECODE is set (this project's Docker
# image, many CI machines) every process -- serve starts four, the tests
# hundreds -- would compile it from source again (~0.1 s of CPU each).
COMPILE := $(BIN)/python -m compileall -q -j 0 tiffany >/dev/null

.PHONY: help install run test lint bench clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "}; {printf "  make %-8s %s\n", $$1, $$2}'

$(BIN)/python:
	@if [ -z "$(PYTHON)" ]; then \
		echo "error: Tiffany needs Python >= 3.11 (none found on PATH; set PYTHON=...)" >&2; \
		exit 1; fi
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "error: $(PYTHON) is older than Python 3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)

# What running needs: the package and its dependencies, not the dev extras.
$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e .
	@touch $@

# The dev extras (pytest, ruff, mypy, playwright, ...) for test and lint;
# they hold the package too, so run's stamp is met as well.
$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e '.[dev]'
	@touch $@ $(RUN_STAMP)

$(BENCH_STAMP): pyproject.toml | $(BIN)/python
	$(PIP_INSTALL) -e '.[dev,bench]'
	@touch $@

install: $(DEV_STAMP) ## create .venv and install the project with the dev extras

run: $(RUN_STAMP) ## the main job: serve the dashboard and run the demo plan (Ctrl-C stops; PORT=8000 TOOLS="shell http")
	@$(COMPILE)
	$(BIN)/tiffany serve --demo --port $(PORT)$(foreach t,$(TOOLS), --enable-tool $(t))

test: $(DEV_STAMP) ## run the test suite (PYTEST_ARGS=... to pass options)
	@$(COMPILE)
	$(BIN)/python -m pytest -q $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(PYTEST_ARGS)

lint: $(DEV_STAMP) ## ruff on the tree, mypy on the package (strict on most layers)
	$(BIN)/ruff check .
	$(BIN)/mypy tiffany

bench: $(BENCH_STAMP) ## run the kernel benchmark (prints a table; no pass/fail)
	$(BIN)/python bench/ring.py

clean: ## remove caches and test artifacts (keeps .venv and .tiffany)
	rm -rf .pytest_cache .mypy_cache .ruff_cache .hypothesis test-artifacts
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
