"""The sweep, and what the worker says about items it cannot serve.

The sweep is a duty of the fleet leader (``Sweep.duty``), in a task of its own so a slow
Scan never delays a takeover: a paginated Scan of the streams table that gives items
written by hand without lease fields ``lease_expires_at_ms = 0`` (so the orphan index sees
them), reports every item that cannot be served, and publishes the fleet view metric.
While the leader's change feed runs (``streamlease.feed``), which stamps hand-written
items within a second, the sweep is its backstop: it runs ``BACKSTOP_FACTOR`` times less
often, and once at once whenever the feed may have missed changes (``request``); between
sweeps the fleet view follows the feed's changes (``follow``, through
``streamlease.core.tally.ViewTracker``, which keeps a change made while a sweep runs from
being counted twice or lost).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from streamlease.clock import sleep_unless
from streamlease.context import Context
from streamlease.core.backoff import jittered
from streamlease.core.changes import ChangeRecord
from streamlease.core.model import StreamRecord, error_text
from streamlease.core.plan import VALID_STATES, bad_item_reason, invisible_to_index, item_problem
from streamlease.core.tally import Followed, ViewTracker
from streamlease.core.upstream import Catalog
from streamlease.core.urls import AllowList
from streamlease.errors import StoreError
from streamlease.holdings import Holdings
from streamlease.logs import event

REPORTED_LIMIT = 10_000  # (stream, problem) pairs remembered for log rate-limiting
BACKSTOP_FACTOR = 10  # with the change feed live the sweep runs this many times less often


class Unservable:
    """Items that cannot be served: written to ``last_error`` each time, logged and
    counted once per (stream, problem)."""

    def __init__(self, ctx: Context) -> None:
        self.leases = ctx.leases
        self.clock = ctx.clock
        self.metrics = ctx.metrics
        self.reported: OrderedDict[tuple[str, str], None] = OrderedDict()

    async def report(self, record: StreamRecord, problem: str) -> None:
        key = (record.stream_id, problem)
        if key in self.reported:
            self.reported.move_to_end(key)
        else:
            self.reported[key] = None
            if len(self.reported) > REPORTED_LIMIT:
                self.reported.popitem(last=False)
            self.metrics.bad_item(bad_item_reason(problem))
            event(logging.WARNING, "stream.unservable", "stream cannot be served; not dialled",
                  stream=record.stream_id, problem=problem)
        try:
            await self.leases.record_error(record.stream_id, problem, self.clock.wall_ms())
        except StoreError as exc:
            event(logging.WARNING, "stream.record_error_failed", "could not record last_error",
                  stream=record.stream_id, error=str(exc))


@dataclass(frozen=True)
class SweepSettings:
    sweep_s: float
    allowed_urls: AllowList
    catalog: Catalog


class Sweep:
    def __init__(self, ctx: Context, holdings: Holdings, settings: SweepSettings,
                 unservable: Unservable, stopping: asyncio.Event) -> None:
        self.leases = ctx.leases
        self.holdings = holdings
        self.clock = ctx.clock
        self.metrics = ctx.metrics
        self.settings = settings
        self.unservable = unservable
        self.rng = ctx.rng
        self.stopping = stopping
        self.feed_live: Callable[[], bool] = lambda: False
        self._requested = asyncio.Event()
        self.view = ViewTracker()  # the last sweep's counts, followed between sweeps
        self._late = False  # a late change asked for a sweep that has not begun yet

    def request(self) -> None:
        """Sweep now: the change feed may have missed changes."""
        self._requested.set()

    async def duty(self, lease: object, stop: asyncio.Event) -> None:
        """A leader duty: the sweep and the fleet view, once at once (a new leader picks
        up hand-written items immediately), then every ``sweep_s`` (+/-20 %), or
        ``BACKSTOP_FACTOR`` times that while the change feed is live."""
        self.view.reset()  # a new term: the view starts from its first sweep
        while not stop.is_set() and not self.stopping.is_set():
            self._requested.clear()
            try:
                await self.sweep()
            except StoreError as exc:
                event(logging.WARNING, "sweep.failed", "sweep failed", error=str(exc))
            await self._until_due(jittered(1.0, 0.2, self.rng), stop)

    async def _until_due(self, factor: float, stop: asyncio.Event) -> None:
        """Until the next sweep is due: ``factor`` x ``sweep_s`` after this one, or
        ``BACKSTOP_FACTOR`` times that while the change feed is live, judged afresh at
        least every ``sweep_s`` (a feed that stops brings the sweep back to its interval)."""
        done = self.clock.monotonic()
        while not (stop.is_set() or self.stopping.is_set() or self._requested.is_set()):
            every = self.settings.sweep_s * (BACKSTOP_FACTOR if self.feed_live() else 1)
            left = done + factor * every - self.clock.monotonic()
            if left <= 0:
                return
            await sleep_unless(min(left, self.settings.sweep_s), stop, self.stopping,
                               self._requested)

    async def sweep(self) -> None:
        """One paginated Scan of the streams table, a page at a time (the table is never
        held in memory): adopt hand-written items, report items that cannot be served,
        and publish the fleet view metric. (A filtered Scan costs the same read capacity
        as a full one, so the view comes for free.)"""
        first = not self.view.ready
        self._late = False
        self.view.begin_sweep(self.clock.wall_ms())
        try:
            async for page in self.leases.scan_pages():
                self.view.page(page, self.clock.monotonic())
                await self._page(page)
        except BaseException:
            self.view.abandon_sweep()
            raise
        if self.view.end_sweep(self.clock.monotonic()):
            self.request()  # an item deleted meanwhile may be counted: count again
        if first:  # read at every scrape from here on (cleared when the term ends)
            self.metrics.fleet_view(self._counts)

    def _counts(self) -> dict[tuple[str, str], int]:
        return self.view.counts(self.clock.wall_ms()) or {}

    def follow(self, change: ChangeRecord) -> None:
        """A change the leader's feed read: the fleet view follows it between sweeps (one
        delivered too late to be placed exactly is counted by a sweep now)."""
        followed = self.view.follow(change, self.clock.monotonic(), self.clock.wall_ms())
        if followed is Followed.LATE and not self._late:
            self._late = True
            event(logging.INFO, "sweep.view_late", "the change feed is behind by more than "
                  "the fleet view can follow; sweeping now", stream=change.stream_id)
            self.request()

    async def _page(self, records: list[StreamRecord]) -> None:
        for record in records:
            # Every problem the full item shows (the index does not hold every attribute,
            # and items with an unknown state are not in it at all), written once.
            problem = item_problem(record, self.settings.allowed_urls,
                                   self.settings.catalog)
            if problem is not None and record.last_error != error_text(problem) and \
                    record.stream_id not in self.holdings.supervisors:
                await self.unservable.report(record, problem)
        for record in filter(invisible_to_index, records):
            if record.desired_state not in VALID_STATES:
                continue
            if record.lease_expires_at_ms is None and await self.leases.adopt(record.stream_id):
                event(logging.INFO, "stream.adopted",
                      "hand-written item given lease fields; it is now visible to the fleet",
                      stream=record.stream_id)

