"""Items <-> model values, attribute names, and the lease rules as DynamoDB expressions.

Pure: no botocore, no I/O. Each expression here is the translation of one rule in
``streamlease.core.lease``; keep the two in step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from boto3.dynamodb.types import Binary, TypeDeserializer

from streamlease.core.frames import Frame
from streamlease.core.lease import CleanRelease
from streamlease.core.model import (
    EventMark,
    StreamRecord,
    Tenure,
    error_text,
    stream_id_from_key,
    stream_key,
)
from streamlease.core.upstream import PROFILE_ATTRIBUTE
from streamlease.errors import SinkConflict, StaleFence
from streamlease.store.protocols import SinkOutcome

# Streams table (docs/contract.md).
PK = "Pk"
DESIRED_STATE = "desired_state"
WS_URL = "ws_url"
LEASE_OWNER = "lease_owner"
LEASE_EXPIRES = "lease_expires_at_ms"
FENCE = "fence"
LAST_SEQ = "last_seq"
LAST_ERROR = "last_error"
LAST_ERROR_AT = "last_error_at_ms"
LEASE_EPOCH = "lease_epoch"  # the holder's member epoch when it acquired the lease
PROFILE = PROFILE_ATTRIBUTE  # the stream's upstream profile (docs/profiles.md)
# The W3C traceparent of the span that last released the lease (a holder's release or a
# release on a fenced member's behalf), written in the same write, only while tracing is on:
# the next holder's acquisition span links to it (streamlease.tracing).
TRACE_PARENT = "trace_parent"
# A holder's clean release (M: fence, last_seq, at_ms), written by the release itself: the
# next holder resumes from last_seq without reading the sink (core.lease.checkpoint_trusted).
CLEAN_RELEASE = "clean_release"
# A taker's no to a live hand-over (S: "<fence>:<taker>", ``core.handover``), written under
# the holder's fence: the holder releases the stream at once instead of waiting.
HANDOVER_DECLINED = "handover_declined"
INDEX_NAME = "desired_state-lease_expires_at_ms-index"
OWNER_INDEX_NAME = "lease_owner-fence-index"
# What the orphan index holds besides its keys and Pk: enough to plan without reading the
# item, and nothing that a checkpoint or a renewal alone changes.
INDEX_PROJECTED = (WS_URL, LEASE_OWNER, FENCE, LEASE_EPOCH, LAST_ERROR)

# Events table (ours): one item holds a run of consecutive deliveries of one stream.
EV_PK = "Pk"  # CONN#<stream_id>, as in the streams table
EV_SK = "Sk"  # N: first seq in the item
EV_LAST = "last"  # N: last seq in the item
EV_FENCE = "fence"  # N: the fence the batch was written under
EV_MSGS = "msgs"  # L of S: the frames as received, in seq order
EV_SEQS = "seqs"  # L of N: their sequence numbers (seqs may skip: a gap)
EV_AT = "at_ms"  # N: wall time of the write
EV_EXPIRES = "expires_at"  # N: epoch seconds; DynamoDB's TTL deletes the item after it

# DynamoDB limits that shape batches: 400 KB an item, 100 actions and 4 MB a transaction.
ITEM_TEXT_BUDGET = 350_000
MAX_TRANSACT_ACTIONS = 100

Item = dict[str, Any]


def s(value: str) -> dict[str, str]:
    return {"S": value}


def n(value: int) -> dict[str, str]:
    return {"N": str(value)}


def key(stream_id: str) -> Item:
    return {PK: s(stream_key(stream_id))}


def _str(item: Mapping[str, Any], name: str) -> str | None:
    value = item.get(name)
    if isinstance(value, Mapping) and isinstance(value.get("S"), str):
        return str(value["S"])
    return None


def _int(item: Mapping[str, Any], name: str) -> int | None:
    value = item.get(name)
    if not isinstance(value, Mapping) or not isinstance(value.get("N"), str):
        return None
    try:
        number = int(value["N"])
    except ValueError:
        try:
            as_float = float(value["N"])
        except ValueError:
            return None
        return int(as_float) if as_float.is_integer() else None
    return number


def decode_record(item: Mapping[str, Any]) -> StreamRecord | None:
    """A streams item as a record; None if its key is not ``CONN#<id>``.

    Attributes of the wrong type read as absent: the worker then reports the item as
    unservable rather than crash on it.
    """
    pk = _str(item, PK)
    stream_id = stream_id_from_key(pk) if pk is not None else None
    if stream_id is None:
        return None
    bad = tuple(
        f"{name} is not {'a string' if kind == 'S' else 'a whole number'}"
        for name, kind in FIELD_TYPES
        if name in item and (_str(item, name) if kind == "S" else _int(item, name)) is None
    )
    return StreamRecord(
        stream_id=stream_id,
        desired_state=_raw_state(item),
        ws_url=_str(item, WS_URL),
        lease_owner=_str(item, LEASE_OWNER),
        lease_expires_at_ms=_int(item, LEASE_EXPIRES),
        fence=_int(item, FENCE),
        last_seq=_int(item, LAST_SEQ),
        last_error=_str(item, LAST_ERROR),
        last_error_at_ms=_int(item, LAST_ERROR_AT),
        lease_epoch=_int(item, LEASE_EPOCH),
        bad_fields=bad,
        attributes=plain(item),
    )


def trace_parent(record: StreamRecord) -> str | None:
    """The item's ``trace_parent`` as stored: None if it has none; a value that is not a
    string as its Python text (which no traceparent parser accepts: it is reported, not
    linked)."""
    value = record.attributes.get(TRACE_PARENT)
    return value if value is None or isinstance(value, str) else repr(value)


_DESERIALIZER = TypeDeserializer()


def plain(item: Mapping[str, Any]) -> dict[str, Any]:
    """An item in DynamoDB JSON as plain Python values: numbers as int (or Decimal when
    fractional), sets as sets, binary as bytes. An attribute that does not decode is
    left out."""
    out: dict[str, Any] = {}
    for name, value in item.items():
        try:
            out[name] = _plain(_DESERIALIZER.deserialize(value))
        except (TypeError, ValueError, KeyError, AttributeError):
            continue
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else value
    if isinstance(value, Binary):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, set):
        return {_plain(v) for v in value}
    return value


# Attributes whose type the worker relies on; ``desired_state`` is reported verbatim.
FIELD_TYPES = ((WS_URL, "S"), (LEASE_OWNER, "S"), (LEASE_EXPIRES, "N"), (FENCE, "N"),
               (LAST_SEQ, "N"), (LEASE_EPOCH, "N"))


def _raw_state(item: Mapping[str, Any]) -> str | None:
    value = item.get(DESIRED_STATE)
    if value is None:
        return None
    if isinstance(value, Mapping) and isinstance(value.get("S"), str):
        return str(value["S"])
    return f"<{next(iter(value), 'unknown') if isinstance(value, Mapping) else 'unknown'} value>"


@dataclass(frozen=True)
class Expr:
    """One condition/update expression with its names and values."""

    condition: str
    names: dict[str, str]
    values: dict[str, Any]
    update: str | None = None

    def update_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for UpdateItem/DeleteItem (no condition when it is empty)."""
        out: dict[str, Any] = {"ExpressionAttributeNames": self.names}
        if self.condition:
            out["ConditionExpression"] = self.condition
        if self.values:
            out["ExpressionAttributeValues"] = self.values
        if self.update is not None:
            out["UpdateExpression"] = self.update
        return out


NAMES = {
    "#pk": PK, "#ds": DESIRED_STATE, "#url": WS_URL, "#owner": LEASE_OWNER,
    "#exp": LEASE_EXPIRES, "#fence": FENCE, "#last": LAST_SEQ,
    "#err": LAST_ERROR, "#errat": LAST_ERROR_AT, "#epoch": LEASE_EPOCH,
    "#tp": TRACE_PARENT, "#clean": CLEAN_RELEASE, "#declined": HANDOVER_DECLINED,
}


def _names(*placeholders: str) -> dict[str, str]:
    return {p: NAMES[p] for p in placeholders}


def acquire_expr(owner: str, new_expiry_ms: int, threshold_ms: int, epoch: int) -> Expr:
    """``can_acquire`` + ``next_fence``, stamping the holder's member epoch (so a peer
    releasing a dead incarnation's streams never touches a newer incarnation's).
    ``attribute_exists(Pk)`` keeps an acquire from creating an item an operator deleted
    (UpdateItem would otherwise upsert it)."""
    return Expr(
        condition=(
            "attribute_exists(#pk) AND #ds = :started AND "
            "(attribute_not_exists(#exp) OR #exp < :threshold) AND "
            # The orphan index does not hold last_seq (so checkpoints never write it): a
            # wrongly typed one is refused here instead; the sweep reports it.
            "(attribute_not_exists(#last) OR attribute_type(#last, :number))"
        ),
        update=("SET #owner = :me, #exp = :exp, #epoch = :epoch, "
                "#fence = if_not_exists(#fence, :zero) + :one"),
        names=_names("#pk", "#ds", "#exp", "#owner", "#fence", "#epoch", "#last"),
        values={
            ":started": s("STARTED"), ":threshold": n(threshold_ms), ":me": s(owner),
            ":exp": n(new_expiry_ms), ":zero": n(0), ":one": n(1), ":epoch": n(epoch),
            ":number": s("N"),
        },
    )


def renew_expr(owner: str, fence: int, new_expiry_ms: int) -> Expr:
    """``holds`` and not released: never resurrects a lease someone else took, one that
    was force released, or one released (expiry 0, by this holder or an operator)."""
    return Expr(
        condition="#owner = :me AND #fence = :fence AND #exp <> :zero",
        update="SET #exp = :exp",
        names=_names("#owner", "#fence", "#exp"),
        values={":me": s(owner), ":fence": n(fence), ":exp": n(new_expiry_ms), ":zero": n(0)},
    )


def release_expr(owner: str, fence: int, trace_parent: str | None = None,
                 clean: CleanRelease | None = None) -> Expr:
    """Expiry 0 (free now); owner and fence stay, so the history is kept (docs/contract.md).
    With ``trace_parent`` (tracing on), the releasing span's context goes in the same write;
    with ``clean`` (the final flush wrote the checkpoint), the mark the next holder trusts."""
    expr = Expr(
        condition="#owner = :me AND #fence = :fence",
        update="SET #exp = :zero",
        names=_names("#owner", "#fence", "#exp"),
        values={":me": s(owner), ":fence": n(fence), ":zero": n(0)},
    )
    return _with_trace_parent(
        _also_set(expr, "#clean", None if clean is None else clean_release_value(clean)),
        trace_parent)


def clean_release_value(clean: CleanRelease) -> dict[str, Any]:
    return {"M": {"fence": n(clean.fence), "last_seq": n(clean.last_seq),
                  "at_ms": n(clean.at_ms)}}


def clean_release(record: StreamRecord) -> CleanRelease | None:
    """The item's ``clean_release`` mark; None if it has none or one that does not read as
    three whole numbers (the checkpoint is then not trusted: the sink is read)."""
    value = record.attributes.get(CLEAN_RELEASE)
    if not isinstance(value, Mapping):
        return None
    fence, last_seq, at_ms = (value.get(name) for name in ("fence", "last_seq", "at_ms"))
    if type(fence) is int and type(last_seq) is int and type(at_ms) is int:
        return CleanRelease(fence, last_seq, at_ms)
    return None


def _with_trace_parent(expr: Expr, trace_parent: str | None) -> Expr:
    """A release's update that also stores ``trace_parent`` (nothing more without one: a
    worker that does not trace names no other attribute than before)."""
    return _also_set(expr, "#tp", None if trace_parent is None else s(trace_parent))


def _also_set(expr: Expr, name: str, value: dict[str, Any] | None) -> Expr:
    """``expr`` whose ``SET`` also writes ``value`` to the attribute ``name`` (a ``NAMES``
    placeholder, its value placeholder the same word after ``:``); ``expr`` as it is
    without a value."""
    if value is None:
        return expr
    placeholder = f":{name[1:]}"
    return Expr(condition=expr.condition, update=f"{expr.update}, {name} = {placeholder}",
                names={**expr.names, **_names(name)}, values={**expr.values, placeholder: value})


def force_release_expr(expect_owner: str | None, expect_fence: int | None) -> Expr:
    """Expiry 0 and fence + 1 in one write: the old holder is fenced out on return."""
    parts = ["attribute_exists(#pk)"]
    names = _names("#pk", "#exp", "#fence")
    values: dict[str, Any] = {":zero": n(0), ":one": n(1)}
    if expect_owner is not None:
        parts.append("#owner = :owner")
        names.update(_names("#owner"))
        values[":owner"] = s(expect_owner)
    if expect_fence is not None:
        parts.append("#fence = :fence")
        values[":fence"] = n(expect_fence)
    return Expr(
        condition=" AND ".join(parts),
        # A trace context left by an earlier release is not this release's: the next
        # holder must not link to it.
        update="SET #exp = :zero, #fence = if_not_exists(#fence, :zero) + :one REMOVE #tp",
        names={**names, **_names("#tp")},
        values=values,
    )


def release_for_expr(owner: str, fence: int, fenced_epoch: int,
                     trace_parent: str | None = None) -> Expr:
    """A peer releases a dead member's stream on its behalf: expiry 0 and fence + 1 in one
    write, conditioned on the owner and fence it saw, on the lease being held, and on the
    lease having been taken by an incarnation older than the fenced epoch. With
    ``trace_parent``, the releasing span's context goes in the same write."""
    return _with_trace_parent(Expr(
        condition=("#owner = :owner AND #fence = :fence AND #exp <> :zero AND "
                   "(attribute_not_exists(#epoch) OR #epoch < :epoch)"),
        update="SET #exp = :zero, #fence = #fence + :one",
        names=_names("#owner", "#fence", "#exp", "#epoch"),
        values={":owner": s(owner), ":fence": n(fence), ":zero": n(0), ":one": n(1),
                ":epoch": n(fenced_epoch)},
    ), trace_parent)


def take_over_expr(dead_owner: str, fenced_epoch: int, owner: str, epoch: int,
                   new_expiry_ms: int) -> Expr:
    """``can_take_over`` + ``next_fence``: a dead incarnation's held, STARTED stream passes
    to ``owner`` (its epoch and a fresh expiry) in one write, fence + 1."""
    return Expr(
        condition=("attribute_exists(#pk) AND #ds = :started AND #owner = :dead AND "
                   "#exp <> :zero AND attribute_exists(#fence) AND "
                   "(attribute_not_exists(#epoch) OR #epoch < :fenced) AND "
                   "(attribute_not_exists(#last) OR attribute_type(#last, :number))"),
        update="SET #owner = :me, #exp = :exp, #epoch = :epoch, #fence = #fence + :one",
        names=_names("#pk", "#ds", "#owner", "#exp", "#fence", "#epoch", "#last"),
        values={":started": s("STARTED"), ":dead": s(dead_owner), ":zero": n(0),
                ":fenced": n(fenced_epoch), ":number": s("N"), ":me": s(owner),
                ":exp": n(new_expiry_ms), ":epoch": n(epoch), ":one": n(1)},
    )


def take_handed_expr(holder: str, fence: int, owner: str, epoch: int,
                     new_expiry_ms: int) -> Expr:
    """A stream its live holder offered (``streamlease.core.handover``) passes to ``owner``
    in one write, fence + 1, if the holder still holds it under ``fence`` (held: a
    released or force-released lease is an orphan, taken the usual way)."""
    return Expr(
        condition=("attribute_exists(#pk) AND #ds = :started AND #owner = :holder AND "
                   "#fence = :fence AND #exp <> :zero AND "
                   "(attribute_not_exists(#last) OR attribute_type(#last, :number))"),
        update="SET #owner = :me, #exp = :exp, #epoch = :epoch, #fence = #fence + :one",
        names=_names("#pk", "#ds", "#owner", "#exp", "#fence", "#epoch", "#last"),
        values={":started": s("STARTED"), ":holder": s(holder), ":fence": n(fence),
                ":zero": n(0), ":number": s("N"), ":me": s(owner), ":exp": n(new_expiry_ms),
                ":epoch": n(epoch), ":one": n(1)},
    )


def decline_expr(holder: str, fence: int, declined: str) -> Expr:
    """A taker's no to an offer, on the item, only while the holder holds it under
    ``fence`` (a later tenure is never touched)."""
    return Expr(
        condition="#owner = :holder AND #fence = :fence",
        update="SET #declined = :declined",
        names=_names("#owner", "#fence", "#declined"),
        values={":holder": s(holder), ":fence": n(fence), ":declined": s(declined)},
    )


def handover_declined(record: StreamRecord) -> str | None:
    """The item's ``handover_declined`` (None if it has none, or not a string)."""
    value = record.attributes.get(HANDOVER_DECLINED)
    return value if isinstance(value, str) else None


def adopt_expr() -> Expr:
    """Give a hand-written item ``lease_expires_at_ms = 0`` so the sparse index sees it."""
    return Expr(
        condition="attribute_exists(#pk) AND attribute_not_exists(#exp)",
        update="SET #exp = :zero",
        names=_names("#pk", "#exp"),
        values={":zero": n(0)},
    )


def record_error_expr(message: str, at_ms: int) -> Expr:
    return Expr(
        condition="attribute_exists(#pk)",
        update="SET #err = :err, #errat = :at",
        names=_names("#pk", "#err", "#errat"),
        values={":err": s(error_text(message)), ":at": n(at_ms)},
    )


def advance_expr(owner: str, fence: int, new_fence: int, last_seq: int) -> Expr:
    """``resume_point`` applied: this tenure's fence and checkpoint move forward together,
    only while the item still names this owner and fence."""
    return Expr(
        condition="#owner = :me AND #fence = :fence",
        update="SET #fence = :newfence, #last = :last",
        names=_names("#owner", "#fence", "#last"),
        values={":me": s(owner), ":fence": n(fence), ":newfence": n(new_fence),
                ":last": n(last_seq)},
    )


def checkpoint_expr(owner: str, fence: int, prev_seq: int, last_seq: int) -> Expr:
    """The sink's lease check: this owner, this fence, and the checkpoint where this
    holder left it. ``prev_seq`` 0 also matches an item that never had a ``last_seq``."""
    if prev_seq == 0:
        seq_cond = "(attribute_not_exists(#last) OR #last = :prev)"
    else:
        seq_cond = "#last = :prev"
    return Expr(
        condition=f"#owner = :me AND #fence = :fence AND {seq_cond}",
        update="SET #last = :last",
        names=_names("#owner", "#fence", "#last"),
        values={":me": s(owner), ":fence": n(fence), ":prev": n(prev_seq), ":last": n(last_seq)},
    )


def chunk_frames(frames: Iterable[Frame], budget: int = ITEM_TEXT_BUDGET) -> list[list[Frame]]:
    """Split a batch into runs that each fit one events item."""
    chunks: list[list[Frame]] = []
    current: list[Frame] = []
    size = 0
    for frame in frames:
        cost = len(frame.text.encode()) + 32
        if current and size + cost > budget:
            chunks.append(current)
            current, size = [], 0
        current.append(frame)
        size += cost
    if current:
        chunks.append(current)
    return chunks


def event_item(stream_id: str, fence: int, frames: list[Frame], at_ms: int,
               ttl_s: int = 0) -> Item:
    """One events item; with ``ttl_s`` it carries ``expires_at`` (epoch seconds, write time
    plus ``ttl_s``), which the events table's TTL deletes some time after it passes."""
    item = {
        EV_PK: s(stream_key(stream_id)),
        EV_SK: n(frames[0].seq),
        EV_LAST: n(frames[-1].seq),
        EV_FENCE: n(fence),
        EV_SEQS: {"L": [n(f.seq) for f in frames]},
        EV_MSGS: {"L": [s(f.text) for f in frames]},
        EV_AT: n(at_ms),
    }
    if ttl_s:
        item[EV_EXPIRES] = n(at_ms // 1000 + ttl_s)
    return item


def item_size(item: Mapping[str, Any]) -> int:
    """An item's size by DynamoDB's rules (what a write is billed on, per started KB):
    each attribute's name plus its value; a string its UTF-8 bytes, a number one byte a
    pair of significant digits plus one, a list or map 3 bytes plus one a element."""
    return sum(len(name.encode()) + _value_size(value) for name, value in item.items())


def _value_size(value: Mapping[str, Any]) -> int:
    (kind, data), = value.items()
    if kind == "S":
        return len(str(data).encode())
    if kind == "N":
        digits = str(data).lstrip("-").replace(".", "").strip("0") or "0"
        return (len(digits) + 1) // 2 + 1
    if kind == "B":
        return len(data)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "L":
        return 3 + sum(1 + _value_size(v) for v in data)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + _value_size(v) for k, v in data.items())
    if kind in ("SS", "NS", "BS"):
        return sum(_value_size({kind[0]: v}) for v in data)
    raise ValueError(f"unknown attribute type {kind}")


def decode_event_item(item: Mapping[str, Any]) -> list[Frame]:
    seqs = item.get(EV_SEQS, {}).get("L", [])
    msgs = item.get(EV_MSGS, {}).get("L", [])
    return [Frame(int(sq["N"]), str(m["S"])) for sq, m in zip(seqs, msgs, strict=True)]


def decode_event_mark(item: Mapping[str, Any]) -> EventMark | None:
    last, fence = _int(item, EV_LAST), _int(item, EV_FENCE)
    return None if last is None or fence is None else EventMark(last, fence)


def refused_batch(codes: list[str], old: StreamRecord | None, tenure: Tenure,
                  first: int, last: int) -> SinkOutcome:
    """What a cancelled sink transaction means, from its reasons (one per action: the
    checkpoint Update first, then the events Puts) and the streams item as it was.

    A re-sent batch that already landed returns ALREADY_COMMITTED; a stale fence raises
    StaleFence; anything else (a checkpoint or events item moved by something outside the
    protocol) raises SinkConflict.
    """
    if not codes or codes[0] != "ConditionalCheckFailed":
        if "ConditionalCheckFailed" in codes[1:]:
            raise SinkConflict(f"stream {tenure.stream_id}: an events item of batch "
                               f"{first}..{last} already exists")
        raise SinkConflict(f"sink transaction cancelled: {codes}")
    if old is None or old.lease_owner != tenure.owner or old.fence != tenure.fence:
        found = "missing" if old is None else f"owner={old.lease_owner} fence={old.fence}"
        raise StaleFence(f"stream {tenure.stream_id}: fence {tenure.fence} is stale ({found})")
    if old.last_seq is not None and old.last_seq >= last:
        return SinkOutcome.ALREADY_COMMITTED
    raise SinkConflict(
        f"stream {tenure.stream_id}: checkpoint is {old.last_seq}, batch {first}..{last} "
        "does not follow it")
