"""Singleton jobs: what a job is, what a run records, and which slots a leader runs (pure).

Each slot runs at most once fleet-wide: the leader claims a slot with a conditional put
of its run record (job + slot), stamped with its fence, before it starts the command, and
a claimed slot is never run again — whoever claimed it, whatever happened to it.

Which due slots a leader runs:

* a slot that came due while this leader held the lease, or at most ``grace_ms`` before
  it took the lease (a hand-over gap), runs — late if need be. The runner's grace is at
  least a whole takeover (``takeover_grace_ms``: lease + 2 x heartbeat), so a slot that
  came due after the previous leader's last renewal is never skipped for the time the
  fleet needed to notice that leader was gone;
* a slot that came due earlier than that (while no leader existed) is skipped, unless
  the job has ``catch_up``: then every such slot since the job's last run runs once, late,
  oldest first (at most ``MAX_CATCH_UP`` of them);
* one run per job at a time: of the slots that came due while the previous run still
  went, only the latest runs (when it ends) and the others are skipped, so a job slower
  than its schedule does not fall further and further behind — unless it has
  ``catch_up``, which runs each of them in turn;
* slots already claimed are skipped whoever claimed them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from streamlease.core.schedule import Schedule, slot_name

MAX_CATCH_UP = 100
OUTPUT_TAIL_BYTES = 4096  # the end of a run's output kept in its record


class RunOutcome(StrEnum):
    SUCCEEDED = "succeeded"  # exit code 0
    FAILED = "failed"  # any other exit code, or the command could not start
    TIMED_OUT = "timed_out"  # stopped after its timeout
    FENCED = "fenced"  # stopped because its leader lost the lease (or its write was refused)
    ABANDONED = "abandoned"  # its leader went away before recording an outcome


@dataclass(frozen=True)
class Job:
    name: str
    schedule: Schedule
    command: str
    timeout_s: float | None = None
    catch_up: bool = False
    updated_at_ms: int = 0


MAX_TIMEOUT_S = 7 * 86400


@dataclass(frozen=True)
class UnreadableJob:
    """A job item that cannot be run as stored (edited by hand): never run, reported."""

    name: str
    problem: str


@dataclass(frozen=True)
class JobList:
    jobs: list[Job]
    unreadable: list[UnreadableJob]


@dataclass(frozen=True)
class JobRun:
    job: str
    slot: str  # the slot's scheduled time, ISO 8601 UTC
    fence: int  # the leader's fence when it claimed the slot
    runner: str  # the worker that claimed it
    started_at_ms: int
    finished_at_ms: int | None = None
    outcome: RunOutcome | None = None  # None: running (or its runner vanished)
    exit_code: int | None = None
    output: str = ""  # the tail of stdout and stderr


def takeover_grace_ms(lease_s: float, heartbeat_s: float, leader_still_s: float = 0.0) -> int:
    """The longest a leader change can take after a leader dies, from its last renewal to
    the moment its successor holds the lease: ``lease + 2 x heartbeat`` (leader lease
    timings; the member timings for the fleet leader). A slot due that long before a new
    leader took over may have come due after the old one stopped, so it still runs.

    Why it is enough: a candidate reads the lease every observation interval, at most half
    a heartbeat, jittered by up to 10 % (``LeaderLease.acquire``). It receives the dead
    leader's last renewal within one interval and a read, waits until a read sent a full
    lease later still shows it, and acquires after that read: at most a lease plus two
    intervals (1.1 heartbeats) plus three calls. The other 0.9 heartbeat covers the calls
    and the clock skew between the two leaders (slots are wall-clock times). A slot the old
    leader did run is not run again: it left a run record, and a claim is conditional.

    The fleet leader's lease is read every interval only by the successor its bulletin
    names; the other members read it once a lease until the leader's row has stood still
    for ``leader_still_s`` (``Membership.campaign_urgent``). Given that time, the grace
    covers a successor lost with the leader: the row's last heartbeat may come up to one
    heartbeat after the lease's last renewal, the row is seen standing still
    ``leader_still_s`` later, and then a lease of unchanged reads is waited out; a
    heartbeat more covers those reads, the calls and the clock skew: ``lease +
    leader_still_s + 3 x heartbeat``.
    """
    if leader_still_s:
        return math.ceil(1000 * (lease_s + leader_still_s + 3 * heartbeat_s))
    return math.ceil(1000 * (lease_s + 2 * heartbeat_s))


def due_slots(job: Job, now_ms: int, last_slot_ms: int | None, leader_since_ms: int,
              grace_ms: int) -> tuple[list[int], list[int]]:
    """(slots to run now, slots skipped), both in time order.

    ``last_slot_ms`` is the job's latest run record (any outcome); slots at or before it
    are never considered again. Without a run record, slots are counted from when this
    leader took the lease (minus the grace), or from the job's last change.
    """
    floor = leader_since_ms - grace_ms
    since = last_slot_ms if last_slot_ms is not None else max(floor, job.updated_at_ms) - 1
    slots = job.schedule.slots_between(since, now_ms, limit=MAX_CATCH_UP if job.catch_up
                                       else 10 * MAX_CATCH_UP)
    if job.catch_up:
        return slots, []
    if slots and slots[-1] >= floor:
        return slots[-1:], slots[:-1]
    return [], slots


def names(slots: list[int]) -> list[str]:
    return [slot_name(s) for s in slots]


def keep_tail(tail: bytes, chunk: bytes, limit: int = OUTPUT_TAIL_BYTES) -> bytes:
    """The last ``limit`` bytes of everything seen so far."""
    joined = tail + chunk
    return joined[-limit:] if len(joined) > limit else joined
