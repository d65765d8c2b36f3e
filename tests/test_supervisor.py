"""The supervisor in virtual time: the in-memory store (wrapped to fail on demand) and a
scripted pump, so every ordering and timeout path runs in milliseconds, deterministically."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import itertools
import logging
import random
from typing import Any

import pytest

from streamlease.context import Context
from streamlease.core.lease import CleanRelease, HolderState, LeaseTimings, StopReason
from streamlease.core.urls import parse_allowed_urls
from streamlease.errors import StoreUnavailable
from streamlease.metrics import Metrics
from streamlease.pump import PumpSettings
from streamlease.store import codec
from streamlease.store.memory import MemoryStore
from streamlease.supervisor import RELEASES_IN_FLIGHT, Supervisor, SupervisorSettings
from streamlease.tenancy import Hooks, Ties
from tests.fakes import FaultyStore, PumpScript, context
from tests.virtual import LoopClock

pytestmark = pytest.mark.virtual_time


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streamlease")

T = LeaseTimings(lease_s=10.0, heartbeat_s=2.0, skew_margin_s=1.0, safety_margin_s=1.0)
URL = "wss://feeds.example.com/a"


class Rig:
    def __init__(self, script: PumpScript | None = None, **settings: Any) -> None:
        self.memory = MemoryStore()
        self.store = FaultyStore(self.memory)
        self.clock = LoopClock()
        self.metrics = Metrics()
        self.script = script or PumpScript()
        timings = settings.pop("timings", T)
        self.settings = SupervisorSettings(
            timings=timings, allowed_urls=parse_allowed_urls("wss://"), pump=PumpSettings(),
            **{"call_timeout_s": 1.0, "drain_timeout_s": 5.0, **settings})

    async def holder(self, sid: str = "a", rng: random.Random | None = None,
                     watched: bool = False) -> Supervisor:
        await self.memory.put_started(sid, URL)
        sent = self.clock.monotonic()
        got = await self.memory.acquire(sid, "w1", self.clock.wall_ms(), T)
        assert got is not None
        return Supervisor(self.ctx(rng=rng or random.Random(1)), self.settings, got, sent,
                          Ties(watched=lambda: watched, hooks=self.hooks()))

    def ctx(self, leases: Any = None, rng: random.Random | None = None) -> Context:
        return context(self.store, self.clock, self.metrics, rng, leases or self.store)

    def hooks(self) -> Hooks:
        return Hooks(pump_factory=self.script.factory())

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels or None) or 0.0

    async def record(self, sid: str = "a") -> Any:
        return await self.memory.get(sid)


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "sl_event", None) == name]


async def run_for(supervisor: Supervisor, seconds: float) -> asyncio.Task[None]:
    task = asyncio.create_task(supervisor.run())
    await asyncio.sleep(seconds)
    return task


async def test_renews_every_heartbeat_and_delivers() -> None:
    rig = Rig()
    sup = await rig.holder()
    task = await run_for(sup, 60)
    assert 29 <= rig.store.count("renew") <= 31  # one per 2 s heartbeat
    assert not task.done() and sup.holding.state is HolderState.HOLDING
    record = await rig.record()
    assert record.last_seq == rig.script.pumps["a"].committed > 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_every_renewal_is_spread_afresh_not_only_the_first() -> None:
    """Each renewal is due a heartbeat +/-10 % after the previous one was sent, a fresh
    draw every time: streams taken in one mass acquisition (or realigned by one outage)
    do not renew in lock-step for as long as they are held."""
    rig = Rig()
    sup = await rig.holder(rng=random.Random(42))
    task = await run_for(sup, 20 * T.heartbeat_s)
    sent = [t for name, t in rig.store.sent_at if name == "renew"]
    intervals = [round(b - a, 9) for a, b in itertools.pairwise(sent)]
    assert len(intervals) >= 15
    assert all(0.9 * T.heartbeat_s <= i <= 1.1 * T.heartbeat_s for i in intervals), intervals
    assert len(set(intervals)) == len(intervals), intervals  # no fixed step after the first
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_renew_timeouts_come_from_the_deadline_that_remains() -> None:
    rig = Rig()
    rig.store.fail("renew", times=-1, hang=True)  # each attempt waits out its own timeout
    sup = await rig.holder()
    await asyncio.wait_for(sup.run(), 60)
    deadline = T.lease_s - T.safety_margin_s  # from the acquire at t=0
    timeouts = rig.store.timeouts("renew")
    sent = [t for name, t in rig.store.sent_at if name == "renew"]
    assert len(timeouts) >= 3
    for timeout, at in zip(timeouts, sent, strict=True):
        assert timeout is not None and timeout <= T.heartbeat_s
        assert at + timeout <= deadline + 0.05  # never outlives the lease
    assert timeouts[-1] < timeouts[0]  # shrinks as the deadline nears
    assert sup.holding.reason is StopReason.DEADLINE


async def test_a_lost_renew_aborts_the_pump_without_flushing(
        caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig()
    sup = await rig.holder()
    task = await run_for(sup, 3)
    await rig.memory.force_release("a")  # an operator fences the holder out
    fenced_at = (await rig.record()).last_seq
    await asyncio.wait_for(task, 10)
    assert sup.holding.state is HolderState.LOST
    # Stopped at once (aborted, or the pump saw may_write turn false first): no flush,
    # and nothing written after the loss.
    assert "a:stop" not in rig.script.log and "a:flushed" not in rig.script.log
    assert (await rig.record()).last_seq == fenced_at
    # Learnt from the renew (condition failed) or from the sink (stale fence): once.
    assert rig.metric("streamlease_lease_lost_total", reason="condition_failed") + \
        rig.metric("streamlease_lease_lost_total", reason="stale_fence") == 1
    assert rig.store.count("release") == 0  # nothing to release: it is not ours


async def test_a_refused_renewal_is_counted_as_lost() -> None:
    """Every lease's renewal answers in one outcome enum; the stream's counter still names
    a refusal "lost", as the alerts and dashboards read it."""
    rig = Rig(PumpScript(every=1000.0), check_s=1000.0)  # only a renewal can learn it
    sup = await rig.holder()
    task = await run_for(sup, 3)
    await rig.memory.force_release("a")
    await asyncio.wait_for(task, 10)
    assert sup.holding.reason is StopReason.CONDITION_FAILED
    assert rig.metric("streamlease_renewals_total", outcome="lost") == 1
    assert rig.metric("streamlease_renewals_total", outcome="renewed") >= 1
    assert rig.metric("streamlease_renewals_total", outcome="refused") == 0


async def test_drain_stops_reading_flushes_then_releases_in_that_order() -> None:
    rig = Rig()
    sup = await rig.holder()
    task = await run_for(sup, 5)
    sup.request_drain(StopReason.SHUTDOWN)
    await asyncio.wait_for(task, 30)
    assert rig.script.log[-3:] == ["a:stop", "a:flushed", "a:release"] or \
        rig.script.log[-2:] == ["a:stop", "a:flushed"]
    names = [n for n, _ in rig.store.calls]
    assert names.index("release") > len(names) - 3  # the release came last
    record = await rig.record()
    assert record.lease_expires_at_ms == 0 and record.last_seq == rig.script.pumps["a"].committed
    assert sup.holding.state is HolderState.RELEASED
    assert rig.metric("streamlease_lease_released_total", reason="shutdown") == 1


@pytest.mark.parametrize("abandoned", [False, True])
async def test_a_drain_marks_its_release_clean_only_when_the_final_flush_was_whole(
        abandoned: bool) -> None:
    """A final flush given up (``sink.flush_abandoned``: frames read and never written)
    releases without ``clean_release``, so the next holder reads the sink."""
    rig = Rig()
    sup = await rig.holder()
    task = await run_for(sup, 5)
    pump = rig.script.pumps["a"]
    pump.abandoned = abandoned
    sup.request_drain(StopReason.SHUTDOWN)
    await asyncio.wait_for(task, 30)
    record = await rig.record()
    assert record.lease_expires_at_ms == 0 and sup.holding.state is HolderState.RELEASED
    mark = codec.clean_release(record)
    if abandoned:
        assert mark is None
    else:
        assert mark == CleanRelease(record.fence, pump.committed, mark.at_ms if mark else 0)
        assert pump.committed == record.last_seq > 0


class InFlight:
    """A lease store whose releases take ``seconds`` each; counts those in flight."""

    def __init__(self, inner: Any, seconds: float) -> None:
        self.inner = inner
        self.seconds = seconds
        self.now = self.most = self.done = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def release(self, *args: Any, **kwargs: Any) -> Any:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(self.seconds)
            return await self.inner.release(*args, **kwargs)
        finally:
            self.now -= 1
            self.done += 1


async def test_a_drain_of_many_streams_keeps_its_releases_in_flight_to_the_gate() -> None:
    """A worker's supervisors share one release gate (``Holdings.release_gate``; the
    reconciler tests check the wiring): a drain of 50 streams has at most
    RELEASES_IN_FLIGHT releases in the store's queue at once, and every stream is still
    released."""
    rig = Rig()
    slow = InFlight(rig.store, 0.2)
    gate = asyncio.Semaphore(RELEASES_IN_FLIGHT)
    sups = []
    for i in range(50):
        await rig.memory.put_started(f"s{i}", URL)
        got = await rig.memory.acquire(f"s{i}", "w1", rig.clock.wall_ms(), T)
        assert got is not None
        sups.append(Supervisor(rig.ctx(slow, random.Random(i)), rig.settings, got,
                               rig.clock.monotonic(), Ties(gate, hooks=rig.hooks())))
    tasks = [asyncio.create_task(s.run()) for s in sups]
    await asyncio.sleep(3)
    deadline = asyncio.get_running_loop().time() + 20
    for s in sups:
        s.request_drain(StopReason.SHUTDOWN, release_by=deadline)
    await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert slow.most == RELEASES_IN_FLIGHT and slow.done == 50
    assert all(s.holding.state is HolderState.RELEASED for s in sups)
    assert rig.metric("streamlease_lease_released_total", reason="shutdown") == 50


async def test_heartbeats_go_on_while_a_long_flush_drains() -> None:
    # The final flush takes longer than the lease: without renewals during the drain the
    # holder would self-fence mid-flush and the lease would lapse under it.
    rig = Rig(PumpScript(flush_s=25.0), drain_timeout_s=60.0)
    sup = await rig.holder()
    task = await run_for(sup, 3)
    renewals_before = rig.store.count("renew")
    sup.request_drain(StopReason.STOPPED)
    await asyncio.wait_for(task, 120)
    assert rig.store.count("renew") >= renewals_before + 10  # 25 s / 2 s heartbeat
    assert "a:flushed" in rig.script.log
    assert sup.holding.state is HolderState.RELEASED
    assert rig.metric("streamlease_lease_lost_total", reason="deadline") == 0


async def test_renewals_failing_until_the_deadline_self_fence(
        caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig()
    rig.store.fail("renew", times=-1)
    sup = await rig.holder()
    task = asyncio.create_task(sup.run())
    await asyncio.wait_for(task, 60)
    assert sup.holding.state in (HolderState.SELF_FENCED, HolderState.RELEASED)
    assert rig.metric("streamlease_lease_lost_total", reason="deadline") == 1
    assert "a:stop" not in rig.script.log and "a:flushed" not in rig.script.log
    # Stopped at lease - safety margin after the acquire, not later.
    assert asyncio.get_running_loop().time() <= 10 - 1 + 1.5


async def test_a_release_that_fails_is_retried_until_it_lands(
        caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig()
    sup = await rig.holder()
    task = await run_for(sup, 3)
    rig.store.fail("release", times=2)
    rig.store.fail("release", times=1, hang=True)  # then one that times out
    sup.request_drain(StopReason.SHUTDOWN, release_by=asyncio.get_running_loop().time() + 20)
    await asyncio.wait_for(task, 60)
    assert rig.store.count("release") == 4
    assert (await rig.record()).lease_expires_at_ms == 0
    (released,) = events(caplog, "lease.released")
    assert released.sl_fields["attempts"] == 4  # type: ignore[attr-defined]


async def test_a_release_gives_up_at_its_budget_and_nothing_goes_unretrieved(
        caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig()
    sup = await rig.holder()
    task = await run_for(sup, 3)
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: unretrieved.append(context))
    # Every release hangs past its timeout, then fails: the late failures must be
    # retrieved (and logged), never left as "Task exception was never retrieved".
    rig.store.fail("release", times=-1, delay=1.5, error=StoreUnavailable("late failure"))
    started = loop.time()
    sup.request_drain(StopReason.SHUTDOWN, release_by=started + 6)
    await asyncio.wait_for(task, 60)
    assert loop.time() - started <= 6 + 1.5
    assert sup.holding.state is not HolderState.RELEASED
    assert events(caplog, "lease.release_failed")
    await asyncio.sleep(5)  # the given-up calls finish (and fail) in the background
    gc.collect()
    assert events(caplog, "store.call_failed_late")
    assert unretrieved == []


async def test_a_pump_that_will_not_stop_is_abandoned_after_the_drain_budget(
        caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig(PumpScript(flush_s=None), drain_timeout_s=4.0)
    sup = await rig.holder()
    task = await run_for(sup, 3)
    sup.request_drain(StopReason.SHUTDOWN)
    await asyncio.wait_for(task, 30)
    assert events(caplog, "stream.stop_timeout")
    assert (await rig.record()).lease_expires_at_ms == 0  # still released


async def test_cancelling_a_supervisor_cancels_its_pump_and_heartbeat() -> None:
    rig = Rig()
    sup = await rig.holder()
    task = await run_for(sup, 3)
    before = set(asyncio.all_tasks())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0)
    left = {t for t in before - {task, asyncio.current_task()} if not t.done()}
    assert left == set(), left
    calls = rig.store.count("renew")
    await asyncio.sleep(30)
    assert rig.store.count("renew") == calls  # nothing renews a cancelled tenure


async def test_a_stopped_item_drains_and_a_changed_url_reconnects() -> None:
    rig = Rig()
    sup = await rig.holder()
    task = await run_for(sup, 3)
    await rig.memory.put_started("a", "wss://feeds.example.com/b")
    await asyncio.sleep(T.heartbeat_s + 0.1)
    assert "a:reconnect:url_changed" in rig.script.log
    await rig.memory.set_state("a", "STOPPED")
    await asyncio.wait_for(task, 10)
    assert rig.metric("streamlease_lease_released_total", reason="stopped") == 1


# --- index records are hints; the heartbeat and the release are guarded ------------------


async def test_an_index_record_from_an_earlier_tenure_is_ignored() -> None:
    """The index lags: right after an acquisition it may still show the previous owner
    and expiry 0. That must never take the live lease away."""
    rig = Rig()
    sup = await rig.holder()
    task = await run_for(sup, 1)
    stale = dataclasses.replace(await rig.record(), lease_owner="w0",
                                fence=sup.tenure.fence - 1, lease_expires_at_ms=0)
    sup.seen(stale)
    await asyncio.sleep(1)
    assert sup.holding.state is HolderState.HOLDING
    assert rig.metric("streamlease_index_hints_total", outcome="stale_fence") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_index_record_is_confirmed_by_a_consistent_read_before_acting() -> None:
    """A STOPPED entry the index still shows after a flip back to STARTED: the holder
    reads the item, sees STARTED, and keeps serving."""
    rig = Rig()
    sup = await rig.holder()
    task = await run_for(sup, 1)
    stale = dataclasses.replace(await rig.record(), desired_state="STOPPED")
    checks = rig.store.count("check")
    sup.seen(stale)
    await asyncio.sleep(0.5)  # well inside one heartbeat: the read is made at once
    assert rig.store.count("check") == checks + 1
    assert sup.holding.state is HolderState.HOLDING
    assert rig.metric("streamlease_index_hints_total", outcome="dismissed") == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_confirmed_stop_drains_and_releases_without_waiting_for_a_renewal() -> None:
    rig = Rig()
    sup = await rig.holder()
    task = await run_for(sup, 1)
    await rig.memory.set_state("a", "STOPPED")
    sup.seen(await rig.record())
    await asyncio.wait_for(task, 1.0)  # a renewal would come only after 2 s
    assert sup.holding.state is HolderState.RELEASED
    assert (await rig.record()).lease_expires_at_ms == 0
    assert rig.metric("streamlease_index_hints_total", outcome="confirmed") == 1


async def test_while_its_item_is_watched_only_a_notice_makes_the_holder_read() -> None:
    """Each stream's periodic read rests while its item is watched for it (the leader's
    change feed, the worker's batched reads); a notice makes the holder read at once, and
    that read decides (a STOPPED flip: drain and release, without waiting for the
    renewal)."""
    rig = Rig(check_s=0.5, timings=dataclasses.replace(T, heartbeat_s=50.0, lease_s=200.0))
    sup = await rig.holder(watched=True)
    task = await run_for(sup, 5)
    assert rig.store.count("check") == 0  # ten check intervals: no read
    await rig.memory.set_state("a", "STOPPED")
    await asyncio.sleep(2)
    assert sup.holding.state is HolderState.HOLDING  # nobody told it
    sup.notified()
    await asyncio.wait_for(task, 1.0)
    assert rig.store.count("check") == 1
    assert sup.holding.state is HolderState.RELEASED
    assert rig.metric("streamlease_index_hints_total", outcome="confirmed") == 0


async def test_a_batched_read_that_looks_changed_is_confirmed_before_acting() -> None:
    rig = Rig(check_s=0.5, timings=dataclasses.replace(T, heartbeat_s=50.0, lease_s=200.0))
    sup = await rig.holder(watched=True)
    task = await run_for(sup, 1)
    current = await rig.record()
    sup.compare(dataclasses.replace(current, fence=sup.tenure.fence - 1, lease_owner="w0"))
    sup.compare(current)  # unchanged: nothing to read
    await asyncio.sleep(1)
    assert rig.store.count("check") == 0
    sup.compare(dataclasses.replace(current, ws_url="wss://feeds.example.com/b"))  # stale?
    await asyncio.sleep(1)
    assert rig.store.count("check") == 1  # read: the URL had not changed after all
    assert sup.holding.state is HolderState.HOLDING and not rig.script.log.count(
        "a:reconnect:url_changed")
    await rig.memory.set_state("a", "STOPPED")
    sup.compare(await rig.record())
    await asyncio.wait_for(task, 1.0)
    assert sup.holding.state is HolderState.RELEASED


async def test_a_crashed_heartbeat_releases_the_stream_instead_of_holding_it() -> None:
    rig = Rig()
    sup = await rig.holder()
    rig.store.fail("renew", times=1, error=RuntimeError("bug in a renewal"))
    task = asyncio.create_task(sup.run())
    await asyncio.wait_for(task, 30)
    assert sup.holding.state is HolderState.RELEASED
    assert (await rig.record()).lease_expires_at_ms == 0
    assert rig.metric("streamlease_task_crashed_total", task="heartbeat") == 1


async def test_a_self_fenced_release_keeps_to_the_shutdown_budget() -> None:
    """A member whose heartbeat lapsed stops its streams and tries to free them; with a
    stream lease of minutes, the release must still end within a shutdown's budget."""
    long = LeaseTimings(lease_s=1800.0, heartbeat_s=500.0, skew_margin_s=1.0,
                        safety_margin_s=1.0)
    rig = Rig(timings=long)
    await rig.memory.put_started("a", URL)
    got = await rig.memory.acquire("a", "w1", rig.clock.wall_ms(), long)
    assert got is not None
    sup = Supervisor(rig.ctx(), rig.settings, got, rig.clock.monotonic(),
                     Ties(hooks=rig.hooks()))
    rig.store.fail("release", times=10_000)
    task = await run_for(sup, 1)
    sup.member_lost(fenced=False)
    await asyncio.sleep(5)
    assert not task.done()  # still trying to free the lease: the store is down
    started = asyncio.get_running_loop().time()
    sup.request_drain(StopReason.SHUTDOWN, release_by=started + 3)
    await asyncio.wait_for(task, 10)
    assert asyncio.get_running_loop().time() - started <= 3.5
    assert sup.holding.state is HolderState.SELF_FENCED
