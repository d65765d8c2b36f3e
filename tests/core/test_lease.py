"""The lease rules, table-driven, with an injected clock (plain numbers): no I/O."""

from __future__ import annotations

import pytest

from streamlease.core.lease import (
    CLEAN_RELEASE_AHEAD_MS,
    CLEAN_RELEASE_TRUST_MS,
    CleanRelease,
    HolderState,
    Holding,
    LeaseTimings,
    RenewOutcome,
    StopReason,
    can_acquire,
    can_renew,
    checkpoint_trusted,
    expiry_for,
    holds,
    local_deadline,
    next_fence,
    takeover_threshold_ms,
)
from streamlease.core.model import StreamRecord, Tenure

T = LeaseTimings(lease_s=20.0, heartbeat_s=5.0, skew_margin_s=1.0, safety_margin_s=2.0)
NOW = 1_000_000


def rec(**kw: object) -> StreamRecord:
    base: dict[str, object] = {"stream_id": "a", "desired_state": "STARTED", "ws_url": "wss://x/"}
    base.update(kw)
    return StreamRecord(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "record", "expected"), [
    ("no item (deleted)", None, False),
    ("hand-written, no lease fields", rec(), True),
    ("released (expiry 0)", rec(lease_owner="w1", lease_expires_at_ms=0, fence=3), True),
    ("live lease", rec(lease_owner="w1", lease_expires_at_ms=NOW + 5000, fence=1), False),
    ("expired but inside skew margin",
     rec(lease_owner="w1", lease_expires_at_ms=NOW - 999, fence=1), False),
    ("expired exactly at the margin",
     rec(lease_owner="w1", lease_expires_at_ms=NOW - 1000, fence=1), False),
    ("expired past the margin", rec(lease_owner="w1", lease_expires_at_ms=NOW - 1001, fence=1),
     True),
    ("STOPPED", rec(desired_state="STOPPED", lease_expires_at_ms=0), False),
    ("unknown state", rec(desired_state="PAUSED", lease_expires_at_ms=0), False),
])
def test_acquire_rule(name: str, record: StreamRecord | None, expected: bool) -> None:
    assert can_acquire(record, NOW, T) is expected, name


def test_threshold_and_expiry_use_the_margins() -> None:
    assert takeover_threshold_ms(NOW, T) == NOW - 1000
    assert expiry_for(NOW, T) == NOW + 20_000


@pytest.mark.parametrize(("name", "record", "owner", "fence", "expected"), [
    ("owner and fence match", rec(lease_owner="w1", fence=4), "w1", 4, True),
    ("other owner", rec(lease_owner="w2", fence=4), "w1", 4, False),
    ("old fence (force released or re-acquired)", rec(lease_owner="w1", fence=5), "w1", 4, False),
    ("deleted", None, "w1", 4, False),
])
def test_renew_release_and_sink_rule(name: str, record: StreamRecord | None, owner: str,
                                     fence: int, expected: bool) -> None:
    assert holds(record, owner, fence) is expected, name


def test_renew_also_refuses_a_released_lease() -> None:
    assert can_renew(rec(lease_owner="w1", fence=4, lease_expires_at_ms=NOW), "w1", 4)
    assert not can_renew(rec(lease_owner="w1", fence=4, lease_expires_at_ms=0), "w1", 4)
    assert not can_renew(rec(lease_owner="w1", fence=3, lease_expires_at_ms=NOW), "w1", 4)


def test_fence_increments_from_zero() -> None:
    assert next_fence(rec()) == 1
    assert next_fence(rec(fence=7)) == 8


def test_local_deadline_counts_from_send_time_minus_safety_margin() -> None:
    assert local_deadline(100.0, T) == pytest.approx(118.0)


@pytest.mark.parametrize(("name", "timings", "fragment"), [
    ("heartbeat at a third", LeaseTimings(9, 3, 1, 1), "STREAMLEASE_HEARTBEAT_SECONDS"),
    ("skew as long as lease", LeaseTimings(2, 0.5, 2, 0.2), "STREAMLEASE_SKEW_MARGIN_SECONDS"),
    ("safety too big", LeaseTimings(9, 1, 1, 3), "STREAMLEASE_SAFETY_MARGIN_SECONDS"),
    ("negative lease", LeaseTimings(-1, 1, 1, 1), "STREAMLEASE_LEASE_SECONDS"),
    ("zero margin", LeaseTimings(9, 1, 0, 1), "STREAMLEASE_SKEW_MARGIN_SECONDS"),
    ("nan heartbeat", LeaseTimings(9, float("nan"), 1, 1), "STREAMLEASE_HEARTBEAT_SECONDS"),
])
def test_timing_validation_names_the_setting(name: str, timings: LeaseTimings,
                                             fragment: str) -> None:
    problems = timings.problems()
    assert any(fragment in p for p in problems), (name, problems)


def test_timing_validation_collects_every_problem() -> None:
    problems = LeaseTimings(3, 2, 5, 4).problems()
    assert len(problems) == 3
    assert LeaseTimings(20, 5, 1, 2).problems() == []
    assert LeaseTimings(0.6, 0.15, 0.2, 0.1).problems() == []


def make_holding(sent_at: float = 100.0) -> Holding:
    tenure = Tenure("a", "w1", 3, 10, NOW + 20_000)
    return Holding(tenure, "wss://x/", sent_at, T)


def test_holder_may_write_until_its_deadline_only() -> None:
    h = make_holding(100.0)
    assert h.may_write(117.9)
    assert not h.may_write(118.0)


def test_renewal_moves_the_deadline_forward_never_back() -> None:
    h = make_holding(100.0)
    h.on_renew(RenewOutcome.RENEWED, 105.0, 105.1, rec(lease_owner="w1", fence=3))
    assert h.deadline == pytest.approx(123.0)
    h.on_renew(RenewOutcome.RENEWED, 104.0, 106.0, rec(lease_owner="w1", fence=3))
    assert h.deadline == pytest.approx(123.0)


def test_lost_stops_at_once_and_is_terminal() -> None:
    h = make_holding()
    d = h.on_renew(RenewOutcome.LOST, 105.0, 105.1, None)
    assert d.state is HolderState.LOST and d.reason is StopReason.CONDITION_FAILED
    assert not h.may_write(105.2)
    d = h.on_renew(RenewOutcome.RENEWED, 106.0, 106.1, rec(lease_owner="w1", fence=3))
    assert d.state is HolderState.LOST  # a late success never resurrects the tenure


def test_unknown_retries_sooner_then_self_fences_at_the_deadline() -> None:
    h = make_holding(100.0)
    d1 = h.on_renew(RenewOutcome.UNKNOWN, 105.0, 105.5, None)
    d2 = h.on_renew(RenewOutcome.UNKNOWN, 106.0, 106.5, None)
    assert d1.state is HolderState.HOLDING and d1.retry_in is not None
    assert d2.retry_in is not None and d2.retry_in > d1.retry_in  # backs off
    assert h.may_write(117.0)
    d3 = h.on_renew(RenewOutcome.THROTTLED, 117.5, 118.2, None)
    assert d3.state is HolderState.SELF_FENCED and d3.reason is StopReason.DEADLINE
    assert not h.may_write(118.2)


def test_retry_never_sleeps_past_the_deadline() -> None:
    h = make_holding(100.0)
    d = h.on_renew(RenewOutcome.THROTTLED, 117.0, 117.9, None)
    assert d.retry_in is not None and 117.9 + d.retry_in <= h.deadline + 1e-9


def test_a_renew_answered_after_the_deadline_still_self_fences() -> None:
    # Sent late (after a pause), answered OK: the new deadline counts from the send time,
    # which is past the old one, so writing is allowed again only from the new tenure time.
    h = make_holding(100.0)
    d = h.on_renew(RenewOutcome.RENEWED, 99.0, 119.0, rec(lease_owner="w1", fence=3))
    assert d.state is HolderState.SELF_FENCED


@pytest.mark.parametrize(("name", "record", "problem", "state", "reason", "reconnect"), [
    ("stopped", rec(desired_state="STOPPED"), None, HolderState.DRAINING, StopReason.STOPPED,
     False),
    ("url changed", rec(ws_url="wss://y/"), None, HolderState.HOLDING, None, True),
    ("url disallowed", rec(ws_url="ws://evil/"), "not allowed", HolderState.DRAINING,
     StopReason.BAD_ITEM, False),
    ("unknown state", rec(desired_state="???"), None, HolderState.DRAINING, StopReason.BAD_ITEM,
     False),
    ("unchanged", rec(), None, HolderState.HOLDING, None, False),
])
def test_the_renewed_item_drives_the_holder(name: str, record: StreamRecord, problem: str | None,
                                            state: HolderState, reason: StopReason | None,
                                            reconnect: bool) -> None:
    h = make_holding(100.0)
    d = h.on_renew(RenewOutcome.RENEWED, 105.0, 105.1, record, problem)
    assert (d.state, d.reason, d.reconnect) == (state, reason, reconnect), name


def test_stale_write_is_terminal() -> None:
    h = make_holding()
    h.begin_drain(StopReason.SHUTDOWN)
    assert h.may_write(101.0)  # draining still flushes
    h.on_stale_write()
    assert h.state is HolderState.LOST and h.reason is StopReason.STALE_FENCE
    assert not h.may_write(101.0)


@pytest.mark.parametrize(("mark", "fence", "last_seq", "now", "trusted"), [
    (CleanRelease(4, 120, NOW), 5, 120, NOW + 800, True),  # a hand-off, taken at once
    (CleanRelease(4, 0, NOW), 5, None, NOW, True),  # nothing delivered yet
    (None, 5, 120, NOW, False),  # no mark: an unclean end (kill -9, lost, error)
    (CleanRelease(3, 120, NOW), 5, 120, NOW, False),  # a tenure came between (fence moved)
    (CleanRelease(4, 120, NOW), 5, 90, NOW, False),  # last_seq rewritten by hand
    (CleanRelease(4, 120, NOW), 6, 120, NOW, False),  # fence rewritten by hand
    (CleanRelease(4, 120, NOW), 5, 120, NOW + CLEAN_RELEASE_TRUST_MS + 1, False),  # old
    (CleanRelease(4, 120, NOW), 5, 120, NOW - 2_000, True),  # the releaser's clock 2 s ahead
    (CleanRelease(4, 120, NOW), 5, 120, NOW - CLEAN_RELEASE_AHEAD_MS - 1, False),  # far ahead
])
def test_a_checkpoint_is_trusted_only_right_after_a_clean_release_under_the_fence_before(
        mark: CleanRelease | None, fence: int, last_seq: int | None, now: int,
        trusted: bool) -> None:
    tenure = Tenure("a", "w2", fence, last_seq, NOW + 20_000)
    assert checkpoint_trusted(tenure, mark, now) is trusted
