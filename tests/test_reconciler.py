"""The reconciler in virtual time, on the in-memory store with a scripted pump."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any

import pytest

from streamlease import tenancy
from streamlease.app import build_settings
from streamlease.balancing import KEPT_PAUSE_HEARTBEATS
from streamlease.config import WorkerConfig
from streamlease.core.bulletin import Bulletin, Taker
from streamlease.core.lease import LeaseTimings, StopReason
from streamlease.core.membership import MemberRecord, MemberStatus
from streamlease.core.model import MAX_LAST_ERROR_CHARS
from streamlease.core.notices import Notice, NoticeKind
from streamlease.core.urls import parse_allowed_urls
from streamlease.membership import FleetView
from streamlease.metrics import Metrics
from streamlease.pump import PumpSettings
from streamlease.reconciler import Reconciler, ReconcilerSettings
from streamlease.store.memory import MemoryStore
from streamlease.supervisor import SupervisorSettings
from streamlease.sweep import REPORTED_LIMIT
from streamlease.upstream import BUILTIN_UPSTREAMS, Upstreams
from tests.fakes import FaultyStore, PumpScript, StaticMember, context
from tests.virtual import LoopClock

pytestmark = pytest.mark.virtual_time

T = LeaseTimings(lease_s=10.0, heartbeat_s=2.0, skew_margin_s=1.0, safety_margin_s=1.0)
URL = "wss://feeds.example.com/{}"


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streamlease")


class Fleet:
    """One reconciler (a worker) over a shared in-memory table."""

    def __init__(self, memory: MemoryStore | None = None, owner: str = "w1",
                 upstreams: Upstreams = BUILTIN_UPSTREAMS, handover_wait_s: float | None = None,
                 **overrides: Any) -> None:
        self.memory = memory or MemoryStore()
        self.store = FaultyStore(self.memory)
        self.clock = LoopClock()
        self.metrics = Metrics()
        self.script = PumpScript()
        self.member = StaticMember()
        values: dict[str, Any] = {"reconcile_s": 1.0, "sweep_s": 10.0, "max_streams": 100,
                                  "stopped_check_s": T.heartbeat_s,
                                  "acquire_per_cycle": 10}
        values.update(overrides)
        self.reconciler = Reconciler(
            context(self.store, self.clock, self.metrics, leases=self.store, owner=owner),
            ReconcilerSettings(supervisor=SupervisorSettings(
                timings=T, allowed_urls=parse_allowed_urls("wss://"), pump=PumpSettings(),
                call_timeout_s=1.0, drain_timeout_s=5.0, upstreams=upstreams,
                handover_wait_s=handover_wait_s), **values),
            self.member, tenancy.Hooks(pump_factory=self.script.factory()))
        self.task: asyncio.Task[None] | None = None

    async def streams(self, *ids: str) -> None:
        for sid in ids:
            await self.memory.put_started(sid, URL.format(sid))
        # The orphan index lags the table (as DynamoDB's does, at most max_s): the test's
        # timeline starts when a worker can see the new streams.
        await asyncio.sleep(self.memory.index_lag.max_s)

    def start(self) -> Fleet:
        self.task = asyncio.create_task(self.reconciler.run())
        return self

    async def stop(self) -> None:
        assert self.task is not None
        self.reconciler.stop(release_by=asyncio.get_running_loop().time() + 10)
        await asyncio.wait_for(self.task, 60)

    def held(self) -> set[str]:
        return set(self.reconciler.supervisors)

    def plans_from(self, news: Bulletin, streams: int, capacity: int = 100,
                   heartbeat: int = 1) -> None:
        """This worker plans from ``news``, the bulletin in the row of the leader (w9,
        holding ``streams`` of ``capacity``), the one row it reads."""
        self.member.view = FleetView((MemberRecord(
            "w9", epoch=1, heartbeat=heartbeat, status=MemberStatus.ACTIVE, streams=streams,
            capacity=capacity),))
        self.member.bulletin = news
        self.member.reading_all = False

    async def holding(self, count: int) -> None:
        """Until this worker supervises ``count`` streams."""
        async with asyncio.timeout(10):
            while len(self.held()) < count:  # noqa: ASYNC110 - a poll with a deadline
                await asyncio.sleep(0.05)


def events(caplog: pytest.LogCaptureFixture, name: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "sl_event", None) == name]


async def until_event(caplog: pytest.LogCaptureFixture, name: str) -> None:
    async with asyncio.timeout(30):
        while not events(caplog, name):  # noqa: ASYNC110 - a poll with a deadline
            await asyncio.sleep(0.05)


async def test_takes_orphans_up_to_capacity_and_releases_all_on_stop() -> None:
    fleet = Fleet(max_streams=3)
    await fleet.streams("a", "b", "c", "d", "e")
    fleet.start()
    await asyncio.sleep(5)
    assert len(fleet.held()) == 3
    # Every supervisor of the worker releases through the one gate its holdings keep.
    gate = fleet.reconciler.holdings.ties.release_gate
    assert all(s.ties.release_gate is gate for s in fleet.reconciler.supervisors.values())
    await fleet.stop()
    records = await fleet.memory.list_streams()
    assert all(r.lease_expires_at_ms == 0 for r in records)
    assert fleet.reconciler.unreleased == 0


async def test_no_new_streams_while_its_own_renewals_fail(
        caplog: pytest.LogCaptureFixture) -> None:
    fleet = Fleet(acquire_per_cycle=1)
    await fleet.streams("a")
    fleet.start()
    await asyncio.sleep(3)
    assert fleet.held() == {"a"}
    fleet.store.fail("renew", times=-1)  # the store is struggling
    await asyncio.sleep(T.heartbeat_s + 1)
    await fleet.streams("b", "c")
    await asyncio.sleep(3 * 1.2)  # three reconcile cycles
    assert fleet.held() <= {"a"}, "acquired while its renewals were failing"
    assert fleet.metrics.registry.get_sample_value("streamlease_admitting") == 0
    (closed,) = events(caplog, "reconcile.admission")
    assert closed.levelno == logging.WARNING
    assert closed.sl_fields["why"] == "renewals"  # type: ignore[attr-defined]
    fleet.store.heal()
    await asyncio.sleep(T.heartbeat_s * 3 + 4)
    assert {"b", "c"} <= fleet.held()
    assert fleet.metrics.registry.get_sample_value("streamlease_admitting") == 1
    await fleet.stop()


async def test_a_drain_closes_admission_without_blaming_the_store(
        caplog: pytest.LogCaptureFixture) -> None:
    """A SIGTERM stops acquisitions (the member drains): logged as the membership's
    doing at INFO, not as failing renewals, which an operator would chase."""
    fleet = Fleet()
    await fleet.streams("a")
    fleet.start()
    await asyncio.sleep(3)
    assert fleet.held() == {"a"}
    fleet.member.accepting = False  # draining: the member no longer takes streams
    await asyncio.sleep(3 * 1.2)  # three reconcile cycles
    (closed,) = events(caplog, "reconcile.admission")
    assert closed.levelno == logging.INFO
    assert closed.sl_fields["why"] == "membership"  # type: ignore[attr-defined]
    assert fleet.metrics.registry.get_sample_value("streamlease_admitting") == 0
    await fleet.stop()


async def test_a_slow_sweep_never_delays_a_takeover() -> None:
    fleet = Fleet(sweep_s=5.0)
    fleet.store.fail("scan", times=-1, delay=30.0)  # every Scan takes 30 s
    fleet.start()
    await asyncio.sleep(1)
    await fleet.streams("a")
    await asyncio.sleep(1.2 + 0.1)  # one reconcile interval with its jitter
    assert fleet.held() == {"a"}
    await fleet.stop()


async def test_a_long_problem_is_written_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever produces it, a problem longer than last_error holds is stored truncated.
    long_problem = "upstream refused: " + "x" * (2 * MAX_LAST_ERROR_CHARS)
    monkeypatch.setattr("streamlease.core.plan.url_problem", lambda url, allowed: long_problem)
    fleet = Fleet()
    await fleet.memory.put_started("bad", "wss://feeds.example.com/bad")
    fleet.start()
    await asyncio.sleep(20)
    # Reported on the first cycle; every later cycle sees the stored (truncated) text
    # and leaves it alone, instead of rewriting it on every pass.
    assert fleet.store.count("record_error") == 1
    record = await fleet.memory.get("bad")
    assert record is not None and record.last_error is not None
    assert len(record.last_error) == MAX_LAST_ERROR_CHARS
    await fleet.stop()


async def test_the_memory_of_reported_problems_is_bounded() -> None:
    fleet = Fleet()
    from streamlease.core.model import StreamRecord
    for i in range(REPORTED_LIMIT + 50):
        record = StreamRecord(f"s{i}", "STARTED", "ws://x/")
        await fleet.reconciler.unservable.report(record, "not allowed")
    assert len(fleet.reconciler.unservable.reported) == REPORTED_LIMIT


async def serve_a(memory: MemoryStore, owner: str, seconds: float) -> Fleet:
    """A worker ``owner`` serves stream "a" (added if ``memory`` lacks it) for ``seconds``
    of virtual time, then stops: its drain flushes and releases."""
    fleet = Fleet(memory, owner=owner)
    if "CONN#a" not in memory.items:
        await fleet.streams("a")
    fleet.start()
    await asyncio.sleep(seconds)
    await fleet.stop()
    return fleet


async def checkpoint_of_a(memory: MemoryStore) -> int:
    record = await memory.get("a")
    assert record is not None
    return record.last_seq or 0


async def test_a_rewound_checkpoint_resumes_after_the_sink(
        caplog: pytest.LogCaptureFixture) -> None:
    memory = MemoryStore()
    await serve_a(memory, "w1", 6)
    written = await checkpoint_of_a(memory)
    fences = await memory.event_fences("a")
    assert written and fences
    # An operator rewrites the item by hand: checkpoint and fence are gone.
    await memory.put_item({"Pk": {"S": "CONN#a"}, "desired_state": {"S": "STARTED"},
                           "ws_url": {"S": URL.format("a")}, "lease_expires_at_ms": {"N": "0"}})
    second = await serve_a(memory, "w2", 6)
    assert events(caplog, "stream.checkpoint_rewound")
    seqs = [f.seq async for f in memory.read_events("a")]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > written
    after = await memory.event_fences("a")
    assert after == sorted(after) and after[-1] > max(fences)
    assert second.metrics.registry.get_sample_value(
        "streamlease_checkpoint_rewound_total") == 1


async def test_after_a_clean_release_the_next_holder_resumes_without_reading_the_sink(
        caplog: pytest.LogCaptureFixture) -> None:
    memory = MemoryStore()
    await serve_a(memory, "w1", 3)  # drained: the final flush, then a release that says so
    assert "newest_event" in memory.calls  # the first holder found no mark: it read
    written = await checkpoint_of_a(memory)
    memory.calls.clear()
    await serve_a(memory, "w2", 3)
    assert "acquire" in memory.calls and "newest_event" not in memory.calls
    seqs = [f.seq async for f in memory.read_events("a")]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > written
    assert not events(caplog, "stream.checkpoint_rewound")


async def test_a_checkpoint_rewound_by_hand_after_a_clean_release_is_still_read(
        caplog: pytest.LogCaptureFixture) -> None:
    memory = MemoryStore()
    await serve_a(memory, "w1", 3)
    written = await checkpoint_of_a(memory)
    assert written > 2
    # An operator rewinds only the checkpoint: the release's mark stays on the item.
    item = memory.items["CONN#a"]
    item["last_seq"] = {"N": "2"}
    memory.calls.clear()
    await serve_a(memory, "w2", 3)
    assert "newest_event" in memory.calls
    assert events(caplog, "stream.checkpoint_rewound")
    seqs = [f.seq async for f in memory.read_events("a")]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) > written


async def test_every_crashed_acquisition_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    fleet = Fleet()
    await fleet.streams("a", "b")
    fleet.store.fail("acquire", times=1, error=RuntimeError("first bug"))
    fleet.store.fail("acquire", times=1, error=ValueError("second bug"))
    fleet.start()
    await asyncio.sleep(0.5)
    (crashed,) = events(caplog, "reconcile.crashed")
    assert crashed.exc_text is not None
    assert "first bug" in crashed.exc_text and "second bug" in crashed.exc_text
    await asyncio.sleep(3)  # the next cycles take both
    assert fleet.held() == {"a", "b"}
    await fleet.stop()


async def test_an_acquire_that_applied_unseen_is_released_and_taken_properly(
        caplog: pytest.LogCaptureFixture) -> None:
    fleet = Fleet()
    await fleet.streams("a")
    # The conditional write applies; its answer is lost (a timeout).
    fleet.store.fail("acquire", times=1, apply=True)
    fleet.start()
    await asyncio.sleep(0.1)  # before the next cycle (a short poll: still short of streams)
    record = await fleet.memory.get("a")
    assert record is not None and record.lease_owner == "w1" and fleet.held() == set()
    # Long before that lease would lapse, the next cycle reads the item back, releases the
    # lease nobody serves, and a later cycle takes the stream properly.
    await asyncio.sleep(3 * 1.2)
    assert fleet.held() == {"a"}
    (released,) = events(caplog, "lease.unserved_released")
    assert released.sl_fields["fence"] == record.fence  # type: ignore[attr-defined]
    assert (await fleet.memory.get("a")).fence == record.fence + 1  # type: ignore[union-attr]
    await fleet.stop()
    assert fleet.reconciler.unreleased == 0


async def test_shutdown_settles_an_unknown_acquire_or_keeps_the_member_row() -> None:
    fleet = Fleet()
    await fleet.streams("a", "b")
    fleet.store.fail("acquire", times=2, apply=True)
    fleet.start()
    await asyncio.sleep(0.1)  # before the next cycle settles them
    fleet.store.fail("check", times=1)  # one of the two cannot be read back at shutdown
    await fleet.stop()
    records = {r.stream_id: r for r in await fleet.memory.list_streams()}
    still = [s for s, r in records.items() if r.lease_owner == "w1" and r.lease_expires_at_ms]
    assert len(still) == 1, records
    # Counted as unreleased: the worker keeps its member row, so a peer releases it.
    assert fleet.reconciler.unreleased == 1


async def test_slow_member_heartbeats_close_admission() -> None:
    fleet = Fleet()
    fleet.start()
    await asyncio.sleep(0.5)
    await fleet.streams("a")
    for _ in range(6):  # member heartbeats, each slower than half the interval
        fleet.reconciler.lease_health.record_call(True, T.heartbeat_s)
        await asyncio.sleep(0.5)
    assert fleet.held() == set()
    assert fleet.metrics.registry.get_sample_value("streamlease_admitting") == 0
    await asyncio.sleep(2 * T.heartbeat_s + 2)  # heartbeats healthy again
    assert fleet.held() == {"a"}
    await fleet.stop()


async def test_the_wait_of_a_released_stream_is_observed() -> None:
    fleet = Fleet()
    await fleet.streams("a")  # expiry 0: free, as after a release
    fleet.start()
    await asyncio.sleep(1.5)
    assert fleet.held() == {"a"}
    count = fleet.metrics.registry.get_sample_value("streamlease_takeover_delay_seconds_count")
    assert count == 1
    await fleet.stop()


async def test_an_orphan_left_for_a_member_that_only_looks_short_is_taken_soon(
        caplog: pytest.LogCaptureFixture) -> None:
    """Rows lag: w2's row still shows 0 though it has since filled up, so the orphan is
    dealt to w2 and nobody else takes it for balance's sake. w1, below its share by its
    own live count, polls often while short and takes it once it has waited half a
    reconcile interval: not two intervals, and not at its next regular cycle."""
    fleet = Fleet()
    await fleet.streams("a", "b")
    fleet.start()
    await asyncio.sleep(1.5)
    assert fleet.held() == {"a", "b"}
    fleet.member.view = FleetView((
        MemberRecord("w2", epoch=1, heartbeat=1, status=MemberStatus.ACTIVE, streams=0,
                     capacity=100),
        MemberRecord("w3", epoch=1, heartbeat=1, status=MemberStatus.ACTIVE, streams=4,
                     capacity=100),
    ))
    # total 2 + 0 + 4 + 1 orphan = 7, share 3: w1 is short by 1, w2 (as its row says) by 3.
    await fleet.streams("c")
    await asyncio.sleep(4.0)
    assert fleet.held() == {"a", "b", "c"}
    [taken] = [r.__dict__["sl_fields"] for r in events(caplog, "lease.acquired")
               if r.__dict__["sl_fields"]["stream"] == "c"]
    waited = taken["unowned_s"]
    # Lingering (reconcile / 2) seen by a short poll (reconcile / 5), not at the next
    # regular cycle (0.8-1.2 s) nor starving (2 s).
    assert 0.5 <= waited < 0.75, waited
    await fleet.stop()


async def test_a_member_at_its_share_takes_starving_orphans_only_inside_its_band(
        caplog: pytest.LogCaptureFixture) -> None:
    """w3's row says it holds nothing (it cannot take: say its admission is closed), so
    the orphans are dealt to it. w1, at its share, takes one after two reconcile
    intervals (share + 1: inside the band, nothing to shed later), the rest only after
    three (balance never leaves a stream unserved)."""
    fleet = Fleet()
    await fleet.streams("a", "b", "c")
    fleet.start()
    await asyncio.sleep(1.5)
    assert fleet.held() == {"a", "b", "c"}
    fleet.member.view = FleetView((
        MemberRecord("w2", epoch=1, heartbeat=1, status=MemberStatus.ACTIVE, streams=3,
                     capacity=100),
        MemberRecord("w3", epoch=1, heartbeat=1, status=MemberStatus.ACTIVE, streams=0,
                     capacity=100),
    ))
    # total 3 + 3 + 0 + 3 orphans = 9, share 3: w1 is at its share, w3 short by 3.
    await fleet.streams("x", "y", "z")
    await asyncio.sleep(6.0)
    assert fleet.held() == {"a", "b", "c", "x", "y", "z"}
    waits = sorted(r.__dict__["sl_fields"]["unowned_s"] for r in events(caplog, "lease.acquired")
                   if r.__dict__["sl_fields"]["stream"] in {"x", "y", "z"})
    # Starving: one, into the band (cycles are jittered, so the first cycle past two
    # intervals may come after three); abandoned: the rest, at a later cycle.
    assert waits[0] >= 2.0, waits
    assert waits[1] > waits[0] and all(w >= 3.0 for w in waits[1:]), waits
    await fleet.stop()


async def test_a_short_member_takes_its_band_not_every_abandoned_orphan() -> None:
    """Orphans that waited three intervals (here: every acquire failed meanwhile) go to a
    member that would otherwise take nothing; a member with a gap of its own fills its
    band and no more, as a slow start-up would otherwise pile streams on it."""
    fleet = Fleet()
    await fleet.streams("a", "b", "c")
    fleet.start()
    await asyncio.sleep(1.5)
    fleet.member.view = FleetView((
        MemberRecord("w2", epoch=1, heartbeat=1, status=MemberStatus.ACTIVE, streams=6,
                     capacity=100),
        MemberRecord("w3", epoch=1, heartbeat=1, status=MemberStatus.ACTIVE, streams=0,
                     capacity=100),
    ))
    # total 3 + 6 + 0 + 6 orphans = 15, share 5: w1 is short by 2, its band ends at 6.
    fleet.store.fail("acquire", times=10_000)
    await fleet.streams("u", "v", "w", "x", "y", "z")
    await asyncio.sleep(3.5)  # every orphan has now waited three intervals
    assert fleet.held() == {"a", "b", "c"}
    fleet.store.heal("acquire")
    for _ in range(100):
        await asyncio.sleep(0.05)
        if len(fleet.held()) > 3:
            break
    assert len(fleet.held()) == 6, fleet.held()  # share + TOLERANCE, not all nine
    await fleet.stop()


async def test_a_short_lease_fleet_rebalances_after_its_scaled_minimum_hold(
        caplog: pytest.LogCaptureFixture) -> None:
    """A scale-out from 2 to 4 workers with a 2 s member lease and the minimum hold left at
    its default: the hold follows the lease (1.5 x 2 s = 3 s), so the first stream moves
    a few seconds after it was taken, not after a fixed 30 s, and none moves sooner."""
    config = WorkerConfig.from_env({"STREAMLEASE_LEASE_SECONDS": "2",
                                    "STREAMLEASE_HEARTBEAT_SECONDS": "0.5",
                                    "STREAMLEASE_SKEW_MARGIN_SECONDS": "0.2"})
    wired = build_settings(config)
    hold = 1.5 * config.timings.lease_s  # 3 s
    fleet = Fleet(min_hold_s=wired.min_hold_s, stopped_check_s=wired.stopped_check_s)
    await fleet.streams("a", "b", "c", "d")
    fleet.start()
    await fleet.holding(4)
    first_taken = min(s.acquired_at for s in fleet.reconciler.supervisors.values())
    fleet.member.view = FleetView((
        MemberRecord("w2", epoch=1, heartbeat=1, status=MemberStatus.ACTIVE, streams=4,
                     capacity=100),
        MemberRecord("w3", epoch=1, heartbeat=1, status=MemberStatus.ACTIVE, streams=0,
                     capacity=100),
        MemberRecord("w4", epoch=1, heartbeat=1, status=MemberStatus.ACTIVE, streams=0,
                     capacity=100),
    ))
    # total 8, share 2: w1 is past its band (share + 1) and sheds.
    async with asyncio.timeout(60):
        while not events(caplog, "balance.shed"):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    held_for = fleet.clock.monotonic() - first_taken
    # The first cycle past the hold sheds: cycles come every reconcile interval (+20 %).
    assert hold <= held_for < hold + 1.3, held_for
    await fleet.stop()


# --- the self-audit and admission at the moment of the call ------------------------------


async def test_the_self_audit_releases_a_lease_it_does_not_serve_and_reads_each_once() -> None:
    """A stream leased to this worker with no supervisor here (an acquire whose answer was
    lost, a failed supervisor, a previous incarnation) is released by the audit; a stream
    it serves is left alone; a pair it has read once is not read again."""
    fleet = Fleet(max_streams=1)
    await fleet.streams("served", "leaked", "gone")
    fleet.start()
    await asyncio.sleep(3)
    assert len(fleet.held()) == 1
    served = next(iter(fleet.held()))
    others = sorted({"served", "leaked", "gone"} - {served})
    # Leak one: leased to w1 with no supervisor. Another was w1's once and moved on.
    leaked = await fleet.memory.acquire(others[0], "w1", fleet.clock.wall_ms(), T)
    assert leaked is not None
    moved = await fleet.memory.acquire(others[1], "w1", fleet.clock.wall_ms(), T)
    assert moved is not None and await fleet.memory.release(moved.tenure)
    assert await fleet.memory.acquire(others[1], "w2", fleet.clock.wall_ms(), T) is not None
    await asyncio.sleep(fleet.memory.index_lag.max_s)  # the owner index catches up
    assert await fleet.reconciler.audit() == 1
    record = await fleet.memory.get(others[0])
    assert record is not None and record.lease_expires_at_ms == 0
    assert (await fleet.memory.get(served)).lease_expires_at_ms > 0  # type: ignore[union-attr]
    assert fleet.metrics.registry.get_sample_value(
        "streamlease_unserved_leases_released_total") == 1
    reads = fleet.store.count("check")
    assert await fleet.reconciler.audit() == 0
    assert fleet.store.count("check") == reads  # nothing new under this worker's name
    await fleet.stop()


async def test_the_self_audit_runs_by_itself_within_two_audit_intervals() -> None:
    fleet = Fleet(max_streams=0, audit_s=4.0)
    await fleet.streams("x")
    fleet.start()
    got = await fleet.memory.acquire("x", "w1", fleet.clock.wall_ms(), T)
    assert got is not None
    await asyncio.sleep(2 * 4.0)
    record = await fleet.memory.get("x")
    assert record is not None and record.lease_expires_at_ms == 0
    await fleet.stop()


async def test_no_acquisition_is_sent_once_the_worker_stopped_accepting() -> None:
    """The plan was made while accepting; by the time of the call the member self-fenced.
    Nothing is sent, and nothing is left leased to this worker."""
    fleet = Fleet()
    await fleet.streams("a")
    record = await fleet.memory.get("a")
    assert record is not None
    fleet.member.accepting = False  # type: ignore[misc]
    await fleet.reconciler.intake.acquire(record)
    assert fleet.store.count("acquire") == 0
    assert not fleet.held()


async def test_an_acquisition_answered_after_the_worker_stopped_accepting_is_handed_back() -> None:
    fleet = Fleet()
    await fleet.streams("a")
    record = await fleet.memory.get("a")
    assert record is not None
    member = fleet.member

    original = fleet.memory.acquire

    async def acquire_then_lapse(*args: Any, **kwargs: Any) -> Any:
        got = await original(*args, **kwargs)
        member.accepting = False  # type: ignore[misc]
        return got

    fleet.memory.acquire = acquire_then_lapse  # type: ignore[method-assign]
    await fleet.reconciler.intake.acquire(record)
    assert not fleet.held()
    after = await fleet.memory.get("a")
    assert after is not None and after.lease_expires_at_ms == 0


async def test_a_hand_over_whose_release_fails_during_shutdown_is_counted_unreleased() -> None:
    """Counted, the member row stays, and peers release the stream on this worker's behalf;
    not counted, the row would be deleted and the stream wait for its stream lease."""
    fleet = Fleet()
    await fleet.streams("a")
    fleet.start()
    async with asyncio.timeout(10):
        while "a" not in fleet.held():  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    fleet.store.fail("release", times=10_000)
    fleet.reconciler.supervisors["a"].request_drain(StopReason.REBALANCE)
    await fleet.stop()
    assert fleet.reconciler.unreleased == 1


async def test_the_self_audit_leaves_a_newer_incarnations_lease_alone() -> None:
    fleet = Fleet(max_streams=0)
    await fleet.streams("x")
    got = await fleet.memory.acquire("x", "w1", fleet.clock.wall_ms(), T,
                                     epoch=StaticMember.epoch + 1)
    assert got is not None
    await asyncio.sleep(1)  # the owner index shows it after its lag
    assert await fleet.reconciler.audit() == 0
    record = await fleet.memory.get("x")
    assert record is not None and record.lease_expires_at_ms



async def test_a_member_reading_the_leaders_row_plans_from_its_bulletin(
        caplog: pytest.LogCaptureFixture) -> None:
    """The bulletin's level is the share: w1 holds 4 where the level says 2, past its band
    (share + 1), so it sheds; then it sheds no more while the bulletin stays the one that
    shed followed; named a donor in a newer bulletin, it gives one at once."""
    fleet = Fleet(min_hold_s=0.0)
    await fleet.streams("a", "b", "c", "d")
    fleet.start()
    await fleet.holding(4)
    fleet.plans_from(Bulletin(gen=1, level=2, total=8, deficit=2, below=1, active=3,
                              draining=False), streams=2)
    async with asyncio.timeout(30):
        while not events(caplog, "balance.shed"):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert fleet.metrics.registry.get_sample_value("streamlease_member_share") == 2
    first = fleet.clock.monotonic()
    # Nobody else takes the stream it shed: it waits, and w1 takes it back once it has
    # waited three intervals (balance never leaves a stream unserved). The same bulletin
    # does not make it shed again for four heartbeats.
    await asyncio.sleep(3 * T.heartbeat_s)
    assert len(events(caplog, "balance.shed")) == 1
    fleet.member.bulletin = Bulletin(gen=1, level=2, total=8, deficit=0, below=0, active=3,
                                     draining=False, donors=("w1",))
    async with asyncio.timeout(30):
        while len(events(caplog, "balance.shed")) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert fleet.clock.monotonic() - first < 4 * T.heartbeat_s
    await fleet.stop()


async def test_a_member_does_not_take_back_a_stream_it_just_handed_over(
        caplog: pytest.LogCaptureFixture) -> None:
    """Named a donor, w1 gives one of its three streams (the level is 3); the next plan,
    from the same lagging bulletin, shows it one short. It leaves the stream to the
    members below their share for three reconcile intervals, and only then (nobody came)
    takes it back: balance never leaves a stream unserved."""
    fleet = Fleet(min_hold_s=0.0)
    await fleet.streams("a", "b", "c")
    fleet.start()
    await fleet.holding(3)
    fleet.plans_from(Bulletin(gen=1, level=3, total=7, deficit=1, below=1, active=3,
                              draining=False, donors=("w1",)), streams=3)
    async with asyncio.timeout(30):
        while not events(caplog, "balance.shed"):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    (shed,) = events(caplog, "balance.shed")
    (given,) = shed.sl_fields["streams"]  # type: ignore[attr-defined]
    async with asyncio.timeout(30):
        while given in fleet.held():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    released = fleet.clock.monotonic()
    async with asyncio.timeout(30):
        while given not in fleet.held():  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert fleet.clock.monotonic() - released >= 3 * 1.0  # three reconcile intervals
    assert len(events(caplog, "balance.shed")) == 1
    await fleet.stop()


async def test_a_member_reading_only_the_leaders_row_hands_its_drain_to_the_bulletins_takers(
        caplog: pytest.LogCaptureFixture) -> None:
    """A member planning from the bulletin reads one row, the leader's: its shutdown
    offers its streams to the members the bulletin names as having room (spread one
    fuller per stream), not all to the leader, which would only shed them again."""
    fleet = Fleet(handover_wait_s=5.0)
    await fleet.streams("a", "b", "c", "d")
    fleet.start()
    await fleet.holding(4)
    fleet.plans_from(Bulletin(
        gen=1, level=4, total=8, deficit=8, below=2, active=4, draining=False,
        takers=(Taker("w3", 2, 0, 0, 10), Taker("w4", 3, 0, 0, 10), Taker("w9", 1, 0, 4, 5),
                Taker("w1", 1, 0, 4, 100))), streams=4, capacity=5, heartbeat=5)
    peers = fleet.member.peers()
    # The leader once (its own row, not the bulletin's copy); this worker is no taker.
    assert [m.worker_id for m in peers] == ["w9", "w3", "w4", "w1"]
    assert {m.heartbeat for m in peers} == {5}
    fleet.member.offers_taken = True  # each reaches its row; nobody takes it
    await fleet.stop()
    offered = sorted(who for who, _ in fleet.member.offers_made)
    assert offered == ["w3", "w3", "w4", "w4"], fleet.member.offers_made
    # Not taken within the wait: each stream was released.
    assert all(r.lease_expires_at_ms == 0 for r in await fleet.memory.list_streams())


async def test_a_shed_every_peer_refused_is_kept_and_shedding_pauses_four_heartbeats(
        caplog: pytest.LogCaptureFixture) -> None:
    """The bulletin names w3 short, but w3's row refuses each rebalance (this fake's
    rows refuse every offer; a decline ends the same way): w1 keeps the streams,
    delivering, and sheds nothing more for four heartbeats, even on a newer bulletin
    (which alone would let it shed again): shedding at once would be refused again,
    stream by stream."""
    fleet = Fleet(handover_wait_s=5.0, min_hold_s=0.0)
    await fleet.streams("a", "b", "c", "d")
    fleet.start()
    await fleet.holding(4)
    news = Bulletin(gen=1, level=2, total=6, deficit=2, below=1, active=3, draining=False,
                    takers=(Taker("w3", 2, 0, 0, 10),))
    fleet.plans_from(news, streams=2, capacity=2, heartbeat=5)
    await until_event(caplog, "handover.kept")
    kept = fleet.clock.monotonic()
    assert len(fleet.held()) == 4
    assert {who for who, _ in fleet.member.offers_made} == {"w3"}
    fleet.member.bulletin = dataclasses.replace(news, gen=2)
    async with asyncio.timeout(60):
        while len(events(caplog, "balance.shed")) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert fleet.clock.monotonic() - kept >= KEPT_PAUSE_HEARTBEATS * T.heartbeat_s
    assert fleet.metrics.registry.get_sample_value(
        "streamlease_handovers_total", {"outcome": "kept"}) >= 1
    assert all(r.lease_owner == "w1" for r in await fleet.memory.list_streams())
    await fleet.stop()


async def test_a_member_reading_every_row_names_its_takers_from_them() -> None:
    member = StaticMember()
    rows = (MemberRecord("w9", epoch=1, heartbeat=5, status=MemberStatus.ACTIVE),)
    member.view = FleetView(rows)
    member.bulletin = Bulletin(gen=1, level=4, total=8, deficit=8, below=2, active=4,
                               draining=False, takers=(Taker("w3", 2, 0, 0, 10),))
    assert member.peers() == rows  # reading_all: the bulletin is not what it plans from
    member.reading_all, member.bulletin = False, None
    assert member.peers() == rows


async def feed_live_fleet(news: Bulletin, *streams: str) -> Fleet:
    """One member planning from the leader's bulletin ``news`` (the leader, w9, holds
    the level) with the change feed live, holding ``streams``."""
    fleet = Fleet()
    fleet.member.feed_live = lambda: True  # type: ignore[method-assign]
    fleet.plans_from(news, streams=news.level)
    await fleet.streams(*streams)
    fleet.start()
    await fleet.holding(len(streams))
    return fleet


async def test_a_member_below_its_share_keeps_looking_while_the_change_feed_is_live() -> None:
    """With the feed live, a member inside its band polls the orphan index twelve times
    less often (every freed stream is offered to someone). One below its band does not
    rest: a stream another member sheds without an offer reaching it (the offer went to
    a member with more room, or was lost with a leader) is taken at a regular cycle."""
    fleet = await feed_live_fleet(Bulletin(gen=1, level=5, total=10, deficit=4, below=1,
                                           active=2, draining=False), "a")
    await asyncio.sleep(2.0)  # a cycle that saw no orphan: nothing to take, as far as it knows
    await fleet.streams("b", "c", "d")
    await asyncio.sleep(3 * 1.2)  # three regular cycles
    assert fleet.held() == {"a", "b", "c", "d"}
    await fleet.stop()


@pytest.mark.parametrize("reading_all", [False, True])
async def test_one_above_its_share_rests_while_the_feed_is_live_if_the_leader_plans(
        reading_all: bool) -> None:
    """Planning from the leader's bulletin, a member one above its share gives only when
    the bulletin names it a donor (and such a bulletin pokes a cycle): meanwhile it polls
    the orphan index no more often than one inside its band. Planning from every row, its
    own plan decides at each cycle: it keeps the regular cadence."""
    fleet = await feed_live_fleet(Bulletin(gen=1, level=2, total=5, deficit=0, below=0,
                                           active=2, draining=False), "a", "b", "c")
    fleet.member.reading_all = reading_all
    # The rows as read: the leader holds 1, so a share of 2 whichever way it is planned.
    fleet.member.view = FleetView((MemberRecord("w9", epoch=1, heartbeat=1, streams=1,
                                                status=MemberStatus.ACTIVE, capacity=100),))
    queries: list[float] = []
    query = fleet.store.orphans

    async def orphans(*args: Any, **kwargs: Any) -> Any:
        queries.append(fleet.clock.monotonic())
        return await query(*args, **kwargs)

    fleet.store.orphans = orphans  # type: ignore[method-assign]
    await asyncio.sleep(4 * 1.2)  # four regular cycles at most
    assert fleet.held() == {"a", "b", "c"}
    if reading_all:
        assert len(queries) >= 3, queries
    else:
        assert len(queries) <= 2, queries
    await fleet.stop()


async def test_an_offered_stream_is_read_while_the_orphan_query_is_in_flight() -> None:
    """The offered stream's consistent read goes out beside the cycle's orphan query, not
    after it: a hand-off is taken one round trip sooner. (The query is held until the
    read was sent; a cycle reading after its query would hold it to the deadline.)"""
    memory = MemoryStore(index_lag_s=8.0, index_lag_jitter_s=0.0)
    fleet = Fleet(memory)
    order: list[str] = []
    offered_read = asyncio.Event()
    hold = False
    query, check = fleet.store.orphans, fleet.store.check

    async def orphans(*args: Any, **kwargs: Any) -> Any:
        if hold:
            try:
                await asyncio.wait_for(offered_read.wait(), timeout=5.0)
            except TimeoutError:
                order.append("query answered before the offered read")
        found = await query(*args, **kwargs)
        order.append("query")
        return found

    async def checked(stream_id: str, **kwargs: Any) -> Any:
        if stream_id == "x":
            order.append("offered read")
            offered_read.set()
        return await check(stream_id, **kwargs)

    fleet.store.orphans = orphans  # type: ignore[method-assign]
    fleet.store.check = checked  # type: ignore[method-assign]
    fleet.start()
    await asyncio.sleep(1.0)
    await memory.put_started("x", URL.format("x"))
    hold = True
    order.clear()
    fleet.reconciler.notice(Notice(1, "w1", "x", NoticeKind.OFFER))
    async with asyncio.timeout(10):
        while fleet.held() != {"x"}:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert order[:2] == ["offered read", "query"], order
    await fleet.stop()


async def test_an_offered_stream_is_taken_when_the_orphan_query_fails(
        caplog: pytest.LogCaptureFixture) -> None:
    """A failed orphan query does not cost the cycle its offered streams: they were read
    beside it, and are taken; the failure is logged."""
    memory = MemoryStore(index_lag_s=8.0, index_lag_jitter_s=0.0)
    fleet = Fleet(memory)
    fleet.start()
    await asyncio.sleep(1.0)
    await memory.put_started("x", URL.format("x"))
    fleet.store.fail("orphans", times=100)
    fleet.reconciler.notice(Notice(1, "w1", "x", NoticeKind.OFFER))
    async with asyncio.timeout(10):
        while fleet.held() != {"x"}:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert any("offered streams only" in r.getMessage()
               for r in events(caplog, "reconcile.failed"))
    await fleet.stop()


async def test_an_offer_whose_read_and_query_both_fail_waits_for_the_next_cycle() -> None:
    """The cycle's orphan query and the offered stream's read both fail: the offer is kept
    for the next cycle (taken well before the lagging index would show the stream)."""
    memory = MemoryStore(index_lag_s=8.0, index_lag_jitter_s=0.0)
    fleet = Fleet(memory)
    fleet.start()
    await asyncio.sleep(1.0)
    await memory.put_started("x", URL.format("x"))
    fleet.store.fail("orphans", times=1)
    fleet.store.fail("check", times=1)
    fleet.reconciler.notice(Notice(1, "w1", "x", NoticeKind.OFFER))
    async with asyncio.timeout(5):
        while fleet.held() != {"x"}:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert fleet.store.count("check") >= 2
    await fleet.stop()


async def test_an_offered_stream_is_read_and_taken_before_the_index_shows_it() -> None:
    """The leader's feed offers a freed or new stream: the member reads it consistently
    and takes it at once, instead of waiting for the orphan index (which lags)."""
    memory = MemoryStore(index_lag_s=8.0, index_lag_jitter_s=0.0)
    fleet = Fleet(memory)
    fleet.start()
    await asyncio.sleep(2.0)
    await memory.put_started("x", URL.format("x"))  # the index shows it 8 s from now
    fleet.reconciler.notice(Notice(1, "w1", "x", NoticeKind.OFFER))
    await asyncio.sleep(1.0)
    assert fleet.held() == {"x"}
    # An offer of a stream someone holds is read, and not taken.
    await memory.put_started("y", URL.format("y"))
    assert await memory.acquire("y", "w2", fleet.clock.wall_ms(), T) is not None
    fleet.reconciler.notice(Notice(2, "w1", "y", NoticeKind.OFFER))
    await asyncio.sleep(1.0)
    assert fleet.held() == {"x"}
    await fleet.stop()
