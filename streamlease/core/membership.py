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

from streamlease.core.keepalive import Keeper, KeepOutcome, KeepState, deadline_after, outcome_label


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
    bulletin: str | None = None  # the leader's row: its bulletin (``core.bulletin``)
    shard: int = 0  # the key it lives under (``core.layout``)
    # the incarnation nonce of a process that reads spread layouts (``core.layout``)
    reads_layout: str | None = None
    # streams a peer offers this member, each ``core.handover.Offer.text`` (its own row)
    offers: frozenset[str] = frozenset()

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


# One outcome for every lease's renewal (``core.keepalive``); a member's refused heartbeat
# (its epoch moved on: a peer declared it dead, or a duplicate id) is counted as "fenced"
# (``heartbeat_label``).
HeartbeatOutcome = KeepOutcome


def heartbeat_label(outcome: KeepOutcome) -> str:
    """A member heartbeat's outcome as the ``streamlease_member_heartbeats_total`` label."""
    return outcome_label(outcome, "fenced")


class MemberState(StrEnum):
    ACTIVE = "active"  # may write
    SELF_FENCED = "self_fenced"  # no heartbeat proven before the deadline: stopped
    FENCED = "fenced"  # the epoch moved on: everything stops; register again


_MEMBER_STATES = {KeepState.KEEPING: MemberState.ACTIVE,
                  KeepState.SELF_FENCED: MemberState.SELF_FENCED,
                  KeepState.REFUSED: MemberState.FENCED}


class Liveness:
    """The member's own side: a ``Keeper`` of its row under one epoch, which recovers from
    a self-fence when a heartbeat is proven again (pure)."""

    def __init__(self, timings: MemberTimings, deadline: float) -> None:
        self.timings = timings
        self.keeper = Keeper(timings, deadline, recovers=True)

    @classmethod
    def registered(cls, sent_at: float, timings: MemberTimings) -> Liveness:
        return cls(timings, deadline_after(sent_at, timings))

    @property
    def deadline(self) -> float:
        return self.keeper.deadline

    @property
    def state(self) -> MemberState:
        return _MEMBER_STATES[self.keeper.state]

    def may_write(self, now: float) -> bool:
        return self.keeper.may_write(now)

    def check_deadline(self, now: float) -> bool:
        """Self-fence if the deadline passed; True if it just did."""
        return self.keeper.check_deadline(now)

    def on_heartbeat(self, outcome: KeepOutcome, sent_at: float, now: float,
                     rng: random.Random) -> float:
        """Apply one heartbeat; the delay until the next one (``Keeper.on_outcome``)."""
        return self.keeper.on_outcome(outcome, sent_at, now, rng)

    def call_timeout(self, now: float) -> float:
        """A heartbeat may not outlive the deadline: past it, its answer changes nothing
        (while self-fenced, a heartbeat gets one interval)."""
        return self.keeper.call_timeout(now)


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
