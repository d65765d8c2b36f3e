"""Store faults injected live into the embedded DynamoDB (``--faults``): the fault set's
JSON and decisions on their own, then a real server process with real clients: each kind
observable while set and gone once cleared, a cut that takes one client's access key off
the store while the others go on, and the project's own client classifying what it sees.
"""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aioboto3
import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from streamlease.dev.dynamodb import EmbeddedDynamoDB, ServerOptions
from streamlease.dev.faults import (
    COUNTERS,
    FaultControl,
    FaultError,
    FaultRequest,
    FaultSet,
    Pass,
    Refuse,
    Reset,
    Stall,
    access_key,
    control_answer,
    decide,
)
from streamlease.dev.procs import free_port
from streamlease.errors import StoreThrottled, StoreUnavailable
from streamlease.store.dynamodb.client import (
    TXN_THROTTLE_REASONS,
    DynamoClient,
    TransactionCancelled,
    client_config,
)
from streamlease.store.dynamodb.leases import DynamoLeaseStore
from tests.procs import Proc, python

STREAM = {"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"}
INDEX = "by_owner"


def auth(key: str) -> str:
    return (f"AWS4-HMAC-SHA256 Credential={key}/20260101/us-east-1/dynamodb/aws4_request, "
            "SignedHeaders=host, Signature=0")


def request(operation: str, body: dict[str, Any] | None = None, key: str | None = "k",
            service: str = "DynamoDB_20120810") -> FaultRequest:
    return FaultRequest(f"{service}.{operation}", key, json.dumps(body or {}).encode())


def wait_for(check: Callable[[], bool], what: str, timeout: float = 10.0) -> float:
    """Poll ``check`` until true; the seconds it took. Fails naming ``what``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)
    return time.monotonic() - started


# -- The fault set and its decisions, without a server ------------------------------------

def test_a_fault_set_round_trips_its_json_and_shows_only_what_is_set() -> None:
    body = {"latency_ms": 250, "latency_mode": "parallel", "throttle": 0.5, "seed": 3,
            "cut": ["b", "a"], "cut_mode": "reset", "streams_unavailable": True,
            "streams_trimmed": True, "write_outage": ["events"], "index_lag_ms": 100,
            "index_lag_jitter_ms": 50, "stale_reads_ms": 20}
    faults = FaultSet.from_json(body)
    assert faults.to_json() == {**body, "cut": ["a", "b"]}
    assert FaultSet.from_json(faults.to_json()) == faults
    assert FaultSet.from_json({}).to_json() == {}
    assert not FaultSet.from_json({}).active
    # A mode without its fault is no fault.
    assert FaultSet.from_json({"latency_mode": "parallel", "cut_mode": "reset"}).to_json() == {}
    assert FaultSet.from_json({"index_lag_ms": 1}).active


@pytest.mark.parametrize("body", [
    b"", b"not json", b"[1]", b"null", b"\xff", b'{"throttle": 2}', b'{"throttle": true}',
    b'{"throttle": NaN}', b'{"latency_ms": -1}', b'{"latency_ms": 60001}',
    b'{"latency_ms": "5"}', b'{"latency_mode": "fast"}', b'{"cut": "worker"}',
    b'{"cut": [""]}', b'{"cut": [1]}', b'{"cut_mode": "drop"}', b'{"streams_trimmed": 1}',
    b'{"streams_unavailable": "yes"}', b'{"write_outage": "events"}',
    b'{"index_lag_ms": 10001}', b'{"stale_reads_ms": -0.5}', b'{"seed": 1.5}',
    b'{"seed": false}', b'{"nope": 1}',
])
def test_a_bad_body_is_refused_with_a_one_line_reason(body: bytes) -> None:
    with pytest.raises(FaultError) as refused:
        FaultSet.parse(body)
    assert str(refused.value) and "\n" not in str(refused.value)
    control = FaultControl(FaultSet(throttle=0.25))
    before = control.state()
    status, content_type, answer = control_answer(control, "PUT", body)
    assert status == 400 and content_type.startswith("text/plain")
    assert answer.endswith(b"\n") and answer.count(b"\n") == 1
    assert control.state() == before


def test_the_access_key_is_read_from_the_signature() -> None:
    assert access_key(auth("AKIDWORKER1")) == "AKIDWORKER1"
    assert access_key("") is None
    assert access_key("Bearer x") is None


def test_a_cut_key_stalls_or_resets_and_no_other_key_is_touched() -> None:
    rng = random.Random(0)
    stall = FaultSet(cut=frozenset({"a"}))
    assert isinstance(decide(stall, request("GetItem", key="a"), rng), Stall)
    assert isinstance(decide(stall, request("GetRecords", key="a",
                                            service="DynamoDBStreams_20120810"), rng), Stall)
    assert decide(stall, request("GetItem", key="b"), rng) == Pass()
    assert decide(stall, request("GetItem", key=None), rng) == Pass()
    reset = FaultSet(cut=frozenset({"a"}), cut_mode="reset")
    assert isinstance(decide(reset, request("GetItem", key="a"), rng), Reset)


def test_throttling_answers_as_dynamodb_does() -> None:
    rng = random.Random(0)
    faults = FaultSet(throttle=1.0)
    plain = decide(faults, request("PutItem"), rng)
    assert isinstance(plain, Refuse) and plain.status == 400
    assert plain.error["__type"].endswith("#ProvisionedThroughputExceededException")
    txn = decide(faults, request("TransactWriteItems", {"TransactItems": [{}, {}, {}]}), rng)
    assert isinstance(txn, Refuse) and txn.status == 400
    assert txn.error["__type"].endswith("#TransactionCanceledException")
    assert [r["Code"] for r in txn.error["CancellationReasons"]] == ["ThrottlingError"] * 3
    # Streams calls are not DynamoDB's throughput: never throttled here.
    assert decide(faults, request("GetRecords", service="DynamoDBStreams_20120810"),
                  rng) == Pass()


def test_the_throttle_draws_replay_from_the_seed() -> None:
    def outcomes(seed: int) -> list[bool]:
        rng = random.Random(seed)
        faults = FaultSet(throttle=0.5)
        return [isinstance(decide(faults, request("GetItem"), rng), Refuse) for _ in range(40)]

    expected = [draw < 0.5 for draw in (lambda r: [r.random() for _ in range(40)])(
        random.Random(9))]
    assert outcomes(9) == outcomes(9) == expected
    assert True in expected and False in expected


def test_a_write_outage_refuses_writes_naming_its_tables_and_nothing_else() -> None:
    rng = random.Random(0)
    faults = FaultSet(write_outage=frozenset({"events"}))

    def refused(operation: str, body: dict[str, Any]) -> bool:
        action = decide(faults, request(operation, body), rng)
        return isinstance(action, Refuse) and action.status == 500

    assert refused("PutItem", {"TableName": "events"})
    assert refused("UpdateItem", {"TableName": "arn:aws:dynamodb:us-east-1:1:table/events"})
    assert refused("DeleteItem", {"TableName": "events"})
    assert refused("BatchWriteItem", {"RequestItems": {"other": [], "events": []}})
    assert refused("TransactWriteItems", {"TransactItems": [
        {"Put": {"TableName": "other"}}, {"Update": {"TableName": "events"}}]})
    assert not refused("PutItem", {"TableName": "other"})
    assert not refused("TransactWriteItems", {"TransactItems": [
        {"Put": {"TableName": "other"}}]})
    assert not refused("GetItem", {"TableName": "events"})
    assert not refused("Query", {"TableName": "events"})
    assert not refused("TransactGetItems", {"TransactItems": [
        {"Get": {"TableName": "events"}}]})


def test_stream_faults_touch_only_streams_calls() -> None:
    rng = random.Random(0)
    down = FaultSet(streams_unavailable=True)
    action = decide(down, request("ListStreams", service="DynamoDBStreams_20120810"), rng)
    assert isinstance(action, Refuse) and action.status == 500
    assert decide(down, request("GetItem"), rng) == Pass()
    trimmed = FaultSet(streams_trimmed=True)
    action = decide(trimmed, request("GetRecords", service="DynamoDBStreams_20120810"), rng)
    assert isinstance(action, Refuse) and action.status == 400
    assert action.error["__type"].endswith("#TrimmedDataAccessException")
    assert decide(trimmed, request("GetShardIterator", service="DynamoDBStreams_20120810"),
                  rng) == Pass()


def test_reads_exposed_to_a_lag_are_counted() -> None:
    rng = random.Random(0)
    index = FaultSet(index_lag_ms=100)
    assert decide(index, request("Query", {"IndexName": "i"}), rng) == Pass("lagged_reads")
    assert decide(index, request("Query", {}), rng) == Pass()
    stale = FaultSet(stale_reads_ms=100)
    assert decide(stale, request("GetItem", {}), rng) == Pass("lagged_reads")
    assert decide(stale, request("GetItem", {"ConsistentRead": True}), rng) == Pass()
    assert decide(stale, request("BatchGetItem", {"RequestItems": {
        "t": {"ConsistentRead": True}}}), rng) == Pass()


def test_a_hold_follows_the_set_and_ends_when_it_is_cleared() -> None:
    control = FaultControl(FaultSet(latency_ms=30_000))
    assert not control.hold("parallel", time.monotonic())  # the other mode: no wait
    done = threading.Event()
    holder = threading.Thread(target=lambda: (control.hold("serial", time.monotonic()),
                                              done.set()))
    holder.start()
    wait_for(lambda: control.state()["counters"]["delayed"] == 1, "the hold to begin")
    assert not done.is_set()
    control.replace(FaultSet())
    assert done.wait(10), "clearing the latency did not release the held request"
    holder.join()


# -- A real server process with --faults --------------------------------------------------

@dataclass
class Control:
    """The ``/_faults`` control of a server, over plain HTTP."""

    url: str

    def call(self, method: str, body: bytes = b"") -> tuple[int, bytes]:
        parts = urlsplit(self.url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
        try:
            conn.request(method, "/_faults", body=body)
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    def get(self) -> dict[str, Any]:
        status, body = self.call("GET")
        assert status == 200, body
        state: dict[str, Any] = json.loads(body)
        return state

    def put(self, **faults: Any) -> dict[str, Any]:
        status, body = self.call("PUT", json.dumps(faults).encode())
        assert status == 200, body
        state: dict[str, Any] = json.loads(body)
        return state

    def counter(self, name: str) -> int:
        return int(self.get()["counters"][name])


@pytest.fixture(scope="module")
def fault_server() -> Iterator[str]:
    proc = Proc(python("-m", "streamlease", "dev", "dynamodb", "--faults", "--seed", "1",
                       "--port", str(free_port())), name="dynamodb-faults")
    try:
        yield proc.url()
    finally:
        proc.stop()


@pytest.fixture
def control(fault_server: str) -> Iterator[Control]:
    faults = Control(fault_server)
    faults.put()
    try:
        yield faults
    finally:
        faults.put()


def client(url: str, key: str = "local", service: str = "dynamodb",
           read_timeout: float = 20.0) -> Any:
    """A boto3 client signing with access key ``key``, without retries."""
    return boto3.client(service, endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key="secret",
                        config=Config(retries={"total_max_attempts": 1, "mode": "standard"},
                                      connect_timeout=3, read_timeout=read_timeout,
                                      max_pool_connections=8))


def make_table(db: Any, stream: bool = False) -> str:
    """A table keyed by ``k`` with an index on ``owner`` (projecting everything)."""
    name = f"faults-{uuid.uuid4().hex[:8]}"
    extra: dict[str, Any] = {"StreamSpecification": STREAM} if stream else {}
    db.create_table(
        TableName=name, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"},
                              {"AttributeName": "owner", "AttributeType": "S"}],
        GlobalSecondaryIndexes=[{"IndexName": INDEX,
                                 "KeySchema": [{"AttributeName": "owner", "KeyType": "HASH"}],
                                 "Projection": {"ProjectionType": "ALL"}}], **extra)
    return name


def put(db: Any, table: str, k: str, owner: str = "nobody") -> None:
    db.put_item(TableName=table, Item={"k": {"S": k}, "owner": {"S": owner}})


def code_of(call: Callable[[], Any]) -> tuple[str, int]:
    """The DynamoDB error code and HTTP status ``call`` fails with."""
    with pytest.raises(ClientError) as failed:
        call()
    response = failed.value.response
    return response["Error"]["Code"], response["ResponseMetadata"]["HTTPStatusCode"]


def test_the_control_answers_and_replaces_the_fault_set(control: Control) -> None:
    state = control.get()
    assert state["faults"] == {}
    assert set(state["counters"]) == set(COUNTERS)
    wanted = {"latency_ms": 1.0, "latency_mode": "parallel", "throttle": 0.001,
              "cut": ["nobody-uses-this-key"], "cut_mode": "stall",
              "write_outage": ["no-such-table"], "index_lag_ms": 5.0}
    replaced = control.put(**wanted)
    assert replaced["faults"] == wanted
    assert replaced["generation"] > state["generation"]
    assert control.get()["faults"] == wanted
    assert control.put()["faults"] == {}  # an empty object clears everything


def test_bad_bodies_are_refused_and_change_nothing(control: Control) -> None:
    control.put(throttle=0.25, cut=["x"])
    before = control.get()
    for body in (b"", b"{", b"[]", b'{"throttle": 1.5}', b'{"cut": "x"}', b'{"what": 1}',
                 b'{"latency_ms": 1e9}', b'{"cut_mode": "sometimes"}'):
        status, answer = control.call("PUT", body)
        assert status == 400, (body, answer)
        assert answer.endswith(b"\n") and answer.count(b"\n") == 1, answer
    status, _ = control.call("POST", b"{}")
    assert status == 405
    assert control.get() == before


def timed_gets(db: Any, table: str, n: int) -> tuple[float, list[float]]:
    """``n`` concurrent GetItems: the wall time of all, and each one's."""
    def one() -> float:
        started = time.monotonic()
        db.get_item(TableName=table, Key={"k": {"S": "x"}})
        return time.monotonic() - started

    started = time.monotonic()
    with ThreadPoolExecutor(n) as pool:
        each = list(pool.map(lambda _: one(), range(n)))
    return time.monotonic() - started, each


def test_latency_is_live_serial_saturates_parallel_does_not(
        control: Control, fault_server: str) -> None:
    db = client(fault_server)
    table = make_table(db)
    control.put(latency_ms=500, latency_mode="parallel")
    wall, each = timed_gets(db, table, 4)
    assert min(each) >= 0.5, each
    assert wall < 1.5, f"parallel latency serialised the requests: {wall:.2f} s"
    control.put(latency_ms=500, latency_mode="serial")
    wall, each = timed_gets(db, table, 4)
    assert wall >= 2.0, f"serial latency let requests overlap: {wall:.2f} s"
    control.put()
    delayed = control.counter("delayed")
    wall, _ = timed_gets(db, table, 4)
    assert wall < 0.5
    assert control.counter("delayed") == delayed


def test_clearing_the_latency_releases_the_requests_it_holds(
        control: Control, fault_server: str) -> None:
    db = client(fault_server)
    table = make_table(db)
    control.put(latency_ms=30_000, latency_mode="serial")
    delayed = control.counter("delayed")
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        held = pool.submit(db.get_item, TableName=table, Key={"k": {"S": "x"}})
        wait_for(lambda: control.counter("delayed") > delayed, "the request to be held")
        assert not held.done()
        control.put()
        held.result(timeout=10)
        assert time.monotonic() - started < 15


def test_throttle_one_throttles_every_request_then_none(
        control: Control, fault_server: str) -> None:
    db = client(fault_server)
    table = make_table(db)
    throttled = control.counter("throttled")
    control.put(throttle=1)
    assert code_of(lambda: put(db, table, "a")) == ("ProvisionedThroughputExceededException",
                                                    400)
    assert code_of(lambda: db.get_item(TableName=table, Key={"k": {"S": "a"}})) == \
        ("ProvisionedThroughputExceededException", 400)
    with pytest.raises(ClientError) as cancelled:
        db.transact_write_items(TransactItems=[
            {"Put": {"TableName": table, "Item": {"k": {"S": "b"}}}},
            {"Put": {"TableName": table, "Item": {"k": {"S": "c"}}}}])
    assert cancelled.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert [r["Code"] for r in cancelled.value.response["CancellationReasons"]] == \
        ["ThrottlingError", "ThrottlingError"]
    assert control.counter("throttled") == throttled + 3
    control.put()
    put(db, table, "a")
    assert control.counter("throttled") == throttled + 3


def test_a_seeded_throttle_replays(control: Control, fault_server: str) -> None:
    db = client(fault_server)
    table = make_table(db)

    def schedule() -> list[bool]:
        control.put(throttle=0.5, seed=42)
        outcomes = []
        for _ in range(24):
            try:
                db.get_item(TableName=table, Key={"k": {"S": "x"}})
                outcomes.append(False)
            except ClientError:
                outcomes.append(True)
        return outcomes

    expected = [draw < 0.5 for draw in
                (lambda rng: [rng.random() for _ in range(24)])(random.Random(42))]
    assert schedule() == expected
    assert schedule() == expected


async def test_the_projects_client_classifies_throttling_and_outages(
        control: Control, fault_server: str) -> None:
    table = make_table(client(fault_server))
    seen: list[tuple[str, str]] = []
    session = aioboto3.Session(aws_access_key_id="worker-1", aws_secret_access_key="x")
    async with session.client("dynamodb", region_name="us-east-1", endpoint_url=fault_server,
                              config=client_config(4)) as raw:
        dynamo = DynamoClient(raw, lambda op, outcome, s: seen.append((op, outcome)))
        store = DynamoLeaseStore(dynamo, table)
        control.put(throttle=1)
        with pytest.raises(StoreThrottled):
            await store.check("a")
        with pytest.raises(TransactionCancelled) as cancelled:
            await dynamo.call("transact_write_items", TransactItems=[
                {"Put": {"TableName": table, "Item": {"k": {"S": "a"}}}}])
        assert set(cancelled.value.codes) <= TXN_THROTTLE_REASONS
        control.put(write_outage=[table])
        with pytest.raises(StoreUnavailable):
            await dynamo.call("put_item", TableName=table, Item={"k": {"S": "a"}})
        control.put(cut=["worker-1"], cut_mode="reset")
        with pytest.raises(StoreUnavailable):
            await dynamo.call("get_item", TableName=table, Key={"k": {"S": "a"}})
        control.put()
        await dynamo.call("put_item", TableName=table, Item={"k": {"S": "a"}})
    assert seen == [("get_item", "throttled"), ("transact_write_items", "throttled"),
                    ("put_item", "unavailable"), ("get_item", "unavailable"),
                    ("put_item", "ok")]


def test_a_stalled_cut_holds_only_the_cut_key_until_lifted(
        control: Control, fault_server: str) -> None:
    cut, other = client(fault_server, "worker-a"), client(fault_server, "worker-b")
    impatient = client(fault_server, "worker-a", read_timeout=1.0)
    table = make_table(other)
    control.put(cut=["worker-a"])
    started = time.monotonic()
    with pytest.raises(ReadTimeoutError):  # never answered: the client gives up
        impatient.get_item(TableName=table, Key={"k": {"S": "x"}})
    assert time.monotonic() - started >= 1.0
    put(other, table, "from-b")  # another key goes on meanwhile
    stalled = control.counter("stalled")
    with ThreadPoolExecutor(1) as pool:
        held: Future[Any] = pool.submit(cut.get_item, TableName=table,
                                        Key={"k": {"S": "from-b"}}, ConsistentRead=True)
        wait_for(lambda: control.counter("stalled") > stalled, "the request to stall")
        put(other, table, "again-b")
        assert other.get_item(TableName=table, Key={"k": {"S": "again-b"}})["Item"]
        assert not held.done(), "a cut key's request was answered during the cut"
        control.put()
        assert held.result(timeout=10)["Item"]["k"] == {"S": "from-b"}
    put(cut, table, "from-a")


def test_a_reset_cut_closes_the_cut_keys_connections_at_once(
        control: Control, fault_server: str) -> None:
    cut, other = client(fault_server, "worker-a"), client(fault_server, "worker-b")
    table = make_table(other)
    reset = control.counter("reset")
    control.put(cut=["worker-a"], cut_mode="reset")
    started = time.monotonic()
    with pytest.raises(ConnectionClosedError):
        cut.get_item(TableName=table, Key={"k": {"S": "x"}})
    assert time.monotonic() - started < 10  # closed, not timed out (read timeout 20 s)
    put(other, table, "from-b")
    assert control.counter("reset") == reset + 1
    control.put()
    put(cut, table, "from-a")
    assert control.counter("reset") == reset + 1


def test_streams_unavailable_fails_streams_calls_only(
        control: Control, fault_server: str) -> None:
    db, streams = client(fault_server), client(fault_server, service="dynamodbstreams")
    table = make_table(db, stream=True)
    control.put(streams_unavailable=True)
    assert code_of(lambda: streams.list_streams(TableName=table)) == ("InternalServerError",
                                                                      500)
    put(db, table, "a")
    control.put()
    assert len(streams.list_streams(TableName=table)["Streams"]) == 1


def stream_iterator(streams: Any, table: str, kind: str = "TRIM_HORIZON") -> str:
    arn = streams.list_streams(TableName=table)["Streams"][0]["StreamArn"]
    shard = streams.describe_stream(StreamArn=arn)["StreamDescription"]["Shards"][0]
    return str(streams.get_shard_iterator(StreamArn=arn, ShardId=shard["ShardId"],
                                          ShardIteratorType=kind)["ShardIterator"])


def test_streams_trimmed_refuses_reads_and_drops_the_retained_records(
        control: Control, fault_server: str) -> None:
    db, streams = client(fault_server), client(fault_server, service="dynamodbstreams")
    table = make_table(db, stream=True)
    for k in ("a", "b", "c"):
        put(db, table, k)
    behind = stream_iterator(streams, table)
    caught_up = streams.get_records(ShardIterator=stream_iterator(streams, table))
    assert len(caught_up["Records"]) == 3
    dropped = control.counter("stream_records_dropped")
    control.put(streams_trimmed=True)
    assert code_of(lambda: streams.get_records(ShardIterator=behind)) == \
        ("TrimmedDataAccessException", 400)
    control.put()
    # The records retained when the fault was set are gone: a reader behind them finds
    # its iterator below the trim horizon, a reader at the end reads on.
    assert code_of(lambda: streams.get_records(ShardIterator=behind)) == \
        ("TrimmedDataAccessException", 400)
    assert control.counter("stream_records_dropped") >= dropped + 3
    assert streams.get_records(ShardIterator=caught_up["NextShardIterator"])["Records"] == []
    assert streams.get_records(ShardIterator=stream_iterator(streams, table))["Records"] == []
    put(db, table, "d")
    records = streams.get_records(ShardIterator=stream_iterator(streams, table))["Records"]
    assert [r["dynamodb"]["Keys"]["k"]["S"] for r in records] == ["d"]


def test_a_write_outage_refuses_writes_to_the_named_table_only(
        control: Control, fault_server: str) -> None:
    db = client(fault_server)
    down, up = make_table(db), make_table(db)
    put(db, down, "before")
    refused = control.counter("write_outage")
    control.put(write_outage=[down])
    key = {"k": {"S": "before"}}
    writes: list[Callable[[], Any]] = [
        lambda: put(db, down, "x"),
        lambda: db.update_item(TableName=down, Key=key, UpdateExpression="SET n = :n",
                               ExpressionAttributeValues={":n": {"N": "1"}}),
        lambda: db.delete_item(TableName=down, Key=key),
        lambda: db.batch_write_item(RequestItems={
            down: [{"PutRequest": {"Item": {"k": {"S": "y"}}}}]}),
        lambda: db.transact_write_items(TransactItems=[
            {"Put": {"TableName": up, "Item": {"k": {"S": "z"}}}},
            {"Put": {"TableName": down, "Item": {"k": {"S": "z"}}}}]),
    ]
    for write in writes:
        assert code_of(write) == ("InternalServerError", 500)
    put(db, up, "fine")  # another table's writes go on
    assert db.get_item(TableName=down, Key=key, ConsistentRead=True)["Item"] == \
        {"k": {"S": "before"}, "owner": {"S": "nobody"}}  # reads go on, nothing written
    assert db.scan(TableName=up)["Count"] == 1  # the refused transaction wrote nothing
    assert control.counter("write_outage") == refused + len(writes)
    control.put()
    put(db, down, "x")


def owners(db: Any, table: str, owner: str) -> list[str]:
    answer = db.query(TableName=table, IndexName=INDEX, KeyConditionExpression="#o = :o",
                      ExpressionAttributeNames={"#o": "owner"},
                      ExpressionAttributeValues={":o": {"S": owner}})
    return [item["k"]["S"] for item in answer["Items"]]


def test_index_lag_set_live_hides_a_new_item_for_about_the_lag(
        control: Control, fault_server: str) -> None:
    db = client(fault_server)
    table = make_table(db)
    put(db, table, "before", "o1")
    assert owners(db, table, "o1") == ["before"]  # no lag yet: the index is current
    lagged = control.counter("lagged_reads")
    control.put(index_lag_ms=2000)
    written = time.monotonic()
    put(db, table, "during", "o2")
    assert owners(db, table, "o2") == []
    assert time.monotonic() - written < 2.0, "too slow to observe the lag"
    took = wait_for(lambda: owners(db, table, "o2") == ["during"], "the index to catch up")
    assert time.monotonic() - written >= 2.0 - 0.05, took
    assert control.counter("lagged_reads") > lagged
    control.put()
    put(db, table, "after", "o3")
    assert owners(db, table, "o3") == ["after"]


def test_without_faults_the_path_is_no_control(dynamodb_endpoint: str) -> None:
    plain = Control(dynamodb_endpoint)
    status, body = plain.call("GET")
    assert status != 200 or b"counters" not in body
    plain.call("PUT", json.dumps({"throttle": 1}).encode())
    client(dynamodb_endpoint).list_tables()  # nothing throttled


def test_zero_lags_keep_no_history_until_a_lag_is_set() -> None:
    """With a control, the consistency machinery is in place from the start but records
    nothing while every lag is 0 (``RequestContextApp`` checks ``consistency.enabled``)."""
    with EmbeddedDynamoDB(ServerOptions(faults=True)) as server:
        control, db = Control(server.endpoint_url), client(server.endpoint_url)
        table = make_table(db)
        put(db, table, "a")
        assert server.replica_lag._histories == {}
        control.put(index_lag_ms=500)
        put(db, table, "b")
        assert server.replica_lag._histories != {}
        assert server.replica_lag.consistency.window_s == 0.5
        control.put()
        put(db, table, "c")
        assert server.replica_lag._histories == {}
        assert not server.replica_lag.consistency.enabled
