"""What every runtime part of one worker shares, built once by the worker
(``streamlease.app``) and handed down: the reconciler, the holdings, each supervisor and
its pump take a ``Context`` plus what is theirs (their settings, their tenure), never a
dozen positional parameters.

A ``Context`` holds no state of its own and starts no task: the task scope a part runs
in is the part's (a supervisor's tenure, the holdings' supervisors), so that whoever owns
the scope reads its exceptions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from streamlease.clock import Clock
from streamlease.health import HealthState
from streamlease.metrics import Metrics
from streamlease.store.protocols import LeaseStore, Sink


@dataclass(frozen=True)
class Context:
    """One worker's shared parts: who it is, its clock, its metrics, the stream leases,
    the sink, its health, and the random source its jitter draws from (seeded in tests)."""

    owner: str
    clock: Clock
    metrics: Metrics
    leases: LeaseStore
    sink: Sink
    health: HealthState
    rng: random.Random = field(default_factory=random.Random)
