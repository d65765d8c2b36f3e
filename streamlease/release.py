"""The end of one tenure: its output closed, its ``last_error`` written, its lease released.

The release is retried with backoff until its budget runs out (a shutdown's deadline, or
the tenure's own deadline, after which the lease frees itself), each attempt waiting its
turn at the worker's release gate; calls run shielded, so one in flight still lands if its
caller is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from streamlease import tracing
from streamlease.context import Context
from streamlease.core.backoff import Backoff
from streamlease.core.lease import CleanRelease, HolderState, StopReason
from streamlease.core.model import error_text
from streamlease.errors import StoreError
from streamlease.logs import event
from streamlease.tenancy import SupervisorSettings, Tenancy

T = TypeVar("T")


class Release:
    def __init__(self, ctx: Context, settings: SupervisorSettings, tenancy: Tenancy,
                 gate: asyncio.Semaphore) -> None:
        self.ctx = ctx
        self.settings = settings
        self.tenancy = tenancy
        self.gate = gate  # shared by every supervisor of the worker: releases in flight

    async def close_output(self, reason: StopReason | None) -> None:
        """The tenure's processor ``stop``: after the last flush, before the release (a
        lost tenure's processor hears ``lost`` and must not write). Bounded, never raises."""
        tenancy, clock = self.tenancy, self.ctx.clock
        public = processor_reason(reason, tenancy.holding.state)
        budget = self.settings.drain_timeout_s
        if tenancy.release_by is not None:
            # A shutdown: leave the release its call within the budget.
            budget = min(budget, max(0.1, tenancy.release_by - clock.monotonic()
                                     - self.settings.call_timeout_s))
        try:
            async with asyncio.timeout(budget):
                await self.ctx.sink.close(tenancy.tenure, public)
        except Exception:
            self.ctx.metrics.task_crashed("pump")
            event(logging.ERROR, "processor.stop_failed", "closing the stream's output failed",
                  stream=tenancy.stream, fence=tenancy.tenure.fence, reason=public,
                  exc_info=True)

    async def release(self, reason: StopReason, fields: dict[str, Any], log: bool,
                      clean_seq: int | None = None) -> None:
        """Release, retried with backoff until the budget: the shutdown deadline if one was
        given, else the tenure's own deadline (after it the lease frees itself). With
        ``clean_seq`` (the final flush wrote that checkpoint) the release leaves the mark
        that lets the next holder resume without reading the sink. Each
        attempt waits its turn at the worker's release gate: a drain of hundreds of streams
        would otherwise put every release in the store's queue at once, ahead of the
        member heartbeat (which then times out, and the worker self-fences mid-drain)."""
        tenancy, clock, metrics = self.tenancy, self.ctx.clock, self.ctx.metrics
        tenure, stream = tenancy.tenure, tenancy.stream
        retry = Backoff(0.05, 1.0, self.ctx.rng)
        attempt = 0
        while True:
            attempt += 1
            async with self.gate:
                # Read each attempt, once its turn came: a shutdown that starts meanwhile
                # brings its own budget, and the wait for the gate spent some of it.
                by = tenancy.release_by if tenancy.release_by is not None \
                    else tenancy.holding.deadline
                remaining = by - clock.monotonic()
                timeout = max(0.05, min(self.settings.call_timeout_s, remaining))
                try:
                    # A trace of its own (linked to the acquisition's); its context goes on
                    # the item in the same write, for the next holder's acquisition to link
                    # to.
                    with tracing.span("release", root=True, stream=stream,
                                      fence=tenure.fence, reason=reason.value,
                                      attempt=attempt) as span:
                        clean = None if clean_seq is None else \
                            CleanRelease(tenure.fence, clean_seq, clock.wall_ms())
                        released = await shielded(
                            self.ctx.leases.release(tenure, timeout,
                                                    trace_parent=tracing.traceparent_of(span),
                                                    clean=clean),
                            timeout, f"release {stream}")
                        tracing.set_attributes(span, released=released,
                                               clean=released and clean is not None)
                    break
                except (TimeoutError, StoreError) as exc:
                    failure = str(exc) or "timeout"
            # Backing off outside the gate: a failed release does not hold up the others.
            delay = retry.next_delay()
            if clock.monotonic() + delay >= by:
                event(logging.WARNING, "lease.release_failed",
                      "release failed; the lease will expire", error=failure,
                      attempts=attempt, **fields)
                return
            tenancy.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await tenancy.wake.wait()  # a shutdown's budget cuts the wait short
        tenancy.holding.on_released()
        if released and log:
            metrics.lease_released(reason)
            event(logging.INFO, "lease.released", "lease released", reason=reason.value,
                  attempts=attempt, **fields)
        elif log:
            metrics.lease_lost(StopReason.CONDITION_FAILED)
            event(logging.WARNING, "lease.lost", "lease had moved on before release",
                  reason=StopReason.CONDITION_FAILED.value, **fields)

    async def record_error(self, problem: str) -> None:
        """Write ``problem`` to the item's ``last_error``, unless it says so already."""
        tenancy = self.tenancy
        if tenancy.record.last_error == error_text(problem):
            return
        with contextlib.suppress(StoreError, TimeoutError):
            await shielded(self.ctx.leases.record_error(tenancy.stream, problem,
                                                        self.ctx.clock.wall_ms()),
                           self.settings.call_timeout_s, f"record_error {tenancy.stream}")
        event(logging.WARNING, "stream.unservable", "stream cannot be served", problem=problem,
              stream=tenancy.stream, fence=tenancy.tenure.fence)


def processor_reason(reason: StopReason | None, state: HolderState) -> str:
    """Why a tenure ended, as a processor's ``stop`` hears it (``STOP_REASONS``)."""
    if state in (HolderState.LOST, HolderState.SELF_FENCED):
        return "lost"
    return {StopReason.STOPPED: "stopped", StopReason.SHUTDOWN: "shutdown",
            StopReason.REBALANCE: "drain"}.get(reason, "error") if reason else "error"


async def shielded(call: Awaitable[T], timeout: float, name: str) -> T:
    """Await ``call`` for at most ``timeout`` seconds, shielded from our own cancellation
    (a release in flight should land even if the shutdown budget cancels us). If we stop
    waiting, the call goes on, and its outcome is still retrieved and logged."""
    task = asyncio.ensure_future(call)
    try:
        async with asyncio.timeout(timeout):
            return await asyncio.shield(task)
    except BaseException:
        if not task.done():
            task.add_done_callback(lambda t: _log_orphaned(t, name))
        raise


def _log_orphaned(task: asyncio.Future[Any], name: str) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        event(logging.WARNING, "store.call_failed_late", "a call given up on failed later",
              call=name, error=str(exc) or type(exc).__name__)
