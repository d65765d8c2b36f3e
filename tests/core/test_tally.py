"""The fleet view between sweeps (streamlease.core.tally): a simulated table, a change
feed that lags it and reads batches twice, and sweeps whose pages are stale or behind
the feed. Once the feed has delivered everything, the followed view must equal the
table, whatever the interleaving."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import pytest

from streamlease.core.changes import ChangeEvent, ChangeRecord
from streamlease.core.model import StreamRecord
from streamlease.core.tally import Followed, Tally, ViewTracker, view_key

BASE_MS = 1_000_000  # expiries are drawn from BASE_MS .. BASE_MS + SPAN_MS
SPAN_MS = 60_000
DELETES = 0.05


def record(sid: str, state: str, expiry: int | None) -> StreamRecord:
    return StreamRecord(stream_id=sid, desired_state=state, ws_url="wss://x",
                        lease_owner="w1" if expiry else None, lease_expires_at_ms=expiry,
                        fence=1, last_seq=None)


def fed(sid: str, old: StreamRecord | None, new: StreamRecord | None, shard: str, seq: str,
        written_ms: int | None) -> ChangeRecord:
    """A change as the feed reads it."""
    kind = ChangeEvent.INSERT if old is None else ChangeEvent.REMOVE if new is None \
        else ChangeEvent.MODIFY
    return ChangeRecord(sid, kind, old, new, written_ms, shard, seq)


def random_version(rng: random.Random, sid: str) -> StreamRecord | None:
    roll = rng.random()
    if roll < DELETES:
        return None  # deleted
    state = rng.choice(["STARTED", "STARTED", "STARTED", "STOPPED", "BOGUS"])
    expiry = rng.choice([None, 0, 0, rng.randrange(BASE_MS, BASE_MS + SPAN_MS)])
    return record(sid, state, expiry)


@dataclass(order=True)
class Step:
    at: float
    order: int
    kind: str = field(compare=False)
    payload: object = field(compare=False, default=None)


@dataclass
class Case:
    name: str
    seed: int
    items: int = 40
    writes: int = 300
    feed_lag_s: float = 1.0  # at most; also how far a page may be stale
    page_size: int = 7
    sweeps: int = 4
    replay: bool = True  # batches read again from a checkpoint
    resweeps: int = 0  # sweeps that asked for another (counted by the run)


CASES = [
    Case("quiet feed, short sweeps", seed=1, feed_lag_s=0.2),
    Case("lagging feed, stale pages", seed=2, feed_lag_s=2.0),
    Case("many writes a sweep", seed=3, writes=900, page_size=3),
    Case("no replays", seed=4, replay=False),
    *[Case(f"random {n}", seed=100 + n, feed_lag_s=0.1 + n % 5 * 0.6,
           page_size=1 + n % 9, writes=200 + 50 * n) for n in range(12)],
]


def truth_at(history: dict[str, list[tuple[float, StreamRecord | None]]],
             sid: str, t: float) -> StreamRecord | None:
    found: StreamRecord | None = None
    for at, version in history[sid]:
        if at <= t:
            found = version
    return found


def simulate(case: Case) -> tuple[ViewTracker, Tally]:
    rng = random.Random(case.seed)
    sids = [f"s{i:03d}" for i in range(case.items)]
    history = {sid: [(0.0, random_version(rng, sid))] for sid in sids}
    steps: list[Step] = []
    order = 0

    def at(t: float, kind: str, payload: object = None) -> None:
        nonlocal order
        order += 1
        heapq.heappush(steps, Step(t, order, kind, payload))

    # Sweeps: pages in a fixed item order, each read a little stale (eventually
    # consistent), processed after a round trip.
    t = 0.0
    for _ in range(case.sweeps):  # one after another, as the leader's sweep duty runs
        t += rng.uniform(1.0, 15.0)
        at(t, "begin")
        for first in range(0, len(sids), case.page_size):
            t += rng.uniform(0.05, 1.5)
            at(t, "page", (sids[first:first + case.page_size],
                           t - rng.uniform(0.0, case.feed_lag_s / 2)))
        t += 0.01
        at(t, "end")
    # Writes until the last sweep ends; the feed delivers them in write order, each at
    # most feed_lag_s after it was written; every record carries its old and new image.
    writes = sorted(rng.uniform(0.1, t) for _ in range(case.writes))
    delivered_at = 0.0
    seq = 0
    records: list[tuple[float, tuple[str, StreamRecord | None, StreamRecord | None, int,
                                     float]]] = []
    for t in writes:
        sid = rng.choice(sids)
        old = history[sid][-1][1]
        new = random_version(rng, sid)
        if view_key(old) == view_key(new) and old is not None and new is not None:
            continue
        history[sid].append((t, new))
        seq += 1
        delivered_at = max(delivered_at, t + rng.uniform(0.0, case.feed_lag_s))
        records.append((delivered_at, (sid, old, new, seq, t)))
    for n, (t, rec) in enumerate(records):
        at(t, "follow", rec)
        if case.replay and rng.random() < 0.1:  # a batch read again from the checkpoint
            for again_t, again in records[max(0, n - 5):n + 1]:
                at(max(t, again_t) + 0.01, "follow", again)
    tracker = ViewTracker()
    again = False
    while steps:
        step = heapq.heappop(steps)
        if step.kind == "follow":
            sid, old, new, n, written = step.payload  # type: ignore[misc]
            # DynamoDB Streams' creation time is rounded down to the second.
            tracker.follow(fed(sid, old, new, "shard-1", f"{n:021d}", int(written) * 1000),
                           step.at, int(step.at * 1000))
        elif step.kind == "begin":
            tracker.begin_sweep(int(step.at * 1000))
        elif step.kind == "page":
            ids, seen_at = step.payload  # type: ignore[misc]
            page = [v for v in (truth_at(history, sid, seen_at) for sid in ids) if v]
            tracker.page(page, step.at)
        else:
            again = tracker.end_sweep(step.at)
            if again:
                case.resweeps += 1
    if again:  # the last sweep asked for another (an item deleted as it ran): the table
        tracker.begin_sweep(int(step.at * 1000) + 10_000)  # is quiet by now
        tracker.page([v for v in (history[sid][-1][1] for sid in sids) if v],
                     step.at + 10.0)
        tracker.end_sweep(step.at + 10.1)
    expected = Tally()
    for sid in sids:
        expected.add(view_key(history[sid][-1][1]))
    return tracker, expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_followed_view_equals_the_table_once_the_feed_has_caught_up(case: Case) -> None:
    tracker, expected = simulate(case)
    for now_ms in range(BASE_MS - 1000, BASE_MS + SPAN_MS + 2000, 500):
        assert tracker.counts(now_ms) == expected.counts(now_ms), now_ms


def test_the_simulation_makes_the_races_happen() -> None:
    """The cases above exercise what they claim: deletes while sweeps run (a sweep then
    asks for another), records delivered twice."""
    resweeps = 0
    for case in CASES:
        simulate(case)
        resweeps += case.resweeps
    assert resweeps > 0


def test_nothing_is_published_before_a_terms_first_sweep_ends() -> None:
    tracker = ViewTracker()
    tracker.follow(fed("a", None, record("a", "STARTED", 0), "s", "1", None), 0.0, 0)
    assert tracker.counts(0) is None
    tracker.begin_sweep(0)
    tracker.page([record("a", "STARTED", 0)], 0.5)
    assert tracker.counts(0) is None
    tracker.end_sweep(1.0)
    assert tracker.counts(0) == {("STARTED", "none"): 1}
    tracker.reset()
    assert tracker.counts(0) is None


def test_a_change_made_while_a_sweep_runs_is_counted_once() -> None:
    """The two races of the module doc, one at a time."""
    free, held = record("a", "STARTED", 0), record("a", "STARTED", BASE_MS + 5000)
    # Followed before the page that holds it was read: the page shows it already.
    tracker = ViewTracker()
    tracker.begin_sweep(0)
    tracker.follow(fed("a", free, held, "s", "1", None), 1.0, 0)
    tracker.page([held], 2.0)
    tracker.end_sweep(3.0)
    assert tracker.counts(BASE_MS) == {("STARTED", "live"): 1}
    # Written before its page was read, followed after (the feed lags the table).
    tracker = ViewTracker()
    tracker.begin_sweep(0)
    tracker.page([held], 1.0)
    tracker.end_sweep(1.5)
    tracker.follow(fed("a", free, held, "s", "1", None), 2.0, 0)
    assert tracker.counts(BASE_MS) == {("STARTED", "live"): 1}
    # Written after its page was read: the page shows it as it was.
    tracker = ViewTracker()
    tracker.begin_sweep(0)
    tracker.page([free], 1.0)
    tracker.follow(fed("a", free, held, "s", "1", None), 2.0, 0)
    tracker.end_sweep(3.0)
    assert tracker.counts(BASE_MS) == {("STARTED", "live"): 1}
    # Followed just before a sweep began, then read by a stale page (an eventually
    # consistent Scan): counted as the feed reported it.
    tracker = ViewTracker()
    tracker.follow(fed("a", free, held, "s", "1", None), 1.0, 0)
    tracker.begin_sweep(0)
    tracker.page([free], 1.5)
    tracker.end_sweep(2.0)
    assert tracker.counts(BASE_MS) == {("STARTED", "live"): 1}
    # Read again from a checkpoint: followed once.
    assert tracker.follow(fed("a", free, held, "s", "1", None), 4.0, 0) is Followed.REPEATED
    assert tracker.counts(BASE_MS) == {("STARTED", "live"): 1}


def test_a_change_written_before_the_sweep_began_is_already_counted() -> None:
    """A new leader's feed replays from an old checkpoint: the sweep saw those changes."""
    free, held = record("a", "STARTED", 0), record("a", "STARTED", BASE_MS + 5000)
    tracker = ViewTracker()
    tracker.begin_sweep(100_000)
    tracker.page([free], 1.0)
    tracker.end_sweep(2.0)
    followed = tracker.follow(fed("a", held, free, "s", "7", 50_000), 60.0, 110_000)
    assert followed is Followed.FOLLOWED  # long behind, but already counted: no sweep
    assert tracker.counts(BASE_MS) == {("STARTED", "none"): 1}
    # Written after the sweep began, delivered more than ten seconds later: sweep again.
    assert tracker.follow(fed("a", free, held, "s", "8", 100_500), 61.0, 120_000) is Followed.LATE
    assert tracker.follow(fed("a", held, free, "s", "9", 100_600), 61.0, 120_000) is Followed.LATE
    # Written as the sweep began: not known to be in it, followed.
    assert tracker.follow(fed("a", free, held, "s", "10", 99_000), 61.0, 105_000) \
        is Followed.FOLLOWED
    assert tracker.counts(BASE_MS) == {("STARTED", "live"): 1}


def test_a_lease_that_lapses_without_a_write_is_counted_expired() -> None:
    tally = Tally()
    tally.add(("STARTED", BASE_MS + 1500))
    tally.add(("STOPPED", 0))
    assert tally.counts(BASE_MS) == {("STARTED", "live"): 1, ("STOPPED", "none"): 1}
    assert tally.counts(BASE_MS + 2000) == {("STARTED", "expired"): 1, ("STOPPED", "none"): 1}
    tally.move(("STARTED", BASE_MS + 1500), None)
    assert tally.counts(BASE_MS) == {("STOPPED", "none"): 1}


def test_the_races_a_review_found() -> None:
    free, held = record("a", "STARTED", 0), record("a", "STARTED", BASE_MS + 5000)
    # Deleted while a sweep ran, before its page: never negative; the sweep asks again.
    tracker = ViewTracker()
    tracker.begin_sweep(0)
    tracker.follow(fed("a", free, None, "s", "1", None), 1.0, 0)
    assert tracker.end_sweep(2.0) is True
    assert tracker.counts(BASE_MS) == {}
    # Created just before a sweep began, missing from its stale first page: counted.
    tracker = ViewTracker()
    tracker.follow(fed("a", None, free, "s", "1", 9_500), 1.0, 10_000)
    tracker.begin_sweep(10_000)
    tracker.page([], 1.5)
    assert tracker.end_sweep(2.0) is False
    assert tracker.counts(BASE_MS) == {("STARTED", "none"): 1}
    # A version repeated long before the sweep (free -> held -> free, the last written
    # 5 s before it began): the page's "free" is the truth, not a stale "held".
    tracker = ViewTracker()
    tracker.follow(fed("a", free, held, "s", "1", 4_000), 1.0, 4_000)
    tracker.follow(fed("a", held, free, "s", "2", 5_000), 2.0, 5_000)
    tracker.begin_sweep(10_000)
    tracker.page([free], 2.5)
    tracker.end_sweep(3.0)
    assert tracker.counts(BASE_MS) == {("STARTED", "none"): 1}
