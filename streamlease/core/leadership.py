"""Leader lease rules: when a candidate may take a named lease (pure).

A leader lease follows the same rules as a stream lease — a conditional acquire with a
time to live, renewals conditioned on owner and fence, resignation by zeroing the
expiry, a fence that moves on with every new leader, self-fencing on the holder's own
monotonic deadline — with one difference in how expiry is judged: like member liveness,
by observation. A candidate takes a held lease only once a read *sent* a time to live
after it first received the lease's current (owner, fence, heartbeat) still shows it
unchanged, on the candidate's own monotonic clock, and the acquire is conditioned on
exactly what it saw. The holder stops acting ``ttl - safety`` after its last proven
renewal. No wall clock of another machine decides, so a leader whose clock runs behind
is not deposed while it renews.

A resigned lease (expiry 0) or an absent one may be taken at once. Backends whose server
keeps the time to live itself (Redis ``PX``) show an expired lease as absent.

Fences never decrease (``next_fence``), even across the loss of a lease's record: each
acquisition also raises a high-water mark kept apart from the record, and a record that
is re-created starts above that mark, however far behind this machine's clock is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LeaderRecord:
    """A named lease as read. ``expires_at_ms`` is the holder's own clock (0: resigned):
    shown to people, used only to see a resignation."""

    name: str
    owner: str | None
    fence: int
    heartbeat: int = 0
    expires_at_ms: int = 0

    @property
    def resigned(self) -> bool:
        return self.owner is None or self.expires_at_ms == 0

    @property
    def key(self) -> tuple[str | None, int, int]:
        return self.owner, self.fence, self.heartbeat


@dataclass
class LeaderObserver:
    """A candidate's view of one named lease, fed one read at a time."""

    me: str
    ttl_s: float
    _key: tuple[str | None, int, int] | None = None
    _since: float = 0.0

    def may_take(self, record: LeaderRecord | None, sent_at: float, received_at: float) -> bool:
        """Whether this read proves the lease free: absent, resigned, or unchanged for a
        time to live since its current state was first received."""
        if record is None or record.resigned:
            self._key = None
            return True
        # Our own id on it (a restarted process) is waited out like anyone's: the holder
        # of that tenure may still be alive.
        if self._key != record.key:
            self._key, self._since = record.key, received_at
            return False
        return sent_at >= self._since + self.ttl_s


def initial_fence(now_wall_ms: int, high_water: int) -> int:
    """The first fence of a lease that has none (never held, or its record was lost):
    the current wall-clock millisecond, or one above ``high_water`` (the highest fence
    this lease has ever handed out, kept apart from its record) if that is higher. The
    wall clock keeps fences moving forward where nothing else is remembered (a fresh
    table, a Redis restart without persistence); the high-water mark makes sure a
    machine whose clock is behind the one that created the lost record can never take
    the fence back."""
    return max(1, now_wall_ms, high_water + 1)


def next_fence(current: int | None, high_water: int, now_wall_ms: int) -> int:
    """The fence an acquisition writes: one above the lease's own (``current``) and above
    the high-water mark (a record whose fence was set lower by hand, or restored on its
    own, does not hand a used fence out again); for a lease with no record,
    ``initial_fence``."""
    if current is None:
        return initial_fence(now_wall_ms, high_water)
    return max(current, high_water) + 1


def raised_fence_mark(high_water: int, fence: int) -> int:
    """The high-water mark after an acquisition hands out ``fence``: never lower."""
    return max(high_water, fence)
