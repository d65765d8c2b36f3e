"""Dealing a dead member's streams: every survivor computes the same deal."""

from __future__ import annotations

from collections import Counter

import pytest

from streamlease.core.deal import deal, deal_weights
from streamlease.core.lease import can_take_over
from streamlease.core.model import StreamRecord

IDS = [f"s{i}" for i in range(3000)]


def test_every_stream_goes_to_exactly_one_member_the_same_way_each_time() -> None:
    weights = {"a": 1, "b": 1, "c": 1}
    first = deal(IDS, weights)
    assert set(first) == set(IDS) and set(first.values()) == {"a", "b", "c"}
    assert deal(reversed(IDS), dict(reversed(list(weights.items())))) == first


def test_parts_follow_the_weights() -> None:
    parts = Counter(deal(IDS, {"a": 1, "b": 3}).values())
    assert parts["b"] / parts["a"] == pytest.approx(3.0, rel=0.15)
    even = Counter(deal(IDS, {"a": 1, "b": 1, "c": 1}).values())
    assert max(even.values()) - min(even.values()) < 0.1 * len(IDS)


def test_no_weight_no_part_and_nobody_no_deal() -> None:
    dealt = deal(IDS[:100], {"a": 2, "b": 0})
    assert set(dealt.values()) == {"a"}
    assert deal(IDS[:10], {"a": 0}) == {}
    assert deal(IDS[:10], {}) == {}


def test_a_member_more_or_less_moves_only_what_it_wins() -> None:
    before = deal(IDS, {"a": 1, "b": 1})
    after = deal(IDS, {"a": 1, "b": 1, "c": 1})
    moved = [sid for sid in IDS if before[sid] != after[sid]]
    assert moved and all(after[sid] == "c" for sid in moved)


def test_weights_favour_the_emptiest_and_respect_capacity() -> None:
    # 100 streams of a dead member over a (40 held) and b (10 held), capacity 100 each:
    # 150 in all, 75 each: a is 35 short, b 65.
    assert deal_weights({"a": 40, "b": 10}, {"a": 100, "b": 100}, 100) == {"a": 36, "b": 66}
    # Balanced survivors split evenly; a full one gets nothing.
    assert deal_weights({"a": 50, "b": 50}, {"a": 100, "b": 100}, 0) == {"a": 1, "b": 1}
    assert deal_weights({"a": 100, "b": 10}, {"a": 100, "b": 100}, 50) == {"a": 0, "b": 71}
    # Never more than the room left.
    assert deal_weights({"a": 95}, {"a": 100}, 50) == {"a": 5}


def record(**changes: object) -> StreamRecord:
    base: dict[str, object] = dict(stream_id="s", desired_state="STARTED", ws_url="wss://x/",
                                   lease_owner="dead", lease_expires_at_ms=123, fence=4,
                                   last_seq=9, lease_epoch=5)
    base.update(changes)
    return StreamRecord(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(("changes", "expected"), [
    ({}, True),
    ({"lease_epoch": None}, True),  # taken before epochs were stamped
    ({"lease_expires_at_ms": 1}, True),  # expired but not released: still its holder's
    ({"lease_epoch": 6}, False),  # a newer incarnation's (re-registered since)
    ({"lease_expires_at_ms": 0}, False),  # released: an orphan, acquired as usual
    ({"lease_expires_at_ms": None}, False),
    ({"lease_owner": "other"}, False),
    ({"fence": None}, False),
    ({"desired_state": "STOPPED"}, False),  # released on its behalf instead
])
def test_take_over_rule(changes: dict[str, object], expected: bool) -> None:
    assert can_take_over(record(**changes), "dead", 6) is expected
    assert can_take_over(None, "dead", 6) is False
