"""Membership rules: death by observation on the observer's own clock, and a member's
own deadline, which always comes before any peer may declare it dead."""

from __future__ import annotations

import pytest

from streamlease.core.membership import (
    HeartbeatOutcome,
    Liveness,
    MemberRecord,
    MemberState,
    MemberStatus,
    MemberTimings,
    Observer,
)

T = MemberTimings(lease_s=10.0, heartbeat_s=2.0, safety_margin_s=1.0)


def member(hb: int, epoch: int = 1, status: MemberStatus = MemberStatus.ACTIVE,
           wid: str = "b", wall_ms: int | None = None) -> MemberRecord:
    return MemberRecord(wid, epoch, hb, status, heartbeat_at_ms=wall_ms)


def test_a_member_is_dead_only_after_a_lease_unchanged_on_the_observers_clock() -> None:
    obs = Observer("a", T.lease_s)
    assert obs.observe([member(5)], sent_at=0.0, received_at=0.1) == []
    # Unchanged, but the read was sent less than a lease after the counter was received.
    assert obs.observe([member(5)], sent_at=10.05, received_at=10.2) == []
    assert obs.observe([member(5)], sent_at=10.1, received_at=10.3) == [member(5)]


def test_any_change_restarts_the_count_and_skew_in_their_stamps_is_ignored() -> None:
    obs = Observer("a", T.lease_s)
    # The member's own wall clock says it is an hour behind: irrelevant.
    obs.observe([member(5, wall_ms=0)], 0.0, 0.0)
    assert obs.observe([member(6, wall_ms=0)], 9.0, 9.0) == []  # counter moved
    assert obs.observe([member(6, wall_ms=0)], 18.9, 19.0) == []
    assert obs.observe([member(0, epoch=2)], 19.5, 19.5) == []  # re-registered: new key
    assert obs.observe([member(0, epoch=2)], 29.4, 29.5) == []
    assert obs.observe([member(0, epoch=2)], 29.5, 29.6) != []


@pytest.mark.parametrize("status", [MemberStatus.DEAD])
def test_dead_rows_and_oneself_are_never_declared(status: MemberStatus) -> None:
    obs = Observer("a", T.lease_s)
    rows = [member(1, status=status), member(1, wid="a")]
    obs.observe(rows, 0.0, 0.0)
    assert obs.observe(rows, 100.0, 100.0) == []


def test_a_member_stops_before_any_peer_may_declare_it_dead() -> None:
    # The member sends heartbeat n at t=3.0; the server applies it by t=3.2, when a peer
    # happens to read it and first receives it. The member's last proof is that heartbeat.
    live = Liveness.registered(0.0, T)
    live.on_heartbeat(HeartbeatOutcome.RENEWED, sent_at=3.0, now=3.2)
    member_stops_at = live.deadline
    obs = Observer("peer", T.lease_s)
    obs.observe([member(7)], sent_at=3.0, received_at=3.2)
    earliest_declared = 3.2 + T.lease_s  # a read sent no earlier than this
    assert member_stops_at == pytest.approx(3.0 + T.lease_s - T.safety_margin_s)
    assert member_stops_at < earliest_declared
    assert not live.may_write(member_stops_at)
    assert live.check_deadline(member_stops_at) and live.state is MemberState.SELF_FENCED


def test_failed_heartbeats_retry_sooner_and_never_past_the_deadline() -> None:
    live = Liveness.registered(0.0, T)
    delays = []
    now = 2.0
    while live.state is MemberState.ACTIVE:
        delay = live.on_heartbeat(HeartbeatOutcome.UNKNOWN, sent_at=now, now=now + 0.1)
        delays.append(delay)
        now += 0.1 + delay
        assert now <= live.deadline + 1e-9 or live.state is MemberState.SELF_FENCED
    assert delays[0] == pytest.approx(T.heartbeat_s / 4)
    assert delays[1] > delays[0]
    assert live.state is MemberState.SELF_FENCED


def test_a_proven_heartbeat_after_a_self_fence_revives_a_member_nobody_fenced() -> None:
    live = Liveness.registered(0.0, T)
    assert live.check_deadline(T.lease_s)
    live.on_heartbeat(HeartbeatOutcome.RENEWED, sent_at=12.0, now=12.1)
    assert live.state is MemberState.ACTIVE and live.may_write(12.2)


def test_a_fenced_member_stays_fenced() -> None:
    live = Liveness.registered(0.0, T)
    assert live.on_heartbeat(HeartbeatOutcome.FENCED, 2.0, 2.1) == 0.0
    assert live.state is MemberState.FENCED and not live.may_write(2.2)
    live.on_heartbeat(HeartbeatOutcome.RENEWED, 3.0, 3.1)
    assert live.state is MemberState.FENCED


def test_nothing_is_proven_before_registration() -> None:
    assert not Liveness(T, deadline=float("-inf")).may_write(0.0)
