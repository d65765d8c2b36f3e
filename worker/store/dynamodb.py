"""The lease store and fenced sink over aioboto3: the only module that imports botocore.

One client per process, reused by every call (its connection pool is sized for the
worker's stream count). botocore's own retries are off: a blindly retried conditional
write can turn a win into an apparent loss, so each caller decides how to retry, and
every call runs under an explicit timeout.

Failed conditions are results, not exceptions: ``acquire`` returns None, ``renew``
returns ``LOST``, ``release`` returns False. Everything else is translated into
``worker.errors`` at this boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aioboto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from worker.core.frames import Frame
from worker.core.lease import LeaseTimings, RenewOutcome, expiry_for, takeover_threshold_ms
from worker.core.model import StreamRecord, Tenure
from worker.errors import (
    ConfigError,
    SinkConflict,
    StaleFence,
    StoreError,
    StoreThrottled,
    StoreUnavailable,
    TableMissing,
)
from worker.store import codec, schema

Observer = Callable[[str, str, float], None]  # (operation, outcome, seconds)

THROTTLE_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "Throttling", "ThrottlingError", "LimitExceededException",
})
UNAVAILABLE_CODES = frozenset({
    "InternalServerError", "InternalFailure", "ServiceUnavailable", "TransactionConflictException",
    "TransactionInProgressException", "RequestTimeout", "RequestTimeoutException",
})


class _ConditionFailed(Exception):
    def __init__(self, item: dict[str, Any] | None) -> None:
        super().__init__("condition failed")
        self.item = item


@dataclass(frozen=True)
class Acquired:
    tenure: Tenure
    record: StreamRecord


@dataclass(frozen=True)
class RenewResult:
    outcome: RenewOutcome
    record: StreamRecord | None = None
    expires_at_ms: int | None = None
    error: str | None = None


class SinkOutcome(enum.Enum):
    COMMITTED = "committed"
    ALREADY_COMMITTED = "already_committed"  # an earlier attempt of this batch landed


@dataclass(frozen=True)
class ForceReleased:
    changed: bool
    record: StreamRecord | None  # after the write if changed, else as found (None: missing)


def client_config(max_connections: int) -> BotoConfig:
    return BotoConfig(
        retries={"max_attempts": 1, "mode": "standard"},
        connect_timeout=3,
        read_timeout=10,
        max_pool_connections=max_connections,
        tcp_keepalive=True,
    )


class DynamoStore:
    """Streams table + events table behind a handful of methods."""

    def __init__(self, client: Any, table: str, events_table: str,
                 observe: Observer | None = None, call_timeout_s: float = 10.0) -> None:
        self._client = client
        self.table = table
        self.events_table = events_table
        self._observe = observe
        self.call_timeout_s = call_timeout_s

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, table: str, events_table: str, *, max_connections: int = 50,
                      observe: Observer | None = None,
                      call_timeout_s: float = 10.0) -> AsyncIterator[DynamoStore]:
        """Open the one client this process uses. Raises ConfigError without a region."""
        session = aioboto3.Session()
        # botocore reads AWS_DEFAULT_REGION and profiles; AWS_REGION (what ECS and most
        # tools set) is honoured here explicitly.
        region = os.environ.get("AWS_REGION", "").strip() or session.region_name
        if not region:
            raise ConfigError(["AWS_REGION: not set (the AWS region of the tables)"])
        config = client_config(max_connections)
        async with session.client("dynamodb", region_name=region, config=config) as client:
            yield cls(client, table, events_table, observe, call_timeout_s)

    # -- plumbing ---------------------------------------------------------------------

    async def _call(self, operation: str, timeout: float | None = None, **kwargs: Any) -> Any:
        started = time.perf_counter()
        outcome = "ok"
        try:
            async with asyncio.timeout(timeout or self.call_timeout_s):
                return await getattr(self._client, operation)(**kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ConditionalCheckFailedException":
                outcome = "condition_failed"
                raise _ConditionFailed(exc.response.get("Item")) from exc
            if code == "TransactionCanceledException":
                outcome = "cancelled"
                raise
            translated = _translate(exc)
            outcome = _outcome_label(translated)
            raise translated from exc
        except TimeoutError as exc:
            outcome = "unavailable"
            raise StoreUnavailable(f"{operation} timed out") from exc
        except (NoCredentialsError, PartialCredentialsError) as exc:
            outcome = "error"
            raise StoreError(f"no AWS credentials: {exc}") from exc
        except NoRegionError as exc:
            outcome = "error"
            raise ConfigError(["AWS_REGION: not set (the AWS region of the tables)"]) from exc
        except (BotoCoreError, OSError) as exc:
            outcome = "unavailable"
            raise StoreUnavailable(f"{operation}: {exc}") from exc
        except Exception as exc:
            # aiohttp raises its own errors for broken connections; treat like a timeout.
            if type(exc).__module__.startswith("aiohttp"):
                outcome = "unavailable"
                raise StoreUnavailable(f"{operation}: {exc!r}") from exc
            outcome = "error"
            raise
        finally:
            if self._observe is not None:
                self._observe(operation, outcome, time.perf_counter() - started)

    # -- tables -----------------------------------------------------------------------

    async def create_tables(self, wait_s: float = 300.0) -> list[str]:
        """Create both tables if missing and wait until active. Returns those created."""
        created: list[str] = []
        definitions = (schema.streams_table(self.table), schema.events_table(self.events_table))
        for definition in definitions:
            name = definition["TableName"]
            try:
                await self._call("create_table", **definition)
                created.append(name)
            except StoreError as exc:
                if "ResourceInUseException" not in str(exc):
                    raise
            await self._wait_active(name, wait_s)
            await self._check_schema(definition)
        return created

    async def check_tables(self) -> None:
        """Raise TableMissing (with the fix) unless both tables exist."""
        for name in (self.table, self.events_table):
            await self._call("describe_table", TableName=name)

    async def _wait_active(self, name: str, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while True:
            desc = (await self._call("describe_table", TableName=name))["Table"]
            indexes = desc.get("GlobalSecondaryIndexes", [])
            if desc.get("TableStatus") == "ACTIVE" and all(
                i.get("IndexStatus", "ACTIVE") == "ACTIVE" for i in indexes
            ):
                return
            if time.monotonic() > deadline:
                raise StoreError(f"table {name} not ACTIVE after {wait_s:g} s")
            await asyncio.sleep(2)

    async def _check_schema(self, definition: dict[str, Any]) -> None:
        name = definition["TableName"]
        desc = (await self._call("describe_table", TableName=name))["Table"]
        if _key_schema(desc["KeySchema"]) != _key_schema(definition["KeySchema"]):
            raise StoreError(f"table {name} exists with a different key schema")
        for index in definition.get("GlobalSecondaryIndexes", []):
            found = {i["IndexName"]: i for i in desc.get("GlobalSecondaryIndexes", [])}
            have = found.get(index["IndexName"])
            if have is None or _key_schema(have["KeySchema"]) != _key_schema(index["KeySchema"]):
                raise StoreError(f"table {name} lacks index {index['IndexName']} as specified")

    # -- lease operations -------------------------------------------------------------

    async def acquire(self, stream_id: str, owner: str, now_wall_ms: int,
                      timings: LeaseTimings, timeout: float | None = None) -> Acquired | None:
        """Take a free or expired lease. None if the condition failed (not ours)."""
        expiry = expiry_for(now_wall_ms, timings)
        expr = codec.acquire_expr(owner, expiry, takeover_threshold_ms(now_wall_ms, timings))
        try:
            resp = await self._call(
                "update_item", timeout, TableName=self.table, Key=codec.key(stream_id),
                ReturnValues="ALL_NEW", ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **expr.update_kwargs(),
            )
        except _ConditionFailed as failed:
            # A request that applied but whose answer was lost, re-sent, fails its own
            # condition; the stamped expiry tells that case apart from a real loss.
            old = codec.decode_record(failed.item) if failed.item else None
            if old is not None and old.lease_owner == owner and old.lease_expires_at_ms == expiry:
                return _acquired(old, owner, expiry)
            return None
        record = codec.decode_record(resp["Attributes"])
        if record is None:
            raise StoreError(f"acquire of {stream_id} returned an item without a stream key")
        return _acquired(record, owner, expiry)

    async def renew(self, tenure: Tenure, now_wall_ms: int, timings: LeaseTimings,
                    timeout: float | None = None) -> RenewResult:
        expiry = expiry_for(now_wall_ms, timings)
        expr = codec.renew_expr(tenure.owner, tenure.fence, expiry)
        try:
            resp = await self._call(
                "update_item", timeout, TableName=self.table, Key=codec.key(tenure.stream_id),
                ReturnValues="ALL_NEW", **expr.update_kwargs(),
            )
        except _ConditionFailed:
            return RenewResult(RenewOutcome.LOST)
        except StoreThrottled as exc:
            return RenewResult(RenewOutcome.THROTTLED, error=str(exc))
        except StoreUnavailable as exc:
            return RenewResult(RenewOutcome.UNKNOWN, error=str(exc))
        except StoreError as exc:
            # Not retriable as such (access denied, a validation error, a table gone):
            # ownership cannot be proven, so it counts as unknown and the local deadline
            # decides. The supervisor then still drains and releases in order.
            return RenewResult(RenewOutcome.UNKNOWN, error=str(exc))
        return RenewResult(RenewOutcome.RENEWED, codec.decode_record(resp["Attributes"]), expiry)

    async def release(self, tenure: Tenure, timeout: float | None = None) -> bool:
        """Expiry 0 if still ours. False if the lease had already moved on."""
        expr = codec.release_expr(tenure.owner, tenure.fence)
        try:
            await self._call("update_item", timeout, TableName=self.table,
                             Key=codec.key(tenure.stream_id), **expr.update_kwargs())
        except _ConditionFailed:
            return False
        return True

    async def force_release(self, stream_id: str, expect_owner: str | None = None,
                            expect_fence: int | None = None) -> ForceReleased:
        expr = codec.force_release_expr(expect_owner, expect_fence)
        try:
            resp = await self._call(
                "update_item", TableName=self.table, Key=codec.key(stream_id),
                ReturnValues="ALL_NEW", ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **expr.update_kwargs(),
            )
        except _ConditionFailed as failed:
            old = codec.decode_record(failed.item) if failed.item else None
            return ForceReleased(False, old)
        return ForceReleased(True, codec.decode_record(resp["Attributes"]))

    async def orphans(self, threshold_ms: int, limit: int, timeout: float | None = None,
                      page_size: int = 200) -> list[StreamRecord]:
        """STARTED items whose lease expired before ``threshold_ms`` (index, paginated)."""
        found: list[StreamRecord] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table, "IndexName": codec.INDEX_NAME,
            "KeyConditionExpression": "#ds = :started AND #exp < :threshold",
            "ExpressionAttributeNames": {"#ds": codec.DESIRED_STATE, "#exp": codec.LEASE_EXPIRES},
            "ExpressionAttributeValues": {":started": codec.s("STARTED"),
                                          ":threshold": codec.n(threshold_ms)},
            "Limit": max(1, min(limit, page_size)),
        }
        while len(found) < limit:
            resp = await self._call("query", timeout, **kwargs)
            found.extend(r for r in map(codec.decode_record, resp.get("Items", [])) if r)
            if "LastEvaluatedKey" not in resp:
                break
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return found[:limit]

    async def list_streams(self, page_size: int = 500) -> list[StreamRecord]:
        records = await self._scan(None, page_size)
        return sorted(records, key=lambda r: r.stream_id)

    async def _scan(self, timeout: float | None, page_size: int,
                    **filters: Any) -> list[StreamRecord]:
        found: list[StreamRecord] = []
        kwargs: dict[str, Any] = {"TableName": self.table, "Limit": page_size, **filters}
        while True:
            resp = await self._call("scan", timeout, **kwargs)
            found.extend(r for r in map(codec.decode_record, resp.get("Items", [])) if r)
            if "LastEvaluatedKey" not in resp:
                return found
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    async def adopt(self, stream_id: str) -> bool:
        """Index a hand-written item (expiry 0). False if it already had an expiry."""
        expr = codec.adopt_expr()
        try:
            await self._call("update_item", TableName=self.table, Key=codec.key(stream_id),
                             **expr.update_kwargs())
        except _ConditionFailed:
            return False
        return True

    async def record_error(self, stream_id: str, message: str, at_ms: int) -> None:
        expr = codec.record_error_expr(message, at_ms)
        with contextlib.suppress(_ConditionFailed):
            await self._call("update_item", TableName=self.table, Key=codec.key(stream_id),
                             **expr.update_kwargs())

    async def get(self, stream_id: str) -> StreamRecord | None:
        resp = await self._call("get_item", TableName=self.table, Key=codec.key(stream_id),
                                ConsistentRead=True)
        item = resp.get("Item")
        return codec.decode_record(item) if item else None

    async def put_started(self, stream_id: str, ws_url: str) -> StreamRecord:
        """Upsert as STARTED; a new item gets ``lease_expires_at_ms`` 0 (free now)."""
        resp = await self._call(
            "update_item", TableName=self.table, Key=codec.key(stream_id), ReturnValues="ALL_NEW",
            UpdateExpression="SET #ds = :started, #url = :url, #exp = if_not_exists(#exp, :zero)",
            ExpressionAttributeNames={"#ds": codec.DESIRED_STATE, "#url": codec.WS_URL,
                                      "#exp": codec.LEASE_EXPIRES},
            ExpressionAttributeValues={":started": codec.s("STARTED"), ":url": codec.s(ws_url),
                                       ":zero": codec.n(0)},
        )
        record = codec.decode_record(resp["Attributes"])
        assert record is not None
        return record

    async def set_state(self, stream_id: str, state: str) -> StreamRecord | None:
        """Set ``desired_state`` on an existing item; None if there is no such stream."""
        try:
            resp = await self._call(
                "update_item", TableName=self.table, Key=codec.key(stream_id),
                ReturnValues="ALL_NEW", ConditionExpression="attribute_exists(#pk)",
                UpdateExpression="SET #ds = :state",
                ExpressionAttributeNames={"#pk": codec.PK, "#ds": codec.DESIRED_STATE},
                ExpressionAttributeValues={":state": codec.s(state)},
            )
        except _ConditionFailed:
            return None
        return codec.decode_record(resp["Attributes"])

    # -- the fenced sink --------------------------------------------------------------

    async def write_batch(self, tenure: Tenure, prev_seq: int, frames: list[Frame],
                          now_wall_ms: int, timeout: float | None = None) -> SinkOutcome:
        """Deliver ``frames`` (in seq order, all above ``prev_seq``) in one transaction.

        The streams item is updated only if it still names this owner and fence and its
        checkpoint is still ``prev_seq``; the events items are written only together with
        it. A stale fence raises StaleFence and writes nothing. Re-sending a batch that
        already landed returns ALREADY_COMMITTED and writes nothing again.
        """
        if not frames:
            return SinkOutcome.COMMITTED
        chunks = codec.chunk_frames(frames)
        if len(chunks) + 1 > codec.MAX_TRANSACT_ACTIONS:
            raise ValueError(f"batch of {len(frames)} frames needs {len(chunks)} items")
        first, last = frames[0].seq, frames[-1].seq
        check = codec.checkpoint_expr(tenure.owner, tenure.fence, prev_seq, last)
        actions: list[dict[str, Any]] = [{
            "Update": {
                "TableName": self.table, "Key": codec.key(tenure.stream_id),
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD", **check.update_kwargs(),
            }
        }]
        for chunk in chunks:
            actions.append({"Put": {
                "TableName": self.events_table,
                "Item": codec.event_item(tenure.stream_id, tenure.fence, chunk, now_wall_ms),
                "ConditionExpression": "attribute_not_exists(#pk)",
                "ExpressionAttributeNames": {"#pk": codec.EV_PK},
            }})
        try:
            # No ClientRequestToken: a retried batch carries a new write time, which
            # DynamoDB would refuse as a parameter mismatch. The checkpoint condition
            # already makes a retry of a landed batch a no-op (ALREADY_COMMITTED).
            await self._call("transact_write_items", timeout, TransactItems=actions)
        except ClientError as exc:
            return self._cancelled(exc, tenure, first, last)
        return SinkOutcome.COMMITTED

    def _cancelled(self, exc: ClientError, tenure: Tenure, first: int, last: int) -> SinkOutcome:
        reasons = exc.response.get("CancellationReasons") or []
        codes = [r.get("Code") or "None" for r in reasons]
        if any(c in THROTTLE_CODES for c in codes):
            raise StoreThrottled(f"sink transaction throttled: {codes}") from exc
        if any(c in ("TransactionConflict", "TransactionInProgress") for c in codes):
            raise StoreUnavailable(f"sink transaction conflicted: {codes}") from exc
        if not reasons or codes[0] != "ConditionalCheckFailed":
            raise SinkConflict(f"sink transaction cancelled: {codes}") from exc
        old_item = reasons[0].get("Item")
        old = codec.decode_record(old_item) if old_item else None
        if old is None or old.lease_owner != tenure.owner or old.fence != tenure.fence:
            found = "missing" if old is None else f"owner={old.lease_owner} fence={old.fence}"
            raise StaleFence(
                f"stream {tenure.stream_id}: fence {tenure.fence} is stale ({found})") from exc
        if old.last_seq is not None and old.last_seq >= last:
            return SinkOutcome.ALREADY_COMMITTED
        raise SinkConflict(
            f"stream {tenure.stream_id}: checkpoint is {old.last_seq}, batch {first}..{last} "
            "does not follow it") from exc

    async def read_events(self, stream_id: str) -> AsyncIterator[Frame]:
        """Delivered frames of one stream in seq order (paginated, consistent reads)."""
        async for item in self._event_items(stream_id):
            for frame in codec.decode_event_item(item):
                yield frame

    async def event_fences(self, stream_id: str) -> list[int]:
        """The fence of each events item in seq order (for audits: never decreasing)."""
        return [int(item[codec.EV_FENCE]["N"]) async for item in self._event_items(stream_id)]

    async def _event_items(self, stream_id: str) -> AsyncIterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "TableName": self.events_table, "ConsistentRead": True,
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {"#pk": codec.EV_PK},
            "ExpressionAttributeValues": {":pk": codec.key(stream_id)[codec.PK]},
        }
        while True:
            resp = await self._call("query", **kwargs)
            for item in resp.get("Items", []):
                yield item
            if "LastEvaluatedKey" not in resp:
                return
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]


def _acquired(record: StreamRecord, owner: str, expiry: int) -> Acquired:
    if record.fence is None:
        raise StoreError(f"stream {record.stream_id} acquired without a fence")
    return Acquired(Tenure(record.stream_id, owner, record.fence, record.last_seq, expiry), record)


def _key_schema(schema_list: Iterable[dict[str, str]]) -> list[tuple[str, str]]:
    return sorted((k["AttributeName"], k["KeyType"]) for k in schema_list)


def _translate(exc: ClientError) -> StoreError:
    code = exc.response.get("Error", {}).get("Code", "")
    message = exc.response.get("Error", {}).get("Message", "")
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    text = f"{code}: {message}" if message else code
    if code in THROTTLE_CODES:
        return StoreThrottled(text)
    if code == "ResourceNotFoundException":
        return TableMissing(f"{text} (run `streamlease table create`)")
    if code in UNAVAILABLE_CODES or status >= 500:
        return StoreUnavailable(text or f"HTTP {status}")
    return StoreError(text)


def _outcome_label(error: StoreError) -> str:
    if isinstance(error, StoreThrottled):
        return "throttled"
    if isinstance(error, StoreUnavailable):
        return "unavailable"
    return "error"
