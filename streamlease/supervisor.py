"""One held stream: the holder state machine, the heartbeat loop and the pump.

The supervisor feeds renew results to ``Holding`` (pure) and applies its decisions:

* lost (condition failed) or past the local deadline -> abort the pump at once; no
  flush, no further write under this tenure;
* ``STOPPED``, shutdown, rebalancing, an item that can no longer be served -> stop
  reading, flush, then release. Heartbeats go on while the pump flushes, so a long final
  flush never outlives the lease; the release is retried with backoff until its budget
  runs out (the shutdown deadline, or the tenure's own deadline, after which the lease
  frees itself);
* a changed ``ws_url`` -> reconnect.

A supervisor never lets an exception escape: one stream's failure never takes down
another stream or the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from streamlease import tracing
from streamlease.clock import Clock
from streamlease.core.backoff import Backoff
from streamlease.core.lease import (
    HolderState,
    Holding,
    LeaseTimings,
    RenewDecision,
    RenewOutcome,
    StopReason,
    always,
    renew_label,
)
from streamlease.core.model import StreamRecord, Tenure, error_text
from streamlease.core.plan import bad_item_reason, item_problem
from streamlease.core.upstream import Catalog
from streamlease.core.urls import AllowList
from streamlease.errors import SelfFenced, SinkConflict, StaleFence, StoreError
from streamlease.health import HealthState
from streamlease.logs import event
from streamlease.metrics import Metrics
from streamlease.pump import Pump, PumpSettings
from streamlease.store.protocols import LeaseStore, Sink
from streamlease.upstream import BUILTIN_UPSTREAMS, Upstreams

T = TypeVar("T")

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

    @property
    def catalog(self) -> Catalog:
        return self.upstreams.catalog


class PumpLike(Protocol):
    @property
    def committed(self) -> int: ...

    async def run(self) -> None: ...

    async def stop(self) -> None: ...

    async def abort(self) -> None: ...

    async def reconnect(self, reason: str) -> None: ...


PumpFactory = Callable[..., PumpLike]


class LeaseHealth:
    """Recent renewal and member heartbeat outcomes of this worker, for admission control:
    a worker whose renewals or heartbeats fail or are slow takes no new streams until they
    recover (overload must not feed itself)."""

    def __init__(self, clock: Clock, slow_s: float, window_s: float) -> None:
        self.clock = clock
        self.slow_s = slow_s
        self.window_s = window_s
        self._bad_until = 0.0

    def record(self, outcome: RenewOutcome, seconds: float) -> None:
        self.record_call(outcome not in (RenewOutcome.UNKNOWN, RenewOutcome.THROTTLED),
                         seconds)

    def record_call(self, answered: bool, seconds: float) -> None:
        """A renewal or member heartbeat: unanswered (unknown, throttled) or slow closes
        admission for the window."""
        if not answered or seconds > self.slow_s:
            self._bad_until = self.clock.monotonic() + self.window_s

    def admits(self) -> bool:
        return self.clock.monotonic() >= self._bad_until


class Supervisor:
    def __init__(self, tenure: Tenure, record: StreamRecord, acquire_sent_at: float,
                 leases: LeaseStore, sink: Sink, clock: Clock, metrics: Metrics,
                 settings: SupervisorSettings, rng: random.Random | None = None,
                 on_delivered: Callable[[int], None] | None = None,
                 health: HealthState | None = None,
                 lease_health: LeaseHealth | None = None,
                 pump_factory: PumpFactory | None = None,
                 member_alive: Callable[[float], bool] = always,
                 watched: Callable[[], bool] = lambda: False,
                 told: Callable[[], bool] = lambda: False,
                 release_gate: asyncio.Semaphore | None = None) -> None:
        self.tenure = tenure
        # Shared by every supervisor of the worker (``Holdings``): releases in flight.
        self.release_gate = release_gate or asyncio.Semaphore(RELEASES_IN_FLIGHT)
        self.leases = leases
        self.clock = clock
        self.metrics = metrics
        self.settings = settings
        self.rng = rng or random.Random()
        self.holding = Holding(tenure, record.ws_url or "", acquire_sent_at, settings.timings,
                               member_alive, self.rng)
        self.sink = sink
        wire = settings.upstreams.wire(tenure.stream_id, record.attributes)
        self.pump: PumpLike = (pump_factory or Pump)(
            tenure, self.holding, sink, clock, metrics, settings.pump, self.rng, on_delivered,
            self._on_problem, wire=wire)
        self._tg: asyncio.TaskGroup | None = None  # the tenure's scope while it runs
        self._confirm = asyncio.Event()  # an index hint asks for a consistent read now
        self._notified = False  # the read asked for is the change feed's notice, not a hint
        # Someone else watches the item for this holder (the leader's change feed, or the
        # worker's batched read of every held item): its own periodic read rests.
        self._watched = watched
        self._told = told  # the leader's change feed tells of every change (health: alive)
        self._record = record
        self._wake = asyncio.Event()
        self._drain_reason: StopReason | None = None
        self._release_by: float | None = None  # monotonic deadline for the release
        self._pump_done = False
        self._failure: str | None = None
        self._health = health
        self._lease_health = lease_health
        self.acquired_at = acquire_sent_at
        if health is not None:
            health.renewed(tenure.stream_id, acquire_sent_at)

    @property
    def stream(self) -> str:
        return self.tenure.stream_id

    def _on_problem(self, text: str | None) -> None:
        """The pump reports a stalled stream (frames arrive, none deliverable): written to
        ``last_error`` once per change of problem. Progress (None) leaves the record as
        is: ``last_error_at_ms`` says when it was seen, the stall metric says it ended."""
        if text is None or self._record.last_error == error_text(text):
            return
        self._record = dataclasses.replace(self._record, last_error=error_text(text))
        if self._tg is not None:
            self._tg.create_task(self._report(text), name=f"report {self.stream}")

    async def _report(self, text: str) -> None:
        """Write a stall to ``last_error``, in the tenure's scope; never fails the tenure."""
        try:
            await self._record_error(text)
        except Exception:
            self.metrics.task_crashed("supervisor")
            event(logging.ERROR, "stream.report_failed", "could not record a stall",
                  stream=self.stream, fence=self.tenure.fence, exc_info=True)

    def member_lost(self, fenced: bool) -> None:
        """This worker was fenced (or its membership lapsed): stop at once, no flush."""
        self.holding.member_lost(fenced)
        self._wake.set()

    def seen(self, record: StreamRecord) -> None:
        """The stream as an index read showed it (the orphan or STOPPED index).

        Index reads lag the table and carry only the projected attributes, so a record
        from one is a hint, never a verdict: the index may still show the item as it was
        before this tenure began (the previous owner, expiry 0, STOPPED before a flip back).
        A record under an older fence is a view of an earlier tenure and is ignored. One
        that suggests the lease moved on, was released or the stream was STOPPED makes
        the heartbeat read the item consistently now, and only that read is acted on."""
        if record.fence is not None and record.fence < self.tenure.fence:
            self.metrics.index_hint("stale_fence")
            return
        if record.lease_owner != self.tenure.owner or record.fence != self.tenure.fence \
                or record.lease_expires_at_ms == 0 or record.stopped:
            self._confirm.set()

    def compare(self, record: StreamRecord | None) -> None:
        """The item as a batched, eventually consistent read showed it: a hint like an
        index record (it may be older than this tenure). If it suggests anything changed
        (gone, moved on, released, stopped, a new URL), read it consistently now."""
        if record is None or (record.fence is not None and record.fence > self.tenure.fence):
            self.notified()
            return
        if record.fence is not None and record.fence < self.tenure.fence:
            return  # a view of an earlier tenure
        if record.lease_owner != self.tenure.owner or record.lease_expires_at_ms == 0 or \
                not record.started or record.ws_url != self._record.ws_url or \
                item_problem(record, self.settings.allowed_urls,
                             self.settings.catalog) is not None:
            self.notified()  # stopped, moved on, a new URL, or no longer servable
        elif self._health is not None and self.holding.state is HolderState.HOLDING:
            self._health.renewed(self.stream, self.clock.monotonic())

    def notified(self) -> None:
        """The leader's change feed says the item changed (STOPPED, a new ``ws_url``, a
        force release): read it consistently now and act on that read."""
        self._notified = True
        self._confirm.set()

    def request_drain(self, reason: StopReason, release_by: float | None = None) -> None:
        """Flush and release (shutdown, STOPPED seen elsewhere, rebalancing); the release
        is retried until ``release_by`` (monotonic), or the tenure's deadline."""
        if self._drain_reason is None:
            self._drain_reason = reason
        if release_by is not None:
            # A shutdown during a hand-over (or after a self-fence) brings its budget.
            self._release_by = release_by if self._release_by is None \
                else min(self._release_by, release_by)
        self._wake.set()

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception:
            # The last line of defence: log, count, stop the output, and let the
            # self-audit or the expiry free the lease.
            self.metrics.task_crashed("supervisor")
            event(logging.ERROR, "supervisor.crashed", "stream supervisor failed; the lease "
                  "is released by the self-audit or expires", stream=self.stream,
                  fence=self.tenure.fence, exc_info=True)
            await self._close_output(StopReason.ERROR)

    async def _run(self) -> None:
        problem = item_problem(self._record, self.settings.allowed_urls, self.settings.catalog)
        if problem is not None:
            self.holding.begin_drain(StopReason.BAD_ITEM)
            await self._finish(problem)
            return
        # One scope for the tenure: the pump and the heartbeat each turn their own failure
        # into a state (neither raises), and both are gone before the release.
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            pump_task = tg.create_task(self._run_pump(), name=f"pump {self.stream}")
            heartbeat = tg.create_task(self._guarded_heartbeat(),
                                       name=f"heartbeat {self.stream}")
            try:
                await self._wait_until_stopping()
                await self._stop_pump(pump_task)
            finally:
                # Heartbeats ran through the drain; the flush is over (or abandoned) now.
                heartbeat.cancel()
                pump_task.cancel()
                self._tg = None
        await self._finish(self._failure)

    async def _wait_until_stopping(self) -> None:
        """Until a drain is asked for, the pump ends, or the heartbeat ends the tenure."""
        while True:
            self._wake.clear()
            if self._drain_reason is not None:
                self.holding.begin_drain(self._drain_reason)
            if self.holding.state is not HolderState.HOLDING:
                return
            if self._pump_done:
                self._fail("pump stopped unexpectedly")
                return
            await self._wake.wait()

    async def _run_pump(self) -> None:
        try:
            await self.pump.run()
        except StaleFence:
            self.metrics.stale_write_rejected()
            self.holding.on_stale_write()
            event(logging.WARNING, "sink.stale_fence", "sink refused a batch: fence is stale",
                  stream=self.stream, fence=self.tenure.fence)
        except SelfFenced:
            self.holding.check_deadline(self.clock.monotonic())
        except SinkConflict as exc:
            self._fail(f"sink conflict: {exc}")
        except StoreError as exc:
            self._fail(f"sink error: {exc}")
        except Exception as exc:
            self.metrics.task_crashed("pump")
            event(logging.ERROR, "pump.crashed", "pump failed", stream=self.stream,
                  fence=self.tenure.fence, error=repr(exc), exc_info=True)
            self._fail(f"pump failed: {exc!r}")
        finally:
            self._pump_done = True
            self._wake.set()

    def _fail(self, message: str) -> None:
        if self._failure is None:
            self._failure = message[:500]
        self.holding.begin_drain(StopReason.ERROR)

    async def _guarded_heartbeat(self) -> None:
        """The heartbeat loop; an unexpected failure in it ends the tenure through the
        graceful path (flush under the deadline it had, then release) instead of leaving
        a stream that is neither renewed nor released."""
        try:
            await self._heartbeat_loop()
        except Exception as exc:
            self.metrics.task_crashed("heartbeat")
            event(logging.ERROR, "stream.heartbeat_crashed", "heartbeat loop failed; "
                  "releasing the stream", stream=self.stream, fence=self.tenure.fence,
                  exc_info=True)
            self._fail(f"heartbeat failed: {exc!r}")
            self._wake.set()

    async def _heartbeat_loop(self) -> None:
        """Renew every renewal interval while holding or draining (retry sooner after a
        failure), read the item every check interval in between, and self-fence at the
        local deadline. Wakes the main task whenever the state changes."""
        check_s = self.settings.check_s or self.settings.timings.heartbeat_s
        now = self.clock.monotonic()
        # Streams acquired together would otherwise renew and check in together forever;
        # every later renewal is spread afresh too (the holding's keeper).
        next_renew = now + self.holding.keeper.first_in(self.rng)
        next_check = now + self.rng.uniform(0.5, 1.0) * check_s
        while not self.holding.terminal:
            wait = min(next_renew, next_check, self.holding.deadline) - self.clock.monotonic()
            if wait > 0 and not self._confirm.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._confirm.wait()
            now = self.clock.monotonic()
            if self.holding.check_deadline(now):
                self._wake.set()
                return
            state = self.holding.state
            if self._confirm.is_set() and now < next_renew:
                # An index hint or a notice: read the item now; only that read decides.
                self._confirm.clear()
                hint, self._notified = not self._notified, False
                await self._check_once(hint=hint)
                event(logging.DEBUG, "stream.checked_now",
                      "item read at once (a notice or an index hint)", stream=self.stream,
                      hint=hint)
                next_check = self.clock.monotonic() + check_s
            elif now >= next_renew:
                self._confirm.clear()  # the renewal reads the item too
                next_renew = await self._renew_once()
                next_check = max(next_check, self.clock.monotonic() + check_s)
            elif now >= next_check:
                if self._watched():
                    # Watched instead: no read. While the change feed tells of every
                    # change, the loop being alive is the check-in; without it, the
                    # batched read's answer is (``compare``).
                    if self._told() and self._health is not None and \
                            state is HolderState.HOLDING:
                        self._health.renewed(self.stream, now)
                else:
                    await self._check_once()
                next_check = self.clock.monotonic() + check_s
            if self.holding.state is not state:
                self._wake.set()

    async def _check_once(self, hint: bool = False) -> None:
        """A consistent read of the item: no write, no deadline change. ``hint``: an
        index record suggested a change, and this read confirms or dismisses it."""
        try:
            record = await self.leases.check(self.stream, timeout=self.settings.call_timeout_s)
        except StoreError as exc:
            event(logging.DEBUG, "stream.check_failed", "check-in read failed",
                  stream=self.stream, fence=self.tenure.fence, error=str(exc))
            return
        problem = item_problem(record, self.settings.allowed_urls, self.settings.catalog) \
            if record else None
        was_holding = self.holding.state is HolderState.HOLDING
        decision = self.holding.on_check(record, problem)
        if hint:
            confirmed = decision.state is not HolderState.HOLDING or not was_holding
            self.metrics.index_hint("confirmed" if confirmed else "dismissed")
        if record is not None:
            self._record = record
        if decision.state in (HolderState.HOLDING, HolderState.DRAINING) and \
                self._health is not None:
            self._health.renewed(self.stream, self.clock.monotonic())
        await self._apply(decision, problem, was_holding)

    async def _apply(self, decision: RenewDecision, problem: str | None,
                     was_holding: bool) -> None:
        if decision.reconnect and decision.state is HolderState.HOLDING:
            event(logging.INFO, "stream.url_changed", "ws_url changed; reconnecting",
                  stream=self.stream, fence=self.tenure.fence)
            await self.pump.reconnect("url_changed")
        if problem is not None and was_holding and decision.state is HolderState.DRAINING:
            self._failure = problem

    async def _renew_once(self) -> float:
        """One renewal; the monotonic time the next one is due."""
        sent = self.clock.monotonic()
        timeout = self.holding.call_timeout(sent, self.settings.call_timeout_s)
        result = await self.leases.renew(self.tenure, self.clock.wall_ms(),
                                         self.settings.timings, timeout)
        now = self.clock.monotonic()
        self.metrics.heartbeat(now - sent, renew_label(result.outcome))
        if self._lease_health is not None:
            self._lease_health.record(result.outcome, now - sent)
        problem = None
        if result.record is not None:
            problem = item_problem(result.record, self.settings.allowed_urls,
                                   self.settings.catalog)
            self._record = result.record
        was_holding = self.holding.state is HolderState.HOLDING
        decision = self.holding.on_renew(result.outcome, sent, now, result.record, problem)
        if result.outcome is RenewOutcome.RENEWED and self._health is not None:
            self._health.renewed(self.stream, sent)
        if result.outcome in (RenewOutcome.UNKNOWN, RenewOutcome.THROTTLED):
            event(logging.WARNING, "lease.renew_failed", "renew outcome unknown; retrying",
                  stream=self.stream, fence=self.tenure.fence, outcome=result.outcome.value,
                  error=result.error, retry_in_s=decision.retry_in,
                  deadline_in_s=round(self.holding.deadline - now, 3))
        await self._apply(decision, problem, was_holding)
        # Once the holding stopped renewing, the loop ends before this is due.
        return now + (decision.next_in or 0.0)

    async def _stop_pump(self, task: asyncio.Task[None]) -> None:
        if task.done():
            return
        if self.holding.state is HolderState.DRAINING:
            await self.pump.stop()  # stop reading, flush, then return
            budget = self.settings.drain_timeout_s
        else:
            await self.pump.abort()  # lost or self-fenced: no new write, no flush
            budget = self.settings.pump.call_timeout_s
        done, _ = await asyncio.wait({task}, timeout=budget)
        if not done:
            event(logging.ERROR, "stream.stop_timeout", "pump did not stop in time",
                  stream=self.stream, fence=self.tenure.fence, state=self.holding.state)
            self._fail("pump did not stop in time")

    async def _finish(self, problem: str | None) -> None:
        holding = self.holding
        reason = holding.reason
        fields: dict[str, Any] = {"stream": self.stream, "fence": self.tenure.fence,
                                  "last_seq": self.pump.committed}
        self.metrics.lease_ended(self.clock.monotonic() - self.acquired_at)
        await self._close_output(reason)
        if holding.state in (HolderState.LOST, HolderState.SELF_FENCED):
            assert reason is not None
            self.metrics.lease_lost(reason)
            event(logging.WARNING, "lease.lost", "lease lost; stream stopped",
                  reason=reason.value, **fields)
            if holding.state is HolderState.SELF_FENCED:
                # Nothing more is written under this tenure; if the lease is still ours,
                # free it now rather than make the fleet wait for the expiry.
                await self._release(reason, fields, log=False)
            return
        assert reason is not None
        if problem is not None:
            if reason is StopReason.BAD_ITEM:
                self.metrics.bad_item(bad_item_reason(problem))
            await self._record_error(problem)
        await self._release(reason, fields, log=True)

    async def _close_output(self, reason: StopReason | None) -> None:
        """The tenure's processor ``stop``: after the last flush, before the release (a
        lost tenure's processor hears ``lost`` and must not write). Bounded, never raises."""
        public = processor_reason(reason, self.holding.state)
        budget = self.settings.drain_timeout_s
        if self._release_by is not None:
            # A shutdown: leave the release its call within the budget.
            budget = min(budget, max(0.1, self._release_by - self.clock.monotonic()
                                     - self.settings.call_timeout_s))
        try:
            async with asyncio.timeout(budget):
                await self.sink.close(self.tenure, public)
        except Exception:
            self.metrics.task_crashed("pump")
            event(logging.ERROR, "processor.stop_failed", "closing the stream's output failed",
                  stream=self.stream, fence=self.tenure.fence, reason=public, exc_info=True)

    async def _release(self, reason: StopReason, fields: dict[str, Any], log: bool) -> None:
        """Release, retried with backoff until the budget: the shutdown deadline if one was
        given, else the tenure's own deadline (after it the lease frees itself). Each
        attempt waits its turn at the worker's release gate: a drain of hundreds of streams
        would otherwise put every release in the store's queue at once, ahead of the
        member heartbeat (which then times out, and the worker self-fences mid-drain)."""
        retry = Backoff(0.05, 1.0, self.rng)
        attempt = 0
        while True:
            attempt += 1
            async with self.release_gate:
                # Read each attempt, once its turn came: a shutdown that starts meanwhile
                # brings its own budget, and the wait for the gate spent some of it.
                by = self._release_by if self._release_by is not None \
                    else self.holding.deadline
                remaining = by - self.clock.monotonic()
                timeout = max(0.05, min(self.settings.call_timeout_s, remaining))
                try:
                    # A trace of its own (linked to the acquisition's); its context goes on
                    # the item in the same write, for the next holder's acquisition to link
                    # to.
                    with tracing.span("release", root=True, stream=self.stream,
                                      fence=self.tenure.fence, reason=reason.value,
                                      attempt=attempt) as span:
                        released = await shielded(
                            self.leases.release(self.tenure, timeout,
                                                trace_parent=tracing.traceparent_of(span)),
                            timeout, f"release {self.stream}")
                        tracing.set_attributes(span, released=released)
                    break
                except (TimeoutError, StoreError) as exc:
                    failure = str(exc) or "timeout"
            # Backing off outside the gate: a failed release does not hold up the others.
            delay = retry.next_delay()
            if self.clock.monotonic() + delay >= by:
                event(logging.WARNING, "lease.release_failed",
                      "release failed; the lease will expire", error=failure,
                      attempts=attempt, **fields)
                return
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()  # a shutdown's budget cuts the wait short
        self.holding.on_released()
        if released and log:
            self.metrics.lease_released(reason)
            event(logging.INFO, "lease.released", "lease released", reason=reason.value,
                  attempts=attempt, **fields)
        elif log:
            self.metrics.lease_lost(StopReason.CONDITION_FAILED)
            event(logging.WARNING, "lease.lost", "lease had moved on before release",
                  reason=StopReason.CONDITION_FAILED.value, **fields)

    async def _record_error(self, problem: str) -> None:
        if self._record.last_error == error_text(problem):
            return
        with contextlib.suppress(StoreError, TimeoutError):
            await shielded(self.leases.record_error(self.stream, problem, self.clock.wall_ms()),
                           self.settings.call_timeout_s, f"record_error {self.stream}")
        event(logging.WARNING, "stream.unservable", "stream cannot be served", problem=problem,
              stream=self.stream, fence=self.tenure.fence)


def processor_reason(reason: StopReason | None, state: HolderState) -> str:
    """Why a tenure ended, as a processor's ``stop`` hears it (``STOP_REASONS``)."""
    if state in (HolderState.LOST, HolderState.SELF_FENCED):
        return "lost"
    return {StopReason.STOPPED: "stopped", StopReason.SHUTDOWN: "shutdown",
            StopReason.REBALANCE: "drain"}.get(reason, "error") if reason else "error"


async def shielded(call: Awaitable[T], timeout: float, name: str) -> T:
    """Await ``call`` for at most ``timeout`` seconds, shielded from our own cancellation
    (a release in flight should land even if the shutdown budget cancels us). If we stop
    waiting, the call goes on, and its outcome is still retrieved and logged."""
    task = asyncio.ensure_future(call)
    try:
        async with asyncio.timeout(timeout):
            return await asyncio.shield(task)
    except BaseException:
        if not task.done():
            task.add_done_callback(lambda t: _log_orphaned(t, name))
        raise


def _log_orphaned(task: asyncio.Future[Any], name: str) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        event(logging.WARNING, "store.call_failed_late", "a call given up on failed later",
              call=name, error=str(exc) or type(exc).__name__)
