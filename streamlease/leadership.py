"""The fleet leader: one worker at a time runs the fleet-wide duties.

Every ACTIVE worker is a candidate for the ``fleet`` leader lease (``streamlease.leader``).
While it holds the lease, the leader runs each duty — the sweep for hand-written items
and the fleet gauges, the clean-up of dead members' rows, the scheduled jobs — each
handed the lease (for its fence) and an event set when it must stop. Duties stop when
the lease is lost (at once: another leader may be starting them) or when the worker
shuts down (jobs get the shutdown budget to finish); then the lease is resigned so the
next leader takes it within one observation interval.

If the lease's renewal task fails (a bug, an answer it cannot read: ``leader.keeper_crashed``,
``streamlease_leader_keeper_crashes_total``), the lease counts as lost: duties stop, the
lease is resigned, and this worker campaigns again after a backoff (from one heartbeat,
doubling up to a lease, reset by a leadership that ends any other way), so a lasting
fault does not make it grab and drop leadership every heartbeat. Leaving never raises it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from streamlease.context import Context
from streamlease.core.backoff import Backoff
from streamlease.leader import LeaderBackend, LeaderLease
from streamlease.logs import event

FLEET_LEASE = "fleet"

Duty = Callable[[LeaderLease, asyncio.Event], Awaitable[None]]


@dataclass(frozen=True)
class LeadershipSettings:
    ttl_s: float
    heartbeat_s: float
    safety_margin_s: float
    name: str = FLEET_LEASE


class Leadership:
    def __init__(self, ctx: Context, backend: LeaderBackend, settings: LeadershipSettings,
                 duties: list[Duty], eligible: Callable[[], bool],
                 urgent: Callable[[], bool] | None = None) -> None:
        self.owner = ctx.owner
        self.backend = backend
        self.clock = ctx.clock
        self.metrics = ctx.metrics
        self.settings = settings
        self.duties = duties
        self.eligible = eligible
        self.urgent = urgent  # campaign at full pace now (None: always)
        self.rng = ctx.rng
        self.lease: LeaderLease | None = None
        self._candidate: LeaderLease | None = None  # the campaign in progress, if any
        self._stop = asyncio.Event()

    @property
    def leading(self) -> bool:
        return self.lease is not None and self.lease.may_write()

    def fence(self) -> int:
        """The fence of the lease this worker holds (0 while it does not lead)."""
        return self.lease.fence if self.lease is not None else 0

    def leader_seen(self) -> str | None:
        """The fleet leader as this worker last knew it: itself while it leads, else the
        holder its campaign last read (None: nobody, or not known)."""
        if self.leading:
            return self.owner
        return self._candidate.seen_owner if self._candidate is not None else None

    def stop(self) -> None:
        """Step down (or stop trying): duties wind down, then the lease is resigned."""
        self._stop.set()

    async def run(self) -> None:
        s = self.settings
        after_crash = Backoff(s.heartbeat_s, s.ttl_s, self.rng)
        while not self._stop.is_set():
            if not self.eligible():
                await self._pause(s.heartbeat_s)
                continue
            lease = LeaderLease(self.backend, s.name, self.owner, ttl_s=s.ttl_s,
                                heartbeat_s=s.heartbeat_s, safety_margin_s=s.safety_margin_s,
                                clock=self.clock, rng=self.rng)
            self._candidate = lease
            if not await lease.acquire(self._stop, self.urgent):
                return
            self.lease = lease
            self.metrics.leader(True)
            event(logging.INFO, "leader.duties", "leading the fleet", lease=s.name,
                  fence=lease.fence)
            try:
                await self._lead(lease)
            finally:
                self.lease = None
                self.metrics.leader(False)
                self.metrics.clear_fleet_view()
                await lease.release()
            if lease.keeper_error is None:
                after_crash.reset()
                continue
            self.metrics.leader_keeper_crashed()
            delay = after_crash.next_delay()
            event(logging.WARNING, "leader.campaign_paused",
                  "the leader lease's renewal task failed; campaigning again after a pause",
                  lease=s.name, fence=lease.fence, delay_s=round(delay, 3),
                  error=repr(lease.keeper_error)[:300])
            await self._pause(delay)

    async def _lead(self, lease: LeaderLease) -> None:
        """Run every duty until the lease is lost or this worker steps down."""
        done = asyncio.Event()
        async with asyncio.TaskGroup() as tg:
            for duty in self.duties:
                tg.create_task(self._guarded(duty, lease, done))
            waits = [asyncio.ensure_future(lease.lost.wait()),
                     asyncio.ensure_future(self._stop.wait())]
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for waiter in waits:
                waiter.cancel()
            if lease.lost.is_set():
                # Another leader may be starting already: stop reporting leadership now,
                # not once the duties (a job's grace period) have wound down.
                self.metrics.leader(False)
            done.set()

    async def _guarded(self, duty: Duty, lease: LeaderLease, done: asyncio.Event) -> None:
        """A duty that crashes is logged and started again; it never ends leadership."""
        while not done.is_set():
            try:
                await duty(lease, done)
                return
            except Exception:
                event(logging.ERROR, "leader.duty_crashed", "a leader duty crashed; restarting",
                      exc_info=True)
                await self._pause(self.settings.heartbeat_s, done)

    async def _pause(self, seconds: float, also: asyncio.Event | None = None) -> None:
        waits = [asyncio.ensure_future(self._stop.wait())]
        if also is not None:
            waits.append(asyncio.ensure_future(also.wait()))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waits:
            waiter.cancel()
