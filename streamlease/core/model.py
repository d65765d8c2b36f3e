"""Plain values shared by every layer: stream ids, stream records, tenures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

KEY_PREFIX = "CONN#"
MAX_LAST_ERROR_CHARS = 1000


def error_text(message: str) -> str:
    """``last_error`` as stored. Compare with this, not the full message, or a long
    message looks changed on every pass and is rewritten forever."""
    return message[:MAX_LAST_ERROR_CHARS]


class DesiredState(StrEnum):
    STARTED = "STARTED"
    STOPPED = "STOPPED"


def stream_key(stream_id: str) -> str:
    """The partition key of a stream: ``CONN#<stream_id>``."""
    return KEY_PREFIX + stream_id


def stream_id_from_key(pk: str) -> str | None:
    """The stream id in a partition key, or None if the key is not a stream key."""
    if not pk.startswith(KEY_PREFIX) or len(pk) == len(KEY_PREFIX):
        return None
    return pk[len(KEY_PREFIX):]


@dataclass(frozen=True)
class StreamRecord:
    """One streams-table item as the worker understands it.

    Fields the item lacks are None. ``desired_state`` keeps the raw string so an
    item with an unknown state can be reported rather than silently coerced.
    """

    stream_id: str
    desired_state: str | None
    ws_url: str | None
    lease_owner: str | None = None
    lease_expires_at_ms: int | None = None
    fence: int | None = None
    last_seq: int | None = None
    last_error: str | None = None
    last_error_at_ms: int | None = None
    lease_epoch: int | None = None  # the holder's member epoch when it acquired
    bad_fields: tuple[str, ...] = ()  # attributes present with the wrong type
    # Every attribute of the item as a plain Python value (the operator's own ones
    # included), for processors and templates; not part of equality.
    attributes: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def started(self) -> bool:
        return self.desired_state == DesiredState.STARTED.value

    @property
    def stopped(self) -> bool:
        return self.desired_state == DesiredState.STOPPED.value


@dataclass(frozen=True)
class Tenure:
    """One acquisition of one stream: who holds it, under which fence.

    Everything that acts for a stream is handed its tenure; the fence it carries is
    what the sink checks, so a tenure is useless once the fence has moved on.
    """

    stream_id: str
    owner: str
    fence: int
    last_seq: int | None
    expires_at_ms: int
    epoch: int = 0  # the owner's member epoch when it acquired

    @property
    def next_seq(self) -> int:
        """The first sequence number not yet durably delivered."""
        return (self.last_seq or 0) + 1


@dataclass(frozen=True)
class OwnedStream:
    """A stream some worker holds or last held, as the owner index shows it."""

    stream_id: str
    fence: int


@dataclass(frozen=True)
class EventMark:
    """Where a stream's sink already is: its newest events item's last seq and fence."""

    last_seq: int
    fence: int
