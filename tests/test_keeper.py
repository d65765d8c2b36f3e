"""The keep-alive loop in virtual time, with scripted renewals: when it renews, what timeout
each call gets, and when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Callable

import pytest

from streamlease.core.keepalive import MIN_CALL_S, Keeper, KeepOutcome, KeepState
from streamlease.core.membership import MemberTimings
from streamlease.keeper import Answered, Step, keep
from tests.virtual import LoopClock

pytestmark = pytest.mark.virtual_time

T = MemberTimings(lease_s=10.0, heartbeat_s=2.0, safety_margin_s=1.0)
CLOCK = LoopClock()


class Store:
    """Answers renewals from ``answer(sent_at)`` after ``latency`` seconds (a call given
    less time than that ends UNKNOWN at its timeout), and records each call."""

    def __init__(self, answer: Callable[[float], KeepOutcome], latency: float = 0.1) -> None:
        self.answer = answer
        self.latency = latency
        self.calls: list[tuple[float, float]] = []  # (sent at, timeout)

    async def renew(self, timeout: float) -> Answered:
        sent = CLOCK.monotonic()
        self.calls.append((sent, timeout))
        if self.latency > timeout:
            await CLOCK.sleep(timeout)
            return Answered(KeepOutcome.UNKNOWN)
        await CLOCK.sleep(self.latency)
        return Answered(self.answer(sent))


async def test_renews_an_interval_apart_until_refused() -> None:
    start = CLOCK.monotonic()
    store = Store(lambda sent: KeepOutcome.REFUSED if sent - start > 7.0
                  else KeepOutcome.RENEWED)
    steps: list[Step[Answered]] = []
    keeper = Keeper.sent(start, T)
    ended = await keep(keeper, store.renew, CLOCK, random.Random(1), on_step=steps.append)
    assert ended is KeepState.REFUSED and keeper.done
    sent = [at for at, _ in store.calls]
    gaps = [b - a for a, b in itertools.pairwise([start, *sent])]
    assert len(sent) == 4 and all(0.9 * 2.0 <= g <= 1.1 * 2.0 for g in gaps), gaps
    assert [s.answer.outcome for s in steps if s.answer] == \
        [KeepOutcome.RENEWED] * 3 + [KeepOutcome.REFUSED]
    assert CLOCK.monotonic() == pytest.approx(sent[-1] + 0.1)  # gone at once


async def test_unanswered_renewals_self_fence_at_the_deadline_not_later() -> None:
    """The store hangs: every call waits out its timeout, none outlives the deadline, and
    the loop ends at the deadline itself."""
    store = Store(lambda sent: KeepOutcome.RENEWED, latency=1000.0)
    steps: list[Step[Answered]] = []
    keeper = Keeper.sent(CLOCK.monotonic(), T)
    deadline = keeper.deadline
    ended = await keep(keeper, store.renew, CLOCK, random.Random(1), on_step=steps.append)
    assert ended is KeepState.SELF_FENCED
    assert CLOCK.monotonic() == pytest.approx(deadline)
    assert len(store.calls) >= 3
    for sent, timeout in store.calls:
        assert timeout <= T.heartbeat_s and sent + timeout <= deadline + MIN_CALL_S
    assert steps[-1].self_fenced


async def test_a_recovering_keeper_keeps_trying_after_its_self_fence_and_comes_back() -> None:
    """A member cut off past its deadline stops writing, and writes again once a heartbeat
    is proven under the same epoch."""
    start = CLOCK.monotonic()
    store = Store(lambda sent: KeepOutcome.RENEWED if sent - start > 14.0
                  else KeepOutcome.THROTTLED)
    stop = asyncio.Event()
    steps: list[Step[Answered]] = []

    def seen(step: Step[Answered]) -> None:
        steps.append(step)
        if step.recovered:
            stop.set()

    async def wait(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await stop.wait()

    keeper = Keeper.sent(start, T, recovers=True)
    ended = await keep(keeper, store.renew, CLOCK, random.Random(1), wait=wait, stop=stop,
                       on_step=seen)
    assert ended is KeepState.KEEPING and keeper.may_write(CLOCK.monotonic())
    assert [s.self_fenced for s in steps].count(True) == 1
    fenced_at = next(s.now for s in steps if s.self_fenced)
    assert fenced_at == pytest.approx(start + 9.0, abs=1e-6)
    # Attempts went on past the deadline, an interval apart at most.
    after = [at for at, _ in store.calls if at >= fenced_at]
    assert len(after) >= 2
    assert all(b - a <= T.heartbeat_s + 0.1 + 1e-9 for a, b in itertools.pairwise(after))


async def test_an_unexpected_failure_is_the_callers() -> None:
    async def broken(timeout: float) -> Answered:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        await keep(Keeper.sent(CLOCK.monotonic(), T), broken, CLOCK, random.Random(1),
                   first_in=0.0)


async def test_no_wait_outlasts_the_deadline() -> None:
    """However late the next attempt is due, the loop wakes at the deadline to fence."""
    store = Store(lambda sent: KeepOutcome.RENEWED)
    keeper = Keeper.sent(CLOCK.monotonic(), T)
    ended = await keep(keeper, store.renew, CLOCK, random.Random(1), first_in=100.0)
    assert ended is KeepState.SELF_FENCED and store.calls == []
    assert CLOCK.monotonic() == pytest.approx(keeper.deadline)
