"""The fleet loop: find orphaned streams, take them up to capacity, supervise them.

Every ``reconcile_s`` (+/-20 % jitter) it queries the index for STARTED streams whose
lease expired before ``now - skew_margin`` (released streams have expiry 0), and takes
what the balance plan (``streamlease.core.balance``) gives this worker, shuffled and capped per
cycle; the conditional acquire is the only arbiter. It hands streams over when this
worker holds more than its share. A worker whose own renewals are failing or slow, or
whose membership is not proven, acquires nothing until they recover (admission
control), so an overloaded store is not fed more work. Every member heartbeat it also
queries the index for STOPPED streams still held, so their holders release them.

The sweep (a paginated Scan for items the index cannot see: written by hand without lease
fields, or with an unknown state) is a duty of the fleet leader (``sweep_duty``), in a
task of its own, so a slow Scan never delays a takeover.

Supervisors live in this object's TaskGroup: when the reconciler stops, intake stops
first, then every supervisor drains, then the group exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from streamlease.clock import Clock
from streamlease.core import balance
from streamlease.core.backoff import jittered
from streamlease.core.deal import deal, deal_weights
from streamlease.core.lease import HolderState, StopReason, resume_point, takeover_threshold_ms
from streamlease.core.membership import MemberRecord, MemberStatus
from streamlease.core.model import StreamRecord, Tenure, error_text
from streamlease.core.plan import (
    VALID_STATES,
    bad_item_reason,
    fleet_view,
    invisible_to_index,
    item_problem,
    plan_cycle,
)
from streamlease.errors import StoreError
from streamlease.health import HealthState
from streamlease.logs import event
from streamlease.membership import FleetView
from streamlease.metrics import Metrics
from streamlease.store.protocols import Acquired, LeaseStore, Sink
from streamlease.supervisor import (
    LeaseHealth,
    PumpFactory,
    Supervisor,
    SupervisorSettings,
    shielded,
)

ORPHAN_QUERY_LIMIT = 1000
REPORTED_LIMIT = 10_000  # (stream, problem) pairs remembered for log rate-limiting
AUDITED_LIMIT = 100_000  # (stream, fence) pairs the self-audit knows are not leased here
AUDIT_READS = 200  # consistent reads one self-audit makes at most
# Take-overs of a dead member's streams: each moves the orphan index's STARTED key (a
# delete and a put), which takes about 1,000 writes/s; the survivors share half of it.
TAKEOVER_INDEX_WRITES_S = 500.0
TAKEOVER_CONCURRENCY = 16  # take-over writes in flight per worker
DEALT_LIMIT = 1_000  # dead incarnations remembered as dealt


@dataclass(frozen=True)
class _Waited:
    """Orphans by how long this worker has seen them wait (each set includes the next)."""

    lingering: frozenset[str]  # half a reconcile interval: a dealt taker would have had it
    starving: frozenset[str]  # two intervals: taken by anyone with room in its band
    abandoned: frozenset[str]  # three: taken by anyone

    def tier(self, record: StreamRecord) -> int:
        sid = record.stream_id
        return 0 if sid in self.abandoned else 1 if sid in self.starving else \
            2 if sid in self.lingering else 3


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
    audit_s: float = 32.0  # the self-audit's interval: 1.6 member leases (+20 % < two)
    second_pass_s: float = 2.0  # a dead member's streams are looked up again after this
    # An item found unservable only once acquired (a profile problem: the orphan index does
    # not hold those attributes) is not taken again for this long (three member leases);
    # the operator's fix is picked up after it.
    unservable_retry_s: float = 60.0


class MemberGate(Protocol):
    """What the reconciler needs of this worker's membership."""

    @property
    def epoch(self) -> int: ...

    @property
    def accepting(self) -> bool: ...

    @property
    def view(self) -> FleetView: ...

    def may_write(self, now: float) -> bool: ...

    def counts_changed(self) -> None: ...

    def handed_off(self) -> None: ...


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
        self.supervisors: dict[str, Supervisor] = {}
        timings = settings.supervisor.timings
        # A renewal slower than half a member heartbeat is slow; one keeps intake off for
        # two heartbeats.
        self.lease_health = LeaseHealth(clock, slow_s=settings.stopped_check_s / 2,
                                        window_s=2 * settings.stopped_check_s)
        self._stop = asyncio.Event()
        self._poke = asyncio.Event()
        self._fast_until = 0.0  # poll orphans often until then (a peer drains or hands off)
        self._share = 0  # this worker's fair share at the last cycle
        self._next_shed = 0.0
        self._orphan_since: dict[str, float] = {}  # when this worker first saw each orphan
        self._totals: deque[tuple[float, int]] = deque()  # (when, streams counted) lately
        self._release_by: float | None = None
        self._reported: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._on_delivered = on_delivered
        self._pump_factory = pump_factory
        self._tg: asyncio.TaskGroup | None = None
        self._admitting = True
        self.unreleased = 0  # shutdown drains whose release did not go through
        # Streams this worker may hold without a supervisor: an acquire (or the release
        # of a late one) whose outcome is unknown. Settled by reading the item back.
        self._unsure: set[str] = set()
        self._acquiring: set[str] = set()
        # Per stream, the fence at which the owner index listed it under this worker and a
        # consistent read showed it not leased here: a fence moves on with every
        # acquisition, so the same entry needs no second read. Forgotten when this worker
        # acquires the stream (its fence may then be moved anywhere by ``advance``).
        self._audited: OrderedDict[str, int] = OrderedDict()
        self._unservable_until: dict[str, float] = {}  # stream -> monotonic: not before
        # Dead incarnations (worker id, fenced epoch) whose streams this worker has dealt.
        self._dealt: OrderedDict[tuple[str, int], None] = OrderedDict()
        self.health = health or HealthState(timings.lease_s)

    def stop(self, release_by: float | None = None) -> None:
        """Stop acquiring and drain every supervisor now (flush and release, the release
        retried until ``release_by``), without waiting for a cycle in progress."""
        self._stop.set()
        self._release_by = release_by
        for supervisor in list(self.supervisors.values()):
            supervisor.request_drain(StopReason.SHUTDOWN, release_by)

    @property
    def stopping(self) -> asyncio.Event:
        return self._stop

    def poke(self) -> None:
        """Run a cycle now, and poll often for a while: a peer died, drained or handed
        streams over, and what it releases should not wait for a regular cycle."""
        self._fast_until = self.clock.monotonic() + 2 * self.settings.stopped_check_s
        self._poke.set()

    def _next_pause(self) -> float:
        """The regular jittered interval, or a short poll while a peer drains or has just
        handed streams over (so a released stream is taken within a fraction of a
        second, not at the next random cycle)."""
        if self.membership.view.draining() or self.clock.monotonic() < self._fast_until:
            return max(0.02, min(self.settings.reconcile_s, self.settings.stopped_check_s) / 5)
        return jittered(self.settings.reconcile_s, 0.2, self.rng)

    def member_lost(self, fenced: bool) -> None:
        """This worker's membership ended or lapsed: every stream stops at once."""
        for supervisor in list(self.supervisors.values()):
            supervisor.member_lost(fenced)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            stopped = tg.create_task(self._guarded("stopped_query", self._stopped_loop),
                                     name="stopped streams")
            audit = tg.create_task(self._guarded("audit", self._audit_loop),
                                   name="self-audit")
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
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
            for supervisor in list(self.supervisors.values()):
                supervisor.request_drain(StopReason.SHUTDOWN, self._release_by)
        self._tg = None
        await self._settle_unsure()
        if self._unsure:
            # Possibly still held: keep the member row so peers release them on its behalf.
            self.unreleased += len(self._unsure)

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

    async def _audit_loop(self) -> None:
        """The self-audit, every ``audit_s`` (+/-20 %), the first one a heartbeat after
        start-up (a previous incarnation's leases whose release failed at registration)."""
        await self._pause(self.settings.stopped_check_s)
        while not self._stop.is_set():
            try:
                await self.audit()
            except StoreError as exc:
                event(logging.WARNING, "audit.failed", "self-audit failed", error=str(exc))
            await self._pause(jittered(self.settings.audit_s, 0.2, self.rng))

    async def audit(self) -> int:
        """Release every stream leased to this worker that it does not serve; returns how
        many. The backstop for every path that would leave a stream leased but unserved
        until its stream lease runs out: an acquire whose answer was lost, a supervisor
        that failed, a release that did not go through, a previous incarnation under the
        same worker id. The owner index (which lags, keys only) says where to look; a
        consistent read of each item decides, and the release is conditioned on the
        owner and fence that read showed."""
        owner = self.settings.owner
        listed = await self.leases.owned_by(owner, timeout=self.settings.audit_s / 2)
        todo = [o for o in listed if o.stream_id not in self.supervisors
                and o.stream_id not in self._acquiring
                and self._audited.get(o.stream_id) != o.fence]
        released = 0
        for owned in todo[:AUDIT_READS]:
            if self._stop.is_set():
                break
            try:
                released += await self._audit_one(owner, owned.stream_id, owned.fence)
            except StoreError as exc:
                event(logging.WARNING, "audit.read_failed", "self-audit could not settle a "
                      "stream; trying again next time", stream=owned.stream_id, error=str(exc))
        return released

    async def _audit_one(self, owner: str, sid: str, listed: int) -> int:
        record = await self.leases.check(sid, timeout=self.settings.stopped_check_s)
        if sid in self.supervisors or sid in self._acquiring:
            return 0  # taken up while the read was in flight: served
        if record is None or record.fence is None:
            return 0
        if record.lease_epoch is not None and record.lease_epoch > self.membership.epoch:
            return 0  # a newer incarnation under this id took it: not this process's to free
        if record.lease_owner != owner or not record.lease_expires_at_ms:
            self._remember_audited(sid, listed)
            return 0
        tenure = Tenure(sid, owner, record.fence, record.last_seq, record.lease_expires_at_ms)
        if not await self.leases.release(tenure, timeout=self.settings.stopped_check_s):
            return 0
        self.metrics.unserved_released()
        self._unsure.discard(sid)
        event(logging.WARNING, "lease.unserved_released",
              "a stream leased to this worker had no supervisor here; released",
              stream=sid, fence=record.fence, source="audit")
        self._remember_audited(sid, listed)
        return 1

    def _remember_audited(self, stream_id: str, fence: int) -> None:
        self._audited[stream_id] = fence
        self._audited.move_to_end(stream_id)
        if len(self._audited) > AUDITED_LIMIT:
            self._audited.popitem(last=False)

    async def _pause(self, seconds: float, also: asyncio.Event | None = None,
                     clear: bool = True) -> None:
        """Sleep, cut short by a stop (or by ``also``, which is then cleared unless
        ``clear`` is False)."""
        waits = [asyncio.ensure_future(self._stop.wait())]
        if also is not None:
            waits.append(asyncio.ensure_future(also.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        if also is not None and clear:
            also.clear()

    async def _cycle(self) -> None:
        if self._unsure:
            await self._settle_unsure()
        if not self._admits():
            return  # nothing will be taken: spare the store the orphan query too
        self._deal_dead()
        timings = self.settings.supervisor.timings
        now_ms = self.clock.wall_ms()
        now = self.clock.monotonic()
        candidates = await self.leases.orphans(takeover_threshold_ms(now_ms, timings),
                                               ORPHAN_QUERY_LIMIT)
        orphans = []
        for candidate in candidates:
            held = self.supervisors.get(candidate.stream_id)
            if held is None:
                orphans.append(candidate)
            else:
                held.seen(candidate)  # released or taken from under us (a force release)
        if orphans:
            self.metrics.orphans_found(len(orphans))
        if self._unservable_until:
            mono = self.clock.monotonic()
            for stream_id, until in list(self._unservable_until.items()):
                if until <= mono:
                    del self._unservable_until[stream_id]
            orphans = [o for o in orphans if o.stream_id not in self._unservable_until]
        waited = self._waited(orphans, now)
        plan = plan_cycle(
            orphans, held=set(self.supervisors), max_streams=self.settings.max_streams,
            per_cycle=self.settings.max_streams, now_wall_ms=now_ms, timings=timings,
            allowed_prefixes=self.settings.supervisor.allowed_urls, rng=self.rng,
            rank=waited.tier,  # the longest waiting first; racing takers spread within a tier
        )
        for record, problem in plan.unservable:
            await self._report_unservable(record, problem)
        want = self._balance(plan.servable, waited, now)
        budget = min(want, self.settings.acquire_per_cycle,
                     self.settings.max_streams - len(self.supervisors))
        if budget > 0 and plan.acquire and not self._stop.is_set():
            async with asyncio.TaskGroup() as tg:
                for record in plan.acquire[:budget]:
                    tg.create_task(self._acquire(record))
            self.membership.counts_changed()
        if plan.acquire and len(self.supervisors) < self._share:
            # Still short with orphans about (dealt to others by rows that may lag, or lost
            # to a racing peer): look again soon, so the gap is filled before they wait two
            # intervals and a member already at its share takes them (and sheds them later).
            self._fast_until = max(self._fast_until,
                                   self.clock.monotonic() + self.settings.reconcile_s)
        self.metrics.set_leases_held(len(self.supervisors))

    # -- a dead member's streams ---------------------------------------------------------

    def _deal_dead(self) -> None:
        """For each member row newly seen fenced (DEAD, its streams not yet released), take
        this worker's part of the deal (``streamlease.core.deal``) straight over."""
        view = self.membership.view
        for row in view.members:
            if row.status is not MemberStatus.DEAD or row.released:
                continue
            key = (row.worker_id, row.epoch)
            if key in self._dealt or self._tg is None:
                continue
            self._dealt[key] = None
            if len(self._dealt) > DEALT_LIMIT:
                self._dealt.popitem(last=False)
            self._tg.create_task(self._guarded_take(row), name=f"take over {row.worker_id}")

    async def _guarded_take(self, dead: MemberRecord) -> None:
        try:
            await self._take_dead_part(dead)
            # The owner index lags: a stream the dead member took just before it died may
            # be listed only a moment later.
            await self._pause(self.settings.second_pass_s)
            if not self._stop.is_set():
                await self._take_dead_part(dead)
        except StoreError as exc:
            event(logging.WARNING, "takeover.failed", "taking a dead member's streams over "
                  "failed; its fencer releases what is left", member=dead.worker_id,
                  error=str(exc))
        except Exception:
            self.metrics.task_crashed("takeover")
            event(logging.ERROR, "takeover.crashed", "taking a dead member's streams over "
                  "crashed; its fencer releases what is left", member=dead.worker_id,
                  exc_info=True)

    def _deal_for(self, dead: MemberRecord, stream_ids: list[str]) -> list[str]:
        """This worker's part of the deal of ``stream_ids``, as every survivor computes it
        from the member rows (its own row's count replaced by its live one, as all do
        with their own: the rows lag by a heartbeat at most)."""
        view = self.membership.view
        survivors = [m for m in view.active() if m.worker_id != dead.worker_id]
        counts = {m.worker_id: m.streams for m in survivors}
        capacities = {m.worker_id: m.capacity for m in survivors}
        weights = deal_weights(counts, capacities, len(stream_ids))
        dealt = deal(stream_ids, weights)
        return [sid for sid in stream_ids if dealt.get(sid) == self.settings.owner]

    async def _take_dead_part(self, dead: MemberRecord) -> int:
        owned = await self.leases.owned_by(dead.worker_id,
                                           timeout=2 * self.settings.stopped_check_s)
        stream_ids = sorted({o.stream_id for o in owned})
        mine = [sid for sid in self._deal_for(dead, stream_ids)
                if sid not in self.supervisors and sid not in self._acquiring]
        room = self.settings.max_streams - len(self.supervisors)
        mine = mine[:max(0, room)]
        if not mine or not self.membership.accepting:
            return 0
        survivors = max(1, len([m for m in self.membership.view.active()
                                if m.worker_id != dead.worker_id]))
        spacing = survivors * 2 / TAKEOVER_INDEX_WRITES_S  # this worker's part of the budget
        gate = asyncio.Semaphore(TAKEOVER_CONCURRENCY)
        taken: list[bool] = []

        async def one(stream_id: str) -> None:
            async with gate:
                taken.append(await self._take_one(stream_id, dead))

        async with asyncio.TaskGroup() as tg:
            for stream_id in mine:
                if self._stop.is_set():
                    break
                tg.create_task(one(stream_id))
                await self.clock.sleep(spacing)
        count = sum(taken)
        if count:
            self.membership.counts_changed()
            event(logging.INFO, "takeover.done", "took a dead member's streams straight over",
                  member=dead.worker_id, epoch=dead.epoch, dealt=len(mine), taken=count)
        self.metrics.set_leases_held(len(self.supervisors))
        return count

    async def _take_one(self, stream_id: str, dead: MemberRecord) -> bool:
        if self._stop.is_set() or not self.membership.accepting or \
                len(self.supervisors) >= self.settings.max_streams:
            return False
        self._acquiring.add(stream_id)
        try:
            sent = self.clock.monotonic()
            try:
                got = await self.leases.take_over(
                    stream_id, dead.worker_id, dead.epoch, self.settings.owner,
                    self.clock.wall_ms(), self.settings.supervisor.timings,
                    timeout=2 * self.settings.stopped_check_s, epoch=self.membership.epoch)
                if got is not None:
                    got = await self._resume_where_the_sink_is(got)
            except StoreError as exc:
                self._unsure.add(stream_id)  # it may have applied: read back next cycle
                event(logging.WARNING, "lease.acquire_failed",
                      "take-over failed; its outcome is checked at the next cycle",
                      error=str(exc), stream=stream_id)
                return False
            if got is None:
                return False  # released, taken by another survivor, or never held by it
            await self._start(got, sent, None, dead.worker_id, how="takeover")
            served = stream_id in self.supervisors
            if served:
                self.metrics.dead_streams_taken(1)
            return served
        except BaseException:
            self._unsure.add(stream_id)  # cancelled mid-call: it may have applied
            raise
        finally:
            self._acquiring.discard(stream_id)

    def _waited(self, orphans: list[StreamRecord], now: float) -> _Waited:
        """Note when this worker first saw each orphan; the orphans by how long they
        have waited since, in reconcile intervals."""
        current = {o.stream_id for o in orphans}
        for gone in set(self._orphan_since) - current:
            del self._orphan_since[gone]
        for stream_id in current:
            self._orphan_since.setdefault(stream_id, now)
        reconcile_s = self.settings.reconcile_s

        def at_least(limit: float) -> frozenset[str]:
            return frozenset(sid for sid, since in self._orphan_since.items()
                             if now - since >= limit)
        return _Waited(lingering=at_least(reconcile_s / 2), starving=at_least(2 * reconcile_s),
                       abandoned=at_least(3 * reconcile_s))

    def _balance(self, servable: int, waited: _Waited, now: float) -> int:
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
        view = self.membership.view
        if not view.members:
            self._share = self.settings.max_streams  # no fleet view yet: take as before
            return self.settings.acquire_per_cycle
        # Streams being handed over are no longer this worker's to count.
        keeping = sum(1 for s in self.supervisors.values()
                      if s.holding.reason is not StopReason.REBALANCE)
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
        self.metrics.share(plan.share)
        self._share = plan.share
        if plan.shed:
            self._shed(plan.shed, now)
        gap = max(0, plan.share - keeping)
        room = max(0, plan.share + balance.TOLERANCE - keeping)
        want = max(plan.take, min(gap, len(waited.lingering)), min(room, len(waited.starving)))
        # What waited three intervals only when nothing else would be taken: a member with
        # a gap of its own fills that, not a heap past its share during a slow start-up.
        return want or len(waited.abandoned)

    def _shed(self, count: int, now: float) -> None:
        """Hand ``count`` streams over through the graceful path (stop reading, flush,
        checkpoint, release), the longest held first, never one held less than the
        minimum hold time; then pause shedding until the takers' counts can be seen."""
        if now < self._next_shed or any(s.holding.reason is StopReason.REBALANCE
                                        for s in self.supervisors.values()):
            return  # the last hand-over is still in flight, or its takers not yet seen
        movable = [s for s in self.supervisors.values()
                   if s.holding.state is HolderState.HOLDING
                   and now - s.acquired_at >= self.settings.min_hold_s]
        movable.sort(key=lambda s: s.acquired_at)
        chosen = movable[:count]
        for supervisor in chosen:
            supervisor.request_drain(StopReason.REBALANCE)
        if chosen:
            self.metrics.rebalance_moved(len(chosen))
            event(logging.INFO, "balance.shed", "handing streams over to even out the fleet",
                  streams=[s.stream for s in chosen], held=len(self.supervisors))
            # The takers' new counts reach the member rows within a heartbeat.
            self._next_shed = now + 1.5 * self.settings.stopped_check_s

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
        it renews its own lease only every few minutes."""
        while not self._stop.is_set():
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
            await self._pause(jittered(self.settings.stopped_check_s, 0.1, self.rng))

    async def sweep_duty(self, lease: object, stop: asyncio.Event) -> None:
        """A leader duty: the sweep and the fleet view, once at once (a new leader picks
        up hand-written items immediately), then every ``sweep_s`` (+/-20 %)."""
        while not stop.is_set() and not self._stop.is_set():
            try:
                await self._sweep()
            except StoreError as exc:
                event(logging.WARNING, "sweep.failed", "sweep failed", error=str(exc))
            await self._pause(jittered(self.settings.sweep_s, 0.2, self.rng), stop,
                              clear=False)

    async def _sweep(self) -> None:
        """One paginated Scan of the streams table: adopt hand-written items, report
        items that cannot be served, and publish the fleet view metric. (A filtered Scan
        costs the same read capacity as a full one, so the view comes for free.)"""
        records = await self.leases.scan()
        self.metrics.fleet_view(fleet_view(records, self.clock.wall_ms()))
        for record in records:
            # Every problem the full item shows (the index does not hold every attribute,
            # and items with an unknown state are not in it at all), written once.
            problem = item_problem(record, self.settings.supervisor.allowed_urls,
                                   self.settings.supervisor.catalog)
            if problem is not None and record.last_error != error_text(problem) and \
                    record.stream_id not in self.supervisors:
                await self._report_unservable(record, problem)
        for record in filter(invisible_to_index, records):
            if record.desired_state not in VALID_STATES:
                continue
            if record.lease_expires_at_ms is None and await self.leases.adopt(record.stream_id):
                event(logging.INFO, "stream.adopted",
                      "hand-written item given lease fields; it is now visible to the fleet",
                      stream=record.stream_id)

    async def _report_unservable(self, record: StreamRecord, problem: str) -> None:
        key = (record.stream_id, problem)
        if key in self._reported:
            self._reported.move_to_end(key)
        else:
            self._reported[key] = None
            if len(self._reported) > REPORTED_LIMIT:
                self._reported.popitem(last=False)
            self.metrics.bad_item(bad_item_reason(problem))
            event(logging.WARNING, "stream.unservable", "stream cannot be served; not dialled",
                  stream=record.stream_id, problem=problem)
        try:
            await self.leases.record_error(record.stream_id, problem, self.clock.wall_ms())
        except StoreError as exc:
            event(logging.WARNING, "stream.record_error_failed", "could not record last_error",
                  stream=record.stream_id, error=str(exc))

    async def _acquire(self, candidate: StreamRecord) -> None:
        stream_id = candidate.stream_id
        self._acquiring.add(stream_id)
        try:
            await self._try_acquire(candidate)
        except BaseException:
            self._unsure.add(stream_id)  # cancelled mid-call: it may have applied
            raise
        finally:
            self._acquiring.discard(stream_id)

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
                got = await self._resume_where_the_sink_is(got)
        except StoreError as exc:
            # The write may have applied with its answer lost: read the item back later
            # and release it if so, or it would sit leased to this worker, unserved, for
            # a whole stream lease.
            self._unsure.add(candidate.stream_id)
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
        await self._start(got, sent, delay, candidate.lease_owner)

    async def _start(self, got: Acquired, sent: float, delay: float | None,
                     previous_owner: str | None, how: str = "orphan") -> None:
        """Serve a lease just taken (acquired as an orphan, or taken over from a dead
        member): start its output and its supervisor, or hand it straight back if this
        worker can no longer serve it."""
        if self._stop.is_set() or len(self.supervisors) >= self.settings.max_streams \
                or not self.membership.accepting:
            # Stopped, full, or no longer a member in good standing while the call was in
            # flight: nothing may serve it here, so hand it straight back.
            try:
                released = await self.leases.release(got.tenure)
            except StoreError as exc:
                released = False
                event(logging.WARNING, "lease.release_failed",
                      "release after a late acquire failed; checked again at the next cycle",
                      stream=got.tenure.stream_id, fence=got.tenure.fence, error=str(exc))
            if not released:
                self._unsure.add(got.tenure.stream_id)
            return
        self._audited.pop(got.tenure.stream_id, None)
        problem = item_problem(got.record, self.settings.supervisor.allowed_urls,
                               self.settings.supervisor.catalog)
        if problem is not None:
            # The orphan index does not project every attribute a problem can lie in (a
            # profile, the attributes its templates use): without a pause the item would be
            # taken and handed back every cycle. Its supervisor records it and releases.
            self._unservable_until[got.tenure.stream_id] = \
                self.clock.monotonic() + self.settings.unservable_retry_s
        else:
            # (An item that cannot be served gets no processor: its supervisor only
            # records the problem and releases.)
            opened = await self._open_output(got)
            if opened is None:
                return
            got = opened
        self.metrics.lease_acquired(delay)
        event(logging.INFO, "lease.acquired", "lease acquired", stream=got.tenure.stream_id,
              fence=got.tenure.fence, last_seq=got.tenure.last_seq,
              previous_owner=previous_owner, unowned_s=delay, how=how)
        supervisor = Supervisor(got.tenure, got.record, sent, self.leases, self.sink,
                                self.clock, self.metrics, self.settings.supervisor, self.rng,
                                self._on_delivered, self.health, self.lease_health,
                                self._pump_factory, self.membership.may_write)
        self.supervisors[got.tenure.stream_id] = supervisor
        self.metrics.set_leases_held(len(self.supervisors))
        assert self._tg is not None
        self._tg.create_task(self._supervise(supervisor), name=f"supervise {supervisor.stream}")

    async def _settle_unsure(self) -> None:
        """Read back each stream whose acquire (or release) outcome was unknown; if this
        worker holds it with no supervisor, release it now (owner and fence as read)."""
        for stream_id in sorted(self._unsure):
            if stream_id in self._acquiring:
                continue  # being acquired again right now: settled by that attempt
            if stream_id in self.supervisors:
                self._unsure.discard(stream_id)  # acquired again since, and served
                continue
            try:
                record = await self.leases.check(stream_id, timeout=self.settings.stopped_check_s)
                if record is not None and record.lease_owner == self.settings.owner \
                        and record.lease_expires_at_ms and record.fence is not None:
                    tenure = Tenure(stream_id, self.settings.owner, record.fence,
                                    record.last_seq, record.lease_expires_at_ms or 0)
                    if await self.leases.release(tenure):
                        self.metrics.lease_released(StopReason.ERROR)
                        event(logging.WARNING, "lease.unserved_released",
                              "an acquire whose answer was lost had applied; released the "
                              "lease this worker was not serving", stream=stream_id,
                              fence=record.fence)
            except StoreError as exc:
                event(logging.WARNING, "lease.settle_failed",
                      "cannot read back a stream whose acquire outcome is unknown; "
                      "trying again at the next cycle", stream=stream_id, error=str(exc))
                continue
            self._unsure.discard(stream_id)

    async def _open_output(self, got: Acquired) -> Acquired | None:
        """Start the tenure's output (its processor's ``start``); resume after what the
        output already holds when it keeps its own checkpoint. If it cannot start, the
        stream is released with ``last_error`` and None is returned."""
        tenure = got.tenure
        try:
            async with asyncio.timeout(self.settings.supervisor.drain_timeout_s):
                beyond = await self.sink.open(tenure, got.record)
            if beyond > (tenure.last_seq or 0):
                event(logging.INFO, "stream.resume_after_output",
                      "the output holds more than the item's checkpoint; resuming after it",
                      stream=tenure.stream_id, fence=tenure.fence,
                      item_last_seq=tenure.last_seq, output_last_seq=beyond)
                moved = await self.leases.advance(tenure, tenure.fence, beyond)
                if moved is None:
                    await self._close_output(tenure, "lost")
                    return None
                return Acquired(moved, got.record)
            return got
        except asyncio.CancelledError:
            await self._close_output(tenure, "error")
            raise
        except Exception as exc:
            problem = f"output failed to start: {type(exc).__name__}: {exc}"[:500]
            event(logging.ERROR, "stream.output_start_failed", "the stream's output could not "
                  "start; releasing it", stream=tenure.stream_id, fence=tenure.fence,
                  error=problem)
            await self._close_output(tenure, "error")
            with contextlib.suppress(StoreError):
                await self.leases.record_error(tenure.stream_id, problem, self.clock.wall_ms())
            try:
                if await self.leases.release(tenure):
                    self.metrics.lease_released(StopReason.ERROR)
            except StoreError:
                self._unsure.add(tenure.stream_id)
            return None

    async def _close_output(self, tenure: Tenure, reason: str) -> None:
        """Stop a tenure's output that will not be supervised: bounded, and shielded (a
        cancellation in progress does not stop the close; it still propagates)."""
        try:
            await shielded(self.sink.close(tenure, reason),
                           self.settings.supervisor.drain_timeout_s, f"close {tenure.stream_id}")
        except Exception:
            event(logging.ERROR, "processor.stop_failed", "closing an output failed",
                  stream=tenure.stream_id, fence=tenure.fence, reason=reason)

    async def _resume_where_the_sink_is(self, got: Acquired) -> Acquired | None:
        """If the item's checkpoint or fence was rewound (rewritten by hand, restored from
        a backup), move this tenure to where the sink already is before pumping."""
        newest = await self.sink.newest_event(got.tenure.stream_id)
        point = resume_point(got.tenure, newest)
        if point is None:
            return got
        fence, last_seq = point
        event(logging.WARNING, "stream.checkpoint_rewound",
              "the item's checkpoint or fence is behind the sink; resuming after the sink",
              stream=got.tenure.stream_id, fence=got.tenure.fence,
              item_last_seq=got.tenure.last_seq, sink_last_seq=newest.last_seq if newest else None,
              sink_fence=newest.fence if newest else None, new_fence=fence, new_last_seq=last_seq)
        self.metrics.checkpoint_rewound()
        tenure = await self.leases.advance(got.tenure, fence, last_seq)
        return None if tenure is None else Acquired(tenure, got.record)

    async def _supervise(self, supervisor: Supervisor) -> None:
        try:
            await supervisor.run()
            # Shutting down: any stream that ended neither released nor lost to another
            # holder (a hand-over or self-fence whose release failed, a crash) may still
            # name this worker: keep the member row so peers release it on its behalf.
            if self._stop.is_set() and supervisor.holding.state not in (
                    HolderState.RELEASED, HolderState.LOST):
                self.unreleased += 1
        finally:
            if self.supervisors.get(supervisor.stream) is supervisor:
                del self.supervisors[supervisor.stream]
                self.health.dropped(supervisor.stream)
            self.metrics.set_leases_held(len(self.supervisors))
            if supervisor.holding.state is HolderState.RELEASED:
                self.membership.handed_off()  # peers take it now, not at their next cycle
            else:
                self.membership.counts_changed()
