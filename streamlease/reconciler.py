"""The fleet loop: find orphaned streams, take them up to capacity, supervise them.

Every ``reconcile_s`` (+/-20 % jitter) it queries the index for STARTED streams whose
lease expired before ``now - skew_margin`` (released streams have expiry 0), and takes
what the balance plan (``streamlease.core.balance``, or the leader's bulletin,
``streamlease.core.bulletin``) gives this worker, shuffled and capped per cycle; the
conditional acquire is the only arbiter. It hands streams over when this
worker holds more than its share. A worker whose own renewals are failing or slow, or
whose membership is not proven, acquires nothing until they recover (admission
control), so an overloaded store is not fed more work. Every member heartbeat it also
queries the index for STOPPED streams still held, so their holders release them.

The reconciler is the intake; the other roles are composed here, each in its module:
``streamlease.holdings`` (what this worker holds: supervisors, leases being settled),
``streamlease.takeover`` (a dead member's streams taken straight over),
``streamlease.audit`` (the self-audit) and ``streamlease.sweep`` (the leader's sweep, and
what the worker says about items it cannot serve).

Supervisors live in this object's TaskGroup: when the reconciler stops, intake stops
first, then every supervisor drains, then the group exits.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from streamlease import tracing
from streamlease.audit import AuditSettings, SelfAudit
from streamlease.clock import Clock, sleep_unless
from streamlease.core import balance, bulletin
from streamlease.core.backoff import jittered
from streamlease.core.lease import HolderState, StopReason, takeover_threshold_ms
from streamlease.core.model import StreamRecord
from streamlease.core.notices import Notice, NoticeKind
from streamlease.core.plan import plan_cycle
from streamlease.errors import StoreError
from streamlease.health import HealthState
from streamlease.holdings import Holdings, HoldingSettings, MemberGate
from streamlease.logs import event
from streamlease.metrics import Metrics
from streamlease.store.protocols import LeaseStore, Sink
from streamlease.supervisor import LeaseHealth, PumpFactory, Supervisor, SupervisorSettings
from streamlease.sweep import Sweep, SweepSettings, Unservable
from streamlease.takeover import Takeover, TakeoverSettings

ORPHAN_QUERY_LIMIT = 1000
# A settled worker trusting the leader's change feed queries the orphan index this many
# times less often (once a minute at the default five-second reconcile interval).
FEED_QUIET_FACTOR = 12
OFFERED_LIMIT = 100  # offered streams remembered between two cycles (the rest: the index)

__all__ = ["MemberGate", "Reconciler", "ReconcilerSettings"]


@dataclass(frozen=True)
class ReconcilerSettings:
    owner: str
    reconcile_s: float
    sweep_s: float
    max_streams: int
    acquire_per_cycle: int
    supervisor: SupervisorSettings
    stopped_check_s: float = 5.0  # the held-STOPPED query (the member heartbeat interval)
    min_hold_s: float = 30.0  # a stream is never handed over sooner after its acquisition
    audit_s: float = 32.0  # the self-audit's interval: 1.6 leases (+20 % < two)
    second_pass_s: float = 2.0  # a dead member's streams are looked up again after this
    # An item found unservable only once acquired (a profile problem: the orphan index does
    # not hold those attributes) is not taken again for this long (three member leases);
    # the operator's fix is picked up after it.
    unservable_retry_s: float = 60.0


class Reconciler:
    def __init__(self, leases: LeaseStore, sink: Sink, clock: Clock, metrics: Metrics,
                 settings: ReconcilerSettings, membership: MemberGate,
                 rng: random.Random | None = None,
                 on_delivered: Callable[[int], None] | None = None,
                 health: HealthState | None = None,
                 pump_factory: PumpFactory | None = None) -> None:
        self.leases = leases
        self.sink = sink
        self.clock = clock
        self.metrics = metrics
        self.settings = settings
        self.membership = membership
        self.rng = rng or random.Random()
        timings = settings.supervisor.timings
        # A renewal slower than half a member heartbeat is slow; one keeps intake off for
        # two heartbeats.
        self.lease_health = LeaseHealth(clock, slow_s=settings.stopped_check_s / 2,
                                        window_s=2 * settings.stopped_check_s)
        self._stop = asyncio.Event()
        self._poke = asyncio.Event()
        self._stopped_now = asyncio.Event()  # the STOPPED query is due at once
        self._checks_now = asyncio.Event()  # the batched read of held items is due at once
        self._fast_until = 0.0  # poll orphans often until then (a peer drains or hands off)
        # Streams the leader's change feed offered this worker since its last cycle: read
        # at once, not found through the orphan index (which lags the table).
        self._offered: set[str] = set()
        self._share = 0  # this worker's fair share at the last cycle
        self._next_shed = 0.0
        self._servable = 0  # servable orphans at the last cycle (the leader's bulletin)
        # The bulletin the last shed followed, and when: shed again on a newer one.
        self._shed_after: tuple[bulletin.Bulletin | None, float] = (None, 0.0)
        self._orphan_since: dict[str, float] = {}  # when this worker first saw each orphan
        # Streams this worker handed over to even out the fleet, and when: it does not take
        # them back itself before they wait three reconcile intervals (see _take_back).
        self._handed_over: dict[str, float] = {}
        self._totals: deque[tuple[float, int]] = deque()  # (when, streams counted) lately
        self._release_by: float | None = None
        self._admitting = True
        self.health = health or HealthState(timings.lease_s)
        # The roles: what this worker holds, a dead member's streams taken over, the
        # self-audit, the sweep (a leader duty) and what cannot be served.
        self.holdings = Holdings(
            leases, sink, clock, metrics,
            HoldingSettings(settings.owner, settings.max_streams, settings.supervisor,
                            settings.stopped_check_s, settings.unservable_retry_s),
            membership, self.rng, self._stop, self.lease_health, self.health,
            on_delivered, pump_factory)
        self.takeover = Takeover(
            leases, self.holdings, clock, metrics,
            TakeoverSettings(settings.owner, settings.max_streams, timings,
                             settings.stopped_check_s, settings.second_pass_s),
            membership, self._stop)
        self.self_audit = SelfAudit(
            leases, self.holdings, metrics,
            AuditSettings(settings.owner, settings.audit_s, settings.stopped_check_s),
            membership, self.rng, self._stop)
        self.unservable = Unservable(leases, clock, metrics)
        self.sweep = Sweep(
            leases, self.holdings, clock, metrics,
            SweepSettings(settings.sweep_s, settings.supervisor.allowed_urls,
                          settings.supervisor.catalog),
            self.unservable, self.rng, self._stop)

    @property
    def supervisors(self) -> dict[str, Supervisor]:
        return self.holdings.supervisors

    @property
    def unreleased(self) -> int:
        """Streams whose release did not go through when the worker stopped."""
        return self.holdings.unreleased

    async def audit(self) -> int:
        return await self.self_audit.audit()

    async def sweep_duty(self, lease: object, stop: asyncio.Event) -> None:
        """A leader duty (``streamlease.sweep``)."""
        await self.sweep.duty(lease, stop)

    def stop(self, release_by: float | None = None) -> None:
        """Stop acquiring and drain every supervisor now (flush and release, the release
        retried until ``release_by``), without waiting for a cycle in progress."""
        self._stop.set()
        self._release_by = release_by
        self.holdings.drain_all(StopReason.SHUTDOWN, release_by)

    @property
    def stopping(self) -> asyncio.Event:
        return self._stop

    def orphans_seen(self) -> int:
        """Servable orphans at the last cycle, as this worker counted them."""
        return self._servable

    def notice(self, notice: Notice) -> None:
        """The leader's change feed: a held stream's item changed (read it now), or a
        free stream is this worker's to take (look for orphans now)."""
        if notice.kind is NoticeKind.OFFER:
            if len(self._offered) < OFFERED_LIMIT:
                self._offered.add(notice.stream)
            self.poke()
            return
        self.holdings.notify(notice.stream)

    def feed_resumed(self) -> None:
        """The leader's notices are trusted again after a gap: the STOPPED query runs
        once now for any flip they missed, and every held item is read once (batched)."""
        self._stopped_now.set()
        self._checks_now.set()

    def poke(self) -> None:
        """Run a cycle now, and poll often for a while: a peer died, drained or handed
        streams over, and what it releases should not wait for a regular cycle."""
        self._fast_until = self.clock.monotonic() + 2 * self.settings.stopped_check_s
        self._poke.set()
        # A member found dead: take this worker's part now, not after a cycle in progress
        # (a stopping worker's take-over deals nothing).
        if self._admits():
            try:
                self.takeover.deal_dead()
            except Exception:  # the caller (membership) must go on to its own part
                self.metrics.task_crashed("takeover")
                event(logging.ERROR, "takeover.crashed", "starting a take-over failed; the "
                      "next cycle tries again", exc_info=True)

    def _next_pause(self) -> float:
        """The regular jittered interval, or a short poll while a peer drains or has just
        handed streams over (so a released stream is taken within a fraction of a
        second, not at the next random cycle)."""
        if self.membership.draining_seen() or self.clock.monotonic() < self._fast_until:
            return max(0.02, min(self.settings.reconcile_s, self.settings.stopped_check_s) / 5)
        # Planning from the leader's bulletin, one above its share gives only when the
        # leader names it a donor, and a bulletin that newly does pokes a cycle at once
        # (``Membership``): until then it has nothing to give. Planning from every row,
        # its own plan decides at each cycle, so it keeps the regular cadence.
        over = balance.TOLERANCE if self.membership.bulletin is not None and \
            not self.membership.reading_all else 0
        held = len(self.supervisors)
        inside_band = self._share - balance.TOLERANCE <= held <= self._share + over
        if self.membership.feed_live() and not self._orphan_since and not self._donor() \
                and inside_band and not self.holdings.unsure and self._admitting:
            # Nothing to take or give, and the leader's change feed offers every freed or
            # new stream (an offer pokes a cycle at once): the orphan query is a backstop
            # for leases that lapse without a write (a wedged holder's stream lease). One
            # below its band keeps looking: an offer goes to one member, maybe another.
            return jittered(FEED_QUIET_FACTOR * self.settings.reconcile_s, 0.2, self.rng)
        return jittered(self.settings.reconcile_s, 0.2, self.rng)

    def _donor(self) -> bool:
        """The leader's bulletin asks this worker to give a stream (its cycle sheds it), or
        a hand-over of its own is still in flight."""
        news = self.membership.bulletin
        return (news is not None and self.settings.owner in news.donors) or any(
            s.holding.reason is StopReason.REBALANCE for s in self.supervisors.values())

    def member_lost(self, fenced: bool) -> None:
        """This worker's membership ended or lapsed: every stream stops at once."""
        self.holdings.member_lost(fenced)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self.holdings.tg = tg
            stopped = tg.create_task(self._guarded("stopped_query", self._stopped_loop),
                                     name="stopped streams")
            audit = tg.create_task(self._guarded("audit", self.self_audit.run),
                                   name="self-audit")
            checks = None
            if self.settings.supervisor.check_s is not None:
                self.holdings.batched_checks = True
                checks = tg.create_task(self._guarded("checks", self._checks_loop),
                                        name="held items read")
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    with tracing.span("reconcile", held=len(self.supervisors)):
                        await self._cycle()
                except StoreError as exc:
                    event(logging.WARNING, "reconcile.failed", "reconcile cycle failed",
                          error=str(exc))
                except Exception:
                    self.metrics.task_crashed("reconcile")
                    event(logging.ERROR, "reconcile.crashed", "reconcile cycle crashed",
                          exc_info=True)
                self.metrics.reconcile(time.perf_counter() - started)
                await self._pause(self._next_pause(), self._poke)
            stopped.cancel()
            audit.cancel()
            if checks is not None:
                checks.cancel()
            self.holdings.drain_all(StopReason.SHUTDOWN, self._release_by)
        self.holdings.tg = None
        await self.holdings.settle_unsure()
        if self.holdings.unsure:
            # Possibly still held: keep the member row so peers release them on its behalf.
            self.holdings.unreleased += len(self.holdings.unsure)

    async def _guarded(self, task: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run a helper loop of the reconciler; an unexpected failure is logged, counted
        and the loop starts again after a pause, so it never takes the reconciler (and
        every supervisor in its scope) down with it."""
        while not self._stop.is_set():
            try:
                await loop()
                return
            except Exception:
                self.metrics.task_crashed(task)
                event(logging.ERROR, "reconcile.task_crashed", "a reconciler loop failed; "
                      "restarting it", task=task, exc_info=True)
                await self._pause(jittered(self.settings.stopped_check_s, 0.2, self.rng))

    async def _pause(self, seconds: float, also: asyncio.Event | None = None) -> None:
        """Sleep, cut short by a stop (or by ``also``, which is then cleared)."""
        await sleep_unless(seconds, self._stop, *([also] if also is not None else []))
        if also is not None:
            also.clear()

    async def _cycle(self) -> None:
        if self.holdings.unsure:
            await self.holdings.settle_unsure()
        if not self._admits():
            return  # nothing will be taken: spare the store the orphan query too
        self.takeover.deal_dead()
        timings = self.settings.supervisor.timings
        now_ms = self.clock.wall_ms()
        now = self.clock.monotonic()
        candidates = await self._candidates(takeover_threshold_ms(now_ms, timings))
        orphans = []
        for candidate in candidates:
            held = self.supervisors.get(candidate.stream_id)
            if held is None:
                orphans.append(candidate)
            else:
                held.seen(candidate)  # released or taken from under us (a force release)
        if orphans:
            self.metrics.orphans_found(len(orphans))
            tracing.set_attributes(orphans=len(orphans))
        if self.holdings.unservable_until:
            mono = self.clock.monotonic()
            for stream_id, until in list(self.holdings.unservable_until.items()):
                if until <= mono:
                    del self.holdings.unservable_until[stream_id]
            orphans = [o for o in orphans if o.stream_id not in self.holdings.unservable_until]
        waited = self._waited(orphans, now)
        plan = plan_cycle(
            orphans, held=set(self.supervisors), max_streams=self.settings.max_streams,
            per_cycle=self.settings.max_streams, now_wall_ms=now_ms, timings=timings,
            allowed_prefixes=self.settings.supervisor.allowed_urls, rng=self.rng,
            rank=waited.tier,  # the longest waiting first; racing takers spread within a tier
            catalog=self.settings.supervisor.catalog,
        )
        for record, problem in plan.unservable:
            await self.unservable.report(record, problem)
        want = self._balance(plan.servable, waited, now)
        budget = min(want, self.settings.acquire_per_cycle,
                     self.settings.max_streams - len(self.supervisors))
        acquire = self._take_back(plan.acquire, waited, now)
        if budget > 0 and acquire and not self._stop.is_set():
            async with asyncio.TaskGroup() as tg:
                for record in acquire[:budget]:
                    tg.create_task(self._acquire(record))
            self.membership.counts_changed()
        if plan.acquire and len(self.supervisors) < self._share:
            # Still short with orphans about (dealt to others by rows that may lag, or lost
            # to a racing peer): look again soon, so the gap is filled before they wait two
            # intervals and a member already at its share takes them (and sheds them later).
            self._fast_until = max(self._fast_until,
                                   self.clock.monotonic() + self.settings.reconcile_s)
        self.metrics.set_leases_held(len(self.supervisors))

    def _take_back(self, acquirable: list[StreamRecord], waited: balance.Waited,
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

    async def _candidates(self, threshold_ms: int) -> list[StreamRecord]:
        """The orphan query's answer and, read beside it (not after it: an offered stream
        is taken one round trip sooner), each stream offered since the last cycle, read
        consistently (the index may not show it yet). Where both have a stream, the
        consistent read is the one kept."""
        offered, self._offered = self._offered - set(self.supervisors), set()
        if not offered:
            return await self.leases.orphans(threshold_ms, ORPHAN_QUERY_LIMIT)
        failed: StoreError | None = None
        found: list[StreamRecord] = []
        async with asyncio.TaskGroup() as tg:
            reading = tg.create_task(self._read_offered(offered))
            try:
                found = await self.leases.orphans(threshold_ms, ORPHAN_QUERY_LIMIT)
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
                return await self.leases.check(stream_id, timeout=timeout)
            except StoreError:
                return None  # the orphan query finds it later
        async with asyncio.TaskGroup() as tg:
            reads = [tg.create_task(read(sid)) for sid in sorted(offered)]
        return [r for r in (t.result() for t in reads) if r is not None]

    # -- a dead member's streams ---------------------------------------------------------

    def _waited(self, orphans: list[StreamRecord], now: float) -> balance.Waited:
        """Note when this worker first saw each orphan; the orphans by how long they
        have waited since, in reconcile intervals."""
        current = {o.stream_id for o in orphans}
        for gone in set(self._orphan_since) - current:
            del self._orphan_since[gone]
        for stream_id in current:
            self._orphan_since.setdefault(stream_id, now)
        return balance.waited(self._orphan_since, now, self.settings.reconcile_s)

    def _balance(self, servable: int, waited: balance.Waited, now: float) -> int:
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
        self._servable = servable
        view = self.membership.view
        if not view.members:
            self._share = self.settings.max_streams  # no fleet view yet: take as before
            return self.settings.acquire_per_cycle
        # Streams being handed over are no longer this worker's to count.
        keeping = sum(1 for s in self.supervisors.values()
                      if s.holding.reason is not StopReason.REBALANCE)
        news = self.membership.bulletin
        if news is not None and not self.membership.reading_all:
            # The leader's bulletin: the share level, the gaps, the donors.
            plan = bulletin.plan_from(news, self.settings.owner, self.settings.max_streams,
                                      keeping, self.membership.accepting, servable)
            return self._follow(plan, keeping, waited, now, news)
        counts, active = balance.counts_of(list(view.members), self.settings.owner, keeping,
                                           view.observed_dead)
        capacities = {m.worker_id: m.capacity for m in view.members}
        capacities[self.settings.owner] = self.settings.max_streams
        if self.membership.accepting:
            active.add(self.settings.owner)
        else:
            active.discard(self.settings.owner)
        counted = sum(counts.values()) + servable
        self._totals.append((now, counted))
        while self._totals and self._totals[0][0] < now - 3 * self.settings.stopped_check_s:
            self._totals.popleft()
        plan = balance.plan(self.settings.owner, counts, active, capacities, servable,
                            total_at_least=max(t for _, t in self._totals))
        return self._follow(plan, keeping, waited, now)

    def _follow(self, plan: balance.Balance, keeping: int, waited: balance.Waited,
                now: float, news: bulletin.Bulletin | None = None) -> int:
        """Shed what ``plan`` (made from the leader's bulletin ``news``, if given) says;
        how many orphans to take now."""
        self.metrics.share(plan.share)
        self._share = plan.share
        if plan.shed:
            self._shed(plan.shed, now, news)
        return balance.intake(plan, keeping, waited)

    def _shed(self, count: int, now: float, news: bulletin.Bulletin | None = None) -> None:
        """Hand ``count`` streams over through the graceful path (stop reading, flush,
        checkpoint, release), the longest held first, never one held less than the
        minimum hold time; then pause shedding until the takers' counts can be seen: a
        heartbeat when planning from the rows; from the leader's bulletin, until a
        bulletin that differs from the one the last shed followed (the leader has seen
        the counts move), or four heartbeats if none comes."""
        if now < self._next_shed or any(s.holding.reason is StopReason.REBALANCE
                                        for s in self.supervisors.values()):
            return  # the last hand-over is still in flight, or its takers not yet seen
        if news is not None and news == self._shed_after[0] and \
                now < self._shed_after[1] + 4 * self.settings.stopped_check_s:
            return  # the bulletin does not show the last hand-over yet
        movable = [s for s in self.supervisors.values()
                   if s.holding.state is HolderState.HOLDING
                   and now - s.acquired_at >= self.settings.min_hold_s]
        movable.sort(key=lambda s: s.acquired_at)
        chosen = movable[:count]
        for supervisor in chosen:
            supervisor.request_drain(StopReason.REBALANCE)
            self._handed_over[supervisor.stream] = now
        if chosen:
            self.metrics.rebalance_moved(len(chosen))
            event(logging.INFO, "balance.shed", "handing streams over to even out the fleet",
                  streams=[s.stream for s in chosen], held=len(self.supervisors))
            # The takers' new counts reach the member rows within a heartbeat.
            self._next_shed = now + 1.5 * self.settings.stopped_check_s
            self._shed_after = (news, now)

    def _admits(self) -> bool:
        """Admission control: no new streams while this worker's renewals are failing,
        and none while its membership is not proven (registering, self-fenced, draining)."""
        admits = self.lease_health.admits() and self.membership.accepting
        if admits != self._admitting:
            self._admitting = admits
            event(logging.WARNING if not admits else logging.INFO,
                  "reconcile.admission", "renewals failing or slow: not acquiring" if not admits
                  else "renewals healthy again: acquiring", admitting=admits)
            self.metrics.admission(admits)
        return admits

    async def _stopped_loop(self) -> None:
        """Every member heartbeat: STOPPED streams whose lease is still live (the index
        returns only those), so a holder releases within a heartbeat of the flip, though
        it renews its own lease only every 80 minutes (at the defaults). While the
        leader's change feed is live its notices say so instead, and the query rests."""
        while not self._stop.is_set():
            asked = self._stopped_now.is_set()
            self._stopped_now.clear()
            if self.membership.feed_live() and not asked:
                await sleep_unless(jittered(self.settings.stopped_check_s, 0.1, self.rng),
                                   self._stop, self._stopped_now)
                continue
            try:
                found = await self.leases.held_stopped(self.clock.wall_ms(), ORPHAN_QUERY_LIMIT,
                                                       timeout=self.settings.stopped_check_s)
                for record in found:
                    held = self.supervisors.get(record.stream_id)
                    if held is not None:
                        held.seen(record)
            except StoreError as exc:
                event(logging.WARNING, "reconcile.stopped_query_failed",
                      "cannot query for STOPPED streams", error=str(exc))
            await sleep_unless(jittered(self.settings.stopped_check_s, 0.1, self.rng),
                               self._stop, self._stopped_now)

    async def _checks_loop(self) -> None:
        """Every stream check interval, unless the leader's change feed tells of every
        change: one eventually consistent read of every held item (``check_many``: a
        BatchGetItem per 100), not one consistent read per stream. An item that looks
        changed (stopped, a new URL, released, moved on, gone) is read consistently by its
        holder, and only that read decides."""
        every = self.settings.supervisor.check_s
        assert every is not None  # the loop runs only with a check interval (``run``)
        while not self._stop.is_set():
            asked = self._checks_now.is_set()
            self._checks_now.clear()
            held = dict(self.supervisors)
            if held and (asked or not self.membership.feed_live()):
                try:
                    found = await self.leases.check_many(
                        list(held), timeout=self.settings.supervisor.call_timeout_s)
                    for stream_id, supervisor in held.items():
                        if stream_id in found:
                            supervisor.compare(found[stream_id])
                except StoreError as exc:
                    event(logging.WARNING, "reconcile.checks_failed",
                          "cannot read the held items; trying again next interval",
                          error=str(exc), held=len(held))
            await sleep_unless(jittered(every, 0.1, self.rng), self._stop, self._checks_now)

    async def _acquire(self, candidate: StreamRecord) -> None:
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
        timings = self.settings.supervisor.timings
        if self._stop.is_set() or not self.membership.accepting:
            return  # the worker stopped accepting (self-fenced, draining) since the plan
        sent = self.clock.monotonic()
        now_ms = self.clock.wall_ms()
        try:
            got = await self.leases.acquire(candidate.stream_id, self.settings.owner, now_ms,
                                            timings, timeout=2 * self.settings.stopped_check_s,
                                            epoch=self.membership.epoch)
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
        seen = self._orphan_since.get(candidate.stream_id)
        delay = (now_ms - expired) / 1000 if expired else \
            None if seen is None else max(0.0, sent - seen)
        await self.holdings.start(got, sent, delay, candidate.lease_owner,
                                  how=tracing.how_freed(candidate))

