"""The change feed: reading the streams table's DynamoDB stream, shard by shard.

DynamoDB Streams allows about two concurrent readers per shard, so one reader serves the
fleet (the leader's). ``ChangeFeedReader``:

* ``open()`` finds the table's latest stream (ListStreams), lists its shards (DescribeStream,
  paginated) and loads the checkpoints (``FeedCheckpointStore``);
* ``poll()`` makes one pass: for each shard it may read (a child only after its parent has
  been read to its end), one GetRecords from the shard's position, the checkpoint
  (``AFTER_SEQUENCE_NUMBER``) or, for a shard never read, ``TRIM_HORIZON``; it returns one
  ``Batch`` of decoded records (``streamlease.core.changes.ChangeRecord``) per shard read;
* ``commit(batch)`` checkpoints the batch under the reader's leader fence once the caller
  has carried out its actions (so a change is processed at least once); ``False`` means a
  reader with a higher fence owns the feed now: stop.

Every fault is a value the caller acts on (``Fault``), never an exception out of ``poll``:

* ``trimmed``: a checkpoint or iterator below the trim horizon (24 h retention), or a
  checkpointed shard gone. The reader reads on from the horizon; ``backstop`` (changes
  were missed).
* ``expired_iterator``: an iterator older than 15 minutes. The reader takes a new one from
  its position; nothing is missed.
* ``throttled`` (``LimitExceededException`` and kin) and ``other`` (timeouts, 5xx): the pass
  ends; ``retry_after_s`` grows with each failed pass (capped), and resets on a clean one.
* ``no_stream``: the table has no enabled stream. The reader closes (``poll`` opens it
  again); ``backstop`` (fall back to the backstop scan).

A first start without any checkpoint reads open shards from ``LATEST`` (the table's past is
the backstop scan's to find, not 24 h of heartbeat records) and says ``backstop``.

The DynamoDB Streams client is pointed at ``AWS_ENDPOINT_URL_DYNAMODBSTREAMS`` when set,
else wherever botocore's own settings say, else at ``AWS_ENDPOINT_URL_DYNAMODB`` (a local
server serves both): ``streams_endpoint``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import aioboto3
from botocore.exceptions import ClientError

from streamlease.clock import Clock
from streamlease.core.changes import ChangeEvent, ChangeRecord
from streamlease.core.model import stream_id_from_key
from streamlease.errors import StoreError, StoreThrottled
from streamlease.store import codec
from streamlease.store.dynamodb.client import DynamoClient, DynamoTable, Observer, client_config
from streamlease.store.feedcheckpoints import Checkpoint, FeedCheckpointStore

STREAMS_ENDPOINT = "AWS_ENDPOINT_URL_DYNAMODBSTREAMS"
DYNAMODB_ENDPOINT = "AWS_ENDPOINT_URL_DYNAMODB"
# botocore's own names for the same endpoint: when set, botocore applies them itself.
BOTOCORE_ENDPOINTS = ("AWS_ENDPOINT_URL_DYNAMODB_STREAMS", "AWS_ENDPOINT_URL")
ENDED = "END"  # a checkpoint's sequence number once its (closed) shard has been read out
MAX_LIMIT = 1000
RETRY_BASE_S = 0.5
RETRY_CAP_S = 30.0
TRIMMED_CODES = frozenset({"TrimmedDataAccessException"})
EXPIRED_CODES = frozenset({"ExpiredIteratorException"})


def streams_endpoint(environ: Mapping[str, str]) -> str | None:
    """The endpoint URL to give the DynamoDB Streams client (None: botocore decides)."""
    explicit = environ.get(STREAMS_ENDPOINT, "").strip()
    if explicit:
        return explicit
    if any(environ.get(name, "").strip() for name in BOTOCORE_ENDPOINTS):
        return None
    return environ.get(DYNAMODB_ENDPOINT, "").strip() or None


@contextlib.asynccontextmanager
async def open_streams_client(region: str, *, connections: int = 4,
                              observe: Observer | None = None, call_timeout_s: float = 10.0,
                              environ: Mapping[str, str] | None = None,
                              ) -> AsyncIterator[DynamoClient]:
    """A DynamoDB Streams client with the project's conventions (no botocore retries, a
    timeout on every call, errors translated, calls metered)."""
    env = os.environ if environ is None else environ
    session = aioboto3.Session()
    async with session.client("dynamodbstreams", region_name=region,
                              endpoint_url=streams_endpoint(env),
                              config=client_config(connections)) as raw:
        yield DynamoClient(raw, observe, call_timeout_s)


class FaultKind(StrEnum):
    TRIMMED = "trimmed"
    EXPIRED_ITERATOR = "expired_iterator"
    THROTTLED = "throttled"
    NO_STREAM = "no_stream"
    OTHER = "other"


FAULT_KINDS = tuple(k.value for k in FaultKind)  # metric label values


@dataclass(frozen=True)
class Fault:
    """Something went wrong; ``backstop``: changes may have been missed, run one backstop
    scan; ``retry_after_s``: wait this long before the next ``poll`` (0: at once)."""

    kind: FaultKind
    detail: str
    shard_id: str | None = None
    backstop: bool = False
    retry_after_s: float = 0.0


@dataclass(frozen=True)
class Opened:
    stream_arn: str
    shards: int
    resumed: int  # shards with a checkpoint to resume from
    backstop: bool  # a first start (no checkpoint): the past is the backstop scan's


@dataclass(frozen=True)
class Batch:
    """One GetRecords' worth of one shard. ``position``: what ``commit`` checkpoints (the
    last record's sequence number; ``ENDED`` for a shard read out; None: nothing to save).
    ``skipped``: records not about a stream item (another key, an undecodable record).
    ``lag_s``: how far behind the newest record read is (0 at the shard's tip)."""

    shard_id: str
    records: tuple[ChangeRecord, ...]
    position: str | None
    lag_s: float
    skipped: int = 0
    shard_ended: bool = False


FeedResult = Batch | Fault


class FeedMetrics(Protocol):
    def change_feed_lag(self, seconds: float) -> None: ...

    def change_feed_error(self, kind: str) -> None: ...


@dataclass
class _Shard:
    shard_id: str
    parent: str | None
    closed: bool  # has an ending sequence number: it will end


@dataclass
class _State:
    shards: dict[str, _Shard] = field(default_factory=dict)  # in DescribeStream's order
    position: dict[str, str] = field(default_factory=dict)  # last sequence number read
    iterator: dict[str, str] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)  # read to the end
    latest: set[str] = field(default_factory=set)  # first start: begin at LATEST


def _code(exc: BaseException) -> str:
    cause = exc.__cause__
    if isinstance(cause, ClientError):
        return str(cause.response.get("Error", {}).get("Code", ""))
    return ""


def _epoch_ms(value: Any) -> int | None:
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value * 1000)
    return None


def decode_change(raw: Mapping[str, Any], shard_id: str) -> ChangeRecord | None:
    """A stream record as a ``ChangeRecord``; None if it is not about a stream item."""
    try:
        body = raw["dynamodb"]
        event = ChangeEvent(raw["eventName"])
        stream_id = stream_id_from_key(str(body["Keys"][codec.PK]["S"]))
        sequence = str(body["SequenceNumber"])
        old_image, new_image = body.get("OldImage"), body.get("NewImage")
        old = codec.decode_record(old_image) if isinstance(old_image, dict) else None
        new = codec.decode_record(new_image) if isinstance(new_image, dict) else None
    except (KeyError, TypeError, ValueError):
        return None
    if stream_id is None:
        return None
    return ChangeRecord(stream_id, event, old, new,
                        _epoch_ms(body.get("ApproximateCreationDateTime")), shard_id, sequence)


def parent_first(shards: Mapping[str, _Shard]) -> list[str]:
    """Shard ids, each parent (when listed) before its children, else in listed order."""
    ordered: list[str] = []
    seen: set[str] = set()

    def visit(shard_id: str, path: frozenset[str]) -> None:
        if shard_id in seen or shard_id in path:
            return
        parent = shards[shard_id].parent
        if parent is not None and parent in shards:
            visit(parent, path | {shard_id})
        seen.add(shard_id)
        ordered.append(shard_id)

    for shard_id in shards:
        visit(shard_id, frozenset())
    return ordered


@dataclass(frozen=True)
class FeedSource:
    """What every leader term's reader shares: the DynamoDB Streams ``client``, the streams
    ``table``, where the ``checkpoints`` are kept, the ``clock`` (lag, checkpoint times),
    at most ``limit`` records a GetRecords, and ``metrics`` (lag and faults)."""

    client: DynamoClient
    table: str
    checkpoints: FeedCheckpointStore
    clock: Clock
    limit: int = MAX_LIMIT
    metrics: FeedMetrics | None = None


class ChangeFeedReader(DynamoTable):
    """The streams table's change feed, read under one leader fence (see the module doc)."""

    def __init__(self, source: FeedSource, fence: int) -> None:
        super().__init__(source.client)
        self.table = source.table
        self.checkpoints = source.checkpoints
        self.fence = fence
        self.clock = source.clock
        self.limit = max(1, min(MAX_LIMIT, source.limit))
        self.metrics = source.metrics
        self.stream_arn: str | None = None
        self._state = _State()
        self._describe = True
        self._failures = 0

    # -- opening ------------------------------------------------------------------------

    async def open(self) -> Opened | Fault:
        """Find the stream, its shards and the checkpoints. A ``Fault`` leaves it closed."""
        self.stream_arn = None
        self._state = _State()
        try:
            arn = await self._latest_stream()
            if arn is None:
                return self._fault(FaultKind.NO_STREAM, f"table {self.table} has no stream",
                                   backstop=True)
            self.stream_arn = arn
            shards = await self._shards()
            if isinstance(shards, Fault):
                return shards
            saved = await self.checkpoints.load()
        except StoreError as exc:
            self.stream_arn = None
            return self._error(exc, None)
        state = self._state
        state.shards = shards
        gone = []
        for shard_id, checkpoint in saved.items():
            if checkpoint.sequence_number == ENDED:
                state.done.add(shard_id)
            elif shard_id in shards:
                state.position[shard_id] = checkpoint.sequence_number
            else:
                gone.append(shard_id)
        fresh = not saved
        if fresh:
            for shard in shards.values():
                if shard.closed:
                    state.done.add(shard.shard_id)  # the past: the backstop's to find
                else:
                    state.latest.add(shard.shard_id)
        self._describe = False
        if gone:
            # Checkpointed shards past retention: what they held after the checkpoint is lost.
            for shard_id in gone:
                with contextlib.suppress(StoreError):
                    await self.checkpoints.forget(shard_id, self.fence)
            return self._fault(FaultKind.TRIMMED, f"shards gone past retention: {gone}",
                               shard_id=gone[0], backstop=True, keep_open=True)
        return Opened(arn, len(shards), len(state.position), backstop=fresh)

    async def _latest_stream(self) -> str | None:
        streams: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {"TableName": self.table}
        while True:
            resp = await self._call("list_streams", **kwargs)
            streams.extend(resp.get("Streams", []))
            last = resp.get("LastEvaluatedStreamArn")
            if not last:
                break
            kwargs["ExclusiveStartStreamArn"] = last
        mine = [s for s in streams if s.get("TableName") == self.table and s.get("StreamArn")]
        if not mine:
            return None
        return str(max(mine, key=lambda s: str(s.get("StreamLabel", "")))["StreamArn"])

    async def _shards(self) -> dict[str, _Shard] | Fault:
        assert self.stream_arn is not None
        shards: dict[str, _Shard] = {}
        kwargs: dict[str, Any] = {"StreamArn": self.stream_arn}
        while True:
            try:
                desc = (await self._call("describe_stream", **kwargs))["StreamDescription"]
            except StoreError as exc:
                if _code(exc) == "ResourceNotFoundException":
                    return self._no_stream(f"stream {self.stream_arn} not found")
                raise
            if desc.get("StreamStatus") not in ("ENABLED", "ENABLING"):
                return self._no_stream(f"stream {self.stream_arn} is {desc.get('StreamStatus')}")
            for raw in desc.get("Shards", []):
                shard_id = str(raw["ShardId"])
                ending = raw.get("SequenceNumberRange", {}).get("EndingSequenceNumber")
                shards[shard_id] = _Shard(shard_id, raw.get("ParentShardId"), ending is not None)
            last = desc.get("LastEvaluatedShardId")
            if not last:
                return shards
            kwargs["ExclusiveStartShardId"] = last

    # -- reading ------------------------------------------------------------------------

    async def poll(self) -> list[FeedResult]:
        """One pass over the readable shards (see the module doc). Never raises a store
        error: faults are results; after ``no_stream`` the reader is closed."""
        if self.stream_arn is None:
            opened = await self.open()
            if isinstance(opened, Fault):
                return [opened]
        results: list[FeedResult] = []
        try:
            if self._describe:
                shards = await self._shards()
                if isinstance(shards, Fault):
                    return [shards]
                self._state.shards = shards
                self._describe = False
            for shard_id in self._readable():
                result = await self._read(shard_id)
                results.append(result)
                if isinstance(result, Fault) and result.kind in (FaultKind.THROTTLED,
                                                                 FaultKind.OTHER):
                    break
        except StoreError as exc:
            results.append(self._error(exc, None))
        if not any(isinstance(r, Fault) for r in results):
            self._failures = 0
        if self.metrics is not None:
            lags = [r.lag_s for r in results if isinstance(r, Batch)]
            if lags:
                self.metrics.change_feed_lag(max(lags))
        return results

    def _readable(self) -> list[str]:
        state = self._state
        ready = []
        for shard_id in parent_first(state.shards):
            if shard_id in state.done:
                continue
            parent = state.shards[shard_id].parent
            if parent is not None and parent in state.shards and parent not in state.done:
                continue  # parent first
            ready.append(shard_id)
        return ready

    async def _iterator(self, shard_id: str) -> str | Fault:
        state = self._state
        have = state.iterator.get(shard_id)
        if have is not None:
            return have
        kwargs: dict[str, Any] = {"StreamArn": self.stream_arn, "ShardId": shard_id}
        if shard_id in state.position:
            kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER",
                          SequenceNumber=state.position[shard_id])
        elif shard_id in state.latest:
            kwargs["ShardIteratorType"] = "LATEST"
        else:
            kwargs["ShardIteratorType"] = "TRIM_HORIZON"
        try:
            resp = await self._call("get_shard_iterator", **kwargs)
        except StoreError as exc:
            code = _code(exc)
            if code in TRIMMED_CODES or code == "ResourceNotFoundException":
                # The checkpoint is below the horizon (or the shard is gone): read on from
                # what is left; what was trimmed is the backstop scan's to find.
                state.position.pop(shard_id, None)
                state.latest.discard(shard_id)
                if code == "ResourceNotFoundException":
                    state.done.add(shard_id)
                    self._describe = True
                return self._fault(FaultKind.TRIMMED, f"shard {shard_id}: {code}",
                                   shard_id=shard_id, backstop=True, keep_open=True)
            raise
        iterator = resp.get("ShardIterator")
        if not iterator:  # a closed shard read out
            return ""
        state.iterator[shard_id] = str(iterator)
        return str(iterator)

    async def _read(self, shard_id: str) -> FeedResult:
        state = self._state
        try:
            iterator = await self._iterator(shard_id)
            if isinstance(iterator, Fault):
                return iterator
            if iterator == "":
                return self._ended(shard_id, [], 0)
            resp = await self._call("get_records", ShardIterator=iterator, Limit=self.limit)
        except StoreError as exc:
            code = _code(exc)
            state.iterator.pop(shard_id, None)
            if code in EXPIRED_CODES:
                # From a position: nothing is lost. From LATEST with nothing read yet, what
                # came while the iterator lay unused is: the backstop finds it.
                return self._fault(FaultKind.EXPIRED_ITERATOR, f"shard {shard_id}: {code}",
                                   shard_id=shard_id, backstop=shard_id in state.latest,
                                   keep_open=True)
            if code in TRIMMED_CODES:
                state.position.pop(shard_id, None)
                state.latest.discard(shard_id)  # read on from the horizon
                return self._fault(FaultKind.TRIMMED, f"shard {shard_id}: {code}",
                                   shard_id=shard_id, backstop=True, keep_open=True)
            # Read from LATEST with nothing read yet, a new iterator starts at the tip
            # again: what came meanwhile is the backstop's to find.
            return self._error(exc, shard_id, backstop=shard_id in state.latest)
        raws = resp.get("Records") or []
        records = []
        for raw in raws:
            change = decode_change(raw, shard_id) if isinstance(raw, dict) else None
            if change is not None:
                records.append(change)
        skipped = len(raws) - len(records)
        last = _last_sequence(raws)
        if last is not None:
            state.position[shard_id] = last
            state.latest.discard(shard_id)
        following = resp.get("NextShardIterator")
        if not following:
            state.iterator.pop(shard_id, None)
            return self._ended(shard_id, records, skipped)
        state.iterator[shard_id] = str(following)
        return Batch(shard_id, tuple(records), last, self._lag(records), skipped)

    def _ended(self, shard_id: str, records: list[ChangeRecord], skipped: int) -> Batch:
        """A closed shard read to its end: its children become readable."""
        self._state.done.add(shard_id)
        self._describe = True
        return Batch(shard_id, tuple(records), ENDED, self._lag(records), skipped,
                     shard_ended=True)

    def _lag(self, records: list[ChangeRecord]) -> float:
        stamps = [r.approximate_at_ms for r in records if r.approximate_at_ms is not None]
        if not stamps:
            return 0.0
        return max(0.0, (self.clock.wall_ms() - max(stamps)) / 1000)

    # -- checkpoints --------------------------------------------------------------------

    async def commit(self, batch: Batch) -> bool:
        """Checkpoint ``batch`` (after its actions were carried out). False: a reader with
        a higher fence has checkpointed this shard, so this one must stop. A store error
        propagates (the checkpoint may or may not be written; the next commit retries)."""
        if batch.position is None:
            return True
        return await self.checkpoints.save(Checkpoint(
            batch.shard_id, batch.position, self.fence, self.clock.wall_ms()))

    # -- faults -------------------------------------------------------------------------

    def _no_stream(self, detail: str) -> Fault:
        self.stream_arn = None
        return self._fault(FaultKind.NO_STREAM, detail, backstop=True)

    def _error(self, exc: StoreError, shard_id: str | None, backstop: bool = False) -> Fault:
        if _code(exc) == "ResourceNotFoundException" and shard_id is None:
            return self._no_stream(f"{exc}")
        kind = FaultKind.THROTTLED if isinstance(exc, StoreThrottled) else FaultKind.OTHER
        self._failures += 1
        delay = min(RETRY_CAP_S, RETRY_BASE_S * 2 ** (self._failures - 1))
        return self._fault(kind, str(exc), shard_id=shard_id, retry_after_s=delay,
                           keep_open=True, backstop=backstop)

    def _fault(self, kind: FaultKind, detail: str, *, shard_id: str | None = None,
               backstop: bool = False, retry_after_s: float = 0.0,
               keep_open: bool = False) -> Fault:
        if not keep_open:
            self.stream_arn = None
        if self.metrics is not None:
            self.metrics.change_feed_error(kind.value)
        return Fault(kind, detail, shard_id, backstop, retry_after_s)


def _last_sequence(raws: list[Any]) -> str | None:
    for raw in reversed(raws):
        try:
            return str(raw["dynamodb"]["SequenceNumber"])
        except (KeyError, TypeError):
            continue
    return None
