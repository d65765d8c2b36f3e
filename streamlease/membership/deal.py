"""A dead member's deal: fence it, let the survivors take its streams straight over, and
release on its behalf what is left after the deal window.

A member that another's observation proves dead (``streamlease.core.membership``) is
fenced with one conditional write, conditioned on the epoch and counter seen: exactly one
peer wins. The leader fences at once; without a leader's bulletin, the first live member
by id does, and the others a quarter lease later. Its streams are then dealt across the
survivors, each taking its part straight over (``streamlease.takeover``, from the DEAD row
or the bulletin's deal, ``streamlease.core.deal``); what is left after the deal window the
fencer releases on its behalf (found through the owner index, each confirmed by a
consistent read) and it is acquired as an orphan. A DEAD row whose release never finished
(its fencer died too) is finished by anyone a lease later; a released one is deleted by
the leader after ``FORGET_AFTER_LEASES``. A new incarnation of this worker releases the
same way what its earlier incarnations left behind.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from streamlease.clock import sleep_unless
from streamlease.core.deal import deal_window_s
from streamlease.core.membership import MemberRecord, MemberStatus, releasable_for
from streamlease.errors import StoreError
from streamlease.logs import event
from streamlease.membership.bulletin import Publisher
from streamlease.membership.row import OwnRow
from streamlease.membership.shared import FleetView, Parts
from streamlease.store.protocols import LeaseStore

RELEASE_CONCURRENCY = 16  # on-behalf releases in flight at once
# The owner index is eventually consistent (well under a second on DynamoDB): a dead
# member's streams are looked up again this long after the first pass.
SECOND_PASS_S = 2.0
FORGET_AFTER_LEASES = 30  # a dead, released row observed this many leases is deleted


@dataclass
class _Takeover:
    seen: MemberRecord
    since: float  # monotonic: when this worker first found it dead


class Dealer:
    """Fences dead members and releases their streams, in the membership's task scope
    (``tg``, set while it runs). ``read_all`` reads every member row at once (to deal
    from them when the leader itself was fenced)."""

    def __init__(self, parts: Parts, row: OwnRow, publisher: Publisher, leases: LeaseStore,
                 read_all: Callable[[], Awaitable[None]]) -> None:
        self.parts = parts
        self.row = row
        self.publisher = publisher
        self.leases = leases
        self.read_all = read_all
        self.tg: asyncio.TaskGroup | None = None
        self._pending: dict[str, _Takeover] = {}
        self._working: set[str] = set()  # members this worker is fencing or releasing
        self._unreleased_since: dict[tuple[str, int], float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()  # takeovers in flight

    def deal_window_s(self, streams: int = 0) -> float:
        """How long survivors have to take a fenced member's ``streams`` straight over
        before its fencer releases what is left (``core.deal.deal_window_s``)."""
        timings = self.parts.timings
        return deal_window_s(timings.observe_s, min(SECOND_PASS_S, timings.lease_s), streams)

    # -- what an observation found ------------------------------------------------------

    def found(self, dead: list[MemberRecord], members: list[MemberRecord],
              now: float) -> None:
        """Every row was read (``members``), and ``dead`` proven dead: fence each when it
        is this worker's turn; finish what other fencers left undone."""
        for member in dead:
            self._pending.setdefault(member.worker_id, _Takeover(member, now))
            self._pending[member.worker_id].seen = member
        for gone in set(self._pending) - {m.worker_id for m in dead}:
            del self._pending[gone]
        for takeover in list(self._pending.values()):
            if self._my_turn(takeover, now):
                self.spawn(self.take_over(takeover.seen))
        self._finish_abandoned(members, now)

    def forget_pending(self) -> None:
        """Only the leader's row was read: no other death is being waited on."""
        self._pending.clear()

    def forget_duplicates(self, rows: Iterable[MemberRecord]) -> None:
        """Second, older rows of worker ids (``layout.one_row_each``): never used."""
        for row in rows:
            self.spawn(self._forget(row, duplicate=True))

    def _my_turn(self, takeover: _Takeover, now: float) -> bool:
        """The leader, or else the first live member by id, fences at once; the others
        give it a quarter lease, so one conditional write usually decides (any of them
        may still win)."""
        p = self.parts
        if p.hooks.leading():
            return True
        live = sorted(m.worker_id for m in p.known.view.live())
        first = live[0] if live else p.me
        return first == p.me or now - takeover.since >= p.timings.lease_s / 4

    # -- the membership's task scope ----------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """A takeover (fence a dead member, release its streams) in the membership's own
        scope: cancelled on stop, its failure logged and counted, never lost."""
        if self.tg is None:
            coro.close()
            return
        task = self.tg.create_task(self._guarded(coro))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def _guarded(self, coro: Coroutine[Any, Any, Any]) -> None:
        try:
            await coro
        except Exception:
            self.parts.metrics.task_crashed("membership")
            event(logging.ERROR, "member.takeover_crashed", "a takeover task failed",
                  exc_info=True)

    # -- fencing, dealing, releasing ----------------------------------------------------

    async def take_over(self, seen: MemberRecord) -> None:
        """Fence a member found dead, show its deal, release what is left after it."""
        await self._alone(seen, self._take_over(seen), "fencing a dead member failed")

    async def _finish(self, member: MemberRecord) -> None:
        await self._alone(member, self._release_dead(member), "finishing a release failed")

    async def _alone(self, member: MemberRecord, work: Coroutine[Any, Any, None],
                     failed: str) -> None:
        """``work`` on ``member``, unless this worker already fences or releases it."""
        key = member.worker_id
        if key in self._working:
            work.close()
            return
        self._working.add(key)
        try:
            await work
        except StoreError as exc:
            event(logging.WARNING, "member.takeover_failed", failed, member=key,
                  error=str(exc))
        finally:
            self._working.discard(key)

    async def _take_over(self, seen: MemberRecord) -> None:
        p, known = self.parts, self.parts.known
        fenced = await p.fleet.fence(seen, p.me, p.clock.wall_ms(),
                                     timeout=p.timings.heartbeat_s)
        if fenced is None:
            return  # it heartbeated meanwhile, or another peer fenced it
        p.metrics.member_declared_dead()
        event(logging.WARNING, "member.dead",
              "a member stopped heartbeating; fenced it and releasing its streams",
              member=seen.worker_id, epoch=seen.epoch, heartbeat=seen.heartbeat,
              new_epoch=fenced.epoch)
        # Survivors deal its streams among themselves from the DEAD row (the reconciler's
        # take-over): show it to this worker's own at once.
        known.view = FleetView(tuple(fenced if m.worker_id == fenced.worker_id else m
                                     for m in known.view.members), known.view.observed_dead)
        if p.hooks.leading() and known.reading_all:
            self.publisher.dealt()  # the deal, in the next heartbeat
        elif not known.reading_all:
            # The leader itself was fenced: its bulletin is gone with it. Deal from every
            # row until a new leader publishes one.
            known.bulletin = None
            await self.read_all()
        p.hooks.fleet_changed()
        # A draining fencer releases at once: it may be gone before the window ends.
        after = 0.0 if self.row.status is MemberStatus.DRAINING else \
            self.deal_window_s(seen.streams)
        await self._release_dead(fenced, after=after)

    async def _release_dead(self, fenced: MemberRecord, after: float = 0.0) -> None:
        """Release every stream of a fenced member still leased to it ``after`` seconds
        from now (the survivors take their parts meanwhile); mark its row released only if
        none failed (else a later pass by any member finishes the job)."""
        p = self.parts
        if not await self._after(after):
            return
        released, failed = await self._release_all(fenced.worker_id, fenced.epoch)
        p.hooks.fleet_changed()
        # The owner index is eventually consistent: a stream the member acquired just
        # before it died may show up a moment later.
        await p.clock.sleep(min(SECOND_PASS_S, p.timings.lease_s))
        more, failed_again = await self._release_all(fenced.worker_id, fenced.epoch)
        released += more
        if failed or failed_again:
            event(logging.WARNING, "member.release_incomplete",
                  "some of a dead member's streams could not be released; retrying later",
                  member=fenced.worker_id, epoch=fenced.epoch,
                  failed=failed_again)
            return
        await p.fleet.mark_released(fenced.worker_id, fenced.epoch,
                                    timeout=p.timings.heartbeat_s, shard=fenced.shard)
        event(logging.INFO, "member.released", "released a dead member's streams",
              member=fenced.worker_id, epoch=fenced.epoch, streams=released)

    async def release_leftovers(self, delay: float = 0.0) -> None:
        """Release what earlier incarnations of this worker id left behind (their streams
        carry an older epoch), ``delay`` seconds from now."""
        if not await self._after(delay):
            return
        released, _ = await self._release_all(self.parts.me, self.row.epoch)
        if released:
            event(logging.WARNING, "member.leftovers_released",
                  "released streams an earlier incarnation of this worker still held",
                  epoch=self.row.epoch, streams=released)

    async def _after(self, delay: float) -> bool:
        """Wait ``delay`` seconds (if any); False if the membership stopped meanwhile."""
        if not delay:
            return True
        await sleep_unless(delay, self.parts.stop)
        return not self.parts.stop.is_set()

    async def _release_all(self, owner: str, fenced_epoch: int) -> tuple[int, int]:
        """Release every stream ``owner`` still holds under an epoch older than
        ``fenced_epoch``: (released, failed).

        The owner index lists every stream that ever named ``owner`` (a release keeps the
        owner), lags behind the table, and holds only the owner and fence. So each row is
        a hint: a consistent read of the item decides, and only a stream still leased to
        an older incarnation of ``owner`` gets the conditional write (with the fence the
        read shows). Streams that moved on or were released cost a read, not a write that
        fails."""
        timings = self.parts.timings
        owned = await self.leases.owned_by(owner, timeout=timings.lease_s)
        if not owned:
            return 0, 0
        gate = asyncio.Semaphore(RELEASE_CONCURRENCY)
        results: list[bool] = []
        failed = 0

        async def one(stream_id: str) -> None:
            nonlocal failed
            async with gate:
                try:
                    record = await self.leases.check(stream_id, timeout=timings.heartbeat_s)
                    if record is None or record.fence is None or not releasable_for(
                            owner, fenced_epoch, record.lease_owner,
                            record.lease_expires_at_ms, record.fence, record.lease_epoch):
                        return
                    results.append(await self.leases.release_for(
                        stream_id, owner, record.fence, fenced_epoch,
                        timeout=timings.heartbeat_s))
                except StoreError as exc:
                    failed += 1
                    event(logging.WARNING, "member.release_for_failed",
                          "releasing a dead member's stream failed; the next pass retries",
                          stream=stream_id, member=owner, error=str(exc))

        async with asyncio.TaskGroup() as tg:
            for stream_id in sorted({item.stream_id for item in owned}):
                tg.create_task(one(stream_id))
        count = sum(results)
        if count:
            self.parts.metrics.released_on_behalf(count)
            self.parts.hooks.fleet_changed()
        return count, failed

    def _finish_abandoned(self, members: list[MemberRecord], now: float) -> None:
        """A DEAD row whose streams were never marked released (its fencer died too): once
        it has stayed so for a lease, anyone finishes the job. A released one observed
        for long enough is deleted (clean exits delete their own rows)."""
        p = self.parts
        keys = set()
        for member in members:
            if member.status is not MemberStatus.DEAD:
                continue
            key = (member.worker_id, member.epoch)
            keys.add(key)
            since = self._unreleased_since.setdefault(key, now)
            if not member.released and now - since >= p.timings.lease_s:
                self._unreleased_since[key] = now
                self.spawn(self._finish(member))
            elif member.released and p.hooks.leading() and \
                    now - since >= FORGET_AFTER_LEASES * p.timings.lease_s:
                self.spawn(self._forget(member))
        for key in set(self._unreleased_since) - keys:
            del self._unreleased_since[key]

    async def _forget(self, member: MemberRecord, duplicate: bool = False) -> None:
        if duplicate:
            event(logging.WARNING, "member.duplicate_row",
                  "a worker id has a second, older row under another key; deleting it",
                  member=member.worker_id, epoch=member.epoch, shard=member.shard)
        try:
            await self.parts.fleet.leave(member.worker_id, member.epoch,
                                         timeout=self.parts.timings.heartbeat_s,
                                         shard=member.shard)
        except StoreError as exc:
            event(logging.WARNING, "member.forget_failed", "could not delete a dead member's row",
                  member=member.worker_id, error=str(exc))
