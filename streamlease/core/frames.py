"""Upstream frames: parse the sequence number, reject what is malformed
(docs/upstream-protocol.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from json.scanner import make_scanner

# DynamoDB numbers hold 38 digits; sequence numbers stay well inside a signed 64-bit int.
MAX_SEQ = 2**63 - 1

# ``json.loads``'s own scanner, called without its wrapper (the pump's per-frame path).
_scan = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # typeshed names the class


@dataclass(slots=True)
class Frame:
    seq: int
    text: str


@dataclass(frozen=True)
class Malformed:
    reason: str


def parse_frame(data: str | bytes) -> Frame | Malformed:
    """A text frame holding a JSON object with an integer ``seq`` (1 .. 2**63-1)."""
    if type(data) is str and data[:1] == "{" and data[-1:] == "}":
        # The pump's per-frame path: a text that is one object from its first character
        # to its last (no whitespace around it, no byte order mark) decodes through
        # json.loads' own scanner to the same value. Only a valid frame returns here;
        # anything else is judged by ``_parse`` from the start.
        try:
            obj, end = _scan(data, 0)
        except (StopIteration, ValueError, RecursionError):
            pass
        else:
            seq = obj.get("seq")
            if end == len(data) and type(seq) is int and 1 <= seq <= MAX_SEQ:
                return Frame(seq, data)
    return _parse(data)


def _parse(data: str | bytes) -> Frame | Malformed:
    if not isinstance(data, str):
        return Malformed("binary frame")
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        return Malformed("not JSON")
    if not isinstance(obj, dict):
        return Malformed(f"JSON {type(obj).__name__}, not an object")
    seq = obj.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, int):
        return Malformed("no integer seq")
    if not 1 <= seq <= MAX_SEQ:
        return Malformed(f"seq {seq} out of range")
    return Frame(seq, data)


def export_line(text: str) -> str:
    """A delivered frame on one line. JSON cannot hold a raw newline inside a string,
    so replacing line breaks between tokens with spaces keeps the object identical."""
    if "\n" in text or "\r" in text:
        return text.replace("\r", " ").replace("\n", " ")
    return text
