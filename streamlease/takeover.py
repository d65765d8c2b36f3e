"""Taking a dead member's streams straight over.

When a member is fenced, every survivor learns it (from the leader's bulletin, with the
survivors' weights in the deal; or from its ``DEAD`` row, when it reads every row), lists
its streams through the owner index, deals them the same way every survivor does
(``streamlease.core.deal``) and takes its own part: one conditional write per stream, from
the dead incarnation to this worker (``LeaseStore.take_over``), paced so the survivors
together stay under half the orphan index key's write rate. The owner index lags, so it
looks once more a moment later. What nobody takes (a survivor that could not, a stream
missing from every survivor's listing) is released by the fencer after the deal window
and acquired as an orphan.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass

from streamlease import tracing
from streamlease.clock import sleep_unless
from streamlease.context import Context
from streamlease.core.deal import TAKEOVERS_PER_S, deal, deal_weights, preference
from streamlease.core.lease import LeaseTimings
from streamlease.core.membership import MemberRecord
from streamlease.errors import StoreError
from streamlease.holdings import Holdings, MemberGate
from streamlease.logs import event
from streamlease.store.protocols import TakeOver

TAKEOVER_CONCURRENCY = 16  # take-over writes in flight per worker
DEALT_LIMIT = 1_000  # dead incarnations remembered as dealt


@dataclass(frozen=True)
class TakeoverSettings:
    max_streams: int
    timings: LeaseTimings  # the stream lease a take-over stamps
    call_s: float  # a take-over write times out after twice this
    second_pass_s: float  # the owner index is listed again after this


class Takeover:
    def __init__(self, ctx: Context, holdings: Holdings, settings: TakeoverSettings,
                 membership: MemberGate, stopping: asyncio.Event) -> None:
        self.ctx = ctx
        self.leases = ctx.leases
        self.holdings = holdings
        self.clock = ctx.clock
        self.metrics = ctx.metrics
        self.settings = settings
        self.membership = membership
        self.stopping = stopping
        # Dead incarnations (worker id, fenced epoch) whose streams this worker has dealt.
        self.dealt: OrderedDict[tuple[str, int], None] = OrderedDict()

    def deal_dead(self) -> None:
        """For each member row newly seen fenced (DEAD, its streams not yet released), take
        this worker's part of the deal (``streamlease.core.deal``) straight over."""
        if self.stopping.is_set():
            return
        for row, weights in self.membership.deals():
            key = (row.worker_id, row.epoch)
            if key in self.dealt or self.holdings.tg is None:
                continue
            self.holdings.tg.create_task(self._guarded_take(row, weights),
                                         name=f"take over {row.worker_id}")
            self.dealt[key] = None
            if len(self.dealt) > DEALT_LIMIT:
                self.dealt.popitem(last=False)

    @tracing.takeover_span  # a root span: the dead member wrote nothing to link to
    async def _guarded_take(self, dead: MemberRecord, weights: dict[str, int] | None) -> None:
        try:
            first = self.clock.monotonic()
            taken, weight = await self._take_dead_part(dead, weights)
            # A second look: the owner index lags, so a stream the dead member took just
            # before it died may be listed only now; survivors whose rows differed may have
            # dealt a stream to nobody; and the deal's hashing may give a survivor more than
            # its room (what it cannot take is left). Those are taken too, up to this
            # worker's weight in the deal, before the fencer would release them. The look
            # is timed from the first one's start, not its end: the fencer's deal window
            # counts from the fence, and a survivor still taking a large part when the
            # others are done would otherwise look only after the fencer released the
            # leftovers to the slower orphan path.
            wait = first + self.settings.second_pass_s - self.clock.monotonic()
            await sleep_unless(max(0.0, wait), self.stopping)
            if not self.stopping.is_set():
                await self._take_dead_part(dead, weights, leftovers=max(0, weight - taken))
        except StoreError as exc:
            # Dealt again at the next cycle while its row still says unreleased.
            self.dealt.pop((dead.worker_id, dead.epoch), None)
            event(logging.WARNING, "takeover.failed", "taking a dead member's streams over "
                  "failed; trying again at the next cycle", member=dead.worker_id,
                  error=str(exc))
        except Exception:
            self.metrics.task_crashed("takeover")
            event(logging.ERROR, "takeover.crashed", "taking a dead member's streams over "
                  "crashed; its fencer releases what is left", member=dead.worker_id,
                  exc_info=True)

    def _deal_for(self, dead: MemberRecord, stream_ids: list[str],
                  weights: dict[str, int] | None) -> tuple[list[str], int]:
        """This worker's part of the deal of ``stream_ids`` by the leader's ``weights``
        (its bulletin), or else as every survivor computes them from the member rows
        (which lag by a heartbeat at most); and how many of them its weight is worth."""
        if weights is None:
            view = self.membership.view
            survivors = [m for m in view.active() if m.worker_id != dead.worker_id]
            counts = {m.worker_id: m.streams for m in survivors}
            capacities = {m.worker_id: m.capacity for m in survivors}
            weights = deal_weights(counts, capacities, len(stream_ids))
        dealt = deal(stream_ids, weights)
        mine = [sid for sid in stream_ids if dealt.get(sid) == self.ctx.owner]
        # This worker's expected part of all the dead member held: the weights are relative
        # (the leader weighed them by the dead member's last reported count, which lags).
        # The listing alone would undercount it: it shrinks while the other survivors take
        # their parts, and a survivor that lists late would then leave its own leftovers
        # to the fencer.
        held = max(len(stream_ids), dead.streams)
        total = sum(w for w in weights.values() if w > 0)
        weight = max(0, weights.get(self.ctx.owner, 0))
        return mine, math.ceil(held * weight / total) if total else 0

    async def _take_dead_part(self, dead: MemberRecord, weights: dict[str, int] | None,
                              leftovers: int = 0) -> tuple[int, int]:
        """Take this worker's part (and up to ``leftovers`` streams dealt elsewhere, in an
        order of this worker's own, so survivors looking at once want different ones):
        (taken, this worker's weight in the deal)."""
        owned = await self.leases.owned_by(dead.worker_id,
                                           timeout=2 * self.settings.call_s)
        # Dealt over the listing as every survivor reads it, then what this worker already
        # holds or is taking is left out.
        listed = sorted({o.stream_id for o in owned})
        mine, weight = self._deal_for(dead, listed, weights)
        if leftovers:
            others = sorted(set(listed) - set(mine),
                            key=lambda sid: preference(sid, self.ctx.owner))
            mine += others[:leftovers]
        busy = set(self.holdings.supervisors) | self.holdings.acquiring
        mine = [sid for sid in mine if sid not in busy]
        room = self.settings.max_streams - len(self.holdings.supervisors)
        mine = mine[:max(0, room)]
        if not mine or not self.membership.accepting:
            return 0, weight
        # This worker's part of the fleet's budget.
        spacing = self.membership.survivors(dead.worker_id) / TAKEOVERS_PER_S
        gate = asyncio.Semaphore(TAKEOVER_CONCURRENCY)
        taken: list[bool] = []

        async def one(stream_id: str) -> None:
            async with gate:
                with tracing.span("acquire", stream=stream_id, how=tracing.HOW_TAKEOVER,
                                  previous_owner=dead.worker_id, acquired=False):
                    taken.append(await self._take_one(stream_id, dead))

        async with asyncio.TaskGroup() as tg:
            for stream_id in mine:
                if self.stopping.is_set():
                    break
                tg.create_task(one(stream_id))
                await self.clock.sleep(spacing)
        count = sum(taken)
        if count:
            self.membership.counts_changed()
            event(logging.INFO, "takeover.done", "took a dead member's streams straight over",
                  member=dead.worker_id, epoch=dead.epoch, dealt=len(mine), taken=count)
        self.metrics.set_leases_held(len(self.holdings.supervisors))
        return count, weight

    async def _take_one(self, stream_id: str, dead: MemberRecord) -> bool:
        if self.stopping.is_set() or not self.membership.accepting or \
                len(self.holdings.supervisors) >= self.settings.max_streams or \
                stream_id in self.holdings.supervisors or stream_id in self.holdings.acquiring:
            return False
        self.holdings.acquiring.add(stream_id)
        try:
            sent = self.clock.monotonic()
            try:
                got = await self.leases.take_over(TakeOver(
                    stream_id, dead.worker_id, dead.epoch, self.ctx.owner,
                    self.clock.wall_ms(), self.settings.timings, epoch=self.membership.epoch),
                    timeout=2 * self.settings.call_s)
                if got is not None:
                    got = await self.holdings.resume_where_the_sink_is(got)
            except StoreError as exc:
                self.holdings.unsure.add(stream_id)  # it may have applied: read back next cycle
                event(logging.WARNING, "lease.acquire_failed",
                      "take-over failed; its outcome is checked at the next cycle",
                      error=str(exc), stream=stream_id)
                return False
            if got is None:
                return False  # released, taken by another survivor, or never held by it
            await self.holdings.start(got, sent, None, dead.worker_id, how="takeover")
            served = stream_id in self.holdings.supervisors
            if served:
                self.metrics.dead_streams_taken(1)
            return served
        except BaseException:
            self.holdings.unsure.add(stream_id)  # cancelled mid-call: it may have applied
            raise
        finally:
            self.holdings.acquiring.discard(stream_id)
