"""The change feed reader and its checkpoints: records from the embedded server, shard
lineage and faults from a fake DynamoDB Streams client, and a leader change."""

from __future__ import annotations

import contextlib
import datetime
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aioboto3
import pytest
from botocore.exceptions import ClientError
from prometheus_client import CollectorRegistry

from streamlease.core.changes import Action, ChangeEvent
from streamlease.core.lease import LeaseTimings
from streamlease.dev.dynamodb import EmbeddedDynamoDB, ServerOptions
from streamlease.metrics import CHANGE_FEED_ERROR_KINDS, Metrics
from streamlease.store import schema
from streamlease.store.dynamodb.changefeed import (
    ENDED,
    FAULT_KINDS,
    Batch,
    ChangeFeedReader,
    Fault,
    FaultKind,
    FeedResult,
    FeedSource,
    Opened,
    open_streams_client,
    streams_endpoint,
)
from streamlease.store.dynamodb.client import DynamoClient, client_config
from streamlease.store.dynamodb.feedcheckpoints import DynamoFeedCheckpoints
from streamlease.store.feedcheckpoints import (
    Checkpoint,
    FeedCheckpointStore,
    MemoryFeedCheckpoints,
)
from streamlease.store.protocols import Stores

T = LeaseTimings(20.0, 5.0, 1.0, 2.0)
WALL_MS = 1_700_000_000_000


class Clock:
    def __init__(self) -> None:
        self.mono = 100.0
        self.wall = WALL_MS

    def monotonic(self) -> float:
        return self.mono

    def wall_ms(self) -> int:
        return self.wall

    async def sleep(self, seconds: float) -> None:
        self.mono += seconds


def batches(results: list[FeedResult]) -> list[Batch]:
    assert all(isinstance(r, Batch) for r in results), results
    return [r for r in results if isinstance(r, Batch)]


def faults(results: list[FeedResult]) -> list[Fault]:
    return [r for r in results if isinstance(r, Fault)]


def changes(results: list[FeedResult]) -> list[tuple[str, str, tuple[Action, ...]]]:
    return [(c.event.value, c.stream_id, c.actions()) for b in batches(results) for c in b.records]


# -- against the embedded server ------------------------------------------------------------

@contextlib.asynccontextmanager
async def fleet_checkpoints(fleet_table: str) -> AsyncIterator[DynamoFeedCheckpoints]:
    async with aioboto3.Session().client("dynamodb", region_name="us-east-1",
                                         config=client_config(4)) as raw:
        yield DynamoFeedCheckpoints(DynamoClient(raw), fleet_table)


async def test_records_of_the_fleet_s_own_writes(dynamo: Stores,
                                                 table_names: tuple[str, str, str]) -> None:
    """Through the session's server (only AWS_ENDPOINT_URL_DYNAMODB set: the streams client
    falls back to it): every write the fleet makes comes out, decoded and classified."""
    streams_table, _, fleet_table = table_names
    async with open_streams_client("us-east-1") as client, \
            fleet_checkpoints(fleet_table) as saved:
        reader = ChangeFeedReader(FeedSource(client, streams_table, saved, Clock()), fence=1)
        opened = await reader.open()
        assert isinstance(opened, Opened) and opened.backstop  # first start: LATEST
        assert batches(await reader.poll())[0].records == ()
        await dynamo.admin.put_started("a", "wss://x/a")
        tenure = await dynamo.leases.acquire("a", "w1", WALL_MS, T)
        assert tenure is not None
        await dynamo.admin.put_started("a", "wss://x/b")  # re-pointed while held
        await dynamo.admin.set_state("a", "STOPPED")
        await dynamo.leases.release(tenure.tenure)
        await dynamo.admin.set_state("a", "STARTED")
        assert await dynamo.leases.acquire("a", "w2", WALL_MS, T) is not None
        await dynamo.admin.force_release("a")
        await dynamo.admin.put_started("b", "wss://x/b")
        async with aioboto3.Session().client("dynamodb", region_name="us-east-1") as raw:
            await raw.delete_item(TableName=streams_table, Key={"Pk": {"S": "CONN#b"}})
        results = await reader.poll()
        assert changes(results) == [
            ("INSERT", "a", (Action.OFFER,)),
            ("MODIFY", "a", (Action.NONE,)),  # acquired
            ("MODIFY", "a", (Action.REPOINTED,)),
            ("MODIFY", "a", (Action.STOPPED,)),
            ("MODIFY", "a", (Action.NONE,)),  # released, stopped: not offered
            ("MODIFY", "a", (Action.OFFER,)),  # started again
            ("MODIFY", "a", (Action.NONE,)),  # acquired by w2
            ("MODIFY", "a", (Action.FORCE_RELEASED, Action.OFFER)),
            ("INSERT", "b", (Action.OFFER,)),
            ("REMOVE", "b", (Action.NONE,)),
        ]
        (batch,) = batches(results)
        first = batch.records[0]
        assert first.event is ChangeEvent.INSERT and first.old is None
        assert first.new is not None and first.new.ws_url == "wss://x/a"
        assert first.approximate_at_ms is not None and first.shard_id == batch.shard_id
        assert batch.position == batch.records[-1].sequence_number
        assert await reader.commit(batch)
        assert (await saved.load())[batch.shard_id].sequence_number == batch.position
        assert batches(await reader.poll())[0].records == ()  # nothing new


@pytest.mark.parametrize("store", ["dynamodb", "memory"])
async def test_a_new_leader_resumes_after_the_checkpoint_and_fences_the_old_one_out(
        dynamo: Stores, table_names: tuple[str, str, str], store: str) -> None:
    streams_table, _, fleet_table = table_names
    async with open_streams_client("us-east-1") as client, \
            fleet_checkpoints(fleet_table) as on_dynamodb:
        saved: FeedCheckpointStore = on_dynamodb if store == "dynamodb" \
            else MemoryFeedCheckpoints()
        old = ChangeFeedReader(FeedSource(client, streams_table, saved, Clock()), fence=4)
        await old.open()
        await old.poll()
        await dynamo.admin.put_started("a", "wss://x/a")
        (read,) = batches(await old.poll())
        assert [c.stream_id for c in read.records] == ["a"]
        assert await old.commit(read)
        await dynamo.admin.put_started("b", "wss://x/b")  # after the old leader's checkpoint
        new = ChangeFeedReader(FeedSource(client, streams_table, saved, Clock()), fence=5)
        opened = await new.open()
        assert isinstance(opened, Opened) and opened.resumed == 1 and not opened.backstop
        (resumed,) = batches(await new.poll())
        assert [c.stream_id for c in resumed.records] == ["b"]  # "a" is not read again
        assert await new.commit(resumed)
        # The deposed leader read "b" too; its checkpoint must not land.
        (late,) = batches(await old.poll())
        assert [c.stream_id for c in late.records] == ["b"]
        assert not await old.commit(late)
        assert (await saved.load())[resumed.shard_id].fence == 5


async def test_a_table_without_a_stream_means_the_backstop(
        dynamodb_endpoint: str, table_names: tuple[str, str, str]) -> None:
    metrics = Metrics(CollectorRegistry())
    plain = table_names[0]
    async with aioboto3.Session().client("dynamodb", region_name="us-east-1") as raw:
        await raw.create_table(**schema.streams_table(plain))
    async with open_streams_client("us-east-1") as client:
        reader = ChangeFeedReader(FeedSource(client, plain, MemoryFeedCheckpoints(), Clock(),
                                             metrics=metrics), fence=1)
        opened = await reader.open()
        assert isinstance(opened, Fault) and opened.kind is FaultKind.NO_STREAM
        assert opened.backstop
        (again,) = await reader.poll()  # polling tries to open again
        assert isinstance(again, Fault) and again.kind is FaultKind.NO_STREAM
    assert counter(metrics, "streamlease_change_feed_errors_total", kind="no_stream") == 2


async def test_a_checkpoint_below_the_trim_horizon_is_trimmed_then_reads_on() -> None:
    """Against a server whose stream keeps 3 records: the checkpoint's successor is gone."""
    with EmbeddedDynamoDB(ServerOptions(stream_records_max=3)) as server:
        session = aioboto3.Session()
        conn = {"endpoint_url": server.endpoint_url, "region_name": "us-east-1",
                "aws_access_key_id": "local", "aws_secret_access_key": "local"}
        env = {"AWS_ENDPOINT_URL_DYNAMODB": server.endpoint_url}
        async with session.client("dynamodb", **conn) as db, \
                open_streams_client("us-east-1", environ=env) as client:
            table = f"trim-{uuid.uuid4().hex[:8]}"
            await db.create_table(**schema.streams_table(table),
                                  StreamSpecification=schema.STREAM_SPECIFICATION)
            saved = MemoryFeedCheckpoints()
            reader = ChangeFeedReader(FeedSource(client, table, saved, Clock(), limit=1), fence=1)
            await reader.open()
            await reader.poll()
            for sid in "abcdef":
                await db.put_item(TableName=table, Item={
                    "Pk": {"S": f"CONN#{sid}"}, "desired_state": {"S": "STARTED"},
                    "ws_url": {"S": "wss://x/"}, "lease_expires_at_ms": {"N": "0"}})
            # LATEST was taken before the writes; a is trimmed away by now (cap 3).
            (fault,) = faults(await reader.poll())
            assert fault.kind is FaultKind.TRIMMED and fault.backstop
            seen = []
            for _ in range(4):
                seen += [c.stream_id for b in batches(await reader.poll()) for c in b.records]
            assert seen == ["d", "e", "f"]


# -- a fake DynamoDB Streams client: lineage and faults -----------------------------------

def client_error(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": 400}}, operation)


def record(sid: str, seq: int, event: str = "INSERT", at_ms: int = WALL_MS) -> dict[str, Any]:
    image = {"Pk": {"S": f"CONN#{sid}"}, "desired_state": {"S": "STARTED"},
             "ws_url": {"S": "wss://x/"}, "lease_expires_at_ms": {"N": "0"}}
    return {"eventName": event, "dynamodb": {
        "Keys": {"Pk": image["Pk"]}, "NewImage": image, "SequenceNumber": str(seq),
        "ApproximateCreationDateTime": datetime.datetime.fromtimestamp(at_ms / 1000,
                                                                       datetime.UTC)}}


class FakeStreams:
    """Shards (listed children first, to prove the reader orders them), records, and
    errors injected per operation."""

    ARN = "arn:aws:dynamodb:us-east-1:1:table/t/stream/2026"

    def __init__(self) -> None:
        # shard id -> (parent, records, closed)
        self.shards: dict[str, tuple[str | None, list[dict[str, Any]], bool]] = {}
        self.errors: dict[str, list[str]] = {}
        self.calls: list[tuple[str, Any]] = []

    def _maybe_fail(self, operation: str) -> None:
        pending = self.errors.get(operation)
        if pending:
            raise client_error(pending.pop(0), operation)

    async def list_streams(self, **kw: Any) -> dict[str, Any]:
        self._maybe_fail("list_streams")
        return {"Streams": [{"StreamArn": self.ARN, "TableName": "t", "StreamLabel": "2026"}]}

    async def describe_stream(self, **kw: Any) -> dict[str, Any]:
        """One shard a page, to exercise pagination."""
        self._maybe_fail("describe_stream")
        ids = list(self.shards)
        start = ids.index(kw["ExclusiveStartShardId"]) + 1 if "ExclusiveStartShardId" in kw else 0
        page = ids[start:start + 1]
        shards = []
        for shard_id in page:
            parent, _records, closed = self.shards[shard_id]
            numbers: dict[str, str] = {"StartingSequenceNumber": "0"}
            if closed:
                numbers["EndingSequenceNumber"] = "999"
            shards.append({"ShardId": shard_id, "SequenceNumberRange": numbers,
                           **({"ParentShardId": parent} if parent else {})})
        desc: dict[str, Any] = {"StreamArn": self.ARN, "StreamStatus": "ENABLED",
                                "Shards": shards}
        if start + 1 < len(ids):
            desc["LastEvaluatedShardId"] = page[-1]
        return {"StreamDescription": desc}

    async def get_shard_iterator(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(("get_shard_iterator", (kw["ShardId"], kw["ShardIteratorType"],
                                                  kw.get("SequenceNumber"))))
        self._maybe_fail("get_shard_iterator")
        _, records, _ = self.shards[kw["ShardId"]]
        kind = kw["ShardIteratorType"]
        if kind == "TRIM_HORIZON":
            index = 0
        elif kind == "LATEST":
            index = len(records)
        else:
            seq = int(kw["SequenceNumber"])
            index = next((i for i, r in enumerate(records)
                          if int(r["dynamodb"]["SequenceNumber"]) > seq), len(records))
        return {"ShardIterator": f"{kw['ShardId']}|{index}"}

    async def get_records(self, **kw: Any) -> dict[str, Any]:
        shard_id, index_text = kw["ShardIterator"].split("|")
        self.calls.append(("get_records", shard_id))
        self._maybe_fail("get_records")
        _, records, closed = self.shards[shard_id]
        index = int(index_text)
        got = records[index:index + kw["Limit"]]
        following = index + len(got)
        out: dict[str, Any] = {"Records": got}
        if not (closed and following >= len(records)):
            out["NextShardIterator"] = f"{shard_id}|{following}"
        return out


def reader_on(fake: FakeStreams, saved: FeedCheckpointStore | None = None,
              metrics: Metrics | None = None, fence: int = 1) -> ChangeFeedReader:
    return ChangeFeedReader(FeedSource(DynamoClient(fake), "t", saved or MemoryFeedCheckpoints(),
                                       Clock(), metrics=metrics), fence=fence)


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value


async def resumed_from_a_checkpoint(fake: FakeStreams) -> ChangeFeedReader:
    """A reader whose feed has a checkpoint somewhere (not a first start: TRIM_HORIZON)."""
    saved = MemoryFeedCheckpoints()
    await saved.save(Checkpoint("shard-old", ENDED, 1, 0))
    return reader_on(fake, saved)


async def test_a_split_parent_is_read_to_its_end_before_its_children() -> None:
    fake = FakeStreams()
    # Listed children first: DescribeStream promises no order the reader may rely on.
    fake.shards["child-1"] = ("parent", [record("c1", 20)], False)
    fake.shards["child-2"] = ("parent", [record("c2", 30)], False)
    fake.shards["parent"] = (None, [record("p1", 1), record("p2", 2)], True)
    reader = await resumed_from_a_checkpoint(fake)
    opened = await reader.open()
    assert isinstance(opened, Opened) and opened.shards == 3
    (first,) = batches(await reader.poll())
    assert first.shard_id == "parent" and first.shard_ended and first.position == ENDED
    assert [c.stream_id for c in first.records] == ["p1", "p2"]
    await reader.commit(first)
    children = batches(await reader.poll())
    assert [(b.shard_id, [c.stream_id for c in b.records]) for b in children] == [
        ("child-1", ["c1"]), ("child-2", ["c2"])]
    # A leader change after the parent was read out: the next reader skips it.
    for batch in children:
        await reader.commit(batch)
    nxt = reader_on(fake, reader.checkpoints, fence=2)
    await nxt.open()
    fake.shards["child-1"][1].append(record("c3", 21))
    assert [c.stream_id for b in batches(await nxt.poll()) for c in b.records] == ["c3"]


async def test_an_expired_iterator_is_replaced_from_the_position() -> None:
    metrics = Metrics(CollectorRegistry())
    fake = FakeStreams()
    fake.shards["s"] = (None, [record("a", 1)], False)
    reader = await resumed_from_a_checkpoint(fake)
    reader.metrics = metrics
    await reader.open()
    assert [c.stream_id for b in batches(await reader.poll()) for c in b.records] == ["a"]
    fake.shards["s"][1].append(record("b", 2))
    fake.errors["get_records"] = ["ExpiredIteratorException"]
    (fault,) = await reader.poll()
    assert isinstance(fault, Fault) and fault.kind is FaultKind.EXPIRED_ITERATOR
    assert not fault.backstop  # nothing missed: the position is known
    assert [c.stream_id for b in batches(await reader.poll()) for c in b.records] == ["b"]
    assert ("get_shard_iterator", ("s", "AFTER_SEQUENCE_NUMBER", "1")) in fake.calls
    assert counter(metrics, "streamlease_change_feed_errors_total",
                   kind="expired_iterator") == 1


@pytest.mark.parametrize("operation", ["get_records", "get_shard_iterator"])
async def test_a_trimmed_iterator_asks_for_the_backstop_and_reads_on_from_the_horizon(
        operation: str) -> None:
    fake = FakeStreams()
    fake.shards["s"] = (None, [record("a", 1)], False)
    saved = MemoryFeedCheckpoints()
    await saved.save(Checkpoint("s", "0", 1, 0))
    reader = reader_on(fake, saved)
    await reader.open()
    fake.errors[operation] = ["TrimmedDataAccessException"]
    (fault,) = await reader.poll()
    assert isinstance(fault, Fault) and fault.kind is FaultKind.TRIMMED and fault.backstop
    assert [c.stream_id for b in batches(await reader.poll()) for c in b.records] == ["a"]
    assert fake.calls[-2] == ("get_shard_iterator", ("s", "TRIM_HORIZON", None))


async def test_a_checkpointed_shard_gone_past_retention_is_trimmed_and_forgotten() -> None:
    fake = FakeStreams()
    fake.shards["s2"] = (None, [record("a", 1)], False)
    saved = MemoryFeedCheckpoints()
    await saved.save(Checkpoint("s1", "5", 1, 0))  # s1 expired while no leader read
    reader = reader_on(fake, saved, fence=2)
    opened = await reader.open()
    assert isinstance(opened, Fault) and opened.kind is FaultKind.TRIMMED and opened.backstop
    assert "s1" not in await saved.load()
    assert [c.stream_id for b in batches(await reader.poll()) for c in b.records] == ["a"]


async def test_throttling_backs_off_and_a_clean_pass_resets_it() -> None:
    fake = FakeStreams()
    fake.shards["s"] = (None, [record("a", 1)], False)
    reader = await resumed_from_a_checkpoint(fake)
    await reader.open()
    fake.errors["get_records"] = ["LimitExceededException",
                                  "ProvisionedThroughputExceededException"]
    delays = []
    for _ in range(2):
        (fault,) = await reader.poll()
        assert isinstance(fault, Fault) and fault.kind is FaultKind.THROTTLED
        assert not fault.backstop
        delays.append(fault.retry_after_s)
    assert 0 < delays[0] < delays[1]
    assert [c.stream_id for b in batches(await reader.poll()) for c in b.records] == ["a"]
    fake.errors["get_records"] = ["InternalServerError"]
    (other,) = await reader.poll()
    assert isinstance(other, Fault) and other.kind is FaultKind.OTHER
    assert other.retry_after_s == delays[0]  # reset by the clean pass


async def test_records_not_about_a_stream_are_skipped_but_passed() -> None:
    fake = FakeStreams()
    odd = record("x", 2)
    odd["dynamodb"]["Keys"] = {"Pk": {"S": "NOT-A-STREAM"}}
    fake.shards["s"] = (None, [record("a", 1), odd, {"eventName": "BOGUS"}], False)
    reader = await resumed_from_a_checkpoint(fake)
    await reader.open()
    (batch,) = batches(await reader.poll())
    assert [c.stream_id for c in batch.records] == ["a"] and batch.skipped == 2
    assert batch.position == "2"  # the last record with a sequence number


async def test_lag_is_the_newest_record_s_age() -> None:
    metrics = Metrics(CollectorRegistry())
    fake = FakeStreams()
    fake.shards["s"] = (None, [record("a", 1, at_ms=WALL_MS - 4_000)], False)
    reader = await resumed_from_a_checkpoint(fake)
    reader.metrics = metrics
    await reader.open()
    (batch,) = batches(await reader.poll())
    assert batch.lag_s == 4.0
    assert counter(metrics, "streamlease_change_feed_lag_seconds") == 4.0
    assert batches(await reader.poll())[0].lag_s == 0.0  # at the tip


def test_the_streams_endpoint_falls_back_to_dynamodb_s() -> None:
    assert streams_endpoint({"AWS_ENDPOINT_URL_DYNAMODBSTREAMS": "http://127.0.0.1:1",
                             "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:2"}) \
        == "http://127.0.0.1:1"
    assert streams_endpoint({"AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:2"}) \
        == "http://127.0.0.1:2"
    # botocore's own settings, when given, are botocore's to apply.
    assert streams_endpoint({"AWS_ENDPOINT_URL_DYNAMODB_STREAMS": "http://127.0.0.1:3",
                             "AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:2"}) is None
    assert streams_endpoint({}) is None


def test_feed_metrics_are_exposed_at_zero_for_every_label() -> None:
    metrics = Metrics(CollectorRegistry())
    assert CHANGE_FEED_ERROR_KINDS == FAULT_KINDS
    for kind in FAULT_KINDS:
        assert counter(metrics, "streamlease_change_feed_errors_total", kind=kind) == 0
    for action in Action:
        assert counter(metrics, "streamlease_change_feed_records_total",
                       action=action.value) == 0
    assert counter(metrics, "streamlease_change_feed_lag_seconds") == 0
