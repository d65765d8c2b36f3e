"""Balance: each member's fair share, and who takes or hands over streams to reach it.

The plan is computed from the member rows (each row reports the streams its member
holds): by the fleet leader, which publishes what every member needs of it in its bulletin
(``streamlease.core.bulletin``), or by each member itself when it reads every row; both
give a member the same share and the same moves:

* **Shares.** The servable STARTED streams (held by live members plus the orphans seen)
  are divided as evenly as capacities allow: ``ceil(total / active members)`` each, never
  above a member's ``STREAMLEASE_MAX_STREAMS`` (what a small member cannot hold goes to
  the others). Members that drain or were observed dead have a share of 0. A fenced
  member's streams count until they are released on its behalf: survivors taking them
  over show them in their rows only a heartbeat later, and a total without them would
  shrink every share for that heartbeat and make the survivors shed.
* **A band, not a point.** A member is balanced while it holds within ``TOLERANCE`` (1) of
  its share. Counts in the rows lag by up to a heartbeat, so a tighter target would make
  members chase each other's stale numbers; with the band a balanced fleet makes no move
  at all while membership and the stream set stay the same.
* **Shed.** A member above its band hands over at most half its excess per cycle (at
  least one): a few at a time, because the takers' counts are only seen a heartbeat later.
  A member at or above its share also gives one stream when some member sits below its
  band, nobody above the band is left to give and no orphan is already waiting to fill
  the gap — the largest holders first, ties by id, as many as the members below the band
  need, so two members never both give for one gap. The member that gave a stream does
  not take it back before it has waited three reconcile intervals (the reconciler keeps
  what it handed over): the next plan may still show the giver short.
* **Take.** A member below its share takes orphans up to its share: all of its gap at once
  when the orphans cover every member's gap (a hand-over), else the orphans are dealt out
  one at a time to whoever is furthest below. A draining member's streams are counted
  once, though its row still shows them while they already wait as orphans. A member
  at or above its share takes none while another live member is below its share, unless
  an orphan has waited two reconcile intervals (then what fits inside its band) or three
  (then any): no stream stays unserved for balance. Rows lag, so the reconciler also
  lets a member below its share by its own live count take an orphan still waiting half
  an interval after it was dealt elsewhere (``streamlease/reconciler.py``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping
from dataclasses import dataclass

from streamlease.core.membership import MemberRecord, MemberStatus, fair_shares
from streamlease.core.model import StreamRecord

TOLERANCE = 1


@dataclass(frozen=True)
class Balance:
    share: int  # this member's fair share
    take: int  # orphans it may take now (before the per-cycle cap)
    shed: int  # streams it should hand over now
    total: int  # servable STARTED streams, as counted
    someone_below: bool  # a live member holds less than its share


def allocate(deficits: dict[str, int], available: int) -> dict[str, int]:
    """Share ``available`` orphans among members short of their share: one at a time to
    whoever is furthest below (ties by id), so several takers racing for the same orphans
    each take their part, and a member short by one never takes what a member short by
    three needs (counts in the rows lag; a slightly inflated share must not win)."""
    given = dict.fromkeys(deficits, 0)
    short = [(-d, m) for m, d in deficits.items() if d > 0]
    heapq.heapify(short)
    for _ in range(available):
        if not short:
            break
        negative, member = heapq.heappop(short)
        given[member] += 1
        if negative + 1 < 0:
            heapq.heappush(short, (negative + 1, member))
    return given


def counts_of(members: list[MemberRecord], me: str, my_held: int,
              observed_dead: frozenset[str] = frozenset()) -> tuple[dict[str, int], set[str]]:
    """(held per member, those taking streams): live rows, with this member's own live
    count in place of its row's (the row lags). Draining and observed-dead members still
    hold their streams until they are released, but take none; so does a fenced member
    whose streams are not released yet: they are being taken over, and counting them
    keeps every share whole meanwhile (without them, the survivors' shares would shrink
    by the dead member's streams and the survivors would shed what they already held)."""
    counts: dict[str, int] = {}
    active: set[str] = set()
    for member in members:
        if not member.live_status and member.released:
            continue
        counts[member.worker_id] = member.streams
        if member.status is MemberStatus.ACTIVE and member.worker_id not in observed_dead:
            active.add(member.worker_id)
    counts[me] = my_held
    return counts, active


def shares_of(counts: dict[str, int], active: set[str], capacities: dict[str, int],
              servable_orphans: int, total_at_least: int = 0) -> tuple[int, dict[str, int]]:
    """(servable STARTED streams as counted, each member's fair share of them)."""
    # A draining (or observed-dead) member's row still counts the streams it is releasing
    # while they already show as orphans: count them once.
    leaving = sum(n for m, n in counts.items() if m not in active)
    holding = sum(n for m, n in counts.items() if m in active)
    total = max(holding + max(leaving, servable_orphans), total_at_least)
    return total, fair_shares(total, {m: capacities.get(m, 0) if m in active else 0
                                      for m in counts})


def donors(counts: dict[str, int], active: set[str], shares: dict[str, int],
           servable_orphans: int) -> list[str]:
    """The members at or above their share that give one stream each now: only when some
    member sits below its band, nobody above the band is left to give and the orphans
    already waiting cannot fill the gaps; the largest holders first, ties by id, as many
    as the gaps need."""
    need = sum(max(0, shares[m] - TOLERANCE - counts.get(m, 0)) for m in active) \
        - servable_orphans
    over = any(counts.get(m, 0) > shares[m] + TOLERANCE for m in active)
    if need <= 0 or over:
        return []
    at_share = sorted((m for m in active if counts.get(m, 0) >= shares[m]),
                      key=lambda m: (-(counts.get(m, 0) - shares[m]), m))
    return at_share[:need]


def shed_of(held: int, share: int, donor: bool) -> int:
    """How many streams a member taking streams hands over now."""
    if held > share + TOLERANCE:
        return max(1, math.ceil((held - share) / 2))
    return 1 if donor and held >= share else 0


def plan(me: str, counts: dict[str, int], active: set[str], capacities: dict[str, int],
         servable_orphans: int, total_at_least: int = 0) -> Balance:
    """This member's share and moves, from every member's count (``counts[me]`` is live).

    ``active`` are the members taking streams (this one included if it is ACTIVE);
    ``capacities`` their STREAMLEASE_MAX_STREAMS. Rows lag: a stream just taken may show
    in nobody's count, which would shrink every share and make members over-shed, so the
    caller may pass ``total_at_least`` (the largest total it counted lately).
    """
    total, shares = shares_of(counts, active, capacities, servable_orphans, total_at_least)
    share = shares.get(me, 0)
    held = counts.get(me, 0)
    deficits = {m: max(0, shares.get(m, 0) - counts.get(m, 0)) for m in active}
    someone_below = any(d > 0 for m, d in deficits.items() if m != me)
    if servable_orphans >= sum(deficits.values()):
        # Enough for everyone (a member's hand-over, a scale-out's shed): each takes its
        # own gap now, without waiting for the others' rows to show what they took.
        take = deficits.get(me, 0)
    else:
        take = allocate(deficits, servable_orphans).get(me, 0)
    # Draining members hand everything over through their own drain.
    shed = 0 if me not in active else \
        shed_of(held, share, me in donors(counts, active, shares, servable_orphans))
    return Balance(share=share, take=take, shed=shed, total=total, someone_below=someone_below)


# -- intake: how many orphans to take now -----------------------------------------------


@dataclass(frozen=True)
class Waited:
    """Orphans by how long this worker has seen them wait (each set includes the next)."""

    lingering: frozenset[str]  # half a reconcile interval: a dealt taker would have had it
    starving: frozenset[str]  # two intervals: taken by anyone with room in its band
    abandoned: frozenset[str]  # three: taken by anyone

    def tier(self, record: StreamRecord) -> int:
        """The longest waiting first (0), those not waiting yet last (3)."""
        sid = record.stream_id
        return 0 if sid in self.abandoned else 1 if sid in self.starving else \
            2 if sid in self.lingering else 3


def waited(first_seen: Mapping[str, float], now: float, reconcile_s: float) -> Waited:
    """The orphans (stream -> when this worker first saw it waiting) by how long they
    have waited, in reconcile intervals."""
    def at_least(limit: float) -> frozenset[str]:
        return frozenset(sid for sid, since in first_seen.items() if now - since >= limit)
    return Waited(lingering=at_least(reconcile_s / 2), starving=at_least(2 * reconcile_s),
                  abandoned=at_least(3 * reconcile_s))


def intake(plan: Balance, keeping: int, waiting: Waited) -> int:
    """How many orphans a member holding ``keeping`` streams (not counting those it is
    handing over) takes now, given its plan.

    What the plan deals it; an orphan still waiting half a reconcile interval after it
    was first seen (its dealt taker, polling every fifth of one, would have had it by
    then) by a member still below its share by its own live count, never past its share;
    those that waited two intervals by a member with room inside its band (share +
    TOLERANCE); and only when nothing else would be taken, what waited three (shares
    computed from rows that undercount, or short members that cannot take): a member with
    a gap of its own fills that, not a heap past its share during a slow start-up.
    """
    gap = max(0, plan.share - keeping)
    room = max(0, plan.share + TOLERANCE - keeping)
    want = max(plan.take, min(gap, len(waiting.lingering)), min(room, len(waiting.starving)))
    return want or len(waiting.abandoned)
