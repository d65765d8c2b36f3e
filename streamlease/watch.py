"""What a holder must learn about the items it holds, read in bulk: the STOPPED query
(held streams flipped to STOPPED) and the batched read of every held item. While the
leader's change feed is live its notices say so instead and both reads rest; when the
feed resumes after a gap, each runs once at once (``resume``) for what it may have missed.
"""

from __future__ import annotations

import asyncio
import logging

from streamlease.clock import sleep_unless
from streamlease.context import Context
from streamlease.core.backoff import jittered
from streamlease.errors import StoreError
from streamlease.holdings import Holdings, MemberGate
from streamlease.logs import event
from streamlease.reconcile_settings import ReconcilerSettings

QUERY_LIMIT = 1000  # held STOPPED streams one query returns at most


class HeldWatch:
    def __init__(self, ctx: Context, settings: ReconcilerSettings, holdings: Holdings,
                 membership: MemberGate, stopping: asyncio.Event) -> None:
        self.ctx = ctx
        self.settings = settings
        self.holdings = holdings
        self.membership = membership
        self.stopping = stopping
        self._stopped_now = asyncio.Event()  # the STOPPED query is due at once
        self._checks_now = asyncio.Event()  # the batched read of held items is due at once

    def resume(self) -> None:
        """The feed's notices are trusted again after a gap: both reads run once now."""
        self._stopped_now.set()
        self._checks_now.set()

    async def _rest(self, seconds: float, now: asyncio.Event) -> None:
        await sleep_unless(jittered(seconds, 0.1, self.ctx.rng), self.stopping, now)

    async def stopped_loop(self) -> None:
        """Every member heartbeat: STOPPED streams whose lease is still live (the index
        returns only those), so a holder releases within a heartbeat of the flip, though
        it renews its own lease only every 80 minutes (at the defaults)."""
        every = self.settings.stopped_check_s
        while not self.stopping.is_set():
            asked = self._stopped_now.is_set()
            self._stopped_now.clear()
            if self.membership.feed_live() and not asked:
                await self._rest(every, self._stopped_now)
                continue
            try:
                found = await self.ctx.leases.held_stopped(self.ctx.clock.wall_ms(),
                                                           QUERY_LIMIT, timeout=every)
                for record in found:
                    held = self.holdings.supervisors.get(record.stream_id)
                    if held is not None:
                        held.seen(record)
            except StoreError as exc:
                event(logging.WARNING, "reconcile.stopped_query_failed",
                      "cannot query for STOPPED streams", error=str(exc))
            await self._rest(every, self._stopped_now)

    async def checks_loop(self) -> None:
        """Every stream check interval, unless the leader's change feed tells of every
        change: one eventually consistent read of every held item (``check_many``: a
        BatchGetItem per 100), not one consistent read per stream. An item that looks
        changed (stopped, a new URL, released, moved on, gone) is read consistently by its
        holder, and only that read decides."""
        every = self.settings.supervisor.check_s
        assert every is not None  # the loop runs only with a check interval
        while not self.stopping.is_set():
            asked = self._checks_now.is_set()
            self._checks_now.clear()
            held = dict(self.holdings.supervisors)
            if held and (asked or not self.membership.feed_live()):
                try:
                    found = await self.ctx.leases.check_many(
                        list(held), timeout=self.settings.supervisor.call_timeout_s)
                    for stream_id, supervisor in held.items():
                        if stream_id in found:
                            supervisor.compare(found[stream_id])
                except StoreError as exc:
                    event(logging.WARNING, "reconcile.checks_failed",
                          "cannot read the held items; trying again next interval",
                          error=str(exc), held=len(held))
            await self._rest(every, self._checks_now)
