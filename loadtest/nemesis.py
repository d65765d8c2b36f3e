"""``make nemesis``: random fault schedules against a real fleet, each audited, a failure
shrunk to a replayable seed.

    make nemesis                                  # 3 schedules of a minute, seed 1
    make nemesis SEED=7 SCHEDULES=50 MINUTES=1    # fifty, from seed 7
    make nemesis SEED=7 SCHEDULE='pause@12.5+3.4/leader;throttle@14+5=0.4'   # replay one
    python -m loadtest.nemesis --help

Schedule ``i`` of a run with seed ``S`` is drawn from seed ``S * 1000 + i``
(``loadtest.nemesis_plan``). docs/performance.md ("The nemesis") describes the fleet each
schedule runs and what its audit checks, from the sink, the store and the job's own
record, never from the workers' logs: nothing lost, duplicated, out of order or altered,
no stale write accepted, every stream served again within ``member lease + 5 s`` of the
heal, a STOPPED stream released in a calm fleet, no job slot run twice, no worker exited
by itself, no process left running.

``--processor`` runs processor schedules: the fleet writes through the load test's
recording processor instead of the events table, and the draw adds ``processor_raises``
(docs/performance.md).

A failing schedule is shrunk (fewer faults, re-run, while it still fails) and printed as
the one line that replays it; its worker logs stay under ``.run/nemesis/``. The figures
go to ``loadtest/results/latest.json`` under ``nemesis`` (every other key kept). Stopped
by SIGTERM, SIGINT or SIGHUP, it stops every process it started and writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import json
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from loadtest.audit import audit_deliveries, from_records, json_files
from loadtest.common import STOP, dynamodb_args, stop_children, stopped_status, until_stopped
from loadtest.fleet import ROOT, Fleet, pct, recording_env
from loadtest.nemesis_faults import Hands
from loadtest.nemesis_plan import (
    ALL_KINDS,
    EVENTS_TABLE_KINDS,
    KINDS,
    Fault,
    Timing,
    decode,
    draw,
    encode,
    is_processor_schedule,
    shrink,
)
from loadtest.report import markdown, write_file
from streamlease.core.jobs import Job
from streamlease.core.schedule import Schedule
from streamlease.dev.procs import carrying

MARK = "STREAMLEASE_NEMESIS_MARK"
RESULTS = ROOT / "loadtest" / "results" / "latest.json"
LOGS = ROOT / ".run" / "nemesis"
LEASE_S = 2.0
RECOVERY_MARGIN_S = 5.0
#: The workers' settings: the load test's small profile (a 2 s member lease).
WORKER_ENV = {
    "STREAMLEASE_LEASE_SECONDS": str(LEASE_S),
    "STREAMLEASE_HEARTBEAT_SECONDS": "0.5",
    "STREAMLEASE_RECONCILE_SECONDS": "0.5",
    "STREAMLEASE_STREAM_CHECK_SECONDS": "2",
    "STREAMLEASE_SHUTDOWN_SECONDS": "10",
    "STREAMLEASE_LOG_FORMAT": "json",
    "STREAMLEASE_METRICS_ADDRESS": "127.0.0.1",
}
JOB = "nemesis-slots"
STOP_CHECKS = 2  # streams STOPPED at the end of a schedule, in a calm fleet


@dataclass(frozen=True)
class Settings:
    seed: int = 1
    schedules: int = 3
    minutes: float = 1.0
    streams: int = 12
    rate: float = 5.0
    workers: int = 3
    kinds: tuple[str, ...] = KINDS
    schedule: str | None = None  # replay this text instead of drawing
    processor: bool = False  # processor schedules (nemesis_plan.draw(processor=True))
    shrink: bool = True
    shrink_budget: int = 8
    results: Path | None = RESULTS  # None: write no figures
    add: bool = False  # add to the recorded figures instead of replacing them
    logs: Path = LOGS

    @property
    def timing(self) -> Timing:
        return Timing(member_lease_s=LEASE_S, duration_s=self.minutes * 60)

    @property
    def recovery_bound_s(self) -> float:
        return LEASE_S + RECOVERY_MARGIN_S


@dataclass
class Outcome:
    seed: int
    faults: list[Fault]
    violations: collections.Counter[str] = field(default_factory=collections.Counter)
    injected: collections.Counter[str] = field(default_factory=collections.Counter)
    skipped: collections.Counter[str] = field(default_factory=collections.Counter)
    recovery_s: list[float] = field(default_factory=list)
    orphans: int = 0
    notes: list[str] = field(default_factory=list)
    logs: str = ""
    processor: bool = False  # the fleet wrote through the recording processor

    @property
    def failed(self) -> bool:
        return bool(+self.violations)

    def replay(self) -> str:
        line = f"make nemesis SEED={self.seed} SCHEDULE='{encode(self.faults)}'"
        return f"{line} ARGS=--processor" if self.processor else line


# -- one schedule ---------------------------------------------------------------------------

async def run_schedule(seed: int, faults: list[Fault], settings: Settings) -> Outcome:
    """Run ``faults`` against a fresh fleet and audit what it left."""
    outcome = Outcome(seed, faults,
                      processor=settings.processor or is_processor_schedule(faults))
    marker = uuid.uuid4().hex
    # The fleet points this process's AWS variables at its own server: put them back after.
    saved = dict(os.environ)
    os.environ[MARK] = marker  # every child inherits it: how leftovers are found
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    recording = settings.logs / stamp / f"seed-{seed}-recording" if outcome.processor else None
    env = WORKER_ENV if recording is None else processor_env(recording)
    try:
        fleet = Fleet(f"seed-{seed}", streams=settings.streams, rate=settings.rate,
                      worker_env=env, store_args=[*dynamodb_args(), "--faults"],
                      log_root=settings.logs / stamp, seed=seed)
        outcome.logs = str(fleet.log_dir)
        async with fleet:
            hands = Hands(fleet, random.Random(seed), env, recording)
            await hands.send_store_faults()  # the control answers: the server has it
            await _run(fleet, hands, faults, settings, outcome)
            outcome.injected, outcome.skipped = hands.injected, hands.skipped
            outcome.violations.update(hands.violations)
            outcome.notes.extend(hands.notes)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    outcome.orphans = await _orphans(marker)
    if outcome.orphans:
        outcome.violations["orphans"] += outcome.orphans
    return outcome


def processor_env(recording: Path) -> dict[str, str]:
    """The workers' settings for a processor schedule: output through the recording
    processor into ``recording``."""
    recording.mkdir(parents=True, exist_ok=True)
    return {**WORKER_ENV, **recording_env(recording)}


async def _run(fleet: Fleet, hands: Hands, faults: list[Fault], settings: Settings,
               outcome: Outcome) -> None:
    for _ in range(settings.workers):
        hands.start_worker()
    if await fleet.wait_until(lambda: fleet.held_total() == len(fleet.ids), 60) is None:
        outcome.violations["never_settled"] += 1
        return
    slots = fleet.log_dir / "job-slots.txt"
    await _put_job(fleet, slots)
    started = fleet.now()
    tasks = [asyncio.ensure_future(_at(hands, fault, i, started))
             for i, fault in enumerate(faults)]
    await asyncio.sleep(settings.timing.duration_s)
    for i, result in enumerate(await asyncio.gather(*tasks, return_exceptions=True)):
        if isinstance(result, BaseException):
            outcome.notes.append(f"fault {faults[i].text()} failed: "
                                 f"{type(result).__name__}: {result}")
            outcome.violations["fault_errors"] += 1
    await hands.heal()
    await _recovery(fleet, settings, outcome)
    for sid in random.Random(outcome.seed).sample(list(fleet.ids), STOP_CHECKS):
        if not await hands.stopped_released(sid):
            outcome.violations["stopped_not_released"] += 1
            outcome.notes.append(f"{sid} STOPPED after the heal and not released in time")
    await fleet.stop_all(wait_s=20)
    if hands.recording is None:
        audit = await fleet.audit()
        names: tuple[str, ...] = ("lost", "duplicated", "out_of_order", "stale_accepted",
                                  "fleet_caused_gaps")
    else:
        audit = await _processor_audit(fleet, hands.recording)
        names = ("lost", "dup_outside_takeover", "out_of_order", "unreadable")
    for name in names:
        if audit[name]:
            outcome.violations[name] += audit[name]
    if fleet.exits:  # a worker that exited by itself, not by the nemesis's hand
        outcome.violations["worker_exits"] += len(fleet.exits)
        outcome.notes.extend(f"{e['worker']} exited by itself at {e['at']}s (exit "
                             f"{e['exit_code']}); see {e['log']}" for e in fleet.exits)
    twice = _slots_run_twice(slots)
    if twice:
        outcome.violations["job_slot_twice"] += len(twice)
        outcome.notes.append(f"job slots run twice: {sorted(twice)[:5]}")


async def _processor_audit(fleet: Fleet, recording: Path) -> dict[str, int]:
    """The recording processor's files against the items' checkpoints: every seq up to
    the checkpoint there intact, in order within a tenure; a seq again only under another
    fence (at least once: the holder before a take-over wrote it, its checkpoint did not
    land). A line that is not a record counts as ``unreadable``."""
    assert fleet.store is not None
    checkpoints = {r.stream_id: r.last_seq or 0 for r in await fleet.store.list_streams()}
    records, unreadable = await asyncio.to_thread(json_files, recording)
    return {**audit_deliveries(checkpoints, from_records(records)), "unreadable": unreadable}


async def _at(hands: Hands, fault: Fault, index: int, started: float) -> None:
    await asyncio.sleep(max(0.0, started + fault.at - hands.fleet.now()))
    await hands.inject(fault, index)


async def _put_job(fleet: Fleet, slots: Path) -> None:
    """A singleton job every 2 s that appends its slot and fence to ``slots``."""
    assert fleet.stores is not None
    command = f'echo "$STREAMLEASE_SLOT $STREAMLEASE_FENCE" >> {slots}'
    await fleet.stores.jobs.put_job(Job(JOB, Schedule(every_ms=2000), command, timeout_s=30,
                                        updated_at_ms=int(time.time() * 1000)))


def _slots_run_twice(slots: Path) -> set[str]:
    if not slots.exists():
        return set()
    seen = collections.Counter(line.split()[0] for line in slots.read_text().splitlines()
                               if line.strip())
    return {slot for slot, runs in seen.items() if runs > 1}


async def _recovery(fleet: Fleet, settings: Settings, outcome: Outcome) -> None:
    """Seconds from the heal until each stream delivers again; over the bound: a
    violation. Waited for up to twice the bound, to measure how far over it went."""
    assert fleet.store is not None
    healed = fleet.now()
    before = {r.stream_id: r.last_seq or 0 for r in await fleet.store.list_streams()}
    pending = set(fleet.ids)
    limit = 2 * settings.recovery_bound_s
    while pending and fleet.now() - healed < limit:
        records = {r.stream_id: r for r in await fleet.store.list_streams()}
        for sid in list(pending):
            record = records.get(sid)
            if record is not None and (record.last_seq or 0) > before.get(sid, 0):
                outcome.recovery_s.append(round(fleet.now() - healed, 2))
                pending.discard(sid)
        await asyncio.sleep(0.1)  # polling the table, with a deadline
    late = [t for t in outcome.recovery_s if t > settings.recovery_bound_s]
    unserved = len(late) + len(pending)
    outcome.recovery_s.extend([round(limit, 2)] * len(pending))
    if unserved:
        outcome.violations["unserved_after_heal"] += unserved
        outcome.notes.append(f"not served again within {settings.recovery_bound_s:g} s of "
                             f"the heal: {sorted(pending)[:5]} (and {len(late)} late)")


async def _orphans(marker: str) -> int:
    """Processes of the schedule still running a few seconds after it ended (then
    killed, so they do not outlive the run)."""
    left = await asyncio.to_thread(_still_running, marker, 10.0)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
    return len(left)


def _still_running(marker: str, within: float) -> set[int]:
    deadline = time.monotonic() + within
    while (left := carrying(MARK, marker)) and time.monotonic() < deadline:
        time.sleep(0.1)  # the last children exiting, with a deadline
    return left


# -- many schedules --------------------------------------------------------------------------

def schedule_for(settings: Settings, index: int) -> tuple[int, list[Fault]]:
    """Schedule ``index`` of the run: its seed, and its faults (drawn, or replayed)."""
    if settings.schedule is not None:
        return settings.seed, decode(settings.schedule)
    seed = settings.seed * 1000 + index
    return seed, draw(seed, settings.timing, settings.kinds, settings.processor)


async def run_all(settings: Settings) -> list[Outcome]:
    outcomes = []
    count = 1 if settings.schedule is not None else settings.schedules
    for index in range(count):
        seed, faults = schedule_for(settings, index)
        print(f"== schedule {index + 1}/{count} seed {seed}: {len(faults)} faults",
              flush=True)
        outcome = await run_schedule(seed, faults, settings)
        _print(outcome)
        if outcome.failed and settings.shrink and len(faults) > 1:
            outcome = await shrunk(outcome, settings)
        outcomes.append(outcome)
    return outcomes


async def shrunk(failing: Outcome, settings: Settings) -> Outcome:
    """The fewest faults of ``failing`` found to fail again (``nemesis_plan.shrink``, each
    try a fresh fleet), with that run's outcome."""
    smallest = failing

    # A processor schedule stays one when its last processor fault is shrunk away.
    settings = replace(settings, processor=failing.processor)

    async def fails(candidate: list[Fault]) -> bool:
        nonlocal smallest
        print(f"   shrinking: {len(candidate)} faults", flush=True)
        again = await run_schedule(failing.seed, candidate, settings)
        if again.failed:
            smallest = again
        return again.failed

    await shrink(failing.faults, fails, settings.shrink_budget)
    print(f"   shrunk to {len(smallest.faults)} faults: {smallest.replay()}", flush=True)
    return smallest


def _print(outcome: Outcome) -> None:
    verdict = "ok" if not outcome.failed else f"FAILED {dict(+outcome.violations)}"
    p99 = pct(outcome.recovery_s, 99)
    print(f"   {verdict}; faults {dict(outcome.injected)}; skipped {dict(outcome.skipped)}; "
          f"recovery p99 {p99} s; logs {outcome.logs}", flush=True)
    for note in outcome.notes[:10]:
        print(f"   - {note}", flush=True)
    if outcome.failed:
        print(f"   replay: {outcome.replay()}", flush=True)


def figures(outcomes: Sequence[Outcome], settings: Settings) -> dict[str, Any]:
    """The ``nemesis`` section of the results."""
    injected: collections.Counter[str] = collections.Counter()
    skipped: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    for o in outcomes:
        injected.update(o.injected)
        skipped.update(o.skipped)
        kinds.update(+o.violations)
    recovery = list(itertools.chain.from_iterable(o.recovery_s for o in outcomes))
    return {
        "schedules": len(outcomes),
        "seeds": sorted({o.seed // 1000 for o in outcomes}),
        "minutes_each": settings.minutes,
        "violations": sum(o.failed for o in outcomes),
        "violations_by_kind": dict(sorted(kinds.items())),
        "faults_by_kind": {k: injected.get(k, 0) for k in ALL_KINDS},
        "fewest_faults_of_a_kind": min(injected.get(k, 0) for k in ALL_KINDS),
        "faults_skipped_by_kind": {k: skipped[k] for k in ALL_KINDS if skipped[k]},
        "recovery_p99_s": pct(recovery, 99),
        "recovery_max_s": max(recovery, default=None),
        "recovery_bound_s": settings.recovery_bound_s,
        "orphans": sum(o.orphans for o in outcomes),
        "failures": [{"seed": o.seed, "replay": o.replay(), "violations": dict(+o.violations),
                      "logs": o.logs, "notes": o.notes[:10]} for o in outcomes if o.failed],
    }


def merge_results(section: dict[str, Any], path: Path, add: bool = False) -> None:
    """Put ``section`` under ``nemesis`` in the results file (``add``: added to the
    figures already there, as a run over more seeds), every other key kept, and name it as
    a scenario so that a later ``make loadtest`` keeps it too; ``latest.md`` beside it is
    written again from the whole."""
    result: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    previous = result.get("nemesis", {})
    if add and previous:
        section = accumulate(previous, section)
    result["nemesis"] = section
    result.setdefault("scenarios", {})["nemesis"] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "ok": True,
        "keys": ["nemesis"]}
    write_file(path, json.dumps(result, indent=2))
    write_file(path.with_name("latest.md"), markdown(result))


def accumulate(previous: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A run added to the figures already recorded (other seeds): counts summed, the
    recovery p99 the worse of the two (a p99 of p99s, which only over-states)."""
    out = dict(new)
    for key in ("schedules", "violations", "orphans"):
        out[key] = previous.get(key, 0) + new[key]
    out["seeds"] = sorted(set(previous.get("seeds", [])) | set(new["seeds"]))
    for key in ("faults_by_kind", "violations_by_kind", "faults_skipped_by_kind"):
        merged = collections.Counter(previous.get(key, {}))
        merged.update(new[key])
        out[key] = dict(sorted(merged.items()))
    out["fewest_faults_of_a_kind"] = min(out["faults_by_kind"].get(k, 0) for k in ALL_KINDS)
    for key in ("recovery_p99_s", "recovery_max_s"):
        out[key] = max(filter(None, (previous.get(key), new[key])), default=None)
    out["failures"] = previous.get("failures", []) + new["failures"]
    return out


# -- the command -------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="make nemesis", description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1, help="the run's seed (default 1)")
    parser.add_argument("--schedules", type=int, default=3, help="schedules (default 3)")
    parser.add_argument("--minutes", type=float, default=1.0,
                        help="minutes each schedule's faults run (default 1)")
    parser.add_argument("--schedule", help="replay this schedule (the line a failure prints)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated fault kinds to draw from (default: all)")
    parser.add_argument("--processor", action="store_true",
                        help="processor schedules: the fleet writes through the load test's "
                             "recording processor (at least once, audited from its files), "
                             "and each schedule gets processor_raises faults besides")
    parser.add_argument("--no-shrink", action="store_true", help="report a failure as found")
    parser.add_argument("--shrink-budget", type=int, default=8,
                        help="re-runs a shrink may take (default 8)")
    parser.add_argument("--add", action="store_true",
                        help="add this run's figures to those already in latest.json (a "
                             "run over more seeds) instead of replacing them")
    parser.add_argument("--no-results", action="store_true",
                        help="write no figures to loadtest/results/latest.json")
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"--kinds: unknown {unknown}" if unknown else "--kinds: none")
    if args.processor and set(kinds) <= set(EVENTS_TABLE_KINDS):
        raise ValueError(f"--kinds: a processor schedule draws none of {', '.join(kinds)}")
    if not 1 <= args.schedules <= 10_000 or not 0.1 <= args.minutes <= 60:
        raise ValueError("--schedules 1-10000 and --minutes 0.1-60")
    if args.schedule is not None:
        decode(args.schedule)  # a bad text is refused before anything starts
    return Settings(seed=args.seed, schedules=args.schedules, minutes=args.minutes,
                    kinds=kinds, schedule=args.schedule, processor=args.processor,
                    shrink=not args.no_shrink,
                    shrink_budget=args.shrink_budget, add=args.add,
                    results=None if args.no_results else RESULTS)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    STOP.install()  # SIGTERM, SIGINT, SIGHUP: stop every child in order, write nothing
    import uvloop

    try:
        outcomes = uvloop.run(until_stopped(run_all(settings)))
    except asyncio.CancelledError:
        if not STOP.requested:
            raise
        return stopped_status("make nemesis")
    finally:
        stop_children()
    if STOP.requested:
        return stopped_status("make nemesis")
    section = figures(outcomes, settings)
    print(json.dumps({k: v for k, v in section.items() if k != "failures"}, indent=2))
    if settings.results is not None and settings.schedule is None:
        merge_results(section, settings.results, settings.add)
    return 1 if section["violations"] or section["orphans"] else 0


if __name__ == "__main__":
    sys.exit(main())
