"""Capped exponential backoff with full jitter, and jittered regular intervals, from an
injected ``random.Random``."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Every regular renewal (a stream's lease, a member heartbeat, the leader lease) is spread
# this much, drawn afresh each time: holders that renewed together (a mass acquisition, a
# fleet started at once, every retry that ended with one outage) drift apart again
# instead of hitting the store in lock-step for as long as they live.
RENEW_JITTER = 0.1


@dataclass
class Backoff:
    """Delays ``uniform(base/2, min(cap, base * 2**n))`` for the n-th consecutive failure.

    Half the nominal delay is kept as a floor so a burst of failures cannot collapse to
    zero and spin; the jitter above it spreads a fleet that failed at the same instant.
    """

    base_s: float
    cap_s: float
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next_delay(self) -> float:
        nominal = min(self.cap_s, self.base_s * (2 ** min(self.failures, 30)))
        self.failures += 1
        return self.rng.uniform(nominal / 2, nominal)

    def reset(self) -> None:
        self.failures = 0


def jittered(interval_s: float, fraction: float, rng: random.Random) -> float:
    """``interval_s`` spread by +/- ``fraction`` (0.2 -> 80 % .. 120 %)."""
    return interval_s * rng.uniform(1 - fraction, 1 + fraction)


def next_renewal(sent_at: float, interval_s: float, rng: random.Random) -> float:
    """When to renew next after a renewal sent at ``sent_at``: ``interval_s`` later,
    spread by +/- ``RENEW_JITTER`` (a fresh draw each call)."""
    return sent_at + jittered(interval_s, RENEW_JITTER, rng)
