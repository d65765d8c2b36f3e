"""A pump's frames in and batches out: each frame read is classified and handed to the
stream machine (``streamlease.core.stream``), with its verdict logged and counted; each
batch the machine cuts is written to the fenced sink, retried on throttling and unknown
outcomes until the tenure's deadline. A stall (frames arrive, none deliverable) is
reported once per change.

The pump never decides ownership: before every sink write it asks the holder
(``Holding.may_write``) whether the tenure's local deadline still allows writing, and the
sink itself refuses a stale fence.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Awaitable, Callable

from streamlease import tracing
from streamlease.core.frames import Frame, Malformed
from streamlease.core.profiles import Control
from streamlease.core.stream import Ending, Verdict
from streamlease.core.upstream import (
    PendingGap,
    gap_dismissed,
    gap_frame,
    gap_on_connect,
    place_gap,
)
from streamlease.errors import SelfFenced, StoreThrottled, StoreUnavailable
from streamlease.logs import event
from streamlease.pumping import PumpParts

_ACCEPTED = Verdict.ACCEPTED


class Delivery:
    """``pause(seconds)`` waits before a sink write is tried again (a stop, abort or
    reconnect cuts it short); ``on_delivered`` hears every batch's size once written."""

    def __init__(self, parts: PumpParts, pause: Callable[[float], Awaitable[object]],
                 on_delivered: Callable[[int], None] | None = None) -> None:
        self.parts = parts
        self.ctx = parts.ctx
        self.machine = parts.machine
        self.tenure = parts.holding.tenure
        self.stream = self.tenure.stream_id
        self._pause = pause
        self._on_delivered = on_delivered
        self._gap: PendingGap | None = None  # a record due before the next message
        self._stalled = False  # counted in streamlease_stalled_streams
        self._flushed = False  # the tenure's first batch was written (it alone gets a span)
        self.abandoned = False  # frames were dropped unwritten while stopping
        # A connection opened ahead of a hand-over replays from where the item was before
        # the take: what it replays up to the take's last_seq is dropped without a word.
        self.replayed_through = 0

    def connected(self, first: bool, closed_ms: int | None) -> None:
        """A connection opened (``first`` of the tenure; the last one ended at wall time
        ``closed_ms``). A gap still pending (a connection that ended before its first
        message) keeps its earlier start: the loss it marks began then."""
        self._gap = self._gap or gap_on_connect(self.parts.wire.replays, first,
                                                self.machine.received, closed_ms)

    # -- frames in -----------------------------------------------------------------------

    def receive(self, data: str | bytes) -> None:
        parts, machine, metrics = self.parts, self.machine, self.ctx.metrics
        frame = parts.wire.classify(data, machine.received)
        if type(frame) is Control:
            metrics.control_frame()
            return
        if self.replayed_through and type(frame) is Frame:
            if frame.seq <= self.replayed_through:
                return  # delivered by the previous holder while this connection opened
            self.replayed_through = 0
        assert not isinstance(frame, Control)
        if self._gap is not None and type(frame) is Frame:
            frame = self._place_gap(frame)
        got = machine.receive(frame, sys.getsizeof(data), self.ctx.clock.monotonic())
        verdict = got.verdict
        if verdict is _ACCEPTED:
            if got.problem_changed:
                self._report_problem()
            return
        fence = self.tenure.fence
        if verdict is Verdict.GAP and not parts.wire.replays:
            # A feed that cannot replay starts wherever it is: not a gap in what was asked.
            pass
        elif verdict is Verdict.GAP:
            assert got.seq is not None
            metrics.gap()
            event(logging.WARNING, "pump.gap", "upstream skipped sequence numbers",
                  stream=self.stream, fence=fence, asked=got.reference + 1,
                  got=got.seq, missing=got.seq - got.reference - 1)
        elif verdict is Verdict.DUPLICATE:
            metrics.duplicate()
            if got.log is not None:
                event(logging.WARNING, "pump.duplicate_frame",
                      "dropped a frame at or below the highest seq received",
                      stream=self.stream, fence=fence, seq=got.seq,
                      received=got.reference, suppressed_since_last=got.log)
        elif verdict is Verdict.JUMP:
            metrics.malformed()
            if got.log is not None:
                event(logging.WARNING, "pump.seq_jump_refused",
                      "refused a frame whose seq jumps past STREAMLEASE_MAX_SEQ_JUMP",
                      stream=self.stream, fence=fence, seq=got.seq,
                      received=got.reference, limit=parts.settings.max_seq_jump,
                      suppressed_since_last=got.log)
        elif verdict is Verdict.MALFORMED:
            metrics.malformed()
            if got.log is not None:
                assert isinstance(frame, Malformed)
                event(logging.WARNING, "pump.malformed_frame",
                      "dropped a malformed upstream frame", stream=self.stream,
                      fence=fence, reason=frame.reason, size=len(data),
                      after_seq=got.reference, suppressed_since_last=got.log)
        if got.problem_changed:
            self._report_problem()

    def _place_gap(self, frame: Frame) -> Frame:
        """Deliver the pending gap record before ``frame`` if it is due there (the frame
        renumbered when the worker numbers frames), or dismiss it if ``frame`` shows that
        nothing was lost."""
        gap, machine, clock = self._gap, self.machine, self.ctx.clock
        assert gap is not None
        numbered = self.parts.wire.numbered
        if gap_dismissed(gap, frame.seq, machine.received, numbered):
            self._gap = None
            return frame
        placement = place_gap(gap, frame.seq, machine.received, numbered,
                              self.parts.settings.max_seq_jump)
        if placement is None:
            return frame
        record = gap_frame(gap, placement, clock.wall_ms())
        got = machine.receive(record, sys.getsizeof(record.text), clock.monotonic())
        if not got.verdict.accepted:
            return frame  # closing: the next connection (or holder) records the gap
        if got.problem_changed:
            self._report_problem()
        self._gap = None
        self.ctx.metrics.upstream_gap(gap.reason)
        event(logging.WARNING, "pump.upstream_gap",
              "the upstream cannot replay: messages sent while no connection was open are "
              "lost; a gap record marks the place", stream=self.stream,
              fence=self.tenure.fence, reason=gap.reason, after_seq=gap.after_seq,
              record_seq=placement.seq, missing=placement.missing)
        if placement.frame_seq != frame.seq:
            return Frame(placement.frame_seq, frame.text)
        return frame

    def _report_problem(self) -> None:
        problem = self.machine.problem
        if problem is not None:
            event(logging.WARNING, "pump.stalled", problem, stream=self.stream,
                  fence=self.tenure.fence, last_seq=self.machine.committed)
        elif self._stalled:
            event(logging.INFO, "pump.progress", "upstream delivers again",
                  stream=self.stream, fence=self.tenure.fence, last_seq=self.machine.committed)
        self.set_stalled(problem is not None)
        if self.parts.on_problem is not None:
            self.parts.on_problem(problem)

    def set_stalled(self, stalled: bool) -> None:
        if stalled != self._stalled:
            self._stalled = stalled
            self.ctx.metrics.stalled(1 if stalled else -1)

    # -- batches out ---------------------------------------------------------------------

    async def write_due(self) -> None:
        """Write every batch the machine has cut, oldest first (none after an abort)."""
        machine = self.machine
        while (batch := machine.next_batch()) is not None:
            if await self._write(batch):
                machine.written(batch)

    async def _write(self, batch: list[Frame]) -> bool:
        """One batch, retried on throttling and unknown outcomes (backoff capped at the
        member heartbeat) until the deadline, or until a stop gives it up. True if written.
        """
        if not self._flushed:
            # The tenure's first flush, in its acquisition's trace; no later batch is traced.
            self._flushed = True
            with tracing.span("first_flush", stream=self.stream, fence=self.tenure.fence,
                              messages=len(batch), first_seq=batch[0].seq,
                              last_seq=batch[-1].seq):
                return await self._write(batch)
        machine, holding, clock, metrics = self.machine, self.parts.holding, self.ctx.clock, \
            self.ctx.metrics
        started = clock.monotonic()
        while True:
            now = clock.monotonic()
            if machine.ending is Ending.ABORT or not holding.may_write(now):
                raise SelfFenced(f"stream {self.stream}: this tenure may not write any more")
            try:
                await self.ctx.sink.write_batch(self.tenure, machine.committed, batch,
                                                clock.wall_ms(),
                                                timeout=self.parts.settings.call_timeout_s)
            except (StoreThrottled, StoreUnavailable) as exc:
                wait = machine.write_failed()
                if wait is None:
                    self._give_up(exc)
                    return False
                delay = min(wait, max(0.0, holding.deadline - now))
                metrics.sink_write_failed("retried")
                event(logging.WARNING, "sink.retry", "sink write failed; retrying",
                      stream=self.stream, fence=self.tenure.fence, error=str(exc),
                      delay_s=round(delay, 3), batch=len(batch))
                # A stop, abort or reconnect wakes this wait: the loop then checks again.
                await self._pause(delay)
                continue
            metrics.sink_batch(clock.monotonic() - started)
            metrics.delivered(len(batch))
            if self._on_delivered is not None:
                self._on_delivered(len(batch))
            return True

    async def settle(self) -> None:
        """After the final flush: what the last write left in flight (a processor's
        checkpoint, ``Sink.settle``) done, retried as a write is. Given up when the
        tenure may write no more, or the retries run out: then the final checkpoint is not
        where the reading ended (``abandoned``: the release is not marked clean)."""
        machine, holding, clock = self.machine, self.parts.holding, self.ctx.clock
        while True:
            if not holding.may_write(clock.monotonic()):
                self.abandoned = True
                return
            try:
                await self.ctx.sink.settle(self.tenure,
                                           timeout=self.parts.settings.call_timeout_s)
                return
            except (StoreThrottled, StoreUnavailable) as exc:
                wait = machine.write_failed()
                if wait is None:
                    self.abandoned = True
                    self.ctx.metrics.sink_write_failed("abandoned")
                    event(logging.WARNING, "sink.flush_abandoned",
                          "the final checkpoint failed while stopping; the next holder "
                          "resumes from the one before", stream=self.stream,
                          fence=self.tenure.fence, error=str(exc))
                    return
                self.ctx.metrics.sink_write_failed("retried")
                await self._pause(min(wait, max(0.0, holding.deadline - clock.monotonic())))

    def _give_up(self, exc: Exception) -> None:
        """Stopping, and the sink does not take the held frames: drop them unwritten.
        ``last_seq`` did not move, so whoever holds the stream next asks for them again."""
        dropped = self.machine.give_up()
        self.abandoned = True
        self.ctx.metrics.sink_write_failed("abandoned")
        event(logging.WARNING, "sink.flush_abandoned",
              "sink write failed while stopping; held frames left for the next holder",
              stream=self.stream, fence=self.tenure.fence, error=str(exc), frames=dropped,
              last_seq=self.machine.committed)
