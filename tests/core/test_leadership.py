"""The leader fence rules: a lease's fence never goes back, whatever the clocks, even
when its record is lost (no event loop, no store)."""

from __future__ import annotations

import random

import pytest

from streamlease.core.leadership import initial_fence, next_fence, raised_fence_mark

WALL = 1_800_000_000_000
HOUR = 3_600_000


@pytest.mark.parametrize(("wall_ms", "high_water", "expected"), [
    pytest.param(WALL, 0, WALL, id="never held: the wall clock"),
    pytest.param(WALL - HOUR, WALL + 5, WALL + 6,
                 id="record lost, clock an hour behind: above the high-water mark"),
    pytest.param(WALL, WALL - HOUR, WALL, id="mark behind the clock: the clock"),
    pytest.param(WALL, WALL, WALL + 1, id="mark equal to the clock: one above it"),
    pytest.param(WALL, WALL - 1, WALL, id="mark one below the clock: the clock"),
    pytest.param(0, 0, 1, id="clock at the epoch: fence 1"),
    pytest.param(-5, 0, 1, id="clock before the epoch: fence 1"),
    pytest.param(0, 41, 42, id="clock at the epoch, mark kept: one above it"),
])
def test_initial_fence(wall_ms: int, high_water: int, expected: int) -> None:
    assert initial_fence(wall_ms, high_water) == expected


@pytest.mark.parametrize(("current", "high_water", "wall_ms", "expected"), [
    pytest.param(7, 7, WALL, 8, id="held before: one above, the clock ignored"),
    pytest.param(7, 0, WALL, 8, id="held before, no mark known (an older table): one above"),
    pytest.param(7, 3, WALL, 8, id="mark below the record: one above the record"),
    pytest.param(5, WALL + 2, WALL, WALL + 3,
                 id="record set lower by hand: one above the mark"),
    pytest.param(None, 0, WALL, WALL, id="no record, no mark: the wall clock"),
    pytest.param(None, WALL + 2, WALL - HOUR, WALL + 3,
                 id="no record, clock behind: one above the mark"),
])
def test_next_fence(current: int | None, high_water: int, wall_ms: int,
                    expected: int) -> None:
    assert next_fence(current, high_water, wall_ms) == expected


@pytest.mark.parametrize(("high_water", "fence", "expected"), [
    pytest.param(0, 7, 7, id="first acquisition"),
    pytest.param(9, 7, 9, id="a lower fence never lowers it"),
    pytest.param(9, 9, 9, id="equal"),
    pytest.param(9, 10, 10, id="raised"),
])
def test_the_fence_mark_never_goes_down(high_water: int, fence: int, expected: int) -> None:
    assert raised_fence_mark(high_water, fence) == expected


def test_fences_never_decrease_across_lost_records_whatever_the_clocks() -> None:
    """Take, hand over, lose and re-create one lease many times from machines whose
    clocks jump back and forth by hours: every fence is above every earlier one."""
    rng = random.Random(7)
    high_water, record, highest = 0, None, 0
    for _ in range(500):
        clock = WALL + rng.randint(-3 * HOUR, 3 * HOUR)
        fence = next_fence(record, high_water, clock)
        assert fence > highest
        highest, high_water = fence, raised_fence_mark(high_water, fence)
        roll = rng.random()
        if roll < 0.3:
            record = None  # lost: deleted by hand, an older backup restored
        elif roll < 0.4:
            record = rng.randint(1, fence)  # set lower by hand
        else:
            record = fence
