"""Backoff and jittered intervals: every delay is drawn from an injected random.Random."""

from __future__ import annotations

import random

import pytest

from streamlease.core.backoff import RENEW_JITTER, Backoff, next_renewal


def test_each_renewal_is_due_an_interval_after_its_send_spread_afresh() -> None:
    rng = random.Random(3)
    dues = [next_renewal(100.0, 600.0, rng) - 100.0 for _ in range(200)]
    assert RENEW_JITTER == 0.1
    assert all(540.0 <= due <= 660.0 for due in dues)
    assert len(set(dues)) == len(dues)  # a fresh draw every time, never a fixed step
    # Spread over the whole band, centred on the interval (the renewal rate is unchanged).
    assert min(dues) < 550.0 and max(dues) > 650.0
    assert sum(dues) / len(dues) == pytest.approx(600.0, abs=10.0)


def test_holders_that_renewed_together_drift_apart() -> None:
    """Two streams acquired in the same instant (one mass acquisition, one rng) are not
    renewed in the same instant again: their schedules separate as they go."""
    rng = random.Random(11)
    a = b = 0.0
    gaps = []
    for _ in range(10):
        a, b = next_renewal(a, 5.0, rng), next_renewal(b, 5.0, rng)
        gaps.append(abs(a - b))
    assert all(gap > 0 for gap in gaps)
    assert max(gaps) > 0.5  # a tenth of an interval apart at some point


def test_backoff_doubles_to_its_cap_and_keeps_half_as_a_floor() -> None:
    retry = Backoff(0.1, 1.0, random.Random(5))
    delays = [retry.next_delay() for _ in range(8)]
    for n, delay in enumerate(delays):
        nominal = min(1.0, 0.1 * 2 ** n)
        assert nominal / 2 <= delay <= nominal
    retry.reset()
    assert retry.next_delay() <= 0.1
