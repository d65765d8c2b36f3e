"""The ``mongodb://`` output against a real MongoDB wire server (tests/mongoserver.py), with
transactions (the server is a one-member replica set) and without (``transactions=off``,
the standalone ``mongod`` path)."""

from __future__ import annotations

import json
import logging
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from pymongo import AsyncMongoClient
from pymongo import errors as merr

from streamlease.core.frames import Frame
from streamlease.core.lease import LeaseTimings
from streamlease.core.model import StreamRecord, Tenure
from streamlease.core.sinks import MONGODB_BAD_INPUT, parse_sink
from streamlease.core.upstream import binary_text
from streamlease.dev.procs import free_port
from streamlease.errors import ConfigError, SinkConflict, SinkGaveUp, StaleFence
from streamlease.metrics import Metrics
from streamlease.processing import ProcessingSettings, ProcessorSink
from streamlease.processor import Context, Message, ProcessorFactory, TransactionalProcessor
from streamlease.sinks import open_output
from streamlease.sinks.files import output as file_output
from streamlease.sinks.mongodb import (
    MongoProcessor,
    MongoRefused,
    MongoUnavailable,
    MongoWriteUnknown,
    output,
    parse_settings,
    supports_transactions,
)
from streamlease.store.memory import MemoryStore
from tests.mongoserver import MongoServer

MODES = ["auto", "off"]  # with transactions (the server has them), and without


class Mongo:
    """One test's database on the session's server: a URL naming it and a direct client
    to look at what landed."""

    def __init__(self, server: MongoServer, client: AsyncMongoClient[dict[str, Any]]) -> None:
        self.server = server
        self.client = client
        self.database = f"t_{uuid.uuid4().hex[:12]}"
        self.db = client.get_database(self.database)

    def url(self, query: str = "", collection: str = "messages") -> str:
        base = self.server.url(f"{self.database}.{collection}")
        return f"{base}?{query}" if query else base

    async def docs(self, stream: str) -> list[dict[str, Any]]:
        cursor = self.db.messages.find({"stream_id": stream}).sort("seq", 1)
        return [doc async for doc in cursor]

    async def seqs(self, stream: str) -> list[int]:
        return [doc["seq"] for doc in await self.docs(stream)]

    async def checkpoint(self, stream: str) -> tuple[int, int] | None:
        doc = await self.db.streamlease_checkpoints.find_one({"_id": stream})
        return None if doc is None else (doc["fence"], doc["last_seq"])


@pytest.fixture
async def mongo(mongo_server: MongoServer) -> AsyncIterator[Mongo]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_server.url())
    view = Mongo(mongo_server, client)
    try:
        yield view
    finally:
        await client.drop_database(view.database)
        await client.close()


def ctx(stream: str, fence: int, after: int = 0) -> Context:
    return Context(stream_id=stream, fence=fence, owner=f"w{fence}", item={},
                   resume_after=after, checkpoint=after)


def data(seq: int) -> dict[str, Any]:
    return {"seq": seq, "s": "é", "nested": {"list": [1, 2.5, None]}}


def batch(first: int, last: int) -> list[Message]:
    return [Message(seq, data(seq), json.dumps(data(seq))) for seq in range(first, last + 1)]


def text(seq: int, body: str) -> Message:
    return Message.of_text(seq, body)


def mongo_processor(factory: ProcessorFactory) -> MongoProcessor:
    proc = factory()
    assert isinstance(proc, MongoProcessor)
    return proc


def bad_input(metrics: Metrics) -> dict[str, float]:
    found = {}
    for family in metrics.registry.collect():
        if family.name == "streamlease_mongodb_bad_input":
            found = {s.labels["kind"]: s.value for s in family.samples
                     if s.name.endswith("_total")}
    return found


async def test_a_batch_lands_documents_and_checkpoint_together(
        mongo: Mongo, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with output(parse_sink(mongo.url())) as factory:
        assert await mongo.checkpoint("s1") is None
        proc = factory()
        assert isinstance(proc, TransactionalProcessor) and proc.commits_checkpoint
        c = ctx("s1", 7)
        await proc.start(c)
        assert await mongo.checkpoint("s1") == (7, 0)  # claimed for fence 7
        assert await proc.committed(c) == 0
        await proc.process(batch(1, 3), c)
        assert await mongo.docs("s1") == [
            {"_id": f"s1:{s}", "stream_id": "s1", "seq": s, "fence": 7, "data": data(s)}
            for s in (1, 2, 3)]
        assert await mongo.checkpoint("s1") == (7, 3)
        assert await proc.committed(c) == 3
        c.checkpoint = 3
        await proc.process(batch(4, 4), c)
        assert await mongo.checkpoint("s1") == (7, 4)
        assert await mongo.seqs("s1") == [1, 2, 3, 4]
        await proc.stop(c, "shutdown")
    ready = [r for r in caplog.records if getattr(r, "sl_event", "") == "mongodb.ready"]
    assert ready and ready[0].sl_fields["transactions"] is True  # type: ignore[attr-defined]
    indexes = await mongo.db.messages.index_information()
    assert indexes["stream_id_seq"]["key"] == [("stream_id", 1), ("seq", 1)]


async def test_the_built_in_output_is_chosen_by_open_output(mongo: Mongo) -> None:
    async with open_output(parse_sink(mongo.url("checkpoints=cps"))) as factory:
        proc = factory()
        c = ctx("s1", 1)
        await proc.start(c)
        await proc.process(batch(1, 1), c)
    assert await mongo.db.cps.find_one({"_id": "s1"}) == {"_id": "s1", "fence": 1,
                                                          "last_seq": 1}
    assert await mongo.seqs("s1") == [1]


@pytest.mark.parametrize("mode", MODES)
async def test_a_retried_batch_that_landed_is_not_written_twice(mongo: Mongo, mode: str) -> None:
    async with output(parse_sink(mongo.url(f"transactions={mode}"))) as factory:
        proc = factory()
        c = ctx("s1", 3)
        await proc.start(c)
        await proc.process(batch(1, 3), c)
        # The write went through but its answer was lost: the worker sends it again,
        # still expecting checkpoint 0.
        await proc.process(batch(1, 3), c)
        assert await mongo.seqs("s1") == [1, 2, 3]
        assert await mongo.checkpoint("s1") == (3, 3)
        # A retry that carries more than what landed writes only the rest.
        await proc.process(batch(1, 5), c)
        assert await mongo.seqs("s1") == [1, 2, 3, 4, 5]
        assert await mongo.checkpoint("s1") == (3, 5)
        # A late retry of an older batch neither writes nor moves the checkpoint back.
        await proc.process(batch(1, 3), c)
        assert await mongo.seqs("s1") == [1, 2, 3, 4, 5]
        assert await mongo.checkpoint("s1") == (3, 5)


@pytest.mark.parametrize("mode", MODES)
async def test_a_zombie_is_fenced_out_after_a_newer_holder_starts(mongo: Mongo,
                                                                  mode: str) -> None:
    async with output(parse_sink(mongo.url(f"transactions={mode}"))) as factory:
        zombie, new = factory(), mongo_processor(factory)
        old_ctx = ctx("s1", 4)
        await zombie.start(old_ctx)
        await zombie.process(batch(1, 2), old_ctx)
        old_ctx.checkpoint = 2
        new_ctx = ctx("s1", 5)  # the lease moved on; the stream item said last_seq 0
        await new.start(new_ctx)
        assert await mongo.checkpoint("s1") == (5, 2)
        assert await new.committed(new_ctx) == 2  # resumes after what MongoDB holds
        with pytest.raises(StaleFence):
            await zombie.process(batch(3, 4), old_ctx)
        assert await mongo.seqs("s1") == [1, 2]
        assert await mongo.checkpoint("s1") == (5, 2)
        with pytest.raises(StaleFence):  # nor can it claim the stream back
            await factory().start(ctx("s1", 4))
        assert await mongo.checkpoint("s1") == (5, 2)
        new_ctx.checkpoint = 2
        await new.process(batch(3, 4), new_ctx)
        assert [(d["seq"], d["fence"]) for d in await mongo.docs("s1")] == [
            (1, 4), (2, 4), (3, 5), (4, 5)]
        # The same fence starting again (a restarted tenure) is not stale.
        await factory().start(ctx("s1", 5))
        assert await mongo.checkpoint("s1") == (5, 4)


class Faulty:
    """The messages' collection, with something happening right after each bulk write of a
    batch (in its transaction, if it has one): a newer holder's claim, a lost answer, a
    refusal."""

    def __init__(self, real: Any, after: Callable[[], Awaitable[None]]) -> None:
        self.real = real
        self.after = after

    async def bulk_write(self, ops: Any, **kwargs: Any) -> Any:
        result = await self.real.bulk_write(ops, **kwargs)
        await self.after()
        return result

    def find(self, *args: Any, **kwargs: Any) -> Any:
        return self.real.find(*args, **kwargs)


def with_faults(proc: MongoProcessor, after: Callable[[], Awaitable[None]]) -> MongoProcessor:
    """A processor like ``proc`` whose batch writes are followed by ``after``."""
    return MongoProcessor(replace(proc.out, messages=cast(Any, Faulty(proc.out.messages, after))))


def raced(factory: ProcessorFactory) -> tuple[MongoProcessor, MongoProcessor, Context]:
    """A holder whose first batch write is overtaken by a newer holder's claim (fence 2),
    and that newer holder, started, with its context."""
    newer, newer_ctx = mongo_processor(factory), ctx("s1", 2)
    claims: list[int] = []

    async def claim() -> None:
        if not claims:
            claims.append(newer_ctx.fence)
            await newer.start(newer_ctx)
    return with_faults(newer, claim), newer, newer_ctx


async def test_a_claim_racing_a_transaction_aborts_it_and_fences_the_holder_out(
        mongo: Mongo) -> None:
    async with output(parse_sink(mongo.url())) as factory:
        zombie, _, _ = raced(factory)
        c = ctx("s1", 1)
        await zombie.start(c)
        # The claim lands between the transaction's read and its checkpoint update: a
        # write conflict; tried again, the transaction finds fence 2.
        with pytest.raises(StaleFence):
            await zombie.process(batch(1, 3), c)
        assert await mongo.seqs("s1") == []  # the aborted transaction left nothing
        assert await mongo.checkpoint("s1") == (2, 0)


async def test_without_transactions_a_redelivered_message_lands_once(mongo: Mongo) -> None:
    """The standalone path: the stale holder's messages can land before its checkpoint is
    refused; the new holder delivers them again and each is there once."""
    metrics = Metrics()
    async with output(parse_sink(mongo.url("transactions=off"))) as factory:
        zombie, new, new_ctx = raced(factory)
        zombie.use_metrics(metrics)
        c = ctx("s1", 1)
        await zombie.start(c)
        with pytest.raises(StaleFence):
            await zombie.process(batch(1, 3), c)
        # Its documents landed under fence 1; its checkpoint did not move.
        assert [(d["seq"], d["fence"]) for d in await mongo.docs("s1")] == [
            (1, 1), (2, 1), (3, 1)]
        cp = await mongo.db.streamlease_checkpoints.find_one({"_id": "s1"})
        assert cp is not None and (cp["fence"], cp["last_seq"], cp["writing_seq"]) == (2, 0, 3)
        new.use_metrics(metrics)
        assert await new.committed(new_ctx) == 0
        await new.process(batch(1, 4), new_ctx)
        docs = await mongo.docs("s1")
        assert [(d["seq"], d["fence"]) for d in docs] == [(1, 1), (2, 1), (3, 1), (4, 2)]
        assert await mongo.db.messages.count_documents({}) == 4
        assert await mongo.checkpoint("s1") == (2, 4)
    assert bad_input(metrics)["foreign_duplicate"] == 0  # the same messages: not foreign


def losing_one_answer(proc: MongoProcessor) -> tuple[MongoProcessor, list[str]]:
    """``proc`` whose connection drops once, right after its messages were upserted and
    before the checkpoint moved: the answer is lost."""
    lost: list[str] = []

    async def drop() -> None:
        if not lost:
            lost.append("lost")
            raise merr.AutoReconnect("connection closed (injected)")
    return with_faults(proc, drop), lost


async def test_without_transactions_a_retry_after_a_lost_answer_lands_once(
        mongo: Mongo) -> None:
    async with output(parse_sink(mongo.url("transactions=off"))) as factory:
        proc, _ = losing_one_answer(mongo_processor(factory))
        c = ctx("s1", 1)
        await proc.start(c)
        with pytest.raises(MongoWriteUnknown) as unknown:
            await proc.process(batch(1, 3), c)
        assert unknown.value.retriable
        assert await mongo.seqs("s1") == [1, 2, 3]  # landed, checkpoint behind
        assert await mongo.checkpoint("s1") == (1, 0)
        await proc.process(batch(1, 3), c)  # the worker sends the batch again
        assert await mongo.seqs("s1") == [1, 2, 3]
        assert await mongo.checkpoint("s1") == (1, 3)


async def test_with_transactions_a_lost_connection_is_tried_again_inside(
        mongo: Mongo) -> None:
    async with output(parse_sink(mongo.url())) as factory:
        proc, lost = losing_one_answer(mongo_processor(factory))
        c = ctx("s1", 1)
        await proc.start(c)
        await proc.process(batch(1, 3), c)  # the first transaction aborted, the next one won
        assert lost == ["lost"]
        assert await mongo.seqs("s1") == [1, 2, 3]
        assert await mongo.checkpoint("s1") == (1, 3)


async def test_a_transaction_failing_midway_leaves_neither_documents_nor_checkpoint(
        mongo: Mongo) -> None:
    async def refuse() -> None:
        raise merr.OperationFailure("refused (injected) secret-payload", code=2)

    async with output(parse_sink(mongo.url())) as factory:
        proc = with_faults(mongo_processor(factory), refuse)
        c = ctx("s1", 1)
        await proc.start(c)
        with pytest.raises(MongoRefused) as refused:
            await proc.process(batch(1, 3), c)
        assert "code 2" in str(refused.value) and "secret-payload" not in str(refused.value)
        assert await mongo.seqs("s1") == []
        assert await mongo.checkpoint("s1") == (1, 0)


async def test_a_checkpoint_moved_back_outside_the_protocol_is_a_conflict(mongo: Mongo) -> None:
    async with output(parse_sink(mongo.url())) as factory:
        proc = factory()
        c = ctx("s1", 2)
        await proc.start(c)
        await proc.process(batch(1, 3), c)
        c.checkpoint = 3
        await mongo.db.streamlease_checkpoints.update_one({"_id": "s1"},
                                                         {"$set": {"last_seq": 1}})
        with pytest.raises(SinkConflict):
            await proc.process(batch(4, 5), c)
        assert await mongo.seqs("s1") == [1, 2, 3]


async def test_committed_after_a_crash_before_the_stream_item_checkpoint(mongo: Mongo) -> None:
    """The old holder's batch landed in MongoDB, then it died before the worker moved
    ``last_seq`` on the stream item: the new holder resumes after MongoDB's."""
    async with output(parse_sink(mongo.url())) as factory:
        old = factory()
        c = ctx("s1", 1)
        await old.start(c)
        await old.process(batch(1, 6), c)  # ... and the worker dies here
        sink = ProcessorSink(factory, MemoryStore().stores().leases, Metrics(),
                             ProcessingSettings("mongodb"))
        tenure = Tenure("s1", "w2", fence=2, last_seq=0, expires_at_ms=0)
        resumed = await sink.open(tenure, StreamRecord("s1", "STARTED", "ws://127.0.0.1/x"))
        assert resumed == 6
        assert await mongo.checkpoint("s1") == (2, 6)
        with pytest.raises(StaleFence):
            await old.process(batch(7, 7), Context("s1", 1, "w1", {}, 6, 6))
        await sink.close(tenure, "shutdown")
    assert await mongo.seqs("s1") == [1, 2, 3, 4, 5, 6]


async def test_stopped_after_lost_writes_nothing(mongo: Mongo) -> None:
    async with output(parse_sink(mongo.url())) as factory:
        proc = factory()
        c = ctx("s1", 1)
        await proc.start(c)
        await proc.stop(c, "lost")
        with pytest.raises(StaleFence):
            await proc.process(batch(1, 1), c)
    assert await mongo.seqs("s1") == []
    assert await mongo.checkpoint("s1") == (1, 0)


async def test_it_refuses_to_be_a_dead_letter_destination(mongo: Mongo) -> None:
    async with output(parse_sink(mongo.url())) as factory:
        proc = factory()
        c = ctx("s1", 1)
        await proc.start(c)
        c.failure = "ProcessorFailed: boom"
        with pytest.raises(ConfigError, match="dead-letter"):
            await proc.process(batch(1, 1), c)
    assert await mongo.seqs("s1") == []
    assert await mongo.checkpoint("s1") == (1, 0)


# -- bad input ------------------------------------------------------------------------------


async def test_messages_that_are_not_documents_are_stored_wrapped(
        mongo: Mongo, caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    assert bad_input(metrics) == dict.fromkeys(MONGODB_BAD_INPUT, 0.0)
    messages = [text(1, '{"seq": 1}'), text(2, "[1, 2, 3]"), text(3, '"just a string"'),
                text(4, "42"), text(5, binary_text(b"\x00\xffraw")), text(6, "not json {")]
    async with output(parse_sink(mongo.url())) as factory:
        proc = factory()
        assert isinstance(proc, MongoProcessor)
        proc.use_metrics(metrics)
        c = ctx("s1", 1)
        await proc.start(c)
        await proc.process(messages, c)
        c.checkpoint = 6
        await proc.process([text(7, "[4]")], c)
    docs = {d["seq"]: d for d in await mongo.docs("s1")}
    assert [(docs[s]["data"], docs[s].get("wrapped")) for s in range(1, 8)] == [
        ({"seq": 1}, None), ([1, 2, 3], "array"), ("just a string", "scalar"), (42, "scalar"),
        (b"\x00\xffraw", "binary"), ("not json {", "text"), ([4], "array")]
    assert bad_input(metrics)["not_a_document"] == 6
    logged = [r.sl_fields for r in caplog.records  # type: ignore[attr-defined]
              if getattr(r, "sl_event", "") == "mongodb.not_a_document"]
    # Once a tenure for each kind: a binary feed would otherwise log every batch.
    assert sorted(f["wrapped"] for f in logged) == ["array", "binary", "scalar", "text"]
    assert await mongo.checkpoint("s1") == (1, 7)


def oversize(seq: int) -> Message:
    return text(seq, json.dumps({"seq": seq, "blob": "x" * (16 * 1024 * 1024)}))


async def test_an_oversize_document_refuses_the_batch_then_the_stream_stops(
        mongo: Mongo, caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    metrics = Metrics()
    async with output(parse_sink(mongo.url())) as factory:
        got = await held_stream(store)
        sink = ProcessorSink(factory, store.stores().leases, metrics,
                             ProcessingSettings("mongodb", max_attempts=2))
        assert await sink.open(got.tenure, got.record) == 0
        frames = [Frame(1, '{"seq": 1}'), Frame(2, oversize(2).text), Frame(3, '{"seq": 3}')]
        with pytest.raises(Exception) as first:
            await sink.write_batch(got.tenure, 0, frames, 0)
        assert "MongoRefused" in str(first.value) and "over MongoDB's limit" in str(first.value)
        with pytest.raises(SinkGaveUp) as gave_up:  # no dead-letter sink: the stream stops
            await sink.write_batch(got.tenure, 0, frames, 0)
        assert "xxxx" not in str(gave_up.value)
        await sink.close(got.tenure, "error")
    assert await mongo.seqs("a") == []  # nothing of the batch was written
    assert await mongo.checkpoint("a") == (got.tenure.fence, 0)
    assert bad_input(metrics)["too_large"] == 1  # once, not once an attempt
    assert [r for r in caplog.records if getattr(r, "sl_event", "") == "mongodb.too_large"]


async def test_an_oversize_batch_dead_lettered_moves_the_checkpoint_past_it(
        mongo: Mongo, tmp_path: Path) -> None:
    store = MemoryStore()
    async with output(parse_sink(mongo.url())) as factory, \
            file_output(parse_sink(f"file://{tmp_path}")) as dead:
        got = await held_stream(store)
        sink = ProcessorSink(factory, store.stores().leases, Metrics(),
                             ProcessingSettings("mongodb", max_attempts=1), dead)
        await sink.open(got.tenure, got.record)
        await sink.write_batch(got.tenure, 0, [Frame(1, '{"seq": 1}')], 0)
        await sink.write_batch(got.tenure, 1, [Frame(2, oversize(2).text)], 0)
        # The next batch follows on: MongoDB's checkpoint moved past the dead letter.
        await sink.write_batch(got.tenure, 2, [Frame(3, '{"seq": 3}')], 0)
        await sink.close(got.tenure, "shutdown")
    assert await mongo.seqs("a") == [1, 3]
    assert await mongo.checkpoint("a") == (got.tenure.fence, 3)
    dead_lines = (tmp_path / "a.jsonl").read_text().splitlines()
    assert [json.loads(line)["seq"] for line in dead_lines] == [2]


async def held_stream(store: MemoryStore) -> Any:
    """Stream ``a`` held by ``w1`` in the in-memory store (whose checkpoint is fenced)."""
    await store.put_started("a", "wss://feeds.example.com/a")
    got = await store.acquire("a", "w1", 100_000, LeaseTimings(
        lease_s=10.0, heartbeat_s=2.0, skew_margin_s=1.0, safety_margin_s=1.0))
    assert got is not None
    return got


@pytest.mark.parametrize("body", ['{"a\\u0000b": "secret-payload"}',
                                  '{"n": 18446744073709551616, "p": "secret-payload"}'],
                         ids=["nul-in-key", "int-over-64-bits"])
async def test_a_message_bson_cannot_hold_refuses_the_batch(mongo: Mongo, body: str) -> None:
    metrics = Metrics()
    async with output(parse_sink(mongo.url())) as factory:
        proc = factory()
        assert isinstance(proc, MongoProcessor)
        proc.use_metrics(metrics)
        c = ctx("s1", 1)
        await proc.start(c)
        with pytest.raises(MongoRefused) as refused:
            await proc.process([text(1, '{"seq": 1}'), text(2, body)], c)
        assert "seq 2" in str(refused.value) and "secret-payload" not in str(refused.value)
    assert await mongo.seqs("s1") == []
    assert bad_input(metrics)["unstorable"] == 1


@pytest.mark.parametrize("mode", MODES)
async def test_a_foreign_document_at_a_messages_id_is_left_alone_and_counted(
        mongo: Mongo, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    foreign = {"_id": "s1:2", "stream_id": "s1", "seq": 2, "fence": 99, "data": {"other": 1}}
    await mongo.db.messages.insert_one(foreign)
    metrics = Metrics()
    async with output(parse_sink(mongo.url(f"transactions={mode}"))) as factory:
        proc = factory()
        assert isinstance(proc, MongoProcessor)
        proc.use_metrics(metrics)
        c = ctx("s1", 1)
        await proc.start(c)
        await proc.process(batch(1, 3), c)
    docs = await mongo.docs("s1")
    assert docs[1] == foreign  # left alone
    assert [(d["seq"], d["data"]) for d in docs] == [(1, data(1)), (2, {"other": 1}),
                                                     (3, data(3))]
    assert await mongo.checkpoint("s1") == (1, 3)
    assert bad_input(metrics)["foreign_duplicate"] == 1
    logged = [r.sl_fields for r in caplog.records  # type: ignore[attr-defined]
              if getattr(r, "sl_event", "") == "mongodb.foreign_duplicate"]
    assert logged == [{"stream": "s1", "fence": 1, "seq": 2, "id": "s1:2", "differs": "data"}]


async def test_the_worker_hands_its_metrics_to_the_output(mongo: Mongo) -> None:
    metrics = Metrics()
    async with output(parse_sink(mongo.url())) as factory:
        store = MemoryStore()
        got = await held_stream(store)
        sink = ProcessorSink(factory, store.stores().leases, metrics,
                             ProcessingSettings("mongodb"))
        await sink.open(got.tenure, got.record)
        await sink.write_batch(got.tenure, 0, [Frame(1, "[1]")], 0)
        await sink.close(got.tenure, "shutdown")
    assert bad_input(metrics)["not_a_document"] == 1


# -- configuration and failures --------------------------------------------------------------


@pytest.mark.parametrize("query, says", [
    ("checkpoints=bad$name", "checkpoints="),
    ("checkpoints=system.x", "checkpoints="),
    ("checkpoints=messages", "another collection"),
    ("checkpoints=a&checkpoints=b", "more than once"),
    ("transactions=maybe", "transactions="),
    ("w=0", "w=0"),
    ("checkpoints", "malformed"),
    ("noSuchOption=1", "not a usable MongoDB URL"),
    ("w=majority&journal=sometimes", "not a usable MongoDB URL"),
])
async def test_a_bad_url_parameter_is_a_config_error(query: str, says: str) -> None:
    # Refused before anything is dialled: nothing listens on port 9.
    url = f"mongodb://streamlease:pw-5ecr3t@127.0.0.1:9/db.messages?{query}"
    with pytest.raises(ConfigError) as refused:
        async with output(parse_sink(url)):
            pass
    assert says in str(refused.value)
    assert "STREAMLEASE_SINK" in str(refused.value)
    assert "pw-5ecr3t" not in str(refused.value)


def test_settings_take_out_the_outputs_own_parameters_and_keep_the_url_s_choices() -> None:
    settings = parse_settings(parse_sink(
        "mongodb://u:p%40ss@127.0.0.1:9,127.0.0.2/db.msgs?checkpoints=cps&replicaSet=rs0"
        "&transactions=off&readConcernLevel=local&authMechanismProperties=AWS_SESSION_TOKEN:tok"))
    assert (settings.database, settings.collection, settings.checkpoints,
            settings.transactions) == ("db", "msgs", "cps", "off")
    assert settings.client_url == (
        "mongodb://u:p%40ss@127.0.0.1:9,127.0.0.2/db.msgs?replicaSet=rs0"
        "&readConcernLevel=local&authMechanismProperties=AWS_SESSION_TOKEN:tok")
    # Majority and journaled writes unless the URL says otherwise; its read concern kept.
    assert dict(settings.defaults) == {"w": "majority", "journal": True, "timeoutMS": 10000,
                                       "appname": "streamlease"}
    assert settings.redact("p%40ss p@ss AWS_SESSION_TOKEN:tok") == "*** *** ***"
    own = parse_settings(parse_sink("mongodb://h/db.m?w=1&journal=false&timeoutMS=500"))
    assert dict(own.defaults) == {"readConcernLevel": "majority", "appname": "streamlease"}


@pytest.mark.parametrize("hello, has", [
    ({"setName": "rs0", "maxWireVersion": 21, "logicalSessionTimeoutMinutes": 30}, True),
    ({"msg": "isdbgrid", "maxWireVersion": 21, "logicalSessionTimeoutMinutes": 30}, True),
    ({"maxWireVersion": 21, "logicalSessionTimeoutMinutes": 30}, False),  # standalone
    ({"setName": "rs0", "maxWireVersion": 21}, False),  # no sessions
    ({"setName": "rs0", "maxWireVersion": 6, "logicalSessionTimeoutMinutes": 30}, False),
    ({"msg": "isdbgrid", "maxWireVersion": 7, "logicalSessionTimeoutMinutes": 30}, False),
], ids=["replica-set", "mongos", "standalone", "no-sessions", "old-replica-set", "old-mongos"])
def test_transactions_are_used_where_the_server_has_them(hello: dict[str, Any],
                                                         has: bool) -> None:
    assert supports_transactions(hello) is has


async def test_transactions_on_is_accepted_where_the_server_has_them(mongo: Mongo) -> None:
    async with output(parse_sink(mongo.url("transactions=on"))) as factory:
        proc = factory()
        assert isinstance(proc, MongoProcessor) and proc.out.transactions


async def test_unreachable_at_start_up_is_retriable_not_config() -> None:
    url = f"mongodb://u:pw-5ecr3t@127.0.0.1:{free_port()}/db.m?serverSelectionTimeoutMS=300"
    with pytest.raises(MongoUnavailable) as down:
        async with output(parse_sink(url)):
            pass
    assert down.value.retriable
    assert "pw-5ecr3t" not in str(down.value)


async def test_a_server_gone_during_a_batch_is_a_retriable_store_error(
        mongo: Mongo, mongo_server: MongoServer) -> None:
    async with output(parse_sink(mongo.url("timeoutMS=1500"))) as factory:
        proc = factory()
        c = ctx("s1", 1)
        await proc.start(c)
        await proc.process(batch(1, 2), c)
        c.checkpoint = 2
        mongo_server.stop()
        try:
            with pytest.raises(MongoWriteUnknown) as unknown:
                await proc.process(batch(3, 4), c)
            assert unknown.value.retriable
        finally:
            mongo_server.start()
        await proc.process(batch(3, 4), c)  # the same batch, once the server is back
    assert await mongo.seqs("s1") == [1, 2, 3, 4]
    assert await mongo.checkpoint("s1") == (1, 4)


async def test_without_pymongo_the_output_names_the_setting_and_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pymongo", None)
    monkeypatch.delitem(sys.modules, "streamlease.sinks.mongodb")
    with pytest.raises(ConfigError) as missing:
        async with open_output(parse_sink("mongodb://u:pw-5ecr3t@127.0.0.1:9/db.m")):
            pass
    assert "STREAMLEASE_SINK" in str(missing.value)
    assert "pip install 'streamlease[mongodb]'" in str(missing.value)
    assert "pw-5ecr3t" not in str(missing.value)


async def test_credentials_never_appear_in_logs(mongo: Mongo,
                                                caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    password, wrong = "r1ght-pw-77e2", "wr0ng-pw-4d1e"
    await mongo.db.command("createUser", "writer", pwd=password, roles=["readWrite"])
    url = mongo.url().replace("mongodb://", f"mongodb://writer:{password}@")
    errors: list[str] = []
    async with output(parse_sink(url)) as factory:  # index created, ready logged
        proc = factory()
        c = ctx("s1", 2)
        await proc.start(c)
        await proc.process(batch(1, 2), c)
        with pytest.raises(StaleFence) as stale:
            await proc.process(batch(3, 3), ctx("s1", 1, 2))
        errors.append(str(stale.value))
        with pytest.raises(StaleFence) as stale:
            await factory().start(ctx("s1", 1))
        errors.append(str(stale.value))
    with pytest.raises(MongoUnavailable) as refused:
        async with output(parse_sink(url.replace(password, wrong))):
            pass
    errors.append(str(refused.value))
    assert "Authentication failed" in errors[-1] or "authentication failed" in errors[-1]
    with pytest.raises(ConfigError) as bad:
        async with output(parse_sink(url + "?transactions=x")):
            pass
    errors.append(str(bad.value))
    assert any(r.getMessage() == "MongoDB output ready" for r in caplog.records)
    logged = caplog.text + " ".join(str(getattr(r, "sl_fields", "")) for r in caplog.records)
    for secret in (password, wrong):
        assert secret not in logged
        assert all(secret not in e for e in errors)
    assert "127.0.0.1" in logged  # the host is logged, the credentials are not



async def test_without_transactions_a_stale_holders_uncommitted_documents_are_replaced(
        mongo: Mongo) -> None:
    """A stale holder landed documents after its claim and had its checkpoint refused; a
    feed that numbers its own frames gives the new holder other messages at those seqs.
    The new tenure's messages replace them: nothing of it is lost (found by a review)."""
    metrics = Metrics()
    async with output(parse_sink(mongo.url("transactions=off"))) as factory:
        proc = mongo_processor(factory)
        proc.use_metrics(metrics)
        c = ctx("s1", 2)
        await proc.start(c)
        stale = {"stream_id": "s1", "fence": 1, "data": {"old": True}}
        await mongo.db.messages.insert_many([
            {"_id": "s1:1", "seq": 1, **stale}, {"_id": "s1:2", "seq": 2, **stale}])
        # What a writer with a higher fence (or another writer) put there stays.
        await mongo.db.messages.insert_one({"_id": "s1:3", "stream_id": "s1", "seq": 3,
                                            "fence": 9, "data": {"other": True}})
        await proc.process(batch(1, 3), c)
    docs = await mongo.docs("s1")
    assert [(d["seq"], d["fence"], d["data"]) for d in docs] == [
        (1, 2, data(1)), (2, 2, data(2)), (3, 9, {"other": True})]
    assert await mongo.checkpoint("s1") == (2, 3)
    assert bad_input(metrics)["foreign_duplicate"] == 1


async def test_a_message_with_a_lone_surrogate_is_unstorable_not_a_crash(mongo: Mongo) -> None:
    metrics = Metrics()
    async with output(parse_sink(mongo.url())) as factory:
        proc = mongo_processor(factory)
        proc.use_metrics(metrics)
        c = ctx("s1", 1)
        await proc.start(c)
        lone = Message(1, {"a": "\ud800"}, '{"a":"\\ud800"}')
        with pytest.raises(MongoRefused, match="BSON cannot hold it"):
            await proc.process([lone], c)
    assert bad_input(metrics)["unstorable"] == 1
    assert await mongo.seqs("s1") == []
