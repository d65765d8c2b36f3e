"""One upstream WebSocket: connect with ``from_seq``, read, batch, hand to the fenced sink.

The protocol decisions — which frame is a duplicate, a refused jump or a gap, when a batch
is due, what stop, abort and reconnect mean, how long to back off — belong to
``streamlease.core.stream.StreamMachine`` (pure). This class moves bytes and time: it opens and
closes the connection, feeds frames and clock readings to the machine, and carries out its
decisions (write a batch, sleep, reconnect), logging and counting as it goes.

One task does all of it (``run``), and it raises plain exceptions. While it writes a batch
it does not read: frames wait in websockets' small receive queue, then in the kernel, so a
stream holds at most one batch and that queue (``streamlease.core.stream.stream_buffer_bytes``).
A request from the supervisor (stop, abort, reconnect) updates the machine and, if the task
is waiting for the upstream or the clock (a frame, the handshake, a reconnect backoff, a
sink-retry backoff), interrupts that wait: no wait of the pump outlasts a request. A write
in flight is never interrupted: it was sent, so the sink decides it either way.

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
import random
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK
from websockets.frames import CloseCode

from streamlease import tracing
from streamlease.clock import Clock
from streamlease.core.frames import Frame, Malformed
from streamlease.core.lease import Holding
from streamlease.core.model import Tenure
from streamlease.core.profiles import Control
from streamlease.core.stream import (
    BATCH_FILL_BYTES,
    BATCH_MAX_BYTES,
    RECEIVE_QUEUE,
    Ending,
    StreamMachine,
    StreamRules,
    Verdict,
)
from streamlease.core.upstream import (
    PendingGap,
    gap_dismissed,
    gap_frame,
    gap_on_connect,
    place_gap,
)
from streamlease.core.urls import AllowList, redact
from streamlease.dial import dial
from streamlease.errors import DialError, SelfFenced, StoreThrottled, StoreUnavailable
from streamlease.logs import event
from streamlease.metrics import Metrics
from streamlease.upstream import (
    BUILTIN_WIRE,
    Connection,
    OpeningFailed,
    Prepared,
    SetupFailed,
    Wire,
)

T = TypeVar("T")
_ACCEPTED = Verdict.ACCEPTED


class Sink(Protocol):
    async def write_batch(self, tenure: Tenure, prev_seq: int, frames: list[Frame],
                          now_wall_ms: int, timeout: float | None = None) -> Any: ...


@dataclass(frozen=True)
class PumpSettings:
    batch_max_messages: int = 200
    batch_max_bytes: int = BATCH_MAX_BYTES
    # Cut a batch once it fills what one DynamoDB write buys (the events-table sink); other
    # outputs pass ``batch_max_bytes`` (no such unit: batches grow to the other caps).
    batch_fill_bytes: int = BATCH_FILL_BYTES
    batch_max_s: float = 0.2
    max_frame_bytes: int = 262_144
    max_seq_jump: int = 1_000_000_000
    stall_s: float = 60.0
    receive_queue: tuple[int, int] = RECEIVE_QUEUE
    allowed_urls: AllowList = ()  # nothing may be dialled unless the worker says so
    call_timeout_s: float = 10.0
    open_timeout_s: float = 10.0
    reconnect_base_s: float = 0.1
    reconnect_cap_s: float = 30.0
    stable_after_s: float = 5.0  # a connection that lived this long resets the backoff
    # A failed sink write waits at most this long before it is tried again: the member
    # heartbeat (``streamlease.core.stream.sink_retry_cap``), 5 s at the defaults.
    sink_retry_cap_s: float = 5.0

    def rules(self) -> StreamRules:
        return StreamRules(
            batch_max_messages=self.batch_max_messages, batch_max_bytes=self.batch_max_bytes,
            batch_fill_bytes=self.batch_fill_bytes, batch_max_s=self.batch_max_s,
            max_seq_jump=self.max_seq_jump,
            stall_s=self.stall_s, reconnect_base_s=self.reconnect_base_s,
            reconnect_cap_s=self.reconnect_cap_s, stable_after_s=self.stable_after_s,
            sink_retry_cap_s=self.sink_retry_cap_s)


class Pump:
    """``on_problem`` is called with a one-line description when the stream stalls (it
    receives frames but can deliver none, for ``stall_s``) or the description changes, and
    with None at the first real progress of this pump and at the end of every stall: once
    per change, never per frame."""

    def __init__(self, tenure: Tenure, holding: Holding, sink: Sink, clock: Clock,
                 metrics: Metrics, settings: PumpSettings, rng: random.Random | None = None,
                 on_delivered: Callable[[int], None] | None = None,
                 on_problem: Callable[[str | None], None] | None = None,
                 wire: Wire = BUILTIN_WIRE) -> None:
        self.tenure = tenure
        self.wire = wire
        self.holding = holding
        self.sink = sink
        self.clock = clock
        self.metrics = metrics
        self.settings = settings
        rules = settings.rules()
        if not wire.replays:
            rules = dataclasses.replace(rules, unanchored=True)
        self.machine = StreamMachine(rules, tenure.last_seq or 0, rng)
        self.connected = False
        self._on_delivered = on_delivered
        self._on_problem = on_problem
        self._task: asyncio.Task[Any] | None = None
        self._parked = False  # the task waits for the upstream or the clock, not a write
        self._interrupted = False  # this pump cancelled that wait
        self._stalled = False  # counted in streamlease_stalled_streams
        self._connections_made = 0
        self._closed_ms: int | None = None  # wall time the last connection ended
        self._gap: PendingGap | None = None  # a record due before the next message
        self._setup_problem: str | None = None
        self._flushed = False  # the tenure's first batch was written (it alone gets a span)

    @property
    def stream(self) -> str:
        return self.tenure.stream_id

    @property
    def committed(self) -> int:
        """The highest seq the sink has taken."""
        return self.machine.committed

    # -- control from the supervisor ------------------------------------------------------

    async def stop(self) -> None:
        """Graceful: stop reading; ``run`` then flushes what it holds and returns.

        Never waits for the connection to close: the pump's task does that, so a caller
        (the heartbeat loop) is not held up by a slow close handshake."""
        self.machine.stop()
        self._interrupt()

    async def abort(self) -> None:
        """Ownership is gone: stop reading and start no new write. A write already in
        flight is left to finish: it was sent, so the sink decides it either way, and its
        answer (accepted before the takeover, or refused as stale) is worth knowing."""
        self.machine.abort()
        self._interrupt()

    async def reconnect(self, reason: str) -> None:
        """Close the connection; ``run`` flushes and connects again (e.g. a new URL)."""
        self.machine.reconnect(reason)
        self._interrupt()

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Read until stopped. Raises StaleFence, SelfFenced, SinkConflict or StoreError
        (plain exceptions, never groups) when the tenure can no longer write."""
        self._task = asyncio.current_task()
        try:
            await self._connections()
            self.machine.flush()
            await self._write_due()
        finally:
            self._task = None
            self._set_stalled(False)

    async def _connections(self) -> None:
        machine = self.machine
        while (from_seq := machine.connect(self.clock.monotonic())) is not None:
            reason = await self._connection(from_seq)
            machine.flush()  # before reconnecting: the next connection asks committed + 1
            await self._write_due()
            step = machine.disconnected(reason, self.clock.monotonic())
            if step is None:
                return
            self.metrics.reconnect(step.reason)
            event(logging.INFO, "pump.reconnect", "reconnecting to upstream",
                  stream=self.stream, fence=self.tenure.fence, reason=step.reason,
                  delay_s=round(step.delay_s, 3), from_seq=step.from_seq)
            if step.delay_s > 0:
                await self._interruptible(self.clock.sleep(step.delay_s))

    async def _open(self, prepared: Prepared) -> ClientConnection:
        """Dial the upstream: the one place that opens a connection (the allow-list is
        checked again on the final URL and on every redirect; no proxy; TLS verified).
        The tenure's first connection is dialled in its acquisition's trace; a reconnect
        starts a trace of its own, linked to it."""
        reconnect = self._connections_made > 0
        with tracing.span("dial", root=reconnect, stream=self.stream, fence=self.tenure.fence,
                          upstream=self.wire.name, reconnect=reconnect):
            return await dial(
                prepared.url, self.settings.allowed_urls, compression=None,
                max_size=self.settings.max_frame_bytes,
                open_timeout=self.settings.open_timeout_s, close_timeout=2,
                max_queue=self.settings.receive_queue, ping_interval=20, ping_timeout=20,
                additional_headers=prepared.headers or None,
                subprotocols=prepared.subprotocols or None,
            )

    async def _prepare(self, from_seq: int) -> Prepared | str:
        """What to dial (secrets resolved), or the reason it cannot be worked out."""
        try:
            prepared = await self._interruptible(self.wire.prepare(self.holding.ws_url,
                                                                   from_seq))
        except SetupFailed as exc:
            text = str(exc)
            if text != self._setup_problem:
                event(logging.ERROR, "pump.setup_failed",
                      "cannot work out how to connect to the upstream; not dialled",
                      stream=self.stream, fence=self.tenure.fence, upstream=self.wire.name,
                      error=text)
            self._connect_problem(text)
            return "setup_failed"
        if prepared is None:
            return "closed"  # stopped while a secret was being fetched
        return prepared

    def _connect_problem(self, text: str) -> None:
        """A connection attempt failed before any frame could be read (setup, opening
        exchange): the stream's ``last_error``, written once per change of text."""
        if text != self._setup_problem:
            self._setup_problem = text
            if self._on_problem is not None:
                self._on_problem(text)

    async def _connection(self, asked: int) -> str:
        """One connection, from the handshake to its end; the reason it ended."""
        prepared = await self._prepare(asked)
        if isinstance(prepared, str):
            return prepared
        url = prepared.url
        try:
            ws = await self._interruptible(self._open(prepared))
        except DialError as exc:
            # Only the failure's type, safe facts and the redacted URL: the library's own
            # message can hold the whole URL with its credentials.
            event(logging.WARNING, "pump.connect_failed", "cannot connect to upstream",
                  stream=self.stream, fence=self.tenure.fence, url=exc.url, error=str(exc))
            return "connect_failed"
        if ws is None:
            return "closed"  # stopped, or the URL changed, while the handshake was in flight
        self.connected = True
        self.metrics.upstream_connected(1)
        event(logging.INFO, "pump.connected", "connected to upstream", stream=self.stream,
              fence=self.tenure.fence, url=redact(url), from_seq=asked,
              upstream=self.wire.name)
        # A gap still pending (a connection that ended before its first message) keeps
        # its earlier start: the loss it marks began then.
        self._gap = self._gap or gap_on_connect(self.wire.replays, self._connections_made == 0,
                                                self.machine.received, self._closed_ms)
        self._connections_made += 1
        try:
            return await self._session(ws, prepared)
        finally:
            self._closed_ms = self.clock.wall_ms()
            self.connected = False
            self.metrics.upstream_connected(-1)

    async def _session(self, ws: ClientConnection, prepared: Prepared) -> str:
        """The opening exchange, then read and write in turn until the connection ends or
        a close is asked for."""
        machine = self.machine
        keepalive: asyncio.Task[None] | None = None
        opening = False
        try:
            opening = True
            await self._interruptible(self.wire.open(Connection(ws), prepared, self._deliver))
            opening = False
            self._setup_problem = None  # connected and through the opening: a new failure
            # of the same kind is reported again
            if prepared.keepalive is not None and prepared.keepalive_s is not None:
                keepalive = asyncio.create_task(
                    self._keepalive(ws, prepared.keepalive, prepared.keepalive_s),
                    name=f"keepalive:{self.stream}")
            while not machine.closing:
                await self._read(ws)
                await self._write_due()
        except OpeningFailed as exc:
            event(logging.WARNING, "pump.opening_failed",
                  "the upstream's opening exchange did not complete; reconnecting",
                  stream=self.stream, fence=self.tenure.fence, upstream=self.wire.name,
                  reason=exc.reason, error=str(exc))
            self._connect_problem(str(exc))
            await self._close(ws)
            return exc.reason
        except ConnectionClosedOK:
            return "closed"
        except ConnectionClosed as exc:
            if opening:
                self._closed_while_opening(exc)
            return self._closed(exc)
        except asyncio.CancelledError:
            ws.transport.abort()
            raise
        except Exception:
            await self._close(ws)
            raise
        finally:
            if keepalive is not None:
                await self._end_keepalive(keepalive)
        await self._close(ws)
        return "closed"

    def _closed_while_opening(self, exc: ConnectionClosed) -> None:
        """The upstream closed during the opening exchange: usually a refused token or
        subscription (close codes like 4004). The stream's ``last_error`` says so."""
        code = exc.rcvd.code if exc.rcvd else None
        reason = (exc.rcvd.reason if exc.rcvd else "")[:120]
        text = f"upstream closed the connection during the opening exchange (code {code}" + \
            (f": {reason})" if reason else ")")
        event(logging.WARNING, "pump.opening_failed",
              "the upstream's opening exchange did not complete; reconnecting",
              stream=self.stream, fence=self.tenure.fence, upstream=self.wire.name,
              reason="closed", error=text)
        self._connect_problem(text)

    async def _deliver(self, data: str | bytes) -> None:
        """A frame read during the opening exchange: handled like any other, and a batch
        that is due is written before the exchange reads on (back-pressure)."""
        self._on_data(data)
        if self.machine.pause_reading:
            await self._write_due()

    async def _keepalive(self, ws: ClientConnection, text: str, every_s: float) -> None:
        """The profile's application-level keepalive, every ``every_s`` while connected."""
        while True:
            await self.clock.sleep(every_s)
            await ws.send(text)

    async def _end_keepalive(self, task: asyncio.Task[None]) -> None:
        """Cancel the keepalive and read how it ended: a send on a closing connection is
        expected (the session sees the close itself); anything else is logged."""
        task.cancel()
        await asyncio.wait([task])
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, ConnectionClosed):
            event(logging.WARNING, "pump.keepalive_failed", "the upstream keepalive failed",
                  stream=self.stream, fence=self.tenure.fence, error=type(exc).__name__)

    async def _read(self, ws: ClientConnection) -> None:
        """Hand frames to the machine until a batch is due or a close is asked for.

        With nothing buffered it waits for the upstream as long as it takes (an idle stream
        holds no timer); with frames buffered, until the oldest has waited ``batch_max_s``."""
        machine = self.machine
        self._parked = True
        try:
            while not machine.pause_reading:
                deadline = machine.flush_deadline()
                if deadline is None:
                    self._on_data(await ws.recv())
                    continue
                wait = deadline - self.clock.monotonic()
                if wait <= 0:
                    machine.tick(deadline)
                    continue
                async with asyncio.timeout(wait):
                    while not machine.pause_reading:
                        self._on_data(await ws.recv())
        except TimeoutError:
            machine.tick(self.clock.monotonic())
        except asyncio.CancelledError:
            if not self._own_interrupt():
                raise
        finally:
            self._parked = False

    def _on_data(self, data: str | bytes) -> None:
        frame = self.wire.classify(data, self.machine.received)
        if type(frame) is Control:
            self.metrics.control_frame()
            return
        assert not isinstance(frame, Control)
        if self._gap is not None and type(frame) is Frame:
            frame = self._place_gap(frame)
        got = self.machine.receive(frame, sys.getsizeof(data), self.clock.monotonic())
        verdict = got.verdict
        if verdict is _ACCEPTED:
            if got.problem_changed:
                self._report_problem()
            return
        if verdict is Verdict.GAP and not self.wire.replays:
            # A feed that cannot replay starts wherever it is: not a gap in what was asked.
            pass
        elif verdict is Verdict.GAP:
            assert got.seq is not None
            self.metrics.gap()
            event(logging.WARNING, "pump.gap", "upstream skipped sequence numbers",
                  stream=self.stream, fence=self.tenure.fence, asked=got.reference + 1,
                  got=got.seq, missing=got.seq - got.reference - 1)
        elif verdict is Verdict.DUPLICATE:
            self.metrics.duplicate()
            if got.log is not None:
                event(logging.WARNING, "pump.duplicate_frame",
                      "dropped a frame at or below the highest seq received",
                      stream=self.stream, fence=self.tenure.fence, seq=got.seq,
                      received=got.reference, suppressed_since_last=got.log)
        elif verdict is Verdict.JUMP:
            self.metrics.malformed()
            if got.log is not None:
                event(logging.WARNING, "pump.seq_jump_refused",
                      "refused a frame whose seq jumps past STREAMLEASE_MAX_SEQ_JUMP",
                      stream=self.stream, fence=self.tenure.fence, seq=got.seq,
                      received=got.reference, limit=self.settings.max_seq_jump,
                      suppressed_since_last=got.log)
        elif verdict is Verdict.MALFORMED:
            self.metrics.malformed()
            if got.log is not None:
                assert isinstance(frame, Malformed)
                event(logging.WARNING, "pump.malformed_frame",
                      "dropped a malformed upstream frame", stream=self.stream,
                      fence=self.tenure.fence, reason=frame.reason, size=len(data),
                      after_seq=got.reference, suppressed_since_last=got.log)
        if got.problem_changed:
            self._report_problem()

    def _place_gap(self, frame: Frame) -> Frame:
        """Deliver the pending gap record before ``frame`` if it is due there (the frame
        renumbered when the worker numbers frames), or dismiss it if ``frame`` shows that
        nothing was lost."""
        gap, machine = self._gap, self.machine
        assert gap is not None
        numbered = self.wire.numbered
        if gap_dismissed(gap, frame.seq, machine.received, numbered):
            self._gap = None
            return frame
        placement = place_gap(gap, frame.seq, machine.received, numbered,
                              self.settings.max_seq_jump)
        if placement is None:
            return frame
        record = gap_frame(gap, placement, self.clock.wall_ms())
        got = machine.receive(record, sys.getsizeof(record.text), self.clock.monotonic())
        if not got.verdict.accepted:
            return frame  # closing: the next connection (or holder) records the gap
        if got.problem_changed:
            self._report_problem()
        self._gap = None
        self.metrics.upstream_gap(gap.reason)
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
                  fence=self.tenure.fence, last_seq=self.committed)
        elif self._stalled:
            event(logging.INFO, "pump.progress", "upstream delivers again",
                  stream=self.stream, fence=self.tenure.fence, last_seq=self.committed)
        self._set_stalled(problem is not None)
        if self._on_problem is not None:
            self._on_problem(problem)

    def _set_stalled(self, stalled: bool) -> None:
        if stalled != self._stalled:
            self._stalled = stalled
            self.metrics.stalled(1 if stalled else -1)

    def _closed(self, exc: ConnectionClosed) -> str:
        code = exc.rcvd.code if exc.rcvd else (exc.sent.code if exc.sent else None)
        event(logging.INFO, "pump.disconnected", "upstream connection closed",
              stream=self.stream, fence=self.tenure.fence, code=code,
              reason=(exc.rcvd.reason if exc.rcvd else "")[:200],
              after_seq=self.machine.received)
        if code == CloseCode.MESSAGE_TOO_BIG:
            event(logging.ERROR, "pump.frame_too_big",
                  "upstream frame exceeds STREAMLEASE_MAX_FRAME_BYTES",
                  stream=self.stream, fence=self.tenure.fence,
                  limit=self.settings.max_frame_bytes, after_seq=self.machine.received)
            return "too_big"
        return "error"

    async def _close(self, ws: ClientConnection) -> None:
        """Close, reading and dropping until the handshake ends: a backlog queued behind
        the close frame would otherwise hold it up for close_timeout. Nothing is lost: the
        next connection asks for committed + 1."""
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_drop_until_closed(ws))
                await ws.close()
        except* Exception as group:
            event(logging.INFO, "pump.close_failed", "closing the upstream connection failed",
                  stream=self.stream, fence=self.tenure.fence,
                  error=type(group.exceptions[0]).__name__)

    # -- writing -------------------------------------------------------------------------

    async def _write_due(self) -> None:
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
        machine = self.machine
        started = self.clock.monotonic()
        while True:
            now = self.clock.monotonic()
            if machine.ending is Ending.ABORT or not self.holding.may_write(now):
                raise SelfFenced(f"stream {self.stream}: this tenure may not write any more")
            try:
                await self.sink.write_batch(self.tenure, self.committed, batch,
                                            self.clock.wall_ms(),
                                            timeout=self.settings.call_timeout_s)
            except (StoreThrottled, StoreUnavailable) as exc:
                wait = machine.write_failed()
                if wait is None:
                    self._give_up(exc)
                    return False
                delay = min(wait, max(0.0, self.holding.deadline - now))
                self.metrics.sink_write_failed("retried")
                event(logging.WARNING, "sink.retry", "sink write failed; retrying",
                      stream=self.stream, fence=self.tenure.fence, error=str(exc),
                      delay_s=round(delay, 3), batch=len(batch))
                # A stop, abort or reconnect wakes this wait: the loop then checks again.
                await self._interruptible(self.clock.sleep(delay))
                continue
            self.metrics.sink_batch(self.clock.monotonic() - started)
            self.metrics.delivered(len(batch))
            if self._on_delivered is not None:
                self._on_delivered(len(batch))
            return True

    def _give_up(self, exc: Exception) -> None:
        """Stopping, and the sink does not take the held frames: drop them unwritten.
        ``last_seq`` did not move, so whoever holds the stream next asks for them again."""
        dropped = self.machine.give_up()
        self.metrics.sink_write_failed("abandoned")
        event(logging.WARNING, "sink.flush_abandoned",
              "sink write failed while stopping; held frames left for the next holder",
              stream=self.stream, fence=self.tenure.fence, error=str(exc), frames=dropped,
              last_seq=self.committed)

    # -- interrupting a wait ---------------------------------------------------------------

    async def _interruptible(self, aw: Awaitable[T]) -> T | None:
        """Await ``aw`` (a wait for the upstream or the clock); None if a request from the
        supervisor interrupted it."""
        self._parked = True
        try:
            result = await aw
        except asyncio.CancelledError:
            if not self._own_interrupt():
                raise
            return None
        finally:
            self._parked = False
        if self._interrupted:
            # The interrupt landed in code that swallowed it (a user's upstream): take it
            # back, or every later request would be ignored.
            self._own_interrupt()
            return None
        return result

    def _interrupt(self) -> None:
        """Wake the task if it waits for the upstream or the clock. The wait is cancelled
        (websockets' recv and handshake, and sleeps, are safe to cancel); ``_own_interrupt``
        tells that cancellation apart from one coming from outside."""
        task = self._task
        if self._parked and not self._interrupted and task is not None and not task.done():
            self._interrupted = True
            task.cancel()

    def _own_interrupt(self) -> bool:
        """True if the CancelledError being handled is this pump's interrupt and nothing
        else: a cancellation from outside (the supervisor's timeout) still propagates."""
        if not self._interrupted:
            return False
        self._interrupted = False
        task = asyncio.current_task()
        return task is not None and task.uncancel() == 0


async def _drop_until_closed(ws: ClientConnection) -> None:
    try:
        while True:
            await ws.recv()
    except ConnectionClosed:
        pass

