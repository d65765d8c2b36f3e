"""``LeaderBackend`` on MongoDB (``STREAMLEASE_LEADER_BACKEND=mongodb://HOST/DB``).

Two collections in the URL's database, one document per lease name in each::

    streamlease_leader_leases   {_id: name, holder, fence, expires_at_ms, acquired_at_ms,
                                 attempt, writes}
    streamlease_leader_fences   {_id: name, fence}   the high-water mark: never lowered

Expiry is the server's: every condition and every new expiry is computed from ``$$NOW``
inside the server (``{$toLong: "$$NOW"}``, epoch milliseconds), never from a worker's
clock, so a worker whose clock is off cannot take a live lease nor keep a dead one. (The
price, as on Redis: the replica set's members must keep their clocks within the lease's
safety margin of each other, or a failover to a primary whose clock runs ahead ends a
lease early. Fenced writes stay safe either way.)

- acquire, in this order:

  1. read the mark;
  2. one ``find_one_and_update`` on ``{_id: name}``, ``upsert`` for the first time, whose
     update pipeline decides: if the lease is free (no holder, expired by the server's
     clock, or a fence below the mark: a document restored from an older snapshot) it
     sets holder, expiry, a fence one above both the document's own and the mark (a
     lease with neither: one above the server's clock in milliseconds, as on the other
     backends) and this attempt's token; else it leaves the document as it was. The
     returned token says who won. One document, one atomic update: exactly one winner
     under any race, and a refused attempt changes nothing. (The condition is in the
     pipeline, not the filter: MongoDB refuses ``$expr`` in an upsert's filter.)
  3. raise the mark to the new fence, only from below it. If the mark is already there
     or above, another acquisition handed out this fence or a higher one since step 1
     (the lease document was lost meanwhile): the lease is resigned and not taken.

  Every fence is above the mark when it is handed out and raises the mark before it is
  returned, so no fence is handed out twice, and a deleted or re-created lease document,
  a dropped lease collection or one restored from an older snapshot still hands out a
  fence above every one used. A holder that dies between steps 2 and 3 never used its
  fence.
- renew: the expiry moves only while ``holder`` is this owner, ``fence`` is its own and
  the lease has not expired (a lost lease is never resurrected); then the mark is read:
  a mark above the fence means a newer leader was made (this document was restored from
  an older snapshot), and the holder is told it is fenced.
- resign: ``holder`` cleared and the expiry zeroed, only by the holder under its fence;
  the fence stays.
- read: the document and the server's ``$$NOW`` in one aggregation: absent, resigned
  or expired reads as None (as on Redis, whose server also keeps the time to live).
- fenced write: one transaction that writes the lease document under the writer's fence
  (a write, not a read: an acquisition updates that document too, so the two are
  ordered and a deposed leader's write never commits after a newer acquisition
  returned), checks the mark still equals the fence, and upserts the target document
  only where no higher fence has written it (its ``streamlease_fence``). Transactions
  need a replica set (a single-member one will do), Atlas or DocumentDB; on a standalone
  ``mongod`` a fenced write is refused with a ``StoreError`` saying so (the lease itself
  works there). A document MongoDB cannot store, or one a unique index of the target
  refuses, is ``WriteRefused``.

Write concern ``w: "majority"`` with ``j: true``, and read concern ``majority``, unless
the URL sets ``w``, ``journal`` or ``readConcernLevel`` itself. Every operation carries the
caller's deadline to the server (``maxTimeMS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from decimal import Decimal
from typing import Any

import bson
import bson.errors
import pymongo
from boto3.dynamodb.types import Binary, TypeDeserializer
from bson.decimal128 import Decimal128
from pymongo import AsyncMongoClient, ReturnDocument
from pymongo import errors as merr
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.collection import AsyncCollection

from streamlease.core.backends import MongoTarget, parse_mongo_url
from streamlease.core.fenced import PutItem, Upsert
from streamlease.core.leadership import LeaderRecord
from streamlease.core.membership import HeartbeatOutcome
from streamlease.errors import ConfigError, StaleFence, StoreError, StoreUnavailable, WriteRefused
from streamlease.store.mongoclient import driver_warnings

__all__ = ["FENCES", "FENCE_FIELD", "LEASES", "MongoLeaderBackend", "client_for",
           "mongo_backend", "mongo_target", "upsert_for_item"]

LEASES = "streamlease_leader_leases"
FENCES = "streamlease_leader_fences"
#: The field a fenced write stamps on the document it writes.
FENCE_FIELD = "streamlease_fence"
NOW_MS = {"$toLong": "$$NOW"}
FREE_FIELD = "streamlease_free"  # set and removed inside one acquisition's pipeline
WRITE_TIMEOUT_S = 30.0  # a fenced write given no deadline of its own (job write)
#: Server answers after which the same operation may succeed: not primary, shutting down,
#: interrupted by a stepdown, a write conflict, host unreachable, exceeded time limit.
TRANSIENT_CODES = frozenset({6, 7, 89, 91, 112, 189, 262, 9001, 10107, 11600, 11602, 13435,
                             13436})
TRANSIENT_LABELS = ("TransientTransactionError", "RetryableWriteError",
                    "UnknownTransactionCommitResult")
_DESERIALIZER = TypeDeserializer()


def upsert_for_item(table: str, item: Mapping[str, Any]) -> Upsert:
    """What ``streamlease job write --table T --item JSON`` writes on MongoDB: a document
    in collection ``T`` whose ``_id`` is the item's ``Pk`` (with an ``Sk`` too: the
    document ``{"Pk": ..., "Sk": ...}``) and whose fields are the item's attributes as
    plain values (numbers as integers, or Decimal128 where fractional; sets as sorted
    lists; binary as BSON binary). ValueError for an item that does not convert."""
    if not table or "$" in table or "\0" in table or table.startswith("system.") or \
            table in (LEASES, FENCES):
        raise ValueError("the table (the MongoDB collection) must be a collection name "
                         f"(not empty, no $ or NUL, not system.*, {LEASES} or {FENCES})")
    if not isinstance(item, Mapping):
        raise ValueError("the item must be a JSON object of DynamoDB attribute values")
    document = {name: _value(name, value) for name, value in item.items()}
    if "Pk" not in document:
        raise ValueError("the item has no Pk attribute: on MongoDB an item is stored with "
                         "its Pk (and Sk) as _id, in the collection named by --table")
    if "_id" in document or FENCE_FIELD in document:
        raise ValueError(f"the item may not have _id or {FENCE_FIELD} attributes: the "
                         "write sets them")
    key = document["Pk"] if "Sk" not in document else {"Pk": document["Pk"],
                                                       "Sk": document["Sk"]}
    return Upsert(table, key, document)


def _value(name: str, value: Any) -> Any:
    try:
        return _bson(_DESERIALIZER.deserialize(value))
    except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError):
        raise ValueError(f"the item's {name} is not a DynamoDB attribute value, e.g. "
                         '{"S": "text"} or {"N": "3"}') from None


def _bson(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else Decimal128(value)
    if isinstance(value, Binary):
        return bytes(value)
    if isinstance(value, list):
        return [_bson(v) for v in value]
    if isinstance(value, dict):
        return {k: _bson(v) for k, v in value.items()}
    if isinstance(value, set):
        return sorted(_bson(v) for v in value)
    return value


class MongoLeaderBackend:
    """Named leader leases and fenced writes in one MongoDB database (see the module)."""

    conditional_puts = False

    def __init__(self, client: AsyncMongoClient[dict[str, Any]], database: str) -> None:
        self.client = client
        self.db = client[database]
        self.leases: AsyncCollection[dict[str, Any]] = self.db[LEASES]
        self.fences: AsyncCollection[dict[str, Any]] = self.db[FENCES]

    async def aclose(self) -> None:
        await self.client.close()

    async def read(self, name: str, timeout: float | None = None,
                   consistent: bool = True) -> LeaderRecord | None:
        del consistent  # majority reads of the primary: one read path
        pipeline: list[dict[str, Any]] = [{"$match": {"_id": name}},
                                          {"$addFields": {"now_ms": NOW_MS}}]
        with _translated(timeout), pymongo.timeout(timeout):
            async with asyncio.timeout(timeout):
                cursor = await self.leases.aggregate(pipeline)
                found = await cursor.to_list(1)
        if not found:
            return None
        lease = found[0]
        holder, fence = lease.get("holder"), _number(lease, "fence", name)
        expires = _number(lease, "expires_at_ms", name)
        # Resigned or lapsed on the server's clock: free, as an absent lease is. (A document
        # whose fence is below the mark, restored from a snapshot, shows as it is; its
        # holder's renewals are refused, and an acquisition takes it at once.)
        if holder is None or expires <= _number(lease, "now_ms", name):
            return None
        return LeaderRecord(name, str(holder), fence, heartbeat=expires, expires_at_ms=expires)

    async def acquire(self, name: str, owner: str, ttl_s: float, seen: LeaderRecord | None,
                      now_wall_ms: int, timeout: float | None = None) -> int | None:
        # The server's $$NOW, not an observation or this machine's clock, decides that a
        # lease is free (``seen`` and ``now_wall_ms`` are not needed).
        attempt = uuid.uuid4().hex
        with _translated(timeout), pymongo.timeout(timeout):
            async with asyncio.timeout(timeout):
                mark = _mark_of(await self.fences.find_one({"_id": name}), name)
                taken = await self.leases.find_one_and_update(
                    {"_id": name}, acquire_pipeline(owner, _ms(ttl_s), mark, attempt),
                    upsert=True, return_document=ReturnDocument.AFTER)
                if taken is None or taken.get("attempt") != attempt:
                    return None  # held: the pipeline left the document as it was
                fence = _number(taken, "fence", name)
                if not await self._raise_mark(name, fence):
                    # A fence at least this high was handed out since the mark was read
                    # (the lease document was lost meanwhile): this one may be a copy.
                    await self.resign(name, owner, fence, timeout)
                    return None
        return fence

    async def _raise_mark(self, name: str, fence: int) -> bool:
        """Raise the mark to ``fence``, before the fence is returned (and so before
        anything is written under it); False if the mark is already there or above."""
        try:
            await self.fences.update_one({"_id": name, "fence": {"$lt": fence}},
                                         {"$set": {"fence": fence}}, upsert=True)
        except merr.DuplicateKeyError:
            return False
        return True

    async def renew(self, name: str, owner: str, fence: int, ttl_s: float, now_wall_ms: int,
                    timeout: float | None = None) -> HeartbeatOutcome:
        try:
            with _translated(timeout), pymongo.timeout(timeout):
                async with asyncio.timeout(timeout):
                    renewed = await self.leases.update_one(
                        {"_id": name, "holder": owner, "fence": fence,
                         "$expr": {"$gt": ["$expires_at_ms", NOW_MS]}},
                        [{"$set": {"expires_at_ms": {"$add": [NOW_MS, _ms(ttl_s)]}}}])
                    mark = await self.fences.find_one({"_id": name})
        except StoreError:
            return HeartbeatOutcome.UNKNOWN
        # A higher mark: a newer leader was made (this document was restored from an
        # older snapshot, or lost and re-created); this holder is deposed.
        if renewed.matched_count != 1 or _mark_of(mark, name) > fence:
            return HeartbeatOutcome.FENCED
        return HeartbeatOutcome.RENEWED

    async def resign(self, name: str, owner: str, fence: int,
                     timeout: float | None = None) -> bool:
        with _translated(timeout), pymongo.timeout(timeout):
            async with asyncio.timeout(timeout):
                resigned = await self.leases.update_one(
                    {"_id": name, "holder": owner, "fence": fence},
                    {"$set": {"holder": None, "expires_at_ms": 0}})
        return resigned.matched_count == 1

    async def fenced_write(self, name: str, fence: int, write: Any,
                           timeout: float | None = None) -> None:
        if isinstance(write, PutItem):
            if write.condition:
                raise TypeError("MongoDB leader leases cannot apply a PutItem with a "
                                "condition")
            write = upsert_for_item(write.table, write.item)
        if not isinstance(write, Upsert):
            raise TypeError(f"MongoDB leader leases cannot apply {type(write).__name__}")
        try:
            bson.encode({**write.document, "_id": write.key})
        except (bson.errors.InvalidDocument, OverflowError) as exc:
            raise WriteRefused(f"MongoDB cannot store the document: {exc}"[:300]) from None
        # with_transaction commits, and runs the whole transaction again on a transient
        # conflict (the holder's renewal, an acquisition, another write) until the
        # deadline, which also bounds every operation on the server (maxTimeMS).
        deadline = timeout or WRITE_TIMEOUT_S
        with _translated(deadline), pymongo.timeout(deadline):
            async with asyncio.timeout(deadline), self.client.start_session() as session:
                await session.with_transaction(lambda s: self._write(s, name, fence, write))

    async def _write(self, session: AsyncClientSession, name: str, fence: int,
                     write: Upsert) -> None:
        # The lease document is written, not only read: an acquisition updates it, so
        # the two are ordered (one waits for, or conflicts with, the other) and a
        # deposed leader's write cannot commit after a newer acquisition returned.
        lease = await self.leases.find_one_and_update(
            {"_id": name, "fence": fence}, {"$inc": {"writes": 1}}, session=session)
        mark = await self.fences.find_one({"_id": name}, session=session)
        if lease is None or _mark_of(mark, name) != fence:
            raise StaleFence(f"lease {name}: fence {fence} is no longer current")
        try:
            await self.db[write.collection].update_one(
                {"_id": write.key, "$or": [{FENCE_FIELD: {"$exists": False}},
                                           {FENCE_FIELD: {"$lte": fence}}]},
                {"$set": {**write.document, FENCE_FIELD: fence}},
                upsert=True, session=session)
        except merr.DuplicateKeyError as exc:
            if (exc.details or {}).get("keyPattern", {"_id": 1}) != {"_id": 1}:
                raise WriteRefused(f"{write.collection}: a unique index of its own refused "
                                   f"the document ({(exc.details or {}).get('keyPattern')})"
                                   ) from None
            raise StaleFence(f"lease {name}: a fence above {fence} has written "
                             f"{write.collection} {write.key!r}") from None


def acquire_pipeline(owner: str, ttl_ms: int, mark: int, attempt: str) -> list[dict[str, Any]]:
    """The update of ``acquire``: when the lease is free (no holder, expired on the
    server's clock, or a fence below the mark), this owner with a fence one above both the
    document's and ``mark`` (a lease with neither: one above the server's clock in
    milliseconds) and ``attempt``, by which the caller knows it won; else the document as
    it was (no write). The condition lives in the pipeline, not in the filter: MongoDB
    refuses ``$expr`` in the filter of an upsert."""
    free = {"$or": [{"$eq": [{"$ifNull": ["$holder", None]}, None]},
                    {"$lte": [{"$ifNull": ["$expires_at_ms", 0]}, NOW_MS]},
                    {"$lt": [{"$ifNull": ["$fence", 0]}, mark]}]}
    base = NOW_MS if mark == 0 else mark
    fence = {"$add": [{"$max": [{"$toLong": {"$ifNull": ["$fence", base]}}, base]}, 1]}

    def when_free(value: Any, field: str) -> dict[str, Any]:
        return {"$cond": ["$" + FREE_FIELD, value, "$" + field]}

    return [{"$set": {FREE_FIELD: free}},
            {"$set": {"holder": when_free(owner, "holder"),
                      "fence": when_free(fence, "fence"),
                      "expires_at_ms": when_free({"$add": [NOW_MS, ttl_ms]}, "expires_at_ms"),
                      "acquired_at_ms": when_free(NOW_MS, "acquired_at_ms"),
                      "attempt": when_free(attempt, "attempt")}},
            {"$unset": FREE_FIELD}]


@contextlib.contextmanager
def _translated(timeout: float | None) -> Iterator[None]:
    """pymongo's and asyncio's failures as ``streamlease.errors``: StoreUnavailable where
    the outcome is unknown or a retry may succeed, StoreError where it will not."""
    try:
        yield
    except TimeoutError as exc:
        raise StoreUnavailable(f"mongodb: no answer within {timeout} s") from exc
    except (StaleFence, WriteRefused):
        raise
    except (merr.ConnectionFailure, merr.WriteConcernError, merr.WTimeoutError,
            merr.ExecutionTimeout) as exc:
        raise StoreUnavailable(f"mongodb: {type(exc).__name__}: {str(exc)[:200]}") from exc
    except merr.OperationFailure as exc:
        if exc.code == 20 and "Transaction" in str(exc):
            raise StoreError("mongodb: fenced writes need transactions: a replica set (one "
                             "member will do), Atlas or DocumentDB, not a standalone "
                             "server") from None
        if exc.timeout or exc.code in TRANSIENT_CODES or any(exc.has_error_label(label)
                                                             for label in TRANSIENT_LABELS):
            raise StoreUnavailable(f"mongodb: {type(exc).__name__}: {exc.code}") from exc
        raise StoreError(f"mongodb: {type(exc).__name__}: {exc.code}: "
                         f"{str(exc)[:200]}") from exc
    except merr.PyMongoError as exc:
        if getattr(exc, "timeout", False):
            raise StoreUnavailable(f"mongodb: {type(exc).__name__}: {str(exc)[:200]}") \
                from exc
        raise StoreError(f"mongodb: {type(exc).__name__}: {str(exc)[:200]}") from exc


def _number(document: Mapping[str, Any], field: str, name: str) -> int:
    """An integer field of a lease document; StoreError if it is not one (an edit by hand
    that a worker must report, not crash on)."""
    value = document.get(field, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise StoreError(f"mongodb: lease {name}: {field} is not a whole number: "
                         f"{value!r}"[:200])
    return int(value)


def _mark_of(document: Mapping[str, Any] | None, name: str) -> int:
    """The fence high-water mark (0 if there is none)."""
    return 0 if document is None else _number(document, "fence", name)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def mongo_target(url: str) -> MongoTarget:
    """A ``mongodb://`` or ``mongodb+srv://`` URL as a ``MongoTarget``; ValueError
    otherwise."""
    return parse_mongo_url(url, "MongoDB URL")


def client_for(target: MongoTarget, *, connect_timeout_s: float = 5.0
               ) -> AsyncMongoClient[dict[str, Any]]:
    """A client for ``target``: majority writes, journaled, majority reads, unless the
    URL says otherwise. Nothing is dialled until the first operation."""
    defaults: dict[str, Any] = {}
    if "w" not in target.options:
        defaults["w"] = "majority"
    if "journal" not in target.options and "j" not in target.options:
        defaults["journal"] = True
    if "readconcernlevel" not in target.options:
        defaults["readConcernLevel"] = "majority"
    ms = round(connect_timeout_s * 1000)
    return AsyncMongoClient(target.uri, serverSelectionTimeoutMS=ms, connectTimeoutMS=ms,
                            appname="streamlease", tz_aware=True, **defaults)


@contextlib.asynccontextmanager
async def mongo_backend(url: str | MongoTarget) -> AsyncIterator[MongoLeaderBackend]:
    """Leader leases in the MongoDB database ``url`` names; closed on the way out.
    ConfigError (naming the setting, never the password) for a URL the driver cannot
    use, an option it does not know or a value it refuses among them."""
    target = url if isinstance(url, MongoTarget) else mongo_target(url)
    try:
        with driver_warnings():
            client = client_for(target)
    except (merr.ConfigurationError, merr.InvalidURI, ValueError, TypeError,
            UserWarning) as exc:
        raise ConfigError([f"STREAMLEASE_LEADER_BACKEND: {target.url} is not a usable "
                           f"MongoDB URL: {str(exc)[:200]}"]) from None
    backend = MongoLeaderBackend(client, target.database)
    try:
        yield backend
    finally:
        await backend.aclose()
