"""Fenced leader leases: one holder of a named lease at a time, and writes that a stale
holder cannot make. The fleet's own leader (scheduled jobs, the sweep) runs on this; so
can any asyncio service::

    from streamlease.leader import LeaderLease, PutItem, dynamodb_backend

    async with dynamodb_backend("streamlease-fleet") as backend:
        async with LeaderLease(backend, "billing", owner="svc-7") as lease:
            # Leader from here on, under lease.fence, until lease.lost is set.
            await lease.fenced_write(PutItem("ledger", {"Pk": {"S": "day#2026-12-01"},
                                                        "fence": {"N": str(lease.fence)}}))

``async with`` waits until this owner holds the lease, renews it every heartbeat in the
background, and resigns on the way out (the next holder takes it at once). ``lease.lost``
is set the moment leadership is lost or can no longer be proven (a renewal refused, none
proven before ``ttl - safety margin`` on this process's monotonic clock, or the renewal
task itself failed: ``keeper_error``): stop acting then. Leaving never raises what the
renewal task raised; it is logged (``leader.keeper_crashed``). ``fenced_write`` makes the
write conditional, atomically, on the lease still carrying this holder's fence; a stale
holder's write raises ``StaleFence`` and changes nothing — also when the holder was paused
past its lease and does not know yet.

What this does not guarantee: anything about side effects outside the backend's own
store. Give such systems the fence and have them refuse a lower one (see docs/jobs.md,
Fenced side effects).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

from streamlease import tracing
from streamlease.clock import SYSTEM_CLOCK, Clock, sleep_unless
from streamlease.core.backoff import jittered
from streamlease.core.fenced import HashSet, PutItem, Transaction, Upsert
from streamlease.core.keepalive import Keeper, KeepState
from streamlease.core.leadership import LeaderObserver, LeaderRecord
from streamlease.core.membership import MemberTimings
from streamlease.errors import StoreError, WriteRefused
from streamlease.keeper import Answered, keep
from streamlease.logs import event
from streamlease.store.protocols import LeaderBackend

# The public API of leader leases, in one place. The writes (streamlease.core.fenced), the
# backend protocol (streamlease.store.protocols) and WriteRefused (streamlease.errors) are
# defined below the runtime, where the stores that apply them import them; storage imports
# no runtime module (tests/test_layering.py).
__all__ = [
    "HashSet",
    "LeaderBackend",
    "LeaderLease",
    "LeaderRecord",
    "PutItem",
    "Transaction",
    "Upsert",
    "WriteRefused",
    "dynamodb_backend",
]


@contextlib.asynccontextmanager
async def dynamodb_backend(fleet_table: str) -> AsyncIterator[LeaderBackend]:
    """Leader leases in a fleet table (``streamlease table create`` makes one), through
    the standard AWS configuration."""
    from streamlease.store.dynamodb import connect_admin
    async with connect_admin("unused-streams", "unused-events", fleet_table) as stores:
        yield stores.leader


# -- the lease ------------------------------------------------------------------------


class LeaderLease:
    """One attempt at leadership of ``name`` by ``owner`` (see the module docstring)."""

    def __init__(self, backend: LeaderBackend, name: str, owner: str, *, ttl_s: float = 20.0,
                 heartbeat_s: float | None = None, safety_margin_s: float | None = None,
                 clock: Clock = SYSTEM_CLOCK, rng: random.Random | None = None) -> None:
        heartbeat = ttl_s / 4 if heartbeat_s is None else heartbeat_s
        safety = ttl_s / 10 if safety_margin_s is None else safety_margin_s
        if not 0 < heartbeat < ttl_s / 3 or not 0 < safety < ttl_s / 3:
            raise ValueError("heartbeat_s and safety_margin_s must be under a third of ttl_s")
        self.backend = backend
        self.name = name
        self.owner = owner
        self.timings = MemberTimings(ttl_s, heartbeat, safety)
        self.clock = clock
        self.rng = rng or random.Random()
        self.fence = 0
        # Who held the lease at this candidate's last read (None: nobody, or expired).
        self.seen_owner: str | None = None
        self.lost = asyncio.Event()
        # What ended the renewal task, if it failed (a bug, an answer it could not read)
        # rather than stopping by the rules: leadership was given up because of it.
        self.keeper_error: Exception | None = None
        self._keepalive: Keeper | None = None  # the lease's deadline while held
        self._keeper: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LeaderLease:
        await self.acquire()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.release()

    def may_write(self) -> bool:
        """Whether this holder may still act: held, and within its local deadline."""
        return self._keepalive is not None and not self.lost.is_set() and \
            self._keepalive.may_write(self.clock.monotonic())

    async def acquire(self, stop: asyncio.Event | None = None,
                      urgent: Callable[[], bool] | None = None) -> bool:
        """Wait until this owner holds the lease (True), or ``stop`` is set (False).

        The lease is read every observation interval while ``urgent()`` (always, without
        it), else once a lease: a candidate that is not next in line still learns who
        leads, at a fraction of the reads."""
        observer = LeaderObserver(self.owner, self.timings.lease_s)
        read_at = float("-inf")
        while stop is None or not stop.is_set():
            now = self.clock.monotonic()
            hurry = urgent is None or urgent()
            if hurry or now - read_at >= self.timings.lease_s:
                read_at = now
                try:
                    if await self._try(observer, consistent=hurry):
                        return True
                except StoreError as exc:
                    event(logging.WARNING, "leader.acquire_failed",
                          "cannot read or take the lease", lease=self.name, error=str(exc))
            delay = jittered(self.timings.observe_s, 0.1, self.rng)
            if stop is None:
                await self.clock.sleep(delay)
            else:
                await sleep_unless(delay, stop)
        return False

    async def _try(self, observer: LeaderObserver, consistent: bool = True) -> bool:
        sent = self.clock.monotonic()
        # A calm read (once a lease, the leader's successor standing ready) may be a moment
        # stale: it only keeps the leader's identity known, and a lease it wrongly shows
        # standing still is taken only through a write conditioned on the lease as seen.
        if consistent:  # the keyword only when needed: a backend written before it still works
            record = await self.backend.read(self.name, timeout=self.timings.heartbeat_s)
        else:
            record = await self.backend.read(self.name, timeout=self.timings.heartbeat_s,
                                             consistent=False)
        received = self.clock.monotonic()
        self.seen_owner = None if record is None or record.resigned else record.owner
        if not observer.may_take(record, sent, received):
            return False
        attempt = self.clock.monotonic()
        # Only a lease this worker may take is campaigned for: a span per election, not per
        # observation.
        with tracing.span("leader_election", root=True, lease=self.name,
                          previous_owner=record.owner if record else None) as span:
            fence = await self.backend.acquire(self.name, self.owner, self.timings.lease_s,
                                               record, self.clock.wall_ms(),
                                               timeout=self.timings.heartbeat_s)
            tracing.set_attributes(span, won=fence is not None, fence=fence)
        if fence is None:
            return False
        self.fence = fence
        self.lost.clear()
        self._keepalive = Keeper.sent(attempt, self.timings)  # a term ends at its deadline
        self._keeper = asyncio.create_task(self._keep(), name=f"leader {self.name}")
        event(logging.INFO, "leader.acquired", "leadership acquired", lease=self.name,
              fence=fence, previous_owner=record.owner if record else None)
        return True

    async def _keep(self) -> None:
        """Renew until the lease is lost. Every end of this task but ``release`` cancelling
        it sets ``lost``: a renewal task that died while ``lost`` stayed clear would leave
        this holder acting on a lease nobody renews, and nobody campaigning."""
        try:
            await self._renew()
        except Exception as exc:  # a bug, an answer that cannot be read: not a store outcome
            self.keeper_error = exc
            event(logging.ERROR, "leader.keeper_crashed",
                  "the leader lease's renewal task failed; leadership given up",
                  lease=self.name, fence=self.fence, error=repr(exc)[:300], exc_info=True)
            self._lose("renewal task crashed")

    async def _renew(self) -> None:
        """Renew every heartbeat; set ``lost`` on refusal or at the local deadline."""
        assert self._keepalive is not None

        async def renew(timeout: float) -> Answered:
            return Answered(await self.backend.renew(
                self.name, self.owner, self.fence, self.timings.lease_s, self.clock.wall_ms(),
                timeout=timeout))

        ended = await keep(self._keepalive, renew, self.clock, self.rng)
        self._lose("renewal refused" if ended is KeepState.REFUSED
                   else "no renewal proven before the deadline")

    def _lose(self, why: str) -> None:
        if not self.lost.is_set():
            event(logging.WARNING, "leader.lost", "leadership lost", lease=self.name,
                  fence=self.fence, reason=why)
            self.lost.set()

    async def release(self) -> None:
        """Stop renewing and resign (if still held), so the next holder takes it now.

        Never raises for the renewal task or the resignation (both are logged): it runs on
        the way out, in a drain that must go on. After the renewal task failed the lease
        is resigned too: this holder stopped acting when ``lost`` was set, and the fleet
        need not wait a time to live for a lease nobody uses."""
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.cancel()
            try:
                await keeper
            except asyncio.CancelledError:
                if not keeper.cancelled():
                    raise  # release itself is being cancelled
            except Exception as exc:  # only if _keep's own handler failed
                self.keeper_error = self.keeper_error or exc
                event(logging.ERROR, "leader.keeper_crashed",
                      "the leader lease's renewal task failed", lease=self.name,
                      fence=self.fence, error=repr(exc)[:300], exc_info=True)
        if self._keepalive is not None and (not self.lost.is_set()
                                           or self.keeper_error is not None):
            self.lost.set()
            try:
                await self.backend.resign(self.name, self.owner, self.fence,
                                          timeout=self.timings.heartbeat_s)
                event(logging.INFO, "leader.resigned", "leadership resigned", lease=self.name,
                      fence=self.fence)
            except Exception as exc:  # StoreError, or a failure as unexpected as above
                event(logging.WARNING, "leader.resign_failed",
                      "could not resign; the lease will expire", lease=self.name,
                      error=str(exc) or repr(exc), exc_info=not isinstance(exc, StoreError))
        self._keepalive = None

    async def fenced_write(self, write: Any, timeout: float | None = None) -> None:
        """Apply ``write`` (``PutItem``/``Transaction`` on DynamoDB, ``HashSet`` on
        Redis, ``Upsert`` on MongoDB) only if the lease still carries this holder's
        fence. StaleFence if not."""
        await self.backend.fenced_write(self.name, self.fence, write,
                                        timeout=timeout or self.timings.heartbeat_s)
