"""The change feed's checkpoints: where the fleet leader has read each shard up to.

One item per shard in the fleet table: ``Pk = FEED``, ``Sk = <shard id>``, with ``seq`` (S:
the sequence number of the last record whose actions were carried out), ``fence`` (N: the
leader fence of the reader that wrote it) and ``at_ms`` (N: when). A write is refused
when the item already carries a higher fence: once a newer leader has checkpointed a
shard, a deposed one's late write cannot move it (``may_write`` is the rule; the DynamoDB
store's condition says the same, ``attribute_not_exists(Pk) OR fence <= :fence``). Losing
that race is a value (``False``), not an error.

A write under the leader lease itself (refused as soon as the lease has moved on, before
the new leader has written anything) is available too: ``checkpoint_put`` is the Put
action, for ``LeaderLease.fenced_write(Transaction([...]))``.

This module is pure (codec, rule, protocol) plus the in-memory store; the DynamoDB store is
``streamlease.store.dynamodb.feedcheckpoints``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

FEED_PK = "FEED"
PK = "Pk"
SK = "Sk"
SEQ = "seq"
FENCE = "fence"
AT = "at_ms"

CONDITION = "attribute_not_exists(#pk) OR #fence <= :fence"


@dataclass(frozen=True)
class Checkpoint:
    shard_id: str
    sequence_number: str
    fence: int
    at_ms: int


def may_write(existing_fence: int | None, fence: int) -> bool:
    """A checkpoint may be written (or forgotten) unless a higher fence wrote it."""
    return existing_fence is None or existing_fence <= fence


def key(shard_id: str) -> dict[str, Any]:
    return {PK: {"S": FEED_PK}, SK: {"S": shard_id}}


def item(checkpoint: Checkpoint) -> dict[str, Any]:
    return {**key(checkpoint.shard_id), SEQ: {"S": checkpoint.sequence_number},
            FENCE: {"N": str(checkpoint.fence)}, AT: {"N": str(checkpoint.at_ms)}}


def condition_kwargs(fence: int) -> dict[str, Any]:
    return {"ConditionExpression": CONDITION,
            "ExpressionAttributeNames": {"#pk": PK, "#fence": FENCE},
            "ExpressionAttributeValues": {":fence": {"N": str(fence)}}}


def checkpoint_put(table: str, checkpoint: Checkpoint) -> dict[str, Any]:
    """The TransactWriteItems ``Put`` action of a checkpoint (for a leader-fenced write)."""
    return {"Put": {"TableName": table, "Item": item(checkpoint), **condition_kwargs(
        checkpoint.fence)}}


def decode(raw: Mapping[str, Any]) -> Checkpoint | None:
    """A checkpoint item, or None if it is not one (an item edited by hand: skipped)."""
    try:
        if raw[PK]["S"] != FEED_PK:
            return None
        return Checkpoint(str(raw[SK]["S"]), str(raw[SEQ]["S"]), int(raw[FENCE]["N"]),
                          int(raw.get(AT, {"N": "0"})["N"]))
    except (KeyError, TypeError, ValueError):
        return None


class FeedCheckpointStore(Protocol):
    async def load(self) -> dict[str, Checkpoint]:
        """Every shard's checkpoint, by shard id (read consistently)."""

    async def save(self, checkpoint: Checkpoint) -> bool:
        """Write it unless a higher fence wrote this shard's: True if written."""

    async def forget(self, shard_id: str, fence: int) -> bool:
        """Delete a shard's checkpoint (the shard is gone) unless a higher fence wrote
        it: True if it is gone."""


class MemoryFeedCheckpoints:
    """The same rule in memory, for tests and simulations."""

    def __init__(self) -> None:
        self.items: dict[str, Checkpoint] = {}

    async def load(self) -> dict[str, Checkpoint]:
        return dict(self.items)

    async def save(self, checkpoint: Checkpoint) -> bool:
        have = self.items.get(checkpoint.shard_id)
        if not may_write(have.fence if have else None, checkpoint.fence):
            return False
        self.items[checkpoint.shard_id] = checkpoint
        return True

    async def forget(self, shard_id: str, fence: int) -> bool:
        have = self.items.get(shard_id)
        if not may_write(have.fence if have else None, fence):
            return False
        self.items.pop(shard_id, None)
        return True
