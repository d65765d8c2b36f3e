"""The DynamoDB store and fenced sink against ``streamlease dev dynamodb`` over HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import aioboto3
import pytest

from worker.core.frames import Frame
from worker.core.lease import LeaseTimings, RenewOutcome
from worker.core.model import Tenure
from worker.core.plan import invisible_to_index
from worker.errors import SinkConflict, StaleFence
from worker.store import codec
from worker.store.dynamodb import DynamoStore, SinkOutcome

T = LeaseTimings(lease_s=20.0, heartbeat_s=5.0, skew_margin_s=1.0, safety_margin_s=2.0)
NOW = 1_700_000_000_000
URL = "wss://feeds.example.com/a"


def frames(first: int, last: int, pad: str = "") -> list[Frame]:
    return [Frame(i, f'{{"seq":{i},"p":"{pad}"}}') for i in range(first, last + 1)]


async def raw_client() -> Any:
    return aioboto3.Session().client("dynamodb")


async def exported(store: DynamoStore, sid: str) -> list[int]:
    return [f.seq async for f in store.read_events(sid)]


async def test_table_create_is_idempotent_and_matches_the_contract(store: DynamoStore) -> None:
    assert await store.create_tables() == []  # second run: nothing new
    async with await raw_client() as client:
        desc = (await client.describe_table(TableName=store.table))["Table"]
    assert desc["KeySchema"] == [{"AttributeName": "Pk", "KeyType": "HASH"}]
    assert desc["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    (index,) = desc["GlobalSecondaryIndexes"]
    assert index["IndexName"] == "desired_state-lease_expires_at_ms-index"
    assert index["KeySchema"] == [
        {"AttributeName": "desired_state", "KeyType": "HASH"},
        {"AttributeName": "lease_expires_at_ms", "KeyType": "RANGE"},
    ]
    types = {a["AttributeName"]: a["AttributeType"] for a in desc["AttributeDefinitions"]}
    assert types == {"Pk": "S", "desired_state": "S", "lease_expires_at_ms": "N"}


async def test_acquire_returns_a_new_fence_and_the_item(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    got = await store.acquire("a", "w1", NOW, T)
    assert got is not None
    assert (got.tenure.fence, got.tenure.owner, got.tenure.expires_at_ms) == (1, "w1", NOW + 20_000)
    assert got.record.ws_url == URL and got.record.started
    assert await store.acquire("a", "w2", NOW + 1000, T) is None  # live lease


async def test_fences_strictly_increase_across_takeovers(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    fences = []
    now = NOW
    for i in range(5):
        got = await store.acquire("a", f"w{i % 2}", now, T)
        assert got is not None
        fences.append(got.tenure.fence)
        now += 20_000 + 1_001  # past expiry and the skew margin
    assert fences == [1, 2, 3, 4, 5]
    assert await store.acquire("a", "w9", now - 1_001, T) is None  # inside the skew margin


async def test_renew_returns_the_item_and_only_the_holder_can_renew(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    got = await store.acquire("a", "w1", NOW, T)
    assert got is not None
    tenure = got.tenure
    result = await store.renew(tenure, NOW + 5000, T)
    assert result.outcome is RenewOutcome.RENEWED
    assert result.record is not None and result.record.ws_url == URL
    assert result.record.lease_expires_at_ms == NOW + 25_000
    before = await store.get("a")
    other_owner = Tenure("a", "w2", tenure.fence, None, 0)
    old_fence = Tenure("a", "w1", tenure.fence - 1, None, 0)
    for bad in (other_owner, old_fence):
        assert (await store.renew(bad, NOW + 6000, T)).outcome is RenewOutcome.LOST
        assert await store.release(bad) is False
    assert await store.get("a") == before


async def test_renew_carries_desired_state_changes(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    got = await store.acquire("a", "w1", NOW, T)
    assert got is not None
    await store.set_state("a", "STOPPED")
    result = await store.renew(got.tenure, NOW + 1, T)
    assert result.record is not None and result.record.stopped


async def test_release_frees_now_and_keeps_owner_and_fence(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    got = await store.acquire("a", "w1", NOW, T)
    assert got is not None
    assert await store.release(got.tenure) is True
    record = await store.get("a")
    assert record is not None
    assert (record.lease_expires_at_ms, record.lease_owner, record.fence) == (0, "w1", 1)
    # A late renew never resurrects a released lease.
    assert (await store.renew(got.tenure, NOW + 1, T)).outcome is RenewOutcome.LOST
    again = await store.acquire("a", "w2", NOW + 1, T)  # free at once, no waiting for expiry
    assert again is not None and again.tenure.fence == 2


async def test_force_release_fences_out_the_holder(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    got = await store.acquire("a", "w1", NOW, T)
    assert got is not None
    refused = await store.force_release("a", expect_owner="w2")
    assert not refused.changed and refused.record is not None and refused.record.fence == 1
    refused = await store.force_release("a", expect_fence=7)
    assert not refused.changed
    done = await store.force_release("a", expect_owner="w1", expect_fence=1)
    assert done.changed and done.record is not None
    assert (done.record.fence, done.record.lease_expires_at_ms) == (2, 0)
    assert (await store.renew(got.tenure, NOW + 1, T)).outcome is RenewOutcome.LOST
    with pytest.raises(StaleFence):
        await store.write_batch(got.tenure, 0, frames(1, 3), NOW)
    assert await exported(store, "a") == []
    missing = await store.force_release("nope")
    assert not missing.changed and missing.record is None


async def test_acquire_never_resurrects_a_deleted_item(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    async with await raw_client() as client:
        await client.delete_item(TableName=store.table, Key=codec.key("a"))
    assert await store.acquire("a", "w1", NOW, T) is None
    assert await store.get("a") is None
    assert await store.set_state("a", "STARTED") is None
    assert await store.get("a") is None


async def test_acquire_refuses_stopped_and_unknown_states(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    await store.set_state("a", "STOPPED")
    assert await store.acquire("a", "w1", NOW, T) is None
    await store.set_state("a", "PAUSED")
    assert await store.acquire("a", "w1", NOW, T) is None


async def test_orphan_query_paginates_and_filters(store: DynamoStore) -> None:
    for i in range(30):
        await store.put_started(f"s{i:02d}", URL)
    live = await store.acquire("s00", "w1", NOW, T)
    assert live is not None
    await store.set_state("s01", "STOPPED")
    found = await store.orphans(NOW, limit=1000, page_size=7)
    ids = sorted(r.stream_id for r in found)
    assert ids == [f"s{i:02d}" for i in range(2, 30)]
    assert len(await store.orphans(NOW, limit=5, page_size=2)) == 5


async def test_sweep_finds_hand_written_and_bad_items(store: DynamoStore) -> None:
    async with await raw_client() as client:
        for i in range(12):
            await client.put_item(TableName=store.table, Item={
                "Pk": {"S": f"CONN#hand{i}"}, "desired_state": {"S": "STARTED"},
                "ws_url": {"S": URL}})
        await client.put_item(TableName=store.table, Item={
            "Pk": {"S": "CONN#weird"}, "desired_state": {"S": "RUNNING"},
            "lease_expires_at_ms": {"N": "0"}})
        await client.put_item(TableName=store.table, Item={"Pk": {"S": "OTHER#x"}})
    await store.put_started("normal", URL)
    everything = await store.list_streams(page_size=3)  # the sweep's paginated Scan
    assert len(everything) == 14  # the OTHER#x item is not a stream
    found = [r for r in everything if invisible_to_index(r)]
    assert sorted(r.stream_id for r in found) == sorted([f"hand{i}" for i in range(12)] + ["weird"])
    assert await store.orphans(NOW, 100) == [await store.get("normal")]
    assert await store.adopt("hand0") is True
    assert await store.adopt("hand0") is False
    assert "hand0" in {r.stream_id for r in await store.orphans(NOW, 100)}
    got = await store.acquire("hand1", "w1", NOW, T)  # acquirable without adoption too
    assert got is not None and got.tenure.fence == 1


async def test_sink_commits_in_order_and_moves_the_checkpoint(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    got = await store.acquire("a", "w1", NOW, T)
    assert got is not None
    t = got.tenure
    assert await store.write_batch(t, 0, frames(1, 10), NOW) is SinkOutcome.COMMITTED
    assert await store.write_batch(t, 10, frames(11, 12), NOW) is SinkOutcome.COMMITTED
    record = await store.get("a")
    assert record is not None and record.last_seq == 12
    assert await exported(store, "a") == list(range(1, 13))
    texts = [f.text async for f in store.read_events("a")]
    assert texts[0] == '{"seq":1,"p":""}'


async def test_a_resent_batch_cannot_duplicate(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    got = await store.acquire("a", "w1", NOW, T)
    assert got is not None
    assert await store.write_batch(got.tenure, 0, frames(1, 5), NOW) is SinkOutcome.COMMITTED
    again = await store.write_batch(got.tenure, 0, frames(1, 5), NOW + 7)
    assert again is SinkOutcome.ALREADY_COMMITTED
    assert await exported(store, "a") == [1, 2, 3, 4, 5]


async def test_stale_fence_rejects_the_whole_batch(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    old = await store.acquire("a", "w1", NOW, T)
    assert old is not None
    await store.write_batch(old.tenure, 0, frames(1, 3), NOW)
    new = await store.acquire("a", "w2", NOW + 30_000, T)
    assert new is not None and new.tenure.fence == 2 and new.tenure.last_seq == 3
    big = frames(4, 200, pad="x" * 3000)  # several events items in one transaction
    assert len(codec.chunk_frames(big)) > 1
    with pytest.raises(StaleFence):
        await store.write_batch(old.tenure, 3, big, NOW + 30_001)
    assert await exported(store, "a") == [1, 2, 3]
    record = await store.get("a")
    assert record is not None and record.last_seq == 3
    assert await store.write_batch(new.tenure, 3, big, NOW + 30_002) is SinkOutcome.COMMITTED
    assert await exported(store, "a") == list(range(1, 201))


async def test_last_seq_never_moves_backwards(store: DynamoStore) -> None:
    await store.put_started("a", URL)
    got = await store.acquire("a", "w1", NOW, T)
    assert got is not None
    await store.write_batch(got.tenure, 0, frames(1, 10), NOW)
    with pytest.raises(SinkConflict):
        await store.write_batch(got.tenure, 5, frames(6, 12), NOW)
    record = await store.get("a")
    assert record is not None and record.last_seq == 10
    assert await exported(store, "a") == list(range(1, 11))


async def test_fifty_concurrent_acquirers_one_winner_twenty_rounds(store: DynamoStore) -> None:
    for round_no in range(20):
        sid = f"race{round_no}"
        await store.put_started(sid, URL)
        results = await asyncio.gather(*(store.acquire(sid, f"w{i}", NOW, T) for i in range(50)))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1, f"round {round_no}: {len(winners)} winners"
        record = await store.get(sid)
        assert record is not None and record.fence == 1
        assert record.lease_owner == winners[0].tenure.owner


def test_decode_reports_wrongly_typed_fields() -> None:
    from worker.core.plan import item_problem

    record = codec.decode_record({
        "Pk": {"S": "CONN#x"}, "desired_state": {"S": "STARTED"}, "ws_url": {"N": "5"},
        "fence": {"S": "seven"}, "last_seq": {"N": "1.5"}, "lease_expires_at_ms": {"N": "0"},
    })
    assert record is not None
    assert record.bad_fields == ("ws_url is not a string", "fence is not a whole number",
                                 "last_seq is not a whole number")
    problem = item_problem(record, ("wss://",))
    assert problem is not None and problem.startswith("wrong attribute type: ws_url")
    fine = codec.decode_record({"Pk": {"S": "CONN#y"}, "desired_state": {"S": "STOPPED"}})
    assert fine is not None and fine.bad_fields == () and item_problem(fine, ("wss://",)) is None
