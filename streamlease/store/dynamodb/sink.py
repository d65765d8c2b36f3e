"""``Sink`` on DynamoDB: one ``TransactWriteItems`` per batch.

The transaction updates the stream's checkpoint only if the item still names this owner
and fence and the checkpoint is still where this holder left it, and writes the events
items only together with it. A stale fence raises ``StaleFence`` and writes nothing;
re-sending a batch that already landed returns ``ALREADY_COMMITTED``.

With ``events_ttl_s`` (``STREAMLEASE_EVENTS_TTL_SECONDS``) each events item carries
``expires_at``, and the table's TTL deletes it some time (DynamoDB: usually within days)
after that. Only delivered history expires: the checkpoint is in the streams item.
"""

from __future__ import annotations

from typing import Any

from streamlease.core.frames import Frame
from streamlease.core.model import EventMark, StreamRecord, Tenure
from streamlease.errors import SinkConflict, StaleFence, StoreThrottled, StoreUnavailable
from streamlease.store import codec
from streamlease.store.dynamodb.client import (
    TXN_CONFLICT_REASONS,
    TXN_THROTTLE_REASONS,
    DynamoClient,
    DynamoTable,
    TransactionCancelled,
)
from streamlease.store.protocols import SinkOutcome


class DynamoSink(DynamoTable):
    def __init__(self, client: DynamoClient, table: str, events_table: str,
                 events_ttl_s: int = 0) -> None:
        super().__init__(client)
        self.table = table
        self.events_table = events_table
        self.events_ttl_s = events_ttl_s

    async def write_batch(self, tenure: Tenure, prev_seq: int, frames: list[Frame],
                          now_wall_ms: int, timeout: float | None = None) -> SinkOutcome:
        if not frames:
            return SinkOutcome.COMMITTED
        chunks = codec.chunk_frames(frames)
        if len(chunks) + 1 > codec.MAX_TRANSACT_ACTIONS:
            raise ValueError(f"batch of {len(frames)} frames needs {len(chunks)} items")
        first, last = frames[0].seq, frames[-1].seq
        check = codec.checkpoint_expr(tenure.owner, tenure.fence, prev_seq, last)
        actions: list[dict[str, Any]] = [{
            "Update": {
                "TableName": self.table, "Key": codec.key(tenure.stream_id),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD", **check.update_kwargs(),
            }
        }]
        for chunk in chunks:
            actions.append({"Put": {
                "TableName": self.events_table,
                "Item": codec.event_item(tenure.stream_id, tenure.fence, chunk, now_wall_ms,
                                       self.events_ttl_s),
                "ConditionExpression": "attribute_not_exists(#pk)",
                "ExpressionAttributeNames": {"#pk": codec.EV_PK},
            }})
        try:
            # No ClientRequestToken: a retried batch carries a new write time, which
            # DynamoDB would refuse as a parameter mismatch. The checkpoint condition
            # already makes a retry of a landed batch a no-op (ALREADY_COMMITTED).
            await self._call("transact_write_items", timeout, TransactItems=actions)
        except TransactionCancelled as cancelled:
            return _cancelled(cancelled, tenure, first, last)
        return SinkOutcome.COMMITTED

    async def open(self, tenure: Tenure, record: StreamRecord) -> int:
        return 0  # the events item and the checkpoint move together: nothing beyond

    async def close(self, tenure: Tenure, reason: str) -> None:
        return None

    async def settle(self, tenure: Tenure, timeout: float | None = None) -> None:
        return None  # each batch's transaction is done when write_batch returns

    async def newest_event(self, stream_id: str,
                           timeout: float | None = None) -> EventMark | None:
        resp = await self._call(
            "query", timeout, TableName=self.events_table, ConsistentRead=True, Limit=1,
            ScanIndexForward=False, KeyConditionExpression="#pk = :pk",
            ProjectionExpression="#last, #fence",
            ExpressionAttributeNames={"#pk": codec.EV_PK, "#last": codec.EV_LAST,
                                      "#fence": codec.EV_FENCE},
            ExpressionAttributeValues={":pk": codec.key(stream_id)[codec.PK]},
        )
        items = resp.get("Items", [])
        return codec.decode_event_mark(items[0]) if items else None


def _cancelled(cancelled: TransactionCancelled, tenure: Tenure, first: int,
               last: int) -> SinkOutcome:
    codes = cancelled.codes
    if any(c in TXN_THROTTLE_REASONS for c in codes):
        raise StoreThrottled(f"sink transaction throttled: {codes}") from cancelled
    if any(c in TXN_CONFLICT_REASONS for c in codes):
        raise StoreUnavailable(f"sink transaction conflicted: {codes}") from cancelled
    old_item = cancelled.reasons[0].get("Item") if cancelled.reasons else None
    old = codec.decode_record(old_item) if old_item else None
    try:
        return codec.refused_batch(codes, old, tenure, first, last)
    except (StaleFence, SinkConflict) as exc:
        raise exc from cancelled
