"""The embedded DynamoDB serves DynamoDB Streams on its own endpoint, as DynamoDB would.

Records come out for writes served through the server (put, update, delete, transactions),
one per item a successful request changed; failed requests and writes that change nothing
leave no record; records are trimmed past retention and iterators expire, with DynamoDB's
error codes (moto alone answers HTTP 500 or keeps everything for ever).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import aioboto3
import pytest
from botocore.exceptions import ClientError
from moto.core.serialize import TimestampSerializer

from streamlease.dev.dynamodb import EmbeddedDynamoDB, ServerOptions, _json_default
from streamlease.store import schema

STREAM = {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}


class StepClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Served:
    db: Any
    streams: Any
    table: str
    clock: StepClock

    async def arn(self) -> str:
        listed = (await self.streams.list_streams(TableName=self.table))["Streams"]
        assert len(listed) == 1, listed
        return str(listed[0]["StreamArn"])

    async def shard(self) -> str:
        desc = (await self.streams.describe_stream(StreamArn=await self.arn()))
        (shard,) = desc["StreamDescription"]["Shards"]
        return str(shard["ShardId"])

    async def iterator(self, kind: str = "TRIM_HORIZON", seq: str | None = None) -> str:
        extra = {"SequenceNumber": seq} if seq is not None else {}
        got = await self.streams.get_shard_iterator(
            StreamArn=await self.arn(), ShardId=await self.shard(), ShardIteratorType=kind,
            **extra)
        return str(got["ShardIterator"])

    async def records(self, kind: str = "TRIM_HORIZON",
                      seq: str | None = None) -> list[dict[str, Any]]:
        got = await self.streams.get_records(ShardIterator=await self.iterator(kind, seq))
        return list(got["Records"])


@contextlib.asynccontextmanager
async def served(**settings: Any) -> AsyncIterator[Served]:
    clock = StepClock()
    with EmbeddedDynamoDB(ServerOptions(**settings), clock=clock) as server:
        session = aioboto3.Session()
        conn = {"endpoint_url": server.endpoint_url, "region_name": "us-east-1",
                "aws_access_key_id": "local", "aws_secret_access_key": "local"}
        async with session.client("dynamodb", **conn) as db, \
                session.client("dynamodbstreams", **conn) as streams:
            table = f"feed-{uuid.uuid4().hex[:8]}"
            await db.create_table(**schema.streams_table(table), StreamSpecification=STREAM)
            yield Served(db, streams, table, clock)


def item(sid: str, **attrs: str | int) -> dict[str, Any]:
    out: dict[str, Any] = {"Pk": {"S": f"CONN#{sid}"}, "desired_state": {"S": "STARTED"},
                           "ws_url": {"S": "wss://x/"}}
    for name, value in attrs.items():
        out[name] = {"N": str(value)} if isinstance(value, int) else {"S": value}
    return out


def summary(records: list[dict[str, Any]]) -> list[tuple[str, str, Any, Any]]:
    """(event, Pk, old fence or state, new fence or state) per record."""
    def brief(image: dict[str, Any] | None) -> Any:
        if image is None:
            return None
        return image.get("fence", image.get("desired_state"))
    return [(r["eventName"], r["dynamodb"]["Keys"]["Pk"]["S"],
             brief(r["dynamodb"].get("OldImage")), brief(r["dynamodb"].get("NewImage")))
            for r in records]


async def test_records_for_put_update_delete_and_transactions() -> None:
    async with served() as s:
        await s.db.put_item(TableName=s.table, Item=item("a"))
        await s.db.update_item(TableName=s.table, Key={"Pk": {"S": "CONN#a"}},
                               UpdateExpression="SET fence = :f",
                               ExpressionAttributeValues={":f": {"N": "1"}})
        await s.db.transact_write_items(TransactItems=[
            {"Put": {"TableName": s.table, "Item": item("b")}},
            {"Update": {"TableName": s.table, "Key": {"Pk": {"S": "CONN#a"}},
                        "UpdateExpression": "SET fence = :f",
                        "ExpressionAttributeValues": {":f": {"N": "2"}}}}])
        await s.db.delete_item(TableName=s.table, Key={"Pk": {"S": "CONN#b"}})
        records = await s.records()
        assert summary(records) == [
            ("INSERT", "CONN#a", None, {"S": "STARTED"}),
            ("MODIFY", "CONN#a", {"S": "STARTED"}, {"N": "1"}),
            ("INSERT", "CONN#b", None, {"S": "STARTED"}),
            ("MODIFY", "CONN#a", {"N": "1"}, {"N": "2"}),
            ("REMOVE", "CONN#b", {"S": "STARTED"}, None),
        ]
        first = records[0]["dynamodb"]
        assert first["NewImage"] == item("a") and first["StreamViewType"] == "NEW_AND_OLD_IMAGES"
        # Epoch seconds on the wire, read back as the moment of the write.
        written = first["ApproximateCreationDateTime"]
        assert isinstance(written, datetime) and written.tzinfo is not None
        assert abs((written - datetime.now(UTC)).total_seconds()) < 60
        seqs = [int(r["dynamodb"]["SequenceNumber"]) for r in records]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        # Reading on after the last record sees only what came later.
        await s.db.put_item(TableName=s.table, Item=item("c"))
        later = await s.records("AFTER_SEQUENCE_NUMBER", records[-1]["dynamodb"]["SequenceNumber"])
        assert summary(later) == [("INSERT", "CONN#c", None, {"S": "STARTED"})]


@pytest.mark.parametrize("moment", [
    datetime(2026, 12, 6, 3, 4, 5),
    datetime(2026, 12, 6, 3, 4, 5, 678_901),
    datetime(2026, 12, 6, 3, 4, 5, 999, tzinfo=UTC),
    datetime(2026, 12, 6, 5, 4, 5, 250_000, tzinfo=timezone(timedelta(hours=2))),
])
def test_timestamps_are_written_as_moto_writes_them(moment: datetime) -> None:
    """The server's own answers (Streams records, stream descriptions) carry the same epoch
    seconds moto's writer would: naive values read as UTC, milliseconds kept."""
    expected = TimestampSerializer._timestamp_unixtimestamp(moment)
    if moment.tzinfo is not None:
        expected = TimestampSerializer._timestamp_unixtimestamp(
            moment.astimezone(UTC).replace(tzinfo=None))
    assert _json_default(moment) == expected


async def test_one_record_per_changed_item_and_none_for_a_failed_request() -> None:
    """moto alone writes two INSERTs for an UpdateItem that creates its item, a record for
    a put that changes nothing, and keeps the records of a cancelled transaction."""
    async with served() as s:
        await s.db.update_item(TableName=s.table, Key={"Pk": {"S": "CONN#new"}},
                               UpdateExpression="SET desired_state = :s, ws_url = :u",
                               ExpressionAttributeValues={":s": {"S": "STARTED"},
                                                          ":u": {"S": "wss://x/"}})
        await s.db.put_item(TableName=s.table, Item=item("new"))  # the same item again
        with pytest.raises(ClientError):
            await s.db.put_item(TableName=s.table, Item=item("new", lease_owner="w"),
                                ConditionExpression="attribute_not_exists(Pk)")
        with pytest.raises(ClientError) as cancelled:
            await s.db.transact_write_items(TransactItems=[
                {"Put": {"TableName": s.table, "Item": item("x")}},
                {"ConditionCheck": {"TableName": s.table, "Key": {"Pk": {"S": "CONN#none"}},
                                    "ConditionExpression": "attribute_exists(Pk)"}}])
        assert cancelled.value.response["Error"]["Code"] == "TransactionCanceledException"
        with pytest.raises(ClientError):  # a wrongly typed index key is refused
            await s.db.update_item(TableName=s.table, Key={"Pk": {"S": "CONN#new"}},
                                   UpdateExpression="SET lease_expires_at_ms = :x",
                                   ExpressionAttributeValues={":x": {"S": "soon"}})
        records = await s.records()
        assert summary(records) == [("INSERT", "CONN#new", None, {"S": "STARTED"})]
        assert records[0]["dynamodb"]["NewImage"] == item("new")


async def test_records_past_the_cap_are_trimmed_and_reading_there_is_refused() -> None:
    async with served(stream_records_max=3) as s:
        for sid in "abcde":
            await s.db.put_item(TableName=s.table, Item=item(sid))
        assert [r[1] for r in summary(await s.records())] == ["CONN#c", "CONN#d", "CONN#e"]
        first = int((await s.records())[0]["dynamodb"]["SequenceNumber"])
        with pytest.raises(ClientError) as trimmed:
            await s.iterator("AFTER_SEQUENCE_NUMBER", str(first - 2))
        assert trimmed.value.response["Error"]["Code"] == "TrimmedDataAccessException"
        # An iterator taken earlier falls behind the horizon as records are trimmed.
        held = await s.iterator("AT_SEQUENCE_NUMBER", str(first))
        await s.db.put_item(TableName=s.table, Item=item("f"))
        with pytest.raises(ClientError) as behind:
            await s.streams.get_records(ShardIterator=held)
        assert behind.value.response["Error"]["Code"] == "TrimmedDataAccessException"
        # A checkpoint on the record just trimmed still reads on from the horizon.
        assert [r[1] for r in summary(await s.records("AFTER_SEQUENCE_NUMBER", str(first)))] \
            == ["CONN#d", "CONN#e", "CONN#f"]


async def test_records_expire_after_the_retention_and_iterators_after_15_minutes() -> None:
    async with served(stream_retention_s=60.0) as s:
        await s.db.put_item(TableName=s.table, Item=item("old"))
        s.clock.now += 30
        await s.db.put_item(TableName=s.table, Item=item("young"))
        held = await s.iterator()
        s.clock.now += 31  # "old" is 61 s old: past retention
        assert [r[1] for r in summary(await s.records())] == ["CONN#young"]
        with pytest.raises(ClientError) as trimmed:
            await s.streams.get_records(ShardIterator=held)
        assert trimmed.value.response["Error"]["Code"] == "TrimmedDataAccessException"
        fresh = await s.iterator("LATEST")
        s.clock.now += 15 * 60 + 1
        with pytest.raises(ClientError) as expired:
            await s.streams.get_records(ShardIterator=fresh)
        assert expired.value.response["Error"]["Code"] == "ExpiredIteratorException"
        # Each answer's next iterator starts a new 15 minutes.
        got = await s.streams.get_records(ShardIterator=await s.iterator("LATEST"))
        s.clock.now += 14 * 60
        await s.streams.get_records(ShardIterator=got["NextShardIterator"])


async def test_missing_streams_are_resource_not_found() -> None:
    async with served() as s:
        arn = await s.arn()
        plain = f"plain-{uuid.uuid4().hex[:8]}"
        await s.db.create_table(**schema.streams_table(plain))
        assert (await s.streams.list_streams(TableName=plain))["Streams"] == []
        gone = arn.replace(f"table/{s.table}/", f"table/{plain}/")
        for bad in (gone, arn.rsplit("/", 1)[0] + "/2001-01-01T00:00:00.000"):
            with pytest.raises(ClientError) as missing:
                await s.streams.describe_stream(StreamArn=bad)
            assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"
        with pytest.raises(ClientError) as no_shard:
            await s.streams.get_shard_iterator(
                StreamArn=arn, ShardId="shardId-00000000000000000000-00000000",
                ShardIteratorType="TRIM_HORIZON")
        assert no_shard.value.response["Error"]["Code"] == "ResourceNotFoundException"
        # Re-created, the table has a new stream; the old ARN is gone with the old table.
        await s.db.delete_table(TableName=s.table)
        await s.db.create_table(**schema.streams_table(s.table), StreamSpecification=STREAM)
        with pytest.raises(ClientError) as old:
            await s.streams.describe_stream(StreamArn=arn)
        assert old.value.response["Error"]["Code"] == "ResourceNotFoundException"


async def test_the_cli_server_serves_the_stream_on_its_endpoint(dynamodb_endpoint: str) -> None:
    """The server the test session starts (``streamlease dev dynamodb``) answers
    DynamoDB Streams on the DynamoDB endpoint."""
    session = aioboto3.Session()
    conn = {"endpoint_url": dynamodb_endpoint, "region_name": "us-east-1"}
    async with session.client("dynamodb", **conn) as db, \
            session.client("dynamodbstreams", **conn) as streams:
        table = f"feed-{uuid.uuid4().hex[:8]}"
        await db.create_table(**schema.streams_table(table), StreamSpecification=STREAM)
        await db.put_item(TableName=table, Item=item("cli"))
        s = Served(db, streams, table, StepClock())
        assert summary(await s.records()) == [("INSERT", "CONN#cli", None, {"S": "STARTED"})]
