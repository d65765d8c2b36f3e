"""Watching the fleet, every ``observe_s``.

The fleet leader reads every member row with one consistent Query; a member whose counter
has not moved for ``LEASE`` on the leader's monotonic clock is dead (``core.membership``),
and its deal begins (``deal``). From the rows the leader composes its bulletin
(``bulletin``). Every other member reads only the leader's row (one GetItem): its
bulletin, and the leader's own liveness, which it watches the same way. So a member's
reads do not grow with the fleet. A member that knows no leader, or finds no bulletin in
the leader's row (a new leader, a leader just fenced), reads every row as the leader does
until a bulletin appears (``STREAMLEASE_FLEET_VIEW=all`` always does): deaths of other
members are then seen by the first live member by id at once and by the others a quarter
lease later. A new leader starts observing afresh, so while leadership changes hands,
deaths are seen up to one leader take-over later.

In a fleet spread over several keys (``core.layout``) a member reads its own key's copy of
the leader's bulletin instead of the leader's row, and watches the leader's counter
there; a copy standing still for a lease sends it to the leader's row to decide.
"""

from __future__ import annotations

import dataclasses
import logging

from streamlease.clock import sleep_unless
from streamlease.core import bulletin as bulletins
from streamlease.core import layout
from streamlease.core.backoff import jittered
from streamlease.core.bulletin import newly_donor
from streamlease.core.membership import MemberRecord, MemberStatus, Observer
from streamlease.errors import StoreError
from streamlease.logs import event
from streamlease.membership.bulletin import Listener, Publisher
from streamlease.membership.deal import Dealer
from streamlease.membership.row import OwnRow
from streamlease.membership.shared import FleetView, Parts

# A member of a spread fleet with no usable copy of the leader's bulletin reads every
# member row only once copies have been missing this long, up to twice as long at random,
# and then once in such an interval (``Watcher._waiting_for_copies``).
SPREAD_FULL_READ_S = 60.0


class Watcher:
    """The observe loop: what this worker reads of the fleet, and what it makes of it."""

    def __init__(self, parts: Parts, row: OwnRow, listener: Listener, publisher: Publisher,
                 dealer: Dealer) -> None:
        self.parts = parts
        self.row = row
        self.listener = listener
        self.publisher = publisher
        self.dealer = dealer
        self.observer = Observer(parts.me, parts.timings.lease_s)
        # The leader's row as a copy showed it standing still for a lease: its own row is
        # read instead until it says whether the leader lives (``_observe_suspect``); and
        # the counter that row showed at the last such read.
        self._suspect: MemberRecord | None = None
        self._suspect_beat: int | None = None
        # (leader, epoch) of copies left by a leader row since fenced or gone: as its DEAD
        # row would, they send this member to every row.
        self.stale_copies: tuple[str, int] | None = None
        self._full_read_at = float("-inf")  # monotonic: the last read of every member row
        self._no_copy_since: float | None = None  # no usable copy of the bulletin since
        self._no_copy_wait = SPREAD_FULL_READ_S
        # (leader, epoch, heartbeat) of the newest leader's row read: a read older than it
        # (eventually consistent) is not acted on.
        self._newest_leader_row: tuple[str, int, int] | None = None

    async def observe_loop(self) -> None:
        p = self.parts
        while not p.stop.is_set():
            try:
                await self.observe()
            except StoreError as exc:
                event(logging.WARNING, "member.observe_failed", "cannot read the fleet",
                      error=str(exc))
            except Exception:
                p.metrics.task_crashed("membership")
                event(logging.ERROR, "member.observe_crashed", "observing the fleet crashed",
                      exc_info=True)
            p.metrics.change_feed_live(self.listener.feed_live())
            # A strained store (this worker's own heartbeats slow or unanswered) is read
            # once a heartbeat instead of twice: deaths are seen a little later, never
            # sooner, and the heartbeat keeps its place in the store's queue.
            every = p.timings.observe_s
            if p.settings.fleet_view == "leader" and p.hooks.leading():
                # The leader is the fleet's only watcher, and every other member hears of
                # a death one read of its row later: it reads twice as often (one Query
                # for the whole fleet), so deaths are seen no later than before.
                every /= 2
            elif p.settings.fleet_view == "leader" and self.listener.feed_live():
                every = min(every, self.listener.read_s)  # one row: the notices, sooner
                if p.clock.monotonic() < self.listener.handoffs_until:
                    # a hand-off's offers in flight
                    every = min(every, self.listener.handoff_read_s)
            if self.row.strain.strained():
                every = max(every, p.timings.heartbeat_s)
            await sleep_unless(jittered(every, 0.1, p.rng), p.stop)

    async def observe(self) -> None:
        p = self.parts
        if p.settings.fleet_view == "leader" and not p.hooks.leading():
            leader = p.hooks.leader()
            if self._suspect is not None and self._suspect.worker_id != leader:
                self._suspect = self._suspect_beat = None  # another leader now
            if leader is not None and leader != p.me:
                if self._suspect is not None:
                    if await self._observe_suspect(self._suspect):
                        self._no_copy_since = None
                        return
                elif await self._observe_leader(leader):
                    self._no_copy_since = None
                    return
            if p.known.shards > 1 and self._waiting_for_copies():
                return
        await self.observe_all()

    def _waiting_for_copies(self) -> bool:
        """No usable copy of the bulletin in a spread fleet (a leader change, a leader
        fenced): wait for the next leader's copies, planning from the last bulletin, rather
        than every member reading every key each interval (many times the keys' read
        limits in a large fleet, the new leader's own reads throttled with them). Deaths
        wait for the next leader meanwhile. Only copies missing for one to two minutes
        (at random, so members spread out) make a member read every key, and then once
        in such an interval."""
        now = self.parts.clock.monotonic()
        if self._no_copy_since is None:
            self._no_copy_since = now
            self._no_copy_wait = SPREAD_FULL_READ_S * (1 + self.parts.rng.random())
        return now - max(self._no_copy_since, self._full_read_at) < self._no_copy_wait

    async def _observe_suspect(self, copied: MemberRecord) -> bool:
        """The leader's copy stood still for a lease, but a copy is written after the
        heartbeat, so a leader that died between the two left its row a counter ahead, and
        a fence conditioned on the copy's counter could never match. Its own row decides
        (one consistent read, watched like any row): moved on between two reads, the
        leader lives and its copies are read again; fenced or gone, its copies count as
        its DEAD row would (False); standing still for a lease, it is fenced."""
        p = self.parts
        sent = p.clock.monotonic()
        row = await p.fleet.member(copied.worker_id, timeout=p.timings.heartbeat_s,
                                   shard=copied.shard)
        received = p.clock.monotonic()
        if row is None or not row.live_status or row.epoch != copied.epoch:
            self._suspect = self._suspect_beat = None
            self.stale_copies = (copied.worker_id, copied.epoch)
            return False
        if self._suspect_beat is not None and row.heartbeat > self._suspect_beat:
            # It moved between two reads: alive, its copies lag (failing or refused).
            self._suspect = self._suspect_beat = None
            return True
        self._suspect_beat = row.heartbeat
        p.metrics.member_rows_read(1)
        if self.observer.observe([row], sent, received):
            self.dealer.spawn(self.dealer.take_over(row))
        return True

    async def _observe_leader(self, leader: str) -> bool:
        """Read the leader's row only: its bulletin, and whether the leader lives. False
        if it carries no readable bulletin (then every row is read instead)."""
        p, known = self.parts, self.parts.known
        sent = p.clock.monotonic()
        # Eventually consistent: half the read units of a consistent read, so reading
        # twice as often as a consistent read would costs the leader's key nothing more.
        # A read a moment old only delays a notice; a stale counter only delays finding
        # the leader dead (and fencing it is conditioned on the counter as seen).
        row: MemberRecord | None
        copied = known.shards > 1
        if copied:
            # A spread layout: this worker's own key holds the leader's bulletin, copied.
            replica = await p.fleet.replica(self.row.shard, timeout=p.timings.heartbeat_s)
            row = replica.leader_row() if replica is not None and replica.leader == leader \
                and (replica.leader, replica.epoch) != self.stale_copies else None
        else:
            row = await p.fleet.member(leader, timeout=p.timings.heartbeat_s,
                                       consistent=False)
        received = p.clock.monotonic()
        if row is not None and self._read_before(row):
            return True  # older than a row already read: nothing in it is news
        self._newest_leader_row = (row.worker_id, row.epoch, row.heartbeat) \
            if row is not None else None
        # A draining leader is handing its streams and its leadership over: its bulletin
        # does not count what it releases, so the members read every row meanwhile. In a
        # spread fleet that would be every member reading every key each interval: they
        # plan from its copy instead, told that someone drains (they poll the orphans
        # fast, and what their shares leave is taken by the waiting tiers).
        trusted = (MemberStatus.ACTIVE, MemberStatus.DRAINING) if copied \
            else (MemberStatus.ACTIVE,)
        news = bulletins.decode(row.bulletin) \
            if row is not None and row.status in trusted else None
        if news is not None and row is not None and row.status is MemberStatus.DRAINING:
            news = dataclasses.replace(news, draining=True)
        if row is None or news is None:
            if row is not None and row.bulletin is not None and \
                    row.status is MemberStatus.ACTIVE:
                p.metrics.bulletin_unreadable()
                event(logging.WARNING, "member.bulletin_unreadable",
                      "the leader's row carries a bulletin this worker cannot read; "
                      "reading every member row instead", leader=leader)
            return False
        known.shards = max(known.shards, layout.valid_shards(news.shards))
        p.metrics.member_keys(known.shards)
        dead = self.observer.observe([row], sent, received)
        if dead and copied:
            # Its own row decides (``_observe_suspect``), from now.
            self._suspect, self._suspect_beat = row, None
            return await self._observe_suspect(row)
        self.publisher.stand_down()
        self.listener.hear(news, received, row.worker_id, row.heartbeat)
        before = None if known.reading_all else known.bulletin
        before_row = None if known.reading_all or not known.view.members \
            else known.view.members[0]
        known.bulletin, known.reading_all = news, False
        known.view = FleetView((row,), frozenset(m.worker_id for m in dead))
        p.metrics.member_counts(dict(news.statuses))
        p.metrics.member_rows_read(1)
        if before is None or before.gen != news.gen or before_row is None or \
                (before_row.worker_id, before_row.handoffs) != (row.worker_id, row.handoffs) \
                or newly_donor(p.me, before, news):
            p.hooks.fleet_changed()
        self.dealer.forget_pending()
        if dead:
            self.dealer.spawn(self.dealer.take_over(row))  # the leader is watched too
        return True

    def _read_before(self, row: MemberRecord) -> bool:
        """An eventually consistent read older than one already read (the same leader and
        epoch, a lower heartbeat counter): planning from it would step back in time."""
        newest = self._newest_leader_row
        return newest is not None and newest[:2] == (row.worker_id, row.epoch) and \
            row.heartbeat < newest[2]

    async def observe_all(self) -> None:
        """Read every member row: the leader composes its bulletin from them; a member
        hears the leader's notices in them."""
        p, known = self.parts, self.parts.known
        sent = p.clock.monotonic()
        rows, known.shards = await p.fleet.roster(timeout=p.timings.heartbeat_s)
        received = self._full_read_at = p.clock.monotonic()
        p.metrics.member_keys(known.shards)
        members, older = layout.one_row_each(rows)
        if older and p.hooks.leading():
            self.dealer.forget_duplicates(older)
        dead = self.observer.observe(members, sent, received)
        before = known.view
        known.view = FleetView(tuple(members), frozenset(m.worker_id for m in dead))
        known.reading_all = True
        p.metrics.members(known.view.members, known.view.observed_dead)
        p.metrics.member_rows_read(len(members))
        changed = _changed(before, known.view)
        if p.hooks.leading():
            self.publisher.led(before, changed, received)
            await self.publisher.consider_spread(members)
        else:
            known.bulletin = None
            self.publisher.stand_down()
            self.publisher.forget_totals()
            # Reading every row, this member still hears the leader's notices.
            leader = p.hooks.leader()
            row = next((m for m in members if m.worker_id == leader), None)
            news = bulletins.decode(row.bulletin) \
                if row is not None and row.status is MemberStatus.ACTIVE else None
            if news is not None and row is not None:
                self.listener.hear(news, received, row.worker_id, row.heartbeat)
        if changed:
            p.hooks.fleet_changed()
        self.dealer.found(dead, members, received)


def _changed(before: FleetView, after: FleetView) -> bool:
    """Worth a reconcile now: someone joined, left, died, was released, started draining,
    or handed streams over."""
    def shape(view: FleetView) -> set[tuple[str, str, bool, int, bool]]:
        return {(m.worker_id, m.status.value, m.released, m.handoffs,
                 m.worker_id in view.observed_dead) for m in view.members}
    return shape(before) != shape(after)
