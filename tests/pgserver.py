"""A real PostgreSQL server (Debian's package) on a free loopback port, for the PostgreSQL
output's tests.

The cluster lives in a temporary directory, made by ``initdb`` with password
(``scram-sha-256``) authentication on TCP, so the tests dial with a URL that carries a
password. PostgreSQL refuses to run as root: as root the server runs as ``nobody`` through
``setpriv`` (util-linux), with the directory handed to that user; as anyone else it runs as
that user. ``make test`` installs the package and sets ``REQUIRE_POSTGRES=1``: missing
binaries then fail the tests. Run bare without it, they are skipped with the reason.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from streamlease.dev.procs import free_port
from tests.procs import Proc

USER = "streamlease"
PASSWORD = "pg-test-secret-6f1c"  # the tests grep logs for it
RUN_AS = "nobody"  # when root: PostgreSQL will not run as root


def postgres_bindir() -> Path:
    """The directory of ``initdb`` and ``postgres``: ``$PG_BINDIR``, else the newest
    ``/usr/lib/postgresql/*/bin``, else wherever ``initdb`` is on PATH. Skip or fail (see
    the module) when there is none."""
    candidates: list[Path] = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(Path(os.environ["PG_BINDIR"]))

    def version(path: str) -> tuple[int, ...]:
        found = re.search(r"/postgresql/(\d+)(?:\.(\d+))?/", path)
        return tuple(int(x) for x in found.groups() if x) if found else (0,)

    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                           key=version, reverse=True)]
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).parent)
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in ("initdb", "postgres")):
            return directory
    if os.environ.get("REQUIRE_POSTGRES"):
        pytest.fail("PostgreSQL's initdb/postgres are missing: `make test` installs Debian's "
                    "postgresql")
    pytest.skip("needs PostgreSQL's initdb and postgres (Debian package postgresql; "
                "`make test` installs it)")


class PostgresServer:
    """One private PostgreSQL cluster listening on 127.0.0.1 only (no Unix socket outside
    its own directory); ``close`` stops it and removes the directory."""

    def __init__(self) -> None:
        self.bindir = postgres_bindir()
        # Not under pytest's tmp_path: its parents are private to root, and the server
        # may run as another user.
        self.directory = Path(tempfile.mkdtemp(prefix="streamlease-pg-"))
        self.data = self.directory / "data"
        self.port = 0
        self.proc: Proc | None = None
        self.wrap: list[str] = []
        if os.geteuid() == 0:
            account = pwd.getpwnam(RUN_AS)
            os.chown(self.directory, account.pw_uid, account.pw_gid)
            self.wrap = [shutil.which("setpriv") or "setpriv", f"--reuid={account.pw_uid}",
                         f"--regid={account.pw_gid}", "--clear-groups"]

    def url(self, database: str = "postgres", password: str = PASSWORD, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return (f"postgres://{USER}:{password}@127.0.0.1:{self.port}/{database}"
                + (f"?{query}" if query else ""))

    def initdb(self) -> None:
        pwfile = self.directory / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self.wrap:
            os.chown(pwfile, pwd.getpwnam(RUN_AS).pw_uid, -1)
        pwfile.chmod(0o600)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}
        done = subprocess.run(
            [*self.wrap, str(self.bindir / "initdb"), "-D", str(self.data), "-U", USER,
             f"--pwfile={pwfile}", "--auth-host=scram-sha-256", "--auth-local=trust",
             "-E", "UTF8", "--no-sync", "--no-instructions"],
            env=env, cwd=self.directory, capture_output=True, text=True, timeout=120)
        pwfile.unlink()
        if done.returncode != 0:
            raise AssertionError(f"initdb failed ({done.returncode}): {done.stderr[-2000:]}")

    def start(self, timeout: float = 30.0) -> None:
        """Start on a free port; return once it accepts connections."""
        assert self.proc is None, "already running"
        if not self.data.exists():
            self.initdb()
        for _ in range(5):
            self.port = free_port()
            self.proc = Proc([*self.wrap, str(self.bindir / "postgres"), "-D", str(self.data),
                              "-p", str(self.port), "-k", str(self.directory),
                              "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
                              "-c", "full_page_writes=off", "-c", "logging_collector=off",
                              "-c", "log_min_messages=warning"],
                             env={"LC_ALL": "C.UTF-8"}, name=f"postgres:{self.port}")
            try:
                self._wait_ready(timeout)
                return
            except AssertionError:
                proc, self.proc = self.proc, None
                proc.stop()
                lines = proc.err_lines + proc.lines
                if not any("Address already in use" in line for line in lines):
                    raise
        raise AssertionError("postgres found no free loopback port in 5 tries")

    def _wait_ready(self, timeout: float) -> None:
        """``pg_isready`` in a loop, with a deadline, while the server lives."""
        assert self.proc is not None
        isready = str(self.bindir / "pg_isready")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.popen.poll() is not None:
                raise AssertionError(f"postgres exited ({self.proc.popen.returncode}): "
                                     f"{self.proc.err_lines[-20:]}")
            probe = subprocess.run([isready, "-q", "-h", "127.0.0.1", "-p", str(self.port),
                                    "-t", "1"], capture_output=True, timeout=10)
            if probe.returncode == 0:
                return
            time.sleep(0.05)  # polling a server that is still starting, with a deadline
        raise AssertionError(f"postgres did not accept connections within {timeout} s: "
                             f"{self.proc.err_lines[-20:]}")

    def close(self) -> None:
        """Fast shutdown (SIGINT: clients are disconnected), then remove the cluster."""
        if self.proc is not None:
            proc, self.proc = self.proc, None
            proc.signal(signal.SIGINT)
            try:
                proc.wait(30)
            finally:
                proc.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
