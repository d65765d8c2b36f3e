"""The streams this worker holds: one supervisor each, and the leases still being settled.

Every way a lease reaches this worker — an orphan acquired by the intake, a dead member's
stream taken straight over, a stream a live peer handed over — ends in ``Holdings.start``:
the output starts (resuming after what it already holds), then the supervisor, in the
reconciler's scope. What is not
served is not kept: a lease taken while this worker stopped, filled up or lost its
membership in good standing is handed straight back, and one whose outcome is unknown (an
answer lost, a call cancelled) is read back and released (``settle_unsure``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from streamlease import tracing
from streamlease.ahead import Ahead
from streamlease.context import Context
from streamlease.core import handover
from streamlease.core.bulletin import Bulletin
from streamlease.core.lease import HolderState, StopReason, checkpoint_trusted, resume_point
from streamlease.core.membership import MemberRecord
from streamlease.core.model import Tenure
from streamlease.core.plan import item_problem
from streamlease.errors import StoreError
from streamlease.logs import event
from streamlease.membership import FleetView
from streamlease.release import shielded
from streamlease.store import codec
from streamlease.store.protocols import Acquired
from streamlease.strain import LeaseHealth
from streamlease.supervisor import Supervisor
from streamlease.tenancy import Hooks, SupervisorSettings, Ties

AUDITED_LIMIT = 100_000  # (stream, fence) pairs the self-audit knows are not leased here


class MemberGate(Protocol):
    """What the holdings and the reconciler need of this worker's membership."""

    @property
    def epoch(self) -> int: ...

    @property
    def accepting(self) -> bool: ...

    @property
    def view(self) -> FleetView: ...

    @property
    def bulletin(self) -> Bulletin | None: ...

    @property
    def reading_all(self) -> bool: ...

    def peers(self) -> tuple[MemberRecord, ...]: ...

    def draining_seen(self) -> bool: ...

    def feed_live(self) -> bool: ...

    def deals(self) -> list[tuple[MemberRecord, dict[str, int] | None]]: ...

    def survivors(self, dead: str) -> int: ...

    def may_write(self, now: float) -> bool: ...

    def counts_changed(self) -> None: ...

    def handed_off(self) -> None: ...

    async def offer_to(self, member: MemberRecord, offer: str) -> bool: ...

    async def offers_done(self, offers: Sequence[str]) -> None: ...


@dataclass(frozen=True)
class HoldingSettings:
    max_streams: int
    supervisor: SupervisorSettings
    call_s: float  # a read back of an unsure lease times out after this (a heartbeat)
    # An item found unservable only once acquired (a profile problem: the orphan index does
    # not hold those attributes) is not taken again for this long.
    unservable_retry_s: float


class Holdings:
    """``stopping`` is set when the worker stops: nothing new is served; ``hooks`` reach
    every supervisor (and its pump)."""

    def __init__(self, ctx: Context, settings: HoldingSettings, membership: MemberGate,
                 stopping: asyncio.Event, lease_health: LeaseHealth,
                 hooks: Hooks | None = None) -> None:
        self.ctx = ctx
        self.settings = settings
        self.membership = membership
        self.stopping = stopping
        # The reconciler reads every held item in batches (and the change feed tells of
        # changes): supervisors make no periodic reads of their own.
        self.batched_checks = False
        self.supervisors: dict[str, Supervisor] = {}
        # Shared by every supervisor: the release gate keeps a drain of hundreds of streams
        # from putting the member heartbeat at the end of a long queue. The membership is
        # asked at each call.
        self.ties = Ties(lease_health=lease_health,
                         member_alive=lambda now: membership.may_write(now),
                         watched=lambda: self.batched_checks,
                         told=lambda: membership.feed_live(), hooks=hooks or Hooks(),
                         offer=membership.offer_to, next_taker=self._next_taker)
        # This worker's fair share as its balance last computed it (None: not yet): how
        # far below it each peer is decides whom a drain hands streams to.
        self.share_level: int | None = None
        self.tg: asyncio.TaskGroup | None = None  # the scope supervisors run in
        # Streams being acquired or taken over right now (not yet supervised).
        self.acquiring: set[str] = set()
        self._starting: set[str] = set()  # taken, its supervisor not registered yet
        self._told: set[str] = set()  # ... and a change to its item was told meanwhile
        # Streams this worker may hold without a supervisor: an acquire (or the release
        # of a late one) whose outcome is unknown. Settled by reading the item back.
        self.unsure: set[str] = set()
        # Per stream, the fence at which the owner index listed it under this worker and a
        # consistent read showed it not leased here: a fence moves on with every
        # acquisition, so the same entry needs no second read. Forgotten when this worker
        # acquires the stream (its fence may then be moved anywhere by ``advance``).
        self.audited: OrderedDict[str, int] = OrderedDict()
        self.unservable_until: dict[str, float] = {}  # stream -> monotonic: not before
        self.unreleased = 0  # shutdown drains whose release did not go through
        # Peer -> (its row's heartbeat, streams offered to it as a further taker since).
        self._sent_next: dict[str, tuple[int, int]] = {}

    def _can_serve(self) -> bool:
        return not self.stopping.is_set() and \
            len(self.supervisors) < self.settings.max_streams and self.membership.accepting

    async def _hand_back(self, got: Acquired) -> None:
        """Stopped, full, or no longer a member in good standing while the call was in
        flight: nothing may serve it here, so hand it straight back (read back later if
        the release's outcome is unknown)."""
        try:
            released = await self.ctx.leases.release(got.tenure)
        except StoreError as exc:
            released = False
            event(logging.WARNING, "lease.release_failed",
                  "release after a late acquire failed; checked again at the next cycle",
                  stream=got.tenure.stream_id, fence=got.tenure.fence, error=str(exc))
        if not released:
            self.unsure.add(got.tenure.stream_id)

    def drain_all(self, reason: StopReason, release_by: float | None) -> None:
        """Drain every stream; a shutdown hands each to a peer with room, if any."""
        held = list(self.supervisors.values())
        chosen = self.takers([s.stream for s in held]) if reason is StopReason.SHUTDOWN \
            else {}
        for supervisor in held:
            supervisor.request_drain(reason, release_by, chosen.get(supervisor.stream))

    def takers(self, streams: list[str], rebalance: bool = False) -> dict[str, MemberRecord]:
        """Whom to hand each of ``streams`` to (``core.handover.takers``), where this
        worker's output allows a live hand-over; the rest are released."""
        if not self.settings.supervisor.handover_wait_s or not streams:
            return {}
        view, peers = self.membership.view, self.membership.peers()
        members = {m.worker_id: m for m in peers}
        chosen = handover.takers(streams, peers, self.ctx.owner, self.share_level,
                                 view.observed_dead, rebalance)
        return {sid: members[wid] for sid, wid in chosen.items()}

    def _next_taker(self, stream_id: str, tried: frozenset[str],
                    rebalance: bool) -> MemberRecord | None:
        """A further peer for a stream its first taker could not take
        (``core.handover.further_taker``)."""
        if not self.settings.supervisor.handover_wait_s:
            return None
        view, peers = self.membership.view, self.membership.peers()
        chosen, self._sent_next = handover.further_taker(
            stream_id, peers, self.ctx.owner, self.share_level,
            view.observed_dead | tried, self._sent_next, rebalance)
        return next((m for m in peers if m.worker_id == chosen), None)

    def notify(self, stream_id: str) -> None:
        """The leader's change feed says a held stream's item changed: its supervisor
        reads it now (one being acquired or started, as soon as it runs)."""
        held = self.supervisors.get(stream_id)
        if held is not None:
            held.notified()
        elif stream_id in self.acquiring or stream_id in self._starting:
            if len(self._told) > 10_000:  # acquisitions lost to a peer leave theirs behind
                self._told.clear()
            self._told.add(stream_id)

    async def start(self, got: Acquired, sent: float, delay: float | None,
                    previous_owner: str | None, how: str = "orphan",
                    ahead: Ahead | None = None) -> None:
        """Serve a lease just taken (acquired as an orphan, taken over from a dead
        member, or handed over with its first connection opened ``ahead``): start its
        output and its supervisor, or hand it straight back if this worker can no longer
        serve it."""
        stream_id = got.tenure.stream_id
        self._starting.add(stream_id)
        try:
            await self._start(got, sent, delay, previous_owner, how, ahead)
        finally:
            self._starting.discard(stream_id)
            held = self.supervisors.get(stream_id)
            if ahead is not None and (held is None or held.tenure != got.tenure):
                await ahead.close()  # not served: the connection goes unused
            told = stream_id in self._told
            self._told.discard(stream_id)
            if told and stream_id in self.supervisors:
                self.supervisors[stream_id].notified()

    async def start_handed(self, got: Acquired, sent: float, previous_owner: str,
                           ahead: Ahead) -> bool:
        """Serve a stream a live peer handed over, from the connection opened ``ahead``
        (``streamlease.handover``); whether it is served here. Its checkpoint is exact:
        the holder's writes were fenced, so there is no resume read."""
        await self.start(got, sent, 0.0, previous_owner, how=tracing.HOW_HANDED, ahead=ahead)
        held = self.supervisors.get(got.tenure.stream_id)
        return held is not None and held.tenure == got.tenure

    async def _start(self, got: Acquired, sent: float, delay: float | None,
                     previous_owner: str | None, how: str, ahead: Ahead | None) -> None:
        tracing.note_acquired(got, how, self.ctx.metrics.trace_context_invalid)
        if not self._can_serve():
            await self._hand_back(got)
            return
        self.audited.pop(got.tenure.stream_id, None)
        problem = item_problem(got.record, self.settings.supervisor.allowed_urls,
                               self.settings.supervisor.catalog)
        if problem is not None:
            # The orphan index does not project every attribute a problem can lie in (a
            # profile, the attributes its templates use): without a pause the item would be
            # taken and handed back every cycle. Its supervisor records it and releases.
            self.unservable_until[got.tenure.stream_id] = \
                self.ctx.clock.monotonic() + self.settings.unservable_retry_s
        else:
            # (An item that cannot be served gets no processor: its supervisor only
            # records the problem and releases.)
            opened = await self._open_output(got)
            if opened is None:
                return
            got = opened
            if not self._can_serve():
                # The worker began to stop (or lapsed, or filled up) while the output
                # started: a supervisor started now would never be asked to drain.
                await self._close_output(got.tenure, "shutdown")
                await self._hand_back(got)
                return
        self.ctx.metrics.lease_acquired(delay)
        event(logging.INFO, "lease.acquired", "lease acquired", stream=got.tenure.stream_id,
              fence=got.tenure.fence, last_seq=got.tenure.last_seq,
              previous_owner=previous_owner, unowned_s=delay, how=how)
        supervisor = Supervisor(self.ctx, self.settings.supervisor, got, sent, self.ties,
                                ahead)
        self.supervisors[got.tenure.stream_id] = supervisor
        self.ctx.metrics.set_leases_held(len(self.supervisors))
        assert self.tg is not None
        self.tg.create_task(self._supervise(supervisor), name=f"supervise {supervisor.stream}")

    async def _open_output(self, got: Acquired) -> Acquired | None:
        """Start the tenure's output (its processor's ``start``); resume after what the
        output already holds when it keeps its own checkpoint. If it cannot start, the
        stream is released with ``last_error`` and None is returned."""
        tenure = got.tenure
        try:
            async with asyncio.timeout(self.settings.supervisor.drain_timeout_s):
                beyond = await self.ctx.sink.open(tenure, got.record)
            if beyond > (tenure.last_seq or 0):
                event(logging.INFO, "stream.resume_after_output",
                      "the output holds more than the item's checkpoint; resuming after it",
                      stream=tenure.stream_id, fence=tenure.fence,
                      item_last_seq=tenure.last_seq, output_last_seq=beyond)
                moved = await self.ctx.leases.advance(tenure, tenure.fence, beyond)
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
                await self.ctx.leases.record_error(tenure.stream_id, problem,
                                                   self.ctx.clock.wall_ms())
            try:
                if await self.ctx.leases.release(tenure):
                    self.ctx.metrics.lease_released(StopReason.ERROR)
            except StoreError:
                self.unsure.add(tenure.stream_id)
            return None

    async def _close_output(self, tenure: Tenure, reason: str) -> None:
        """Stop a tenure's output that will not be supervised: bounded, and shielded (a
        cancellation in progress does not stop the close; it still propagates)."""
        try:
            await shielded(self.ctx.sink.close(tenure, reason),
                           self.settings.supervisor.drain_timeout_s, f"close {tenure.stream_id}")
        except Exception:
            event(logging.ERROR, "processor.stop_failed", "closing an output failed",
                  stream=tenure.stream_id, fence=tenure.fence, reason=reason)

    async def resume_where_the_sink_is(self, got: Acquired) -> Acquired | None:
        """If the item's checkpoint or fence was rewound (rewritten by hand, restored from
        a backup), move this tenure to where the sink already is before pumping. After a
        clean release the item's checkpoint is trusted as it is: no read."""
        if checkpoint_trusted(got.tenure, codec.clean_release(got.record),
                              self.ctx.clock.wall_ms()):
            return got
        with tracing.span("resume_read", stream=got.tenure.stream_id, fence=got.tenure.fence):
            newest = await self.ctx.sink.newest_event(got.tenure.stream_id)
            tracing.set_attributes(sink_last_seq=newest.last_seq if newest else None)
        point = resume_point(got.tenure, newest)
        if point is None:
            return got
        fence, last_seq = point
        event(logging.WARNING, "stream.checkpoint_rewound",
              "the item's checkpoint or fence is behind the sink; resuming after the sink",
              stream=got.tenure.stream_id, fence=got.tenure.fence,
              item_last_seq=got.tenure.last_seq, sink_last_seq=newest.last_seq if newest else None,
              sink_fence=newest.fence if newest else None, new_fence=fence, new_last_seq=last_seq)
        self.ctx.metrics.checkpoint_rewound()
        tenure = await self.ctx.leases.advance(got.tenure, fence, last_seq)
        return None if tenure is None else Acquired(tenure, got.record)

    async def _supervise(self, supervisor: Supervisor) -> None:
        try:
            await supervisor.run()
            # Shutting down: any stream that ended neither released nor lost to another
            # holder (a hand-over or self-fence whose release failed, a crash) may still
            # name this worker: keep the member row so peers release it on its behalf.
            if self.stopping.is_set() and supervisor.holding.state not in (
                    HolderState.RELEASED, HolderState.LOST):
                self.unreleased += 1
        finally:
            if self.supervisors.get(supervisor.stream) is supervisor:
                del self.supervisors[supervisor.stream]
                self.ctx.health.dropped(supervisor.stream)
            self.ctx.metrics.set_leases_held(len(self.supervisors))
            if supervisor.holding.state is HolderState.RELEASED:
                self.membership.handed_off()  # peers take it now, not at their next cycle
            else:
                self.membership.counts_changed()

    async def settle_unsure(self) -> None:
        """Read back each stream whose acquire (or release) outcome was unknown; if this
        worker holds it with no supervisor, release it now (owner and fence as read)."""
        for stream_id in sorted(self.unsure):
            if stream_id in self.acquiring:
                continue  # being acquired again right now: settled by that attempt
            if stream_id in self.supervisors:
                self.unsure.discard(stream_id)  # acquired again since, and served
                continue
            try:
                record = await self.ctx.leases.check(stream_id, timeout=self.settings.call_s)
                if record is not None and record.lease_owner == self.ctx.owner \
                        and record.lease_expires_at_ms and record.fence is not None:
                    tenure = Tenure(stream_id, self.ctx.owner, record.fence,
                                    record.last_seq, record.lease_expires_at_ms or 0)
                    if await self.ctx.leases.release(tenure):
                        self.ctx.metrics.lease_released(StopReason.ERROR)
                        event(logging.WARNING, "lease.unserved_released",
                              "an acquire whose answer was lost had applied; released the "
                              "lease this worker was not serving", stream=stream_id,
                              fence=record.fence)
            except StoreError as exc:
                event(logging.WARNING, "lease.settle_failed",
                      "cannot read back a stream whose acquire outcome is unknown; "
                      "trying again at the next cycle", stream=stream_id, error=str(exc))
                continue
            self.unsure.discard(stream_id)

    def remember_audited(self, stream_id: str, fence: int) -> None:
        self.audited[stream_id] = fence
        self.audited.move_to_end(stream_id)
        if len(self.audited) > AUDITED_LIMIT:
            self.audited.popitem(last=False)

    def member_lost(self, fenced: bool) -> None:
        """This worker's membership ended or lapsed: every stream stops at once."""
        for supervisor in list(self.supervisors.values()):
            supervisor.member_lost(fenced)
