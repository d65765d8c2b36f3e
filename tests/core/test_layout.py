"""The member layout's rules (pure)."""

from __future__ import annotations

import dataclasses

import pytest

from streamlease.core import layout
from streamlease.core.membership import MemberRecord, MemberStatus


def test_partition_keys_round_trip() -> None:
    assert layout.partition(0) == "MEMBER" and layout.partition(3) == "MEMBER#3"
    for shard in (0, 1, 7, layout.MAX_SHARDS - 1):
        assert layout.shard_of_partition(layout.partition(shard)) == shard
    for other in ("LEADER", "MEMBER#", "MEMBER#x", "MEMBER#0", "MEMBER#-1",
                  f"MEMBER#{layout.MAX_SHARDS}", "RUN#MEMBER"):
        assert layout.shard_of_partition(other) is None, other
    with pytest.raises(ValueError):
        layout.partition(-1)


def test_a_layout_is_a_power_of_two_never_rounded_up() -> None:
    assert [layout.valid_shards(k) for k in (-3, 0, 1, 2, 3, 5, 8, 1000)] == \
        [1, 1, 1, 2, 2, 4, 8, layout.MAX_SHARDS]


def test_doubling_keeps_half_of_a_keys_rows_where_they_were() -> None:
    ids = [f"task-{i:05d}" for i in range(4000)]
    for k in (1, 2, 4, 8, 64):
        before = [layout.shard_of(w, k) for w in ids]
        after = [layout.shard_of(w, 2 * k) for w in ids]
        assert all(a in (b, b + k) for a, b in zip(after, before, strict=True))
        stayed = sum(a == b for a, b in zip(after, before, strict=True)) / len(ids)
        assert 0.45 < stayed < 0.55, (k, stayed)
        # ... and the keys fill evenly.
        counts = [after.count(s) for s in range(2 * k)]
        assert max(counts) < 1.4 * len(ids) / (2 * k), counts


def test_search_order_covers_every_layout_the_fleet_grew_through() -> None:
    for worker_id in ("a", "b", "task-1", "0123456789abcdef"):
        order = layout.search_order(worker_id, 16)
        assert order[0] == layout.shard_of(worker_id, 16)
        assert set(order) == {layout.shard_of(worker_id, k) for k in (1, 2, 4, 8, 16)}
        assert len(order) == len(set(order)) and order[-1] == 0
    assert layout.search_order("a", 1) == [0]


def test_the_layout_grows_with_the_fleet_and_never_shrinks() -> None:
    per = layout.MEMBERS_PER_KEY
    assert layout.shards_for(per, 1) == 1
    assert layout.shards_for(per + 1, 1) == 2
    assert layout.shards_for(10_000, 1) == 64  # a million streams at 100 each
    assert layout.shards_for(10, 64) == 64  # a smaller fleet keeps its keys
    assert layout.shards_for(10**9, 1) == layout.MAX_SHARDS
    assert layout.shards_for(5, 1, per_key=1) == 8


def row(worker_id: str, status: MemberStatus = MemberStatus.ACTIVE,
        reads: bool = True) -> MemberRecord:
    return MemberRecord(worker_id, 1, 0, status, incarnation=f"nonce-{worker_id}",
                        reads_layout=f"nonce-{worker_id}" if reads else None)


def test_the_layout_spreads_only_when_every_live_row_reads_it() -> None:
    assert layout.may_spread([row("a"), row("b")])
    assert not layout.may_spread([row("a"), row("b", reads=False)])
    assert not layout.may_spread([row("a"), row("b", MemberStatus.DRAINING, reads=False)])
    # A fenced row's process no longer writes.
    assert layout.may_spread([row("a"), row("b", MemberStatus.DEAD, reads=False)])
    # An older release registered the row again: a new nonce, the old mark left behind.
    again = dataclasses.replace(row("a"), incarnation="nonce-older-release")
    assert not layout.reads_layout(again) and not layout.may_spread([again])


def test_a_replica_reads_as_the_leaders_row() -> None:
    replica = layout.Replica(leader="l", shard=3, epoch=9, heartbeat=41, fence=2, shards=4,
                             bulletin="{}")
    seen = replica.leader_row()
    assert (seen.worker_id, seen.shard, seen.epoch, seen.heartbeat, seen.bulletin) == \
        ("l", 3, 9, 41, "{}")
    assert seen.status is MemberStatus.ACTIVE


def test_one_row_each_keeps_the_newest_row_of_a_worker_id() -> None:
    old = dataclasses.replace(row("a"), epoch=5, shard=0)
    new = dataclasses.replace(row("a"), epoch=9, shard=1)
    other = row("b")
    kept, extra = layout.one_row_each([new, other, old])
    assert kept == [new, other] and extra == [old]
    kept, extra = layout.one_row_each([old, new, other])
    assert kept == [new, other] and extra == [old]
    assert layout.one_row_each([other]) == ([other], [])
