"""Virtual time for asyncio tests: a loop whose clock jumps to the next timer whenever
every task is waiting, so a test of minutes of lease time runs in milliseconds and never
depends on how busy the machine is.

Mark a test ``@pytest.mark.virtual_time`` (tests/conftest.py then runs it on this loop)
and give the code under test a ``LoopClock``. Only for code that does no real I/O: a
task waiting on a socket would see time fly past it.
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

WALL_START_MS = 1_800_000_000_000


class _InstantSelector:
    """Delegates to a real selector, but instead of blocking for ``timeout`` it advances
    the loop's virtual clock by that much (nothing can arrive meanwhile: no real I/O)."""

    def __init__(self, loop: VirtualTimeLoop, inner: selectors.BaseSelector) -> None:
        self._loop = loop
        self._inner = inner

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = self._inner.select(0)
        if ready:
            return ready
        if timeout is None:
            # Nothing scheduled and nothing ready: only the self-pipe (another thread's
            # call_soon_threadsafe) could wake us. Wait for it for real, briefly.
            ready = self._inner.select(5.0)
            if not ready:
                raise RuntimeError("virtual time: every task waits and no timer is set")
            return ready
        self._loop.advance(timeout)
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_InstantSelector(self, selectors.DefaultSelector()))  # type: ignore[arg-type]

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(0.0, seconds)


class LoopClock:
    """The worker's ``Clock`` on the running loop's time (virtual under VirtualTimeLoop)."""

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    def wall_ms(self) -> int:
        return WALL_START_MS + int(asyncio.get_running_loop().time() * 1000)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))
