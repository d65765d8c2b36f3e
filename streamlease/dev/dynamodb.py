"""An embedded DynamoDB-compatible server for development and tests: moto, served atomically
and made to keep the promises of DynamoDB that the fleet relies on.

docs/development.md ("Test stores and the embedded DynamoDB") says what this adds to moto,
why, and what each change measured: one lock around every request (moto's conditional
writes are not atomic), DynamoDB's refusals and costs where moto's differ, eventual
consistency (``--index-lag-ms``, ``--index-lag-jitter-ms``, ``--stale-reads-ms``),
DynamoDB Streams on the same endpoint, and store faults set live (``--faults``, the schema
in ``streamlease.dev.faults``).

``--latency-ms N`` with ``--latency-mode serial`` waits inside the lock: a slow *and
saturated* store, at most 1000/N requests a second, the overload that turned renew
timeouts into ownership churn (the lock is not fair, so the tail is longer than queue
length x N). ``parallel`` waits before it: a slow network.

Loopback only, no persistence: state lives as long as the process.
"""

from __future__ import annotations

import argparse
import base64
import calendar
import contextlib
import copy
import functools
import inspect
import io
import json
import logging
import random
import select
import signal
import socket
import struct
import sys
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http import HTTPStatus
from typing import Any

from streamlease.dev.faults import (
    CONTROL_PATH,
    ERROR_PREFIX,
    LATENCY_MODES,
    MAX_LAG_MS,
    FaultControl,
    FaultRequest,
    FaultSet,
    Pass,
    Refuse,
    Reset,
    Stall,
    access_key,
    control_answer,
)
from streamlease.store.versions import IndexLag, VersionLog

try:
    from moto.backends import get_backend
    from moto.core.exceptions import JsonRESTError
    from moto.core.model_instances import model_data
    from moto.core.responses import ActionResult
    from moto.dynamodb.exceptions import MockValidationException
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import StreamShard, Table
    from moto.dynamodb.responses import DynamoHandler
    from moto.dynamodbstreams.models import DynamoDBStreamsBackend, ShardIterator
    from moto.dynamodbstreams.responses import DynamoDBStreamsHandler
    from moto.moto_server.werkzeug_app import create_backend_app
    from werkzeug.serving import BaseWSGIServer, make_server

    from streamlease.dev.keepalive import KeepAliveHandler
    from streamlease.dev.parsecache import install_parse_caches
except ImportError as exc:  # pragma: no cover - exercised by the CLI without the extra
    raise ImportError(
        "streamlease dev dynamodb needs the dev extra: pip install 'streamlease[dev]'") from exc

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

# moto's own methods, taken before ``install_patches`` replaces them.
_original_transact = DynamoDBBackend.transact_write_items
_original_put = DynamoDBBackend.put_item
_original_update = DynamoDBBackend.update_item
_original_get_table = DynamoDBBackend.get_table
_original_query: Callable[..., Any] = Table.query
_query_signature = inspect.signature(Table.query)
_original_table_put = Table.put_item
_original_table_delete = Table.delete_item
_original_shard_add = StreamShard.add
_PATCH_LOCK = threading.Lock()
_patched = False

MAX_LATENCY_MS = 10_000.0


class DelayedApp:
    """WSGI middleware that holds every request ``seconds`` before serving it."""

    def __init__(self, app: WSGIApp, seconds: float) -> None:
        self.app = app
        self.seconds = seconds

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        time.sleep(self.seconds)
        return list(self.app(environ, start_response))


class SerializedApp:
    """WSGI middleware that runs one request at a time (the whole request, body included)."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        with self.lock:
            # Materialise the body inside the lock: a lazy iterable would run moto's
            # handler after the lock is released.
            return list(self.app(environ, start_response))


@contextmanager
def _tables_by_reference() -> Iterator[None]:
    """While set, ``copy.deepcopy(table)`` returns the table itself: a transaction backs up
    only the items it touches (``_touched_items``), not every table it names."""
    Table.__deepcopy__ = lambda self, memo: self  # type: ignore[attr-defined]
    try:
        yield
    finally:
        del Table.__deepcopy__  # type: ignore[attr-defined]


def _touched_items(backend: Any, transact_items: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(table, hash, range, backup) for every item a transaction may write."""
    touched = []
    for entry in transact_items:
        if len(entry) != 1:
            continue
        op_type, op = next(iter(entry.items()))
        table = backend.tables.get(op.get("TableName"))
        if table is None:
            continue
        attrs = op.get("Item") if op_type == "Put" else op.get("Key")
        if not isinstance(attrs, dict) or table.hash_key_attr not in attrs:
            continue
        hash_value = DynamoType(attrs[table.hash_key_attr])
        range_value = None
        if table.range_key_attr is not None:
            if table.range_key_attr not in attrs:
                continue
            range_value = DynamoType(attrs[table.range_key_attr])
        backup = copy.deepcopy(table.get_item(hash_value, range_value))
        touched.append((table, hash_value, range_value, backup))
    return touched


def _restore(touched: list[tuple[Any, ...]]) -> None:
    for table, hash_value, range_value, backup in reversed(touched):
        if backup is None:
            table.delete_item(hash_value, range_value)
        elif range_value is not None:
            table.items[hash_value][range_value] = backup
        else:
            table.items[hash_value] = backup


def _fast_transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
    touched = _touched_items(self, transact_items)
    with _tables_by_reference():
        try:
            _original_transact(self, transact_items)
        except BaseException:
            # moto's own rollback re-assigned each table to itself (a no-op here);
            # put back exactly the items the transaction may have changed.
            _restore(touched)
            raise


def _index_key_mismatch(table: Any, attrs: dict[str, Any]) -> str | None:
    """DynamoDB's message if ``attrs`` (wire format) gives an index key the wrong type."""
    declared = {a["AttributeName"]: a["AttributeType"] for a in table.attr}
    for index in table.global_indexes:
        for key in index.schema:
            name = key["AttributeName"]
            value = attrs.get(name)
            if isinstance(value, dict) and value and name in declared:
                actual = next(iter(value))
                if actual != declared[name]:
                    return (f"One or more parameter values were invalid: Type mismatch for "
                            f"Index Key {name} Expected: {declared[name]} Actual: {actual} "
                            f"IndexName: {index.name}")
    return None


def _typed_put_item(self: Any, table_name: str, item_attrs: dict[str, Any],
                    *args: Any, **kwargs: Any) -> Any:
    problem = _index_key_mismatch(self.get_table(table_name), item_attrs)
    if problem:
        raise MockValidationException(problem)
    return _original_put(self, table_name, item_attrs, *args, **kwargs)


def _typed_update_item(self: Any, table_name: str, key: dict[str, Any],
                       *args: Any, **kwargs: Any) -> Any:
    table = self.get_table(table_name)
    touched = _touched_items(self, [{"Update": {"TableName": table_name, "Key": key}}])
    item = _original_update(self, table_name, key, *args, **kwargs)
    problem = _index_key_mismatch(table, item.to_json()["Attributes"])
    if problem:
        _restore(touched)
        raise MockValidationException(problem)
    request = _current()
    if request is not None and touched:
        # An update changes the Item in place: the backup is the version it replaced.
        _, hash_value, range_value, backup = touched[0]
        request.lag.record(table, (hash_value, range_value), backup, request.t)
    return item


class _Untracked(list[Any]):
    """A list that keeps nothing: moto's per-class ``instances_tracked``."""

    def append(self, _item: Any) -> None:
        pass


def install_untracked_models() -> None:
    """Patch moto (in this process) so its DynamoDB models are not kept after use: memory
    follows the tables however long a session runs. A moto reset puts plain lists back;
    each server start patches again."""
    with _PATCH_LOCK:
        models = [*model_data["dynamodb"].values(), *model_data["dynamodbstreams"].values()]
        for model in models:
            if not isinstance(getattr(model, "instances_tracked", None), _Untracked):
                model.instances_tracked = _Untracked()  # type: ignore[attr-defined]


_READ_ACTIONS = ("query", "scan", "get_item", "batch_get_item")
# Item writes answer with the item's attributes when asked (ReturnValues): every
# conditional lease write a worker makes, written the same way.
_WRITE_ACTIONS = ("update_item", "put_item", "delete_item")
# DynamoDB Streams answers written the same way: the leader's change feed reads a record of
# every write to the streams table (every checkpoint among them).
_STREAMS_ACTIONS = ("describe_stream", "list_streams", "get_shard_iterator", "get_records")


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, datetime):
        # The JSON protocols' timestamp: epoch seconds, millisecond precision, a naive
        # value read as UTC (as moto's own writer does).
        seconds = calendar.timegm(value.utctimetuple())
        return seconds + (value.microsecond // 1000) / 1000.0 if value.microsecond else seconds
    raise TypeError(f"not JSON: {type(value).__name__}")


def _plain_json(original: Callable[..., Any]) -> Callable[..., Any]:
    """An answer written as DynamoDB's JSON directly: moto's own writer walks the API's
    shape model for every attribute of every item, the most costly part of a large Query
    or Scan and a tenth of a conditional write's time (and it runs under the request lock,
    delaying every request)."""
    @functools.wraps(original)
    def handler(self: Any) -> Any:
        result = original(self)
        if not isinstance(result, ActionResult):
            return result
        try:
            body = json.dumps(result.result, default=_json_default, separators=(",", ":"))
        except (TypeError, ValueError):
            return result  # anything unexpected takes moto's own writer
        return body, {"Content-Type": "application/x-amz-json-1.0"}
    return handler


class _KeyedView:
    """A table as one index Query reads it: only the items its key condition matches
    (everything else is the table's own)."""

    def __init__(self, table: Any, items: list[Any]) -> None:
        self._table = table
        self._items = items

    def all_items(self) -> list[Any]:
        return self._items

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)


def _key_matches(item: Any, hash_conditions: list[tuple[str, Any]],
                 range_condition: tuple[str, str, list[Any]] | None) -> bool:
    attrs = item.attrs
    for name, value in hash_conditions:
        found = attrs.get(name)
        if not found:
            return False
        if value.type == "S":  # the common case, without moto's casting comparison
            if found.type != "S" or found.value != value.value:
                return False
        elif found != value:
            return False
    if range_condition is None:
        return True
    name, comparison, values = range_condition
    found = attrs.get(name)
    return bool(found) and bool(found.compare(comparison, values))


def _keyed_query(self: Any, *args: Any, **kwargs: Any) -> Any:
    """moto's Query (its arguments as ``Table.query`` names them), over only the items its
    key condition matches: moto sorts (and sizes) every item of the table before it applies
    the key condition, so a Query cost O(table) under the request lock where DynamoDB's
    costs O(items returned). A base-table Query reads its one partition; an index Query the
    items whose index keys match."""
    given = _query_signature.bind(self, *args, **kwargs).arguments
    hash_key, range_comparison = given["hash_key"], given["range_comparison"]
    index_name: str | None = given.get("index_name")
    hash_key_conditions: list[tuple[str, Any]] | None = given.get("hash_key_conditions")
    range_key_conditions: list[tuple[str, str, list[Any]]] | None = \
        given.get("range_key_conditions")
    filter_kwargs = given.get("filter_kwargs")
    if index_name is None and hash_key is not None and hash_key.type == "S":
        # One partition (an events table grows with every batch a sink writes, and a
        # take-over's resume read queries it for one stream's newest item).
        stored = self.items.get(hash_key)
        part = [] if stored is None else \
            list(stored.values()) if self.range_key_attr else [stored]
        return _original_query(_KeyedView(self, part), *args, **kwargs)
    index = next((i for i in self.global_indexes if i.name == index_name), None)
    ranges = [k for k in index.schema if k["KeyType"] == "RANGE"] if index is not None else []
    simple = index is not None and not filter_kwargs and \
        len(ranges) <= 1 and len(range_key_conditions or []) <= 1 and \
        (range_comparison is None) == (not range_key_conditions)
    if not simple or not hash_key_conditions:
        return _original_query(self, *args, **kwargs)
    condition = range_key_conditions[0] if range_key_conditions else None
    names = [k["AttributeName"] for k in ranges]
    items = []
    for stored in self.items.values():
        for item in (stored.values() if self.range_key_attr else (stored,)):
            # DynamoDB indexes an item only if it has every key attribute of the index.
            if all(item.attrs.get(n) for n in names) and \
                    _key_matches(item, hash_key_conditions, condition):
                items.append(item)
    return _original_query(_KeyedView(self, items), *args, **kwargs)


# -- Eventual consistency -----------------------------------------------------------------

Key = tuple[Any, Any]  # (hash DynamoType, range DynamoType or None)


@dataclass(frozen=True)
class Consistency:
    """How far behind the current table each kind of read may be, in seconds."""

    index_lag: IndexLag = field(default_factory=IndexLag)  # global secondary index reads
    stale_reads_s: float = 0.0  # eventually consistent base-table reads: uniform(0, this)

    def __post_init__(self) -> None:
        if not 0.0 <= self.stale_reads_s <= MAX_LAG_MS / 1000:
            raise ValueError(f"stale_reads_s must be 0-{MAX_LAG_MS / 1000:g}, "
                             f"got {self.stale_reads_s!r}")

    @property
    def enabled(self) -> bool:
        return self.window_s > 0

    @property
    def window_s(self) -> float:
        """The oldest moment any read may see: how long replaced versions are kept."""
        return max(self.index_lag.max_s, self.stale_reads_s)


@dataclass
class _History:
    # The moto Table the log belongs to (a re-created table starts afresh), held weakly:
    # a deleted table's items are freed with it, not kept alive by its log.
    table: weakref.ref[Any]
    log: VersionLog[Key, Any]

    def of(self, table: Any) -> bool:
        return self.table() is table


class ReplicaLag:
    """The tables as eventually consistent reads see them: the item versions that writes
    served here replaced within the lag window, stamped with the request's monotonic time,
    put back into a view that moto's own read code runs on (so filters, ``Select``,
    ``Limit`` and pagination behave as on a current read). A lock of its own keeps the
    history whole also without the request lock (``--no-lock``)."""

    def __init__(self, consistency: Consistency, clock: Callable[[], float],
                 rng: random.Random) -> None:
        self.consistency = consistency
        self.clock = clock
        self.rng = rng
        self._lock = threading.Lock()
        self._histories: dict[tuple[str, str, str], _History] = {}

    def set_consistency(self, consistency: Consistency) -> None:
        """Lag reads by ``consistency`` from the next request on (a fault control changes
        it live): the history kept follows the new window; none is kept while no read
        lags (the writes meanwhile are not recorded, so an older one must not stand)."""
        with self._lock:
            self.consistency = consistency
            if not consistency.enabled:
                self._histories.clear()
            for history in self._histories.values():
                history.log.window_s = consistency.window_s

    def index_lag(self) -> float:
        return self.consistency.index_lag.draw(self.rng)

    def stale_lag(self) -> float:
        c = self.consistency
        return self.rng.uniform(0.0, c.stale_reads_s) if c.stale_reads_s else 0.0

    def record(self, table: Any, key: Key, before: Any, t: float) -> None:
        """A write stamped ``t`` replaced ``before`` (None: the item did not exist)."""
        with self._lock:
            self._history(table).log.record(key, before, t)

    def as_of(self, table: Any, at: float, now: float) -> Any:
        """``table`` as it was at monotonic moment ``at``: the table itself if no write
        since, else a view (a Table sharing everything but its items) to query."""
        with self._lock:
            history = self._histories.get(_table_id(table))
            if history is None or not history.of(table):
                return table
            history.log.prune(now)
            overrides = history.log.as_of(at)
        if not overrides:
            return table
        items: defaultdict[Any, Any] = defaultdict(dict, table.items)
        copied: set[Any] = set()
        for (hash_value, range_value), before in overrides.items():
            if table.range_key_attr is None:
                if before is None:
                    items.pop(hash_value, None)
                else:
                    items[hash_value] = before
                continue
            if hash_value not in copied:
                items[hash_value] = dict(items.get(hash_value, {}))
                copied.add(hash_value)
            if before is None:
                items[hash_value].pop(range_value, None)
            else:
                items[hash_value][range_value] = before
        # object.__new__: moto's models track every instance they construct; a view is
        # short-lived and must not be kept alive by that list.
        view = object.__new__(Table)  # type: ignore[type-abstract]
        view.__dict__.update(table.__dict__)
        view.items = items
        return view

    def read_views(self, backend: Any, action: str, body: dict[str, Any],
                   now: float) -> dict[str, Any]:
        """Table name -> the table as this read request sees it, where that is not now."""
        wanted: dict[str, float] = {}
        if action in ("query", "scan"):
            name = str(body.get("TableName"))
            table = _find_table(backend, name)
            if table is None:
                return {}
            index = body.get("IndexName")
            if index is not None and index in {i.name for i in table.global_indexes}:
                wanted[name] = self.index_lag()
            elif not body.get("ConsistentRead"):  # the table, or a local index
                wanted[name] = self.stale_lag()
        elif action == "get_item":
            if not body.get("ConsistentRead"):
                wanted[body.get("TableName", "")] = self.stale_lag()
        elif action == "batch_get_item":
            for name, request in (body.get("RequestItems") or {}).items():
                if isinstance(request, dict) and not request.get("ConsistentRead"):
                    wanted[name] = self.stale_lag()
        views = {}
        for name, lag in wanted.items():
            table = _find_table(backend, name) if lag > 0 else None
            if table is not None:
                views[name] = self.as_of(table, now - lag, now)
        return views

    def _history(self, table: Any) -> _History:
        table_id = _table_id(table)
        history = self._histories.get(table_id)
        if history is None or not history.of(table):  # new, or deleted and re-created
            for gone in [k for k, h in self._histories.items() if h.table() is None]:
                del self._histories[gone]
            log: VersionLog[Key, Any] = VersionLog(self.consistency.window_s)
            history = self._histories[table_id] = _History(weakref.ref(table), log)
        return history


@dataclass
class _Request:
    lag: ReplicaLag
    t: float  # monotonic time the request was served at
    views: dict[str, Any] | None = None


# What this thread is serving, if anything: .request (a _Request), .streams (a _StreamsRequest).
_local = threading.local()


def _current() -> _Request | None:
    request: _Request | None = getattr(_local, "request", None)
    return request


def _table_id(table: Any) -> tuple[str, str, str]:
    return (table.account_id, table.region_name, table.name)


def _find_table(backend: Any, name: Any) -> Any:
    try:
        return _original_get_table(backend, name)
    except Exception:  # moto's own handler reports a missing table
        return None


def _viewed_get_table(self: Any, table_name: str) -> Any:
    request = _current()
    if request is not None and request.views and table_name in request.views:
        return request.views[table_name]
    return _original_get_table(self, table_name)


def _lagged(action: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def handler(self: Any) -> Any:
        request = _current()
        if request is None:
            return original(self)
        request.views = request.lag.read_views(self.dynamodb_backend, action, self.body,
                                               request.t)
        try:
            return original(self)
        finally:
            request.views = None

    return handler


def _stored(table: Any, hash_value: Any, range_value: Any) -> Any:
    """The item under a key, without moto's get_item side effects."""
    if table.range_key_attr is None:
        return table.items.get(hash_value)
    return table.items.get(hash_value, {}).get(range_value)


def _recorded_put(self: Any, item_attrs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    request = _current()
    if request is None:
        return _original_table_put(self, item_attrs, *args, **kwargs)
    try:
        hash_value = DynamoType(item_attrs[self.hash_key_attr])
        range_value = (DynamoType(item_attrs[self.range_key_attr])
                       if self.range_key_attr is not None else None)
        before = _stored(self, hash_value, range_value)
    except (KeyError, TypeError):
        return _original_table_put(self, item_attrs, *args, **kwargs)  # moto refuses it
    item = _original_table_put(self, item_attrs, *args, **kwargs)
    # A put replaces the Item object, never changes it: ``before`` stays as it was.
    request.lag.record(self, (hash_value, range_value), before, request.t)
    return item


def _recorded_delete(self: Any, hash_value: Any, range_value: Any) -> Any:
    item = _original_table_delete(self, hash_value, range_value)
    request = _current()
    if request is not None and item is not None:
        request.lag.record(self, (hash_value, range_value), item, request.t)
    return item


# -- DynamoDB Streams ---------------------------------------------------------------------

STREAMS_TARGET_PREFIX = "DynamoDBStreams_"
ITERATOR_TTL_S = 15 * 60.0  # DynamoDB's shard iterators expire after 15 minutes
DEFAULT_STREAM_RETENTION_S = 24 * 3600.0
DEFAULT_STREAM_RECORDS_MAX = 100_000


class _StreamsError(JsonRESTError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(ERROR_PREFIX + code, message)


@dataclass(frozen=True)
class StreamRetention:
    """How long stream records and shard iterators live."""

    retention_s: float = DEFAULT_STREAM_RETENTION_S
    records_max: int = DEFAULT_STREAM_RECORDS_MAX
    iterator_ttl_s: float = ITERATOR_TTL_S
    clock: Callable[[], float] = time.monotonic


@dataclass
class _StreamsRequest:
    retention: StreamRetention
    now: float
    # (shard, item key) -> [shard, old item, new item], in the order items were first touched
    pending: dict[tuple[int, Any, Any], list[Any]] = field(default_factory=dict)


def _streams_request() -> _StreamsRequest | None:
    request: _StreamsRequest | None = getattr(_local, "streams", None)
    return request


def _pending_add(self: Any, old: Any, new: Any) -> None:
    """moto's per-write hook, deferred to the end of the request (see ``RequestContextApp``)."""
    request = _streams_request()
    if request is None:
        _original_shard_add(self, old, new)
        _stamp(self, None)
        return
    item = old if old is not None else new
    key = (id(self), item.hash_key, item.range_key)
    seen = request.pending.get(key)
    if seen is None:
        request.pending[key] = [self, old, new]
    else:
        seen[2] = new  # the first old image, the last new image


def _stamp(shard: Any, now: float | None) -> None:
    """Keep the serving time of each record (parallel to ``shard.items``) for retention."""
    stamps: list[float] = shard.__dict__.setdefault("streamlease_stamps", [])
    missing = len(shard.items) - len(stamps)
    if missing > 0:
        stamps.extend([time.monotonic() if now is None else now] * missing)


def _trim(shard: Any, retention: StreamRetention, now: float) -> None:
    """Drop the records past retention (oldest first); the trim horizon moves up."""
    _stamp(shard, now)
    stamps: list[float] = shard.__dict__["streamlease_stamps"]
    drop = max(0, len(shard.items) - retention.records_max)
    while drop < len(stamps) and stamps[drop] < now - retention.retention_s:
        drop += 1
    if drop:
        del shard.items[:drop]
        del stamps[:drop]
        shard.starting_sequence_number += drop


def _flush(request: _StreamsRequest) -> None:
    """Write the request's records: one per changed item, none for an unchanged one."""
    for shard, old, new in request.pending.values():
        if old is None and new is None:
            continue
        if old is not None and new is not None and old.attrs == new.attrs:
            continue  # DynamoDB writes no record for a write that changed nothing
        if shard.table.stream_shard is not shard:
            continue  # the stream was turned off (or the table re-created) meanwhile
        _original_shard_add(shard, old, new)
        _trim(shard, request.retention, request.now)


class RequestContextApp:
    """WSGI middleware, innermost (under the request lock): what the patched moto paths know
    of the request they serve. While some read lags, the time it is served, for the writes
    it records and the reads it lags (at lag 0 they see no request: nothing is recorded, no
    view is built). And the stream records its writes produce, written when, and only if,
    the request succeeded."""

    def __init__(self, app: WSGIApp, lag: ReplicaLag, retention: StreamRetention) -> None:
        self.app = app
        self.lag = lag
        self.retention = retention

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if self.lag.consistency.enabled:
            _local.request = _Request(self.lag, self.lag.clock())
        request = _StreamsRequest(self.retention, self.retention.clock())
        status: list[int] = []

        def recording_start(code: str, headers: Any, *args: Any) -> Any:
            status.append(int(code.split()[0]))
            return start_response(code, headers, *args)

        _local.streams = request
        try:
            body = list(self.app(environ, recording_start))
            if status and status[-1] < 400:
                _flush(request)
            return body
        finally:
            _local.streams = None
            _local.request = None


class StreamsRoutingApp:
    """Serves DynamoDB and DynamoDB Streams on one endpoint, routed by ``X-Amz-Target``."""

    def __init__(self, dynamodb: WSGIApp, streams: WSGIApp) -> None:
        self.dynamodb = dynamodb
        self.streams = streams

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
        app = self.streams if target.startswith(STREAMS_TARGET_PREFIX) else self.dynamodb
        return app(environ, start_response)


def _retention_now() -> tuple[StreamRetention, float]:
    request = _streams_request()
    if request is None:
        retention = StreamRetention()
        return retention, retention.clock()
    return request.retention, request.now


def _stream_table(backend: Any, arn: str) -> Any:
    """The table whose current stream ``arn`` names, else ResourceNotFoundException."""
    parts = str(arn).split(":", 5)
    path = parts[5].split("/") if len(parts) == 6 else []
    table = None
    if len(path) >= 4 and path[0] == "table" and path[2] == "stream":
        table = backend.dynamodb.tables.get(path[1])
    if (table is None or table.stream_shard is None
            or table.latest_stream_label != "/".join(path[3:])):
        raise _StreamsError("ResourceNotFoundException", f"Requested resource not found: "
                            f"Stream: {arn} not found")
    return table


def _describe_stream(self: Any, arn: str) -> dict[str, Any]:
    table = _stream_table(self, arn)
    _trim(table.stream_shard, *_retention_now())
    return {
        "StreamArn": arn,
        "StreamLabel": table.latest_stream_label,
        "StreamStatus": "ENABLED",
        "StreamViewType": table.stream_specification["StreamViewType"],
        "CreationRequestDateTime": table.stream_shard.created_on,
        "TableName": table.name,
        "KeySchema": table.schema,
        "Shards": [table.stream_shard.to_json()],
    }


def _get_shard_iterator(self: Any, arn: str, shard_id: str, shard_iterator_type: str,
                        sequence_number: int | None = None) -> Any:
    table = _stream_table(self, arn)
    shard = table.stream_shard
    if shard.id != shard_id:
        raise _StreamsError("ResourceNotFoundException",
                            f"Requested resource not found: Shard: {shard_id} not found")
    retention, now = _retention_now()
    _trim(shard, retention, now)
    if shard_iterator_type in ("AT_SEQUENCE_NUMBER", "AFTER_SEQUENCE_NUMBER"):
        if sequence_number is None:
            raise _StreamsError("ValidationException", "SequenceNumber is required")
        first = int(sequence_number) + (shard_iterator_type == "AFTER_SEQUENCE_NUMBER")
        if first < shard.starting_sequence_number:
            raise _StreamsError("TrimmedDataAccessException", f"sequence number "
                                f"{sequence_number} is past the shard's trim horizon")
        if first > shard.starting_sequence_number + len(shard.items):
            raise _StreamsError("ValidationException", f"sequence number {sequence_number} "
                                "is beyond the shard's last record")
    elif shard_iterator_type not in ("TRIM_HORIZON", "LATEST"):
        raise _StreamsError("ValidationException",
                            f"bad ShardIteratorType {shard_iterator_type!r}")
    iterator = ShardIterator(self, shard, shard_iterator_type, sequence_number)
    iterator.streamlease_created = now  # type: ignore[attr-defined]
    self.shard_iterators[iterator.arn] = iterator
    _forget_expired_iterators(self, retention, now)
    return iterator


def _forget_expired_iterators(backend: Any, retention: StreamRetention, now: float) -> None:
    # Insertion order is creation order: the expired ones are at the front.
    iterators = backend.shard_iterators
    while iterators:
        oldest = next(iter(iterators))
        created = getattr(iterators[oldest], "streamlease_created", now)
        if created >= now - retention.iterator_ttl_s:
            break
        del iterators[oldest]


def _get_records(self: Any, iterator_arn: str, limit: int) -> dict[str, Any]:
    retention, now = _retention_now()
    _forget_expired_iterators(self, retention, now)
    iterator = self.shard_iterators.get(iterator_arn)
    if iterator is None:
        raise _StreamsError("ExpiredIteratorException", "Iterator expired or unknown")
    shard = iterator.stream_shard
    if shard.table.stream_shard is not shard:
        raise _StreamsError("ResourceNotFoundException",
                            "Requested resource not found: the shard's stream is gone")
    _trim(shard, retention, now)
    if iterator.sequence_number < shard.starting_sequence_number:
        raise _StreamsError("TrimmedDataAccessException",
                            "the iterator points past the shard's trim horizon")
    if not 1 <= int(limit) <= 1000:
        raise _StreamsError("ValidationException", "Limit must be 1-1000")
    result: dict[str, Any] = iterator.get(int(limit))
    successor = self.shard_iterators.get(result["NextShardIterator"])
    if successor is not None:
        successor.streamlease_created = now
    return result


def install_patches() -> None:
    """Patch moto, once in this process. Requests served without this
    server's ``RequestContextApp`` (direct backend calls) take moto's own paths: current
    reads, stream records at once."""
    global _patched
    with _PATCH_LOCK:
        if _patched:
            return
        DynamoDBBackend.put_item = _typed_put_item  # type: ignore[method-assign]
        DynamoDBBackend.update_item = _typed_update_item  # type: ignore[method-assign]
        DynamoDBBackend.transact_write_items = _fast_transact_write_items  # type: ignore[method-assign]
        DynamoDBBackend.get_table = _viewed_get_table  # type: ignore[method-assign]
        Table.query = _keyed_query  # type: ignore[method-assign]
        Table.put_item = _recorded_put  # type: ignore[method-assign]
        Table.delete_item = _recorded_delete  # type: ignore[method-assign,assignment]
        StreamShard.add = _pending_add  # type: ignore[method-assign]
        DynamoDBStreamsBackend.describe_stream = _describe_stream  # type: ignore[method-assign]
        DynamoDBStreamsBackend.get_shard_iterator = (  # type: ignore[method-assign]
            _get_shard_iterator)  # type: ignore[assignment]
        DynamoDBStreamsBackend.get_records = _get_records  # type: ignore[method-assign]
        for action in (*_READ_ACTIONS, *_WRITE_ACTIONS):
            handler = _plain_json(getattr(DynamoHandler, action))
            if action in _READ_ACTIONS:
                handler = _lagged(action, handler)
            setattr(DynamoHandler, action, handler)
        for action in _STREAMS_ACTIONS:
            setattr(DynamoDBStreamsHandler, action,
                    _plain_json(getattr(DynamoDBStreamsHandler, action)))
        install_parse_caches()
        _patched = True


# -- Injected faults (--faults) -----------------------------------------------------------

STALL_POLL_S = 0.25  # how often a stalled request looks whether its client gave up


def _answer(start_response: Callable[..., Any], status: int, content_type: str,
            body: bytes) -> list[bytes]:
    start_response(f"{status} {HTTPStatus(status).phrase}",
                   [("Content-Type", content_type), ("Content-Length", str(len(body)))])
    return [body]


def _request_body(environ: dict[str, Any]) -> bytes:
    """The request's body, read once and put back for the app behind."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length <= 0:
        return b""
    body: bytes = environ["wsgi.input"].read(length)
    environ["wsgi.input"] = io.BytesIO(body)
    return body


def _peer_gone(environ: dict[str, Any]) -> bool:
    """Whether the client closed the connection (it gave up waiting for its answer)."""
    sock = environ.get("werkzeug.socket")
    if not isinstance(sock, socket.socket):
        return False
    try:
        poller = select.poll()  # not select(): a busy server's descriptors pass 1024
        poller.register(sock, select.POLLIN)
        events = poller.poll(0)
        if not events:
            return False
        if events[0][1] & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            return True
        return sock.recv(1, socket.MSG_PEEK) == b""  # readable: the end of the stream?
    except (OSError, ValueError):
        return True


def _drop_connection(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """Close the connection without an answer: shut down at once (the client reads the
    end of the stream), reset when the handler closes it. The handler's own answer then
    meets a broken pipe, which werkzeug takes for a dropped connection."""
    sock = environ.get("werkzeug.socket")
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.shutdown(socket.SHUT_RDWR)
    start_response("500 Internal Server Error", [("Connection", "close")])
    return []


class FaultsApp:
    """WSGI middleware, outermost (before the request lock): the ``/_faults`` control,
    and the faults a request meets when it arrives (see ``streamlease.dev.faults``)."""

    def __init__(self, app: WSGIApp, control: FaultControl) -> None:
        self.app = app
        self.control = control

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ.get("PATH_INFO") == CONTROL_PATH:
            status, content_type, body = control_answer(
                self.control, str(environ.get("REQUEST_METHOD")), _request_body(environ))
            return _answer(start_response, status, content_type, body)
        if not self.control.current.active:
            return list(self.app(environ, start_response))
        request = FaultRequest(str(environ.get("HTTP_X_AMZ_TARGET", "")),
                               access_key(str(environ.get("HTTP_AUTHORIZATION", ""))),
                               _request_body(environ))
        action = self._wait_out_cut(environ, request)
        started = time.monotonic()  # a request let through a cut travels the network then
        if isinstance(action, Reset):
            return _drop_connection(environ, start_response)
        if action.counter is not None:
            self.control.count(action.counter)
        self.control.hold("parallel", started)
        if isinstance(action, Refuse):
            return _answer(start_response, action.status, "application/x-amz-json-1.0",
                           action.body())
        return list(self.app(environ, start_response))

    def _wait_out_cut(self, environ: dict[str, Any],
                      request: FaultRequest) -> Pass | Refuse | Reset:
        """The request's action once no cut stalls it: a stalled request is decided anew
        whenever the set changes; one whose client gave up is dropped."""
        stalled = False
        while True:
            decision = self.control.decide(request)
            if isinstance(decision.action, Reset):
                self.control.count(Reset.counter)
            if not isinstance(decision.action, Stall):
                return decision.action
            if not stalled:
                stalled = True
                self.control.count(Stall.counter)
            self.control.wait_change(decision.generation, STALL_POLL_S)
            if self.control.closed or _peer_gone(environ):
                return Reset()


class ServedFaultsApp:
    """WSGI middleware under the request lock: what the current fault set changes in how
    requests are served (serial latency, the eventual consistency, a stream trim)."""

    def __init__(self, app: WSGIApp, control: FaultControl, lag: ReplicaLag,
                 retention: StreamRetention) -> None:
        self.app = app
        self.control = control
        self.lag = lag
        self.retention = retention
        self._applied: FaultSet | None = None
        self._trims = 0

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        faults = self.control.current
        if faults is not self._applied:
            self._apply(faults)
        self.control.hold("serial", time.monotonic())
        return list(self.app(environ, start_response))

    def _apply(self, faults: FaultSet) -> None:
        consistency = Consistency(IndexLag(faults.index_lag_ms / 1000,
                                           faults.index_lag_jitter_ms / 1000),
                                  faults.stale_reads_ms / 1000)
        if consistency != self.lag.consistency:
            self.lag.set_consistency(consistency)
        trims = self.control.trims
        if trims != self._trims:
            self._trims = trims
            dropped = _drop_stream_records(self.retention.clock())
            self.control.count("stream_records_dropped", dropped)
        self._applied = faults


def _drop_stream_records(now: float) -> int:
    """Trim every table's stream to its end (every account and region of this process);
    the records dropped. Iterators below the new horizon get TrimmedDataAccessException."""
    dropped = 0
    for table in _all_tables():
        shard = table.stream_shard
        if shard is not None:
            _stamp(shard, now)
            dropped += len(shard.items)
            shard.starting_sequence_number += len(shard.items)
            del shard.items[:]
            del shard.__dict__["streamlease_stamps"][:]
    return dropped


def _all_tables() -> Iterator[Any]:
    """Every DynamoDB table moto holds in this process (every account and region)."""
    for account in list(dict.values(get_backend("dynamodb"))):
        for backend in list(dict.values(account)):
            yield from list(backend.tables.values())


@dataclass(frozen=True)
class ServerOptions:
    """How an ``EmbeddedDynamoDB`` serves (docs/development.md explains each). ``serialize``:
    the lock that makes moto atomic; lags all 0: every read is current; ``faults``: serve
    the ``/_faults`` control, the latency and lags here its initial set; ``seed``: the
    throttle draws and, without an ``rng``, the lag draws."""

    host: str = "127.0.0.1"
    port: int = 0
    serialize: bool = True
    latency_s: float = 0.0
    latency_mode: str = "serial"
    index_lag_s: float = 0.0
    index_lag_jitter_s: float = 0.0
    stale_reads_s: float = 0.0
    stream_retention_s: float = DEFAULT_STREAM_RETENTION_S
    stream_records_max: int = DEFAULT_STREAM_RECORDS_MAX
    faults: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.stream_retention_s <= 0 or self.stream_records_max < 1:
            raise ValueError("stream_retention_s and stream_records_max must be positive")
        if self.latency_mode not in LATENCY_MODES:
            raise ValueError(f"latency_mode must be one of {LATENCY_MODES}, "
                             f"got {self.latency_mode!r}")
        if not 0.0 <= self.latency_s <= MAX_LATENCY_MS / 1000:
            raise ValueError(f"latency_s must be 0-{MAX_LATENCY_MS / 1000:g}, "
                             f"got {self.latency_s!r}")


class EmbeddedDynamoDB:
    """A DynamoDB-compatible HTTP server on loopback, in a background thread."""

    def __init__(self, options: ServerOptions = ServerOptions(), *,
                 clock: Callable[[], float] = time.monotonic,
                 rng: random.Random | None = None) -> None:
        """``clock`` (monotonic seconds) and ``rng`` decide which past a lagged read sees,
        and when stream records and shard iterators expire; tests inject them to step time
        by hand."""
        self.options = options
        self.host = options.host
        self.consistency = Consistency(IndexLag(options.index_lag_s, options.index_lag_jitter_s),
                                       options.stale_reads_s)
        self.replica_lag = ReplicaLag(self.consistency, clock, rng or random.Random(options.seed))
        self.fault_control: FaultControl | None = None
        if options.faults:
            self.fault_control = FaultControl(FaultSet(
                latency_ms=options.latency_s * 1000, latency_mode=options.latency_mode,
                index_lag_ms=options.index_lag_s * 1000,
                index_lag_jitter_ms=options.index_lag_jitter_s * 1000,
                stale_reads_ms=options.stale_reads_s * 1000), options.seed)
        self.stream_retention = StreamRetention(options.stream_retention_s,
                                                options.stream_records_max, clock=clock)
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> EmbeddedDynamoDB:
        install_patches()
        install_untracked_models()
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        # Connections stay open between requests, as DynamoDB's do (see keepalive.py).
        self._server = make_server(self.host, self.options.port, self._app(), threaded=True,
                                   request_handler=KeepAliveHandler)
        self._server.daemon_threads = True  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="embedded-dynamodb", daemon=True)
        self._thread.start()
        return self

    def _app(self) -> WSGIApp:
        options = self.options
        app: WSGIApp = StreamsRoutingApp(create_backend_app("dynamodb"),
                                         create_backend_app("dynamodbstreams"))
        app = RequestContextApp(app, self.replica_lag, self.stream_retention)
        control = self.fault_control
        if control is not None:
            app = ServedFaultsApp(app, control, self.replica_lag, self.stream_retention)
            return FaultsApp(SerializedApp(app) if options.serialize else app, control)
        # Serial latency is served under the lock (a saturated server), parallel latency
        # before it (a slow path to a server with capacity to spare); see the module doc.
        latency = options.latency_s
        if latency and options.latency_mode == "serial":
            app = DelayedApp(app, latency)
        if options.serialize:
            app = SerializedApp(app)
        if latency and options.latency_mode == "parallel":
            app = DelayedApp(app, latency)
        return app

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.server_address[1])

    @property
    def endpoint_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def backend(self, region: str = "us-east-1", account: str = "123456789012") -> Any:
        """The moto backend behind this server (same process only; for seeding tests)."""
        return get_backend("dynamodb")[account][region]

    def stop(self) -> None:
        if self.fault_control is not None:
            self.fault_control.close()  # stalled and delayed requests let go
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> EmbeddedDynamoDB:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="streamlease dev dynamodb",
        description="Serve an embedded, atomic DynamoDB-compatible API on loopback.")
    add = parser.add_argument
    add("--port", type=int, default=8000, help="TCP port (0: pick a free one)")
    add("--host", default="127.0.0.1", help="loopback address to bind")
    add("--latency-ms", type=float, default=0.0,
        help="hold every request this long (load tests of a slow store)")
    add("--latency-mode", choices=LATENCY_MODES, default="serial",
        help="serial: inside the request lock, a saturated store (1000/N requests/s at "
             "most); parallel: before it, a slow network")
    add("--index-lag-ms", type=float, default=0.0,
        help="index reads (Query/Scan with IndexName) see the table as it was this long ago "
             "(DynamoDB's indexes are eventually consistent); default 0")
    add("--index-lag-jitter-ms", type=float, default=0.0,
        help="plus uniform(0, this), drawn for every index read; default 0")
    add("--stale-reads-ms", type=float, default=0.0,
        help="base-table reads without ConsistentRead see the table as it was up to this "
             "long ago; default 0")
    add("--faults", action="store_true",
        help="serve a fault control on /_faults (GET: the active faults and counters; PUT: a "
             "JSON object replacing them) for tests and load tests: latency, throttling, cut "
             "clients, stream and write outages, lags; see streamlease/dev/faults.py")
    add("--seed", type=int, help="seed of the throttle and lag draws (a fault schedule replays)")
    # Test-only knobs: a tiny thread switch interval makes races likely, and --no-lock
    # serves plain moto, so the tests can show the race they guard against is real.
    add("--switch-interval", type=float, help=argparse.SUPPRESS)
    add("--no-lock", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0-65535, got {args.port}")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        parser.error(f"--host must be a loopback address, got {args.host!r}")
    for option, limit in (("latency_ms", MAX_LATENCY_MS), ("index_lag_ms", MAX_LAG_MS),
                          ("index_lag_jitter_ms", MAX_LAG_MS), ("stale_reads_ms", MAX_LAG_MS)):
        value = getattr(args, option)
        if not 0.0 <= value <= limit:  # also refuses nan
            flag = "--" + option.replace("_", "-")
            parser.error(f"{flag} must be 0-{limit:g}, got {value:g}")
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    server = EmbeddedDynamoDB(ServerOptions(
        args.host, args.port, serialize=not args.no_lock, latency_s=args.latency_ms / 1000,
        latency_mode=args.latency_mode, index_lag_s=args.index_lag_ms / 1000,
        index_lag_jitter_s=args.index_lag_jitter_ms / 1000,
        stale_reads_s=args.stale_reads_ms / 1000, faults=args.faults, seed=args.seed))
    try:
        server.start()
    except OSError as exc:
        print(f"streamlease dev dynamodb: cannot bind {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"listening on {server.endpoint_url}", flush=True)
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
