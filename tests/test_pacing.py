"""Sink pacing: the cap on sink transactions in flight follows member heartbeat health,
waiters are served in order, and a wait that times out or is cancelled leaks no place."""

from __future__ import annotations

import asyncio

import pytest

from streamlease.core.membership import HeartbeatOutcome
from streamlease.errors import StoreUnavailable
from streamlease.metrics import Metrics
from streamlease.pacing import PacedSink, SinkGate

pytestmark = pytest.mark.virtual_time

OK, SLOW = 0.01, 0.5


def test_slow_or_unanswered_heartbeats_halve_the_cap_and_healthy_ones_restore_it() -> None:
    metrics = Metrics()
    gate = SinkGate(100, slow_s=0.1, metrics=metrics)
    assert gate.limit == 100
    gate.heartbeat(HeartbeatOutcome.RENEWED, SLOW)
    gate.heartbeat(HeartbeatOutcome.UNKNOWN, OK)
    gate.heartbeat(HeartbeatOutcome.THROTTLED, OK)
    assert gate.limit == 12
    for _ in range(10):
        gate.heartbeat(HeartbeatOutcome.RENEWED, SLOW)
    assert gate.limit == 1  # never below one: the sink still moves
    gate.heartbeat(HeartbeatOutcome.FENCED, SLOW)
    assert gate.limit == 1  # a fenced member says nothing about the store
    for _ in range(10):
        gate.heartbeat(HeartbeatOutcome.RENEWED, OK)
    assert gate.limit == 100  # never above the ceiling
    assert metrics.registry.get_sample_value("streamlease_sink_in_flight_limit") == 100


async def test_waiters_are_served_in_order_when_places_free() -> None:
    gate = SinkGate(4, slow_s=0.1)
    gate.heartbeat(HeartbeatOutcome.RENEWED, SLOW)  # limit 2
    await gate.acquire(None)
    await gate.acquire(None)
    served: list[int] = []

    async def wait(n: int) -> None:
        await gate.acquire(None)
        served.append(n)

    waiters = [asyncio.create_task(wait(n)) for n in range(3)]
    await asyncio.sleep(0.1)
    assert served == [] and gate.in_flight == 2
    gate.release()
    await asyncio.sleep(0.01)
    assert served == [0]
    gate.heartbeat(HeartbeatOutcome.RENEWED, OK)  # limit 4: both others go at once
    await asyncio.gather(*waiters)
    assert served == [0, 1, 2] and gate.in_flight == 4


async def test_a_wait_that_times_out_or_is_cancelled_keeps_no_place() -> None:
    gate = SinkGate(2, slow_s=0.1)
    gate.heartbeat(HeartbeatOutcome.RENEWED, SLOW)  # limit 1
    await gate.acquire(None)
    with pytest.raises(StoreUnavailable, match="sink paced"):
        await gate.acquire(1.0)
    cancelled = asyncio.create_task(gate.acquire(None))
    await asyncio.sleep(0.1)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    gate.release()
    assert gate.in_flight == 0
    await asyncio.wait_for(gate.acquire(None), 1.0)  # the place is free for the next
    assert gate.in_flight == 1


class SlowSink:
    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    async def write_batch(self, tenure: object, prev_seq: int, frames: list[object],
                          now_wall_ms: int, timeout: float | None = None) -> str:
        self.timeouts.append(timeout)
        await asyncio.sleep(1.0)
        return "committed"

    async def newest_event(self, stream_id: str, timeout: float | None = None) -> None:
        return None

    async def settle(self, tenure: object, timeout: float | None = None) -> None:
        return None


async def test_the_time_spent_waiting_comes_out_of_the_calls_timeout() -> None:
    inner = SlowSink()
    gate = SinkGate(2, slow_s=0.1)
    gate.heartbeat(HeartbeatOutcome.RENEWED, SLOW)  # limit 1
    sink = PacedSink(inner, gate)  # type: ignore[arg-type]
    first = asyncio.create_task(
        sink.write_batch(None, 0, [], 0, timeout=5.0))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    await sink.write_batch(None, 0, [], 0, timeout=5.0)  # type: ignore[arg-type]
    await first
    assert inner.timeouts[0] == pytest.approx(5.0)
    assert inner.timeouts[1] == pytest.approx(4.01)  # waited for the first to finish
    assert gate.in_flight == 0
