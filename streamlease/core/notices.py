"""Notices: what the fleet leader's change feed tells one member, carried in its bulletin.

The leader tails the streams table's change feed (``streamlease.feed``). Most changes need
one member to act: the holder of a stream flipped to ``STOPPED``, given a new ``ws_url`` or
force released reads its item now (``CHECK``), and a stream released or newly started is
offered to the member with most room (``OFFER``). A ``Notice`` names the member, the stream
and what to do; the ``NoticeBoard`` keeps the leader's recent notices for ``ttl_s`` so
that every member, reading the leader's row once a read interval, sees each notice at
least once, and numbers them so that a member acts on each once (acting twice is harmless:
a consistent read, an orphan query).

The board is bounded: past ``limit`` notices the oldest go, and the board says it
``overflowed`` until the dropped one would have expired, so members fall back to their
own polls for a while instead of trusting notices that may be missing.

Pure: no I/O; the caller passes the time (monotonic seconds).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

MAX_NOTICES = 128  # in one bulletin: about 60 bytes each, read by every member


class NoticeKind(StrEnum):
    CHECK = "check"  # read the stream's item now and act on it (stopped, repointed, fenced)
    OFFER = "offer"  # the stream is free and started: look for orphans now


NOTICE_KINDS = tuple(k.value for k in NoticeKind)  # metric label values


@dataclass(frozen=True)
class Notice:
    n: int  # unique within a leader's term; members act on each number once
    member: str
    stream: str
    kind: NoticeKind


class NoticeBoard:
    """The leader's recent notices (see the module doc)."""

    def __init__(self, first: int, ttl_s: float, limit: int = MAX_NOTICES) -> None:
        self.ttl_s = ttl_s
        self.limit = limit
        self._next = first
        self._posted: deque[tuple[float, Notice]] = deque()
        self._overflow_until = float("-inf")

    def post(self, member: str, stream: str, kind: NoticeKind, now: float) -> Notice:
        notice = Notice(self._next, member, stream, kind)
        self._next += 1
        self._posted.append((now, notice))
        while len(self._posted) > self.limit:
            at, _ = self._posted.popleft()
            self._overflow_until = max(self._overflow_until, at + self.ttl_s)
        return notice

    def current(self, now: float) -> tuple[Notice, ...]:
        """The notices still on the board (expired ones dropped)."""
        while self._posted and self._posted[0][0] + self.ttl_s <= now:
            self._posted.popleft()
        return tuple(notice for _, notice in self._posted)

    def overflowed(self, now: float) -> bool:
        """A notice left the board before its time: members may have missed it."""
        return now < self._overflow_until

    @property
    def last(self) -> int:
        """The number of the newest notice posted (one below the first: none yet)."""
        return self._next - 1


def fresh(notices: tuple[Notice, ...], me: str, seen: frozenset[int]) -> list[Notice]:
    """The notices for ``me`` not among ``seen`` (the numbers of the last bulletin read)."""
    return [n for n in notices if n.member == me and n.n not in seen]


@dataclass
class Room:
    """What a member can still take: up to its fair share, and up to its capacity."""

    to_share: int
    to_capacity: int


def rooms_of(members: Iterable[tuple[str, int, int]], level: int | None) -> dict[str, Room]:
    """Each (member, streams, capacity)'s room under the fair-share ``level`` (None: no
    level known, the share is the capacity)."""
    return {wid: Room(max(0, min(capacity, capacity if level is None else level) - streams),
                      max(0, capacity - streams))
            for wid, streams, capacity in members}


def most_room(rooms: dict[str, Room]) -> str | None:
    """Whom to offer a stream: a member below its share first (one at its share would only
    shed it again), the furthest below; else the member with the most room to its
    capacity (the share grows). Ties: the lowest id. The member is then counted one stream
    fuller; None when nobody has room."""
    best = min(rooms.items(), key=lambda kv: (-kv[1].to_share, -kv[1].to_capacity, kv[0]),
               default=None)
    if best is None or best[1].to_capacity <= 0:
        return None
    room = best[1]
    room.to_share, room.to_capacity = max(0, room.to_share - 1), room.to_capacity - 1
    return best[0]
