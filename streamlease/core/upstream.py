"""Which protocol a stream's upstream speaks, and what a feed that cannot replay costs.

A stream item names its profile (``profile``, else ``STREAMLEASE_DEFAULT_PROFILE``); the
``Catalog`` says which profile that is, or why the item cannot be served with it (an
unknown name, an attribute the profile's templates need and the item lacks). With
``STREAMLEASE_UPSTREAM=python:MODULE:ATTR`` one Python object speaks to every upstream and
the ``profile`` attribute is not consulted.

Gaps (docs/profiles.md, Resume). A profile with ``resume: none`` cannot ask for a replay:
what the feed sent while no connection of this stream was open is lost. The worker says
so in the stream itself: before the first message of a connection that may follow such a
loss, it delivers a *gap record*, a message whose data is ``{"streamlease_gap": {...}}``
and whose seq is the first number after the last message delivered. Its place in the
sequence is exact (every message lost there was sent between the message before it and
the message after it); its fields say why (``takeover`` or ``reconnect``), the range of
sequence numbers missing when the feed numbers its messages, and the wall-clock window
this worker knows of. A binary frame that is data is delivered as
``{"streamlease_binary": "<base64>"}`` (every sink stores text or JSON).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from streamlease.core.frames import Frame
from streamlease.core.profiles import BUILTIN, BUILTIN_PROFILE, Profile

PROFILE_ATTRIBUTE = "profile"
GAP_KEY = "streamlease_gap"
BINARY_KEY = "streamlease_binary"

GapReason = Literal["takeover", "reconnect"]
GAP_REASONS: tuple[GapReason, ...] = ("takeover", "reconnect")


@dataclass(frozen=True)
class Catalog:
    """The profiles a worker knows (the built-in ``streamlease`` always among them), the
    default for items that name none, and whether a Python upstream replaces them all."""

    profiles: Mapping[str, Profile]
    default: str = BUILTIN
    python: str | None = None  # STREAMLEASE_UPSTREAM=python:MODULE:ATTR, as given

    def choose(self, item: Mapping[str, Any]) -> Profile | str:
        """The profile for a stream item, or why there is none (a ``last_error`` text)."""
        name = item.get(PROFILE_ATTRIBUTE, self.default)
        if not isinstance(name, str):
            return "profile: must be a string"
        profile = self.profiles.get(name)
        if profile is None:
            known = ", ".join(sorted(self.profiles))
            return f"profile {name[:64]!r} is not defined (known: {known}; STREAMLEASE_PROFILES)"
        for attribute in sorted(profile.item_refs):
            value = item.get(attribute)
            if value is None:
                return (f"profile {name}: its templates use ${{item.{attribute}}} and the "
                        "item has no such attribute")
            if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
                return (f"profile {name}: ${{item.{attribute}}} must be a string or a "
                        "number")
        return profile

    def item_problem(self, item: Mapping[str, Any]) -> str | None:
        if self.python is not None:
            return None
        chosen = self.choose(item)
        return chosen if isinstance(chosen, str) else None


BUILTIN_CATALOG = Catalog({BUILTIN: BUILTIN_PROFILE})


# --- gaps ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PendingGap:
    """A connection opened where messages may have been lost; the record is due before
    its first message. ``since_ms`` is when this worker last knew the feed's position (the
    end of its previous connection), None after a takeover (then: since the message at
    ``after_seq`` was delivered)."""

    reason: GapReason
    after_seq: int
    since_ms: int | None


def gap_on_connect(replays: bool, first_connection: bool, committed: int,
                   reason_ms: int | None) -> PendingGap | None:
    """Whether a new connection may follow a loss. Feeds that replay lose nothing. A
    tenure's first connection follows a loss unless nothing was ever delivered (the feed
    is read from wherever it is when the stream is first served); every later one does."""
    if replays:
        return None
    if first_connection:
        return PendingGap("takeover", committed, None) if committed > 0 else None
    return PendingGap("reconnect", committed, reason_ms)


@dataclass(frozen=True)
class GapPlacement:
    """Where a pending gap goes, decided by the connection's first data frame: ``seq`` for
    the record, and the frame itself renumbered when the worker numbers frames."""

    seq: int
    missing: tuple[int, int] | None  # first and last seq missing, when the feed numbers
    frame_seq: int


def place_gap(gap: PendingGap, frame_seq: int, received: int, numbered: bool,
              max_seq_jump: int) -> GapPlacement | None:
    """The record for ``gap`` before a data frame numbered ``frame_seq``, or None if
    none is due before this frame.

    When the worker numbers frames (``seq: count``) the record takes ``received + 1`` and
    the frame the number after it: the loss is unknown, so it is always recorded. When the
    feed numbers them, a frame at or below ``received`` is a duplicate (no record yet), one
    right after it shows nothing was lost (no record; the gap is dismissed by the caller),
    and one a refused jump ahead is not placed either."""
    if numbered:
        return GapPlacement(received + 1, None, received + 2)
    if frame_seq <= received + 1 or frame_seq - received > max_seq_jump:
        return None
    return GapPlacement(received + 1, (received + 1, frame_seq - 1), frame_seq)


def gap_dismissed(gap: PendingGap, frame_seq: int, received: int, numbered: bool) -> bool:
    """True if a data frame at ``frame_seq`` shows nothing was lost (the feed's next number)."""
    return not numbered and frame_seq == received + 1


def gap_text(gap: PendingGap, placement: GapPlacement, until_ms: int) -> str:
    """The gap record's message text."""
    body: dict[str, Any] = {"reason": gap.reason, "after_seq": gap.after_seq,
                            "since_ms": gap.since_ms, "until_ms": until_ms}
    if placement.missing is not None:
        body["missing_from"], body["missing_to"] = placement.missing
    return json.dumps({GAP_KEY: body}, separators=(",", ":"))


def gap_frame(gap: PendingGap, placement: GapPlacement, until_ms: int) -> Frame:
    return Frame(placement.seq, gap_text(gap, placement, until_ms))


# --- binary frames ------------------------------------------------------------------------


def binary_text(data: bytes) -> str:
    """A binary frame as the message text every sink stores."""
    return '{"' + BINARY_KEY + '":"' + base64.b64encode(data).decode("ascii") + '"}'


def binary_payload(data: object) -> bytes | None:
    """The bytes of a message made by ``binary_text`` (given its parsed data), else None."""
    if not isinstance(data, dict) or len(data) != 1:
        return None
    encoded = data.get(BINARY_KEY)
    if not isinstance(encoded, str):
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None


def gap_body(data: object) -> dict[str, Any] | None:
    """The fields of a gap record (given a message's parsed data), else None."""
    if isinstance(data, dict) and len(data) == 1:
        body = data.get(GAP_KEY)
        if isinstance(body, dict):
            return body
    return None
