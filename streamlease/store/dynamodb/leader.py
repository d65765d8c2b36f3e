"""``LeaderBackend`` on DynamoDB: named leader leases in the fleet table (``Pk = LEADER``),
and fenced writes as transactions that check the lease's fence.

Each acquisition is one transaction: the lease's conditional update and the raise of its
fence high-water item (``fleetcodec.fence_mark_item``), so the mark is never below a fence
handed out. A lease whose item is missing (never held, or lost: deleted by hand, an older
backup restored) starts above that mark (``next_fence``), whatever this machine's clock says.
"""

from __future__ import annotations

from typing import Any

from streamlease.core.fenced import PutItem, Transaction
from streamlease.core.leadership import LeaderRecord, next_fence
from streamlease.core.membership import HeartbeatOutcome
from streamlease.errors import (
    StaleFence,
    StoreError,
    StoreThrottled,
    StoreUnavailable,
    WriteRefused,
)
from streamlease.store import fleetcodec
from streamlease.store.dynamodb.client import (
    TXN_CONFLICT_REASONS,
    TXN_THROTTLE_REASONS,
    ConditionFailed,
    DynamoClient,
    DynamoTable,
    TransactionCancelled,
)

ACQUIRE_ATTEMPTS = 3


class DynamoLeaderBackend(DynamoTable):
    conditional_puts = True

    def __init__(self, client: DynamoClient, table: str) -> None:
        super().__init__(client)
        self.table = table

    async def read(self, name: str, timeout: float | None = None,
                   consistent: bool = True) -> LeaderRecord | None:
        resp = await self._call("get_item", timeout, TableName=self.table,
                                Key=fleetcodec.leader_key(name), ConsistentRead=consistent)
        item = resp.get("Item")
        return fleetcodec.decode_leader(item) if item else None

    async def acquire(self, name: str, owner: str, ttl_s: float, seen: LeaderRecord | None,
                      now_wall_ms: int, timeout: float | None = None) -> int | None:
        # Usually one transaction. A missing item costs a consistent read of the mark
        # first. A mark above the item's own fence (set lower by hand) fails the mark's
        # condition: read it and go again above it. The lease's condition pins the fence
        # seen, so a retry can only succeed on the same item.
        current = seen.fence if seen is not None else None
        # An existing item's mark is its own fence unless someone lowered the item.
        high_water = current if current is not None else await self._fence_mark(name, timeout)
        ttl_ms = round(ttl_s * 1000)
        for _ in range(ACQUIRE_ATTEMPTS):
            fence = next_fence(current, high_water, now_wall_ms)
            attempt = fleetcodec.LeaderAcquisition(owner, ttl_ms, now_wall_ms, seen, fence)
            try:
                await self._call("transact_write_items", timeout, TransactItems=[
                    fleetcodec.leader_acquire_item(self.table, name, attempt),
                    fleetcodec.fence_mark_item(self.table, name, fence)])
            except TransactionCancelled as cancelled:
                codes = cancelled.codes
                if any(c in TXN_THROTTLE_REASONS for c in codes):
                    raise StoreThrottled(f"acquire throttled: {codes}") from cancelled
                if any(c in TXN_CONFLICT_REASONS for c in codes):
                    raise StoreUnavailable(f"acquire conflicted: {codes}") from cancelled
                if codes and codes[0] == "ConditionalCheckFailed":
                    return None  # not as seen: someone else's now
                if codes[1:2] == ["ConditionalCheckFailed"]:
                    high_water = await self._fence_mark(name, timeout)
                    continue
                raise StoreError(f"acquire of lease {name} cancelled: {codes}") from cancelled
            return fence
        raise StoreError(f"lease {name}: its fence high-water mark kept moving under "
                         f"{ACQUIRE_ATTEMPTS} attempts")

    async def _fence_mark(self, name: str, timeout: float | None) -> int:
        resp = await self._call("get_item", timeout, TableName=self.table,
                                Key=fleetcodec.fence_mark_key(name), ConsistentRead=True)
        return fleetcodec.decode_fence_mark(resp.get("Item"))

    async def renew(self, name: str, owner: str, fence: int, ttl_s: float, now_wall_ms: int,
                    timeout: float | None = None) -> HeartbeatOutcome:
        expr = fleetcodec.leader_renew_expr(owner, fence, round(ttl_s * 1000), now_wall_ms)
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=fleetcodec.leader_key(name), **expr.update_kwargs())
        except ConditionFailed:
            return HeartbeatOutcome.FENCED
        except StoreThrottled:
            return HeartbeatOutcome.THROTTLED
        except StoreError:
            return HeartbeatOutcome.UNKNOWN
        return HeartbeatOutcome.RENEWED

    async def resign(self, name: str, owner: str, fence: int,
                     timeout: float | None = None) -> bool:
        expr = fleetcodec.leader_resign_expr(owner, fence)
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=fleetcodec.leader_key(name), **expr.update_kwargs())
        except ConditionFailed:
            return False
        return True

    async def fenced_write(self, name: str, fence: int, write: Any,
                           timeout: float | None = None) -> None:
        if isinstance(write, PutItem):
            put: dict[str, Any] = {"TableName": write.table, "Item": write.item}
            if write.condition:
                put["ConditionExpression"] = write.condition
                if write.names:
                    put["ExpressionAttributeNames"] = write.names
                if write.values:
                    put["ExpressionAttributeValues"] = write.values
            actions = [{"Put": put}]
        elif isinstance(write, Transaction):
            actions = list(write.actions)
        else:
            raise TypeError(f"DynamoDB leader leases cannot apply {type(write).__name__}")
        check = fleetcodec.leader_check(name, fence, self.table)
        try:
            await self._call("transact_write_items", timeout, TransactItems=[check, *actions])
        except TransactionCancelled as cancelled:
            codes = cancelled.codes
            if any(c in TXN_THROTTLE_REASONS for c in codes):
                raise StoreThrottled(f"fenced write throttled: {codes}") from cancelled
            if any(c in TXN_CONFLICT_REASONS for c in codes):
                raise StoreUnavailable(f"fenced write conflicted: {codes}") from cancelled
            if codes and codes[0] == "ConditionalCheckFailed":
                raise StaleFence(f"lease {name}: fence {fence} is no longer current") \
                    from cancelled
            raise WriteRefused(f"the write's own condition failed: {codes[1:]}") from cancelled
