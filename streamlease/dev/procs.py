"""Child processes for ``make run`` and the load test: servers that print ``listening on
URL`` once bound, and workers.

Every child runs in a session of its own, so a terminal's signals (Ctrl-C, a closed
terminal's SIGHUP) reach only the parent, which stops its children in the order it
chooses. With ``death_signal`` the kernel sends a child that signal when its parent dies
without stopping it (SIGKILL, a crash): on Linux, ``PR_SET_PDEATHSIG``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class Interrupted(RuntimeError):
    """Waiting for a child was given up because the caller was asked to stop."""


def _never() -> bool:
    return False


def _death_signal(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the kernel send ``sig`` to the child when the thread that
    started it exits; None where the kernel has no such thing (not Linux).

    The kernel ties the signal to the *thread* that forked, so start such children from a
    thread that lives as long as the parent (the main thread). If the parent died between
    ``fork`` and ``prctl``, the child has already been re-parented and exits at once."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl  # resolved here, in the parent: nothing is loaded after fork
    parent = os.getpid()

    def preexec() -> None:
        if prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            os._exit(127)
        if os.getppid() != parent:
            os._exit(128 + sig)

    return preexec


class Child:
    """A child process in its own session; stdin from /dev/null, stderr to ``log`` (or
    discarded), stdout a pipe for ``listening_url`` (or, with ``capture=False``, into the
    log too: a child whose stdout nobody reads, such as a worker with the ``stdout``
    sink, must not block on a full pipe)."""

    def __init__(self, name: str, args: list[str], env: Mapping[str, str],
                 log: Path | None = None, *, death_signal: int | None = None,
                 capture: bool = True) -> None:
        self.name = name
        self.log_path = log
        self._log = log.open("ab") if log is not None else None
        stdout = subprocess.PIPE if capture else (self._log or subprocess.DEVNULL)
        self.popen = subprocess.Popen(
            args, env=dict(env), stdin=subprocess.DEVNULL, stdout=stdout,
            stderr=self._log or subprocess.DEVNULL, start_new_session=True,
            preexec_fn=None if death_signal is None else _death_signal(death_signal))
        self._stdout = b""

    @property
    def pid(self) -> int:
        return self.popen.pid

    def listening_url(self, timeout: float = 30.0,
                      stop: Callable[[], bool] = _never) -> str:
        """The URL from the child's ``listening on URL`` line. Raises RuntimeError if the child
        exits or says nothing within ``timeout``, Interrupted as soon as ``stop()`` is true
        (checked at least every 0.1 s)."""
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if stop():
                raise Interrupted(f"{self.name}: stopped while starting")
            ready, _, _ = select.select([fd], [], [], min(0.1, left))
            if not ready:
                continue
            chunk = os.read(fd, 4096)
            *lines, self._stdout = (self._stdout + chunk).split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                if text.startswith("listening on "):
                    return text.split("listening on ", 1)[1].strip()
            if not chunk:
                break
        where = f"; see {self.log_path}" if self.log_path else ""
        raise RuntimeError(f"{self.name} did not start{where}")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def send(self, sig: int) -> None:
        """Send ``sig`` unless the child has already been reaped."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        """``sig``, wait up to ``timeout`` seconds, then SIGKILL; the exit code."""
        stop_all([self], sig, timeout)
        return self.popen.returncode

    def close(self) -> None:
        if self._log is not None:
            self._log.close()


def stop_all(children: Iterable[Child], sig: int = signal.SIGTERM, timeout: float = 15.0,
             cut_short: Callable[[], bool] = _never) -> None:
    """Send ``sig`` to every child at once, wait until all have exited, ``timeout`` seconds
    have passed or ``cut_short()`` is true, then SIGKILL whoever is left and reap them."""
    children = list(children)
    for child in children:
        child.send(sig)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not cut_short():
        running = [c for c in children if c.alive()]
        if not running:
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            running[0].popen.wait(min(0.05, max(0.0, deadline - time.monotonic())))
    for child in children:
        child.send(signal.SIGKILL)
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.popen.wait(5)
        child.close()


_PORTS = random.Random()


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``
    starts at 32768 by default), for a child told to listen on it: an ephemeral pick,
    released and bound again later by the child, can meanwhile become some client socket's
    source port (the child then cannot listen and exits)."""
    for _ in range(200):
        port = _PORTS.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port between 20000 and 32000")


def carrying(name: str, value: str) -> set[int]:
    """The pids of this user's processes whose environment holds ``name=value``: how a
    tool that marks its children (they inherit the mark) finds any it left behind."""
    want = f"{name}={value}".encode()
    found = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/environ", "rb") as environ:
                    if want in environ.read().split(b"\0"):
                        found.add(int(entry.name))
            except OSError:
                continue
    return found
