"""The DynamoDB plumbing every store class shares: one aioboto3 client, one way to call it.

botocore's own retries are off: a blindly retried conditional write can turn a win into
an apparent loss, so each caller decides how to retry, and every call runs under an
explicit timeout. Errors are translated into ``streamlease.errors`` here; a failed condition
becomes ``ConditionFailed`` (carrying the old item when asked for), which the store
classes turn into result values. This package is the only code that imports botocore.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from botocore.config import Config as BotoConfig
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from streamlease.errors import (
    ConfigError,
    StoreError,
    StoreThrottled,
    StoreUnavailable,
    TableMissing,
)

Observer = Callable[[str, str, float], None]  # (operation, outcome, seconds)
ReadCounter = Callable[[str, int], None]  # (operation, items read)

THROTTLE_CODES = frozenset({
    "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded",
    "Throttling", "ThrottlingError", "LimitExceededException",
})
UNAVAILABLE_CODES = frozenset({
    "InternalServerError", "InternalFailure", "ServiceUnavailable", "TransactionConflictException",
    "TransactionInProgressException", "RequestTimeout", "RequestTimeoutException",
})
# Reasons inside a TransactionCanceledException.
TXN_THROTTLE_REASONS = frozenset({"ThrottlingError", "ProvisionedThroughputExceeded",
                                  "RequestLimitExceeded"})
TXN_CONFLICT_REASONS = frozenset({"TransactionConflict", "TransactionInProgress"})


class ConditionFailed(Exception):
    """A conditional write's condition did not hold (not an error: callers decide)."""

    def __init__(self, item: dict[str, Any] | None) -> None:
        super().__init__("condition failed")
        self.item = item


class TransactionCancelled(Exception):
    """A transaction was cancelled; ``reasons`` are DynamoDB's, one per action."""

    def __init__(self, reasons: list[dict[str, Any]]) -> None:
        super().__init__("transaction cancelled")
        self.reasons = reasons

    @property
    def codes(self) -> list[str]:
        return [r.get("Code") or "None" for r in self.reasons]


def client_config(max_connections: int) -> BotoConfig:
    return BotoConfig(
        retries={"max_attempts": 1, "mode": "standard"},
        connect_timeout=3,
        read_timeout=10,
        max_pool_connections=max_connections,
        tcp_keepalive=True,
    )


class DynamoClient:
    """One aioboto3 client (its own connection pool) plus the observers that meter it:
    ``observe`` hears every call, ``count_read`` the items each answered read returned."""

    def __init__(self, client: Any, observe: Observer | None = None,
                 call_timeout_s: float = 10.0, count_read: ReadCounter | None = None) -> None:
        self.raw = client
        self.observe = observe
        self.call_timeout_s = call_timeout_s
        self.count_read = count_read

    async def call(self, operation: str, timeout: float | None = None, **kwargs: Any) -> Any:
        """One DynamoDB call under a timeout; errors translated; outcome metered.

        Outcomes: ok, condition_failed, throttled, unavailable, timeout (our deadline ran
        out: the write may or may not have applied), cancelled (the caller was cancelled),
        error.
        """
        started = time.perf_counter()
        outcome = "ok"
        try:
            async with asyncio.timeout(timeout or self.call_timeout_s):
                resp = await getattr(self.raw, operation)(**kwargs)
            if self.count_read is not None:
                items = items_read(operation, resp)
                if items:
                    self.count_read(operation, items)
            return resp
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "ConditionalCheckFailedException":
                outcome = "condition_failed"
                raise ConditionFailed(exc.response.get("Item")) from exc
            if code == "TransactionCanceledException":
                cancelled = TransactionCancelled(exc.response.get("CancellationReasons") or [])
                outcome = _transaction_outcome(cancelled.codes)
                raise cancelled from exc
            translated = translate(exc)
            outcome = _outcome_label(translated)
            raise translated from exc
        except TimeoutError as exc:
            outcome = "timeout"
            raise StoreUnavailable(f"{operation} timed out") from exc
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
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
            if self.observe is not None:
                self.observe(operation, outcome, time.perf_counter() - started)


class DynamoTable:
    """Base of the store classes: ``self._call("operation", ...)`` is every DynamoDB call
    (tests/infra read these literals to pin the IAM policies to the code)."""

    def __init__(self, client: DynamoClient) -> None:
        self._client = client

    async def _call(self, operation: str, timeout: float | None = None, **kwargs: Any) -> Any:
        return await self._client.call(operation, timeout, **kwargs)


def items_read(operation: str, resp: Any) -> int:
    """Items a read's answer carries: a Query's or Scan's ``ScannedCount`` (what was read,
    before any filter; else ``Count``), 1 for a GetItem that found its item, every item of
    a BatchGetItem; 0 for writes and for an answer of an unexpected shape."""
    if not isinstance(resp, dict):
        return 0
    if operation in ("query", "scan"):
        for key in ("ScannedCount", "Count"):
            if isinstance(resp.get(key), int):
                return max(0, int(resp[key]))
        items = resp.get("Items")
        return len(items) if isinstance(items, list) else 0
    if operation == "get_item":
        return 1 if isinstance(resp.get("Item"), dict) else 0
    if operation == "batch_get_item":
        found = resp.get("Responses")
        if not isinstance(found, dict):
            return 0
        return sum(len(v) for v in found.values() if isinstance(v, list))
    return 0


def translate(exc: ClientError) -> StoreError:
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


def _transaction_outcome(codes: list[str]) -> str:
    if any(c in TXN_THROTTLE_REASONS for c in codes):
        return "throttled"
    if any(c in TXN_CONFLICT_REASONS for c in codes):
        return "unavailable"
    if "ConditionalCheckFailed" in codes:
        return "condition_failed"
    return "error"
