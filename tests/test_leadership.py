"""The fleet leader's duties on the in-memory store: one leader among candidates, a
crashing duty restarted without ending leadership, the gauge dropped the moment the lease
is lost (not once duties wind down), and a resignation taken over at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamlease.clock import SYSTEM_CLOCK
from streamlease.leader import LeaderBackend, LeaderLease
from streamlease.leadership import FLEET_LEASE, Leadership, LeadershipSettings
from streamlease.metrics import Metrics
from streamlease.store.memory import MemoryStore
from tests.fakes import context
from tests.virtual import LoopClock

TTL, HEARTBEAT, SAFETY = 0.6, 0.1, 0.06


class Candidate:
    def __init__(self, store: MemoryStore, owner: str, duties: list, eligible: bool = True,
                 ) -> None:  # type: ignore[type-arg]
        self.metrics = Metrics()
        self.eligible = eligible
        self.leadership = Leadership(
            context(metrics=self.metrics, owner=owner), store.stores().leader,
            LeadershipSettings(TTL, HEARTBEAT, SAFETY), duties, eligible=lambda: self.eligible)
        self.task = asyncio.create_task(self.leadership.run())

    def gauge(self) -> float:
        return self.metrics.registry.get_sample_value("streamlease_is_leader") or 0.0

    def changes(self) -> float:
        return self.metrics.registry.get_sample_value("streamlease_leader_changes_total") or 0.0

    async def stop(self) -> None:
        self.leadership.stop()
        await asyncio.wait_for(self.task, 10)


async def until(check: object, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():  # type: ignore[operator]  # noqa: ASYNC110
            await asyncio.sleep(0.01)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture
async def candidates(store: MemoryStore) -> AsyncIterator[list[Candidate]]:
    made: list[Candidate] = []
    yield made
    for candidate in made:
        await candidate.stop()


async def idle(lease: LeaderLease, done: asyncio.Event) -> None:
    await done.wait()


async def test_one_leader_among_candidates_and_the_ineligible_never_lead(
        store: MemoryStore, candidates: list[Candidate]) -> None:
    candidates += [Candidate(store, f"w{i}", [idle]) for i in range(3)]
    candidates.append(Candidate(store, "draining", [idle], eligible=False))

    def leaders() -> list[Candidate]:
        # ``leading`` is judged on the clock (a renewal proven before the deadline), so
        # it, not the gauge the loop sets, is what a stalled event loop cannot overstate.
        return [c for c in candidates if c.leadership.leading]
    await until(leaders)
    (first,) = leaders()
    assert first.leadership.owner != "draining" and first.gauge() == 1
    # Resigning hands over at once (no lease to wait out) to another eligible worker.
    await first.stop()
    candidates.remove(first)
    await until(leaders, timeout=TTL)
    (second,) = leaders()
    assert second.leadership.owner != "draining" and second.gauge() == 1
    assert first.gauge() == 0 and first.changes() == 1


async def test_a_crashing_duty_is_restarted_and_leadership_goes_on(
        store: MemoryStore, candidates: list[Candidate]) -> None:
    calls = 0

    async def flaky(lease: LeaderLease, done: asyncio.Event) -> None:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RuntimeError("boom")
        await done.wait()

    candidates.append(Candidate(store, "w1", [flaky, idle]))
    await until(lambda: calls >= 3, timeout=5)
    leader = candidates[0]
    assert leader.leadership.leading and leader.changes() == 1


async def test_the_gauge_drops_when_the_lease_is_lost_not_when_duties_end(
        store: MemoryStore, candidates: list[Candidate]) -> None:
    release = asyncio.Event()
    noticed = asyncio.Event()

    async def slow_to_stop(lease: LeaderLease, done: asyncio.Event) -> None:
        await done.wait()
        noticed.set()
        await release.wait()  # a job still in its grace period

    candidates.append(Candidate(store, "w1", [slow_to_stop]))
    leader = candidates[0]
    await until(lambda: leader.gauge() == 1)
    seen = await store.stores().leader.read(FLEET_LEASE)
    # Another worker takes the lease, as after observing this one dead.
    assert await store.stores().leader.acquire(FLEET_LEASE, "w2", TTL, seen,
                                               SYSTEM_CLOCK.wall_ms()) is not None
    await asyncio.wait_for(noticed.wait(), 5)
    assert leader.gauge() == 0, "still reporting leadership while its duty winds down"
    release.set()


# -- the renewal task fails: leadership ends, the candidate campaigns again -------------------


class RenewRaises:
    """The leader backend, whose renewals raise what no store outcome is (a bug, an answer
    that cannot be decoded) while ``broken``."""

    def __init__(self, inner: LeaderBackend) -> None:
        self.inner = inner
        self.broken = True
        self.raised = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def renew(self, *args: Any, **kwargs: Any) -> Any:
        if self.broken:
            self.raised += 1
            raise RuntimeError("cannot decode the renewal's answer")
        return await self.inner.renew(*args, **kwargs)


class CrashRig:
    def __init__(self) -> None:
        self.store = MemoryStore()
        self.backend = RenewRaises(self.store.stores().leader)
        self.metrics = Metrics()
        self.clock = LoopClock()
        self.started: list[int] = []  # the fence of each leadership the duty ran under
        self.stopped: list[int] = []
        self.leadership = Leadership(
            context(clock=self.clock, metrics=self.metrics), self.backend,  # type: ignore[arg-type]
            LeadershipSettings(TTL, HEARTBEAT, SAFETY), [self.job], eligible=lambda: True)
        self.task = asyncio.create_task(self.leadership.run())

    async def job(self, lease: LeaderLease, done: asyncio.Event) -> None:
        self.started.append(lease.fence)
        await done.wait()  # what the job runner does: run until leadership ends
        self.stopped.append(lease.fence)

    def crashes(self) -> float:
        return self.metrics.registry.get_sample_value(
            "streamlease_leader_keeper_crashes_total") or 0.0


@pytest.mark.virtual_time
async def test_a_crashed_renewal_task_ends_leadership_and_the_candidate_leads_again(
        caplog: pytest.LogCaptureFixture) -> None:
    """The renewal task used to die silently: ``lost`` never set, the jobs kept running on
    a lease nobody renewed, and nobody campaigned."""
    rig = CrashRig()
    try:
        await until(lambda: rig.backend.raised >= 1 and rig.stopped)
        first = rig.started[0]
        assert rig.stopped == [first]  # the job stopped: leadership ended with the crash
        assert not rig.leadership.leading
        rig.backend.broken = False  # the store heals
        await until(lambda: len(rig.started) >= 2 and rig.leadership.leading)
        second = rig.started[-1]
        assert second > first and rig.stopped == [first]
        lease = rig.leadership.lease
        assert lease is not None
        # It leads again for good: renewals go on for several leases, under the same fence.
        since = rig.clock.monotonic()
        await until(lambda: rig.clock.monotonic() - since >= 3 * TTL)
        assert rig.leadership.leading and rig.leadership.lease is lease
        assert rig.started == [first, second] and rig.crashes() == 1
    finally:
        rig.leadership.stop()
        await asyncio.wait_for(rig.task, 10)
    crashed = [r for r in caplog.records if getattr(r, "sl_event", "") == "leader.keeper_crashed"]
    assert len(crashed) == 1 and crashed[0].exc_info is not None


@pytest.mark.virtual_time
async def test_shutdown_after_the_renewal_task_crashed_completes(
        caplog: pytest.LogCaptureFixture) -> None:
    """Leaving after a crash never raises the renewal task's exception into the drain, and
    the lease is resigned: another worker may take it at once."""
    rig = CrashRig()
    await until(lambda: rig.backend.raised >= 1 and rig.stopped)
    rig.leadership.stop()
    await asyncio.wait_for(rig.task, 10)  # returns: no RuntimeError out of release()
    record = await rig.store.stores().leader.read(FLEET_LEASE)
    assert record is None or record.resigned
    assert rig.crashes() == 1 and rig.stopped == rig.started


@pytest.mark.virtual_time
async def test_a_lease_left_after_its_renewal_task_crashed_does_not_raise() -> None:
    """``async with LeaderLease``: ``lost`` set by the crash, ``keeper_error`` says why,
    and leaving resigns instead of raising."""
    store = MemoryStore()
    backend = RenewRaises(store.stores().leader)
    lease = LeaderLease(backend, "billing", "w1", ttl_s=TTL,  # type: ignore[arg-type]
                        heartbeat_s=HEARTBEAT, safety_margin_s=SAFETY, clock=LoopClock())
    async with lease:
        await asyncio.wait_for(lease.lost.wait(), 5)
        assert isinstance(lease.keeper_error, RuntimeError) and not lease.may_write()
    record = await store.stores().leader.read("billing")
    assert record is None or record.resigned


class CountedReads:
    """A leader backend that counts the lease reads made through it."""

    def __init__(self, backend: LeaderBackend) -> None:
        self.backend = backend
        self.reads = 0
        self.consistent: set[bool] = set()  # the consistency each read asked for

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    async def read(self, *args: Any, **kwargs: Any) -> Any:
        self.reads += 1
        self.consistent.add(kwargs.get("consistent", True))
        return await self.backend.read(*args, **kwargs)


async def test_a_candidate_not_next_in_line_reads_the_lease_once_a_lease(
        store: MemoryStore, candidates: list[Candidate]) -> None:
    """Not urgent, a candidate reads the lease once a lease (it still learns who leads),
    and may read it a moment stale (half the read units on DynamoDB); urgent, every
    observation interval, consistently; and it takes over a leader that stopped."""
    candidates.append(Candidate(store, "w0", [idle]))
    await until(lambda: candidates[0].leadership.leading)
    counted = CountedReads(store.stores().leader)
    urgent = [False]
    other = Leadership(context(), counted,  # type: ignore[arg-type]
                       LeadershipSettings(TTL, HEARTBEAT, SAFETY), [idle],
                       eligible=lambda: True, urgent=lambda: urgent[0])
    task = asyncio.create_task(other.run())
    try:
        window = 6 * TTL
        await asyncio.sleep(window)  # the reads in a window, counted
        calm = counted.reads
        assert 1 <= calm <= window / TTL + 2
        assert counted.consistent == {False}
        assert other.leader_seen() == "w0"
        urgent[0] = True
        counted.reads, counted.consistent = 0, set()
        await asyncio.sleep(window)
        assert counted.reads >= 4 * (window / TTL + 2)  # every observe interval (TTL / 12)
        assert counted.consistent == {True}
        await candidates[0].stop()
        await until(lambda: other.leading)
    finally:
        other.stop()
        await asyncio.wait_for(task, 10)

