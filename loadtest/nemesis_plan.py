"""The nemesis's fault schedules, as plain data (pure: no process, no clock, no I/O).

A schedule is a list of ``Fault``s, each a kind from ``KINDS`` at a time (seconds after the
fleet is up), with how long it lasts (``hold``), how hard (``value``) and whom it hits
(``target``: ``leader``, ``any`` worker holding streams, or empty where the fault has no
victim). ``draw`` makes one from a seed, so a schedule is known by its seed alone;
``encode``/``decode`` turn it into the one-line text that ``make nemesis SCHEDULE='...'``
replays; ``shrink`` reduces a failing schedule to the fewest faults that still fail.

The text of one fault is ``kind@at[+hold][=value][/target]``; faults are joined by ``;``.
For example ``pause@12.5+3.4/leader;throttle@14.0+5.0=0.4;kill9@20.1/any``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

#: Every kind, grouped by what it disturbs. ``hold`` is how long the fault lasts; ``value``
#: its strength, in the unit the kind's comment names.
PROCESS_KINDS = (
    "kill9",         # kill -9 a worker holding streams (a replacement starts if too few)
    "sigterm",       # SIGTERM a worker: it releases and exits (a replacement likewise)
    "pause",         # SIGSTOP a worker past the member lease, SIGCONT after hold
    "leader_kill9",  # kill -9 the fleet leader
    "leader_pause",  # SIGSTOP the fleet leader past its lease, SIGCONT after hold
    "scale_out",     # one more worker
    "scale_in",      # SIGTERM the newest worker (never below the floor)
    "clock_skew",    # one more worker whose wall clock is value seconds off (libfaketime)
)
STORE_KINDS = (
    "store_cut",     # one worker's requests to the store go unanswered for hold
    "throttle",      # the store throttles a share (value) of all requests for hold
    "latency",       # every request held value ms for hold
    "index_lag",     # index reads value ms behind the table for hold
    "stale_reads",   # eventually consistent reads up to value ms stale for hold
    "feed_trimmed",  # change-feed reads answered "trimmed" for hold
    "feed_down",     # the change feed unavailable for hold
    "sink_outage",   # writes to the events table (the sink) refused for hold
)
OPERATOR_KINDS = (
    "flip",          # a stream STOPPED, then STARTED again after hold
    "url_change",    # a stream's ws_url changed (same feed, another query)
    "hand_written",  # a new stream written by hand: Pk, desired_state and ws_url only
    "ctl_release",   # `ctl release` of a held stream: fence + 1
)
UPSTREAM_KINDS = (
    "upstream_drop",   # the upstream drops every connection
    "upstream_stall",  # the upstream sends nothing for hold
    "malformed",       # the upstream sends hostile frames
)
KINDS = PROCESS_KINDS + STORE_KINDS + OPERATOR_KINDS + UPSTREAM_KINDS
#: Drawn only for a processor schedule (``draw(processor=True)``), whose fleet writes through
#: a Python processor instead of the events table.
PROCESSOR_KINDS = (
    "processor_raises",  # the user's processor raises on every batch for hold
)
ALL_KINDS = KINDS + PROCESSOR_KINDS
#: Processor faults a minute a processor schedule gets on top of its draw from ``KINDS``.
PROCESSOR_FAULTS_PER_MINUTE = 2.0
#: Kinds a processor schedule does not draw: they disturb the events table, which its fleet
#: does not write.
EVENTS_TABLE_KINDS = ("sink_outage",)
TARGETED = ("kill9", "sigterm", "pause", "store_cut")  # a worker chosen at run time
MIN_HOLD_S = 0.5
_TEXT = re.compile(r"^(?P<kind>[a-z_0-9]+)@(?P<at>\d+(?:\.\d+)?)"
                   r"(?:\+(?P<hold>\d+(?:\.\d+)?))?(?:=(?P<value>-?\d+(?:\.\d+)?))?"
                   r"(?:/(?P<target>[a-z0-9_-]+))?$")


@dataclass(frozen=True, order=True)
class Fault:
    at: float
    kind: str
    hold: float = 0.0
    value: float = 0.0
    target: str = ""

    @property
    def ends(self) -> float:
        return self.at + self.hold

    def text(self) -> str:
        out = f"{self.kind}@{self.at:g}"
        if self.hold:
            out += f"+{self.hold:g}"
        if self.value:
            out += f"={self.value:g}"
        if self.target:
            out += f"/{self.target}"
        return out


@dataclass(frozen=True)
class Timing:
    """The fleet timings a schedule is drawn for: faults that must outlast a lease do."""

    member_lease_s: float
    duration_s: float
    faults_per_minute: float = 8.0


def draw(seed: int, timing: Timing, kinds: Sequence[str] = KINDS,
         processor: bool = False) -> list[Fault]:
    """The schedule of ``seed``: about ``faults_per_minute`` faults a minute of
    ``duration_s``, kinds drawn evenly from ``kinds``, times uniform over the run (the
    last fault starts at least a lease before the end), overlapping as they fall. A
    ``processor`` schedule draws no ``EVENTS_TABLE_KINDS`` and gets
    ``PROCESSOR_FAULTS_PER_MINUTE`` processor faults besides."""
    unknown = set(kinds) - set(KINDS)
    if processor:
        kinds = [k for k in kinds if k not in EVENTS_TABLE_KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown fault kinds: {sorted(unknown)}" if unknown
                         else "no fault kinds to draw from")
    rng = random.Random(seed)
    minutes = timing.duration_s / 60
    latest = max(1.0, timing.duration_s - timing.member_lease_s)

    def drawn(choices: Sequence[str], per_minute: float) -> list[Fault]:
        return [_fault(rng, rng.choice(list(choices)), round(rng.uniform(1.0, latest), 1),
                       timing) for _ in range(max(1, round(per_minute * minutes)))]

    faults = drawn(kinds, timing.faults_per_minute)
    if processor:
        faults += drawn(PROCESSOR_KINDS, PROCESSOR_FAULTS_PER_MINUTE)
    return sorted(faults)


def is_processor_schedule(faults: Sequence[Fault]) -> bool:
    return any(f.kind in PROCESSOR_KINDS for f in faults)


def _fault(rng: random.Random, kind: str, at: float, timing: Timing) -> Fault:
    lease = timing.member_lease_s

    def hold(low: float, high: float) -> float:
        return round(rng.uniform(low, high), 1)

    if kind in ("pause", "leader_pause"):
        return Fault(at, kind, hold(lease + 0.5, lease + 3.0),
                     target="leader" if kind == "leader_pause" else "any")
    if kind in ("kill9", "sigterm"):
        return Fault(at, kind, target=rng.choice(("any", "any", "leader")))
    if kind == "leader_kill9":
        return Fault(at, kind, target="leader")
    if kind == "store_cut":
        return Fault(at, kind, hold(1.0, lease + 3.0), target="any")
    if kind == "clock_skew":
        return Fault(at, kind, value=rng.choice((-2.0, 2.0)))
    strengths: dict[str, tuple[tuple[float, float], tuple[float, float], int]] = {
        "throttle": ((1.0, 8.0), (0.2, 0.8), 2),
        "latency": ((1.0, 6.0), (20.0, 300.0), 0),
        "index_lag": ((5.0, 20.0), (0.0, 3000.0), 0),
        "stale_reads": ((5.0, 20.0), (100.0, 2000.0), 0),
    }
    if kind in strengths:
        (low, high), (weak, strong), digits = strengths[kind]
        return Fault(at, kind, hold(low, high), round(rng.uniform(weak, strong), digits))
    holds = {"feed_trimmed": (2.0, 10.0), "feed_down": (2.0, 10.0), "sink_outage": (1.0, 5.0),
             "flip": (1.0, 5.0), "upstream_stall": (1.0, 5.0), "processor_raises": (1.0, 5.0)}
    if kind in holds:
        return Fault(at, kind, hold(*holds[kind]))
    return Fault(at, kind)


def encode(faults: Sequence[Fault]) -> str:
    return ";".join(f.text() for f in sorted(faults))


def decode(text: str) -> list[Fault]:
    """The faults a ``SCHEDULE`` text names; ValueError naming the first bad one."""
    faults = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        found = _TEXT.match(part)
        if found is None:
            raise ValueError(f"not a fault (kind@at[+hold][=value][/target]): {part[:60]!r}")
        kind = found["kind"]
        if kind not in ALL_KINDS:
            raise ValueError(f"unknown fault kind {kind!r} (one of {', '.join(ALL_KINDS)})")
        target = found["target"] or ""
        if target not in ("", "any", "leader"):
            raise ValueError(f"{part}: the target is any or leader")
        faults.append(Fault(float(found["at"]), kind, float(found["hold"] or 0),
                            float(found["value"] or 0), target))
    if not faults:
        raise ValueError("the schedule names no fault")
    return sorted(faults)


def last_fault_ends(faults: Sequence[Fault]) -> float:
    """When the last fault is over (a fault without a hold is over when it happens)."""
    return max((f.ends for f in faults), default=0.0)


async def shrink(faults: Sequence[Fault], fails: Callable[[list[Fault]], Awaitable[bool]],
                 budget: int = 16) -> list[Fault]:
    """The smallest sub-schedule found that still ``fails`` (a run of it, awaited),
    trying at most ``budget`` runs: chunks of halving size removed while the rest still
    fails (delta debugging's complement step), down to single faults. ``faults`` itself is
    known to fail."""
    current = sorted(faults)
    size = max(1, len(current) // 2)
    tries = 0
    while tries < budget and current:
        removed = False
        start = 0
        while start < len(current) and tries < budget:
            candidate = current[:start] + current[start + size:]
            tries += 1
            if candidate and await fails(candidate):
                current, removed = candidate, True
            else:
                start += size
        if size == 1 and not removed:
            break
        size = max(1, size // 2)
    return current
