"""The fleet table's items <-> model values, and the membership rules as conditions.

One table, keyed ``Pk`` (S) + ``Sk`` (S), holds the fleet's own state; the partition
says what an item is, so each kind is read with one Query:

| Pk | Sk | item |
|---|---|---|
| ``MEMBER`` | worker id | a member row: epoch, heartbeat counter, status, streams held |

Pure: no botocore, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.core.membership import MemberRecord, MemberStatus
from worker.store.codec import Expr, n, s

PK = "Pk"
SK = "Sk"
MEMBER_PK = "MEMBER"

# Member rows.
EPOCH = "epoch"
HEARTBEAT = "heartbeat"
STATUS = "status"
STREAMS = "streams"
CAPACITY = "capacity"
HEARTBEAT_AT = "heartbeat_at_ms"  # the member's own wall clock: for people only
STARTED_AT = "started_at_ms"
RELEASED = "released"  # N 0/1: a DEAD member's streams were released on its behalf
HANDOFFS = "handoffs"  # N: bumped whenever the member hands streams over
FENCED_BY = "fenced_by"
FENCED_AT = "fenced_at_ms"

Item = dict[str, Any]


def member_key(worker_id: str) -> Item:
    return {PK: s(MEMBER_PK), SK: s(worker_id)}


def _int(item: Mapping[str, Any], name: str, default: int = 0) -> int:
    value = item.get(name)
    if isinstance(value, Mapping) and isinstance(value.get("N"), str):
        try:
            return int(value["N"])
        except ValueError:
            return default
    return default


def _str(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    if isinstance(value, Mapping) and isinstance(value.get("S"), str):
        return str(value["S"])
    return None


def decode_member(item: Mapping[str, Any]) -> MemberRecord | None:
    """A member row, or None if the item is not one (or is unreadable)."""
    if _str(item, PK) != MEMBER_PK:
        return None
    worker_id = _str(item, SK)
    status_text = _str(item, STATUS)
    if not worker_id or status_text is None or status_text not in MemberStatus.__members__:
        return None
    heartbeat_at = _int(item, HEARTBEAT_AT, -1)
    return MemberRecord(
        worker_id=worker_id,
        epoch=_int(item, EPOCH),
        heartbeat=_int(item, HEARTBEAT),
        status=MemberStatus(status_text),
        streams=_int(item, STREAMS),
        capacity=_int(item, CAPACITY),
        heartbeat_at_ms=None if heartbeat_at < 0 else heartbeat_at,
        released=_int(item, RELEASED) == 1,
        handoffs=_int(item, HANDOFFS),
    )


_NAMES = {
    "#epoch": EPOCH, "#hb": HEARTBEAT, "#status": STATUS, "#streams": STREAMS,
    "#cap": CAPACITY, "#hbat": HEARTBEAT_AT, "#started": STARTED_AT, "#released": RELEASED,
    "#handoffs": HANDOFFS, "#by": FENCED_BY, "#at": FENCED_AT,
}


def _names(*placeholders: str) -> dict[str, str]:
    return {p: _NAMES[p] for p in placeholders}


def register_expr(capacity: int, now_ms: int) -> Expr:
    """A new incarnation: the epoch moves past every earlier one of this worker id (so
    their conditional writes fail), the counter restarts, status ACTIVE."""
    return Expr(
        condition="",
        update=("SET #epoch = if_not_exists(#epoch, :zero) + :one, #hb = :zero, "
                "#status = :active, #streams = :zero, #cap = :cap, #hbat = :now, "
                "#started = :now, #released = :zero, #handoffs = :zero REMOVE #by, #at"),
        names=_names("#epoch", "#hb", "#status", "#streams", "#cap", "#hbat", "#started",
                     "#released", "#handoffs", "#by", "#at"),
        values={":zero": n(0), ":one": n(1), ":active": s(MemberStatus.ACTIVE.value),
                ":cap": n(capacity), ":now": n(now_ms)},
    )


def heartbeat_expr(epoch: int, status: MemberStatus, streams: int, capacity: int,
                   handoffs: int, now_ms: int) -> Expr:
    """Counter + 1, only under this member's epoch: a fenced member's heartbeat fails."""
    return Expr(
        condition="#epoch = :epoch",
        update=("SET #hb = #hb + :one, #status = :status, #streams = :streams, #cap = :cap, "
                "#handoffs = :handoffs, #hbat = :now"),
        names=_names("#epoch", "#hb", "#status", "#streams", "#cap", "#handoffs", "#hbat"),
        values={":epoch": n(epoch), ":one": n(1), ":status": s(status.value),
                ":streams": n(streams), ":cap": n(capacity), ":handoffs": n(handoffs),
                ":now": n(now_ms)},
    )


def fence_expr(seen: MemberRecord, by: str, now_ms: int) -> Expr:
    """Declare a member dead: its epoch moves on, conditioned on exactly what the peer
    observed (epoch and counter), so one peer wins and a member that heartbeated in the
    meantime is left alone."""
    return Expr(
        condition="#epoch = :epoch AND #hb = :hb AND #status <> :dead",
        update="SET #epoch = :next, #status = :dead, #released = :zero, #by = :by, #at = :now",
        names=_names("#epoch", "#hb", "#status", "#released", "#by", "#at"),
        values={":epoch": n(seen.epoch), ":hb": n(seen.heartbeat), ":next": n(seen.epoch + 1),
                ":dead": s(MemberStatus.DEAD.value), ":zero": n(0), ":by": s(by),
                ":now": n(now_ms)},
    )


def released_expr(epoch: int) -> Expr:
    """A DEAD member's streams are all released (its row can be forgotten later)."""
    return Expr(
        condition="#epoch = :epoch AND #status = :dead",
        update="SET #released = :one",
        names=_names("#epoch", "#status", "#released"),
        values={":epoch": n(epoch), ":dead": s(MemberStatus.DEAD.value), ":one": n(1)},
    )


def leave_condition(epoch: int) -> Expr:
    return Expr(condition="#epoch = :epoch", names=_names("#epoch"),
                values={":epoch": n(epoch)})
