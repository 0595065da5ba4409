# Two commands on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: serve test lint typecheck pytest bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/migratory serve $(if $(CONFIG),--config $(CONFIG),)

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) benchmarks/fanout.py
	$(PY) benchmarks/idle_connections.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
