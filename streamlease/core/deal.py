"""Dealing a dead member's streams across the survivors, with no coordinator.

When a member is fenced, every survivor reads the same dead row and the same member rows,
and each computes the same deal: every stream goes to one survivor, chosen by weighted
rendezvous hashing (highest random weight), with weights from how far each survivor is
below its fair share. A survivor then takes its part directly — one conditional write
per stream, from the dead incarnation to itself — instead of the streams being released
and raced for through the orphan index.

Survivors whose rows differ slightly (a count a heartbeat old) may disagree about a few
streams: one of them is dealt to two survivors (the conditional write lets one win) or
to none (the fencer releases whatever is still leased to the dead incarnation once the
deal has had its time, and it is acquired as an orphan). Neither costs safety; the
balance planner evens out what the weights did not.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

from streamlease.core.membership import fair_shares

# Each take-over moves the orphan index's STARTED key (a delete and a put); that key takes
# about 1,000 writes/s, and the survivors together use half of it.
TAKEOVERS_PER_S = 250.0


def deal_window_s(read_interval_s: float, second_look_s: float, streams: int) -> float:
    """How long survivors have to take a fenced member's ``streams`` straight over before
    its fencer releases what is left: two member-row reads (every survivor has seen the
    DEAD row), the take-overs at the fleet's pace, and the second look at the lagging
    owner index."""
    return 2 * read_interval_s + streams / TAKEOVERS_PER_S + second_look_s


def _unit(stream_id: str, member: str) -> float:
    """A uniform number in (0, 1), the same on every machine for this pair."""
    digest = hashlib.blake2b(f"{stream_id}\x00{member}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 1) / (2**64 + 2)


def preference(stream_id: str, member: str) -> float:
    """How much ``member`` wants ``stream_id`` among streams dealt to nobody it knows of:
    an order of each member's own, so members looking at the same leftovers at once mostly
    reach for different ones."""
    return _unit(stream_id, member)


def deal(stream_ids: Iterable[str], weights: dict[str, int]) -> dict[str, str]:
    """Each stream's taker: the member with the highest ``weight / -ln(u)`` for it.

    A member's expected part is proportional to its weight; members with weight 0 get
    nothing (empty result if nobody has a positive weight). Adding or removing a member
    moves only the streams it wins or won.
    """
    members = sorted((m, w) for m, w in weights.items() if w > 0)
    if not members:
        return {}
    dealt: dict[str, str] = {}
    for stream_id in stream_ids:
        best = max(members, key=lambda mw: mw[1] / -math.log(_unit(stream_id, mw[0])))
        dealt[stream_id] = best[0]
    return dealt


def deal_weights(counts: dict[str, int], capacities: dict[str, int], dead_streams: int) -> dict[
        str, int]:
    """Each survivor's weight for a deal: how far below its fair share it would be once the
    dead member's ``dead_streams`` are placed, plus one (so a balanced fleet splits evenly),
    never for more than the room its capacity leaves. ``counts`` and ``capacities`` name
    the survivors that take streams (ACTIVE, not dead)."""
    total = sum(counts.values()) + dead_streams
    shares = fair_shares(total, capacities)
    weights = {}
    for member, held in counts.items():
        room = capacities.get(member, 0) - held
        weights[member] = 0 if room <= 0 else min(room, max(0, shares[member] - held) + 1)
    return weights
