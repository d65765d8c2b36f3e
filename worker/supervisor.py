"""One held stream: the holder state machine, the heartbeat loop and the pump.

The supervisor feeds renew results to ``Holding`` (pure) and applies its decisions:

* lost (condition failed) or past the local deadline -> cancel the pump at once; no
  flush, no further write under this tenure;
* ``STOPPED``, shutdown, an item that can no longer be served -> stop reading, flush,
  release (shielded, under its own timeout; if it fails the lease simply expires);
* a changed ``ws_url`` -> reconnect.

A supervisor never lets an exception escape: one stream's failure never takes down
another stream or the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from worker.clock import Clock
from worker.core.lease import HolderState, Holding, LeaseTimings, RenewOutcome, StopReason
from worker.core.model import StreamRecord, Tenure
from worker.core.plan import item_problem
from worker.errors import SelfFenced, SinkConflict, StaleFence, StoreError
from worker.health import HealthState
from worker.logs import event
from worker.metrics import Metrics
from worker.pump import Pump, PumpSettings
from worker.store.dynamodb import DynamoStore


@dataclass(frozen=True)
class SupervisorSettings:
    timings: LeaseTimings
    allowed_urls: tuple[str, ...]
    pump: PumpSettings
    release_timeout_s: float = 5.0
    drain_timeout_s: float = 10.0


class Supervisor:
    def __init__(self, tenure: Tenure, record: StreamRecord, acquire_sent_at: float,
                 store: DynamoStore, clock: Clock, metrics: Metrics,
                 settings: SupervisorSettings, rng: random.Random | None = None,
                 on_delivered: Callable[[int], None] | None = None,
                 health: HealthState | None = None) -> None:
        self.tenure = tenure
        self.store = store
        self.clock = clock
        self.metrics = metrics
        self.settings = settings
        self.holding = Holding(tenure, record.ws_url or "", acquire_sent_at, settings.timings)
        self.pump = Pump(tenure, self.holding, store, clock, metrics, settings.pump, rng,
                         on_delivered)
        self._record = record
        self._wake = asyncio.Event()
        self._drain_reason: StopReason | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._pump_done = False
        self._failure: str | None = None
        self._health = health
        self._acquired_at = acquire_sent_at
        if health is not None:
            health.renewed(tenure.stream_id, acquire_sent_at)

    @property
    def stream(self) -> str:
        return self.tenure.stream_id

    def request_drain(self, reason: StopReason) -> None:
        """Ask the supervisor to flush and release (shutdown, rebalancing)."""
        if self._drain_reason is None:
            self._drain_reason = reason
        self._wake.set()

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception:
            # The last line of defence: log, count, and let the lease expire.
            event(logging.ERROR, "supervisor.crashed", "stream supervisor failed; the lease "
                  "will expire", stream=self.stream, fence=self.tenure.fence, exc_info=True)

    async def _run(self) -> None:
        problem = item_problem(self._record, self.settings.allowed_urls)
        if problem is not None:
            self.holding.begin_drain(StopReason.BAD_ITEM)
            await self._finish(problem)
            return
        async with asyncio.TaskGroup() as tg:
            self._pump_task = tg.create_task(self._run_pump())
            await self._heartbeat_loop()
            await self._stop_pump()
        await self._finish(self._failure)

    async def _run_pump(self) -> None:
        try:
            await self.pump.run()
        except StaleFence:
            self.metrics.stale_write_rejected()
            self.holding.on_stale_write()
            event(logging.WARNING, "sink.stale_fence", "sink refused a batch: fence is stale",
                  stream=self.stream, fence=self.tenure.fence)
        except SelfFenced:
            self.holding.check_deadline(self.clock.monotonic())
        except SinkConflict as exc:
            self._fail(f"sink conflict: {exc}")
        except StoreError as exc:
            self._fail(f"sink error: {exc}")
        except Exception as exc:
            event(logging.ERROR, "pump.crashed", "pump failed", stream=self.stream,
                  fence=self.tenure.fence, error=repr(exc))
            self._fail(f"pump failed: {exc!r}")
        finally:
            self._pump_done = True
            self._wake.set()

    def _fail(self, message: str) -> None:
        self._failure = message[:500]
        self.holding.begin_drain(StopReason.ERROR)

    async def _heartbeat_loop(self) -> None:
        timings = self.settings.timings
        next_renew = self.clock.monotonic() + timings.heartbeat_s
        while self.holding.state is HolderState.HOLDING:
            now = self.clock.monotonic()
            wait = min(next_renew, self.holding.deadline) - now
            # Check the flags before sleeping and clear the event only after: a drain
            # requested or a pump ended while a renew was in flight is never missed.
            if wait > 0 and self._drain_reason is None and not self._pump_done:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._wake.wait()
            self._wake.clear()
            now = self.clock.monotonic()
            if self._drain_reason is not None:
                self.holding.begin_drain(self._drain_reason)
                break
            if self.holding.check_deadline(now) or self.holding.state is not HolderState.HOLDING:
                break
            if self._pump_done:
                # The pump ended by itself without a terminal error: treat as a failure.
                if self.holding.state is HolderState.HOLDING:
                    self._fail("pump stopped unexpectedly")
                break
            if now < next_renew:
                continue
            next_renew = await self._renew_once()

    async def _renew_once(self) -> float:
        timings = self.settings.timings
        sent = self.clock.monotonic()
        timeout = max(0.05, min(timings.heartbeat_s, self.holding.deadline - sent))
        result = await self.store.renew(self.tenure, self.clock.wall_ms(), timings, timeout)
        now = self.clock.monotonic()
        self.metrics.heartbeat(now - sent, result.outcome.value)
        problem = None
        if result.record is not None:
            problem = item_problem(result.record, self.settings.allowed_urls)
            self._record = result.record
        decision = self.holding.on_renew(result.outcome, sent, now, result.record, problem)
        if result.outcome is RenewOutcome.RENEWED and self._health is not None:
            self._health.renewed(self.stream, sent)
        if result.outcome in (RenewOutcome.UNKNOWN, RenewOutcome.THROTTLED):
            event(logging.WARNING, "lease.renew_failed", "renew outcome unknown; retrying",
                  stream=self.stream, fence=self.tenure.fence, outcome=result.outcome.value,
                  error=result.error, retry_in_s=decision.retry_in,
                  deadline_in_s=round(self.holding.deadline - now, 3))
        if decision.reconnect:
            event(logging.INFO, "stream.url_changed", "ws_url changed; reconnecting",
                  stream=self.stream, fence=self.tenure.fence)
            await self.pump.reconnect("url_changed")
        if problem is not None and decision.state is HolderState.DRAINING:
            self._failure = problem
        if decision.retry_in is not None:
            return now + decision.retry_in
        return sent + timings.heartbeat_s

    async def _stop_pump(self) -> None:
        task = self._pump_task
        assert task is not None
        if not task.done():
            if self.holding.state is HolderState.DRAINING:
                await self.pump.stop()  # stop reading, flush, then return
                budget = self.settings.drain_timeout_s
            else:
                await self.pump.abort()  # lost or self-fenced: no new write, no flush
                budget = self.settings.pump.call_timeout_s
            try:
                async with asyncio.timeout(budget):
                    await asyncio.shield(task)
            except TimeoutError:
                event(logging.ERROR, "stream.stop_timeout", "pump did not stop in time",
                      stream=self.stream, fence=self.tenure.fence, state=self.holding.state)
                task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            # The pump's own cancellation is expected; ours (the shutdown budget ran out)
            # must propagate, or the process outlives STREAMLEASE_SHUTDOWN_SECONDS.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise

    async def _finish(self, problem: str | None) -> None:
        holding = self.holding
        reason = holding.reason
        fields: dict[str, Any] = {"stream": self.stream, "fence": self.tenure.fence,
                  "last_seq": self.pump.committed}
        self.metrics.lease_ended(self.clock.monotonic() - self._acquired_at)
        if holding.state is HolderState.LOST or holding.state is HolderState.SELF_FENCED:
            assert reason is not None
            self.metrics.lease_lost(reason)
            event(logging.WARNING, "lease.lost", "lease lost; stream stopped",
                  reason=reason.value, **fields)
            if holding.state is HolderState.SELF_FENCED:
                # Nothing more is written under this tenure; if the lease is still ours,
                # free it now rather than make the fleet wait for the expiry.
                await self._release(reason, fields, log=False)
            return
        assert reason is not None
        if problem is not None:
            if reason is StopReason.BAD_ITEM:
                self.metrics.bad_item("bad_state" if "desired_state" in problem else "bad_url")
            await self._record_error(problem)
        await self._release(reason, fields, log=True)

    async def _release(self, reason: StopReason, fields: dict[str, Any], log: bool) -> None:
        released = False
        try:
            async with asyncio.timeout(self.settings.release_timeout_s):
                released = await asyncio.shield(self.store.release(self.tenure))
        except (TimeoutError, StoreError) as exc:
            event(logging.WARNING, "lease.release_failed", "release failed; lease will expire",
                  error=str(exc), **fields)
            return
        self.holding.on_released()
        if released and log:
            self.metrics.lease_released(reason)
            event(logging.INFO, "lease.released", "lease released", reason=reason.value,
                  **fields)
        elif log:
            self.metrics.lease_lost(StopReason.CONDITION_FAILED)
            event(logging.WARNING, "lease.lost", "lease had moved on before release",
                  reason=StopReason.CONDITION_FAILED.value, **fields)

    async def _record_error(self, problem: str) -> None:
        if self._record.last_error == problem:
            return
        with contextlib.suppress(StoreError, TimeoutError):
            async with asyncio.timeout(self.settings.release_timeout_s):
                await self.store.record_error(self.stream, problem, self.clock.wall_ms())
        event(logging.WARNING, "stream.unservable", "stream cannot be served", problem=problem,
              stream=self.stream, fence=self.tenure.fence)
