"""The fleet loop: find orphaned streams, take them up to capacity, supervise them.

Every ``reconcile_s`` (+/-20 % jitter) a cycle runs: the intake (``streamlease.intake``)
finds the orphans and plans over them, the balancer (``streamlease.balancing``) says how
many to take and hands streams over when this worker holds more than its share (from
the leader's bulletin, ``streamlease.core.bulletin``, or every member row), and the intake
acquires them. A worker whose own renewals are failing or slow, or whose membership is
not proven, acquires nothing until they recover (admission control, here), so an
overloaded store is not fed more work.

The other roles are composed here, each in its module: ``streamlease.holdings`` (what
this worker holds: supervisors, leases being settled), ``streamlease.takeover`` (a dead
member's streams taken straight over), ``streamlease.watch`` (the STOPPED query and the
batched read of held items), ``streamlease.audit`` (the self-audit) and
``streamlease.sweep`` (the leader's sweep, and what the worker says about items it
cannot serve).

Supervisors live in this object's TaskGroup: when the reconciler stops, intake stops
first, then every supervisor drains, then the group exits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from streamlease import tracing
from streamlease.audit import AuditSettings, SelfAudit
from streamlease.balancing import Balancer
from streamlease.clock import sleep_unless
from streamlease.context import Context
from streamlease.core import balance
from streamlease.core.backoff import jittered
from streamlease.core.lease import StopReason
from streamlease.core.notices import Notice, NoticeKind
from streamlease.errors import StoreError
from streamlease.handover import TakerGate, Taking, TakingSettings
from streamlease.holdings import Holdings, HoldingSettings, MemberGate
from streamlease.intake import Intake
from streamlease.logs import event
from streamlease.reconcile_settings import ReconcilerSettings
from streamlease.strain import LeaseHealth
from streamlease.supervisor import Supervisor
from streamlease.sweep import Sweep, SweepSettings, Unservable
from streamlease.takeover import Takeover, TakeoverSettings
from streamlease.tenancy import Hooks
from streamlease.watch import HeldWatch

# A settled worker trusting the leader's change feed queries the orphan index this many
# times less often (once a minute at the default five-second reconcile interval).
FEED_QUIET_FACTOR = 12

__all__ = ["MemberGate", "Reconciler", "ReconcilerSettings"]


class Reconciler:
    def __init__(self, ctx: Context, settings: ReconcilerSettings, membership: MemberGate,
                 hooks: Hooks | None = None) -> None:
        self.ctx = ctx
        self.metrics = ctx.metrics
        self.settings = settings
        self.membership = membership
        # A renewal slower than half a member heartbeat is slow; one keeps intake off for
        # two heartbeats.
        self.lease_health = LeaseHealth(ctx.clock, slow_s=settings.stopped_check_s / 2,
                                        window_s=2 * settings.stopped_check_s)
        self._stop = asyncio.Event()
        self._poke = asyncio.Event()
        self._fast_until = 0.0  # poll orphans often until then (a peer drains or hands off)
        self._release_by: float | None = None
        self._admitting = True
        # The roles: what this worker holds, the intake and balance, a dead member's
        # streams taken over, the reads of held items, the self-audit, the sweep (a leader
        # duty) and what cannot be served.
        self.holdings = Holdings(
            ctx, HoldingSettings(settings.max_streams, settings.supervisor,
                                 settings.stopped_check_s, settings.unservable_retry_s),
            membership, self._stop, self.lease_health, hooks)
        self.intake = Intake(ctx, settings, self.holdings, membership, self._stop)
        self.balancer = Balancer(ctx, settings, self.holdings, membership)
        self.watch = HeldWatch(ctx, settings, self.holdings, membership, self._stop)
        self.takeover = Takeover(
            ctx, self.holdings,
            TakeoverSettings(settings.max_streams, settings.supervisor.timings,
                             settings.stopped_check_s, settings.second_pass_s),
            membership, self._stop)
        self.self_audit = SelfAudit(
            ctx, self.holdings, AuditSettings(settings.audit_s, settings.stopped_check_s),
            membership, self._stop)
        self.taking = Taking(
            ctx, TakingSettings(settings.supervisor, settings.supervisor.timings,
                                settings.stopped_check_s),
            TakerGate(self._may_take, lambda: membership.epoch, self.holdings.start_handed,
                      membership.offers_done, self.holdings.acquiring, self.holdings.unsure),
            lambda: self.holdings.tg)
        self.unservable = Unservable(ctx)
        self.sweep = Sweep(
            ctx, self.holdings,
            SweepSettings(settings.sweep_s, settings.supervisor.allowed_urls,
                          settings.supervisor.catalog),
            self.unservable, self._stop)

    def offered(self, offers: frozenset[str]) -> None:
        """The offers in this worker's member row, read back by its heartbeat."""
        self.taking.offered(offers)

    def _may_take(self, stream_id: str, rebalance: bool) -> bool:
        """A stream a peer hands over is taken with room, and for a rebalance only below
        this worker's share by its own live count (as an orphan would be: past its share
        it would only shed the stream again)."""
        holdings = self.holdings
        room = self.settings.max_streams
        if rebalance and holdings.share_level is not None:
            room = min(room, holdings.share_level)
        return not self._stop.is_set() and self.membership.accepting and \
            self._admitting and len(holdings.supervisors) < room \
            and stream_id not in holdings.supervisors

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
        return self.intake.servable

    def notice(self, notice: Notice) -> None:
        """The leader's change feed: a held stream's item changed (read it now), or a
        free stream is this worker's to take (look for orphans now)."""
        if notice.kind is NoticeKind.OFFER:
            self.intake.offer(notice.stream)
            self.poke()
            return
        self.holdings.notify(notice.stream)

    def feed_resumed(self) -> None:
        """The leader's notices are trusted again after a gap: the STOPPED query runs
        once now for any flip they missed, and every held item is read once (batched)."""
        self.watch.resume()

    def poke(self) -> None:
        """Run a cycle now, and poll often for a while: a peer died, drained or handed
        streams over, and what it releases should not wait for a regular cycle."""
        self._fast_until = self.ctx.clock.monotonic() + 2 * self.settings.stopped_check_s
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

    def member_lost(self, fenced: bool) -> None:
        """This worker's membership ended or lapsed: every stream stops at once."""
        self.holdings.member_lost(fenced)

    def _next_pause(self) -> float:
        """The regular jittered interval, or a short poll while a peer drains or has just
        handed streams over (so a released stream is taken within a fraction of a
        second, not at the next random cycle)."""
        s, rng = self.settings, self.ctx.rng
        if self.membership.draining_seen() or self.ctx.clock.monotonic() < self._fast_until:
            return max(0.02, min(s.reconcile_s, s.stopped_check_s) / 5)
        # Planning from the leader's bulletin, one above its share gives only when the
        # leader names it a donor, and a bulletin that newly does pokes a cycle at once
        # (``Membership``): until then it has nothing to give. Planning from every row,
        # its own plan decides at each cycle, so it keeps the regular cadence.
        over = balance.TOLERANCE if self.membership.bulletin is not None and \
            not self.membership.reading_all else 0
        held, share = len(self.supervisors), self.balancer.share
        inside_band = share - balance.TOLERANCE <= held <= share + over
        if self.membership.feed_live() and not self.intake.orphan_since and \
                not self.balancer.donor() and inside_band and not self.holdings.unsure \
                and self._admitting:
            # Nothing to take or give, and the leader's change feed offers every freed or
            # new stream (an offer pokes a cycle at once): the orphan query is a backstop
            # for leases that lapse without a write (a wedged holder's stream lease). One
            # below its band keeps looking: an offer goes to one member, maybe another.
            return jittered(FEED_QUIET_FACTOR * s.reconcile_s, 0.2, rng)
        return jittered(s.reconcile_s, 0.2, rng)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self.holdings.tg = tg
            helpers = [tg.create_task(self._guarded("stopped_query", self.watch.stopped_loop),
                                      name="stopped streams"),
                       tg.create_task(self._guarded("audit", self.self_audit.run),
                                      name="self-audit")]
            if self.settings.supervisor.check_s is not None:
                self.holdings.batched_checks = True
                helpers.append(tg.create_task(self._guarded("checks", self.watch.checks_loop),
                                              name="held items read"))
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
            for helper in helpers:
                helper.cancel()
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
                await self._pause(jittered(self.settings.stopped_check_s, 0.2, self.ctx.rng))

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
        now = self.ctx.clock.monotonic()
        plan, waited = await self.intake.plan(now)
        for record, problem in plan.unservable:
            await self.unservable.report(record, problem)
        want = self.balancer.intake(plan.servable, waited, now)
        await self.intake.take(self.balancer.take_back(plan.acquire, waited, now), want)
        if plan.acquire and len(self.supervisors) < self.balancer.share:
            # Still short with orphans about (dealt to others by rows that may lag, or lost
            # to a racing peer): look again soon, so the gap is filled before they wait two
            # intervals and a member already at its share takes them (and sheds them later).
            self._fast_until = max(self._fast_until,
                                   self.ctx.clock.monotonic() + self.settings.reconcile_s)
        self.metrics.set_leases_held(len(self.supervisors))

    def _admits(self) -> bool:
        """Admission control: no new streams while this worker's renewals are failing,
        and none while its membership is not proven (registering, self-fenced, draining)."""
        healthy = self.lease_health.admits()
        admits = healthy and self.membership.accepting
        if admits != self._admitting:
            self._admitting = admits
            if admits:
                event(logging.INFO, "reconcile.admission", "acquiring again", admitting=True)
            elif not healthy:
                event(logging.WARNING, "reconcile.admission",
                      "renewals failing or slow: not acquiring", admitting=False,
                      why="renewals")
            else:
                # Registering, draining (a SIGTERM) or self-fenced: each logged where it
                # happens; not a sign of a struggling store.
                event(logging.INFO, "reconcile.admission",
                      "not a member in good standing: not acquiring", admitting=False,
                      why="membership")
            self.metrics.admission(admits)
        return admits
