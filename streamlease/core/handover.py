"""Make before break: a live holder hands a stream straight to a named taker.

A graceful hand-off of the events table's output (a shutdown, a rebalance) runs as:

1. The holder picks a taker (``takers``: the member furthest below its share, as the
   leader offers orphans) and adds an offer, ``"<fence>:<why>:<stream_id>"``, to the
   taker's member row (``why``: ``s`` for a shutdown, ``r`` for a rebalance). It goes on
   delivering.
2. The taker's next heartbeat reads its row back and finds the offer. It reads the item,
   dials the upstream from ``last_seq + 1`` and completes the opening exchange, all while
   the holder still delivers.
3. The taker takes the lease with one conditional write naming the holder and its fence
   (``LeaseStore.take_handed``: fence + 1, the item as it now is). The events table takes
   each batch and its checkpoint in one transaction conditioned on the fence, so the
   item's ``last_seq`` is exactly what the holder delivered: the holder's next write is
   refused, and the taker drops what its connection replays up to ``last_seq`` and
   delivers the rest.
4. The holder sees its lease gone (a refused write, or a read of the item) and stops
   without a flush: what it still held is the taker's to deliver.

The stream is silent only for the take and the taker's first write. A taker that cannot
take it (full, stopping; for a rebalance, already at its share by its own live count, as
for an orphan: past it, it would only shed the stream again) says so on the item, in a
write conditioned on the holder's fence (``handover_declined``: ``"<fence>:<taker>"``),
which the holder reads within ``OFFER_CHECK_S``. Declined, or refused by the taker's row
(it is no longer that ACTIVE member), the holder offers the stream to the next peer with
room, up to ``OFFER_TAKERS`` peers (a rebalance: only peers below their share). When
none is left, a rebalance's holder keeps the stream and goes on delivering (nobody below
the share could take it: a release would only make it an orphan for a member at its
share); a shutdown's holder, or one whose offer was not taken in ``offer_wait_s``, drops
the offer: it flushes and releases as before (a clean release,
``core.lease.checkpoint_trusted``), and the stream is an orphan.

A feed that cannot replay loses at most what arrived between the holder's last accepted
write and the take, and the taker's gap record says so. A profile whose frames the worker
numbers itself (no ``seq`` of the upstream's) is never handed live: nothing would tell
the taker which of its frames the holder already delivered.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from streamlease.core.deal import preference
from streamlease.core.membership import MemberRecord, MemberStatus
from streamlease.core.notices import rooms_of

# What came of an offer (``streamlease_handovers_total{outcome}``): as the taker saw it,
# and ``not_taken`` as the holder saw it.
HANDOVER_OUTCOMES = (
    "taken",        # taken and served from the connection opened ahead
    "handed_back",  # taken, then handed back (this worker began to stop, or filled up)
    "moved_on",     # the item no longer named the offer's fence (released, taken)
    "no_room",      # this worker was full, stopping or not accepting
    "unservable",   # the item could not be served as written (its holder's problem too)
    "dial_failed",  # the upstream could not be dialled ahead
    "unreadable",   # the offer's text was not one
    "error",        # a store call failed (the holder releases as before)
    "declined",     # the holder's offer was declined by its taker (the next peer, or release)
    "refused",      # the taker's row refused the offer (no longer that ACTIVE member)
    "not_taken",    # the holder's offer was not acted on in time: it released instead
    "kept",         # the holder's rebalance every peer asked said no to: it kept the stream
)

# The holder reads the item this often while its offer is out, to stop as soon as the
# taker has it (a stream that delivers finds out sooner: its next write is refused).
OFFER_CHECK_S = 0.2
# An offer the taker has not acted on within this many member heartbeats (it reads its
# row back with each) plus the dial is dropped: the holder releases as before.
OFFER_WAIT_HEARTBEATS = 1.5
OFFER_DIAL_S = 1.0  # the dial ahead and the take, on top
# A holder whose taker's row refuses its offer (the peer is no longer that ACTIVE member)
# or whose taker declines offers the stream to the next peer with room, up to this many
# peers in all, before it releases the stream: its view of the fleet is a heartbeat old,
# and a peer draining at the same moment, or too busy to take more, is common in a
# rolling deploy. The holder delivers all along, so each further offer costs nothing
# downstream.
OFFER_TAKERS = 3


def offer_wait_s(member_heartbeat_s: float) -> float:
    """How long a holder waits for its taker before it releases instead."""
    return OFFER_WAIT_HEARTBEATS * member_heartbeat_s + OFFER_DIAL_S


@dataclass(frozen=True)
class Offer:
    stream_id: str
    fence: int  # the holder's: the take is conditioned on it
    rebalance: bool  # to even out the fleet (else the holder shuts down)

    @property
    def text(self) -> str:
        """The offer as the taker's member row holds it."""
        return f"{self.fence}:{'r' if self.rebalance else 's'}:{self.stream_id}"


def parse_offer(text: str) -> Offer | None:
    """An offer from its text; None for a text that is not one."""
    fence, why, stream_id = [*text.split(":", 2), "", ""][:3]
    if not stream_id or not (fence.isascii() and fence.isdigit()) or why not in ("r", "s"):
        return None
    return Offer(stream_id, int(fence), why == "r")


def declined_text(fence: int, taker: str) -> str:
    """A taker's no to an offer under ``fence``, as the item holds it."""
    return f"{fence}:{taker}"


def takers(streams: Sequence[str], members: Iterable[MemberRecord], me: str,
           level: int | None, dead: frozenset[str] = frozenset(),
           rebalance: bool = False) -> dict[str, str]:
    """Whom to hand each of ``streams`` to: the live, ACTIVE peers (not ``me``, not
    ``dead``) with room, the furthest below the fair-share ``level`` first (as
    ``core.notices.most_room``), each counted one stream fuller per stream given. Ties go
    by each stream's own order of the members (``core.deal.preference``), so holders
    handing streams over at once, from rows that do not show each other's hand-overs yet,
    mostly pick different takers. A ``rebalance`` goes only to peers below the share (one
    at its share declines it: it would only shed the stream again). Streams nobody has
    room for are left out: their holder releases them (a rebalance's holder keeps them)."""
    peers = [(m.worker_id, m.streams, m.capacity) for m in members
             if m.worker_id != me and m.worker_id not in dead
             and m.status is MemberStatus.ACTIVE]
    rooms = rooms_of(peers, level)
    chosen: dict[str, str] = {}
    for stream_id in streams:
        best = min(rooms.items(), default=None,
                   key=lambda kv: (-kv[1].to_share, -kv[1].to_capacity,
                                   preference(stream_id, kv[0])))
        if best is None or best[1].to_capacity <= 0 or (rebalance and best[1].to_share <= 0):
            break
        taker, room = best
        room.to_share, room.to_capacity = max(0, room.to_share - 1), room.to_capacity - 1
        chosen[stream_id] = taker
    return chosen


def further_taker(stream_id: str, members: Sequence[MemberRecord], me: str,
                  level: int | None, excluded: frozenset[str],
                  sent: Mapping[str, tuple[int, int]],
                  rebalance: bool = False) -> tuple[str | None, dict[str, tuple[int, int]]]:
    """The next peer to offer ``stream_id`` to when its taker could not take it (as
    ``takers``, none of ``excluded``), and ``sent`` as it is after that choice.

    ``sent`` holds, per peer, the heartbeat of its row as last read and how many streams
    were sent its way as a further taker since: each counts the peer one stream fuller
    until its row is read again (a new heartbeat: its count then holds what it took), so
    a drain whose first taker refused every stream spreads them over the others as
    ``takers`` spreads a drain, rather than piling them onto one peer."""
    counted = []
    for m in members:
        seen, extra = sent.get(m.worker_id, (m.heartbeat, 0))
        counted.append(replace(m, streams=m.streams + extra) if seen == m.heartbeat else m)
    chosen = takers([stream_id], counted, me, level, excluded, rebalance).get(stream_id)
    after = dict(sent)
    if chosen is not None:
        row = next(m for m in members if m.worker_id == chosen)
        seen, extra = sent.get(chosen, (row.heartbeat, 0))
        after[chosen] = (row.heartbeat, extra + 1 if seen == row.heartbeat else 1)
    return chosen, after
