"""`streamlease run` as a process: configuration errors, missing tables, worker identity,
signals and the shutdown budget."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from streamlease.dev import local_aws_env
from tests.fleet.conftest import FleetFactory
from tests.fleet.harness import HoldingProxy, wait_until
from tests.procs import ROOT


def run_once(env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    import os
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-m", "streamlease", "run"], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(("env", "names"), [
    ({"STREAMLEASE_HEARTBEAT_SECONDS": "10"}, ["STREAMLEASE_HEARTBEAT_SECONDS"]),
    ({"STREAMLEASE_LEASE_SECONDS": "soon", "STREAMLEASE_MAX_STREAMS": "-1"},
     ["STREAMLEASE_LEASE_SECONDS", "STREAMLEASE_MAX_STREAMS"]),
    ({"STREAMLEASE_ALLOWED_URLS": "http://x"}, ["STREAMLEASE_ALLOWED_URLS"]),
    ({"STREAMLEASE_LOG_FORMAT": "yaml"}, ["STREAMLEASE_LOG_FORMAT"]),
])
def test_bad_configuration_exits_2_before_any_io(env: dict[str, str], names: list[str]) -> None:
    # An endpoint nobody listens on: reaching it would hang or fail differently.
    result = run_once({**local_aws_env("http://127.0.0.1:9"), **env})
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    for name in names:
        assert name in result.stderr


def test_missing_tables_exit_1_with_the_fix(dynamodb_endpoint: str) -> None:
    result = run_once({**local_aws_env(dynamodb_endpoint), "STREAMLEASE_TABLE": "no-such-table",
                       "STREAMLEASE_METRICS_PORT": "0"})
    assert result.returncode == 1
    assert "table create" in result.stderr


@pytest.fixture
def ecs_metadata() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"TaskARN": "arn:aws:ecs:eu-west-1:1:task/prod/0f1e2d3c4b5a"})
            self.send_response(200 if self.path.endswith("/task") else 404)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v4/abc"
    server.shutdown()


async def test_worker_id_comes_from_ecs_task_metadata(make_fleet: FleetFactory,
                                                      ecs_metadata: str) -> None:
    fleet = make_fleet(streams=1)
    await fleet.start(workers=0)
    worker = fleet.start_worker("ignored", env={"STREAMLEASE_WORKER_ID": "",
                                               "ECS_CONTAINER_METADATA_URI_V4": ecs_metadata})
    line = worker.proc.wait_for_line('{"ts"', stderr=True)
    assert json.loads(line)["worker"] == "0f1e2d3c4b5a"
    await wait_until(lambda: fleet.all_owned(by={"0f1e2d3c4b5a"}), 30, "owned by the task id")


async def held_worker(make_fleet: FleetFactory, shutdown_s: str) -> tuple[object, HoldingProxy]:
    fleet = make_fleet(streams=2, rate=20)
    await fleet.start(workers=0)
    proxy = HoldingProxy(int(fleet.dynamodb.rsplit(":", 1)[1]))
    worker = fleet.start_worker("w1", endpoint=proxy.endpoint,
                                env={"STREAMLEASE_SHUTDOWN_SECONDS": shutdown_s,
                                     "STREAMLEASE_LEASE_SECONDS": "30",
                                     "STREAMLEASE_HEARTBEAT_SECONDS": "5",
                                     "STREAMLEASE_SAFETY_MARGIN_SECONDS": "1",
                                     "STREAMLEASE_STREAM_LEASE_SECONDS": "60",
                                     "STREAMLEASE_STREAM_RENEW_SECONDS": "20"})
    await wait_until(lambda: fleet.all_owned(by={"w1"}), 30, "w1 holds both streams")
    proxy.hold()  # DynamoDB stops answering this worker: its drain cannot finish
    return worker, proxy


async def test_a_second_signal_exits_at_once(make_fleet: FleetFactory) -> None:
    worker, proxy = await held_worker(make_fleet, shutdown_s="60")
    try:
        proc = worker.proc  # type: ignore[attr-defined]
        proc.signal(signal.SIGTERM)
        proc.wait_for_line('{"ts"', stderr=True)
        await wait_until(lambda: _has_event(proc, "worker.draining"), 10, "draining")
        proc.signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=10) == 1
        assert time.monotonic() - started < 5
    finally:
        proxy.release()
        proxy.close()


async def test_the_shutdown_budget_bounds_a_stuck_drain(make_fleet: FleetFactory) -> None:
    worker, proxy = await held_worker(make_fleet, shutdown_s="1.5")
    try:
        proc = worker.proc  # type: ignore[attr-defined]
        proc.signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 1
        await wait_until(lambda: _has_event(proc, "worker.drain_timeout"), 5, "timeout logged")
    finally:
        proxy.release()
        proxy.close()


async def _has_event(proc: object, name: str) -> bool:
    return any(f'"event":"{name}"' in line for line in proc.err_lines)  # type: ignore[attr-defined]


def catches(pid: int, sig: int) -> bool:
    """Whether the process has a handler installed for ``sig`` (Linux: /proc's SigCgt)."""
    with open(f"/proc/{pid}/status") as status:
        mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    return bool(mask >> (sig - 1) & 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
async def test_a_signal_while_starting_stops_the_worker_cleanly(
        make_fleet: FleetFactory) -> None:
    """A deploy may stop a task while it is still starting: the worker must not die of the
    signal's default action (exit -15) but stop, holding nothing, with exit 0."""
    fleet = make_fleet(streams=1)
    await fleet.start(workers=0)
    proxy = HoldingProxy(int(fleet.dynamodb.rsplit(":", 1)[1]))
    proxy.hold()  # DynamoDB never answers: the start-up table check waits
    try:
        worker = fleet.start_worker("w1", endpoint=proxy.endpoint)
        proc = worker.proc

        async def starting() -> bool:  # its first request held, its handler installed
            return bool(proxy.held_bytes()) and catches(proc.popen.pid, signal.SIGTERM)
        await wait_until(starting, 30, "w1 starting, with a handler for SIGTERM")
        proc.signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, proc.err_lines[-10:]
        assert await _has_event(proc, "worker.stopped")
    finally:
        proxy.release()
        proxy.close()
