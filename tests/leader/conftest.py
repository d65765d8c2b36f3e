"""Leader backends for the contract suite: each with a way to write a value, to read it
back, and to make a held lease lapse. Redis runs on a real ``redis-server`` (with AOF,
``appendfsync always``) that the session starts on a free loopback port; MongoDB on the
session's MongoDB wire server (tests/mongoserver.py), a database of its own per test."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aioboto3
import pytest

from streamlease.leader import HashSet, LeaderBackend, PutItem, Upsert
from streamlease.store import dynamodb, fleetcodec
from streamlease.store.memory import MemoryStore
from streamlease.store.mongo_leader import LEASES, mongo_backend
from streamlease.store.redis_leader import client_for, lease_keys, redis_backend, redis_target
from tests.mongoserver import MongoServer
from tests.redisserver import RedisServer

SIDE_TABLE_KEY = "Pk"


@dataclass
class Backend:
    impl: LeaderBackend
    write: Callable[..., Any]  # (key, value, unique=False) -> a write for this backend
    written: Callable[[str], Awaitable[str | None]]  # key -> value written, or None
    expire: Callable[[str], Awaitable[None]]  # make a held lease lapse now
    # Lose a lease's item, as an operator's delete or a restore from an older backup does
    # (Redis: the lease key; its fence counter stays, as it does on a server with AOF).
    forget: Callable[[str], Awaitable[None]]
    observe_takeover: bool  # a candidate takes a silent lease by observing it
    conditional_writes: bool  # writes may carry their own condition
    # Set a lease's fence by hand, lower than it was (an edit, a partial restore); None
    # where the fence is not kept on the lease's record (Redis: its own counter).
    rewind: Callable[[str, int], Awaitable[None]] | None = None


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

    async def forget(name: str) -> None:
        del store.leaders[name]

    async def rewind(name: str, fence: int) -> None:
        store.leaders[name] = dataclasses.replace(store.leaders[name], fence=fence)

    yield Backend(backend, _put("side"), written, expire, forget, True, True, rewind)


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

            async def forget(name: str) -> None:
                await client.delete_item(TableName=names[2], Key=fleetcodec.leader_key(name),
                                         ConditionExpression="attribute_exists(Pk)")

            async def rewind(name: str, fence: int) -> None:
                await client.update_item(TableName=names[2], Key=fleetcodec.leader_key(name),
                                         UpdateExpression="SET fence = :f",
                                         ExpressionAttributeValues={":f": {"N": str(fence)}})

            yield Backend(stores.leader, _put(side), written, expire, forget, True, True,
                          rewind)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """``redis-server`` with AOF and ``appendfsync always``, for the whole session."""
    server = RedisServer(tmp_path_factory.mktemp("redis"), aof=True)
    server.start()
    try:
        yield server
    finally:
        server.close()


async def _redis(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    server: RedisServer = request.getfixturevalue("redis_server")
    side = f"side-{uuid.uuid4().hex[:8]}"
    raw = client_for(redis_target(server.url))

    def write(key: str, value: str, unique: bool = False) -> HashSet:
        assert not unique, "HashSet carries no condition of its own"
        return HashSet(side, key, value)

    async def written(key: str) -> str | None:
        value = await raw.hget(side, key)
        return None if value is None else str(value)

    async def expire(name: str) -> None:
        # What a silent holder's lease does by itself once its PX runs out, made to
        # happen now: the server's own expiry, then absent to every reader.
        lease, _ = lease_keys(name)
        assert await raw.pexpire(lease, 1)
        deadline = time.monotonic() + 5
        while await raw.exists(lease):
            assert time.monotonic() < deadline, "the lease did not lapse"

    async def forget(name: str) -> None:
        lease, _ = lease_keys(name)
        assert await raw.delete(lease) == 1

    try:
        async with redis_backend(server.url) as impl:
            yield Backend(impl, write, written, expire, forget, False, False)
    finally:
        await raw.aclose()


async def _mongodb(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    server: MongoServer = request.getfixturevalue("mongo_server")
    url = server.url(f"leader-{uuid.uuid4().hex[:8]}")
    side = "side"

    def write(key: str, value: str, unique: bool = False) -> Upsert:
        assert not unique, "Upsert carries no condition of its own"
        return Upsert(side, key, {"value": value})

    async with mongo_backend(url) as impl:
        async def written(key: str) -> str | None:
            found = await impl.db[side].find_one({"_id": key})
            return None if found is None else str(found["value"])

        async def expire(name: str) -> None:
            # What a silent holder's lease is once the server's clock passes its expiry.
            lapsed = await impl.leases.update_one({"_id": name, "holder": {"$ne": None}},
                                                  {"$set": {"expires_at_ms": 1}})
            assert lapsed.matched_count == 1, "no held lease to lapse"

        async def forget(name: str) -> None:
            assert (await impl.db[LEASES].delete_one({"_id": name})).deleted_count == 1

        async def rewind(name: str, fence: int) -> None:
            await impl.leases.update_one({"_id": name}, {"$set": {"fence": fence}})

        yield Backend(impl, write, written, expire, forget, False, False, rewind)


@pytest.fixture(params=["memory", "dynamodb", "redis", "mongodb"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    makers: dict[str, Callable[[], AsyncIterator[Backend]]] = {
        "memory": _memory,
        "dynamodb": lambda: _dynamodb(request),
        "redis": lambda: _redis(request),
        "mongodb": lambda: _mongodb(request),
    }
    async for made in makers[request.param]():
        yield made
