"""The fleet view between sweeps: counts of the streams table kept true by the change feed.

The leader publishes how many streams are in each (``desired_state``, lease) cell. A sweep
(a paginated, eventually consistent Scan) counts them; between sweeps the change feed's
records move single items from one cell to another. Done naively, two races make the
counts drift until the next sweep (minutes while the feed is live):

* a change the feed reports while a sweep is under way is either already in the page that
  holds its item, or not: counting it again, or not at all, is wrong either way;
* the feed lags the table, and a Scan may return an item as it was a moment ago: a page
  can show an item newer or older than the feed has reached.

``ViewTracker`` resolves both with memory bounded by the changes of one sweep and of a
short window (``window_s``), never by the table's size:

* what a tally counts an item as is known exactly only briefly: for an item a page or the
  feed showed within the window (``_counted``). Past the window, the feed has delivered
  every change before it, so the item is counted as the next change's old image says;
* a change to an item not counted in the sweep's tally yet is kept (``_pending``) until a
  page shows the item: if the page shows any version the feed has reported (the page is
  behind or level), the item is counted as its newest; otherwise the page is ahead and
  counted as read, and the feed's next records catch up to it. An item no page shows
  after its change (written behind the sweep's position, or before the sweep reached it
  but scanned long before the change) is moved as the changes say, from their first old
  image to their newest;
* the feed reads a batch again after a fault: a record at or below the last sequence
  number followed in its shard changes nothing, and neither does a record written before
  the sweep that built a tally began (every page read after it shows the change);
* a change the feed delivers more than the window after it was written cannot be placed
  exactly: ``follow`` says so (``Followed.LATE``), and the caller sweeps again.

One case is left to another sweep: an item deleted while a sweep runs, and shown by no
page after its deletion, may or may not have been counted by it (a Scan does not say
which keys a page would have held); ``end_sweep`` says so and the caller sweeps again.

Lease liveness depends on the time: cells count expiries in one-second buckets, so a
lease that lapses without a write is counted expired within a second, not at the next
sweep.

Pure: times are plain numbers handed in (``now_s`` monotonic seconds for the window,
``now_ms`` wall epoch milliseconds for expiry).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from streamlease.core.changes import ChangeRecord
from streamlease.core.model import StreamRecord
from streamlease.core.plan import VALID_STATES

Key = tuple[str, int] | None  # (state, expiry epoch ms; 0 = free); None: no such item

WINDOW_S = 10.0  # how long what a tally counts an item as is remembered
MAX_VERSIONS = 16  # versions of one item remembered to place a page against the feed
# A page read after a sweep began shows every change written this long before it began
# (an eventually consistent read lags well under a second; DynamoDB Streams' creation
# time is rounded down to the second).
SEEN_BY_SWEEP_MS = 3000


class Followed(Enum):
    FOLLOWED = "followed"
    REPEATED = "repeated"  # read again from a checkpoint: nothing changed
    LATE = "late"  # delivered too late to be placed exactly: sweep again


def view_key(record: StreamRecord | None) -> Key:
    """What the fleet view counts an item as: its state (``invalid`` outside
    STARTED/STOPPED) and its lease's expiry (0 when free or never stamped)."""
    if record is None:
        return None
    state = record.desired_state if record.desired_state in VALID_STATES else "invalid"
    return (state or "invalid", record.lease_expires_at_ms or 0)


class Tally:
    """Counts by state: free leases, and held ones by the second their lease expires."""

    def __init__(self, begun_ms: int = 0) -> None:
        self.begun_ms = begun_ms  # when the sweep that counted it began (wall)
        self._cells: dict[tuple[str, int], int] = {}  # (state, expiry second or -1) -> n

    def saw(self, written_ms: int | None) -> bool:
        """Whether this tally's sweep already counted a change written then."""
        return written_ms is not None and written_ms < self.begun_ms - SEEN_BY_SWEEP_MS

    @staticmethod
    def _cell(key: tuple[str, int]) -> tuple[str, int]:
        state, expiry = key
        return (state, -1 if expiry <= 0 else expiry // 1000)

    def add(self, key: Key, n: int = 1) -> None:
        if key is None:
            return
        cell = self._cell(key)
        left = self._cells.get(cell, 0) + n
        if left:
            self._cells[cell] = left
        else:
            del self._cells[cell]

    def move(self, old: Key, new: Key) -> None:
        if old != new:
            self.add(old, -1)
            self.add(new)

    def counts(self, now_ms: int) -> dict[tuple[str, str], int]:
        """(state, ``live``|``expired``|``none``) -> n at ``now_ms``. A lease is counted
        live until the end of the second it expires in. Safe to call from another thread
        (the metrics server's) while the event loop moves items: it reads a copy, which
        CPython takes without releasing the GIL."""
        out: dict[tuple[str, str], int] = {}
        for (state, second), n in tuple(self._cells.items()):
            lease = "none" if second < 0 else ("live" if second * 1000 + 999 > now_ms
                                               else "expired")
            out[(state, lease)] = out.get((state, lease), 0) + n
        return out


@dataclass
class _Pending:
    """Changes to an item that the sweep's tally has not counted yet."""

    first: Key  # the old image of the first: what a page before them shows
    seen: list[Key] = field(default_factory=list)  # every version they reported
    latest: Key = None


class ViewTracker:
    """The published fleet view (``counts``), rebuilt by each sweep and followed between."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.reset()

    def reset(self) -> None:
        """A new term: nothing is known until its first sweep ends."""
        self._current: Tally | None = None  # None until a term's first sweep ends
        self._scan: Tally | None = None  # the sweep under way
        # What each tally counts recently shown items as: stream -> (key, shown at).
        self._counted: OrderedDict[str, tuple[Key, float]] = OrderedDict()
        self._counted_scan: OrderedDict[str, tuple[Key, float]] = OrderedDict()
        self._pending: dict[str, _Pending] = {}
        # Versions the feed reported recently: stream -> (versions, at, written_ms).
        self._recent: OrderedDict[str, tuple[list[Key], float, int | None]] = OrderedDict()
        self._followed: dict[str, int] = {}  # shard -> last sequence number followed

    @property
    def ready(self) -> bool:
        return self._current is not None

    def counts(self, now_ms: int) -> dict[tuple[str, str], int] | None:
        return None if self._current is None else self._current.counts(now_ms)

    # -- the sweep ---------------------------------------------------------------------

    def begin_sweep(self, now_ms: int) -> None:
        self._scan = Tally(now_ms)
        self._counted_scan = OrderedDict()
        # Changes written just before the sweep began may be missing from a stale page:
        # pending from the start, as changes to items the sweep has not counted (no page
        # that showed them counts them as anything but their newest).
        self._pending = {sid: _Pending(None, list(versions), versions[-1])
                         for sid, (versions, _, written_ms) in self._recent.items()
                         if not self._scan.saw(written_ms)}

    def page(self, records: Iterable[StreamRecord], now_s: float) -> None:
        """One page of the sweep's Scan, as read."""
        if self._scan is None:
            return
        self._expire(now_s)
        for record in records:
            read = view_key(record)
            sid = record.stream_id
            pending = self._pending.pop(sid, None)
            key = read
            if pending is not None and read in (pending.first, *pending.seen):
                key = pending.latest  # the page is behind the feed, or level with it
            self._scan.add(key)
            _remember(self._counted_scan, sid, key, now_s)

    def end_sweep(self, now_s: float) -> bool:
        """The Scan is complete: what it counted, moved by the changes no page showed
        after them, becomes the published view. True when an item was deleted while the
        sweep ran and no page showed it: whether the sweep counted it cannot be told (a
        Scan does not say which keys a page would have held), so sweep again."""
        if self._scan is None:
            return False
        unsure = False
        for pending in self._pending.values():
            if pending.first is not None and None in pending.seen:
                unsure = True  # counted as ``first`` if scanned before; else not at all
            else:
                self._scan.move(pending.first, pending.latest)
        self._current, self._scan = self._scan, None
        self._counted, self._counted_scan = self._counted_scan, OrderedDict()
        self._pending = {}
        self._expire(now_s)
        return unsure

    def abandon_sweep(self) -> None:
        """A sweep that failed part-way: the published view stays as it was."""
        self._scan, self._counted_scan, self._pending = None, OrderedDict(), {}

    # -- the feed ----------------------------------------------------------------------

    def follow(self, change: ChangeRecord, now_s: float, now_ms: int) -> Followed:
        """One change the feed read, written at its approximate creation time
        (``written_ms``, None if unknown)."""
        stream_id, written_ms = change.stream_id, change.approximate_at_ms
        try:
            seq: int | None = int(change.sequence_number)
        except ValueError:
            seq = None
        if seq is not None:
            if seq <= self._followed.get(change.shard_id, -1):
                return Followed.REPEATED
            self._followed[change.shard_id] = seq
        self._expire(now_s)
        before, after = view_key(change.old), view_key(change.new)
        versions = [*self._recent.pop(stream_id, ([before], 0.0, None))[0], after]
        self._recent[stream_id] = (versions[-MAX_VERSIONS:], now_s, written_ms)
        applied = False
        if self._current is not None and not self._current.saw(written_ms):
            applied = True
            self._current.move(_counted_as(self._counted, stream_id, before), after)
            if stream_id in self._counted:
                _remember(self._counted, stream_id, after, now_s)
        if self._scan is not None and not self._scan.saw(written_ms):
            applied = True
            if stream_id in self._counted_scan:  # a page showed it a moment ago
                self._scan.move(_counted_as(self._counted_scan, stream_id, before), after)
                _remember(self._counted_scan, stream_id, after, now_s)
            else:
                pending = self._pending.setdefault(stream_id, _Pending(before))
                pending.seen = [*pending.seen[1 - MAX_VERSIONS:], after]
                pending.latest = after
        # Late, and not already counted by a sweep that began after it was written.
        late = applied and written_ms is not None and \
            written_ms < now_ms - self.window_s * 1000
        return Followed.LATE if late else Followed.FOLLOWED

    def _expire(self, now_s: float) -> None:
        horizon = now_s - self.window_s
        for remembered in (self._counted, self._counted_scan, self._recent):
            _forget_before(remembered, horizon)


def _counted_as(counted: OrderedDict[str, tuple[Key, float]], stream_id: str,
                old: Key) -> Key:
    """What a tally counts an item as: remembered if shown recently, else the old image
    of the change that replaced it (the feed has delivered every change before it)."""
    remembered = counted.get(stream_id)
    return old if remembered is None else remembered[0]


def _remember(counted: OrderedDict[str, tuple[Key, float]], stream_id: str, key: Key,
              now_s: float) -> None:
    counted.pop(stream_id, None)
    counted[stream_id] = (key, now_s)


def _forget_before(remembered: OrderedDict[str, Any], horizon: float) -> None:
    """Drop the entries (oldest first; an entry's second field is when) before ``horizon``."""
    while remembered:
        sid, entry = next(iter(remembered.items()))
        if entry[1] >= horizon:
            return
        del remembered[sid]
