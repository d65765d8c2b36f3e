"""The events item against DynamoDB's size rules: what a sink write is billed on."""

from __future__ import annotations

import pytest

from streamlease.core.frames import Frame
from streamlease.core.stream import WRITE_UNIT_BYTES, StreamMachine, StreamRules
from streamlease.store import codec


@pytest.mark.parametrize(("name", "value", "size"), [
    ("a string: its UTF-8 bytes", {"S": "h\u00e9"}, 3),
    ("a number: a byte a pair of significant digits, plus one", {"N": "12345"}, 4),
    ("zeros around the digits are not significant", {"N": "1000"}, 2),
    ("a list: 3 bytes plus a byte an element", {"L": [{"S": "ab"}, {"N": "7"}]}, 3 + 3 + 3),
    ("a map: its keys count too", {"M": {"k": {"S": "v"}}}, 3 + 1 + 1 + 1),
], ids=lambda v: v if isinstance(v, str) else "")
def test_item_size_follows_dynamodbs_rules(name: str, value: dict[str, object],
                                           size: int) -> None:
    assert codec.item_size({"a": value}) == 1 + size


@pytest.mark.parametrize("text_bytes", [1, 10, 100, 300, 800])
@pytest.mark.parametrize("stream_id", ["s1", "x" * 100])
def test_a_batch_cut_by_the_fill_is_one_write_unit_of_events_item(text_bytes: int,
                                                                  stream_id: str) -> None:
    """The machine's default fill (one write unit less the item's own attributes) keeps
    every events item it cuts within 1 KB, for stream ids up to 100 bytes, seqs up to 10**12,
    with a TTL; and it is cut close to that, not far below."""
    machine = StreamMachine(StreamRules(first_batch_s=60.0), 10**12 - 2000)
    assert machine.connect(0.0) is not None
    seq = 10**12 - 2000
    while machine.next_batch() is None:
        seq += 1
        machine.receive(Frame(seq, "y" * text_bytes), 100, 0.0)
    batch = machine.next_batch()
    assert batch is not None
    item = codec.event_item(stream_id, 2**31, batch, 1_800_000_000_000, ttl_s=86_400 * 365)
    size = codec.item_size(item)
    assert size <= WRITE_UNIT_BYTES or len(batch) == 1
    if len(batch) > 1:  # the unit is mostly used, not cut early
        assert size > 0.6 * WRITE_UNIT_BYTES
