"""The member's own row: registration, the heartbeat, the epoch and the incarnation,
draining and leaving.

The heartbeat moves the row's counter on every ``HEARTBEAT_SECONDS``, conditioned on this
incarnation's epoch (the keep-alive loop, ``streamlease.keeper``), and carries the leader's
bulletin when this worker leads (a ``Carrier``). No heartbeat proven for ``LEASE - safety
margin`` (monotonic, from when it was sent): every stream stops writing (self-fence) until
one is proven again. The epoch moved on: every stream stops at once, and the row says why
(``core.membership.fence_cause``). A peer declared us dead: the worker registers afresh
under a new epoch. Another live process registered under this worker id (a duplicate id):
the worker logs ``member.duplicate_id``, leaves the id to that process, stops the
membership and sets ``superseded`` (the worker then exits 2): re-registering would fence
the other process, which would re-register in turn, forever.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Protocol

from streamlease.clock import sleep_unless
from streamlease.core import bulletin as bulletins
from streamlease.core.backoff import Backoff
from streamlease.core.bulletin import Bulletin
from streamlease.core.keepalive import KeepOutcome, KeepState
from streamlease.core.membership import (
    FenceCause,
    Liveness,
    MemberRecord,
    MemberStatus,
    fence_cause,
    heartbeat_label,
)
from streamlease.errors import StoreError
from streamlease.keeper import Step, keep
from streamlease.logs import event
from streamlease.membership.shared import Parts
from streamlease.store.protocols import Heartbeat, HeartbeatResult
from streamlease.strain import Strain


class Carrier(Protocol):
    """Who gives the heartbeat a bulletin to carry (the leader's, ``bulletin.Publisher``)."""

    published: int  # the newest notice a written bulletin carried (logged)

    def due(self) -> Bulletin | None:
        """The bulletin the next heartbeat carries (None: none)."""
        ...

    def carried(self, beat: Heartbeat, bulletin: Bulletin, counter: int | None) -> None:
        """A heartbeat carrying ``bulletin`` was written; the row's counter is ``counter``."""
        ...


class OwnRow:
    """This incarnation's row and liveness. ``again`` registers a new incarnation (the
    whole membership's registration); ``halt`` stops the whole membership."""

    def __init__(self, parts: Parts, again: Callable[[], Awaitable[None]],
                 halt: Callable[[], None]) -> None:
        self.parts = parts
        self.again = again
        self.halt = halt
        self.carrier: Carrier | None = None
        self.epoch = 0
        # This process's nonce, written by each of its registrations: another process
        # with the same worker id writes another one.
        self.incarnation = secrets.token_hex(8)
        # The row as another process registered it under this worker id: set once, and
        # then this membership has stopped for good (the worker exits).
        self.superseded: MemberRecord | None = None
        self.status = MemberStatus.ACTIVE
        self.handoffs = 0
        self.shard = 0  # the key of this worker's row (``core.layout``), for life
        # Nothing is proven before registration: may_write is false until then.
        self.liveness = Liveness(parts.timings, deadline=float("-inf"))
        # Heartbeats slow or unanswered: the store is read less for two heartbeats.
        self.strain = Strain(parts.clock, parts.timings.slow_heartbeat_s,
                             2 * parts.timings.heartbeat_s)
        self.beat_now = asyncio.Event()
        # A heartbeat is due at once: it carries a new bulletin (even inside the gap).
        self._publish_now = asyncio.Event()
        self._last_beat = 0.0

    def may_write(self, now: float) -> bool:
        return self.liveness.may_write(now)

    @property
    def accepting(self) -> bool:
        """May this worker take streams now (alive, registered, not draining)?"""
        return self.status is MemberStatus.ACTIVE and \
            self.liveness.may_write(self.parts.clock.monotonic())

    async def register(self) -> None:
        """Write a new incarnation's row (the epoch moves on)."""
        p = self.parts
        sent = p.clock.monotonic()
        record = await p.fleet.register(p.me, p.settings.capacity, p.clock.wall_ms(),
                                        self.status, timeout=p.timings.lease_s,
                                        incarnation=self.incarnation)
        self.epoch = record.epoch
        self.shard = record.shard
        self.liveness = Liveness.registered(sent, p.timings)
        if self.status is MemberStatus.DRAINING:
            self.beat_now.set()  # fenced while draining: say so again at once
        event(logging.INFO, "member.registered", "joined the fleet", epoch=self.epoch)

    def drain(self) -> None:
        """Shutting down: tell peers at once (share 0; they poll for what we release)."""
        self.status = MemberStatus.DRAINING
        self.beat_now.set()

    def handed_off(self) -> None:
        """Streams were released for others to take: tell peers now, not next heartbeat."""
        self.handoffs += 1
        self.beat_now.set()

    def counts_changed(self) -> None:
        """This worker's stream count changed: report it soon (peers plan with it)."""
        self.beat_now.set()

    def publish_now(self) -> None:
        """A new bulletin: the heartbeat carrying it is due at once."""
        self._publish_now.set()
        self.beat_now.set()

    async def leave(self) -> None:
        """A clean exit (every stream released): remove this incarnation's row."""
        p = self.parts
        p.stop.set()
        try:
            await p.fleet.leave(p.me, self.epoch, timeout=p.timings.heartbeat_s,
                                shard=self.shard)
        except StoreError as exc:
            event(logging.WARNING, "member.leave_failed",
                  "could not remove the member row; peers will declare it dead",
                  error=str(exc))

    async def heartbeat_loop(self) -> None:
        """Keep this incarnation's row (``keep``) until the membership stops; when its
        epoch moves on, find out why and register afresh (or give the id up)."""
        p = self.parts
        delay: float | None = None  # the first heartbeat: an interval, jittered
        while not p.stop.is_set():
            try:
                ended = await keep(self.liveness.keeper, self._heartbeat, p.clock, p.rng,
                                   first_in=delay, wait=self._wait, stop=p.stop,
                                   on_step=self._on_step)
                if ended is KeepState.REFUSED:
                    await self._on_fenced()
                    delay = 0.0  # the new incarnation says so at once
            except Exception:
                # The heartbeat loop must outlive any surprise; the deadline still rules.
                p.metrics.task_crashed("membership")
                event(logging.ERROR, "member.heartbeat_crashed", "member heartbeat crashed",
                      exc_info=True)
                delay = p.timings.heartbeat_s / 4

    async def _heartbeat(self, timeout: float) -> HeartbeatResult:
        """One heartbeat: the row's counter moves on if the epoch is still ours."""
        p = self.parts
        sent = self._last_beat = p.clock.monotonic()
        carried = self.carrier.due() if self.carrier is not None else None
        beat = Heartbeat(p.me, self.epoch, self.status, p.hooks.held(), p.settings.capacity,
                         self.handoffs, p.clock.wall_ms(),
                         bulletin=bulletins.encode(carried) if carried is not None else None,
                         shard=self.shard)
        result = await p.fleet.heartbeat(beat, timeout=timeout)
        if self.carrier is not None and carried is not None and \
                result.outcome is KeepOutcome.RENEWED:
            self.carrier.carried(beat, carried, result.heartbeat)
        now = p.clock.monotonic()
        label = heartbeat_label(result.outcome)
        event(logging.DEBUG, "member.beat", "heartbeat answered", seconds=round(now - sent, 3),
              outcome=label, published=self.carrier.published if self.carrier else 0)
        p.metrics.member_heartbeat(now - sent, label)
        p.hooks.beat(result.outcome, now - sent)
        self.strain.record(result.outcome, now - sent)
        if result.outcome is KeepOutcome.RENEWED:
            p.hooks.offers(result.offers)
        return result

    def _on_step(self, step: Step[HeartbeatResult]) -> None:
        """A heartbeat or the deadline, as the liveness took it."""
        if step.answer is not None:
            outcome = step.answer.outcome
            if outcome is KeepOutcome.RENEWED:
                self.parts.hooks.proven(step.sent_at)
            elif outcome in (KeepOutcome.UNKNOWN, KeepOutcome.THROTTLED):
                event(logging.WARNING, "member.heartbeat_failed",
                      "member heartbeat failed; retrying", outcome=outcome.value,
                      error=step.answer.error, retry_in_s=round(step.delay, 3),
                      deadline_in_s=round(self.liveness.deadline - step.now, 3))
        if step.self_fenced:
            event(logging.ERROR, "member.self_fenced",
                  "no member heartbeat proven before the deadline: every stream stops "
                  "writing", epoch=self.epoch)
            self.parts.hooks.self_fenced()
        elif step.recovered:
            event(logging.WARNING, "member.recovered",
                  "heartbeats proven again under the same epoch; taking streams again",
                  epoch=self.epoch)

    async def _on_fenced(self) -> None:
        p = self.parts
        p.metrics.member_fenced()
        p.hooks.fenced()  # whatever the cause, every stream stops now
        retry = Backoff(0.1, p.timings.heartbeat_s, p.rng)
        row: MemberRecord | None = None
        while not p.stop.is_set():
            try:
                rows = await p.fleet.members(timeout=p.timings.heartbeat_s)
                row = next((m for m in rows if m.worker_id == p.me), None)
                break
            except StoreError as exc:
                event(logging.WARNING, "member.read_failed",
                      "cannot read this worker's own row after it was fenced; retrying",
                      error=str(exc))
                await self._wait(retry.next_delay())
        else:
            return
        cause = fence_cause(row, self.incarnation)
        if cause is FenceCause.DUPLICATE:
            assert row is not None
            self._on_duplicate(row)
            return
        event(logging.ERROR, "member.fenced",
              "this worker's epoch moved on: every stream stops; registering again",
              epoch=self.epoch, cause=cause.value,
              fenced_by=row.fenced_by if row is not None else None)
        retry = Backoff(0.1, p.timings.heartbeat_s, p.rng)
        while not p.stop.is_set():
            try:
                await self.again()
                return
            except StoreError as exc:
                event(logging.WARNING, "member.register_failed", "cannot register; retrying",
                      error=str(exc))
                await self._wait(retry.next_delay())

    def _on_duplicate(self, row: MemberRecord) -> None:
        """Another live process registered under this worker id while this one was alive
        and heartbeating. This one learnt it second-hand, so it is the one that stops:
        registering again would fence the other, which would register again, forever.
        Its streams stopped already; the other's registration releases them."""
        self.superseded = row
        self.parts.metrics.member_duplicate_id()
        event(logging.ERROR, "member.duplicate_id",
              "another live process registered with this worker id (STREAMLEASE_WORKER_ID "
              "must be unique per process): this one stops taking streams and exits",
              epoch=self.epoch, their_epoch=row.epoch, incarnation=self.incarnation,
              their_incarnation=row.incarnation)
        self.halt()

    async def _wait(self, seconds: float) -> None:
        """Until the next heartbeat is due, or one is asked for early (draining, a
        hand-off, a changed count, the leader's new bulletin) — but never sooner than a
        short gap after the last, so a burst of such requests costs one write; a new
        bulletin (the leader's notices) cuts the gap short."""
        p = self.parts
        await sleep_unless(seconds, self.beat_now)
        gap = self._last_beat + min(p.timings.observe_s, p.timings.heartbeat_s / 4) \
            - p.clock.monotonic()
        if not self._publish_now.is_set() and gap > 0 and not p.stop.is_set():
            # The leader's new bulletin is not held back by the gap: every other member
            # waits for its notices (a count that changed just before would otherwise
            # hold a notice back for up to a quarter heartbeat).
            await sleep_unless(gap, self._publish_now, p.stop)
        # The heartbeat about to be sent carries everything asked for so far: the newest
        # bulletin, counts and status are read when it is sent.
        self.beat_now.clear()
        self._publish_now.clear()
