"""The MongoDB leader backend on a real MongoDB wire server (tests/mongoserver.py): one
winner under a race, fences that never go back (a restart, a dropped lease collection),
expiry on the server's clock whatever a candidate's own says, renewals and releases only
by the holder, fenced writes refused once a higher fence holds, and what the URL and a
job's item become."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from bson.decimal128 import Decimal128
from pymongo import WriteConcern

from loadtest.fleet import FAKETIME_ENV, faketime_library
from streamlease.core.backends import parse_leader_backend
from streamlease.core.fenced import PutItem, Upsert
from streamlease.core.membership import HeartbeatOutcome
from streamlease.errors import ConfigError, StaleFence, StoreError, StoreUnavailable, WriteRefused
from streamlease.store.mongo_leader import (
    FENCE_FIELD,
    FENCES,
    LEASES,
    MongoLeaderBackend,
    client_for,
    mongo_backend,
    mongo_target,
    upsert_for_item,
)
from streamlease.store.mongoclient import driver_warnings
from tests.mongoserver import MongoServer
from tests.procs import ROOT

NOW = 1_800_000_000_000


def name() -> str:
    return f"lease-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def url(mongo_server: MongoServer) -> str:
    return mongo_server.url(f"leader-{uuid.uuid4().hex[:8]}")


@pytest.fixture
async def impl(url: str) -> AsyncIterator[MongoLeaderBackend]:
    async with mongo_backend(url) as backend:
        yield backend


async def lapse(impl: MongoLeaderBackend, lease: str) -> None:
    """The lease's expiry put in the past, as the server's clock passing it would."""
    done = await impl.leases.update_one({"_id": lease}, {"$set": {"expires_at_ms": 1}})
    assert done.matched_count == 1


async def race(url: str, lease: str, racers: int) -> list[int | None]:
    """``racers`` candidates, each on a client (and connections) of its own, acquire at
    once; what each got."""
    backends = [mongo_backend(url) for _ in range(racers)]
    opened = [await b.__aenter__() for b in backends]
    try:
        # Connected first, so that the acquisitions, not the handshakes, race.
        await asyncio.gather(*(b.read(lease) for b in opened))
        return list(await asyncio.gather(
            *(b.acquire(lease, f"c{i}", 10, None, NOW) for i, b in enumerate(opened))))
    finally:
        for b in backends:
            await b.__aexit__(None, None, None)


async def test_racing_candidates_one_winner_each_round_and_fences_strictly_increase(
        url: str, impl: MongoLeaderBackend) -> None:
    lease = name()
    fences = []
    for round_ in range(5):
        if round_:
            await lapse(impl, lease)  # round 0 races the upsert of a lease never held
        got = await race(url, lease, 12)
        winners = [f for f in got if f is not None]
        assert len(winners) == 1, f"round {round_}: {got}"
        held = await impl.read(lease)
        assert held is not None and held.fence == winners[0]
        assert held.owner == f"c{got.index(winners[0])}"
        fences.append(winners[0])
    assert fences == sorted(fences) and len(set(fences)) == len(fences)
    assert fences[1:] == [fences[0] + i for i in range(1, 5)]


async def test_the_first_fence_comes_from_the_servers_clock(impl: MongoLeaderBackend) -> None:
    before = int(time.time() * 1000)
    fence = await impl.acquire(name(), "a", 10, None, 0)  # the caller's clock says 1970
    assert fence is not None and before - 60_000 <= fence <= int(time.time() * 1000) + 60_000


async def test_a_heartbeat_after_the_lease_was_lost_is_fenced_and_changes_nothing(
        impl: MongoLeaderBackend) -> None:
    lease = name()
    old = await impl.acquire(lease, "a", 10, None, NOW)
    assert old is not None
    await lapse(impl, lease)
    new = await impl.acquire(lease, "b", 10, None, NOW)
    assert new is not None and new > old
    before = await impl.leases.find_one({"_id": lease})
    assert await impl.renew(lease, "a", old, 10, NOW) is HeartbeatOutcome.FENCED
    assert await impl.renew(lease, "a", new, 10, NOW) is HeartbeatOutcome.FENCED
    assert await impl.renew(lease, "b", old, 10, NOW) is HeartbeatOutcome.FENCED
    assert await impl.leases.find_one({"_id": lease}) == before
    assert await impl.renew(lease, "b", new, 10, NOW) is HeartbeatOutcome.RENEWED


async def test_an_expired_lease_nobody_took_is_not_resurrected_by_its_holder(
        impl: MongoLeaderBackend) -> None:
    lease = name()
    fence = await impl.acquire(lease, "a", 10, None, NOW)
    assert fence is not None
    await lapse(impl, lease)
    assert await impl.read(lease) is None
    assert await impl.renew(lease, "a", fence, 10, NOW) is HeartbeatOutcome.FENCED
    assert await impl.read(lease) is None
    again = await impl.acquire(lease, "a", 10, None, NOW)
    assert again is not None and again > fence  # a new tenure, under a new fence


async def test_a_release_of_anothers_lease_is_refused(impl: MongoLeaderBackend) -> None:
    lease = name()
    fence = await impl.acquire(lease, "a", 10, None, NOW)
    assert fence is not None
    assert await impl.resign(lease, "b", fence) is False
    assert await impl.resign(lease, "a", fence - 1) is False
    held = await impl.read(lease)
    assert held is not None and (held.owner, held.fence) == ("a", fence)
    assert await impl.acquire(lease, "b", 10, None, NOW) is None
    assert await impl.resign(lease, "a", fence) is True
    document = await impl.leases.find_one({"_id": lease})
    assert document is not None and document["fence"] == fence  # the fence stays
    assert await impl.read(lease) is None
    taken = await impl.acquire(lease, "b", 10, None, NOW)
    assert taken == fence + 1


async def test_the_fence_survives_a_dropped_lease_collection(impl: MongoLeaderBackend) -> None:
    lease = name()
    fences = []
    for owner in "abc":
        fence = await impl.acquire(lease, owner, 10, None, NOW)
        assert fence is not None
        fences.append(fence)
        assert await impl.resign(lease, owner, fence)
    await impl.db.drop_collection(LEASES)
    assert await impl.read(lease) is None
    after = await impl.acquire(lease, "d", 10, None, NOW)
    assert after is not None and after > max(fences)
    mark = await impl.fences.find_one({"_id": lease})
    assert mark is not None and mark["fence"] == after


async def test_the_fence_survives_a_lease_collection_restored_from_an_older_snapshot(
        impl: MongoLeaderBackend) -> None:
    lease = name()
    first = await impl.acquire(lease, "a", 10, None, NOW)
    assert first is not None
    snapshot = await impl.leases.find_one({"_id": lease})
    assert await impl.resign(lease, "a", first)
    second = await impl.acquire(lease, "b", 10, None, NOW)
    assert second is not None and await impl.resign(lease, "b", second)
    assert snapshot is not None
    await impl.leases.replace_one({"_id": lease}, {**snapshot, "expires_at_ms": 0})
    third = await impl.acquire(lease, "c", 10, None, NOW)
    assert third is not None and third > second


async def test_a_refused_attempt_moves_neither_the_lease_nor_the_mark(
        impl: MongoLeaderBackend) -> None:
    lease = name()
    fence = await impl.acquire(lease, "a", 10, None, NOW)
    assert fence is not None
    before = (await impl.leases.find_one({"_id": lease}), await impl.fences.find_one(
        {"_id": lease}))
    for owner in "bcd":
        assert await impl.acquire(lease, owner, 10, None, NOW) is None
    after = (await impl.leases.find_one({"_id": lease}), await impl.fences.find_one(
        {"_id": lease}))
    assert after == before


async def test_a_held_lease_and_its_fence_survive_a_server_restart(
        tmp_path: Path) -> None:
    server = MongoServer(tmp_path)
    server.start()
    try:
        url = server.url("restart")
        lease = name()
        async with mongo_backend(url) as impl:
            fence = await impl.acquire(lease, "a", 60, None, NOW)
            assert fence is not None
            assert await impl.resign(lease, "a", fence)
            fence = await impl.acquire(lease, "b", 60, None, NOW)
            assert fence is not None
        server.stop(signal.SIGKILL)  # a crash: what was acknowledged is on disk
        server.start()
        async with mongo_backend(url) as impl:
            held = await impl.read(lease)
            assert held is not None and (held.owner, held.fence) == ("b", fence)
            assert await impl.acquire(lease, "c", 60, None, NOW) is None
            assert await impl.renew(lease, "b", fence, 60, NOW) is HeartbeatOutcome.RENEWED
            await impl.db.drop_collection(LEASES)
        server.stop()  # a clean shutdown this time
        server.start()
        async with mongo_backend(url) as impl:
            after = await impl.acquire(lease, "c", 60, None, NOW)
            assert after is not None and after > fence
    finally:
        server.close()


async def test_a_fenced_write_is_refused_after_a_newer_acquisition_and_writes_nothing(
        impl: MongoLeaderBackend) -> None:
    lease = name()
    old = await impl.acquire(lease, "a", 10, None, NOW)
    assert old is not None
    await impl.fenced_write(lease, old, Upsert("out", "slot-1", {"value": "a"}))
    await lapse(impl, lease)
    new = await impl.acquire(lease, "b", 10, None, NOW)
    assert new is not None
    with pytest.raises(StaleFence):
        await impl.fenced_write(lease, old, Upsert("out", "slot-2", {"value": "a"}))
    assert await impl.db.out.find_one({"_id": "slot-2"}) is None
    await impl.fenced_write(lease, new, Upsert("out", "slot-1", {"value": "b"}))
    written = await impl.db.out.find_one({"_id": "slot-1"})
    assert written == {"_id": "slot-1", "value": "b", FENCE_FIELD: new}


async def test_a_write_is_refused_where_a_higher_fence_has_written_the_document(
        impl: MongoLeaderBackend) -> None:
    """The resource's own fence: even a lease that carries the writer's fence (its record
    rewound by hand, say) cannot overwrite what a higher fence wrote."""
    lease = name()
    fence = await impl.acquire(lease, "a", 10, None, NOW)
    assert fence is not None
    await impl.db.out.insert_one({"_id": "k", "value": "newer", FENCE_FIELD: fence + 5})
    with pytest.raises(StaleFence, match="has written"):
        await impl.fenced_write(lease, fence, Upsert("out", "k", {"value": "older"}))
    assert (await impl.db.out.find_one({"_id": "k"}) or {})["value"] == "newer"


async def test_writes_mongodb_cannot_apply_are_refused_before_anything_runs(
        impl: MongoLeaderBackend) -> None:
    lease = name()
    fence = await impl.acquire(lease, "a", 10, None, NOW)
    assert fence is not None
    with pytest.raises(TypeError, match="condition"):
        await impl.fenced_write(lease, fence, PutItem(
            "out", {"Pk": {"S": "k"}}, "attribute_not_exists(Pk)"))
    with pytest.raises(TypeError, match="cannot apply"):
        await impl.fenced_write(lease, fence, object())
    assert await impl.db.out.count_documents({}) == 0
    await impl.fenced_write(lease, fence, PutItem("out", {"Pk": {"S": "k"}, "n": {"N": "3"}}))
    assert await impl.db.out.find_one({"_id": "k"}) == {
        "_id": "k", "Pk": "k", "n": 3, FENCE_FIELD: fence}


def test_an_item_becomes_a_document_with_plain_values() -> None:
    item = {"Pk": {"S": "day#1"}, "Sk": {"N": "2"}, "n": {"N": "3"}, "x": {"N": "0.5"},
            "ok": {"BOOL": True}, "none": {"NULL": True}, "tags": {"SS": ["b", "a"]},
            "m": {"M": {"k": {"L": [{"S": "v"}, {"N": "1"}]}}}, "b": {"B": b"\x00\x01"}}
    upsert = upsert_for_item("ledger", item)
    assert upsert.collection == "ledger"
    assert upsert.key == {"Pk": "day#1", "Sk": 2}
    assert upsert.document == {"Pk": "day#1", "Sk": 2, "n": 3, "x": Decimal128(Decimal("0.5")),
                               "ok": True, "none": None, "tags": ["a", "b"],
                               "m": {"k": ["v", 1]}, "b": b"\x00\x01"}
    assert upsert_for_item("ledger", {"Pk": {"S": "k"}}).key == "k"


@pytest.mark.parametrize(("table", "item", "says"), [
    ("ledger", {"n": {"N": "1"}}, "no Pk"),
    ("ledger", {"Pk": {"S": "k"}, "_id": {"S": "x"}}, "may not have _id"),
    ("ledger", {"Pk": {"S": "k"}, FENCE_FIELD: {"N": "1"}}, "may not have _id"),
    ("ledger", {"Pk": {"Q": "k"}}, "not a DynamoDB attribute value"),
    ("ledger", {"Pk": "k"}, "not a DynamoDB attribute value"),
    ("", {"Pk": {"S": "k"}}, "collection name"),
    ("a$b", {"Pk": {"S": "k"}}, "collection name"),
    ("system.users", {"Pk": {"S": "k"}}, "collection name"),
])
def test_an_item_that_cannot_be_a_document_is_refused(table: str, item: dict[str, object],
                                                     says: str) -> None:
    with pytest.raises(ValueError, match=says):
        upsert_for_item(table, item)  # type: ignore[arg-type]


def test_writes_are_majority_and_journaled_and_reads_majority_unless_the_url_says() -> None:
    plain = client_for(mongo_target("mongodb://127.0.0.1:9/db"))
    assert plain.write_concern == WriteConcern(w="majority", j=True)
    assert plain.read_concern.level == "majority"
    told = client_for(mongo_target(
        "mongodb://127.0.0.1:9/db?w=1&journal=false&readConcernLevel=local"))
    assert told.write_concern == WriteConcern(w=1, j=False)
    assert told.read_concern.level == "local"


def test_the_url_for_logs_shows_neither_password_nor_option_values() -> None:
    target = parse_leader_backend("mongodb://svc:s3cret@db1.internal:27017,db2.internal/app"
                                  "?authSource=admin&tlsCertificateKeyFilePassword=pw")
    assert target != "dynamodb"
    shown = f"{target.url} {target!r}"
    assert "s3cret" not in shown and "pw" not in shown.replace("password", "")
    assert "db1.internal:27017,db2.internal/app" in shown


async def test_no_server_is_store_unavailable_and_a_renewal_unknown() -> None:
    async with mongo_backend("mongodb://127.0.0.1:9/none?serverSelectionTimeoutMS=200") as b:
        with pytest.raises(StoreUnavailable):
            await b.read("x", timeout=2)
        with pytest.raises(StoreUnavailable):
            await b.acquire("x", "a", 10, None, NOW, timeout=2)
        assert await b.renew("x", "a", 1, 10, NOW, timeout=2) is HeartbeatOutcome.UNKNOWN


@pytest.mark.parametrize("query", ["w=-5", "authMechanism=NOPE", "tls=maybe",
                                   "readPreference=nowhere", "noSuchOption=1"])
async def test_an_unusable_url_is_a_config_error_naming_the_setting_not_the_password(
        query: str) -> None:
    with pytest.raises(ConfigError, match=r"STREAMLEASE_LEADER_BACKEND.*not a usable") as raised:
        async with mongo_backend(f"mongodb://u:s3cret@127.0.0.1:9/db?{query}"):
            pass
    assert "s3cret" not in str(raised.value)


CANDIDATE = """
import asyncio, json, sys, time
from streamlease.store.mongo_leader import mongo_backend

async def main(url, lease, ttl_s):
    async with mongo_backend(url) as backend:
        seen = await backend.read(lease)
        fence = await backend.acquire(lease, "skewed", ttl_s, None, int(time.time() * 1000))
        print(json.dumps({"now": time.time(), "seen": seen is not None, "fence": fence}))

asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
"""


def candidate(url: str, lease: str, offset: str, lib: str) -> dict[str, object]:
    """One acquisition by a process whose wall clock is ``offset`` off (libfaketime)."""
    env = {**os.environ, "LD_PRELOAD": lib, "FAKETIME": offset, **FAKETIME_ENV}
    done = subprocess.run([sys.executable, "-c", CANDIDATE, url, lease, "5"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@pytest.mark.skipif(faketime_library() is None and not os.environ.get("REQUIRE_FAKETIME"),
                    reason="needs libfaketime (Debian package faketime; `make test` installs it "
                           "as root on Debian)")
async def test_a_candidates_clock_two_seconds_off_changes_nothing(
        url: str, impl: MongoLeaderBackend) -> None:
    lib = faketime_library()
    assert lib is not None, "libfaketime is missing: `make test` installs Debian's faketime"
    lease = name()
    held = await impl.acquire(lease, "holder", 1.5, None, NOW)
    assert held is not None
    # Ahead by 2 s: by its own clock the 1.5 s lease ran out already. The server's says no.
    before = time.time()
    ahead = await asyncio.to_thread(candidate, url, lease, "+2s", lib)
    assert float(ahead["now"]) - before >= 1.5  # type: ignore[arg-type]
    assert ahead["seen"] is True and ahead["fence"] is None
    record = await impl.read(lease)
    assert record is not None and (record.owner, record.fence) == ("holder", held)
    # Behind by 2 s: by its own clock the lease has 2 s left once the server's ran out.
    # The server's clock decides: it takes the lease.
    deadline = time.monotonic() + 10
    while await impl.read(lease) is not None:
        assert time.monotonic() < deadline, "the lease never ran out on the server"
        await asyncio.sleep(0.05)  # waiting out a 1.5 s lease on the server's clock
    behind = await asyncio.to_thread(candidate, url, lease, "-2s", lib)
    assert time.time() - float(behind["now"]) >= 1.5  # type: ignore[arg-type]  # after it
    assert behind["seen"] is False and behind["fence"] == held + 1
    assert await impl.renew(lease, "holder", held, 1.5, NOW) is HeartbeatOutcome.FENCED


async def test_the_lease_collections_are_the_documented_ones(impl: MongoLeaderBackend) -> None:
    lease = name()
    assert await impl.acquire(lease, "a", 10, None, NOW) is not None
    assert {LEASES, FENCES} <= set(await impl.db.list_collection_names())


class Recorded:
    """A collection whose calls are recorded (method, filter, upsert), then made."""

    def __init__(self, inner: Any, calls: list[tuple[str, Any, bool]]) -> None:
        self.inner, self.calls = inner, calls

    def __getattr__(self, method: str) -> Any:
        real = getattr(self.inner, method)

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((method, args[0] if args else None, bool(kwargs.get("upsert"))))
            return await real(*args, **kwargs)
        return call


async def test_no_upsert_filter_holds_expr_which_mongodb_refuses(
        impl: MongoLeaderBackend) -> None:
    """MongoDB refuses ``$expr`` in the filter of an upsert (error 224) though the test
    server takes it: every upsert's condition is in its pipeline or plain fields."""
    calls: list[tuple[str, Any, bool]] = []
    impl.leases = Recorded(impl.leases, calls)  # type: ignore[assignment]
    impl.fences = Recorded(impl.fences, calls)  # type: ignore[assignment]
    lease = name()
    fence = await impl.acquire(lease, "a", 10, None, NOW)
    assert fence is not None
    assert await impl.acquire(lease, "b", 10, None, NOW) is None
    assert await impl.renew(lease, "a", fence, 10, NOW) is HeartbeatOutcome.RENEWED
    await impl.fenced_write(lease, fence, Upsert("out", "k", {"v": 1}))
    assert await impl.resign(lease, "a", fence)
    upserts = [(method, where) for method, where, upsert in calls if upsert]
    assert upserts, calls
    assert all("$expr" not in json.dumps(where) for _, where in upserts), upserts


class Paused:
    """A collection whose ``method`` stops, on its first call, after the call is made,
    until ``go`` is set; ``reached`` is set once it got there."""

    def __init__(self, inner: Any, method: str) -> None:
        self.inner, self.method = inner, method
        self.reached, self.go = asyncio.Event(), asyncio.Event()

    def __getattr__(self, method: str) -> Any:
        real = getattr(self.inner, method)
        if method != self.method or self.reached.is_set():
            return real

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = await real(*args, **kwargs)
            self.reached.set()
            await self.go.wait()
            return result
        return call


async def test_a_deposed_leaders_write_never_commits_after_a_newer_acquisition_returned(
        url: str, impl: MongoLeaderBackend) -> None:
    """The deposed leader's transaction has passed its lease check when a newer leader
    acquires: either the acquisition waits for the transaction (the write is ordered
    before it) or the write is refused; never a write landing after the new fence was
    handed out."""
    lease = name()
    old = await impl.acquire(lease, "old", 10, None, NOW)
    assert old is not None
    await lapse(impl, lease)
    paused = Paused(impl.leases, "find_one_and_update")
    impl.leases = paused  # type: ignore[assignment]
    finished: dict[str, float] = {}

    async def deposed_write() -> None:
        try:
            await impl.fenced_write(lease, old, Upsert("out", "late", {"by": "old"}), 20)
        finally:
            finished["write"] = time.monotonic()

    writing = asyncio.ensure_future(deposed_write())
    await asyncio.wait_for(paused.reached.wait(), 10)
    async with mongo_backend(url) as other:
        acquiring = asyncio.ensure_future(other.acquire(lease, "new", 10, None, NOW, 20))
        done, _ = await asyncio.wait({acquiring}, timeout=1.0)
        paused.go.set()
        results = await asyncio.gather(writing, acquiring, return_exceptions=True)
    new_fence = results[1]
    assert not done or isinstance(results[0], StaleFence), results
    if not isinstance(results[0], BaseException):
        assert new_fence is not None and not isinstance(new_fence, BaseException)
        written = await impl.db.out.find_one({"_id": "late"})
        assert written is not None and written[FENCE_FIELD] == old < new_fence


async def test_a_fence_is_never_handed_out_twice_when_the_lease_is_lost_mid_acquisition(
        url: str, impl: MongoLeaderBackend) -> None:
    """A reads the mark; meanwhile B acquires and the lease document is deleted; A's
    update then computes B's fence again from the mark it read: A is refused."""
    lease = name()
    first = await impl.acquire(lease, "x", 10, None, NOW)
    assert first is not None and await impl.resign(lease, "x", first)
    paused = Paused(impl.fences, "find_one")
    impl.fences = paused  # type: ignore[assignment]
    a = asyncio.ensure_future(impl.acquire(lease, "a", 10, None, NOW))
    await asyncio.wait_for(paused.reached.wait(), 10)
    async with mongo_backend(url) as other:
        b = await other.acquire(lease, "b", 10, None, NOW)
        assert b == first + 1
        await other.leases.delete_one({"_id": lease})
    paused.go.set()
    assert await a is None  # its fence would have been b's
    async with mongo_backend(url) as other:
        assert await other.renew(lease, "b", b, 10, NOW) is HeartbeatOutcome.FENCED
        again = await other.acquire(lease, "c", 10, None, NOW)
        assert again is not None and again > b


async def test_a_lease_restored_from_an_older_snapshot_deposes_nobody_and_revives_nobody(
        impl: MongoLeaderBackend) -> None:
    lease = name()
    old = await impl.acquire(lease, "x", 10, None, NOW)
    assert old is not None
    snapshot = await impl.leases.find_one({"_id": lease})
    await lapse(impl, lease)
    new = await impl.acquire(lease, "y", 10, None, NOW)
    assert new is not None and snapshot is not None
    await impl.leases.replace_one({"_id": lease}, snapshot)  # the old holder, unexpired
    assert await impl.renew(lease, "x", old, 10, NOW) is HeartbeatOutcome.FENCED
    with pytest.raises(StaleFence):
        await impl.fenced_write(lease, old, Upsert("out", "k", {"by": "x"}))
    assert await impl.db.out.find_one({"_id": "k"}) is None
    taken = await impl.acquire(lease, "z", 10, None, NOW)  # below the mark: free at once
    assert taken == new + 1


async def test_a_lease_document_edited_into_nonsense_is_a_store_error_not_a_crash(
        impl: MongoLeaderBackend) -> None:
    lease = name()
    await impl.leases.insert_one({"_id": lease, "holder": "a", "fence": "seven",
                                  "expires_at_ms": 1})
    with pytest.raises(StoreError, match="fence is not a whole number"):
        await impl.read(lease)
    await impl.fences.insert_one({"_id": lease, "fence": [1]})
    with pytest.raises(StoreError, match="fence is not a whole number"):
        await impl.acquire(lease, "b", 10, None, NOW)


async def test_what_mongodb_cannot_store_or_a_users_unique_index_refuses_is_write_refused(
        impl: MongoLeaderBackend) -> None:
    lease = name()
    fence = await impl.acquire(lease, "a", 10, None, NOW)
    assert fence is not None
    with pytest.raises(WriteRefused, match="cannot store"):
        await impl.fenced_write(lease, fence, PutItem("out", {"Pk": {"S": "k"},
                                                              "n": {"N": "1e30"}}))
    await impl.db.out.create_index("email", unique=True)
    await impl.fenced_write(lease, fence, Upsert("out", "k1", {"email": "a@example.com"}))
    with pytest.raises(WriteRefused, match="unique index"):
        await impl.fenced_write(lease, fence, Upsert("out", "k2", {"email": "a@example.com"}))
    assert await impl.db.out.count_documents({}) == 1


async def test_the_leases_own_collections_are_not_a_job_writes_table() -> None:
    for table in (LEASES, FENCES):
        with pytest.raises(ValueError, match="collection name"):
            upsert_for_item(table, {"Pk": {"S": "fleet"}})


def test_the_drivers_notice_about_documentdb_is_no_refusal_but_a_bad_option_is() -> None:
    """pymongo warns that a DocumentDB or Cosmos DB host is one (a notice, not a fault of
    the URL); it also only warns about an option it cannot use. The first is let through
    (a DocumentDB URL must not be refused), the second refused."""
    with driver_warnings():
        for service in ("DocumentDB", "CosmosDB"):
            warnings.warn(f"You appear to be connected to a {service} cluster. For more "
                          "information ...", UserWarning, stacklevel=1)
        with pytest.raises(UserWarning, match="must be an integer"):
            warnings.warn("The value of maxpoolsize must be an integer", UserWarning,
                          stacklevel=1)
