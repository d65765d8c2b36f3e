"""Stand-ins for unit tests of the supervisor and reconciler: a store wrapper that fails
on demand (around the in-memory store, so every answer it does give is real) and a pump
that follows a script instead of dialling an upstream."""

from __future__ import annotations

import asyncio
import inspect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from streamlease.clock import SYSTEM_CLOCK, Clock
from streamlease.context import Context
from streamlease.core.bulletin import Bulletin
from streamlease.core.frames import Frame
from streamlease.core.lease import Holding, RenewOutcome
from streamlease.core.membership import HeartbeatOutcome, MemberRecord
from streamlease.core.model import Tenure
from streamlease.errors import SelfFenced, StoreError, StoreThrottled, StoreUnavailable
from streamlease.health import HealthState
from streamlease.membership import FleetKnowledge, FleetView
from streamlease.metrics import Metrics
from streamlease.store.memory import MemoryStore
from streamlease.store.protocols import HeartbeatResult, RenewResult, Stores


@dataclass
class Fault:
    times: int  # how many calls it affects (-1: all)
    error: BaseException | None = None  # raised instead of calling (or after, if applied)
    delay: float = 0.0  # seconds before the call is made
    hang: bool = False  # never answers (until cancelled)
    apply: bool = False  # the call happens, then its answer is lost (error raised)


class FaultyStore:
    """Every method of the wrapped store, with faults injected per method name. Records
    each call's name and the timeout it was given."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.faults: dict[str, list[Fault]] = {}
        self.calls: list[tuple[str, float | None]] = []
        self.sent_at: list[tuple[str, float]] = []  # loop time of each call

    def stores(self) -> Stores:
        return Stores(leases=self, sink=self, admin=self)  # type: ignore[arg-type]

    def fail(self, method: str, times: int = 1, error: BaseException | None = None,
             delay: float = 0.0, hang: bool = False, apply: bool = False) -> None:
        fault = Fault(times, error or StoreUnavailable(f"{method}: injected"), delay, hang,
                      apply)
        self.faults.setdefault(method, []).append(fault)

    def heal(self, method: str | None = None) -> None:
        if method is None:
            self.faults.clear()
        else:
            self.faults.pop(method, None)

    def count(self, method: str) -> int:
        return sum(1 for name, _ in self.calls if name == method)

    def timeouts(self, method: str) -> list[float | None]:
        return [t for name, t in self.calls if name == method]

    def __getattr__(self, name: str) -> Any:
        target = getattr(self.inner, name)
        if not asyncio.iscoroutinefunction(target):
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            bound = inspect.signature(target).bind(*args, **kwargs)
            self.calls.append((name, bound.arguments.get("timeout")))
            self.sent_at.append((name, asyncio.get_running_loop().time()))
            fault = self._take(name)
            if fault is None:
                return await target(*args, **kwargs)
            try:
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.hang:
                    # Like the DynamoDB store: the call's own timeout ends the wait.
                    timeout = bound.arguments.get("timeout")
                    if timeout is None:
                        await asyncio.Event().wait()
                    await asyncio.sleep(timeout)
                    raise StoreUnavailable(f"{name} timed out")
                if fault.apply:
                    await target(*args, **kwargs)
                if fault.error is not None:
                    raise fault.error
            except StoreError as exc:
                throttled = isinstance(exc, StoreThrottled)
                if name == "renew":  # renewals report store errors as outcomes
                    return RenewResult(RenewOutcome.THROTTLED if throttled
                                       else RenewOutcome.UNKNOWN, error=str(exc))
                if name == "heartbeat":
                    return HeartbeatResult(HeartbeatOutcome.THROTTLED if throttled
                                           else HeartbeatOutcome.UNKNOWN, error=str(exc))
                raise
            return await target(*args, **kwargs)

        return call

    def _take(self, name: str) -> Fault | None:
        queue = self.faults.get(name)
        if not queue:
            return None
        fault = queue[0]
        if fault.times > 0:
            fault.times -= 1
            if fault.times == 0:
                queue.pop(0)
        return fault


def context(sink: Any = None, clock: Clock = SYSTEM_CLOCK, metrics: Metrics | None = None,
            rng: random.Random | None = None, leases: Any = None, owner: str = "w1") -> Context:
    """A worker's ``Context`` for a unit test: what it does not give is unused or fresh."""
    stores = MemoryStore().stores()
    return Context(owner, clock, metrics or Metrics(), leases or stores.leases,
                   sink or stores.sink, HealthState(60.0), rng or random.Random())


@dataclass
class PumpScript:
    """What every ScriptedPump of a test does: deliver ``batch`` frames every ``every``
    seconds; ``stop`` takes ``flush_s`` seconds to flush (``None``: never finishes)."""

    every: float = 1.0
    batch: int = 5
    flush_s: float | None = 0.1
    log: list[str] = field(default_factory=list)  # "stream:event", in order
    pumps: dict[str, ScriptedPump] = field(default_factory=dict)

    def factory(self) -> Callable[..., ScriptedPump]:
        def make(ctx: Context, holding: Holding, settings: Any, **hooks: Any) -> ScriptedPump:
            pump = ScriptedPump(self, holding.tenure, holding, ctx.sink, ctx.clock)
            self.pumps[holding.tenure.stream_id] = pump
            return pump
        return make


class ScriptedPump:
    """Writes batches through the real sink under the holder's ``may_write`` rule, like the
    pump does, and records what it was asked to do."""

    def __init__(self, script: PumpScript, tenure: Tenure, holding: Holding, sink: Any,
                 clock: Clock) -> None:
        self.script = script
        self.tenure = tenure
        self.holding = holding
        self.sink = sink
        self.clock = clock
        self.committed = tenure.last_seq or 0
        self.abandoned = False
        self._stopping = asyncio.Event()
        self._aborted = False

    def note(self, what: str) -> None:
        self.script.log.append(f"{self.tenure.stream_id}:{what}")

    async def run(self) -> None:
        self.note("run")
        while not self._stopping.is_set():
            try:
                async with asyncio.timeout(self.script.every):
                    await self._stopping.wait()
            except TimeoutError:
                await self._write()
        if self._aborted:
            self.note("aborted")
            return
        if self.script.flush_s is None:
            await asyncio.Event().wait()
        await self.clock.sleep(self.script.flush_s)
        await self._write()
        self.note("flushed")

    async def _write(self) -> None:
        if not self.holding.may_write(self.clock.monotonic()):
            raise SelfFenced("past the deadline")
        first = self.committed + 1
        frames = [Frame(s, f'{{"seq":{s}}}') for s in range(first, first + self.script.batch)]
        await self.sink.write_batch(self.tenure, self.committed, frames, self.clock.wall_ms())
        self.committed = frames[-1].seq

    async def stop(self) -> None:
        self.note("stop")
        self._stopping.set()

    async def abort(self) -> None:
        self.note("abort")
        self._aborted = True
        self._stopping.set()

    async def reconnect(self, reason: str) -> None:
        self.note(f"reconnect:{reason}")


class StaticMember(FleetKnowledge):
    """A membership that is always registered and alive, alone in its fleet unless a
    test gives it a view or a bulletin (for reconciler unit tests)."""

    epoch = 1
    accepting = True

    def __init__(self) -> None:
        self.view = FleetView()
        self.bulletin: Bulletin | None = None
        self.reading_all = True
        self.notices = 0
        self.offers_made: list[tuple[str, str]] = []
        self.offers_taken = False  # whether an offer reaches the peer's row
        self.offers_cleared: list[str] = []

    def may_write(self, now: float) -> bool:
        return True

    def counts_changed(self) -> None:
        self.notices += 1

    def handed_off(self) -> None:
        self.notices += 1

    async def offer_to(self, member: MemberRecord, offer: str) -> bool:
        self.offers_made.append((member.worker_id, offer))
        return self.offers_taken

    async def offers_done(self, offers: Sequence[str]) -> None:
        self.offers_cleared.extend(offers)
