"""``LeaseStore`` on the streams table: the rules of ``streamlease.core.lease`` as conditional
writes (``streamlease.store.codec`` holds the expressions), the orphan query on the index,
the sweep's Scan, and the holders' check-ins (a consistent GetItem of one item, or an
eventually consistent BatchGetItem of many)."""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator, Sequence
from typing import Any

from streamlease.clock import SYSTEM_CLOCK, Clock
from streamlease.core.backoff import Backoff
from streamlease.core.handover import declined_text
from streamlease.core.lease import (
    CleanRelease,
    LeaseTimings,
    RenewOutcome,
    expiry_for,
    takeover_threshold_ms,
)
from streamlease.core.model import OwnedStream, StreamRecord, Tenure, stream_key
from streamlease.errors import StoreError, StoreThrottled, StoreUnavailable
from streamlease.store import codec
from streamlease.store.dynamodb.client import ConditionFailed, DynamoClient, DynamoTable
from streamlease.store.protocols import Acquired, HandOver, RenewResult, SinkOutcome, TakeOver

BATCH_GET_KEYS = 100  # DynamoDB's limit on the keys of one BatchGetItem
# Waits before asking again for keys a BatchGetItem left unprocessed (DynamoDB does that
# when the table or a partition is at its throughput limit): short, growing, jittered.
UNPROCESSED_BACKOFF_S = 0.05
UNPROCESSED_BACKOFF_CAP_S = 1.0


class DynamoLeaseStore(DynamoTable):
    def __init__(self, client: DynamoClient, table: str, clock: Clock = SYSTEM_CLOCK,
                 rng: random.Random | None = None) -> None:
        """``clock`` and ``rng`` time and spread the retries of ``check_many``."""
        super().__init__(client)
        self.table = table
        self.clock = clock
        self.rng = rng or random.Random()

    async def acquire(self, stream_id: str, owner: str, now_wall_ms: int,
                      timings: LeaseTimings, timeout: float | None = None,
                      epoch: int = 0) -> Acquired | None:
        expiry = expiry_for(now_wall_ms, timings)
        expr = codec.acquire_expr(owner, expiry, takeover_threshold_ms(now_wall_ms, timings),
                                  epoch)
        try:
            resp = await self._call(
                "update_item", timeout, TableName=self.table, Key=codec.key(stream_id),
                ReturnValues="ALL_NEW", ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **expr.update_kwargs(),
            )
        except ConditionFailed as failed:
            # A request that applied but whose answer was lost, re-sent, fails its own
            # condition; the stamped expiry tells that case apart from a real loss.
            old = codec.decode_record(failed.item) if failed.item else None
            if old is not None and old.lease_owner == owner and old.lease_expires_at_ms == expiry:
                return acquired(old, owner, expiry)
            return None
        record = codec.decode_record(resp["Attributes"])
        if record is None:
            raise StoreError(f"acquire of {stream_id} returned an item without a stream key")
        return acquired(record, owner, expiry)

    async def renew(self, tenure: Tenure, now_wall_ms: int, timings: LeaseTimings,
                    timeout: float | None = None) -> RenewResult:
        expiry = expiry_for(now_wall_ms, timings)
        expr = codec.renew_expr(tenure.owner, tenure.fence, expiry)
        try:
            resp = await self._call(
                "update_item", timeout, TableName=self.table, Key=codec.key(tenure.stream_id),
                ReturnValues="ALL_NEW", **expr.update_kwargs(),
            )
        except ConditionFailed:
            return RenewResult(RenewOutcome.LOST)
        except StoreThrottled as exc:
            return RenewResult(RenewOutcome.THROTTLED, error=str(exc))
        except StoreError as exc:
            # Unavailable, or not retriable as such (access denied, a table gone):
            # ownership cannot be proven, so it counts as unknown and the local deadline
            # decides. The supervisor then still drains and releases in order.
            return RenewResult(RenewOutcome.UNKNOWN, error=str(exc))
        return RenewResult(RenewOutcome.RENEWED, codec.decode_record(resp["Attributes"]), expiry)

    async def release(self, tenure: Tenure, timeout: float | None = None,
                      trace_parent: str | None = None,
                      clean: CleanRelease | None = None) -> bool:
        expr = codec.release_expr(tenure.owner, tenure.fence, trace_parent, clean)
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=codec.key(tenure.stream_id), **expr.update_kwargs())
        except ConditionFailed:
            return False
        return True

    async def advance(self, tenure: Tenure, fence: int, last_seq: int,
                      timeout: float | None = None) -> Tenure | None:
        expr = codec.advance_expr(tenure.owner, tenure.fence, fence, last_seq)
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=codec.key(tenure.stream_id), **expr.update_kwargs())
        except ConditionFailed:
            return None
        return dataclasses.replace(tenure, fence=fence, last_seq=last_seq)

    async def checkpoint(self, tenure: Tenure, prev_seq: int, last_seq: int,
                         timeout: float | None = None) -> SinkOutcome:
        expr = codec.checkpoint_expr(tenure.owner, tenure.fence, prev_seq, last_seq)
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=codec.key(tenure.stream_id),
                             ReturnValuesOnConditionCheckFailure="ALL_OLD",
                             **expr.update_kwargs())
        except ConditionFailed as failed:
            old = codec.decode_record(failed.item) if failed.item else None
            return codec.refused_batch(["ConditionalCheckFailed"], old, tenure, prev_seq + 1,
                                       last_seq)
        return SinkOutcome.COMMITTED

    async def orphans(self, threshold_ms: int, limit: int, timeout: float | None = None,
                      page_size: int = 200) -> list[StreamRecord]:
        return await self._index_query(
            "#ds = :started AND #exp < :threshold",
            {":started": codec.s("STARTED"), ":threshold": codec.n(threshold_ms)},
            limit, timeout, page_size)

    async def held_stopped(self, now_wall_ms: int, limit: int, timeout: float | None = None,
                           page_size: int = 200) -> list[StreamRecord]:
        return await self._index_query(
            "#ds = :stopped AND #exp > :now",
            {":stopped": codec.s("STOPPED"), ":now": codec.n(now_wall_ms)},
            limit, timeout, page_size)

    async def _index_query(self, condition: str, values: dict[str, Any], limit: int,
                           timeout: float | None, page_size: int) -> list[StreamRecord]:
        found: list[StreamRecord] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table, "IndexName": codec.INDEX_NAME,
            "KeyConditionExpression": condition,
            "ExpressionAttributeNames": {"#ds": codec.DESIRED_STATE, "#exp": codec.LEASE_EXPIRES},
            "ExpressionAttributeValues": values, "Limit": max(1, min(limit, page_size)),
        }
        while len(found) < limit:
            resp = await self._call("query", timeout, **kwargs)
            found.extend(r for r in map(codec.decode_record, resp.get("Items", [])) if r)
            if "LastEvaluatedKey" not in resp:
                break
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return found[:limit]

    async def check(self, stream_id: str, timeout: float | None = None) -> StreamRecord | None:
        resp = await self._call("get_item", timeout, TableName=self.table,
                                Key=codec.key(stream_id), ConsistentRead=True)
        item = resp.get("Item")
        return codec.decode_record(item) if item else None

    async def check_many(self, stream_ids: Sequence[str], *,
                         timeout: float | None = None) -> dict[str, StreamRecord | None]:
        """BatchGetItem without ConsistentRead, ``BATCH_GET_KEYS`` keys a request, one
        request after another (a burst of parallel reads would be throttled first). Keys
        DynamoDB leaves unprocessed are asked for again after a jittered backoff, as long
        as the deadline (``timeout``, else the call timeout, for the whole read) allows."""
        by_key = {stream_key(sid): sid for sid in stream_ids}
        found: dict[str, StreamRecord | None] = dict.fromkeys(by_key.values())
        deadline = self.clock.monotonic() + (timeout or self._client.call_timeout_s)
        backoff = Backoff(UNPROCESSED_BACKOFF_S, UNPROCESSED_BACKOFF_CAP_S, self.rng)
        pending = list(by_key)
        while pending:
            batch, pending = pending[:BATCH_GET_KEYS], pending[BATCH_GET_KEYS:]
            left = deadline - self.clock.monotonic()
            if left <= 0:
                raise StoreUnavailable(f"batch_get_item timed out with {len(batch) + len(pending)}"
                                       f" of {len(by_key)} keys unread")
            resp = await self._call(
                "batch_get_item", left,
                RequestItems={self.table: {"Keys": [{codec.PK: codec.s(k)} for k in batch],
                                           "ConsistentRead": False}})
            for item in _batch_items(resp, self.table):
                sid = by_key.get(_pk(item) or "")
                if sid is not None:  # as check: an item that does not decode reads as None
                    found[sid] = codec.decode_record(item)
            asked = set(batch)
            again = [k for k in _unprocessed_keys(resp, self.table) if k in asked]
            if not again:
                backoff.reset()
                continue
            pending = list(dict.fromkeys(again)) + pending
            delay = backoff.next_delay()
            if self.clock.monotonic() + delay >= deadline:
                raise StoreThrottled(f"batch_get_item: {len(pending)} of {len(by_key)} keys "
                                     "still unprocessed when the timeout ran out")
            await self.clock.sleep(delay)
        return found

    async def owned_by(self, owner: str, timeout: float | None = None,
                       page_size: int = 500) -> list[OwnedStream]:
        found: list[OwnedStream] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table, "IndexName": codec.OWNER_INDEX_NAME,
            "KeyConditionExpression": "#owner = :owner",
            "ExpressionAttributeNames": {"#owner": codec.LEASE_OWNER},
            "ExpressionAttributeValues": {":owner": codec.s(owner)}, "Limit": page_size,
        }
        while True:
            resp = await self._call("query", timeout, **kwargs)
            for item in resp.get("Items", []):
                record = codec.decode_record(item)
                if record is not None and record.fence is not None:
                    found.append(OwnedStream(record.stream_id, record.fence))
            if "LastEvaluatedKey" not in resp:
                return found
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def release_for(self, stream_id: str, owner: str, fence: int, fenced_epoch: int,
                          timeout: float | None = None,
                          trace_parent: str | None = None) -> bool:
        expr = codec.release_for_expr(owner, fence, fenced_epoch, trace_parent)
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=codec.key(stream_id), **expr.update_kwargs())
        except ConditionFailed:
            return False
        return True

    async def take_over(self, claim: TakeOver, timeout: float | None = None) -> Acquired | None:
        owner, expiry = claim.owner, expiry_for(claim.now_wall_ms, claim.timings)
        expr = codec.take_over_expr(claim.dead_owner, claim.fenced_epoch, owner, claim.epoch,
                                    expiry)
        try:
            resp = await self._call(
                "update_item", timeout, TableName=self.table, Key=codec.key(claim.stream_id),
                ReturnValues="ALL_NEW", ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **expr.update_kwargs(),
            )
        except ConditionFailed as failed:
            old = codec.decode_record(failed.item) if failed.item else None
            if old is not None and old.lease_owner == owner and old.lease_expires_at_ms == expiry:
                return acquired(old, owner, expiry)  # it applied; this is its re-send
            return None
        record = codec.decode_record(resp["Attributes"])
        if record is None:
            raise StoreError(f"take-over of {claim.stream_id} returned an item without a "
                             "stream key")
        return acquired(record, owner, expiry)

    async def take_handed(self, claim: HandOver,
                          timeout: float | None = None) -> Acquired | None:
        owner, expiry = claim.owner, expiry_for(claim.now_wall_ms, claim.timings)
        expr = codec.take_handed_expr(claim.holder, claim.fence, owner, claim.epoch, expiry)
        try:
            resp = await self._call(
                "update_item", timeout, TableName=self.table, Key=codec.key(claim.stream_id),
                ReturnValues="ALL_NEW", ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **expr.update_kwargs(),
            )
        except ConditionFailed as failed:
            old = codec.decode_record(failed.item) if failed.item else None
            if old is not None and old.lease_owner == owner and old.lease_expires_at_ms == expiry:
                return acquired(old, owner, expiry)  # it applied; this is its re-send
            return None
        record = codec.decode_record(resp["Attributes"])
        if record is None:
            raise StoreError(f"hand-over of {claim.stream_id} returned an item without a "
                             "stream key")
        return acquired(record, owner, expiry)

    async def decline(self, stream_id: str, holder: str, fence: int, taker: str,
                      timeout: float | None = None) -> None:
        expr = codec.decline_expr(holder, fence, declined_text(fence, taker))
        with contextlib.suppress(ConditionFailed):
            await self._call("update_item", timeout, TableName=self.table,
                             Key=codec.key(stream_id), **expr.update_kwargs())

    async def scan_pages(self, timeout: float | None = None,
                         page_size: int = 500) -> AsyncIterator[list[StreamRecord]]:
        kwargs: dict[str, Any] = {"TableName": self.table, "Limit": page_size}
        while True:
            resp = await self._call("scan", timeout, **kwargs)
            yield [r for r in map(codec.decode_record, resp.get("Items", [])) if r]
            if "LastEvaluatedKey" not in resp:
                return
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def adopt(self, stream_id: str, timeout: float | None = None) -> bool:
        expr = codec.adopt_expr()
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=codec.key(stream_id), **expr.update_kwargs())
        except ConditionFailed:
            return False
        return True

    async def record_error(self, stream_id: str, message: str, at_ms: int,
                           timeout: float | None = None) -> None:
        expr = codec.record_error_expr(message, at_ms)
        with contextlib.suppress(ConditionFailed):
            await self._call("update_item", timeout, TableName=self.table,
                             Key=codec.key(stream_id), **expr.update_kwargs())


def acquired(record: StreamRecord, owner: str, expiry: int) -> Acquired:
    if record.fence is None:
        raise StoreError(f"stream {record.stream_id} acquired without a fence")
    return Acquired(Tenure(record.stream_id, owner, record.fence, record.last_seq, expiry,
                           record.lease_epoch or 0), record)


def _pk(item: Any) -> str | None:
    value = item.get(codec.PK) if isinstance(item, dict) else None
    pk = value.get("S") if isinstance(value, dict) else None
    return pk if isinstance(pk, str) else None


def _batch_items(resp: Any, table: str) -> list[Any]:
    """The items a BatchGetItem answer carries for ``table`` (DynamoDB leaves out the
    items it did not find). An answer without ``Responses`` is refused: read as "no such
    items", it would tell every holder that its item is gone."""
    responses = resp.get("Responses") if isinstance(resp, dict) else None
    if not isinstance(responses, dict):
        raise StoreError("batch_get_item: an answer without Responses")
    items = responses.get(table, [])
    if not isinstance(items, list):
        raise StoreError(f"batch_get_item: Responses for {table} is not a list")
    return items


def _unprocessed_keys(resp: Any, table: str) -> list[str]:
    """The partition keys of ``table`` a BatchGetItem answer left for another request."""
    unprocessed = resp.get("UnprocessedKeys") if isinstance(resp, dict) else None
    request = unprocessed.get(table) if isinstance(unprocessed, dict) else None
    keys = request.get("Keys") if isinstance(request, dict) else None
    if not isinstance(keys, list):
        return []
    return [pk for pk in map(_pk, keys) if pk is not None]
