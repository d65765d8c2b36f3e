"""The fleet leader's duties on the in-memory store: one leader among candidates, a
crashing duty restarted without ending leadership, the gauge dropped the moment the lease
is lost (not once duties wind down), and a resignation taken over at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from streamlease.clock import SYSTEM_CLOCK
from streamlease.leader import LeaderLease
from streamlease.leadership import FLEET_LEASE, Leadership, LeadershipSettings
from streamlease.metrics import Metrics
from streamlease.store.memory import MemoryStore

TTL, HEARTBEAT, SAFETY = 0.6, 0.1, 0.06


class Candidate:
    def __init__(self, store: MemoryStore, owner: str, duties: list, eligible: bool = True,
                 ) -> None:  # type: ignore[type-arg]
        self.metrics = Metrics()
        self.eligible = eligible
        self.leadership = Leadership(
            store.stores().leader, SYSTEM_CLOCK, self.metrics,
            LeadershipSettings(owner, TTL, HEARTBEAT, SAFETY), duties,
            eligible=lambda: self.eligible)
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
    assert first.leadership.settings.owner != "draining" and first.gauge() == 1
    # Resigning hands over at once (no lease to wait out) to another eligible worker.
    await first.stop()
    candidates.remove(first)
    await until(leaders, timeout=TTL)
    (second,) = leaders()
    assert second.leadership.settings.owner != "draining" and second.gauge() == 1
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
