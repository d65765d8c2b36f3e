"""Reconcile planning: which orphaned streams to try to acquire this cycle."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from streamlease.core.lease import LeaseTimings, can_acquire
from streamlease.core.model import StreamRecord, error_text
from streamlease.core.upstream import BUILTIN_CATALOG, Catalog
from streamlease.core.urls import AllowList, url_problem

VALID_STATES = ("STARTED", "STOPPED")


def item_problem(record: StreamRecord, allowed_urls: AllowList,
                 catalog: Catalog = BUILTIN_CATALOG) -> str | None:
    """Why a STARTED-or-not item cannot be served as written, or None.

    This is the list of docs/contract.md: an unknown ``desired_state``, a missing ``ws_url``, or
    one outside the allow-list; and a ``profile`` that is not defined, or whose templates
    need an item attribute the item lacks (docs/profiles.md). The text goes to
    ``last_error`` and the log.
    """
    if record.bad_fields:
        return "wrong attribute type: " + ", ".join(record.bad_fields)
    if record.desired_state not in VALID_STATES:
        shown = "missing" if record.desired_state is None else repr(record.desired_state)[:64]
        return f"desired_state {shown} is not STARTED or STOPPED"
    if record.started:
        return url_problem(record.ws_url, allowed_urls) or \
            catalog.item_problem(record.attributes)
    return None


def bad_item_reason(problem: str) -> str:
    """The ``streamlease_bad_items_total`` label for an ``item_problem`` text."""
    if "desired_state" in problem:
        return "bad_state"
    if problem.startswith("profile"):
        return "bad_profile"
    return "bad_url"


def invisible_to_index(record: StreamRecord) -> bool:
    """Items the orphan query cannot see: no ``lease_expires_at_ms`` (written by hand) or
    a ``desired_state`` outside STARTED/STOPPED. The sweep handles these."""
    return record.lease_expires_at_ms is None or record.desired_state not in VALID_STATES


@dataclass(frozen=True)
class Plan:
    acquire: list[StreamRecord] = field(default_factory=list)
    unservable: list[tuple[StreamRecord, str]] = field(default_factory=list)
    servable: int = 0  # orphans that could be acquired, before any cap


@dataclass(frozen=True)
class Cycle:
    """What one reconcile cycle plans from: the orphan query's candidates, the streams
    this worker holds, its capacity, and what it may serve (``item_problem``; ``catalog``:
    the worker's upstream profiles, since a candidate read in full, as an offered stream
    is, names its ``profile``). ``rank`` puts some candidates before others (lower first;
    the caller's: orphans that have waited longest) before the cap cuts."""

    candidates: list[StreamRecord]
    held: set[str]
    max_streams: int
    per_cycle: int
    now_wall_ms: int
    timings: LeaseTimings
    allowed_urls: AllowList
    catalog: Catalog = BUILTIN_CATALOG
    rank: Callable[[StreamRecord], int] | None = None


def plan_cycle(cycle: Cycle, rng: random.Random) -> Plan:
    """Pick the streams to try this cycle.

    Candidates come from the orphan query and may be stale by the time we act; the
    conditional acquire is the real arbiter, this only avoids pointless calls. Shuffling
    (with ``rng``) spreads a fleet that wakes together over different streams, and the
    per-cycle cap keeps one worker from grabbing everything a dead peer left behind.
    """
    budget = min(max(0, cycle.max_streams - len(cycle.held)), cycle.per_cycle)
    acquirable: list[StreamRecord] = []
    unservable: list[tuple[StreamRecord, str]] = []
    for record in cycle.candidates:
        if record.stream_id in cycle.held:
            continue
        problem = item_problem(record, cycle.allowed_urls, cycle.catalog)
        if problem is not None:
            if record.last_error != error_text(problem):
                unservable.append((record, problem))
            continue
        if can_acquire(record, cycle.now_wall_ms, cycle.timings):
            acquirable.append(record)
    rng.shuffle(acquirable)
    if cycle.rank is not None:
        acquirable.sort(key=cycle.rank)  # stable: shuffled within each rank
    return Plan(acquire=acquirable[:budget], unservable=unservable, servable=len(acquirable))
