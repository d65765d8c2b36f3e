"""Time, behind a protocol so tests and the lease rules never read the real clock.

Outside this module nobody calls ``time.time()``, ``time.monotonic()`` or
``asyncio.sleep()``: they take a ``Clock``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never jumps; only differences mean anything."""

    def wall_ms(self) -> int:
        """Epoch milliseconds (can jump; compared with other machines' clocks)."""

    async def sleep(self, seconds: float) -> None:
        """Suspend the calling task."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


SYSTEM_CLOCK = SystemClock()


async def sleep_unless(seconds: float, *events: asyncio.Event) -> None:
    """Sleep ``seconds``, cut short as soon as any of ``events`` is set."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=max(0.0, seconds),
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waits:
            waiter.cancel()
