# streamlease: the two commands are `make run` and `make test`; everything else is a helper.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# checkov pins boto3 and ships its own hcl2 module: it gets an environment of its own
# (.gitignore'd).
CHECKOV_VENV  := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed

.PHONY: run test lint typecheck pytest promtool faketime redis postgres bench loadtest loadtest-all nemesis lock clean

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

# `make run SINK=file:///tmp/out` delivers to that sink instead of the events table;
# `make run FEED=gateway` (subscribe, gateway, live, binary) serves the streams from that test
# feed of the upstream, through its profile in examples/profiles.toml; `make run LEADER=mongodb`
# keeps the fleet leader lease on a MongoDB wire server it starts (or LEADER=mongodb://... or
# redis://..., a server already running).
run: $(STAMP)
	$(BIN)/python -m streamlease.dev.demo $(if $(SINK),--sink '$(SINK)') $(if $(FEED),--feed '$(FEED)') $(if $(LEADER),--leader '$(LEADER)') $(ARGS)

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

# System packages some tests need, by their Debian names (docs/development.md lists the
# whole toolchain). `make test` installs a missing one only where it can: as root where
# apt-get exists (Debian, Ubuntu; CI). There the tests that need them are also required
# (REQUIRE_*=1: a missing tool fails them). Elsewhere it prints one line a missing tool and
# goes on, and the tests that need it skip, saying why. SYSTEM_INSTALL=yes|no overrides.
SYSTEM_INSTALL ?= $(shell [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && echo yes || echo no)
REQUIRE_SYSTEM := $(if $(filter yes,$(SYSTEM_INSTALL)),REQUIRE_REDIS_SERVER=1 REQUIRE_PROMTOOL=1 REQUIRE_FAKETIME=1 REQUIRE_POSTGRES=1)

# $(call system_package,CHECK,PACKAGE,WHAT): nothing if CHECK succeeds; else install the
# Debian package PACKAGE, or say that WHAT is missing.
ifeq ($(SYSTEM_INSTALL),yes)
system_package = @{ $(1); } >/dev/null 2>&1 || { \
	echo "installing $(3) (Debian package $(2))"; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -qq --no-install-recommends $(2) >/dev/null; }
else
system_package = @{ $(1); } >/dev/null 2>&1 || \
	echo "$(3) is missing (Debian package $(2)); the tests that need it will skip"
endif

# tests/infra also runs terraform, offline, where it can: `terraform` 1.11+ on PATH (or
# TERRAFORM=path) and a filesystem mirror of hashicorp/aws 5.x (TERRAFORM_PROVIDER_MIRROR=dir,
# else /opt/tf-plugins, ~/.terraform.d/plugins, ...). init, validate and test run in a
# temporary copy of terraform/; without either, those tests skip and say why.
# REQUIRE_*: the tests that need a system package fail, not skip, where it can be installed.
pytest: $(STAMP) $(CHECKOV_STAMP) promtool faketime redis postgres
	$(REQUIRE_SYSTEM) $(BIN)/pytest $(PYTEST_ARGS)

# The alert rule tests need promtool, from Debian's prometheus package.
promtool:
	$(call system_package,command -v promtool,prometheus,promtool)

# The clock-skew tests and the load test's skew scenario offset one worker's clock with
# libfaketime (Debian package faketime: the wrapper and the library).
faketime:
	$(call system_package,command -v faketime && ls /usr/lib/*/faketime/libfaketime.so.1,faketime,libfaketime)

# The Redis leader backend's tests start a real redis-server (Debian package redis-server).
redis:
	$(call system_package,command -v redis-server,redis-server,redis-server)

# The PostgreSQL output's tests start a private server (Debian package postgresql: initdb and
# postgres under /usr/lib/postgresql/VERSION/bin), installed here when root on Debian. The
# tests run a private cluster on a free loopback port, whatever else runs on the machine.
postgres:
	$(call system_package,ls /usr/lib/postgresql/*/bin/initdb || command -v initdb,postgresql,PostgreSQL initdb)

# Benchmarks: print figures; only the load test's correctness figures can fail it.
bench: $(STAMP)
	$(BIN)/python -m loadtest.bench_store

# The default scenarios (under 20 minutes on 2 cores); loadtest-all adds the control plane
# at default timings (change_feed, scale_reads, scale: about 31 minutes in all).
loadtest: $(STAMP) faketime
	$(BIN)/python -m loadtest.runner $(ARGS)

loadtest-all: $(STAMP) faketime
	$(BIN)/python -m loadtest.runner --scenarios all $(ARGS)

# Random fault schedules, each audited (loadtest/nemesis.py): SEED=N SCHEDULES=K MINUTES=M,
# or SCHEDULE='...' to replay the line a failure printed; ARGS=--processor for processor
# schedules (docs/performance.md).
nemesis: $(STAMP) faketime
	$(BIN)/python -m loadtest.nemesis $(if $(SEED),--seed $(SEED)) $(if $(SCHEDULES),--schedules $(SCHEDULES)) $(if $(MINUTES),--minutes $(MINUTES)) $(if $(SCHEDULE),--schedule '$(SCHEDULE)') $(ARGS)

# Re-resolve the lock after changing dependencies in pyproject.toml. The lock holds exact
# versions and hashes, and nothing of the machine it was made on (no index URLs, no
# find-links from the local pip configuration).
lock: $(STAMP)
	$(BIN)/python -m pip install --quiet pip-tools
	$(BIN)/pip-compile --quiet --extra test --extra loadtest --generate-hashes --allow-unsafe --strip-extras \
		--no-emit-index-url --no-emit-find-links \
		--output-file requirements.lock pyproject.toml build-requirements.in

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) .mypy_cache .ruff_cache .pytest_cache
