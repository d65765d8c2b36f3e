"""The store contract, run against both backends: DynamoDB (the embedded server over
HTTP) and the in-memory store. What one promises, the other must too."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import aioboto3
import pytest

from streamlease.core.frames import Frame
from streamlease.core.lease import CleanRelease, LeaseTimings, RenewOutcome, checkpoint_trusted
from streamlease.core.model import MAX_LAST_ERROR_CHARS, EventMark, Tenure
from streamlease.core.plan import invisible_to_index
from streamlease.errors import SinkConflict, StaleFence, StoreError
from streamlease.store import codec
from streamlease.store.dynamodb import DynamoAdmin
from streamlease.store.memory import MemoryStore
from streamlease.store.protocols import SinkOutcome, Stores
from tests.fleet.harness import INDEX_LAG_MS
from tests.store.lag import eventually, memory_of

T = LeaseTimings(lease_s=20.0, heartbeat_s=5.0, skew_margin_s=1.0, safety_margin_s=2.0)
NOW = 1_700_000_000_000
URL = "wss://feeds.example.com/a"


def frames(first: int, last: int, pad: str = "") -> list[Frame]:
    return [Frame(i, f'{{"seq":{i},"p":"{pad}"}}') for i in range(first, last + 1)]


async def exported(stores: Stores, sid: str) -> list[int]:
    return [f.seq async for f in stores.admin.read_events(sid)]


async def delete_stream(stores: Stores, sid: str) -> None:
    """An operator deleting an item (a write no store role offers)."""
    admin = stores.admin
    if isinstance(admin, MemoryStore):
        del admin.items[f"CONN#{sid}"]
        return
    assert isinstance(admin, DynamoAdmin)
    async with aioboto3.Session().client("dynamodb") as client:
        await client.delete_item(TableName=admin.table, Key=codec.key(sid))


async def acquired(stores: Stores, sid: str, owner: str = "w1", now: int = NOW) -> Tenure:
    got = await stores.leases.acquire(sid, owner, now, T)
    assert got is not None
    return got.tenure


async def test_acquire_returns_a_new_fence_and_the_item(stores: Stores) -> None:
    await stores.admin.put_started("a", URL)
    got = await stores.leases.acquire("a", "w1", NOW, T)
    assert got is not None
    assert (got.tenure.fence, got.tenure.owner, got.tenure.expires_at_ms) == (1, "w1", NOW + 20_000)
    assert got.record.ws_url == URL and got.record.started
    assert await stores.leases.acquire("a", "w2", NOW + 1000, T) is None  # live lease


async def test_put_started_sets_a_profile_and_keeps_it_when_given_none(stores: Stores) -> None:
    created = await stores.admin.put_started("a", URL, profile="gateway")
    assert created.attributes["profile"] == "gateway" and created.lease_expires_at_ms == 0
    again = await stores.admin.put_started("a", URL + "2")
    assert again.attributes["profile"] == "gateway" and again.ws_url == URL + "2"
    changed = await stores.admin.put_started("a", URL, profile="live")
    read = await stores.admin.get("a")
    assert changed.attributes["profile"] == "live"
    assert read is not None and read.attributes["profile"] == "live"
    plain = await stores.admin.put_started("b", URL)
    assert "profile" not in plain.attributes


async def test_fences_strictly_increase_across_takeovers(stores: Stores) -> None:
    await stores.admin.put_started("a", URL)
    fences = []
    now = NOW
    for i in range(5):
        fences.append((await acquired(stores, "a", f"w{i % 2}", now)).fence)
        now += 20_000 + 1_001  # past expiry and the skew margin
    assert fences == [1, 2, 3, 4, 5]
    assert await stores.leases.acquire("a", "w9", now - 1_001, T) is None  # inside the margin


async def test_renew_returns_the_item_and_only_the_holder_can_renew(stores: Stores) -> None:
    leases, admin = stores.leases, stores.admin
    await admin.put_started("a", URL)
    tenure = await acquired(stores, "a")
    result = await leases.renew(tenure, NOW + 5000, T)
    assert result.outcome is RenewOutcome.RENEWED
    assert result.record is not None and result.record.ws_url == URL
    assert result.record.lease_expires_at_ms == NOW + 25_000
    before = await admin.get("a")
    other_owner = Tenure("a", "w2", tenure.fence, None, 0)
    old_fence = Tenure("a", "w1", tenure.fence - 1, None, 0)
    for bad in (other_owner, old_fence):
        assert (await leases.renew(bad, NOW + 6000, T)).outcome is RenewOutcome.LOST
        assert await leases.release(bad) is False
    assert await admin.get("a") == before


async def test_renew_carries_desired_state_changes(stores: Stores) -> None:
    await stores.admin.put_started("a", URL)
    tenure = await acquired(stores, "a")
    await stores.admin.set_state("a", "STOPPED")
    result = await stores.leases.renew(tenure, NOW + 1, T)
    assert result.record is not None and result.record.stopped


async def test_release_frees_now_and_keeps_owner_and_fence(stores: Stores) -> None:
    await stores.admin.put_started("a", URL)
    tenure = await acquired(stores, "a")
    assert await stores.leases.release(tenure) is True
    record = await stores.admin.get("a")
    assert record is not None
    assert (record.lease_expires_at_ms, record.lease_owner, record.fence) == (0, "w1", 1)
    # A late renew never resurrects a released lease.
    assert (await stores.leases.renew(tenure, NOW + 1, T)).outcome is RenewOutcome.LOST
    again = await acquired(stores, "a", "w2", NOW + 1)  # free at once, no waiting for expiry
    assert again.fence == 2


TRACE_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER_TRACE_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_a_release_stores_the_trace_parent_it_is_given_in_the_same_write(
        stores: Stores) -> None:
    """Tracing on: a release (by the holder, on a dead member's behalf) leaves its span's
    context on the item; tracing off writes none; a force release removes an earlier one."""
    await stores.admin.put_started("a", URL)
    tenure = await acquired(stores, "a")
    assert await stores.leases.release(tenure) is True
    record = await stores.admin.get("a")
    assert record is not None and codec.trace_parent(record) is None
    assert codec.TRACE_PARENT not in record.attributes
    tenure = await acquired(stores, "a", "w2", NOW + 1)
    assert await stores.leases.release(tenure, trace_parent=TRACE_PARENT) is True
    record = await stores.admin.get("a")
    assert record is not None and record.lease_expires_at_ms == 0
    assert codec.trace_parent(record) == TRACE_PARENT
    # A refused release writes nothing.
    assert await stores.leases.release(tenure, trace_parent=OTHER_TRACE_PARENT) is True
    stale = dataclasses.replace(tenure, fence=tenure.fence - 1)
    assert await stores.leases.release(stale, trace_parent="00-bad") is False
    assert codec.trace_parent(await stores.admin.get("a")) == OTHER_TRACE_PARENT  # type: ignore[arg-type]
    done = await stores.admin.force_release("a")
    assert done.changed and done.record is not None
    assert codec.trace_parent(done.record) is None
    record = await stores.admin.get("a")
    assert record is not None and codec.TRACE_PARENT not in record.attributes
    # On a fenced member's behalf: expiry 0, fence + 1 and the context, in one write.
    tenure = await acquired(stores, "a", "dead", NOW + 2)
    assert await stores.leases.release_for("a", "dead", tenure.fence, 1,
                                           trace_parent=TRACE_PARENT) is True
    record = await stores.admin.get("a")
    assert record is not None and record.fence == tenure.fence + 1
    assert codec.trace_parent(record) == TRACE_PARENT


async def test_a_clean_release_leaves_its_mark_in_the_same_write(stores: Stores) -> None:
    """A release told its final checkpoint stores the mark the next holder trusts; a
    refused one writes nothing; one without it leaves an earlier mark as it was (the next
    fence no longer matches it)."""
    await stores.admin.put_started("a", URL)
    tenure = await acquired(stores, "a")
    assert await stores.leases.release(tenure, clean=CleanRelease(1, 0, NOW)) is True
    record = await stores.admin.get("a")
    assert record is not None and record.lease_expires_at_ms == 0
    assert codec.clean_release(record) == CleanRelease(1, 0, NOW)
    got = await stores.leases.acquire("a", "w2", NOW + 1, T)
    assert got is not None and codec.clean_release(got.record) == CleanRelease(1, 0, NOW)
    assert checkpoint_trusted(got.tenure, codec.clean_release(got.record), NOW + 1)
    stale = dataclasses.replace(got.tenure, fence=1)
    assert await stores.leases.release(stale, clean=CleanRelease(1, 9, NOW + 2)) is False
    assert await stores.leases.release(got.tenure) is True
    record = await stores.admin.get("a")
    assert record is not None and codec.clean_release(record) == CleanRelease(1, 0, NOW)
    third = await acquired(stores, "a", "w3", NOW + 3)
    assert not checkpoint_trusted(third, codec.clean_release(record), NOW + 3)


async def test_force_release_fences_out_the_holder(stores: Stores) -> None:
    admin = stores.admin
    await admin.put_started("a", URL)
    tenure = await acquired(stores, "a")
    refused = await admin.force_release("a", expect_owner="w2")
    assert not refused.changed and refused.record is not None and refused.record.fence == 1
    refused = await admin.force_release("a", expect_fence=7)
    assert not refused.changed
    done = await admin.force_release("a", expect_owner="w1", expect_fence=1)
    assert done.changed and done.record is not None
    assert (done.record.fence, done.record.lease_expires_at_ms) == (2, 0)
    assert (await stores.leases.renew(tenure, NOW + 1, T)).outcome is RenewOutcome.LOST
    with pytest.raises(StaleFence):
        await stores.sink.write_batch(tenure, 0, frames(1, 3), NOW)
    assert await exported(stores, "a") == []
    missing = await admin.force_release("nope")
    assert not missing.changed and missing.record is None


async def test_acquire_never_resurrects_a_deleted_item(stores: Stores) -> None:
    await stores.admin.put_started("a", URL)
    await delete_stream(stores, "a")
    assert await stores.leases.acquire("a", "w1", NOW, T) is None
    assert await stores.admin.get("a") is None
    assert await stores.admin.set_state("a", "STARTED") is None
    assert await stores.admin.get("a") is None


async def test_acquire_refuses_stopped_and_unknown_states(stores: Stores) -> None:
    await stores.admin.put_started("a", URL)
    await stores.admin.set_state("a", "STOPPED")
    assert await stores.leases.acquire("a", "w1", NOW, T) is None
    await stores.admin.set_state("a", "PAUSED")
    assert await stores.leases.acquire("a", "w1", NOW, T) is None


async def test_orphan_query_filters_and_limits(stores: Stores) -> None:
    for i in range(30):
        await stores.admin.put_started(f"s{i:02d}", URL)
    await acquired(stores, "s00")
    await stores.admin.set_state("s01", "STOPPED")
    expected = [f"s{i:02d}" for i in range(2, 30)]
    await eventually(stores, lambda: stores.leases.orphans(NOW, limit=1000),
                     lambda found: sorted(r.stream_id for r in found) == expected)
    # Each index read draws its own lag (two reads may see different moments): wait again.
    await eventually(stores, lambda: stores.leases.orphans(NOW, limit=5),
                     lambda found: len(found) == 5)


async def test_sweep_finds_hand_written_and_bad_items(stores: Stores) -> None:
    leases, admin = stores.leases, stores.admin
    for i in range(12):
        await admin.put_item({"Pk": {"S": f"CONN#hand{i}"}, "desired_state": {"S": "STARTED"},
                              "ws_url": {"S": URL}})
    await admin.put_item({"Pk": {"S": "CONN#weird"}, "desired_state": {"S": "RUNNING"},
                          "lease_expires_at_ms": {"N": "0"}})
    await admin.put_item({"Pk": {"S": "OTHER#x"}})
    await admin.put_started("normal", URL)
    everything = [r async for page in leases.scan_pages() for r in page]
    assert len(everything) == 14  # the OTHER#x item is not a stream
    found = [r for r in everything if invisible_to_index(r)]
    assert sorted(r.stream_id for r in found) == sorted([f"hand{i}" for i in range(12)] + ["weird"])
    normal = await admin.get("normal")
    await eventually(stores, lambda: leases.orphans(NOW, 100), lambda found: found == [normal])
    assert await leases.adopt("hand0") is True
    assert await leases.adopt("hand0") is False
    await eventually(stores, lambda: leases.orphans(NOW, 100),
                     lambda found: "hand0" in {r.stream_id for r in found})
    got = await leases.acquire("hand1", "w1", NOW, T)  # acquirable without adoption too
    assert got is not None and got.tenure.fence == 1


async def test_a_wrongly_typed_index_key_is_refused(stores: Stores) -> None:
    with pytest.raises(StoreError, match="Type mismatch"):
        await stores.admin.put_item({"Pk": {"S": "CONN#bad"}, "desired_state": {"S": "STARTED"},
                                     "lease_expires_at_ms": {"S": "soon"}})
    assert await stores.admin.get("bad") is None


async def test_sink_commits_in_order_and_moves_the_checkpoint(stores: Stores) -> None:
    await stores.admin.put_started("a", URL)
    t = await acquired(stores, "a")
    assert await stores.sink.write_batch(t, 0, frames(1, 10), NOW) is SinkOutcome.COMMITTED
    assert await stores.sink.write_batch(t, 10, frames(11, 12), NOW) is SinkOutcome.COMMITTED
    record = await stores.admin.get("a")
    assert record is not None and record.last_seq == 12
    assert await exported(stores, "a") == list(range(1, 13))
    texts = [f.text async for f in stores.admin.read_events("a")]
    assert texts[0] == '{"seq":1,"p":""}'
    assert await stores.sink.newest_event("a") == EventMark(12, 1)
    assert await stores.sink.newest_event("never") is None


async def test_a_resent_batch_cannot_duplicate(stores: Stores) -> None:
    await stores.admin.put_started("a", URL)
    t = await acquired(stores, "a")
    assert await stores.sink.write_batch(t, 0, frames(1, 5), NOW) is SinkOutcome.COMMITTED
    again = await stores.sink.write_batch(t, 0, frames(1, 5), NOW + 7)
    assert again is SinkOutcome.ALREADY_COMMITTED
    assert await exported(stores, "a") == [1, 2, 3, 4, 5]


async def test_stale_fence_rejects_the_whole_batch(stores: Stores) -> None:
    sink = stores.sink
    await stores.admin.put_started("a", URL)
    old = await acquired(stores, "a")
    await sink.write_batch(old, 0, frames(1, 3), NOW)
    new = await acquired(stores, "a", "w2", NOW + 30_000)
    assert new.fence == 2 and new.last_seq == 3
    big = frames(4, 200, pad="x" * 3000)  # several events items in one transaction
    assert len(codec.chunk_frames(big)) > 1
    with pytest.raises(StaleFence):
        await sink.write_batch(old, 3, big, NOW + 30_001)
    assert await exported(stores, "a") == [1, 2, 3]
    record = await stores.admin.get("a")
    assert record is not None and record.last_seq == 3
    assert await sink.write_batch(new, 3, big, NOW + 30_002) is SinkOutcome.COMMITTED
    assert await exported(stores, "a") == list(range(1, 201))
    assert await stores.admin.event_fences("a") == [1] + [2] * len(codec.chunk_frames(big))


async def test_last_seq_never_moves_backwards(stores: Stores) -> None:
    await stores.admin.put_started("a", URL)
    t = await acquired(stores, "a")
    await stores.sink.write_batch(t, 0, frames(1, 10), NOW)
    with pytest.raises(SinkConflict):
        await stores.sink.write_batch(t, 5, frames(6, 12), NOW)
    record = await stores.admin.get("a")
    assert record is not None and record.last_seq == 10
    assert await exported(stores, "a") == list(range(1, 11))


async def rewind(stores: Stores, sid: str, **attrs: Any) -> None:
    """Rewrite a stream item by hand (as a PutItem or a restore from backup would)."""
    record = await stores.admin.get(sid)
    assert record is not None and record.ws_url is not None
    item = {"Pk": {"S": f"CONN#{sid}"}, "desired_state": {"S": "STARTED"},
            "ws_url": {"S": record.ws_url}, "lease_expires_at_ms": {"N": "0"}}
    item.update({k: {"N": str(v)} for k, v in attrs.items()})
    await stores.admin.put_item(item)


async def test_advance_moves_a_rewound_tenure_past_the_sink(stores: Stores) -> None:
    sink, leases = stores.sink, stores.leases
    await stores.admin.put_started("a", URL)
    first = await acquired(stores, "a")
    for f in (1, 2, 3):  # three takeovers' worth of history in the sink
        await leases.release(first)
        first = await acquired(stores, "a", f"w{f}", NOW + f)
    await sink.write_batch(first, 0, frames(1, 10), NOW)
    mark = await sink.newest_event("a")
    assert mark == EventMark(10, first.fence)
    await rewind(stores, "a")  # checkpoint and fence gone: both restart
    fresh = await acquired(stores, "a", "w9", NOW + 10)
    assert (fresh.fence, fresh.last_seq) == (1, None)
    # Without advancing, the rewound tenure would write seqs 1.. again (here its first
    # events item collides with the one already there; another start would duplicate).
    with pytest.raises(SinkConflict, match="already exists"):
        await sink.write_batch(fresh, 0, frames(1, 2), NOW)
    moved = await leases.advance(fresh, mark.fence + 1, 10)
    assert moved is not None and (moved.fence, moved.last_seq) == (mark.fence + 1, 10)
    assert await sink.write_batch(moved, 10, frames(11, 12), NOW) is SinkOutcome.COMMITTED
    assert await exported(stores, "a") == list(range(1, 13))
    fences = await stores.admin.event_fences("a")
    assert fences == sorted(fences)
    # advance is conditional on the tenure it moves: a stale one moves nothing.
    assert await leases.advance(fresh, 99, 99) is None


async def test_record_error_is_truncated_as_stored(stores: Stores) -> None:
    await stores.admin.put_started("a", URL)
    long = "x" * (MAX_LAST_ERROR_CHARS + 500)
    await stores.leases.record_error("a", long, NOW)
    record = await stores.admin.get("a")
    assert record is not None and record.last_error == long[:MAX_LAST_ERROR_CHARS]
    assert record.last_error_at_ms == NOW
    await stores.leases.record_error("missing", "x", NOW)  # never creates an item
    assert await stores.admin.get("missing") is None


async def test_fifty_concurrent_acquirers_one_winner_twenty_rounds(stores: Stores) -> None:
    for round_no in range(20):
        sid = f"race{round_no}"
        await stores.admin.put_started(sid, URL)
        results = await asyncio.gather(
            *(stores.leases.acquire(sid, f"w{i}", NOW, T) for i in range(50)))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1, f"round {round_no}: {len(winners)} winners"
        record = await stores.admin.get(sid)
        assert record is not None and record.fence == 1
        assert record.lease_owner == winners[0].tenure.owner


async def test_dynamodb_pages_through_the_index_and_the_table(dynamo: Stores) -> None:
    leases, admin = dynamo.leases, dynamo.admin
    for i in range(30):
        await admin.put_started(f"s{i:02d}", URL)
    await eventually(dynamo, lambda: leases.orphans(NOW, limit=1000, page_size=7),  # type: ignore[call-arg]
                     lambda found: len(found) == 30)
    assert len(await leases.orphans(NOW, limit=5, page_size=2)) == 5  # type: ignore[call-arg]
    pages = [page async for page in leases.scan_pages(page_size=4)]
    assert sum(map(len, pages)) == 30 and len(pages) >= 8 and max(map(len, pages)) <= 4
    assert len(await admin.list_streams(page_size=4)) == 30  # type: ignore[call-arg]


def test_decode_reports_wrongly_typed_fields() -> None:
    from streamlease.core.plan import item_problem
    from streamlease.core.urls import parse_allowed_urls

    record = codec.decode_record({
        "Pk": {"S": "CONN#x"}, "desired_state": {"S": "STARTED"}, "ws_url": {"N": "5"},
        "fence": {"S": "seven"}, "last_seq": {"N": "1.5"}, "lease_expires_at_ms": {"N": "0"},
    })
    assert record is not None
    assert record.bad_fields == ("ws_url is not a string", "fence is not a whole number",
                                 "last_seq is not a whole number")
    wss = parse_allowed_urls("wss://")
    problem = item_problem(record, wss)
    assert problem is not None and problem.startswith("wrong attribute type: ws_url")
    fine = codec.decode_record({"Pk": {"S": "CONN#y"}, "desired_state": {"S": "STOPPED"}})
    assert fine is not None and fine.bad_fields == () and item_problem(fine, wss) is None


async def test_index_reads_lag_writes_and_consistent_reads_and_conditions_do_not(
        stores: Stores) -> None:
    """Right after a write, an index shows the item as it was (or not at all), never the
    new version; the item itself, and every condition, is current. On DynamoDB the
    check needs the read back within the server's fixed lag: a stalled machine retries."""
    leases, admin = stores.leases, stores.admin
    memory = memory_of(stores)
    for attempt in range(5):
        sid = f"a{attempt}"
        await admin.put_started(sid, URL)
        sent = time.monotonic()
        await leases.record_error(sid, "boom", NOW)  # the orphan index holds last_error
        tenure = await acquired(stores, sid)  # moves the item into the owner index
        orphans = await leases.orphans(NOW + 60_000, 100)
        owned = await leases.owned_by("w1")
        if memory is not None or time.monotonic() - sent < INDEX_LAG_MS / 1000:
            break
    else:
        pytest.fail("never read back within the index lag")
    assert sid not in {o.stream_id for o in owned}
    assert [r.last_error for r in orphans if r.stream_id == sid] in ([], [None])
    # A consistent read and a conditional write see the current item.
    record = await leases.check(sid)
    assert record is not None and record.lease_owner == "w1" and record.last_error == "boom"
    assert await leases.acquire(sid, "w2", NOW + 1, T) is None  # the lease is live
    # Once the lag has passed, the index shows the new version.
    await eventually(stores, lambda: leases.owned_by("w1"),
                     lambda found: (sid, tenure.fence) in {(o.stream_id, o.fence) for o in found})
    await eventually(stores, lambda: leases.orphans(NOW + 60_000, 100),
                     lambda found: [r.last_error for r in found if r.stream_id == sid] == ["boom"])


async def test_the_orphan_index_returns_only_its_projected_attributes(stores: Stores) -> None:
    """No last_seq (a checkpoint must not write the hot index) and no last_error_at_ms,
    however the item has them."""
    leases, admin = stores.leases, stores.admin
    await admin.put_started("a", URL)
    await leases.record_error("a", "boom", NOW)
    tenure = await acquired(stores, "a")
    await stores.sink.write_batch(tenure, 0, frames(1, 3), NOW)
    await leases.release(tenure)
    item = await admin.get("a")
    assert item is not None and item.last_seq == 3 and item.last_error_at_ms == NOW
    (found,) = await eventually(stores, lambda: leases.orphans(NOW, 10),
                                lambda found: [r.fence for r in found] == [1])
    assert (found.last_seq, found.last_error_at_ms) == (None, None)
    assert (found.ws_url, found.lease_owner, found.last_error) == (URL, "w1", "boom")
    assert found == dataclasses.replace(item, last_seq=None, last_error_at_ms=None)


async def raw_event_items(stores: Stores, sid: str) -> list[dict[str, Any]]:
    admin = stores.admin
    if isinstance(admin, MemoryStore):
        return list(admin.events.get(f"CONN#{sid}", {}).values())
    assert isinstance(admin, DynamoAdmin)
    async with aioboto3.Session().client("dynamodb") as client:
        resp = await client.query(TableName=admin.events_table, ConsistentRead=True,
                                  KeyConditionExpression="Pk = :pk",
                                  ExpressionAttributeValues={":pk": {"S": f"CONN#{sid}"}})
    return list(resp["Items"])


async def test_events_items_expire_only_with_a_ttl(stores: Stores) -> None:
    """STREAMLEASE_EVENTS_TTL_SECONDS: each events item carries ``expires_at`` (epoch
    seconds: write time plus the TTL); with 0 (the default) none does."""
    await stores.admin.put_started("a", URL)
    tenure = await acquired(stores, "a")
    assert await stores.sink.write_batch(tenure, 0, frames(1, 2), NOW) is SinkOutcome.COMMITTED
    setattr(stores.sink, "events_ttl_s", 86_400)  # noqa: B010 (not on the Sink protocol)
    assert await stores.sink.write_batch(tenure, 2, frames(3, 4), NOW + 5_000) \
        is SinkOutcome.COMMITTED
    items = sorted(await raw_event_items(stores, "a"), key=lambda i: int(i["Sk"]["N"]))
    assert [i.get("expires_at") for i in items] == [
        None, {"N": str((NOW + 5_000) // 1000 + 86_400)}]
    assert await exported(stores, "a") == [1, 2, 3, 4]


# -- check_many: many items in one eventually consistent read ------------------------------
# Each read below is repeated until it shows the write before it (``eventually``): an
# eventually consistent read may show an item's previous version for a moment, on either
# backend (DynamoDB's replicas; the embedded server's and the in-memory store's
# ``stale reads``), so no assertion here may depend on the first answer being current.


async def test_check_many_of_nothing_is_an_empty_answer(stores: Stores) -> None:
    assert await stores.leases.check_many([]) == {}
    assert await stores.leases.check_many((), timeout=1.0) == {}


async def test_check_many_answers_every_id_once_and_none_where_there_is_no_item(
        stores: Stores) -> None:
    leases, admin = stores.leases, stores.admin
    await admin.put_started("a", URL)
    await admin.put_started("b", URL + "b")
    tenure = await acquired(stores, "a")
    wanted = {"a": await leases.check("a"), "b": await leases.check("b"), "nope": None}
    assert wanted["a"] is not None and wanted["a"].lease_owner == "w1"
    got = await eventually(stores, lambda: leases.check_many(["a", "nope", "b", "a"]),
                           lambda found: found == wanted)
    assert list(got) == ["a", "nope", "b"]  # each id once, in the order first asked
    (one,) = (await leases.check_many(["nope"])).values()
    assert one is None
    # What it reads moves on with the item: a release, a STOPPED flip, a deletion.
    await leases.release(tenure)
    await admin.set_state("b", "STOPPED")
    await eventually(stores, lambda: leases.check_many(["a", "b"]), lambda found: (
        found["a"] is not None and found["a"].lease_expires_at_ms == 0
        and found["b"] is not None and found["b"].stopped))
    await delete_stream(stores, "b")
    await eventually(stores, lambda: leases.check_many(["a", "b"]),
                     lambda found: found["b"] is None and found["a"] is not None)


async def test_check_many_of_150_ids_reads_them_all(stores: Stores) -> None:
    """More ids than one BatchGetItem takes (100): the DynamoDB store sends two."""
    leases, admin = stores.leases, stores.admin
    sids = [f"s{i:03}" for i in range(140)]
    await asyncio.gather(*(admin.put_started(sid, f"{URL}/{sid}") for sid in sids))
    asked = sids + [f"gone{i}" for i in range(10)]
    got = await eventually(stores, lambda: leases.check_many(asked),
                           lambda found: all(found[s] is not None for s in sids))
    assert list(got) == asked
    assert {sid: r.ws_url for sid, r in got.items() if r is not None} == {
        sid: f"{URL}/{sid}" for sid in sids}
    assert all(got[f"gone{i}"] is None for i in range(10))


async def test_check_many_reads_bad_items_as_check_does(stores: Stores) -> None:
    """A wrongly typed attribute is reported on the record (the holder then drains it as
    unservable); an item whose key names no stream reads as None."""
    leases, admin = stores.leases, stores.admin
    await admin.put_item({"Pk": {"S": "CONN#odd"}, "desired_state": {"S": "STARTED"},
                          "ws_url": {"N": "7"}, "lease_expires_at_ms": {"N": "0"}})
    await admin.put_item({"Pk": {"S": "CONN#"}, "desired_state": {"S": "STARTED"}})
    odd = await leases.check("odd")
    assert odd is not None and odd.bad_fields == ("ws_url is not a string",)
    await eventually(stores, lambda: leases.check_many(["odd", ""]),
                     lambda found: found == {"odd": odd, "": None})
