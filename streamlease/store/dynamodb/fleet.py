"""``FleetStore`` on DynamoDB: member rows in the fleet table (``Pk = MEMBER``)."""

from __future__ import annotations

import contextlib
from typing import Any

from streamlease.core.membership import HeartbeatOutcome, MemberRecord, MemberStatus
from streamlease.errors import StoreError, StoreThrottled
from streamlease.store import fleetcodec
from streamlease.store.codec import s
from streamlease.store.dynamodb.client import ConditionFailed, DynamoClient, DynamoTable
from streamlease.store.protocols import HeartbeatResult

REGISTER_ATTEMPTS = 5


class DynamoFleetStore(DynamoTable):
    def __init__(self, client: DynamoClient, table: str) -> None:
        super().__init__(client)
        self.table = table

    async def register(self, worker_id: str, capacity: int, now_wall_ms: int,
                       status: MemberStatus = MemberStatus.ACTIVE,
                       timeout: float | None = None, incarnation: str = "") -> MemberRecord:
        # Usually one write (the row exists). A missing row costs a failed write, a
        # consistent read of the high-water mark and the create; a row deleted or created
        # concurrently fails a condition and the loop goes round again.
        high_water: int | None = None  # None: move an existing row on
        for _ in range(REGISTER_ATTEMPTS):
            expr = fleetcodec.register_expr(capacity, now_wall_ms, status, incarnation,
                                            high_water)
            try:
                resp = await self._call("update_item", timeout, TableName=self.table,
                                        Key=fleetcodec.member_key(worker_id),
                                        ReturnValues="ALL_NEW", **expr.update_kwargs())
            except ConditionFailed:
                # No row to move on: create one above the mark. A row that appeared
                # meanwhile: move it on.
                high_water = await self._high_water(timeout) if high_water is None else None
                continue
            record = fleetcodec.decode_member(resp["Attributes"])
            if record is None:
                raise StoreError(f"registering {worker_id} returned an unreadable member row")
            return record
        raise StoreError(f"registering {worker_id}: its row kept changing under "
                         f"{REGISTER_ATTEMPTS} attempts")

    async def _high_water(self, timeout: float | None) -> int:
        resp = await self._call("get_item", timeout, TableName=self.table,
                                Key=fleetcodec.high_water_key(), ConsistentRead=True)
        return fleetcodec.decode_high_water(resp.get("Item"))

    async def heartbeat(self, worker_id: str, epoch: int, status: MemberStatus, streams: int,
                        capacity: int, handoffs: int, now_wall_ms: int,
                        timeout: float | None = None,
                        bulletin: str | None = None) -> HeartbeatResult:
        expr = fleetcodec.heartbeat_expr(epoch, status, streams, capacity, handoffs,
                                         now_wall_ms, bulletin)
        try:
            resp = await self._call("update_item", timeout, TableName=self.table,
                                    Key=fleetcodec.member_key(worker_id),
                                    ReturnValues="UPDATED_NEW", **expr.update_kwargs())
        except ConditionFailed:
            return HeartbeatResult(HeartbeatOutcome.FENCED)
        except StoreThrottled as exc:
            return HeartbeatResult(HeartbeatOutcome.THROTTLED, error=str(exc))
        except StoreError as exc:
            return HeartbeatResult(HeartbeatOutcome.UNKNOWN, error=str(exc))
        counter = resp.get("Attributes", {}).get(fleetcodec.HEARTBEAT, {}).get("N")
        return HeartbeatResult(HeartbeatOutcome.RENEWED,
                               int(counter) if counter is not None else None)

    async def member(self, worker_id: str, timeout: float | None = None,
                     consistent: bool = True) -> MemberRecord | None:
        resp = await self._call("get_item", timeout, TableName=self.table,
                                Key=fleetcodec.member_key(worker_id),
                                ConsistentRead=consistent)
        item = resp.get("Item")
        return fleetcodec.decode_member(item) if item else None

    async def members(self, timeout: float | None = None) -> list[MemberRecord]:
        found: list[MemberRecord] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table, "ConsistentRead": True,
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {"#pk": fleetcodec.PK},
            "ExpressionAttributeValues": {":pk": s(fleetcodec.MEMBER_PK)},
        }
        while True:
            resp = await self._call("query", timeout, **kwargs)
            found.extend(m for m in map(fleetcodec.decode_member, resp.get("Items", [])) if m)
            if "LastEvaluatedKey" not in resp:
                return found
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def fence(self, seen: MemberRecord, by: str, now_wall_ms: int,
                    timeout: float | None = None) -> MemberRecord | None:
        expr = fleetcodec.fence_expr(seen, by, now_wall_ms)
        try:
            resp = await self._call("update_item", timeout, TableName=self.table,
                                    Key=fleetcodec.member_key(seen.worker_id),
                                    ReturnValues="ALL_NEW", **expr.update_kwargs())
        except ConditionFailed:
            return None
        return fleetcodec.decode_member(resp["Attributes"])

    async def mark_released(self, worker_id: str, epoch: int,
                            timeout: float | None = None) -> bool:
        expr = fleetcodec.released_expr(epoch)
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=fleetcodec.member_key(worker_id), **expr.update_kwargs())
        except ConditionFailed:
            return False
        return True

    async def leave(self, worker_id: str, epoch: int, timeout: float | None = None) -> bool:
        # The high-water mark first: a row is never gone before its epoch is recorded (a
        # crash in between leaves a mark above a live row, which costs nothing).
        raise_mark = fleetcodec.high_water_expr(epoch)
        with contextlib.suppress(ConditionFailed):  # the mark is already that high
            await self._call("update_item", timeout, TableName=self.table,
                             Key=fleetcodec.high_water_key(), **raise_mark.update_kwargs())
        expr = fleetcodec.leave_condition(epoch)
        try:
            await self._call("delete_item", timeout, TableName=self.table,
                             Key=fleetcodec.member_key(worker_id), **expr.update_kwargs())
        except ConditionFailed:
            return False
        return True
