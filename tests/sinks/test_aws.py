"""The kinesis://, sqs:// and s3:// outputs against moto's server over HTTP on loopback.

Each test uses names of its own on the session's server. Partial failures come from a
client wrapper that fails chosen records of a call the way the services do (the others of
the call land), not from mocks of the output's internals.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import aioboto3
import pytest

from streamlease.core.sinks import SinkSpec, parse_sink
from streamlease.errors import ConfigError
from streamlease.processor import Context, Message
from streamlease.sinks import open_output
from streamlease.sinks.aws import (
    KINESIS_MAX_RECORDS,
    AwsOutputError,
    RecordTooLarge,
    chunks,
    group_id,
    object_key,
    partition_key,
)

REGION = "us-east-1"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def ctx(stream_id: str = "s-1", fence: int = 1, failure: str | None = None) -> Context:
    return Context(stream_id=stream_id, fence=fence, owner="w-1", item={}, resume_after=0,
                   checkpoint=0, failure=failure)


def batch(seqs: Iterable[int], pad: int = 0) -> list[Message]:
    out = []
    for seq in seqs:
        data = {"seq": seq, "v": "x" * pad}
        out.append(Message(seq, data, json.dumps(data)))
    return out


@pytest.fixture
async def admin(aws_env: str) -> AsyncIterator[dict[str, Any]]:
    """Plain clients to create the destinations and read them back."""
    session = aioboto3.Session()
    async with session.client("kinesis", region_name=REGION) as kinesis, \
            session.client("sqs", region_name=REGION) as sqs, \
            session.client("s3", region_name=REGION) as s3:
        yield {"kinesis": kinesis, "sqs": sqs, "s3": s3}


class Opened:
    """``async with Opened(url) as (factory, new):`` an output entered for one test."""

    def __init__(self, url: str) -> None:
        self.manager = open_output(parse_sink(url))

    async def __aenter__(self) -> Any:
        return await self.manager.__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        await self.manager.__aexit__(None, None, None)


# --- Kinesis ----------------------------------------------------------------------------

async def make_stream(kinesis: Any, shards: int = 1) -> str:
    name = unique("sl")
    await kinesis.create_stream(StreamName=name, ShardCount=shards)
    return name


async def shard_contents(kinesis: Any, name: str) -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Every shard's records, in shard order: (partition key, decoded record)."""
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    shards = (await kinesis.list_shards(StreamName=name))["Shards"]
    for shard in shards:
        iterator = (await kinesis.get_shard_iterator(
            StreamName=name, ShardId=shard["ShardId"],
            ShardIteratorType="TRIM_HORIZON"))["ShardIterator"]
        records: list[tuple[str, dict[str, Any]]] = []
        for _ in range(100):
            page = await kinesis.get_records(ShardIterator=iterator, Limit=10000)
            if not page["Records"]:
                break
            records += [(r["PartitionKey"], json.loads(r["Data"])) for r in page["Records"]]
            iterator = page["NextShardIterator"]
        out[shard["ShardId"]] = records
    return out


def seqs_of(records: Sequence[tuple[str, dict[str, Any]]], stream_id: str) -> list[int]:
    return [r["seq"] for _, r in records if r["stream_id"] == stream_id]


def in_order_reader(seqs: Sequence[int], expected: Sequence[int]) -> list[int]:
    """A consumer that takes a record only when it is the next seq it expects."""
    taken: list[int] = []
    for seq in seqs:
        if len(taken) < len(expected) and seq == expected[len(taken)]:
            taken.append(seq)
    return taken


class FailingKinesis:
    """Wraps a client: ``plans`` lists, per PutRecords call, the indexes that fail; the
    other records of the call are really sent (as the service does)."""

    def __init__(self, client: Any, plans: list[set[int]]) -> None:
        self.client = client
        self.plans = plans
        self.calls: list[int] = []  # records per call

    async def put_records(self, **kwargs: Any) -> dict[str, Any]:
        records = kwargs.pop("Records")
        self.calls.append(len(records))
        failing = self.plans.pop(0) if self.plans else set()
        sent = [r for i, r in enumerate(records) if i not in failing]
        answers = iter((await self.client.put_records(Records=sent, **kwargs))["Records"]
                       if sent else [])
        results = [{"ErrorCode": "ProvisionedThroughputExceededException",
                    "ErrorMessage": "Rate exceeded for shard"} if i in failing
                   else next(answers) for i in range(len(records))]
        return {"FailedRecordCount": len(failing), "Records": results}


async def test_kinesis_batch_lands_in_one_shard_per_stream_in_order(admin: Any) -> None:
    name = await make_stream(admin["kinesis"], shards=4)
    async with Opened(f"kinesis://{name}") as factory:
        ids = [f"stream-{i}" for i in range(6)]
        for sid in ids:
            await factory().process(batch(range(1, 6)), ctx(sid, fence=3))
    shards = await shard_contents(admin["kinesis"], name)
    for sid in ids:
        holding = [shard for shard, recs in shards.items() if seqs_of(recs, sid)]
        assert len(holding) == 1, (sid, holding)
        records = [(k, r) for k, r in shards[holding[0]] if r["stream_id"] == sid]
        assert [r["seq"] for _, r in records] == [1, 2, 3, 4, 5]
        assert all(key == sid for key, _ in records)
        assert records[0][1] == {"stream_id": sid, "seq": 1, "fence": 3,
                                 "data": {"seq": 1, "v": ""}}


async def test_kinesis_splits_big_batches_into_calls_and_keeps_order(admin: Any) -> None:
    name = await make_stream(admin["kinesis"])
    async with Opened(f"kinesis://{name}") as factory:
        processor = factory()
        processor.client = wrapped = FailingKinesis(processor.client, [])
        await processor.process(batch(range(1, 1002)), ctx())
        # 5 MiB a call: records of about 600 KB go 8 a call.
        await processor.process(batch(range(1002, 1011), pad=600_000), ctx())
    assert wrapped.calls == [KINESIS_MAX_RECORDS, KINESIS_MAX_RECORDS, 1, 8, 1]
    [records] = (await shard_contents(admin["kinesis"], name)).values()
    assert seqs_of(records, "s-1") == list(range(1, 1011))


async def test_kinesis_partial_failure_resends_from_the_first_failed_record(
        admin: Any) -> None:
    """Record 3 fails while 4 and 5 land: 3, 4, 5 are sent again, in order. The shard holds
    4 and 5 twice; the stream's records appear in seq order after the first copies."""
    name = await make_stream(admin["kinesis"])
    async with Opened(f"kinesis://{name}") as factory:
        processor = factory()
        processor.client = wrapped = FailingKinesis(processor.client, [{2}])
        await processor.process(batch(range(1, 6)), ctx())
    assert wrapped.calls == [5, 3]
    [records] = (await shard_contents(admin["kinesis"], name)).values()
    seqs = seqs_of(records, "s-1")
    assert seqs == [1, 2, 4, 5, 3, 4, 5]
    assert in_order_reader(seqs, [1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5]


async def test_kinesis_failure_without_progress_raises_and_the_retry_resumes(
        admin: Any) -> None:
    """A call whose first record fails raises (the worker backs off and retries the batch);
    the retry starts at the first record not yet in the shard in order."""
    name = await make_stream(admin["kinesis"])
    async with Opened(f"kinesis://{name}") as factory:
        processor = factory()
        processor.client = wrapped = FailingKinesis(processor.client, [{2}, {0}])
        with pytest.raises(AwsOutputError, match="ProvisionedThroughputExceeded"):
            await processor.process(batch(range(1, 6)), ctx())
        await processor.process(batch(range(1, 6)), ctx())  # the worker's retry
    assert wrapped.calls == [5, 3, 3]
    [records] = (await shard_contents(admin["kinesis"], name)).values()
    seqs = seqs_of(records, "s-1")
    assert seqs == [1, 2, 4, 5, 4, 5, 3, 4, 5]
    assert in_order_reader(seqs, [1, 2, 3, 4, 5]) == [1, 2, 3, 4, 5]


async def test_kinesis_resend_by_a_new_tenure_duplicates(admin: Any) -> None:
    """At least once: a batch sent again by the next holder (its checkpoint never landed)
    is in the shard twice, each copy in order and carrying its own fence. The same
    tenure's processor does not send a delivered batch again."""
    name = await make_stream(admin["kinesis"])
    async with Opened(f"kinesis://{name}") as factory:
        first = factory()
        await first.process(batch(range(1, 4)), ctx(fence=1))
        await first.process(batch(range(1, 4)), ctx(fence=1))  # checkpoint retry
        await factory().process(batch(range(1, 4)), ctx(fence=2))
    [records] = (await shard_contents(admin["kinesis"], name)).values()
    assert [(r["seq"], r["fence"]) for _, r in records] == [
        (1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (3, 2)]


async def test_kinesis_oversized_record_is_refused_before_sending(admin: Any) -> None:
    name = await make_stream(admin["kinesis"])
    async with Opened(f"kinesis://{name}") as factory:
        processor = factory()
        messages = batch([1]) + batch([2], pad=1024 * 1024)
        with pytest.raises(RecordTooLarge, match=r"seq 2 .* over the 1024 KiB"):
            await processor.process(messages, ctx())
    [records] = (await shard_contents(admin["kinesis"], name)).values()
    assert records == []


async def test_kinesis_missing_stream_fails_the_batch_not_the_start(admin: Any) -> None:
    async with Opened(f"kinesis://{unique('missing')}") as factory:
        with pytest.raises(AwsOutputError, match="ResourceNotFoundException"):
            await factory().process(batch([1]), ctx())


# --- SQS --------------------------------------------------------------------------------

async def make_queue(sqs: Any, fifo: bool) -> tuple[str, str]:
    name = unique("sl") + (".fifo" if fifo else "")
    attributes = {"FifoQueue": "true"} if fifo else {}
    url = (await sqs.create_queue(QueueName=name, Attributes=attributes))["QueueUrl"]
    return name, url


async def drain(sqs: Any, url: str) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Every message, in receive order (deleted as read, so FIFO groups move on)."""
    out: list[tuple[dict[str, Any], dict[str, str]]] = []
    for _ in range(1000):
        page = await sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                         WaitTimeSeconds=0, AttributeNames=["All"])
        messages = page.get("Messages", [])
        if not messages:
            return out
        for m in messages:
            out.append((json.loads(m["Body"]), m.get("Attributes", {})))
            await sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    raise AssertionError("the queue did not drain")


class FailingSqs:
    """Wraps a client: ``plans`` lists, per SendMessageBatch call, the entry indexes that
    fail; the other entries are really sent."""

    def __init__(self, client: Any, plans: list[set[int]]) -> None:
        self.client = client
        self.plans = plans
        self.calls: list[list[str]] = []  # the dedup ids (or bodies' seqs) of each call

    async def send_message_batch(self, **kwargs: Any) -> dict[str, Any]:
        entries = kwargs["Entries"]
        self.calls.append([str(json.loads(e["MessageBody"])["seq"]) for e in entries])
        failing = self.plans.pop(0) if self.plans else set()
        sent = [e for i, e in enumerate(entries) if i not in failing]
        answer = (await self.client.send_message_batch(QueueUrl=kwargs["QueueUrl"],
                                                       Entries=sent)) if sent else {}
        return {"Successful": answer.get("Successful", []),
                "Failed": [{"Id": entries[i]["Id"], "Code": "InternalError",
                            "SenderFault": False, "Message": "injected"} for i in failing]}


async def test_sqs_standard_queue_batch_lands_with_record_shape(admin: Any) -> None:
    name, url = await make_queue(admin["sqs"], fifo=False)
    async with Opened(f"sqs://{name}") as factory:
        processor = factory()
        processor.client = wrapped = FailingSqs(processor.client, [])
        await processor.process(batch(range(1, 26)), ctx("s/\u00e9", fence=4))
    assert [len(c) for c in wrapped.calls] == [10, 10, 5]
    bodies = [body for body, _ in await drain(admin["sqs"], url)]
    assert sorted(b["seq"] for b in bodies) == list(range(1, 26))
    assert {"stream_id": "s/\u00e9", "seq": 7, "fence": 4, "data": {"seq": 7, "v": ""}} in bodies


async def test_sqs_fifo_keeps_order_and_deduplicates_a_resend(admin: Any) -> None:
    name, url = await make_queue(admin["sqs"], fifo=True)
    async with Opened(f"sqs://{name}") as factory:
        await factory().process(batch(range(1, 16)), ctx("a", fence=1))
        await factory().process(batch(range(1, 16)), ctx("b", fence=1))
        # The next holder of "a" sends the same batch again (its checkpoint never landed).
        await factory().process(batch(range(1, 16)), ctx("a", fence=2))
    received = await drain(admin["sqs"], url)
    for sid in ("a", "b"):
        mine = [(b, attrs) for b, attrs in received if b["stream_id"] == sid]
        assert [b["seq"] for b, _ in mine] == list(range(1, 16))
        assert {b["fence"] for b, _ in mine} == {1}  # the second copy was dropped
        assert {attrs["MessageGroupId"] for _, attrs in mine} == {sid}
        assert [attrs["MessageDeduplicationId"] for _, attrs in mine] == [
            f"{sid}:{seq}" for seq in range(1, 16)]


async def test_sqs_partial_failure_raises_and_the_retry_resends_from_it(admin: Any) -> None:
    name, url = await make_queue(admin["sqs"], fifo=True)
    async with Opened(f"sqs://{name}") as factory:
        processor = factory()
        processor.client = wrapped = FailingSqs(processor.client, [set(), {3}])
        with pytest.raises(AwsOutputError, match=r"1 of 10 messages failed \(InternalError\)"
                                                 r" from seq 14"):
            await processor.process(batch(range(1, 26)), ctx())
        await processor.process(batch(range(1, 26)), ctx())  # the worker's retry
    assert [c[0] for c in wrapped.calls] == ["1", "11", "14", "24"]
    received = [b["seq"] for b, _ in await drain(admin["sqs"], url)]
    # Every seq once: the re-sent 15..20 were deduplicated, so 14 arrives after them.
    assert received == [*range(1, 14), *range(15, 21), 14, *range(21, 26)]


async def test_sqs_oversized_message_is_refused_before_sending(admin: Any) -> None:
    name, url = await make_queue(admin["sqs"], fifo=False)
    async with Opened(f"sqs://{name}") as factory:
        messages = batch([1]) + batch([2], pad=256 * 1024)
        with pytest.raises(RecordTooLarge, match=r"seq 2 .* over the 256 KiB"):
            await factory().process(messages, ctx())
    assert await drain(admin["sqs"], url) == []


async def test_sqs_long_or_odd_stream_ids_get_a_hashed_group(admin: Any) -> None:
    name, url = await make_queue(admin["sqs"], fifo=True)
    odd = "stream with spaces é"
    async with Opened(f"sqs://{name}") as factory:
        await factory().process(batch([1, 2]), ctx(odd))
    received = await drain(admin["sqs"], url)
    assert [b["stream_id"] for b, _ in received] == [odd, odd]
    assert received[0][1]["MessageGroupId"] == group_id(odd)
    assert received[0][1]["MessageGroupId"].startswith("sha256-")


async def test_sqs_missing_queue_is_a_config_error(aws_env: str) -> None:
    with pytest.raises(ConfigError, match=r"STREAMLEASE_SINK: SQS queue '.*' does not exist"):
        async with Opened(f"sqs://{unique('missing')}"):
            pass


async def test_sqs_unreachable_endpoint_is_not_a_config_error(
        aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens on the port: the output opens, and each batch fails (retried)."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # botocore's own retries: not needed here
    async with Opened("sqs://some-queue") as factory:
        with pytest.raises(AwsOutputError, match="GetQueueUrl"):
            await factory().process(batch([1]), ctx())


# --- S3 ---------------------------------------------------------------------------------

async def make_bucket(s3: Any) -> str:
    name = unique("sl-bucket")
    await s3.create_bucket(Bucket=name)
    return name


async def objects(s3: Any, bucket: str) -> dict[str, bytes]:
    listing = await s3.list_objects_v2(Bucket=bucket)
    out = {}
    for item in listing.get("Contents", []):
        body = await s3.get_object(Bucket=bucket, Key=item["Key"])
        out[item["Key"]] = await body["Body"].read()
    return out


async def test_s3_one_object_per_batch_and_a_resend_is_idempotent(admin: Any) -> None:
    bucket = await make_bucket(admin["s3"])
    async with Opened(f"s3://{bucket}/out/events/") as factory:
        processor = factory()
        await processor.process(batch(range(1, 4)), ctx("s-1", fence=2))
        await processor.process(batch(range(4, 6)), ctx("s-1", fence=2))
        first = await objects(admin["s3"], bucket)
        await processor.process(batch(range(1, 4)), ctx("s-1", fence=2))  # a retry
        assert await objects(admin["s3"], bucket) == first
    assert sorted(first) == [
        f"out/events/s-1/{1:020d}-{3:020d}.jsonl", f"out/events/s-1/{4:020d}-{5:020d}.jsonl"]
    lines = [json.loads(line) for line in
             first[f"out/events/s-1/{1:020d}-{3:020d}.jsonl"].decode().splitlines()]
    assert lines == [{"stream_id": "s-1", "seq": s, "fence": 2, "data": {"seq": s, "v": ""}}
                     for s in (1, 2, 3)]


async def test_s3_stream_ids_are_key_safe_and_dead_letters_carry_the_error(
        admin: Any) -> None:
    bucket = await make_bucket(admin["s3"])
    async with Opened(f"s3://{bucket}") as factory:
        await factory().process(batch([7]), ctx("../a b/c", failure="ValueError: bad"))
    [(key, body)] = (await objects(admin["s3"], bucket)).items()
    assert key == f"%2E.%2Fa%20b%2Fc/{7:020d}-{7:020d}.jsonl"
    assert json.loads(body) == {"stream_id": "../a b/c", "seq": 7, "fence": 1,
                                "data": {"seq": 7, "v": ""}, "error": "ValueError: bad"}


async def test_s3_missing_bucket_fails_the_batch(admin: Any) -> None:
    async with Opened(f"s3://{unique('missing-bucket')}/p") as factory:
        with pytest.raises(AwsOutputError, match="NoSuchBucket"):
            await factory().process(batch([1]), ctx())


async def test_the_general_endpoint_variable_is_honoured(
        admin: Any, aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore reads AWS_ENDPOINT_URL itself when no per-service variable is set."""
    bucket = await make_bucket(admin["s3"])
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws_env)
    async with Opened(f"s3://{bucket}") as factory:
        await factory().process(batch([1]), ctx())
    assert len(await objects(admin["s3"], bucket)) == 1


# --- configuration ----------------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "kinesis://a/b",
    "kinesis://" + "k" * 129,
    "sqs://bad.name",
    "sqs://" + "q" * 81,
    "s3://Bad_Bucket/prefix",
    "s3://ab",
    "s3://10.0.0.1/p",
    "s3://a..b/p",
])
async def test_bad_names_are_config_errors(aws_env: str, url: str) -> None:
    with pytest.raises(ConfigError, match=r"STREAMLEASE_SINK: .* is not an? "):
        async with Opened(url):
            pass


async def test_no_region_is_a_config_error(aws_env: str, monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Any) -> None:
    for key in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(ConfigError, match="AWS_REGION: not set"):
        async with Opened("kinesis://events"):
            pass


def test_arns_are_accepted_names() -> None:
    from streamlease.sinks.aws import _problems
    assert _problems(SinkSpec("kinesis", "", "arn:aws:kinesis:eu-west-1:123456789012:"
                                             "stream/events")) == []
    assert _problems(SinkSpec("sqs", "", "arn:aws:sqs:eu-west-1:123456789012:q.fifo")) == []


# --- pure helpers -----------------------------------------------------------------------

def test_chunks_respect_count_and_bytes_in_order() -> None:
    sizes = [4, 4, 4, 9, 1, 1, 1, 1]
    assert chunks(sizes, lambda n: n, max_items=3, max_bytes=10) == [
        [4, 4], [4], [9, 1], [1, 1, 1]]
    assert chunks([], lambda n: n, 3, 10) == []


def test_keys_fall_back_to_a_hash_when_the_service_would_refuse_the_id() -> None:
    assert partition_key("s-1") == "s-1"
    assert partition_key("x" * 257).startswith("sha256-")
    assert partition_key("x" * 257) != partition_key("x" * 258)
    assert group_id("s-1") == "s-1"
    assert group_id("x" * 200).startswith("sha256-")
    assert len(f"{group_id('x' * 200)}:{2**63}") <= 128
    assert object_key("", "a", 1, 2) == f"a/{1:020d}-{2:020d}.jsonl"
    long_key = object_key("p", "é" * 300, 1, 2)
    assert len(long_key.encode()) < 300 and long_key != object_key("p", "é" * 301, 1, 2)
