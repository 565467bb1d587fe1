# Two entry points (README): `make audit` and `make test` (lint, then pytest). Both create .venv on first use.
# constraints.txt pins torch to the CPU build on this machine's disk; every install goes through it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/dpaudit: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test,cluster]'
	touch $@

setup: $(BIN)/dpaudit

audit: setup
	$(BIN)/dpaudit audit $(ARGS)

# Every check runs and reports; the target fails if any of them failed (config in pyproject.toml).
lint: setup
	@rc=0; \
	$(BIN)/ruff check . || rc=1; \
	$(BIN)/ruff format --check . || rc=1; \
	$(BIN)/mypy || rc=1; \
	exit $$rc

test: lint
	$(BIN)/python -m pytest -n auto --dist loadfile $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi; exit $$rc

.PHONY: setup audit lint test
