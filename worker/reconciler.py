"""The fleet loop: find orphaned streams, take them up to capacity, supervise them.

Every ``reconcile_s`` (+/-20 % jitter) it queries the index for STARTED streams whose
lease expired before ``now - skew_margin``; every ``sweep_s`` it also scans for items
the index cannot see (written by hand without lease fields, or with an unknown state).
Candidates are shuffled and capped per cycle so a fleet that wakes together spreads
over different streams; the conditional acquire is the only arbiter.

Supervisors live in this object's TaskGroup: when the reconciler stops, intake stops
first, then every supervisor drains, then the group exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from worker.clock import Clock
from worker.core.backoff import jittered
from worker.core.lease import HolderState, StopReason, takeover_threshold_ms
from worker.core.model import StreamRecord
from worker.core.plan import (
    VALID_STATES,
    fleet_view,
    invisible_to_index,
    item_problem,
    plan_cycle,
)
from worker.errors import StoreError
from worker.health import HealthState
from worker.logs import event
from worker.metrics import Metrics
from worker.store.dynamodb import DynamoStore
from worker.supervisor import Supervisor, SupervisorSettings

ORPHAN_QUERY_LIMIT = 1000


@dataclass(frozen=True)
class ReconcilerSettings:
    owner: str
    reconcile_s: float
    sweep_s: float
    max_streams: int
    acquire_per_cycle: int
    supervisor: SupervisorSettings


class Reconciler:
    def __init__(self, store: DynamoStore, clock: Clock, metrics: Metrics,
                 settings: ReconcilerSettings, rng: random.Random | None = None,
                 on_delivered: Callable[[int], None] | None = None,
                 health: HealthState | None = None) -> None:
        self.store = store
        self.clock = clock
        self.metrics = metrics
        self.settings = settings
        self.rng = rng or random.Random()
        self.supervisors: dict[str, Supervisor] = {}
        self._stop = asyncio.Event()
        self._next_sweep = 0.0
        self._reported: set[tuple[str, str]] = set()
        self._on_delivered = on_delivered
        self._tg: asyncio.TaskGroup | None = None
        self.unreleased = 0  # shutdown drains whose release did not go through
        self.health = health or HealthState(settings.supervisor.timings.lease_s)

    def stop(self) -> None:
        """Stop acquiring and drain every supervisor now (flush and release), without
        waiting for a reconcile cycle in progress to finish."""
        self._stop.set()
        for supervisor in list(self.supervisors.values()):
            supervisor.request_drain(StopReason.SHUTDOWN)

    @property
    def stopping(self) -> asyncio.Event:
        return self._stop

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            # Sweep at start-up: a fresh fleet picks up hand-written items at once.
            self._next_sweep = self.clock.monotonic()
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    await self._cycle()
                except StoreError as exc:
                    event(logging.WARNING, "reconcile.failed", "reconcile cycle failed",
                          error=str(exc))
                except Exception:
                    event(logging.ERROR, "reconcile.crashed", "reconcile cycle crashed",
                          exc_info=True)
                self.metrics.reconcile(time.perf_counter() - started)
                delay = jittered(self.settings.reconcile_s, 0.2, self.rng)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._stop.wait()
            for supervisor in list(self.supervisors.values()):
                supervisor.request_drain(StopReason.SHUTDOWN)
        self._tg = None

    async def _cycle(self) -> None:
        now_mono = self.clock.monotonic()
        if now_mono >= self._next_sweep:
            self._next_sweep = now_mono + jittered(self.settings.sweep_s, 0.2, self.rng)
            await self._sweep()
        if len(self.supervisors) >= self.settings.max_streams:
            return
        timings = self.settings.supervisor.timings
        now_ms = self.clock.wall_ms()
        candidates = await self.store.orphans(takeover_threshold_ms(now_ms, timings),
                                              ORPHAN_QUERY_LIMIT)
        orphans = [c for c in candidates if c.stream_id not in self.supervisors]
        if orphans:
            self.metrics.orphans_found(len(orphans))
        plan = plan_cycle(
            orphans, held=set(self.supervisors), max_streams=self.settings.max_streams,
            per_cycle=self.settings.acquire_per_cycle, now_wall_ms=now_ms, timings=timings,
            allowed_prefixes=self.settings.supervisor.allowed_urls, rng=self.rng,
        )
        for record, problem in plan.unservable:
            await self._report_unservable(record, problem)
        if plan.acquire and not self._stop.is_set():
            await asyncio.gather(*(self._acquire(r) for r in plan.acquire))
        self.metrics.set_leases_held(len(self.supervisors))

    async def _sweep(self) -> None:
        """One paginated Scan of the streams table: adopt hand-written items, report
        items with an invalid state, and publish the fleet view metric. (A filtered Scan
        costs the same read capacity as a full one, so the view comes for free.)"""
        records = await self.store.list_streams()
        self.metrics.fleet_view(fleet_view(records, self.clock.wall_ms()))
        for record in filter(invisible_to_index, records):
            if record.desired_state not in VALID_STATES:
                problem = item_problem(record, self.settings.supervisor.allowed_urls)
                if problem is not None and record.last_error != problem:
                    await self._report_unservable(record, problem)
                continue
            if record.lease_expires_at_ms is None and await self.store.adopt(record.stream_id):
                event(logging.INFO, "stream.adopted",
                      "hand-written item given lease fields; it is now visible to the fleet",
                      stream=record.stream_id)

    async def _report_unservable(self, record: StreamRecord, problem: str) -> None:
        key = (record.stream_id, problem)
        if key not in self._reported:
            self._reported.add(key)
            self.metrics.bad_item("bad_state" if "desired_state" in problem else "bad_url")
            event(logging.WARNING, "stream.unservable", "stream cannot be served; not dialled",
                  stream=record.stream_id, problem=problem)
        try:
            await self.store.record_error(record.stream_id, problem, self.clock.wall_ms())
        except StoreError as exc:
            event(logging.WARNING, "stream.record_error_failed", "could not record last_error",
                  stream=record.stream_id, error=str(exc))

    async def _acquire(self, candidate: StreamRecord) -> None:
        timings = self.settings.supervisor.timings
        sent = self.clock.monotonic()
        now_ms = self.clock.wall_ms()
        try:
            got = await self.store.acquire(candidate.stream_id, self.settings.owner, now_ms,
                                           timings, timeout=timings.heartbeat_s)
        except StoreError as exc:
            event(logging.WARNING, "lease.acquire_failed", "acquire failed", error=str(exc),
                  stream=candidate.stream_id)
            return
        if got is None:
            return  # someone else won, or the item changed: not an error
        if self._stop.is_set() or len(self.supervisors) >= self.settings.max_streams:
            try:
                await self.store.release(got.tenure)
            except StoreError as exc:
                event(logging.WARNING, "lease.release_failed",
                      "release after a late acquire failed; the lease will expire",
                      stream=got.tenure.stream_id, fence=got.tenure.fence, error=str(exc))
            return
        expired = candidate.lease_expires_at_ms
        delay = (now_ms - expired) / 1000 if expired else None
        self.metrics.lease_acquired(delay)
        event(logging.INFO, "lease.acquired", "lease acquired", stream=got.tenure.stream_id,
              fence=got.tenure.fence, last_seq=got.tenure.last_seq,
              previous_owner=candidate.lease_owner, unowned_s=delay)
        supervisor = Supervisor(got.tenure, got.record, sent, self.store, self.clock,
                                self.metrics, self.settings.supervisor, self.rng,
                                self._on_delivered, self.health)
        self.supervisors[got.tenure.stream_id] = supervisor
        self.metrics.set_leases_held(len(self.supervisors))
        assert self._tg is not None
        self._tg.create_task(self._supervise(supervisor))

    async def _supervise(self, supervisor: Supervisor) -> None:
        try:
            await supervisor.run()
            if supervisor.holding.reason is StopReason.SHUTDOWN and \
                    supervisor.holding.state is not HolderState.RELEASED:
                self.unreleased += 1
        finally:
            if self.supervisors.get(supervisor.stream) is supervisor:
                del self.supervisors[supervisor.stream]
                self.health.dropped(supervisor.stream)
            self.metrics.set_leases_held(len(self.supervisors))
