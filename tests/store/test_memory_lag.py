"""The in-memory store's index lag and stale reads on its own clock, step by step, and the
version log under them (``streamlease.store.versions``)."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable

import pytest

from streamlease.core.lease import LeaseTimings
from streamlease.store import codec
from streamlease.store.memory import PROJECTIONS, MemoryStore
from streamlease.store.versions import IndexLag, VersionLog
from tests.store.lag import ManualClock

T = LeaseTimings(lease_s=20.0, heartbeat_s=5.0, skew_margin_s=1.0, safety_margin_s=2.0)
NOW = 1_700_000_000_000


def store(fixed: float, jitter: float = 0.0) -> tuple[MemoryStore, ManualClock]:
    clock = ManualClock()
    return MemoryStore(clock, index_lag_s=fixed, index_lag_jitter_s=jitter,
                       rng=random.Random(3)), clock


async def orphan_ids(memory: MemoryStore) -> list[str]:
    return [r.stream_id for r in await memory.orphans(NOW, 100)]


async def test_every_index_backed_call_sees_the_table_a_lag_ago() -> None:
    memory, clock = store(1.0)
    await memory.put_started("a", "wss://x/")
    assert await orphan_ids(memory) == []
    clock.advance(0.999)
    assert await orphan_ids(memory) == []
    clock.advance(0.002)
    assert await orphan_ids(memory) == ["a"]
    got = await memory.acquire("a", "w1", NOW, T)
    assert got is not None
    await memory.set_state("a", "STOPPED")
    assert await orphan_ids(memory) == ["a"]  # still the free, STARTED item
    assert await memory.owned_by("w1") == []
    assert await memory.held_stopped(NOW, 10) == []
    assert (await memory.check("a")).stopped  # type: ignore[union-attr]  # current
    clock.advance(1.001)
    assert await orphan_ids(memory) == []
    assert [o.stream_id for o in await memory.owned_by("w1")] == ["a"]
    assert [r.stream_id for r in await memory.held_stopped(NOW, 10)] == ["a"]
    await memory.delete("a")
    assert [o.stream_id for o in await memory.owned_by("w1")] == ["a"]  # deleted, indexed
    clock.advance(1.001)
    assert await memory.owned_by("w1") == []


async def test_jitter_is_drawn_for_every_read_between_the_bounds() -> None:
    memory, clock = store(0.1, 0.2)
    await memory.put_started("a", "wss://x/")
    start = clock.now

    async def seen(after: float) -> set[bool]:
        clock.now = start + after
        return {bool(await orphan_ids(memory)) for _ in range(50)}

    assert await seen(0.099) == {False}
    assert await seen(0.2) == {False, True}
    assert await seen(0.3001) == {True}


async def test_without_lag_every_read_is_current() -> None:
    memory = MemoryStore(index_lag_s=0.0, index_lag_jitter_s=0.0)
    await memory.put_started("a", "wss://x/")
    assert await orphan_ids(memory) == ["a"]


def stale(seconds: float) -> tuple[MemoryStore, ManualClock]:
    clock = ManualClock()
    return MemoryStore(clock, index_lag_s=0.0, index_lag_jitter_s=0.0,
                       stale_reads_s=seconds, rng=random.Random(3)), clock


async def owners_seen(clock: ManualClock, at: float,
                      owner_of: Callable[[], Awaitable[str | None]]) -> set[str | None]:
    """The owners 50 eventually consistent reads show at ``at``: each draws its own
    staleness."""
    clock.now = at
    return {await owner_of() for _ in range(50)}


async def test_an_eventually_consistent_read_may_see_the_previous_version() -> None:
    memory, clock = stale(1.0)
    await memory.put_started("a", "wss://x/")
    clock.advance(2.0)
    got = await memory.acquire("a", "w1", NOW, T)
    assert got is not None
    written = clock.now

    async def owner() -> str | None:
        (record,) = (await memory.check_many(["a"])).values()
        assert record is not None
        return record.lease_owner

    async def owners(after: float) -> set[str | None]:
        return await owners_seen(clock, written + after, owner)

    assert await owners(0.0) == {None}  # up to a second old, and the write is now
    assert await owners(0.5) == {None, "w1"}  # each read draws its own staleness
    assert (await memory.check("a")).lease_owner == "w1"  # type: ignore[union-attr]
    assert await owners(1.0001) == {"w1"}


async def test_a_calm_leader_lease_read_may_see_the_lease_as_it_was() -> None:
    """As on DynamoDB: a leader lease read with ``consistent=False`` answers from up to
    ``stale_reads_s`` ago (absent, if the lease is newer than that); a consistent one is
    current."""
    memory, clock = stale(1.0)
    leader = memory.stores().leader
    clock.advance(2.0)
    fence = await leader.acquire("lease", "a", 10, None, NOW)
    assert fence is not None
    written = clock.now

    async def owner() -> str | None:
        record = await leader.read("lease", consistent=False)
        return None if record is None else record.owner

    async def owners(after: float) -> set[str | None]:
        return await owners_seen(clock, written + after, owner)

    assert await owners(0.0) == {None}  # up to a second old, and the lease is now
    assert await owners(0.5) == {None, "a"}
    current = await leader.read("lease")
    assert current is not None and current.owner == "a"
    assert await owners(1.0001) == {"a"}


async def test_stale_reads_can_miss_a_new_item_and_show_a_deleted_one() -> None:
    memory, clock = stale(1.0)
    await memory.put_started("old", "wss://x/")
    clock.advance(2.0)
    before = await memory.check("old")
    await memory.put_started("new", "wss://x/")
    await memory.delete("old")
    assert before is not None
    assert await memory.check_many(["new", "old"]) == {"new": None, "old": before}
    assert await memory.check("new") is not None and await memory.check("old") is None
    clock.advance(1.0001)
    found = await memory.check_many(["new", "old"])
    assert found["new"] is not None and found["old"] is None


async def test_without_stale_reads_every_read_is_current_and_draws_nothing() -> None:
    """The default: ``check_many`` returns each item as it is now, and leaves the jitter's
    generator alone (a virtual-time test with lagging indexes replays as before)."""
    memory = MemoryStore(index_lag_s=0.1, index_lag_jitter_s=0.2, rng=random.Random(3))
    assert memory.stale_reads_s == 0.0
    await memory.put_started("a", "wss://x/")
    got = await memory.acquire("a", "w1", NOW, T)
    assert got is not None
    state = memory.rng.getstate()
    assert await memory.check_many(["a", "b"]) == {"a": got.record, "b": None}
    assert memory.rng.getstate() == state


def test_projections_follow_the_table_definition() -> None:
    assert PROJECTIONS[codec.OWNER_INDEX_NAME] == {"Pk", "lease_owner", "fence"}
    assert PROJECTIONS[codec.INDEX_NAME] == {"Pk", "desired_state", "lease_expires_at_ms",
                                             *codec.INDEX_PROJECTED}
    assert "last_seq" not in PROJECTIONS[codec.INDEX_NAME]


def test_the_version_log_answers_as_of_any_moment_in_its_window() -> None:
    log: VersionLog[str, str] = VersionLog(window_s=1.0)
    log.record("k", None, 10.0)  # created at 10
    log.record("k", "v1", 10.5)  # v1 replaced at 10.5
    log.record("k", "v2", 10.5)  # and again in the same request: the first entry counts
    log.record("j", "w1", 10.7)
    assert log.as_of(9.9) == {"k": None, "j": "w1"}
    assert log.as_of(10.2) == {"k": "v1", "j": "w1"}
    assert log.as_of(10.6) == {"j": "w1"}
    assert log.as_of(10.7) == {}  # nothing written after: current
    assert log.version_at("k", 9.9) == (True, None)  # not yet created
    assert log.version_at("k", 10.2) == (True, "v1")
    assert log.version_at("k", 10.5) == log.version_at("x", 0.0) == (False, None)
    log.prune(11.6)  # 10.0 and 10.5 are out of any read's reach
    assert len(log) == 1 and log.as_of(10.65) == {"j": "w1"}
    log.prune(12.0)
    assert len(log) == 0 and log.as_of(0.0) == {}


def test_lag_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="index lag"):
        IndexLag(-0.1)
    with pytest.raises(ValueError, match="index lag jitter"):
        IndexLag(0.0, float("nan"))
    with pytest.raises(ValueError):
        MemoryStore(index_lag_s=11.0)
    for bad in (-0.1, 10.5, float("nan")):
        with pytest.raises(ValueError, match="stale reads"):
            MemoryStore(stale_reads_s=bad)
