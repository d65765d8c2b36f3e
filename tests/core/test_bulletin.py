"""The leader's bulletin: composed from every row, it gives each member the same share and
the same shedding decision that member would compute from every row itself."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from streamlease.core import bulletin as bulletins
from streamlease.core.balance import counts_of, plan
from streamlease.core.bulletin import (
    Bulletin,
    Deal,
    FleetRead,
    Taker,
    compose,
    newly_donor,
    plan_from,
)
from streamlease.core.deal import deal_weights
from streamlease.core.membership import MemberRecord, MemberStatus


def row(worker: str, streams: int, capacity: int = 100,
        status: MemberStatus = MemberStatus.ACTIVE, released: bool = False,
        epoch: int = 1) -> MemberRecord:
    return MemberRecord(worker, epoch, 7, status, streams, capacity, released=released)


def fleet(rng: random.Random) -> tuple[list[MemberRecord], int]:
    rows = [row(f"w{i:02d}", rng.randrange(0, 60), rng.choice([5, 40, 100]))
            for i in range(rng.randrange(2, 12))]
    if rng.random() < 0.3:
        rows.append(row("zz-draining", rng.randrange(0, 20), status=MemberStatus.DRAINING))
    return rows, rng.randrange(0, 30)


@pytest.mark.parametrize("seed", range(200))
def test_every_member_gets_the_share_and_shedding_it_would_compute_from_every_row(
        seed: int) -> None:
    rng = random.Random(seed)
    rows, orphans = fleet(rng)
    leader = rows[0].worker_id
    news = compose(FleetRead(rows, frozenset(), leader, rows[0].streams, True, orphans, gen=1))
    for member in rows:
        if member.status is not MemberStatus.ACTIVE:
            continue
        counts, active = counts_of(rows, member.worker_id, member.streams)
        capacities = {m.worker_id: m.capacity for m in rows}
        whole = plan(member.worker_id, counts, active, capacities, orphans)
        mine = plan_from(news, member.worker_id, member.capacity, member.streams, True, orphans)
        assert (mine.share, mine.shed, mine.total) == (whole.share, whole.shed, whole.total)
        assert 0 <= mine.take <= max(0, mine.share - member.streams)
        if orphans >= news.deficit:
            assert mine.take == whole.take


def test_a_member_that_takes_nothing_has_no_share_and_sheds_nothing() -> None:
    news = compose(FleetRead([row("a", 10), row("b", 30)], frozenset(), "a", 10, True, 0,
                             gen=1))
    drained = plan_from(news, "b", 100, 30, False, 0)
    assert (drained.share, drained.take, drained.shed) == (0, 0, 0)


def test_the_gaps_count_the_members_below_their_share() -> None:
    news = compose(FleetRead([row("a", 30), row("b", 0), row("c", 0)], frozenset(), "a", 30,
                             True, 0, gen=1))
    assert (news.level, news.total, news.deficit, news.below) == (10, 30, 20, 2)
    # a is far above its band: it sheds half its excess; b and c take what it sheds.
    assert plan_from(news, "a", 100, 30, True, 0).shed == 10
    assert plan_from(news, "b", 100, 0, True, 0).someone_below


def test_a_fenced_members_streams_are_dealt_to_the_survivors_by_room() -> None:
    rows = [row("a", 10, capacity=12), row("b", 10), row("c", 0),
            row("dead", 20, status=MemberStatus.DEAD, epoch=5),
            row("gone", 9, status=MemberStatus.DEAD, released=True, epoch=3)]
    news = compose(FleetRead(rows, frozenset(), "a", 10, True, 0, gen=1))
    assert [d.member for d in news.deals] == ["dead"]
    deal = news.deals[0]
    assert (deal.epoch, deal.streams) == (5, 20)
    expected = deal_weights({"a": 10, "b": 10, "c": 0}, {"a": 12, "b": 100, "c": 100}, 20)
    assert deal.weights() == {m: w for m, w in expected.items() if w > 0}
    assert deal.dead_row().status is MemberStatus.DEAD
    assert deal.dead_row().key[0] == 5


def test_draining_and_unresponsive_members_are_counted_and_shown() -> None:
    rows = [row("a", 5), row("b", 5, status=MemberStatus.DRAINING), row("c", 5)]
    news = compose(FleetRead(rows, frozenset({"c"}), "a", 5, True, 0, gen=4))
    assert news.draining
    assert dict(news.statuses) == {"ACTIVE": 1, "DRAINING": 1, "UNRESPONSIVE": 1}
    assert news.active == 1  # c is observed dead, b drains
    assert not compose(FleetRead(rows[:1], frozenset(), "a", 5, True, 0, gen=1)).draining


def test_donors_are_named_only_when_asked() -> None:
    """c sits below its band (2 of a share of 4) and nobody is above it: the largest
    holder gives one, unless a hand-over is still settling."""
    rows = [row("a", 5), row("b", 5), row("c", 2)]
    assert compose(FleetRead(rows, frozenset(), "a", 5, True, 0, gen=1)).donors == ("a",)
    assert compose(FleetRead(rows, frozenset(), "a", 5, True, 0, gen=1,
                             name_donors=False)).donors == ()


def test_the_successor_is_the_first_member_taking_streams_by_id_the_leader_aside() -> None:
    rows = [row("a", 5), row("b", 5, status=MemberStatus.DRAINING), row("c", 5), row("d", 1)]
    assert compose(FleetRead(rows, frozenset(), "a", 5, True, 0, gen=1)).successor == "c"
    assert compose(FleetRead(rows, frozenset({"c"}), "a", 5, True, 0, gen=1)).successor == "d"
    assert compose(FleetRead(rows[:2], frozenset(), "a", 5, True, 0, gen=1)).successor is None


def test_a_bulletin_reads_back_as_written() -> None:
    news = Bulletin(gen=9, level=12, total=40, deficit=3, below=2, active=4, draining=True,
                    donors=("a", "b"), deals=(Deal("d", 8, 20, (("a", 3), ("c", 1))),),
                    statuses=(("ACTIVE", 4), ("DEAD", 1)), successor="c",
                    takers=(Taker("c", 4, 1, 2, 100), Taker("a", 3, 0, 9, 50)))
    assert bulletins.decode(bulletins.encode(news)) == news
    # A bulletin written by a version that names no successor: every member campaigns.
    older = json.loads(bulletins.encode(news))
    del older["su"]
    assert bulletins.decode(json.dumps(older)).successor is None
    # ... nor any takers: a hand-over then names the leader, the one row read.
    del older["tk"]
    assert bulletins.decode(json.dumps(older)) == dataclasses.replace(
        news, successor=None, takers=())


def test_the_takers_are_the_members_with_the_most_room_the_furthest_below_share_first(
        ) -> None:
    rows = [row("a", 12), row("b", 9), row("c", 0, capacity=5), row("d", 3, capacity=3),
            row("e", 1, status=MemberStatus.DRAINING), row("f", 0),
            row("g", 2, status=MemberStatus.DEAD)]
    news = compose(FleetRead(rows, frozenset({"f"}), "a", 12, True, 0, gen=1))
    # 24 streams over a, b, c, d (f is observed dead, e drains, g is dead): c's share is its
    # capacity, 5 above its count; a and b are at or above their share of 8, b with the
    # more room to its capacity; d is full.
    assert [(t.member, t.streams, t.capacity) for t in news.takers] == [
        ("c", 0, 5), ("b", 9, 100), ("a", 12, 100)]
    assert news.takers[0].row(42) == MemberRecord("c", 1, 42, MemberStatus.ACTIVE, 0, 5)
    many = compose(FleetRead([row(f"w{i:02d}", i) for i in range(40)], frozenset(), "w00", 0,
                             True, 0, gen=1))
    assert [t.member for t in many.takers] == [f"w{i:02d}" for i in range(bulletins.MAX_TAKERS)]


@pytest.mark.parametrize("text", [
    None, "", "not json", "[]", "{}", '{"g": 1}',
    '{"g":"1","l":1,"t":1,"d":0,"b":0,"a":1,"dr":0,"do":[],"de":[],"s":[]}',
    '{"g":1,"l":1,"t":1,"d":0,"b":0,"a":1,"dr":0,"do":[7],"de":[],"s":[]}',
    '{"g":1,"l":1,"t":1,"d":0,"b":0,"a":1,"dr":0,"do":[],"de":[["x",1]],"s":[]}',
    '{"g":1,"l":1,"t":1,"d":0,"b":0,"a":1,"dr":0,"do":[],"de":[["x",1,2,[["a"]]]],"s":[]}',
    '{"g":true,"l":1,"t":1,"d":0,"b":0,"a":1,"dr":0,"do":[],"de":[],"s":[]}',
    '{"g":1,"l":1,"t":1,"d":0,"b":0,"a":1,"dr":0,"do":[],"de":[],"s":[],"tk":[["a",1,0]]}',
    '{"g":1,"l":1,"t":1,"d":0,"b":0,"a":1,"dr":0,"do":[],"de":[],"s":[],"tk":[[1,1,0,1,1]]}',
])
def test_an_unreadable_bulletin_is_none(text: str | None) -> None:
    assert bulletins.decode(text) is None


def test_a_bulletin_stays_small_however_many_members_die_at_once() -> None:
    """A zone's outage in a fleet of 1,000: 300 fenced members at once. The bulletin names
    the first deals and the survivors with the most room in each, and stays a small
    fraction of the 400 KB an item may hold."""
    rows = [row(f"w{i:04d}", 100, capacity=150) for i in range(700)]
    rows += [row(f"x{i:04d}", 100, status=MemberStatus.DEAD, epoch=9) for i in range(300)]
    rows[5] = row("w0005", 10, capacity=150)  # the most room
    news = compose(FleetRead(rows, frozenset(), "w0000", 100, True, 0, gen=1))
    assert len(news.deals) == bulletins.MAX_DEALS
    assert [d.member for d in news.deals] == [f"x{i:04d}" for i in range(bulletins.MAX_DEALS)]
    for deal in news.deals:
        assert len(deal.heirs) == bulletins.MAX_HEIRS
        assert "w0005" in deal.weights()
        assert deal.weights()["w0005"] == max(deal.weights().values())
    assert len(bulletins.encode(news).encode()) < 40_000


def test_newly_donor_only_when_the_bulletin_before_did_not_name_it() -> None:
    quiet = Bulletin(gen=3, level=4, total=12, deficit=0, below=0, active=3, draining=False)
    asks_b = dataclasses.replace(quiet, donors=("b",))
    assert newly_donor("b", quiet, asks_b)
    assert newly_donor("b", None, asks_b)
    assert not newly_donor("b", asks_b, asks_b)  # still named: told once already
    assert not newly_donor("a", quiet, asks_b)
    assert not newly_donor("b", asks_b, quiet)
