"""The hand-over's store contract (``streamlease.core.handover``), for both backends: the
taker's one conditional write that moves a live lease, its no written on the item, and
the offers a holder adds to the taker's member row."""

from __future__ import annotations

import dataclasses

import pytest

from streamlease.core.frames import Frame
from streamlease.core.handover import Offer
from streamlease.core.lease import LeaseTimings, RenewOutcome
from streamlease.core.membership import HeartbeatOutcome, MemberStatus
from streamlease.core.model import StreamRecord, Tenure
from streamlease.errors import StaleFence
from streamlease.store import codec
from streamlease.store.protocols import HandOver, Heartbeat, Stores

NOW = 1_800_000_000_000
T = LeaseTimings(lease_s=60.0, heartbeat_s=20.0, skew_margin_s=1.0, safety_margin_s=2.0)
URL = "wss://feeds.example.com/s"


def frames(first: int, last: int) -> list[Frame]:
    return [Frame(i, f'{{"seq":{i}}}') for i in range(first, last + 1)]


async def held(stores: Stores, sid: str = "s", owner: str = "a", epoch: int = 5,
               delivered: int = 0) -> Tenure:
    """``sid`` held by ``owner``, its sink ``delivered`` frames in under that tenure."""
    await stores.admin.put_started(sid, URL)
    got = await stores.leases.acquire(sid, owner, NOW, T, epoch=epoch)
    assert got is not None
    if delivered:
        await stores.sink.write_batch(got.tenure, 0, frames(1, delivered), NOW)
    return dataclasses.replace(got.tenure, last_seq=delivered or None)


async def item(stores: Stores, sid: str = "s") -> StreamRecord:
    record = await stores.admin.get(sid)
    assert record is not None
    return record


def claim(holder: str = "a", fence: int = 1, owner: str = "b", sid: str = "s",
          now: int = NOW + 1_000, epoch: int = 9) -> HandOver:
    return HandOver(sid, holder, fence, owner, now, T, epoch=epoch)


# -- take_handed ---------------------------------------------------------------------------


async def test_a_take_passes_a_live_lease_in_one_write_and_returns_its_checkpoint(
        stores: Stores) -> None:
    """fence + 1, owner, epoch and expiry the taker's; the item's last_seq (what the holder
    delivered, under its fence) comes back as the tenure's."""
    leases = stores.leases
    holder = await held(stores, delivered=12)
    got = await leases.take_handed(claim())
    assert got is not None
    later = NOW + 1_000
    assert (got.tenure.stream_id, got.tenure.owner, got.tenure.fence, got.tenure.last_seq,
            got.tenure.expires_at_ms, got.tenure.epoch) == ("s", "b", 2, 12,
                                                            later + T.lease_ms, 9)
    assert got.record.ws_url == URL and got.record.last_seq == 12
    record = await item(stores)
    assert (record.lease_owner, record.fence, record.lease_epoch, record.lease_expires_at_ms,
            record.last_seq) == ("b", 2, 9, later + T.lease_ms, 12)
    # The holder it passed from can write, renew and release no more; the taker can.
    with pytest.raises(StaleFence):
        await stores.sink.write_batch(holder, 12, frames(13, 14), NOW + 1_001)
    assert (await leases.renew(holder, NOW + 1_001, T)).outcome is RenewOutcome.LOST
    assert await leases.release(holder) is False
    assert (await leases.renew(got.tenure, NOW + 1_002, T)).outcome is RenewOutcome.RENEWED
    assert (await item(stores)).last_seq == 12


async def test_a_take_of_a_stream_never_written_has_no_checkpoint(stores: Stores) -> None:
    await held(stores)
    got = await stores.leases.take_handed(claim())
    assert got is not None and got.tenure.last_seq is None and got.tenure.fence == 2


async def test_a_second_taker_finds_the_lease_gone(stores: Stores) -> None:
    await held(stores)
    assert await stores.leases.take_handed(claim(owner="b")) is not None
    assert await stores.leases.take_handed(claim(owner="c", epoch=4)) is None
    assert (await item(stores)).lease_owner == "b"


async def test_a_take_after_the_holder_released_is_refused(stores: Stores) -> None:
    """A released lease (expiry 0) is an orphan, acquired the usual way."""
    tenure = await held(stores, delivered=3)
    assert await stores.leases.release(tenure) is True
    before = await item(stores)
    assert await stores.leases.take_handed(claim()) is None
    assert await item(stores) == before


async def test_a_take_after_the_fence_moved_is_refused(stores: Stores) -> None:
    await held(stores)
    moved = await stores.admin.force_release("s")  # fence 2, expiry 0
    assert moved.changed
    assert await stores.leases.take_handed(claim(fence=1)) is None
    # Acquired again by the same holder under fence 3: an offer under fence 1 is stale.
    again = await stores.leases.acquire("s", "a", NOW + 10, T, epoch=5)
    assert again is not None and again.tenure.fence == 3
    assert await stores.leases.take_handed(claim(fence=1)) is None
    assert await stores.leases.take_handed(claim(fence=2)) is None
    record = await item(stores)
    assert (record.lease_owner, record.fence) == ("a", 3)
    assert await stores.leases.take_handed(claim(fence=3)) is not None


async def test_a_take_of_a_stopped_stream_is_refused(stores: Stores) -> None:
    await held(stores)
    await stores.admin.set_state("s", "STOPPED")
    assert await stores.leases.take_handed(claim()) is None
    record = await item(stores)
    assert (record.lease_owner, record.fence) == ("a", 1)


async def test_a_take_naming_another_holder_is_refused(stores: Stores) -> None:
    await held(stores, owner="a")
    assert await stores.leases.take_handed(claim(holder="z")) is None
    assert await stores.leases.take_handed(claim(holder="b", owner="b")) is None
    record = await item(stores)
    assert (record.lease_owner, record.fence) == ("a", 1)


async def test_a_take_of_a_missing_stream_is_refused(stores: Stores) -> None:
    assert await stores.leases.take_handed(claim(sid="missing")) is None
    assert await stores.admin.get("missing") is None  # and never created


async def test_a_resent_take_that_applied_returns_the_tenure(stores: Stores) -> None:
    await held(stores, delivered=4)
    first = await stores.leases.take_handed(claim())
    again = await stores.leases.take_handed(claim())
    assert first is not None and again is not None and again.tenure == first.tenure


# -- decline -------------------------------------------------------------------------------


async def test_a_decline_is_written_while_the_holder_holds_under_the_fence(
        stores: Stores) -> None:
    await held(stores, delivered=2)
    before = await item(stores)
    await stores.leases.decline("s", "a", 1, "b")
    record = await item(stores)
    assert codec.handover_declined(record) == "1:b"
    # Nothing else about the lease changes: the holder goes on (and releases).
    assert (record.lease_owner, record.fence, record.lease_expires_at_ms, record.last_seq) == \
        (before.lease_owner, before.fence, before.lease_expires_at_ms, before.last_seq)


async def test_a_decline_under_another_holder_or_fence_writes_nothing(stores: Stores) -> None:
    await held(stores)
    await stores.leases.decline("s", "z", 1, "b")  # not the holder
    await stores.leases.decline("s", "a", 7, "b")  # not its fence
    await stores.leases.decline("missing", "a", 1, "b")
    assert codec.handover_declined(await item(stores)) is None
    assert await stores.admin.get("missing") is None


async def test_a_late_decline_never_touches_a_later_tenure(stores: Stores) -> None:
    """The taker says no after the lease moved on (taken by another peer, or released and
    acquired again): the later tenure's item is left as it is."""
    await held(stores)
    taken = await stores.leases.take_handed(claim(owner="c"))
    assert taken is not None
    before = await item(stores)
    await stores.leases.decline("s", "a", 1, "b")
    assert await item(stores) == before
    assert codec.handover_declined(before) is None
    # The same holder again, a later fence: an old no is not this tenure's either.
    await stores.leases.release(taken.tenure)
    again = await stores.leases.acquire("s", "a", NOW + 5_000, T, epoch=5)
    assert again is not None and again.tenure.fence == 3
    await stores.leases.decline("s", "a", 1, "b")
    assert codec.handover_declined(await item(stores)) is None


# -- offers in the member row --------------------------------------------------------------


def offer(sid: str, fence: int = 1, rebalance: bool = False) -> str:
    return Offer(sid, fence, rebalance).text


async def beat(stores: Stores, wid: str, epoch: int, status: MemberStatus = MemberStatus.ACTIVE,
               now: int = NOW) -> frozenset[str]:
    result = await stores.fleet.heartbeat(Heartbeat(wid, epoch, status, 0, 100, 0, now))
    assert result.outcome is HeartbeatOutcome.RENEWED
    return result.offers


async def test_offers_join_the_row_and_each_heartbeat_reads_them_back(stores: Stores) -> None:
    fleet = stores.fleet
    b = await fleet.register("b", 100, NOW)
    assert await beat(stores, "b", b.epoch) == frozenset()
    assert await fleet.offer("b", b.epoch, offer("s1")) is True
    assert await fleet.offer("b", b.epoch, offer("s2", 4, rebalance=True)) is True
    assert await fleet.offer("b", b.epoch, offer("s1")) is True  # a set: once
    expected = frozenset({"1:s:s1", "4:r:s2"})
    assert await beat(stores, "b", b.epoch, now=NOW + 1) == expected
    assert await beat(stores, "b", b.epoch, now=NOW + 2) == expected  # until cleared
    (row,) = [m for m in await fleet.members() if m.worker_id == "b"]
    assert row.offers == expected
    other = await fleet.register("c", 100, NOW)
    assert await beat(stores, "c", other.epoch) == frozenset()  # only its own row's


async def test_an_offer_is_refused_under_another_epoch_or_a_status_not_active(
        stores: Stores) -> None:
    fleet = stores.fleet
    b = await fleet.register("b", 100, NOW)
    assert await fleet.offer("b", b.epoch - 1, offer("s1")) is False
    assert await fleet.offer("b", b.epoch + 1, offer("s1")) is False
    assert await fleet.offer("nobody", b.epoch, offer("s1")) is False
    assert await beat(stores, "b", b.epoch, MemberStatus.DRAINING) == frozenset()
    assert await fleet.offer("b", b.epoch, offer("s1")) is False  # draining takes nothing
    assert await beat(stores, "b", b.epoch, MemberStatus.DRAINING) == frozenset()
    assert [m.worker_id for m in await fleet.members()] == ["b"]  # nothing created
    c = await fleet.register("c", 100, NOW)
    (seen,) = [m for m in await fleet.members() if m.worker_id == "c"]
    fenced = await fleet.fence(seen, "a", NOW + 1)
    assert fenced is not None
    assert await fleet.offer("c", c.epoch, offer("s1")) is False  # its old epoch
    assert await fleet.offer("c", fenced.epoch, offer("s1")) is False  # DEAD


async def test_clearing_takes_off_only_the_offers_named(stores: Stores) -> None:
    fleet = stores.fleet
    b = await fleet.register("b", 100, NOW)
    for sid in ("s1", "s2", "s3"):
        assert await fleet.offer("b", b.epoch, offer(sid)) is True
    await fleet.clear_offers("b", b.epoch, [offer("s1"), offer("s3")])
    assert await beat(stores, "b", b.epoch) == frozenset({offer("s2")})
    await fleet.clear_offers("b", b.epoch, [offer("s9")])  # not there: nothing changes
    await fleet.clear_offers("b", b.epoch, [])
    assert await beat(stores, "b", b.epoch, now=NOW + 1) == frozenset({offer("s2")})
    await fleet.clear_offers("b", b.epoch - 1, [offer("s2")])  # another epoch's: no
    assert await beat(stores, "b", b.epoch, now=NOW + 2) == frozenset({offer("s2")})
    await fleet.clear_offers("b", b.epoch, [offer("s2")])
    assert await beat(stores, "b", b.epoch, now=NOW + 3) == frozenset()
    await fleet.clear_offers("b", b.epoch, [offer("s2")])  # none left: still fine
    await fleet.clear_offers("nobody", b.epoch, [offer("s2")])
    assert [m.worker_id for m in await fleet.members()] == ["b"]


async def test_a_new_incarnation_starts_with_no_offers(stores: Stores) -> None:
    """Offers made to an earlier incarnation are not the new one's: its holders have
    released (or will release) them."""
    fleet = stores.fleet
    old = await fleet.register("b", 100, NOW, incarnation="one")
    assert await fleet.offer("b", old.epoch, offer("s1")) is True
    new = await fleet.register("b", 100, NOW + 1, incarnation="two")
    assert new.offers == frozenset()
    (row,) = await fleet.members()
    assert row.offers == frozenset() and row.epoch == new.epoch
    assert await beat(stores, "b", new.epoch) == frozenset()
    assert await fleet.offer("b", old.epoch, offer("s2")) is False  # to the old one: no
    assert await fleet.offer("b", new.epoch, offer("s3")) is True
    assert await beat(stores, "b", new.epoch, now=NOW + 2) == frozenset({offer("s3")})
