"""Processors behind the worker's sink: lifecycle, fenced checkpoints, retries and the
dead-letter destination, on the in-memory store (its checkpoint write is the same
conditional rule as DynamoDB's)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import pytest

from streamlease import tenancy
from streamlease.core.frames import Frame, parse_frame
from streamlease.core.lease import LeaseTimings
from streamlease.core.urls import parse_allowed_urls
from streamlease.errors import ProcessorFailed, SinkGaveUp, StaleFence, StoreUnavailable
from streamlease.metrics import Metrics
from streamlease.processing import ProcessingSettings, ProcessorSink
from streamlease.processor import Context, Message, Processor
from streamlease.pump import PumpSettings
from streamlease.reconciler import Reconciler, ReconcilerSettings
from streamlease.store.memory import MemoryStore
from streamlease.supervisor import SupervisorSettings
from tests.fakes import PumpScript, StaticMember, context
from tests.virtual import LoopClock

T = LeaseTimings(lease_s=10.0, heartbeat_s=2.0, skew_margin_s=1.0, safety_margin_s=1.0)
URL = "wss://feeds.example.com/{}"


class Recorder:
    """A processor that records every call; fails the first ``fail`` process calls."""

    def __init__(self, calls: list[tuple[Any, ...]], fail: int = 0, name: str = "p") -> None:
        self.calls = calls
        self.fail = fail
        self.name = name

    async def start(self, ctx: Context) -> None:
        self.calls.append((self.name, "start", ctx.stream_id, ctx.fence, ctx.resume_after,
                           dict(ctx.item)))

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        if self.fail:
            self.fail -= 1
            raise ValueError("destination refused")
        self.calls.append((self.name, "process", ctx.stream_id, [m.seq for m in batch],
                           ctx.checkpoint, ctx.failure))

    async def stop(self, ctx: Context, reason: str) -> None:
        self.calls.append((self.name, "stop", ctx.stream_id, reason))


def frames(first: int, last: int) -> list[Frame]:
    out = []
    for seq in range(first, last + 1):
        got = parse_frame(f'{{"seq":{seq},"v":"x{seq}"}}')
        assert isinstance(got, Frame)
        out.append(got)
    return out


async def held(store: MemoryStore, sid: str = "a") -> Any:
    await store.put_started(sid, URL.format(sid))
    got = await store.acquire(sid, "w1", 100_000, T)
    assert got is not None
    return got


def sink(store: MemoryStore, calls: list[tuple[Any, ...]], fail: int = 0,
         dead: bool = False, attempts: int = 3) -> tuple[ProcessorSink, Metrics]:
    metrics = Metrics()
    dead_factory = (lambda: Recorder(calls, name="dlq")) if dead else None
    return ProcessorSink(lambda: Recorder(calls, fail), store, metrics,
                         ProcessingSettings("python", attempts), dead_factory), metrics


async def test_start_process_checkpoint_stop_in_order() -> None:
    store = MemoryStore()
    got = await held(store)
    calls: list[tuple[Any, ...]] = []
    out, _ = sink(store, calls)
    assert await out.open(got.tenure, got.record) == 0
    await out.write_batch(got.tenure, 0, frames(1, 3), 0)
    await out.write_batch(got.tenure, 3, frames(4, 5), 0)
    await out.close(got.tenure, "shutdown")
    assert [c[:2] for c in calls] == [("p", "start"), ("p", "process"), ("p", "process"),
                                      ("p", "stop")]
    assert calls[0][2:5] == ("a", got.tenure.fence, 0)
    assert calls[0][5]["ws_url"] == URL.format("a")  # the item's attributes, plain values
    assert calls[1][3:5] == ([1, 2, 3], 0) and calls[2][3:5] == ([4, 5], 3)
    assert calls[3][3] == "shutdown"
    assert (await store.get("a")).last_seq == 5  # type: ignore[union-attr]


async def test_messages_carry_the_parsed_object_and_the_text() -> None:
    store = MemoryStore()
    got = await held(store)
    seen: list[Message] = []

    class Keep(Recorder):
        async def process(self, batch: Sequence[Message], ctx: Context) -> None:
            seen.extend(batch)

    out = ProcessorSink(lambda: Keep([]), store, Metrics(), ProcessingSettings("python"))
    await out.open(got.tenure, got.record)
    await out.write_batch(got.tenure, 0, frames(1, 1), 0)
    assert seen[0].seq == 1 and seen[0].data == {"seq": 1, "v": "x1"}
    assert seen[0].text == '{"seq":1,"v":"x1"}'


async def test_a_stale_holder_cannot_checkpoint() -> None:
    store = MemoryStore()
    got = await held(store)
    out, _ = sink(store, [])
    await out.open(got.tenure, got.record)
    await store.force_release("a")
    # Processed, then the checkpoint (written while the pump reads on) is refused: the
    # pump hears it when it settles, or at its next batch, which is not processed.
    await out.write_batch(got.tenure, 0, frames(1, 2), 0)
    with pytest.raises(StaleFence):
        await out.settle(got.tenure)
    assert (await store.get("a")).last_seq is None  # type: ignore[union-attr]


async def test_a_destination_that_knows_a_newer_fence_stops_the_tenure_at_once() -> None:
    store = MemoryStore()
    got = await held(store)

    class Fenced(Recorder):
        async def process(self, batch: Sequence[Message], ctx: Context) -> None:
            raise StaleFence("the receiver has seen a newer fence")

    out = ProcessorSink(lambda: Fenced([]), store, Metrics(), ProcessingSettings("http", 5))
    await out.open(got.tenure, got.record)
    with pytest.raises(StaleFence):
        await out.write_batch(got.tenure, 0, frames(1, 2), 0)
    assert (await store.get("a")).last_seq is None  # type: ignore[union-attr]


async def test_a_failing_batch_is_retried_then_the_stream_gives_up() -> None:
    store = MemoryStore()
    got = await held(store)
    calls: list[tuple[Any, ...]] = []
    out, _ = sink(store, calls, fail=10, attempts=3)
    await out.open(got.tenure, got.record)
    for _ in range(2):
        with pytest.raises(ProcessorFailed):
            await out.write_batch(got.tenure, 0, frames(1, 2), 0)
    with pytest.raises(SinkGaveUp, match=r"3 times on seq 1\.\.2"):
        await out.write_batch(got.tenure, 0, frames(1, 2), 0)
    assert (await store.get("a")).last_seq is None  # type: ignore[union-attr]  # not skipped


class Unreachable(Recorder):
    """An output whose destination does not answer ``down`` times, then takes the batch."""

    def __init__(self, calls: list[tuple[Any, ...]], down: int) -> None:
        super().__init__(calls)
        self.down = down

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        if self.down:
            self.down -= 1
            raise StoreUnavailable("mongodb: no answer within 10 s")
        await super().process(batch, ctx)


async def test_an_unreachable_destination_is_retried_without_using_up_attempts() -> None:
    """An outage is not a poison batch: it is never dead-lettered nor given up on for it,
    however long it lasts (found by a review of the mongodb output)."""
    store = MemoryStore()
    got = await held(store)
    calls: list[tuple[Any, ...]] = []
    out = ProcessorSink(lambda: Unreachable(calls, down=7), store, Metrics(),
                        ProcessingSettings("mongodb", 3), lambda: Recorder(calls, name="dlq"))
    await out.open(got.tenure, got.record)
    for _ in range(7):
        with pytest.raises(StoreUnavailable) as raised:
            await out.write_batch(got.tenure, 0, frames(1, 2), 0)
        assert not isinstance(raised.value, ProcessorFailed)
    await out.write_batch(got.tenure, 0, frames(1, 2), 0)
    await out.settle(got.tenure)
    assert ("p", "process", "a", [1, 2], 0, None) in calls
    assert not [c for c in calls if c[0] == "dlq"]
    assert (await store.get("a")).last_seq == 2  # type: ignore[union-attr]


async def test_a_batch_that_fails_every_attempt_goes_to_the_dead_letter_sink() -> None:
    store = MemoryStore()
    got = await held(store)
    calls: list[tuple[Any, ...]] = []
    out, metrics = sink(store, calls, fail=3, dead=True, attempts=3)
    await out.open(got.tenure, got.record)
    for _ in range(2):
        with pytest.raises(ProcessorFailed):
            await out.write_batch(got.tenure, 0, frames(1, 2), 0)
    await out.write_batch(got.tenure, 0, frames(1, 2), 0)
    await out.settle(got.tenure)
    dead = [c for c in calls if c[0] == "dlq" and c[1] == "process"]
    assert dead == [("dlq", "process", "a", [1, 2], 0, "ValueError: destination refused")]
    assert (await store.get("a")).last_seq == 2  # type: ignore[union-attr]
    assert metrics.registry.get_sample_value(
        "streamlease_dead_lettered_messages_total", {"sink": "python"}) == 2
    await out.write_batch(got.tenure, 2, frames(3, 3), 0)  # the next batch is processed
    assert calls[-1][:4] == ("p", "process", "a", [3])
    await out.close(got.tenure, "drain")
    assert ("dlq", "stop", "a", "drain") in calls


async def test_a_checkpoint_that_failed_is_retried_without_processing_the_batch_again(
        ) -> None:
    """The output took the batch, the checkpoint write (made while the pump reads on) timed
    out, and so did its retry: the pump backs off and tries again, and only the checkpoint
    is retried before the next batch is processed (no duplicate within a tenure)."""
    store = MemoryStore()
    got = await held(store)
    calls: list[tuple[Any, ...]] = []
    out, _ = sink(store, calls)
    await out.open(got.tenure, got.record)
    original = store.checkpoint
    failures = [StoreUnavailable("checkpoint: timeout"), StoreUnavailable("again")]

    async def flaky(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return await original(*args, **kwargs)

    store.checkpoint = flaky  # type: ignore[method-assign]
    await out.write_batch(got.tenure, 0, frames(1, 3), 0)
    with pytest.raises(StoreUnavailable):
        await out.write_batch(got.tenure, 3, frames(4, 4), 0)
    assert [c[3] for c in calls if c[1] == "process"] == [[1, 2, 3]]
    assert (await store.get("a")).last_seq is None  # type: ignore[union-attr]
    await out.write_batch(got.tenure, 3, frames(4, 4), 0)
    assert [c[3] for c in calls if c[1] == "process"] == [[1, 2, 3], [4]]
    assert (await store.get("a")).last_seq == 3  # type: ignore[union-attr]
    await out.settle(got.tenure)
    assert (await store.get("a")).last_seq == 4  # type: ignore[union-attr]


async def test_a_transactional_processor_resumes_after_its_own_checkpoint() -> None:
    store = MemoryStore()
    got = await held(store)

    class Own(Recorder):
        commits_checkpoint = True

        async def committed(self, ctx: Context) -> int:
            return 42

    out = ProcessorSink(lambda: Own([]), store, Metrics(), ProcessingSettings("postgres"))
    assert await out.open(got.tenure, got.record) == 42


async def test_a_transactional_processor_hears_of_its_dead_lettered_batch() -> None:
    """Its own checkpoint must move past the batch the worker skipped, as the stream item's
    does; a processor without its own checkpoint is not asked."""
    store = MemoryStore()
    got = await held(store)
    calls: list[tuple[Any, ...]] = []

    class Own(Recorder):
        commits_checkpoint = True

        async def committed(self, ctx: Context) -> int:
            return 0

        async def dead_lettered(self, batch: Sequence[Message], ctx: Context) -> None:
            self.calls.append((self.name, "dead_lettered", [m.seq for m in batch],
                               ctx.checkpoint))

    out = ProcessorSink(lambda: Own(calls, fail=2), store, Metrics(),
                        ProcessingSettings("mongodb", 2), lambda: Recorder(calls, name="dlq"))
    await out.open(got.tenure, got.record)
    with pytest.raises(ProcessorFailed):
        await out.write_batch(got.tenure, 0, frames(1, 2), 0)
    await out.write_batch(got.tenure, 0, frames(1, 2), 0)
    await out.settle(got.tenure)
    assert [c[:3] for c in calls if c[1] != "start"] == [
        ("dlq", "process", "a"), ("p", "dead_lettered", [1, 2])]
    assert calls[-1] == ("p", "dead_lettered", [1, 2], 0)
    assert (await store.get("a")).last_seq == 2  # type: ignore[union-attr]


async def test_a_metered_processor_gets_the_workers_metrics_before_start() -> None:
    store = MemoryStore()
    got = await held(store)
    metrics = Metrics()
    seen: list[object] = []

    class Counting(Recorder):
        def use_metrics(self, given: Metrics) -> None:
            seen.append(given)

        async def start(self, ctx: Context) -> None:
            seen.append("start")

    out = ProcessorSink(lambda: Counting([]), store, metrics, ProcessingSettings("mongodb"))
    await out.open(got.tenure, got.record)
    assert seen == [metrics, "start"]


# --- through the reconciler: the reasons a processor's stop hears ----------------------


class Rig:
    def __init__(self, processor: type[Recorder] = Recorder) -> None:
        self.memory = MemoryStore()
        self.clock = LoopClock()
        self.calls: list[tuple[Any, ...]] = []
        self.output = ProcessorSink(lambda: processor(self.calls), self.memory, Metrics(),
                                    ProcessingSettings("python"))
        self.reconciler = Reconciler(
            context(self.output, self.clock, leases=self.memory),
            ReconcilerSettings(reconcile_s=1.0, sweep_s=10.0, max_streams=10,
                               acquire_per_cycle=10, stopped_check_s=T.heartbeat_s,
                               supervisor=SupervisorSettings(
                                   timings=T, allowed_urls=parse_allowed_urls("wss://"),
                                   pump=PumpSettings(), call_timeout_s=1.0,
                                   drain_timeout_s=5.0, check_s=0.5)),
            StaticMember(), tenancy.Hooks(pump_factory=PumpScript(every=0.5, batch=2).factory()))

    def stops(self) -> dict[str, str]:
        return {c[2]: c[3] for c in self.calls if c[1] == "stop"}


@pytest.mark.virtual_time
async def test_stop_hears_stopped_lost_and_shutdown() -> None:
    rig = Rig()
    for sid in ("a", "b", "c"):
        await rig.memory.put_started(sid, URL.format(sid))
    task = asyncio.create_task(rig.reconciler.run())
    await asyncio.sleep(3)
    assert set(rig.reconciler.supervisors) == {"a", "b", "c"}
    await rig.memory.set_state("a", "STOPPED")
    await rig.memory.force_release("b")
    await asyncio.sleep(3)
    assert {"a": "stopped", "b": "lost"}.items() <= rig.stops().items()
    b_calls = [c[1] for c in rig.calls if c[2] == "b"]
    lost_at = b_calls.index("stop")
    # Nothing processed after it heard "lost" (b is free again: a new tenure may start).
    assert b_calls[lost_at + 1:lost_at + 2] in ([], ["start"])
    rig.reconciler.stop(release_by=asyncio.get_running_loop().time() + 10)
    await asyncio.wait_for(task, 30)
    assert rig.stops()["c"] == "shutdown"
    record = await rig.memory.get("c")
    assert record is not None and record.lease_expires_at_ms == 0 and record.last_seq


@pytest.mark.virtual_time
async def test_a_processor_that_cannot_start_leaves_the_stream_released_with_last_error(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streamlease")

    class NoStart(Recorder):
        async def start(self, ctx: Context) -> None:
            raise ConnectionError("cannot reach the destination")

    rig = Rig(NoStart)
    await rig.memory.put_started("a", URL.format("a"))
    task = asyncio.create_task(rig.reconciler.run())
    async with asyncio.timeout(5):  # the orphan index shows it within its lag
        while not ((record := await rig.memory.get("a")) and record.last_error):  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    assert record is not None and record.lease_expires_at_ms == 0
    assert "output failed to start: ConnectionError" in (record.last_error or "")
    assert not rig.reconciler.supervisors
    rig.reconciler.stop(release_by=asyncio.get_running_loop().time() + 5)
    await asyncio.wait_for(task, 30)


def test_a_processor_is_a_protocol_users_can_check() -> None:
    assert isinstance(Recorder([]), Processor)


def test_batches_grow_to_the_cap_or_the_window_for_every_sink() -> None:
    """The write-unit fill rule stays in the core, off: it made a takeover's catch-up
    several transactions a stream (see docs/performance.md, Batching)."""
    from streamlease.app import build_settings
    from streamlease.config import WorkerConfig
    from streamlease.core.stream import BATCH_MAX_BYTES

    for env in ({}, {"STREAMLEASE_SINK": "python:m:make"}):
        pump = build_settings(WorkerConfig.from_env(env)).supervisor.pump
        assert pump.rules().batch_fill_bytes == BATCH_MAX_BYTES
