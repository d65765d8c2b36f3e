"""The in-memory store's index lag on its own clock, step by step, and the version log
under it (``streamlease.store.versions``)."""

from __future__ import annotations

import random

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
