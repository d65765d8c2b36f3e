"""The one keep-alive machine behind a stream's lease, a member's row and a leader lease:
plain numbers for the monotonic clock, a seeded random, no I/O."""

from __future__ import annotations

import random

import pytest

from streamlease.core.keepalive import (
    MIN_CALL_S,
    Keeper,
    KeepOutcome,
    KeepState,
    deadline_after,
    retry_delay,
)
from streamlease.core.lease import Holding, LeaseTimings, RenewOutcome, renew_label
from streamlease.core.membership import (
    HeartbeatOutcome,
    Liveness,
    MemberState,
    MemberTimings,
    heartbeat_label,
)
from streamlease.core.model import Tenure
from streamlease.metrics import MEMBER_HEARTBEAT_OUTCOMES, RENEW_OUTCOMES

T = MemberTimings(lease_s=10.0, heartbeat_s=2.0, safety_margin_s=1.0)
RENEWED, REFUSED = KeepOutcome.RENEWED, KeepOutcome.REFUSED
UNKNOWN, THROTTLED = KeepOutcome.UNKNOWN, KeepOutcome.THROTTLED


def rng() -> random.Random:
    return random.Random(5)


def test_the_deadline_counts_from_the_send_minus_the_safety_margin() -> None:
    assert deadline_after(100.0, T) == pytest.approx(109.0)
    k = Keeper.sent(100.0, T)
    assert k.deadline == pytest.approx(109.0)
    k.on_outcome(RENEWED, sent_at=104.0, now=104.5, rng=rng())
    # From the send, not the answer: the server may have applied it any time between.
    assert k.deadline == pytest.approx(113.0)


def test_the_deadline_only_moves_forward() -> None:
    k = Keeper.sent(100.0, T)
    k.on_outcome(RENEWED, sent_at=105.0, now=105.1, rng=rng())
    # A renewal sent before the one that already extended it, answered after it.
    k.on_outcome(RENEWED, sent_at=103.0, now=105.2, rng=rng())
    assert k.deadline == pytest.approx(114.0)
    for outcome in (UNKNOWN, THROTTLED):
        k.on_outcome(outcome, sent_at=106.0, now=106.1, rng=rng())
        assert k.deadline == pytest.approx(114.0)  # an unproven renewal moves nothing


def test_after_a_renewal_the_next_is_due_an_interval_after_it_was_sent_jittered() -> None:
    k = Keeper.sent(0.0, T)
    r = rng()
    sent, dues = 0.0, []
    for _ in range(20):
        delay = k.on_outcome(RENEWED, sent_at=sent, now=sent + 0.3, rng=r)
        dues.append(round(0.3 + delay, 9))
        sent += 0.3 + delay
    assert all(0.9 * T.heartbeat_s <= due <= 1.1 * T.heartbeat_s for due in dues), dues
    assert len(set(dues)) == len(dues)  # a fresh draw every time
    assert 0.9 * T.heartbeat_s <= k.first_in(r) <= 1.1 * T.heartbeat_s


def test_retries_back_off_from_a_quarter_interval_up_to_one() -> None:
    assert [retry_delay(n, UNKNOWN, 2.0) for n in range(1, 6)] == [0.5, 1.0, 2.0, 2.0, 2.0]
    k = Keeper.sent(0.0, MemberTimings(lease_s=100.0, heartbeat_s=2.0, safety_margin_s=1.0))
    delays = [k.on_outcome(UNKNOWN, sent_at=t, now=t, rng=rng()) for t in (1.0, 2.0, 3.0, 4.0)]
    assert delays == [0.5, 1.0, 2.0, 2.0]
    assert k.failures == 4
    k.on_outcome(RENEWED, sent_at=5.0, now=5.1, rng=rng())
    assert k.failures == 0
    assert k.on_outcome(UNKNOWN, sent_at=6.0, now=6.1, rng=rng()) == 0.5  # afresh


def test_a_throttled_renewal_backs_off_twice_as_long() -> None:
    for failures in (1, 2):
        assert retry_delay(failures, THROTTLED, 2.0) == 2 * retry_delay(failures, UNKNOWN, 2.0)
    assert retry_delay(5, THROTTLED, 2.0) == 2.0  # the same cap
    slow = MemberTimings(lease_s=100.0, heartbeat_s=2.0, safety_margin_s=1.0)
    unknown, throttled = Keeper.sent(0.0, slow), Keeper.sent(0.0, slow)
    assert throttled.on_outcome(THROTTLED, 1.0, 1.1, rng()) == \
        2 * unknown.on_outcome(UNKNOWN, 1.0, 1.1, rng())


@pytest.mark.parametrize("outcome", [UNKNOWN, THROTTLED])
@pytest.mark.parametrize("answer_s", [0.0, 0.1, 0.7])
def test_retries_leave_an_attempt_before_the_deadline_and_none_after_it(
        outcome: KeepOutcome, answer_s: float) -> None:
    """However the failures fall, attempts go on at most an interval apart and the last
    comes no later than the deadline, where the keeper fences itself."""
    k = Keeper.sent(0.0, T)
    attempts = [0.0]
    at = k.on_outcome(RENEWED, sent_at=0.0, now=answer_s, rng=rng()) + answer_s
    while not k.done:
        attempts.append(at)
        assert at <= k.deadline + 1e-9, "an attempt scheduled after the deadline"
        if k.check_deadline(at):
            break
        delay = k.on_outcome(outcome, sent_at=at, now=at + answer_s, rng=rng())
        assert delay <= T.heartbeat_s
        at += answer_s + delay
    assert k.state is KeepState.SELF_FENCED
    before = [a for a in attempts if a < k.deadline]
    assert len(before) >= 3
    assert k.deadline - before[-1] <= T.heartbeat_s + answer_s


def test_a_refusal_is_final() -> None:
    k = Keeper.sent(0.0, T, recovers=True)
    assert k.on_outcome(REFUSED, sent_at=2.0, now=2.1, rng=rng()) == 0.0
    assert k.state is KeepState.REFUSED and k.done and not k.may_write(2.2)
    assert k.on_outcome(RENEWED, sent_at=3.0, now=3.1, rng=rng()) == 0.0  # a late success
    assert k.state is KeepState.REFUSED and not k.may_write(3.2)
    assert not k.check_deadline(100.0) and k.state is KeepState.REFUSED


def test_it_fences_itself_at_the_deadline() -> None:
    k = Keeper.sent(0.0, T)
    assert k.may_write(8.999) and not k.check_deadline(8.999)
    assert not k.may_write(9.0)
    assert k.check_deadline(9.0) and k.state is KeepState.SELF_FENCED
    assert not k.check_deadline(9.5)  # once
    # A failure answered past the deadline fences too, and schedules nothing more.
    late = Keeper.sent(0.0, T)
    assert late.on_outcome(UNKNOWN, sent_at=8.5, now=9.2, rng=rng()) == 0.0
    assert late.state is KeepState.SELF_FENCED and late.done


def test_a_renewal_answered_after_its_own_deadline_proves_nothing_in_time() -> None:
    k = Keeper.sent(0.0, T)
    k.on_outcome(RENEWED, sent_at=1.0, now=10.5, rng=rng())  # answered 9.5 s later
    assert k.deadline == pytest.approx(10.0) and k.state is KeepState.SELF_FENCED


def test_a_keeper_that_recovers_is_alive_again_after_a_proven_renewal() -> None:
    """A member: nobody fenced it meanwhile (its epoch would have moved and the heartbeat
    been refused), so a heartbeat proven after its self-fence lets it write again."""
    k = Keeper.sent(0.0, T, recovers=True)
    assert k.check_deadline(9.0) and not k.done
    # While self-fenced it keeps trying, every interval at most, past the deadline.
    assert k.on_outcome(UNKNOWN, sent_at=9.0, now=9.1, rng=rng()) == 0.5
    assert k.call_timeout(9.2) == T.heartbeat_s
    assert k.on_outcome(RENEWED, sent_at=12.0, now=12.1, rng=rng()) > 0
    assert k.state is KeepState.KEEPING and k.may_write(12.2)
    assert k.deadline == pytest.approx(21.0)


def test_a_keeper_that_does_not_recover_ends_at_its_deadline() -> None:
    """A stream's tenure (or a leader's term): past the deadline someone else may hold it
    under a new fence; a late success changes nothing."""
    k = Keeper.sent(0.0, T)
    assert k.check_deadline(9.0) and k.done
    assert k.on_outcome(RENEWED, sent_at=12.0, now=12.1, rng=rng()) == 0.0
    assert k.state is KeepState.SELF_FENCED and k.deadline == pytest.approx(9.0)
    assert not k.may_write(12.2)


def test_a_renewal_call_never_outlives_the_deadline() -> None:
    k = Keeper.sent(0.0, T)
    assert k.call_timeout(1.0) == T.heartbeat_s
    assert k.call_timeout(1.0, limit_s=0.5) == 0.5
    assert k.call_timeout(8.0) == pytest.approx(1.0)
    assert k.call_timeout(8.999) == MIN_CALL_S  # a floor, not zero


def test_one_outcome_enum_under_every_old_name() -> None:
    assert RenewOutcome is KeepOutcome and HeartbeatOutcome is KeepOutcome
    assert KeepOutcome.LOST is KeepOutcome.REFUSED and KeepOutcome.FENCED is KeepOutcome.REFUSED
    assert list(KeepOutcome) == [RENEWED, REFUSED, UNKNOWN, THROTTLED]


def test_metric_labels_name_a_refusal_in_each_leases_words() -> None:
    """The counters' label values are an interface (alerts, dashboards): unchanged."""
    assert [renew_label(o) for o in KeepOutcome] == ["renewed", "lost", "unknown", "throttled"]
    assert [heartbeat_label(o) for o in KeepOutcome] == \
        ["renewed", "fenced", "unknown", "throttled"]
    assert tuple(renew_label(o) for o in KeepOutcome) == RENEW_OUTCOMES
    assert tuple(heartbeat_label(o) for o in KeepOutcome) == MEMBER_HEARTBEAT_OUTCOMES


SEQUENCE = [(RENEWED, 1.9, 2.0), (UNKNOWN, 4.0, 4.2), (THROTTLED, 4.7, 4.8),
            (UNKNOWN, 5.8, 6.5), (RENEWED, 7.5, 7.6), (UNKNOWN, 9.5, 9.6)]


def test_a_streams_holding_and_a_members_liveness_keep_by_the_same_arithmetic() -> None:
    stream = LeaseTimings(lease_s=10.0, heartbeat_s=2.0, skew_margin_s=0.5,
                          safety_margin_s=1.0)
    keeper = Keeper.sent(0.0, T)
    holding = Holding(Tenure("a", "w1", 1, 0, None), "wss://x/", 0.0, stream,
                      rng=random.Random(9))
    liveness = Liveness.registered(0.0, T)
    r_keeper, r_liveness = random.Random(9), random.Random(9)
    for outcome, sent, now in SEQUENCE:
        expected = keeper.on_outcome(outcome, sent, now, r_keeper)
        decision = holding.on_renew(outcome, sent, now, None)
        assert decision.next_in == pytest.approx(expected)
        assert liveness.on_heartbeat(outcome, sent, now, r_liveness) == pytest.approx(expected)
        assert holding.deadline == liveness.deadline == keeper.deadline
        assert liveness.state is MemberState.ACTIVE
    assert holding.call_timeout(10.0, 5.0) == liveness.call_timeout(10.0) == \
        keeper.call_timeout(10.0)
