"""What ``ctl members`` makes of a few fleet reads: liveness by observed change only."""

from __future__ import annotations

import pytest

from streamlease.core.membership import MemberRecord, MemberStatus
from streamlease.core.roster import FleetRead, held, report, settled

ACTIVE, DRAINING, DEAD = MemberStatus.ACTIVE, MemberStatus.DRAINING, MemberStatus.DEAD


def m(worker_id: str, epoch: int = 1, heartbeat: int = 0, status: MemberStatus = ACTIVE,
      capacity: int = 100, heartbeat_at_ms: int | None = None) -> MemberRecord:
    return MemberRecord(worker_id, epoch, heartbeat, status, capacity=capacity,
                        heartbeat_at_ms=heartbeat_at_ms)


def read(at: float, *members: MemberRecord, latency: float = 0.1) -> FleetRead:
    return FleetRead(tuple(members), at, at + latency)


@pytest.mark.parametrize(("name", "before", "after", "alive", "age"), [
    ("counter moved", m("w", heartbeat=4), m("w", heartbeat=5), True, 0.0),
    ("re-registered: epoch moved, counter restarted", m("w", 1, 9), m("w", 2, 0), True, 0.0),
    ("appeared while watched", None, m("w"), True, 0.0),
    ("row unchanged", m("w", heartbeat=4), m("w", heartbeat=4), False, 3.0),
    ("draining and heartbeating", m("w", heartbeat=1, status=DRAINING),
     m("w", heartbeat=2, status=DRAINING), True, 0.0),
    ("dead rows never live, whatever moved", m("w", 1, 3), m("w", 2, 3, DEAD), False, 0.0),
    ("dead and unchanged", m("w", 2, 3, DEAD), m("w", 2, 3, DEAD), False, 3.0),
])
def test_liveness_comes_from_what_changed(name: str, before: MemberRecord | None,
                                          after: MemberRecord, alive: bool,
                                          age: float) -> None:
    first = read(0.0) if before is None else read(0.0, before)
    [found] = report([first, read(3.0, after)], total=0)
    assert (found.alive, found.heartbeat_age_s) == (alive, pytest.approx(age)), name


def test_the_members_own_wall_clock_decides_nothing() -> None:
    """A heartbeat stamped in the future (a clock far ahead) does not make a silent member
    alive, and one stamped long ago does not make a moving member dead."""
    silent = m("a", heartbeat=7, heartbeat_at_ms=10**15)
    reads = [read(0.0, silent, m("b", heartbeat=1, heartbeat_at_ms=0)),
             read(2.0, silent, m("b", heartbeat=2, heartbeat_at_ms=0))]
    assert [(r.member.worker_id, r.alive, r.liveness) for r in report(reads, 0)] == [
        ("a", False, "silent"), ("b", True, "alive")]


def test_age_counts_from_the_first_read_showing_the_current_heartbeat() -> None:
    reads = [read(0.0, m("w", heartbeat=1)), read(1.0, m("w", heartbeat=2)),
             read(2.0, m("w", heartbeat=2)), read(3.5, m("w", heartbeat=2))]
    [found] = report(reads, 0)
    assert found.alive and found.heartbeat_age_s == pytest.approx(2.5)


def test_a_single_read_proves_nothing() -> None:
    [found] = report([read(0.0, m("w"))], 10)
    assert (found.alive, found.heartbeat_age_s, found.share) == (False, 0.0, 0)
    assert report([], 10) == []


def test_shares_go_to_alive_active_members_within_their_capacity() -> None:
    before = read(0.0, m("big", heartbeat=1), m("small", heartbeat=1, capacity=2),
                  m("drain", heartbeat=1, status=DRAINING), m("silent", heartbeat=1),
                  m("dead", 2, 1, DEAD))
    after = read(2.0, m("big", heartbeat=2), m("small", heartbeat=2, capacity=2),
                 m("drain", heartbeat=2, status=DRAINING), m("silent", heartbeat=1),
                 m("dead", 2, 1, DEAD))
    shares = {r.member.worker_id: r.share for r in report([before, after], total=9)}
    assert shares == {"big": 7, "small": 2, "drain": 0, "silent": 0, "dead": 0}


def test_shares_default_to_what_the_member_rows_hold() -> None:
    """Without a total, the fleet shares what its rows report holding: every member not
    DEAD, silent and draining ones included (their streams are still held); a DEAD row's
    last count is not (the others release and count those streams)."""
    def row(worker_id: str, heartbeat: int, streams: int, status: MemberStatus = ACTIVE,
            epoch: int = 1) -> MemberRecord:
        return MemberRecord(worker_id, epoch, heartbeat, status, streams=streams, capacity=10)

    reads = [read(0.0, row("a", 1, 6), row("b", 1, 1), row("silent", 1, 3),
                  row("drain", 1, 2, status=DRAINING), row("dead", 1, 9, epoch=2, status=DEAD)),
             read(2.0, row("a", 2, 6), row("b", 2, 1), row("silent", 1, 3),
                  row("drain", 2, 2, status=DRAINING), row("dead", 1, 9, epoch=2, status=DEAD))]
    assert held(reads[-1].members) == 6 + 1 + 3 + 2
    shares = {r.member.worker_id: r.share for r in report(reads)}
    assert shares == {"a": 6, "b": 6, "silent": 0, "drain": 0, "dead": 0}


def test_reports_are_sorted_by_id_and_cover_the_last_read_only() -> None:
    reads = [read(0.0, m("gone"), m("b")), read(1.0, m("c"), m("a"), m("b"))]
    assert [r.member.worker_id for r in report(reads, 0)] == ["a", "b", "c"]


@pytest.mark.parametrize(("name", "reads", "done"), [
    ("one read", [read(0.0, m("a", heartbeat=1))], False),
    ("all moved", [read(0.0, m("a", heartbeat=1)), read(1.0, m("a", heartbeat=2))], True),
    ("one silent", [read(0.0, m("a", heartbeat=1), m("b", heartbeat=1)),
                    read(1.0, m("a", heartbeat=2), m("b", heartbeat=1))], False),
    ("dead rows need no proof", [read(0.0, m("a", heartbeat=1), m("d", 2, 0, DEAD)),
                                 read(1.0, m("a", heartbeat=2), m("d", 2, 0, DEAD))], True),
    ("empty fleet", [read(0.0), read(1.0)], True),
])
def test_settled_once_every_live_member_proved_itself(name: str, reads: list[FleetRead],
                                                       done: bool) -> None:
    assert settled(reads) is done, name
