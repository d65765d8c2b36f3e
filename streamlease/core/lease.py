"""Lease rules as pure functions and the holder's per-stream state machine.

The DynamoDB store translates these rules into condition expressions
(``streamlease.store.codec``); the in-memory evaluation here is what the unit tests pin down.

Safety argument, in one place:

* A holder renews at ``sent`` (its monotonic clock) and stamps
  ``lease_expires_at_ms = wall_now + lease``.
* Another worker takes over only once ``lease_expires_at_ms < its_wall_now - skew_margin``.
  As long as the two wall clocks disagree by less than ``skew_margin``, that is at least
  ``lease`` seconds of real time after ``sent``.
* The holder stops writing at ``sent + lease - safety_margin`` on its own monotonic clock,
  which does not depend on any other machine, so it has stopped before anyone may take
  over — even across a pause (SIGSTOP, GC, a stalled VM), because the check runs after
  the pause, immediately before each write.
* If all of that fails (a skew beyond the margin), the fence still makes the sink refuse
  the stale holder's write atomically. Leases give liveness; fences give safety.

What this does not guarantee: liveness when clocks disagree by more than the skew
margin (takeovers come early and fence out the holder, or late and leave a gap in
service), and anything about writes that bypass the fenced sink.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from streamlease.core.keepalive import (
    Keeper,
    KeepOutcome,
    KeepState,
    deadline_after,
    outcome_label,
)
from streamlease.core.model import EventMark, StreamRecord, Tenure


@dataclass(frozen=True)
class LeaseTimings:
    """Lease durations in seconds. ``problems()`` lists every violated rule."""

    lease_s: float
    heartbeat_s: float
    skew_margin_s: float
    safety_margin_s: float

    def problems(self, lease_name: str = "STREAMLEASE_LEASE_SECONDS",
                 heartbeat_name: str = "STREAMLEASE_HEARTBEAT_SECONDS") -> list[str]:
        """Every rule these timings break, as ``NAME: what is wrong`` strings (the lease
        and the heartbeat named as the variables they were read from)."""
        found: list[str] = []
        values = {
            lease_name: self.lease_s,
            heartbeat_name: self.heartbeat_s,
            "STREAMLEASE_SKEW_MARGIN_SECONDS": self.skew_margin_s,
            "STREAMLEASE_SAFETY_MARGIN_SECONDS": self.safety_margin_s,
        }
        positive = True
        for name, value in values.items():
            if not math.isfinite(value) or value <= 0:
                found.append(f"{name}: must be a positive number of seconds, got {value!r}")
                positive = False
        if not positive:
            return found
        found.extend(heartbeat_problems(self.lease_s, self.heartbeat_s, heartbeat_name))
        if self.skew_margin_s >= self.lease_s:
            found.append(
                f"STREAMLEASE_SKEW_MARGIN_SECONDS: must be smaller than the lease "
                f"({self.lease_s:g}), got {self.skew_margin_s:g}"
            )
        if self.safety_margin_s >= self.lease_s / 3:
            found.append(
                f"STREAMLEASE_SAFETY_MARGIN_SECONDS: must be under a third of the lease "
                f"({self.lease_s / 3:g}) so a holder gets two renewals before its deadline, "
                f"got {self.safety_margin_s:g}"
            )
        return found

    @property
    def lease_ms(self) -> int:
        return round(self.lease_s * 1000)


def heartbeat_problems(lease_s: float, heartbeat_s: float, heartbeat_name: str) -> list[str]:
    """A heartbeat must be under a third of its lease: two renewals before the deadline."""
    if heartbeat_s < lease_s / 3:
        return []
    return [f"{heartbeat_name}: must be under a third of the lease "
            f"({lease_s:g}/3 = {lease_s / 3:g}), got {heartbeat_s:g}"]


# --- conditions, evaluated on a record (the store expresses the same in DynamoDB) ----


def expiry_for(now_wall_ms: int, timings: LeaseTimings) -> int:
    """The ``lease_expires_at_ms`` a holder stamps when it acquires or renews at now."""
    return now_wall_ms + timings.lease_ms


def takeover_threshold_ms(now_wall_ms: int, timings: LeaseTimings) -> int:
    """A lease whose expiry is strictly below this may be taken over at ``now``."""
    return now_wall_ms - round(timings.skew_margin_s * 1000)


def can_acquire(record: StreamRecord | None, now_wall_ms: int, timings: LeaseTimings) -> bool:
    """Acquire rule: the item exists, is STARTED, and its lease is absent or expired.

    An item with no ``lease_expires_at_ms`` (written by hand) is free. A released lease
    (expiry 0) is free. An expired one is free only past the skew margin.
    """
    if record is None or not record.started:
        return False
    if record.lease_expires_at_ms is None:
        return True
    return record.lease_expires_at_ms < takeover_threshold_ms(now_wall_ms, timings)


def holds(record: StreamRecord | None, owner: str, fence: int) -> bool:
    """Renew, release and sink-write rule: the item names this owner *and* this fence.

    Checking the fence too is what stops a worker that restarted under the same id, or a
    holder fenced out by a force release, from acting on a tenure that is gone.
    """
    return record is not None and record.lease_owner == owner and record.fence == fence


def can_renew(record: StreamRecord | None, owner: str, fence: int) -> bool:
    """Renew rule: ``holds`` and not released (expiry 0 means free now, docs/contract.md)."""
    return holds(record, owner, fence) and record is not None and \
        record.lease_expires_at_ms != 0


def can_take_over(record: StreamRecord | None, dead_owner: str, fenced_epoch: int) -> bool:
    """Take-over rule: a STARTED stream still leased (expiry not 0) to ``dead_owner`` under
    an epoch older than ``fenced_epoch`` (the dead member's row epoch after it was fenced)
    passes straight to a survivor — fence + 1, the survivor's owner, expiry and epoch — in
    one conditional write, with no release between. It is an acquisition: the fence moves
    on, so nothing the dead incarnation still sends is accepted."""
    return (record is not None and record.started and record.lease_owner == dead_owner
            and record.fence is not None and record.lease_expires_at_ms is not None
            and record.lease_expires_at_ms != 0
            and (record.lease_epoch is None or record.lease_epoch < fenced_epoch))


def next_fence(record: StreamRecord) -> int:
    """Fence after an acquisition or a force release: +1, starting from 0."""
    return (record.fence or 0) + 1


def resume_point(tenure: Tenure, newest: EventMark | None) -> tuple[int, int] | None:
    """The (fence, last_seq) a fresh tenure must move to, or None if it is consistent.

    The item's checkpoint and fence are the truth unless someone rewrote the item by hand
    or restored it from a backup: then the sink already holds seqs above ``last_seq`` or
    batches written under a fence at or above this one. Resuming from there would write
    seqs twice (or collide with an existing events item forever), and an older-looking
    fence would follow a newer one in the sink. So the tenure moves to a fence above every
    fence in the sink and resumes after the newest seq it holds.
    """
    if newest is None:
        return None
    last = tenure.last_seq or 0
    if newest.last_seq <= last and newest.fence < tenure.fence:
        return None
    return max(tenure.fence, newest.fence + 1), max(last, newest.last_seq)


@dataclass(frozen=True)
class CleanRelease:
    """What a holder's clean release leaves on the item for the next holder: the fence it
    released under, the checkpoint its final flush wrote, and when (its wall clock)."""

    fence: int
    last_seq: int
    at_ms: int


# How old a clean release may be for the next holder to trust its checkpoint without
# reading the sink: a hand-off is taken within seconds; a stream STOPPED for longer, or an
# item restored from a backup, is read as before.
CLEAN_RELEASE_TRUST_MS = 60_000
# A mark stamped this far in the taker's future still counts as just now: the releaser's
# clock may run ahead (5 s, above the default 1 s STREAMLEASE_SKEW_MARGIN_SECONDS), but not
# by a minute (a mark that stays "fresh" for longer than its window). A mark further ahead
# costs the taker only its resume read.
CLEAN_RELEASE_AHEAD_MS = 5_000


def checkpoint_trusted(tenure: Tenure, mark: CleanRelease | None, now_ms: int) -> bool:
    """Whether a fresh tenure may resume after the item's ``last_seq`` without reading the
    sink's newest event (``resume_point``): the tenure before it released cleanly (its
    final flush wrote the checkpoint; the release said so in its own conditional write),
    under the fence this acquisition moved on from, with the checkpoint it left unchanged
    since, and lately. A checkpoint or fence rewritten by hand no longer matches its mark,
    so a rewound item is still read."""
    return (mark is not None and mark.fence == tenure.fence - 1
            and mark.last_seq == (tenure.last_seq or 0)
            and -CLEAN_RELEASE_AHEAD_MS <= now_ms - mark.at_ms <= CLEAN_RELEASE_TRUST_MS)


# --- the holder's local deadline ------------------------------------------------------

# Monotonic time after which the holder must not write for this tenure, measured from when
# the renew (or acquire) was *sent*, not when its answer came back: the server may have
# applied it at any instant in between. The keep-alive machine owns the arithmetic.
local_deadline = deadline_after

# One outcome for every lease's renewal (``core.keepalive``); a stream's refused renewal
# is counted as "lost" (``renew_label``).
RenewOutcome = KeepOutcome


def renew_label(outcome: KeepOutcome) -> str:
    """A stream renewal's outcome as the ``streamlease_renewals_total`` label."""
    return outcome_label(outcome, "lost")


class HolderState(StrEnum):
    HOLDING = "holding"
    DRAINING = "draining"  # stop reading, flush, then release
    LOST = "lost"  # terminal: ownership gone, nothing more may be written
    SELF_FENCED = "self_fenced"  # terminal: the local deadline passed
    RELEASED = "released"  # terminal


class StopReason(StrEnum):
    """Why a holder stops serving a stream. Values are metric label values."""

    STOPPED = "stopped"  # desired_state flipped to STOPPED
    SHUTDOWN = "shutdown"  # SIGTERM / SIGINT
    BAD_ITEM = "bad_item"  # the item can no longer be served (bad or disallowed URL)
    CONDITION_FAILED = "condition_failed"  # renew refused: taken over or force released
    DEADLINE = "deadline"  # self-fenced: no renewal proven before the local deadline
    STALE_FENCE = "stale_fence"  # the sink refused a batch
    MEMBER_FENCED = "member_fenced"  # this worker was declared dead: its epoch moved on
    MEMBER_DEADLINE = "member_deadline"  # no member heartbeat proven before its deadline
    REBALANCE = "rebalance"  # handed over to even out the fleet
    ERROR = "error"  # an unexpected failure in this stream's tasks


LOST_REASONS = (StopReason.CONDITION_FAILED, StopReason.DEADLINE, StopReason.STALE_FENCE,
                StopReason.MEMBER_FENCED, StopReason.MEMBER_DEADLINE)
RELEASE_REASONS = (StopReason.STOPPED, StopReason.SHUTDOWN, StopReason.BAD_ITEM,
                   StopReason.REBALANCE, StopReason.ERROR)


@dataclass(frozen=True)
class RenewDecision:
    """What the supervisor must do after a renew attempt."""

    state: HolderState
    deadline: float
    reason: StopReason | None = None
    reconnect: bool = False  # the URL changed: the pump must reconnect
    retry_in: float | None = None  # renew again sooner than the regular heartbeat
    next_in: float | None = None  # seconds until the next renewal (None: renewing is over)


def always(now: float) -> bool:
    return True


class Holding:
    """The holder's view of one tenure: a small state machine, inputs in, decisions out.

    It is fed renew and check-in outcomes and the current monotonic time; it never does
    I/O. The supervisor applies what it decides and asks ``may_write`` before every sink
    write. The lease's deadline and renewal schedule are a ``Keeper``'s (a tenure does not
    recover from a self-fence); ``member_alive`` is the worker's own membership rule (a
    pure function of the monotonic time): a tenure writes only while its worker may.
    """

    def __init__(self, tenure: Tenure, ws_url: str, acquire_sent_at: float,
                 timings: LeaseTimings,
                 member_alive: Callable[[float], bool] = always,
                 rng: random.Random | None = None) -> None:
        self.tenure = tenure
        self.ws_url = ws_url
        self.timings = timings
        self.member_alive = member_alive
        self.rng = rng or random.Random()
        self.keeper = Keeper.sent(acquire_sent_at, timings)
        self.state = HolderState.HOLDING
        self.reason: StopReason | None = None

    @property
    def deadline(self) -> float:
        """Monotonic time after which nothing may be written under this tenure."""
        return self.keeper.deadline

    @property
    def terminal(self) -> bool:
        return self.state in (HolderState.LOST, HolderState.SELF_FENCED, HolderState.RELEASED)

    def may_write(self, now: float) -> bool:
        """True while this tenure may still send a sink write (draining included)."""
        return self.state in (HolderState.HOLDING, HolderState.DRAINING) and \
            self.keeper.may_write(now) and self.member_alive(now)

    def check_deadline(self, now: float) -> bool:
        """Self-fence if the tenure's deadline has passed, or its worker may no longer
        write (its membership lapsed). Returns True if it just did."""
        if self.terminal:
            return False
        self.keeper.check_deadline(now)
        if self.keeper.state is KeepState.SELF_FENCED:
            self._stop(HolderState.SELF_FENCED, StopReason.DEADLINE)
            return True
        if not self.member_alive(now):
            self._stop(HolderState.SELF_FENCED, StopReason.MEMBER_DEADLINE)
            return True
        return False

    def call_timeout(self, now: float, limit_s: float) -> float:
        """How long a renewal sent at ``now`` may take (at most ``limit_s``): never past
        the deadline, after which its answer changes nothing."""
        return self.keeper.call_timeout(now, limit_s)

    def on_renew(self, outcome: KeepOutcome, sent_at: float, now: float,
                 record: StreamRecord | None, url_problem: str | None = None) -> RenewDecision:
        """Apply one renew result.

        ``record`` is the item as the renew left it (RENEWED only). ``url_problem`` is
        the caller's verdict on ``record.ws_url`` (None when it may be dialled).
        """
        if self.terminal:
            return self._decision()
        next_in = self.keeper.on_outcome(outcome, sent_at, now, self.rng)
        if self.keeper.state is KeepState.REFUSED:
            self._stop(HolderState.LOST, StopReason.CONDITION_FAILED)
            return self._decision()
        if self.check_deadline(now):
            return self._decision()
        if outcome is KeepOutcome.RENEWED:
            reconnect = record is not None and self._apply_item(record, url_problem)
            return RenewDecision(self.state, self.deadline, self.reason, reconnect=reconnect,
                                 next_in=next_in)
        # UNKNOWN or THROTTLED: the lease may still be ours; the keeper retries sooner,
        # and its deadline decides.
        return RenewDecision(self.state, self.deadline, self.reason, retry_in=next_in,
                             next_in=next_in)

    def on_check(self, record: StreamRecord | None,
                 url_problem: str | None = None) -> RenewDecision:
        """Apply a read of the item (a check-in, or the index showing it): the lease may
        have moved on (force release, a peer releasing for a dead member), the state may
        be STOPPED, the URL may have changed. Never extends the deadline."""
        if self.terminal:
            return self._decision()
        if record is None or not holds(record, self.tenure.owner, self.tenure.fence) \
                or record.lease_expires_at_ms == 0:
            self._stop(HolderState.LOST, StopReason.CONDITION_FAILED)
            return self._decision()
        reconnect = self._apply_item(record, url_problem)
        return RenewDecision(self.state, self.deadline, self.reason, reconnect=reconnect)

    def _apply_item(self, record: StreamRecord, url_problem: str | None) -> bool:
        """What the item says, read by a renewal or a check-in: STOPPED or unservable
        drains; a new ``ws_url`` is taken (and dialled, if still holding). True if the
        pump should reconnect."""
        if record.stopped:
            self.begin_drain(StopReason.STOPPED)
        elif not record.started or url_problem is not None:
            self.begin_drain(StopReason.BAD_ITEM)
        elif record.ws_url is not None and record.ws_url != self.ws_url:
            self.ws_url = record.ws_url
            return self.state is HolderState.HOLDING
        return False

    def member_lost(self, fenced: bool) -> None:
        """This worker's membership ended (fenced by a peer) or lapsed (its own deadline):
        stop at once, no flush."""
        if self.terminal:
            return
        if fenced:
            self._stop(HolderState.LOST, StopReason.MEMBER_FENCED)
        else:
            self._stop(HolderState.SELF_FENCED, StopReason.MEMBER_DEADLINE)

    def begin_drain(self, reason: StopReason) -> None:
        """Stop reading and flush before releasing (STOPPED, shutdown, bad item)."""
        if self.state is HolderState.HOLDING:
            self.state = HolderState.DRAINING
            self.reason = reason

    def on_stale_write(self) -> None:
        """The sink refused a batch: the fence moved on."""
        if not self.terminal:
            self._stop(HolderState.LOST, StopReason.STALE_FENCE)

    def on_released(self) -> None:
        if not self.terminal:
            self.state = HolderState.RELEASED

    def _stop(self, state: HolderState, reason: StopReason) -> None:
        self.state = state
        self.reason = reason

    def _decision(self) -> RenewDecision:
        return RenewDecision(self.state, self.deadline, self.reason)
