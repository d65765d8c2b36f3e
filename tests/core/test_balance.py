"""Balance planning: shares, the band, who sheds and who takes — and a simulation of a
fleet applying it with member rows a heartbeat stale, which must converge, within the
move budget, and then never move again."""

from __future__ import annotations

import random

import pytest

from streamlease.core import balance
from streamlease.core.balance import TOLERANCE, plan
from streamlease.core.membership import MemberRecord, MemberStatus, fair_shares
from streamlease.core.model import StreamRecord


@pytest.mark.parametrize(("name", "total", "caps", "expected"), [
    ("even", 40, {"a": 100, "b": 100, "c": 100, "d": 100}, {"a": 10, "b": 10, "c": 10, "d": 10}),
    ("ceil", 41, {"a": 100, "b": 100, "c": 100, "d": 100}, {"a": 11, "b": 11, "c": 11, "d": 11}),
    ("a small member", 40, {"a": 5, "b": 100, "c": 100}, {"a": 5, "b": 18, "c": 18}),
    ("draining gets none", 24, {"a": 100, "b": 0, "c": 100}, {"a": 12, "b": 0, "c": 12}),
    ("more than all hold", 500, {"a": 100, "b": 100}, {"a": 100, "b": 100}),
    ("nothing", 0, {"a": 100}, {"a": 0}),
])
def test_fair_shares(name: str, total: int, caps: dict[str, int],
                     expected: dict[str, int]) -> None:
    assert fair_shares(total, caps) == expected


CAP = 100


def decide(me: str, counts: dict[str, int], orphans: int = 0,
           active: set[str] | None = None) -> tuple[int, int, int]:
    members = set(counts) if active is None else active
    b = plan(me, counts, members, dict.fromkeys(counts, CAP), orphans)
    return b.share, b.take, b.shed


@pytest.mark.parametrize(("name", "counts", "orphans", "me", "expected"), [
    # (share, take, shed)
    ("scale-out: a full member sheds half its excess", {"a": 20, "b": 20, "c": 0, "d": 0}, 0,
     "a", (10, 0, 5)),
    ("scale-out: new members share what was shed", {"a": 15, "b": 15, "c": 0, "d": 0}, 10,
     "c", (10, 5, 0)),
    ("the one furthest below takes first", {"a": 10, "b": 10, "c": 9, "d": 8}, 1, "c",
     (10, 0, 0)),
    ("...the one furthest below", {"a": 10, "b": 10, "c": 9, "d": 8}, 1, "d", (10, 1, 0)),
    ("inside the band: no move", {"a": 11, "b": 11, "c": 9, "d": 9}, 0, "a", (10, 0, 0)),
    ("inside the band: nothing to take", {"a": 11, "b": 11, "c": 9, "d": 9}, 0, "c",
     (10, 0, 0)),
    ("just above the band sheds one", {"a": 12, "b": 10, "c": 9, "d": 9}, 0, "a", (10, 0, 1)),
    ("a gap below the band: the largest holder gives one", {"a": 14, "b": 14, "c": 12}, 0,
     "a", (14, 0, 1)),
    ("...and only one gives for one gap", {"a": 14, "b": 14, "c": 12}, 0, "b", (14, 0, 0)),
    ("...and none while an orphan already fills it", {"a": 13, "b": 13, "c": 12}, 1, "a",
     (13, 0, 0)),
    ("orphans count toward the total", {"a": 10, "b": 0}, 10, "b", (10, 10, 0)),
])
def test_plan(name: str, counts: dict[str, int], orphans: int, me: str,
              expected: tuple[int, int, int]) -> None:
    assert decide(me, counts, orphans) == expected


def test_a_draining_member_has_no_share_and_others_absorb_it() -> None:
    active = {"a", "b"}  # c drains
    assert decide("c", {"a": 8, "b": 8, "c": 8}, active=active) == (0, 0, 0)
    assert decide("a", {"a": 8, "b": 8, "c": 8}, active=active) == (12, 0, 0)  # not yet
    assert decide("a", {"a": 8, "b": 8, "c": 0}, orphans=8, active=active) == (12, 4, 0)


def simulate(counts: dict[str, int], orphans: int, rng: random.Random,
             rounds: int = 60) -> tuple[int, list[dict[str, int]]]:
    """Every member plans from rows one round stale (its own count live), sheds to the
    orphan pool, then members take from it in random order. Returns the moves made and
    the counts after each round (with the orphans left over under ``"(orphans)"``)."""
    history = []
    moves = 0
    stale = dict(counts)
    for _ in range(rounds):
        sheds = {}
        for me in counts:
            view = {**stale, me: counts[me]}
            sheds[me] = plan(me, view, set(counts), dict.fromkeys(counts, CAP), orphans).shed
        for me, n in sheds.items():
            n = min(n, counts[me])
            counts[me] -= n
            orphans += n
            moves += n
        order = list(counts)
        rng.shuffle(order)
        for me in order:
            view = {**stale, me: counts[me]}
            take = plan(me, view, set(counts), dict.fromkeys(counts, CAP), orphans).take
            got = min(take, orphans)
            counts[me] += got
            orphans -= got
        stale = dict(counts)
        history.append({**counts, "(orphans)": orphans})
    assert orphans == 0
    return moves, history


def in_band(counts: dict[str, int], share: int) -> bool:
    return counts["(orphans)"] == 0 and all(
        abs(v - share) <= TOLERANCE for k, v in counts.items() if k != "(orphans)")


@pytest.mark.parametrize("seed", range(20))
def test_scale_out_converges_within_the_move_budget_and_stays(seed: int) -> None:
    rng = random.Random(seed)
    moves, history = simulate({"a": 20, "b": 20, "c": 0, "d": 0}, 0, rng)
    share = 10
    settled = next(i for i, h in enumerate(history) if in_band(h, share))
    assert settled <= 4, history[:6]
    assert moves <= 22
    assert all(h == history[settled] for h in history[settled:]), "moved after settling"


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("start", [
    {"a": 24, "b": 0, "c": 0},  # after a rolling restart left everything on one member
    {"a": 14, "b": 14, "c": 12},
    {"a": 30, "b": 5, "c": 5, "d": 0, "e": 1},
    {"a": 7, "b": 0},
])
def test_any_start_settles_inside_the_band_and_stays(seed: int, start: dict[str, int]) -> None:
    total = sum(start.values())
    _, history = simulate(dict(start), 0, random.Random(seed))
    final = history[-1]
    share = -(-total // len(start))
    assert in_band(final, share), final
    assert history[-10:] == [final] * 10


def test_a_hand_over_is_taken_in_one_round_though_the_rows_lag() -> None:
    # d drains: its row still shows 15 while its 15 streams already wait as orphans.
    counts = {"a": 5, "b": 4, "c": 0, "d": 15}
    active = {"a", "b", "c"}
    taken = {}
    for me in sorted(active):
        b = plan(me, counts, active, dict.fromkeys(counts, CAP), 15)
        assert b.share == 8, "the drainer's streams were counted twice"
        taken[me] = b.take
    assert taken == {"a": 3, "b": 4, "c": 8}  # every orphan has a taker at once


def test_too_few_orphans_are_still_dealt_to_the_furthest_below() -> None:
    counts = {"a": 10, "b": 7, "c": 5}
    takes = {me: plan(me, counts, set(counts), dict.fromkeys(counts, CAP), 2).take
             for me in counts}
    assert takes == {"a": 0, "b": 0, "c": 2}


# -- intake ------------------------------------------------------------------------------


def test_orphans_are_tiered_by_how_long_they_waited() -> None:
    first_seen = {"new": 10.0, "half": 9.4, "two": 8.0, "three": 7.0}
    w = balance.waited(first_seen, now=10.0, reconcile_s=1.0)
    assert w.lingering == {"half", "two", "three"}
    assert w.starving == {"two", "three"} and w.abandoned == {"three"}
    tiers = {sid: w.tier(StreamRecord(sid, "STARTED", "wss://x/")) for sid in first_seen}
    assert tiers == {"three": 0, "two": 1, "half": 2, "new": 3}


def plan_of(share: int, take: int = 0) -> balance.Balance:
    return balance.Balance(share=share, take=take, shed=0, total=0, someone_below=False)


def tiers(lingering: int = 0, starving: int = 0, abandoned: int = 0) -> balance.Waited:
    def ids(n: int) -> frozenset[str]:
        return frozenset(f"s{i}" for i in range(n))
    return balance.Waited(ids(max(lingering, starving, abandoned)),
                          ids(max(starving, abandoned)), ids(abandoned))


@pytest.mark.parametrize(("share", "take", "keeping", "waiting", "expected"), [
    (10, 3, 5, tiers(), 3),  # what the plan deals it
    (10, 0, 5, tiers(lingering=8), 5),  # lingering: up to its own gap, never past its share
    (10, 0, 10, tiers(lingering=8), 0),  # at its share: lingering ones are not its to take
    (10, 0, 10, tiers(starving=8), 1),  # starving: room inside its band (share + 1)
    (10, 0, 11, tiers(starving=8), 0),
    (10, 0, 15, tiers(abandoned=4), 4),  # abandoned: anyone, when nothing else is taken
    (10, 2, 8, tiers(abandoned=4), 3),  # its band first (abandoned ones are starving too)
])
def test_intake(share: int, take: int, keeping: int, waiting: balance.Waited,
                expected: int) -> None:
    assert balance.intake(plan_of(share, take), keeping, waiting) == expected


BIG = 1000  # room for a dead member's share


def row(worker: str, streams: int, status: MemberStatus = MemberStatus.ACTIVE,
        released: bool = False) -> MemberRecord:
    return MemberRecord(worker_id=worker, epoch=2, heartbeat=9, status=status,
                        streams=streams, capacity=BIG, released=released)


def test_a_dead_members_streams_keep_the_shares_whole_until_released() -> None:
    """While survivors take a fenced member's 500 streams over, their rows show only part
    of what they took: counted without the dead member's streams, the total would shrink
    and a survivor already past the smaller share would shed streams it held before."""
    rows = [row("w1", 500, MemberStatus.DEAD), row("w2", 665), row("w3", 575), row("w4", 571)]
    counts, active = balance.counts_of(rows, "w2", 665)
    assert active == {"w2", "w3", "w4"}
    decided = plan("w2", counts, active, dict.fromkeys(counts, BIG), 0)
    assert decided.shed == 0, decided
    assert decided.share >= 667
    # Once its streams are released on its behalf, the row no longer counts: they are
    # orphans now, counted as such.
    released = [row("w1", 500, MemberStatus.DEAD, released=True), *rows[1:]]
    counts, active = balance.counts_of(released, "w2", 665)
    assert "w1" not in counts
    assert plan("w2", counts, active, dict.fromkeys(counts, BIG), 189).share == 667
