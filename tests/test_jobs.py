"""The job runner with real commands (``/bin/sh``), the in-memory store and a real leader
lease on it: each slot once, outcomes recorded, commands stopped by their timeout or a
lost lease (their whole process group), output kept to a bounded tail."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from streamlease.clock import SYSTEM_CLOCK
from streamlease.core.jobs import (
    OUTPUT_TAIL_BYTES,
    Job,
    JobList,
    JobRun,
    RunOutcome,
    UnreadableJob,
)
from streamlease.core.schedule import Schedule, slot_ms, slot_name
from streamlease.errors import StoreUnavailable
from streamlease.jobs import JobRunner, JobSettings
from streamlease.leader import LeaderLease
from streamlease.metrics import Metrics
from streamlease.store.memory import MemoryStore
from streamlease.store.protocols import Stores


class Rig:
    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.stores = self.memory.stores()
        self.metrics = Metrics()
        self.runner = JobRunner(self.stores.jobs, SYSTEM_CLOCK, self.metrics, JobSettings(
            owner="w1", grace_s=0.5, late_ms=2000, refresh_s=0.2, shutdown_s=1.0,
            env=dict(os.environ)))
        self.stop = asyncio.Event()
        self.lease = LeaderLease(self.stores.leader, "fleet", "w1", ttl_s=3.0,
                                 heartbeat_s=0.5, safety_margin_s=0.3)

    async def job(self, name: str, command: str, every_ms: int = 1000,
                  timeout_s: float | None = None, catch_up: bool = False) -> None:
        await self.stores.jobs.put_job(Job(name, Schedule(every_ms=every_ms), command,
                                           timeout_s, catch_up, SYSTEM_CLOCK.wall_ms()))

    async def runs(self, name: str) -> list:  # type: ignore[type-arg]
        return list(reversed(await self.stores.jobs.runs(name, 1000)))

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels or None) or 0.0


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    made = Rig()
    await made.lease.acquire()
    task = asyncio.create_task(made.runner.run(made.lease, made.stop))
    made.task = task  # type: ignore[attr-defined]
    yield made
    made.stop.set()
    await asyncio.wait_for(task, 30)
    await made.lease.release()


async def until(check: object, timeout: float = 15.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():  # type: ignore[operator]  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_each_slot_runs_once_with_its_environment(rig: Rig, tmp_path: Path) -> None:
    log = tmp_path / "ran"
    await rig.job("tick", f'echo "$STREAMLEASE_JOB $STREAMLEASE_SLOT $STREAMLEASE_FENCE" >> {log}')

    async def three() -> bool:
        done = [r for r in await rig.runs("tick") if r.outcome is not None]
        return len(done) >= 3
    await until(three)
    runs = await rig.runs("tick")
    lines = log.read_text().splitlines()
    slots = [r.slot for r in runs if r.outcome is RunOutcome.SUCCEEDED]
    assert len(set(slots)) == len(slots)  # never twice
    for line in lines:
        name, slot, fence = line.split()
        assert name == "tick" and slot in slots and int(fence) == rig.lease.fence
    assert [slot_ms(s) % 1000 for s in slots] == [0] * len(slots)  # aligned slots
    assert all(r.runner == "w1" and r.fence == rig.lease.fence and r.exit_code == 0
               for r in runs if r.outcome is not None)
    assert rig.metric("streamlease_job_runs_total", outcome="succeeded") >= 3


async def test_failures_are_recorded_with_their_exit_code_and_output(rig: Rig) -> None:
    await rig.job("bad", "echo boom >&2; exit 7")
    await rig.job("missing", "no-such-command-anywhere --now")

    async def both() -> bool:
        return bool([r for r in await rig.runs("bad") if r.outcome]) and \
            bool([r for r in await rig.runs("missing") if r.outcome])
    await until(both)
    bad = next(r for r in await rig.runs("bad") if r.outcome)
    assert (bad.outcome, bad.exit_code) == (RunOutcome.FAILED, 7) and "boom" in bad.output
    missing = next(r for r in await rig.runs("missing") if r.outcome)
    assert (missing.outcome, missing.exit_code) == (RunOutcome.FAILED, 127)
    assert "not found" in missing.output


async def test_megabytes_of_output_keep_a_bounded_tail(rig: Rig) -> None:
    await rig.job("loud", f"{sys.executable} -c \"import sys; "
                          "sys.stdout.write('x' * 5_000_000 + 'THE END')\"", every_ms=2000)

    async def done() -> bool:
        return any(r.outcome for r in await rig.runs("loud"))
    await until(done, 30)
    run = next(r for r in await rig.runs("loud") if r.outcome)
    assert run.outcome is RunOutcome.SUCCEEDED
    assert len(run.output.encode()) <= OUTPUT_TAIL_BYTES and run.output.endswith("THE END")


async def test_a_timeout_stops_the_whole_process_group(rig: Rig, tmp_path: Path) -> None:
    child = tmp_path / "child.pid"
    # A shell that starts a grandchild: both must go when the run is stopped.
    await rig.job("slow", f"sleep 60 & echo $! > {child}; wait", every_ms=3000, timeout_s=0.5)

    async def stopped() -> bool:
        return any(r.outcome for r in await rig.runs("slow"))
    await until(stopped, 20)
    run = next(r for r in await rig.runs("slow") if r.outcome)
    assert run.outcome is RunOutcome.TIMED_OUT
    pid = int(child.read_text())
    await until(lambda: asyncio.sleep(0, result=not Path(f"/proc/{pid}").exists()), 5)


async def test_losing_the_lease_stops_the_run_and_records_it_fenced(rig: Rig) -> None:
    await rig.job("long", "sleep 30", every_ms=2000)

    async def running() -> bool:
        return any(r.outcome is None for r in await rig.runs("long"))
    await until(running)
    # Another leader takes over (as after observing this one dead).
    seen = await rig.stores.leader.read("fleet")
    assert await rig.stores.leader.acquire("fleet", "w2", 3.0, seen, SYSTEM_CLOCK.wall_ms())

    async def fenced() -> bool:
        return any(r.outcome is RunOutcome.FENCED for r in await rig.runs("long"))
    await until(fenced, 15)
    assert rig.lease.lost.is_set()


async def test_a_claimed_slot_is_never_run_again_and_a_new_leader_marks_it_abandoned(
        ) -> None:
    rig = Rig()
    await rig.job("once", "true", every_ms=60_000)
    now = SYSTEM_CLOCK.wall_ms()
    slot = now - now % 60_000
    await rig.lease.acquire()
    # A previous leader (an older fence) claimed this slot and vanished mid-run.
    from streamlease.core.jobs import JobRun
    from streamlease.core.schedule import slot_name
    await rig.stores.jobs.claim_run(JobRun("once", slot_name(slot), rig.lease.fence - 1, "w0",
                                           slot))
    task = asyncio.create_task(rig.runner.run(rig.lease, rig.stop))

    async def abandoned() -> bool:
        runs = await rig.runs("once")
        return bool(runs) and runs[0].outcome is RunOutcome.ABANDONED
    await until(abandoned)
    await asyncio.sleep(0.5)
    assert [r.runner for r in await rig.runs("once")] == ["w0"]  # not run again
    rig.stop.set()
    await task
    await rig.lease.release()


async def test_shutdown_lets_a_running_job_finish_within_the_budget(tmp_path: Path) -> None:
    rig = Rig()
    marker = tmp_path / "finished"
    await rig.job("short", f"sleep 0.5; touch {marker}", every_ms=1000)
    await rig.lease.acquire()
    task = asyncio.create_task(rig.runner.run(rig.lease, rig.stop))

    async def started() -> bool:
        return any(r.outcome is None for r in await rig.runs("short"))
    await until(started)
    rig.stop.set()
    await asyncio.wait_for(task, 10)
    assert marker.exists()
    assert all(r.outcome is RunOutcome.SUCCEEDED for r in await rig.runs("short"))
    await rig.lease.release()


async def test_an_unreadable_job_item_is_reported_and_never_run(
        caplog: pytest.LogCaptureFixture) -> None:
    rig = Rig()
    good = rig.stores.jobs
    bad = UnreadableJob("hand-edited", "bad schedule: cron expression '61 * * * *' ...")

    class WithABadItem:
        """The store as it reads back a table holding one hand-edited job item."""

        def __getattr__(self, name: str) -> object:
            return getattr(good, name)

        async def list_jobs(self, timeout: float | None = None) -> JobList:
            listing = await good.list_jobs(timeout)
            return JobList(listing.jobs, [bad])

    rig.runner.jobs = WithABadItem()  # type: ignore[assignment]
    await rig.job("fine", "true")
    await rig.lease.acquire()
    task = asyncio.create_task(rig.runner.run(rig.lease, rig.stop))
    try:
        async def ran(times: int) -> bool:
            return sum(r.outcome is RunOutcome.SUCCEEDED for r in await rig.runs("fine")) >= times
        await until(lambda: ran(1))  # the good job is not held up by the bad one
        assert rig.metric("streamlease_jobs_unreadable") == 1
        await until(lambda: ran(2))  # a slot later: several refreshes of the job list
        warnings = [r for r in caplog.records if getattr(r, "sl_event", "") == "job.unreadable"]
        assert len(warnings) == 1, "warned once, not at every refresh"
        assert await rig.runs("hand-edited") == []
    finally:
        rig.stop.set()
        await asyncio.wait_for(task, 30)
        await rig.lease.release()
    assert rig.metric("streamlease_jobs_unreadable") == 0  # no longer leading: not reported


class ShiftedClock:
    """The system clock with its wall time moved by ``shift_ms``: puts a slot where a test
    needs it relative to when this leader began."""

    def __init__(self) -> None:
        self.shift_ms = 0

    def monotonic(self) -> float:
        return SYSTEM_CLOCK.monotonic()

    def wall_ms(self) -> int:
        return SYSTEM_CLOCK.wall_ms() + self.shift_ms

    async def sleep(self, seconds: float) -> None:
        await SYSTEM_CLOCK.sleep(seconds)


class ReadsOfRuns:
    """The job store, counting job-list reads; its first read of a job's runs can fail."""

    def __init__(self, inner: Any, fail_first_runs: bool) -> None:
        self.inner = inner
        self.listings = 0
        self.fail_runs = fail_first_runs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def list_jobs(self, timeout: float | None = None) -> JobList:
        self.listings += 1
        return await self.inner.list_jobs(timeout)

    async def runs(self, job: str, last: int, timeout: float | None = None) -> list[JobRun]:
        if self.fail_runs:
            self.fail_runs = False
            raise StoreUnavailable("fleet table unavailable")
        return list(await self.inner.runs(job, last, timeout))


TTL, HEARTBEAT, SAFETY = 1.0, 0.3, 0.1
EVERY_MS = 300_000


async def take_over_from_a_dead_leader(stores: Stores, old_ran_the_slot: bool,
                                       ) -> tuple[LeaderLease, int, int]:
    """The old leader w0 runs a five-minutely job's slots, renews one last time, and dies;
    w1 waits it out (a full lease of unchanged reads) and takes the lease. The slot due
    next, in the runner's shifted time, and both fences."""
    await stores.jobs.put_job(Job("report", Schedule(every_ms=EVERY_MS), "true"))
    old_fence = await stores.leader.acquire("fleet", "w0", TTL, None, SYSTEM_CLOCK.wall_ms())
    assert old_fence is not None
    now = SYSTEM_CLOCK.wall_ms()
    slot = now - now % EVERY_MS + EVERY_MS
    for ran in [slot - EVERY_MS] + ([slot] if old_ran_the_slot else []):
        run = JobRun("report", slot_name(ran), old_fence, "w0", now)
        assert await stores.jobs.claim_run(run)
        assert await stores.jobs.finish_run(replace(run, finished_at_ms=now,
                                                    outcome=RunOutcome.SUCCEEDED, exit_code=0))
    await stores.leader.renew("fleet", "w0", old_fence, TTL, SYSTEM_CLOCK.wall_ms())
    lease = LeaderLease(stores.leader, "fleet", "w1", ttl_s=TTL, heartbeat_s=HEARTBEAT,
                        safety_margin_s=SAFETY)
    async with asyncio.timeout(10):
        await lease.acquire()
    assert lease.fence > old_fence
    return lease, slot, old_fence


@pytest.mark.parametrize("old_ran_the_slot", [False, True],
                         ids=["slot-missed", "slot-ran-before-the-death"])
async def test_a_slot_due_during_a_takeover_from_a_dead_leader_runs_exactly_once(
        old_ran_the_slot: bool, caplog: pytest.LogCaptureFixture) -> None:
    """The slot came due in the takeover: a lease and a heartbeat before the new leader
    held the lease (the dead leader's lease running out, then observation and acquisition).
    If the old leader did not run it, the new one does, instead of skipping it for the
    takeover's length; if it did, the new one never runs it again — even when it cannot
    read the run records and falls back on the window: the claim is refused."""
    caplog.set_level(logging.INFO, logger="streamlease")
    store = MemoryStore()
    stores = store.stores()
    metrics = Metrics()
    clock = ShiftedClock()
    lease, slot, old_fence = await take_over_from_a_dead_leader(stores, old_ran_the_slot)
    jobs = ReadsOfRuns(stores.jobs, fail_first_runs=old_ran_the_slot)
    # As the app wires it, late_ms is one lease: too short for a whole takeover.
    runner = JobRunner(jobs, clock, metrics, JobSettings(  # type: ignore[arg-type]
        owner="w1", grace_s=0.5, late_ms=int(TTL * 1000), refresh_s=0.2, shutdown_s=1.0,
        env=dict(os.environ)))
    clock.shift_ms = slot + int((TTL + HEARTBEAT) * 1000) - SYSTEM_CLOCK.wall_ms()
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(lease, stop))
    try:
        if old_ran_the_slot:
            await until(lambda: asyncio.sleep(0, result=any(
                getattr(r, "sl_event", "") == "job.claimed_already" for r in caplog.records)))
        else:
            async def ran() -> bool:
                return any(r.slot == slot_name(slot) and r.outcome is RunOutcome.SUCCEEDED
                           for r in await stores.jobs.runs("report", 10))
            await until(ran, 5)
        listed = jobs.listings
        await until(lambda: asyncio.sleep(0, result=jobs.listings >= listed + 2))
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
        await lease.release()
    runs = list(reversed(await stores.jobs.runs("report", 10)))
    runner_of_slot = "w0" if old_ran_the_slot else "w1"
    assert [(r.slot, r.runner) for r in runs] == [
        (slot_name(slot - EVERY_MS), "w0"), (slot_name(slot), runner_of_slot)]
    assert runs[1].fence == (old_fence if old_ran_the_slot else lease.fence)
    assert (metrics.registry.get_sample_value("streamlease_job_slots_skipped_total") or 0) == 0
    started = [r for r in caplog.records if getattr(r, "sl_event", "") == "job.started"]
    assert len(started) == (0 if old_ran_the_slot else 1)


async def test_a_job_run_that_raises_is_read_and_counted() -> None:
    from streamlease.jobs import _ended

    metrics = Metrics()
    running: dict[str, asyncio.Task[None]] = {}
    wake = asyncio.Event()

    async def broken() -> None:
        raise RuntimeError("a bug in a slot run")

    task = asyncio.create_task(broken())
    running["nightly"] = task
    task.add_done_callback(_ended(running, "nightly", wake, metrics))
    await asyncio.wait({task})
    await asyncio.sleep(0)
    assert wake.is_set() and "nightly" not in running
    assert metrics.registry.get_sample_value("streamlease_task_crashed_total",
                                             {"task": "jobs"}) == 1
