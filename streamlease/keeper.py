"""The loop that keeps a lease alive, around the pure ``Keeper``
(``streamlease.core.keepalive``): wait until the next attempt is due, self-fence if the
deadline passed, renew with a timeout that does not outlive the deadline, let the keeper
decide, repeat. The member heartbeat and every leader lease run on it.

A stream's lease keeps its own loop (``streamlease.heartbeat``) on the same ``Keeper``: it
interleaves consistent reads of the item, index hints and the drain with its renewals.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from streamlease.clock import Clock
from streamlease.core.keepalive import Keeper, KeepOutcome, KeepState


class Answer(Protocol):
    """What a renewal returns: its outcome, and whatever else the caller wants to see."""

    @property
    def outcome(self) -> KeepOutcome: ...


A = TypeVar("A", bound=Answer)


@dataclass(frozen=True)
class Answered:
    """A renewal's answer that is its outcome alone."""

    outcome: KeepOutcome


@dataclass(frozen=True)
class Step(Generic[A]):
    """One round of the loop, after the keeper applied it: a renewal (``answer``), or the
    deadline found passed before one (``answer`` None)."""

    answer: A | None
    sent_at: float  # when the renewal was sent (when the deadline was found passed)
    now: float  # when it was answered
    delay: float  # until the next attempt
    before: KeepState
    after: KeepState

    @property
    def self_fenced(self) -> bool:
        return self.before is KeepState.KEEPING and self.after is KeepState.SELF_FENCED

    @property
    def recovered(self) -> bool:
        return self.before is KeepState.SELF_FENCED and self.after is KeepState.KEEPING


def _ignore(step: Step[A]) -> None:
    return None


async def keep(keeper: Keeper, renew: Callable[[float], Awaitable[A]], clock: Clock,
               rng: random.Random, *, first_in: float | None = None,
               wait: Callable[[float], Awaitable[None]] | None = None,
               stop: asyncio.Event | None = None,
               on_step: Callable[[Step[A]], None] = _ignore) -> KeepState:
    """Keep ``keeper``'s lease until it is ``done`` (refused, or self-fenced for good), or
    ``stop`` is set; the keeper's state then.

    ``renew(timeout)`` makes one renewal and returns its answer (a failure to reach the
    store is an outcome, UNKNOWN or THROTTLED, not an exception: an exception ends the loop
    and is the caller's). The first attempt is due ``first_in`` seconds from now (default: a
    jittered interval), each later one when the keeper says; while keeping, no wait
    outlasts the deadline. ``wait(seconds)`` waits (default: the clock's sleep; pass one
    that wakes early on ``stop`` or on a request for an early renewal). ``on_step`` hears
    every renewal and every self-fence, after the keeper applied it.
    """
    delay = keeper.first_in(rng) if first_in is None else first_in
    sleep = wait or clock.sleep
    while True:
        if keeper.state is KeepState.KEEPING:
            delay = min(delay, max(0.0, keeper.deadline - clock.monotonic()))
        await sleep(delay)
        if stop is not None and stop.is_set():
            return keeper.state
        now = clock.monotonic()
        before = keeper.state
        if keeper.check_deadline(now):
            on_step(Step(None, now, now, 0.0, before, keeper.state))
        if keeper.done:
            return keeper.state
        sent = clock.monotonic()
        answer = await renew(keeper.call_timeout(sent))
        now = clock.monotonic()
        before = keeper.state
        delay = keeper.on_outcome(answer.outcome, sent, now, rng)
        on_step(Step(answer, sent, now, delay, before, keeper.state))
        if keeper.done:
            return keeper.state
