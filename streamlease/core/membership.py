"""Fleet membership rules: who is in the fleet, and when a member is dead.

Each worker keeps a member row (epoch, heartbeat counter, status) and renews it every
heartbeat, conditioned on its epoch. Liveness is decided by observation, never by
comparing another machine's clock:

* **A peer declares a member dead** when a read *sent* at least ``lease`` seconds after
  the peer first received that member's current (epoch, counter) still shows it
  unchanged — all on the peer's own monotonic clock (as client-go and KCL observe
  leases). "First received" is when the answer arrived: the counter was written before
  the server answered, so the member sent that heartbeat earlier still.
* **A member stops itself** ``lease - safety_margin`` after the last heartbeat it proved
  (measured from when that heartbeat was *sent*), on its own monotonic clock.

So by the time any peer may declare a member dead, that member has already stopped
writing, whatever the wall clocks say; skew between workers cannot make a live member
look dead. If the argument ever fails (a monotonic clock running fast, a pause between
the check and a write), the fences still refuse the stale holder's writes.

The peer then *fences* the member (a conditional write moving its epoch on, conditioned
on the epoch and counter it saw: exactly one peer wins) and releases its streams on its
behalf. A member that finds its epoch moved stops every stream, then reads its row to learn
why (``fence_cause``): fenced by a peer, it registers afresh; moved on by another process's
*registration* under the same worker id (a duplicate id), it leaves the id to that process
and the worker exits, instead of the two fencing each other forever.

Epochs never decrease (``next_epoch``): a row that was deleted is re-created above the
fleet's epoch high-water mark, however far behind this machine's clock is.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from enum import StrEnum

from streamlease.core.backoff import next_renewal


class MemberStatus(StrEnum):
    ACTIVE = "ACTIVE"
    DRAINING = "DRAINING"  # shutting down: takes nothing, hands everything over
    DEAD = "DEAD"  # fenced by a peer; its streams are (being) released on its behalf


@dataclass(frozen=True)
class MemberRecord:
    """One member row as read. ``heartbeat_at_ms`` is the member's own wall clock: shown
    to operators, never used to decide anything."""

    worker_id: str
    epoch: int
    heartbeat: int
    status: MemberStatus
    streams: int = 0
    capacity: int = 0
    heartbeat_at_ms: int | None = None
    released: bool = False  # DEAD rows: its streams were released on its behalf
    handoffs: int = 0  # bumped each time it hands streams over (drain, rebalancing)
    incarnation: str | None = None  # a nonce per process, written by each registration
    fenced_by: str | None = None  # DEAD rows: the peer that fenced it

    @property
    def key(self) -> tuple[int, int]:
        """What changes when the member proves it is alive."""
        return self.epoch, self.heartbeat

    @property
    def live_status(self) -> bool:
        return self.status is not MemberStatus.DEAD


@dataclass(frozen=True)
class MemberTimings:
    lease_s: float
    heartbeat_s: float
    safety_margin_s: float

    @property
    def slow_heartbeat_s(self) -> float:
        """A member heartbeat slower than this says the store is strained."""
        return self.heartbeat_s / 4

    @property
    def observe_s(self) -> float:
        """How often members read the fleet: often enough that a death is seen within a
        fraction of a heartbeat of becoming provable."""
        return max(0.01, min(self.heartbeat_s / 2, self.lease_s / 8))


def self_fence_deadline(sent_at: float, timings: MemberTimings) -> float:
    """Monotonic time after which a member that proved a heartbeat sent at ``sent_at``
    (and none since) must not write."""
    return sent_at + timings.lease_s - timings.safety_margin_s


@dataclass
class _Seen:
    key: tuple[int, int]
    since: float  # monotonic: when this key was first received


@dataclass
class Observer:
    """A peer's view of the other members, fed one fleet read at a time (pure)."""

    me: str
    lease_s: float
    _seen: dict[str, _Seen] = field(default_factory=dict)

    def observe(self, members: list[MemberRecord], sent_at: float,
                received_at: float) -> list[MemberRecord]:
        """Record one read (sent and answered at these monotonic times); the members
        it proves dead. A member stays "dead" in every later read until someone fences
        it (its epoch moves) or it heartbeats again (its counter moves)."""
        dead: list[MemberRecord] = []
        present = set()
        for member in members:
            present.add(member.worker_id)
            if member.worker_id == self.me or not member.live_status:
                continue
            seen = self._seen.get(member.worker_id)
            if seen is None or seen.key != member.key:
                self._seen[member.worker_id] = _Seen(member.key, received_at)
            elif sent_at >= seen.since + self.lease_s:
                dead.append(member)
        for gone in set(self._seen) - present:
            del self._seen[gone]
        return dead

    def unchanged_for(self, worker_id: str, now: float) -> float | None:
        """Seconds since this member's current key was first received (None: unseen)."""
        seen = self._seen.get(worker_id)
        return None if seen is None else max(0.0, now - seen.since)


class HeartbeatOutcome(StrEnum):
    RENEWED = "renewed"
    FENCED = "fenced"  # the epoch moved on: a peer declared us dead, or a duplicate id
    UNKNOWN = "unknown"  # timeout, 5xx: it may or may not have applied
    THROTTLED = "throttled"


def heartbeat_strained(outcome: HeartbeatOutcome, seconds: float, slow_s: float) -> bool:
    """A member heartbeat that went unanswered (unknown, throttled) or took longer than
    ``slow_s``: the store is strained (read the fleet less often, pace the sink)."""
    return outcome in (HeartbeatOutcome.UNKNOWN, HeartbeatOutcome.THROTTLED) or \
        seconds > slow_s


class MemberState(StrEnum):
    ACTIVE = "active"  # may write
    SELF_FENCED = "self_fenced"  # no heartbeat proven before the deadline: stopped
    FENCED = "fenced"  # the epoch moved on: everything stops; register again


@dataclass
class Liveness:
    """The member's own side: its deadline, fed heartbeat outcomes (pure)."""

    timings: MemberTimings
    deadline: float
    state: MemberState = MemberState.ACTIVE
    failures: int = 0

    @classmethod
    def registered(cls, sent_at: float, timings: MemberTimings) -> Liveness:
        return cls(timings, self_fence_deadline(sent_at, timings))

    def may_write(self, now: float) -> bool:
        return self.state is MemberState.ACTIVE and now < self.deadline

    def check_deadline(self, now: float) -> bool:
        """Self-fence if the deadline passed; True if it just did."""
        if self.state is MemberState.ACTIVE and now >= self.deadline:
            self.state = MemberState.SELF_FENCED
            return True
        return False

    def on_heartbeat(self, outcome: HeartbeatOutcome, sent_at: float, now: float,
                     rng: random.Random) -> float:
        """Apply one heartbeat; the delay until the next one: a heartbeat interval after
        this one was sent, spread +/-10 % afresh each time (``next_renewal``), or a retry
        that backs off after a failure."""
        t = self.timings
        if outcome is HeartbeatOutcome.FENCED:
            self.state = MemberState.FENCED
            return 0.0
        if outcome is HeartbeatOutcome.RENEWED:
            self.failures = 0
            self.deadline = max(self.deadline, self_fence_deadline(sent_at, t))
            if self.state is MemberState.SELF_FENCED:
                # Proven alive again under the same epoch: nobody fenced us meanwhile.
                self.state = MemberState.ACTIVE
            return max(0.0, next_renewal(sent_at, t.heartbeat_s, rng) - now)
        self.failures += 1
        self.check_deadline(now)
        base = t.heartbeat_s / (2 if outcome is HeartbeatOutcome.THROTTLED else 4)
        retry = min(base * 2.0 ** min(self.failures - 1, 30), t.heartbeat_s)
        if self.state is MemberState.ACTIVE:
            retry = min(retry, max(0.0, self.deadline - now))
        return retry

    def call_timeout(self, now: float) -> float:
        """A heartbeat may not outlive the deadline: past it, its answer changes nothing
        (while self-fenced, a heartbeat gets one interval)."""
        if self.state is MemberState.ACTIVE:
            return max(0.01, min(self.timings.heartbeat_s, self.deadline - now))
        return self.timings.heartbeat_s


class FenceCause(StrEnum):
    """Why a member's epoch moved on, as its row tells (``fence_cause``)."""

    PEER = "peer"  # a peer declared it dead (the row is DEAD): register afresh
    GONE = "gone"  # the row was deleted (forgotten, or the other process left): register
    OWN = "own"  # this process's own registration (an answer lost, a retry): register
    DUPLICATE = "duplicate"  # another live process registered under this worker id


def fence_cause(row: MemberRecord | None, incarnation: str) -> FenceCause:
    """Classify a member's own row, read after its heartbeat was refused for its epoch.

    Only two writes move an epoch: a peer's fence (which also sets the row DEAD and names
    the fencer) and a registration (which sets ACTIVE or DRAINING and writes the
    registering process's incarnation nonce). So a row that is not DEAD and carries
    another nonce — or none, written by an older version — was registered by another
    process using this worker id while this one was alive and heartbeating.
    """
    if row is None:
        return FenceCause.GONE
    if row.status is MemberStatus.DEAD:
        return FenceCause.PEER
    if row.incarnation == incarnation:
        return FenceCause.OWN
    return FenceCause.DUPLICATE


def next_epoch(current: int | None, high_water: int, wall_ms: int) -> int:
    """The epoch a registration writes: one above the row's (``current``), or, for a row
    that does not exist (never did, or was deleted), one above both this machine's wall
    clock in milliseconds and the fleet's high-water mark (the highest epoch any deleted
    row carried). The wall clock keeps epochs roughly ordered across a fresh table; the
    high-water mark makes sure a clock that is behind can never take an epoch back."""
    if current is not None:
        return current + 1
    return max(wall_ms, high_water) + 1


def raised_high_water(high_water: int, deleted_epoch: int) -> int:
    """The high-water mark after a row with ``deleted_epoch`` is deleted: never lower."""
    return max(high_water, deleted_epoch)


def releasable_for(owner: str, fenced_epoch: int, lease_owner: str | None,
                   expires_at_ms: int | None, fence: int | None,
                   lease_epoch: int | None) -> bool:
    """Is a stream, as a consistent read shows it, still leased to an incarnation of
    ``owner`` older than ``fenced_epoch`` (so a release on its behalf would apply)? The
    owner index only hints: it lists every stream that ever named the owner, lags, and
    holds no expiry."""
    return (lease_owner == owner and fence is not None and expires_at_ms is not None
            and expires_at_ms != 0 and (lease_epoch is None or lease_epoch < fenced_epoch))


def fair_shares(total: int, capacities: dict[str, int]) -> dict[str, int]:
    """Each member's share of ``total`` streams: as even as capacities allow.

    Members get ``ceil(total / n)`` each, but never more than their capacity; what a
    small member cannot hold is spread over the others the same way (water-filling).
    Members with capacity 0 (draining) get 0.
    """
    shares = dict.fromkeys(capacities, 0)
    open_members = sorted((c, m) for m, c in capacities.items() if c > 0)
    remaining = total
    while open_members and remaining > 0:
        level = math.ceil(remaining / len(open_members))
        capacity, member = open_members[0]
        if capacity < level:
            shares[member] = capacity
            remaining -= capacity
            open_members.pop(0)
            continue
        for _, m in open_members:
            shares[m] = level
        break
    return shares
