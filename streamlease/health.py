"""The worker's HTTP endpoints: ``/metrics``, ``/healthz`` (liveness), ``/readyz``.

Served off the worker's event loop, so a stuck loop cannot hide itself: the loop
publishes when each held stream was last renewed, and ``/healthz`` fails once any of
them is older than the lease, whether because DynamoDB refuses or because the loop no
longer runs. ``/readyz`` fails until the worker has started and while it drains.

The server is a small asyncio HTTP/1.1 responder on its own thread with its own event
loop, rather than a thread per connection: an idle connection then costs a socket and a
few hundred bytes, not a thread, and every limit is a plain deadline. Bounds:

- at most ``max_connections`` open at once; the next one closes the oldest (a flood of
  idle connections cannot lock the health check out, and sockets stay bounded);
- a request's line and headers must arrive within ``header_timeout_s`` of the accept
  (answered 408 and closed otherwise: a slow-loris client is dropped) and fit in
  ``MAX_HEAD_BYTES`` (431 otherwise);
- a response must be taken by the client within ``write_timeout_s`` (then aborted);
- one request a connection (``Connection: close``): nothing is held between requests.

Only ``GET`` and ``HEAD`` are served; a request body is never read.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus

MAX_HEAD_BYTES = 8192


class HealthState:
    """Written by the event loop, read by the HTTP thread (single dict operations only)."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self.renewed_at: dict[str, float] = {}
        self.started = False
        self.draining = False

    def renewed(self, stream: str, at: float) -> None:
        self.renewed_at[stream] = at

    def dropped(self, stream: str) -> None:
        self.renewed_at.pop(stream, None)

    def live(self, now: float | None = None) -> tuple[bool, str]:
        now = time.monotonic() if now is None else now
        times = list(self.renewed_at.values())
        if not times:
            return True, "ok: no streams held"
        stale = max(now - t for t in times)
        if stale > self.lease_s:
            return False, (f"a held stream was last renewed {stale:.1f} s ago "
                           f"(lease {self.lease_s:g} s)")
        return True, f"ok: {len(times)} streams, oldest renewal {stale:.1f} s ago"

    def ready(self) -> tuple[bool, str]:
        if self.draining:
            return False, "draining"
        if not self.started:
            return False, "starting"
        return True, "ok"


Exposition = Callable[[], tuple[bytes, str]]


@dataclass(frozen=True)
class ServerLimits:
    """Connections served at once, and how long a request's head and an answer may take."""

    max_connections: int = 64
    header_timeout_s: float = 5.0
    write_timeout_s: float = 10.0


class HealthServer:
    """The listening server and its thread. ``address``/``port``: where it listens."""

    def __init__(self, sock: socket.socket, health: HealthState, exposition: Exposition,
                 limits: ServerLimits) -> None:
        self.address, self.port = sock.getsockname()[:2]
        self.health = health
        self.exposition = exposition
        self.limits = limits
        self._sock = sock
        self._open: dict[asyncio.StreamWriter, None] = {}  # oldest first
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, name="http", daemon=True)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop listening, drop every connection, end the thread."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        self._server = loop.run_until_complete(asyncio.start_server(
            self._handle, sock=self._sock, limit=MAX_HEAD_BYTES))
        try:
            loop.run_forever()
        finally:
            self._server.close()
            for writer in list(self._open):
                writer.transport.abort()
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open[writer] = None
        if len(self._open) > self.limits.max_connections:
            oldest = next(iter(self._open))
            del self._open[oldest]  # now, not when its handler wakes: evict each one once
            oldest.transport.abort()
        try:
            await self._serve_one(reader, writer)
        except Exception:  # a client can only ever cost its own connection
            writer.transport.abort()
        finally:
            self._open.pop(writer, None)

    async def _serve_one(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.limits.header_timeout_s):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            await self._respond(writer, HTTPStatus.REQUEST_TIMEOUT, b"request timeout\n")
            return
        except asyncio.LimitOverrunError:
            await self._respond(writer, HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                b"request header too large\n")
            return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.transport.abort()
            return
        method, _, rest = head.partition(b" ")
        path = rest.split(b" ", 1)[0].split(b"?", 1)[0]
        if method not in (b"GET", b"HEAD"):
            await self._respond(writer, HTTPStatus.METHOD_NOT_ALLOWED, b"GET or HEAD only\n")
            return
        status, body, content_type = self._route(path)
        await self._respond(writer, status, body, content_type, head_only=method == b"HEAD")

    def _route(self, path: bytes) -> tuple[HTTPStatus, bytes, str]:
        if path == b"/metrics":
            body, content_type = self.exposition()
            return HTTPStatus.OK, body, content_type
        if path in (b"/healthz", b"/readyz"):
            ok, text = self.health.live() if path == b"/healthz" else self.health.ready()
            return (HTTPStatus.OK if ok else HTTPStatus.SERVICE_UNAVAILABLE,
                    (text + "\n").encode(), "text/plain; charset=utf-8")
        return HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8"

    async def _respond(self, writer: asyncio.StreamWriter, status: HTTPStatus, body: bytes,
                       content_type: str = "text/plain; charset=utf-8", *,
                       head_only: bool = False) -> None:
        head = (f"HTTP/1.1 {status.value} {status.phrase}\r\n"
                f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()
        writer.write(head if head_only else head + body)
        try:
            async with asyncio.timeout(self.limits.write_timeout_s):
                await writer.drain()
        except (TimeoutError, ConnectionError):
            writer.transport.abort()
            return
        writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.limits.write_timeout_s):
                await writer.wait_closed()


def serve(address: str, port: int, health: HealthState, exposition: Exposition,
          limits: ServerLimits = ServerLimits()) -> HealthServer:
    """Listen on ``address`` (an IP literal; ``0.0.0.0`` is every IPv4 interface, as the
    scraper and the ECS agent are elsewhere) and serve from a thread of its own.

    Binding happens here, so a port in use raises OSError to the caller."""
    family = socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    sock = socket.create_server((address, port), family=family, backlog=128)
    server = HealthServer(sock, health, exposition, limits)
    server.start()
    return server
