"""What one held stream's supervisor and its roles are given: their settings, their ties
to the rest of the worker, the pump they drive, and the tenure's live state they share.

The roles are ``streamlease.supervisor`` (the tenure's scope: pump, heartbeat, drain),
``streamlease.heartbeat`` (the stream lease kept) and ``streamlease.release`` (the end:
output closed, lease released). This module imports none of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from streamlease.core.lease import Holding, LeaseTimings, StopReason, always
from streamlease.core.membership import MemberRecord
from streamlease.core.model import StreamRecord, Tenure
from streamlease.core.upstream import Catalog
from streamlease.core.urls import AllowList
from streamlease.pumping import PumpSettings
from streamlease.strain import LeaseHealth
from streamlease.upstream import BUILTIN_UPSTREAMS, Upstreams

# A worker's own releases in flight at once (a drain, a rebalance): enough to release
# hundreds of streams in well under a second on DynamoDB, few enough that the member
# heartbeat never queues behind them.
RELEASES_IN_FLIGHT = 16


@dataclass(frozen=True)
class SupervisorSettings:
    timings: LeaseTimings  # the stream lease: renewed every ``heartbeat_s`` of these
    allowed_urls: AllowList
    pump: PumpSettings
    call_timeout_s: float = 5.0  # one store call (renew, check, release) at most
    drain_timeout_s: float = 10.0  # the pump's final flush at most
    check_s: float | None = None  # read the item this often (None: only when renewing)
    upstreams: Upstreams = BUILTIN_UPSTREAMS  # how each stream's upstream is spoken to
    # A drain may hand the stream to a named taker while delivering (make before break,
    # ``streamlease.core.handover``), waiting this long for the take (None: never; only
    # the events table's transactions keep the item's last_seq exactly where delivery is).
    handover_wait_s: float | None = None

    @property
    def catalog(self) -> Catalog:
        return self.upstreams.catalog


class PumpLike(Protocol):
    @property
    def committed(self) -> int: ...

    @property
    def abandoned(self) -> bool: ...

    async def run(self) -> None: ...

    async def stop(self) -> None: ...

    async def abort(self) -> None: ...

    async def reconnect(self, reason: str) -> None: ...


PumpFactory = Callable[..., PumpLike]  # called as ``streamlease.pump.Pump`` is


def never() -> bool:
    return False


@dataclass(frozen=True)
class Hooks:
    """Optional: a count of delivered messages (the load test), a pump stand-in (tests)."""

    on_delivered: Callable[[int], None] | None = None
    pump_factory: PumpFactory | None = None


@dataclass(frozen=True)
class Ties:
    """What ties every supervisor of a worker to the rest of it (``Holdings`` makes one):
    the release gate they share, the renewal outcomes admission control reads, whether the
    worker may still write (its membership), whether someone else reads held items for
    them (the batched read), whether the leader's change feed tells of every change, and
    how a stream is offered to a peer (its member row; None: never) and to whom next when
    a peer cannot take it."""

    release_gate: asyncio.Semaphore = field(
        default_factory=lambda: asyncio.Semaphore(RELEASES_IN_FLIGHT))
    lease_health: LeaseHealth | None = None
    member_alive: Callable[[float], bool] = always
    watched: Callable[[], bool] = never
    told: Callable[[], bool] = never
    hooks: Hooks = Hooks()
    offer: Callable[[MemberRecord, str], Awaitable[bool]] | None = None
    # Another peer to offer a stream to, none of those named, for a rebalance or not
    # (None: nobody has room).
    next_taker: Callable[[str, frozenset[str], bool], MemberRecord | None] | None = None


@dataclass
class Tenancy:
    """One tenure's live state, shared by its supervisor's roles: the holder state machine,
    the item as last read, the wake-up of the supervisor's main task, why the tenure ends
    in error, and the deadline a shutdown gave its release."""

    holding: Holding
    record: StreamRecord
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    failure: str | None = None  # written to ``last_error`` when the tenure ends
    release_by: float | None = None  # monotonic deadline for the release

    @property
    def tenure(self) -> Tenure:
        return self.holding.tenure

    @property
    def stream(self) -> str:
        return self.holding.tenure.stream_id

    def fail(self, message: str) -> None:
        """End the tenure through the graceful path (flush, release) with ``message`` as
        its error, unless it already has one."""
        if self.failure is None:
            self.failure = message[:500]
        self.holding.begin_drain(StopReason.ERROR)
