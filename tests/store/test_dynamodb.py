"""What only the DynamoDB backend has: the table definitions, and how calls are metered."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator

import aioboto3
import pytest

from streamlease.errors import StoreUnavailable
from streamlease.store.dynamodb import DynamoAdmin
from streamlease.store.dynamodb.client import DynamoClient, client_config, items_read
from streamlease.store.protocols import Stores


async def test_table_create_is_idempotent_and_matches_the_contract(dynamo: Stores) -> None:
    admin = dynamo.admin
    assert isinstance(admin, DynamoAdmin)
    assert await admin.create_tables() == []  # second run: nothing new
    async with aioboto3.Session().client("dynamodb") as client:
        desc = (await client.describe_table(TableName=admin.table))["Table"]
    assert desc["KeySchema"] == [{"AttributeName": "Pk", "KeyType": "HASH"}]
    assert desc["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    indexes = {i["IndexName"]: i for i in desc["GlobalSecondaryIndexes"]}
    index = indexes["desired_state-lease_expires_at_ms-index"]
    assert index["KeySchema"] == [
        {"AttributeName": "desired_state", "KeyType": "HASH"},
        {"AttributeName": "lease_expires_at_ms", "KeyType": "RANGE"},
    ]
    # A checkpoint (last_seq) must not write the hot index: it is not projected.
    assert index["Projection"]["ProjectionType"] == "INCLUDE"
    assert "last_seq" not in index["Projection"]["NonKeyAttributes"]
    owner = indexes["lease_owner-fence-index"]
    assert owner["KeySchema"] == [{"AttributeName": "lease_owner", "KeyType": "HASH"},
                                  {"AttributeName": "fence", "KeyType": "RANGE"}]
    assert owner["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    types = {a["AttributeName"]: a["AttributeType"] for a in desc["AttributeDefinitions"]}
    assert types == {"Pk": "S", "desired_state": "S", "lease_expires_at_ms": "N",
                     "lease_owner": "S", "fence": "N"}
    async with aioboto3.Session().client("dynamodb") as client:
        fleet = (await client.describe_table(TableName=admin.fleet_table))["Table"]
    assert fleet["KeySchema"] == [{"AttributeName": "Pk", "KeyType": "HASH"},
                                  {"AttributeName": "Sk", "KeyType": "RANGE"}]


async def test_table_create_enables_the_change_feed_stream(dynamo: Stores) -> None:
    """The streams table carries a DynamoDB stream with both images (the change feed reads
    it); the events and fleet tables have none (nobody reads one)."""
    admin = dynamo.admin
    assert isinstance(admin, DynamoAdmin)
    async with aioboto3.Session().client("dynamodb") as client:
        desc = (await client.describe_table(TableName=admin.table))["Table"]
        others = [(await client.describe_table(TableName=name))["Table"]
                  for name in (admin.events_table, admin.fleet_table)]
    assert desc["StreamSpecification"] == {"StreamEnabled": True,
                                           "StreamViewType": "NEW_AND_OLD_IMAGES"}
    assert desc["LatestStreamArn"].startswith(desc["TableArn"] + "/stream/")
    assert all("LatestStreamArn" not in other for other in others)
    assert await admin.stream_advice() == []


@pytest.mark.parametrize("spec", [None, {"StreamEnabled": True, "StreamViewType": "KEYS_ONLY"}])
async def test_a_streams_table_without_the_stream_gets_advice_not_a_failure(
        dynamodb_endpoint: str, table_names: tuple[str, str, str],
        spec: dict[str, object] | None) -> None:
    from streamlease.store import dynamodb, schema

    old = schema.streams_table(table_names[0])
    if spec is not None:
        old["StreamSpecification"] = spec
    async with aioboto3.Session().client("dynamodb") as client:
        await client.create_table(**old)
    async with dynamodb.connect(*table_names) as stores:
        assert isinstance(stores.admin, DynamoAdmin)
        await stores.admin.create_tables()  # no failure: the stream is advice
        assert await stores.admin.check_tables() == []  # a worker starts on it
        (advice,) = await stores.admin.stream_advice()
    assert table_names[0] in advice
    assert (f"aws dynamodb update-table --table-name {table_names[0]} --stream-specification "
            "StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES") in advice
    assert ("no DynamoDB stream" in advice) == (spec is None)
    assert ("view type KEYS_ONLY" in advice) == (spec is not None)


async def test_table_create_adds_the_indexes_an_older_table_lacks(
        dynamodb_endpoint: str, table_names: tuple[str, str, str]) -> None:
    from streamlease.errors import TableMissing
    from streamlease.store import dynamodb, schema

    old = schema.streams_table(table_names[0])
    # As the first release created it: one index, projecting everything.
    old["GlobalSecondaryIndexes"] = old["GlobalSecondaryIndexes"][:1]
    old["GlobalSecondaryIndexes"][0]["Projection"] = {"ProjectionType": "ALL"}
    old["AttributeDefinitions"] = old["AttributeDefinitions"][:3]
    async with aioboto3.Session().client("dynamodb") as client:
        await client.create_table(**old)
    async with dynamodb.connect(*table_names) as stores:
        with pytest.raises(TableMissing, match="lease_owner-fence-index"):
            await stores.admin.check_tables()  # a worker refuses to start on it
        created = await stores.admin.create_tables()
        assert f"{table_names[0]}/index/lease_owner-fence-index" in created
        (advice,) = await stores.admin.check_tables()  # works, at a cost it names
        assert "projects ALL" in advice and "desired_state-lease_expires_at_ms-index" in advice


async def test_an_index_that_lacks_what_the_worker_reads_is_refused(
        dynamodb_endpoint: str, table_names: tuple[str, str, str]) -> None:
    from streamlease.errors import TableMissing
    from streamlease.store import dynamodb, schema

    thin = schema.streams_table(table_names[0])
    thin["GlobalSecondaryIndexes"][0]["Projection"] = {"ProjectionType": "KEYS_ONLY"}
    async with aioboto3.Session().client("dynamodb") as client:
        await client.create_table(**thin)
    async with dynamodb.connect(*table_names) as stores:
        await stores.admin.create_tables()  # the other tables; it cannot fix a projection
        with pytest.raises(TableMissing, match=r"does not project .*ws_url"):
            await stores.admin.check_tables()


class SilentServer:
    """A loopback port that accepts connections, reads, and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.requests = 0
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                self.requests += data.count(b"X-Amz-Target")


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.sock.close()
    for conn in server.held:
        conn.close()


async def test_timed_out_and_cancelled_calls_are_metered_as_such(silent: SilentServer) -> None:
    seen: list[tuple[str, str]] = []
    session = aioboto3.Session(aws_access_key_id="x", aws_secret_access_key="x")
    async with session.client("dynamodb", region_name="us-east-1", endpoint_url=silent.endpoint,
                              config=client_config(4)) as raw:
        client = DynamoClient(raw, lambda op, outcome, s: seen.append((op, outcome)))
        with pytest.raises(StoreUnavailable, match="timed out"):
            await client.call("get_item", 0.2, TableName="t", Key={"Pk": {"S": "a"}})
        task = asyncio.create_task(client.call("get_item", 30, TableName="t",
                                               Key={"Pk": {"S": "a"}}))
        async with asyncio.timeout(10):  # cancel it while the request is in flight
            while silent.requests < 2:  # noqa: ASYNC110 - a poll with a deadline
                await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert seen == [("get_item", "timeout"), ("get_item", "cancelled")]


async def test_reads_are_metered_by_the_items_they_return(
        dynamodb_endpoint: str, table_names: tuple[str, str, str]) -> None:
    from streamlease.store import dynamodb

    counted: list[tuple[str, int]] = []
    async with dynamodb.connect(*table_names, dynamodb.ConnectOptions(
            count_read=lambda op, n: counted.append((op, n)))) as stores:
        await stores.admin.create_tables()
        for sid in ("a", "b", "c"):
            await stores.admin.put_started(sid, f"ws://127.0.0.1:1/{sid}")
        counted.clear()
        assert sum([len(page) async for page in stores.leases.scan_pages()]) == 3
        assert await stores.leases.check("a") is not None
        assert await stores.leases.check("nope") is None  # no item: nothing read
        await stores.leases.release_for("a", "w", 1, 1)  # a write: nothing read
    assert counted == [("scan", 3), ("get_item", 1)]


def test_items_read_from_answers_of_any_shape() -> None:
    assert items_read("query", {"Count": 2, "ScannedCount": 5, "Items": [{}, {}]}) == 5
    assert items_read("scan", {"Count": 2, "Items": [{}, {}]}) == 2
    assert items_read("query", {"Items": [{}]}) == 1
    assert items_read("get_item", {"Item": {"Pk": {"S": "a"}}}) == 1
    assert items_read("get_item", {}) == 0
    assert items_read("batch_get_item", {"Responses": {"t": [{}, {}], "u": [{}]}}) == 3
    assert items_read("update_item", {"Attributes": {}}) == 0
    for odd in (None, [], {"Count": "x", "Items": "y"}, {"Responses": []}):
        assert items_read("query", odd) == 0 and items_read("batch_get_item", odd) == 0


async def test_table_create_turns_on_ttl_on_the_events_table(dynamo: Stores) -> None:
    """``expires_at`` (STREAMLEASE_EVENTS_TTL_SECONDS) is the events table's TTL attribute;
    turning it on again is a no-op (the fixture already ran table create once)."""
    admin = dynamo.admin
    assert isinstance(admin, DynamoAdmin)
    async with aioboto3.Session().client("dynamodb") as client:
        ttl = (await client.describe_time_to_live(TableName=admin.events_table))
    assert ttl["TimeToLiveDescription"] == {"TimeToLiveStatus": "ENABLED",
                                            "AttributeName": "expires_at"}
    assert await admin.create_tables() == []


async def test_table_create_refuses_ttl_on_another_attribute(
        dynamodb_endpoint: str, table_names: tuple[str, str, str]) -> None:
    from streamlease.errors import StoreError
    from streamlease.store import dynamodb, schema

    async with aioboto3.Session().client("dynamodb") as client:
        await client.create_table(**schema.events_table(table_names[1]))
        await client.update_time_to_live(
            TableName=table_names[1],
            TimeToLiveSpecification={"Enabled": True, "AttributeName": "gone_at"})
    async with dynamodb.connect(*table_names) as stores:
        with pytest.raises(StoreError, match="TTL on gone_at, not expires_at"):
            await stores.admin.create_tables()
