# The two commands a user needs are `make demo` and `make test`; both set up what they use.
PYTHON ?= python3
PIP := tests/infra/pip-install.sh
VENV := .venv

.PHONY: install demo test lint typecheck rocq pytest bench clean

install:
	@$(PIP) -e ".[test]"

# The demo runs in the project's own virtual environment (created once; never the system Python).
demo:
	@tests/infra/ensure-venv.sh $(VENV)
	$(VENV)/bin/python examples/demo.py

test: install
	@tests/infra/ensure-postgres.sh
	@tests/infra/ensure-coq.sh
	@tests/infra/ensure-spin.sh
	@tests/infra/ensure-iproute.sh
	@tests/infra/ensure-capsh.sh
	$(MAKE) rocq
	$(MAKE) lint typecheck
	$(MAKE) pytest

rocq:
	$(MAKE) -C rocq check

lint:
	$(PYTHON) -m ruff check bide govern tests examples benchmarks

typecheck:
	$(PYTHON) -m mypy

# PYTEST_WORKERS=0 runs the suite in one process (pytest-xdist's -n 0).
PYTEST_WORKERS ?= 4

pytest:
	$(PYTHON) -m pytest -q -n $(PYTEST_WORKERS)

bench: install
	for b in benchmarks/[!_]*.py; do $(PYTHON) $$b || exit 1; done

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache $(VENV)
	$(MAKE) -C rocq clean
