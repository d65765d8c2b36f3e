"""A fleet whose member rows spread over several keys (``streamlease.core.layout``), in
virtual time on the in-memory store: the leader spreads them, copies its bulletin into
every key, and members read their own key's copy; a row of an older release holds the
layout; the leader's death is seen through the copies."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import pytest

from streamlease.core import bulletin as bulletins
from streamlease.core import layout
from streamlease.core.membership import MemberStatus
from streamlease.core.notices import NoticeKind
from streamlease.membership import SPREAD_FULL_READ_S
from streamlease.store.memory import MemoryStore
from tests.fakes import Fault
from tests.test_membership import Pairs, T, fleet_member, until

pytestmark = pytest.mark.virtual_time

PER_KEY = 2  # five members spread over four keys


async def start(memory: MemoryStore, names: str, leader: list[str]) -> tuple[
        Pairs, dict[str, asyncio.Task[None]]]:
    pairs = {n: fleet_member(memory, n, leader, held=3, per_key=PER_KEY) for n in names}
    for m, _ in pairs.values():
        await m.register()
    return pairs, {n: asyncio.create_task(m.run()) for n, (m, _) in pairs.items()}


async def stop(pairs: Pairs, tasks: dict[str, asyncio.Task[None]]) -> None:
    for m, _ in pairs.values():
        m.stop()
    await asyncio.gather(*tasks.values(), return_exceptions=True)


def outside_member_key(shards: int) -> str:
    return next(f"late{i}" for i in range(100) if layout.shard_of(f"late{i}", shards) != 0)


@pytest.mark.parametrize("stale_reads_s", [0.0, 0.4])
async def test_a_growing_fleet_spreads_and_members_read_their_own_keys_copy(
        stale_reads_s: float) -> None:
    memory = MemoryStore(stale_reads_s=stale_reads_s)
    pairs, tasks = await start(memory, "abcde", ["a"])
    await until(lambda: memory.shards == 4)
    await until(lambda: all(r.leader == "a" for r in memory.replicas.values()) and
                set(memory.replicas) == {0, 1, 2, 3})
    # Rows registered before the spread stay under MEMBER, and read its copy.
    await until(lambda: all(m.shards == 4 and m.bulletin is not None and not m.reading_all
                            for n, (m, _) in pairs.items() if n != "a"))
    for _, store in pairs.values():
        store.calls.clear()
    await asyncio.sleep(10 * T.heartbeat_s)
    leader = pairs["a"][0]
    for name in "bcde":
        m, store = pairs[name]
        assert store.count("replica") >= 10, name
        assert store.count("member") == 0 and store.count("roster") == 0, name
        assert m.bulletin is not None and leader.bulletin is not None
        assert m.bulletin.gen == leader.bulletin.gen
    assert pairs["a"][1].count("publish") >= 5
    # A member that joins now gets a key of its own, and reads that key's copy.
    late = outside_member_key(4)
    joined, store = fleet_member(memory, late, ["a"], per_key=PER_KEY)
    await joined.register()
    assert joined.shard == layout.shard_of(late, 4) != 0
    pairs[late] = (joined, store)
    tasks[late] = asyncio.create_task(joined.run())
    await until(lambda: joined.bulletin is not None and not joined.reading_all)
    store.calls.clear()
    await asyncio.sleep(4 * T.heartbeat_s)
    assert store.count("replica") >= 3 and store.count("member") == 0
    assert memory.members_by_id[late].heartbeat > 0
    assert leader.metrics.registry.get_sample_value("streamlease_member_keys") == 4
    await stop(pairs, tasks)


async def test_a_row_of_an_older_release_holds_the_layout(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    memory = MemoryStore()
    leader = ["a"]
    pairs = {n: fleet_member(memory, n, leader, per_key=PER_KEY) for n in "abc"}
    for m, _ in pairs.values():
        await m.register()
    # "c" as a process of an older release registers it: no mark of its incarnation.
    memory.members_by_id["c"] = dataclasses.replace(memory.members_by_id["c"],
                                                    reads_layout=None)
    a = pairs["a"][0]
    for _ in range(3):
        await a.watcher.observe()
        await asyncio.sleep(T.heartbeat_s)
    assert memory.shards == 1 and a.shards == 1
    held = [r for r in caplog.records if getattr(r, "sl_event", "") == "member.layout_held"]
    assert len(held) == 1, "said once"
    # The member runs this release again: the leader spreads at its next read.
    await pairs["c"][0].register()
    await a.watcher.observe()
    await until(lambda: memory.shards == 2 and a.shards == 2)
    assert any(getattr(r, "sl_event", "") == "member.layout_spread" for r in caplog.records)


@pytest.mark.parametrize("stale_reads_s", [0.0, 0.4])
async def test_the_leaders_death_is_seen_through_the_copies(stale_reads_s: float) -> None:
    """Also with copies read as they were up to 0.4 s ago (eventually consistent)."""
    memory = MemoryStore(stale_reads_s=stale_reads_s)
    pairs, tasks = await start(memory, "abcde", ["a"])
    await until(lambda: all(m.shards == 4 and not m.reading_all and m.bulletin is not None
                            for n, (m, _) in pairs.items() if n != "a"))
    tasks["a"].cancel()  # the leader stops heartbeating; its lease still names it
    await until(lambda: memory.members_by_id["a"].status is MemberStatus.DEAD,
                limit=T.lease_s + 10)
    assert memory.members_by_id["a"].fenced_by in set("bcde")
    del pairs["a"], tasks["a"]
    await stop(pairs, tasks)


async def test_a_notice_is_published_once_every_keys_copy_carries_it() -> None:
    memory = MemoryStore()
    pairs, tasks = await start(memory, "abcde", ["a"])
    a = pairs["a"][0]
    await until(lambda: memory.shards == 4 and set(memory.replicas) == {0, 1, 2, 3})
    pairs["a"][1].fail("publish", times=2)  # the next two copies fail
    n = a.post("d", "s-1", NoticeKind.CHECK)
    assert await a.published(n, timeout=10 * T.heartbeat_s)
    for replica in memory.replicas.values():
        news = bulletins.decode(replica.bulletin)
        assert news is not None and n in {x.n for x in news.notices}
    assert a.metrics.registry.get_sample_value(
        "streamlease_bulletin_replica_failures_total") == 2
    d = pairs["d"][0]
    await until(lambda: d.bulletin is not None and any(x.n == n for x in d.bulletin.notices))
    await stop(pairs, tasks)


async def test_a_deposed_leaders_copies_do_not_replace_its_successors() -> None:
    """"a" still believes it leads under the lease's first fence; "b" leads under the
    second. Both copy their bulletins after every heartbeat: every key keeps "b"'s, and
    "a" counts its refused copies (its notices are not published)."""
    memory = MemoryStore()
    deposed, current = ["a"], ["b", "a"]
    pairs = {n: fleet_member(memory, n, deposed if n == "a" else current, held=3,
                             per_key=PER_KEY) for n in "abcde"}
    for m, _ in pairs.values():
        await m.register()
    await memory.spread(4)
    tasks = {n: asyncio.create_task(m.run()) for n, (m, _) in pairs.items()}
    await until(lambda: set(memory.replicas) == {0, 1, 2, 3} and
                all(r.leader == "b" for r in memory.replicas.values()))
    a = pairs["a"][0]
    await until(lambda: (a.metrics.registry.get_sample_value(
        "streamlease_bulletin_replica_failures_total") or 0) >= 3)
    for _ in range(8):
        await asyncio.sleep(T.heartbeat_s / 2)
        assert all(r.leader == "b" and r.fence == 2 for r in memory.replicas.values())
    n = a.post("c", "s-1", NoticeKind.CHECK)
    assert not await a.published(n, timeout=4 * T.heartbeat_s)
    await stop(pairs, tasks)


async def test_a_draining_leaders_copies_tell_members_someone_drains() -> None:
    """With one key, members read every row while the leader drains; in a spread fleet
    they plan from its copy, told that someone drains, without reading every key."""
    memory = MemoryStore()
    pairs, tasks = await start(memory, "abcde", ["a"])
    others = [pairs[n] for n in "bcde"]
    await until(lambda: all(m.shards == 4 and not m.reading_all and m.bulletin is not None
                            for m, _ in others))
    for _, store in others:
        store.calls.clear()
    pairs["a"][0].drain()  # it hands its streams (and soon its leadership) over
    await until(lambda: all(r.status is MemberStatus.DRAINING
                            for r in memory.replicas.values()))
    await until(lambda: all(m.draining_seen() for m, _ in others), limit=5 * T.heartbeat_s)
    await asyncio.sleep(4 * T.heartbeat_s)
    assert all(store.count("roster") == 0 for _, store in others)
    assert all(not m.reading_all for m, _ in others)
    await stop(pairs, tasks)

async def test_a_leader_that_dies_between_its_heartbeat_and_its_copies_is_still_fenced() -> None:
    """The copies then show the counter before the last heartbeat, which no fence
    conditioned on it can match: the members read the rows, see the last counter stand
    still for a lease, and fence on that."""
    memory = MemoryStore()
    pairs, tasks = await start(memory, "abcde", ["a"])
    await until(lambda: all(m.shards == 4 and not m.reading_all and m.bulletin is not None
                            for n, (m, _) in pairs.items() if n != "a"))
    pairs["a"][1].fail("publish", times=-1)  # every copy from now on fails
    copied = max(r.heartbeat for r in memory.replicas.values())
    await until(lambda: memory.members_by_id["a"].heartbeat >= copied + 1)
    tasks["a"].cancel()
    last, last_epoch = memory.members_by_id["a"].heartbeat, memory.members_by_id["a"].epoch
    assert last > copied
    await until(lambda: memory.members_by_id["a"].status is MemberStatus.DEAD,
                limit=3 * T.lease_s + 10)
    assert memory.members_by_id["a"].fenced_by in set("bcde")
    # Its copies still say ACTIVE; a member that saw its row fenced no longer plans from
    # them, and waits for the next leader's copies without reading every key meanwhile.
    await until(lambda: any(pairs[n][0].watcher.stale_copies == ("a", last_epoch) for n in "bcde"))
    for n in "bcde":
        pairs[n][1].calls.clear()
    await asyncio.sleep(4 * T.heartbeat_s)
    assert all(pairs[n][1].count("roster") == 0 for n in "bcde"
               if pairs[n][0].watcher.stale_copies == ("a", last_epoch))
    del pairs["a"], tasks["a"]
    await stop(pairs, tasks)


async def test_a_live_leader_whose_copies_fail_is_never_fenced() -> None:
    """Its copies stand still, so members read its row, see it move, and read the copies
    again: a lease later the same, never a fence."""
    memory = MemoryStore()
    pairs, tasks = await start(memory, "abcde", ["a"])
    await until(lambda: all(m.shards == 4 and not m.reading_all and m.bulletin is not None
                            for n, (m, _) in pairs.items() if n != "a"))
    pairs["a"][1].fail("publish", times=-1)
    epoch = memory.members_by_id["a"].epoch
    await asyncio.sleep(6 * T.lease_s)
    row = memory.members_by_id["a"]
    assert row.status is MemberStatus.ACTIVE and row.epoch == epoch
    assert all(pairs[n][1].count("fence") == 0 for n in "bcde")
    assert sum(pairs[n][1].count("member") for n in "bcde") > 0, "their rows were read"
    await stop(pairs, tasks)


async def test_a_copy_never_pairs_a_new_epoch_with_an_old_counter() -> None:
    """The leader registers again (fenced, or its id taken back) while a copy of its last
    heartbeat waits: that copy is dropped, never written under the new epoch (whose
    counter restarts at 0, so the copy would read as the newest row for hours)."""
    memory = MemoryStore()
    pairs, tasks = await start(memory, "abcde", ["a"])
    a, store = pairs["a"]
    await until(lambda: memory.shards == 4 and set(memory.replicas) == {0, 1, 2, 3})
    store.faults["publish"] = [Fault(1, None, delay=4 * T.heartbeat_s)]  # one slow copy
    await until(lambda: store.count("publish") >= 1 and a.publisher.replica_due is not None)
    store.fail("heartbeat", times=-1)  # no newer copy is queued meanwhile
    await a.register()
    assert a.publisher.replica_due is None
    await asyncio.sleep(6 * T.heartbeat_s)  # the slow copy is done; the queue was dropped
    row = memory.members_by_id["a"]
    assert all(r.epoch < row.epoch for r in memory.replicas.values()), \
        "nothing written under the new epoch before a heartbeat under it"
    store.heal()
    await stop(pairs, tasks)


async def test_a_leader_change_does_not_send_every_member_to_every_key() -> None:
    """The leader dies; until the next one's copies appear the others plan from the last
    bulletin and read only their copy (and the dead leader's row), not every key; copies
    missing for minutes make each read every key once in a while."""
    memory = MemoryStore()
    leader = ["a"]
    pairs, tasks = await start(memory, "abcde", leader)
    await until(lambda: all(m.shards == 4 and not m.reading_all and m.bulletin is not None
                            for n, (m, _) in pairs.items() if n != "a"))
    for n in "bcde":
        pairs[n][1].calls.clear()
    tasks["a"].cancel()
    await until(lambda: memory.members_by_id["a"].status is MemberStatus.DEAD,
                limit=3 * T.lease_s + 10)
    await asyncio.sleep(20.0)
    # The fencer reads every key once after its fence (it deals from the rows); the rest
    # did not read them at all.
    assert sum(pairs[n][1].count("roster") for n in "bcde") <= 1
    assert all(pairs[n][0].bulletin is not None or pairs[n][0].reading_all for n in "bcde")
    # Copies missing for two minutes: each reads every key once in a while.
    await asyncio.sleep(2 * SPREAD_FULL_READ_S)
    assert all(pairs[n][1].count("roster") >= 1 for n in "bcde")
    # The next leader's copies: back to one item a read.
    leader[0] = "b"
    await until(lambda: all(r.leader == "b" for r in memory.replicas.values()))
    await until(lambda: all(not pairs[n][0].reading_all for n in "cde"))
    for n in "cde":
        pairs[n][1].calls.clear()
    await asyncio.sleep(4 * T.heartbeat_s)
    assert all(pairs[n][1].count("roster") == 0 and pairs[n][1].count("replica") >= 4
               for n in "cde")
    del pairs["a"], tasks["a"]
    await stop(pairs, tasks)
