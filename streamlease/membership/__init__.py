"""This worker's fleet membership (the rules are in ``streamlease.core.membership``),
as roles that ``Membership`` composes:

* ``row`` — its own row: registration, the heartbeat and the liveness it proves, the
  epoch and the incarnation, draining and leaving;
* ``observe`` — the leader watching every row and judging deaths on its own clock; a
  member reading the leader's row (or its key's copy of it);
* ``bulletin`` — the leader's bulletin, composed and written with its heartbeat, and
  heard by the others;
* ``deal`` — a dead member fenced, its streams dealt to the survivors or released.

Lease upkeep is O(workers): a member write every heartbeat per worker, however many
streams it holds; each stream's own lease is renewed only every ``STREAM_RENEW_SECONDS``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from streamlease.context import Context
from streamlease.core.membership import MemberRecord
from streamlease.membership.bulletin import (
    DONOR_PAUSE_HEARTBEATS,
    FEED_READ_S,
    HANDOFF_READ_S,
    HANDOFF_READS_FOR_S,
    HANDOFF_READS_PER_S,
    Listener,
    Publisher,
)
from streamlease.membership.deal import SECOND_PASS_S, Dealer
from streamlease.membership.observe import SPREAD_FULL_READ_S, Watcher
from streamlease.membership.row import OwnRow
from streamlease.membership.shared import (
    FleetKnowledge,
    FleetView,
    Hooks,
    MembershipSettings,
    Parts,
)
from streamlease.store.protocols import FleetStore

__all__ = ["DONOR_PAUSE_HEARTBEATS", "FEED_READ_S", "HANDOFF_READS_FOR_S",
           "HANDOFF_READS_PER_S", "HANDOFF_READ_S", "SECOND_PASS_S", "SPREAD_FULL_READ_S",
           "FleetKnowledge", "FleetView", "Hooks", "Membership", "MembershipSettings"]


class Membership(FleetKnowledge):
    """The roles, and what the rest of the worker asks of them; the fleet as this worker
    knows it (``FleetKnowledge``) is what they keep up to date."""

    def __init__(self, ctx: Context, fleet: FleetStore, settings: MembershipSettings,
                 hooks: Hooks) -> None:
        """``ctx.leases`` releases a dead member's streams on its behalf."""
        super().__init__()
        self.clock, self.metrics, self.settings, self.hooks = \
            ctx.clock, ctx.metrics, settings, hooks
        self.me = settings.me
        self.parts = parts = Parts(fleet, ctx.clock, ctx.metrics, settings, hooks, ctx.rng,
                                   self, asyncio.Event())
        self.row = OwnRow(parts, again=self.register, halt=self.stop)
        self.publisher = self.row.carrier = Publisher(parts, self.row)
        self.listener = Listener(parts, self.publisher)
        self.dealer = Dealer(parts, self.row, self.publisher, ctx.leases,
                             read_all=lambda: self.watcher.observe_all())
        self.watcher = Watcher(parts, self.row, self.listener, self.publisher, self.dealer)
        self._leftovers_again = False  # a second look for an earlier incarnation's streams
        # What the rest of the worker asks, by role.
        self.may_write, self.drain = self.row.may_write, self.row.drain
        self.counts_changed, self.leave = self.row.counts_changed, self.row.leave
        self.campaign_urgent = self.listener.campaign_urgent
        self.post, self.published = self.publisher.post, self.publisher.wait_published
        self.feed_running, self.share_level = \
            self.publisher.feed_running, self.publisher.share_level
        self.deal_window_s = self.dealer.deal_window_s

    @property
    def epoch(self) -> int:
        return self.row.epoch

    @property
    def shard(self) -> int:
        return self.row.shard

    @property
    def incarnation(self) -> str:
        return self.row.incarnation

    @property
    def superseded(self) -> MemberRecord | None:
        """Set once another process registered under this worker id: this one exits."""
        return self.row.superseded

    @property
    def accepting(self) -> bool:
        """May this worker take streams now (alive, registered, not draining)?"""
        return self.row.accepting

    @property
    def leader_still_s(self) -> float:
        return self.listener.leader_still_s

    def feed_live(self) -> bool:
        return self.listener.feed_live()

    async def offer_to(self, member: MemberRecord, offer: str) -> bool:
        """Hand a stream to ``member``: ``offer`` into its row (``core.handover``)."""
        return await self.parts.fleet.offer(member.worker_id, member.epoch, offer,
                                            shard=member.shard,
                                            timeout=self.settings.timings.heartbeat_s)

    async def offers_done(self, offers: Sequence[str]) -> None:
        """This worker acted on ``offers``: off its row."""
        await self.parts.fleet.clear_offers(self.me, self.epoch, offers, shard=self.shard,
                                            timeout=self.settings.timings.heartbeat_s)

    def handed_off(self) -> None:
        """Streams were released for others to take: tell peers now, not next heartbeat."""
        self.publisher.handed_over_at = self.clock.monotonic()
        self.row.handed_off()

    async def register(self) -> None:
        """Register a new incarnation, then release what earlier incarnations of this
        worker id left behind (their streams carry an older epoch)."""
        await self.row.register()
        self.publisher.replica_due = None  # a copy of the last incarnation's heartbeat
        await self.dealer.release_leftovers()
        # The owner index lags: a stream the earlier incarnation took just before it went
        # may show up a moment later. Look again once the membership runs.
        self._leftovers_again = True

    def stop(self) -> None:
        self.parts.stop.set()
        self.row.beat_now.set()
        self.publisher.replica_wake.set()
        self.dealer.cancel()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self.dealer.tg = tg
            tg.create_task(self.row.heartbeat_loop(), name="member heartbeat")
            tg.create_task(self.watcher.observe_loop(), name="member observe")
            tg.create_task(self.publisher.replica_loop(), name="member replicas")
            if self._leftovers_again:
                self._leftovers_again = False
                self.dealer.spawn(self.dealer.release_leftovers(
                    min(SECOND_PASS_S, self.settings.timings.lease_s)))
        self.dealer.tg = None
