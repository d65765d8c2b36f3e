"""The installable package: its public API, its type marker, the optional extras (nothing
imports ``redis`` unless the Redis leader backend is chosen; no uvloop falls back to
asyncio's loop), and the Makefile installing system packages only where it can."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import streamlease
from streamlease import app
from streamlease.dev import local_aws_env
from streamlease.errors import ConfigError
from tests.procs import ROOT

REDIS_URL = "redis://127.0.0.1:1/0"  # never dialled: every check here stops before I/O


def test_the_public_api_exports_what_all_says_and_is_typed() -> None:
    assert streamlease.__all__, "the package names its public API"
    for name in streamlease.__all__:
        assert hasattr(streamlease, name), f"__all__ names {name!r}, which is not there"
    assert streamlease.__version__ == importlib.metadata.version("streamlease")
    assert (Path(streamlease.__file__).parent / "py.typed").is_file()


def python_with(blocked: str, code: str, env: dict[str, str] | None = None,
                ) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``import <blocked>`` fails as if the
    package were not installed (``blocked`` empty: nothing blocked)."""
    prelude = f"import sys; sys.modules[{blocked!r}] = None\n" if blocked else ""
    full = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLEASE_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-c", prelude + code], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)


def test_starting_imports_neither_redis_nor_its_backend() -> None:
    result = python_with("", "import sys, streamlease.app, streamlease.cli, streamlease.jobcli\n"
                             "print(sorted(m for m in sys.modules if m == 'redis' "
                             "or m.startswith(('redis.', 'streamlease.store.redis'))))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("args", [
    ["run"],
    ["job", "write", "--table", "ledger", "--item", '{"Pk": {"S": "day#1"}}'],
], ids=["run", "job-write"])
def test_a_redis_backend_without_the_redis_package_exits_2_naming_the_setting_and_extra(
        args: list[str]) -> None:
    result = python_with(
        "redis", f"from streamlease.cli import main; raise SystemExit(main({args!r}))",
        # A closed loopback endpoint and dummy credentials: should the check ever come after
        # the first store call, that call fails here and never leaves the machine.
        env={"STREAMLEASE_LEADER_BACKEND": REDIS_URL, "STREAMLEASE_FENCE": "7",
             "STREAMLEASE_METRICS_PORT": "0", **local_aws_env("http://127.0.0.1:9")})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "STREAMLEASE_LEADER_BACKEND" in lines[0]
    assert "pip install 'streamlease[redis]'" in lines[0]
    assert REDIS_URL not in lines[0]  # the setting is secret: named, never quoted


MONGODB_URL = "mongodb://127.0.0.1:1/streamlease"  # never dialled, as REDIS_URL


@pytest.mark.parametrize("args", [
    ["run"],
    ["job", "write", "--table", "ledger", "--item", '{"Pk": {"S": "day#1"}}'],
], ids=["run", "job-write"])
def test_a_mongodb_backend_without_pymongo_exits_2_naming_the_setting_and_extra(
        args: list[str]) -> None:
    result = python_with(
        "pymongo", f"from streamlease.cli import main; raise SystemExit(main({args!r}))",
        env={"STREAMLEASE_LEADER_BACKEND": MONGODB_URL, "STREAMLEASE_FENCE": "7",
             "STREAMLEASE_METRICS_PORT": "0", **local_aws_env("http://127.0.0.1:9")})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "STREAMLEASE_LEADER_BACKEND" in lines[0]
    assert "pip install 'streamlease[mongodb]'" in lines[0]
    assert MONGODB_URL not in lines[0]


def test_a_mongodb_sink_without_pymongo_exits_2_before_any_store_is_dialled() -> None:
    result = python_with(
        "pymongo", "from streamlease.cli import main; raise SystemExit(main(['run']))",
        env={"STREAMLEASE_SINK": "mongodb://u:s3cret@127.0.0.1:1/db.messages",
             "STREAMLEASE_METRICS_PORT": "0", **local_aws_env("http://127.0.0.1:9")})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("streamlease: STREAMLEASE_SINK: a mongodb:// sink needs")
    assert "pip install 'streamlease[mongodb]'" in lines[0] and "s3cret" not in lines[0]


def test_starting_imports_no_mongodb_driver() -> None:
    result = python_with("", "import sys, streamlease.app, streamlease.cli, streamlease.jobcli\n"
                             "print(sorted(m for m in sys.modules if m.startswith(("
                             "'pymongo', 'bson', 'streamlease.store.mongo'))))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_require_redis_passes_where_the_package_is_installed_and_refuses_without(
        monkeypatch: pytest.MonkeyPatch) -> None:
    app.require_redis()
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(ConfigError, match=r"streamlease\[redis\]"):
        app.require_redis()


def test_the_worker_loop_is_uvloop_where_installed_else_asyncio_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import uvloop
    assert app.loop_factory() is uvloop.new_event_loop
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert app.loop_factory() is None
    with asyncio.Runner(loop_factory=app.loop_factory()) as runner:
        assert runner.run(asyncio.sleep(0, result="ran")) == "ran"


# -- the Makefile: system packages only where it can install them --------------------------

MAKE = shutil.which("make")
needs_make = pytest.mark.skipif(MAKE is None, reason="needs GNU make")
# Stand-in prerequisites: `make -n pytest` prints the pytest line without (re)building .venv.
KEEP_VENVS = ["-o", ".venv/.installed", "-o", ".venv-checkov/.installed"]


def fake_path(tmp_path: Path, uid: int, apt_get: bool) -> str:
    """A PATH holding only a fake ``id`` (printing ``uid`` for ``-u``) and, if asked, a
    fake ``apt-get``: the Makefile's shell commands find nothing else (no promtool,
    faketime or redis-server either)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    scripts = [bin_dir / "id"]
    if apt_get:
        (bin_dir / "apt-get").write_text("#!/bin/sh\necho 'fake apt-get ran' >&2\nexit 1\n")
        scripts.append(bin_dir / "apt-get")
    for script in scripts:
        script.chmod(0o755)
    return str(bin_dir)


def run_make(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    assert MAKE is not None
    # A make above this pytest (`make test X=...`) passes its variables on in MAKEFLAGS.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["PATH"] = path
    return subprocess.run([MAKE, "--no-print-directory", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


@needs_make
@pytest.mark.parametrize(("uid", "apt_get", "installs"), [
    (0, True, True),  # root on Debian (CI): install, and require the tools
    (1000, True, False),  # no root: cannot install
    (0, False, False),  # root without apt-get (not Debian): cannot install
], ids=["root-debian", "no-root", "no-apt-get"])
def test_make_installs_and_requires_system_packages_only_as_root_with_apt_get(
        tmp_path: Path, uid: int, apt_get: bool, installs: bool) -> None:
    result = run_make(fake_path(tmp_path, uid, apt_get), "-n", *KEEP_VENVS, "pytest")
    assert result.returncode == 0, result.stderr
    commands = result.stdout.splitlines()
    pytest_line = next(line for line in commands if "bin/pytest" in line)
    for package in ("prometheus", "faketime", "redis-server"):
        assert any(f"--no-install-recommends {package}" in line for line in commands) == installs
    for flag in ("REQUIRE_REDIS_SERVER=1", "REQUIRE_PROMTOOL=1", "REQUIRE_FAKETIME=1"):
        assert (flag in pytest_line) == installs, pytest_line


@needs_make
def test_make_without_install_rights_names_each_missing_tool_and_goes_on(
        tmp_path: Path) -> None:
    result = run_make(fake_path(tmp_path, 1000, False), "promtool", "faketime", "redis")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "promtool is missing (Debian package prometheus); the tests that need it will skip",
        "libfaketime is missing (Debian package faketime); the tests that need it will skip",
        "redis-server is missing (Debian package redis-server); "
        "the tests that need it will skip",
    ]
