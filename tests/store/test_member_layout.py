"""Member rows spread over several keys (``streamlease.core.layout``), for both backends:
where rows are created and found again, the leader's replicas, and the layout item."""

from __future__ import annotations

from streamlease.core import layout
from streamlease.core.layout import Replica
from streamlease.core.membership import HeartbeatOutcome, MemberStatus
from streamlease.store import fleetcodec
from streamlease.store.protocols import Heartbeat, Stores
from tests.store.lag import eventually

NOW = 1_800_000_000_000


def ids_in_other_keys(shards: int, count: int) -> list[str]:
    """Worker ids whose rows a layout of ``shards`` keys puts outside ``MEMBER``."""
    found = [f"w{i}" for i in range(1000) if layout.shard_of(f"w{i}", shards) != 0]
    return found[:count]


async def test_the_layout_moves_only_up(stores: Stores) -> None:
    fleet = stores.fleet
    assert (await fleet.roster())[1] == 1
    assert await fleet.spread(4) is True
    assert await fleet.spread(2) is False  # never down
    assert await fleet.spread(4) is False
    assert (await fleet.roster())[1] == 4


async def test_new_rows_take_their_key_and_every_key_is_read(stores: Stores) -> None:
    fleet = stores.fleet
    home = await fleet.register("home", 100, NOW)  # before the spread: MEMBER
    assert home.shard == 0
    await fleet.spread(4)
    spread = ids_in_other_keys(4, 3)
    records = {w: await fleet.register(w, 100, NOW) for w in spread}
    for worker_id, record in records.items():
        assert record.shard == layout.shard_of(worker_id, 4) != 0
        beat = await fleet.heartbeat(Heartbeat(worker_id, record.epoch, MemberStatus.ACTIVE, 5,
                                               100, 0, NOW + 1, shard=record.shard))
        assert beat.outcome is HeartbeatOutcome.RENEWED
        # The same write under another key finds no row: as a fence would.
        wrong = await fleet.heartbeat(Heartbeat(worker_id, record.epoch, MemberStatus.ACTIVE, 5,
                                                100, 0, NOW + 1, shard=0))
        assert wrong.outcome is HeartbeatOutcome.FENCED
        assert await fleet.member(worker_id, shard=record.shard) is not None
        assert await fleet.member(worker_id, shard=0) is None
    rows, shards = await fleet.roster()
    assert shards == 4
    assert [m.worker_id for m in rows] == sorted(["home", *spread])
    assert {m.worker_id: m.shard for m in rows} == \
        {"home": 0, **{w: r.shard for w, r in records.items()}}
    assert all(m.streams == 5 for m in rows if m.worker_id != "home")


async def test_a_worker_id_keeps_its_row_wherever_it_lives(stores: Stores) -> None:
    fleet = stores.fleet
    worker_id = ids_in_other_keys(8, 1)[0]
    first = await fleet.register(worker_id, 100, NOW)
    assert first.shard == 0
    await fleet.spread(8)  # its key in the new layout is another one
    again = await fleet.register(worker_id, 100, NOW + 1)
    assert again.shard == 0 and again.epoch > first.epoch, "moved on, not created anew"
    assert [m.worker_id for m in await fleet.members()] == [worker_id]
    old = await fleet.heartbeat(Heartbeat(worker_id, first.epoch, MemberStatus.ACTIVE, 0, 100,
                                          0, NOW))
    assert old.outcome is HeartbeatOutcome.FENCED
    # Gone after a clean exit: the next registration creates it under the new layout, its
    # epoch still above the deleted one.
    assert await fleet.leave(worker_id, again.epoch, shard=again.shard) is True
    fresh = await fleet.register(worker_id, 100, NOW + 2)
    assert fresh.shard == layout.shard_of(worker_id, 8) != 0
    assert fresh.epoch > again.epoch


async def test_fence_and_release_marks_work_under_any_key(stores: Stores) -> None:
    fleet = stores.fleet
    await fleet.spread(2)
    worker_id = ids_in_other_keys(2, 1)[0]
    record = await fleet.register(worker_id, 100, NOW)
    (seen,) = await fleet.members()
    assert seen.shard == record.shard == 1
    fenced = await fleet.fence(seen, "peer", NOW + 1)
    assert fenced is not None and fenced.status is MemberStatus.DEAD and fenced.shard == 1
    assert await fleet.mark_released(worker_id, fenced.epoch, shard=0) is False
    assert await fleet.mark_released(worker_id, fenced.epoch, shard=1) is True
    assert await fleet.leave(worker_id, fenced.epoch, shard=1) is True
    assert await fleet.members() == []


async def test_rows_say_their_process_reads_spread_layouts(stores: Stores) -> None:
    fleet = stores.fleet
    await fleet.register("a", 100, NOW, incarnation="nonce-1")
    (row,) = await fleet.members()
    assert row.reads_layout == "nonce-1" and layout.reads_layout(row)


async def test_replicas_are_written_into_every_key_and_never_go_back(stores: Stores) -> None:
    fleet = stores.fleet
    assert await fleet.replica(0) is None
    first = Replica(leader="a", shard=1, epoch=7, heartbeat=3, fence=5, shards=4,
                    bulletin='{"g":1}')
    assert await fleet.publish(first, 4) == 4
    for shard in range(4):
        assert await _eventually_replica(stores, shard, first)
    # A deposed leader (an older fence) does not overwrite its successor's replicas.
    newer = Replica(leader="b", shard=0, epoch=9, heartbeat=1, fence=6, shards=4,
                    bulletin='{"g":2}')
    assert await fleet.publish(newer, 4) == 4
    stale = Replica(leader="a", shard=1, epoch=7, heartbeat=4, fence=5, shards=4,
                    bulletin='{"g":3}')
    assert await fleet.publish(stale, 4) == 0
    assert await _eventually_replica(stores, 3, newer)
    # Replicas and the layout item are not member rows.
    assert await fleet.members() == []


async def _eventually_replica(stores: Stores, shard: int, want: Replica) -> bool:
    """The replica in ``shard`` reads as ``want`` (its reads are eventually consistent)."""
    found = await eventually(stores, lambda: stores.fleet.replica(shard),
                             lambda got: got == want)
    return bool(found == want)


def test_a_replica_round_trips_and_a_damaged_one_is_none() -> None:
    replica = Replica(leader="a", shard=2, epoch=7, heartbeat=3, fence=5, shards=4,
                      bulletin='{"g":1}', status=MemberStatus.DRAINING)
    item = fleetcodec.encode_replica(3, replica)
    assert fleetcodec.decode_replica(item) == replica
    assert fleetcodec.decode_member(item) is None, "a replica is never a member row"
    for name, value in ((fleetcodec.LEADER, None), (fleetcodec.BULLETIN, None),
                        (fleetcodec.LEADER_SHARD, {"N": "-1"}),
                        (fleetcodec.LEADER_STATUS, {"S": "ASLEEP"})):
        damaged = {k: v for k, v in item.items() if k != name}
        if value is not None:
            damaged[name] = value
        assert fleetcodec.decode_replica(damaged) is None, name
    # A layout edited by hand counts as the power of two at or below it; junk as one key.
    assert fleetcodec.decode_layout({fleetcodec.SHARDS: {"N": "6"}}) == 4
    assert fleetcodec.decode_layout({fleetcodec.SHARDS: {"N": "x"}}) == 1
    assert fleetcodec.decode_layout(None) == 1
