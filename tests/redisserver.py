"""A real ``redis-server`` (Debian's package) on a free loopback port, for the Redis
leader backend's tests.

``make test`` installs the package and sets ``REQUIRE_REDIS_SERVER=1``: a missing
binary then fails the tests. Run bare without it, they are skipped with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.procs import Proc

MIN_VERSION = (7, 0)  # PEXPIRETIME


def redis_server_binary() -> str:
    """The path of ``redis-server`` 7.0 or newer; skip or fail (see the module)."""
    path = shutil.which("redis-server")
    if path is None:
        if os.environ.get("REQUIRE_REDIS_SERVER"):
            pytest.fail("redis-server is missing: `make test` installs Debian's redis-server")
        pytest.skip("needs redis-server (Debian package redis-server; `make test` installs it)")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    found = re.search(r"v=(\d+)\.(\d+)", out)
    assert found, f"cannot read the version of {path}: {out!r}"
    version = (int(found[1]), int(found[2]))
    assert version >= MIN_VERSION, f"redis-server {version} is older than {MIN_VERSION}"
    return path


def redis_server_version() -> str:
    out = subprocess.run([redis_server_binary(), "--version"], capture_output=True, text=True,
                         check=True).stdout
    found = re.search(r"v=(\S+)", out)
    return found[1] if found else out.strip()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` bound to 127.0.0.1 with its data in ``directory``; it can be
    stopped and started again on the same port and directory."""

    def __init__(self, directory: Path, *, aof: bool = True, extra: tuple[str, ...] = ()
                 ) -> None:
        self.binary = redis_server_binary()
        self.directory = directory
        self.aof = aof
        self.extra = extra
        self.port = 0
        self.proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def args(self) -> list[str]:
        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if self.aof
                       else ["--appendonly", "no"])
        return [self.binary, "--bind", "127.0.0.1", "--port", str(self.port),
                "--protected-mode", "yes", "--daemonize", "no", "--dir", str(self.directory),
                "--save", "", "--logfile", "", *persistence, *self.extra]

    def start(self, timeout: float = 20.0) -> None:
        """Start (on a new free port the first time, the same port after) and return
        once it answers PING."""
        assert self.proc is None, "already running"
        fixed = self.port != 0
        for _ in range(1 if fixed else 5):
            if not fixed:
                self.port = free_port()
            self.proc = Proc(self.args(), name=f"redis-server:{self.port}")
            if self._wait_for_pong(timeout):
                return
            lines = self.proc.lines + self.proc.err_lines
            self.proc.stop()
            self.proc = None
            if fixed or not any("Address already in use" in line for line in lines):
                raise AssertionError(f"redis-server did not answer PING within {timeout} s: "
                                     f"{lines[-20:]}")
        raise AssertionError("redis-server found no free loopback port in 5 tries")

    def _wait_for_pong(self, timeout: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.popen.poll() is not None:
                return False
            if self.ping() == "+PONG":
                return True
            time.sleep(0.02)  # polling a server that is still starting, with a deadline
        return False

    def ping(self) -> str | None:
        """The first line of the answer to PING, or None if nothing answers."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(256).split(b"\r\n", 1)[0].decode()
        except OSError:
            return None

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop it (SIGTERM: a clean shutdown; SIGKILL: a crash); its exit code."""
        assert self.proc is not None, "not running"
        proc, self.proc = self.proc, None
        if sig == signal.SIGKILL:
            proc.kill()
            return proc.stop()
        proc.signal(sig)
        return proc.wait(20)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
