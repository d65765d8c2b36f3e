"""One keep-alive machine for every lease a worker keeps: a stream's lease, its own member
row, a leader lease. Pure: outcomes and monotonic times in, decisions out.

A lease is kept by renewing it before it runs out, and by stopping before anyone else may
take it over. The holder writes only before

    deadline = sent + ttl - safety margin

on its own monotonic clock, where ``sent`` is when the latest renewal proven to have applied
was *sent* (the server may have applied it at any instant before it answered). The deadline
only moves forward: a renewal sent before one that already extended it pulls nothing back.
It does not depend on any other machine's clock, so a holder that is paused, partitioned or
slow has stopped before anyone may take its lease.

Renewals are due an interval after the previous one was sent, spread +/-10 % afresh each
time (``core.backoff.next_renewal``). A renewal whose outcome is unknown (a timeout, a 5xx)
or throttled may still have applied, so the lease may still be held: it is retried sooner —
a quarter interval after an unknown outcome, half after throttling, doubling with each
failure in a row up to one interval — and never later than the deadline, which decides.
A refused renewal (the condition failed: the lease, or the member's epoch, moved on) is
final: nothing the holder learns later makes the lease its own again.

At the deadline the holder fences itself. What may follow is the one difference between the
leases (``recovers``): a member that proves a heartbeat again under the same epoch is alive
again — nobody fenced it meanwhile, or its epoch would have moved and the heartbeat been
refused; a stream's tenure and a leader's term end at their deadline.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from streamlease.core.backoff import RENEW_JITTER, jittered, next_renewal

# A renewal call is given at least this long, even when less is left before the deadline.
MIN_CALL_S = 0.05


class KeepOutcome(StrEnum):
    """What one renewal of a lease found. Every store answers in these four."""

    RENEWED = "renewed"
    REFUSED = "refused"  # the condition failed: someone else holds it, or the fence moved
    UNKNOWN = "unknown"  # timeout, 5xx, connection error: it may or may not have applied
    THROTTLED = "throttled"
    # The names a refusal had before the three leases shared this enum, kept for callers
    # that still say them: a stream's lease was "lost", a member "fenced". They are the
    # same member as REFUSED (``KeepOutcome.LOST is KeepOutcome.REFUSED``); new code says
    # REFUSED (mypy takes an alias for a member of its own when it narrows a type).
    LOST = "refused"
    FENCED = "refused"


def outcome_label(outcome: KeepOutcome, refused: str) -> str:
    """``outcome`` as a metric label value, a refusal named ``refused`` (each lease's
    counter names it in its own words)."""
    return refused if outcome is KeepOutcome.REFUSED else outcome.value


class KeepState(StrEnum):
    KEEPING = "keeping"  # may write until the deadline
    SELF_FENCED = "self_fenced"  # no renewal proven before the deadline: stopped writing
    REFUSED = "refused"  # a renewal was refused: the lease is gone for good


class KeepTimings(Protocol):
    """The three durations a keeper needs, in seconds (``LeaseTimings`` for a stream,
    ``MemberTimings`` for a member or a leader lease)."""

    @property
    def lease_s(self) -> float: ...

    @property
    def heartbeat_s(self) -> float: ...

    @property
    def safety_margin_s(self) -> float: ...


def deadline_after(sent_at: float, timings: KeepTimings) -> float:
    """Monotonic time after which a holder whose latest proven renewal (or acquisition) was
    sent at ``sent_at`` must not write."""
    return sent_at + timings.lease_s - timings.safety_margin_s


def retry_delay(failures: int, outcome: KeepOutcome, interval_s: float) -> float:
    """The delay before retrying after ``failures`` unknown or throttled renewals in a row
    (the last one ``outcome``): a quarter interval (half when throttled), doubling, at most
    one interval."""
    base = interval_s / (2 if outcome is KeepOutcome.THROTTLED else 4)
    return min(base * 2.0 ** min(max(failures, 1) - 1, 30), interval_s)


@dataclass
class Keeper:
    """One lease's keep-alive state: its deadline and what the renewals have shown.

    It is fed each renewal's outcome with the monotonic times it was sent and answered, and
    answers how long to wait before the next attempt; the caller does the I/O, asks
    ``may_write`` before every write, and calls ``check_deadline`` when it wakes.
    """

    timings: KeepTimings
    deadline: float
    recovers: bool = False  # a renewal proven after a self-fence makes it KEEPING again
    state: KeepState = KeepState.KEEPING
    failures: int = 0  # unknown or throttled renewals in a row

    @classmethod
    def sent(cls, sent_at: float, timings: KeepTimings, *, recovers: bool = False) -> Keeper:
        """A lease just acquired (or registered) by a call sent at ``sent_at``."""
        return cls(timings, deadline_after(sent_at, timings), recovers)

    @property
    def done(self) -> bool:
        """Nothing more to renew: refused, or self-fenced for good."""
        return self.state is KeepState.REFUSED or \
            (self.state is KeepState.SELF_FENCED and not self.recovers)

    def may_write(self, now: float) -> bool:
        return self.state is KeepState.KEEPING and now < self.deadline

    def check_deadline(self, now: float) -> bool:
        """Self-fence if the deadline has passed; True if it just did."""
        if self.state is KeepState.KEEPING and now >= self.deadline:
            self.state = KeepState.SELF_FENCED
            return True
        return False

    def first_in(self, rng: random.Random) -> float:
        """The delay until the first renewal after an acquisition that was just sent."""
        return jittered(self.timings.heartbeat_s, RENEW_JITTER, rng)

    def on_outcome(self, outcome: KeepOutcome, sent_at: float, now: float,
                   rng: random.Random) -> float:
        """Apply one renewal, sent at ``sent_at`` and answered at ``now``; the delay until
        the next attempt (0 once ``done``)."""
        if self.done:
            return 0.0
        if outcome is KeepOutcome.REFUSED:
            self.state = KeepState.REFUSED
            return 0.0
        if outcome is KeepOutcome.RENEWED:
            self.failures = 0
            self.deadline = max(self.deadline, deadline_after(sent_at, self.timings))
            if self.state is KeepState.SELF_FENCED:
                # Proven again: for a member, under the same epoch, so nobody fenced it.
                self.state = KeepState.KEEPING
            # An answer that came back after even the new deadline proves nothing in time.
            if self.check_deadline(now) and not self.recovers:
                return 0.0
            return max(0.0, next_renewal(sent_at, self.timings.heartbeat_s, rng) - now)
        self.failures += 1
        if self.check_deadline(now) and not self.recovers:
            return 0.0
        retry = retry_delay(self.failures, outcome, self.timings.heartbeat_s)
        if self.state is KeepState.KEEPING:
            # The deadline decides: an attempt is never scheduled after it.
            retry = min(retry, max(0.0, self.deadline - now))
        return retry

    def call_timeout(self, now: float, limit_s: float = math.inf) -> float:
        """How long a renewal sent at ``now`` may take: at most an interval (and
        ``limit_s``), and never past the deadline, after which its answer changes nothing
        (while self-fenced, a recovering keeper's renewal gets the whole interval)."""
        most = min(self.timings.heartbeat_s, limit_s)
        if self.state is KeepState.KEEPING:
            return max(MIN_CALL_S, min(most, self.deadline - now))
        return most
