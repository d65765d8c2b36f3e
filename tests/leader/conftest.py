"""Leader backends for the contract suite: each with a way to write a value, to read it
back, and to make a held lease lapse."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aioboto3
import pytest

from worker.leader import LeaderBackend, PutItem
from worker.store import dynamodb
from worker.store.memory import MemoryStore

SIDE_TABLE_KEY = "Pk"


@dataclass
class Backend:
    impl: LeaderBackend
    write: Callable[..., Any]  # (key, value, unique=False) -> a write for this backend
    written: Callable[[str], Awaitable[str | None]]  # key -> value written, or None
    expire: Callable[[str], Awaitable[None]]  # make a held lease lapse now
    observe_takeover: bool  # a candidate takes a silent lease by observing it
    conditional_writes: bool  # writes may carry their own condition


def _put(table: str) -> Callable[..., PutItem]:
    def write(key: str, value: str, unique: bool = False) -> PutItem:
        item = {SIDE_TABLE_KEY: {"S": key}, "value": {"S": value}}
        if unique:
            return PutItem(table, item, "attribute_not_exists(#pk)", {"#pk": SIDE_TABLE_KEY})
        return PutItem(table, item)
    return write


async def _memory() -> AsyncIterator[Backend]:
    store = MemoryStore()
    backend = store.stores().leader

    async def written(key: str) -> str | None:
        items = store.written.get("side", {}).values()
        item = next((i for i in items if i[SIDE_TABLE_KEY]["S"] == key), None)
        return None if item is None else str(item["value"]["S"])

    async def expire(name: str) -> None:
        raise AssertionError("memory leases lapse by observation")

    yield Backend(backend, _put("side"), written, expire, True, True)


async def _dynamodb(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    request.getfixturevalue("dynamodb_endpoint")
    names: tuple[str, str, str] = request.getfixturevalue("table_names")
    side = names[0] + "-side"
    async with dynamodb.connect_admin(*names) as stores:
        await stores.admin.create_tables()
        async with aioboto3.Session().client("dynamodb") as client:
            await client.create_table(
                TableName=side, BillingMode="PAY_PER_REQUEST",
                AttributeDefinitions=[{"AttributeName": SIDE_TABLE_KEY, "AttributeType": "S"}],
                KeySchema=[{"AttributeName": SIDE_TABLE_KEY, "KeyType": "HASH"}])

            async def written(key: str) -> str | None:
                resp = await client.get_item(TableName=side, ConsistentRead=True,
                                             Key={SIDE_TABLE_KEY: {"S": key}})
                item = resp.get("Item")
                return None if item is None else str(item["value"]["S"])

            async def expire(name: str) -> None:
                raise AssertionError("DynamoDB leases lapse by observation")

            yield Backend(stores.leader, _put(side), written, expire, True, True)


@pytest.fixture(params=["memory", "dynamodb"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    makers: dict[str, Callable[[], AsyncIterator[Backend]]] = {
        "memory": _memory,
        "dynamodb": lambda: _dynamodb(request),
    }
    async for made in makers[request.param]():
        yield made
