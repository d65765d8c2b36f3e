"""A binary frame and a gap record through the file output: each is a line whose ``data``
is the record's object, and a processor reading the line back gets the bytes or the fields."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from streamlease.core.upstream import GapPlacement, PendingGap, binary_text, gap_text
from streamlease.processor import Context, Message
from streamlease.sinks.files import FileProcessor

PAYLOAD = bytes(range(256))


async def test_binary_and_gap_records_are_lines_of_the_file_output(tmp_path: Path) -> None:
    gap = gap_text(PendingGap("reconnect", 1, 1_000), GapPlacement(2, None, 3), until_ms=2_000)
    batch = [Message.of_text(1, '{"seq": 1}'), Message.of_text(2, gap),
             Message.of_text(3, binary_text(PAYLOAD))]
    ctx = Context(stream_id="s1", fence=4, owner="w1", item={}, resume_after=0, checkpoint=0)
    await FileProcessor(tmp_path).process(batch, ctx)
    lines = [json.loads(line) for line in (tmp_path / "s1.jsonl").read_text().splitlines()]
    assert [(line["seq"], line["fence"]) for line in lines] == [(1, 4), (2, 4), (3, 4)]
    assert lines[2]["data"] == {"streamlease_binary": base64.b64encode(PAYLOAD).decode()}
    read_back = [Message(line["seq"], line["data"], json.dumps(line["data"])) for line in lines]
    assert [m.bytes for m in read_back] == [None, None, PAYLOAD]
    assert [m.gap for m in read_back] == [None, {"reason": "reconnect", "after_seq": 1,
                                                 "since_ms": 1_000, "until_ms": 2_000}, None]
