"""Start and stop real processes for tests: servers that print ``listening on URL``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """A child process whose stdout/stderr are collected by a reader thread."""

    def __init__(self, args: list[str], env: Mapping[str, str] | None = None,
                 name: str = "") -> None:
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.name = name or args[0]
        self.popen = subprocess.Popen(
            args, env=full_env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )
        self.lines: list[str] = []
        self.err_lines: list[str] = []
        self._cond = threading.Condition()
        self._threads = [
            threading.Thread(target=self._pump, args=(self.popen.stdout, self.lines), daemon=True),
            threading.Thread(target=self._pump, args=(self.popen.stderr, self.err_lines),
                             daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _pump(self, stream: object, sink: list[str]) -> None:
        assert stream is not None
        for line in stream:  # type: ignore[attr-defined]
            with self._cond:
                sink.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for_line(self, prefix: str, timeout: float = 30.0, stderr: bool = False) -> str:
        source = self.err_lines if stderr else self.lines
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in source:
                    if line.startswith(prefix):
                        return line
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.popen.poll() is not None and not self._more(source)):
                    raise AssertionError(
                        f"{self.name}: no line starting {prefix!r} within {timeout} s; "
                        f"exit={self.popen.poll()} stdout={self.lines[-20:]} "
                        f"stderr={self.err_lines[-20:]}")
                self._cond.wait(min(remaining, 0.2))

    def _more(self, source: list[str]) -> bool:
        return any(t.is_alive() for t in self._threads)

    def url(self, timeout: float = 30.0) -> str:
        return self.wait_for_line("listening on ", timeout).split("listening on ", 1)[1].strip()

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)

    def stop(self, timeout: float = 10.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._kill_strays()
        for t in self._threads:
            t.join(2)
        return self.popen.returncode

    def _kill_strays(self) -> None:
        """Whatever the process left in its session (it was started in a new one): a
        wrapper's child must not outlive the test."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)

    def wait(self, timeout: float = 30.0) -> int:
        """Wait for the process to exit by itself; its exit code."""
        code = self.popen.wait(timeout)
        for t in self._threads:
            t.join(2)
        return code

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)
        self._kill_strays()


def python(*args: str) -> list[str]:
    return [sys.executable, *args]
