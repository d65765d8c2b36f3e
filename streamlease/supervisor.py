"""One held stream: the holder state machine, the heartbeat loop and the pump.

The supervisor runs the tenure's scope: the pump and the heartbeat
(``streamlease.heartbeat``, which feeds renew and read results to ``Holding`` and applies
its decisions) in one TaskGroup, then the end (``streamlease.release``):

* lost (condition failed) or past the local deadline -> abort the pump at once; no
  flush, no further write under this tenure;
* shutdown or rebalancing with a taker named -> offer the stream to the taker and go on
  delivering until it takes the lease (make before break, ``streamlease.handover``);
  then stop at once, no flush. An offer not taken in time falls through to:
* ``STOPPED``, shutdown, rebalancing, an item that can no longer be served -> stop
  reading, flush, then release. Heartbeats go on while the pump flushes, so a long final
  flush never outlives the lease; the release is retried with backoff until its budget
  runs out (the shutdown deadline, or the tenure's own deadline, after which the lease
  frees itself);
* a changed ``ws_url`` -> reconnect.

A supervisor never lets an exception escape: one stream's failure never takes down
another stream or the worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

from streamlease.ahead import Ahead
from streamlease.context import Context
from streamlease.core.lease import HolderState, Holding, StopReason
from streamlease.core.membership import MemberRecord
from streamlease.core.model import StreamRecord, error_text
from streamlease.core.plan import bad_item_reason, item_problem
from streamlease.errors import SelfFenced, SinkConflict, StaleFence, StoreError
from streamlease.handover import Handing
from streamlease.heartbeat import Heartbeat
from streamlease.logs import event
from streamlease.pump import Pump
from streamlease.release import Release
from streamlease.store.protocols import Acquired
from streamlease.tenancy import (
    RELEASES_IN_FLIGHT,
    PumpFactory,
    PumpLike,
    SupervisorSettings,
    Tenancy,
    Ties,
)

__all__ = ["RELEASES_IN_FLIGHT", "PumpFactory", "Supervisor", "SupervisorSettings"]


class Supervisor:
    """``got`` is the lease just taken (its tenure, and the item as taken), sent at
    ``acquire_sent_at`` (monotonic); ``ties`` are the worker's, shared by its supervisors;
    ``ahead``: its first connection, opened before the lease was taken (a hand-over)."""

    def __init__(self, ctx: Context, settings: SupervisorSettings, got: Acquired,
                 acquire_sent_at: float, ties: Ties | None = None,
                 ahead: Ahead | None = None) -> None:
        self.ctx = ctx
        self.settings = settings
        self.ties = ties = ties or Ties()
        self.tenure = tenure = got.tenure
        self.holding = Holding(tenure, got.record.ws_url or "", acquire_sent_at,
                               settings.timings, ties.member_alive, ctx.rng)
        self.tenancy = Tenancy(self.holding, got.record)
        wire = settings.upstreams.wire(tenure.stream_id, got.record.attributes)
        self.pump: PumpLike = (ties.hooks.pump_factory or Pump)(
            ctx, self.holding, settings.pump, wire=wire, on_problem=self._on_problem,
            on_delivered=ties.hooks.on_delivered, **({"ahead": ahead} if ahead else {}))
        # Handed live only where the item's last_seq is exactly what was delivered (the
        # events table's transactions) and frames carry the upstream's own seq.
        self._handing = Handing(ctx, settings, ties.offer, ties.next_taker) \
            if ties.offer is not None and settings.handover_wait_s and not wire.numbered else None
        self._taker: MemberRecord | None = None  # named by the drain, offered once
        self._offered = False
        self._offering = False  # an offer is out now
        self._refused_while_offered = False
        self._handed_to: str | None = None
        # When a rebalance every peer asked said no to was kept here (monotonic; the
        # balancer pauses shedding after one).
        self.kept_at: float | None = None
        self.heartbeat = Heartbeat(ctx, settings, self.tenancy, ties, self.pump)
        self.ending = Release(ctx, settings, self.tenancy, ties.release_gate)
        self._tg: asyncio.TaskGroup | None = None  # the tenure's scope while it runs
        self._drain_reason: StopReason | None = None
        self._pump_done = False
        self.acquired_at = acquire_sent_at
        ctx.health.renewed(tenure.stream_id, acquire_sent_at)

    @property
    def stream(self) -> str:
        return self.tenure.stream_id

    def _on_problem(self, text: str | None) -> None:
        """The pump reports a stalled stream (frames arrive, none deliverable): written to
        ``last_error`` once per change of problem. Progress (None) leaves the record as
        is: ``last_error_at_ms`` says when it was seen, the stall metric says it ended."""
        record = self.tenancy.record
        if text is None or record.last_error == error_text(text):
            return
        self.tenancy.record = dataclasses.replace(record, last_error=error_text(text))
        if self._tg is not None:
            self._tg.create_task(self._report(text), name=f"report {self.stream}")

    async def _report(self, text: str) -> None:
        """Write a stall to ``last_error``, in the tenure's scope; never fails the tenure."""
        try:
            await self.ending.record_error(text)
        except Exception:
            self.ctx.metrics.task_crashed("supervisor")
            event(logging.ERROR, "stream.report_failed", "could not record a stall",
                  stream=self.stream, fence=self.tenure.fence, exc_info=True)

    def member_lost(self, fenced: bool) -> None:
        """This worker was fenced (or its membership lapsed): stop at once, no flush."""
        self.holding.member_lost(fenced)
        self.tenancy.wake.set()

    def seen(self, record: StreamRecord) -> None:
        """An index read's record of the stream: a hint (``Heartbeat.seen``)."""
        self.heartbeat.seen(record)

    def compare(self, record: StreamRecord | None) -> None:
        """A batched read's record of the item: a hint (``Heartbeat.compare``)."""
        self.heartbeat.compare(record)

    def notified(self) -> None:
        """The leader's change feed says the item changed: read it now."""
        self.heartbeat.notified()

    @property
    def leaving(self) -> StopReason | None:
        """Why the tenure was asked to end (set before its drain begins: a hand-over)."""
        return self._drain_reason or self.holding.reason

    def request_drain(self, reason: StopReason, release_by: float | None = None,
                      taker: MemberRecord | None = None) -> None:
        """Flush and release (shutdown, STOPPED seen elsewhere, rebalancing); the release
        is retried until ``release_by`` (monotonic), or the tenure's deadline. With a
        ``taker`` (and an output that allows it), the stream is first offered to it."""
        # A shutdown overrides a rebalance not yet drained: offers from here on are a
        # shutdown's, and nobody taking the stream ends in a release, not in keeping it.
        superseding = reason is StopReason.SHUTDOWN and \
            self._drain_reason is StopReason.REBALANCE and \
            self.holding.state is HolderState.HOLDING
        if self._drain_reason is None or superseding:
            self._drain_reason = reason
            if taker is not None and self._handing is not None and not self._offering:
                self._taker = taker
        if release_by is not None:
            # A shutdown during a hand-over (or after a self-fence) brings its budget.
            held = self.tenancy.release_by
            self.tenancy.release_by = release_by if held is None else min(held, release_by)
        self.tenancy.wake.set()

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception:
            # The last line of defence: log, count, stop the output, and let the
            # self-audit or the expiry free the lease.
            self.ctx.metrics.task_crashed("supervisor")
            event(logging.ERROR, "supervisor.crashed", "stream supervisor failed; the lease "
                  "is released by the self-audit or expires", stream=self.stream,
                  fence=self.tenure.fence, exc_info=True)
            await self.ending.close_output(StopReason.ERROR)

    async def _run(self) -> None:
        problem = item_problem(self.tenancy.record, self.settings.allowed_urls,
                               self.settings.catalog)
        if problem is not None:
            self.holding.begin_drain(StopReason.BAD_ITEM)
            await self._finish(problem)
            return
        # One scope for the tenure: the pump and the heartbeat each turn their own failure
        # into a state (neither raises), and both are gone before the release.
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            pump_task = tg.create_task(self._run_pump(), name=f"pump {self.stream}")
            heartbeat = tg.create_task(self.heartbeat.run(), name=f"heartbeat {self.stream}")
            try:
                await self._wait_until_stopping()
                # A rebalance nobody could take is kept: the tenure waits for its next end.
                while self._taker is not None and self.holding.state is HolderState.HOLDING:
                    await self._hand_over()
                    await self._wait_until_stopping()
                await self._stop_pump(pump_task)
            finally:
                # Heartbeats ran through the drain; the flush is over (or abandoned) now.
                heartbeat.cancel()
                pump_task.cancel()
                self._tg = None
        await self._finish(self.tenancy.failure)

    async def _wait_until_stopping(self) -> None:
        """Until a drain is asked for, the pump ends, or the heartbeat ends the tenure."""
        wake = self.tenancy.wake
        while True:
            wake.clear()
            if self._drain_reason is not None:
                if self._taker is not None and self.holding.state is HolderState.HOLDING:
                    return  # offered first; drained after, if the offer is not taken
                self.holding.begin_drain(self._drain_reason)
            if self.holding.state is not HolderState.HOLDING:
                return
            if self._pump_done:
                self.tenancy.fail("pump stopped unexpectedly")
                return
            await wake.wait()

    async def _hand_over(self) -> None:
        """Offer the stream to the drain's taker, delivering meanwhile, and wait until it
        takes the lease (then the tenure ends here: no flush, nothing released) or the
        offer is given up (the drain goes on as any other). A rebalance that every peer
        asked said no to is called off: the stream stays here, delivering, and the
        balance may shed again later. A shutdown leaves the drain its own budget after
        the offer."""
        taker, self._taker = self._taker, None
        assert taker is not None and self._handing is not None
        self._offered = self._offering = True
        holding, tenancy = self.holding, self.tenancy

        def until() -> float:
            release_by = tenancy.release_by
            return float("inf") if release_by is None \
                else release_by - self.settings.drain_timeout_s

        def ended() -> bool:
            return holding.state is not HolderState.HOLDING or self._pump_done

        def rebalance() -> bool:
            return self._drain_reason is StopReason.REBALANCE

        try:
            handed = await self._handing.hand(self.tenure, taker, rebalance,
                                              self.tenancy.wake, until, ended)
        finally:
            self._offering = False
        if handed.taker is not None:
            self._handed_to = handed.taker
            holding.on_stale_write()  # the fence moved on: abort the pump, no flush
        elif self._refused_while_offered:
            self._stale_write()  # refused, and not because the taker took it
        elif handed.all_said_no and rebalance() and not ended():
            # Nobody below the share could take it: released, it would be an orphan that
            # only a member at its share finds. Every peer asked said no, so no take can
            # come of those offers.
            self._drain_reason, self._offered = None, False
            self.kept_at = self.ctx.clock.monotonic()
            self.ctx.metrics.handover("kept")
            event(logging.INFO, "handover.kept",
                  "no peer could take the stream; it stays here", stream=self.stream,
                  fence=self.tenure.fence)

    def _stale_write(self) -> None:
        self.ctx.metrics.stale_write_rejected()
        event(logging.WARNING, "sink.stale_fence", "sink refused a batch: fence is stale",
              stream=self.stream, fence=self.tenure.fence)

    async def _run_pump(self) -> None:
        metrics = self.ctx.metrics
        try:
            await self.pump.run()
        except StaleFence:
            self.holding.on_stale_write()
            if self._offered:
                self._refused_while_offered = True  # told once the take is known, or not
            else:
                self._stale_write()
        except SelfFenced:
            self.holding.check_deadline(self.ctx.clock.monotonic())
        except SinkConflict as exc:
            self.tenancy.fail(f"sink conflict: {exc}")
        except StoreError as exc:
            self.tenancy.fail(f"sink error: {exc}")
        except Exception as exc:
            metrics.task_crashed("pump")
            event(logging.ERROR, "pump.crashed", "pump failed", stream=self.stream,
                  fence=self.tenure.fence, error=repr(exc), exc_info=True)
            self.tenancy.fail(f"pump failed: {exc!r}")
        finally:
            self._pump_done = True
            self.tenancy.wake.set()

    async def _stop_pump(self, task: asyncio.Task[None]) -> None:
        if task.done():
            return
        if self.holding.state is HolderState.DRAINING:
            await self.pump.stop()  # stop reading, flush, then return
            budget = self.settings.drain_timeout_s
        else:
            await self.pump.abort()  # lost or self-fenced: no new write, no flush
            budget = self.settings.pump.call_timeout_s
        done, _ = await asyncio.wait({task}, timeout=budget)
        if not done:
            event(logging.ERROR, "stream.stop_timeout", "pump did not stop in time",
                  stream=self.stream, fence=self.tenure.fence, state=self.holding.state)
            self.tenancy.fail("pump did not stop in time")

    async def _finish(self, problem: str | None) -> None:
        holding, metrics, ending = self.holding, self.ctx.metrics, self.ending
        reason = holding.reason
        fields: dict[str, Any] = {"stream": self.stream, "fence": self.tenure.fence,
                                  "last_seq": self.pump.committed}
        metrics.lease_ended(self.ctx.clock.monotonic() - self.acquired_at)
        await ending.close_output(reason)
        if self._handed_to is not None:
            assert self._drain_reason is not None
            metrics.lease_released(self._drain_reason)
            event(logging.INFO, "lease.handed_over", "lease handed over to a peer",
                  reason=self._drain_reason.value, taker=self._handed_to, **fields)
            return
        if holding.state in (HolderState.LOST, HolderState.SELF_FENCED):
            assert reason is not None
            metrics.lease_lost(reason)
            event(logging.WARNING, "lease.lost", "lease lost; stream stopped",
                  reason=reason.value, **fields)
            if holding.state is HolderState.SELF_FENCED:
                # Nothing more is written under this tenure; if the lease is still ours,
                # free it now rather than make the fleet wait for the expiry.
                await ending.release(reason, fields, log=False)
            return
        assert reason is not None
        if problem is not None:
            if reason is StopReason.BAD_ITEM:
                metrics.bad_item(bad_item_reason(problem))
            await ending.record_error(problem)
        # Drained with no failure and the final flush whole: the checkpoint under this
        # fence is where the sink is, and the release says so (core.lease.checkpoint_trusted).
        clean = problem is None and not self.pump.abandoned
        await ending.release(reason, fields, log=True,
                             clean_seq=self.pump.committed if clean else None)
