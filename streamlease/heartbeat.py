"""One held stream's lease kept: renewals, reads of the item, index hints and notices.

Renew every renewal interval while holding or draining (sooner after a failure), read the
item every check interval in between (unless someone else watches it), read it at once
when an index hint or the leader's change feed suggests it changed, and self-fence at the
local deadline. Every answer goes to ``Holding`` (pure); this loop applies its decisions
(reconnect on a new URL) and wakes the supervisor whenever the state changes.

It runs on the stream's ``Keeper`` like ``streamlease.keeper.keep`` does, in a loop of its
own: reads of the item and hints interleave with the renewals, and a renewal's answer
also carries the item (STOPPED, a new URL), which only ``Holding`` can judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from streamlease.context import Context
from streamlease.core.lease import HolderState, RenewDecision, RenewOutcome, renew_label
from streamlease.core.model import StreamRecord
from streamlease.core.plan import item_problem
from streamlease.errors import StoreError
from streamlease.logs import event
from streamlease.tenancy import PumpLike, SupervisorSettings, Tenancy, Ties


class Heartbeat:
    def __init__(self, ctx: Context, settings: SupervisorSettings, tenancy: Tenancy,
                 ties: Ties, pump: PumpLike) -> None:
        self.ctx = ctx
        self.settings = settings
        self.tenancy = tenancy
        self.holding = tenancy.holding
        self.tenure = tenancy.tenure
        self.stream = tenancy.stream
        self.ties = ties
        self.pump = pump
        self._confirm = asyncio.Event()  # an index hint asks for a consistent read now
        self._notified = False  # the read asked for is the change feed's notice, not a hint

    def _problem(self, record: StreamRecord) -> str | None:
        return item_problem(record, self.settings.allowed_urls, self.settings.catalog)

    def seen(self, record: StreamRecord) -> None:
        """The stream as an index read showed it (the orphan or STOPPED index).

        Index reads lag the table and carry only the projected attributes, so a record
        from one is a hint, never a verdict: the index may still show the item as it was
        before this tenure began (the previous owner, expiry 0, STOPPED before a flip back).
        A record under an older fence is a view of an earlier tenure and is ignored. One
        that suggests the lease moved on, was released or the stream was STOPPED makes
        the heartbeat read the item consistently now, and only that read is acted on."""
        if record.fence is not None and record.fence < self.tenure.fence:
            self.ctx.metrics.index_hint("stale_fence")
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
                not record.started or record.ws_url != self.tenancy.record.ws_url or \
                self._problem(record) is not None:
            self.notified()  # stopped, moved on, a new URL, or no longer servable
        elif self.holding.state is HolderState.HOLDING:
            self.ctx.health.renewed(self.stream, self.ctx.clock.monotonic())

    def notified(self) -> None:
        """The leader's change feed says the item changed (STOPPED, a new ``ws_url``, a
        force release): read it consistently now and act on that read."""
        self._notified = True
        self._confirm.set()

    async def run(self) -> None:
        """The heartbeat loop; an unexpected failure in it ends the tenure through the
        graceful path (flush under the deadline it had, then release) instead of leaving
        a stream that is neither renewed nor released."""
        try:
            await self._loop()
        except Exception as exc:
            self.ctx.metrics.task_crashed("heartbeat")
            event(logging.ERROR, "stream.heartbeat_crashed", "heartbeat loop failed; "
                  "releasing the stream", stream=self.stream, fence=self.tenure.fence,
                  exc_info=True)
            self.tenancy.fail(f"heartbeat failed: {exc!r}")
            self.tenancy.wake.set()

    async def _loop(self) -> None:
        clock, rng, wake = self.ctx.clock, self.ctx.rng, self.tenancy.wake
        check_s = self.settings.check_s or self.settings.timings.heartbeat_s
        now = clock.monotonic()
        # Streams acquired together would otherwise renew and check in together forever;
        # every later renewal is spread afresh too (the holding's keeper).
        next_renew = now + self.holding.keeper.first_in(rng)
        next_check = now + rng.uniform(0.5, 1.0) * check_s
        while not self.holding.terminal:
            wait = min(next_renew, next_check, self.holding.deadline) - clock.monotonic()
            if wait > 0 and not self._confirm.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait):
                        await self._confirm.wait()
            now = clock.monotonic()
            if self.holding.check_deadline(now):
                wake.set()
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
                next_check = clock.monotonic() + check_s
            elif now >= next_renew:
                self._confirm.clear()  # the renewal reads the item too
                next_renew = await self._renew_once()
                next_check = max(next_check, clock.monotonic() + check_s)
            elif now >= next_check:
                if self.ties.watched():
                    # Watched instead: no read. While the change feed tells of every
                    # change, the loop being alive is the check-in; without it, the
                    # batched read's answer is (``compare``).
                    if self.ties.told() and state is HolderState.HOLDING:
                        self.ctx.health.renewed(self.stream, now)
                else:
                    await self._check_once()
                next_check = clock.monotonic() + check_s
            if self.holding.state is not state:
                wake.set()

    async def _check_once(self, hint: bool = False) -> None:
        """A consistent read of the item: no write, no deadline change. ``hint``: an
        index record suggested a change, and this read confirms or dismisses it."""
        try:
            record = await self.ctx.leases.check(self.stream,
                                                 timeout=self.settings.call_timeout_s)
        except StoreError as exc:
            event(logging.DEBUG, "stream.check_failed", "check-in read failed",
                  stream=self.stream, fence=self.tenure.fence, error=str(exc))
            return
        problem = self._problem(record) if record else None
        was_holding = self.holding.state is HolderState.HOLDING
        decision = self.holding.on_check(record, problem)
        if hint:
            confirmed = decision.state is not HolderState.HOLDING or not was_holding
            self.ctx.metrics.index_hint("confirmed" if confirmed else "dismissed")
        if record is not None:
            self.tenancy.record = record
        if decision.state in (HolderState.HOLDING, HolderState.DRAINING):
            self.ctx.health.renewed(self.stream, self.ctx.clock.monotonic())
        await self._apply(decision, problem, was_holding)

    async def _apply(self, decision: RenewDecision, problem: str | None,
                     was_holding: bool) -> None:
        if decision.reconnect and decision.state is HolderState.HOLDING:
            event(logging.INFO, "stream.url_changed", "ws_url changed; reconnecting",
                  stream=self.stream, fence=self.tenure.fence)
            await self.pump.reconnect("url_changed")
        if problem is not None and was_holding and decision.state is HolderState.DRAINING:
            self.tenancy.failure = problem

    async def _renew_once(self) -> float:
        """One renewal; the monotonic time the next one is due."""
        clock = self.ctx.clock
        sent = clock.monotonic()
        timeout = self.holding.call_timeout(sent, self.settings.call_timeout_s)
        result = await self.ctx.leases.renew(self.tenure, clock.wall_ms(),
                                             self.settings.timings, timeout)
        now = clock.monotonic()
        self.ctx.metrics.heartbeat(now - sent, renew_label(result.outcome))
        if self.ties.lease_health is not None:
            self.ties.lease_health.record(result.outcome, now - sent)
        problem = None
        if result.record is not None:
            problem = self._problem(result.record)
            self.tenancy.record = result.record
        was_holding = self.holding.state is HolderState.HOLDING
        decision = self.holding.on_renew(result.outcome, sent, now, result.record, problem)
        if result.outcome is RenewOutcome.RENEWED:
            self.ctx.health.renewed(self.stream, sent)
        if result.outcome in (RenewOutcome.UNKNOWN, RenewOutcome.THROTTLED):
            event(logging.WARNING, "lease.renew_failed", "renew outcome unknown; retrying",
                  stream=self.stream, fence=self.tenure.fence, outcome=result.outcome.value,
                  error=result.error, retry_in_s=decision.retry_in,
                  deadline_in_s=round(self.holding.deadline - now, 3))
        await self._apply(decision, problem, was_holding)
        # Once the holding stopped renewing, the loop ends before this is due.
        return now + (decision.next_in or 0.0)
