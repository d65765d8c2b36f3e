"""The leader's bulletin: what every member needs from the whole fleet, in one small item.

Only the fleet leader reads every member row. From them it composes a ``Bulletin`` and
writes it into its own member row with its heartbeat; every other member reads that one
row each read interval (``streamlease.membership``), so a member's control-plane reads do
not grow with the fleet. The bulletin carries:

* ``level`` — the fair-share water level: a member's share is ``min(capacity, level)``
  (``streamlease.core.membership.fair_shares``), so no member needs the others' counts;
* ``deficit``, ``below`` and ``donors`` — the balance planner's view of the gaps: how many
  streams members below their share still need, how many such members there are, and
  which members at their share give one stream now (``streamlease.core.balance``);
* ``deals`` — for each fenced member whose streams are not released yet, its fenced
  epoch and the survivors' weights: each survivor takes its part straight over
  (``streamlease.core.deal``), as every member computes the same deal from them;
* ``draining`` and ``gen`` — someone is handing streams over (poll the orphans fast), and
  a counter that moves whenever the fleet's membership does (someone joined, left, died,
  was released, started draining or handed streams over; not when a count changes): a
  reconcile is worth it now;
* ``statuses`` — the members by status, for every worker's gauges;
* ``successor`` — the member that campaigns for the leader lease at full pace (the first
  member taking streams by id, the leader aside): the others read the lease once a lease
  while the leader's row shows it alive, so campaign reads do not grow with the fleet;
* ``feed`` and ``notices`` — the leader tails the change feed and vouches that its
  notices are complete (members then stop polling for STOPPED flips and changed items),
  and the notices themselves (``streamlease.core.notices``). ``feed`` is 0 when the leader
  does not vouch, else the number of its current stretch of vouching: it moves on whenever
  vouching resumed after a gap, so a member that saw no gap still knows there was one;
* ``shards`` — how many keys the member rows spread over (``streamlease.core.layout``):
  above 1, the leader copies the bulletin into each key and a member reads its own;
* ``takers`` — the members with the most room (the furthest below their share first), as
  much of each row as an offer needs: a member handing streams over (a drain, a shed)
  names its takers from them (``streamlease.core.handover``), not only from the leader,
  the one row it reads.

Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from streamlease.core.balance import Balance, counts_of, donors, shares_of, shed_of
from streamlease.core.deal import deal_weights
from streamlease.core.membership import MemberRecord, MemberStatus
from streamlease.core.notices import NOTICE_KINDS, Notice, NoticeKind

MAX_DONORS = 256  # donors named at once; the rest give at a later bulletin
# The bulletin rides in the leader's row (an item is at most 400 KB, and every byte of it
# is written with each heartbeat and read by every member): a deal names the survivors
# with the most room, and a bulletin the first deals by member id. A fenced member left
# out is released by its fencer after the deal window and its streams acquired as orphans.
MAX_HEIRS = 64
MAX_DEALS = 16
# Takers named for hand-overs: a drain spreads its streams over these (and the leader), one
# fuller per stream; a taker that cannot take one sends the holder to the next of them.
MAX_TAKERS = 8


@dataclass(frozen=True)
class Deal:
    """A fenced member's streams, dealt across the survivors by weight."""

    member: str
    epoch: int  # the fenced (DEAD) row's epoch
    streams: int  # as its last live row reported them
    heirs: tuple[tuple[str, int], ...]  # (survivor, weight), weights > 0, sorted by id

    def weights(self) -> dict[str, int]:
        return dict(self.heirs)

    def dead_row(self) -> MemberRecord:
        return MemberRecord(self.member, self.epoch, 0, MemberStatus.DEAD, self.streams)


@dataclass(frozen=True)
class Taker:
    """A member with room, as much of its row as a hand-over's offer needs."""

    member: str
    epoch: int
    shard: int
    streams: int  # as its row (or, for the leader, its live count) showed them
    capacity: int

    def row(self, heartbeat: int) -> MemberRecord:
        """The member as an ACTIVE row; ``heartbeat`` stands for the read it came with
        (``core.handover.further_taker`` counts streams sent to it until that moves)."""
        return MemberRecord(self.member, self.epoch, heartbeat, MemberStatus.ACTIVE,
                            self.streams, self.capacity, shard=self.shard)


@dataclass(frozen=True)
class Bulletin:
    gen: int
    level: int
    total: int
    deficit: int
    below: int
    active: int
    draining: bool
    donors: tuple[str, ...] = ()
    deals: tuple[Deal, ...] = ()
    statuses: tuple[tuple[str, int], ...] = ()
    feed: int = 0  # 0: not vouched for; else the leader's vouching stretch
    notices: tuple[Notice, ...] = ()
    successor: str | None = None  # None: every member campaigns at full pace
    shards: int = 1  # the member layout
    takers: tuple[Taker, ...] = ()  # the members with the most room, the most first

    def share_of(self, capacity: int) -> int:
        return max(0, min(capacity, self.level))


@dataclass(frozen=True)
class FleetRead:
    """What a bulletin is composed from: every member row as the leader read them, with
    the leader's own live figures and what it adds to the rows' picture."""

    members: Sequence[MemberRecord]
    observed_dead: frozenset[str]
    leader: str
    leader_held: int  # the leader's own count, live
    leader_active: bool
    servable_orphans: int
    gen: int
    total_at_least: int = 0
    # False: no donors now (a hand-over is still settling, so the rows undercount its takers)
    name_donors: bool = True
    feed: int = 0  # the leader's vouching stretch (``Bulletin.feed``)
    notices: tuple[Notice, ...] = ()
    shards: int = 1


def compose(read: FleetRead) -> Bulletin:
    """The bulletin from every member row as the leader read them (its own count live)."""
    rows, leader, observed_dead = list(read.members), read.leader, read.observed_dead
    servable_orphans = read.servable_orphans
    counts, active = counts_of(rows, leader, read.leader_held, observed_dead)
    if read.leader_active:
        active.add(leader)
    else:
        active.discard(leader)
    capacities = {m.worker_id: m.capacity for m in rows}
    total, shares = shares_of(counts, active, capacities, servable_orphans,
                              read.total_at_least)
    level = max((shares[m] for m in active), default=0)
    gaps = [max(0, shares[m] - counts.get(m, 0)) for m in active]
    statuses: dict[str, int] = {}
    for row in rows:
        if row.worker_id in observed_dead and row.live_status:
            statuses["UNRESPONSIVE"] = statuses.get("UNRESPONSIVE", 0) + 1
        else:
            statuses[row.status.value] = statuses.get(row.status.value, 0) + 1
    survivors = {m: counts.get(m, 0) for m in active}
    fenced = [row for row in sorted(rows, key=lambda r: r.worker_id)
              if row.status is MemberStatus.DEAD and not row.released]
    deals = tuple(Deal(row.worker_id, row.epoch, row.streams,
                       _heirs(survivors, capacities, row))
                  for row in fenced[:MAX_DEALS])
    return Bulletin(
        gen=read.gen, level=level, total=total, deficit=sum(gaps),
        below=sum(1 for g in gaps if g > 0), active=len(active),
        draining=any(m.status is MemberStatus.DRAINING and m.worker_id not in observed_dead
                     for m in rows),
        donors=tuple(donors(counts, active, shares, servable_orphans)[:MAX_DONORS])
        if read.name_donors else (),
        deals=deals, statuses=tuple(sorted(statuses.items())), feed=read.feed,
        notices=read.notices, successor=min((m for m in active if m != leader), default=None),
        shards=read.shards, takers=_takers(rows, counts, active, shares, capacities))


def _takers(rows: Sequence[MemberRecord], counts: dict[str, int], active: set[str],
            shares: dict[str, int], capacities: dict[str, int]) -> tuple[Taker, ...]:
    """The MAX_TAKERS members taking streams with room to their capacity: the furthest
    below their share first, then the most room, ties by id."""
    rooms = [(max(0, shares.get(r.worker_id, 0) - counts.get(r.worker_id, 0)),
              capacities.get(r.worker_id, 0) - counts.get(r.worker_id, 0), r)
             for r in rows if r.worker_id in active]
    rooms = [room for room in rooms if room[1] > 0]
    rooms.sort(key=lambda room: (-room[0], -room[1], room[2].worker_id))
    return tuple(Taker(r.worker_id, r.epoch, r.shard, counts.get(r.worker_id, 0),
                       capacities.get(r.worker_id, 0)) for _, _, r in rooms[:MAX_TAKERS])


def _heirs(survivors: dict[str, int], capacities: dict[str, int],
           dead: MemberRecord) -> tuple[tuple[str, int], ...]:
    """The survivors' weights in the deal of ``dead``'s streams: the MAX_HEIRS with the
    most, sorted by id."""
    weights = deal_weights({m: n for m, n in survivors.items() if m != dead.worker_id},
                           {m: capacities.get(m, 0) for m in survivors if m != dead.worker_id},
                           dead.streams)
    best = sorted(((m, w) for m, w in weights.items() if w > 0),
                  key=lambda mw: (-mw[1], mw[0]))[:MAX_HEIRS]
    return tuple(sorted(best))


def newly_donor(me: str, before: Bulletin | None, news: Bulletin) -> bool:
    """``news`` names ``me`` a donor and the bulletin before it did not: its reconciler
    should shed now rather than at its next cycle, which may be a quiet one."""
    return me in news.donors and (before is None or me not in before.donors)


def plan_from(bulletin: Bulletin, me: str, capacity: int, keeping: int, active: bool,
              servable_orphans: int) -> Balance:
    """A member's balance plan from the leader's bulletin and its own live count.

    The bulletin's gaps are the leader's counts, up to a heartbeat and a read old; this
    member's own gap is live. Orphans are taken up to its gap when they cover every gap,
    else its part of them in proportion to its gap (the waiting tiers of ``intake`` take
    what is left)."""
    share = bulletin.share_of(capacity) if active else 0
    gap = max(0, share - keeping)
    deficit = max(bulletin.deficit, gap)
    if servable_orphans >= deficit:
        take = gap
    else:
        take = min(gap, math.ceil(servable_orphans * gap / deficit))
    shed = shed_of(keeping, share, me in bulletin.donors) if active else 0
    others_below = bulletin.below - (1 if gap > 0 else 0)
    return Balance(share=share, take=take, shed=shed, total=bulletin.total,
                   someone_below=others_below > 0)


# -- the bulletin as stored: a compact JSON string in the leader's member row -------------


def encode(bulletin: Bulletin) -> str:
    layout = {"k": bulletin.shards} if bulletin.shards > 1 else {}
    return json.dumps({
        "g": bulletin.gen, "l": bulletin.level, "t": bulletin.total, "d": bulletin.deficit,
        "b": bulletin.below, "a": bulletin.active, "dr": int(bulletin.draining),
        "do": list(bulletin.donors),
        "de": [[d.member, d.epoch, d.streams, [[m, w] for m, w in d.heirs]]
               for d in bulletin.deals],
        "s": [[k, v] for k, v in bulletin.statuses],
        "f": int(bulletin.feed),
        "n": [[x.n, x.member, x.stream, x.kind.value] for x in bulletin.notices],
        "su": bulletin.successor,
        "tk": [[t.member, t.epoch, t.shard, t.streams, t.capacity] for t in bulletin.takers],
        **layout,
    }, separators=(",", ":"))


def decode(text: str | None) -> Bulletin | None:
    """The bulletin, or None if absent or unreadable (the reader then reads every row)."""
    if not text:
        return None
    try:
        raw = json.loads(text)
        news = Bulletin(
            gen=_int(raw["g"]), level=_int(raw["l"]), total=_int(raw["t"]),
            deficit=_int(raw["d"]), below=_int(raw["b"]), active=_int(raw["a"]),
            draining=bool(_int(raw["dr"])),
            donors=tuple(_str(m) for m in raw["do"]),
            deals=tuple(Deal(_str(m), _int(e), _int(n),
                             tuple((_str(h), _int(w)) for h, w in heirs))
                        for m, e, n, heirs in raw["de"]),
            statuses=tuple((_str(k), _int(v)) for k, v in raw["s"]),
            # A bulletin from a leader without a change feed has neither.
            feed=_int(raw.get("f", 0)),
            notices=tuple(Notice(_int(n), _str(m), _str(s), NoticeKind(_str(k)))
                          for n, m, s, k in raw.get("n", []) if k in NOTICE_KINDS),
            # A bulletin from a leader that names none: everyone campaigns at full pace.
            successor=None if raw.get("su") is None else _str(raw["su"]),
            # A bulletin from a leader of one key (or of an older release) names none.
            shards=max(1, _int(raw.get("k", 1))),
            # A bulletin from an older leader names none: hand-overs go to the leader.
            takers=tuple(Taker(_str(m), _int(e), _int(k), _int(n), _int(c))
                         for m, e, k, n, c in raw.get("tk", [])))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if len(news.notices) != len(raw.get("n", [])):
        # A notice of a kind this version does not know: not trusted to be complete.
        news = replace(news, feed=0)
    return news


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer: {value!r}")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"not a string: {value!r}")
    return value
