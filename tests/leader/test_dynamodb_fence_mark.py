"""The DynamoDB leader backend's fence high-water item, on the embedded server: raised by
every acquisition in the same transaction (never lagging, never lowered), never read as a
lease, and out of reach of every lease name."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import aioboto3
import pytest

from streamlease.leader import LeaderBackend
from streamlease.store import dynamodb, fleetcodec

NOW = 1_800_000_000_000


@pytest.fixture
async def fleet(dynamodb_endpoint: str, table_names: tuple[str, str, str]
                ) -> AsyncIterator[tuple[LeaderBackend, Any, str]]:
    async with dynamodb.connect_admin(*table_names) as stores:
        await stores.admin.create_tables()
        async with aioboto3.Session().client("dynamodb") as client:
            yield stores.leader, client, table_names[2]


async def mark(client: Any, table: str, name: str) -> int | None:
    resp = await client.get_item(TableName=table, Key=fleetcodec.fence_mark_key(name),
                                 ConsistentRead=True)
    item = resp.get("Item")
    return None if item is None else fleetcodec.decode_fence_mark(item)


async def test_the_mark_follows_every_fence_handed_out_and_only_those(
        fleet: tuple[LeaderBackend, Any, str]) -> None:
    backend, client, table = fleet
    name = f"lease-{uuid.uuid4().hex[:8]}"
    assert await mark(client, table, name) is None
    first = await backend.acquire(name, "a", 10, None, NOW)
    assert first == NOW and await mark(client, table, name) == first
    seen = await backend.read(name)
    assert seen is not None
    assert await backend.acquire(name, "b", 10, seen, NOW) == first + 1
    assert await mark(client, table, name) == first + 1
    # Refused attempts (a stale view, a present item) leave the mark where it was.
    assert await backend.acquire(name, "c", 10, seen, NOW + 5) is None
    assert await backend.acquire(name, "c", 10, None, NOW + 5) is None
    assert await mark(client, table, name) == first + 1
    # Renewals and resignations do not hand out a fence: the mark stays.
    assert await backend.resign(name, "b", first + 1) is True
    assert await mark(client, table, name) == first + 1


async def test_the_mark_is_never_read_as_a_lease_and_no_lease_can_take_its_key(
        fleet: tuple[LeaderBackend, Any, str]) -> None:
    backend, client, table = fleet
    name = f"lease-{uuid.uuid4().hex[:8]}"
    assert await backend.acquire(name, "a", 10, None, NOW) is not None
    resp = await client.query(
        TableName=table, ConsistentRead=True, KeyConditionExpression="Pk = :pk",
        ExpressionAttributeValues={":pk": {"S": fleetcodec.LEADER_PK}})
    items = resp["Items"]
    assert len(items) == 2  # the lease and its mark
    leases = [r for r in map(fleetcodec.decode_leader, items) if r is not None]
    assert [(r.name, r.owner) for r in leases] == [(name, "a")]
    with pytest.raises(ValueError, match="may not start with"):
        await backend.read(fleetcodec.FENCE_MARK_SK + name)
    with pytest.raises(ValueError, match="may not start with"):
        await backend.acquire(fleetcodec.FENCE_MARK_SK + name, "x", 10, None, NOW)


async def test_a_mark_older_than_the_lease_item_is_raised_with_it(
        fleet: tuple[LeaderBackend, Any, str]) -> None:
    """A lease item written before marks existed (no mark item) is taken over at its
    fence plus one, and the mark starts there."""
    backend, client, table = fleet
    name = f"lease-{uuid.uuid4().hex[:8]}"
    await client.put_item(TableName=table, Item={
        **fleetcodec.leader_key(name), "owner": {"S": "old"}, "fence": {"N": "41"},
        "heartbeat": {"N": "0"}, "expires_at_ms": {"N": "0"}})
    seen = await backend.read(name)
    assert seen is not None and seen.resigned
    assert await backend.acquire(name, "a", 10, seen, NOW) == 42
    assert await mark(client, table, name) == 42
