"""The leader lease contract, for every backend (the ``backend`` fixture in conftest.py
names each): one holder at a time, fences that only move forward, renewals only by the
holder, resignation, takeover by observation, and fenced writes that refuse a stale
holder atomically."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from streamlease.core.membership import HeartbeatOutcome
from streamlease.errors import StaleFence
from streamlease.leader import LeaderLease, PutItem, WriteRefused
from tests.leader.conftest import Backend

NOW = 1_800_000_000_000


def lease_name() -> str:
    return f"lease-{uuid.uuid4().hex[:8]}"


async def test_one_holder_and_fences_that_only_move_forward(backend: Backend) -> None:
    name = lease_name()
    assert await backend.impl.read(name) is None
    first = await backend.impl.acquire(name, "a", 10, None, NOW)
    assert first is not None
    assert await backend.impl.acquire(name, "b", 10, None, NOW) is None  # not absent any more
    held = await backend.impl.read(name)
    assert held is not None and (held.owner, held.fence) == ("a", first)
    fences = [first]
    for i, owner in enumerate(["b", "c", "a", "b"]):
        seen = await backend.impl.read(name)
        assert seen is not None
        assert await backend.impl.resign(name, seen.owner or "", seen.fence) is True
        resigned = await backend.impl.read(name)
        taken = await backend.impl.acquire(name, owner, 10, resigned, NOW + i)
        assert taken is not None
        fences.append(taken)
    assert fences == sorted(set(fences)) and len(fences) == 5


async def test_a_calm_read_shows_the_holder_and_fence_a_consistent_one_shows(
        backend: Backend) -> None:
    """``consistent=False`` (a candidate's calm read) is a read every backend answers: it
    shows the holder and fence the consistent read shows."""
    name = lease_name()
    assert await backend.impl.read(name, consistent=False) is None
    fence = await backend.impl.acquire(name, "a", 10, None, NOW)
    assert fence is not None
    consistent = await backend.impl.read(name)
    calm = await backend.impl.read(name, consistent=False)
    assert consistent is not None and calm is not None
    assert (calm.owner, calm.fence) == (consistent.owner, consistent.fence) == ("a", fence)


async def test_only_the_holder_renews_and_a_resigned_lease_is_taken_at_once(
        backend: Backend) -> None:
    name = lease_name()
    fence = await backend.impl.acquire(name, "a", 10, None, NOW)
    assert fence is not None
    assert await backend.impl.renew(name, "a", fence, 10, NOW) is HeartbeatOutcome.RENEWED
    assert await backend.impl.renew(name, "b", fence, 10, NOW) is HeartbeatOutcome.FENCED
    assert await backend.impl.renew(name, "a", fence - 1, 10, NOW) is HeartbeatOutcome.FENCED
    assert await backend.impl.resign(name, "b", fence) is False
    assert await backend.impl.resign(name, "a", fence) is True
    # A late renewal never resurrects a resigned lease.
    assert await backend.impl.renew(name, "a", fence, 10, NOW) is HeartbeatOutcome.FENCED
    seen = await backend.impl.read(name)
    new = await backend.impl.acquire(name, "b", 10, seen, NOW)
    assert new is not None and new > fence


async def test_a_stale_holders_fenced_write_is_refused_and_writes_nothing(
        backend: Backend) -> None:
    name = lease_name()
    old = await backend.impl.acquire(name, "a", 10, None, NOW)
    assert old is not None
    await backend.impl.fenced_write(name, old, backend.write("slot-1", f"a:{old}"))
    assert await backend.written("slot-1") == f"a:{old}"
    # b takes over (a resigned, or was observed dead: either way the fence moves on).
    seen = await backend.impl.read(name)
    assert seen is not None
    if backend.observe_takeover:
        new = await backend.impl.acquire(name, "b", 10, seen, NOW)
    else:
        await backend.expire(name)
        new = await backend.impl.acquire(name, "b", 10, None, NOW)
    assert new is not None and new > old
    with pytest.raises(StaleFence):
        await backend.impl.fenced_write(name, old, backend.write("slot-2", f"a:{old}"))
    assert await backend.written("slot-2") is None
    await backend.impl.fenced_write(name, new, backend.write("slot-2", f"b:{new}"))
    assert await backend.written("slot-2") == f"b:{new}"
    assert await backend.impl.renew(name, "a", old, 10, NOW) is HeartbeatOutcome.FENCED


async def test_a_writes_own_condition_is_kept(backend: Backend) -> None:
    # The job runner relies on the flag to choose how it claims slots.
    assert backend.impl.conditional_puts is backend.conditional_writes
    if not backend.conditional_writes:
        with pytest.raises(TypeError):
            await backend.impl.fenced_write(lease_name(), 1, PutItem(
                "t", {"Pk": {"S": "x"}}, "attribute_not_exists(#pk)", {"#pk": "Pk"}))
        return
    name = lease_name()
    fence = await backend.impl.acquire(name, "a", 10, None, NOW)
    assert fence is not None
    await backend.impl.fenced_write(name, fence, backend.write("once", "1", unique=True))
    with pytest.raises(WriteRefused):
        await backend.impl.fenced_write(name, fence, backend.write("once", "2", unique=True))
    assert await backend.written("once") == "1"


async def test_lease_context_takes_over_a_silent_holder_and_the_old_one_learns(
        backend: Backend) -> None:
    name = lease_name()
    ttl = 0.6
    silent = LeaderLease(backend.impl, name, "silent", ttl_s=ttl, heartbeat_s=0.15,
                         safety_margin_s=0.06)
    await silent.acquire()
    old = silent.fence
    assert silent._keeper is not None
    silent._keeper.cancel()  # it stops renewing, as a paused or partitioned process would
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with LeaderLease(backend.impl, name, "next", ttl_s=ttl, heartbeat_s=0.15,
                           safety_margin_s=0.06) as lease:
        took = loop.time() - started
        assert lease.fence > old and lease.may_write()
        assert ttl * 0.9 <= took <= ttl * 4 + 1.0  # by observation, not before a ttl
        with pytest.raises(StaleFence):
            await silent.fenced_write(backend.write("k", "stale"))
        await lease.fenced_write(backend.write("k", "fresh"))
    assert await backend.written("k") == "fresh"
    record = await backend.impl.read(name)
    assert record is None or record.resigned  # resigned on the way out


async def test_lost_is_set_when_the_lease_is_taken_from_the_holder(backend: Backend) -> None:
    name = lease_name()
    async with LeaderLease(backend.impl, name, "a", ttl_s=0.8, heartbeat_s=0.1,
                           safety_margin_s=0.08) as lease:
        seen = await backend.impl.read(name)
        assert seen is not None
        # Another owner takes it as if it had observed this holder dead.
        if backend.observe_takeover:
            assert await backend.impl.acquire(name, "b", 0.8, seen, NOW) is not None
        else:
            await backend.expire(name)
            assert await backend.impl.acquire(name, "b", 0.8, None, NOW) is not None
        async with asyncio.timeout(5):
            await lease.lost.wait()
        assert not lease.may_write()


async def _hand_over(backend: Backend, name: str, owners: list[str], now_ms: int) -> list[int]:
    """Resign and re-take the held lease once per owner; the fences handed out."""
    fences = []
    for owner in owners:
        seen = await backend.impl.read(name)
        assert seen is not None
        assert await backend.impl.resign(name, seen.owner or "", seen.fence) is True
        taken = await backend.impl.acquire(name, owner, 10, await backend.impl.read(name),
                                           now_ms)
        assert taken is not None
        fences.append(taken)
    return fences


async def test_a_lost_item_recreated_by_a_clock_behind_moves_the_fence_forward(
        backend: Backend) -> None:
    """The lease's item is lost (deleted by hand, an older backup restored) and a machine
    whose clock is an hour behind the one that created it takes the lease again: its
    fence is still above every fence handed out before, so targets that refuse fences
    below the highest they have seen accept the new leader."""
    name = lease_name()
    first = await backend.impl.acquire(name, "a", 10, None, NOW)
    assert first is not None
    fences = [first, *await _hand_over(backend, name, ["b", "c"], NOW)]
    behind = NOW - 3_600_000
    for owner in ("d", "e"):  # lost twice, each time re-created further behind
        await backend.forget(name)
        assert await backend.impl.read(name) is None
        again = await backend.impl.acquire(name, owner, 10, None, behind)
        assert again is not None
        assert again == max(fences) + 1, (fences, again)
        fences.append(again)
        behind -= 3_600_000
    # Every earlier holder is refused; the new one writes.
    for stale in fences[:-1]:
        with pytest.raises(StaleFence):
            await backend.impl.fenced_write(name, stale, backend.write("after-loss", "old"))
    await backend.impl.fenced_write(name, fences[-1], backend.write("after-loss", "new"))
    assert await backend.written("after-loss") == "new"


async def test_a_normal_acquisition_hands_out_what_it_did_before(backend: Backend) -> None:
    """Recording the fence's high-water mark changes no acquisition's outcome: each new
    leader's fence is the last one plus one and is what a read shows; a refused attempt
    returns None and moves nothing (not even the mark: the next fence is still +1)."""
    name = lease_name()
    first = await backend.impl.acquire(name, "a", 10, None, NOW)
    assert first is not None
    held = await backend.impl.read(name)
    assert held is not None and (held.owner, held.fence) == ("a", first)
    assert await backend.impl.acquire(name, "b", 10, None, NOW) is None  # present now
    fences = await _hand_over(backend, name, ["b", "c"], NOW + 1)
    assert fences == [first + 1, first + 2]
    seen = await backend.impl.read(name)
    assert seen is not None and (seen.owner, seen.fence) == ("c", first + 2)
    if backend.observe_takeover:
        # Taken from a silent holder exactly as seen; a second taker with the same view
        # loses, and the one after it moves the fence on by one only.
        assert await backend.impl.acquire(name, "d", 10, seen, NOW + 2) == first + 3
        assert await backend.impl.acquire(name, "e", 10, seen, NOW + 2) is None
        now_held = await backend.impl.read(name)
        assert now_held is not None and (now_held.owner, now_held.fence) == ("d", first + 3)
        assert await backend.impl.acquire(name, "e", 10, now_held, NOW + 3) == first + 4


async def test_a_fence_set_below_the_mark_by_hand_is_passed_on_the_next_acquisition(
        backend: Backend) -> None:
    """A lease item whose fence was set lower by hand (or restored on its own) is taken
    over above every fence handed out before, not at its own fence plus one."""
    if backend.rewind is None:
        pytest.skip("the fence is kept apart from the lease's record")
    name = lease_name()
    first = await backend.impl.acquire(name, "a", 10, None, NOW)
    assert first is not None
    fences = [first, *await _hand_over(backend, name, ["b"], NOW)]
    await backend.rewind(name, 5)
    seen = await backend.impl.read(name)
    assert seen is not None and seen.fence == 5
    if not backend.observe_takeover:
        await backend.expire(name)  # the server's clock, not an observation, frees it
        seen = None
    taken = await backend.impl.acquire(name, "c", 10, seen, NOW)
    assert taken == max(fences) + 1
    record = await backend.impl.read(name)
    assert record is not None and (record.owner, record.fence) == ("c", taken)
