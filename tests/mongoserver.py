"""A real MongoDB wire server on a free loopback port, for the MongoDB leader backend's and
sink's tests: SecantusDB (PyPI ``secantusdb``, the WiredTiger engine inside, in the
``test`` extra that ``make test`` installs), run as its own process with its data in a
directory, so that it can be killed and started again on the same port and data.

It advertises itself as a one-member replica set: transactions and majority write concern
work as on a replica set's primary; elections and failover do not exist.
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

from streamlease.dev.procs import free_port
from tests.procs import Proc

READY = "listening on"


class MongoServer:
    """One SecantusDB server bound to 127.0.0.1 with its WiredTiger home in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = 0
        self.proc: Proc | None = None

    def url(self, database: str = "streamlease") -> str:
        return f"mongodb://127.0.0.1:{self.port}/{database}"

    def args(self) -> list[str]:
        return [sys.executable, "-m", "secantus", "--host", "127.0.0.1", "--port",
                str(self.port), "--storage-path", str(self.directory / "data"),
                "--log-level", "WARNING"]

    def start(self, timeout: float = 30.0) -> None:
        """Start (on a new free port the first time, the same port after) and return once
        it accepts connections."""
        assert self.proc is None, "already running"
        fixed = self.port != 0
        for _ in range(1 if fixed else 5):
            if not fixed:
                self.port = free_port()
            self.proc = Proc(self.args(), name=f"secantusdb:{self.port}")
            if self._wait_accepting(timeout):
                return
            lines = self.proc.lines + self.proc.err_lines
            self.proc.stop()
            self.proc = None
            if fixed or not any("in use" in line for line in lines):
                raise AssertionError(f"the MongoDB wire server did not start within "
                                     f"{timeout} s: {lines[-20:]}")
        raise AssertionError("the MongoDB wire server found no free loopback port in 5 tries")

    def _wait_accepting(self, timeout: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.popen.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0):
                    return True
            except OSError:
                time.sleep(0.02)  # polling a server that is still starting, with a deadline
        return False

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop it (SIGTERM: a clean shutdown; SIGKILL: a crash); its exit code."""
        assert self.proc is not None, "not running"
        proc, self.proc = self.proc, None
        if sig == signal.SIGKILL:
            proc.kill()
            return proc.stop()
        proc.signal(sig)
        return proc.wait(30)

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None
