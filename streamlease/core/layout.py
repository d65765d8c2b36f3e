"""How member rows spread over partition keys as the fleet grows (pure).

DynamoDB serves about 1,000 write and 3,000 read units a second per partition-key value.
Every member heartbeats its own row (0.8 writes a second at the defaults) and reads the
leader's bulletin twice a second, so one ``MEMBER`` key carries a few hundred members at
most. A large fleet spreads its rows over ``shards`` keys (``MEMBER``, ``MEMBER#1``, ...),
and the leader writes a *replica* of its bulletin into each of them, so a member reads
only its own key:

* **the layout** is one number, ``shards``, a power of two in an item of the ``MEMBER``
  partition (absent: 1). Only the leader moves it, and only up (``shards_for``): a fleet
  that shrinks keeps its keys, which costs the leader one more Query per key.
* **a row's key** is fixed when the row is created: ``shard_of(worker id, shards)``. Later
  registrations of the same worker id move that row on wherever it is
  (``search_order``), so a worker id has one row, and a process keeps its key for life.
  Doubling ``shards`` leaves half of a key's new rows where they were: ``shard_of`` under
  ``2k`` is the shard under ``k`` or that plus ``k``.
* **the switch** happens only once every member row says its process reads this layout
  (``reads_layout``, the row's own incarnation nonce: a process of an older release that
  registers the row again writes a new nonce and leaves the old mark, which then no
  longer matches), so a rolling upgrade never has a member that reads only the leader's
  row while the leader lives under another key.

Everything here is pure: no I/O, no clock.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from streamlease.core.membership import MemberRecord, MemberStatus

MEMBER_PK = "MEMBER"
MAX_SHARDS = 256  # keys at most: 256 x MEMBERS_PER_KEY members
# Members per key before the leader spreads the rows (STREAMLEASE_MEMBERS_PER_KEY): at the
# default 1.25 s heartbeat, 200 members write 160 units a second into their key and read
# its replica 400 times a second (200 read units): a sixth and a fifteenth of the key's
# limits, leaving room for early beats, hand-off reads and a bulletin over 4 KB.
MEMBERS_PER_KEY = 200


def partition(shard: int) -> str:
    """The partition-key value of member rows in ``shard``."""
    if shard < 0:
        raise ValueError(f"a shard is 0 or more, got {shard}")
    return MEMBER_PK if shard == 0 else f"{MEMBER_PK}#{shard}"


def shard_of_partition(pk: str) -> int | None:
    """The shard a partition-key value names (None: not a member partition)."""
    if pk == MEMBER_PK:
        return 0
    prefix = MEMBER_PK + "#"
    if not pk.startswith(prefix) or not pk[len(prefix):].isdigit():
        return None
    shard = int(pk[len(prefix):])
    return shard if 0 < shard < MAX_SHARDS else None


def valid_shards(shards: int) -> int:
    """``shards`` as a layout: a power of two from 1 to ``MAX_SHARDS`` (an unreadable or
    hand-edited value counts as the nearest one below, never above)."""
    if shards < 1:
        return 1
    shards = min(shards, MAX_SHARDS)
    return 1 << (shards.bit_length() - 1)


def shard_of(worker_id: str, shards: int) -> int:
    """The key a new row of ``worker_id`` is created under (a stable hash, not Python's
    ``hash``, which differs between processes)."""
    return zlib.crc32(worker_id.encode()) % valid_shards(shards)


def search_order(worker_id: str, shards: int) -> list[int]:
    """Where an existing row of ``worker_id`` may live: its shard under this layout and
    under each smaller one it grew from, newest first, each once."""
    order: list[int] = []
    k = valid_shards(shards)
    while k >= 1:
        shard = shard_of(worker_id, k)
        if shard not in order:
            order.append(shard)
        k //= 2
    return order


def shards_for(members: int, current: int, per_key: int = MEMBERS_PER_KEY) -> int:
    """The layout for ``members`` rows: ``current`` doubled until each key holds at most
    ``per_key`` of them on average; never fewer keys than now."""
    shards = valid_shards(current)
    while shards < MAX_SHARDS and members > shards * max(1, per_key):
        shards *= 2
    return shards


def reads_layout(row: MemberRecord) -> bool:
    """Whether the process that registered ``row`` reads spread layouts."""
    return row.reads_layout is not None and row.reads_layout == row.incarnation


def may_spread(rows: Iterable[MemberRecord]) -> bool:
    """Every row that may still write (not DEAD) was registered by a process that reads
    spread layouts."""
    return all(reads_layout(row) for row in rows if row.status is not MemberStatus.DEAD)


@dataclass(frozen=True)
class Replica:
    """The leader's bulletin as copied into one key of a spread layout, with what a member
    watches of the leader's own row (its counter moves with every replica write)."""

    leader: str
    shard: int  # the key of the leader's own row
    epoch: int
    heartbeat: int
    fence: int  # the leader lease's fence: a replica never goes back to an older leader
    shards: int  # the layout the leader wrote it under
    bulletin: str
    status: MemberStatus = MemberStatus.ACTIVE  # the leader's (DRAINING: it hands over)
    handoffs: int = 0  # the leader's hand-over counter (a member reconciles when it moves)

    def leader_row(self) -> MemberRecord:
        """The leader's row as the replica shows it (what a member reads instead)."""
        return MemberRecord(self.leader, self.epoch, self.heartbeat, self.status,
                            handoffs=self.handoffs, bulletin=self.bulletin, shard=self.shard)


def one_row_each(rows: Iterable[MemberRecord]) -> tuple[list[MemberRecord], list[MemberRecord]]:
    """(the newest row of each worker id, the others). A worker id has one row, but a
    registration whose create was answered too late to count can land under one key after
    its retry created the row under another (the layout doubled in between): the older
    row was never used, and the leader deletes it."""
    newest: dict[str, MemberRecord] = {}
    older: list[MemberRecord] = []
    for row in rows:
        seen = newest.get(row.worker_id)
        if seen is None or row.epoch > seen.epoch:
            newest[row.worker_id] = row
            if seen is not None:
                older.append(seen)
        else:
            older.append(row)
    return sorted(newest.values(), key=lambda m: m.worker_id), older
