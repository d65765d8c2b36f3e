"""One upstream WebSocket: connect with ``from_seq``, read, batch, hand to the fenced sink.

The protocol decisions — which frame is a duplicate, a refused jump or a gap, when a batch
is due, what stop, abort and reconnect mean, how long to back off — belong to
``streamlease.core.stream.StreamMachine`` (pure). The pump moves bytes and time, in two
roles: ``streamlease.session`` opens, reads and closes connections;
``streamlease.delivery`` feeds frames to the machine and writes the batches it cuts.
This module runs them: one connection after another, flushing in between.

One task does all of it (``run``), and it raises plain exceptions. A request from the
supervisor (stop, abort, reconnect) updates the machine and, if the task is waiting for
the upstream or the clock (a frame, the handshake, a reconnect backoff, a sink-retry
backoff), interrupts that wait (``streamlease.pumping.Interrupts``): no wait of the pump
outlasts a request. A write in flight is never interrupted: it was sent, so the sink
decides it either way.

The pump never decides ownership. Before every sink write it asks the holder
(``Holding.may_write``) whether the tenure's local deadline still allows writing, and the
sink itself refuses a stale fence. Reconnects flush first, so every connection asks for
``from_seq = last_seq + 1`` where ``last_seq`` is what the sink has durably taken
(docs/contract.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

from streamlease.ahead import Ahead
from streamlease.context import Context
from streamlease.core.lease import Holding
from streamlease.core.stream import StreamMachine
from streamlease.delivery import Delivery
from streamlease.logs import event
from streamlease.pumping import Interrupts, PumpParts, PumpSettings
from streamlease.session import Session
from streamlease.upstream import BUILTIN_WIRE, Wire

__all__ = ["Pump", "PumpSettings"]


class Pump:
    """``on_problem`` is called with a one-line description when the stream stalls (it
    receives frames but can deliver none, for ``stall_s``) or the description changes, and
    with None at the first real progress of this pump and at the end of every stall: once
    per change, never per frame. ``on_delivered`` hears every written batch's size."""

    def __init__(self, ctx: Context, holding: Holding, settings: PumpSettings,
                 wire: Wire = BUILTIN_WIRE,
                 on_problem: Callable[[str | None], None] | None = None,
                 on_delivered: Callable[[int], None] | None = None,
                 ahead: Ahead | None = None) -> None:
        """``ahead``: the first connection, opened before the tenure began (a hand-over)."""
        self.ctx = ctx
        self.tenure = holding.tenure
        self.holding = holding
        self.settings = settings
        rules = settings.rules()
        if not wire.replays:
            rules = dataclasses.replace(rules, unanchored=True)
        self.machine = StreamMachine(rules, self.tenure.last_seq or 0, ctx.rng)
        self.interrupts = Interrupts()
        parts = PumpParts(ctx, holding, settings, wire, self.machine, on_problem)
        self.delivery = Delivery(parts, self._pause, on_delivered)
        self.session = Session(parts, self.delivery, self.interrupts)
        if ahead is not None:
            self.session.ahead = ahead
            self.delivery.replayed_through = self.tenure.last_seq or 0

    @property
    def stream(self) -> str:
        return self.tenure.stream_id

    @property
    def committed(self) -> int:
        """The highest seq the sink has taken."""
        return self.machine.committed

    @property
    def abandoned(self) -> bool:
        """The final flush was given up (``sink.flush_abandoned``): frames read under this
        tenure were dropped unwritten, and ``committed`` is not where the reading ended."""
        return self.delivery.abandoned

    @property
    def connected(self) -> bool:
        return self.session.connected

    async def _pause(self, seconds: float) -> None:
        await self.interrupts.wait(self.ctx.clock.sleep(seconds))

    # -- control from the supervisor ------------------------------------------------------

    async def stop(self) -> None:
        """Graceful: stop reading; ``run`` then flushes what it holds and returns.

        Never waits for the connection to close: the pump's task does that, so a caller
        (the heartbeat loop) is not held up by a slow close handshake."""
        self.machine.stop()
        self.interrupts.interrupt()

    async def abort(self) -> None:
        """Ownership is gone: stop reading and start no new write. A write already in
        flight is left to finish: it was sent, so the sink decides it either way, and its
        answer (accepted before the takeover, or refused as stale) is worth knowing."""
        self.machine.abort()
        self.interrupts.interrupt()

    async def reconnect(self, reason: str) -> None:
        """Close the connection; ``run`` flushes and connects again (e.g. a new URL)."""
        self.machine.reconnect(reason)
        self.interrupts.interrupt()

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Read until stopped. Raises StaleFence, SelfFenced, SinkConflict or StoreError
        (plain exceptions, never groups) when the tenure can no longer write."""
        self.interrupts.task = asyncio.current_task()
        try:
            await self._connections()
            self.machine.flush()
            await self.delivery.write_due()
            await self.delivery.settle()
        finally:
            self.interrupts.task = None
            self.delivery.set_stalled(False)
            if self.session.ahead is not None:  # stopped before its first connection
                await self.session.ahead.close()
                self.session.ahead = None

    async def _connections(self) -> None:
        machine, clock = self.machine, self.ctx.clock
        while (from_seq := machine.connect(clock.monotonic())) is not None:
            reason = await self.session.connection(from_seq)
            machine.flush()  # before reconnecting: the next connection asks committed + 1
            await self.delivery.write_due()
            step = machine.disconnected(reason, clock.monotonic())
            if step is None:
                return
            self.ctx.metrics.reconnect(step.reason)
            event(logging.INFO, "pump.reconnect", "reconnecting to upstream",
                  stream=self.stream, fence=self.tenure.fence, reason=step.reason,
                  delay_s=round(step.delay_s, 3), from_seq=step.from_seq)
            if step.delay_s > 0:
                await self._pause(step.delay_s)
