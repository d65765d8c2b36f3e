"""The embedded DynamoDB keeps DynamoDB's promises that plain moto breaks.

If a moto upgrade changes its internals, these tests say so: atomic conditional writes
under concurrency (the race is real without the lock, absent with it), and sink
transactions whose cost does not grow with the events table.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator

import pytest

from streamlease.core.frames import Frame
from streamlease.core.lease import LeaseTimings
from streamlease.dev import local_aws_env
from streamlease.dev.dynamodb import EmbeddedDynamoDB
from streamlease.store import codec, dynamodb
from streamlease.store.protocols import Stores
from tests.procs import Proc, python

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
                                control_connections=60) as stores:
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
    assert [r.stream_id for r in await dynamo.leases.orphans(NOW, 10)] == ["good"]


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
    with EmbeddedDynamoDB(latency_s=0.05) as server:
        elapsed = await timed_list_tables(server.endpoint_url, 20, concurrent=False)
    assert elapsed >= 20 * 0.05


async def test_serial_latency_saturates_and_parallel_latency_overlaps(env_for: None) -> None:
    """Ten requests at once: serial mode serves them one after another (at least ten
    delays), parallel mode lets the delays overlap. Compared as a ratio of two runs on
    the same machine, so its speed cancels out; measured about 0.15."""
    with EmbeddedDynamoDB(latency_s=0.1, latency_mode="serial") as server:
        serial = await timed_list_tables(server.endpoint_url, 10, concurrent=True)
    with EmbeddedDynamoDB(latency_s=0.1, latency_mode="parallel") as server:
        parallel = await timed_list_tables(server.endpoint_url, 10, concurrent=True)
    print(f"10 concurrent requests, 100 ms each: serial {serial:.2f} s, "
          f"parallel {parallel:.2f} s")
    assert serial >= 10 * 0.1
    assert parallel / serial < 0.5


def test_latency_options_are_checked() -> None:
    from streamlease.dev.dynamodb import main

    with pytest.raises(ValueError, match="latency_mode"):
        EmbeddedDynamoDB(latency_mode="sometimes")
    with pytest.raises(SystemExit) as exited:
        main(["--port", "0", "--latency-ms", "-1"])
    assert exited.value.code == 2
