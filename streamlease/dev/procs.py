"""Child processes for ``make run`` and the load test: servers that print ``listening on
URL`` once bound, and workers."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path


class Child:
    """A child process in its own session; stderr to ``log`` (or discarded)."""

    def __init__(self, name: str, args: list[str], env: Mapping[str, str],
                 log: Path | None = None) -> None:
        self.name = name
        self.log_path = log
        self._log = log.open("ab") if log is not None else None
        self.popen = subprocess.Popen(args, env=dict(env), stdout=subprocess.PIPE,
                                      stderr=self._log or subprocess.DEVNULL,
                                      start_new_session=True)

    def listening_url(self, timeout: float = 30.0) -> str:
        assert self.popen.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.popen.stdout.readline().decode()
            if line.startswith("listening on "):
                return line.split("listening on ", 1)[1].strip()
            if not line and self.popen.poll() is not None:
                break
        where = f"; see {self.log_path}" if self.log_path else ""
        raise RuntimeError(f"{self.name} did not start{where}")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        if self.alive():
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        if self._log is not None:
            self._log.close()
        return self.popen.returncode
