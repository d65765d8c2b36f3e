"""Composition root for ``streamlease run``: build everything, handle signals, drain in order.

Order on SIGTERM/SIGINT: stop acquiring; every supervisor stops reading, flushes,
checkpoints and releases; then the process exits 0. If that does not finish within
``STREAMLEASE_SHUTDOWN_SECONDS`` the worker exits 1 (leases it still holds expire on
their own). A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import urllib.request

import uvloop

from worker import __version__
from worker import health as http
from worker.clock import SYSTEM_CLOCK, Clock
from worker.config import WorkerConfig, default_worker_id
from worker.errors import ConfigError, StoreError
from worker.health import HealthState
from worker.logs import CONTEXT, event, setup
from worker.metrics import Metrics
from worker.pump import PumpSettings
from worker.reconciler import Reconciler, ReconcilerSettings
from worker.store.dynamodb import DynamoStore
from worker.supervisor import SupervisorSettings


def resolve_worker_id(config: WorkerConfig) -> str:
    """STREAMLEASE_WORKER_ID, else the ECS task id, else hostname-pid."""
    if config.worker_id:
        return config.worker_id
    base = os.environ.get("ECS_CONTAINER_METADATA_URI_V4")
    if base:
        try:
            with urllib.request.urlopen(base.rstrip("/") + "/task", timeout=2) as resp:
                arn = json.load(resp).get("TaskARN", "")
            if arn:
                return str(arn).rsplit("/", 1)[-1]
        except (OSError, ValueError) as exc:
            event(logging.WARNING, "worker.ecs_metadata_failed",
                  "cannot read the ECS task id; using hostname-pid", error=str(exc))
    return default_worker_id()


def build_settings(config: WorkerConfig, owner: str) -> ReconcilerSettings:
    timings = config.timings
    call_timeout = max(1.0, min(10.0, timings.lease_s / 2))
    # A sink write is not bounded by the lease: the fence, not a timeout, keeps a late
    # write safe, and waiting for its answer tells a stale holder that it was refused.
    pump = PumpSettings(
        batch_max_messages=config.batch_max_messages, batch_max_s=config.batch_max_s,
        max_frame_bytes=config.max_frame_bytes, max_seq_jump=config.max_seq_jump,
        stall_s=config.stall_s, call_timeout_s=10.0,
        reconnect_cap_s=max(1.0, min(30.0, timings.lease_s)),
        stable_after_s=max(1.0, timings.lease_s / 4),
    )
    supervisor = SupervisorSettings(
        timings=timings, allowed_urls=config.allowed_urls, pump=pump,
        release_timeout_s=call_timeout, drain_timeout_s=max(1.0, config.shutdown_s / 2),
    )
    return ReconcilerSettings(
        owner=owner, reconcile_s=config.reconcile_s, sweep_s=config.sweep_s,
        max_streams=config.max_streams, acquire_per_cycle=config.acquire_per_cycle,
        supervisor=supervisor,
    )


async def serve(config: WorkerConfig, owner: str, clock: Clock = SYSTEM_CLOCK) -> int:
    metrics = Metrics()
    metrics.set_capacity(config.max_streams)
    health = HealthState(config.timings.lease_s)
    if config.metrics_port:
        try:
            http.serve(config.metrics_port, health, metrics.exposition)
        except OSError as exc:
            print(f"streamlease: STREAMLEASE_METRICS_PORT: cannot listen on "
                  f"{config.metrics_port}: {exc}", file=sys.stderr)
            return 1
    settings = build_settings(config, owner)
    async with DynamoStore.connect(
        config.table, config.events_table,
        max_connections=min(1000, 2 * config.max_streams + 10),
        observe=metrics.dynamodb_request,
        call_timeout_s=settings.supervisor.release_timeout_s,
    ) as store:
        # Fail fast, with a clear line, if the tables are missing or unreachable.
        await store.check_tables()
        reconciler = Reconciler(store, clock, metrics, settings, health=health)
        loop = asyncio.get_running_loop()
        signals_seen = 0

        def on_signal(signum: int) -> None:
            nonlocal signals_seen
            signals_seen += 1
            if signals_seen > 1:
                event(logging.WARNING, "worker.exit_now", "second signal: exiting at once",
                      signal=signal.Signals(signum).name)
                os._exit(1)
            event(logging.INFO, "worker.draining", "draining: releasing every lease",
                  signal=signal.Signals(signum).name, leases=len(reconciler.supervisors))
            metrics.draining(True)
            health.draining = True
            reconciler.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        t = config.timings
        event(logging.INFO, "worker.started", "worker started", version=__version__,
              table=config.table, events_table=config.events_table, lease_s=t.lease_s,
              heartbeat_s=t.heartbeat_s, skew_margin_s=t.skew_margin_s,
              safety_margin_s=t.safety_margin_s,
              self_fence_after_s=round(t.lease_s - t.safety_margin_s, 3),
              reconcile_s=config.reconcile_s, sweep_s=config.sweep_s,
              max_streams=config.max_streams, metrics_port=config.metrics_port,
              allowed_urls=list(config.allowed_urls))
        health.started = True
        return await _run_until_drained(reconciler, config.shutdown_s, metrics, clock)


async def _watch_loop_lag(metrics: Metrics, clock: Clock, period: float = 0.5) -> None:
    """Sample how late the loop wakes a timer: a busy or blocked loop shows here first."""
    while True:
        before = clock.monotonic()
        await clock.sleep(period)
        metrics.loop_lag(clock.monotonic() - before - period)


async def _run_until_drained(reconciler: Reconciler, shutdown_s: float, metrics: Metrics,
                             clock: Clock) -> int:
    """Run the reconciler until a signal; then give the drain ``shutdown_s`` seconds."""
    async with asyncio.TaskGroup() as tg:
        lag_task = tg.create_task(_watch_loop_lag(metrics, clock))
        run_task = tg.create_task(reconciler.run())
        stop_task = tg.create_task(reconciler.stopping.wait())
        await asyncio.wait({run_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
        stop_task.cancel()
        lag_task.cancel()
        if run_task.done() and not reconciler.stopping.is_set():
            event(logging.ERROR, "worker.failed", "the reconciler stopped by itself")
            return 1
        try:
            async with asyncio.timeout(shutdown_s):
                await asyncio.shield(run_task)
        except TimeoutError:
            event(logging.ERROR, "worker.drain_timeout",
                  "STREAMLEASE_SHUTDOWN_SECONDS ran out; remaining leases will expire",
                  leases=len(reconciler.supervisors))
            run_task.cancel()
            return 1
    if reconciler.unreleased:
        event(logging.ERROR, "worker.stopped", "exiting; some leases could not be released "
              "and will expire", unreleased=reconciler.unreleased)
        return 1
    event(logging.INFO, "worker.stopped", "every lease released; exiting")
    return 0


def run_worker() -> int:
    try:
        config = WorkerConfig.from_env()
    except ConfigError as exc:
        print(f"streamlease: {exc}", file=sys.stderr)
        return 2
    setup(config.log_format, config.log_level)
    owner = resolve_worker_id(config)
    CONTEXT.worker = owner
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(serve(config, owner))
    except ConfigError as exc:
        print(f"streamlease: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"streamlease: DynamoDB: {exc}", file=sys.stderr)
        return 1
