"""Sink pacing: the sink never crowds the lease control plane out of the store.

Every held stream may have one sink transaction in flight, so a worker with 100 streams
can queue 100 requests at a store that has slowed down, and its member heartbeat waits
behind them until it misses its deadline: every stream then stops, and overload turns
into churn. The gate caps the sink transactions in flight per worker and steers the cap
by the health of the member heartbeat, the call that must not be late:

* a heartbeat slower than a quarter of the heartbeat interval, or one whose outcome is
  unknown or throttled, halves the cap (down to one);
* a healthy heartbeat doubles it (up to the number of streams the worker may hold).

On a healthy store the cap sits at its ceiling and changes nothing. On a saturated one,
delivery slows (the pump stops reading while its batch waits, so the upstream buffers)
while heartbeats, renewals and releases keep their place in the queue.
"""

from __future__ import annotations

import asyncio
from collections import deque

from streamlease.core.frames import Frame
from streamlease.core.membership import HeartbeatOutcome
from streamlease.core.model import EventMark, StreamRecord, Tenure
from streamlease.errors import StoreUnavailable
from streamlease.metrics import Metrics
from streamlease.store.protocols import Sink, SinkOutcome
from streamlease.strain import Strain


class SinkGate:
    """At most ``limit`` sink transactions in flight; the limit follows heartbeat health.
    Waiters are served first come, first served."""

    def __init__(self, ceiling: int, slow_s: float, metrics: Metrics | None = None) -> None:
        self.ceiling = max(1, ceiling)
        self.strain = Strain(None, slow_s)  # each heartbeat judged on its own
        self.limit = self.ceiling
        self.in_flight = 0
        self._metrics = metrics
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._publish()

    def heartbeat(self, outcome: HeartbeatOutcome, seconds: float) -> None:
        """A member heartbeat's outcome and latency: halve or double the limit."""
        if outcome is HeartbeatOutcome.FENCED:
            return  # says nothing about the store's speed
        if self.strain.record(outcome, seconds):
            self.limit = max(1, self.limit // 2)
        else:
            self.limit = min(self.ceiling, self.limit * 2)
        self._publish()
        self._wake()

    async def acquire(self, timeout: float | None) -> None:
        """Take a place; StoreUnavailable if none frees within ``timeout``."""
        if self.in_flight < self.limit and not self._waiters:
            self.in_flight += 1
            return
        place: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(place)
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(place)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if place.done():
                self.release()  # given a place just as the wait ended: hand it on
            else:
                place.cancel()
                self._waiters.remove(place)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise StoreUnavailable(
                f"sink paced: {self.in_flight} transactions in flight at a limit of "
                f"{self.limit} (member heartbeats are slow)") from None

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.limit:
            place = self._waiters.popleft()
            self.in_flight += 1
            place.set_result(None)

    def _publish(self) -> None:
        if self._metrics is not None:
            self._metrics.sink_limit(self.limit)


class PacedSink:
    """A ``Sink`` whose writes pass through a ``SinkGate``; reads pass straight on."""

    def __init__(self, inner: Sink, gate: SinkGate, metrics: Metrics | None = None,
                 kind: str = "dynamodb") -> None:
        self.inner = inner
        self.gate = gate
        self.metrics = metrics
        self.kind = kind  # the sink-labelled metrics' label

    async def write_batch(self, tenure: Tenure, prev_seq: int, frames: list[Frame],
                          now_wall_ms: int, timeout: float | None = None) -> SinkOutcome:
        loop = asyncio.get_running_loop()
        started = loop.time()
        await self.gate.acquire(timeout)
        ok = False
        attempt = loop.time()
        try:
            left = None if timeout is None else max(0.001, timeout - (loop.time() - started))
            outcome = await self.inner.write_batch(tenure, prev_seq, frames, now_wall_ms,
                                                   timeout=left)
            ok = True
            return outcome
        finally:
            self.gate.release()
            if self.metrics is not None:
                self.metrics.sink_attempt(self.kind, len(frames), loop.time() - attempt, ok)

    async def newest_event(self, stream_id: str,
                           timeout: float | None = None) -> EventMark | None:
        return await self.inner.newest_event(stream_id, timeout=timeout)

    async def open(self, tenure: Tenure, record: StreamRecord) -> int:
        return await self.inner.open(tenure, record)

    async def close(self, tenure: Tenure, reason: str) -> None:
        await self.inner.close(tenure, reason)

    async def settle(self, tenure: Tenure, timeout: float | None = None) -> None:
        await self.inner.settle(tenure, timeout)
