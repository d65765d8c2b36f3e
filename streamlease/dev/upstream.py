"""The reference replaying upstream: a loopback WebSocket server serving many streams on one port.

It speaks the default upstream protocol (docs/upstream-protocol.md: text frames, each a JSON
object with an integer ``seq`` strictly increasing per stream; ``from_seq`` asks for a replay)
and is used by tests, the demo and the load test. It is a development tool: it binds to
loopback unless told otherwise.

* ``ws://HOST:PORT/streams/<stream_id>?from_seq=N`` serves stream ``<stream_id>`` (any id
  matching ``[A-Za-z0-9_.-]{1,128}``, created on first use) from ``seq = N`` (default 1).
* Every stream produces ``seq = 1, 2, 3, ...`` at ``rate`` messages per second on one clock that
  starts with the server: at time ``t`` after start the head is
  ``initial_backlog + floor(t * rate)``. Frame content is a pure function of
  ``(stream_id, seq)``: see :func:`frame_for`.
* A connection first gets the held backlog as fast as possible, then live messages as the head
  advances. With ``retention`` set, a ``from_seq`` older than the oldest retained message
  starts at the oldest retained one (a gap the client must detect).
* Fault hooks, as methods and as plain HTTP GETs on the same port: ``/control/drop``,
  ``/control/malformed``, ``/control/gap``, ``/control/pause``; plus ``/streams`` and
  ``/stats``.

Run it with ``python -m streamlease.dev.upstream [--port N] [--streams N] [--rate R]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
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
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import parse_qs

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

__all__ = [
    "MALFORMED_KINDS",
    "POISON_SEQ",
    "STREAM_ID_PATTERN",
    "UpstreamServer",
    "declared_stream_ids",
    "frame_for",
    "main",
]

log = logging.getLogger(__name__)

STREAM_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")
"""Stream ids the server accepts (matched against the whole id)."""

MALFORMED_KINDS: tuple[str, ...] = ("notjson", "noseq", "badseq", "binary", "array", "poison")
"""Kinds of hostile frame :meth:`UpstreamServer.inject_malformed` can send. ``poison`` is
well-formed but carries ``seq`` 2**63-1, far ahead of the stream's real numbering."""

POISON_SEQ = 2**63 - 1

YIELD_EVERY = 64
"""A sender yields to the event loop after this many sends (a tight send loop starves others)."""

DROP_CLOSE_CODE = 1011
_MAX_MALFORMED_COUNT = 1_000_000
_MAX_PAUSE_SECONDS = 3600.0
_MIN_SLEEP = 0.001  # loop timers may round tiny delays down to zero
_CLOSE_TIMEOUT = 3.0
_DIGITS = re.compile(r"[0-9]+")
_JSON_SEPARATORS = (",", ":")

DropMode = Literal["close", "abort"]


def frame_for(stream_id: str, seq: int) -> str:
    """The frame the upstream sends for ``seq`` on ``stream_id``: identical on every replay."""
    digest = hashlib.blake2b(f"{stream_id}:{seq}".encode(), digest_size=8).hexdigest()
    frame = {"seq": seq, "stream": stream_id, "data": digest}
    return json.dumps(frame, separators=_JSON_SEPARATORS)


def declared_stream_ids(count: int) -> list[str]:
    """The pre-declared stream ids ``s001``, ``s002``, ... (wider than 3 digits past 999)."""
    width = max(3, len(str(count)))
    return [f"s{i:0{width}d}" for i in range(1, count + 1)]


def _hostile_frame(kind: str, stream_id: str, seq: int) -> str | bytes:
    """One hostile frame of ``kind``, sent just before the real frame ``seq``."""
    if kind == "notjson":
        return f"not json: hostile frame before {stream_id}:{seq} {{"
    if kind == "noseq":
        return json.dumps({"stream": stream_id, "data": "hostile"}, separators=_JSON_SEPARATORS)
    if kind == "badseq":
        return json.dumps(
            {"seq": str(seq), "stream": stream_id, "data": "hostile"}, separators=_JSON_SEPARATORS
        )
    if kind == "binary":
        return b"\x00\xffhostile binary frame\xfe"
    if kind == "array":
        return json.dumps([seq, stream_id, "hostile"], separators=_JSON_SEPARATORS)
    if kind == "poison":
        return json.dumps({"seq": POISON_SEQ, "stream": stream_id, "data": "poisoned"},
                          separators=_JSON_SEPARATORS)
    raise ValueError(f"unknown malformed kind {kind!r}")


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
    if not _DIGITS.fullmatch(text):
        raise ValueError(f"from_seq must be an integer >= 1, got {text!r}")
    value = int(text)
    if value < 1:
        raise ValueError(f"from_seq must be an integer >= 1, got {text!r}")
    return value


def _split_target(target: str) -> tuple[str, dict[str, list[str]]]:
    path, _, query = target.partition("?")
    return path, parse_qs(query, keep_blank_values=True)


def _format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class _Stream:
    """The state of one stream id: its connections, counters and pending faults."""

    __slots__ = (
        "connections",
        "frames_sent",
        "id",
        "malformed",
        "malformed_sent",
        "paused_until",
        "pending_skip",
    )

    def __init__(self, stream_id: str) -> None:
        self.id = stream_id
        self.connections: set[_Connection] = set()
        self.frames_sent = 0
        self.malformed_sent = 0
        self.malformed: deque[str] = deque()
        self.pending_skip = 0
        self.paused_until = 0.0  # time.monotonic(); 0 = not paused


class _Connection:
    """One open WebSocket connection to a stream."""

    __slots__ = ("closed", "drop_mode", "stream", "wake", "ws")

    def __init__(self, ws: ServerConnection, stream: _Stream) -> None:
        self.ws = ws
        self.stream = stream
        self.closed = False
        self.drop_mode: DropMode | None = None
        self.wake = asyncio.Event()

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


class UpstreamServer:
    """The reference replaying upstream. ``async with UpstreamServer(...) as up: ...``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        streams: int = 12,
        rate: float = 10.0,
        initial_backlog: int = 0,
        retention: int | None = None,
    ) -> None:
        if not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a finite number > 0, got {rate!r}")
        if streams < 0:
            raise ValueError(f"streams must be >= 0, got {streams!r}")
        if initial_backlog < 0:
            raise ValueError(f"initial_backlog must be >= 0, got {initial_backlog!r}")
        if retention is not None and retention < 1:
            raise ValueError(f"retention must be >= 1 or None, got {retention!r}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port!r}")
        # "localhost" may resolve to two addresses, which with port 0 get two different ports.
        self._host = "127.0.0.1" if host == "localhost" else host
        self._requested_port = port
        self.rate = float(rate)
        self.initial_backlog = initial_backlog
        self.retention = retention
        self._declared = declared_stream_ids(streams)
        self._streams: dict[str, _Stream] = {sid: _Stream(sid) for sid in self._declared}
        self._server: Server | None = None
        self._port: int | None = None
        self._t0 = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Bind the socket and start serving; the clock of every stream starts now."""
        if self._server is not None:
            raise RuntimeError("UpstreamServer already started")
        server = await serve(
            self._handle,
            self._host,
            self._requested_port,
            compression=None,
            process_request=self._process_request,
            close_timeout=_CLOSE_TIMEOUT,
            max_size=2**16,
        )
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

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
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
        return f"ws://{_format_host(self._host)}:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://{_format_host(self._host)}:{self.port}"

    @property
    def stream_ids(self) -> list[str]:
        """The pre-declared stream ids (``s001``, ...)."""
        return list(self._declared)

    def url_for(self, stream_id: str, from_seq: int | None = None) -> str:
        """The WebSocket URL of ``stream_id`` (optionally with ``from_seq``)."""
        _check_stream_id(stream_id)
        url = f"{self.base_url}/streams/{stream_id}"
        if from_seq is not None:
            url += f"?from_seq={from_seq}"
        return url

    def head(self) -> int:
        """The newest ``seq`` produced now (the same for every stream: one clock)."""
        return self._head_at(time.monotonic())

    def _head_at(self, now: float) -> int:
        elapsed = max(0.0, now - self._t0)
        return self.initial_backlog + math.floor(elapsed * self.rate + 1e-9)

    def _due(self, seq: int) -> float:
        """The monotonic time at which ``seq`` is produced."""
        return self._t0 + (seq - self.initial_backlog) / self.rate

    def _stream(self, stream_id: str) -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is None:
            stream = self._streams[_check_stream_id(stream_id)] = _Stream(stream_id)
        return stream

    def stats(self) -> dict[str, Any]:
        """Per stream: head, open connections, frames sent (and hostile frames sent)."""
        head = self.head()
        return {
            "rate": self.rate,
            "head": head,
            "streams": {
                sid: {
                    "head": head,
                    "connections": len(stream.connections),
                    "frames_sent": stream.frames_sent,
                    "malformed_sent": stream.malformed_sent,
                }
                for sid, stream in sorted(self._streams.items())
            },
        }

    # -- fault hooks ---------------------------------------------------------------------

    def drop(self, stream_id: str | None = None, *, abort: bool = False) -> int:
        """Close every open connection of ``stream_id`` (all streams if None).

        Closes with code 1011, or aborts the TCP connection when ``abort``. Returns how many
        connections were dropped.
        """
        if stream_id is None:
            streams = list(self._streams.values())
        else:
            _check_stream_id(stream_id)
            found = self._streams.get(stream_id)
            streams = [] if found is None else [found]
        count = 0
        for stream in streams:
            for conn in list(stream.connections):
                if conn.closed or conn.drop_mode is not None:
                    continue
                count += 1
                if abort:
                    conn.drop_mode = "abort"
                    conn.ws.transport.abort()
                else:
                    conn.drop_mode = "close"
                    self._spawn(conn.ws.close(DROP_CLOSE_CODE, "dropped by control hook"))
                conn.wake.set()
        return count

    def inject_malformed(self, stream_id: str, count: int = 1, kind: str = "notjson") -> int:
        """Precede each of the next ``count`` frames sent on ``stream_id`` by a hostile frame.

        Returns how many hostile frames are now pending on the stream.
        """
        if kind not in MALFORMED_KINDS:
            raise ValueError(
                f"unknown malformed kind {kind!r}; expected one of {', '.join(MALFORMED_KINDS)}"
            )
        if not 1 <= count <= _MAX_MALFORMED_COUNT:
            raise ValueError(f"count must be in 1..{_MAX_MALFORMED_COUNT}, got {count!r}")
        stream = self._stream(stream_id)
        stream.malformed.extend([kind] * count)
        return len(stream.malformed)

    def inject_gap(self, stream_id: str, skip: int) -> None:
        """Make the next connection to ``stream_id`` start ``skip`` seqs later than asked."""
        if skip < 0:
            raise ValueError(f"skip must be >= 0, got {skip!r}")
        self._stream(stream_id).pending_skip = skip

    def pause(self, stream_id: str, seconds: float) -> None:
        """Stop sending on ``stream_id`` for ``seconds`` (0 resumes); the head keeps advancing."""
        if not (math.isfinite(seconds) and 0 <= seconds <= _MAX_PAUSE_SECONDS):
            raise ValueError(f"seconds must be in 0..{_MAX_PAUSE_SECONDS:g}, got {seconds!r}")
        stream = self._stream(stream_id)
        stream.paused_until = time.monotonic() + seconds if seconds > 0 else 0.0
        for conn in stream.connections:
            conn.wake.set()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- HTTP ----------------------------------------------------------------------------

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path, params = _split_target(request.path)
        if path.startswith("/streams/"):
            if not STREAM_ID_PATTERN.fullmatch(path.removeprefix("/streams/")):
                return connection.respond(404, "not found: unknown path\n")
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
        try:
            if hook == "drop":
                abort = (one("abort") or "0").lower() in ("1", "true", "yes")
                return {"dropped": self.drop(stream_id, abort=abort)}
            if hook not in ("malformed", "gap", "pause"):
                raise _HttpError(404, f"not found: unknown control hook {hook!r}")
            if stream_id is None:
                raise _HttpError(400, "bad request: stream is required")
            if hook == "malformed":
                kind = one("kind") or "notjson"
                pending = self.inject_malformed(stream_id, integer("count", 1), kind)
                return {"stream": stream_id, "kind": kind, "pending": pending}
            if hook == "gap":
                skip = integer("skip", 1)
                self.inject_gap(stream_id, skip)
                return {"stream": stream_id, "skip": skip}
            text = one("seconds")
            if text is None:
                raise _HttpError(400, "bad request: seconds is required")
            try:
                seconds = float(text)
            except ValueError:
                message = f"bad request: seconds must be a number, got {text!r}"
                raise _HttpError(400, message) from None
            self.pause(stream_id, seconds)
            return {"stream": stream_id, "paused_for": seconds}
        except ValueError as exc:
            raise _HttpError(400, f"bad request: {exc}") from None

    # -- WebSocket -----------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None  # the handshake succeeded
        path, params = _split_target(ws.request.path)
        stream = self._stream(path.removeprefix("/streams/"))
        from_seq = _parse_from_seq(params)  # validated in _process_request

        start = from_seq + stream.pending_skip
        stream.pending_skip = 0
        if self.retention is not None:
            start = max(start, self.head() - self.retention + 1)

        conn = _Connection(ws, stream)
        stream.connections.add(conn)
        reader = asyncio.create_task(self._read_until_closed(conn))
        try:
            await self._pump(conn, start)
        except ConnectionClosed:
            pass
        finally:
            stream.connections.discard(conn)
            reader.cancel()
            await asyncio.wait([reader])

    @staticmethod
    async def _read_until_closed(conn: _Connection) -> None:
        """Discard whatever the client sends (so closing handshakes go through); note closure."""
        try:
            async for _ in conn.ws:
                pass
        except ConnectionClosed:
            pass
        finally:
            conn.closed = True
            conn.wake.set()

    async def _pump(self, conn: _Connection, start: int) -> None:
        """Send ``start``, ``start + 1``, ... : the backlog at once, then live as produced."""
        ws, stream = conn.ws, conn.stream
        seq = start
        sends = 0
        while True:
            conn.wake.clear()  # clear before checking, so a wake-up during the checks is kept
            if conn.closed:
                return
            if conn.drop_mode is not None:
                if conn.drop_mode == "close":
                    await ws.close(DROP_CLOSE_CODE, "dropped by control hook")
                return
            now = time.monotonic()
            if stream.paused_until > now:
                await conn.sleep(stream.paused_until - now)
                continue
            head = self._head_at(now)
            if seq > head:
                await conn.sleep(self._due(seq) - now)
                continue
            while seq <= head:
                if conn.closed or conn.drop_mode is not None:
                    break
                if stream.paused_until and stream.paused_until > time.monotonic():
                    break
                if stream.malformed:
                    kind = stream.malformed.popleft()
                    await ws.send(_hostile_frame(kind, stream.id, seq))
                    stream.malformed_sent += 1
                await ws.send(frame_for(stream.id, seq))
                stream.frames_sent += 1
                seq += 1
                sends += 1
                if sends % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # let other connections and handshakes run


# -- command line ------------------------------------------------------------------------


def _int_in(low: int, high: int | None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return parse


def _positive_rate(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamlease dev upstream",
        description="The reference replaying upstream: many WebSocket streams on one port.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=_int_in(0, 65535), default=8765, help="port (default 8765; 0 = any free)"
    )
    parser.add_argument(
        "--streams", type=_int_in(0, None), default=12, help="pre-declared streams s001... (12)"
    )
    parser.add_argument(
        "--rate", type=_positive_rate, default=10.0, help="messages per second per stream (10)"
    )
    parser.add_argument(
        "--initial-backlog",
        type=_int_in(0, None),
        default=0,
        help="messages already available at start (0)",
    )
    parser.add_argument(
        "--retention",
        type=_int_in(1, None),
        default=None,
        help="messages kept per stream (default unlimited)",
    )
    parser.add_argument(
        "--allow-remote", action="store_true", help="allow binding a non-loopback address"
    )
    return parser


async def _serve(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread, or not Unix
            continue
        installed.append(sig)
    up = UpstreamServer(
        host=args.host,
        port=args.port,
        streams=args.streams,
        rate=args.rate,
        initial_backlog=args.initial_backlog,
        retention=args.retention,
    )
    try:
        try:
            await up.start()
        except OSError as exc:
            print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
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
    args = parser.parse_args(argv)
    if not args.allow_remote and not _is_loopback(args.host):
        parser.error(f"--host {args.host} is not a loopback address (pass --allow-remote)")
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(_serve(args))


if __name__ == "__main__":
    raise SystemExit(main())
