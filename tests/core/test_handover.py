"""Make before break, the pure rules: the offer's text as a member row holds it, whom a
draining holder hands each stream to, and how long it waits for the take."""

from __future__ import annotations

from collections import Counter

import pytest

from streamlease.core.deal import preference
from streamlease.core.handover import (
    OFFER_DIAL_S,
    OFFER_WAIT_HEARTBEATS,
    Offer,
    declined_text,
    further_taker,
    offer_wait_s,
    parse_offer,
    takers,
)
from streamlease.core.membership import MemberRecord, MemberStatus


def member(wid: str, streams: int = 0, capacity: int = 10,
           status: MemberStatus = MemberStatus.ACTIVE, heartbeat: int = 1) -> MemberRecord:
    return MemberRecord(wid, epoch=1, heartbeat=heartbeat, status=status, streams=streams,
                        capacity=capacity)


# -- the offer's text ------------------------------------------------------------------


@pytest.mark.parametrize("offer", [
    Offer("s1", 7, rebalance=False),
    Offer("s1", 7, rebalance=True),
    Offer("s1", 0, rebalance=False),
    Offer("feed:eu:btc-usd", 12, rebalance=True),  # a stream id may hold colons itself
    Offer("s" * 300, 2**53, rebalance=False),
])
def test_an_offer_reads_back_from_its_text_as_it_was(offer: Offer) -> None:
    assert parse_offer(offer.text) == offer


def test_the_text_names_the_fence_then_why_then_the_stream() -> None:
    assert Offer("s1", 7, rebalance=False).text == "7:s:s1"
    assert Offer("a:b", 3, rebalance=True).text == "3:r:a:b"
    assert parse_offer("3:r:a:b") == Offer("a:b", 3, rebalance=True)


@pytest.mark.parametrize("text", [
    "",
    "s1",  # no colon at all
    "7",
    "7:s",  # no stream id
    "7:s:",  # an empty stream id
    "7::s1",  # no why
    ":s:s1",  # no fence
    "x:s:s1",  # a fence that is no number
    "-1:s:s1",
    "+1:s:s1",
    "1.5:s:s1",
    " 7:s:s1",
    "7 :s:s1",
    "0x7:s:s1",
    "7:x:s1",  # why is s (shutdown) or r (rebalance), nothing else
    "7:S:s1",
    "7:rs:s1",
    "7:R:s1",
    "s1:s:7",  # the parts in the wrong order
])
def test_a_text_that_is_not_an_offer_reads_as_none(text: str) -> None:
    assert parse_offer(text) is None


@pytest.mark.parametrize("text", [
    "\u00b2:s:s1",  # SUPERSCRIPT TWO: str.isdigit() says yes, int() says no
    "\u0661:s:s1",  # ARABIC-INDIC DIGIT ONE: int() reads 1, but no holder writes that
    "\uff17:s:s1",  # FULLWIDTH DIGIT SEVEN
])
def test_a_fence_of_digits_other_than_ascii_is_no_offer(text: str) -> None:
    """A holder writes its fence in ASCII digits. Anything else in a member row is not an
    offer: read as None (counted "unreadable"), never an exception that would count as a
    crash, and never a fence the holder did not write."""
    assert parse_offer(text) is None


def test_declined_names_the_fence_and_the_taker() -> None:
    assert declined_text(7, "w2") == "7:w2"
    assert declined_text(7, "w2") != declined_text(8, "w2")
    assert declined_text(7, "w2") != declined_text(7, "w3")


# -- whom to hand each stream to --------------------------------------------------------


def test_only_live_active_peers_are_takers_never_me() -> None:
    members = [member("me"), member("dead"), member("draining", status=MemberStatus.DRAINING),
               member("fenced", status=MemberStatus.DEAD), member("ok", streams=9)]
    chosen = takers(["s1", "s2", "s3"], members, "me", None, dead=frozenset({"dead"}))
    # "ok" has room for one more stream (9 of 10); nobody else may take any.
    assert chosen == {"s1": "ok"}


def test_nobody_else_nobody_chosen() -> None:
    assert takers(["s1"], [member("me")], "me", 5) == {}
    assert takers(["s1"], [], "me", 5) == {}
    assert takers([], [member("a")], "me", 5) == {}


def test_the_member_furthest_below_the_level_is_chosen_first() -> None:
    members = [member("a", streams=4), member("b", streams=1), member("c", streams=3)]
    assert takers(["s1"], members, "me", 5) == {"s1": "b"}


def test_each_stream_given_counts_its_taker_one_fuller() -> None:
    # Below the level of 5: a by 1, b by 3. b takes until it is no further below than a,
    # then ties go by each stream's own order of the two.
    members = [member("a", streams=4), member("b", streams=2)]
    streams = [f"s{i}" for i in range(4)]
    chosen = takers(streams, members, "me", 5)
    assert chosen["s0"] == "b" and chosen["s1"] == "b"
    parts = Counter(chosen.values())
    assert parts == {"a": 1, "b": 3}, chosen  # both at the level after four


def test_past_the_level_the_one_with_most_room_to_its_capacity_takes() -> None:
    # Everyone is at or above the level: it grows, the emptiest by capacity first.
    members = [member("a", streams=6, capacity=10), member("b", streams=5, capacity=8),
               member("c", streams=5, capacity=20)]
    chosen = takers(["s1", "s2"], members, "me", 4)
    assert chosen == {"s1": "c", "s2": "c"}


def test_a_rebalance_goes_only_to_peers_below_the_level() -> None:
    """A peer at its share declines a rebalance (it would only shed the stream again):
    a rebalance names only peers below the level, one fuller per stream, and leaves the
    rest out for their holder to keep."""
    members = [member("a", streams=4), member("b", streams=5), member("c", streams=9)]
    chosen = takers(["s1", "s2", "s3"], members, "me", 5, rebalance=True)
    assert chosen == {"s1": "a"}
    # A shutdown's streams go on past the level, to whoever has room to its capacity.
    assert len(takers(["s1", "s2", "s3"], members, "me", 5)) == 3
    # Without a level the share is the capacity: room to it is room below the share.
    assert takers(["s1"], members, "me", None, rebalance=True) == {"s1": "a"}
    chosen, _ = further_taker("s1", members, "me", 5, frozenset({"a"}), {}, rebalance=True)
    assert chosen is None
    chosen, _ = further_taker("s1", members, "me", 5, frozenset({"a"}), {})
    assert chosen == "b"


def test_without_a_level_the_share_is_the_capacity() -> None:
    members = [member("a", streams=2, capacity=4), member("b", streams=2, capacity=10)]
    assert takers(["s1"], members, "me", None) == {"s1": "b"}


def test_streams_nobody_has_room_for_are_left_out() -> None:
    members = [member("a", streams=9, capacity=10), member("b", streams=10, capacity=10),
               member("c", streams=12, capacity=10)]  # over capacity: no room, not negative
    chosen = takers(["s1", "s2", "s3"], members, "me", 5)
    assert chosen == {"s1": "a"}


def test_ties_go_by_each_streams_own_order_of_the_members() -> None:
    """Two holders handing streams over at once, from rows that do not show each other's
    hand-overs yet, mostly pick different takers: a tie is decided per stream."""
    members = [member("a", streams=1), member("b", streams=1), member("c", streams=1)]
    streams = [f"s{i:03}" for i in range(300)]
    picks = {sid: takers([sid], members, "me", 5)[sid] for sid in streams}
    for sid, taker in picks.items():
        assert taker == min("abc", key=lambda m: preference(sid, m))
    parts = Counter(picks.values())
    assert set(parts) == {"a", "b", "c"} and min(parts.values()) > 60, parts
    # The order of the member rows as read makes no difference.
    assert all(takers([sid], list(reversed(members)), "me", 5)[sid] == taker
               for sid, taker in picks.items())


def test_the_same_inputs_always_name_the_same_takers() -> None:
    members = [member("a", streams=3), member("b", streams=3), member("c", streams=0)]
    streams = [f"s{i}" for i in range(12)]
    first = takers(streams, members, "me", 6)
    assert takers(streams, members, "me", 6) == first
    assert len(first) == 12 and Counter(first.values()) == {"a": 3, "b": 3, "c": 6}


# -- how long a holder waits -------------------------------------------------------------


def test_a_holder_waits_one_and_a_half_member_heartbeats_and_a_dial() -> None:
    assert offer_wait_s(5.0) == pytest.approx(OFFER_WAIT_HEARTBEATS * 5.0 + OFFER_DIAL_S)
    assert offer_wait_s(5.0) == pytest.approx(8.5)
    assert offer_wait_s(0.5) == pytest.approx(1.75)
    # The taker reads its row back with each heartbeat: a slower heartbeat, a longer wait.
    assert offer_wait_s(2.0) < offer_wait_s(4.0)
    assert offer_wait_s(0.0) == pytest.approx(OFFER_DIAL_S)


# -- a further taker, when the first could not take the stream --------------------------


def test_a_further_taker_is_none_of_those_tried() -> None:
    members = [member("a", streams=1), member("b", streams=2), member("c", streams=3)]
    chosen, _ = further_taker("s1", members, "me", 5, frozenset({"a"}), {})
    assert chosen == "b"
    chosen, _ = further_taker("s1", members, "me", 5, frozenset({"a", "b", "c"}), {})
    assert chosen is None


def test_streams_sent_to_further_takers_spread_as_a_drain_does() -> None:
    # Ten streams of a drain whose first taker ("gone") refused every one: "a" and "b"
    # each below the level by 5, so they share them, not all to whichever is first.
    members = [member("a", streams=0), member("b", streams=0)]
    sent: dict[str, tuple[int, int]] = {}
    got: Counter[str] = Counter()
    for i in range(10):
        chosen, sent = further_taker(f"s{i}", members, "me", 5, frozenset({"gone"}), sent)
        assert chosen is not None
        got[chosen] += 1
    assert got == {"a": 5, "b": 5}
    assert sent == {"a": (1, 5), "b": (1, 5)}


def test_a_peer_counts_what_was_sent_its_way_only_until_its_row_is_read_again() -> None:
    sent = {"a": (1, 4), "b": (1, 0)}
    # Same heartbeat: "a" counts 1 + 4 streams, so "b" (2) has more room.
    chosen, _ = further_taker("s1", [member("a", streams=1), member("b", streams=2)], "me",
                              10, frozenset(), sent)
    assert chosen == "b"
    # "a"'s row read again (heartbeat 2): its own count now, 1; the old extra is dropped.
    rows = [member("a", streams=1, heartbeat=2), member("b", streams=2)]
    chosen, after = further_taker("s1", rows, "me", 10, frozenset(), sent)
    assert chosen == "a" and after["a"] == (2, 1)


def test_the_sent_counts_given_are_not_changed() -> None:
    sent = {"a": (1, 1)}
    _, after = further_taker("s1", [member("a")], "me", 5, frozenset(), sent)
    assert sent == {"a": (1, 1)} and after == {"a": (1, 2)}
