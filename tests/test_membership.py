"""Membership in virtual time: several members on one in-memory fleet table, one of them
silenced, fenced, revived; failures injected into releases."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from streamlease.core.lease import LeaseTimings
from streamlease.core.membership import MemberStatus, MemberTimings
from streamlease.errors import StoreUnavailable
from streamlease.membership import Hooks, Membership, MembershipSettings
from streamlease.metrics import Metrics
from streamlease.store.memory import MemoryStore
from tests.fakes import FaultyStore
from tests.virtual import LoopClock

pytestmark = pytest.mark.virtual_time

T = MemberTimings(lease_s=2.0, heartbeat_s=0.5, safety_margin_s=0.2)
STREAM = LeaseTimings(lease_s=60.0, heartbeat_s=20.0, skew_margin_s=0.3, safety_margin_s=0.2)


@dataclass
class Calls:
    fenced: int = 0
    self_fenced: int = 0
    changed: int = 0
    held: int = 0
    log: list[str] = field(default_factory=list)


def member(store: FaultyStore, name: str, calls: Calls) -> Membership:
    hooks = Hooks(held=lambda: calls.held,
                  fenced=lambda: setattr(calls, "fenced", calls.fenced + 1),
                  self_fenced=lambda: setattr(calls, "self_fenced", calls.self_fenced + 1),
                  fleet_changed=lambda: setattr(calls, "changed", calls.changed + 1))
    return Membership(store, store, LoopClock(), Metrics(),
                      MembershipSettings(name, 10, T), hooks)  # type: ignore[arg-type]


async def held_by(memory: MemoryStore, owner: str, count: int, epoch: int) -> list[str]:
    ids = []
    for i in range(count):
        sid = f"{owner}-s{i}"
        await memory.put_started(sid, "wss://x/")
        got = await memory.acquire(sid, owner, LoopClock().wall_ms(), STREAM, epoch=epoch)
        assert got is not None
        ids.append(sid)
    return ids


async def test_a_silent_member_is_fenced_once_and_its_streams_released() -> None:
    memory = MemoryStore()
    store = FaultyStore(memory)
    calls = {n: Calls() for n in "abc"}
    members = {n: member(store, n, calls[n]) for n in "abc"}
    for m in members.values():
        await m.register()
    streams = await held_by(memory, "c", 5, members["c"].epoch)
    tasks = {n: asyncio.create_task(m.run()) for n, m in members.items()}
    await asyncio.sleep(3)
    tasks["c"].cancel()  # c stops heartbeating (a crash, a pause, a partition)
    silenced = asyncio.get_running_loop().time()
    await asyncio.sleep(T.lease_s + 4)
    rows = {m.worker_id: m for m in await memory.members()}
    assert rows["c"].status is MemberStatus.DEAD and rows["c"].released
    assert store.count("fence") == 1, "the preferred peer fences; the other need not try"
    for sid in streams:
        record = await memory.get(sid)
        assert record is not None and record.lease_expires_at_ms == 0 and record.fence == 2
    # Not before a lease after its last heartbeat was received.
    (fenced_at,) = [t for name, t in store.sent_at if name == "fence"]
    assert fenced_at - silenced >= T.lease_s - T.heartbeat_s
    assert calls["a"].changed and calls["b"].changed
    for m in members.values():
        m.stop()
    await asyncio.gather(*tasks.values(), return_exceptions=True)


async def test_a_failed_release_leaves_the_row_unreleased_and_a_later_pass_finishes(
        ) -> None:
    memory = MemoryStore()
    store = FaultyStore(memory)
    a, b = Calls(), Calls()
    ma, mb = member(store, "a", a), member(store, "b", b)
    await ma.register()
    await mb.register()
    streams = await held_by(memory, "b", 3, mb.epoch)
    store.fail("release_for", times=6, error=StoreUnavailable("injected"))
    task = asyncio.create_task(ma.run())
    await asyncio.sleep(T.lease_s + 3)  # b never heartbeats: dead, fenced, releases fail
    row = {m.worker_id: m for m in await memory.members()}["b"]
    assert row.status is MemberStatus.DEAD and not row.released
    await asyncio.sleep(T.lease_s * 3)  # a later pass (any member) finishes the job
    row = {m.worker_id: m for m in await memory.members()}["b"]
    assert row.released
    for sid in streams:
        assert (await memory.get(sid)).lease_expires_at_ms == 0  # type: ignore[union-attr]
    ma.stop()
    await asyncio.gather(task, return_exceptions=True)


async def test_a_fenced_member_stops_everything_and_registers_afresh_still_draining() -> None:
    memory = MemoryStore()
    store = FaultyStore(memory)
    calls = Calls()
    m = member(store, "a", calls)
    await m.register()
    first = m.epoch
    task = asyncio.create_task(m.run())
    await asyncio.sleep(1)
    m.drain()
    await asyncio.sleep(0.2)
    row = (await memory.members())[0]
    assert await memory.fence(row, "peer", 0) is not None  # a peer declared it dead
    await asyncio.sleep(T.heartbeat_s * 3)
    assert calls.fenced == 1
    row = (await memory.members())[0]
    assert m.epoch > first + 1 and row.epoch == m.epoch
    assert row.status is MemberStatus.DRAINING, "a drainer must not come back as ACTIVE"
    m.stop()
    await asyncio.gather(task, return_exceptions=True)


async def test_heartbeats_failing_past_the_deadline_self_fence_and_recover() -> None:
    memory = MemoryStore()
    store = FaultyStore(memory)
    calls = Calls()
    m = member(store, "a", calls)
    await m.register()
    task = asyncio.create_task(m.run())
    await asyncio.sleep(1)
    store.fail("heartbeat", times=-1)
    await asyncio.sleep(T.lease_s)
    assert calls.self_fenced == 1 and not m.may_write(LoopClock().monotonic())
    store.heal()
    await asyncio.sleep(T.heartbeat_s * 2)
    assert m.may_write(LoopClock().monotonic()), "nobody fenced it: alive again"
    assert calls.fenced == 0
    m.stop()
    await asyncio.gather(task, return_exceptions=True)


async def test_epochs_keep_moving_forward_after_the_row_is_deleted() -> None:
    memory = MemoryStore()
    store = FaultyStore(memory)
    m = member(store, "a", Calls())
    await m.register()
    await m.register()
    second = m.epoch
    await m.leave()
    await asyncio.sleep(1)  # the wall clock moves on too
    m2 = member(store, "a", Calls())
    await m2.register()
    assert m2.epoch > second


async def test_a_strained_store_is_read_once_a_heartbeat_instead_of_twice() -> None:
    store = FaultyStore(MemoryStore())
    m = member(store, "a", Calls())
    await m.register()
    task = asyncio.create_task(m.run())
    await asyncio.sleep(1.0)
    before = store.count("members")
    await asyncio.sleep(5.0)
    healthy = store.count("members") - before
    store.fail("heartbeat", times=-1, delay=T.heartbeat_s / 2)  # slow, then unanswered
    await asyncio.sleep(1.0)
    before = store.count("members")
    await asyncio.sleep(5.0)
    strained = store.count("members") - before
    assert healthy >= 18 and strained <= 12, (healthy, strained)  # every 0.25 s vs 0.5 s
    m.stop()
    await asyncio.gather(task, return_exceptions=True)
