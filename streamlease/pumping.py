"""What one pump (``streamlease.pump``) and its roles share: the settings, the parts they
are built from, and the interruptible waits of the pump's one task. Imports none of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from streamlease.context import Context
from streamlease.core.lease import Holding
from streamlease.core.stream import (
    BATCH_FILL_BYTES,
    BATCH_MAX_BYTES,
    RECEIVE_QUEUE,
    StreamMachine,
    StreamRules,
)
from streamlease.core.urls import AllowList
from streamlease.upstream import Wire

T = TypeVar("T")


@dataclass(frozen=True)
class PumpSettings:
    batch_max_messages: int = 200
    batch_max_bytes: int = BATCH_MAX_BYTES
    # Cut a batch once it fills what one DynamoDB write buys (the events-table sink); other
    # outputs pass ``batch_max_bytes`` (no such unit: batches grow to the other caps).
    batch_fill_bytes: int = BATCH_FILL_BYTES
    batch_max_s: float = 0.2
    max_frame_bytes: int = 262_144
    max_seq_jump: int = 1_000_000_000
    stall_s: float = 60.0
    receive_queue: tuple[int, int] = RECEIVE_QUEUE
    allowed_urls: AllowList = ()  # nothing may be dialled unless the worker says so
    call_timeout_s: float = 10.0
    open_timeout_s: float = 10.0
    reconnect_base_s: float = 0.1
    reconnect_cap_s: float = 30.0
    stable_after_s: float = 5.0  # a connection that lived this long resets the backoff
    # A failed sink write waits at most this long before it is tried again: the member
    # heartbeat (``streamlease.core.stream.sink_retry_cap``), 5 s at the defaults.
    sink_retry_cap_s: float = 5.0

    def rules(self) -> StreamRules:
        return StreamRules(
            batch_max_messages=self.batch_max_messages, batch_max_bytes=self.batch_max_bytes,
            batch_fill_bytes=self.batch_fill_bytes, batch_max_s=self.batch_max_s,
            max_seq_jump=self.max_seq_jump,
            stall_s=self.stall_s, reconnect_base_s=self.reconnect_base_s,
            reconnect_cap_s=self.reconnect_cap_s, stable_after_s=self.stable_after_s,
            sink_retry_cap_s=self.sink_retry_cap_s)


@dataclass(frozen=True)
class PumpParts:
    """What a pump's roles (``streamlease.session``, ``streamlease.delivery``) are built
    from. ``on_problem`` hears a one-line description when the stream stalls or cannot
    connect, and None at progress (``streamlease.pump.Pump``)."""

    ctx: Context
    holding: Holding
    settings: PumpSettings
    wire: Wire
    machine: StreamMachine
    on_problem: Callable[[str | None], None] | None = None


class Interrupts:
    """The pump task's waits for the upstream or the clock, which a request from the
    supervisor (stop, abort, reconnect) cuts short. A write in flight is never one: it
    was sent, so the sink decides it either way."""

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None  # the pump's task while it runs
        self.parked = False  # the task waits for the upstream or the clock, not a write
        self._interrupted = False  # this pump cancelled that wait

    async def wait(self, aw: Awaitable[T]) -> T | None:
        """Await ``aw`` (a wait for the upstream or the clock); None if a request from the
        supervisor interrupted it."""
        self.parked = True
        try:
            result = await aw
        except asyncio.CancelledError:
            if not self.own():
                raise
            return None
        finally:
            self.parked = False
        if self._interrupted:
            # The interrupt landed in code that swallowed it (a user's upstream): take it
            # back, or every later request would be ignored.
            self.own()
            return None
        return result

    def interrupt(self) -> None:
        """Wake the task if it waits for the upstream or the clock. The wait is cancelled
        (websockets' recv and handshake, and sleeps, are safe to cancel); ``own`` tells
        that cancellation apart from one coming from outside."""
        task = self.task
        if self.parked and not self._interrupted and task is not None and not task.done():
            self._interrupted = True
            task.cancel()

    def own(self) -> bool:
        """True if the CancelledError being handled is this pump's interrupt and nothing
        else: a cancellation from outside (the supervisor's timeout) still propagates."""
        if not self._interrupted:
            return False
        self._interrupted = False
        task = asyncio.current_task()
        return task is not None and task.uncancel() == 0
