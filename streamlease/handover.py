"""Make before break (``streamlease.core.handover``), as the two workers run it.

``Handing`` is the holder's side, one per supervisor whose drain names a taker: the offer
into the taker's member row, then the wait (delivering all along) until the lease has
moved, or until the offer is given up and the supervisor drains and releases as before.

``Taking`` is the taker's side: the offers its heartbeat read back, each acted on once:
read the item, dial ahead (``streamlease.ahead``), take the lease in one conditional
write, and serve it from the connection already open.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from streamlease import tracing
from streamlease.ahead import Ahead, AheadFailed, dial_ahead
from streamlease.context import Context
from streamlease.core.handover import (
    OFFER_CHECK_S,
    OFFER_TAKERS,
    Offer,
    declined_text,
    parse_offer,
)
from streamlease.core.lease import LeaseTimings
from streamlease.core.membership import MemberRecord
from streamlease.core.model import Tenure
from streamlease.core.plan import item_problem
from streamlease.errors import StoreError
from streamlease.logs import event
from streamlease.store import codec
from streamlease.store.protocols import Acquired, HandOver
from streamlease.tenancy import SupervisorSettings

OfferTo = Callable[[MemberRecord, str], Awaitable[bool]]
# Another peer to offer a stream to, none of the workers named, for a rebalance or not
# (None: nobody has room).
NextTaker = Callable[[str, frozenset[str], bool], MemberRecord | None]

# What came of one offer, as the holder saw it.
_TAKEN, _MOVED, _REFUSED, _DECLINED, _GIVEN_UP = "taken", "moved", "refused", "declined", \
    "given_up"


class Handed(NamedTuple):
    """What came of a hand-over, as its holder saw it."""

    taker: str | None  # the worker that took the lease; None: nobody took it
    all_said_no: bool  # not taken because every peer asked said no (declined, or its row refused)


class Handing:
    """The holder's side of one hand-over (``hand``)."""

    def __init__(self, ctx: Context, settings: SupervisorSettings, offer: OfferTo,
                 next_taker: NextTaker | None = None) -> None:
        self.ctx = ctx
        self.settings = settings
        self._offer = offer  # into the taker's member row; False if it was not written
        self._next_taker = next_taker

    async def hand(self, tenure: Tenure, taker: MemberRecord, rebalance: Callable[[], bool],
                   wake: asyncio.Event, until: Callable[[], float],
                   ended: Callable[[], bool]) -> Handed:
        """Offer ``tenure``'s stream to ``taker`` and wait, at most until ``until()``
        (monotonic; asked again whenever ``wake`` is set: a shutdown brings its budget)
        or the settings' ``handover_wait_s``, for the lease to move: the item
        is read every ``OFFER_CHECK_S``, and at once when ``wake`` is set (the tenure
        heard something: a write refused, a renewal lost). A taker whose row refuses the
        offer (no longer that ACTIVE member) or who declines it is followed by the next
        peer with room (for a ``rebalance``: below its share), up to ``OFFER_TAKERS`` in
        all, each with a wait of its own within ``until()``. ``rebalance`` is asked at each
        offer: a shutdown that comes while a rebalance's offer is out makes the next
        offer a shutdown's. The worker that took the lease, if one did; and whether the
        offers ended because every peer asked said no (not when one was not taken in
        time, nor made, nor when the tenure ``ended`` otherwise)."""
        tried = {taker.worker_id}
        while True:
            outcome = await self._offer_once(tenure, taker, rebalance(), wake, until, ended)
            if outcome == _TAKEN:
                return Handed(taker.worker_id, all_said_no=False)
            said_no = outcome in (_REFUSED, _DECLINED) and not ended()
            if not said_no or len(tried) >= OFFER_TAKERS or self._next_taker is None:
                return Handed(None, all_said_no=said_no)
            following = self._next_taker(tenure.stream_id, frozenset(tried), rebalance())
            if following is None:
                return Handed(None, all_said_no=True)
            tried.add(following.worker_id)
            event(logging.INFO, "handover.next_taker",
                  "offering the stream to another peer", stream=tenure.stream_id,
                  fence=tenure.fence, taker=following.worker_id, after=taker.worker_id,
                  why=outcome)
            taker = following

    async def _offer_once(self, tenure: Tenure, taker: MemberRecord, rebalance: bool,
                          wake: asyncio.Event, until: Callable[[], float],
                          ended: Callable[[], bool]) -> str:
        clock, stream = self.ctx.clock, tenure.stream_id
        waited = clock.monotonic() + (self.settings.handover_wait_s or 0.0)
        if min(waited, until()) <= clock.monotonic():
            return _GIVEN_UP
        try:
            if not await self._offer(taker, Offer(stream, tenure.fence, rebalance).text):
                event(logging.INFO, "handover.refused",
                      "the peer is no longer the member it was; not offered to it",
                      stream=stream, fence=tenure.fence, taker=taker.worker_id)
                self.ctx.metrics.handover("refused")
                return _REFUSED
        except StoreError as exc:
            event(logging.INFO, "handover.offer_failed",
                  "could not offer the stream to a peer; releasing it instead",
                  stream=stream, fence=tenure.fence, taker=taker.worker_id, error=str(exc))
            self.ctx.metrics.handover("error")
            return _GIVEN_UP
        event(logging.INFO, "handover.offered", "offered the stream to a peer",
              stream=stream, fence=tenure.fence, taker=taker.worker_id)
        while (left := min(waited, until()) - clock.monotonic()) > 0:
            wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(OFFER_CHECK_S, left)):
                    await wake.wait()
            try:
                record = await self.ctx.leases.check(stream,
                                                     timeout=self.settings.call_timeout_s)
            except StoreError:
                if ended():
                    return _GIVEN_UP  # unconfirmed, but nothing is left to deliver
                continue
            if record is None or record.lease_owner != tenure.owner or \
                    record.fence != tenure.fence:
                # Taken by the taker; or moved on some other way (a force release): then
                # the tenure is lost, as the drain's refused writes will say.
                taken = record is not None and record.lease_owner == taker.worker_id
                return _TAKEN if taken else _MOVED
            if codec.handover_declined(record) == declined_text(tenure.fence, taker.worker_id):
                event(logging.INFO, "handover.declined", "the peer cannot take the stream",
                      stream=stream, fence=tenure.fence, taker=taker.worker_id)
                self.ctx.metrics.handover("declined")
                return _DECLINED
            if ended():
                return _GIVEN_UP
        event(logging.INFO, "handover.not_taken",
              "the peer did not take the stream in time; releasing it instead",
              stream=stream, fence=tenure.fence, taker=taker.worker_id)
        self.ctx.metrics.handover("not_taken")
        return _GIVEN_UP


@dataclass(frozen=True)
class TakingSettings:
    supervisor: SupervisorSettings
    timings: LeaseTimings  # the stream lease the take stamps
    call_s: float


class TakerGate:
    """What ``Taking`` asks of the rest of the worker."""

    def __init__(self, may_take: Callable[[str, bool], bool], epoch: Callable[[], int],
                 start: Callable[[Acquired, float, str, Ahead], Awaitable[bool]],
                 done: Callable[[Sequence[str]], Awaitable[None]],
                 busy: set[str], unsure: set[str]) -> None:
        # room (to its share, for a rebalance), accepting, admitting, not held, not stopping
        self.may_take = may_take
        self.epoch = epoch  # this worker's member epoch
        self.start = start  # serve a lease taken, from the connection opened ahead
        self.done = done  # take acted-on offers off this worker's row
        self.busy = busy  # streams being acquired or taken now (shared with the others)
        self.unsure = unsure  # streams whose take's outcome is unknown (read back later)


class Taking:
    """The taker's side: each offer in this worker's row, acted on once."""

    def __init__(self, ctx: Context, settings: TakingSettings, gate: TakerGate,
                 scope: Callable[[], asyncio.TaskGroup | None]) -> None:
        self.ctx = ctx
        self.settings = settings
        self.gate = gate
        self.scope = scope  # where the takes run (the holdings' scope; None: not serving)
        self._seen: frozenset[str] = frozenset()

    def offered(self, offers: frozenset[str]) -> None:
        """The offers as this worker's row holds them after a heartbeat."""
        tg = self.scope()
        if tg is None:
            return  # not serving yet (or any more): acted on once it is, if still there
        fresh = offers - self._seen
        self._seen = offers
        if not fresh:
            return
        for text in sorted(fresh):
            tg.create_task(self._act(text), name=f"take handed {text}")

    async def _act(self, text: str) -> None:
        outcome = "error"
        try:
            offer = parse_offer(text)
            outcome = "unreadable" if offer is None else await self._take(offer)
        except Exception:
            self.ctx.metrics.task_crashed("handover")
            event(logging.ERROR, "handover.crashed", "taking a handed stream crashed; its "
                  "holder releases it", offer=text, exc_info=True)
        finally:
            self.ctx.metrics.handover(outcome)
            with contextlib.suppress(StoreError):
                await self.gate.done([text])

    async def _take(self, offer: Offer) -> str:
        """Read, dial ahead, take, serve; what came of it (the metric's outcome)."""
        gate, leases, clock = self.gate, self.ctx.leases, self.ctx.clock
        stream_id, fence = offer.stream_id, offer.fence
        if stream_id in gate.busy:
            return "no_room"
        gate.busy.add(stream_id)
        ahead: Ahead | None = None
        try:
            record = await leases.check(stream_id, timeout=self.settings.call_s)
            if record is None or record.fence != fence or not record.lease_owner or \
                    not record.lease_expires_at_ms:
                return "moved_on"
            holder = record.lease_owner
            if not gate.may_take(stream_id, offer.rebalance):
                return await self._decline(offer, holder, "no_room")
            supervisor = self.settings.supervisor
            if item_problem(record, supervisor.allowed_urls, supervisor.catalog) is not None:
                return await self._decline(offer, holder, "unservable")
            with tracing.span("acquire", stream=stream_id, how=tracing.HOW_HANDED,
                              previous_owner=record.lease_owner, acquired=False) as span:
                try:
                    with tracing.span("dial", stream=stream_id, ahead=True):
                        ahead = await dial_ahead(supervisor, record)
                except AheadFailed as exc:
                    event(logging.INFO, "handover.dial_failed",
                          "could not dial a handed stream ahead; its holder releases it",
                          stream=stream_id, error=str(exc))
                    return await self._decline(offer, holder, "dial_failed")
                if not gate.may_take(stream_id, offer.rebalance):
                    return await self._decline(offer, holder, "no_room")
                sent, sent_ms = clock.monotonic(), clock.wall_ms()
                try:
                    # The moment the lease moves: the hand-off proper starts here.
                    with tracing.span("take", stream=stream_id, fence=fence, holder=holder):
                        got = await leases.take_handed(HandOver(
                            stream_id, holder, fence, self.ctx.owner, sent_ms,
                            self.settings.timings, epoch=gate.epoch()),
                            timeout=2 * self.settings.call_s)
                except BaseException:
                    gate.unsure.add(stream_id)  # it may have applied: read back next cycle
                    raise
                if got is None:
                    return "moved_on"
                tracing.set_attributes(span, acquired=True, fence=got.tenure.fence)
                event(logging.INFO, "handover.taken", "took a stream its holder handed over",
                      stream=stream_id, fence=got.tenure.fence, holder=holder,
                      last_seq=got.tenure.last_seq, sent_ms=sent_ms)
                served = await gate.start(got, sent, holder, ahead)
                ahead = None  # the supervisor's now (or closed by the start)
                return "taken" if served else "handed_back"
        except StoreError as exc:
            event(logging.WARNING, "handover.take_failed",
                  "taking a handed stream failed; its holder releases it",
                  stream=stream_id, error=str(exc))
            return "error"
        finally:
            gate.busy.discard(stream_id)
            if ahead is not None:
                await ahead.close()

    async def _decline(self, offer: Offer, holder: str, outcome: str) -> str:
        """Tell the holder, on the item, that this worker will not take the stream: it
        releases it now rather than wait out the offer. ``outcome``, for the metric."""
        with contextlib.suppress(StoreError):
            await self.ctx.leases.decline(offer.stream_id, holder, offer.fence,
                                          self.ctx.owner, timeout=self.settings.call_s)
        return outcome
