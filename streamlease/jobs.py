"""The job runner: on the fleet leader only, each due slot of each job runs once.

For every slot the leader first *claims* it: a conditional put of the run record (job +
slot) stamped with its fence. With the leader lease in DynamoDB the claim is a fenced
write — one transaction that also checks the lease still carries that fence — so a
deposed leader cannot even claim. A claimed slot is never run again, by anyone.

The command runs as ``/bin/sh -c COMMAND`` in a process group of its own, with
``STREAMLEASE_JOB``, ``STREAMLEASE_SLOT`` (the slot, ISO 8601 UTC) and ``STREAMLEASE_FENCE``
added to the worker's environment, stdin closed, and stdout and stderr merged into a
bounded tail kept in the run record. One run per job at a time: of the slots that come
due while the previous run still goes, the latest runs when it ends and the others are
skipped (with ``catch_up``, each runs in turn).

It stops the command's whole group (SIGTERM, then SIGKILL after
``STREAMLEASE_JOB_GRACE_SECONDS``) when its timeout passes (``timed_out``), when this
worker loses the lease (``fenced``: another leader may already be running the next
slot), or when the worker shuts down and the job outlives the shutdown budget
(``abandoned``). A run whose leader vanished without recording an outcome is marked
``abandoned`` by the next leader. Exit code 3 — a fenced write refused for a stale fence
(``streamlease job write``) — is recorded ``fenced``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from streamlease import tracing
from streamlease.clock import Clock
from streamlease.core.jobs import (
    Job,
    JobRun,
    RunOutcome,
    UnreadableJob,
    due_slots,
    keep_tail,
    takeover_grace_ms,
)
from streamlease.core.schedule import slot_ms, slot_name
from streamlease.errors import StaleFence, StoreError
from streamlease.leader import LeaderLease, WriteRefused
from streamlease.logs import event
from streamlease.metrics import Metrics
from streamlease.store.protocols import JobStore

EXIT_STALE_FENCE = 3


@dataclass(frozen=True)
class JobSettings:
    owner: str
    grace_s: float  # SIGTERM -> SIGKILL
    # A slot due at most this long before leadership began still runs; never less than
    # a whole takeover of the lease (``takeover_grace_ms``: lease + 2 x heartbeat).
    late_ms: int
    refresh_s: float  # job definitions are read again this often
    shutdown_s: float  # how long running jobs may finish when the worker shuts down
    env: Mapping[str, str]  # the commands' base environment
    shutdown_grace_s: float | None = None  # SIGTERM -> SIGKILL then (default: grace_s)


class JobRunner:
    def __init__(self, jobs: JobStore, clock: Clock, metrics: Metrics,
                 settings: JobSettings) -> None:
        self.jobs = jobs
        self.clock = clock
        self.metrics = metrics
        self.settings = settings
        self._unreadable_seen: set[tuple[str, str]] = set()

    async def run(self, lease: LeaderLease, stop: asyncio.Event) -> None:
        """Run due slots while ``lease`` is held and until ``stop``; then let running
        jobs finish within the shutdown budget (or stop them)."""
        leader_since = self.clock.wall_ms()
        grace_ms = max(self.settings.late_ms, takeover_grace_ms(lease.timings.lease_s,
                                                                lease.timings.heartbeat_s))
        last_slot: dict[str, int | None] = {}
        running: dict[str, asyncio.Task[None]] = {}
        jobs: list[Job] = []
        next_refresh = 0.0
        wake = asyncio.Event()
        try:
            while not stop.is_set() and not lease.lost.is_set():
                now = self.clock.monotonic()
                if now >= next_refresh:
                    jobs = await self._refresh(lease, jobs, last_slot)
                    next_refresh = now + self.settings.refresh_s
                now_ms = self.clock.wall_ms()
                next_due: int | None = None
                for job in jobs:
                    if job.name in running:
                        continue
                    due, skipped = due_slots(job, now_ms, last_slot[job.name], leader_since,
                                             grace_ms)
                    if skipped:
                        self._skipped(job, skipped)
                        last_slot[job.name] = skipped[-1]
                    if due:
                        last_slot[job.name] = due[0]
                        task = asyncio.create_task(self._run_slot(job, due[0], lease, stop))
                        running[job.name] = task
                        task.add_done_callback(_ended(running, job.name, wake, self.metrics))
                        continue
                    upcoming = job.schedule.next_slot(max(now_ms, last_slot[job.name] or 0))
                    next_due = upcoming if next_due is None else min(next_due, upcoming)
                sleep = next_refresh - self.clock.monotonic()
                if next_due is not None:
                    sleep = min(sleep, (next_due - self.clock.wall_ms()) / 1000)
                await _first(stop, lease.lost, wake, timeout=max(0.0, sleep))
                wake.clear()
        finally:
            self.metrics.unreadable_jobs(0)  # only the leader reads the jobs
            self._unreadable_seen = set()
            if running:
                await self._wind_down(list(running.values()), lease)

    async def _refresh(self, lease: LeaderLease, old: list[Job],
                       last_slot: dict[str, int | None]) -> list[Job]:
        try:
            listing = await self.jobs.list_jobs(timeout=self.settings.refresh_s)
        except StoreError as exc:
            event(logging.WARNING, "job.list_failed", "cannot read the jobs", error=str(exc))
            return old
        self._report_unreadable(listing.unreadable)
        jobs = listing.jobs
        for job in jobs:
            if job.name not in last_slot:
                last_slot[job.name] = await self._latest_slot(job, lease)
        return jobs

    async def _latest_slot(self, job: Job, lease: LeaderLease) -> int | None:
        """The job's latest run record; marks abandoned any run a previous leader left
        without an outcome."""
        try:
            runs = await self.jobs.runs(job.name, 5)
        except StoreError as exc:
            event(logging.WARNING, "job.runs_failed", "cannot read a job's runs", job=job.name,
                  error=str(exc))
            return None
        for run in runs:
            if run.outcome is None and run.fence < lease.fence and \
                    await self.jobs.abandon_run(run.job, run.slot, run.fence,
                                                self.clock.wall_ms()):
                self.metrics.job_run(RunOutcome.ABANDONED.value, 0.0)
                event(logging.WARNING, "job.abandoned",
                      "a run's leader went away before it finished", job=run.job,
                      slot=run.slot, fence=run.fence, runner=run.runner)
        return slot_ms(runs[0].slot) if runs else None

    def _report_unreadable(self, unreadable: list[UnreadableJob]) -> None:
        """Job items that cannot be run as stored are never run: a warning once per item
        and problem, and the gauge, until they are fixed or removed."""
        self.metrics.unreadable_jobs(len(unreadable))
        seen = {(bad.name, bad.problem) for bad in unreadable}
        for bad in unreadable:
            if (bad.name, bad.problem) not in self._unreadable_seen:
                event(logging.WARNING, "job.unreadable",
                      "a job item cannot be run as stored; fix it with `streamlease job put`",
                      job=bad.name, problem=bad.problem)
        self._unreadable_seen = seen

    def _skipped(self, job: Job, slots: list[int]) -> None:
        self.metrics.job_slots_skipped(len(slots))
        event(logging.WARNING, "job.skipped",
              "slots skipped: they came due while no leader could run them, or while the "
              "previous run still went (--catch-up runs each of them, late)",
              job=job.name, slots=len(slots), first=slot_name(slots[0]),
              last=slot_name(slots[-1]))

    async def _claim(self, run: JobRun, lease: LeaderLease) -> bool:
        if not lease.backend.conditional_puts:
            # The lease lives elsewhere (Redis): a claim cannot share its fence check.
            return await self.jobs.claim_run(run)
        try:
            await lease.fenced_write(self.jobs.claim_write(run))
            return True
        except WriteRefused:
            return False  # claimed already: by us before a restart, or by another leader

    async def _run_slot(self, job: Job, slot: int, lease: LeaderLease,
                        stop: asyncio.Event) -> None:
        run = JobRun(job.name, slot_name(slot), lease.fence, self.settings.owner,
                     self.clock.wall_ms())
        try:
            if not await self._claim(run, lease):
                event(logging.INFO, "job.claimed_already", "slot already claimed",
                      job=job.name, slot=run.slot)
                return
        except StaleFence:
            return  # deposed: the lease watcher ends the leadership
        except StoreError as exc:
            self.metrics.job_slots_skipped(1)
            event(logging.WARNING, "job.claim_failed", "could not claim a slot; it is skipped",
                  job=job.name, slot=run.slot, error=str(exc))
            return
        self.metrics.job_started((run.started_at_ms - slot) / 1000)
        event(logging.INFO, "job.started", "job started", job=job.name, slot=run.slot,
              fence=run.fence, late_s=round((run.started_at_ms - slot) / 1000, 3))
        started = self.clock.monotonic()
        # A trace of its own; the job's process gets its context (TRACEPARENT).
        with tracing.span("job_run", root=True, job=job.name, slot=run.slot,
                          fence=run.fence) as span:
            outcome, code, output = await self._execute(job, run, lease, stop)
            tracing.set_attributes(span, outcome=outcome.value, exit_code=code)
        finished = replace(run, finished_at_ms=self.clock.wall_ms(), outcome=outcome,
                           exit_code=code, output=output)
        seconds = self.clock.monotonic() - started
        self.metrics.job_run(outcome.value, seconds)
        event(logging.INFO if outcome is RunOutcome.SUCCEEDED else logging.WARNING,
              "job.finished", "job finished", job=job.name, slot=run.slot, fence=run.fence,
              outcome=outcome.value, exit_code=code, seconds=round(seconds, 3))
        for _ in range(3):
            try:
                if not await self.jobs.finish_run(finished):
                    event(logging.WARNING, "job.record_refused",
                          "the run record was changed meanwhile (marked abandoned?)",
                          job=job.name, slot=run.slot)
                return
            except StoreError as exc:
                event(logging.WARNING, "job.record_failed", "could not record the outcome",
                      job=job.name, slot=run.slot, error=str(exc))
                await self.clock.sleep(0.5)

    async def _execute(self, job: Job, run: JobRun, lease: LeaderLease,
                       stop: asyncio.Event) -> tuple[RunOutcome, int | None, str]:
        env = tracing.job_environment({
            **self.settings.env, "STREAMLEASE_JOB": job.name, "STREAMLEASE_SLOT": run.slot,
            "STREAMLEASE_FENCE": str(run.fence)})
        try:
            proc = await asyncio.create_subprocess_exec(
                "/bin/sh", "-c", job.command, env=env, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                start_new_session=True)
        except OSError as exc:
            return RunOutcome.FAILED, None, f"cannot start /bin/sh: {exc}"
        tail = bytearray()
        reader = asyncio.create_task(_read_tail(proc, tail))
        waiter = asyncio.create_task(proc.wait())
        try:
            stopped_for = await self._watch(job, waiter, lease, stop)
        finally:
            if not waiter.done():
                grace = self.settings.grace_s
                if stop.is_set() and self.settings.shutdown_grace_s is not None:
                    grace = self.settings.shutdown_grace_s
                await self._stop_group(proc, waiter, grace)
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                async with asyncio.timeout(self.settings.grace_s):
                    await reader
        code = proc.returncode
        text = tail.decode(errors="replace")
        if stopped_for is not None:
            return stopped_for, code, text
        if code == 0:
            return RunOutcome.SUCCEEDED, code, text
        if code == EXIT_STALE_FENCE:
            return RunOutcome.FENCED, code, text
        return RunOutcome.FAILED, code, text

    async def _watch(self, job: Job, waiter: asyncio.Task[int], lease: LeaderLease,
                     stop: asyncio.Event) -> RunOutcome | None:
        """Until the command exits by itself (None), or there is a reason to stop it:
        the lease lost (fenced), its timeout passed (timed_out), or the worker shut down
        and the shutdown budget ran out (abandoned)."""
        now = self.clock.monotonic()
        deadline = None if job.timeout_s is None else now + job.timeout_s
        lost = asyncio.ensure_future(lease.lost.wait())
        stopping: asyncio.Future[Any] | None = asyncio.ensure_future(stop.wait())
        shutdown_by: float | None = None
        try:
            while True:
                limits = [t for t in (deadline, shutdown_by) if t is not None]
                timeout = None if not limits else max(0.0, min(limits) - self.clock.monotonic())
                waits: set[asyncio.Future[Any]] = {waiter, lost}
                if stopping is not None:
                    waits.add(stopping)
                done, _ = await asyncio.wait(waits, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                if waiter in done:
                    return None
                if lost in done:
                    return RunOutcome.FENCED
                if stopping is not None and stopping in done:
                    # Shutting down: the job may finish within the budget, then it stops.
                    shutdown_by = self.clock.monotonic() + self.settings.shutdown_s
                    stopping = None
                    continue
                if shutdown_by is not None and self.clock.monotonic() >= shutdown_by:
                    return RunOutcome.ABANDONED
                return RunOutcome.TIMED_OUT
        finally:
            lost.cancel()
            if stopping is not None:
                stopping.cancel()

    async def _stop_group(self, proc: asyncio.subprocess.Process, waiter: asyncio.Task[int],
                          grace_s: float) -> None:
        """SIGTERM to the job's process group, SIGKILL after the grace period."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await asyncio.shield(waiter)
                return

    async def _wind_down(self, tasks: list[asyncio.Task[None]], lease: LeaderLease) -> None:
        """Runs end on their own (finished, fenced or out of shutdown budget)."""
        budget = self.settings.shutdown_s + 2 * self.settings.grace_s + 5
        _, pending = await asyncio.wait(tasks, timeout=budget)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _ended(running: dict[str, asyncio.Task[None]], name: str, wake: asyncio.Event,
           metrics: Metrics) -> Callable[[asyncio.Task[None]], None]:
    def callback(task: asyncio.Task[None]) -> None:
        running.pop(name, None)
        wake.set()
        # The slot's run records its own outcome; anything it raised is a bug: read it
        # here, so it is logged and counted rather than lost with the task.
        if not task.cancelled() and (exc := task.exception()) is not None:
            metrics.task_crashed("jobs")
            event(logging.ERROR, "job.run_crashed", "a job run failed unexpectedly", job=name,
                  error=repr(exc))
    return callback


async def _read_tail(proc: asyncio.subprocess.Process, tail: bytearray) -> None:
    assert proc.stdout is not None
    while chunk := await proc.stdout.read(65536):
        kept = keep_tail(bytes(tail), chunk)
        tail[:] = kept


async def _first(*events: asyncio.Event, timeout: float) -> None:
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
