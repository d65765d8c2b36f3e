"""Liveness and readiness: the pure state, the HTTP server's bounds (in-process, loopback),
and a real worker whose DynamoDB goes silent."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from streamlease.config import WorkerConfig
from streamlease.errors import ConfigError
from streamlease.health import HealthServer, HealthState, ServerLimits, serve
from tests.fleet.conftest import FleetFactory
from tests.fleet.harness import HoldingProxy, wait_until
from tests.procs import ROOT


def test_live_until_a_held_stream_goes_unrenewed_for_a_lease() -> None:
    h = HealthState(lease_s=2.0)
    assert h.live(100.0)[0]
    h.renewed("a", 99.0)
    h.renewed("b", 97.5)
    assert h.live(99.4)[0]
    ok, why = h.live(99.6)
    assert not ok and "2.1 s ago" in why
    h.dropped("b")
    assert h.live(99.6)[0]


def test_ready_only_between_start_and_drain() -> None:
    h = HealthState(lease_s=2.0)
    assert not h.ready()[0]
    h.started = True
    assert h.ready()[0]
    h.draining = True
    assert h.ready() == (False, "draining")


def status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0  # not listening yet, or gone


def healthcheck(port: int) -> int:
    env = {**os.environ, "STREAMLEASE_METRICS_PORT": str(port)}
    return subprocess.run([sys.executable, "-m", "streamlease", "healthcheck"], cwd=ROOT, env=env,
                          capture_output=True, timeout=30).returncode


async def test_healthz_fails_when_renewals_stop_and_readyz_while_draining(
        make_fleet: FleetFactory) -> None:
    fleet = make_fleet(streams=2, rate=10)
    await fleet.start(workers=0)
    proxy = HoldingProxy(int(fleet.dynamodb.rsplit(":", 1)[1]))
    try:
        worker = fleet.start_worker("w1", endpoint=proxy.endpoint,
                                    env={"STREAMLEASE_SHUTDOWN_SECONDS": "3"})
        port = worker.metrics_port
        await wait_until(lambda: fleet.all_owned(by={"w1"}), 30, "w1 holds both streams")

        async def code(path: str, want: int) -> bool:
            return status(port, path) == want
        await wait_until(lambda: code("/readyz", 200), 10, "ready")
        assert status(port, "/healthz") == 200 and healthcheck(port) == 0
        assert status(port, "/nope") == 404
        proxy.hold()  # DynamoDB goes silent for this worker: renewals stop
        await wait_until(lambda: code("/healthz", 503), 10, "liveness fails")
        assert healthcheck(port) == 1
        proxy.release()
        await wait_until(lambda: code("/healthz", 200), 10, "live again once it holds nothing")
        await wait_until(lambda: fleet.all_owned(by={"w1"}), 30, "w1 holds them again")
        proxy.hold()  # so the drain cannot finish at once and can be watched
        worker.proc.signal(signal.SIGTERM)
        await wait_until(lambda: code("/readyz", 503), 10, "not ready while draining")
    finally:
        proxy.release()
        proxy.close()


def test_healthcheck_without_a_worker_is_unhealthy() -> None:
    assert healthcheck(9) == 1
    env = {**os.environ, "STREAMLEASE_METRICS_PORT": "0"}
    result = subprocess.run([sys.executable, "-m", "streamlease", "healthcheck"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "STREAMLEASE_METRICS_PORT" in result.stderr


def exposition() -> tuple[bytes, str]:
    return b"streamlease_up 1\n", "text/plain; version=0.0.4"


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[HealthServer]:
    """An in-process server on a free loopback port; ``indirect`` params are
    ``ServerLimits``' fields (and ``address``)."""
    kwargs = dict(getattr(request, "param", {}))
    address = kwargs.pop("address", "127.0.0.1")
    state = HealthState(lease_s=2.0)
    started = serve(address, 0, state, exposition, ServerLimits(**kwargs))
    yield started
    started.close()


def get(host: str, port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def raw(port: int, data: bytes, host: str = "127.0.0.1") -> bytes:
    """Send ``data`` and read the whole answer (the server closes after one response)."""
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_serves_the_three_endpoints_and_nothing_else(server: HealthServer) -> None:
    assert get("127.0.0.1", server.port, "/healthz") == (200, b"ok: no streams held\n")
    assert get("127.0.0.1", server.port, "/readyz") == (503, b"starting\n")
    assert get("127.0.0.1", server.port, "/metrics?x=1") == (200, b"streamlease_up 1\n")
    assert get("127.0.0.1", server.port, "/nope")[0] == 404
    head = raw(server.port, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert raw(server.port, b"POST /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    huge = b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"
    assert raw(server.port, huge).startswith(b"HTTP/1.1 431")


@pytest.mark.parametrize("server", [{"header_timeout_s": 60.0, "max_connections": 64}],
                         indirect=True)
def test_idle_connections_neither_starve_healthz_nor_add_threads(server: HealthServer) -> None:
    threads = threading.active_count()
    idle: list[socket.socket] = []
    try:
        for i in range(200):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            if i % 2:
                sock.sendall(b"GET /heal")  # half a request line, never finished
            idle.append(sock)
        slowest = 0.0
        for _ in range(20):
            began = time.monotonic()
            assert get("127.0.0.1", server.port, "/healthz", timeout=2)[0] == 200
            slowest = max(slowest, time.monotonic() - began)
        print(f"slowest /healthz with 200 idle connections: {slowest * 1000:.1f} ms")
        assert slowest < 1.0
        assert threading.active_count() == threads  # one thread serves them all
        assert server.open_connections <= 64
        # The oldest idle connections were closed to make room.
        readable, _, _ = select.select(idle[:100], [], [], 2)
        assert len(readable) == 100 and all(closed_by_peer(s) for s in readable)
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize("server", [{"header_timeout_s": 0.5}], indirect=True)
def test_a_slow_loris_is_answered_408_and_closed_at_the_deadline(server: HealthServer) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"z" * 200
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        began = time.monotonic()
        answer = b""
        for byte in request:  # one byte every 50 ms: never a whole header in time
            sock.sendall(bytes([byte]))
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                answer = sock.recv(4096)
                break
        closed_after = time.monotonic() - began
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert 0.4 < closed_after < 2.0, closed_after


@pytest.mark.parametrize("server", [{"address": "127.0.0.2"}], indirect=True)
def test_binds_the_configured_address_only(server: HealthServer) -> None:
    assert server.address == "127.0.0.2"
    assert get("127.0.0.2", server.port, "/healthz")[0] == 200
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    env = {**os.environ, "STREAMLEASE_METRICS_PORT": str(server.port),
           "STREAMLEASE_METRICS_ADDRESS": "127.0.0.2"}
    check = subprocess.run([sys.executable, "-m", "streamlease", "healthcheck"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 0 and "ok" in check.stdout, check


def test_metrics_address_is_an_ip_literal() -> None:
    assert WorkerConfig.from_env({}).metrics_address == "0.0.0.0"
    assert WorkerConfig.from_env({"STREAMLEASE_METRICS_ADDRESS": "::1"}).metrics_address == "::1"
    for bad in ("localhost", "127.0.0.1:9108", "0.0.0.0/0", "256.0.0.1"):
        with pytest.raises(ConfigError) as err:
            WorkerConfig.from_env({"STREAMLEASE_METRICS_ADDRESS": bad})
        assert err.value.problems[0].startswith("STREAMLEASE_METRICS_ADDRESS: must be an IP")
