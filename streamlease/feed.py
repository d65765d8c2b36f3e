"""The change feed: a leader duty that turns the streams table's changes into actions.

The fleet leader, and only the leader, tails the streams table's DynamoDB stream
(``streamlease.store.dynamodb.changefeed``) under its leader fence. Each change is
classified (``streamlease.core.changes.classify``) and acted on:

* ``STAMP`` — a hand-written item gets ``lease_expires_at_ms = 0`` (the sparse orphan
  index then shows it; the stamp's own record is an ``OFFER``);
* ``STOPPED``, ``REPOINTED``, ``FORCE_RELEASED`` — the holder is told
  (``NoticeKind.CHECK``, in the leader's bulletin): it reads its item consistently and
  releases, reconnects or stops;
* ``OFFER`` — the member with most room is told to look for orphans now.

A batch is checkpointed only after its actions were carried out and a bulletin carrying
its notices was written, so a change is processed at least once: a leader that dies
mid-batch leaves the checkpoint before it, and the next leader reads the batch again
(stamping is conditional, and a notice acted on twice costs a consistent read). A batch
whose notices are not written in time (the leader's heartbeats are failing) is read again
from the checkpoint, and the bulletin's vouching stretch moves on, so every member runs
its polls once for what it may have missed.

While the feed runs, the leader's bulletin vouches for it (``Bulletin.feed``) and members
stop polling for what it tells them (the STOPPED query, each stream's periodic read); the
sweep becomes a slow backstop. When the feed cannot be read (no stream on the table, a
fault), the bulletin stops vouching, the members' polls resume, and each fault that may
have lost changes (a trimmed shard, a stream gone, an iterator expired before anything
was read) runs one backstop sweep.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from streamlease.clock import sleep_unless
from streamlease.context import Context
from streamlease.core.changes import Action, ChangeRecord
from streamlease.core.notices import NoticeKind, Room, most_room, rooms_of
from streamlease.errors import StoreError
from streamlease.logs import event
from streamlease.membership import FleetView
from streamlease.store.dynamodb.changefeed import Batch, Fault, FaultKind, FeedResult, Opened

NO_STREAM_RETRY_S = 60.0  # a table without a stream is asked again this often
MIN_POLL_S = 0.2  # DynamoDB Streams allows five GetRecords a second per shard


class Applied(Enum):
    OK = "ok"
    LATE = "late"  # its notices were not written in time: read again from the checkpoint
    DEPOSED = "deposed"  # a newer leader checkpointed the shard


class FeedReader(Protocol):
    async def open(self) -> Opened | Fault: ...

    async def poll(self) -> list[FeedResult]: ...

    async def commit(self, batch: Batch) -> bool: ...


class Notifier(Protocol):
    """What the feed needs of this worker's membership (the leader's bulletin)."""

    @property
    def view(self) -> FleetView: ...

    def share_level(self) -> int | None:
        """The fair-share level of the bulletin this leader composed (None: none yet)."""
        ...

    def post(self, member: str, stream: str, kind: NoticeKind) -> int: ...

    async def published(self, n: int, timeout: float) -> bool: ...

    def feed_running(self, up: bool) -> None: ...


class Backstop(Protocol):
    """The sweep, as the feed uses it (``streamlease.sweep.Sweep``)."""

    def request(self) -> None:
        """Sweep now: the feed may have missed changes."""

    def follow(self, change: ChangeRecord) -> None:
        """The fleet view follows a change between sweeps."""


class Fenced(Protocol):
    @property
    def fence(self) -> int: ...


@dataclass(frozen=True)
class FeedSettings:
    # An idle feed is read again after this: four GetRecords a second a shard, under
    # DynamoDB Streams' five; a change waits an eighth of a second on average.
    poll_s: float = 0.25
    publish_timeout_s: float = 5.0  # a batch's notices must be written within this


class ChangeFeed:
    def __init__(self, ctx: Context, open_reader: Callable[[int], FeedReader],
                 notifier: Notifier, sweep: Backstop, settings: FeedSettings,
                 stopping: asyncio.Event) -> None:
        self.open_reader = open_reader
        self.leases = ctx.leases
        self.notifier = notifier
        self.sweep = sweep
        self.clock = ctx.clock
        self.metrics = ctx.metrics
        self.settings = settings
        self.stopping = stopping
        self._said_no_stream = False

    async def duty(self, lease: Fenced, stop: asyncio.Event) -> None:
        """A leader duty: read the feed under ``lease``'s fence until ``stop``."""
        reader = self.open_reader(lease.fence)
        try:
            await self._run(reader, stop)
        finally:
            self.notifier.feed_running(False)

    def _stopped(self, stop: asyncio.Event) -> bool:
        return stop.is_set() or self.stopping.is_set()

    async def _run(self, reader: FeedReader, stop: asyncio.Event) -> None:
        while not self._stopped(stop):
            opened = await reader.open()
            if isinstance(opened, Fault):
                await self._faulted(opened, stop)
                continue
            self._said_no_stream = False
            event(logging.INFO, "feed.opened", "reading the streams table's change feed",
                  shards=opened.shards, resumed=opened.resumed, first_start=opened.backstop)
            if opened.backstop:
                self.sweep.request()  # what came before the feed's first record: the sweep's
            self.notifier.feed_running(True)
            if not await self._tail(reader, stop):
                return

    async def _tail(self, reader: FeedReader, stop: asyncio.Event) -> bool:
        """Poll until stopped (True: reopen the reader; False: this leader is deposed)."""
        while not self._stopped(stop):
            results = await reader.poll()
            read = False
            for result in results:
                if isinstance(result, Fault):
                    if result.kind is FaultKind.NO_STREAM:
                        await self._faulted(result, stop)
                        return True
                    await self._faulted(result, stop, keep_open=True)
                    continue
                read = read or bool(result.records)
                applied = await self._apply(reader, result)
                if applied is not Applied.OK:
                    # Late: read again from the checkpoint, and the bulletin says there
                    # was a gap (members catch up with one poll each).
                    self.notifier.feed_running(False)
                    return applied is Applied.LATE
            if results and not any(isinstance(r, Fault) for r in results):
                self.notifier.feed_running(True)
            if not read:
                await sleep_unless(max(MIN_POLL_S, self.settings.poll_s), stop, self.stopping)
        return False

    async def _apply(self, reader: FeedReader, batch: Batch) -> Applied:
        """Act on one batch, then checkpoint it once its notices are written. ``LATE``:
        they were not written in time; ``DEPOSED``: a newer leader has checkpointed this
        shard."""
        last = 0
        rooms = self._rooms()
        event(logging.DEBUG, "feed.batch", "change feed records read", shard=batch.shard_id,
              records=len(batch.records), streams=[c.stream_id for c in batch.records[:20]])
        for change in batch.records:
            last = max(last, await self._act(change, rooms))
        if last and not await self.notifier.published(last, self.settings.publish_timeout_s):
            # Not checkpointed: the feed is read again from the checkpoint.
            event(logging.WARNING, "feed.publish_late", "the bulletin carrying the change "
                  "feed's notices was not written in time; reading again from the checkpoint",
                  shard=batch.shard_id)
            return Applied.LATE
        try:
            if not await reader.commit(batch):
                event(logging.WARNING, "feed.deposed", "a newer leader checkpointed the change "
                      "feed: this one stops reading it", shard=batch.shard_id)
                return Applied.DEPOSED
        except StoreError as exc:
            event(logging.WARNING, "feed.checkpoint_failed", "cannot checkpoint the change "
                  "feed; the next batch's checkpoint covers this one", error=str(exc))
        return Applied.OK

    def _rooms(self) -> dict[str, Room]:
        """Free slots of the members taking streams, as the leader last read the rows, to
        their fair share and to their capacity."""
        return rooms_of(((m.worker_id, m.streams, m.capacity)
                         for m in self.notifier.view.active()), self.notifier.share_level())

    async def _act(self, change: ChangeRecord, rooms: dict[str, Room]) -> int:
        """Carry out one change's actions; the number of the last notice posted (0: none)."""
        last = 0
        self.sweep.follow(change)  # the fleet view follows each change between sweeps
        for action in change.actions():
            self.metrics.change_feed_records(action.value)
            if action is Action.STAMP:
                try:
                    if await self.leases.adopt(change.stream_id):
                        event(logging.INFO, "stream.adopted", "hand-written item given lease "
                              "fields; it is now visible to the fleet", stream=change.stream_id)
                except StoreError as exc:
                    event(logging.WARNING, "feed.stamp_failed", "cannot stamp a hand-written "
                          "item; the backstop sweep will", stream=change.stream_id,
                          error=str(exc))
                    self.sweep.request()
            elif action in (Action.STOPPED, Action.REPOINTED, Action.FORCE_RELEASED):
                record = change.old if action is Action.FORCE_RELEASED else change.new
                holder = record.lease_owner if record is not None else None
                if holder is not None:
                    last = self.notifier.post(holder, change.stream_id, NoticeKind.CHECK)
                    event(logging.DEBUG, "feed.notice_posted", "the holder is told to read "
                          "the item", stream=change.stream_id, member=holder, n=last)
            elif action is Action.OFFER:
                taker = most_room(rooms)
                if taker is not None:
                    last = self.notifier.post(taker, change.stream_id, NoticeKind.OFFER)
                    event(logging.DEBUG, "feed.notice_posted", "a free stream is offered",
                          stream=change.stream_id, member=taker, n=last)
        return last

    async def _faulted(self, fault: Fault, stop: asyncio.Event, keep_open: bool = False) -> None:
        """The feed cannot be trusted for now: members poll again; a fault that may have
        lost changes runs one backstop sweep; then a pause."""
        self.notifier.feed_running(False)
        if fault.backstop:
            self.sweep.request()
        if fault.kind is FaultKind.NO_STREAM:
            if not self._said_no_stream:
                self._said_no_stream = True
                event(logging.WARNING, "feed.unavailable", "the streams table has no DynamoDB "
                      "stream: the fleet polls for changes instead (streamlease table create "
                      "enables one)", detail=fault.detail)
            await sleep_unless(NO_STREAM_RETRY_S, stop, self.stopping)
            return
        event(logging.WARNING, "feed.fault", "change feed fault; carrying on",
              kind=fault.kind.value, shard=fault.shard_id, detail=fault.detail[:300],
              backstop=fault.backstop)
        if fault.retry_after_s > 0 or not keep_open:
            await sleep_unless(max(fault.retry_after_s, MIN_POLL_S), stop, self.stopping)
