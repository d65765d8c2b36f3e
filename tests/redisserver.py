"""A real ``redis-server`` (Debian's package) on a free loopback port, for the Redis
leader backend's tests; ``replica_of`` starts one replicating another, for failovers.

Where ``make test`` can install the package (as root where apt-get exists) it does, and
sets ``REQUIRE_REDIS_SERVER=1``: a missing binary then fails the tests. Elsewhere, and run
bare, they are skipped with the reason.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from streamlease.dev.procs import free_port
from tests.procs import Proc

MIN_VERSION = (7, 0)  # PEXPIRETIME


def redis_server_binary() -> str:
    """The path of ``redis-server`` 7.0 or newer; skip or fail (see the module)."""
    path = shutil.which("redis-server")
    if path is None:
        if os.environ.get("REQUIRE_REDIS_SERVER"):
            pytest.fail("redis-server is missing: `make test` installs Debian's redis-server")
        pytest.skip("needs redis-server (Debian package redis-server; `make test` installs it "
                    "as root on Debian)")
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

    def command(self, *args: Any) -> Any:
        """One command on a fresh connection, its answer parsed (``INFO`` as a dict)."""
        with redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True,
                         socket_timeout=5, socket_connect_timeout=5) as client:
            return client.execute_command(*args)

    def info(self, section: str = "replication") -> dict[str, Any]:
        return dict(self.command("INFO", section))

    def wait_replicating(self, primary: RedisServer, timeout: float = 20.0) -> None:
        """Return once this replica's link to ``primary`` is up and it has processed
        everything ``primary`` had written when the call started."""
        target = int(primary.info()["master_repl_offset"])
        deadline = time.monotonic() + timeout
        while True:
            info = self.info()
            if info.get("master_link_status") == "up" and \
                    int(info.get("slave_repl_offset", -1)) >= target:
                return
            assert time.monotonic() < deadline, \
                f"replica :{self.port} not caught up with :{primary.port} in {timeout} s: {info}"
            time.sleep(0.02)  # polling replication state, with a deadline

    def promote(self, timeout: float = 20.0) -> None:
        """``REPLICAOF NO ONE``; return once it reports itself a primary."""
        assert self.command("REPLICAOF", "NO", "ONE") in ("OK", True)
        deadline = time.monotonic() + timeout
        while self.info().get("role") != "master":
            assert time.monotonic() < deadline, f"replica :{self.port} was not promoted"
            time.sleep(0.02)  # polling the role, with a deadline

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


def replica_of(primary: RedisServer, directory: Path, *, via: Link | None = None
               ) -> RedisServer:
    """A second ``redis-server`` (no persistence) replicating ``primary`` (through the
    relay ``via`` if given), started and caught up. The primary should run with
    ``--repl-diskless-sync-delay 0`` so the first sync does not wait five seconds for
    more replicas."""
    port = primary.port if via is None else via.port
    replica = RedisServer(directory, aof=False, extra=("--replicaof", "127.0.0.1", str(port)))
    replica.start()
    try:
        replica.wait_replicating(primary)
    except BaseException:
        replica.close()
        raise
    return replica


class Link:
    """A TCP relay on loopback, standing for the network between a replica and its
    primary. ``hold()`` is a partition that leaves both connections open: bytes stay
    unread in the relay, so the primary still counts the replica as connected but
    receives no acknowledgement, and the replica receives nothing. ``release()`` lets
    them through; ``cut()`` resets both sides and drops whatever was held."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.peers: dict[socket.socket, socket.socket] = {}
        self.held = threading.Event()
        self.closing = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._relay, name=f"link:{self.port}",
                                       daemon=True)
        self.thread.start()

    def _relay(self) -> None:
        while not self.closing.is_set():
            with self.lock:
                watched = [self.listener] if self.listener.fileno() != -1 else []
                watched += [] if self.held.is_set() else list(self.peers)
            try:
                readable, _, _ = select.select(watched, [], [], 0.05)
            except (OSError, ValueError):  # closed by cut() meanwhile: look again
                continue
            with self.lock:
                for sock in readable:
                    if sock is self.listener:
                        if sock.fileno() != -1:
                            self._accept()
                    elif sock in self.peers and not self.held.is_set():
                        self._forward(sock)

    def _accept(self) -> None:
        inbound, _ = self.listener.accept()
        try:
            outbound = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
        except OSError:
            inbound.close()
            return
        self.peers[inbound] = outbound
        self.peers[outbound] = inbound

    def _forward(self, sock: socket.socket) -> None:
        other = self.peers[sock]
        try:
            data = sock.recv(65536)
            if data:
                other.sendall(data)
                return
        except OSError:
            pass
        self._drop(sock, reset=False)

    def _drop(self, sock: socket.socket, *, reset: bool) -> None:
        other = self.peers.pop(sock)
        self.peers.pop(other, None)
        for s in (sock, other):
            if reset:  # an RST, and whatever the kernel still buffers is discarded
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()

    def hold(self) -> None:
        with self.lock:
            self.held.set()

    def release(self) -> None:
        with self.lock:
            self.held.clear()

    def cut(self) -> None:
        """Reset every connection now, held bytes dropped; later ones are refused."""
        with self.lock:
            self.listener.close()
            while self.peers:
                self._drop(next(iter(self.peers)), reset=True)
            self.held.clear()

    def close(self) -> None:
        if not self.closing.is_set():
            self.cut()
            self.closing.set()
            self.thread.join(5)
