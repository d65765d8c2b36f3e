"""The reference upstream: a loopback WebSocket server serving many streams on one port.

It speaks the default upstream protocol on ``/streams/<id>`` and, on other paths, one test
feed per shape of real upstream the worker's profiles adapt. docs/upstream-protocol.md
states every mode's frames, refusals and tokens, the control endpoints and the flags. Used
by tests, the demo and the load test; it binds to loopback unless told otherwise.

Every path serves message numbers ``n = 1, 2, 3, ...`` on one clock that starts with the
server, at ``rate`` messages per second: message ``n`` of every stream of every mode is due
at the same moment, and a frame's content is a pure function of ``(mode, stream_id, n)``
(:func:`mode_frame`), so an audit can check exactly what was delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import re
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Self, TypeGuard
from urllib.parse import parse_qs

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

log = logging.getLogger(__name__)

STREAM_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")  # matched against the whole id

Mode = Literal["streams", "subscribe", "gateway", "live", "binary"]
MODES: tuple[Mode, ...] = ("streams", "subscribe", "gateway", "live", "binary")  # /<mode>/<id>
DEFAULT_MODE: Mode = "streams"
_HEARTBEATS: frozenset[str] = frozenset({"subscribe", "live", "binary"})

MALFORMED_KINDS: tuple[str, ...] = ("notjson", "noseq", "badseq", "binary", "array", "poison")
"""Kinds of hostile frame :meth:`UpstreamServer.inject_malformed` can send. ``poison`` is
well-formed but carries ``seq`` 2**63-1, far ahead of the stream's real numbering."""
_BINARY_MALFORMED_KINDS: tuple[str, ...] = ("notjson", "array")

POISON_SEQ = 2**63 - 1

BINARY_MAGIC = b"SLB1"  # a binary data frame's first four bytes; then n, 8 bytes big-endian
_BINARY_PAYLOAD_BYTES = 32

HEARTBEAT_EVERY = 5  # data frames of one connection between two heartbeats
DEFAULT_IDLE_HEARTBEAT_S = 1.0
DEFAULT_GATEWAY_HEARTBEAT_MS = 1000
GATEWAY_MISSED_HEARTBEATS = 3  # intervals without a heartbeat before the gateway closes

POLICY_VIOLATION = 1008
GATEWAY_DECODE_ERROR = 4002
GATEWAY_AUTH_FAILED = 4004
GATEWAY_HEARTBEAT_TIMEOUT = 4009

YIELD_EVERY = 64  # sends between yields to the loop (a tight send loop starves the others)

DROP_CLOSE_CODE = 1011
HANDSHAKE_TIMEOUT_S = 10.0  # how long subscribe and live wait for the subscription
_MAX_MALFORMED_COUNT = 1_000_000
_MAX_PAUSE_SECONDS = 3600.0
_MAX_GATEWAY_HEARTBEAT_MS = 3_600_000
_MIN_SLEEP = 0.001  # loop timers may round tiny delays down to zero
_CLOSE_TIMEOUT = 3.0
_SUBSCRIPTIONS_KEPT = 1000
_DIGITS = re.compile(r"[0-9]+")
_JSON_SEPARATORS = (",", ":")

DropMode = Literal["close", "abort"]


def _dumps(value: object) -> str:
    return json.dumps(value, separators=_JSON_SEPARATORS)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_mode(mode: str) -> Mode:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    return mode


# -- frame content -----------------------------------------------------------------------


def frame_for(stream_id: str, seq: int) -> str:
    """The frame the upstream sends for ``seq`` on ``stream_id``: identical on every replay."""
    digest = hashlib.blake2b(f"{stream_id}:{seq}".encode(), digest_size=8).hexdigest()
    return _dumps({"seq": seq, "stream": stream_id, "data": digest})


def _digest(mode: str, stream_id: str, n: int, size: int = 8) -> bytes:
    return hashlib.blake2b(f"{mode}/{stream_id}:{n}".encode(), digest_size=size).digest()


def _data_object(mode: Mode, stream_id: str, n: int) -> dict[str, Any]:
    """The JSON data frame of message ``n`` in a JSON mode other than the default."""
    if mode == "live":
        h = int.from_bytes(_digest(mode, stream_id, n), "big")
        cents = 100_000 + h % 9_900_000  # 1000.00 .. 99999.99
        milli = 1 + (h >> 32) % 100_000  # 0.001 .. 100.000
        return {"e": "trade", "u": n, "s": stream_id,
                "p": f"{cents // 100}.{cents % 100:02d}",
                "q": f"{milli // 1000}.{milli % 1000:03d}"}
    payload = {"stream": stream_id, "data": _digest(mode, stream_id, n).hex()}
    if mode == "subscribe":
        return {"type": "data", "seq": n, "payload": payload}
    if mode == "gateway":
        return {"op": 0, "t": "EVENT", "d": {"s": n, "payload": payload}}
    raise ValueError(f"mode {mode!r} has no JSON data object")


def mode_frame(mode: str, stream_id: str, n: int) -> str | bytes:
    """The exact data frame of message ``n`` of ``stream_id`` under ``mode`` (the shapes:
    docs/upstream-protocol.md), its payload a blake2b of ``"<mode>/<id>:<n>"``: compact
    JSON (bytes for ``binary``), so a replay sends the same bytes."""
    checked = _check_mode(mode)
    if not 1 <= n <= POISON_SEQ:
        raise ValueError(f"n must be in 1..{POISON_SEQ}, got {n!r}")
    if checked == "streams":
        return frame_for(stream_id, n)
    if checked == "binary":
        digest = _digest(checked, stream_id, n, _BINARY_PAYLOAD_BYTES)
        return BINARY_MAGIC + n.to_bytes(8, "big") + digest
    return _dumps(_data_object(checked, stream_id, n))


def frame_maker(mode: str, stream_id: str) -> Callable[[int], str | bytes]:
    """``n -> mode_frame(mode, stream_id, n)``, the same bytes built from a template made
    once per connection: the server's cost per frame stays far below a worker's, so the load
    test measures the worker, not this server (tests/dev check them side by side)."""
    checked = _check_mode(mode)
    sid = json.dumps(stream_id)
    blake2b = hashlib.blake2b

    def digest(n: int) -> str:
        return blake2b(f"{checked}/{stream_id}:{n}".encode(), digest_size=8).hexdigest()

    if checked == "streams":
        def streams(n: int) -> str:
            h = blake2b(f"{stream_id}:{n}".encode(), digest_size=8).hexdigest()
            return f'{{"seq":{n},"stream":{sid},"data":"{h}"}}'
        return streams
    if checked == "gateway":
        def gateway(n: int) -> str:
            return (f'{{"op":0,"t":"EVENT","d":{{"s":{n},"payload":{{"stream":{sid},'
                    f'"data":"{digest(n)}"}}}}}}')
        return gateway
    if checked == "subscribe":
        def subscribe(n: int) -> str:
            return (f'{{"type":"data","seq":{n},"payload":{{"stream":{sid},'
                    f'"data":"{digest(n)}"}}}}')
        return subscribe
    return lambda n: mode_frame(checked, stream_id, n)


def mode_seq(mode: str, frame: str | bytes) -> int | None:
    """The upstream's own message number in a data frame of ``mode``; None for anything else
    (heartbeats, replies such as ``subscribed``/READY/acks, hostile frames without a number).
    """
    checked = _check_mode(mode)
    if checked == "binary":
        if isinstance(frame, bytes) and len(frame) >= 12 and frame.startswith(BINARY_MAGIC):
            return int.from_bytes(frame[4:12], "big")
        return None
    obj = _json_object(frame)
    if obj is None:
        return None
    value: object = None
    if checked == "streams":
        value = obj.get("seq")
    elif checked == "subscribe":
        if obj.get("type") == "data":
            value = obj.get("seq")
    elif checked == "gateway":
        d = obj.get("d")
        if _is_int(obj.get("op")) and obj["op"] == 0 and obj.get("t") == "EVENT" \
                and isinstance(d, dict):
            value = d.get("s")
    elif obj.get("e") == "trade":  # live
        value = obj.get("u")
    return value if _is_int(value) else None


def _heartbeat_frame(mode: Mode) -> str:
    if mode == "subscribe":
        return _dumps({"type": "heartbeat", "ts": int(time.time() * 1000)})
    if mode == "live":
        return '{"e":"heartbeat"}'
    return '{"type":"heartbeat"}'


def declared_stream_ids(count: int) -> list[str]:
    """The pre-declared stream ids ``s001``, ``s002``, ... (wider than 3 digits past 999)."""
    width = max(3, len(str(count)))
    return [f"s{i:0{width}d}" for i in range(1, count + 1)]


def malformed_kinds(mode: str) -> tuple[str, ...]:
    """The hostile-frame kinds ``mode`` can send: every kind, except in ``binary``, where
    any binary frame is data, so only the text kinds ``notjson`` and ``array`` are hostile."""
    return _BINARY_MALFORMED_KINDS if _check_mode(mode) == "binary" else MALFORMED_KINDS


_SEQ_PATH: dict[str, tuple[str, ...]] = {
    "subscribe": ("seq",), "gateway": ("d", "s"), "live": ("u",),
}


def _hostile_frame(kind: str, stream_id: str, seq: int, mode: Mode = DEFAULT_MODE) -> str | bytes:
    """One hostile frame of ``kind``, sent just before the real frame ``seq``."""
    if kind == "notjson":
        where = stream_id if mode == DEFAULT_MODE else f"{mode}/{stream_id}"
        return f"not json: hostile frame before {where}:{seq} {{"
    if kind == "binary":
        return b"\x00\xffhostile binary frame\xfe"
    if kind == "array":
        return _dumps([seq, stream_id, "hostile"])
    if mode == DEFAULT_MODE:
        if kind == "noseq":
            return _dumps({"stream": stream_id, "data": "hostile"})
        if kind == "badseq":
            return _dumps({"seq": str(seq), "stream": stream_id, "data": "hostile"})
        if kind == "poison":
            return _dumps({"seq": POISON_SEQ, "stream": stream_id, "data": "poisoned"})
        raise ValueError(f"unknown malformed kind {kind!r}")
    # The mode's own data frame, its number removed, made a string, or poisoned.
    obj = _data_object(mode, stream_id, seq)
    *parents, key = _SEQ_PATH[mode]
    node = obj
    for name in parents:
        node = node[name]
    if kind == "noseq":
        del node[key]
    elif kind == "badseq":
        node[key] = str(seq)
    elif kind == "poison":
        node[key] = POISON_SEQ
    else:
        raise ValueError(f"unknown malformed kind {kind!r}")
    return _dumps(obj)


def _check_stream_id(stream_id: str) -> str:
    if not STREAM_ID_PATTERN.fullmatch(stream_id):
        raise ValueError(f"invalid stream id {stream_id!r}: must match [A-Za-z0-9_.-]{{1,128}}")
    return stream_id


def _parse_from_seq(params: dict[str, list[str]]) -> int:
    """``from_seq`` from the query (first value wins); missing means 1. Raises ValueError."""
    values = params.get("from_seq")
    if not values:
        return 1
    text = values[0]
    if not _DIGITS.fullmatch(text) or int(text) < 1:
        raise ValueError(f"from_seq must be an integer >= 1, got {text!r}")
    return int(text)


def _split_target(target: str) -> tuple[str, dict[str, list[str]]]:
    path, _, query = target.partition("?")
    return path, parse_qs(query, keep_blank_values=True)


def _route(path: str) -> tuple[Mode, str] | None:
    """``(mode, rest)`` for a path under one of the modes' prefixes (``rest`` unchecked)."""
    for mode in MODES:
        prefix = f"/{mode}/"
        if path.startswith(prefix):
            return mode, path[len(prefix):]
    return None


def _json_object(message: str | bytes) -> dict[str, Any] | None:
    if not isinstance(message, str):
        return None
    try:
        obj = json.loads(message)
    except (ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) else None


def _same_secret(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _one_header(headers: Headers, name: str) -> str | None:
    values = headers.get_all(name)
    return values[0] if len(values) == 1 else None


class _Stream:
    """The state of one stream of one mode: its connections, counters and pending faults."""

    __slots__ = ("connections", "control_sent", "frames_sent", "id", "malformed",
                 "malformed_sent", "mode", "paused_until", "pending_skip", "subscriptions")

    def __init__(self, mode: Mode, stream_id: str) -> None:
        self.mode = mode
        self.id = stream_id
        self.connections: set[_Connection] = set()
        self.frames_sent = 0
        self.control_sent = 0
        self.malformed_sent = 0
        self.malformed: deque[str] = deque()
        self.pending_skip = 0
        self.paused_until = 0.0  # time.monotonic(); 0 = not paused
        # The first number offered to each subscription, oldest first (the newest kept).
        self.subscriptions: deque[int] = deque(maxlen=_SUBSCRIPTIONS_KEPT)

    def paused(self) -> bool:
        return self.paused_until > 0 and self.paused_until > time.monotonic()


class _ModeCounters:
    __slots__ = ("opened", "refused", "timed_out")

    def __init__(self) -> None:
        self.opened = 0  # WebSocket connections accepted
        self.refused = 0  # 401 before the upgrade, or closed for a bad first message
        self.timed_out = 0  # closed for a missing subscription or missing heartbeats


class _Connection:
    """One open WebSocket connection to a stream."""

    __slots__ = ("close_code", "close_reason", "closed", "data_sent", "drop_mode",
                 "last_heartbeat", "last_sent", "stream", "wake", "ws")

    def __init__(self, ws: ServerConnection, stream: _Stream) -> None:
        self.ws = ws
        self.stream = stream
        self.closed = False
        self.drop_mode: DropMode | None = None
        self.close_code = DROP_CLOSE_CODE
        self.close_reason = ""
        self.wake = asyncio.Event()
        self.data_sent = 0
        self.last_sent = time.monotonic()  # anything sent (heartbeats when idle)
        self.last_heartbeat = time.monotonic()  # the client's last gateway heartbeat

    async def sleep(self, delay: float) -> None:
        """Sleep for ``delay`` seconds or until woken (closed, dropped, paused, resumed)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(delay, _MIN_SLEEP)):
                await self.wake.wait()


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class UpstreamOptions:
    """What an ``UpstreamServer`` serves (see the module doc), and where."""

    host: str = "127.0.0.1"
    port: int = 0
    streams: int = 12
    rate: float = 10.0
    initial_backlog: int = 0
    retention: int | None = None
    token: str | None = None
    gateway_heartbeat_ms: int = DEFAULT_GATEWAY_HEARTBEAT_MS
    idle_heartbeat_s: float = DEFAULT_IDLE_HEARTBEAT_S

    def __post_init__(self) -> None:
        rate, idle_heartbeat_s = self.rate, self.idle_heartbeat_s
        if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
        if self.streams < 0:
            raise ValueError(f"streams must be >= 0, got {self.streams!r}")
        if self.initial_backlog < 0:
            raise ValueError(f"initial_backlog must be >= 0, got {self.initial_backlog!r}")
        if self.retention is not None and self.retention < 1:
            raise ValueError(f"retention must be >= 1 or None, got {self.retention!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port!r}")
        if self.token is not None and not re.fullmatch(r"[\x21-\x7e]+", self.token):
            raise ValueError("token must be non-empty printable ASCII without spaces")
        if not 1 <= self.gateway_heartbeat_ms <= _MAX_GATEWAY_HEARTBEAT_MS:
            raise ValueError(f"gateway_heartbeat_ms must be in 1..{_MAX_GATEWAY_HEARTBEAT_MS}, "
                             f"got {self.gateway_heartbeat_ms!r}")
        if not (math.isfinite(idle_heartbeat_s) and idle_heartbeat_s > 0):
            raise ValueError(f"idle_heartbeat_s must be a finite number > 0, "
                             f"got {idle_heartbeat_s!r}")


class _Feed:
    """Every stream of every mode on the one clock, their counters, and the fault hooks
    that act on them (the server's state; ``_Sessions`` serves it)."""

    def __init__(self, options: UpstreamOptions) -> None:
        self.rate = float(options.rate)
        self.initial_backlog = options.initial_backlog
        self.retention = options.retention
        self.token = options.token
        self.gateway_heartbeat_ms = options.gateway_heartbeat_ms
        self.idle_heartbeat_s = float(options.idle_heartbeat_s)
        self._declared = declared_stream_ids(options.streams)
        self._streams: dict[tuple[Mode, str], _Stream] = {
            (DEFAULT_MODE, sid): _Stream(DEFAULT_MODE, sid) for sid in self._declared
        }
        self._counters = {mode: _ModeCounters() for mode in MODES}
        self._t0 = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def stream_ids(self) -> list[str]:
        """The pre-declared stream ids (``s001``, ...)."""
        return list(self._declared)

    def head(self) -> int:
        """The newest message number produced now (the same for every stream: one clock)."""
        return self._head_at(time.monotonic())

    def _head_at(self, now: float) -> int:
        elapsed = max(0.0, now - self._t0)
        return self.initial_backlog + math.floor(elapsed * self.rate + 1e-9)

    def _due(self, seq: int) -> float:
        """The monotonic time at which message ``seq`` is produced (in every mode)."""
        return self._t0 + (seq - self.initial_backlog) / self.rate

    def _stream(self, stream_id: str, mode: Mode = DEFAULT_MODE) -> _Stream:
        key = (mode, stream_id)
        stream = self._streams.get(key)
        if stream is None:
            _check_stream_id(stream_id)
            stream = self._streams[key] = _Stream(mode, stream_id)
        return stream

    def stats(self) -> dict[str, Any]:
        """What ``/stats`` answers (docs/upstream-protocol.md); ``streams`` at the top level
        is the default mode's."""
        head = self.head()
        by_mode: dict[Mode, dict[str, Any]] = {mode: {} for mode in MODES}
        for (mode, sid), stream in sorted(self._streams.items()):
            entry: dict[str, Any] = {
                "head": head,
                "connections": len(stream.connections),
                "frames_sent": stream.frames_sent,
                "malformed_sent": stream.malformed_sent,
            }
            if mode != DEFAULT_MODE:
                entry["control_sent"] = stream.control_sent
                entry["subscriptions"] = list(stream.subscriptions)
            by_mode[mode][sid] = entry
        modes: dict[str, Any] = {}
        for mode, streams in by_mode.items():
            counters = self._counters[mode]
            modes[mode] = {
                "connections": sum(entry["connections"] for entry in streams.values()),
                "opened": counters.opened,
                "refused": counters.refused,
                "timed_out": counters.timed_out,
                "streams": streams,
            }
        return {"rate": self.rate, "head": head, "streams": modes[DEFAULT_MODE]["streams"],
                "modes": modes}

    # -- fault hooks ---------------------------------------------------------------------

    def drop(self, stream_id: str | None = None, *, abort: bool = False,
             mode: str | None = DEFAULT_MODE) -> int:
        """Close (code 1011) or, with ``abort``, abort every open connection of ``stream_id``
        under ``mode`` (None: every stream, every mode); how many were dropped."""
        checked = None if mode is None else _check_mode(mode)
        if stream_id is not None:
            _check_stream_id(stream_id)
        streams = [s for (m, sid), s in self._streams.items()
                   if checked in (None, m) and stream_id in (None, sid)]
        count = 0
        for stream in streams:
            for conn in list(stream.connections):
                if conn.closed or conn.drop_mode is not None:
                    continue
                count += 1
                if abort:
                    conn.drop_mode = "abort"
                    conn.ws.transport.abort()
                    conn.wake.set()
                else:
                    self._end(conn, DROP_CLOSE_CODE, "dropped by control hook")
        return count

    def inject_malformed(self, stream_id: str, count: int = 1, kind: str = "notjson", *,
                         mode: str = DEFAULT_MODE) -> int:
        """Precede each of the next ``count`` data frames sent on ``stream_id`` under ``mode``
        by a hostile frame (:func:`malformed_kinds`); how many are now pending."""
        checked = _check_mode(mode)
        kinds = malformed_kinds(checked)
        if kind not in kinds:
            raise ValueError(f"unknown malformed kind {kind!r} for mode {checked}; expected "
                             f"one of {', '.join(kinds)}")
        if not 1 <= count <= _MAX_MALFORMED_COUNT:
            raise ValueError(f"count must be in 1..{_MAX_MALFORMED_COUNT}, got {count!r}")
        stream = self._stream(stream_id, checked)
        stream.malformed.extend([kind] * count)
        return len(stream.malformed)

    def inject_gap(self, stream_id: str, skip: int, *, mode: str = DEFAULT_MODE) -> None:
        """Make the next connection to ``stream_id`` under ``mode`` start ``skip`` numbers
        later than it asked for (``live``/``binary``: than the first due after it subscribed)."""
        if skip < 0:
            raise ValueError(f"skip must be >= 0, got {skip!r}")
        self._stream(stream_id, _check_mode(mode)).pending_skip = skip

    def pause(self, stream_id: str, seconds: float, *, mode: str = DEFAULT_MODE) -> None:
        """Send nothing on ``stream_id`` under ``mode`` for ``seconds`` (0 resumes): no data,
        no heartbeats, no acks. The head keeps advancing."""
        if not (math.isfinite(seconds) and 0 <= seconds <= _MAX_PAUSE_SECONDS):
            raise ValueError(f"seconds must be in 0..{_MAX_PAUSE_SECONDS:g}, got {seconds!r}")
        stream = self._stream(stream_id, _check_mode(mode))
        stream.paused_until = time.monotonic() + seconds if seconds > 0 else 0.0
        for conn in stream.connections:
            conn.wake.set()

    def _end(self, conn: _Connection, code: int, reason: str) -> None:
        """Close ``conn`` with ``code`` from outside its handler (the handler notices)."""
        conn.drop_mode = "close"
        conn.close_code = code
        conn.close_reason = reason
        self._spawn(conn.ws.close(code, reason))
        conn.wake.set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _replay_start(self, stream: _Stream, from_seq: int) -> int:
        start = from_seq + stream.pending_skip
        stream.pending_skip = 0
        if self.retention is not None:
            start = max(start, self.head() - self.retention + 1)
        return start

    def _live_start(self, stream: _Stream) -> int:
        start = self.head() + 1 + stream.pending_skip
        stream.pending_skip = 0
        return start


class _Sessions:
    """The WebSocket side: each connection's opening exchange (by mode), then its frames,
    from the feed's clock."""

    def __init__(self, feed: _Feed) -> None:
        self.feed = feed

    async def handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None  # the handshake succeeded
        path, params = _split_target(ws.request.path)
        route = _route(path)
        assert route is not None  # checked in _process_request
        mode, stream_id = route
        stream = self.feed._stream(stream_id, mode)
        conn = _Connection(ws, stream)
        stream.connections.add(conn)
        self.feed._counters[mode].opened += 1
        helpers: list[asyncio.Task[None]] = []
        try:
            start = await self._open(conn, params, helpers)
            if start is not None:
                await self._pump(conn, start)
        except ConnectionClosed:
            pass
        finally:
            stream.connections.discard(conn)
            for task in helpers:
                task.cancel()
            if helpers:
                await asyncio.wait(helpers)

    async def _open(self, conn: _Connection, params: dict[str, list[str]],
                    helpers: list[asyncio.Task[None]]) -> int | None:
        """The mode's opening exchange: the first number to send, or None if it failed (the
        connection is then closing). Starts the connection's reader in ``helpers``."""
        stream = conn.stream
        mode = stream.mode
        if mode == "gateway":
            return await self._open_gateway(conn, helpers)
        if mode == "streams":
            start = self.feed._replay_start(stream, _parse_from_seq(params))  # validated already
        elif mode == "binary":
            start = self.feed._live_start(stream)
        else:  # subscribe, live: the client's first message subscribes
            message = await self._first_message(conn)
            if message is None:
                return None
            obj = _json_object(message)
            if mode == "subscribe":
                if obj != {"op": "subscribe", "channel": stream.id}:
                    await self._refuse(conn, POLICY_VIOLATION,
                                       'expected {"op":"subscribe","channel":<this id>} first')
                    return None
                await conn.ws.send(_dumps({"type": "subscribed", "channel": stream.id}))
                start = self.feed._replay_start(stream, _parse_from_seq(params))
            else:
                if obj is None or obj.get("method") != "SUBSCRIBE" or \
                        obj.get("params") != [stream.id] or "id" not in obj:
                    await self._refuse(conn, POLICY_VIOLATION,
                                       'expected {"method":"SUBSCRIBE","params":[<this id>],'
                                       '"id":…} first')
                    return None
                start = self.feed._live_start(stream)  # only what is due from now on
                await conn.ws.send(_dumps({"result": None, "id": obj["id"]}))
        if mode != "streams":
            stream.subscriptions.append(start)
        helpers.append(asyncio.create_task(self._read(conn)))
        return start

    async def _first_message(self, conn: _Connection) -> str | bytes | None:
        """The client's first message, or None (closed with 1008) after the handshake timeout."""
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                return await conn.ws.recv()
        except TimeoutError:
            self.feed._counters[conn.stream.mode].timed_out += 1
            await conn.ws.close(POLICY_VIOLATION, "no subscription in time")
            return None

    async def _refuse(self, conn: _Connection, code: int, reason: str) -> None:
        self.feed._counters[conn.stream.mode].refused += 1
        await conn.ws.close(code, reason)

    async def _open_gateway(self, conn: _Connection,
                            helpers: list[asyncio.Task[None]]) -> int | None:
        """Hello, identify, READY; the heartbeat watchdog runs from hello on."""
        stream, ws = conn.stream, conn.ws
        conn.last_heartbeat = time.monotonic()
        hello = {"heartbeat_interval_ms": self.feed.gateway_heartbeat_ms}
        await ws.send(_dumps({"op": 10, "d": hello}))
        helpers.append(asyncio.create_task(self._gateway_watchdog(conn)))
        obj = _json_object(await ws.recv())  # a silent client is closed by the watchdog
        d = None if obj is None else obj.get("d")
        if obj is None or not _is_int(obj.get("op")) or obj["op"] != 2 or not isinstance(d, dict):
            await self._refuse(conn, GATEWAY_DECODE_ERROR, "expected identify (op 2) first")
            return None
        token = d.get("token")
        if self.feed.token is not None and not (
                isinstance(token, str) and _same_secret(token, self.feed.token)):
            await self._refuse(conn, GATEWAY_AUTH_FAILED, "authentication failed")
            return None
        from_seq = d.get("from_seq", 1)
        if not _is_int(from_seq) or not 1 <= from_seq <= POISON_SEQ:
            await self._refuse(conn, GATEWAY_DECODE_ERROR, "from_seq must be an integer >= 1")
            return None
        await ws.send(_dumps({"op": 9, "t": "READY"}))
        start = self.feed._replay_start(stream, from_seq)
        stream.subscriptions.append(start)
        helpers.append(asyncio.create_task(self._read(conn)))
        return start

    async def _gateway_watchdog(self, conn: _Connection) -> None:
        """Close with 4009 once the client has sent no heartbeat for 3 intervals."""
        limit = GATEWAY_MISSED_HEARTBEATS * self.feed.gateway_heartbeat_ms / 1000
        while True:
            left = conn.last_heartbeat + limit - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(max(left, _MIN_SLEEP))
        if conn.closed or conn.drop_mode is not None:
            return
        self.feed._counters["gateway"].timed_out += 1
        self.feed._end(conn, GATEWAY_HEARTBEAT_TIMEOUT, "no heartbeat in time")

    @staticmethod
    async def _read(conn: _Connection) -> None:
        """Read until the connection closes (so closing handshakes go through), then note it.
        The gateway answers each heartbeat ``{"op":1}`` with ``{"op":11}``; anything else is
        discarded."""
        try:
            async for message in conn.ws:
                if conn.stream.mode != "gateway":
                    continue
                obj = _json_object(message)
                if obj is None or not _is_int(obj.get("op")) or obj["op"] != 1:
                    continue
                conn.last_heartbeat = time.monotonic()
                if not conn.stream.paused() and conn.drop_mode is None:
                    await conn.ws.send('{"op":11}')
                    conn.stream.control_sent += 1
        except ConnectionClosed:
            pass
        finally:
            conn.closed = True
            conn.wake.set()

    async def _send_heartbeat(self, conn: _Connection) -> None:
        await conn.ws.send(_heartbeat_frame(conn.stream.mode))
        conn.stream.control_sent += 1
        conn.last_sent = time.monotonic()

    async def _pump(self, conn: _Connection, start: int) -> None:
        """Send ``start``, ``start + 1``, ... : the backlog at once, then live as produced,
        with the mode's heartbeats in between."""
        ws, stream = conn.ws, conn.stream
        mode = stream.mode
        heartbeats = mode in _HEARTBEATS
        make = frame_maker(mode, stream.id)
        seq = start
        sends = 0
        conn.last_sent = time.monotonic()
        while True:
            conn.wake.clear()  # clear before checking, so a wake-up during the checks is kept
            if conn.closed:
                return
            if conn.drop_mode is not None:
                if conn.drop_mode == "close":
                    await ws.close(conn.close_code, conn.close_reason)
                return
            now = time.monotonic()
            if stream.paused_until > now:
                await conn.sleep(stream.paused_until - now)
                continue
            head = self.feed._head_at(now)
            if seq > head:
                wake_at = self.feed._due(seq)
                if heartbeats:
                    idle_at = conn.last_sent + self.feed.idle_heartbeat_s
                    if now >= idle_at:
                        await self._send_heartbeat(conn)
                        continue
                    wake_at = min(wake_at, idle_at)
                await conn.sleep(wake_at - now)
                continue
            while seq <= head:
                if conn.closed or conn.drop_mode is not None:
                    break
                if stream.paused_until and stream.paused_until > time.monotonic():
                    break
                if stream.malformed:
                    kind = stream.malformed.popleft()
                    await ws.send(_hostile_frame(kind, stream.id, seq, mode))
                    stream.malformed_sent += 1
                await ws.send(make(seq))
                stream.frames_sent += 1
                seq += 1
                sends += 1
                if heartbeats:
                    conn.data_sent += 1
                    if conn.data_sent % HEARTBEAT_EVERY == 0:
                        await self._send_heartbeat(conn)
                if sends % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # let other connections and handshakes run
            if heartbeats:
                conn.last_sent = time.monotonic()


class UpstreamServer(_Feed):
    """The reference upstream, every mode on one port.
    ``async with UpstreamServer(UpstreamOptions(...))``."""

    def __init__(self, options: UpstreamOptions = UpstreamOptions()) -> None:
        super().__init__(options)
        # "localhost" may resolve to two addresses, which with port 0 get two different ports.
        self._host = "127.0.0.1" if options.host == "localhost" else options.host
        self._requested_port = options.port
        self._sessions = _Sessions(self)
        self._server: Server | None = None
        self._port: int | None = None

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the socket and start serving; the clock of every stream starts now."""
        if self._server is not None:
            raise RuntimeError("UpstreamServer already started")
        server = await serve(self._sessions.handle, self._host, self._requested_port,
                             compression=None, process_request=self._process_request,
                             close_timeout=_CLOSE_TIMEOUT, max_size=2**16)
        self._t0 = time.monotonic()
        self._server = server
        self._port = int(server.sockets[0].getsockname()[1])
        log.info("upstream listening on %s", self.base_url)

    async def stop(self) -> None:
        """Close every connection, stop the server and wait for every task it started."""
        server = self._server
        if server is None:
            return
        self._server = None
        server.close()  # closes open connections with 1001; handlers notice and return
        await server.wait_closed()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- addresses and state -------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("UpstreamServer not started")
        return self._port

    @property
    def base_url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"ws://{host}:{self.port}"

    def url_for(self, stream_id: str, from_seq: int | None = None, *,
                mode: str = DEFAULT_MODE) -> str:
        """The WebSocket URL of ``stream_id`` under ``mode`` (optionally with ``from_seq``,
        which only ``streams`` and ``subscribe`` take from the query: ``gateway`` resumes by
        its identify message, ``live`` and ``binary`` do not replay)."""
        checked = _check_mode(mode)
        _check_stream_id(stream_id)
        url = f"{self.base_url}/{checked}/{stream_id}"
        if from_seq is not None:
            if checked not in ("streams", "subscribe"):
                raise ValueError(f"mode {checked} does not take from_seq in the URL")
            url += f"?from_seq={from_seq}"
        return url

    # -- HTTP ----------------------------------------------------------------------------

    def _authorized(self, mode: Mode, headers: Headers) -> bool:
        """Whether the handshake's headers carry the token ``mode`` asks for (if any)."""
        token = self.token
        if token is None or mode in ("streams", "gateway"):
            return True
        if mode == "subscribe":
            value = _one_header(headers, "Authorization")
            if value is None:
                return False
            scheme, _, given = value.partition(" ")
            return scheme.lower() == "bearer" and _same_secret(given.strip(), token)
        value = _one_header(headers, "X-Api-Key")
        return value is not None and _same_secret(value, token)

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path, params = _split_target(request.path)
        route = _route(path)
        if route is not None:
            mode, stream_id = route
            if not STREAM_ID_PATTERN.fullmatch(stream_id):
                return connection.respond(404, "not found: unknown path\n")
            if not self._authorized(mode, request.headers):
                self._counters[mode].refused += 1
                header = "Authorization: Bearer" if mode == "subscribe" else "X-Api-Key"
                response = connection.respond(401, f"unauthorized: {header} token needed\n")
                if mode == "subscribe":
                    response.headers["WWW-Authenticate"] = "Bearer"
                return response
            if mode in ("streams", "subscribe"):
                try:
                    _parse_from_seq(params)
                except ValueError as exc:
                    return connection.respond(400, f"bad request: {exc}\n")
            return None  # go on with the WebSocket handshake
        try:
            if path == "/streams":
                body: dict[str, Any] = {"streams": self.stream_ids, "rate": self.rate}
            elif path == "/stats":
                body = self.stats()
            elif path.startswith("/control/"):
                body = self._control(path.removeprefix("/control/"), params)
            else:
                raise _HttpError(404, "not found: unknown path")
        except _HttpError as exc:
            return connection.respond(exc.status, f"{exc.message}\n")
        response = connection.respond(200, json.dumps(body) + "\n")
        del response.headers["Content-Type"]
        response.headers["Content-Type"] = "application/json"
        return response

    def _control(self, hook: str, params: dict[str, list[str]]) -> dict[str, Any]:
        def one(name: str) -> str | None:
            values = params.get(name)
            return values[0] if values else None

        def integer(name: str, default: int) -> int:
            text = one(name)
            if text is None:
                return default
            if not re.fullmatch(r"-?[0-9]+", text):
                raise _HttpError(400, f"bad request: {name} must be an integer, got {text!r}")
            return int(text)

        stream_id = one("stream")
        mode = one("mode") or DEFAULT_MODE
        try:
            if hook == "drop":
                abort = (one("abort") or "0").lower() in ("1", "true", "yes")
                return {"dropped": self.drop(stream_id, abort=abort,
                                             mode=None if mode == "all" else mode)}
            if hook not in ("malformed", "gap", "pause"):
                raise _HttpError(404, f"not found: unknown control hook {hook!r}")
            if stream_id is None:
                raise _HttpError(400, "bad request: stream is required")
            if hook == "malformed":
                kind = one("kind") or "notjson"
                pending = self.inject_malformed(stream_id, integer("count", 1), kind, mode=mode)
                return {"stream": stream_id, "kind": kind, "pending": pending}
            if hook == "gap":
                skip = integer("skip", 1)
                self.inject_gap(stream_id, skip, mode=mode)
                return {"stream": stream_id, "skip": skip}
            text = one("seconds")
            if text is None:
                raise _HttpError(400, "bad request: seconds is required")
            try:
                seconds = float(text)
            except ValueError:
                message = f"bad request: seconds must be a number, got {text!r}"
                raise _HttpError(400, message) from None
            self.pause(stream_id, seconds, mode=mode)
            return {"stream": stream_id, "paused_for": seconds}
        except ValueError as exc:
            raise _HttpError(400, f"bad request: {exc}") from None


# -- command line ------------------------------------------------------------------------


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _build_parser() -> argparse.ArgumentParser:
    # Values are checked by UpstreamOptions, whose ValueError main() turns into a usage error.
    parser = argparse.ArgumentParser(
        prog="streamlease dev upstream",
        description="The reference upstream: many WebSocket streams on one port, in every "
        "test-feed mode.")
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    add("--port", type=int, default=8765, help="port (default 8765; 0 = any free)")
    add("--streams", type=int, default=12, help="pre-declared streams s001... (12)")
    add("--rate", type=float, default=10.0, help="messages per second per stream (10)")
    add("--initial-backlog", type=int, default=0, help="messages already available at start (0)")
    add("--retention", type=int, help="messages kept per stream (default unlimited)")
    add("--token", help="token the test feeds require: Authorization: Bearer (subscribe), "
        "X-Api-Key (live, binary), identify (gateway); default: none checked")
    add("--gateway-heartbeat-ms", type=int, default=DEFAULT_GATEWAY_HEARTBEAT_MS,
        help="heartbeat interval the gateway asks for; 3 missed close with 4009 (1000)")
    add("--allow-remote", action="store_true", help="allow binding a non-loopback address")
    return parser


async def _serve(options: UpstreamOptions) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or not Unix
            continue
        installed.append(sig)
    up = UpstreamServer(options)
    try:
        try:
            await up.start()
        except OSError as exc:
            print(f"error: cannot listen on {options.host}:{options.port}: {exc}",
                  file=sys.stderr)
            return 1
        try:
            print(f"listening on {up.base_url}", flush=True)
            await stop.wait()
        finally:
            await up.stop()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGTERM/SIGINT; 0 on a clean stop, 2 on bad usage, 1 if it cannot bind."""
    parser = _build_parser()
    args = vars(parser.parse_args(argv))
    if not args.pop("allow_remote") and not _is_loopback(args["host"]):
        parser.error(f"--host {args['host']} is not a loopback address (pass --allow-remote)")
    try:
        options = UpstreamOptions(**args)
    except ValueError as exc:
        parser.error(str(exc))
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(_serve(options))


if __name__ == "__main__":
    raise SystemExit(main())
