"""The intake: orphaned streams found, planned and acquired.

At each cycle it queries the index for STARTED streams whose lease expired before
``now - skew_margin`` (released streams have expiry 0) and reads beside it each stream the
leader's change feed offered this worker since (the index lags the table); the pure plan
(``streamlease.core.plan``) says which are acquirable, shuffled and ranked by how long
they have waited; the balancer says how many to take. The conditional acquire is the only
arbiter, and what it wins starts in the holdings (``Holdings.start``).
"""

from __future__ import annotations

import asyncio
import logging

from streamlease import tracing
from streamlease.context import Context
from streamlease.core import balance
from streamlease.core.lease import takeover_threshold_ms
from streamlease.core.model import StreamRecord
from streamlease.core.plan import Cycle, Plan, plan_cycle
from streamlease.errors import StoreError
from streamlease.holdings import Holdings, MemberGate
from streamlease.logs import event
from streamlease.reconcile_settings import ReconcilerSettings

ORPHAN_QUERY_LIMIT = 1000
OFFERED_LIMIT = 100  # offered streams remembered between two cycles (the rest: the index)


class Intake:
    def __init__(self, ctx: Context, settings: ReconcilerSettings, holdings: Holdings,
                 membership: MemberGate, stopping: asyncio.Event) -> None:
        self.ctx = ctx
        self.settings = settings
        self.holdings = holdings
        self.membership = membership
        self.stopping = stopping
        # Streams the leader's change feed offered this worker since its last cycle: read
        # at once, not found through the orphan index (which lags the table).
        self._offered: set[str] = set()
        self.orphan_since: dict[str, float] = {}  # when this worker first saw each orphan
        self.servable = 0  # servable orphans at the last cycle (the leader's bulletin)

    def offer(self, stream_id: str) -> None:
        if len(self._offered) < OFFERED_LIMIT:
            self._offered.add(stream_id)

    async def plan(self, now: float) -> tuple[Plan, balance.Waited]:
        """The orphans (each held stream among the candidates told what they show), the
        plan over them, and how long each has waited."""
        supervisors = self.holdings.supervisors
        supervisor = self.settings.supervisor
        now_ms = self.ctx.clock.wall_ms()
        candidates = await self._candidates(takeover_threshold_ms(now_ms, supervisor.timings))
        orphans = []
        for candidate in candidates:
            held = supervisors.get(candidate.stream_id)
            if held is None:
                orphans.append(candidate)
            else:
                held.seen(candidate)  # released or taken from under us (a force release)
        if orphans:
            self.ctx.metrics.orphans_found(len(orphans))
            tracing.set_attributes(orphans=len(orphans))
        unservable = self.holdings.unservable_until
        if unservable:
            mono = self.ctx.clock.monotonic()
            for stream_id, until in list(unservable.items()):
                if until <= mono:
                    del unservable[stream_id]
            orphans = [o for o in orphans if o.stream_id not in unservable]
        waited = self._waited(orphans, now)
        plan = plan_cycle(Cycle(
            orphans, held=set(supervisors), max_streams=self.settings.max_streams,
            per_cycle=self.settings.max_streams, now_wall_ms=now_ms, timings=supervisor.timings,
            allowed_urls=supervisor.allowed_urls, catalog=supervisor.catalog,
            rank=waited.tier,  # the longest waiting first; racing takers spread within a tier
        ), self.ctx.rng)
        self.servable = plan.servable
        return plan, waited

    async def take(self, acquire: list[StreamRecord], want: int) -> None:
        """Acquire up to ``want`` of ``acquire`` at once (within the per-cycle cap and the
        room left)."""
        budget = min(want, self.settings.acquire_per_cycle,
                     self.settings.max_streams - len(self.holdings.supervisors))
        if budget > 0 and acquire and not self.stopping.is_set():
            async with asyncio.TaskGroup() as tg:
                for record in acquire[:budget]:
                    tg.create_task(self.acquire(record))
            self.membership.counts_changed()

    async def _candidates(self, threshold_ms: int) -> list[StreamRecord]:
        """The orphan query's answer and, read beside it (not after it: an offered stream
        is taken one round trip sooner), each stream offered since the last cycle, read
        consistently (the index may not show it yet). Where both have a stream, the
        consistent read is the one kept."""
        offered, self._offered = self._offered - set(self.holdings.supervisors), set()
        leases = self.ctx.leases
        if not offered:
            return await leases.orphans(threshold_ms, ORPHAN_QUERY_LIMIT)
        failed: StoreError | None = None
        found: list[StreamRecord] = []
        async with asyncio.TaskGroup() as tg:
            reading = tg.create_task(self._read_offered(offered))
            try:
                found = await leases.orphans(threshold_ms, ORPHAN_QUERY_LIMIT)
            except StoreError as exc:
                failed = exc  # the offered reads still finish: their streams are taken
        read = reading.result()
        fresh = {r.stream_id for r in read}
        if failed is not None:
            # Offers not read either wait for the next cycle, as before the read.
            self._offered |= set(sorted(offered - fresh)[:OFFERED_LIMIT])
            if not read:
                raise failed
            event(logging.WARNING, "reconcile.failed", "orphan query failed; taking the "
                  "offered streams only", error=str(failed))
        return [c for c in found if c.stream_id not in fresh] + read

    async def _read_offered(self, offered: set[str]) -> list[StreamRecord]:
        """Each offered stream read consistently; the plan then treats them as any orphan
        (a stream already taken is not acquirable, and the acquisition is a conditional
        write)."""
        timeout = self.settings.supervisor.call_timeout_s

        async def read(stream_id: str) -> StreamRecord | None:
            try:
                return await self.ctx.leases.check(stream_id, timeout=timeout)
            except StoreError:
                return None  # the orphan query finds it later
        async with asyncio.TaskGroup() as tg:
            reads = [tg.create_task(read(sid)) for sid in sorted(offered)]
        return [r for r in (t.result() for t in reads) if r is not None]

    def _waited(self, orphans: list[StreamRecord], now: float) -> balance.Waited:
        """Note when this worker first saw each orphan; the orphans by how long they
        have waited since, in reconcile intervals."""
        current = {o.stream_id for o in orphans}
        for gone in set(self.orphan_since) - current:
            del self.orphan_since[gone]
        for stream_id in current:
            self.orphan_since.setdefault(stream_id, now)
        return balance.waited(self.orphan_since, now, self.settings.reconcile_s)

    async def acquire(self, candidate: StreamRecord) -> None:
        stream_id = candidate.stream_id
        self.holdings.acquiring.add(stream_id)
        try:
            with tracing.span("acquire", stream=stream_id, how=tracing.how_freed(candidate),
                              previous_owner=candidate.lease_owner, acquired=False):
                await self._try_acquire(candidate)
        except BaseException:
            self.holdings.unsure.add(stream_id)  # cancelled mid-call: it may have applied
            raise
        finally:
            self.holdings.acquiring.discard(stream_id)

    async def _try_acquire(self, candidate: StreamRecord) -> None:
        if self.stopping.is_set() or not self.membership.accepting:
            return  # the worker stopped accepting (self-fenced, draining) since the plan
        clock = self.ctx.clock
        sent = clock.monotonic()
        now_ms = clock.wall_ms()
        try:
            got = await self.ctx.leases.acquire(
                candidate.stream_id, self.ctx.owner, now_ms, self.settings.supervisor.timings,
                timeout=2 * self.settings.stopped_check_s, epoch=self.membership.epoch)
            if got is not None:
                got = await self.holdings.resume_where_the_sink_is(got)
        except StoreError as exc:
            # The write may have applied with its answer lost: read the item back later
            # and release it if so, or it would sit leased to this worker, unserved, for
            # a whole stream lease.
            self.holdings.unsure.add(candidate.stream_id)
            event(logging.WARNING, "lease.acquire_failed",
                  "acquire failed; its outcome is checked at the next cycle", error=str(exc),
                  stream=candidate.stream_id)
            return
        if got is None:
            return  # someone else won, or the item changed: not an error
        # Unowned since its stored expiry; a released stream (expiry 0: a hand-over, a
        # release on behalf) since this worker first saw it free, a lower bound.
        expired = candidate.lease_expires_at_ms
        seen = self.orphan_since.get(candidate.stream_id)
        delay = (now_ms - expired) / 1000 if expired else \
            None if seen is None else max(0.0, sent - seen)
        await self.holdings.start(got, sent, delay, candidate.lease_owner,
                                  how=tracing.how_freed(candidate))
