"""A dead member's streams pass straight to the survivors, in virtual time: every survivor
deals them the same way and takes its part with one conditional write per stream; what
nobody takes is released by the fencer after the deal window and acquired as usual."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

from streamlease import tenancy
from streamlease.core.deal import deal, deal_weights
from streamlease.core.lease import LeaseTimings
from streamlease.core.membership import MemberStatus, MemberTimings
from streamlease.core.urls import parse_allowed_urls
from streamlease.membership import Hooks, Membership, MembershipSettings
from streamlease.metrics import Metrics
from streamlease.pump import PumpSettings
from streamlease.reconciler import Reconciler, ReconcilerSettings
from streamlease.store.memory import MemoryStore
from streamlease.supervisor import SupervisorSettings
from tests.fakes import FaultyStore, PumpScript, context
from tests.virtual import LoopClock

pytestmark = pytest.mark.virtual_time

T = MemberTimings(lease_s=2.0, heartbeat_s=0.5, safety_margin_s=0.2)
STREAM = LeaseTimings(lease_s=60.0, heartbeat_s=20.0, skew_margin_s=0.3, safety_margin_s=0.2)
DEAD_STREAMS = 40


@dataclass
class Worker:
    membership: Membership
    reconciler: Reconciler | None
    metrics: Metrics
    tasks: list[asyncio.Task[None]]

    def taken(self) -> float:
        value = self.metrics.registry.get_sample_value("streamlease_dead_streams_taken_total")
        return value or 0.0


def worker(store: FaultyStore, name: str, reconciles: bool = True, holds: int = 0) -> Worker:
    """A member; without a reconciler, its heartbeats report ``holds`` streams held."""
    clock, metrics = LoopClock(), Metrics()
    box: list[Reconciler] = []
    membership = Membership(  # type: ignore[arg-type]
        context(clock=clock, metrics=metrics, leases=store), store,
        MembershipSettings(name, 100, T), Hooks(
            held=lambda: len(box[0].supervisors) if box else holds,
            fenced=lambda: box[0].member_lost(True) if box else None,
            self_fenced=lambda: box[0].member_lost(False) if box else None,
            fleet_changed=lambda: box[0].poke() if box else None))
    if not reconciles:
        return Worker(membership, None, metrics, [])
    reconciler = Reconciler(context(store, clock, metrics, leases=store, owner=name),
                            ReconcilerSettings(
        reconcile_s=5.0, sweep_s=60.0, max_streams=100, acquire_per_cycle=10,
        stopped_check_s=T.heartbeat_s, min_hold_s=1000.0, second_pass_s=1.0,
        supervisor=SupervisorSettings(timings=STREAM, allowed_urls=parse_allowed_urls("wss://"),
                                      pump=PumpSettings(), call_timeout_s=1.0,
                                      drain_timeout_s=2.0)),
        membership, tenancy.Hooks(pump_factory=PumpScript(every=10.0).factory()))
    box.append(reconciler)
    return Worker(membership, reconciler, metrics, [])


def supervised(workers: list[Worker]) -> int:
    return sum(len(w.reconciler.supervisors) for w in workers if w.reconciler is not None)


async def start(w: Worker) -> None:
    await w.membership.register()
    w.tasks.append(asyncio.create_task(w.membership.run()))
    if w.reconciler is not None:
        w.tasks.append(asyncio.create_task(w.reconciler.run()))


async def stop(workers: list[Worker]) -> None:
    for w in workers:
        if w.reconciler is not None:
            w.reconciler.stop()
        w.membership.stop()
    await asyncio.gather(*(t for w in workers for t in w.tasks), return_exceptions=True)


async def dead_member_holding(memory: MemoryStore, store: FaultyStore) -> tuple[Worker, list[str]]:
    """A member "dead" that holds DEAD_STREAMS streams, heartbeating (no reconciler)."""
    dead = worker(store, "dead", reconciles=False, holds=DEAD_STREAMS)
    await start(dead)
    ids = []
    for i in range(DEAD_STREAMS):
        sid = f"s{i:02}"
        await memory.put_started(sid, f"wss://feeds.example.com/{sid}")
        got = await memory.acquire(sid, "dead", LoopClock().wall_ms(), STREAM,
                                   epoch=dead.membership.epoch)
        assert got is not None
        ids.append(sid)
    return dead, ids


async def owners(memory: MemoryStore, ids: list[str]) -> dict[str, tuple[str | None, int | None]]:
    found = {}
    for sid in ids:
        record = await memory.get(sid)
        assert record is not None
        found[sid] = (record.lease_owner, record.fence if record.lease_expires_at_ms else None)
    return found


async def test_survivors_take_a_dead_members_streams_straight_over_by_share() -> None:
    memory = MemoryStore()
    store = FaultyStore(memory)
    dead, ids = await dead_member_holding(memory, store)
    survivors = [worker(store, name) for name in ("a", "b", "c")]
    for w in survivors:
        await start(w)
    await asyncio.sleep(2 * T.heartbeat_s)  # everyone has read everyone's row
    dead.membership.stop()  # a kill -9: no release, the row stays as it was
    await asyncio.gather(*dead.tasks, return_exceptions=True)
    async with asyncio.timeout(4 * T.lease_s):
        while supervised(survivors) < DEAD_STREAMS:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    held = await owners(memory, ids)
    # One write each: fence 1 -> 2, straight from the dead incarnation to a survivor.
    assert {fence for _, fence in held.values()} == {2}
    parts = Counter(owner for owner, _ in held.values())
    assert set(parts) == {"a", "b", "c"} and min(parts.values()) >= DEAD_STREAMS // 6, parts
    assert store.count("release_for") == 0, "nothing was released and raced for"
    assert store.count("acquire") == 0, "nothing went through the orphan index"
    assert sum(w.taken() for w in survivors) == DEAD_STREAMS
    for w in survivors:
        assert w.reconciler is not None
        assert {sid for sid, (owner, _) in held.items() if owner == w.membership.me} == \
            set(w.reconciler.supervisors)
    # The fencer finds nothing left to release and marks the row released.
    async with asyncio.timeout(4 * T.lease_s):
        while not any(m.worker_id == "dead" and m.released  # noqa: ASYNC110
                      for m in await memory.members()):
            await asyncio.sleep(0.05)
    rows = {m.worker_id: m for m in await memory.members()}
    assert rows["dead"].status is MemberStatus.DEAD
    await stop(survivors)


async def test_a_part_nobody_takes_is_released_after_the_deal_window_and_acquired() -> None:
    """Survivor "idle" reads the fleet but takes nothing (its reconciler is not running):
    its part stays leased to the dead incarnation until the fencer releases it, and the
    others acquire it as orphans."""
    memory = MemoryStore()
    store = FaultyStore(memory)
    dead, ids = await dead_member_holding(memory, store)
    active = [worker(store, name) for name in ("a", "b")]
    idle = worker(store, "idle", reconciles=False)
    for w in [*active, idle]:
        await start(w)
    await asyncio.sleep(2 * T.heartbeat_s)
    dead.membership.stop()
    await asyncio.gather(*dead.tasks, return_exceptions=True)
    async with asyncio.timeout(20 * T.lease_s):
        while supervised(active) < DEAD_STREAMS:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    held = await owners(memory, ids)
    assert {owner for owner, _ in held.values()} <= {"a", "b"}
    taken = sum(w.taken() for w in active)
    released = store.count("release_for")
    assert 0 < taken < DEAD_STREAMS and released > 0, (taken, released)
    # Taken straight over: fence 2; released on its behalf (fence 2) then acquired: 3.
    fences = Counter(fence for _, fence in held.values())
    assert fences == {2: taken, 3: DEAD_STREAMS - taken}
    # Every survivor dealt "idle" its part; a second look took some of it anyway (up to
    # each taker's weight), so the fencer released less than that part.
    weights = deal_weights(dict.fromkeys(("a", "b", "idle"), 0),
                           dict.fromkeys(("a", "b", "idle"), 100), DEAD_STREAMS)
    idle_part = sum(1 for owner in deal(ids, weights).values() if owner == "idle")
    assert taken > DEAD_STREAMS - idle_part and released < idle_part, (taken, idle_part)
    await stop([*active, idle])


async def test_a_take_over_whose_output_is_still_starting_at_shutdown_is_handed_back() -> None:
    """SIGTERM while a taken-over stream's output starts: no supervisor starts after the
    drain (it would never be asked to drain, and the worker would not exit), and the
    lease goes back."""
    memory = MemoryStore()
    store = FaultyStore(memory)
    dead, ids = await dead_member_holding(memory, store)
    a = worker(store, "a")
    assert a.reconciler is not None
    opening, proceed = asyncio.Event(), asyncio.Event()
    holdings = a.reconciler.holdings
    real = holdings.ctx.sink

    class SlowOpen:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        async def open(self, tenure: Any, record: Any) -> int:
            opening.set()
            await proceed.wait()
            return int(await real.open(tenure, record))

    holdings.ctx = dataclasses.replace(holdings.ctx, sink=SlowOpen())  # type: ignore[arg-type]
    await start(a)
    await asyncio.sleep(2 * T.heartbeat_s)
    dead.membership.stop()
    await asyncio.gather(*dead.tasks, return_exceptions=True)
    await asyncio.wait_for(opening.wait(), 4 * T.lease_s)
    a.reconciler.stop(release_by=asyncio.get_running_loop().time() + 5)
    # Virtual time: every task ready now runs (the reconciler's loop ends and drains what
    # it holds) before the clock moves on to let the output finish starting.
    await asyncio.sleep(0.1)
    proceed.set()
    await asyncio.wait_for(a.tasks[1], 30)  # the reconciler ends: nothing left running
    assert not a.reconciler.supervisors
    held = await owners(memory, ids)
    assert all(owner != "a" or fence is None for owner, fence in held.values()), held
    a.membership.stop()
    await asyncio.gather(*a.tasks, return_exceptions=True)


@pytest.mark.parametrize(("first_look_s", "second_at_s"), [
    (0.5, 2.0),  # a quick first look: the second one a second look's wait after its start
    (3.0, 3.0),  # a large part still being taken then: the second look follows at once
])
async def test_the_second_look_is_timed_from_the_first_ones_start(
        first_look_s: float, second_at_s: float) -> None:
    """The fencer's deal window counts from the fence: a survivor still taking a large
    part must not look for leftovers only a whole wait after it finished (by then the
    fencer has released them to the slower orphan path)."""
    from streamlease.core.membership import MemberRecord
    from streamlease.takeover import Takeover, TakeoverSettings

    clock = LoopClock()
    looks: list[tuple[float, int]] = []

    class Parts(Takeover):
        async def _take_dead_part(self, dead: MemberRecord, weights: dict[str, int] | None,
                                  leftovers: int = 0) -> tuple[int, int]:
            looks.append((clock.monotonic(), leftovers))
            if len(looks) == 1:
                await asyncio.sleep(first_look_s)
                return 7, 9  # took 7 of a weight of 9
            return 0, 9

    settings = TakeoverSettings(max_streams=100, timings=STREAM, call_s=0.5, second_pass_s=2.0)
    takeover = Parts(context(clock=clock, owner="a"), None, settings,  # type: ignore[arg-type]
                     None, asyncio.Event())  # type: ignore[arg-type]
    dead = MemberRecord("dead", 5, 1, MemberStatus.DEAD, streams=40)
    start = clock.monotonic()
    await takeover._guarded_take(dead, {"a": 9})
    assert [(round(at - start, 3), left) for at, left in looks] == \
        [(0.0, 0), (second_at_s, 2)]
