"""The ``kinesis://NAME``, ``sqs://NAME`` and ``s3://BUCKET/PREFIX`` outputs: at least once.

docs/sinks.md ("kinesis", "sqs", "s3") states each output's records, guarantee, order,
partial failures and limits. ``output(spec)`` opens one aioboto3 client for the worker's
lifetime and yields a factory of processors, one per tenure, sharing it; ``process``
returns only once the service has acknowledged every record of the batch. botocore's
errors do not leave this module: they are raised as ``AwsOutputError`` (operation, AWS
error code and message; never a payload).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import aioboto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError

from streamlease.core.sinks import SinkSpec
from streamlease.errors import ConfigError, StreamleaseError
from streamlease.logs import event
from streamlease.processor import Context, Message, Processor, ProcessorFactory
from streamlease.sinks import ProcessOnly, record_line

KiB = 1024
MiB = 1024 * KiB
KINESIS_MAX_RECORDS = 500
KINESIS_MAX_CALL_BYTES = 5 * MiB  # data plus partition keys, the whole request
KINESIS_MAX_RECORD_BYTES = 1 * MiB  # one record's data plus its partition key
KINESIS_MAX_KEY_CHARS = 256
SQS_MAX_ENTRIES = 10
SQS_MAX_BYTES = 256 * KiB  # one message, and a whole batch
SQS_MAX_ID_CHARS = 128  # MessageGroupId and MessageDeduplicationId
MAX_POOL_CONNECTIONS = 50

_KINESIS_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_KINESIS_ARN = re.compile(
    r"^arn:aws[a-z-]*:kinesis:[a-z0-9-]+:\d{12}:stream/[A-Za-z0-9_.-]{1,128}$")
_SQS_NAME = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_SQS_ARN = re.compile(r"^arn:aws[a-z-]*:sqs:[a-z0-9-]+:(\d{12}):([A-Za-z0-9_.-]{1,80})$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_IPV4 = re.compile(r"^\d+\.\d+\.\d+\.\d+$")
_SQS_ID = re.compile(r"^[\x21-\x7e]+$")  # what SQS accepts in group and deduplication ids
_MISSING_QUEUE = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
_ACCESS_DENIED = frozenset({"AccessDenied", "AccessDeniedException"})

T = TypeVar("T")


class AwsOutputError(StreamleaseError):
    """An AWS output could not deliver a batch (a failed call, failed records, an
    unreachable endpoint): the worker retries the batch. The message names the
    operation and AWS's error code, never a payload or a credential."""

    retriable = True


class RecordTooLarge(AwsOutputError):
    """A record exceeds what the service accepts: retrying cannot succeed, so the batch
    ends in the dead-letter destination or stops the stream."""

    retriable = False


def encode(message: Message, ctx: Context) -> bytes:
    """One record, compact JSON (ASCII: valid in every service's body)."""
    line = record_line(ctx.stream_id, message.seq, ctx.fence, message.data, ctx.failure)
    return json.dumps(line, separators=(",", ":")).encode()


def _digest(stream_id: str) -> str:
    return hashlib.sha256(stream_id.encode("utf-8", "surrogatepass")).hexdigest()


def partition_key(stream_id: str) -> str:
    """The stream id, or ``sha256-<hex>`` of it when Kinesis would refuse it (empty or
    over 256 characters): still one key, so one shard, per stream."""
    if 0 < len(stream_id) <= KINESIS_MAX_KEY_CHARS:
        return stream_id
    return f"sha256-{_digest(stream_id)}"


def group_id(stream_id: str) -> str:
    """The FIFO ``MessageGroupId``: the stream id when SQS accepts it (printable ASCII,
    short enough that ``stream_id:seq`` fits 128 characters), else ``sha256-<hex>``."""
    if _SQS_ID.match(stream_id) and len(stream_id) <= SQS_MAX_ID_CHARS - 21:
        return stream_id
    return f"sha256-{_digest(stream_id)}"


def object_key(prefix: str, stream_id: str, first_seq: int, last_seq: int) -> str:
    """``PREFIX/<stream_id>/<first:020d>-<last:020d>.jsonl``; the id percent-encoded where
    it is not key-safe (``/`` too, and a leading dot), a very long one cut and suffixed
    with a hash so the key stays well under S3's 1024 bytes."""
    name = quote(stream_id, safe="-_.!*'()")
    if name.startswith("."):
        name = "%2E" + name[1:]
    if not name:
        name = "%00empty"  # quote never emits a bare "%0", so no real id maps here
    if len(name) > 200:
        name = f"{name[:120]}~{_digest(stream_id)[:32]}"
    leaf = f"{name}/{first_seq:020d}-{last_seq:020d}.jsonl"
    return f"{prefix}/{leaf}" if prefix else leaf


def chunks(items: Sequence[T], size: Callable[[T], int], max_items: int,
           max_bytes: int) -> list[list[T]]:
    """Consecutive runs of ``items``, in order, each within both limits (every item must
    fit a call on its own: callers check that first)."""
    out: list[list[T]] = []
    current: list[T] = []
    total = 0
    for item in items:
        n = size(item)
        if current and (len(current) >= max_items or total + n > max_bytes):
            out.append(current)
            current, total = [], 0
        current.append(item)
        total += n
    if current:
        out.append(current)
    return out


async def _call(operation: str, call: Awaitable[T]) -> T:
    """One AWS call; its errors as ``AwsOutputError`` (code and message, nothing else)."""
    try:
        return await call
    except ClientError as exc:
        raise AwsOutputError(f"{operation}: {_code(exc)}: "
                             f"{exc.response.get('Error', {}).get('Message', '')}"[:300]) from exc
    except (BotoCoreError, OSError, TimeoutError) as exc:
        raise AwsOutputError(f"{operation}: {type(exc).__name__}: {exc}"[:300]) from exc
    except Exception as exc:
        # aiohttp raises its own errors for broken connections.
        if type(exc).__module__.startswith("aiohttp"):
            raise AwsOutputError(f"{operation}: {type(exc).__name__}: {exc}"[:300]) from exc
        raise


def _code(exc: ClientError) -> str:
    error = exc.response.get("Error", {})
    return str(error.get("Code") or error.get("QueryErrorCode") or "Unknown")


@dataclass(frozen=True)
class _Record:
    seq: int
    body: bytes


def _records(batch: Sequence[Message], ctx: Context, limit: int, extra: int,
             kind: str) -> list[_Record]:
    """The batch encoded; ``RecordTooLarge`` (nothing sent yet) if one exceeds ``limit``."""
    records = [_Record(m.seq, encode(m, ctx)) for m in batch]
    for record in records:
        if len(record.body) + extra > limit:
            raise RecordTooLarge(
                f"{kind}: the record of seq {record.seq} is {len(record.body) + extra} bytes, "
                f"over the {limit // KiB} KiB a {kind} record may hold")
    return records


def _undelivered(batch: Sequence[Message], delivered: int | None) -> list[Message]:
    """The batch after ``delivered`` (a retry resumes where the last attempt got to)."""
    return [m for m in batch if delivered is None or m.seq > delivered]


class KinesisProcessor(ProcessOnly):
    """One tenure's ``PutRecords`` writer. ``delivered`` is the highest seq known to be in
    the shard with every earlier seq of the tenure before it: a retried batch resumes
    after it."""

    def __init__(self, client: Any, target: dict[str, str]) -> None:
        self.client = client
        self.target = target
        self.delivered: int | None = None

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        key = partition_key(ctx.stream_id)
        extra = len(key.encode())
        pending = _records(_undelivered(batch, self.delivered), ctx,
                           KINESIS_MAX_RECORD_BYTES, extra, "kinesis")
        while pending:
            chunk = chunks(pending, lambda r: len(r.body) + extra, KINESIS_MAX_RECORDS,
                           KINESIS_MAX_CALL_BYTES)[0]
            answer = await _call("PutRecords", self.client.put_records(
                Records=[{"Data": r.body, "PartitionKey": key} for r in chunk], **self.target))
            results = answer.get("Records", [])
            failed = next((i for i, r in enumerate(results) if r.get("ErrorCode")),
                          None if len(results) == len(chunk) else len(results))
            if failed is None:
                self.delivered = chunk[-1].seq
                pending = pending[len(chunk):]
                continue
            codes = sorted({str(r.get("ErrorCode")) for r in results if r.get("ErrorCode")})
            landed_after = sum(1 for r in results[failed:] if not r.get("ErrorCode"))
            event(logging.WARNING, "sink.kinesis_partial",
                  "PutRecords failed some records; sending again from the first failed one",
                  stream=ctx.stream_id, fence=ctx.fence, first_failed_seq=chunk[failed].seq,
                  failed=int(answer.get("FailedRecordCount", 0)), codes=",".join(codes),
                  out_of_order=landed_after)
            if failed == 0:
                raise AwsOutputError(
                    f"PutRecords: {answer.get('FailedRecordCount', '?')} of {len(chunk)} "
                    f"records failed ({', '.join(codes) or 'no result'}) from seq "
                    f"{chunk[0].seq}; resending from there")
            # Records [0, failed) are in the shard, in order. Some after ``failed`` may
            # have landed too (PutRecords does not stop at a failure): they are sent again
            # after the failed one, so the shard holds the stream in order once more.
            self.delivered = chunk[failed - 1].seq
            pending = pending[failed:]


class SqsProcessor(ProcessOnly):
    """One tenure's ``SendMessageBatch`` writer; ``delivered`` as for Kinesis."""

    def __init__(self, client: Any, queue: _Queue) -> None:
        self.client = client
        self.queue = queue
        self.delivered: int | None = None

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        records = _records(_undelivered(batch, self.delivered), ctx, SQS_MAX_BYTES, 0, "sqs")
        if not records:
            return
        url = await self.queue.url()
        group = group_id(ctx.stream_id)
        for chunk in chunks(records, lambda r: len(r.body), SQS_MAX_ENTRIES, SQS_MAX_BYTES):
            entries = []
            for i, record in enumerate(chunk):
                entry: dict[str, Any] = {"Id": str(i), "MessageBody": record.body.decode()}
                if self.queue.fifo:
                    entry["MessageGroupId"] = group
                    entry["MessageDeduplicationId"] = f"{group}:{record.seq}"
                entries.append(entry)
            answer = await _call("SendMessageBatch", self.client.send_message_batch(
                QueueUrl=url, Entries=entries))
            failed = sorted(int(f["Id"]) for f in answer.get("Failed", []))
            ok = {int(s["Id"]) for s in answer.get("Successful", [])}
            first_bad = failed[0] if failed else next(
                (i for i in range(len(chunk)) if i not in ok), None)
            if first_bad is None:
                self.delivered = chunk[-1].seq
                continue
            if first_bad > 0:
                self.delivered = chunk[first_bad - 1].seq
            codes = sorted({str(f.get("Code")) for f in answer.get("Failed", [])})
            raise AwsOutputError(
                f"SendMessageBatch: {len(failed) or len(chunk) - len(ok)} of {len(chunk)} "
                f"messages failed ({', '.join(codes) or 'no result'}) from seq "
                f"{chunk[first_bad].seq}")


class S3Processor(ProcessOnly):
    """One object per batch: the same batch always makes the same key and body."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix

    async def process(self, batch: Sequence[Message], ctx: Context) -> None:
        if not batch:
            return
        body = b"".join(encode(m, ctx) + b"\n" for m in batch)
        key = object_key(self.prefix, ctx.stream_id, batch[0].seq, batch[-1].seq)
        await _call("PutObject", self.client.put_object(
            Bucket=self.bucket, Key=key, Body=body, ContentType="application/x-ndjson"))


class _Queue:
    """The queue URL, resolved once: at start-up if SQS answers, else on first use (an
    unreachable endpoint is retried with the batch, not a configuration error)."""

    def __init__(self, client: Any, params: dict[str, str], name: str) -> None:
        self.client = client
        self.params = params
        self.name = name
        self.fifo = name.endswith(".fifo")
        self._url: str | None = None
        self._lock = asyncio.Lock()

    async def url(self) -> str:
        if self._url is None:
            async with self._lock:
                if self._url is None:
                    await self.resolve()
        assert self._url is not None
        return self._url

    async def resolve(self) -> None:
        try:
            answer = await self.client.get_queue_url(**self.params)
        except ClientError as exc:
            raise AwsOutputError(f"GetQueueUrl {self.name!r}: {_code(exc)}") from exc
        except (BotoCoreError, OSError, TimeoutError) as exc:
            raise AwsOutputError(f"GetQueueUrl: {type(exc).__name__}: {exc}"[:300]) from exc
        self._url = str(answer["QueueUrl"])

    async def resolve_at_start(self, sink: str) -> None:
        """Resolve now. A missing queue or a refused ``GetQueueUrl`` is a configuration
        error; anything else (an unreachable endpoint) leaves it for the first batch."""
        try:
            await self.url()
        except AwsOutputError as exc:
            cause = exc.__cause__
            code = _code(cause) if isinstance(cause, ClientError) else ""
            if code in _MISSING_QUEUE:
                raise ConfigError([f"STREAMLEASE_SINK: SQS queue {self.name!r} does not "
                                   "exist"]) from exc
            if code in _ACCESS_DENIED:
                raise ConfigError([f"STREAMLEASE_SINK: access denied to SQS queue "
                                   f"{self.name!r} (needs sqs:GetQueueUrl and "
                                   "sqs:SendMessage)"]) from exc
            event(logging.WARNING, "sink.sqs_unresolved",
                  "the SQS queue URL is not known yet; resolving it with the first batch",
                  sink=sink, error=str(exc))


def _problems(spec: SinkSpec) -> list[str]:
    name = spec.target
    if spec.kind == "kinesis" and not (_KINESIS_NAME.match(name) or _KINESIS_ARN.match(name)):
        return [f"STREAMLEASE_SINK: {name!r} is not a Kinesis stream name (1-128 of "
                "A-Z a-z 0-9 _ . -) or stream ARN"]
    if spec.kind == "sqs" and not _SQS_ARN.match(name):
        base = name[:-5] if name.endswith(".fifo") else name
        if not _SQS_NAME.match(base) or len(name) > 80:
            return [f"STREAMLEASE_SINK: {name!r} is not an SQS queue name (1-80 of "
                    "A-Z a-z 0-9 _ -, a FIFO queue ending in .fifo) or queue ARN"]
    if spec.kind == "s3":
        if not _BUCKET.match(name) or ".." in name or _IPV4.match(name):
            return [f"STREAMLEASE_SINK: {name!r} is not an S3 bucket name (3-63 of "
                    "a-z 0-9 . -, starting and ending with a letter or digit)"]
        if len(spec.prefix.encode()) > 512:
            return ["STREAMLEASE_SINK: the S3 key prefix is over 512 bytes"]
    if spec.kind not in ("kinesis", "sqs", "s3"):
        return [f"STREAMLEASE_SINK: {spec.describe()} is not an AWS output"]
    return []


def region(session: aioboto3.Session, kind: str) -> str:
    """``AWS_REGION`` (what ECS sets), else botocore's own lookup; passed to the client
    explicitly because botocore 1.40 does not read ``AWS_REGION`` on every path."""
    name = os.environ.get("AWS_REGION", "").strip() or session.region_name
    if not name:
        raise ConfigError([f"AWS_REGION: not set (the region of the {kind} sink)"])
    return str(name)


def client_config() -> BotoConfig:
    # botocore's standard retries (AWS_MAX_ATTEMPTS, 3 by default, with backoff on
    # throttling and 5xx) absorb brief faults; what is left is raised and retried by the
    # worker with the batch.
    return BotoConfig(retries={"mode": "standard"}, connect_timeout=3,
                      read_timeout=20, max_pool_connections=MAX_POOL_CONNECTIONS,
                      tcp_keepalive=True)


@contextlib.asynccontextmanager
async def output(spec: SinkSpec) -> AsyncIterator[ProcessorFactory]:
    """The processor factory of a ``kinesis``, ``sqs`` or ``s3`` sink, with one client
    for the worker's lifetime. ConfigError for a bad name or no region."""
    problems = _problems(spec)
    if problems:
        raise ConfigError(problems)
    session = aioboto3.Session()
    name = region(session, spec.kind)
    async with session.client(spec.kind, region_name=name, config=client_config()) as client:
        event(logging.INFO, "sink.aws_open", "AWS output ready", sink=spec.describe(),
              region=name)
        factory: Callable[[], Processor]
        if spec.kind == "kinesis":
            target = ({"StreamARN": spec.target} if spec.target.startswith("arn:")
                      else {"StreamName": spec.target})
            factory = lambda: KinesisProcessor(client, target)  # noqa: E731
        elif spec.kind == "sqs":
            arn = _SQS_ARN.match(spec.target)
            params = ({"QueueName": arn.group(2), "QueueOwnerAWSAccountId": arn.group(1)}
                      if arn else {"QueueName": spec.target})
            queue = _Queue(client, params, params["QueueName"])
            await queue.resolve_at_start(spec.describe())
            factory = lambda: SqsProcessor(client, queue)  # noqa: E731
        else:
            factory = lambda: S3Processor(client, spec.target, spec.prefix)  # noqa: E731
        yield factory
