# streamlease: the two commands are `make run` and `make test`; everything else is a helper.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test lint typecheck pytest promtool bench lock clean

# Create the virtual environment if missing and install exactly what the lock says.
$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "streamlease needs Python 3.11 or newer")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m worker.dev.demo $(ARGS)

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) promtool
	$(BIN)/pytest $(PYTEST_ARGS)

# The alert rule tests need promtool, from Debian's prometheus package.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
		echo "installing promtool (Debian package prometheus)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# Benchmarks: print figures, assert nothing.
bench: $(STAMP)
	$(BIN)/python -m loadtest.bench_store
	$(BIN)/python -m loadtest.bench_worker

# Re-resolve the lock after changing dependencies in pyproject.toml.
lock: $(STAMP)
	$(BIN)/python -m pip install --quiet pip-tools
	$(BIN)/pip-compile --quiet --extra test --generate-hashes --allow-unsafe --strip-extras \
		--output-file requirements.lock pyproject.toml build-requirements.in

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
