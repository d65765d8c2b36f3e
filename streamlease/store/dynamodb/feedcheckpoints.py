"""``FeedCheckpointStore`` on DynamoDB: the change feed's checkpoints in the fleet table
(layout and rule: ``streamlease.store.feedcheckpoints``)."""

from __future__ import annotations

from typing import Any

from streamlease.store import feedcheckpoints as fc
from streamlease.store.dynamodb.client import ConditionFailed, DynamoClient, DynamoTable


class DynamoFeedCheckpoints(DynamoTable):
    def __init__(self, client: DynamoClient, fleet_table: str) -> None:
        super().__init__(client)
        self.table = fleet_table

    async def load(self) -> dict[str, fc.Checkpoint]:
        found: dict[str, fc.Checkpoint] = {}
        kwargs: dict[str, Any] = {
            "TableName": self.table, "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {"#pk": fc.PK},
            "ExpressionAttributeValues": {":pk": {"S": fc.FEED_PK}}, "ConsistentRead": True}
        while True:
            resp = await self._call("query", **kwargs)
            for raw in resp.get("Items", []):
                checkpoint = fc.decode(raw)
                if checkpoint is not None:
                    found[checkpoint.shard_id] = checkpoint
            if "LastEvaluatedKey" not in resp:
                return found
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def save(self, checkpoint: fc.Checkpoint) -> bool:
        try:
            await self._call("put_item", TableName=self.table, Item=fc.item(checkpoint),
                             **fc.condition_kwargs(checkpoint.fence))
        except ConditionFailed:
            return False
        return True

    async def forget(self, shard_id: str, fence: int) -> bool:
        try:
            await self._call("delete_item", TableName=self.table, Key=fc.key(shard_id),
                             **fc.condition_kwargs(fence))
        except ConditionFailed:
            return False
        return True
