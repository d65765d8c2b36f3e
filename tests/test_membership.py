"""Membership in virtual time: several members on one in-memory fleet table, one of them
silenced, fenced, revived; failures injected into releases."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from streamlease import tenancy
from streamlease.app import _run_until_drained
from streamlease.core.backoff import RENEW_JITTER
from streamlease.core.layout import MEMBERS_PER_KEY
from streamlease.core.lease import LeaseTimings
from streamlease.core.membership import MemberRecord, MemberStatus, MemberTimings
from streamlease.core.model import OwnedStream
from streamlease.core.urls import parse_allowed_urls
from streamlease.errors import StoreUnavailable
from streamlease.leadership import Leadership, LeadershipSettings
from streamlease.membership import DONOR_PAUSE_HEARTBEATS, Hooks, Membership, MembershipSettings
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
    return Membership(context(clock=LoopClock(), leases=store), store,  # type: ignore[arg-type]
                      MembershipSettings(name, 10, T), hooks)


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
    # No reconciler here takes them over, so the fencer releases them after the deal window.
    await asyncio.sleep(T.lease_s + 4 + members["a"].deal_window_s(5))
    rows = {m.worker_id: m for m in await memory.members()}
    assert rows["c"].status is MemberStatus.DEAD and rows["c"].released
    assert store.count("fence") == 1, "the preferred peer fences; the other need not try"
    for sid in streams:
        record = await memory.get(sid)
        assert record is not None and record.lease_expires_at_ms == 0 and record.fence == 2
    # Not before a lease after its last heartbeat was received (the last one went out at
    # most one re-jittered heartbeat interval before the silence).
    (fenced_at,) = [t for name, t in store.sent_at if name == "fence"]
    assert fenced_at - silenced >= T.lease_s - T.heartbeat_s * (1 + RENEW_JITTER)
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


async def test_a_refused_heartbeat_is_counted_as_fenced() -> None:
    """The member heartbeat counter still names a refusal "fenced" (one outcome enum for
    every lease, each counter in its own words)."""
    memory = MemoryStore()
    calls = Calls()
    m = member(FaultyStore(memory), "a", calls)
    await m.register()
    task = asyncio.create_task(m.run())
    await asyncio.sleep(1)
    row = (await memory.members())[0]
    assert await memory.fence(row, "peer", 0) is not None
    await asyncio.sleep(T.heartbeat_s * 3)
    assert calls.fenced == 1
    count = m.metrics.registry.get_sample_value
    assert count("streamlease_member_heartbeats_total", {"outcome": "fenced"}) == 1
    assert (count("streamlease_member_heartbeats_total", {"outcome": "renewed"}) or 0) >= 2
    assert count("streamlease_member_heartbeats_total", {"outcome": "refused"}) is None
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
    before = store.count("roster")
    await asyncio.sleep(5.0)
    healthy = store.count("roster") - before
    store.fail("heartbeat", times=-1, delay=T.heartbeat_s / 2)  # slow, then unanswered
    await asyncio.sleep(1.0)
    before = store.count("roster")
    await asyncio.sleep(5.0)
    strained = store.count("roster") - before
    assert healthy >= 18 and strained <= 12, (healthy, strained)  # every 0.25 s vs 0.5 s
    m.stop()
    await asyncio.gather(task, return_exceptions=True)


async def test_two_processes_with_one_worker_id_stop_fencing_each_other(
        caplog: pytest.LogCaptureFixture) -> None:
    """A second live process registers under a running worker's id (a copy-pasted task
    definition, a restart whose predecessor still runs). The first finds its row moved on
    by a registration, not a peer's fence: it stops for good instead of registering back
    over the other, and the other keeps the id, heartbeating under one epoch."""
    caplog.set_level(logging.INFO, logger="streamlease")
    memory = MemoryStore()
    store = FaultyStore(memory)
    first_calls, second_calls = Calls(), Calls()
    first, second = member(store, "a", first_calls), member(store, "a", second_calls)
    await first.register()
    first_task = asyncio.create_task(first.run())
    await asyncio.sleep(T.heartbeat_s * 3)
    await second.register()
    second_task = asyncio.create_task(second.run())
    async with asyncio.timeout(T.lease_s * 5):
        await first_task  # its loops end by themselves
    await asyncio.sleep(T.lease_s * 3)
    assert first.superseded is not None and first.superseded.epoch == second.epoch
    assert second.superseded is None and not second_task.done()
    assert store.count("register") == 2, "nobody registered back over the other"
    (row,) = await memory.members()
    assert (row.epoch, row.incarnation) == (second.epoch, second.incarnation)
    assert row.heartbeat >= 5 and row.status is MemberStatus.ACTIVE
    assert first_calls.fenced == 1 and second_calls.fenced == 0
    assert not first.accepting and second.accepting
    assert first.metrics.registry.get_sample_value(
        "streamlease_member_duplicate_id_total") == 1.0
    (logged,) = [r for r in caplog.records if getattr(r, "sl_event", None)
                 == "member.duplicate_id"]
    assert logged.levelno == logging.ERROR
    second.stop()
    await asyncio.gather(second_task, return_exceptions=True)


async def test_a_peers_fence_is_not_taken_for_a_duplicate_id() -> None:
    memory = MemoryStore()
    store = FaultyStore(memory)
    calls = Calls()
    m = member(store, "a", calls)
    await m.register()
    first = m.epoch
    task = asyncio.create_task(m.run())
    await asyncio.sleep(1)
    (row,) = await memory.members()
    assert await memory.fence(row, "peer", 0) is not None
    await asyncio.sleep(T.heartbeat_s * 3)
    assert m.superseded is None and not task.done()
    (row,) = await memory.members()
    assert m.epoch > first + 1 and row.epoch == m.epoch and row.status is MemberStatus.ACTIVE
    m.stop()
    await asyncio.gather(task, return_exceptions=True)


async def test_registration_writes_only_for_streams_still_leased_to_the_id() -> None:
    """The owner index lists every stream that ever named this worker id (a release keeps
    the owner). Of N such streams that moved on and M still leased to an earlier
    incarnation, registration writes M releases and none for the N."""
    memory = MemoryStore()
    store = FaultyStore(memory)
    moved_on, still_held = 7, 3
    clock = LoopClock()
    tenures = []
    for i in range(moved_on):
        sid = f"old-{i}"
        await memory.put_started(sid, "wss://x/")
        got = await memory.acquire(sid, "a", clock.wall_ms(), STREAM, epoch=5)
        assert got is not None
        tenures.append(got.tenure)
    held = await held_by(memory, "a", still_held, epoch=5)
    # The index as a lagging replica may still show it: every stream as "a" took it
    # (read once the store's own index lag, at most max_s, has passed).
    await asyncio.sleep(memory.index_lag.max_s)
    lagging = await memory.owned_by("a")
    for i, tenure in enumerate(tenures):
        if i % 2:
            await memory.release(tenure)  # released cleanly: expiry 0, owner kept
        else:  # force released and taken by another worker
            await memory.force_release(tenure.stream_id)
            assert await memory.acquire(tenure.stream_id, "b", clock.wall_ms(), STREAM,
                                        epoch=9)

    async def owned_by(owner: str, timeout: float | None = None) -> list[OwnedStream]:
        return list(lagging) if owner == "a" else []

    memory.owned_by = owned_by  # type: ignore[method-assign]
    m = member(store, "a", Calls())
    await m.register()
    assert store.count("release_for") == still_held
    for sid in held:
        record = await memory.get(sid)
        assert record is not None and record.lease_expires_at_ms == 0 and record.fence == 2
    for i in range(moved_on):
        record = await memory.get(f"old-{i}")
        assert record is not None and record.lease_owner == ("a" if i % 2 else "b")


async def test_the_superseded_worker_stops_its_streams_and_exits_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The worker's exit path for a duplicate id: its stream stops, it takes nothing
    more, it does not remove the row (the other process's now), and it exits 2."""
    memory = MemoryStore()
    store = FaultyStore(memory)
    clock, metrics = LoopClock(), Metrics()
    await memory.put_started("s1", "wss://feeds.example.com/s1")
    reconciler: Reconciler | None = None
    ctx = context(store, clock, metrics, leases=store, owner="a")
    first = Membership(ctx, store, MembershipSettings("a", 10, T), Hooks(  # type: ignore[arg-type]
        held=lambda: len(reconciler.supervisors) if reconciler else 0,
        fenced=lambda: reconciler.member_lost(True) if reconciler else None,
        self_fenced=lambda: reconciler.member_lost(False) if reconciler else None,
        fleet_changed=lambda: reconciler.poke() if reconciler else None))
    script = PumpScript()
    reconciler = Reconciler(ctx, ReconcilerSettings(
        reconcile_s=0.5, sweep_s=10.0, max_streams=10, acquire_per_cycle=10,
        stopped_check_s=T.heartbeat_s, min_hold_s=0.0,
        supervisor=SupervisorSettings(timings=STREAM, allowed_urls=parse_allowed_urls("wss://"),
                                      pump=PumpSettings(), call_timeout_s=1.0,
                                      drain_timeout_s=2.0)),
        first, tenancy.Hooks(pump_factory=script.factory()))
    leadership = Leadership(ctx, memory.stores().leader,
                            LeadershipSettings(T.lease_s, T.heartbeat_s, T.safety_margin_s), [],
                            eligible=lambda: first.accepting)
    await first.register()
    worker = asyncio.create_task(_run_until_drained(reconciler, first, leadership, 5.0,
                                                    metrics, clock))
    async with asyncio.timeout(30):
        while "s1" not in reconciler.supervisors:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    second = member(store, "a", Calls())
    await second.register()  # another process, same id: it releases what "a" held
    running = asyncio.create_task(second.run())  # and looks again once the index caught up
    async with asyncio.timeout(T.lease_s * 10):
        code = await worker
    assert code == 2
    assert "STREAMLEASE_WORKER_ID" in capsys.readouterr().err
    assert not reconciler.supervisors and "s1:aborted" in script.log
    assert store.count("leave") == 0
    (row,) = await memory.members()
    assert row.incarnation == second.incarnation
    async with asyncio.timeout(T.lease_s * 2):
        while (record := await memory.get("s1")) is not None and \
                record.lease_expires_at_ms != 0:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    second.stop()
    await running


async def test_member_heartbeats_are_spread_afresh_every_time() -> None:
    """Members started together (a fleet deployed at once) do not heartbeat in lock-step:
    each beat is due a heartbeat +/-10 % after the last was sent, a fresh draw each time."""
    memory = MemoryStore()
    store = FaultyStore(memory)
    one = Membership(context(clock=LoopClock(), rng=random.Random(3), leases=store),
                     store, MembershipSettings("w1", 10, T),  # type: ignore[arg-type]
                     Hooks(held=lambda: 0, fenced=lambda: None, self_fenced=lambda: None,
                           fleet_changed=lambda: None))
    await one.register()
    task = asyncio.create_task(one.run())
    await asyncio.sleep(20 * T.heartbeat_s)
    one.stop()
    await asyncio.wait_for(task, 5)
    sent = [t for name, t in store.sent_at if name == "heartbeat"]
    intervals = [round(b - a, 9) for a, b in itertools.pairwise(sent)]
    assert len(intervals) >= 15
    assert all(0.9 * T.heartbeat_s <= i <= 1.1 * T.heartbeat_s for i in intervals), intervals
    assert len(set(intervals)) == len(intervals), intervals


async def test_a_failing_takeover_task_is_logged_counted_and_the_member_goes_on() -> None:
    memory = MemoryStore()
    store = FaultyStore(memory)
    calls = Calls()
    one = member(store, "w1", calls)
    await one.register()
    task = asyncio.create_task(one.run())
    await asyncio.sleep(0.1)

    async def broken() -> None:
        raise RuntimeError("a bug in a takeover")

    one.dealer.spawn(broken())
    beats = store.count("heartbeat")
    await asyncio.sleep(2 * T.heartbeat_s)
    assert one.metrics.registry.get_sample_value(
        "streamlease_task_crashed_total", {"task": "membership"}) == 1
    assert store.count("heartbeat") > beats and not task.done()
    one.stop()
    await asyncio.wait_for(task, 5)


# -- the leader's bulletin ----------------------------------------------------------------


def fleet_member(memory: MemoryStore, name: str, leader: list[str],
                 held: int = 0, timings: MemberTimings = T,
                 per_key: int = MEMBERS_PER_KEY) -> tuple[Membership, FaultyStore]:
    """A member on its own call-counting view of one table; ``leader[0]`` leads (under a
    leader-lease fence of its position in ``leader``'s history: 1 for the first)."""
    store = FaultyStore(memory)
    hooks = Hooks(held=lambda: held, fenced=lambda: None, self_fenced=lambda: None,
                  fleet_changed=lambda: None, leading=lambda: bool(leader) and leader[0] == name,
                  leader=lambda: leader[0] if leader else None,
                  leader_fence=lambda: len(leader))
    return Membership(context(clock=LoopClock(), leases=store), store,  # type: ignore[arg-type]
                      MembershipSettings(name, 10, timings, members_per_key=per_key),
                      hooks), store


Pairs = dict[str, tuple[Membership, FaultyStore]]


async def running_fleet(held: dict[str, int]) -> tuple[Pairs, dict[str, asyncio.Task[None]]]:
    """Members (name -> streams held) on one table, registered and running; "a" leads."""
    memory = MemoryStore()
    pairs = {n: fleet_member(memory, n, ["a"], held=h) for n, h in held.items()}
    for m, _ in pairs.values():
        await m.register()
    return pairs, {n: asyncio.create_task(m.run()) for n, (m, _) in pairs.items()}


async def until(condition: Callable[[], bool], limit: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.05)


async def test_members_other_than_the_leader_read_only_the_leaders_row() -> None:
    pairs, tasks = await running_fleet({"a": 9, "b": 3, "c": 0})
    await until(lambda: all(m.bulletin is not None and not m.reading_all
                            for n, (m, _) in pairs.items() if n != "a"))
    for _, store in pairs.values():
        store.calls.clear()
    await asyncio.sleep(10 * T.heartbeat_s)
    a, b = pairs["a"], pairs["b"]
    assert a[1].count("roster") >= 10 and a[1].count("member") == 0
    for m, store in (b, pairs["c"]):
        assert store.count("roster") == 0 and store.count("member") >= 10
        assert m.bulletin == a[0].bulletin
    news = b[0].bulletin
    assert news is not None and (news.level, news.total, news.active) == (4, 12, 3)
    assert b[0].metrics.registry.get_sample_value(
        "streamlease_members", {"status": "ACTIVE"}) == 3
    for m, _ in pairs.values():
        m.stop()
    await asyncio.gather(*tasks.values())


async def test_the_leaders_death_is_seen_by_the_others_who_read_every_row_again() -> None:
    memory = MemoryStore()
    leader = ["a"]
    pairs = {n: fleet_member(memory, n, leader) for n in "abc"}
    for m, _ in pairs.values():
        await m.register()
    tasks = {n: asyncio.create_task(m.run()) for n, (m, _) in pairs.items()}
    b = pairs["b"][0]
    await until(lambda: b.bulletin is not None and not b.reading_all)
    tasks["a"].cancel()  # the leader stops heartbeating; its lease still names it
    await until(lambda: memory.members_by_id["a"].status is MemberStatus.DEAD,
                limit=T.lease_s + 10)
    await until(lambda: b.reading_all and any(m.worker_id == "c" for m in b.view.members))
    assert memory.members_by_id["a"].fenced_by in ("b", "c")
    for n in "bc":
        pairs[n][0].stop()
        await tasks[n]


async def test_an_unreadable_bulletin_is_counted_and_every_row_is_read_instead(
        caplog: pytest.LogCaptureFixture) -> None:
    memory = MemoryStore()
    leader = ["a"]
    a, _ = fleet_member(memory, "a", leader)
    b, store = fleet_member(memory, "b", leader)
    await a.register()
    await b.register()
    memory.members_by_id["a"] = dataclasses.replace(memory.members_by_id["a"],
                                                    bulletin='{"g": "torn')
    caplog.set_level(logging.WARNING)
    await b.watcher.observe()
    assert b.reading_all and b.bulletin is None
    assert {m.worker_id for m in b.view.members} == {"a", "b"}
    assert store.count("member") == 1 and store.count("roster") == 1
    assert b.metrics.registry.get_sample_value("streamlease_bulletin_unreadable_total") == 1
    assert any(getattr(r, "sl_event", "") == "member.bulletin_unreadable"
               for r in caplog.records)


async def test_the_bulletins_generation_moves_with_membership_not_with_counts() -> None:
    memory = MemoryStore()
    leader = ["a"]
    held = [5]
    store = FaultyStore(memory)
    a = Membership(context(clock=LoopClock(), leases=store), store,  # type: ignore[arg-type]
                   MembershipSettings("a", 10, T),
                   Hooks(held=lambda: held[0], fenced=lambda: None, self_fenced=lambda: None,
                         fleet_changed=lambda: None, leading=lambda: True))
    b, _ = fleet_member(memory, "b", leader)
    await a.register()
    await b.register()
    tasks = [asyncio.create_task(a.run()), asyncio.create_task(b.run())]
    await until(lambda: b.bulletin is not None and b.bulletin.total == 5)
    assert a.bulletin is not None
    gen = a.bulletin.gen
    held[0] = 7  # a count changes: republished, same generation
    await until(lambda: b.bulletin is not None and b.bulletin.total == 7)
    assert b.bulletin is not None and b.bulletin.gen == gen
    c, _ = fleet_member(memory, "c", leader)
    await c.register()  # a member joins: a new generation
    await until(lambda: b.bulletin is not None and b.bulletin.active == 3)
    assert b.bulletin is not None and b.bulletin.gen > gen
    for m in (a, b):
        m.stop()
    await asyncio.gather(*tasks)


async def test_the_leader_names_no_donors_while_a_hand_over_settles() -> None:
    """12 streams on three members: c (2) sits below its band and nobody is above it, so
    the largest holder, a, gives one. Once b hands streams over, its takers' rows lag the
    hand-over: no donor is named for two heartbeats, then a is named again."""
    pairs, tasks = await running_fleet({"a": 5, "b": 5, "c": 2})
    a = pairs["a"][0]

    def donors() -> tuple[str, ...] | None:
        return None if a.bulletin is None else a.bulletin.donors
    await until(lambda: donors() == ("a",))
    pairs["b"][0].handed_off()
    await until(lambda: donors() == ())
    paused = asyncio.get_running_loop().time()
    await until(lambda: donors() == ("a",))
    waited = asyncio.get_running_loop().time() - paused
    assert DONOR_PAUSE_HEARTBEATS * T.heartbeat_s - 0.1 <= waited
    assert waited <= (DONOR_PAUSE_HEARTBEATS + 1) * T.heartbeat_s
    for m, _ in pairs.values():
        m.stop()
    await asyncio.gather(*tasks.values())


async def test_only_the_named_successor_campaigns_at_full_pace_while_the_leader_lives(
        ) -> None:
    """The leader's bulletin names b (the first member taking streams by id, the leader
    aside): b campaigns at full pace, c does not. Once the leader's heartbeats stop, c's
    reads show its counter standing still and c campaigns at full pace too."""
    pairs, tasks = await running_fleet({"a": 0, "b": 0, "c": 0})
    b, c = pairs["b"][0], pairs["c"][0]
    await until(lambda: all(m.bulletin is not None and not m.reading_all for m in (b, c)))
    assert c.bulletin is not None and c.bulletin.successor == "b"
    assert b.campaign_urgent() and not c.campaign_urgent()
    tasks["a"].cancel()  # the leader stops heartbeating
    stopped = asyncio.get_running_loop().time()
    await until(c.campaign_urgent)
    assert asyncio.get_running_loop().time() - stopped <= c.leader_still_s + 2 * T.heartbeat_s
    for n in "bc":
        pairs[n][0].stop()
        await tasks[n]


async def test_a_member_reads_the_leaders_row_faster_while_notices_flow() -> None:
    """While the feed is live a member reads the leader's row every FEED_READ_S (here the
    shorter observe interval); for HANDOFF_READS_FOR_S after a bulletin carried a notice
    for it that it had not seen (a hand-off's streams are offered one by one), every
    HANDOFF_READ_S; then at the regular rate again. Another member's notice changes
    nothing; and in a fleet of hundreds the speed-up is spread thin (the leader's key
    gets at most HANDOFF_READS_PER_S more reads a second)."""
    from streamlease.core.notices import NoticeKind
    from streamlease.membership import (
        HANDOFF_READ_S,
        HANDOFF_READS_FOR_S,
        HANDOFF_READS_PER_S,
    )
    memory = MemoryStore()
    leader = ["a"]
    a, _ = fleet_member(memory, "a", leader)
    b, reads = fleet_member(memory, "b", leader)
    for m in (a, b):
        await m.register()
    tasks = [asyncio.create_task(m.run()) for m in (a, b)]
    a.feed_running(True)
    await until(lambda: b.feed_live())
    loop = asyncio.get_running_loop()

    async def reads_in(seconds: float) -> int:
        before = reads.count("member")
        await asyncio.sleep(seconds)
        return reads.count("member") - before

    window = HANDOFF_READS_FOR_S / 2
    quiet = await reads_in(window)
    assert quiet <= window / b.listener.read_s * 1.25 + 1, quiet
    other = a.post("a", "s1", NoticeKind.OFFER)  # offered to the leader itself, not to b
    assert await a.published(other, timeout=5.0)
    assert await reads_in(window) <= window / b.listener.read_s * 1.25 + 1  # not b's: no speed-up
    a.post("b", "s2", NoticeKind.OFFER)
    await until(lambda: loop.time() < b.listener.handoffs_until)
    busy = await reads_in(window)
    assert busy >= window / HANDOFF_READ_S * 0.75, (busy, quiet)
    await asyncio.sleep(HANDOFF_READS_FOR_S)
    assert await reads_in(window) <= window / b.listener.read_s * 1.25 + 1  # back to the rate
    assert b.listener.handoff_read_s == HANDOFF_READ_S
    assert b.bulletin is not None
    b.bulletin = dataclasses.replace(b.bulletin, active=501)
    assert b.listener.handoff_read_s == pytest.approx(500 / HANDOFF_READS_PER_S)
    for m in (a, b):
        m.stop()
    await asyncio.gather(*tasks)


async def test_the_leaders_notices_reach_their_member_once_and_vouch_for_the_feed() -> None:
    from streamlease.core.notices import Notice, NoticeKind
    memory = MemoryStore()
    leader = ["a"]
    heard: dict[str, list[Notice]] = {"a": [], "b": [], "c": []}
    resumed: list[str] = []
    pairs = {n: fleet_member(memory, n, leader) for n in "abc"}
    for n, (m, _) in pairs.items():
        m.hooks.notice = heard[n].append
        m.hooks.feed_resumed = lambda n=n: resumed.append(n)  # type: ignore[misc]
        await m.register()
    tasks = [asyncio.create_task(m.run()) for m, _ in pairs.values()]
    a, b, c = (pairs[n][0] for n in "abc")
    await until(lambda: b.bulletin is not None and not b.reading_all)
    assert not b.feed_live() and not a.feed_live()  # no feed yet: every poll runs
    a.feed_running(True)
    await until(lambda: b.feed_live() and c.feed_live())
    assert a.feed_live() and sorted(resumed) == ["a", "b", "c"]  # each catches up once
    a.post("b", "s1", NoticeKind.CHECK)
    last = a.post("a", "s2", NoticeKind.OFFER)  # the leader's own: at once
    assert [x.stream for x in heard["a"]] == ["s2"]
    assert await a.published(last, timeout=5.0)
    await until(lambda: bool(heard["b"]))
    await asyncio.sleep(3 * T.observe_s)  # read again and again: each notice is heard once
    assert [(x.stream, x.kind) for x in heard["b"]] == [("s1", NoticeKind.CHECK)]
    assert heard["c"] == []
    assert b.metrics.registry.get_sample_value("streamlease_notices_total",
                                               {"kind": "check"}) == 1
    a.feed_running(False)  # the feed faulted: the others poll again
    await until(lambda: not b.feed_live() and not c.feed_live())
    # A gap too short for any member to read is still seen: vouching resumes under a new
    # stretch, and each member runs its polls once.
    resumed.clear()
    a.feed_running(True)
    a.feed_running(False)
    a.feed_running(True)
    await until(lambda: sorted(resumed) == ["a", "a", "b", "c"])
    resumed.clear()
    a.feed_running(False)
    a.feed_running(True)  # no read in between on the others' side
    await until(lambda: sorted(resumed) == ["a", "b", "c"])
    for m, _ in pairs.values():
        m.stop()
    await asyncio.gather(*tasks)


async def test_a_dead_leaders_vouching_lapses_with_its_heartbeats_not_its_row() -> None:
    """The leader's row outlives it: members stop trusting its feed once its heartbeat
    counter stands still (``leader_still_s``), before it is found dead (a lease), and
    poll meanwhile. A counter that moves again is trusted at once, with no catch-up: every
    bulletin was read meanwhile."""
    long_lease = MemberTimings(lease_s=10.0, heartbeat_s=0.5, safety_margin_s=0.2)
    memory = MemoryStore()
    leader = ["a"]
    resumed = []
    pairs = {n: fleet_member(memory, n, leader, timings=long_lease) for n in "ab"}
    a, b = pairs["a"][0], pairs["b"][0]
    b.hooks.feed_resumed = lambda: resumed.append(1)  # type: ignore[assignment]
    for m, _ in pairs.values():
        await m.register()
    tasks = {n: asyncio.create_task(m.run()) for n, (m, _) in pairs.items()}
    await until(lambda: b.bulletin is not None and not b.reading_all)
    a.feed_running(True)
    await until(lambda: b.feed_live())
    catch_ups = len(resumed)
    assert b.leader_still_s < long_lease.lease_s
    pairs["a"][1].fail("heartbeat", times=-1)  # its heartbeats stop; its row still vouches
    stopped = asyncio.get_running_loop().time()
    await until(lambda: not b.feed_live(), limit=long_lease.lease_s)
    took = asyncio.get_running_loop().time() - stopped
    assert took <= b.leader_still_s + 2 * long_lease.heartbeat_s
    assert b.metrics.registry.get_sample_value("streamlease_members_declared_dead_total") == 0
    pairs["a"][1].heal()  # it was only stalled: trusted again, nothing to catch up on
    await until(lambda: b.feed_live(), limit=long_lease.lease_s)
    assert len(resumed) == catch_ups
    for m, _ in pairs.values():
        m.stop()
    await asyncio.gather(*tasks.values(), return_exceptions=True)


async def test_an_eventually_consistent_read_older_than_one_read_is_not_acted_on() -> None:
    """Members read the leader's row eventually consistently (half the read units): a
    read may be a moment old, and one older than a row already read is skipped, so the
    view, the bulletin and the notices never step back."""
    memory = MemoryStore(stale_reads_s=1.0)
    leader = ["a"]
    pairs = {n: fleet_member(memory, n, leader) for n in "ab"}
    b, b_store = pairs["b"]
    returned: list[int] = []
    acted: list[int] = []
    read = b_store.member

    async def recording(worker_id: str, timeout: float | None = None,
                        consistent: bool = True) -> MemberRecord | None:
        assert consistent is False  # the leader's row: eventually consistent
        row = await read(worker_id, timeout=timeout, consistent=consistent)
        if row is not None:
            returned.append(row.heartbeat)
        return row
    b_store.member = recording  # type: ignore[method-assign]
    for m, _ in pairs.values():
        await m.register()
    tasks = [asyncio.create_task(m.run()) for m, _ in pairs.values()]
    deadline = asyncio.get_running_loop().time() + 20
    while asyncio.get_running_loop().time() < deadline:
        if not b.reading_all and b.view.members:
            acted.append(b.view.members[0].heartbeat)
        await asyncio.sleep(0.02)
    for m, _ in pairs.values():
        m.stop()
    await asyncio.gather(*tasks)
    assert any(later < earlier for earlier, later in itertools.pairwise(returned)), \
        "no read went back in time: the test saw no staleness"
    assert acted and acted == sorted(acted)


async def test_a_notice_is_published_at_once_even_just_after_a_count_change() -> None:
    """A changed count asks for a heartbeat no sooner than a short gap after the last; the
    leader's notice posted meanwhile is not held back by that gap (members wait for it),
    and the one heartbeat sent carries both."""
    slow = MemberTimings(lease_s=16.0, heartbeat_s=8.0, safety_margin_s=0.2)  # gap 2 s
    memory = MemoryStore()
    leader = ["a"]
    a, store = fleet_member(memory, "a", leader, timings=slow)
    await a.register()
    task = asyncio.create_task(a.run())
    from streamlease.core.notices import NoticeKind
    await until(lambda: a.publisher.read_all_leading and store.count("heartbeat") >= 1)
    beats = store.count("heartbeat")
    a.feed_running(True)  # vouching for a feed: a new bulletin, published at once
    await until(lambda: store.count("heartbeat") > beats)
    beats = store.count("heartbeat")
    a.counts_changed()
    for _ in range(10):  # let the heartbeat loop wake and start waiting out the gap
        await asyncio.sleep(0)
    n = a.post("b", "s1", NoticeKind.CHECK)
    gap = min(slow.observe_s, slow.heartbeat_s / 4)
    assert await a.published(n, timeout=gap / 2)  # held back by the gap: about 2 s
    assert store.count("heartbeat") == beats + 1  # one heartbeat carried both
    a.stop()
    await task


@pytest.mark.parametrize("donor", ["a", "b"])  # the leader itself, or a member
async def test_a_member_newly_named_a_donor_is_poked_at_once(donor: str) -> None:
    """The donor, one above its share, names nobody to give while everyone sits in band
    (its reconciler may then rest, its cycles quiet). Counts alone change (no new
    generation) so that the donor is named: the bulletin that names it pokes its
    reconciler at once, once, so it sheds now and not at its next quiet cycle."""
    memory = MemoryStore()
    leader = ["a"]
    held = {"a": 4, "b": 4, "c": 3}
    held[donor] = 5
    pokes = dict.fromkeys(held, 0)

    def make(name: str) -> Membership:
        store = FaultyStore(memory)
        hooks = Hooks(held=lambda: held[name], fenced=lambda: None, self_fenced=lambda: None,
                      fleet_changed=lambda: pokes.__setitem__(name, pokes[name] + 1),
                      leading=lambda: leader[0] == name, leader=lambda: leader[0],
                      leader_fence=lambda: len(leader))
        return Membership(context(clock=LoopClock(), leases=store),  # type: ignore[arg-type]
                          store, MembershipSettings(name, 10, T), hooks)

    members = {n: make(n) for n in held}
    for m in members.values():
        await m.register()
    tasks = [asyncio.create_task(m.run()) for m in members.values()]
    named = members[donor]

    def bulletin() -> Any:
        return named.bulletin
    await until(lambda: bulletin() is not None and bulletin().total == 12
                and bulletin().active == 3)
    assert bulletin().donors == () and bulletin().level == 4
    gen = bulletin().gen
    await asyncio.sleep(4 * T.heartbeat_s)
    before = pokes[donor]
    held["c"] = 1  # c falls below its band: the largest holder gives
    await until(lambda: donor in bulletin().donors)
    assert bulletin().gen == gen, "counts alone moved"
    assert pokes[donor] == before + 1
    await asyncio.sleep(4 * T.heartbeat_s)
    assert pokes[donor] == before + 1, "poked once, not at every bulletin that names it"
    for m in members.values():
        m.stop()
    await asyncio.gather(*tasks)
