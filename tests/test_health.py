"""Liveness and readiness: the pure state, and a real worker whose DynamoDB goes silent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

from tests.fleet.conftest import FleetFactory
from tests.fleet.harness import HoldingProxy, wait_until
from tests.procs import ROOT
from worker.health import HealthState


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
    return subprocess.run([sys.executable, "-m", "worker", "healthcheck"], cwd=ROOT, env=env,
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
    result = subprocess.run([sys.executable, "-m", "worker", "healthcheck"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "STREAMLEASE_METRICS_PORT" in result.stderr
