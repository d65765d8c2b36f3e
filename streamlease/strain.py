"""Whether the store is strained: the one judgement, fed with store calls as they end.

A call that went unanswered (its outcome unknown, or throttled) or took longer than
``slow_s`` says the store is strained, and it is judged strained for ``window_s`` after.
Each user feeds its own calls, with its own thresholds:

* admission control (``LeaseHealth``): stream renewals and member heartbeats; a worker
  takes no new streams while they are strained (overload must not feed itself);
* membership: its own heartbeats; it reads the fleet less often while they are strained;
* sink pacing (``streamlease.pacing``): each member heartbeat, judged on its own, halves
  or doubles the sink transactions in flight.

Imports only the clock and the pure core.
"""

from __future__ import annotations

from streamlease.clock import Clock
from streamlease.core.keepalive import KeepOutcome


class Strain:
    """Fed with call outcomes and durations: is the store strained now, and until when.
    ``clock`` is needed only for a window (a call-by-call judgement needs none)."""

    def __init__(self, clock: Clock | None, slow_s: float, window_s: float = 0.0) -> None:
        self.clock = clock
        self.slow_s = slow_s
        self.window_s = window_s
        self.until = float("-inf")  # monotonic: strained until then

    def record(self, outcome: KeepOutcome, seconds: float) -> bool:
        """A renewal or heartbeat; whether it says the store is strained."""
        return self.record_call(outcome not in (KeepOutcome.UNKNOWN, KeepOutcome.THROTTLED),
                                seconds)

    def record_call(self, answered: bool, seconds: float) -> bool:
        """A store call: unanswered or slow, it says the store is strained (for the
        window from now)."""
        strained = not answered or seconds > self.slow_s
        if strained and self.clock is not None:
            self.until = self.clock.monotonic() + self.window_s
        return strained

    def strained(self) -> bool:
        return self.clock is not None and self.clock.monotonic() < self.until


class LeaseHealth(Strain):
    """This worker's renewals and member heartbeats, for admission control: while they
    are strained, it takes no new streams."""

    def admits(self) -> bool:
        return not self.strained()
