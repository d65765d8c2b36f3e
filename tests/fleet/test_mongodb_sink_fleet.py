"""The mongodb sink in real worker processes: a kill -9 and a SIGTERM while messages flow,
then an audit of MongoDB itself (tests/mongoserver.py: a one-member replica set, so the
sink writes each batch and its checkpoint in one transaction)."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from streamlease.dev.upstream import frame_for
from tests.fleet.conftest import FleetFactory
from tests.fleet.harness import Fleet, wait_until
from tests.mongoserver import MongoServer

pytestmark = pytest.mark.fleet


@pytest.fixture
async def mongo_db(mongo_server: MongoServer
                   ) -> AsyncIterator[tuple[str, AsyncMongoClient[dict[str, Any]]]]:
    """A database of this test's own on the session's server, dropped afterwards."""
    name = f"fleet_{uuid.uuid4().hex[:12]}"
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_server.url())
    try:
        yield name, client
    finally:
        await client.drop_database(name)
        await client.close()


async def progress(fleet: Fleet) -> dict[str, int]:
    return {sid: r.last_seq or 0 for sid, r in (await fleet.records()).items()}


# A worker killed mid-transaction leaves its transaction open on the server, holding the
# stream's documents, until the server's transaction lifetime ends it (60 s, mongod's
# transactionLifetimeLimitSeconds default, as SecantusDB's; a closed connection does not end
# it): the stream's next holder retries its first batch until then (docs/sinks.md).
TRANSACTION_LIFETIME_S = 60.0


async def wait_moving_on(fleet: Fleet, beyond: dict[str, int], what: str,
                         timeout: float = 45.0) -> None:
    async def moved() -> bool:
        now = await progress(fleet)
        return all(now[sid] > beyond.get(sid, 0) + 5 for sid in fleet.stream_ids)
    await wait_until(moved, timeout, what)


def busiest(owners: dict[str, str | None], among: list[str]) -> str:
    return max(among, key=lambda name: sum(o == name for o in owners.values()))


async def audit(fleet: Fleet, db: Any) -> dict[str, int]:
    """From MongoDB itself: each stream's documents are seq 1..N, each once, with the
    upstream's object as data; N is MongoDB's checkpoint and at least the stream item's
    (nothing checkpointed is missing); fences never go back along the sequence."""
    records = await fleet.records()
    stored: dict[str, int] = {}
    for sid in fleet.stream_ids:
        docs = [d async for d in db.messages.find({"stream_id": sid}).sort("seq", 1)]
        seqs = [d["seq"] for d in docs]
        count = await db.messages.count_documents({"stream_id": sid})
        distinct = await db.messages.distinct("seq", {"stream_id": sid})
        assert count == len(distinct) == len(seqs), f"{sid}: {count} documents, " \
            f"{len(distinct)} distinct seqs: duplicated"
        assert seqs == list(range(1, len(seqs) + 1)), f"{sid}: not exactly 1..{len(seqs)}"
        for doc in docs:
            assert doc["_id"] == f"{sid}:{doc['seq']}"
            assert doc["data"] == json.loads(frame_for(sid, doc["seq"])), \
                f"{sid} seq {doc['seq']}: content differs"
        fences = [d["fence"] for d in docs]
        assert fences == sorted(fences), f"{sid}: an older fence wrote after a newer one"
        checkpoint = await db.streamlease_checkpoints.find_one({"_id": sid})
        assert checkpoint is not None and checkpoint["last_seq"] == len(seqs), \
            f"{sid}: MongoDB's checkpoint {checkpoint} but {len(seqs)} documents"
        item = records[sid]
        assert len(seqs) >= (item.last_seq or 0), \
            f"{sid}: the item's checkpoint is {item.last_seq}, only {len(seqs)} stored: lost"
        assert checkpoint["fence"] <= (item.fence or 0)
        stored[sid] = len(seqs)
    return stored


async def test_mongodb_sink_through_kill_9_and_sigterm_lands_every_message_once(
        make_fleet: FleetFactory, mongo_server: MongoServer,
        mongo_db: tuple[str, AsyncMongoClient[dict[str, Any]]]) -> None:
    started = time.monotonic()
    name, client = mongo_db
    url = mongo_server.url(f"{name}.messages")
    fleet = await make_fleet(streams=6, rate=20,
                             env={"STREAMLEASE_SINK": url}).start(workers=3)
    await wait_until(fleet.balanced, 60, "the streams spread over the three workers")
    await wait_moving_on(fleet, {}, "every stream delivering")
    for worker in fleet.workers.values():
        ready = worker.log_events("mongodb.ready")
        assert ready and ready[0]["transactions"] is True, worker.tail()

    # kill -9 the worker holding most streams, then SIGTERM the busiest other one while
    # the first one's streams are being taken over.
    owners = await fleet.owners()
    victim = busiest(owners, list(fleet.workers))
    taken_over = [sid for sid, owner in owners.items() if owner == victim]
    assert taken_over
    fleet.workers[victim].proc.popen.send_signal(signal.SIGKILL)
    fleet.workers[victim].proc.popen.wait(10)
    others = [n for n in fleet.workers if n != victim]
    owners = await fleet.owners()
    drained = busiest(owners, others)
    assert any(o == drained for o in owners.values())
    before = await progress(fleet)
    fleet.workers[drained].drain()  # exits 0 having released every lease
    survivor = next(n for n in others if n != drained)
    await wait_until(lambda: fleet.all_owned(by={survivor}), 45, "the survivor holds all")
    # Where the kill landed inside a transaction, that stream waits out its lifetime.
    await wait_moving_on(fleet, before, "every stream delivering again",
                         TRANSACTION_LIFETIME_S + 30)

    fences = {sid: r.fence for sid, r in (await fleet.records()).items()}
    assert all((fences[sid] or 0) > 1 for sid in taken_over)  # new tenures, new fences
    metrics = fleet.workers[survivor].metrics()
    for kind in ("not_a_document", "too_large", "unstorable", "foreign_duplicate"):
        assert metrics[f'streamlease_mongodb_bad_input_total{{kind="{kind}"}}'] == 0
    assert metrics['streamlease_sink_batches_total{sink="mongodb"}'] > 0
    fleet.workers[survivor].drain()

    stored = await audit(fleet, client.get_database(name))
    assert min(stored.values()) > 10
    print(f"mongodb fleet: {sum(stored.values())} messages over {len(stored)} streams, "
          f"audited in {time.monotonic() - started:.1f} s")
