"""The ``jobs`` scenario: a singleton job through a pause, a kill -9 and a rolling restart.

Three workers at the profile's timings (no streams: the figures are the leader's). A job
every 2 s runs ``JOB_SCRIPT``: it sleeps ``JOB_DELAY_S`` (so a run is "in the middle"
for a while), then writes one item for its slot into a side table with
``streamlease job write``, the write the leader lease's fence guards. The side table's
key is the slot *and* a per-execution id, so a second write for a slot is a second item,
never an overwrite that would hide it. After ``STEADY_BEFORE_S``: the leader paused in the
middle of a run (``_pause_leader``: its job's write must be refused while it is stopped),
kill -9 of the leader in the middle of a run (its orphaned job writes when its sleep ends:
accepted only if no new leader has the lease yet), a rolling SIGTERM restart, and
``STEADY_AFTER_S``; then the audit reads every run record and every side-table item.

The audit (``audit_jobs``, pure): ``double_runs`` counts slots with more than one item
in the side table plus slots with more than one run record (impossible by the records'
key; counted anyway). ``stale_accepted`` counts, once each, the items that a stale
leader's write put there, found two ways:

* an item whose fence is not the fence of the run record that claimed its slot (or
  whose slot has no run record): a write some other leader's tenure let through;
* an item written after its fence was superseded. A job writes its own run's fence,
  so a paused leader's late write would match its run record: ``SideWatch`` catches it
  instead. It reads the leader lease's fence, then scans the side table, over and over;
  an item missing from one scan was written after that scan began, so if its fence is
  below the fence read before that scan, a newer leader held the lease when the item
  was accepted. One-sided: it never flags a legitimate write, and it misses a stale
  write only in the moment between a takeover and the next fence read.

``start_delay_p99_s`` is over the runs of steady slots only: a slot due during a fault,
or within ``SETTLE_S`` after it ends, is not steady state (nor is one due within
``SETTLE_S`` of the job's creation, or after the final stop began).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aioboto3

from loadtest.common import log_records, timing_env
from loadtest.fleet import Context, Fleet, LeaderWatch, by_label, leaders_now, metric_sum, pct
from streamlease.core.jobs import Job, JobRun, RunOutcome
from streamlease.core.schedule import Schedule, slot_ms, slot_name
from streamlease.leadership import FLEET_LEASE
from streamlease.store.protocols import Stores

JOB = "loadtest-every-2s"
EVERY_MS = 2000
JOB_DELAY_S = 0.5
WORKERS = 3
STEADY_BEFORE_S = 30.0
STEADY_AFTER_S = 20.0
SETTLE_S = 4.0  # slots due this long after a fault ends are not steady state
LEADER_TIMEOUT_S = 30.0
SIDE_WATCH_S = 0.5
RUNS_READ = 10_000

JOB_SCRIPT = """#!/bin/sh
sleep {delay}
exec {python} -m streamlease job write --table {table} --item "$(printf \\
  '{{"Pk":{{"S":"%s"}},"W":{{"S":"%s"}},"fence":{{"N":"%s"}}}}' \\
  "$STREAMLEASE_SLOT" "$STREAMLEASE_FENCE-$$-$(date +%s%N)" "$STREAMLEASE_FENCE")"
"""


@dataclass(frozen=True)
class SideItem:
    """One accepted ``job write``: its slot (ISO 8601 UTC), the fence it carried, and
    the id of the execution that wrote it (the side table's sort key)."""

    slot: str
    fence: int
    writer: str = ""


@dataclass
class Disturbance:
    """A fault, as wall-clock milliseconds (``end_ms`` None: it never ended)."""

    kind: str
    start_ms: int
    end_ms: int | None = None

    def covers(self, slot: int, settle_ms: int) -> bool:
        end = float("inf") if self.end_ms is None else self.end_ms + settle_ms
        return self.start_ms <= slot <= end


# -- the audit (pure) -----------------------------------------------------------------


def audit_jobs(runs: Iterable[JobRun], items: Iterable[SideItem],
               disturbances: Iterable[Disturbance], every_ms: int = EVERY_MS,
               settle_ms: int = int(SETTLE_S * 1000),
               written_superseded: Iterable[SideItem] = ()) -> dict[str, Any]:
    """The correctness figures and the start delays from the run records, the side
    table and what ``SideWatch`` saw written after its fence was superseded (see the
    module docstring)."""
    runs = list(runs)
    items = list(items)
    disturbances = list(disturbances)
    late = list(written_superseded)
    runs_per_slot = collections.Counter(r.slot for r in runs)
    items_per_slot = collections.Counter(i.slot for i in items)
    by_slot = {r.slot: r for r in runs}
    twice_written = sorted(s for s, n in items_per_slot.items() if n > 1)
    twice_claimed = sorted(s for s, n in runs_per_slot.items() if n > 1)
    mismatched = [i for i in items if i.slot not in by_slot or by_slot[i.slot].fence != i.fence]
    stale = list({(i.slot, i.writer): i for i in [*mismatched, *late]}.values())
    without_run = sorted({i.slot for i in items if i.slot not in by_slot})
    succeeded_without_item = sorted(r.slot for r in runs if r.outcome is RunOutcome.SUCCEEDED
                                    and r.slot not in items_per_slot)
    written_not_succeeded = sorted(r.slot for r in runs if r.slot in items_per_slot
                                   and r.outcome is not RunOutcome.SUCCEEDED)

    claimed = {slot_ms(r.slot) for r in runs}
    skipped = [s for s in range(min(claimed), max(claimed), every_ms) if s not in claimed] \
        if claimed else []

    def steady(slot: int) -> bool:
        return not any(d.covers(slot, settle_ms) for d in disturbances)

    delays_all = [(r.started_at_ms - slot_ms(r.slot)) / 1000 for r in runs]
    delays = [(r.started_at_ms - slot_ms(r.slot)) / 1000 for r in runs
              if steady(slot_ms(r.slot))]
    outcomes = collections.Counter(r.outcome.value if r.outcome else "running" for r in runs)
    return {
        "double_runs": len(twice_written) + len(twice_claimed),
        "stale_accepted": len(stale),
        "stale_fence_mismatch": len(mismatched),
        "stale_written_after_superseded": len(late),
        "start_delay_p99_s": pct(delays, 99),
        "start_delay_p50_s": pct(delays, 50),
        "start_delay_max_s": round(max(delays), 3) if delays else None,
        "steady_slots": len(delays),
        "start_delay_p99_all_slots_s": pct(delays_all, 99),
        "runs": len(runs),
        "side_items": len(items),
        "outcomes": dict(sorted(outcomes.items())),
        "slots_written_twice": twice_written,
        "slots_claimed_twice": twice_claimed,
        "stale_items": [{"slot": i.slot, "fence": i.fence,
                         "run_fence": by_slot[i.slot].fence if i.slot in by_slot else None}
                        for i in stale[:20]],
        "items_without_run": without_run,
        "succeeded_without_item": succeeded_without_item,
        "written_by_runs_not_succeeded": written_not_succeeded,
        "skipped_slots": len(skipped),
        "skipped": [slot_name(s) for s in skipped[:20]],
        "skipped_in_steady_state": sum(1 for s in skipped if steady(s)),
        "fences": sorted({r.fence for r in runs}),
    }


# -- watching the fleet ---------------------------------------------------------------


def _processes() -> Iterator[tuple[int, list[str]]]:
    """Every process: its pid and the fields of its ``stat`` after the command name."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 3:
                yield int(entry.name), fields


def job_group(worker_pid: int) -> int | None:
    """The process group of the job a worker runs (its child, in a session of its own)."""
    for pid, fields in _processes():
        if int(fields[1]) == worker_pid:
            with contextlib.suppress(OSError):
                return os.getpgid(pid)
    return None


def group_alive(group: int) -> bool:
    """Whether any process of this group still runs (a zombie waiting for its stopped
    parent does not)."""
    return any(int(fields[3]) == group and fields[0] != "Z" for _, fields in _processes())


def finished_event(log: Path, slot: str) -> dict[str, Any] | None:
    """The worker's own ``job.finished`` line for ``slot`` (outcome, exit code)."""
    return next((r for r in log_records(log, '"job.finished"') if r.get("slot") == slot),
                None)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _signal_group(group: int | None, sig: signal.Signals) -> None:
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)


# -- the side table -------------------------------------------------------------------


def _client() -> Any:
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return aioboto3.Session().client("dynamodb", region_name=region)


async def create_side_table(name: str) -> None:
    async with _client() as client:
        await client.create_table(
            TableName=name, BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "Pk", "AttributeType": "S"},
                                  {"AttributeName": "W", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "Pk", "KeyType": "HASH"},
                       {"AttributeName": "W", "KeyType": "RANGE"}])
        waiter = client.get_waiter("table_exists")
        await waiter.wait(TableName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 60})


async def read_side_table(name: str) -> list[SideItem]:
    found: list[SideItem] = []
    async with _client() as client:
        async for page in client.get_paginator("scan").paginate(TableName=name,
                                                                  ConsistentRead=True):
            found += [SideItem(i["Pk"]["S"], int(i["fence"]["N"]), i["W"]["S"])
                      for i in page["Items"]]
    return found


@dataclass
class SideWatch:
    """Items written after their fence was superseded (see the module docstring):
    ``fence`` reads the leader lease's fence (None: no lease yet), ``items`` the side
    table."""

    fence: Callable[[], Awaitable[int | None]]
    items: Callable[[], Awaitable[list[SideItem]]]
    seen: set[tuple[str, str]] = field(default_factory=set)
    late: list[SideItem] = field(default_factory=list)
    scans: int = 0
    failures: int = 0
    _fence_before_last_scan: int | None = None

    @classmethod
    def of(cls, stores: Stores, table: str) -> SideWatch:
        async def fence() -> int | None:
            record = await stores.leader.read(FLEET_LEASE, timeout=5)
            return record.fence if record else None
        return cls(fence, lambda: read_side_table(table))

    async def step(self) -> None:
        fence = max(await self.fence() or 0, self._fence_before_last_scan or 0)
        items = await self.items()
        for item in items:
            key = (item.slot, item.writer)
            if key in self.seen:
                continue
            self.seen.add(key)
            # Missing from the last scan: written after it began, when the lease already
            # carried at least ``_fence_before_last_scan``.
            if self._fence_before_last_scan is not None and \
                    item.fence < self._fence_before_last_scan:
                self.late.append(item)
        self._fence_before_last_scan = fence
        self.scans += 1

    async def loop(self) -> None:
        while True:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a slow read: the next one covers the same items
                self.failures += 1
                print(f"  side watch: {type(exc).__name__}: {exc}", file=sys.stderr,
                      flush=True)
            await asyncio.sleep(SIDE_WATCH_S)


# -- the scenario ---------------------------------------------------------------------


@dataclass
class Run:
    """One scenario's state: its fleet, the job's records, the faults as wall time."""

    fleet: Fleet
    profile: dict[str, Any]
    watch: LeaderWatch
    disturbances: list[Disturbance]

    async def runs(self, last: int = RUNS_READ) -> list[JobRun]:
        assert self.fleet.stores is not None
        return await self.fleet.stores.jobs.runs(JOB, last)

    def note(self, text: str) -> None:
        print(f"  {self.fleet.now():7.1f}s  {text}", flush=True)


async def run_jobs(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    target = p["lease"] + p["reconcile"] + 0.5
    section: dict[str, Any] = {
        "workers": WORKERS, "every_s": EVERY_MS / 1000, "job_delay_s": JOB_DELAY_S,
        "lease_s": p["lease"], "reconcile_s": p["reconcile"],
        "steady_before_s": STEADY_BEFORE_S, "steady_after_s": STEADY_AFTER_S,
        "settle_s": SETTLE_S, "leader_failover_target_s": round(target, 3),
        "double_runs": None, "stale_accepted": None, "leader_failover_s": None,
        "start_delay_p99_s": None}
    error: str | None = None
    # No streams: the sampler has little to read, and the leader polls /metrics itself.
    async with ctx.fleet("jobs", streams=0, rate=1.0, worker_env=timing_env(p),
                         sample_s=1.0) as fleet:
        assert fleet.stores is not None
        side = f"{fleet.fleet_table}-side"
        await create_side_table(side)
        script = fleet.log_dir / "job.sh"
        script.write_text(JOB_SCRIPT.format(delay=JOB_DELAY_S, python=sys.executable,
                                            table=side))
        run = Run(fleet, p, LeaderWatch(fleet), [])
        watch = SideWatch.of(fleet.stores, side)
        watcher = asyncio.ensure_future(watch.loop())
        print(f"jobs: a job every {EVERY_MS / 1000:g} s on {WORKERS} workers, lease "
              f"{p['lease']} s, reconcile {p['reconcile']} s", flush=True)
        try:
            for _ in range(WORKERS):
                fleet.start_worker()
            first = await run.watch.wait(timeout=60.0)
            if first is None:
                error = "no worker became the leader within 60 s"
            else:
                run.note(f"leader {first[0]}")
                run.disturbances.append(Disturbance("job put", _wall_ms(), _wall_ms()))
                await fleet.stores.jobs.put_job(Job(JOB, Schedule(every_ms=EVERY_MS),
                                                    f"sh {script}", timeout_s=30,
                                                    updated_at_ms=_wall_ms()))
                await asyncio.sleep(STEADY_BEFORE_S)
                section["pause"] = await _pause_leader(run)
                await asyncio.sleep(SETTLE_S)
                kill = await _kill_leader(run)
                section["kill9"] = kill
                section["leader_failover_s"] = kill.get("failover_s")
                await asyncio.sleep(SETTLE_S)
                section["rolling_restart"] = await _rolling_restart(run)
                await asyncio.sleep(STEADY_AFTER_S)
            run.disturbances.append(Disturbance("stop", _wall_ms()))
            fleet.scrape_all()
            await fleet.stop_all()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        await watch.step()  # writes since its last scan (orphaned jobs end within seconds)
        runs = await run.runs()
        items = await read_side_table(side)
        section.update(audit_jobs(runs, items, run.disturbances,
                                  written_superseded=watch.late))
        section["side_watch"] = {"scans": watch.scans, "failed_reads": watch.failures,
                                 "every_s": SIDE_WATCH_S}
        _fill_in(section, runs, items)
        section["two_leaders_seen_at_once"] = run.watch.two_at_once
        section["disturbances"] = [{"kind": d.kind, "start_ms": d.start_ms,
                                    "end_ms": d.end_ms} for d in run.disturbances]
        section.update(_worker_figures(fleet))
        if first is not None and section["leader_failover_s"] is None:
            error = "no new leader after kill -9 of the leader"
    out: dict[str, Any] = {"jobs": section}
    if error is not None:
        out["error"] = error
    return out


def _fill_in(section: dict[str, Any], runs: list[JobRun], items: list[SideItem]) -> None:
    """The final outcome, and whether an item was written, of the slot in flight at the
    pause and at the kill -9."""
    outcomes = {r.slot: r.outcome.value if r.outcome else None for r in runs}
    written = collections.Counter(i.slot for i in items)
    for key in ("pause", "kill9"):
        fault = section.get(key)
        if isinstance(fault, dict) and fault.get("slot"):
            fault["slot_outcome"] = outcomes.get(fault["slot"])
            fault["slot_items"] = written.get(fault["slot"], 0)


async def _mid_run(run: Run, leader: str, timeout: float) -> tuple[JobRun, int] | None:
    """Wait until ``leader`` runs a slot whose command has started and not yet written:
    (run, its process group)."""
    worker = run.fleet.workers[leader]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        latest = await run.runs(1)
        if latest and latest[0].outcome is None and latest[0].runner == leader and \
                _wall_ms() - latest[0].started_at_ms < JOB_DELAY_S * 1000:
            group = await asyncio.to_thread(job_group, worker.popen.pid)
            if group is not None:
                return latest[0], group
        await asyncio.sleep(0.05)
    return None


async def _pause_leader(run: Run) -> dict[str, Any]:
    """SIGSTOP the leader (and its running job) until another has run two slots; then
    let the job's write go out while its leader is still stopped, then the leader."""
    fleet = run.fleet
    found = await run.watch.wait()
    if found is None:
        return {"error": "no leader to pause"}
    leader = found[0]
    mid = await _mid_run(run, leader, timeout=15.0)
    if mid is None:
        return {"error": f"{leader} was never seen early in a run", "worker": leader}
    paused, group = mid
    worker = fleet.workers[leader]
    _signal_group(group, signal.SIGSTOP)  # the job, before its write
    worker.pause()
    stopped = time.monotonic()
    fleet.fault("pause", leader)
    fault = Disturbance("pause", _wall_ms())
    run.disturbances.append(fault)
    out: dict[str, Any] = {"worker": leader, "slot": paused.slot, "fence": paused.fence}
    try:
        took = await run.watch.wait(exclude={leader}, since=stopped)
        out["new_leader"], out["new_leader_after_s"] = (took[0], round(took[1], 3)) \
            if took else (None, None)

        async def taken_over() -> bool:
            later = [r for r in await run.runs(20) if r.slot > paused.slot
                     and r.fence > paused.fence and r.outcome is RunOutcome.SUCCEEDED]
            return len(later) >= 2
        out["next_slots_run"] = await _poll(taken_over, LEADER_TIMEOUT_S)
        # The job first: its write goes out while its leader is stopped and deposed.
        _signal_group(group, signal.SIGCONT)

        async def job_gone() -> bool:
            return not await asyncio.to_thread(group_alive, group)
        out["job_exited_before_its_leader_resumed"] = await _poll(job_gone, 20.0)
    finally:
        _signal_group(group, signal.SIGCONT)
        worker.resume()
        fault.end_ms = _wall_ms()
    out["paused_s"] = round(time.monotonic() - stopped, 2)
    run.note(f"SIGCONT {leader} after {out['paused_s']} s (new leader "
             f"{out.get('new_leader')} after {out.get('new_leader_after_s')} s)")

    async def recorded() -> bool:
        return any(r.slot == paused.slot and r.outcome is not None for r in await run.runs(20)) \
            and await asyncio.to_thread(finished_event, worker.log, paused.slot) is not None
    await _poll(recorded, 20.0)
    seen = await asyncio.to_thread(finished_event, worker.log, paused.slot)
    if seen is not None:  # what the paused leader itself made of its run
        out["runner_saw"] = {"outcome": seen.get("outcome"), "exit_code": seen.get("exit_code")}
    return out


async def _kill_leader(run: Run) -> dict[str, Any]:
    """kill -9 of the leader early in a run; the time until another worker's /metrics
    says it leads."""
    fleet = run.fleet
    found = await run.watch.wait()
    if found is None:
        return {"error": "no leader to kill"}
    leader = found[0]
    mid = await _mid_run(run, leader, timeout=15.0)
    fault = Disturbance("kill9", _wall_ms())
    run.disturbances.append(fault)
    fleet.kill9(leader)
    killed = time.monotonic()
    took = await run.watch.wait(exclude={leader}, since=killed)
    fault.end_ms = _wall_ms()
    out: dict[str, Any] = {"worker": leader, "new_leader": took[0] if took else None,
                           "failover_s": round(took[1], 3) if took else None,
                           "slot": mid[0].slot if mid else None,
                           "fence": mid[0].fence if mid else None}
    run.note(f"kill -9 {leader}: new leader {out['new_leader']} after {out['failover_s']} s")
    fleet.start_worker()
    return out


async def _rolling_restart(run: Run) -> dict[str, Any]:
    """Every worker, one at a time: a new one, then SIGTERM of an old one. When the old
    one leads, the time from its SIGTERM until another worker leads."""
    fleet, p = run.fleet, run.profile
    fault = Disturbance("rolling restart", _wall_ms())
    run.disturbances.append(fault)
    handoffs: list[dict[str, Any]] = []
    for name in sorted(fleet.workers, key=lambda n: (len(n), n)):
        fleet.start_worker()
        await asyncio.sleep(p["reconcile"] * 2)
        if name not in fleet.workers:
            continue
        leading = name in await leaders_now(fleet)
        signalled = time.monotonic()
        stopping = asyncio.ensure_future(fleet.sigterm(name, wait_s=30))
        if leading:
            took = await run.watch.wait(exclude={name}, since=signalled)
            handoffs.append({"worker": name, "new_leader": took[0] if took else None,
                             "handoff_s": round(took[1], 3) if took else None})
            run.note(f"SIGTERM of the leader {name}: new leader "
                     f"{handoffs[-1]['new_leader']} after {handoffs[-1]['handoff_s']} s")
        await stopping
        await asyncio.sleep(p["gap"] / 2)
    fault.end_ms = _wall_ms()
    return {"sigterm_leader_handoffs": handoffs,
            "seconds": round((fault.end_ms - fault.start_ms) / 1000, 1)}


async def _poll(check: Callable[[], Awaitable[bool]], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.1)
    return False


def _worker_figures(fleet: Fleet) -> dict[str, Any]:
    """What the workers' own counters say (each as last scraped), and their logs."""
    everyone = fleet.everyone()
    return {
        "job_runs_by_metrics": by_label(everyone, "streamlease_job_runs_total", "outcome"),
        "slots_skipped_by_metrics": int(metric_sum(everyone,
                                                   "streamlease_job_slots_skipped_total")),
        "leader_changes": int(metric_sum(everyone, "streamlease_leader_changes_total")),
        "log_events": fleet.log_events(),
        "worker_exits": fleet.exits,
    }
