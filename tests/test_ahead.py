"""A pump given a connection opened ahead of its tenure (the taker's side of a hand-over,
``streamlease.ahead``), against the reference upstream on 127.0.0.1.

The connection asked for the item's ``last_seq + 1`` as read before the take; the holder
may have delivered more until the take landed. What the connection replays up to the
tenure's ``last_seq`` is dropped quietly (no duplicate verdict, no metric, no log), and
delivery goes on from ``last_seq + 1`` with neither a gap nor a duplicate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from websockets.protocol import State

from streamlease.ahead import Ahead, dial_ahead
from streamlease.clock import SYSTEM_CLOCK
from streamlease.core.lease import Holding
from streamlease.core.model import StreamRecord, Tenure
from streamlease.core.urls import parse_allowed_urls
from streamlease.dev.upstream import DEFAULT_MODE, UpstreamOptions, UpstreamServer, frame_for
from streamlease.metrics import Metrics
from streamlease.pump import Pump, PumpSettings
from streamlease.supervisor import SupervisorSettings
from tests.fakes import context
from tests.test_pump import LONG, FakeSink, contiguous, run_until, until, value

LOOPBACK = parse_allowed_urls("ws://127.0.0.1")
PUMP = PumpSettings(batch_max_messages=50, batch_max_s=0.05, reconnect_base_s=0.02,
                    reconnect_cap_s=0.1, allowed_urls=LOOPBACK, open_timeout_s=2.0)
SETTINGS = SupervisorSettings(timings=LONG, allowed_urls=LOOPBACK, pump=PUMP)


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streamlease")


def pump_events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [str(getattr(r, "sl_event", "")) for r in caplog.records
            if str(getattr(r, "sl_event", "")).startswith("pump.")]


async def ahead_of(up: UpstreamServer, read_last_seq: int | None) -> Ahead:
    """The taker's dial, from the item as it read it before the take."""
    record = StreamRecord("s001", "STARTED", up.url_for("s001"), lease_owner="w1",
                          lease_expires_at_ms=1, fence=1, last_seq=read_last_seq)
    return await dial_ahead(SETTINGS, record)


def handed_pump(sink: FakeSink, ahead: Ahead, taken_last_seq: int | None,
                url: str) -> tuple[Pump, Metrics]:
    """The pump of the tenure the take returned (fence 2, the item's last_seq then)."""
    tenure = Tenure("s001", "w2", 2, taken_last_seq, 0)
    holding = Holding(tenure, url, SYSTEM_CLOCK.monotonic(), LONG)
    metrics = Metrics()
    pump = Pump(context(sink, metrics=metrics), holding, PUMP, ahead=ahead)
    sink.pump = pump
    return pump, metrics


def opened(up: UpstreamServer) -> int:
    return int(up.stats()["modes"][DEFAULT_MODE]["opened"])


@pytest.fixture
async def upstream() -> AsyncIterator[UpstreamServer]:
    async with UpstreamServer(UpstreamOptions(streams=1, rate=200.0, initial_backlog=100)) as up:
        yield up


@pytest.mark.parametrize(("read", "taken"), [
    (10, 40),  # the holder delivered 11..40 while the connection opened
    (10, 10),  # it delivered nothing more: nothing to drop
    (None, 25),  # never written when read; 1..25 delivered before the take
    (None, None),  # never written at all: from the first frame
])
async def test_what_the_connection_replays_up_to_the_take_is_dropped_quietly(
        upstream: UpstreamServer, caplog: pytest.LogCaptureFixture,
        read: int | None, taken: int | None) -> None:
    ahead = await ahead_of(upstream, read)
    sink = FakeSink()
    pump, metrics = handed_pump(sink, ahead, taken, upstream.url_for("s001"))
    first = (taken or 0) + 1
    await run_until(pump, lambda: len(sink.seqs) >= 100)
    assert sink.seqs[0] == first and contiguous(sink.seqs, first)
    assert sink.prevs[0] == (taken or 0)
    assert all(f.text == frame_for("s001", f.seq) for b in sink.batches for f in b)
    assert value(metrics, "streamlease_duplicate_frames_total") == 0
    assert value(metrics, "streamlease_sequence_gaps_total") == 0
    assert value(metrics, "streamlease_messages_delivered_total") == len(sink.seqs)
    assert "pump.duplicate_frame" not in pump_events(caplog)
    assert "pump.gap" not in pump_events(caplog)
    # Served from the connection opened ahead: the pump dialled none of its own.
    assert opened(upstream) == 1


async def test_frames_that_came_during_the_opening_exchange_are_delivered_first(
        upstream: UpstreamServer) -> None:
    """A wire whose opening exchange also carried data frames kept them in ``frames``:
    they come before what the connection reads next, dropped up to the take as well."""
    ahead = await ahead_of(upstream, 15)  # the connection reads 16 onwards
    ahead.frames.extend(frame_for("s001", i) for i in range(11, 16))
    sink = FakeSink()
    pump, metrics = handed_pump(sink, ahead, 12, upstream.url_for("s001"))
    await run_until(pump, lambda: len(sink.seqs) >= 50)
    assert sink.seqs[0] == 13 and contiguous(sink.seqs, 13)
    assert value(metrics, "streamlease_duplicate_frames_total") == 0
    assert value(metrics, "streamlease_sequence_gaps_total") == 0


async def test_a_replay_past_the_take_is_still_a_duplicate_and_counted(
        upstream: UpstreamServer) -> None:
    """Only the replay that leads up to the take is quiet: once the connection passed
    ``last_seq``, a frame at or below what was received is a duplicate as ever."""
    ahead = await ahead_of(upstream, 10)
    ahead.frames.extend(frame_for("s001", i) for i in (20, 21, 22, 21))
    sink = FakeSink()
    pump, metrics = handed_pump(sink, ahead, 19, upstream.url_for("s001"))
    await run_until(pump, lambda: len(sink.seqs) >= 30)
    assert sink.seqs[:3] == [20, 21, 22]
    # The repeated 21, and the connection's own 11..22 (after 20 arrived, 11..19 are no
    # longer the replay up to the take): every one counted.
    assert value(metrics, "streamlease_duplicate_frames_total") == 1 + 12
    assert contiguous(sink.seqs, 20)


async def test_a_reconnect_after_the_connection_opened_ahead_dials_from_what_was_delivered(
        upstream: UpstreamServer) -> None:
    ahead = await ahead_of(upstream, 10)
    sink = FakeSink()
    pump, metrics = handed_pump(sink, ahead, 30, upstream.url_for("s001"))
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pump.run())
        await until(lambda: len(sink.seqs) >= 20)
        assert upstream.drop("s001") == 1
        n = len(sink.seqs)
        await until(lambda: len(sink.seqs) >= n + 50)
        await pump.stop()
        await task
    assert sink.seqs[0] == 31 and contiguous(sink.seqs, 31)
    assert opened(upstream) == 2
    assert value(metrics, "streamlease_duplicate_frames_total") == 0
    assert value(metrics, "streamlease_sequence_gaps_total") == 0


async def test_a_pump_stopped_before_its_first_connection_closes_the_one_opened_ahead(
        upstream: UpstreamServer) -> None:
    ahead = await ahead_of(upstream, 10)
    sink = FakeSink()
    pump, _ = handed_pump(sink, ahead, 10, upstream.url_for("s001"))
    await pump.stop()
    async with asyncio.timeout(5):
        await pump.run()
    assert pump.session.ahead is None and sink.batches == []
    # Closed by the pump, not left to the upstream's or the kernel's timeouts.
    assert ahead.ws.state in (State.CLOSING, State.CLOSED)
    await until(lambda: ahead.ws.state is State.CLOSED, timeout=1.0)
    await until(lambda: upstream.stats()["streams"]["s001"]["connections"] == 0, timeout=1.0)
