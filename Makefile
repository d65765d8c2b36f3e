# streamlease: the two commands are `make run` and `make test`; everything else is a helper.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# checkov pins boto3 and ships its own hcl2 module: it gets an environment of its own
# (.gitignore'd).
CHECKOV_VENV  := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed

.PHONY: run test lint typecheck pytest promtool faketime redis postgres bench loadtest lock clean

# Create the virtual environment if missing and install exactly what the lock says.
$(STAMP): requirements.lock pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "streamlease needs Python 3.11 or newer")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The checkov environment for tests/infra, exactly as requirements-checkov.lock says.
$(CHECKOV_STAMP): requirements-checkov.lock
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements-checkov.lock
	touch $(CHECKOV_STAMP)

# `make run SINK=file:///tmp/out` delivers to that sink instead of the events table.
run: $(STAMP)
	$(BIN)/python -m streamlease.dev.demo $(if $(SINK),--sink '$(SINK)') $(ARGS)

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

# tests/infra also runs terraform, offline, where it can: `terraform` 1.11+ on PATH (or
# TERRAFORM=path) and a filesystem mirror of hashicorp/aws 5.x (TERRAFORM_PROVIDER_MIRROR=dir,
# else /opt/tf-plugins, ~/.terraform.d/plugins, ...). init, validate and test run in a
# temporary copy of terraform/; without either, those tests skip and say why.
# REQUIRE_REDIS_SERVER: the Redis tests fail, not skip, if redis-server is missing;
# REQUIRE_POSTGRES: the same for the PostgreSQL output's tests and initdb/postgres.
pytest: $(STAMP) $(CHECKOV_STAMP) promtool faketime redis postgres
	REQUIRE_REDIS_SERVER=1 REQUIRE_POSTGRES=1 $(BIN)/pytest $(PYTEST_ARGS)

# The alert rule tests need promtool, from Debian's prometheus package.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
		echo "installing promtool (Debian package prometheus)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# The clock-skew tests and the load test's skew scenario offset one worker's clock with
# libfaketime (Debian package faketime: the wrapper and the library).
faketime:
	@{ command -v faketime && ls /usr/lib/*/faketime/libfaketime.so.1; } >/dev/null 2>&1 || { \
		echo "installing faketime (Debian package faketime)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends faketime >/dev/null; }

# The Redis leader backend's tests start a real redis-server (Debian package redis-server).
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
		echo "installing redis-server (Debian package redis-server)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -qq --no-install-recommends redis-server >/dev/null; }

# The PostgreSQL output's tests start a private server (Debian package postgresql: initdb and
# postgres under /usr/lib/postgresql/VERSION/bin), installed here when root on Debian; the
# system cluster the package may start is stopped again (the tests run their own).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing PostgreSQL (Debian package postgresql)"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
				apt-get install -y -qq --no-install-recommends postgresql >/dev/null && \
			{ service postgresql stop >/dev/null 2>&1 || :; }; \
		else \
			echo "PostgreSQL's initdb is missing: install the postgresql package"; exit 1; \
		fi; }

# Benchmarks: print figures; only the load test's correctness figures can fail it.
bench: $(STAMP)
	$(BIN)/python -m loadtest.bench_store

loadtest: $(STAMP) faketime
	$(BIN)/python -m loadtest.chaos $(ARGS)

# Re-resolve the lock after changing dependencies in pyproject.toml.
lock: $(STAMP)
	$(BIN)/python -m pip install --quiet pip-tools
	$(BIN)/pip-compile --quiet --extra test --extra loadtest --generate-hashes --allow-unsafe --strip-extras \
		--output-file requirements.lock pyproject.toml build-requirements.in

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) .mypy_cache .ruff_cache .pytest_cache
