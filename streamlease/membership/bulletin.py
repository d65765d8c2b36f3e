"""The leader's bulletin (``streamlease.core.bulletin``): published by the leader,
heard by every other member.

The leader (``Publisher``) composes it from every row it read, writes it into its own row
with its heartbeat and, in a fleet spread over several keys (``streamlease.core.layout``),
copies it after each heartbeat, with that heartbeat's counter, into a replica in each key;
it also moves the layout up once every row says it can read it, and keeps the change
feed's notices. A member (``Listener``) hears the notices for it, each acted on once,
whether the leader vouches for its change feed, and whether the leader's heartbeat
counter still moves in its reads (a dead leader leaves its row, and its vouching, behind).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets

from streamlease.clock import sleep_unless
from streamlease.core import bulletin as bulletins
from streamlease.core import layout
from streamlease.core.bulletin import Bulletin, FleetRead, newly_donor
from streamlease.core.layout import Replica
from streamlease.core.membership import MemberRecord, MemberStatus, MemberTimings
from streamlease.core.notices import NoticeBoard, NoticeKind, fresh
from streamlease.errors import StoreError
from streamlease.logs import event
from streamlease.membership.row import OwnRow
from streamlease.membership.shared import FleetView, Parts
from streamlease.store.protocols import Heartbeat

# After a member hands streams over, the leader names no donors for this many member
# heartbeats: the streams in flight show in nobody's row and as no orphan yet (released,
# the index not caught up, or taken and the taker's row not rewritten), so the takers look
# short and a donor would give a stream the fleet does not need moved.
DONOR_PAUSE_HEARTBEATS = 2.0
# While the leader's change feed is live, members read its row at least this often: its
# notices (a STOPPED flip, a new ws_url, a stream to take) reach them within half a second.
# Eventually consistent reads at this rate cost the read units of consistent ones at 1 s.
FEED_READ_S = 0.5
# While the leader's bulletin says someone drains, or carries a notice for this worker it
# had not seen (a hand-off's streams are offered one by one as each is released), its row
# is read this often for HANDOFF_READS_FOR_S: the next offer reaches its taker a fifth as
# late. A quiet fleet reads at FEED_READ_S, and the speed-up is spread so that the fleet
# adds at most HANDOFF_READS_PER_S reads of the leader's key however large it is (one of a
# few hundred members reads no faster than FEED_READ_S).
HANDOFF_READ_S = 0.1
HANDOFF_READS_FOR_S = 2.0
HANDOFF_READS_PER_S = 250.0


def notice_ttl_s(timings: MemberTimings) -> float:
    """How long a notice stays in the bulletin: four regular reads of the fleet, and never
    under five seconds, so a member that misses a read or two still sees it."""
    return max(5.0, 4 * timings.observe_s)


class Publisher:
    """This worker's bulletin while it leads: the ``Carrier`` of its heartbeat."""

    def __init__(self, parts: Parts, row: OwnRow) -> None:
        self.parts = parts
        self.row = row
        self.gen = 0  # the generation of the bulletins this worker composes
        self.composed: Bulletin | None = None
        self._totals: list[tuple[float, int]] = []  # (when, total counted) while leading
        self.handed_over_at = float("-inf")  # the last hand-over seen (monotonic)
        # The change feed's notices: the leader's board (posted by its feed duty).
        self.notices = NoticeBoard(secrets.randbits(40), notice_ttl_s(parts.timings))
        self._feed_up = False  # this worker leads and its change feed runs
        self._vouch = secrets.randbits(20) + 1  # this leader's stretch of vouching (>= 1)
        self.read_all_leading = False  # a full read of the rows since this term began
        self.published = 0  # the newest notice a written bulletin carried
        self._published_changed = asyncio.Event()
        # The copy of the bulletin the leader's replicas are to show (built from the
        # heartbeat that carried it), and the newest notice in it; the replica loop writes
        # the newest.
        self.replica_due: tuple[Replica, int] | None = None
        self.replica_wake = asyncio.Event()
        self._layout_held = False  # said once that a row keeps the layout from spreading

    # -- the change feed's notices --------------------------------------------------------

    def feed_vouched(self, now: float) -> bool:
        return self._feed_up and not self.notices.overflowed(now)

    def share_level(self) -> int | None:
        """The fair-share level of the bulletin this leader composed (None: none yet)."""
        return self.composed.level if self.composed is not None else None

    def feed_running(self, up: bool) -> None:
        """The leader's change feed started (or stopped) vouching for its notices."""
        if up != self._feed_up:
            self._feed_up = up
            self.parts.metrics.change_feed_live(up)
            if up:
                # A new stretch: members see the gap, however short, and catch up.
                self._vouch += 1
                self.parts.hooks.feed_resumed()
            self.recompose()

    def post(self, member: str, stream: str, kind: NoticeKind) -> int:
        """A notice for ``member`` (this leader's own are acted on at once); the
        bulletin carrying it is written at once. Its number, for ``published``."""
        p = self.parts
        notice = self.notices.post(member, stream, kind, p.clock.monotonic())
        if member == p.me:
            p.metrics.notice(notice.kind.value)
            p.hooks.notice(notice)
        self.recompose()
        return notice.n

    async def wait_published(self, n: int, timeout: float) -> bool:
        """Until a written bulletin has carried notice ``n``; False after ``timeout``."""
        p = self.parts
        deadline = p.clock.monotonic() + timeout
        while self.published < n:
            left = deadline - p.clock.monotonic()
            if left <= 0 or p.stop.is_set() or self.row.status is not MemberStatus.ACTIVE:
                return False  # members do not read a draining leader's bulletin
            self._published_changed.clear()
            await sleep_unless(left, self._published_changed, p.stop)
        return True

    def _mark_published(self, newest: int) -> None:
        self.published = max(self.published, newest)
        self._published_changed.set()

    # -- composing ------------------------------------------------------------------------

    def recompose(self) -> None:
        # Only from every row read in this term (not the leader's row a member read).
        if self.parts.hooks.leading() and self.read_all_leading:
            self.compose(self.parts.clock.monotonic())

    def led(self, before: FleetView, changed: bool, received: float) -> None:
        """The leader read every row (the view was ``before``; ``changed``: worth a
        reconcile)."""
        if changed:
            self.gen += 1
        if _handed_over(before, self.parts.known.view):
            self.handed_over_at = received
        self.read_all_leading = True
        self.compose(received)

    def dealt(self) -> None:
        """The leader fenced a member: its deal rides the next heartbeat."""
        self.gen += 1
        self.compose(self.parts.clock.monotonic())

    def stand_down(self) -> None:
        """Not leading: nothing of an earlier term is written."""
        self.read_all_leading = False
        self.composed = None

    def compose(self, now: float) -> None:
        """The leader's bulletin from the rows it read (its own count live). Written at
        once when membership moved, someone drains, or the donors or the deals changed;
        changed counts alone ride the next regular heartbeat (the leader would otherwise
        write every read interval while streams come and go). Its generation moves only
        when the fleet did (someone joined, left, died, was released, drains or handed
        streams over): that is what pokes the other members' reconcilers."""
        p, known = self.parts, self.parts.known
        held = p.hooks.held()
        orphans = p.hooks.orphans()
        counted = sum(m.streams for m in known.view.members
                      if m.worker_id != p.me and (m.live_status or not m.released)) \
            + held + orphans
        self._totals.append((now, counted))
        self._totals = [(at, n) for at, n in self._totals
                        if at >= now - 3 * p.timings.heartbeat_s]
        settling = now < self.handed_over_at + DONOR_PAUSE_HEARTBEATS * p.timings.heartbeat_s
        news = bulletins.compose(FleetRead(
            known.view.members, known.view.observed_dead, p.me, held, self.row.accepting,
            orphans, self.gen, total_at_least=max(n for _, n in self._totals),
            name_donors=not settling, feed=self._vouch if self.feed_vouched(now) else 0,
            notices=self.notices.current(now), shards=known.shards))
        before, self.composed = self.composed, news
        known.bulletin = news
        if newly_donor(p.me, before, news):
            p.hooks.fleet_changed()  # its own reconciler sheds now, not at a quiet cycle
        if before is not None and \
                (news.gen, news.draining, news.donors, news.deals, news.feed, news.shards) == \
                (before.gen, before.draining, before.donors, before.deals, before.feed,
                 before.shards) and \
                {x.n for x in news.notices} <= {x.n for x in before.notices}:
            return  # counts only (or notices expired): the next heartbeat carries them
        self.row.publish_now()

    def forget_totals(self) -> None:
        self._totals.clear()

    # -- carried by the heartbeat, copied into every key ----------------------------------

    def due(self) -> Bulletin | None:
        return self.composed if self.parts.hooks.leading() else None

    def carried(self, beat: Heartbeat, bulletin: Bulletin, counter: int | None) -> None:
        newest = bulletin.notices[-1].n if bulletin.notices else 0
        if bulletin.shards > 1 and counter is not None:
            # Members read the replicas: a notice is out once they carry it. The copy
            # shows the row exactly as this heartbeat left it.
            assert beat.bulletin is not None
            self.replica_due = (Replica(
                leader=beat.worker_id, shard=beat.shard, epoch=beat.epoch, heartbeat=counter,
                fence=self.parts.hooks.leader_fence(), shards=bulletin.shards,
                bulletin=beat.bulletin, status=beat.status, handoffs=beat.handoffs), newest)
            self.replica_wake.set()
        elif newest:
            self._mark_published(newest)

    async def replica_loop(self) -> None:
        """While leading a spread layout: copy each bulletin the leader's heartbeat wrote,
        with that heartbeat's counter, into every key (the newest one: a bulletin that a
        newer one overtook while the keys were written is skipped)."""
        p = self.parts
        while not p.stop.is_set():
            await sleep_unless(p.timings.heartbeat_s, self.replica_wake, p.stop)
            self.replica_wake.clear()
            due, self.replica_due = self.replica_due, None
            if due is None or not p.hooks.leading():
                continue
            replica, newest = due
            if replica.epoch != self.row.epoch:
                continue  # fenced and registered again since: that row is gone
            try:
                written = await p.fleet.publish(replica, replica.shards,
                                                timeout=p.timings.heartbeat_s)
            except StoreError as exc:
                p.metrics.replica_failed()
                event(logging.WARNING, "member.replica_failed",
                      "could not copy the bulletin into every member key; the next "
                      "heartbeat's copy retries", shards=p.known.shards, error=str(exc))
                continue
            except Exception:
                p.metrics.task_crashed("membership")
                event(logging.ERROR, "member.replica_crashed", "copying the bulletin crashed",
                      exc_info=True)
                continue
            if written < replica.shards:
                # A copy under a higher leader fence is there: this worker no longer leads
                # (or the leader backend was changed and its fences start lower).
                p.metrics.replica_failed()
                event(logging.WARNING, "member.replica_refused",
                      "keys hold a copy of a newer leader's bulletin; this one was not "
                      "written there", shards=replica.shards, written=written,
                      fence=replica.fence)
                continue
            if newest:
                self._mark_published(newest)

    async def consider_spread(self, members: list[MemberRecord]) -> None:
        """The leader moves the layout up when its keys hold more rows than
        ``members_per_key`` each (``layout.shards_for``), once every row may read it (one
        conditional write, rarely: in the read's own step). First it writes a copy of its
        bulletin into every key of the new layout: members that learn of it find their
        copy at once, and a task role not allowed to write there (``MEMBER#*``) keeps the
        layout where it is instead of shutting new members out."""
        p, known = self.parts, self.parts.known
        live = [m for m in members if m.status is not MemberStatus.DEAD]
        want = layout.shards_for(len(live), known.shards, p.settings.members_per_key)
        older = [m.worker_id for m in live if not layout.reads_layout(m)]
        if older and (want > known.shards or known.shards > 1):
            if not self._layout_held:
                self._layout_held = True
                event(logging.WARNING, "member.layout_held",
                      "some members run a release that cannot read a spread layout: the "
                      "member rows do not spread further, and those members see only part "
                      "of a spread fleet", shards=known.shards, want=want, members=len(live),
                      older=sorted(older)[:10], older_count=len(older))
        elif not older:
            self._layout_held = False
        mine = next((m for m in live if m.worker_id == p.me), None)
        if want <= known.shards or older or mine is None or self.composed is None:
            return
        copy = Replica(leader=p.me, shard=mine.shard, epoch=mine.epoch,
                       heartbeat=mine.heartbeat, fence=p.hooks.leader_fence(), shards=want,
                       bulletin=bulletins.encode(dataclasses.replace(self.composed,
                                                                     shards=want)),
                       status=mine.status, handoffs=mine.handoffs)
        try:
            if await p.fleet.publish(copy, want, timeout=p.timings.heartbeat_s) < want:
                return  # a newer leader's copies are there: this worker no longer leads
            if await p.fleet.spread(want, timeout=p.timings.heartbeat_s):
                event(logging.WARNING, "member.layout_spread",
                      "member rows spread over more keys (new rows take the new keys)",
                      shards=want, was=known.shards, members=len(live))
        except StoreError as exc:
            event(logging.WARNING, "member.layout_failed",
                  "could not spread member rows over more keys (the task role must be "
                  "allowed to write MEMBER#*); the next read retries", shards=want,
                  error=str(exc))
            return
        # From the next bulletin on, the heartbeat copies it into every key (the layout is
        # that large now, whoever moved it).
        known.shards = max(known.shards, want)
        p.metrics.member_keys(known.shards)
        self.recompose()


def _handed_over(before: FleetView, after: FleetView) -> bool:
    """A member seen in both views handed streams over between them."""
    was = {m.worker_id: m.handoffs for m in before.members}
    return any(was.get(m.worker_id, m.handoffs) != m.handoffs for m in after.members)


class Listener:
    """What this member heard from the leader's bulletins (or, leading, what its own
    ``publisher`` vouches for)."""

    def __init__(self, parts: Parts, publisher: Publisher) -> None:
        self.parts = parts
        self.publisher = publisher
        self._notices_seen: frozenset[int] = frozenset()
        self._bulletin_at = float("-inf")  # monotonic: the last bulletin read from the leader
        self.handoffs_until = float("-inf")  # monotonic: read the leader's row fast until
        self._heard_feed = False  # that bulletin vouched for the leader's change feed
        self._heard: tuple[str, int] = ("", 0)  # (leader, vouching stretch) last heard
        self._leader_beat: tuple[str, int] = ("", -1)  # (leader, its heartbeat counter)
        self._leader_beat_at = float("-inf")  # monotonic: when that counter was first read

    @property
    def read_s(self) -> float:
        """How often a member reads the leader's row while the change feed is live."""
        return min(self.parts.timings.observe_s, FEED_READ_S)

    @property
    def handoff_read_s(self) -> float:
        """How often a member reads the leader's row while a hand-off's notices flow:
        HANDOFF_READ_S, or slower in a fleet so large that its members would together
        read the leader's key more than HANDOFF_READS_PER_S times a second."""
        news = self.parts.known.bulletin
        others = max(0, (news.active if news is not None else 1) - 1)
        return max(HANDOFF_READ_S, others / HANDOFF_READS_PER_S)

    @property
    def leader_still_s(self) -> float:
        """How long the leader's heartbeat counter may stand still in this member's reads
        before its vouching is not trusted: two heartbeats, and never under half a
        notice's life (a leader whose heartbeats run late on a loaded store is not
        dropped and taken back every few reads)."""
        timings = self.parts.timings
        return max(2 * timings.heartbeat_s, notice_ttl_s(timings) / 2)

    def feed_live(self) -> bool:
        """The leader's change feed tells this worker of every change to its streams: the
        polls it replaces may rest."""
        now = self.parts.clock.monotonic()
        if self.parts.hooks.leading():
            return self.publisher.feed_vouched(now)
        # A leader that died leaves its row, and its vouching, behind: its counter stops.
        return self._hearing_feed(now) and not self.leader_stood_still(now)

    def campaign_urgent(self) -> bool:
        """Whether this worker campaigns for the leader lease at full pace (a read every
        observation interval): it is the successor the leader's bulletin names, or it has
        no such bulletin (no leader, or one that names no successor: it reads every row),
        or the leader's heartbeat counter has stood still in its reads for
        ``leader_still_s``. Otherwise the leader lives and its successor stands ready: a
        read once a lease keeps the leader's identity known."""
        p = self.parts
        if p.hooks.leading() or p.known.reading_all or p.known.bulletin is None:
            return True
        successor = p.known.bulletin.successor
        if successor is None or successor == p.me:
            return True
        return self.leader_stood_still(p.clock.monotonic())

    def leader_stood_still(self, now: float) -> bool:
        """The leader's heartbeat counter has not moved in this worker's reads for
        ``leader_still_s``."""
        return now - self._leader_beat_at > self.leader_still_s

    def _hearing_feed(self, now: float) -> bool:
        """The last bulletin read vouched for the feed, and was read lately enough that no
        notice can have come and gone unread."""
        return self._heard_feed and \
            now - self._bulletin_at <= notice_ttl_s(self.parts.timings) / 2

    def hear(self, news: Bulletin, received: float, leader: str, beat: int) -> None:
        """The leader's notices for this worker, each acted on once; and if its change
        feed is vouched for after a gap (this worker's reads lapsed, the leader changed,
        or its vouching stopped and resumed), the polls it replaces run once now. (A
        leader whose counter stood still and moves again needs no catch-up: every
        bulletin was read meanwhile, and the polls ran while it was not trusted.)"""
        p = self.parts
        was_live = self._hearing_feed(received)
        if (leader, beat) != self._leader_beat:
            self._leader_beat, self._leader_beat_at = (leader, beat), received
        for notice in fresh(news.notices, p.me, self._notices_seen):
            event(logging.DEBUG, "member.notice_heard", "the leader's notice read",
                  stream=notice.stream, kind=notice.kind.value, n=notice.n)
            p.metrics.notice(notice.kind.value)
            p.hooks.notice(notice)
        mine = {x.n for x in news.notices if x.member == p.me}
        if news.draining or mine - self._notices_seen:
            self.handoffs_until = received + HANDOFF_READS_FOR_S
        self._notices_seen = frozenset(x.n for x in news.notices)
        self._bulletin_at, self._heard_feed = received, news.feed > 0
        heard, self._heard = self._heard, (leader, news.feed)
        if news.feed and (not was_live or heard != self._heard):
            p.hooks.feed_resumed()
