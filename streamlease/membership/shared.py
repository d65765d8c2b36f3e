"""What the roles of a membership share: its settings, the hooks into the rest of the
worker, the fleet as this worker knows it, and the parts every role is built with."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

from streamlease.clock import Clock
from streamlease.core.bulletin import Bulletin
from streamlease.core.layout import MEMBERS_PER_KEY
from streamlease.core.membership import HeartbeatOutcome, MemberRecord, MemberStatus, MemberTimings
from streamlease.core.notices import Notice
from streamlease.metrics import Metrics
from streamlease.store.protocols import FleetStore


@dataclass(frozen=True)
class MembershipSettings:
    me: str
    capacity: int
    timings: MemberTimings
    # "leader": read the leader's bulletin when there is one; "all": read every row
    fleet_view: str = "leader"
    # members per key before the leader spreads the rows (``core.layout``)
    members_per_key: int = MEMBERS_PER_KEY


@dataclass
class Hooks:
    """What membership asks of the rest of the worker."""

    held: Callable[[], int]  # streams held now (reported in the row)
    fenced: Callable[[], None]  # our epoch moved on: stop every stream now, no release
    self_fenced: Callable[[], None]  # no heartbeat proven in time: stop writing
    fleet_changed: Callable[[], None]  # a peer died, released, drained or handed off
    proven: Callable[[float], None] = lambda at: None  # a heartbeat sent at ``at`` landed
    # every heartbeat's outcome and latency (admission control, sink pacing)
    beat: Callable[[HeartbeatOutcome, float], None] = lambda outcome, seconds: None
    leading: Callable[[], bool] = lambda: True  # dead rows are deleted by the leader only
    leader: Callable[[], str | None] = lambda: None  # the fleet leader, as last seen
    leader_fence: Callable[[], int] = lambda: 0  # this leader's lease fence (replicas)
    orphans: Callable[[], int] = lambda: 0  # servable orphans, as this worker last saw them
    # the leader's notice for this worker (streamlease.core.notices)
    notice: Callable[[Notice], None] = lambda notice: None
    # the leader's notices are trusted again after a gap: poll once for what they missed
    feed_resumed: Callable[[], None] = lambda: None
    # the offers in this worker's row, read back by each heartbeat (``core.handover``)
    offers: Callable[[frozenset[str]], None] = lambda offers: None


@dataclass(frozen=True)
class FleetView:
    """The members as last read, with what this worker observed about them."""

    members: tuple[MemberRecord, ...] = ()
    observed_dead: frozenset[str] = frozenset()

    def active(self) -> list[MemberRecord]:
        """Members taking streams: ACTIVE and not observed dead."""
        return [m for m in self.members
                if m.status is MemberStatus.ACTIVE and m.worker_id not in self.observed_dead]

    def live(self) -> list[MemberRecord]:
        return [m for m in self.members
                if m.live_status and m.worker_id not in self.observed_dead]

    def draining(self) -> bool:
        return any(m.status is MemberStatus.DRAINING for m in self.live())


class FleetKnowledge:
    """What this worker knows of the fleet, for the reconciler and the take-over: the
    leader's bulletin while it reads only the leader's row, else every row it read. The
    observer keeps it; the bulletin this leader composes and the deal update it too."""

    def __init__(self) -> None:
        self.view = FleetView()
        # The bulletin this worker plans from: the leader's (read from its row, or composed
        # here while leading); None while it plans from every row it read.
        self.bulletin: Bulletin | None = None
        self.reading_all = True  # the last observation read every row
        self.shards = 1  # the member layout as last read (``core.layout``)

    def draining_seen(self) -> bool:
        """Someone is handing streams over (the bulletin says so, or the rows do)."""
        if self.bulletin is not None and not self.reading_all:
            return self.bulletin.draining
        return self.view.draining()

    def peers(self) -> tuple[MemberRecord, ...]:
        """The members a hand-over may name as its taker: every row read; or, while this
        worker reads only the leader's row, that row and the bulletin's takers (the
        members with the most room), each standing at the leader row's heartbeat."""
        if self.bulletin is None or self.reading_all or not self.view.members:
            return self.view.members
        leader = self.view.members[0]
        named = {m.worker_id for m in self.view.members}
        return self.view.members + tuple(t.row(leader.heartbeat) for t in self.bulletin.takers
                                         if t.member not in named)

    def deals(self) -> list[tuple[MemberRecord, dict[str, int] | None]]:
        """Fenced members whose streams are being dealt: each DEAD row (or the bulletin's
        deal) with the survivors' weights, None where the survivor computes them itself
        from every row it read."""
        if self.bulletin is not None:
            return [(d.dead_row(), d.weights()) for d in self.bulletin.deals]
        return [(row, None) for row in self.view.members
                if row.status is MemberStatus.DEAD and not row.released]

    def feed_live(self) -> bool:
        """The leader's change feed tells this worker of every change to its streams
        (``streamlease.feed``): the polls it replaces may rest."""
        return False

    def survivors(self, dead: str) -> int:
        """Members taking streams besides ``dead``, as this worker knows them."""
        if self.bulletin is not None and not self.reading_all:
            return max(1, self.bulletin.active)
        return max(1, len([m for m in self.view.active() if m.worker_id != dead]))


@dataclass(frozen=True)
class Parts:
    """What every role of one membership is built with. ``stop`` ends every loop."""

    fleet: FleetStore
    clock: Clock
    metrics: Metrics
    settings: MembershipSettings
    hooks: Hooks
    rng: random.Random
    known: FleetKnowledge
    stop: asyncio.Event

    @property
    def me(self) -> str:
        return self.settings.me

    @property
    def timings(self) -> MemberTimings:
        return self.settings.timings
