"""Store faults injected live into the embedded DynamoDB (``streamlease dev dynamodb
--faults``), for tests and load tests only: a nemesis replaces the fault set over HTTP
while real workers use the server.

docs/development.md states the control (``GET`` and ``PUT /_faults``), every key and what
it does.

A request meets the set current when it arrives (cut, throttle, refusals, parallel
latency) and the set current when it is served under the request lock (serial latency,
consistency). Each such decision reads one whole set: a ``PUT`` never shows half of
itself to a request. Pure except ``FaultControl``, which holds the current set and the
counters under a lock.
"""

from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, NamedTuple

from streamlease.store.versions import MAX_LAG_S

CONTROL_PATH = "/_faults"
MAX_LATENCY_MS = 60_000.0
MAX_LAG_MS = MAX_LAG_S * 1000
MAX_CONTROL_BODY = 1 << 20
LATENCY_MODES = ("serial", "parallel")
CUT_MODES = ("stall", "reset")
DYNAMODB_TARGET = "DynamoDB_20120810."
STREAMS_TARGET = "DynamoDBStreams_20120810."
ERROR_PREFIX = "com.amazonaws.dynamodb.v20120810#"
WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem",
                    "TransactWriteItems"})
READS = frozenset({"GetItem", "Query", "Scan", "BatchGetItem"})
TRANSACTIONS = frozenset({"TransactWriteItems", "TransactGetItems"})
# Per kind, the requests affected (stream_records_dropped: records, not requests).
COUNTERS = ("delayed", "throttled", "stalled", "reset", "streams_unavailable",
            "streams_trimmed", "write_outage", "lagged_reads", "stream_records_dropped")
JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"

_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")


class FaultError(ValueError):
    """A control body refused; ``str()`` is the one-line reason."""


Parser = Callable[[str, object], Any]


def _shown(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(limit: float) -> Parser:
    def parse(key: str, value: object) -> float:
        # bool is an int to Python, not a number to JSON; the range check refuses nan.
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not 0 <= value <= limit:
            raise FaultError(f"{key} must be a number 0-{limit:g}, got {_shown(value)}")
        return float(value)
    return parse


def _choice(options: tuple[str, ...]) -> Parser:
    def parse(key: str, value: object) -> str:
        if value not in options:
            raise FaultError(f"{key} must be one of {', '.join(options)}, got {_shown(value)}")
        return str(value)
    return parse


def _flag(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise FaultError(f"{key} must be true or false, got {_shown(value)}")
    return value


def _names(key: str, value: object) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise FaultError(f"{key} must be a list of non-empty strings, got {_shown(value)}")
    return frozenset(value)


def _seed(key: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise FaultError(f"{key} must be an integer, got {_shown(value)}")
    return value


def _key(default: Any, parse: Parser) -> Any:
    """A ``FaultSet`` field: its default, and how a control body's value for it is read."""
    return field(default=default, metadata={"parse": parse})


@dataclass(frozen=True)
class FaultSet:
    """The faults a server applies; the default: none."""

    latency_ms: float = _key(0.0, _number(MAX_LATENCY_MS))
    latency_mode: str = _key("serial", _choice(LATENCY_MODES))
    throttle: float = _key(0.0, _number(1.0))
    seed: int | None = _key(None, _seed)
    cut: frozenset[str] = _key(frozenset(), _names)
    cut_mode: str = _key("stall", _choice(CUT_MODES))
    streams_unavailable: bool = _key(False, _flag)
    streams_trimmed: bool = _key(False, _flag)
    write_outage: frozenset[str] = _key(frozenset(), _names)
    index_lag_ms: float = _key(0.0, _number(MAX_LAG_MS))
    index_lag_jitter_ms: float = _key(0.0, _number(MAX_LAG_MS))
    stale_reads_ms: float = _key(0.0, _number(MAX_LAG_MS))

    @classmethod
    def from_json(cls, value: object) -> FaultSet:
        """The set a control body's JSON value describes; FaultError if it is not one."""
        if not isinstance(value, dict):
            raise FaultError(f"the body must be a JSON object, got {_shown(value)}")
        parsers = {f.name: f.metadata["parse"] for f in fields(cls)}
        unknown = sorted(set(value) - set(parsers))
        if unknown:
            raise FaultError(f"unknown key {unknown[0]!r} (known: {', '.join(parsers)})")
        return cls(**{key: parsers[key](key, v) for key, v in value.items()})

    @classmethod
    def parse(cls, body: bytes) -> FaultSet:
        try:
            value = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise FaultError(f"the body is not JSON: {reason}") from exc
        return cls.from_json(value)

    def to_json(self) -> dict[str, Any]:
        """The keys set, each mode with its fault (and only then): ``{}`` when nothing
        is."""
        shown: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value != f.default:
                shown[f.name] = sorted(value) if isinstance(value, frozenset) else value
        shown.pop("latency_mode", None)
        shown.pop("cut_mode", None)
        if self.latency_ms:
            shown["latency_mode"] = self.latency_mode
        if self.cut:
            shown["cut_mode"] = self.cut_mode
        return shown

    @property
    def lags(self) -> bool:
        return self.index_lag_ms + self.index_lag_jitter_ms + self.stale_reads_ms > 0

    @property
    def active(self) -> bool:
        """Whether any request can meet a fault (false: requests pass untouched)."""
        return bool(self.latency_ms or self.throttle or self.cut or self.streams_unavailable
                    or self.streams_trimmed or self.write_outage or self.lags)

    def delay_s(self, mode: str) -> float:
        return self.latency_ms / 1000 if self.latency_mode == mode else 0.0


NO_FAULTS = FaultSet()


def access_key(authorization: str) -> str | None:
    """The access key ID a SigV4 ``Authorization`` header names, if any."""
    found = _CREDENTIAL.search(authorization)
    return found.group(1) if found else None


@dataclass
class FaultRequest:
    """What a fault decision needs of a request: its ``X-Amz-Target``, its signer's
    access key, its body (parsed only if a decision needs it)."""

    target: str = ""
    key: str | None = None
    body: bytes = b""
    _document: dict[str, Any] | None = field(default=None, init=False, repr=False)

    @property
    def service(self) -> str:
        if self.target.startswith(STREAMS_TARGET):
            return "streams"
        return "dynamodb" if self.target.startswith(DYNAMODB_TARGET) else ""

    @property
    def operation(self) -> str:
        return self.target.rpartition(".")[2]

    def document(self) -> dict[str, Any]:
        if self._document is None:
            try:
                value = json.loads(self.body) if self.body else {}
            except (UnicodeDecodeError, ValueError):
                value = {}
            self._document = value if isinstance(value, dict) else {}
        return self._document

    def written_tables(self) -> frozenset[str]:
        """The tables a write request names (empty for anything else)."""
        doc = self.document()
        if self.operation == "BatchWriteItem":
            items = doc.get("RequestItems")
            names = list(items) if isinstance(items, dict) else []
        elif self.operation == "TransactWriteItems":
            names = [op.get("TableName") for entry in _list(doc.get("TransactItems"))
                     if isinstance(entry, dict) for op in entry.values() if isinstance(op, dict)]
        else:
            names = [doc.get("TableName")]
        return frozenset(_table_name(n) for n in names if isinstance(n, str))


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _table_name(name: str) -> str:
    """A table's name, also where the request gives its ARN."""
    return name.partition(":table/")[2] or name if name.startswith("arn:") else name


@dataclass(frozen=True)
class Pass:
    """Served as usual (``counter``: the kind that still affects it, if any)."""

    counter: str | None = None


@dataclass(frozen=True)
class Refuse:
    """Answered at once with a DynamoDB error, unserved."""

    counter: str
    status: int
    error: dict[str, Any]

    def body(self) -> bytes:
        return json.dumps(self.error, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Stall:
    """Held unanswered while the cut lasts."""

    counter: ClassVar[str] = "stalled"


@dataclass(frozen=True)
class Reset:
    """The connection closed without an answer."""

    counter: ClassVar[str] = "reset"


Action = Pass | Refuse | Stall | Reset
PASS = Pass()


def _error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"__type": ERROR_PREFIX + code, "message": message, **extra}


def throttled(request: FaultRequest) -> Refuse:
    """DynamoDB's answer to a throttled request, as botocore parses it (and
    ``streamlease.store.dynamodb.client`` classifies it: throttled)."""
    if request.operation not in TRANSACTIONS:
        return Refuse("throttled", 400, _error(
            "ProvisionedThroughputExceededException",
            "The level of configured provisioned throughput for the table was exceeded. "
            "Consider increasing your provisioning level with the UpdateTable API."))
    actions = max(1, len(_list(request.document().get("TransactItems"))))
    reasons = [{"Code": "ThrottlingError",
                "Message": "Throughput exceeds the current capacity of your table or index."}
               ] * actions
    message = ("Transaction cancelled, please refer cancellation reasons for specific "
               f"reasons [{', '.join(['ThrottlingError'] * actions)}]")
    return Refuse("throttled", 400, {"__type": ERROR_PREFIX + "TransactionCanceledException",
                                     "Message": message, "CancellationReasons": reasons})


def _streams_action(faults: FaultSet, request: FaultRequest) -> Action:
    if faults.streams_unavailable:
        return Refuse("streams_unavailable", 500, _error(
            "InternalServerError", "DynamoDB Streams is unavailable (injected fault)"))
    if faults.streams_trimmed and request.operation == "GetRecords":
        return Refuse("streams_trimmed", 400, _error(
            "TrimmedDataAccessException",
            "the iterator points past the shard's trim horizon (injected fault)"))
    return PASS


def _lagged(faults: FaultSet, request: FaultRequest) -> bool:
    """Whether a read may see the past (an index read under index lag, an eventually
    consistent read under stale reads)."""
    if request.operation not in READS:
        return False
    doc = request.document()
    if request.operation in ("Query", "Scan") and doc.get("IndexName") is not None:
        return faults.index_lag_ms + faults.index_lag_jitter_ms > 0
    if request.operation == "BatchGetItem":
        wanted = doc.get("RequestItems")
        consistent = isinstance(wanted, dict) and all(
            isinstance(w, dict) and w.get("ConsistentRead") for w in wanted.values())
    else:
        consistent = bool(doc.get("ConsistentRead"))
    return faults.stale_reads_ms > 0 and not consistent


def decide(faults: FaultSet, request: FaultRequest, rng: random.Random) -> Action:
    """What ``request`` meets under ``faults``; ``rng`` draws the throttle (one draw per
    DynamoDB request while ``throttle`` > 0, none otherwise)."""
    if request.key is not None and request.key in faults.cut:
        return Stall() if faults.cut_mode == "stall" else Reset()
    if request.service == "streams":
        return _streams_action(faults, request)
    if request.service != "dynamodb":
        return PASS
    if faults.throttle and rng.random() < faults.throttle:
        return throttled(request)
    if faults.write_outage and request.operation in WRITES \
            and request.written_tables() & faults.write_outage:
        return Refuse("write_outage", 500, _error(
            "InternalServerError", "Internal server error (injected write outage)"))
    if faults.lags and _lagged(faults, request):
        return Pass("lagged_reads")
    return PASS


class Decision(NamedTuple):
    faults: FaultSet
    action: Action
    generation: int  # of the set decided on (to wait for the next one)


class FaultControl:
    """The fault set a server applies and the counters of what it affected; replaced
    whole, thread-safe. ``trims`` counts the times ``streams_trimmed`` was turned on (the
    server drops the retained stream records once for each)."""

    def __init__(self, faults: FaultSet = NO_FAULTS, seed: int | None = None) -> None:
        self._cond = threading.Condition()
        self._faults = faults
        self._rng = random.Random(faults.seed if faults.seed is not None else seed)
        self._counters = dict.fromkeys(COUNTERS, 0)
        self.generation = 0
        self.trims = int(faults.streams_trimmed)
        self.closed = False

    @property
    def current(self) -> FaultSet:
        return self._faults

    def replace(self, faults: FaultSet) -> None:
        with self._cond:
            if faults.seed is not None:
                self._rng = random.Random(faults.seed)
            if faults.streams_trimmed and not self._faults.streams_trimmed:
                self.trims += 1
            self._faults = faults
            self.generation += 1
            self._cond.notify_all()

    def decide(self, request: FaultRequest) -> Decision:
        with self._cond:
            return Decision(self._faults, decide(self._faults, request, self._rng),
                            self.generation)

    def count(self, counter: str, n: int = 1) -> None:
        with self._cond:
            self._counters[counter] += n

    def state(self) -> dict[str, Any]:
        """The control's answer: ``{"faults": {...}, "counters": {...}, "generation": n}``."""
        with self._cond:
            return {"faults": self._faults.to_json(), "counters": dict(self._counters),
                    "generation": self.generation}

    def wait_change(self, generation: int, timeout: float) -> None:
        """Until the set is no longer ``generation``, the control closes, or ``timeout``."""
        with self._cond:
            self._cond.wait_for(lambda: self.generation != generation or self.closed,
                                timeout)

    def hold(self, mode: str, started: float) -> bool:
        """Wait out the current set's ``mode`` latency, counted from monotonic ``started``
        and recomputed whenever the set changes; whether it waited at all (counted as
        ``delayed`` when the wait begins)."""
        if not self._faults.delay_s(mode):
            return False
        held = False
        with self._cond:
            while not self.closed:
                left = self._faults.delay_s(mode) - (time.monotonic() - started)
                if left <= 0:
                    break
                if not held:
                    held = True
                    self._counters["delayed"] += 1
                self._cond.wait(left)
        return held

    def close(self) -> None:
        """Release every held request (the server is stopping)."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()


def control_answer(control: FaultControl, method: str, body: bytes) -> tuple[int, str, bytes]:
    """(HTTP status, content type, body) for a request to ``CONTROL_PATH``."""
    if method == "GET":
        return 200, JSON_TYPE, json.dumps(control.state()).encode()
    if method != "PUT":
        return 405, TEXT_TYPE, b"use GET to read the faults, PUT to replace them\n"
    if len(body) > MAX_CONTROL_BODY:
        return 400, TEXT_TYPE, b"the body is too large\n"
    try:
        faults = FaultSet.parse(body)
    except FaultError as exc:
        reason = " ".join(str(exc).split())
        return 400, TEXT_TYPE, (reason + "\n").encode()
    control.replace(faults)
    return 200, JSON_TYPE, json.dumps(control.state()).encode()
