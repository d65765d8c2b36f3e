"""The fleet table's items <-> model values, and the membership rules as conditions.

One table, keyed ``Pk`` (S) + ``Sk`` (S), holds the fleet's own state; the partition
says what an item is, so each kind is read with one Query:

| Pk | Sk | item |
|---|---|---|
| ``MEMBER`` | worker id | a member row: epoch, heartbeat counter, status, streams held |
| ``LEADER`` | lease name | a leader lease: owner, fence, heartbeat counter, expiry |

Pure: no botocore, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from worker.core.leadership import LeaderRecord
from worker.core.membership import MemberRecord, MemberStatus
from worker.store.codec import Expr, n, s

PK = "Pk"
SK = "Sk"
MEMBER_PK = "MEMBER"
LEADER_PK = "LEADER"

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


# Leader leases.
OWNER = "owner"
FENCE = "fence"
EXPIRES = "expires_at_ms"  # the holder's own clock: 0 means resigned
ACQUIRED_AT = "acquired_at_ms"


def leader_key(name: str) -> Item:
    return {PK: s(LEADER_PK), SK: s(name)}


def decode_leader(item: Mapping[str, Any]) -> LeaderRecord | None:
    name = _str(item, SK)
    if _str(item, PK) != LEADER_PK or name is None:
        return None
    return LeaderRecord(name=name, owner=_str(item, OWNER), fence=_int(item, FENCE),
                        heartbeat=_int(item, HEARTBEAT), expires_at_ms=_int(item, EXPIRES))


_LEADER_NAMES = {"#pk": PK, "#owner": OWNER, "#fence": FENCE, "#hb": HEARTBEAT,
                 "#exp": EXPIRES, "#at": ACQUIRED_AT}


def leader_acquire_expr(owner: str, ttl_ms: int, now_ms: int, seen: LeaderRecord | None,
                        first_fence: int) -> Expr:
    """Take the lease if it is exactly as seen: absent; resigned under the fence seen; or
    held with the owner, fence and counter seen (observed unchanged for a time to live).
    The fence moves on by one, or starts at ``first_fence`` if the item is new."""
    values: dict[str, Any] = {":me": s(owner), ":exp": n(now_ms + ttl_ms), ":zero": n(0),
                              ":one": n(1), ":now": n(now_ms), ":first": n(first_fence - 1)}
    if seen is None:
        condition = "attribute_not_exists(#pk)"
    elif seen.resigned:
        condition = "#fence = :fence AND (#exp = :zero OR attribute_not_exists(#owner))"
        values[":fence"] = n(seen.fence)
    else:
        condition = "#owner = :owner AND #fence = :fence AND #hb = :hb"
        values.update({":owner": s(seen.owner or ""), ":fence": n(seen.fence),
                       ":hb": n(seen.heartbeat)})
    update = ("SET #owner = :me, #fence = if_not_exists(#fence, :first) + :one, #hb = :zero, "
              "#exp = :exp, #at = :now")
    return Expr(condition=condition, update=update,
                names=_used(_LEADER_NAMES, condition, update), values=values)


def _used(names: dict[str, str], *texts: str) -> dict[str, str]:
    """The placeholders that appear in these expressions (DynamoDB refuses unused ones)."""
    return {k: v for k, v in names.items() if any(re.search(re.escape(k) + r"\b", t)
                                                   for t in texts)}


def leader_renew_expr(owner: str, fence: int, ttl_ms: int, now_ms: int) -> Expr:
    return Expr(
        condition="#owner = :me AND #fence = :fence AND #exp <> :zero",
        update="SET #hb = #hb + :one, #exp = :exp",
        names={k: _LEADER_NAMES[k] for k in ("#owner", "#fence", "#exp", "#hb")},
        values={":me": s(owner), ":fence": n(fence), ":zero": n(0), ":one": n(1),
                ":exp": n(now_ms + ttl_ms)},
    )


def leader_resign_expr(owner: str, fence: int) -> Expr:
    return Expr(
        condition="#owner = :me AND #fence = :fence",
        update="SET #exp = :zero",
        names={k: _LEADER_NAMES[k] for k in ("#owner", "#fence", "#exp")},
        values={":me": s(owner), ":fence": n(fence), ":zero": n(0)},
    )


def leader_check(name: str, fence: int, table: str) -> dict[str, Any]:
    """The ConditionCheck that fences a write: the lease still carries this fence."""
    return {"ConditionCheck": {
        "TableName": table, "Key": leader_key(name),
        "ConditionExpression": "#fence = :fence",
        "ExpressionAttributeNames": {"#fence": FENCE},
        "ExpressionAttributeValues": {":fence": n(fence)},
    }}
