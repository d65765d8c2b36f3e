"""This worker's fleet membership: its member row, its liveness, and its view of peers.

Two loops (the rules are in ``streamlease.core.membership``):

* **heartbeat** — every ``HEARTBEAT_SECONDS`` the row's counter moves on, conditioned on
  this incarnation's epoch (the keep-alive loop, ``streamlease.keeper``). No heartbeat
  proven for ``LEASE - safety margin`` (monotonic, from when it was sent): every stream
  stops writing (self-fence) until one is proven again. The epoch moved on: every stream
  stops at once, and the row says why. A peer declared us dead: the worker registers afresh
  under a new epoch. Another live process registered under this worker id (a duplicate id):
  the worker logs ``member.duplicate_id``, leaves the id to that process, stops both loops
  and sets ``superseded`` (the worker then exits 2) — re-registering would fence the other
  process, which would re-register in turn, forever.
* **observe** — every ``observe_s``. The fleet leader reads every member row with one
  consistent Query; a member whose counter has not moved for ``LEASE`` on the leader's
  monotonic clock is dead: the leader fences it, and its streams are dealt across the
  survivors (each takes its part straight over, ``streamlease.takeover``); what is left
  after the deal window the fencer releases on its behalf — found through the owner
  index, each confirmed by a consistent read — and it is acquired as an orphan. From the
  rows the leader composes its bulletin (``streamlease.core.bulletin``: the share level,
  the gaps, the deals, who drains) and writes it into its own row with its heartbeat.
  Every other member reads only that row (one consistent GetItem): its bulletin, and the
  leader's own liveness, which it watches the same way. So a member's reads do not grow
  with the fleet. A member that knows no leader, or finds no bulletin in the leader's
  row (a new leader, a leader just fenced), reads every row as the leader does until a
  bulletin appears (``STREAMLEASE_FLEET_VIEW=all`` always does): deaths of other members
  are then seen by the first live member by id at once and by the others a quarter lease
  later. A new leader starts observing afresh, so while leadership changes hands, deaths
  are seen up to one leader take-over later.

A fleet too large for one key spreads its rows over several (``streamlease.core.layout``):
the leader moves the layout up once every row says it can read it, reads every key, and
after each heartbeat copies its bulletin, with its own counter, into a replica in each key
(``_replica_loop``); a member then reads its own key's replica instead of the leader's
row, and watches the leader's counter there.

Lease upkeep is therefore O(workers): a member write every heartbeat per worker, however
many streams it holds; each stream's own lease is renewed only every
``STREAM_RENEW_SECONDS``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import secrets
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from streamlease.clock import Clock, sleep_unless
from streamlease.core import bulletin as bulletins
from streamlease.core import layout
from streamlease.core.backoff import Backoff, jittered
from streamlease.core.bulletin import Bulletin, newly_donor
from streamlease.core.deal import deal_window_s
from streamlease.core.keepalive import KeepOutcome, KeepState
from streamlease.core.layout import MEMBERS_PER_KEY, Replica
from streamlease.core.membership import (
    FenceCause,
    HeartbeatOutcome,
    Liveness,
    MemberRecord,
    MemberStatus,
    MemberTimings,
    Observer,
    fence_cause,
    heartbeat_label,
    heartbeat_strained,
    releasable_for,
)
from streamlease.core.notices import Notice, NoticeBoard, NoticeKind, fresh
from streamlease.errors import StoreError
from streamlease.keeper import Step, keep
from streamlease.logs import event
from streamlease.metrics import Metrics
from streamlease.store.protocols import FleetStore, HeartbeatResult, LeaseStore

RELEASE_CONCURRENCY = 16  # on-behalf releases in flight at once
# The owner index is eventually consistent (well under a second on DynamoDB): a dead
# member's streams are looked up again this long after the first pass.
SECOND_PASS_S = 2.0
FORGET_AFTER_LEASES = 30  # a dead, released row observed this many leases is deleted
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
# A member of a spread fleet with no usable copy of the leader's bulletin reads every
# member row only once copies have been missing this long, up to twice as long at random,
# and then once in such an interval (``Membership._waiting_for_copies``).
SPREAD_FULL_READ_S = 60.0
# After a member hands streams over, the leader names no donors for this many member
# heartbeats: the streams in flight show in nobody's row and as no orphan yet (released,
# the index not caught up, or taken and the taker's row not rewritten), so the takers look
# short and a donor would give a stream the fleet does not need moved.
DONOR_PAUSE_HEARTBEATS = 2.0


@dataclass(frozen=True)
class MembershipSettings:
    me: str
    capacity: int
    timings: MemberTimings
    # "leader": read the leader's bulletin when there is one; "all": read every row
    fleet_view: str = "leader"
    # members per key before the leader spreads the rows (``core.layout``)
    members_per_key: int = MEMBERS_PER_KEY


@dataclass
class Hooks:
    """What membership asks of the rest of the worker."""

    held: Callable[[], int]  # streams held now (reported in the row)
    fenced: Callable[[], None]  # our epoch moved on: stop every stream now, no release
    self_fenced: Callable[[], None]  # no heartbeat proven in time: stop writing
    fleet_changed: Callable[[], None]  # a peer died, released, drained or handed off
    proven: Callable[[float], None] = lambda at: None  # a heartbeat sent at ``at`` landed
    # every heartbeat's outcome and latency (admission control, sink pacing)
    beat: Callable[[HeartbeatOutcome, float], None] = lambda outcome, seconds: None
    leading: Callable[[], bool] = lambda: True  # dead rows are deleted by the leader only
    leader: Callable[[], str | None] = lambda: None  # the fleet leader, as last seen
    leader_fence: Callable[[], int] = lambda: 0  # this leader's lease fence (replicas)
    orphans: Callable[[], int] = lambda: 0  # servable orphans, as this worker last saw them
    # the leader's notice for this worker (streamlease.core.notices)
    notice: Callable[[Notice], None] = lambda notice: None
    # the leader's notices are trusted again after a gap: poll once for what they missed
    feed_resumed: Callable[[], None] = lambda: None


@dataclass(frozen=True)
class FleetView:
    """The members as last read, with what this worker observed about them."""

    members: tuple[MemberRecord, ...] = ()
    observed_dead: frozenset[str] = frozenset()

    def active(self) -> list[MemberRecord]:
        """Members taking streams: ACTIVE and not observed dead."""
        return [m for m in self.members
                if m.status is MemberStatus.ACTIVE and m.worker_id not in self.observed_dead]

    def live(self) -> list[MemberRecord]:
        return [m for m in self.members
                if m.live_status and m.worker_id not in self.observed_dead]

    def draining(self) -> bool:
        return any(m.status is MemberStatus.DRAINING for m in self.live())


class FleetKnowledge:
    """What this worker knows of the fleet, for the reconciler and the take-over: the
    leader's bulletin while it reads only the leader's row, else every row it read."""

    view: FleetView
    bulletin: Bulletin | None
    reading_all: bool

    def draining_seen(self) -> bool:
        """Someone is handing streams over (the bulletin says so, or the rows do)."""
        if self.bulletin is not None and not self.reading_all:
            return self.bulletin.draining
        return self.view.draining()

    def deals(self) -> list[tuple[MemberRecord, dict[str, int] | None]]:
        """Fenced members whose streams are being dealt: each DEAD row (or the bulletin's
        deal) with the survivors' weights, None where the survivor computes them itself
        from every row it read."""
        if self.bulletin is not None:
            return [(d.dead_row(), d.weights()) for d in self.bulletin.deals]
        return [(row, None) for row in self.view.members
                if row.status is MemberStatus.DEAD and not row.released]

    def feed_live(self) -> bool:
        """The leader's change feed tells this worker of every change to its streams
        (``streamlease.feed``): the polls it replaces may rest."""
        return False

    def survivors(self, dead: str) -> int:
        """Members taking streams besides ``dead``, as this worker knows them."""
        if self.bulletin is not None and not self.reading_all:
            return max(1, self.bulletin.active)
        return max(1, len([m for m in self.view.active() if m.worker_id != dead]))


@dataclass
class _Takeover:
    seen: MemberRecord
    since: float  # monotonic: when this worker first found it dead


class Membership(FleetKnowledge):
    def __init__(self, fleet: FleetStore, leases: LeaseStore, clock: Clock, metrics: Metrics,
                 settings: MembershipSettings, hooks: Hooks,
                 rng: random.Random | None = None) -> None:
        self.fleet = fleet
        self.leases = leases
        self.clock = clock
        self.metrics = metrics
        self.settings = settings
        self.hooks = hooks
        self.rng = rng or random.Random()
        self.timings = settings.timings
        self.epoch = 0
        # This process's nonce, written by each of its registrations: another process
        # with the same worker id writes another one.
        self.incarnation = secrets.token_hex(8)
        # The row as another process registered it under this worker id: set once, and
        # then this membership has stopped for good (the worker exits).
        self.superseded: MemberRecord | None = None
        self.status = MemberStatus.ACTIVE
        self.handoffs = 0
        self.shard = 0  # the key of this worker's row (``core.layout``), for life
        self.shards = 1  # the layout as last read
        self._layout_held = False  # said once that a row keeps the layout from spreading
        # The copy of the bulletin the leader's replicas are to show (built from the
        # heartbeat that carried it), and the newest notice in it; the replica loop writes
        # the newest.
        self._replica_due: tuple[Replica, int] | None = None
        self._replica_wake = asyncio.Event()
        # The leader's row as a copy showed it standing still for a lease: its own row is
        # read instead until it says whether the leader lives (``_observe_suspect``); and
        # the counter that row showed at the last such read.
        self._suspect: MemberRecord | None = None
        self._suspect_beat: int | None = None
        # (leader, epoch) of copies left by a leader row since fenced or gone: as its DEAD
        # row would, they send this member to every row.
        self._stale_copies: tuple[str, int] | None = None
        self._full_read_at = float("-inf")  # monotonic: the last read of every member row
        self._no_copy_since: float | None = None  # no usable copy of the bulletin since
        self._no_copy_wait = SPREAD_FULL_READ_S
        # Nothing is proven before registration: may_write is false until then.
        self.liveness = Liveness(self.timings, deadline=float("-inf"))
        self.view = FleetView()
        # The bulletin this worker plans from: the leader's (read from its row, or composed
        # here while leading); None while it plans from every row it read.
        self.bulletin: Bulletin | None = None
        self.reading_all = True  # the last observation read every row
        self._gen = 0  # the generation of the bulletins this worker composes
        self._composed: Bulletin | None = None
        self._totals: list[tuple[float, int]] = []  # (when, total counted) while leading
        self._handed_over_at = float("-inf")  # the last hand-over seen (monotonic)
        # The change feed's notices: the leader's board (posted by its feed duty), and on
        # every member the numbers of the notices in the last bulletin read.
        self.notices = NoticeBoard(secrets.randbits(40), self.notice_ttl_s)
        self._feed_up = False  # this worker leads and its change feed runs
        self._vouch = secrets.randbits(20) + 1  # this leader's stretch of vouching (>= 1)
        self._read_all_leading = False  # a full read of the rows since this term began
        self._published = 0  # the newest notice a written bulletin carried
        self._published_changed = asyncio.Event()
        self._notices_seen: frozenset[int] = frozenset()
        self._bulletin_at = float("-inf")  # monotonic: the last bulletin read from the leader
        self._handoffs_until = float("-inf")  # monotonic: read the leader's row fast until
        self._heard_feed = False  # that bulletin vouched for the leader's change feed
        self._heard: tuple[str, int] = ("", 0)  # (leader, vouching stretch) last heard
        self._leader_beat: tuple[str, int] = ("", -1)  # (leader, its heartbeat counter)
        self._leader_beat_at = float("-inf")  # monotonic: when that counter was first read
        # (leader, epoch, heartbeat) of the newest leader's row read: a read older than it
        # (eventually consistent) is not acted on.
        self._newest_leader_row: tuple[str, int, int] | None = None
        self.observer = Observer(settings.me, self.timings.lease_s)
        self._beat_now = asyncio.Event()
        # A heartbeat is due at once: it carries a new bulletin (even inside the gap).
        self._publish_now = asyncio.Event()
        self._last_beat = 0.0
        self._stop = asyncio.Event()
        self._pending: dict[str, _Takeover] = {}
        self._working: set[str] = set()  # members this worker is fencing or releasing
        self._strained_until = 0.0  # heartbeats slow or unanswered until then
        self._unreleased_since: dict[tuple[str, int], float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # takeovers in flight
        self._tg: asyncio.TaskGroup | None = None  # the membership's scope while it runs
        self._leftovers_again = False  # a second look for an earlier incarnation's streams

    @property
    def me(self) -> str:
        return self.settings.me

    # -- the change feed's notices --------------------------------------------------------

    @property
    def read_s(self) -> float:
        """How often a member reads the leader's row while the change feed is live."""
        return min(self.timings.observe_s, FEED_READ_S)

    @property
    def handoff_read_s(self) -> float:
        """How often a member reads the leader's row while a hand-off's notices flow:
        HANDOFF_READ_S, or slower in a fleet so large that its members would together
        read the leader's key more than HANDOFF_READS_PER_S times a second."""
        others = max(0, (self.bulletin.active if self.bulletin is not None else 1) - 1)
        return max(HANDOFF_READ_S, others / HANDOFF_READS_PER_S)

    @property
    def notice_ttl_s(self) -> float:
        """How long a notice stays in the bulletin: four regular reads of the fleet, and
        never under five seconds, so a member that misses a read or two still sees it."""
        return max(5.0, 4 * self.timings.observe_s)

    @property
    def leader_still_s(self) -> float:
        """How long the leader's heartbeat counter may stand still in this member's reads
        before its vouching is not trusted: two heartbeats, and never under half a
        notice's life (a leader whose heartbeats run late on a loaded store is not
        dropped and taken back every few reads)."""
        return max(2 * self.timings.heartbeat_s, self.notice_ttl_s / 2)

    def feed_live(self) -> bool:
        now = self.clock.monotonic()
        if self.hooks.leading():
            return self._feed_up and not self.notices.overflowed(now)
        # A leader that died leaves its row, and its vouching, behind: its counter stops.
        return self._hearing_feed(now) and not self._leader_stood_still(now)

    def campaign_urgent(self) -> bool:
        """Whether this worker campaigns for the leader lease at full pace (a read every
        observation interval): it is the successor the leader's bulletin names, or it has
        no such bulletin (no leader, or one that names no successor: it reads every row),
        or the leader's heartbeat counter has stood still in its reads for
        ``leader_still_s``. Otherwise the leader lives and its successor stands ready: a
        read once a lease keeps the leader's identity known."""
        if self.hooks.leading() or self.reading_all or self.bulletin is None:
            return True
        successor = self.bulletin.successor
        if successor is None or successor == self.me:
            return True
        return self._leader_stood_still(self.clock.monotonic())

    def _leader_stood_still(self, now: float) -> bool:
        """The leader's heartbeat counter has not moved in this worker's reads for
        ``leader_still_s``."""
        return now - self._leader_beat_at > self.leader_still_s

    def _hearing_feed(self, now: float) -> bool:
        """The last bulletin read vouched for the feed, and was read lately enough that no
        notice can have come and gone unread."""
        return self._heard_feed and now - self._bulletin_at <= self.notice_ttl_s / 2

    def share_level(self) -> int | None:
        """The fair-share level of the bulletin this leader composed (None: none yet)."""
        return self._composed.level if self._composed is not None else None

    def feed_running(self, up: bool) -> None:
        """The leader's change feed started (or stopped) vouching for its notices."""
        if up != self._feed_up:
            self._feed_up = up
            self.metrics.change_feed_live(up)
            if up:
                # A new stretch: members see the gap, however short, and catch up.
                self._vouch += 1
                self.hooks.feed_resumed()
            self._recompose()

    def post(self, member: str, stream: str, kind: NoticeKind) -> int:
        """A notice for ``member`` (this leader's own are acted on at once); the
        bulletin carrying it is written at once. Its number, for ``published``."""
        notice = self.notices.post(member, stream, kind, self.clock.monotonic())
        if member == self.me:
            self.metrics.notice(notice.kind.value)
            self.hooks.notice(notice)
        self._recompose()
        return notice.n

    async def published(self, n: int, timeout: float) -> bool:
        """Until a written bulletin has carried notice ``n``; False after ``timeout``."""
        deadline = self.clock.monotonic() + timeout
        while self._published < n:
            left = deadline - self.clock.monotonic()
            if left <= 0 or self._stop.is_set() or self.status is not MemberStatus.ACTIVE:
                return False  # members do not read a draining leader's bulletin
            self._published_changed.clear()
            await sleep_unless(left, self._published_changed, self._stop)
        return True

    def _recompose(self) -> None:
        # Only from every row read in this term (not the leader's row a member read).
        if self.hooks.leading() and self._read_all_leading:
            self.compose(self.clock.monotonic())

    def may_write(self, now: float) -> bool:
        return self.liveness.may_write(now)

    @property
    def accepting(self) -> bool:
        """May this worker take streams now (alive, registered, not draining)?"""
        return self.status is MemberStatus.ACTIVE and \
            self.liveness.may_write(self.clock.monotonic())

    # -- lifecycle ----------------------------------------------------------------------

    async def register(self) -> None:
        """Register a new incarnation, then release what earlier incarnations of this
        worker id left behind (their streams carry an older epoch)."""
        sent = self.clock.monotonic()
        record = await self.fleet.register(self.me, self.settings.capacity,
                                           self.clock.wall_ms(), self.status,
                                           timeout=self.timings.lease_s,
                                           incarnation=self.incarnation)
        self.epoch = record.epoch
        self.shard = record.shard
        self._replica_due = None  # a copy of the last incarnation's heartbeat: never written
        self.liveness = Liveness.registered(sent, self.timings)
        if self.status is MemberStatus.DRAINING:
            self._beat_now.set()  # fenced while draining: say so again at once
        event(logging.INFO, "member.registered", "joined the fleet", epoch=self.epoch)
        await self._release_leftovers()
        # The owner index lags: a stream the earlier incarnation took just before it went
        # may show up a moment later. Look again once the membership runs.
        self._leftovers_again = True

    async def _release_leftovers(self, delay: float = 0.0) -> None:
        if delay:
            await sleep_unless(delay, self._stop)
            if self._stop.is_set():
                return
        released, _ = await self._release_all(self.me, self.epoch)
        if released:
            event(logging.WARNING, "member.leftovers_released",
                  "released streams an earlier incarnation of this worker still held",
                  epoch=self.epoch, streams=released)

    def drain(self) -> None:
        """Shutting down: tell peers at once (share 0; they poll for what we release)."""
        self.status = MemberStatus.DRAINING
        self._beat_now.set()

    def handed_off(self) -> None:
        """Streams were released for others to take: tell peers now, not next heartbeat."""
        self.handoffs += 1
        self._handed_over_at = self.clock.monotonic()
        self._beat_now.set()

    def counts_changed(self) -> None:
        """This worker's stream count changed: report it soon (peers plan with it)."""
        self._beat_now.set()

    async def leave(self) -> None:
        """A clean exit (every stream released): remove this incarnation's row."""
        self._stop.set()
        try:
            await self.fleet.leave(self.me, self.epoch, timeout=self.timings.heartbeat_s,
                                   shard=self.shard)
        except StoreError as exc:
            event(logging.WARNING, "member.leave_failed",
                  "could not remove the member row; peers will declare it dead",
                  error=str(exc))

    def stop(self) -> None:
        self._stop.set()
        self._beat_now.set()
        self._replica_wake.set()
        for task in list(self._tasks):
            task.cancel()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            tg.create_task(self._heartbeat_loop(), name="member heartbeat")
            tg.create_task(self._observe_loop(), name="member observe")
            tg.create_task(self._replica_loop(), name="member replicas")
            if self._leftovers_again:
                self._leftovers_again = False
                self._spawn(self._release_leftovers(min(SECOND_PASS_S, self.timings.lease_s)))
        self._tg = None

    # -- heartbeat ------------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        """Keep this incarnation's row (``keep``) until the membership stops; when its
        epoch moves on, find out why and register afresh (or give the id up)."""
        delay: float | None = None  # the first heartbeat: an interval, jittered
        while not self._stop.is_set():
            try:
                ended = await keep(self.liveness.keeper, self._heartbeat, self.clock, self.rng,
                                   first_in=delay, wait=self._wait, stop=self._stop,
                                   on_step=self._on_step)
                if ended is KeepState.REFUSED:
                    await self._on_fenced()
                    delay = 0.0  # the new incarnation says so at once
            except Exception:
                # The heartbeat loop must outlive any surprise; the deadline still rules.
                self.metrics.task_crashed("membership")
                event(logging.ERROR, "member.heartbeat_crashed", "member heartbeat crashed",
                      exc_info=True)
                delay = self.timings.heartbeat_s / 4

    async def _heartbeat(self, timeout: float) -> HeartbeatResult:
        """One heartbeat: the row's counter moves on if the epoch is still ours."""
        sent = self._last_beat = self.clock.monotonic()
        composed = self._composed if self.hooks.leading() else None
        text = bulletins.encode(composed) if composed is not None else None
        epoch, shard, status, handoffs = self.epoch, self.shard, self.status, self.handoffs
        result = await self.fleet.heartbeat(
            self.me, epoch, status, self.hooks.held(), self.settings.capacity, handoffs,
            self.clock.wall_ms(), timeout=timeout, bulletin=text, shard=shard)
        if composed is not None and text is not None and \
                result.outcome is HeartbeatOutcome.RENEWED:
            newest = composed.notices[-1].n if composed.notices else 0
            if composed.shards > 1 and result.heartbeat is not None:
                # Members read the replicas: a notice is out once they carry it. The copy
                # shows the row exactly as this heartbeat left it.
                self._replica_due = (Replica(
                    leader=self.me, shard=shard, epoch=epoch, heartbeat=result.heartbeat,
                    fence=self.hooks.leader_fence(), shards=composed.shards, bulletin=text,
                    status=status, handoffs=handoffs), newest)
                self._replica_wake.set()
            elif newest:
                self._mark_published(newest)
        now = self.clock.monotonic()
        label = heartbeat_label(result.outcome)
        event(logging.DEBUG, "member.beat", "heartbeat answered", seconds=round(now - sent, 3),
              outcome=label, published=self._published)
        self.metrics.member_heartbeat(now - sent, label)
        self.hooks.beat(result.outcome, now - sent)
        if heartbeat_strained(result.outcome, now - sent, self.timings.slow_heartbeat_s):
            self._strained_until = now + 2 * self.timings.heartbeat_s
        return result

    def _mark_published(self, newest: int) -> None:
        self._published = max(self._published, newest)
        self._published_changed.set()

    async def _replica_loop(self) -> None:
        """While leading a spread layout: copy each bulletin the leader's heartbeat wrote,
        with that heartbeat's counter, into every key (the newest one: a bulletin that a
        newer one overtook while the keys were written is skipped)."""
        while not self._stop.is_set():
            await sleep_unless(self.timings.heartbeat_s, self._replica_wake, self._stop)
            self._replica_wake.clear()
            due, self._replica_due = self._replica_due, None
            if due is None or not self.hooks.leading():
                continue
            replica, newest = due
            if replica.epoch != self.epoch:
                continue  # fenced and registered again since: that row is gone
            try:
                written = await self.fleet.publish(replica, replica.shards,
                                                   timeout=self.timings.heartbeat_s)
            except StoreError as exc:
                self.metrics.replica_failed()
                event(logging.WARNING, "member.replica_failed",
                      "could not copy the bulletin into every member key; the next "
                      "heartbeat's copy retries", shards=self.shards, error=str(exc))
                continue
            except Exception:
                self.metrics.task_crashed("membership")
                event(logging.ERROR, "member.replica_crashed", "copying the bulletin crashed",
                      exc_info=True)
                continue
            if written < replica.shards:
                # A copy under a higher leader fence is there: this worker no longer leads
                # (or the leader backend was changed and its fences start lower).
                self.metrics.replica_failed()
                event(logging.WARNING, "member.replica_refused",
                      "keys hold a copy of a newer leader's bulletin; this one was not "
                      "written there", shards=replica.shards, written=written,
                      fence=replica.fence)
                continue
            if newest:
                self._mark_published(newest)

    def _on_step(self, step: Step[HeartbeatResult]) -> None:
        """A heartbeat or the deadline, as the liveness took it."""
        if step.answer is not None:
            outcome = step.answer.outcome
            if outcome is KeepOutcome.RENEWED:
                self.hooks.proven(step.sent_at)
            elif outcome in (KeepOutcome.UNKNOWN, KeepOutcome.THROTTLED):
                event(logging.WARNING, "member.heartbeat_failed",
                      "member heartbeat failed; retrying", outcome=outcome.value,
                      error=step.answer.error, retry_in_s=round(step.delay, 3),
                      deadline_in_s=round(self.liveness.deadline - step.now, 3))
        if step.self_fenced:
            self._on_self_fenced()
        elif step.recovered:
            event(logging.WARNING, "member.recovered",
                  "heartbeats proven again under the same epoch; taking streams again",
                  epoch=self.epoch)

    def _on_self_fenced(self) -> None:
        event(logging.ERROR, "member.self_fenced",
              "no member heartbeat proven before the deadline: every stream stops writing",
              epoch=self.epoch)
        self.hooks.self_fenced()

    async def _on_fenced(self) -> None:
        self.metrics.member_fenced()
        self.hooks.fenced()  # whatever the cause, every stream stops now
        retry = Backoff(0.1, self.timings.heartbeat_s, self.rng)
        row: MemberRecord | None = None
        while not self._stop.is_set():
            try:
                rows = await self.fleet.members(timeout=self.timings.heartbeat_s)
                row = next((m for m in rows if m.worker_id == self.me), None)
                break
            except StoreError as exc:
                event(logging.WARNING, "member.read_failed",
                      "cannot read this worker's own row after it was fenced; retrying",
                      error=str(exc))
                await self._wait(retry.next_delay())
        else:
            return
        cause = fence_cause(row, self.incarnation)
        if cause is FenceCause.DUPLICATE:
            assert row is not None
            self._on_duplicate(row)
            return
        event(logging.ERROR, "member.fenced",
              "this worker's epoch moved on: every stream stops; registering again",
              epoch=self.epoch, cause=cause.value,
              fenced_by=row.fenced_by if row is not None else None)
        retry = Backoff(0.1, self.timings.heartbeat_s, self.rng)
        while not self._stop.is_set():
            try:
                await self.register()
                return
            except StoreError as exc:
                event(logging.WARNING, "member.register_failed", "cannot register; retrying",
                      error=str(exc))
                await self._wait(retry.next_delay())

    def _on_duplicate(self, row: MemberRecord) -> None:
        """Another live process registered under this worker id while this one was alive
        and heartbeating. This one learnt it second-hand, so it is the one that stops:
        registering again would fence the other, which would register again, forever.
        Its streams stopped already; the other's registration releases them."""
        self.superseded = row
        self.metrics.member_duplicate_id()
        event(logging.ERROR, "member.duplicate_id",
              "another live process registered with this worker id (STREAMLEASE_WORKER_ID "
              "must be unique per process): this one stops taking streams and exits",
              epoch=self.epoch, their_epoch=row.epoch, incarnation=self.incarnation,
              their_incarnation=row.incarnation)
        self.stop()

    async def _wait(self, seconds: float) -> None:
        """Until the next heartbeat is due, or one is asked for early (draining, a
        hand-off, a changed count, the leader's new bulletin) — but never sooner than a
        short gap after the last, so a burst of such requests costs one write; a new
        bulletin (the leader's notices) cuts the gap short."""
        await sleep_unless(seconds, self._beat_now)
        gap = self._last_beat + min(self.timings.observe_s, self.timings.heartbeat_s / 4) \
            - self.clock.monotonic()
        if not self._publish_now.is_set() and gap > 0 and not self._stop.is_set():
            # The leader's new bulletin is not held back by the gap: every other member
            # waits for its notices (a count that changed just before would otherwise
            # hold a notice back for up to a quarter heartbeat).
            await sleep_unless(gap, self._publish_now, self._stop)
        # The heartbeat about to be sent carries everything asked for so far: the newest
        # bulletin, counts and status are read when it is sent.
        self._beat_now.clear()
        self._publish_now.clear()

    # -- observing peers ------------------------------------------------------------------

    async def _observe_loop(self) -> None:
        while not self._stop.is_set():
            try:
                await self._observe()
            except StoreError as exc:
                event(logging.WARNING, "member.observe_failed", "cannot read the fleet",
                      error=str(exc))
            except Exception:
                self.metrics.task_crashed("membership")
                event(logging.ERROR, "member.observe_crashed", "observing the fleet crashed",
                      exc_info=True)
            self.metrics.change_feed_live(self.feed_live())
            # A strained store (this worker's own heartbeats slow or unanswered) is read
            # once a heartbeat instead of twice: deaths are seen a little later, never
            # sooner, and the heartbeat keeps its place in the store's queue.
            every = self.timings.observe_s
            if self.settings.fleet_view == "leader" and self.hooks.leading():
                # The leader is the fleet's only watcher, and every other member hears of
                # a death one read of its row later: it reads twice as often (one Query
                # for the whole fleet), so deaths are seen no later than before.
                every /= 2
            elif self.settings.fleet_view == "leader" and self.feed_live():
                every = min(every, self.read_s)  # one row: the leader's notices, sooner
                if self.clock.monotonic() < self._handoffs_until:
                    every = min(every, self.handoff_read_s)  # a hand-off's offers in flight
            if self.clock.monotonic() < self._strained_until:
                every = max(every, self.timings.heartbeat_s)
            await sleep_unless(jittered(every, 0.1, self.rng), self._stop)

    async def _observe(self) -> None:
        if self.settings.fleet_view == "leader" and not self.hooks.leading():
            leader = self.hooks.leader()
            if self._suspect is not None and self._suspect.worker_id != leader:
                self._suspect = self._suspect_beat = None  # another leader now
            if leader is not None and leader != self.me:
                if self._suspect is not None:
                    if await self._observe_suspect(self._suspect):
                        self._no_copy_since = None
                        return
                elif await self._observe_leader(leader):
                    self._no_copy_since = None
                    return
            if self.shards > 1 and self._waiting_for_copies():
                return
        await self._observe_all()

    def _waiting_for_copies(self) -> bool:
        """No usable copy of the bulletin in a spread fleet (a leader change, a leader
        fenced): wait for the next leader's copies, planning from the last bulletin, rather
        than every member reading every key each interval (many times the keys' read
        limits in a large fleet, the new leader's own reads throttled with them). Deaths
        wait for the next leader meanwhile. Only copies missing for one to two minutes
        (at random, so members spread out) make a member read every key, and then once
        in such an interval."""
        now = self.clock.monotonic()
        if self._no_copy_since is None:
            self._no_copy_since = now
            self._no_copy_wait = SPREAD_FULL_READ_S * (1 + self.rng.random())
        return now - max(self._no_copy_since, self._full_read_at) < self._no_copy_wait

    async def _observe_suspect(self, copied: MemberRecord) -> bool:
        """The leader's copy stood still for a lease, but a copy is written after the
        heartbeat, so a leader that died between the two left its row a counter ahead, and
        a fence conditioned on the copy's counter could never match. Its own row decides
        (one consistent read, watched like any row): moved on between two reads, the
        leader lives and its copies are read again; fenced or gone, its copies count as
        its DEAD row would (False); standing still for a lease, it is fenced."""
        sent = self.clock.monotonic()
        row = await self.fleet.member(copied.worker_id, timeout=self.timings.heartbeat_s,
                                      shard=copied.shard)
        received = self.clock.monotonic()
        if row is None or not row.live_status or row.epoch != copied.epoch:
            self._suspect = self._suspect_beat = None
            self._stale_copies = (copied.worker_id, copied.epoch)
            return False
        if self._suspect_beat is not None and row.heartbeat > self._suspect_beat:
            # It moved between two reads: alive, its copies lag (failing or refused).
            self._suspect = self._suspect_beat = None
            return True
        self._suspect_beat = row.heartbeat
        self.metrics.member_rows_read(1)
        if self.observer.observe([row], sent, received):
            self._spawn(self._take_over(row))
        return True

    async def _observe_leader(self, leader: str) -> bool:
        """Read the leader's row only: its bulletin, and whether the leader lives. False
        if it carries no readable bulletin (then every row is read instead)."""
        sent = self.clock.monotonic()
        # Eventually consistent: half the read units of a consistent read, so reading
        # twice as often as a consistent read would costs the leader's key nothing more.
        # A read a moment old only delays a notice; a stale counter only delays finding
        # the leader dead (and fencing it is conditioned on the counter as seen).
        row: MemberRecord | None
        copied = self.shards > 1
        if copied:
            # A spread layout: this worker's own key holds the leader's bulletin, copied.
            replica = await self.fleet.replica(self.shard, timeout=self.timings.heartbeat_s)
            row = replica.leader_row() if replica is not None and replica.leader == leader \
                and (replica.leader, replica.epoch) != self._stale_copies else None
        else:
            row = await self.fleet.member(leader, timeout=self.timings.heartbeat_s,
                                          consistent=False)
        received = self.clock.monotonic()
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
                self.metrics.bulletin_unreadable()
                event(logging.WARNING, "member.bulletin_unreadable",
                      "the leader's row carries a bulletin this worker cannot read; "
                      "reading every member row instead", leader=leader)
            return False
        self.shards = max(self.shards, layout.valid_shards(news.shards))
        self.metrics.member_keys(self.shards)
        dead = self.observer.observe([row], sent, received)
        if dead and copied:
            # Its own row decides (``_observe_suspect``), from now.
            self._suspect, self._suspect_beat = row, None
            return await self._observe_suspect(row)
        self._read_all_leading = False
        self._composed = None  # not leading: nothing of an earlier term is written
        self._hear(news, received, row.worker_id, row.heartbeat)
        before = None if self.reading_all else self.bulletin
        before_row = None if self.reading_all or not self.view.members else self.view.members[0]
        self.bulletin, self.reading_all = news, False
        self.view = FleetView((row,), frozenset(m.worker_id for m in dead))
        self.metrics.member_counts(dict(news.statuses))
        self.metrics.member_rows_read(1)
        if before is None or before.gen != news.gen or before_row is None or \
                (before_row.worker_id, before_row.handoffs) != (row.worker_id, row.handoffs) \
                or newly_donor(self.me, before, news):
            self.hooks.fleet_changed()
        self._pending.clear()
        if dead:
            self._spawn(self._take_over(row))  # the leader is watched like any member
        return True

    def _read_before(self, row: MemberRecord) -> bool:
        """An eventually consistent read older than one already read (the same leader and
        epoch, a lower heartbeat counter): planning from it would step back in time."""
        newest = self._newest_leader_row
        return newest is not None and newest[:2] == (row.worker_id, row.epoch) and \
            row.heartbeat < newest[2]

    def _hear(self, news: Bulletin, received: float, leader: str, beat: int) -> None:
        """The leader's notices for this worker, each acted on once; and if its change
        feed is vouched for after a gap (this worker's reads lapsed, the leader changed,
        or its vouching stopped and resumed), the polls it replaces run once now. (A
        leader whose counter stood still and moves again needs no catch-up: every
        bulletin was read meanwhile, and the polls ran while it was not trusted.)"""
        was_live = self._hearing_feed(received)
        if (leader, beat) != self._leader_beat:
            self._leader_beat, self._leader_beat_at = (leader, beat), received
        for notice in fresh(news.notices, self.me, self._notices_seen):
            event(logging.DEBUG, "member.notice_heard", "the leader's notice read",
                  stream=notice.stream, kind=notice.kind.value, n=notice.n)
            self.metrics.notice(notice.kind.value)
            self.hooks.notice(notice)
        mine = {x.n for x in news.notices if x.member == self.me}
        if news.draining or mine - self._notices_seen:
            self._handoffs_until = received + HANDOFF_READS_FOR_S
        self._notices_seen = frozenset(x.n for x in news.notices)
        self._bulletin_at, self._heard_feed = received, news.feed > 0
        heard, self._heard = self._heard, (leader, news.feed)
        if news.feed and (not was_live or heard != self._heard):
            self.hooks.feed_resumed()

    async def _observe_all(self) -> None:
        sent = self.clock.monotonic()
        rows, self.shards = await self.fleet.roster(timeout=self.timings.heartbeat_s)
        received = self._full_read_at = self.clock.monotonic()
        self.metrics.member_keys(self.shards)
        members, older = layout.one_row_each(rows)
        if older and self.hooks.leading():
            for extra in older:
                self._spawn(self._forget_duplicate(extra))
        dead = self.observer.observe(members, sent, received)
        before = self.view
        self.view = FleetView(tuple(members), frozenset(m.worker_id for m in dead))
        self.reading_all = True
        self.metrics.members(self.view.members, self.view.observed_dead)
        self.metrics.member_rows_read(len(members))
        changed = _changed(before, self.view)
        if self.hooks.leading():
            if changed:
                self._gen += 1
            if _handed_over(before, self.view):
                self._handed_over_at = received
            self._read_all_leading = True
            self.compose(received)
            await self._consider_spread(members)
        else:
            self.bulletin = self._composed = None
            self._read_all_leading = False
            self._totals.clear()
            # Reading every row, this member still hears the leader's notices.
            leader = self.hooks.leader()
            row = next((m for m in members if m.worker_id == leader), None)
            news = bulletins.decode(row.bulletin) \
                if row is not None and row.status is MemberStatus.ACTIVE else None
            if news is not None and row is not None:
                self._hear(news, received, row.worker_id, row.heartbeat)
        if changed:
            self.hooks.fleet_changed()
        for member in dead:
            self._pending.setdefault(member.worker_id, _Takeover(member, received))
            self._pending[member.worker_id].seen = member
        for gone in set(self._pending) - {m.worker_id for m in dead}:
            del self._pending[gone]
        for takeover in list(self._pending.values()):
            if self._my_turn(takeover, received):
                self._spawn(self._take_over(takeover.seen))
        self._finish_abandoned(members, received)

    def compose(self, now: float) -> None:
        """The leader's bulletin from the rows it read (its own count live). Written at
        once when membership moved, someone drains, or the donors or the deals changed;
        changed counts alone ride the next regular heartbeat (the leader would otherwise
        write every read interval while streams come and go). Its generation moves only
        when the fleet did (someone joined, left, died, was released, drains or handed
        streams over): that is what pokes the other members' reconcilers."""
        held = self.hooks.held()
        orphans = self.hooks.orphans()
        counted = sum(m.streams for m in self.view.members
                      if m.worker_id != self.me and (m.live_status or not m.released)) \
            + held + orphans
        self._totals.append((now, counted))
        self._totals = [(at, n) for at, n in self._totals
                        if at >= now - 3 * self.timings.heartbeat_s]
        settling = now < self._handed_over_at + DONOR_PAUSE_HEARTBEATS * self.timings.heartbeat_s
        news = bulletins.compose(self.view.members, self.view.observed_dead, self.me, held,
                                 self.accepting, orphans, self._gen,
                                 total_at_least=max(n for _, n in self._totals),
                                 name_donors=not settling)
        vouch = self._vouch if self._feed_up and not self.notices.overflowed(now) else 0
        news = dataclasses.replace(news, feed=vouch, notices=self.notices.current(now),
                                   shards=self.shards)
        before, self._composed = self._composed, news
        self.bulletin = news
        if newly_donor(self.me, before, news):
            self.hooks.fleet_changed()  # its own reconciler sheds now, not at a quiet cycle
        if before is not None and \
                (news.gen, news.draining, news.donors, news.deals, news.feed, news.shards) == \
                (before.gen, before.draining, before.donors, before.deals, before.feed,
                 before.shards) and \
                {x.n for x in news.notices} <= {x.n for x in before.notices}:
            return  # counts only (or notices expired): the next heartbeat carries them
        self._publish_now.set()
        self._beat_now.set()

    async def _consider_spread(self, members: list[MemberRecord]) -> None:
        """The leader moves the layout up when its keys hold more rows than
        ``members_per_key`` each (``layout.shards_for``), once every row may read it (one
        conditional write, rarely: in the read's own step). First it writes a copy of its
        bulletin into every key of the new layout: members that learn of it find their
        copy at once, and a task role not allowed to write there (``MEMBER#*``) keeps the
        layout where it is instead of shutting new members out."""
        live = [m for m in members if m.status is not MemberStatus.DEAD]
        want = layout.shards_for(len(live), self.shards, self.settings.members_per_key)
        older = [m.worker_id for m in live if not layout.reads_layout(m)]
        if older and (want > self.shards or self.shards > 1):
            if not self._layout_held:
                self._layout_held = True
                event(logging.WARNING, "member.layout_held",
                      "some members run a release that cannot read a spread layout: the "
                      "member rows do not spread further, and those members see only part "
                      "of a spread fleet", shards=self.shards, want=want, members=len(live),
                      older=sorted(older)[:10], older_count=len(older))
        elif not older:
            self._layout_held = False
        mine = next((m for m in live if m.worker_id == self.me), None)
        if want <= self.shards or older or mine is None or self._composed is None:
            return
        copy = Replica(leader=self.me, shard=mine.shard, epoch=mine.epoch,
                       heartbeat=mine.heartbeat, fence=self.hooks.leader_fence(), shards=want,
                       bulletin=bulletins.encode(dataclasses.replace(self._composed,
                                                                     shards=want)),
                       status=mine.status, handoffs=mine.handoffs)
        try:
            if await self.fleet.publish(copy, want, timeout=self.timings.heartbeat_s) < want:
                return  # a newer leader's copies are there: this worker no longer leads
            if await self.fleet.spread(want, timeout=self.timings.heartbeat_s):
                event(logging.WARNING, "member.layout_spread",
                      "member rows spread over more keys (new rows take the new keys)",
                      shards=want, was=self.shards, members=len(live))
        except StoreError as exc:
            event(logging.WARNING, "member.layout_failed",
                  "could not spread member rows over more keys (the task role must be "
                  "allowed to write MEMBER#*); the next read retries", shards=want,
                  error=str(exc))
            return
        # From the next bulletin on, the heartbeat copies it into every key (the layout is
        # that large now, whoever moved it).
        self.shards = max(self.shards, want)
        self.metrics.member_keys(self.shards)
        self._recompose()

    def _my_turn(self, takeover: _Takeover, now: float) -> bool:
        """The leader, or else the first live member by id, fences at once; the others
        give it a quarter lease, so one conditional write usually decides (any of them
        may still win)."""
        if self.hooks.leading():
            return True
        live = sorted(m.worker_id for m in self.view.live())
        first = live[0] if live else self.me
        return first == self.me or now - takeover.since >= self.timings.lease_s / 4

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """A takeover (fence a dead member, release its streams) in the membership's own
        scope: cancelled on stop, its failure logged and counted, never lost."""
        if self._tg is None:
            coro.close()
            return
        task = self._tg.create_task(self._guarded(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, coro: Coroutine[Any, Any, Any]) -> None:
        try:
            await coro
        except Exception:
            self.metrics.task_crashed("membership")
            event(logging.ERROR, "member.takeover_crashed", "a takeover task failed",
                  exc_info=True)

    async def _take_over(self, seen: MemberRecord) -> None:
        key = seen.worker_id
        if key in self._working:
            return
        self._working.add(key)
        try:
            fenced = await self.fleet.fence(seen, self.me, self.clock.wall_ms(),
                                            timeout=self.timings.heartbeat_s)
            if fenced is None:
                return  # it heartbeated meanwhile, or another peer fenced it
            self.metrics.member_declared_dead()
            event(logging.WARNING, "member.dead",
                  "a member stopped heartbeating; fenced it and releasing its streams",
                  member=seen.worker_id, epoch=seen.epoch, heartbeat=seen.heartbeat,
                  new_epoch=fenced.epoch)
            # Survivors deal its streams among themselves from the DEAD row (the
            # reconciler's take-over): show it to this worker's own at once.
            self.view = FleetView(tuple(fenced if m.worker_id == fenced.worker_id else m
                                        for m in self.view.members), self.view.observed_dead)
            if self.hooks.leading() and self.reading_all:
                self._gen += 1
                self.compose(self.clock.monotonic())  # the deal, in the next heartbeat
            elif not self.reading_all:
                # The leader itself was fenced: its bulletin is gone with it. Deal from
                # every row until a new leader publishes one.
                self.bulletin = None
                await self._observe_all()
            self.hooks.fleet_changed()
            # A draining fencer releases at once: it may be gone before the window ends.
            after = 0.0 if self.status is MemberStatus.DRAINING else \
                self.deal_window_s(seen.streams)
            await self._release_dead(fenced, after=after)
        except StoreError as exc:
            event(logging.WARNING, "member.takeover_failed", "fencing a dead member failed",
                  member=seen.worker_id, error=str(exc))
        finally:
            self._working.discard(key)

    def deal_window_s(self, streams: int = 0) -> float:
        """How long survivors have to take a fenced member's ``streams`` straight over
        before its fencer releases what is left (``core.deal.deal_window_s``)."""
        return deal_window_s(self.timings.observe_s, min(SECOND_PASS_S, self.timings.lease_s),
                             streams)

    async def _release_dead(self, fenced: MemberRecord, after: float = 0.0) -> None:
        """Release every stream of a fenced member still leased to it ``after`` seconds
        from now (the survivors take their parts meanwhile); mark its row released only if
        none failed (else a later pass by any member finishes the job)."""
        if after:
            await sleep_unless(after, self._stop)
            if self._stop.is_set():
                return
        released, failed = await self._release_all(fenced.worker_id, fenced.epoch)
        self.hooks.fleet_changed()
        # The owner index is eventually consistent: a stream the member acquired just
        # before it died may show up a moment later.
        await self.clock.sleep(min(SECOND_PASS_S, self.timings.lease_s))
        more, failed_again = await self._release_all(fenced.worker_id, fenced.epoch)
        released += more
        if failed or failed_again:
            event(logging.WARNING, "member.release_incomplete",
                  "some of a dead member's streams could not be released; retrying later",
                  member=fenced.worker_id, epoch=fenced.epoch,
                  failed=failed_again)
            return
        await self.fleet.mark_released(fenced.worker_id, fenced.epoch,
                                       timeout=self.timings.heartbeat_s, shard=fenced.shard)
        event(logging.INFO, "member.released", "released a dead member's streams",
              member=fenced.worker_id, epoch=fenced.epoch, streams=released)

    async def _release_all(self, owner: str, fenced_epoch: int) -> tuple[int, int]:
        """Release every stream ``owner`` still holds under an epoch older than
        ``fenced_epoch``: (released, failed).

        The owner index lists every stream that ever named ``owner`` (a release keeps the
        owner), lags behind the table, and holds only the owner and fence. So each row is
        a hint: a consistent read of the item decides, and only a stream still leased to
        an older incarnation of ``owner`` gets the conditional write (with the fence the
        read shows). Streams that moved on or were released cost a read, not a write that
        fails."""
        owned = await self.leases.owned_by(owner, timeout=self.timings.lease_s)
        if not owned:
            return 0, 0
        gate = asyncio.Semaphore(RELEASE_CONCURRENCY)
        results: list[bool] = []
        failed = 0

        async def one(stream_id: str) -> None:
            nonlocal failed
            async with gate:
                try:
                    record = await self.leases.check(stream_id,
                                                     timeout=self.timings.heartbeat_s)
                    if record is None or record.fence is None or not releasable_for(
                            owner, fenced_epoch, record.lease_owner,
                            record.lease_expires_at_ms, record.fence, record.lease_epoch):
                        return
                    results.append(await self.leases.release_for(
                        stream_id, owner, record.fence, fenced_epoch,
                        timeout=self.timings.heartbeat_s))
                except StoreError as exc:
                    failed += 1
                    event(logging.WARNING, "member.release_for_failed",
                          "releasing a dead member's stream failed; the next pass retries",
                          stream=stream_id, member=owner, error=str(exc))

        async with asyncio.TaskGroup() as tg:
            for stream_id in sorted({item.stream_id for item in owned}):
                tg.create_task(one(stream_id))
        count = sum(results)
        if count:
            self.metrics.released_on_behalf(count)
            self.hooks.fleet_changed()
        return count, failed

    def _finish_abandoned(self, members: list[MemberRecord], now: float) -> None:
        """A DEAD row whose streams were never marked released (its fencer died too): once
        it has stayed so for a lease, anyone finishes the job. A released one observed
        for long enough is deleted (clean exits delete their own rows)."""
        keys = set()
        for member in members:
            if member.status is not MemberStatus.DEAD:
                continue
            key = (member.worker_id, member.epoch)
            keys.add(key)
            since = self._unreleased_since.setdefault(key, now)
            if not member.released and now - since >= self.timings.lease_s:
                self._unreleased_since[key] = now
                self._spawn(self._finish(member))
            elif member.released and self.hooks.leading() and \
                    now - since >= FORGET_AFTER_LEASES * self.timings.lease_s:
                self._spawn(self._forget(member))
        for key in set(self._unreleased_since) - keys:
            del self._unreleased_since[key]

    async def _forget_duplicate(self, row: MemberRecord) -> None:
        """A second, older row of a worker id (``layout.one_row_each``): never used."""
        event(logging.WARNING, "member.duplicate_row",
              "a worker id has a second, older row under another key; deleting it",
              member=row.worker_id, epoch=row.epoch, shard=row.shard)
        await self._forget(row)

    async def _forget(self, member: MemberRecord) -> None:
        try:
            await self.fleet.leave(member.worker_id, member.epoch,
                                   timeout=self.timings.heartbeat_s, shard=member.shard)
        except StoreError as exc:
            event(logging.WARNING, "member.forget_failed", "could not delete a dead member's row",
                  member=member.worker_id, error=str(exc))

    async def _finish(self, member: MemberRecord) -> None:
        key = member.worker_id
        if key in self._working:
            return
        self._working.add(key)
        try:
            await self._release_dead(member)
        except StoreError as exc:
            event(logging.WARNING, "member.takeover_failed", "finishing a release failed",
                  member=member.worker_id, error=str(exc))
        finally:
            self._working.discard(key)


def _handed_over(before: FleetView, after: FleetView) -> bool:
    """A member seen in both views handed streams over between them."""
    was = {m.worker_id: m.handoffs for m in before.members}
    return any(was.get(m.worker_id, m.handoffs) != m.handoffs for m in after.members)


def _changed(before: FleetView, after: FleetView) -> bool:
    """Worth a reconcile now: someone joined, left, died, was released, started draining,
    or handed streams over."""
    def shape(view: FleetView) -> set[tuple[str, str, bool, int, bool]]:
        return {(m.worker_id, m.status.value, m.released, m.handoffs,
                 m.worker_id in view.observed_dead) for m in view.members}
    return shape(before) != shape(after)
