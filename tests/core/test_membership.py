"""Membership rules: death by observation on the observer's own clock, and a member's
own deadline, which always comes before any peer may declare it dead."""

from __future__ import annotations

import random

import pytest

from streamlease.core.membership import (
    FenceCause,
    HeartbeatOutcome,
    Liveness,
    MemberRecord,
    MemberState,
    MemberStatus,
    MemberTimings,
    Observer,
    fence_cause,
    next_epoch,
    raised_high_water,
    releasable_for,
)

T = MemberTimings(lease_s=10.0, heartbeat_s=2.0, safety_margin_s=1.0)
RNG = random.Random(0)


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
    live.on_heartbeat(HeartbeatOutcome.RENEWED, sent_at=3.0, now=3.2, rng=RNG)
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
        delay = live.on_heartbeat(HeartbeatOutcome.UNKNOWN, sent_at=now, now=now + 0.1,
                                  rng=RNG)
        delays.append(delay)
        now += 0.1 + delay
        assert now <= live.deadline + 1e-9 or live.state is MemberState.SELF_FENCED
    assert delays[0] == pytest.approx(T.heartbeat_s / 4)
    assert delays[1] > delays[0]
    assert live.state is MemberState.SELF_FENCED


def test_each_heartbeat_is_due_an_interval_after_it_was_sent_spread_afresh() -> None:
    """Members that beat together (a fleet started at once) drift apart: every delay is
    a fresh draw within +/-10 % of the interval, measured from when the beat was sent."""
    live = Liveness.registered(0.0, T)
    rng = random.Random(7)
    sent, dues = 0.0, []
    for _ in range(20):
        delay = live.on_heartbeat(HeartbeatOutcome.RENEWED, sent_at=sent, now=sent + 0.3,
                                  rng=rng)
        dues.append(round(0.3 + delay, 9))  # from send to the next send
        sent += 0.3 + delay
    assert all(0.9 * T.heartbeat_s <= due <= 1.1 * T.heartbeat_s for due in dues), dues
    assert len(set(dues)) == len(dues), dues  # never the same interval twice
    assert live.state is MemberState.ACTIVE


def test_a_proven_heartbeat_after_a_self_fence_revives_a_member_nobody_fenced() -> None:
    live = Liveness.registered(0.0, T)
    assert live.check_deadline(T.lease_s)
    live.on_heartbeat(HeartbeatOutcome.RENEWED, sent_at=12.0, now=12.1, rng=RNG)
    assert live.state is MemberState.ACTIVE and live.may_write(12.2)


def test_a_fenced_member_stays_fenced() -> None:
    live = Liveness.registered(0.0, T)
    assert live.on_heartbeat(HeartbeatOutcome.FENCED, 2.0, 2.1, RNG) == 0.0
    assert live.state is MemberState.FENCED and not live.may_write(2.2)
    live.on_heartbeat(HeartbeatOutcome.RENEWED, 3.0, 3.1, RNG)
    assert live.state is MemberState.FENCED


def test_nothing_is_proven_before_registration() -> None:
    assert not Liveness(T, deadline=float("-inf")).may_write(0.0)


WALL = 1_800_000_000_000


@pytest.mark.parametrize(("current", "high_water", "wall_ms", "expected"), [
    pytest.param(None, 0, WALL, WALL + 1, id="fresh table: above the wall clock"),
    pytest.param(41, 0, WALL, 42, id="existing row: one up, whatever the clock"),
    pytest.param(WALL + 5_000, 0, WALL, WALL + 5_001, id="existing row ahead of the clock"),
    pytest.param(None, WALL + 60_000, WALL, WALL + 60_001,
                 id="deleted row, clock a minute behind: above the high-water mark"),
    pytest.param(None, WALL - 60_000, WALL, WALL + 1, id="high-water mark behind the clock"),
    pytest.param(None, WALL, WALL, WALL + 1, id="mark equal to the clock"),
    pytest.param(None, 0, 0, 1, id="clock at the epoch"),
])
def test_next_epoch(current: int | None, high_water: int, wall_ms: int, expected: int) -> None:
    assert next_epoch(current, high_water, wall_ms) == expected


@pytest.mark.parametrize(("high_water", "deleted", "expected"), [
    pytest.param(0, 7, 7, id="first deletion"),
    pytest.param(9, 7, 9, id="an older epoch never lowers it"),
    pytest.param(9, 9, 9, id="equal"),
    pytest.param(9, 12, 12, id="raised"),
])
def test_the_high_water_mark_never_goes_down(high_water: int, deleted: int,
                                              expected: int) -> None:
    assert raised_high_water(high_water, deleted) == expected


def test_epochs_never_decrease_across_deletions_whatever_the_clocks() -> None:
    """Register, fence, delete and re-create one id many times from machines whose clocks
    jump back and forth by minutes: every epoch is above every earlier one."""
    high_water, row, seen = 0, None, 0
    clocks = [WALL, WALL - 300_000, WALL + 120_000, WALL - 900_000, WALL + 1, WALL - 1]
    for step, clock in enumerate(clocks * 3):
        row = next_epoch(row, high_water, clock)
        assert row > seen
        seen = row
        if step % 2:  # a peer fences it, then it leaves (or the leader forgets it)
            row += 1
            seen = row
            high_water = raised_high_water(high_water, row)
            row = None


ME = "inc-me"


@pytest.mark.parametrize(("row", "expected"), [
    pytest.param(None, FenceCause.GONE, id="row deleted: register again"),
    pytest.param(MemberRecord("a", 5, 0, MemberStatus.DEAD, incarnation=ME, fenced_by="b"),
                 FenceCause.PEER, id="a peer fenced it"),
    pytest.param(MemberRecord("a", 5, 0, MemberStatus.DEAD, incarnation="other"),
                 FenceCause.PEER, id="DEAD whoever registered it: a peer's fence"),
    pytest.param(MemberRecord("a", 5, 0, MemberStatus.ACTIVE, incarnation=ME),
                 FenceCause.OWN, id="its own registration (an answer lost)"),
    pytest.param(MemberRecord("a", 5, 3, MemberStatus.ACTIVE, incarnation="other"),
                 FenceCause.DUPLICATE, id="another process registered the id"),
    pytest.param(MemberRecord("a", 5, 0, MemberStatus.DRAINING, incarnation="other"),
                 FenceCause.DUPLICATE, id="another process, registered while draining"),
    pytest.param(MemberRecord("a", 5, 0, MemberStatus.ACTIVE),
                 FenceCause.DUPLICATE, id="registered by a version without nonces"),
])
def test_fence_cause(row: MemberRecord | None, expected: FenceCause) -> None:
    assert fence_cause(row, ME) is expected


@pytest.mark.parametrize(("owner", "expires", "fence", "lease_epoch", "expected"), [
    pytest.param("a", WALL, 3, 4, True, id="leased to an older incarnation"),
    pytest.param("a", WALL, 3, None, True, id="leased, taken before epochs were stamped"),
    pytest.param("a", 1, 3, 4, True, id="expired but not released: the write applies"),
    pytest.param("a", 0, 3, 4, False, id="released (expiry 0)"),
    pytest.param("b", WALL, 3, 1, False, id="moved on to another owner"),
    pytest.param("a", WALL, 3, 5, False, id="taken by the fenced (or a newer) incarnation"),
    pytest.param("a", WALL, 3, 9, False, id="taken by a newer incarnation"),
    pytest.param(None, WALL, 3, 1, False, id="no owner"),
    pytest.param("a", None, 3, 1, False, id="no lease fields"),
    pytest.param("a", WALL, None, 1, False, id="no fence"),
])
def test_releasable_for(owner: str | None, expires: int | None, fence: int | None,
                        lease_epoch: int | None, expected: bool) -> None:
    assert releasable_for("a", 5, owner, expires, fence, lease_epoch) is expected
