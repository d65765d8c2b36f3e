"""A pump's connections to the upstream, one at a time: work out what to dial (secrets
resolved), dial it (``streamlease.dial``), go through the wire's opening exchange, keep it
alive, read frames until a batch is due, and close it.

While a batch is written nothing is read: frames wait in websockets' small receive queue,
then in the kernel, so a stream holds at most one batch and that queue
(``streamlease.core.stream.stream_buffer_bytes``). A connection that fails before any frame
could be read (setup, the opening exchange) is the stream's ``last_error``, once per
change of text.
"""

from __future__ import annotations

import asyncio
import logging

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, ConnectionClosedOK
from websockets.frames import CloseCode

from streamlease import tracing
from streamlease.ahead import Ahead, dial_options
from streamlease.core.urls import redact
from streamlease.delivery import Delivery
from streamlease.dial import dial
from streamlease.errors import DialError
from streamlease.logs import event
from streamlease.pumping import Interrupts, PumpParts
from streamlease.upstream import Connection, OpeningFailed, Prepared, SetupFailed


class Session:
    def __init__(self, parts: PumpParts, delivery: Delivery, interrupts: Interrupts) -> None:
        self.parts = parts
        self.ctx = parts.ctx
        self.machine = parts.machine
        self.wire = parts.wire
        self.tenure = parts.holding.tenure
        self.stream = self.tenure.stream_id
        self.delivery = delivery
        self.interrupts = interrupts
        self.connected = False
        self._connections_made = 0
        self._closed_ms: int | None = None  # wall time the last connection ended
        self._setup_problem: str | None = None
        # A connection opened before the tenure began (a hand-over, ``streamlease.ahead``):
        # the first connection, already through its opening exchange.
        self.ahead: Ahead | None = None

    async def connection(self, asked: int) -> str:
        """One connection, from the handshake to its end; the reason it ended."""
        ahead, self.ahead = self.ahead, None
        if ahead is not None:
            prepared, ws = ahead.prepared, ahead.ws
        else:
            opened = await self._dial(asked)
            if isinstance(opened, str):
                return opened
            prepared, ws = opened
        metrics = self.ctx.metrics
        self.connected = True
        metrics.upstream_connected(1)
        event(logging.INFO, "pump.connected", "connected to upstream", stream=self.stream,
              fence=self.tenure.fence, url=redact(prepared.url), from_seq=asked,
              upstream=self.wire.name)
        self.delivery.connected(self._connections_made == 0, self._closed_ms)
        self._connections_made += 1
        try:
            return await self._session(ws, prepared, ahead)
        finally:
            self._closed_ms = self.ctx.clock.wall_ms()
            self.connected = False
            metrics.upstream_connected(-1)

    async def _dial(self, asked: int) -> tuple[Prepared, ClientConnection] | str:
        """A new connection, from ``asked`` on; or the reason there is none."""
        prepared = await self._prepare(asked)
        if isinstance(prepared, str):
            return prepared
        try:
            ws = await self.interrupts.wait(self._open(prepared))
        except DialError as exc:
            # Only the failure's type, safe facts and the redacted URL: the library's own
            # message can hold the whole URL with its credentials.
            event(logging.WARNING, "pump.connect_failed", "cannot connect to upstream",
                  stream=self.stream, fence=self.tenure.fence, url=exc.url, error=str(exc))
            return "connect_failed"
        if ws is None:
            return "closed"  # stopped, or the URL changed, while the handshake was in flight
        return prepared, ws

    async def _prepare(self, from_seq: int) -> Prepared | str:
        """What to dial (secrets resolved), or the reason it cannot be worked out."""
        try:
            prepared = await self.interrupts.wait(
                self.wire.prepare(self.parts.holding.ws_url, from_seq))
        except SetupFailed as exc:
            text = str(exc)
            if text != self._setup_problem:
                event(logging.ERROR, "pump.setup_failed",
                      "cannot work out how to connect to the upstream; not dialled",
                      stream=self.stream, fence=self.tenure.fence, upstream=self.wire.name,
                      error=text)
            self._connect_problem(text)
            return "setup_failed"
        if prepared is None:
            return "closed"  # stopped while a secret was being fetched
        return prepared

    async def _open(self, prepared: Prepared) -> ClientConnection:
        """Dial the upstream: the one place that opens a connection (the allow-list is
        checked again on the final URL and on every redirect; no proxy; TLS verified).
        The tenure's first connection is dialled in its acquisition's trace; a reconnect
        starts a trace of its own, linked to it."""
        settings = self.parts.settings
        reconnect = self._connections_made > 0
        with tracing.span("dial", root=reconnect, stream=self.stream, fence=self.tenure.fence,
                          upstream=self.wire.name, reconnect=reconnect):
            return await dial(prepared.url, settings.allowed_urls,
                              dial_options(settings, prepared))

    def _connect_problem(self, text: str) -> None:
        """A connection attempt failed before any frame could be read (setup, opening
        exchange): the stream's ``last_error``, written once per change of text."""
        if text != self._setup_problem:
            self._setup_problem = text
            if self.parts.on_problem is not None:
                self.parts.on_problem(text)

    async def _session(self, ws: ClientConnection, prepared: Prepared,
                       ahead: Ahead | None = None) -> str:
        """The opening exchange (done already for a connection opened ``ahead``: what
        arrived during it is handed on first), then read and write in turn until the
        connection ends or a close is asked for."""
        keepalive: asyncio.Task[None] | None = None
        opening = False
        try:
            if ahead is None:
                opening = True
                await self.interrupts.wait(self.wire.open(Connection(ws), prepared,
                                                          self._deliver))
                opening = False
            else:
                for data in ahead.frames:
                    await self._deliver(data)
            self._setup_problem = None  # connected and through the opening: a new failure
            # of the same kind is reported again
            if prepared.keepalive is not None and prepared.keepalive_s is not None:
                keepalive = asyncio.create_task(
                    self._keepalive(ws, prepared.keepalive, prepared.keepalive_s),
                    name=f"keepalive:{self.stream}")
            while not self.machine.closing:
                await self._read(ws)
                await self.delivery.write_due()
        except OpeningFailed as exc:
            event(logging.WARNING, "pump.opening_failed",
                  "the upstream's opening exchange did not complete; reconnecting",
                  stream=self.stream, fence=self.tenure.fence, upstream=self.wire.name,
                  reason=exc.reason, error=str(exc))
            self._connect_problem(str(exc))
            await self._close(ws)
            return exc.reason
        except ConnectionClosedOK:
            return "closed"
        except ConnectionClosed as exc:
            if opening:
                self._closed_while_opening(exc)
            return self._closed(exc)
        except asyncio.CancelledError:
            ws.transport.abort()
            raise
        except Exception:
            await self._close(ws)
            raise
        finally:
            if keepalive is not None:
                await self._end_keepalive(keepalive)
        await self._close(ws)
        return "closed"

    def _closed_while_opening(self, exc: ConnectionClosed) -> None:
        """The upstream closed during the opening exchange: usually a refused token or
        subscription (close codes like 4004). The stream's ``last_error`` says so."""
        code = exc.rcvd.code if exc.rcvd else None
        reason = (exc.rcvd.reason if exc.rcvd else "")[:120]
        text = f"upstream closed the connection during the opening exchange (code {code}" + \
            (f": {reason})" if reason else ")")
        event(logging.WARNING, "pump.opening_failed",
              "the upstream's opening exchange did not complete; reconnecting",
              stream=self.stream, fence=self.tenure.fence, upstream=self.wire.name,
              reason="closed", error=text)
        self._connect_problem(text)

    async def _deliver(self, data: str | bytes) -> None:
        """A frame read during the opening exchange: handled like any other, and a batch
        that is due is written before the exchange reads on (back-pressure)."""
        self.delivery.receive(data)
        if self.machine.pause_reading:
            await self.delivery.write_due()

    async def _keepalive(self, ws: ClientConnection, text: str, every_s: float) -> None:
        """The profile's application-level keepalive, every ``every_s`` while connected."""
        while True:
            await self.ctx.clock.sleep(every_s)
            await ws.send(text)

    async def _end_keepalive(self, task: asyncio.Task[None]) -> None:
        """Cancel the keepalive and read how it ended: a send on a closing connection is
        expected (the session sees the close itself); anything else is logged."""
        task.cancel()
        await asyncio.wait([task])
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, ConnectionClosed):
            event(logging.WARNING, "pump.keepalive_failed", "the upstream keepalive failed",
                  stream=self.stream, fence=self.tenure.fence, error=type(exc).__name__)

    async def _read(self, ws: ClientConnection) -> None:
        """Hand frames to the machine until a batch is due or a close is asked for.

        With nothing buffered it waits for the upstream as long as it takes (an idle stream
        holds no timer); with frames buffered, until the oldest has waited ``batch_max_s``."""
        machine, receive, clock = self.machine, self.delivery.receive, self.ctx.clock
        self.interrupts.parked = True
        try:
            while not machine.pause_reading:
                deadline = machine.flush_deadline()
                if deadline is None:
                    receive(await ws.recv())
                    continue
                wait = deadline - clock.monotonic()
                if wait <= 0:
                    machine.tick(deadline)
                    continue
                async with asyncio.timeout(wait):
                    while not machine.pause_reading:
                        receive(await ws.recv())
        except TimeoutError:
            machine.tick(clock.monotonic())
        except asyncio.CancelledError:
            if not self.interrupts.own():
                raise
        finally:
            self.interrupts.parked = False

    def _closed(self, exc: ConnectionClosed) -> str:
        code = exc.rcvd.code if exc.rcvd else (exc.sent.code if exc.sent else None)
        event(logging.INFO, "pump.disconnected", "upstream connection closed",
              stream=self.stream, fence=self.tenure.fence, code=code,
              reason=(exc.rcvd.reason if exc.rcvd else "")[:200],
              after_seq=self.machine.received)
        if code == CloseCode.MESSAGE_TOO_BIG:
            event(logging.ERROR, "pump.frame_too_big",
                  "upstream frame exceeds STREAMLEASE_MAX_FRAME_BYTES",
                  stream=self.stream, fence=self.tenure.fence,
                  limit=self.parts.settings.max_frame_bytes, after_seq=self.machine.received)
            return "too_big"
        return "error"

    async def _close(self, ws: ClientConnection) -> None:
        """Close, reading and dropping until the handshake ends: a backlog queued behind
        the close frame would otherwise hold it up for close_timeout. Nothing is lost: the
        next connection asks for committed + 1."""
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(_drop_until_closed(ws))
                await ws.close()
        except* Exception as group:
            event(logging.INFO, "pump.close_failed", "closing the upstream connection failed",
                  stream=self.stream, fence=self.tenure.fence,
                  error=type(group.exceptions[0]).__name__)


async def _drop_until_closed(ws: ClientConnection) -> None:
    try:
        while True:
            await ws.recv()
    except ConnectionClosed:
        pass
