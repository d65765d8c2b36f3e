"""The ``mongodb://`` output: each message lands once; the checkpoint moves under the fence.

docs/sinks.md ("mongodb") states the URL and its parameters, the documents, both write
paths (one transaction a batch where the server has transactions; three single-document
steps on a standalone ``mongod``), the bad input and the failures. In short: ``start``
claims the stream's checkpoint document for its fence, so every write of an older holder is
refused from then on; ``committed`` reads its ``last_seq``, so a new holder resumes after the
last batch MongoDB holds; ``stop`` writes nothing.

This module is the only one that imports pymongo for the sink (the ``mongodb`` extra).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import bson
from bson.raw_bson import RawBSONDocument
from pymongo import AsyncMongoClient, UpdateOne
from pymongo import errors as merr
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase

from streamlease.core.sinks import (
    MONGODB_CHECKPOINTS,
    SinkSpec,
    mongodb_collection_problem,
    split_mongodb,
)
from streamlease.errors import (
    ConfigError,
    SinkConflict,
    StaleFence,
    StoreUnavailable,
    StreamleaseError,
)
from streamlease.logs import event
from streamlease.processor import Context, Message, ProcessorFactory
from streamlease.sinks import Redacting
from streamlease.store.mongoclient import driver_warnings

if TYPE_CHECKING:
    from streamlease.metrics import Metrics

Doc = dict[str, Any]
Session = AsyncClientSession | None  # None: no transaction

SETTING = "STREAMLEASE_SINK"
OWN_PARAMS = ("checkpoints", "transactions")
TRANSACTION_MODES = ("auto", "on", "off")
DEFAULT_TIMEOUT_MS = 10_000
DEFAULT_MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
TRANSACTION_ATTEMPTS = 3  # a transient transaction error is tried again this many times
INDEX_NAME = "stream_id_seq"
# Query options whose values may be secrets (redacted from every error).
SENSITIVE_OPTIONS = ("password", "authmechanismproperties", "tlscertificatekeyfilepassword")
# Codes of the server's answers this output acts on.
UNAUTHORIZED = 13
COMMAND_NOT_FOUND = 59
INDEX_EXISTS_OTHERWISE = (85, 86)  # the same keys under another name or options
DUPLICATE_KEY = 11000
# Where the URL is silent: (option as the URL spells it, lower-cased; client keyword; value).
DEFAULTS: tuple[tuple[tuple[str, ...], str, Any], ...] = (
    (("w",), "w", "majority"),
    (("journal", "j"), "journal", True),
    (("readconcernlevel",), "readConcernLevel", "majority"),
    (("timeoutms", "sockettimeoutms", "wtimeoutms"), "timeoutMS", DEFAULT_TIMEOUT_MS),
    (("appname",), "appname", "streamlease"),
)
FIELDS = ("stream_id", "seq", "data", "wrapped")  # what makes a stored message this one


class MongoUnavailable(StreamleaseError):
    """MongoDB could not be reached or refused the login at start-up (the message names the
    cause, never the URL's credentials). Retrying later may succeed."""

    retriable = True


class MongoWriteUnknown(StoreUnavailable):
    """A batch's or a claim's write got no answer: the connection failed, no server could
    be selected in time, or a transaction kept hitting transient errors. Nothing or all of
    a batch landed (with transactions), or a part (without): the batch is sent again, and
    what is there is not written twice."""


class MongoRefused(StreamleaseError):
    """MongoDB cannot take a batch: a document over its size limit, one BSON cannot hold,
    or an answer refusing it (with its code). The message gives the seq and the reason,
    never the payload."""


@dataclass(frozen=True)
class MongoSettings(Redacting):
    client_url: str = field(repr=False)  # the URL without this output's parameters
    database: str
    collection: str
    checkpoints: str = MONGODB_CHECKPOINTS
    transactions: str = "auto"
    defaults: tuple[tuple[str, Any], ...] = ()  # client options the URL leaves unset
    secrets: tuple[str, ...] = field(default=(), repr=False)


def parse_settings(spec: SinkSpec) -> MongoSettings:
    """This output's settings from the sink URL; ConfigError naming every problem, never
    echoing the credentials."""
    try:
        url = split_mongodb(spec.url)
    except ValueError as exc:
        raise ConfigError([f"{SETTING}: {exc}"]) from None
    problems: list[str] = []
    secrets: set[str] = set()
    password = url.authority.rpartition("@")[0].partition(":")[2]
    if password:
        secrets |= {password, unquote(password)}
    sep = ";" if ";" in url.query and "&" not in url.query else "&"
    own: dict[str, str] = {}
    rest: list[str] = []
    given: set[str] = set()
    for pair in url.query.split(sep) if url.query else []:
        key, eq, value = pair.partition("=")
        name = unquote(key).lower()
        if not eq or not name:
            problems.append(f"{SETTING}: the query string of {spec.describe()} is malformed "
                            "(expected name=value pairs joined by &)")
            continue
        if name in SENSITIVE_OPTIONS and value:
            secrets |= {value, unquote(value)}
        if name not in OWN_PARAMS:
            rest.append(pair)
            given.add(name)
            if name == "w" and unquote(value) == "0":
                problems.append(f"{SETTING}: w=0 (unacknowledged writes) cannot tell that a "
                                "batch landed; use w=1, w=majority or leave it out")
            continue
        if name in own:
            problems.append(f"{SETTING}: {name}= is given more than once")
        own[name] = unquote(value)
    checkpoints = own.get("checkpoints", MONGODB_CHECKPOINTS)
    problem = mongodb_collection_problem(url.database, checkpoints)
    if problem:
        problems.append(f"{SETTING}: checkpoints= must be a MongoDB collection name: it "
                        f"{problem}")
    elif checkpoints == url.collection:
        problems.append(f"{SETTING}: checkpoints= must name another collection than the "
                        "messages'")
    mode = own.get("transactions", "auto")
    if mode not in TRANSACTION_MODES:
        problems.append(f"{SETTING}: transactions= must be one of "
                        f"{', '.join(TRANSACTION_MODES)}")
    if problems:
        raise ConfigError(problems)
    query = f"?{sep.join(rest)}" if rest else ""
    defaults = tuple((keyword, value) for names, keyword, value in DEFAULTS
                     if not given.intersection(names))
    return MongoSettings(client_url=f"{url.scheme}://{url.authority}/{url.path}{query}",
                         database=url.database, collection=url.collection,
                         checkpoints=checkpoints, transactions=mode, defaults=defaults,
                         secrets=tuple(sorted(secrets, key=len, reverse=True)))


def supports_transactions(hello: Mapping[str, Any]) -> bool:
    """Whether the server ``hello`` describes runs multi-document transactions: a replica
    set member (``setName``, wire version 7: MongoDB 4.0) or a ``mongos`` (``msg:
    isdbgrid``, wire version 8: 4.2), with sessions. A standalone ``mongod`` has none."""
    if hello.get("logicalSessionTimeoutMinutes") is None:
        return False
    wire = int(hello.get("maxWireVersion", 0))
    if hello.get("msg") == "isdbgrid":
        return wire >= 8
    return "setName" in hello and wire >= 7


def stored_data(message: Message) -> tuple[Any, str | None]:
    """What a message's document holds under ``data``, and ``wrapped`` (None for a JSON
    object, the usual case)."""
    payload = message.bytes
    if payload is not None:
        return payload, "binary"
    try:
        data = message.data
    except (ValueError, RecursionError):
        return message.text, "text"
    if isinstance(data, dict):
        return data, None
    return data, "array" if isinstance(data, list) else "scalar"


@dataclass(frozen=True)
class _Doc:
    """One message's document: as Python values (to compare with what is stored) and as
    BSON without its ``_id`` (what is written)."""

    id: str
    seq: int
    body: dict[str, Any]
    raw: RawBSONDocument


@dataclass
class _Written:
    inserted: list[_Doc] = field(default_factory=list)
    foreign: list[tuple[_Doc, list[str]]] = field(default_factory=list)


def _no_answer(exc: merr.PyMongoError) -> bool:
    """True if the write's outcome is unknown and trying again is the remedy."""
    return (isinstance(exc, merr.ConnectionFailure | merr.WriteConcernError)
            or exc.timeout
            or any(exc.has_error_label(label) for label in (
                "TransientTransactionError", "UnknownTransactionCommitResult",
                "RetryableWriteError")))


def _code(exc: merr.PyMongoError) -> str:
    """The server's code for a refusal (the first write error's in a bulk write)."""
    if isinstance(exc, merr.BulkWriteError):
        errors = exc.details.get("writeErrors") or [{}]
        return str(errors[0].get("code", "?"))
    return str(getattr(exc, "code", None) or "?")


def _uncounted(kind: str, count: int = 1) -> None:
    return None


@dataclass(frozen=True)
class MongoOutput:
    """What every tenure's processor shares: the worker's client and collections."""

    client: AsyncMongoClient[Doc]
    messages: AsyncCollection[Doc]
    checkpoints: AsyncCollection[Doc]
    settings: MongoSettings
    transactions: bool
    max_document_bytes: int = DEFAULT_MAX_DOCUMENT_BYTES


class MongoProcessor:
    """One tenure's processor; the client is the worker's, shared by every tenure."""

    commits_checkpoint = True

    def __init__(self, out: MongoOutput) -> None:
        self.out = out
        self.stopped = False
        self.count: Callable[[str, int], None] = _uncounted
        self._refused: set[int] = set()  # seqs already counted as refused in this tenure
        self._noted: set[str] = set()  # wrapped kinds already logged in this tenure

    def use_metrics(self, metrics: Metrics) -> None:
        self.count = metrics.mongodb_bad_input

    async def start(self, ctx: Context) -> None:
        """Claim the stream for ``ctx.fence``: older holders' writes are refused from now
        on. StaleFence if a newer fence already claimed it."""
        sid = ctx.stream_id
        try:
            with contextlib.suppress(merr.DuplicateKeyError):  # a fence not below ours
                await self.out.checkpoints.find_one_and_update(
                    {"_id": sid, "fence": {"$lt": ctx.fence}},
                    {"$set": {"fence": ctx.fence}, "$setOnInsert": {"last_seq": ctx.resume_after}},
                    upsert=True)
                return
            found = await self.out.checkpoints.find_one({"_id": sid})
        except merr.PyMongoError as exc:
            raise self._failure(exc, f"stream {sid}: claiming its checkpoint") from None
        if found is not None and int(found["fence"]) > ctx.fence:
            raise self._stale(ctx, int(found["fence"]), "claim")

    async def committed(self, ctx: Context) -> int:
        """The last seq MongoDB holds for the stream (0 if none)."""
        try:
            found = await self.out.checkpoints.find_one({"_id": ctx.stream_id})
        except merr.PyMongoError as exc:
            raise self._failure(exc, f"stream {ctx.stream_id}: reading its checkpoint") \
                from None
        return int(found["last_seq"]) if found is not None else 0

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        if not batch:
            return
        if self.stopped:
            raise StaleFence(f"stream {ctx.stream_id}: the tenure of fence {ctx.fence} "
                             "has ended")
        if ctx.failure is not None:
            # Dead-lettered batches have no place in a collection whose checkpoint is the
            # stream's: the batch then fails with this, and the stream stops saying so.
            raise ConfigError([f"{SETTING}: the mongodb output cannot be a dead-letter "
                               "destination (STREAMLEASE_DEAD_LETTER); use another output"])
        docs = [self._document(m, ctx) for m in batch]
        try:
            if self.out.transactions:
                written = await self._in_transaction(docs, ctx)
            else:
                written = await self._write(docs, ctx, None)
        except merr.PyMongoError as exc:
            raise self._failure(exc, f"stream {ctx.stream_id}: seq "
                                     f"{batch[0].seq}..{batch[-1].seq}") from None
        self._report(written, ctx)

    async def dead_lettered(self, batch: Sequence[Message], ctx: Context) -> None:
        """The batch failed every attempt and went to the dead-letter output: the
        checkpoint moves past it under the fence, no document written, so the next batch
        follows on as it does on the stream item."""
        sid, last = ctx.stream_id, batch[-1].seq
        try:
            # ``$max``: told twice (a retry whose first answer was lost), it moves once.
            moved = await self.out.checkpoints.update_one(
                {"_id": sid, "fence": ctx.fence, "last_seq": {"$gte": ctx.checkpoint}},
                {"$max": {"last_seq": last}})
            if moved.matched_count != 1:
                await self._refuse(ctx, batch[0].seq, last, None)
        except merr.PyMongoError as exc:
            raise self._failure(exc, f"stream {sid}: moving its checkpoint past a "
                                     "dead-lettered batch") from None
        event(logging.WARNING, "mongodb.skipped",
              "a dead-lettered batch: the checkpoint moved past it, no document written",
              stream=sid, fence=ctx.fence, first_seq=batch[0].seq, last_seq=last)

    async def stop(self, ctx: Context, reason: str) -> None:
        self.stopped = True  # nothing to write: every batch moved its checkpoint itself

    # -- one batch -------------------------------------------------------------------------

    def _document(self, message: Message, ctx: Context) -> _Doc:
        """The message's document, encoded; MongoRefused (counted once a tenure) if BSON
        cannot hold it or it is over the server's limit."""
        data, wrapped = stored_data(message)
        body: dict[str, Any] = {"stream_id": ctx.stream_id, "seq": message.seq,
                                "fence": ctx.fence, "data": data}
        if wrapped is not None:
            body["wrapped"] = wrapped
        doc_id = f"{ctx.stream_id}:{message.seq}"
        try:
            encoded = bson.encode(body)
        except (bson.InvalidDocument, OverflowError, RecursionError, ValueError) as exc:
            # The library's message can quote the payload: keep only its type.
            raise self._refused_input(ctx, message.seq, "unstorable",
                                      f"BSON cannot hold it ({type(exc).__name__})") from None
        # The stored document: the ``_id`` element (type, "_id\0", length, text, NUL) first.
        size = len(encoded) + 10 + len(doc_id.encode())
        if size > self.out.max_document_bytes:
            raise self._refused_input(ctx, message.seq, "too_large",
                                      f"its document is {size} bytes, over MongoDB's "
                                      f"limit of {self.out.max_document_bytes}")
        return _Doc(doc_id, message.seq, body, RawBSONDocument(encoded))

    def _refused_input(self, ctx: Context, seq: int, kind: str, why: str) -> MongoRefused:
        if seq not in self._refused:
            self._refused.add(seq)
            self.count(kind, 1)
            event(logging.ERROR, f"mongodb.{kind}",
                  "a message MongoDB cannot store; the batch is refused, nothing written",
                  stream=ctx.stream_id, fence=ctx.fence, seq=seq, reason=why)
        return MongoRefused(f"stream {ctx.stream_id}: seq {seq}: {why}")

    async def _in_transaction(self, docs: list[_Doc], ctx: Context) -> _Written:
        """The batch and its checkpoint in one transaction, tried again on a transient
        error (a write conflict: a claim raced it; then the fence check decides)."""
        for attempt in range(1, TRANSACTION_ATTEMPTS + 1):
            try:
                async with self.out.client.start_session() as session, \
                        await session.start_transaction():
                    return await self._write(docs, ctx, session)
            except merr.PyMongoError as exc:
                if attempt == TRANSACTION_ATTEMPTS or not _no_answer(exc):
                    raise
                event(logging.INFO, "mongodb.transaction_retried",
                      "a transaction of the MongoDB output hit a transient error; trying "
                      "again", stream=ctx.stream_id, fence=ctx.fence, attempt=attempt,
                      error=self.out.settings.why(exc))
        raise AssertionError("unreachable")

    async def _write(self, docs: list[_Doc], ctx: Context, session: Session) -> _Written:
        """Check the checkpoint (in the transaction, or by claiming it under the fence),
        upsert the messages beyond it, move it conditioned on the fence."""
        first, last = docs[0].seq, docs[-1].seq
        held = await self._held(ctx, first, last, session)
        if held is None:
            return _Written()
        written = await self._upsert([d for d in docs if d.seq > held], session)
        if session is None and written.foreign:
            await self._replace_uncommitted(written, ctx)
        moved = await self.out.checkpoints.update_one(
            {"_id": ctx.stream_id, "fence": ctx.fence, "last_seq": held},
            {"$set": {"last_seq": last}}, session=session)
        if moved.matched_count != 1:
            await self._refuse(ctx, first, last, session)
        return written

    async def _held(self, ctx: Context, first: int, last: int, session: Session) -> int | None:
        """The last seq held for the stream, checked against ``ctx``; None if the batch
        landed already. StaleFence, SinkConflict as the checkpoint document says."""
        sid = ctx.stream_id
        if session is not None:
            found = await self.out.checkpoints.find_one({"_id": sid}, session=session)
        else:
            # Only the current fence passes; ``writing_seq`` tells an operator that
            # documents up to it may be there past ``last_seq``.
            found = await self.out.checkpoints.find_one_and_update(
                {"_id": sid, "fence": ctx.fence}, {"$max": {"writing_seq": last}})
            if found is None:
                await self._refuse(ctx, first, last, None)
        if found is None:
            raise SinkConflict(f"stream {sid}: no checkpoint document in "
                               f"{self.out.settings.checkpoints} (deleted after the claim)")
        fence, held = int(found["fence"]), int(found["last_seq"])
        if fence != ctx.fence:
            raise self._stale(ctx, fence, f"seq {first}..{last}")
        if held >= last:
            event(logging.INFO, "mongodb.already_committed",
                  "the batch is already in MongoDB; nothing written", stream=sid,
                  fence=ctx.fence, first_seq=first, last_seq=last, held_seq=held)
            return None
        if held < ctx.checkpoint:
            raise SinkConflict(f"stream {sid}: MongoDB's checkpoint is {held}, expected "
                               f"{ctx.checkpoint}")
        # held > ctx.checkpoint: this same fence already landed a prefix of the batch (an
        # attempt whose answer was lost): only the rest is written.
        return held

    async def _refuse(self, ctx: Context, first: int, last: int, session: Session) -> None:
        """A conditioned write matched nothing: say why (StaleFence or SinkConflict)."""
        found = await self.out.checkpoints.find_one({"_id": ctx.stream_id}, session=session)
        if found is not None and int(found["fence"]) != ctx.fence:
            raise self._stale(ctx, int(found["fence"]), f"seq {first}..{last}")
        held = "none" if found is None else found.get("last_seq")
        raise SinkConflict(f"stream {ctx.stream_id}: MongoDB's checkpoint moved outside the "
                           f"protocol (last_seq {held}, expected {ctx.checkpoint})")

    async def _upsert(self, docs: list[_Doc], session: Session) -> _Written:
        """Insert each document unless its ``_id`` is there; compare those that are."""
        if not docs:
            return _Written()
        ops = [UpdateOne({"_id": d.id}, {"$setOnInsert": d.raw}, upsert=True) for d in docs]
        try:
            result = await self.out.messages.bulk_write(ops, ordered=True, session=session)
        except merr.BulkWriteError as exc:
            codes = {e.get("code") for e in exc.details.get("writeErrors", [])}
            if session is not None or codes != {DUPLICATE_KEY}:
                raise
            # Two holders upserting the same _id at once (no transactions): one insert
            # lost the race; the documents are all there now.
            result = await self.out.messages.bulk_write(ops, ordered=True)
        inserted = set(result.upserted_ids or {})
        present = [d for i, d in enumerate(docs) if i not in inserted]
        written = _Written(inserted=[d for i, d in enumerate(docs) if i in inserted])
        if present:
            cursor = self.out.messages.find({"_id": {"$in": [d.id for d in present]}},
                                            session=session)
            stored = {doc["_id"]: doc async for doc in cursor}
            for doc in present:
                differ = _differing(doc, stored.get(doc.id))
                if differ:
                    written.foreign.append((doc, differ))
        return written

    async def _replace_uncommitted(self, written: _Written, ctx: Context) -> None:
        """Without transactions, a document past the checkpoint under a lower fence is a
        stale holder's, landed after its claim and never committed (its checkpoint was
        refused): for a feed that does not replay the same content for a seq it is not
        this message, and this tenure's replaces it. What a writer of this fence or a
        higher one wrote, or another writer, is left alone (``foreign_duplicate``)."""
        still: list[tuple[_Doc, list[str]]] = []
        for doc, differ in written.foreign:
            replaced = await self.out.messages.replace_one(
                {"_id": doc.id, "stream_id": ctx.stream_id, "seq": doc.seq,
                 "fence": {"$lt": ctx.fence}}, doc.body)
            if replaced.matched_count == 1:
                event(logging.WARNING, "mongodb.uncommitted_replaced",
                      "a stale holder's uncommitted document replaced by this tenure's",
                      stream=ctx.stream_id, fence=ctx.fence, seq=doc.seq)
            else:
                still.append((doc, differ))
        written.foreign = still

    def _report(self, written: _Written, ctx: Context) -> None:
        """Log and count the batch's bad input once it is committed."""
        wrapped: dict[str, list[int]] = {}
        for doc in written.inserted:
            kind = doc.body.get("wrapped")
            if kind is not None:
                wrapped.setdefault(kind, []).append(doc.seq)
        for kind, seqs in wrapped.items():
            self.count("not_a_document", len(seqs))
            if kind not in self._noted:  # once a tenure: a binary feed sends nothing else
                self._noted.add(kind)
                event(logging.WARNING, "mongodb.not_a_document",
                      "messages that are not JSON objects are stored wrapped: data holds "
                      "them as they are, wrapped says what they are", stream=ctx.stream_id,
                      fence=ctx.fence, wrapped=kind, first_seq=seqs[0], count=len(seqs))
        for doc, differ in written.foreign:
            self.count("foreign_duplicate", 1)
            event(logging.WARNING, "mongodb.foreign_duplicate",
                  "another document is already at this message's _id; left alone, the "
                  "message is not stored", stream=ctx.stream_id, fence=ctx.fence,
                  seq=doc.seq, id=doc.id, differs=",".join(differ))

    def _stale(self, ctx: Context, found: int, what: str) -> StaleFence:
        event(logging.WARNING, "mongodb.stale_fence",
              "MongoDB holds a newer fence for the stream; nothing written",
              stream=ctx.stream_id, fence=ctx.fence, found_fence=found, what=what)
        return StaleFence(f"stream {ctx.stream_id}: fence {ctx.fence} is stale (MongoDB "
                          f"holds fence {found})")

    def _failure(self, exc: merr.PyMongoError, what: str) -> StreamleaseError:
        """A driver error as this package's: unknown outcome (retriable) or refused."""
        if _no_answer(exc):
            return MongoWriteUnknown(f"{what}: no answer from MongoDB: "
                                     f"{self.out.settings.why(exc)}")
        # The server's message can quote the payload: keep its code only.
        return MongoRefused(f"{what}: MongoDB refused it: {type(exc).__name__} "
                            f"(code {_code(exc)})")


def _differing(doc: _Doc, stored: Mapping[str, Any] | None) -> list[str]:
    """The fields by which the stored document is not this message (empty: it is, written
    by an earlier attempt or another holder of the stream)."""
    if stored is None:
        return ["_id"]  # deleted meanwhile by something else
    return [name for name in FIELDS if stored.get(name) != doc.body.get(name)]


# -- the worker's output --------------------------------------------------------------------


def _client(settings: MongoSettings, spec: SinkSpec) -> AsyncMongoClient[Doc]:
    try:
        with driver_warnings():
            return AsyncMongoClient(settings.client_url, **dict(settings.defaults))
    except (merr.ConfigurationError, ValueError, TypeError, UserWarning) as exc:
        raise ConfigError([f"{SETTING}: {spec.describe()} is not a usable MongoDB URL: "
                           f"{settings.why(exc)}"]) from None


async def _hello(client: AsyncMongoClient[Doc], settings: MongoSettings,
                 spec: SinkSpec) -> Mapping[str, Any]:
    """The server's ``hello`` (``isMaster`` before 4.4.2); MongoUnavailable if there is no
    answer or the login is refused."""
    try:
        try:
            answer: Mapping[str, Any] = await client.admin.command("hello")
        except merr.OperationFailure as exc:
            if exc.code != COMMAND_NOT_FOUND:
                raise
            answer = await client.admin.command("isMaster")
    except merr.PyMongoError as exc:
        raise MongoUnavailable(f"cannot use {spec.describe()}: {settings.why(exc)}") \
            from None
    return answer


def _transactions(hello: Mapping[str, Any], settings: MongoSettings, spec: SinkSpec) -> bool:
    has = supports_transactions(hello)
    if settings.transactions == "on" and not has:
        raise ConfigError([f"{SETTING}: transactions=on, but {spec.describe()} has no "
                           "multi-document transactions (a standalone mongod: run a replica "
                           "set, or leave transactions=auto)"])
    return has and settings.transactions != "off"


async def _prepare(db: AsyncDatabase[Doc], settings: MongoSettings, spec: SinkSpec) -> None:
    """The messages' index (and with it the collection), created if missing."""
    try:
        await db[settings.collection].create_index([("stream_id", 1), ("seq", 1)],
                                                   name=INDEX_NAME)
    except merr.PyMongoError as exc:
        code = exc.code if isinstance(exc, merr.OperationFailure) else None
        if code in INDEX_EXISTS_OTHERWISE:
            return  # an equivalent index is there under another name
        if code == UNAUTHORIZED:
            raise ConfigError([f"{SETTING}: {spec.describe()}: the user may not create "
                               "the messages' index (needs the readWrite role on the "
                               "database)"]) from None
        raise MongoUnavailable(f"cannot prepare {spec.describe()}: "
                               f"{settings.why(exc)}") from None


@contextlib.asynccontextmanager
async def output(spec: SinkSpec) -> AsyncIterator[ProcessorFactory]:
    """The MongoDB output for the worker's lifetime: a client, the index ready, whether
    the server has transactions found out."""
    settings = parse_settings(spec)
    client = _client(settings, spec)
    try:
        hello = await _hello(client, settings, spec)
        db = client.get_database(settings.database)
        await _prepare(db, settings, spec)
        out = MongoOutput(client, db[settings.collection], db[settings.checkpoints], settings,
                          _transactions(hello, settings, spec),
                          int(hello.get("maxBsonObjectSize", DEFAULT_MAX_DOCUMENT_BYTES)))
        event(logging.INFO, "mongodb.ready", "MongoDB output ready", sink=spec.describe(),
              checkpoints=settings.checkpoints, transactions=out.transactions,
              max_document_bytes=out.max_document_bytes)
        if not out.transactions:
            event(logging.WARNING, "mongodb.no_transactions",
                  "the MongoDB output writes without transactions: each message still lands "
                  "once, but documents can be there past the stream's checkpoint",
                  sink=spec.describe(), transactions=settings.transactions)
        yield lambda: MongoProcessor(out)
    finally:
        await client.close()
