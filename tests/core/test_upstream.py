"""Which profile a stream item gets, gap records, binary frames: pure rules, no network."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from streamlease.core.frames import Frame
from streamlease.core.profiles import BUILTIN, BUILTIN_PROFILE, Profile, parse_profiles
from streamlease.core.upstream import (
    BUILTIN_CATALOG,
    Catalog,
    GapPlacement,
    PendingGap,
    binary_payload,
    binary_text,
    gap_body,
    gap_dismissed,
    gap_frame,
    gap_on_connect,
    gap_text,
    place_gap,
)
from streamlease.processor import Message

PROFILES = parse_profiles(json.dumps({
    "plain": {"seq": "/u"},
    "chat": {"on_open": [{"send": '{"sub":"${item.channel}","n":"${item.shard}"}'}],
             "resume": {"mode": "none"}},
}), "json")
CATALOG = Catalog(PROFILES)


# --- which profile --------------------------------------------------------------------------


def test_an_item_without_profile_gets_the_default() -> None:
    assert CATALOG.choose({"ws_url": "wss://x/"}) is BUILTIN_PROFILE
    other = Catalog(PROFILES, default="plain")
    chosen = other.choose({})
    assert isinstance(chosen, Profile) and chosen.name == "plain"
    assert other.item_problem({}) is None
    # An item's own profile wins over the default.
    assert other.choose({"profile": BUILTIN}) is BUILTIN_PROFILE
    assert BUILTIN_CATALOG.item_problem({"ws_url": "wss://x/"}) is None


def test_a_named_profile_is_chosen() -> None:
    chosen = CATALOG.choose({"profile": "chat", "channel": "c1", "shard": Decimal(3)})
    assert isinstance(chosen, Profile) and chosen.name == "chat"
    assert CATALOG.item_problem({"profile": "chat", "channel": "c1", "shard": 3}) is None


@pytest.mark.parametrize(("item", "expected"), [
    ({"profile": "nope"}, "profile 'nope' is not defined (known: chat, plain, streamlease; "
                          "STREAMLEASE_PROFILES)"),
    ({"profile": 7}, "profile: must be a string"),
    ({"profile": None}, "profile: must be a string"),
    ({"profile": ["chat"]}, "profile: must be a string"),
    # The first missing attribute in name order is named.
    ({"profile": "chat"}, "profile chat: its templates use ${item.channel} and the item has "
                          "no such attribute"),
    ({"profile": "chat", "channel": "c"}, "profile chat: its templates use ${item.shard} and "
                                          "the item has no such attribute"),
    ({"profile": "chat", "channel": True, "shard": 1},
     "profile chat: ${item.channel} must be a string or a number"),
    ({"profile": "chat", "channel": {"a": 1}, "shard": 1},
     "profile chat: ${item.channel} must be a string or a number"),
    ({"profile": "chat", "channel": b"\x00", "shard": 1},
     "profile chat: ${item.channel} must be a string or a number"),
    ({"profile": "chat", "channel": 1.5, "shard": 1},  # DynamoDB numbers are Decimal
     "profile chat: ${item.channel} must be a string or a number"),
])
def test_items_that_cannot_be_served_say_why(item: dict[str, Any], expected: str) -> None:
    assert CATALOG.choose(item) == expected
    assert CATALOG.item_problem(item) == expected
    assert expected.startswith("profile")  # bad_item_reason's label: bad_profile


def test_a_long_unknown_name_is_cut_in_the_problem() -> None:
    problem = CATALOG.item_problem({"profile": "x" * 10_000})
    assert problem is not None and len(problem) < 200


def test_a_python_upstream_ignores_profiles() -> None:
    catalog = Catalog(PROFILES, python="python:feeds:make")
    for item in ({"profile": "nope"}, {"profile": 7}, {"profile": "chat"}, {}):
        assert catalog.item_problem(item) is None


# --- gaps -----------------------------------------------------------------------------------


def test_feeds_that_replay_never_get_a_gap() -> None:
    for first in (True, False):
        assert gap_on_connect(True, first, 41, 1_000) is None


def test_the_first_connection_of_a_fresh_stream_loses_nothing() -> None:
    assert gap_on_connect(False, True, 0, None) is None


def test_a_takeover_after_deliveries_may_follow_a_loss() -> None:
    assert gap_on_connect(False, True, 41, 5_000) == PendingGap("takeover", 41, None)


def test_every_reconnect_may_follow_a_loss() -> None:
    assert gap_on_connect(False, False, 41, 5_000) == PendingGap("reconnect", 41, 5_000)
    # Even one before anything was delivered: the first connection saw the feed.
    assert gap_on_connect(False, False, 0, 5_000) == PendingGap("reconnect", 0, 5_000)


RECONNECT = PendingGap("reconnect", 41, 5_000)


def test_counted_frames_always_get_a_record_first() -> None:
    # The worker numbered the frame 42 (received + 1); the record takes 42, the frame 43.
    placed = place_gap(RECONNECT, 42, 41, numbered=True, max_seq_jump=10)
    assert placed == GapPlacement(42, None, 43)
    assert not gap_dismissed(RECONNECT, 42, 41, numbered=True)


@pytest.mark.parametrize(("frame_seq", "dismissed", "placed"), [
    (30, False, None),  # a duplicate: no record yet, the gap stays pending
    (41, False, None),  # the last one received again
    (42, True, None),  # the very next number: nothing was lost
    (43, False, GapPlacement(42, (42, 42), 43)),  # one missing
    (57, False, GapPlacement(42, (42, 56), 57)),
    (61, False, GapPlacement(42, (42, 60), 61)),  # exactly max_seq_jump ahead: accepted
    (62, False, None),  # beyond max_seq_jump: refused as a jump, not placed
])
def test_a_feed_numbered_gap_is_placed_by_the_first_data_frame(
        frame_seq: int, dismissed: bool, placed: GapPlacement | None) -> None:
    assert gap_dismissed(RECONNECT, frame_seq, 41, numbered=False) is dismissed
    assert place_gap(RECONNECT, frame_seq, 41, numbered=False, max_seq_jump=20) == placed


def test_a_gap_record_round_trips_through_json() -> None:
    placement = GapPlacement(42, (42, 56), 57)
    text = gap_text(RECONNECT, placement, until_ms=7_150)
    assert "\n" not in text
    body = gap_body(json.loads(text))
    assert body == {"reason": "reconnect", "after_seq": 41, "since_ms": 5_000,
                    "until_ms": 7_150, "missing_from": 42, "missing_to": 56}
    frame = gap_frame(RECONNECT, placement, until_ms=7_150)
    assert frame == Frame(42, text)
    message = Message.of_text(frame.seq, frame.text)
    assert message.gap == body and message.bytes is None


def test_a_takeover_record_of_counted_frames_has_no_range() -> None:
    gap = PendingGap("takeover", 9, None)
    body = gap_body(json.loads(gap_text(gap, GapPlacement(10, None, 11), until_ms=1)))
    assert body == {"reason": "takeover", "after_seq": 9, "since_ms": None, "until_ms": 1}


# --- binary frames --------------------------------------------------------------------------


@pytest.mark.parametrize("payload", [b"", b"\x00\x01\xff", bytes(range(256)) * 4,
                                     "é".encode()])
def test_binary_frames_round_trip(payload: bytes) -> None:
    text = binary_text(payload)
    assert binary_payload(json.loads(text)) == payload
    message = Message.of_text(3, text)
    assert message.bytes == payload and message.gap is None


@pytest.mark.parametrize("data", [
    None, "AAEC", ["AAEC"], {},
    {"streamlease_binary": 5},
    {"streamlease_binary": None},
    {"streamlease_binary": "AAEC", "seq": 1},  # more than the one key
    {"streamlease_binary": "not base64!"},
    {"streamlease_binary": "AAE"},  # bad padding
    {"streamlease_binary": "ÀÀ=="},  # not ASCII
    {"streamlease_gap": {"reason": "reconnect"}},
])
def test_only_binary_records_give_bytes(data: object) -> None:
    assert binary_payload(data) is None


@pytest.mark.parametrize("data", [
    None, [], {}, {"streamlease_gap": "reconnect"}, {"streamlease_gap": [1]},
    {"streamlease_gap": {"reason": "reconnect"}, "seq": 1},
    {"streamlease_binary": "AAEC"},
])
def test_only_gap_records_give_gap_fields(data: object) -> None:
    assert gap_body(data) is None


@pytest.mark.parametrize("text", [
    '{"seq": 1, "note": "streamlease_gap and streamlease_binary in a string"}',
    '{"streamlease_gap": {"reason": "reconnect"}, "seq": 1}',
    '{"streamlease_binary": "AAEC", "seq": 1}',
    '{"streamlease_gap": "x"}',
    '[{"streamlease_binary": "AAEC"}]',
    # Not JSON at all (a Python upstream's text, a test's): None, not an exception.
    "streamlease_gap streamlease_binary",
])
def test_look_alike_messages_are_neither_gaps_nor_binary(text: str) -> None:
    message = Message.of_text(1, text)
    assert message.gap is None and message.bytes is None


def test_a_message_built_with_its_data_uses_it() -> None:
    data = {"streamlease_binary": "AAEC"}
    assert Message(1, data, json.dumps(data)).bytes == b"\x00\x01\x02"
    assert Message(1, {"seq": 1}, '{"seq": 1}').bytes is None
