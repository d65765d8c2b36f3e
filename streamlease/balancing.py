"""Balancing: how many orphans this worker takes at a cycle, and which streams it hands
over so the fleet evens out.

The share comes from the leader's bulletin (``streamlease.core.bulletin``) or, reading
every member row, from this worker's own plan (``streamlease.core.balance``); this role
carries the plan out: it sheds through each supervisor's graceful drain, paces its
hand-overs until the takers' counts show, and keeps a stream it just gave from coming
straight back.
"""

from __future__ import annotations

import logging
from collections import deque

from streamlease.context import Context
from streamlease.core import balance, bulletin
from streamlease.core.lease import HolderState, StopReason
from streamlease.core.model import StreamRecord
from streamlease.holdings import Holdings, MemberGate
from streamlease.logs import event
from streamlease.reconcile_settings import ReconcilerSettings

# A rebalance that every peer asked said no to (``handover.kept``) pauses shedding this
# many heartbeats: the rows or the bulletin that named those peers short lag their own
# counts, and a worker shedding again at once would be told no again, stream by stream.
KEPT_PAUSE_HEARTBEATS = 4


class Balancer:
    def __init__(self, ctx: Context, settings: ReconcilerSettings, holdings: Holdings,
                 membership: MemberGate) -> None:
        self.ctx = ctx
        self.settings = settings
        self.holdings = holdings
        self.membership = membership
        self.share = 0  # this worker's fair share at the last cycle
        self._next_shed = 0.0
        # The bulletin the last shed followed, and when: shed again on a newer one.
        self._shed_after: tuple[bulletin.Bulletin | None, float] = (None, 0.0)
        # Streams this worker handed over to even out the fleet, and when: it does not take
        # them back itself before they wait three reconcile intervals (see take_back).
        self._handed_over: dict[str, float] = {}
        self._totals: deque[tuple[float, int]] = deque()  # (when, streams counted) lately

    def donor(self) -> bool:
        """The leader's bulletin asks this worker to give a stream (its cycle sheds it), or
        a hand-over of its own is still in flight."""
        news = self.membership.bulletin
        return (news is not None and self.ctx.owner in news.donors) or self._handing_over()

    def _handing_over(self) -> bool:
        return any(s.leaving is StopReason.REBALANCE
                   for s in self.holdings.supervisors.values())

    def take_back(self, acquirable: list[StreamRecord], waited: balance.Waited,
                  now: float) -> list[StreamRecord]:
        """``acquirable`` without the streams this worker handed over lately, until they
        have waited three reconcile intervals (``abandoned``: anyone takes them then).

        A hand-over follows counts that lag: the member that gave a stream may read, a
        cycle later, a plan that still shows it short, and would take its own stream back
        (two moves, nothing evened out). The members below their share take it instead.
        """
        keep_for = self.settings.supervisor.drain_timeout_s + 3 * self.settings.reconcile_s
        for stream_id, at in list(self._handed_over.items()):
            if now - at > keep_for:
                del self._handed_over[stream_id]
        if not self._handed_over:
            return acquirable
        return [r for r in acquirable if r.stream_id not in self._handed_over
                or r.stream_id in waited.abandoned]

    def intake(self, servable: int, waited: balance.Waited, now: float) -> int:
        """Shed what the balance plan says; how many orphans to take now.

        Orphans are dealt to whoever the member rows show furthest below its share, but
        rows lag: a member may look short only because its row does not yet show what it
        took. An orphan still waiting half a reconcile interval after it was first seen
        (its dealt taker, polling every fifth of one, would have had it by then) is taken
        by any member still below its share by its own live count, which never takes it
        past its share. Orphans that waited two intervals (``starving``) are taken by
        any member with room inside its band (share + TOLERANCE), so balance never
        leaves a stream unserved and a member at its share takes one, not a heap it
        sheds again later; past the band, a member that would take nothing else takes
        what waited three (``abandoned``: shares computed from rows that undercount, or
        short members that cannot take)."""
        owner, view = self.ctx.owner, self.membership.view
        if not view.members:
            self.share = self.settings.max_streams  # no fleet view yet: take as before
            return self.settings.acquire_per_cycle
        # Streams being handed over are no longer this worker's to count.
        keeping = sum(1 for s in self.holdings.supervisors.values()
                      if s.leaving is not StopReason.REBALANCE)
        news = self.membership.bulletin
        if news is not None and not self.membership.reading_all:
            # The leader's bulletin: the share level, the gaps, the donors.
            plan = bulletin.plan_from(news, owner, self.settings.max_streams,
                                      keeping, self.membership.accepting, servable)
            return self._follow(plan, keeping, waited, now, news)
        counts, active = balance.counts_of(list(view.members), owner, keeping,
                                           view.observed_dead)
        capacities = {m.worker_id: m.capacity for m in view.members}
        capacities[owner] = self.settings.max_streams
        if self.membership.accepting:
            active.add(owner)
        else:
            active.discard(owner)
        counted = sum(counts.values()) + servable
        self._totals.append((now, counted))
        while self._totals and self._totals[0][0] < now - 3 * self.settings.stopped_check_s:
            self._totals.popleft()
        plan = balance.plan(owner, counts, active, capacities, servable,
                            total_at_least=max(t for _, t in self._totals))
        return self._follow(plan, keeping, waited, now)

    def _follow(self, plan: balance.Balance, keeping: int, waited: balance.Waited,
                now: float, news: bulletin.Bulletin | None = None) -> int:
        """Shed what ``plan`` (made from the leader's bulletin ``news``, if given) says;
        how many orphans to take now."""
        self.ctx.metrics.share(plan.share)
        self.share = self.holdings.share_level = plan.share
        if plan.shed:
            self._shed(plan.shed, now, news)
        return balance.intake(plan, keeping, waited)

    def _shed(self, count: int, now: float, news: bulletin.Bulletin | None = None) -> None:
        """Hand ``count`` streams over through the graceful path (stop reading, flush,
        checkpoint, release), the longest held first, never one held less than the
        minimum hold time; then pause shedding until the takers' counts can be seen: a
        heartbeat when planning from the rows; from the leader's bulletin, until a
        bulletin that differs from the one the last shed followed (the leader has seen
        the counts move), or four heartbeats if none comes. A stream kept because every
        peer asked said no (``handover.kept``) pauses shedding for four heartbeats too:
        the peers this worker counted as short were not, as they count themselves."""
        if now < self._next_shed or self._handing_over():
            return  # the last hand-over is still in flight, or its takers not yet seen
        pause = KEPT_PAUSE_HEARTBEATS * self.settings.stopped_check_s
        if any(s.kept_at is not None and now - s.kept_at < pause
               for s in self.holdings.supervisors.values()):
            return  # its view of who is short is off: shedding more would be kept too
        if news is not None and news == self._shed_after[0] and \
                now < self._shed_after[1] + 4 * self.settings.stopped_check_s:
            return  # the bulletin does not show the last hand-over yet
        held = self.holdings.supervisors
        movable = [s for s in held.values() if s.holding.state is HolderState.HOLDING
                   and now - s.acquired_at >= self.settings.min_hold_s]
        movable.sort(key=lambda s: s.acquired_at)
        chosen = movable[:count]
        takers = self.holdings.takers([s.stream for s in chosen], rebalance=True)
        for supervisor in chosen:
            supervisor.request_drain(StopReason.REBALANCE, taker=takers.get(supervisor.stream))
            self._handed_over[supervisor.stream] = now
        if chosen:
            self.ctx.metrics.rebalance_moved(len(chosen))
            event(logging.INFO, "balance.shed", "handing streams over to even out the fleet",
                  streams=[s.stream for s in chosen], held=len(held))
            # The takers' new counts reach the member rows within a heartbeat.
            self._next_shed = now + 1.5 * self.settings.stopped_check_s
            self._shed_after = (news, now)
