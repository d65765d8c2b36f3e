"""The pump against a real loopback upstream and a sink that can be slow or refuse."""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosedOK
from websockets.frames import Close

import streamlease.dial
from streamlease.app import build_settings
from streamlease.clock import SYSTEM_CLOCK
from streamlease.config import WorkerConfig
from streamlease.core.frames import Frame
from streamlease.core.lease import Holding, LeaseTimings
from streamlease.core.model import Tenure
from streamlease.core.urls import parse_allowed_urls
from streamlease.dev.upstream import POISON_SEQ, UpstreamOptions, UpstreamServer, frame_for
from streamlease.dial import DialOptions
from streamlease.errors import SelfFenced, StaleFence, StoreUnavailable
from streamlease.metrics import Metrics
from streamlease.pump import Pump, PumpSettings
from tests.fakes import context
from tests.virtual import LoopClock

LONG = LeaseTimings(lease_s=60, heartbeat_s=5, skew_margin_s=1, safety_margin_s=2)


class FakeSink:
    """Records what it is given; can be slow, or refuse as a stale fence."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.batches: list[list[Frame]] = []
        self.prevs: list[int] = []
        self.stale = False
        self.buffer_sizes: list[int] = []
        self.pump: Pump | None = None
        self.calls = 0

    async def settle(self, tenure: Tenure, timeout: float | None = None) -> None:
        return None  # each batch is done when write_batch returns

    async def write_batch(self, tenure: Tenure, prev_seq: int, frames: list[Frame],
                          now_wall_ms: int, timeout: float | None = None) -> Any:
        self.calls += 1
        if self.pump is not None:
            self.buffer_sizes.append(self.pump.machine.held_frames)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.stale:
            raise StaleFence("fence moved on")
        self.prevs.append(prev_seq)
        self.batches.append(list(frames))
        return None

    @property
    def seqs(self) -> list[int]:
        return [f.seq for b in self.batches for f in b]


def make_pump(url: str, sink: FakeSink, last_seq: int | None = None,
              timings: LeaseTimings = LONG, sent_at: float | None = None,
              on_problem: Any = None, **settings: Any) -> tuple[Pump, Metrics]:
    tenure = Tenure("s001", "w1", 1, last_seq, 0)
    holding = Holding(tenure, url, SYSTEM_CLOCK.monotonic() if sent_at is None else sent_at,
                      timings)
    metrics = Metrics()
    defaults: dict[str, Any] = {"batch_max_messages": 50, "batch_max_s": 0.05,
                                "reconnect_base_s": 0.02, "reconnect_cap_s": 0.1,
                                "allowed_urls": parse_allowed_urls("ws://127.0.0.1")}
    defaults.update(settings)
    pump = Pump(context(sink, metrics=metrics), holding, PumpSettings(**defaults),
                on_problem=on_problem)
    sink.pump = pump
    return pump, metrics


def value(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels or None) or 0.0


async def until(check: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():  # noqa: ASYNC110 - a poll with a deadline on outside state
            await asyncio.sleep(0.01)


@pytest.fixture
async def upstream() -> AsyncIterator[UpstreamServer]:
    async with UpstreamServer(UpstreamOptions(streams=2, rate=200.0)) as up:
        yield up


async def run_until(pump: Pump, check: Any, timeout: float = 10.0) -> None:
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pump.run())
        try:
            await until(check, timeout)
        finally:
            await pump.stop()
            async with asyncio.timeout(5):  # a drain must never hang
                await asyncio.shield(task)


def contiguous(seqs: list[int], first: int) -> bool:
    return seqs == list(range(first, first + len(seqs)))


async def test_resumes_from_last_seq_plus_one_in_order(upstream: UpstreamServer) -> None:
    sink = FakeSink()
    pump, metrics = make_pump(upstream.url_for("s001"), sink, last_seq=10)
    await run_until(pump, lambda: len(sink.seqs) >= 120)
    assert sink.seqs[0] == 11 and contiguous(sink.seqs, 11)
    assert all(f.text == frame_for("s001", f.seq) for b in sink.batches for f in b)
    assert sink.prevs[0] == 10 and pump.committed == sink.seqs[-1]
    assert value(metrics, "streamlease_messages_delivered_total") == len(sink.seqs)
    assert max(len(b) for b in sink.batches) <= 50


async def test_a_slow_sink_stops_the_reading_instead_of_buffering() -> None:
    async with UpstreamServer(UpstreamOptions(streams=1, rate=1.0, initial_backlog=5_000)) as up:
        sink = FakeSink(delay=0.05)
        pump, _ = make_pump(up.url_for("s001"), sink, batch_max_messages=100)
        await run_until(pump, lambda: sink.calls >= 15)
    # 5,000 frames were ready at once and the sink took 100 per 50 ms: the pump held at
    # most a batch being written plus one being filled; the rest waited in the socket.
    assert max(sink.buffer_sizes) <= 2 * 100
    assert contiguous(sink.seqs, 1)


async def test_a_gap_is_counted_and_logged_never_hidden() -> None:
    options = UpstreamOptions(streams=1, rate=1.0, initial_backlog=200, retention=50)
    async with UpstreamServer(options) as up:
        sink = FakeSink()
        pump, metrics = make_pump(up.url_for("s001"), sink, last_seq=0)
        await run_until(pump, lambda: len(sink.seqs) >= 50)
    assert sink.seqs[0] == 151 and contiguous(sink.seqs, 151)
    assert value(metrics, "streamlease_sequence_gaps_total") == 1


async def test_hostile_frames_are_dropped_and_counted(upstream: UpstreamServer) -> None:
    for kind in ("notjson", "noseq", "badseq", "binary", "array"):
        upstream.inject_malformed("s001", 1, kind)
    sink = FakeSink()
    pump, metrics = make_pump(upstream.url_for("s001"), sink)
    await run_until(pump, lambda: len(sink.seqs) >= 100)
    assert contiguous(sink.seqs, 1)
    assert value(metrics, "streamlease_malformed_frames_total") == 5


async def test_reconnects_after_a_drop_without_gap_or_duplicate(upstream: UpstreamServer) -> None:
    sink = FakeSink()
    pump, metrics = make_pump(upstream.url_for("s001"), sink)

    async def drops() -> None:
        for _ in range(3):
            await until(lambda: pump.connected)
            assert upstream.drop("s001") == 1
            await until(lambda: not pump.connected)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pump.run())
        await drops()
        n = len(sink.seqs)
        await until(lambda: len(sink.seqs) >= n + 100)
        await pump.stop()
        await task
    assert contiguous(sink.seqs, 1)
    assert value(metrics, "streamlease_upstream_reconnects_total", reason="error") == 3
    assert value(metrics, "streamlease_sequence_gaps_total") == 0


async def test_past_the_local_deadline_nothing_is_written(upstream: UpstreamServer) -> None:
    sink = FakeSink()
    short = LeaseTimings(lease_s=0.3, heartbeat_s=0.05, skew_margin_s=0.05, safety_margin_s=0.05)
    pump, _ = make_pump(upstream.url_for("s001"), sink, timings=short,
                        sent_at=SYSTEM_CLOCK.monotonic() - 1.0)
    with pytest.raises(SelfFenced):  # a plain exception, not a group
        async with asyncio.timeout(5):
            await pump.run()
    assert sink.batches == []


async def test_a_stale_fence_stops_the_pump_after_one_refused_batch(
        upstream: UpstreamServer) -> None:
    sink = FakeSink()
    sink.stale = True
    pump, _ = make_pump(upstream.url_for("s001"), sink)
    with pytest.raises(StaleFence):  # a plain exception, not a group
        async with asyncio.timeout(5):
            await pump.run()
    assert sink.calls == 1 and sink.batches == []


async def test_abort_writes_nothing_more(upstream: UpstreamServer) -> None:
    sink = FakeSink(delay=0.1)
    pump, _ = make_pump(upstream.url_for("s001"), sink, batch_max_messages=10)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pump.run())
        await until(lambda: sink.calls >= 1)
        await pump.abort()
        async with asyncio.timeout(5):
            await task
    assert sink.calls == 1  # the write in flight finished; no new one started, no flush


async def test_a_frame_over_the_size_cap_is_reported_and_retried_with_backoff() -> None:
    async def handler(ws: ServerConnection) -> None:
        await ws.send('{"seq": 1, "pad": "' + "x" * 4000 + '"}')
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        sink = FakeSink()
        pump, metrics = make_pump(f"ws://127.0.0.1:{port}/", sink, max_frame_bytes=1024)
        await run_until(pump, lambda: value(
            metrics, "streamlease_upstream_reconnects_total", reason="too_big") >= 2)
    assert sink.batches == []


async def test_stop_during_a_fast_backlog_drains_quickly() -> None:
    async with UpstreamServer(UpstreamOptions(streams=1, rate=1.0, initial_backlog=200_000)) as up:
        sink = FakeSink()
        pump, _ = make_pump(up.url_for("s001"), sink, batch_max_messages=200)
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(pump.run())
            await until(lambda: len(sink.seqs) >= 1000)
            await pump.stop()
            async with asyncio.timeout(1.5):  # well under websockets' close_timeout path
                await task
    assert contiguous(sink.seqs, 1) and pump.committed == sink.seqs[-1]
    assert pump.machine.held_frames == 0


async def test_stop_behind_a_slow_sink_reads_no_further() -> None:
    """Stopping mid-backlog while a slow write is in flight: the pump drops what arrives
    during the close instead of buffering and writing it (that would hold the close
    handshake up for websockets' close_timeout)."""
    async with UpstreamServer(UpstreamOptions(streams=1, rate=1.0, initial_backlog=100_000)) as up:
        sink = FakeSink(delay=0.3)
        pump, _ = make_pump(up.url_for("s001"), sink, batch_max_messages=200)
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(pump.run())
            await until(lambda: sink.calls >= 2)
            calls_at_stop = sink.calls
            await pump.stop()
            async with asyncio.timeout(10):
                await task
    # The write in flight, then one final flush of what was buffered before the stop.
    assert sink.calls <= calls_at_stop + 2
    assert contiguous(sink.seqs, 1)


async def test_a_url_change_reconnects_to_the_new_url(upstream: UpstreamServer) -> None:
    sink = FakeSink()
    pump, metrics = make_pump(upstream.url_for("s001"), sink)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pump.run())
        await until(lambda: len(sink.seqs) >= 20)
        pump.holding.ws_url = upstream.url_for("s002")
        await pump.reconnect("url_changed")
        await until(lambda: any("s002" in f.text for b in sink.batches for f in b))
        await pump.stop()
        await task
    assert value(metrics, "streamlease_upstream_reconnects_total", reason="url_changed") == 1
    assert contiguous(sink.seqs, 1)  # the new URL resumes from committed + 1


# -- sequence numbers: poisoned, reset ------------------------------------------------------


async def test_a_poisoned_seq_is_refused_and_the_stream_goes_on(
        upstream: UpstreamServer) -> None:
    """A frame with seq 2**63-1 used to be committed, after which every real frame was
    dropped as a duplicate, silently and for good."""
    upstream.inject_malformed("s001", 1, "poison")
    sink = FakeSink()
    pump, metrics = make_pump(upstream.url_for("s001"), sink)
    await run_until(pump, lambda: len(sink.seqs) >= 100)
    assert contiguous(sink.seqs, 1) and POISON_SEQ not in sink.seqs
    assert value(metrics, "streamlease_malformed_frames_total") == 1
    assert value(metrics, "streamlease_duplicate_frames_total") == 0


async def test_an_upstream_that_reset_its_numbering_is_reported_once_and_cleared(
        caplog: pytest.LogCaptureFixture) -> None:
    """Only duplicates for stall_s: one report through on_problem, the gauge, a warning;
    none per frame; the first frame delivered clears it."""
    resume = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        seq = 0
        while not resume.is_set():  # numbering restarted at 1, below last_seq = 1000
            seq += 1
            await ws.send(f'{{"seq": {seq}}}')
            await asyncio.sleep(0.005)
        for seq in (1001, 1002):
            await ws.send(f'{{"seq": {seq}}}')
        await ws.wait_closed()

    reports: list[str | None] = []
    async with serve(handler, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        sink = FakeSink()
        pump, metrics = make_pump(f"ws://127.0.0.1:{port}/", sink, last_seq=1000,
                                  on_problem=reports.append, stall_s=0.3)
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(pump.run())
            await until(lambda: len(reports) >= 1)
            stalled = value(metrics, "streamlease_stalled_streams")
            await until(lambda: value(metrics, "streamlease_duplicate_frames_total") >= 100)
            assert len(reports) == 1  # once per change, not per frame
            resume.set()
            await until(lambda: sink.seqs == [1001, 1002])
            await pump.stop()
            await task
    assert stalled == 1 and value(metrics, "streamlease_stalled_streams") == 0
    assert len(reports) == 2 and reports[1] is None
    assert reports[0] is not None and "duplicates" in reports[0] and "1000" in reports[0]
    warnings = [r for r in caplog.records if getattr(r, "sl_event", "") == "pump.stalled"]
    assert len(warnings) == 1
    duplicate_logs = [r for r in caplog.records
                      if getattr(r, "sl_event", "") == "pump.duplicate_frame"]
    assert 1 <= len(duplicate_logs) < 10  # counted every time, logged rate-limited


# -- memory: bounded batches, a small receive queue, one task per stream ----------------------


async def test_a_batch_never_exceeds_the_byte_cap_and_reading_waits_for_the_sink() -> None:
    pad = "x" * 9_000

    async def handler(ws: ServerConnection) -> None:
        for seq in range(1, 200):
            await ws.send(f'{{"seq": {seq}, "pad": "{pad}"}}')
        await ws.wait_closed()

    held: list[int] = []
    async with serve(handler, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        sink = FakeSink(delay=0.01)
        pump, _ = make_pump(f"ws://127.0.0.1:{port}/", sink, batch_max_bytes=50_000)
        original = sink.write_batch

        async def sampling(*args: Any, **kwargs: Any) -> Any:
            held.append(pump.machine.held_bytes)
            return await original(*args, **kwargs)
        sink.write_batch = sampling  # type: ignore[method-assign]
        await run_until(pump, lambda: len(sink.seqs) >= 150)
    assert contiguous(sink.seqs, 1)
    assert all(sum(sys.getsizeof(f.text) for f in b) <= 50_000 for b in sink.batches)
    # What the pump holds while a batch is written: that batch and the one frame that did
    # not fit in it; nothing is read meanwhile.
    frame_size = sys.getsizeof(f'{{"seq": 100, "pad": "{pad}"}}')
    assert max(held) <= 50_000 + frame_size


async def test_the_receive_queue_is_small(monkeypatch: pytest.MonkeyPatch,
                                          upstream: UpstreamServer) -> None:
    """websockets queues up to max_queue frames per connection: 64 x 256 KiB was 16 MiB a
    stream, 1.6 GB for the default 100 streams of a 1 GiB task."""
    seen: list[Any] = []
    real = streamlease.dial.dial

    async def recording(url: str, rules: Any, options: DialOptions) -> Any:
        seen.append(options.max_queue)
        return await real(url, rules, options)
    monkeypatch.setattr("streamlease.session.dial", recording)
    sink = FakeSink()
    pump, _ = make_pump(upstream.url_for("s001"), sink)
    await run_until(pump, lambda: len(sink.seqs) >= 10)
    high = seen[0][0] if isinstance(seen[0], tuple) else seen[0]
    assert high * pump.settings.max_frame_bytes <= 2**20


async def test_an_idle_stream_runs_one_task_of_its_own() -> None:
    """No timer task per stream: the pump's own task waits for a frame and nothing else
    wakes it (the control task used to wake every batch_max_s / 2)."""
    async with UpstreamServer(UpstreamOptions(streams=1, rate=0.001)) as up:
        sink = FakeSink()
        pump, _ = make_pump(up.url_for("s001"), sink)
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(pump.run())
            await until(lambda: pump.connected)
            mine = [t for t in asyncio.all_tasks() if t is not task
                    and getattr(t.get_coro(), "__qualname__", "").startswith("Pump.")]
            await pump.stop()
            await task
    assert mine == []


# -- stop, abort, cancellation -------------------------------------------------------------


async def test_stop_interrupts_a_handshake_that_hangs() -> None:
    """Stopping while the opening handshake hangs returns at once, not after open_timeout."""
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # accept, never answer
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        pump, metrics = make_pump(f"ws://127.0.0.1:{port}/", FakeSink(), open_timeout_s=30.0)
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(pump.run())
            await asyncio.sleep(0.2)  # the handshake is in flight and will never finish
            await pump.stop()
            async with asyncio.timeout(2):
                await task
    assert value(metrics, "streamlease_upstream_reconnects_total", reason="connect_failed") == 0


async def test_stop_interrupts_a_reconnect_backoff() -> None:
    pump, _ = make_pump("ws://127.0.0.1:9/", FakeSink(), reconnect_base_s=30.0,
                        reconnect_cap_s=30.0)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pump.run())
        await until(lambda: value(pump.ctx.metrics, "streamlease_upstream_reconnects_total",
                                  reason="connect_failed") >= 1)
        await pump.stop()
        async with asyncio.timeout(2):
            await task


@pytest.mark.parametrize("also_stop", [False, True], ids=["cancel", "cancel and stop"])
async def test_a_cancellation_from_outside_is_never_taken_for_a_stop(
        upstream: UpstreamServer, also_stop: bool) -> None:
    """The supervisor cancels a pump that did not stop in time: that must end ``run`` with
    CancelledError even if a stop interrupted the same wait."""
    async with UpstreamServer(UpstreamOptions(streams=1, rate=0.001)) as quiet:
        pump, _ = make_pump(quiet.url_for("s001"), FakeSink())
        task = asyncio.get_running_loop().create_task(pump.run())
        try:
            await until(lambda: pump.connected)
            task.cancel()
            if also_stop:
                await pump.stop()
            with pytest.raises(asyncio.CancelledError):
                async with asyncio.timeout(5):
                    await task
        finally:
            task.cancel()
    assert task.cancelled()


# -- a sink that fails: the backoff stays on the heartbeat's scale, a drain never waits it out --


class UnreachableUpstream:
    """A connection without a socket, for virtual time: hands out ``frames``, then waits
    until closed (``streamlease.session.dial`` is replaced by ``dial``)."""

    def __init__(self, frames: list[int]) -> None:
        self.frames = [f'{{"seq": {seq}}}' for seq in frames]
        self.closed = asyncio.Event()
        self.transport = self  # websockets' transport, for abort()

    async def dial(self, url: str, rules: Any, options: Any) -> UnreachableUpstream:
        return self

    async def recv(self) -> str:
        if self.frames and not self.closed.is_set():
            return self.frames.pop(0)
        await self.closed.wait()
        raise ConnectionClosedOK(Close(1000, ""), Close(1000, ""))

    async def close(self) -> None:
        self.closed.set()

    def abort(self) -> None:
        self.closed.set()


class OutageSink(FakeSink):
    """Unavailable until ``heal_at`` (loop time); records when each call came."""

    def __init__(self, heal_at: float = float("inf")) -> None:
        super().__init__()
        self.heal_at = heal_at
        self.call_times: list[float] = []

    async def write_batch(self, tenure: Tenure, prev_seq: int, frames: list[Frame],
                          now_wall_ms: int, timeout: float | None = None) -> Any:
        now = asyncio.get_running_loop().time()
        self.call_times.append(now)
        if now < self.heal_at:
            self.calls += 1
            raise StoreUnavailable("sink unavailable")
        return await super().write_batch(tenure, prev_seq, frames, now_wall_ms, timeout)


class SleepWatch(LoopClock):
    """The loop's clock; says how long the sleep the pump is in now was meant to last."""

    def __init__(self) -> None:
        self.sleeping: float | None = None

    async def sleep(self, seconds: float) -> None:
        self.sleeping = seconds
        try:
            await super().sleep(seconds)
        finally:
            self.sleeping = None


def default_pump(monkeypatch: pytest.MonkeyPatch, sink: FakeSink,
                 upstream: UnreachableUpstream, clock: LoopClock) -> Pump:
    """A pump wired as ``streamlease run`` wires it with every setting at its default."""
    monkeypatch.setattr("streamlease.session.dial", upstream.dial)
    config = WorkerConfig.from_env({})
    settings = build_settings(config).supervisor
    tenure = Tenure("s001", "w1", 1, 0, 0)
    holding = Holding(tenure, "wss://feed.example/s001", clock.monotonic(), settings.timings)
    assert holding.timings.heartbeat_s == 4800  # the stream lease's renewal interval
    pump = Pump(context(sink, clock), holding, settings.pump)
    sink.pump = pump
    return pump


@pytest.mark.virtual_time
async def test_after_a_sink_outage_the_stream_writes_within_a_heartbeat(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A two-minute outage used to leave the stream backing off for up to the stream
    lease's renewal interval (then 600 s at the defaults) before it tried again."""
    clock = SleepWatch()
    start = clock.monotonic()
    sink = OutageSink(heal_at=start + 120)
    pump = default_pump(monkeypatch, sink, UnreachableUpstream([1, 2, 3]), clock)
    heartbeat = WorkerConfig.from_env({}).timings.heartbeat_s
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pump.run())
        await until(lambda: sink.seqs == [1, 2, 3], timeout=3600)
        await pump.stop()
        await task
    gaps = [b - a for a, b in itertools.pairwise(sink.call_times)]
    assert max(gaps) <= heartbeat, [round(g, 1) for g in gaps]
    assert sink.call_times[-1] - sink.heal_at <= heartbeat
    assert not pump.abandoned  # the outage healed: the final flush wrote everything
    assert len(gaps) > 20
    retried = value(pump.ctx.metrics, "streamlease_sink_write_failures_total", outcome="retried")
    assert retried == len(sink.call_times) - 1


@pytest.mark.virtual_time
async def test_a_drain_wakes_the_pump_from_a_sink_retry_backoff(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Stopping while the pump waits to retry a failed write: one more try, then the held
    frames are given up (last_seq did not move; the next holder asks for them again) and
    ``run`` returns — not after the backoff, nor by retrying until the lease runs out."""
    clock = SleepWatch()
    sink = OutageSink()
    pump = default_pump(monkeypatch, sink, UnreachableUpstream([1, 2, 3]), clock)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(pump.run())
        # Deep in the outage: the pump sleeps a backoff of a second or more (the cap is a
        # member heartbeat, 1.25 s at the defaults).
        await until(lambda: sink.calls >= 10 and (clock.sleeping or 0) >= 1.0, timeout=3600)
        stopped_at = clock.monotonic()
        await pump.stop()
        async with asyncio.timeout(0.5):  # virtual seconds: well under the backoff
            await task
    assert clock.monotonic() - stopped_at < 0.5
    assert sink.batches == [] and pump.committed == 0 and pump.abandoned
    assert value(pump.ctx.metrics, "streamlease_sink_write_failures_total",
                 outcome="abandoned") == 1
    assert [r for r in caplog.records if getattr(r, "sl_event", "") == "sink.flush_abandoned"]


@pytest.mark.virtual_time
async def test_an_abort_wakes_the_pump_from_a_sink_retry_backoff(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = SleepWatch()
    sink = OutageSink()
    pump = default_pump(monkeypatch, sink, UnreachableUpstream([1]), clock)
    task = asyncio.get_running_loop().create_task(pump.run())
    await until(lambda: sink.calls >= 10 and (clock.sleeping or 0) >= 1.0, timeout=3600)
    calls = sink.calls
    await pump.abort()
    with pytest.raises(SelfFenced):
        async with asyncio.timeout(0.5):
            await task
    assert sink.calls == calls  # no write after the abort
