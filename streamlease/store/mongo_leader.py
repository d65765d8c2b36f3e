"""``LeaderBackend`` on MongoDB (``STREAMLEASE_LEADER_BACKEND=mongodb://HOST/DB``).

Two collections in the URL's database, one document per lease name in each::

    streamlease_leader_leases   {_id: name, holder, fence, expires_at_ms, acquired_at_ms}
    streamlease_leader_fences   {_id: name, fence}   the high-water mark: never lowered

Expiry is the server's: every condition and every new expiry is computed from ``$$NOW``
inside the server (``{$toLong: "$$NOW"}``, epoch milliseconds), never from a worker's
clock, so a worker whose clock is off cannot take a live lease nor keep a dead one.

- acquire, in this order:

  1. read the mark;
  2. one ``find_one_and_update`` whose filter is "no holder, or the holder's lease has
     expired", setting holder, expiry, and a fence one above both the document's own
     and the mark (a lease with neither: one above the server's clock in milliseconds,
     as on the other backends), ``upsert`` for the first time. A held lease fails the
     filter and the upsert collides on ``_id`` (``DuplicateKeyError``): not acquired,
     and nothing moved. One document, one atomic update: exactly one winner under any
     race;
  3. ``$max`` the mark up to the fence just handed out, before the fence is returned.

  A fence is used (renewals, fenced writes) only after step 3, so the mark covers every
  fence ever used, and a deleted or re-created lease document, a dropped lease
  collection, or one restored from an older snapshot, still hands out a fence above
  every one used. (A holder that dies between steps 2 and 3 never used its fence; one
  whose step 3 fails is told the acquisition failed.)
- renew: the expiry moves only while ``holder`` is this owner, ``fence`` is its own and
  the lease has not expired: a lost lease is never resurrected.
- resign: ``holder`` cleared and the expiry zeroed, only by the holder under its fence;
  the fence stays.
- read: the document and the server's ``$$NOW`` in one aggregation: absent, resigned
  or expired reads as None (as on Redis, whose server also keeps the time to live).
- fenced write: one transaction that checks the lease document still carries the
  writer's fence, touches the mark (so that it conflicts with any acquisition running
  at the same time), and upserts the resource document only where no higher fence has
  written it (the document's ``streamlease_fence``). Transactions need a replica set (a
  single-member one will do), Atlas or DocumentDB; on a standalone ``mongod`` a fenced
  write is refused with a ``StoreError`` saying so (the lease itself works there).

Write concern ``w: "majority"`` with ``j: true``, and read concern ``majority``, unless
the URL sets ``w``, ``journal`` or ``readConcernLevel`` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from collections.abc import AsyncIterator, Iterator, Mapping
from decimal import Decimal
from typing import Any

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
from streamlease.errors import ConfigError, StaleFence, StoreError, StoreUnavailable

__all__ = ["FENCES", "FENCE_FIELD", "LEASES", "MongoLeaderBackend", "client_for",
           "mongo_backend", "mongo_target", "upsert_for_item"]

LEASES = "streamlease_leader_leases"
FENCES = "streamlease_leader_fences"
#: The field a fenced write stamps on the document it writes.
FENCE_FIELD = "streamlease_fence"
NOW_MS = {"$toLong": "$$NOW"}
_DESERIALIZER = TypeDeserializer()


def upsert_for_item(table: str, item: Mapping[str, Any]) -> Upsert:
    """What ``streamlease job write --table T --item JSON`` writes on MongoDB: a document
    in collection ``T`` whose ``_id`` is the item's ``Pk`` (with an ``Sk`` too: the
    document ``{"Pk": ..., "Sk": ...}``) and whose fields are the item's attributes as
    plain values (numbers as integers, or Decimal128 where fractional; sets as sorted
    lists; binary as BSON binary). ValueError for an item that does not convert."""
    if not table or "$" in table or "\0" in table or table.startswith("system."):
        raise ValueError("the table (the MongoDB collection) must be a collection name "
                         "(not empty, no $ or NUL, not system.*)")
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
        with _translated(timeout):
            async with asyncio.timeout(timeout):
                cursor = await self.leases.aggregate(pipeline)
                found = await cursor.to_list(1)
        if not found:
            return None
        lease = found[0]
        holder, expires = lease.get("holder"), int(lease.get("expires_at_ms") or 0)
        if holder is None or expires <= int(lease["now_ms"]):
            return None
        return LeaderRecord(name, str(holder), int(lease["fence"]), heartbeat=expires,
                            expires_at_ms=expires)

    async def acquire(self, name: str, owner: str, ttl_s: float, seen: LeaderRecord | None,
                      now_wall_ms: int, timeout: float | None = None) -> int | None:
        # The server's $$NOW, not an observation or this machine's clock, decides that a
        # lease is free (``seen`` and ``now_wall_ms`` are not needed).
        with _translated(timeout):
            async with asyncio.timeout(timeout):
                mark = await self.fences.find_one({"_id": name})
                base = NOW_MS if mark is None else int(mark["fence"])
                try:
                    taken = await self.leases.find_one_and_update(
                        {"_id": name, "$or": [
                            {"holder": None},
                            {"$expr": {"$lte": ["$expires_at_ms", NOW_MS]}}]},
                        [{"$set": {
                            "holder": owner,
                            "fence": {"$add": [
                                {"$max": [{"$ifNull": ["$fence", base]}, base]}, 1]},
                            "expires_at_ms": {"$add": [NOW_MS, _ms(ttl_s)]},
                            "acquired_at_ms": NOW_MS}}],
                        upsert=True, return_document=ReturnDocument.AFTER)
                except merr.DuplicateKeyError:
                    return None  # held: the filter failed, the upsert met the document
                fence = _fence_of(taken)
                # Before the fence is returned, and so before anything is written under
                # it: a fence only ever used is one the mark already covers.
                await self.fences.update_one({"_id": name}, {"$max": {"fence": fence}},
                                             upsert=True)
        return fence

    async def renew(self, name: str, owner: str, fence: int, ttl_s: float, now_wall_ms: int,
                    timeout: float | None = None) -> HeartbeatOutcome:
        try:
            with _translated(timeout):
                async with asyncio.timeout(timeout):
                    renewed = await self.leases.update_one(
                        {"_id": name, "holder": owner, "fence": fence,
                         "$expr": {"$gt": ["$expires_at_ms", NOW_MS]}},
                        [{"$set": {"expires_at_ms": {"$add": [NOW_MS, _ms(ttl_s)]}}}])
        except StoreError:
            return HeartbeatOutcome.UNKNOWN
        return HeartbeatOutcome.RENEWED if renewed.matched_count == 1 \
            else HeartbeatOutcome.FENCED

    async def resign(self, name: str, owner: str, fence: int,
                     timeout: float | None = None) -> bool:
        with _translated(timeout):
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
        # with_transaction commits, and runs the whole transaction again on a transient
        # conflict (another fenced write, or an acquisition) until the call's timeout.
        with _translated(timeout):
            async with asyncio.timeout(timeout), self.client.start_session() as session:
                await session.with_transaction(lambda s: self._write(s, name, fence, write))

    async def _write(self, session: AsyncClientSession, name: str, fence: int,
                     write: Upsert) -> None:
        lease = await self.leases.find_one({"_id": name}, {"fence": 1}, session=session)
        if lease is None or int(lease.get("fence", -1)) != fence:
            raise StaleFence(f"lease {name}: fence {fence} is no longer current")
        # Written, not only read: an acquisition running now writes the mark first, so
        # one of the two transactions fails on the conflict instead of both committing.
        await self.fences.update_one({"_id": name}, {"$max": {"fence": fence}},
                                     session=session)
        try:
            await self.db[write.collection].update_one(
                {"_id": write.key, "$or": [{FENCE_FIELD: {"$exists": False}},
                                           {FENCE_FIELD: {"$lte": fence}}]},
                {"$set": {**write.document, FENCE_FIELD: fence}},
                upsert=True, session=session)
        except merr.DuplicateKeyError:
            raise StaleFence(f"lease {name}: a fence above {fence} has written "
                             f"{write.collection} {write.key!r}") from None


@contextlib.contextmanager
def _translated(timeout: float | None) -> Iterator[None]:
    """pymongo's and asyncio's failures as ``streamlease.errors``."""
    try:
        yield
    except TimeoutError as exc:
        raise StoreUnavailable(f"mongodb: no answer within {timeout} s") from exc
    except StaleFence:
        raise
    except merr.OperationFailure as exc:
        if exc.code == 20 and "Transaction" in str(exc):
            raise StoreError("mongodb: fenced writes need transactions: a replica set (one "
                             "member will do), Atlas or DocumentDB, not a standalone "
                             "server") from None
        if exc.has_error_label("TransientTransactionError") or \
                exc.has_error_label("RetryableWriteError"):
            raise StoreUnavailable(f"mongodb: {type(exc).__name__}: {exc.code}") from exc
        raise StoreError(f"mongodb: {type(exc).__name__}: {exc.code}: "
                         f"{str(exc)[:200]}") from exc
    except (merr.ConnectionFailure, merr.WriteConcernError, merr.WTimeoutError,
            merr.ExecutionTimeout) as exc:
        raise StoreUnavailable(f"mongodb: {type(exc).__name__}: {str(exc)[:200]}") from exc
    except merr.PyMongoError as exc:
        raise StoreError(f"mongodb: {type(exc).__name__}: {str(exc)[:200]}") from exc


def _fence_of(document: Mapping[str, Any] | None) -> int:
    """The fence of a document an upserting update returned (it always returns one)."""
    if document is None or not isinstance(document.get("fence"), int):
        raise StoreError(f"mongodb: an upsert returned no fence: {document!r}"[:200])
    return int(document["fence"])


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
        # The driver only warns about an option it cannot use, and goes on without it.
        with warnings.catch_warnings():
            warnings.simplefilter("error")
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
