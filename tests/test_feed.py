"""The change feed duty against a scripted reader: what each change makes the leader do,
checkpoints only after the notices are written, faults (backstop sweeps, members polling
again), a deposed reader stopping; and the notices' board and their trip through the
bulletin."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from streamlease.core import bulletin as bulletins
from streamlease.core.changes import ChangeEvent, ChangeRecord
from streamlease.core.membership import MemberRecord, MemberStatus
from streamlease.core.model import StreamRecord
from streamlease.core.notices import (
    Notice,
    NoticeBoard,
    NoticeKind,
    fresh,
    most_room,
    rooms_of,
)
from streamlease.feed import ChangeFeed, FeedSettings
from streamlease.membership import FleetView
from streamlease.metrics import Metrics
from streamlease.store.dynamodb.changefeed import Batch, Fault, FaultKind, FeedResult, Opened
from streamlease.store.memory import MemoryStore
from tests.fakes import context
from tests.virtual import LoopClock


def record(sid: str, **fields: object) -> StreamRecord:
    base: dict[str, object] = {"stream_id": sid, "desired_state": "STARTED",
                               "ws_url": f"ws://127.0.0.1:1/{sid}"}
    base.update(fields)
    return StreamRecord(**base)  # type: ignore[arg-type]


def change(old: StreamRecord | None, new: StreamRecord | None, seq: str) -> ChangeRecord:
    sid = (new or old).stream_id  # type: ignore[union-attr]
    return ChangeRecord(sid, ChangeEvent.MODIFY if old else ChangeEvent.INSERT, old, new,
                        None, "shard-1", seq)


HELD = {"lease_owner": "w1", "lease_expires_at_ms": 10**13, "fence": 3}


class Reader:
    """Answers ``open`` and each ``poll`` from a script; records commits."""

    def __init__(self, polls: list[list[FeedResult]], opened: list[Opened | Fault] | None = None,
                 commit_ok: bool = True) -> None:
        self.opens: Iterator[Opened | Fault] = iter(opened or [Opened("arn", 1, 1, False)])
        self.polls = iter(polls)
        self.commits: list[str | None] = []
        self.commit_ok = commit_ok
        self.done = asyncio.Event()

    async def open(self) -> Opened | Fault:
        return next(self.opens, Opened("arn", 1, 1, False))

    async def poll(self) -> list[FeedResult]:
        try:
            return next(self.polls)
        except StopIteration:
            self.done.set()  # read out: an idle feed from here on
            return []

    async def commit(self, batch: Batch) -> bool:
        self.commits.append(batch.position)
        return self.commit_ok


class Notifier:
    def __init__(self, view: FleetView, publish: bool = True, level: int | None = None) -> None:
        self.view = view
        self.level = level
        self.posted: list[tuple[str, str, NoticeKind]] = []
        self.running: list[bool] = []
        self.publish = publish

    def share_level(self) -> int | None:
        return self.level

    def post(self, member: str, stream: str, kind: NoticeKind) -> int:
        self.posted.append((member, stream, kind))
        return len(self.posted)

    async def published(self, n: int, timeout: float) -> bool:
        return self.publish

    def feed_running(self, up: bool) -> None:
        if not self.running or self.running[-1] != up:
            self.running.append(up)


def member(wid: str, streams: int, capacity: int = 10) -> MemberRecord:
    return MemberRecord(wid, 1, 5, MemberStatus.ACTIVE, streams, capacity=capacity)


async def run(feed: ChangeFeed, reader: Reader) -> None:
    """The duty until the script is read out (or the duty ends by itself)."""
    stop = asyncio.Event()
    task = asyncio.create_task(feed.duty(_Lease(), stop))
    finished = asyncio.ensure_future(reader.done.wait())
    await asyncio.wait({task, finished}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    await asyncio.wait_for(task, 10)
    finished.cancel()


class _Lease:
    fence = 7


def make(reader: Reader, notifier: Notifier, leases: MemoryStore | None = None,
         ) -> tuple[ChangeFeed, list[int], Metrics]:
    backstops: list[int] = []
    metrics = Metrics()
    sweep = SimpleNamespace(request=lambda: backstops.append(1), follow=lambda change: None)
    feed = ChangeFeed(context(clock=LoopClock(), metrics=metrics, leases=leases or MemoryStore()),
                      lambda fence: reader, notifier, sweep,  # type: ignore[arg-type]
                      FeedSettings(poll_s=0.01, publish_timeout_s=0.1), asyncio.Event())
    return feed, backstops, metrics


async def test_each_change_is_acted_on_and_checkpointed_after() -> None:
    leases = MemoryStore()
    await leases.put_item({"Pk": {"S": "CONN#hand"}, "desired_state": {"S": "STARTED"},
                    "ws_url": {"S": "ws://127.0.0.1:1/hand"}})
    view = FleetView((member("w1", 8), member("w2", 2), member("w3", 9)))
    notifier = Notifier(view)
    batch = Batch("shard-1", (
        change(None, record("hand"), "1"),  # written by hand: stamp
        change(record("a", **HELD), record("a", desired_state="STOPPED", **HELD), "2"),
        change(record("b", **HELD), record("b", ws_url="ws://127.0.0.1:2/b", **HELD), "3"),
        change(record("c", **HELD),
               record("c", lease_owner="w1", lease_expires_at_ms=0, fence=4), "4"),
        change(record("d", **HELD), record("d", lease_owner="w1", lease_expires_at_ms=0,
                                            fence=3), "5"),
    ), "5", 0.0)
    reader = Reader([[batch]])
    feed, backstops, metrics = make(reader, notifier, leases)
    await run(feed, reader)
    stored = await leases.check("hand")
    assert stored is not None and stored.lease_expires_at_ms == 0  # stamped
    assert notifier.posted == [
        ("w1", "a", NoticeKind.CHECK),  # STOPPED: its holder
        ("w1", "b", NoticeKind.CHECK),  # a new URL
        ("w1", "c", NoticeKind.CHECK),  # force released: the old holder
        ("w2", "c", NoticeKind.OFFER),  # free: the member with most room
        ("w2", "d", NoticeKind.OFFER),  # released: w2 still has the most room (7 left)
    ]
    assert reader.commits == ["5"]
    assert notifier.running == [True, False]  # vouched while it ran; not after
    assert backstops == []
    text = metrics.exposition()[0].decode()
    assert 'streamlease_change_feed_records_total{action="stamp"} 1.0' in text


async def test_a_batch_whose_notices_were_not_written_is_not_checkpointed() -> None:
    notifier = Notifier(FleetView((member("w1", 1),)), publish=False)
    stopped = Batch("shard-1", (change(record("a", **HELD),
                                       record("a", desired_state="STOPPED", **HELD), "9"),),
                    "9", 0.0)
    quiet = Batch("shard-1", (change(record("x", **HELD), record("x", last_seq=5, **HELD),
                                     "10"),), "10", 0.0)
    reader = Reader([[stopped], [quiet]])
    feed, _, _ = make(reader, notifier)
    await run(feed, reader)
    # The batch with a notice is not checkpointed: the feed stops vouching (members catch
    # up) and reads again from the checkpoint; the next batch, with nothing to tell, is.
    assert reader.commits == ["10"]
    assert notifier.running == [True, False, True, False]


@pytest.mark.parametrize("kind, backstop", [
    (FaultKind.TRIMMED, True), (FaultKind.EXPIRED_ITERATOR, True),
    (FaultKind.THROTTLED, False), (FaultKind.OTHER, False),
])
async def test_a_fault_stops_the_vouching_and_may_run_one_backstop(kind: FaultKind,
                                                                  backstop: bool) -> None:
    notifier = Notifier(FleetView((member("w1", 1),)))
    ok = Batch("shard-1", (), None, 0.0)
    reader = Reader([[ok], [Fault(kind, "boom", "shard-1", backstop, 0.0)], [ok]])
    feed, backstops, _ = make(reader, notifier)
    await run(feed, reader)
    assert notifier.running == [True, False, True, False]
    assert backstops == ([1] if backstop else [])


async def test_a_table_without_a_stream_is_swept_and_polled() -> None:
    notifier = Notifier(FleetView())
    reader = Reader([], opened=[Fault(FaultKind.NO_STREAM, "no stream", None, True)])
    feed, backstops, _ = make(reader, notifier)
    stop = asyncio.Event()
    task = asyncio.create_task(feed.duty(_Lease(), stop))
    for _ in range(100):
        if backstops:
            break
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(task, 10)
    assert backstops == [1] and notifier.running == [False]


async def test_a_first_start_sweeps_once_for_the_past() -> None:
    notifier = Notifier(FleetView())
    reader = Reader([[Batch("shard-1", (), None, 0.0)]], opened=[Opened("arn", 1, 0, True)])
    feed, backstops, _ = make(reader, notifier)
    await run(feed, reader)
    assert backstops == [1]


async def test_a_deposed_reader_stops() -> None:
    notifier = Notifier(FleetView((member("w1", 1),)))
    batch = Batch("shard-1", (change(None, record("x", **HELD), "1"),), "1", 0.0)
    reader = Reader([[batch], [batch]], commit_ok=False)
    feed, _, _ = make(reader, notifier)
    stop = asyncio.Event()
    await asyncio.wait_for(feed.duty(_Lease(), stop), 10)  # ends by itself
    assert reader.commits == ["1"] and notifier.running == [True, False]


# -- the board and the bulletin ---------------------------------------------------------

def test_notices_stay_for_their_life_and_an_overflow_is_said() -> None:
    board = NoticeBoard(first=100, ttl_s=5.0, limit=3)
    for i in range(3):
        board.post("w1", f"s{i}", NoticeKind.CHECK, now=float(i))
    assert [n.n for n in board.current(4.0)] == [100, 101, 102]
    assert [n.n for n in board.current(5.5)] == [101, 102]  # the first expired
    assert not board.overflowed(5.5)
    board.post("w2", "s3", NoticeKind.OFFER, now=5.8)
    board.post("w2", "s4", NoticeKind.OFFER, now=5.8)  # pushes 101 out before its time
    assert board.overflowed(5.8) and [n.n for n in board.current(5.8)] == [102, 103, 104]
    assert not board.overflowed(6.0)  # 101 (posted at 1.0) would have expired by now
    assert board.last == 104


def test_a_member_acts_on_its_own_notices_once() -> None:
    notices = (Notice(1, "w1", "a", NoticeKind.CHECK), Notice(2, "w2", "b", NoticeKind.OFFER),
               Notice(3, "w1", "c", NoticeKind.OFFER))
    assert [n.n for n in fresh(notices, "w1", frozenset())] == [1, 3]
    assert [n.n for n in fresh(notices, "w1", frozenset({1, 2}))] == [3]


def test_offers_go_to_the_most_room_and_fill_it() -> None:
    rooms = rooms_of([("w1", 8, 10), ("w2", 7, 10), ("w3", 10, 10)], None)
    assert [most_room(rooms) for _ in range(6)] == ["w2", "w1", "w2", "w1", "w2", None]


def test_offers_go_below_the_share_first() -> None:
    """Level 5: w3 (2 of 5) is offered streams before w1, which has more capacity left
    but is at its share and would only shed them again; once nobody is below, the most
    room to capacity (the share grows)."""
    rooms = rooms_of([("w1", 5, 100), ("w2", 4, 10), ("w3", 2, 10)], 5)
    assert [most_room(rooms) for _ in range(6)] == ["w3", "w3", "w2", "w3", "w1", "w1"]
    assert most_room(rooms_of([("w1", 10, 10)], 5)) is None


def test_the_bulletin_carries_the_feed_and_its_notices() -> None:
    news = bulletins.compose(bulletins.FleetRead([member("w1", 3)], frozenset(), "w1", 3, True,
                                                 0, gen=1))
    news = dataclasses.replace(news, feed=3, notices=(
        Notice(7, "w2", "s1", NoticeKind.CHECK), Notice(8, "w3", "s2", NoticeKind.OFFER)))
    assert bulletins.decode(bulletins.encode(news)) == news
    # A leader without a feed wrote neither: read as no feed, no notices.
    older = bulletins.encode(dataclasses.replace(news, feed=0, notices=()))
    trimmed = older.replace(',"f":0,"n":[]', "")
    assert "\"f\"" not in trimmed
    decoded = bulletins.decode(trimmed)
    assert decoded is not None and decoded.feed == 0 and decoded.notices == ()
    # A notice of a kind this version does not know is skipped, and the feed is not
    # trusted to be complete (the member polls); the rest of the bulletin still counts.
    newer = bulletins.decode(bulletins.encode(news).replace('"offer"', '"bogus"'))
    assert newer is not None and newer.feed == 0 and newer.level == news.level
    assert [x.n for x in newer.notices] == [7]


# -- the sweep as the feed's backstop ------------------------------------------------------

@pytest.mark.virtual_time
async def test_the_sweep_rests_while_the_feed_is_live_and_returns_when_it_stops() -> None:
    import random

    from streamlease.core.urls import parse_allowed_urls
    from streamlease.sweep import BACKSTOP_FACTOR, Sweep, SweepSettings, Unservable
    from streamlease.upstream import BUILTIN_UPSTREAMS

    memory = MemoryStore()
    clock, metrics = LoopClock(), Metrics()
    ctx = context(clock=clock, metrics=metrics, rng=random.Random(1), leases=memory)
    sweep = Sweep(ctx, SimpleNamespace(supervisors={}),  # type: ignore[arg-type]
                  SweepSettings(10.0, parse_allowed_urls("wss://"), BUILTIN_UPSTREAMS.catalog),
                  Unservable(ctx), asyncio.Event())
    live = [True]
    sweep.feed_live = lambda: live[0]
    stop = asyncio.Event()
    task = asyncio.create_task(sweep.duty(_Lease(), stop))
    await asyncio.sleep(1)
    assert memory.calls.count("scan") == 1  # once at once
    await asyncio.sleep(5 * 10.0)
    assert memory.calls.count("scan") == 1  # live: ten times the interval
    live[0] = False  # the feed stopped without a fault: the interval is back within one
    await asyncio.sleep(2 * 10.0)
    assert memory.calls.count("scan") >= 2
    sweep.request()  # the feed may have missed changes: at once
    before = memory.calls.count("scan")
    await asyncio.sleep(0.1)
    assert memory.calls.count("scan") == before + 1
    assert BACKSTOP_FACTOR == 10
    stop.set()
    await asyncio.wait_for(task, 5)
