"""``FleetStore`` on DynamoDB: member rows in the fleet table (``Pk = MEMBER``, and
``MEMBER#<n>`` once the layout spreads: ``streamlease.core.layout``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from streamlease.core import layout
from streamlease.core.layout import Replica
from streamlease.core.membership import HeartbeatOutcome, MemberRecord, MemberStatus
from streamlease.errors import StoreError, StoreThrottled
from streamlease.store import fleetcodec
from streamlease.store.codec import s
from streamlease.store.dynamodb.client import ConditionFailed, DynamoClient, DynamoTable
from streamlease.store.protocols import Heartbeat, HeartbeatResult

REGISTER_ATTEMPTS = 5


class Registration(NamedTuple):
    """A registration's ``fleetcodec.register_expr`` arguments."""

    capacity: int
    now_ms: int
    status: MemberStatus
    incarnation: str
    high_water: int | None


class DynamoFleetStore(DynamoTable):
    def __init__(self, client: DynamoClient, table: str) -> None:
        super().__init__(client)
        self.table = table

    async def register(self, worker_id: str, capacity: int, now_wall_ms: int,
                       status: MemberStatus = MemberStatus.ACTIVE,
                       timeout: float | None = None, incarnation: str = "") -> MemberRecord:
        # Usually a read of the layout and one write (the row exists). A missing row costs
        # a failed write per key it might live under, a consistent read of the high-water
        # mark and the create; a row deleted or created concurrently fails a condition and
        # the loop goes round again.
        order = layout.search_order(worker_id, await self.layout(timeout))
        moved = Registration(capacity, now_wall_ms, status, incarnation, None)
        for _ in range(REGISTER_ATTEMPTS):
            for shard in order:  # move an existing row on, wherever it lives
                record = await self._register_at(worker_id, shard, moved, timeout)
                if record is not None:
                    return record
            # No row anywhere: create one above the mark, under this layout's key.
            created = moved._replace(high_water=await self._high_water(timeout))
            record = await self._register_at(worker_id, order[0], created, timeout)
            if record is not None:
                return record
        raise StoreError(f"registering {worker_id}: its row kept changing under "
                         f"{REGISTER_ATTEMPTS} attempts")

    async def _register_at(self, worker_id: str, shard: int, registration: Registration,
                           timeout: float | None) -> MemberRecord | None:
        """One registration write under ``shard``; None if its condition failed."""
        expr = fleetcodec.register_expr(*registration)
        try:
            resp = await self._call("update_item", timeout, TableName=self.table,
                                    Key=fleetcodec.member_key(worker_id, shard),
                                    ReturnValues="ALL_NEW", **expr.update_kwargs())
        except ConditionFailed:
            return None
        record = fleetcodec.decode_member(resp["Attributes"])
        if record is None:
            raise StoreError(f"registering {worker_id} returned an unreadable member row")
        return record

    async def layout(self, timeout: float | None = None) -> int:
        """The layout, read consistently (1 if never spread)."""
        resp = await self._call("get_item", timeout, TableName=self.table,
                                Key=fleetcodec.layout_key(), ConsistentRead=True)
        return fleetcodec.decode_layout(resp.get("Item"))

    async def _high_water(self, timeout: float | None) -> int:
        resp = await self._call("get_item", timeout, TableName=self.table,
                                Key=fleetcodec.high_water_key(), ConsistentRead=True)
        return fleetcodec.decode_high_water(resp.get("Item"))

    async def heartbeat(self, beat: Heartbeat, timeout: float | None = None) -> HeartbeatResult:
        expr = fleetcodec.heartbeat_expr(beat)
        try:
            resp = await self._call("update_item", timeout, TableName=self.table,
                                    Key=fleetcodec.member_key(beat.worker_id, beat.shard),
                                    ReturnValues="ALL_NEW", **expr.update_kwargs())
        except ConditionFailed:
            return HeartbeatResult(HeartbeatOutcome.FENCED)
        except StoreThrottled as exc:
            return HeartbeatResult(HeartbeatOutcome.THROTTLED, error=str(exc))
        except StoreError as exc:
            return HeartbeatResult(HeartbeatOutcome.UNKNOWN, error=str(exc))
        # The whole row comes back (its offers: a peer's hand-over, core.handover).
        item = resp.get("Attributes", {})
        counter = item.get(fleetcodec.HEARTBEAT, {}).get("N")
        return HeartbeatResult(HeartbeatOutcome.RENEWED,
                               int(counter) if counter is not None else None,
                               offers=fleetcodec.offers_of(item))

    async def offer(self, worker_id: str, epoch: int, offer: str, shard: int = 0,
                    timeout: float | None = None) -> bool:
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=fleetcodec.member_key(worker_id, shard),
                             **fleetcodec.offer_expr(epoch, offer).update_kwargs())
        except ConditionFailed:
            return False
        return True

    async def clear_offers(self, worker_id: str, epoch: int, offers: Sequence[str],
                           shard: int = 0, timeout: float | None = None) -> None:
        if not offers:
            return
        with contextlib.suppress(ConditionFailed):
            await self._call("update_item", timeout, TableName=self.table,
                             Key=fleetcodec.member_key(worker_id, shard),
                             **fleetcodec.clear_offers_expr(epoch, offers).update_kwargs())

    async def member(self, worker_id: str, timeout: float | None = None,
                     consistent: bool = True, shard: int = 0) -> MemberRecord | None:
        resp = await self._call("get_item", timeout, TableName=self.table,
                                Key=fleetcodec.member_key(worker_id, shard),
                                ConsistentRead=consistent)
        item = resp.get("Item")
        return fleetcodec.decode_member(item) if item else None

    async def members(self, timeout: float | None = None) -> list[MemberRecord]:
        return (await self.roster(timeout))[0]

    async def roster(self, timeout: float | None = None) -> tuple[list[MemberRecord], int]:
        first = await self._query(0, timeout)
        shards = fleetcodec.decode_layout(next(
            (item for item in first if item.get(fleetcodec.SK) == {"S": fleetcodec.LAYOUT_SK}),
            None))
        rest = await asyncio.gather(*(self._query(k, timeout) for k in range(1, shards)))
        found = [m for page in (first, *rest) for m in map(fleetcodec.decode_member, page) if m]
        return sorted(found, key=lambda m: m.worker_id), shards

    async def _query(self, shard: int, timeout: float | None) -> list[dict[str, Any]]:
        """Every item under one member key, consistently."""
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table, "ConsistentRead": True,
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {"#pk": fleetcodec.PK},
            "ExpressionAttributeValues": {":pk": s(layout.partition(shard))},
        }
        while True:
            resp = await self._call("query", timeout, **kwargs)
            items.extend(resp.get("Items", []))
            if "LastEvaluatedKey" not in resp:
                return items
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def spread(self, shards: int, timeout: float | None = None) -> bool:
        expr = fleetcodec.spread_expr(layout.valid_shards(shards))
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=fleetcodec.layout_key(), **expr.update_kwargs())
        except ConditionFailed:
            return False
        return True

    async def publish(self, replica: Replica, shards: int,
                      timeout: float | None = None) -> int:
        condition = fleetcodec.replica_condition(replica.fence)

        async def one(shard: int) -> bool:
            try:
                await self._call("put_item", timeout, TableName=self.table,
                                 Item=fleetcodec.encode_replica(shard, replica),
                                 **condition.update_kwargs())
            except ConditionFailed:
                return False  # a newer leader's replica
            return True

        results = await asyncio.gather(*(one(k) for k in range(layout.valid_shards(shards))),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return sum(1 for r in results if r is True)

    async def replica(self, shard: int, timeout: float | None = None) -> Replica | None:
        resp = await self._call("get_item", timeout, TableName=self.table,
                                Key=fleetcodec.replica_key(shard), ConsistentRead=False)
        return fleetcodec.decode_replica(resp.get("Item"))

    async def fence(self, seen: MemberRecord, by: str, now_wall_ms: int,
                    timeout: float | None = None) -> MemberRecord | None:
        expr = fleetcodec.fence_expr(seen, by, now_wall_ms)
        try:
            resp = await self._call("update_item", timeout, TableName=self.table,
                                    Key=fleetcodec.member_key(seen.worker_id, seen.shard),
                                    ReturnValues="ALL_NEW", **expr.update_kwargs())
        except ConditionFailed:
            return None
        return fleetcodec.decode_member(resp["Attributes"])

    async def mark_released(self, worker_id: str, epoch: int,
                            timeout: float | None = None, shard: int = 0) -> bool:
        expr = fleetcodec.released_expr(epoch)
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=fleetcodec.member_key(worker_id, shard),
                             **expr.update_kwargs())
        except ConditionFailed:
            return False
        return True

    async def leave(self, worker_id: str, epoch: int, timeout: float | None = None,
                    shard: int = 0) -> bool:
        # The high-water mark first: a row is never gone before its epoch is recorded (a
        # crash in between leaves a mark above a live row, which costs nothing).
        raise_mark = fleetcodec.high_water_expr(epoch)
        with contextlib.suppress(ConditionFailed):  # the mark is already that high
            await self._call("update_item", timeout, TableName=self.table,
                             Key=fleetcodec.high_water_key(), **raise_mark.update_kwargs())
        expr = fleetcodec.leave_condition(epoch)
        try:
            await self._call("delete_item", timeout, TableName=self.table,
                             Key=fleetcodec.member_key(worker_id, shard),
                             **expr.update_kwargs())
        except ConditionFailed:
            return False
        return True
