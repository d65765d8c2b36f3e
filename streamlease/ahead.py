"""A connection opened ahead of a lease: the taker's side of a hand-over
(``streamlease.core.handover``) dials the upstream and completes the opening exchange
while the holder still delivers, then gives the open connection to the pump of the
tenure it takes (``streamlease.session``).

The connection asks for the item's ``last_seq + 1`` as read before the take; the holder
may deliver more until the take lands, so the pump drops what the connection replays up
to the ``last_seq`` the take returned. Nothing is read past the opening exchange until
then: frames wait in websockets' receive queue and the kernel, as they do during a write.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from websockets.asyncio.client import ClientConnection

from streamlease.core.model import StreamRecord
from streamlease.dial import DialOptions, dial
from streamlease.errors import DialError
from streamlease.pumping import PumpSettings
from streamlease.tenancy import SupervisorSettings
from streamlease.upstream import Connection, Prepared


class AheadFailed(Exception):
    """The connection could not be opened ahead; the message is safe to log."""


@dataclass
class Ahead:
    """An open connection, through its opening exchange, not yet read from; ``frames``:
    what arrived during the exchange that was not its reply."""

    ws: ClientConnection
    prepared: Prepared
    frames: list[str | bytes] = field(default_factory=list)

    async def close(self) -> None:
        """Close it unused (the take failed, or the tenure ended before it was read)."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await self.ws.close()
        self.ws.transport.abort()


def dial_options(settings: PumpSettings, prepared: Prepared) -> DialOptions:
    """How every upstream connection of a pump is dialled."""
    return DialOptions(
        compression=None, max_size=settings.max_frame_bytes,
        open_timeout=settings.open_timeout_s, close_timeout=2,
        max_queue=settings.receive_queue, ping_interval=20, ping_timeout=20,
        additional_headers=prepared.headers or None,
        subprotocols=prepared.subprotocols or None)


async def dial_ahead(settings: SupervisorSettings, record: StreamRecord) -> Ahead:
    """Dial ``record``'s upstream from its ``last_seq + 1`` and go through the opening
    exchange, bounded by the pump's open timeout. Raises ``AheadFailed`` for anything that
    went wrong (its text: the dial's safe message, or the failure's type)."""
    try:
        return await _dial_ahead(settings, record)
    except DialError as exc:
        raise AheadFailed(str(exc)) from exc
    except Exception as exc:
        raise AheadFailed(type(exc).__name__) from exc


async def _dial_ahead(settings: SupervisorSettings, record: StreamRecord) -> Ahead:
    pump = settings.pump
    wire = settings.upstreams.wire(record.stream_id, record.attributes)
    async with asyncio.timeout(pump.open_timeout_s):
        prepared = await wire.prepare(record.ws_url or "", (record.last_seq or 0) + 1)
        ws = await dial(prepared.url, settings.allowed_urls, dial_options(pump, prepared))
        ahead = Ahead(ws, prepared)

        async def keep(data: str | bytes) -> None:
            ahead.frames.append(data)

        try:
            await wire.open(Connection(ws), prepared, keep)
        except BaseException:
            ws.transport.abort()
            raise
    return ahead
