"""The embedded DynamoDB keeps DynamoDB's promises that plain moto breaks.

If a moto upgrade changes its internals, these tests say so: atomic conditional writes
under concurrency (the race is real without the lock, absent with it), and sink
transactions whose cost does not grow with the events table.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from streamlease.core.frames import Frame
from streamlease.core.lease import LeaseTimings
from streamlease.dev import local_aws_env
from streamlease.dev.dynamodb import EmbeddedDynamoDB, ServerOptions
from streamlease.store import codec, dynamodb
from streamlease.store.protocols import Stores
from tests.fleet.harness import dynamodb_server
from tests.procs import Proc, python
from tests.store.lag import eventually

T = LeaseTimings(20.0, 5.0, 1.0, 2.0)
NOW = 1_700_000_000_000


@pytest.fixture
def env_for() -> AsyncIterator[None]:
    saved = dict(os.environ)
    yield None  # type: ignore[misc]
    os.environ.clear()
    os.environ.update(saved)


async def rounds_with_several_winners(endpoint: str, rounds: int, stop_at_first: bool) -> int:
    os.environ.update(local_aws_env(endpoint))
    bad = 0
    async with dynamodb.connect("race-streams", "race-events", "race-fleet",
                                dynamodb.ConnectOptions(control_connections=60)) as stores:
        await stores.admin.create_tables()
        for r in range(rounds):
            sid = f"r{r}"
            await stores.admin.put_started(sid, "wss://x/")
            got = await asyncio.gather(
                *(stores.leases.acquire(sid, f"w{i}", NOW, T) for i in range(50)))
            if sum(g is not None for g in got) > 1:
                bad += 1
                if stop_at_first:
                    return bad
    return bad


def start_server(*extra: str) -> Proc:
    return Proc(python("-m", "streamlease", "dev", "dynamodb", "--port", "0",
                       "--switch-interval", "0.00001", *extra), name="dynamodb-race")


async def test_atomic_under_concurrency_with_a_tiny_switch_interval(env_for: None) -> None:
    server = start_server()
    try:
        assert await rounds_with_several_winners(server.url(), 30, stop_at_first=False) == 0
    finally:
        server.stop()


async def test_plain_moto_really_races(env_for: None) -> None:
    """The control: the same check without the lock finds double winners, so the test
    above can fail. Stops at the first double winner (measured: about half the rounds)."""
    server = start_server("--no-lock")
    try:
        assert await rounds_with_several_winners(server.url(), 60, stop_at_first=True) >= 1
    finally:
        server.stop()


async def test_two_processes_racing_for_the_same_streams(dynamo: Stores) -> None:
    store = dynamo.admin
    assert isinstance(store, dynamodb.DynamoAdmin)
    ids = [f"p{i}" for i in range(40)]
    for sid in ids:
        await store.put_started(sid, "wss://x/")
    start_at = time.time() + 3.0
    racers = [Proc(python("-m", "tests.store.racer", store.table, store.events_table,
                          store.fleet_table, owner,
                          str(start_at), *ids), name=owner) for owner in ("proc-a", "proc-b")]
    won: list[list[str]] = []
    for racer in racers:
        won.append(json.loads(racer.wait_for_line("[", timeout=60)))
        assert racer.wait() == 0
    assert sorted(won[0] + won[1]) == sorted(ids), "every stream won exactly once"
    for sid in ids:
        record = await store.get(sid)
        assert record is not None and record.fence == 1
        assert sid in won[0 if record.lease_owner == "proc-a" else 1]


async def sink_rate(stores: Stores, prefix: str, count: int) -> float:
    acquired = await stores.leases.acquire(prefix, "w1", NOW, T)
    assert acquired is not None
    tenure = acquired.tenure
    started = time.perf_counter()
    prev = 0
    for _ in range(count):
        batch = [Frame(s, f'{{"seq":{s}}}') for s in range(prev + 1, prev + 11)]
        await stores.sink.write_batch(tenure, prev, batch, NOW)
        prev = batch[-1].seq
    return count / (time.perf_counter() - started)


async def test_sink_transactions_stay_fast_as_the_events_table_grows(env_for: None) -> None:
    with EmbeddedDynamoDB() as server:
        os.environ.update(local_aws_env(server.endpoint_url))
        async with dynamodb.connect("perf-streams", "perf-events", "perf-fleet") as stores:
            await stores.admin.create_tables()
            await stores.admin.put_started("empty", "wss://x/")
            await stores.admin.put_started("full", "wss://x/")
            empty_rate = await sink_rate(stores, "empty", 150)
            backend = server.backend()
            for i in range(50_000):
                backend.put_item("perf-events", {
                    codec.EV_PK: {"S": f"CONN#old{i % 500}"}, codec.EV_SK: {"N": str(i)},
                    codec.EV_LAST: {"N": str(i)}, codec.EV_MSGS: {"L": [{"S": "{}"}]},
                })
            assert len(backend.get_table("perf-events")) >= 50_000
            full_rate = await sink_rate(stores, "full", 150)
    ratio = full_rate / empty_rate
    print(f"sink tx/s: empty {empty_rate:.0f}, 50k items {full_rate:.0f}, ratio {ratio:.2f}")
    # Plain moto copies the whole table per transaction: about 1/100 of the empty rate
    # at this size. A ratio, not a time: the machine's speed cancels out.
    assert ratio > 0.5


async def test_a_wrongly_typed_index_key_is_refused_as_dynamodb_does(dynamo: Stores) -> None:
    """moto alone stores it, and then every query of the index fails with HTTP 500."""
    import aioboto3
    from botocore.exceptions import ClientError

    store = dynamo.admin
    assert isinstance(store, dynamodb.DynamoAdmin)
    await store.put_started("good", "wss://x/")
    bad = {"Pk": {"S": "CONN#bad"}, "desired_state": {"S": "STARTED"},
           "ws_url": {"S": "wss://x/"}, "lease_expires_at_ms": {"S": "soon"}}
    async with aioboto3.Session().client("dynamodb") as client:
        with pytest.raises(ClientError, match="Type mismatch for Index Key lease_expires_at_ms"):
            await client.put_item(TableName=store.table, Item=bad)
        with pytest.raises(ClientError, match="Type mismatch"):
            await client.update_item(
                TableName=store.table, Key={"Pk": {"S": "CONN#good"}},
                UpdateExpression="SET lease_expires_at_ms = :s",
                ExpressionAttributeValues={":s": {"S": "later"}})
    record = await store.get("good")
    assert record is not None and record.lease_expires_at_ms == 0
    assert await store.get("bad") is None
    # The index still answers (no HTTP 500), once it has caught up with the good item.
    await eventually(dynamo, lambda: dynamo.leases.orphans(NOW, 10),
                     lambda found: [r.stream_id for r in found] == ["good"])


async def timed_list_tables(endpoint: str, calls: int, concurrent: bool) -> float:
    """Seconds for ``calls`` ListTables requests, one after another or all at once (each
    on a connection of its own, so the server serves them on separate threads)."""
    import aioboto3
    from botocore.config import Config

    os.environ.update(local_aws_env(endpoint))
    config = Config(max_pool_connections=calls + 2, retries={"max_attempts": 1})
    async with aioboto3.Session().client("dynamodb", endpoint_url=endpoint,
                                         region_name="us-east-1", config=config) as client:
        await client.list_tables()  # connect and warm up outside the measurement
        started = time.perf_counter()
        if concurrent:
            await asyncio.gather(*(client.list_tables() for _ in range(calls)))
        else:
            for _ in range(calls):
                await client.list_tables()
        return time.perf_counter() - started


async def test_injected_latency_delays_every_request(env_for: None) -> None:
    """Lower bounds only: a busy machine makes requests slower, never faster. Without
    the delay 20 calls take a few tens of milliseconds, so the bound can fail."""
    with EmbeddedDynamoDB(ServerOptions(latency_s=0.05)) as server:
        elapsed = await timed_list_tables(server.endpoint_url, 20, concurrent=False)
    assert elapsed >= 20 * 0.05


async def test_serial_latency_saturates_and_parallel_latency_overlaps(env_for: None) -> None:
    """Six requests at once: serial mode serves them one after another (at least six
    delays), parallel mode lets the delays overlap. The delay (half a second) dwarfs a
    request's own cost, so the two modes stay far apart on a loaded machine too: parallel
    measured about 0.6 s against serial's 3 s; three delays is the bound."""
    with EmbeddedDynamoDB(ServerOptions(latency_s=0.5, latency_mode="serial")) as server:
        serial = await timed_list_tables(server.endpoint_url, 6, concurrent=True)
    with EmbeddedDynamoDB(ServerOptions(latency_s=0.5, latency_mode="parallel")) as server:
        parallel = await timed_list_tables(server.endpoint_url, 6, concurrent=True)
    print(f"6 concurrent requests, 500 ms each: serial {serial:.2f} s, "
          f"parallel {parallel:.2f} s")
    assert serial >= 6 * 0.5
    assert parallel < 3 * 0.5


def test_latency_options_are_checked() -> None:
    from streamlease.dev.dynamodb import main

    with pytest.raises(ValueError, match="latency_mode"):
        EmbeddedDynamoDB(ServerOptions(latency_mode="sometimes"))
    with pytest.raises(SystemExit) as exited:
        main(["--port", "0", "--latency-ms", "-1"])
    assert exited.value.code == 2


# -- Eventual consistency: index lag, projections, stale reads ------------------------------

class StepClock:
    """The server's monotonic clock, stepped by the test."""

    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


def streams_item(sid: str, **attrs: str | int) -> dict[str, Any]:
    item: dict[str, Any] = {"Pk": {"S": f"CONN#{sid}"}, "desired_state": {"S": "STARTED"},
                            "lease_expires_at_ms": {"N": "0"}, "ws_url": {"S": "wss://x/"}}
    for name, value in attrs.items():
        item[name] = {"N": str(value)} if isinstance(value, int) else {"S": value}
    return item


@contextlib.asynccontextmanager
async def lagged(**settings: Any) -> AsyncIterator[tuple[Any, str, StepClock]]:
    """An in-process server with the given lag settings and a stepped clock; yields a
    raw client, a fresh streams table (the schema's indexes) and the clock."""
    import aioboto3

    from streamlease.store import schema

    clock = StepClock()
    with EmbeddedDynamoDB(ServerOptions(**settings), clock=clock, rng=random.Random(7)) as server:
        async with aioboto3.Session().client(
                "dynamodb", endpoint_url=server.endpoint_url, region_name="us-east-1",
                aws_access_key_id="local", aws_secret_access_key="local") as client:
            table = f"lag-{uuid.uuid4().hex[:8]}"
            await client.create_table(**schema.streams_table(table))
            yield client, table, clock


async def orphan_rows(client: Any, table: str, **extra: Any) -> list[dict[str, Any]]:
    resp = await client.query(
        TableName=table, IndexName=codec.INDEX_NAME,
        KeyConditionExpression="desired_state = :s AND lease_expires_at_ms < :t",
        ExpressionAttributeValues={":s": {"S": "STARTED"}, ":t": {"N": str(NOW)}}, **extra)
    rows: list[dict[str, Any]] = resp.get("Items", [])
    return rows


async def owner_rows(client: Any, table: str, owner: str) -> list[dict[str, Any]]:
    resp = await client.query(
        TableName=table, IndexName=codec.OWNER_INDEX_NAME,
        KeyConditionExpression="lease_owner = :o", ExpressionAttributeValues={":o": {"S": owner}})
    rows: list[dict[str, Any]] = resp["Items"]
    return rows


def pks(rows: list[dict[str, Any]]) -> list[str]:
    return [row["Pk"]["S"] for row in rows]


async def test_an_index_read_sees_the_table_as_it_was_a_lag_ago() -> None:
    async with lagged(index_lag_s=1.0) as (client, table, clock):
        await client.put_item(TableName=table, Item=streams_item("a"))
        assert await orphan_rows(client, table) == []  # written after the index's moment
        clock.now += 1.0001
        (row,) = await orphan_rows(client, table)
        assert row["ws_url"] == {"S": "wss://x/"}
        await client.update_item(TableName=table, Key={"Pk": {"S": "CONN#a"}},
                                 UpdateExpression="SET ws_url = :u, lease_owner = :o, fence = :f",
                                 ExpressionAttributeValues={":u": {"S": "wss://y/"},
                                                            ":o": {"S": "w1"}, ":f": {"N": "1"}})
        clock.now += 0.5
        (row,) = await orphan_rows(client, table)
        assert row["ws_url"] == {"S": "wss://x/"}, "the old version, half a lag later"
        assert await owner_rows(client, table, "w1") == []
        scanned = await client.scan(TableName=table, IndexName=codec.OWNER_INDEX_NAME)
        assert scanned["Items"] == []  # a Scan of an index lags too
        # The table itself (a consistent read) is current.
        got = await client.get_item(TableName=table, Key={"Pk": {"S": "CONN#a"}},
                                    ConsistentRead=True)
        assert got["Item"]["ws_url"] == {"S": "wss://y/"}
        clock.now += 0.5001
        (row,) = await orphan_rows(client, table)
        assert row["ws_url"] == {"S": "wss://y/"}
        assert pks(await owner_rows(client, table, "w1")) == ["CONN#a"]
        await client.delete_item(TableName=table, Key={"Pk": {"S": "CONN#a"}})
        assert pks(await orphan_rows(client, table)) == ["CONN#a"]  # deleted, still indexed
        clock.now += 1.0001
        assert await orphan_rows(client, table) == []


async def test_each_index_read_draws_its_lag_between_the_fixed_part_and_the_jitter() -> None:
    async with lagged(index_lag_s=0.1, index_lag_jitter_s=0.2) as (client, table, clock):
        await client.put_item(TableName=table, Item=streams_item("a"))
        written = clock.now

        async def seen(after: float, reads: int) -> set[bool]:
            clock.now = written + after
            return {bool(await orphan_rows(client, table)) for _ in range(reads)}

        assert await seen(0.099, 20) == {False}  # never before the fixed part
        assert await seen(0.2, 40) == {False, True}  # sometimes, inside the jitter
        assert await seen(0.3001, 20) == {True}  # always after fixed + jitter


async def test_index_reads_return_only_what_the_index_projects() -> None:
    """KEYS_ONLY: the table's and the index's keys. INCLUDE: those plus the named
    attributes (never last_seq, so a checkpoint does not write the orphan index). Checked
    on a current read and on a lagged one (served from a view of the past)."""
    full = streams_item("a", lease_owner="w1", fence=3, lease_epoch=2, last_seq=17,
                        last_error="boom", last_error_at_ms=5, extra="x")
    orphan_attrs = {"Pk", "desired_state", "lease_expires_at_ms", *codec.INDEX_PROJECTED}
    for lag in (0.0, 1.0):
        async with lagged(index_lag_s=lag) as (client, table, clock):
            await client.put_item(TableName=table, Item=full)
            clock.now += 2.0
            # Moves the item's index entries, so the read below is served from the past.
            await client.update_item(TableName=table, Key={"Pk": {"S": "CONN#a"}},
                                     UpdateExpression="SET last_seq = :n",
                                     ExpressionAttributeValues={":n": {"N": "18"}})
            (row,) = await owner_rows(client, table, "w1")
            assert set(row) == {"Pk", "lease_owner", "fence"}
            (row,) = await orphan_rows(client, table)
            assert set(row) == orphan_attrs
            assert {k: full[k] for k in orphan_attrs} == row
            counted = await orphan_rows(client, table, Select="COUNT")
            assert counted == []  # COUNT answers without items
            resp = await client.query(
                TableName=table, IndexName=codec.INDEX_NAME, Select="COUNT",
                KeyConditionExpression="desired_state = :s",
                ExpressionAttributeValues={":s": {"S": "STARTED"}})
            assert resp["Count"] == 1


async def test_pagination_filters_and_key_conditions_work_on_a_lagged_read() -> None:
    async with lagged(index_lag_s=1.0) as (client, table, clock):
        for i in range(30):
            await client.put_item(TableName=table,
                                  Item=streams_item(f"s{i:02d}", last_error=f"e{i % 3}"))
        clock.now += 1.5
        for i in range(0, 30, 3):  # ten of them leave the orphan range
            await client.update_item(TableName=table, Key={"Pk": {"S": f"CONN#s{i:02d}"}},
                                     UpdateExpression="SET lease_expires_at_ms = :e",
                                     ExpressionAttributeValues={":e": {"N": str(NOW + 1)}})

        async def paged(values: dict[str, Any] | None = None, **extra: Any) -> list[str]:
            found: list[str] = []
            kwargs: dict[str, Any] = {"Limit": 7, **extra}
            while True:
                resp = await client.query(
                    TableName=table, IndexName=codec.INDEX_NAME,
                    KeyConditionExpression="desired_state = :s AND lease_expires_at_ms < :t",
                    ExpressionAttributeValues={":s": {"S": "STARTED"}, ":t": {"N": str(NOW)},
                                               **(values or {})}, **kwargs)
                found += pks(resp["Items"])
                if "LastEvaluatedKey" not in resp:
                    return found
                kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

        everything = [f"CONN#s{i:02d}" for i in range(30)]
        assert sorted(await paged()) == everything
        assert len(set(await paged())) == 30  # no page repeats or skips an item
        filtered = await paged(FilterExpression="last_error = :e",
                               values={":e": {"S": "e0"}})
        assert sorted(filtered) == [f"CONN#s{i:02d}" for i in range(0, 30, 3)]
        clock.now += 1.0001
        assert sorted(await paged()) == [p for i, p in enumerate(everything) if i % 3]
        assert await paged(FilterExpression="last_error = :e", values={":e": {"S": "e0"}}) == []


async def test_conditional_writes_and_transactions_see_the_current_table() -> None:
    from botocore.exceptions import ClientError

    async with lagged(index_lag_s=1.0, stale_reads_s=1.0) as (client, table, clock):
        await client.put_item(TableName=table, Item=streams_item("a"))
        assert await orphan_rows(client, table) == []
        with pytest.raises(ClientError, match="ConditionalCheckFailed"):
            await client.put_item(TableName=table, Item=streams_item("a"),
                                  ConditionExpression="attribute_not_exists(Pk)")
        with pytest.raises(ClientError, match="TransactionCanceled"):
            await client.transact_write_items(TransactItems=[
                {"ConditionCheck": {"TableName": table, "Key": {"Pk": {"S": "CONN#a"}},
                                    "ConditionExpression": "attribute_not_exists(Pk)"}},
                {"Put": {"TableName": table, "Item": streams_item("b")}}])
        await client.transact_write_items(TransactItems=[
            {"ConditionCheck": {"TableName": table, "Key": {"Pk": {"S": "CONN#a"}},
                                "ConditionExpression": "attribute_exists(Pk)"}},
            {"Put": {"TableName": table, "Item": streams_item("b", fence=1)}}])
        got = await client.transact_get_items(TransactItems=[
            {"Get": {"TableName": table, "Key": {"Pk": {"S": "CONN#b"}}}}])
        assert got["Responses"][0]["Item"]["fence"] == {"N": "1"}  # always current
        assert await orphan_rows(client, table) == []
        clock.now += 1.0001
        assert pks(await orphan_rows(client, table)) == ["CONN#a", "CONN#b"]


async def test_stale_reads_only_where_consistent_read_is_not_asked_for() -> None:
    async with lagged(stale_reads_s=1.0) as (client, table, clock):
        key = {"Pk": {"S": "CONN#a"}}
        await client.put_item(TableName=table, Item=streams_item("a", fence=1))
        clock.now += 2.0
        await client.update_item(TableName=table, Key=key, UpdateExpression="SET fence = :f",
                                 ExpressionAttributeValues={":f": {"N": "2"}})

        async def fences(consistent: bool) -> set[str]:
            seen = set()
            for _ in range(5):
                got = await client.get_item(TableName=table, Key=key,
                                            ConsistentRead=consistent)
                seen.add(got["Item"]["fence"]["N"])
                batch = await client.batch_get_item(RequestItems={
                    table: {"Keys": [key], "ConsistentRead": consistent}})
                seen.add(batch["Responses"][table][0]["fence"]["N"])
                for op, extra in (("scan", {}), ("query", {
                        "KeyConditionExpression": "Pk = :k",
                        "ExpressionAttributeValues": {":k": key["Pk"]}})):
                    resp = await getattr(client, op)(TableName=table, ConsistentRead=consistent,
                                                     **extra)
                    seen.add(resp["Items"][0]["fence"]["N"])
            return seen

        assert await fences(consistent=True) == {"2"}
        assert await fences(consistent=False) == {"1"}  # up to a second old, and it is now
        clock.now += 1.0001
        assert await fences(consistent=False) == {"2"}
        # An index read is not a stale read: this server's indexes do not lag.
        (row,) = await orphan_rows(client, table)
        assert row["fence"] == {"N": "2"}


async def test_a_server_without_lag_answers_every_read_from_the_current_table() -> None:
    async with lagged() as (client, table, _):
        await client.put_item(TableName=table, Item=streams_item("a"))
        assert pks(await orphan_rows(client, table)) == ["CONN#a"]
        got = await client.get_item(TableName=table, Key={"Pk": {"S": "CONN#a"}})
        assert "Item" in got


async def test_the_cli_lags_index_reads_in_real_time(env_for: None) -> None:
    """The session's server lags 50-150 ms; this one a fixed second, so that a read sent
    right after a write is certainly inside the lag (checked, not assumed)."""
    server = dynamodb_server(name="dynamodb-lag", index_lag_ms=1000, index_lag_jitter_ms=0)
    try:
        os.environ.update(local_aws_env(server.url()))
        async with dynamodb.connect(f"cli-{uuid.uuid4().hex[:8]}", "cli-e", "cli-f") as stores:
            await stores.admin.create_tables()
            sent = time.monotonic()
            await stores.admin.put_started("a", "wss://x/")
            right_after = await stores.leases.orphans(NOW, 10)
            if time.monotonic() - sent < 1.0:  # else the machine stalled past the lag
                assert right_after == []
            deadline = time.monotonic() + 15
            while not await stores.leases.orphans(NOW, 10):
                assert time.monotonic() < deadline, "the index never caught up"
                await asyncio.sleep(0.05)
            record = await stores.leases.check("a")  # consistent: current all along
            assert record is not None and record.started
    finally:
        server.stop()


@pytest.mark.parametrize("option", ["--index-lag-ms", "--index-lag-jitter-ms",
                                    "--stale-reads-ms"])
@pytest.mark.parametrize("value", ["-1", "10001", "nan"])
def test_lag_options_are_checked(option: str, value: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    from streamlease.dev.dynamodb import main

    with pytest.raises(SystemExit) as exited:
        main(["--port", "0", option, value])
    assert exited.value.code == 2
    assert f"{option} must be 0-10000" in capsys.readouterr().err
    with pytest.raises(ValueError, match="stale_reads_s"):
        EmbeddedDynamoDB(ServerOptions(stale_reads_s=11.0))
    with pytest.raises(ValueError, match="index lag"):
        EmbeddedDynamoDB(ServerOptions(index_lag_s=-0.1))


async def test_the_instant_fixture_serves_a_current_index(instant_dynamo: Stores) -> None:
    """Uses the instant-index server on purpose: it checks that server (no lag options
    means no lag) and that its fixture points the stores at it."""
    await instant_dynamo.admin.put_started("a", "wss://x/")
    assert [r.stream_id for r in await instant_dynamo.leases.orphans(NOW, 10)] == ["a"]



async def test_memory_holds_the_current_tables_only() -> None:
    """moto keeps every model object it built; the server must not: neither the item
    versions writes replaced nor a deleted table (a long session writes and deletes many)."""
    import gc
    import weakref

    from moto.dynamodb.models import dynamodb_backends
    from moto.dynamodb.models.dynamo_type import Item

    from streamlease.store import schema

    async with lagged(index_lag_s=1.0) as (client, table, clock):
        for owner in ("w1", "w2", "w3"):
            await client.put_item(TableName=table, Item=streams_item("a", lease_owner=owner))
            clock.now += 2.0  # past the lag window: the old versions are not needed
        await client.put_item(TableName=table, Item=streams_item("b"))
        gc.collect()
        live = list(Item.instances_tracked)  # type: ignore[attr-defined]
        assert live == [], f"{len(live)} item versions kept by moto"
        backend = next(b for account in dynamodb_backends.values()
                       for b in account.values() if table in b.tables)
        ref = weakref.ref(backend.tables[table])
        await client.delete_table(TableName=table)
        gc.collect()
        assert ref() is None, f"the deleted table is still referenced: {gc.get_referrers(ref())}"
        await client.create_table(**schema.streams_table(table))
        assert await orphan_rows(client, table) == []  # a re-created table starts empty


async def test_every_attribute_type_reads_back_as_written() -> None:
    """Reads and item writes are answered in DynamoDB's JSON written directly (not by
    moto's generic writer): every type, nested, must come back exactly as it was put,
    through GetItem, Query, Scan, BatchGetItem, a lagged index read and the attributes a
    PutItem, UpdateItem or DeleteItem returns."""
    item = {**streams_item("t", lease_owner="w1", fence=3),
            "s": {"S": "ünïcode \\ \" quote"}, "n": {"N": "-12345678901234567890.125"},
            "b": {"B": b"\x00\xffbinary"}, "ss": {"SS": ["a", "b"]}, "ns": {"NS": ["1", "2.5"]},
            "bs": {"BS": [b"\x01", b"\x02"]}, "t": {"BOOL": True}, "f": {"BOOL": False},
            "z": {"NULL": True},
            "l": {"L": [{"S": "x"}, {"N": "1"}, {"M": {"k": {"B": b"\x03"}}}, {"L": []}]},
            "m": {"M": {"inner": {"M": {"deep": {"SS": ["q"]}}}, "e": {"M": {}}}}}
    key = {"Pk": item["Pk"]}

    def same(got: dict[str, Any]) -> None:
        normal = {k: ({t: sorted(v)} if t in ("SS", "NS", "BS") else {t: v})
                  for k, d in got.items() for t, v in d.items()}
        want = {k: ({t: sorted(v)} if t in ("SS", "NS", "BS") else {t: v})
                for k, d in item.items() for t, v in d.items()}
        assert normal == want

    async with lagged(index_lag_s=1.0) as (client, table, clock):
        await client.put_item(TableName=table, Item=item)
        same((await client.get_item(TableName=table, Key=key, ConsistentRead=True))["Item"])
        (queried,) = (await client.query(
            TableName=table, KeyConditionExpression="Pk = :p",
            ExpressionAttributeValues={":p": item["Pk"]}, ConsistentRead=True))["Items"]
        same(queried)
        same((await client.scan(TableName=table, ConsistentRead=True))["Items"][0])
        batch = await client.batch_get_item(RequestItems={table: {"Keys": [key]}})
        same(batch["Responses"][table][0])
        clock.now += 1.0001
        (indexed,) = await owner_rows(client, table, "w1")
        assert indexed["Pk"] == item["Pk"] and indexed["lease_owner"] == {"S": "w1"}
        # Item writes answer the same way when asked for the item (ReturnValues).
        same((await client.put_item(TableName=table, Item=item,
                                    ReturnValues="ALL_OLD"))["Attributes"])
        updated = await client.update_item(
            TableName=table, Key=key, UpdateExpression="SET fence = :f",
            ExpressionAttributeValues={":f": {"N": "4"}}, ReturnValues="ALL_OLD",
            ReturnConsumedCapacity="TOTAL")
        same(updated["Attributes"])
        assert updated["ConsumedCapacity"]["TableName"] == table
        item["fence"] = {"N": "4"}
        same((await client.update_item(
            TableName=table, Key=key, UpdateExpression="SET fence = :f",
            ExpressionAttributeValues={":f": {"N": "4"}}, ReturnValues="ALL_NEW"))["Attributes"])
        assert (await client.update_item(
            TableName=table, Key=key, UpdateExpression="SET fence = :f",
            ExpressionAttributeValues={":f": {"N": "5"}}, ReturnValues="UPDATED_NEW"))[
            "Attributes"] == {"fence": {"N": "5"}}
        item["fence"] = {"N": "5"}
        same((await client.delete_item(TableName=table, Key=key,
                                       ReturnValues="ALL_OLD"))["Attributes"])
        assert "Attributes" not in await client.put_item(TableName=table, Item=item)


def test_read_answers_carry_dynamodbs_content_type() -> None:
    """SDKs other than botocore check the answer's media type."""
    import urllib.request

    def call(endpoint: str, target: str, body: dict[str, Any]) -> tuple[str, bytes]:
        request = urllib.request.Request(endpoint, data=json.dumps(body).encode(), headers={
            "X-Amz-Target": f"DynamoDB_20120810.{target}",
            "Content-Type": "application/x-amz-json-1.0",
            "Authorization": "AWS4-HMAC-SHA256 Credential=local/20260101/us-east-1/dynamodb/"
                             "aws4_request, SignedHeaders=host, Signature=0"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.headers["Content-Type"], answer.read()

    with EmbeddedDynamoDB() as server:
        url = server.endpoint_url
        call(url, "CreateTable", {
            "TableName": "t", "BillingMode": "PAY_PER_REQUEST",
            "KeySchema": [{"AttributeName": "k", "KeyType": "HASH"}],
            "AttributeDefinitions": [{"AttributeName": "k", "AttributeType": "S"}]})
        call(url, "PutItem", {"TableName": "t", "Item": {"k": {"S": "a"}}})
        for target, body in (("GetItem", {"TableName": "t", "Key": {"k": {"S": "a"}}}),
                             ("Query", {"TableName": "t", "KeyConditionExpression": "k = :k",
                                        "ExpressionAttributeValues": {":k": {"S": "a"}}}),
                             ("Scan", {"TableName": "t"})):
            media, answer = call(url, target, body)
            assert media == "application/x-amz-json-1.0", (target, media)
            assert b'"k":{"S":"a"}' in answer, answer


# -- Index queries read only what their key condition matches --------------------------------

@contextlib.contextmanager
def moto_own_index_queries() -> Any:
    """moto's own Query, which sorts and sizes the whole table for an index read."""
    from moto.dynamodb.models.table import Table

    from streamlease.dev import dynamodb as embedded

    assert embedded._original_query is not None, "the server installs the keyed query"
    keyed, Table.query = Table.query, embedded._original_query  # type: ignore[method-assign]
    try:
        yield
    finally:
        Table.query = keyed  # type: ignore[method-assign]


INDEX_QUERIES: list[dict[str, Any]] = [
    {"IndexName": codec.INDEX_NAME,
     "KeyConditionExpression": "desired_state = :s AND lease_expires_at_ms < :t",
     "ExpressionAttributeValues": {":s": {"S": "STARTED"}, ":t": {"N": "500"}}},
    {"IndexName": codec.INDEX_NAME,
     "KeyConditionExpression": "desired_state = :s AND lease_expires_at_ms BETWEEN :a AND :b",
     "ExpressionAttributeValues": {":s": {"S": "STOPPED"}, ":a": {"N": "100"},
                                   ":b": {"N": "800"}}, "ScanIndexForward": False},
    {"IndexName": codec.INDEX_NAME,
     "KeyConditionExpression": "desired_state = :s AND lease_expires_at_ms >= :t",
     "ExpressionAttributeValues": {":s": {"S": "STARTED"}, ":t": {"N": "250.5"}},
     "FilterExpression": "attribute_exists(lease_owner)"},
    {"IndexName": codec.INDEX_NAME, "KeyConditionExpression": "desired_state = :s",
     "ExpressionAttributeValues": {":s": {"S": "STARTED"}}, "Select": "COUNT"},
    {"IndexName": codec.OWNER_INDEX_NAME, "KeyConditionExpression": "lease_owner = :o",
     "ExpressionAttributeValues": {":o": {"S": "w2"}}},
    {"IndexName": codec.OWNER_INDEX_NAME,
     "KeyConditionExpression": "lease_owner = :o AND fence > :f",
     "ExpressionAttributeValues": {":o": {"S": "w1"}, ":f": {"N": "3"}},
     "ScanIndexForward": False},
]


async def every_page(client: Any, table: str, query: dict[str, Any],
                     limit: int) -> list[Any]:
    pages: list[Any] = []
    start: dict[str, Any] | None = None
    while True:
        extra = {"ExclusiveStartKey": start} if start else {}
        page = await client.query(TableName=table, Limit=limit, **query, **extra)
        pages.append((page.get("Items"), page["Count"], page["ScannedCount"],
                      page.get("LastEvaluatedKey")))
        start = page.get("LastEvaluatedKey")
        if not start:
            return pages


async def test_an_index_query_answers_exactly_as_motos_whole_table_query() -> None:
    """An index Query reads only the items its key condition matches (moto's own sorts
    every item of the table first): every page, count and start key must be the same,
    including items missing an index key (not indexed) and repeated range values."""
    rng = random.Random(11)
    async with lagged() as (client, table, _clock):
        for i in range(240):
            item: dict[str, Any] = {"Pk": {"S": f"CONN#s{i:03}"}, "ws_url": {"S": "wss://x/"}}
            if rng.random() < 0.9:
                item["desired_state"] = {"S": rng.choice(["STARTED", "STARTED", "STOPPED"])}
            if rng.random() < 0.9:
                item["lease_expires_at_ms"] = {"N": str(rng.choice([0, rng.randrange(1000)]))}
            if rng.random() < 0.8:
                item["lease_owner"] = {"S": rng.choice(["w1", "w2", "w3"])}
                item["fence"] = {"N": str(rng.randrange(8))}
            await client.put_item(TableName=table, Item=item)
        for query in INDEX_QUERIES:
            for limit in (7, 1000):
                got = await every_page(client, table, query, limit)
                with moto_own_index_queries():
                    want = await every_page(client, table, query, limit)
                assert got == want, (query, limit)
                assert sum(count for _, count, _, _ in got) > 0, query  # not vacuous


BASE_QUERIES: list[dict[str, Any]] = [
    {"KeyConditionExpression": "Pk = :p", "ExpressionAttributeValues": {":p": {"S": "CONN#s1"}}},
    {"KeyConditionExpression": "Pk = :p", "ExpressionAttributeValues": {":p": {"S": "CONN#s2"}},
     "ScanIndexForward": False},
    {"KeyConditionExpression": "Pk = :p AND Sk > :k",
     "ExpressionAttributeValues": {":p": {"S": "CONN#s0"}, ":k": {"N": "40"}}},
    {"KeyConditionExpression": "Pk = :p AND Sk BETWEEN :a AND :b",
     "ExpressionAttributeValues": {":p": {"S": "CONN#s1"}, ":a": {"N": "10"},
                                   ":b": {"N": "70"}}, "ScanIndexForward": False},
    {"KeyConditionExpression": "Pk = :p", "FilterExpression": "fence > :f",
     "ProjectionExpression": "Pk, Sk, fence",
     "ExpressionAttributeValues": {":p": {"S": "CONN#s2"}, ":f": {"N": "1"}}},
    {"KeyConditionExpression": "Pk = :p", "ExpressionAttributeValues": {":p": {"S": "CONN#s1"}},
     "Select": "COUNT"},
]


async def test_a_table_query_answers_exactly_as_motos_whole_table_query() -> None:
    """A base-table Query reads only its partition (moto's own sorts every item of the
    table first, so a sink's resume read grew with the events table): every page, count
    and start key must be the same, newest first included, and a partition with no items
    answers empty."""
    from streamlease.store import schema

    rng = random.Random(5)
    async with lagged() as (client, _table, _clock):
        events = f"events-{uuid.uuid4().hex[:8]}"
        await client.create_table(**schema.events_table(events))
        for i in range(300):
            await client.put_item(TableName=events, Item={
                "Pk": {"S": f"CONN#s{rng.randrange(3)}"}, "Sk": {"N": str(i)},
                "fence": {"N": str(rng.randrange(4))}})
        for query in [*BASE_QUERIES, {**BASE_QUERIES[0], "ExpressionAttributeValues": {
                ":p": {"S": "CONN#none"}}}]:
            for limit in (7, 1000):
                got = await every_page(client, events, query, limit)
                with moto_own_index_queries():
                    want = await every_page(client, events, query, limit)
                assert got == want, (query, limit)
                counted = sum(count for _, count, _, _ in got)
                assert counted > 0 if query in BASE_QUERIES else counted == 0, query
