"""What an outside observer (``streamlease ctl members``) makes of the fleet (pure).

A command reads every member row a few times, a bounded interval apart, and judges each
member only by what it saw change on its *own* monotonic clock, the way a peer's
``Observer`` does. The member's ``heartbeat_at_ms`` (its own wall clock) is shown to
people and decides nothing.

* **alive** — the status is not DEAD and the member wrote its row while the command
  watched: its (epoch, heartbeat) changed between two reads, or it appeared. A member
  whose row did not move is *silent*: not proven alive, though its peers count it
  alive until it stays silent for a whole lease.
* **heartbeat_age_s** — how long the command has seen the member's current (epoch,
  heartbeat) unchanged: from the arrival of the first read that showed it to the arrival
  of the last read. The heartbeat was written before that first answer, so this is a
  lower bound of its true age, and it is the quantity peers compare with the lease.
* **share** — ``fair_shares`` of the streams the fleet holds over the alive ACTIVE
  members; every other member's share is 0. What the fleet holds is what the member rows
  say (``held``: the sum over every member not DEAD, silent ones included), so the command
  reads member rows only, never the streams table: a STARTED stream that nobody holds yet
  is not in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streamlease.core.membership import MemberRecord, MemberStatus, fair_shares


@dataclass(frozen=True)
class FleetRead:
    """One read of every member row, sent and answered at these monotonic times."""

    members: tuple[MemberRecord, ...]
    sent_at: float
    received_at: float


@dataclass(frozen=True)
class MemberReport:
    member: MemberRecord
    alive: bool
    heartbeat_age_s: float
    share: int

    @property
    def liveness(self) -> str:
        """``alive``, ``silent`` (live status, row unchanged while watched) or ``dead``."""
        if self.member.status is MemberStatus.DEAD:
            return "dead"
        return "alive" if self.alive else "silent"


def _unchanged_since(reads: Sequence[FleetRead], member: MemberRecord) -> tuple[int, bool]:
    """The index of the first read in the trailing run that shows ``member``'s current
    key, and whether an earlier read showed something else (or no row at all)."""
    first = len(reads) - 1
    for index in range(len(reads) - 2, -1, -1):
        before = next((m for m in reads[index].members if m.worker_id == member.worker_id),
                      None)
        if before is None or before.key != member.key:
            return first, True
        first = index
    return first, False


def held(members: Sequence[MemberRecord]) -> int:
    """The streams the fleet holds, as its member rows report them: every member not
    DEAD (a DEAD row's last count is being released to, and counted by, the others)."""
    return sum(max(0, m.streams) for m in members if m.live_status)


def report(reads: Sequence[FleetRead], total: int | None = None) -> list[MemberReport]:
    """One report per member of the last read, sorted by id. ``total``: the streams the
    fleet shares (default: ``held`` by the last read's rows)."""
    if not reads:
        return []
    if total is None:
        total = held(reads[-1].members)
    last = reads[-1]
    judged: list[tuple[MemberRecord, bool, float]] = []
    for member in sorted(last.members, key=lambda m: m.worker_id):
        first, moved = _unchanged_since(reads, member)
        alive = member.live_status and moved
        judged.append((member, alive, max(0.0, last.received_at - reads[first].received_at)))
    capacities = {m.worker_id: (m.capacity if alive and m.status is MemberStatus.ACTIVE else 0)
                  for m, alive, _ in judged}
    shares = fair_shares(total, capacities)
    return [MemberReport(m, alive, age, shares[m.worker_id]) for m, alive, age in judged]


def settled(reads: Sequence[FleetRead]) -> bool:
    """Reading again cannot change the verdict: every member that could still prove
    itself alive (any status but DEAD) already has."""
    if len(reads) < 2:
        return False
    return all(r.alive or r.member.status is MemberStatus.DEAD for r in report(reads, 0))
