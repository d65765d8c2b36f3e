"""One upstream WebSocket: connect with ``from_seq``, read, batch, hand to the fenced sink.

The pump never decides ownership. Before every sink write it asks the holder
(``Holding.may_write``) whether the tenure's local deadline still allows writing, and
the sink itself refuses a stale fence. It stops reading while a full batch is being
written, so memory stays bounded by about two batches whatever the sink's speed.

Reconnects flush first, so every connection asks for ``from_seq = last_seq + 1`` where
``last_seq`` is what the sink has durably taken (CONTRACT).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import (
    ConnectionClosed,
    ConnectionClosedOK,
    InvalidHandshake,
    InvalidURI,
)
from websockets.frames import CloseCode

from worker.clock import Clock
from worker.core.backoff import Backoff
from worker.core.frames import Frame, Malformed, parse_frame
from worker.core.lease import Holding
from worker.core.model import Tenure
from worker.core.urls import redact, with_from_seq
from worker.errors import SelfFenced, StoreThrottled, StoreUnavailable
from worker.logs import event
from worker.metrics import Metrics


class Sink(Protocol):
    async def write_batch(self, tenure: Tenure, prev_seq: int, frames: list[Frame],
                          now_wall_ms: int, timeout: float | None = None) -> Any: ...


@dataclass(frozen=True)
class PumpSettings:
    batch_max_messages: int = 200
    # Counted in characters; even at 4 bytes each a batch stays under DynamoDB's 4 MB
    # transaction limit.
    batch_max_bytes: int = 800_000
    batch_max_s: float = 0.2
    max_frame_bytes: int = 262_144
    call_timeout_s: float = 10.0
    open_timeout_s: float = 10.0
    reconnect_base_s: float = 0.1
    reconnect_cap_s: float = 30.0
    stable_after_s: float = 5.0  # a connection that lived this long resets the backoff


class _RateLimited:
    """Log the first line, then at most one a ``period`` with a count of the rest."""

    def __init__(self, clock: Clock, period: float = 5.0) -> None:
        self.clock = clock
        self.period = period
        self.next_at = 0.0
        self.suppressed = 0

    def allow(self) -> int | None:
        now = self.clock.monotonic()
        if now < self.next_at:
            self.suppressed += 1
            return None
        self.next_at = now + self.period
        count, self.suppressed = self.suppressed, 0
        return count


class Pump:
    def __init__(self, tenure: Tenure, holding: Holding, sink: Sink, clock: Clock,
                 metrics: Metrics, settings: PumpSettings, rng: random.Random | None = None,
                 on_delivered: Callable[[int], None] | None = None) -> None:
        self.tenure = tenure
        self.holding = holding
        self.sink = sink
        self.clock = clock
        self.metrics = metrics
        self.settings = settings
        self.committed = tenure.last_seq or 0  # highest seq the sink has taken
        self._seen = self.committed  # highest seq received (buffered or committed)
        self._buffer: list[Frame] = []
        self._buffer_bytes = 0
        self._oldest_at = 0.0
        self._flush_lock = asyncio.Lock()
        self._stopping = False
        self._aborted = False
        self._ws: ClientConnection | None = None
        self._reconnect_reason: str | None = None
        self._backoff = Backoff(settings.reconnect_base_s, settings.reconnect_cap_s,
                                rng or random.Random())
        self._malformed_log = _RateLimited(clock)
        self._control = asyncio.Event()  # wakes the control task (close, timed flush)
        self._wake = asyncio.Event()  # ends a reconnect backoff early
        self._on_delivered = on_delivered
        self.connected = False

    @property
    def stream(self) -> str:
        return self.tenure.stream_id

    # -- control from the supervisor ------------------------------------------------------

    async def stop(self) -> None:
        """Graceful: stop reading; ``run`` then flushes what it holds and returns.

        Never waits for the connection to close: the pump's own control task does that,
        so a caller (the heartbeat loop) is not held up by a slow close handshake."""
        self._stopping = True
        self._wake.set()
        self._control.set()

    async def abort(self) -> None:
        """Ownership is gone: stop reading and start no new write. A write already in
        flight is left to finish: it was sent, so the sink decides it either way, and its
        answer (accepted before the takeover, or refused as stale) is worth knowing."""
        self._aborted = True
        await self.stop()

    async def reconnect(self, reason: str) -> None:
        """Close the connection; ``run`` flushes and connects again (e.g. a new URL)."""
        self._reconnect_reason = reason
        self._wake.set()
        self._control.set()

    def _closing(self) -> bool:
        return self._stopping or self._reconnect_reason is not None

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Read until stopped. Raises StaleFence, SelfFenced or SinkConflict when the
        tenure can no longer write; the supervisor handles those."""
        try:
            async with asyncio.TaskGroup() as tg:
                flusher = tg.create_task(self._control_loop())
                try:
                    await self._connect_loop()
                    await self.flush()
                finally:
                    flusher.cancel()
        except ExceptionGroup as group:
            raise group.exceptions[0] from group

    async def _connect_loop(self) -> None:
        while not self._stopping:
            url = with_from_seq(self.holding.ws_url, self.committed + 1)
            asked = self.committed + 1
            started = self.clock.monotonic()
            reason = await self._one_connection(url, asked)
            await self.flush()
            if self._stopping:
                return
            reason = self._reconnect_reason or reason
            self._reconnect_reason = None
            self.metrics.reconnect(reason)
            if reason == "url_changed" or self.clock.monotonic() - started > \
                    self.settings.stable_after_s:
                self._backoff.reset()
            delay = 0.0 if reason == "url_changed" else self._backoff.next_delay()
            event(logging.INFO, "pump.reconnect", "reconnecting to upstream",
                  stream=self.stream, fence=self.tenure.fence, reason=reason,
                  delay_s=round(delay, 3), from_seq=self.committed + 1)
            await self._sleep_unless_stopping(delay)

    async def _one_connection(self, url: str, asked: int) -> str:
        try:
            ws = await connect(
                url, compression=None, max_size=self.settings.max_frame_bytes,
                open_timeout=self.settings.open_timeout_s, close_timeout=2,
                max_queue=64, proxy=None, ping_interval=20, ping_timeout=20,
            )
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError, ValueError) as exc:
            event(logging.WARNING, "pump.connect_failed", "cannot connect to upstream",
                  stream=self.stream, fence=self.tenure.fence, url=redact(url),
                  error=_describe(exc))
            return "connect_failed"
        if self._closing():
            # Stopped, or the URL changed, while the handshake was in flight.
            await ws.close()
            return "closed"
        self._ws = ws
        self.connected = True
        self.metrics.upstream_connected(1)
        event(logging.INFO, "pump.connected", "connected to upstream", stream=self.stream,
              fence=self.tenure.fence, url=redact(url), from_seq=asked)
        first = True
        try:
            async for data in ws:
                if self._closing():
                    # Closing: keep reading (and drop) until the close handshake ends, or
                    # a backlog queued behind it would stall the close for close_timeout.
                    # Nothing is lost: the next connection asks for committed + 1.
                    continue
                frame = parse_frame(data)
                if isinstance(frame, Malformed):
                    self._on_malformed(frame, data)
                    continue
                if frame.seq <= self._seen:
                    self.metrics.duplicate()
                    continue
                if first and frame.seq > asked:
                    self.metrics.gap()
                    event(logging.WARNING, "pump.gap", "upstream skipped sequence numbers",
                          stream=self.stream, fence=self.tenure.fence, asked=asked,
                          got=frame.seq, missing=frame.seq - asked)
                first = False
                await self._add(frame)
            return "closed"
        except ConnectionClosedOK:
            return "closed"
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else (exc.sent.code if exc.sent else None)
            event(logging.INFO, "pump.disconnected", "upstream connection closed",
                  stream=self.stream, fence=self.tenure.fence, code=code,
                  reason=(exc.rcvd.reason if exc.rcvd else "")[:200], after_seq=self._seen)
            if code == CloseCode.MESSAGE_TOO_BIG:
                event(logging.ERROR, "pump.frame_too_big",
                      "upstream frame exceeds STREAMLEASE_MAX_FRAME_BYTES",
                      stream=self.stream, fence=self.tenure.fence,
                      limit=self.settings.max_frame_bytes, after_seq=self._seen)
                return "too_big"
            return "error"
        finally:
            self.connected = False
            self.metrics.upstream_connected(-1)
            self._ws = None
            with contextlib.suppress(Exception):
                await ws.close()

    def _on_malformed(self, frame: Malformed, data: str | bytes) -> None:
        self.metrics.malformed()
        suppressed = self._malformed_log.allow()
        if suppressed is not None:
            event(logging.WARNING, "pump.malformed_frame", "dropped a malformed upstream frame",
                  stream=self.stream, fence=self.tenure.fence, reason=frame.reason,
                  size=len(data), after_seq=self._seen, suppressed_since_last=suppressed)

    async def _add(self, frame: Frame) -> None:
        if not self._buffer:
            self._oldest_at = self.clock.monotonic()
        self._buffer.append(frame)
        self._buffer_bytes += len(frame.text)
        self._seen = frame.seq
        if (len(self._buffer) >= self.settings.batch_max_messages
                or self._buffer_bytes >= self.settings.batch_max_bytes):
            await self.flush()  # backpressure: no reading while a full batch is written

    async def _control_loop(self) -> None:
        """Close the connection when asked, and flush a batch that waited long enough.

        The event is only a hint: it is cleared first and the state checked after, so a
        request made while this task was busy is never missed."""
        period = self.settings.batch_max_s
        closed: ClientConnection | None = None
        while True:
            self._control.clear()
            ws = self._ws
            if ws is not None and ws is not closed and self._closing():
                closed = ws
                await ws.close()
                continue
            if self._buffer and self.clock.monotonic() - self._oldest_at >= period:
                await self.flush()
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(period / 2):
                    await self._control.wait()

    async def flush(self) -> None:
        """Write what is buffered now, in order, one transaction per batch.

        Frames that arrive while this runs wait for the next trigger (size, age, stop):
        chasing them would turn one timed flush into a stream of tiny transactions."""
        async with self._flush_lock:
            pending = len(self._buffer)
            while pending > 0 and self._buffer and not self._aborted:
                # The reader keeps appending while this batch is written: remove exactly
                # the frames written, never "the first N", or later arrivals are lost.
                batch = self._buffer[:min(pending, self.settings.batch_max_messages)]
                await self._write(batch)
                del self._buffer[:len(batch)]
                pending -= len(batch)
                self._buffer_bytes -= sum(len(f.text) for f in batch)
                self._oldest_at = self.clock.monotonic()

    async def _write(self, batch: list[Frame]) -> None:
        """One batch, retried on throttling and unknown outcomes until the deadline."""
        retry = Backoff(0.05, max(0.1, self.holding.timings.heartbeat_s))
        started = self.clock.monotonic()
        while True:
            now = self.clock.monotonic()
            if self._aborted or not self.holding.may_write(now):
                raise SelfFenced(f"stream {self.stream}: this tenure may not write any more")
            try:
                await self.sink.write_batch(self.tenure, self.committed, batch,
                                            self.clock.wall_ms(),
                                            timeout=self.settings.call_timeout_s)
            except (StoreThrottled, StoreUnavailable) as exc:
                delay = min(retry.next_delay(), max(0.0, self.holding.deadline - now))
                event(logging.WARNING, "sink.retry", "sink write failed; retrying",
                      stream=self.stream, fence=self.tenure.fence, error=str(exc),
                      delay_s=round(delay, 3), batch=len(batch))
                await self.clock.sleep(delay)
                continue
            self.committed = batch[-1].seq
            self.metrics.sink_batch(self.clock.monotonic() - started)
            self.metrics.delivered(len(batch))
            if self._on_delivered is not None:
                self._on_delivered(len(batch))
            return

    async def _sleep_unless_stopping(self, delay: float) -> None:
        self._wake.clear()
        if self._stopping or delay <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await _wait_event(self._wake, delay)


async def _wait_event(ev: asyncio.Event, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        await ev.wait()


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]

