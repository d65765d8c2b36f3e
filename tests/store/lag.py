"""Waiting out index lag in the store tests: the in-memory store's clock is stepped by
hand, the embedded server's lag passes in real time (polled, with a deadline)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from streamlease.store.memory import MemoryStore
from streamlease.store.protocols import Stores

T = TypeVar("T")



class ManualClock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def memory_of(stores: Stores) -> MemoryStore | None:
    admin = stores.admin
    return admin if isinstance(admin, MemoryStore) else None


async def eventually(stores: Stores, read: Callable[[], Awaitable[T]],
                     ok: Callable[[T], bool], timeout: float = 10.0) -> T:
    """Read until ``ok`` holds (the index has caught up); fail with the last value."""
    memory = memory_of(stores)
    deadline = time.monotonic() + timeout
    step = 0.02
    while True:
        value = await read()
        if ok(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"still {value!r} after {timeout} s")
        if memory is not None and isinstance(memory.clock, ManualClock):
            memory.clock.advance(step)
        else:
            await asyncio.sleep(step)
