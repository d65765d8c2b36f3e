"""The fleet store contract (member rows, the owner index, releases on behalf), for both
backends."""

from __future__ import annotations

from streamlease.core.lease import LeaseTimings
from streamlease.core.membership import HeartbeatOutcome, MemberStatus
from streamlease.core.model import Tenure
from streamlease.store.protocols import Heartbeat, Stores, TakeOver
from tests.store.lag import eventually

NOW = 1_800_000_000_000
T = LeaseTimings(lease_s=60.0, heartbeat_s=20.0, skew_margin_s=1.0, safety_margin_s=2.0)


async def test_register_heartbeat_and_read_every_member_in_one_query(stores: Stores) -> None:
    fleet = stores.fleet
    a = await fleet.register("a", 100, NOW)
    b = await fleet.register("b", 50, NOW)
    assert a.status is MemberStatus.ACTIVE and a.heartbeat == 0 and a.epoch > NOW
    ok = await fleet.heartbeat(Heartbeat("a", a.epoch, MemberStatus.ACTIVE, 7, 100, 1, NOW + 5))
    assert ok.outcome is HeartbeatOutcome.RENEWED and ok.heartbeat == 1
    rows = {m.worker_id: m for m in await fleet.members()}
    assert set(rows) == {"a", "b"}
    assert (rows["a"].heartbeat, rows["a"].streams, rows["a"].handoffs) == (1, 7, 1)
    assert rows["b"].capacity == 50 and rows["b"].epoch == b.epoch


async def test_a_new_incarnation_fences_the_old_one(stores: Stores) -> None:
    fleet = stores.fleet
    old = await fleet.register("a", 100, NOW)
    new = await fleet.register("a", 100, NOW + 1, MemberStatus.DRAINING)
    assert new.epoch > old.epoch and new.status is MemberStatus.DRAINING
    gone = await fleet.heartbeat(Heartbeat("a", old.epoch, MemberStatus.ACTIVE, 0, 100, 0, NOW + 2))
    assert gone.outcome is HeartbeatOutcome.FENCED
    # Deleted (a clean exit) and registered again: the epoch still moves forward.
    assert await fleet.leave("a", new.epoch) is True
    again = await fleet.register("a", 100, NOW + 1000)
    assert again.epoch > new.epoch


async def test_one_peer_fences_a_member_exactly_as_seen(stores: Stores) -> None:
    fleet = stores.fleet
    a = await fleet.register("a", 100, NOW)
    await fleet.heartbeat(Heartbeat("a", a.epoch, MemberStatus.ACTIVE, 3, 100, 0, NOW))
    (seen,) = [m for m in await fleet.members() if m.worker_id == "a"]
    fenced = await fleet.fence(seen, "b", NOW + 30_000)
    assert fenced is not None and fenced.status is MemberStatus.DEAD
    assert fenced.epoch == seen.epoch + 1 and not fenced.released
    assert await fleet.fence(seen, "c", NOW + 30_001) is None  # only one peer wins
    refused = await fleet.heartbeat(Heartbeat("a", a.epoch, MemberStatus.ACTIVE, 3, 100, 0, NOW))
    assert refused.outcome is HeartbeatOutcome.FENCED
    assert await fleet.mark_released("a", seen.epoch) is False  # the old epoch: no
    assert await fleet.mark_released("a", fenced.epoch) is True
    (row,) = [m for m in await fleet.members() if m.worker_id == "a"]
    assert row.released


async def test_a_member_that_heartbeated_meanwhile_is_not_fenced(stores: Stores) -> None:
    fleet = stores.fleet
    a = await fleet.register("a", 100, NOW)
    (seen,) = await fleet.members()
    await fleet.heartbeat(Heartbeat("a", a.epoch, MemberStatus.ACTIVE, 0, 100, 0, NOW + 1))
    assert await fleet.fence(seen, "b", NOW + 2) is None


async def test_owner_index_and_release_on_behalf_of_an_older_epoch(stores: Stores) -> None:
    leases, admin = stores.leases, stores.admin
    for sid in ("s1", "s2", "s3"):
        await admin.put_started(sid, "wss://x/")
    old_epoch, new_epoch = 10, 12
    await leases.acquire("s1", "a", NOW, T, epoch=old_epoch)
    await leases.acquire("s2", "a", NOW, T, epoch=old_epoch)
    await leases.acquire("s3", "a", NOW, T, epoch=new_epoch)  # a newer incarnation's
    # The owner index lags the acquisitions: wait for it.
    owned = await eventually(stores, lambda: leases.owned_by("a"), lambda found: len(found) == 3)
    owned = sorted(owned, key=lambda o: o.stream_id)
    assert [(o.stream_id, o.fence) for o in owned] == [("s1", 1), ("s2", 1), ("s3", 1)]
    fenced_epoch = old_epoch + 1
    results = {o.stream_id: await leases.release_for(o.stream_id, "a", o.fence, fenced_epoch)
               for o in owned}
    assert results == {"s1": True, "s2": True, "s3": False}
    s1 = await admin.get("s1")
    assert s1 is not None and (s1.lease_expires_at_ms, s1.fence, s1.lease_owner) == (0, 2, "a")
    # Conditioned on what was seen: a second release changes nothing.
    assert await leases.release_for("s1", "a", 1, fenced_epoch) is False
    assert await leases.release_for("s1", "a", 2, fenced_epoch) is False  # released already


async def test_held_stopped_finds_only_stopped_streams_still_held(stores: Stores) -> None:
    leases, admin = stores.leases, stores.admin
    for sid in ("held", "free", "running"):
        await admin.put_started(sid, "wss://x/")
    await leases.acquire("held", "a", NOW, T)
    await leases.acquire("running", "a", NOW, T)
    await admin.set_state("held", "STOPPED")
    await admin.set_state("free", "STOPPED")
    found = await eventually(stores, lambda: leases.held_stopped(NOW + 1, 100),
                             lambda found: [r.stream_id for r in found] == ["held"])
    assert found[0].lease_owner == "a" and found[0].fence == 1
    checked = await leases.check("running")
    assert checked is not None and checked.lease_owner == "a"
    assert await leases.check("missing") is None


async def test_a_row_recreated_by_a_clock_behind_still_gets_a_higher_epoch(
        stores: Stores) -> None:
    """A worker with a clock running ahead registers, is fenced, and leaves; the same id
    registers again from a machine whose clock is ten minutes behind: the epoch still
    moves forward (the deletion raised the high-water mark first)."""
    fleet = stores.fleet
    ahead, behind = NOW + 600_000, NOW - 600_000
    first = await fleet.register("a", 100, ahead)
    second = await fleet.register("a", 100, behind)  # the row exists: one up
    assert second.epoch == first.epoch + 1
    assert await fleet.leave("a", second.epoch) is True
    again = await fleet.register("a", 100, behind)
    assert again.epoch > second.epoch
    # The leader forgets a dead, released row: the same rule.
    (seen,) = [m for m in await fleet.members() if m.worker_id == "a"]
    fenced = await fleet.fence(seen, "b", behind)
    assert fenced is not None
    assert await fleet.leave("a", fenced.epoch) is True
    latest = await fleet.register("a", 100, behind - 600_000)
    assert latest.epoch > fenced.epoch
    # The high-water mark is no member; another id's new row starts above it too.
    assert [m.worker_id for m in await fleet.members()] == ["a"]
    other = await fleet.register("b", 100, behind)
    assert other.epoch > fenced.epoch


async def test_rows_name_their_incarnation_and_their_fencer(stores: Stores) -> None:
    fleet = stores.fleet
    mine = await fleet.register("a", 100, NOW, incarnation="one")
    assert mine.incarnation == "one" and mine.fenced_by is None
    (seen,) = await fleet.members()
    fenced = await fleet.fence(seen, "peer-b", NOW + 1)
    assert fenced is not None and fenced.fenced_by == "peer-b"
    theirs = await fleet.register("a", 100, NOW + 2, incarnation="two")
    (row,) = await fleet.members()
    assert (row.epoch, row.incarnation, row.fenced_by) == (theirs.epoch, "two", None)
    assert row.status is MemberStatus.ACTIVE


async def test_take_over_passes_a_dead_incarnations_stream_in_one_write(stores: Stores) -> None:
    """A survivor takes a fenced member's held stream straight over: owner, expiry and
    epoch its own, fence + 1; nothing else qualifies (released, newer incarnation,
    STOPPED, another owner), and a second survivor's write finds it gone."""
    leases, admin = stores.leases, stores.admin
    for sid in ("held", "released", "newer", "stopped", "other"):
        await admin.put_started(sid, "wss://x/")
    assert await leases.acquire("held", "a", NOW, T, epoch=5) is not None
    released = await leases.acquire("released", "a", NOW, T, epoch=5)
    assert released is not None and await leases.release(released.tenure)
    assert await leases.acquire("newer", "a", NOW, T, epoch=7) is not None  # re-registered
    assert await leases.acquire("stopped", "a", NOW, T, epoch=5) is not None
    await admin.set_state("stopped", "STOPPED")
    assert await leases.acquire("other", "z", NOW, T, epoch=5) is not None
    fenced_epoch = 6
    later = NOW + 1_000
    got = await leases.take_over(TakeOver("held", "a", fenced_epoch, "b", later, T, epoch=3))
    assert got is not None
    assert (got.tenure.owner, got.tenure.fence, got.tenure.expires_at_ms, got.tenure.epoch) == \
        ("b", 2, later + T.lease_ms, 3)
    record = await admin.get("held")
    assert record is not None and (record.lease_owner, record.fence, record.lease_epoch,
                                   record.lease_expires_at_ms) == ("b", 2, 3, later + T.lease_ms)
    for sid in ("released", "newer", "stopped", "other"):
        claim = TakeOver(sid, "a", fenced_epoch, "b", later, T, epoch=3)
        assert await leases.take_over(claim) is None, sid
    claim = TakeOver("held", "a", fenced_epoch, "c", later, T, epoch=4)
    assert await leases.take_over(claim) is None
    claim = TakeOver("missing", "a", fenced_epoch, "b", later, T, epoch=3)
    assert await leases.take_over(claim) is None
    # The holder it passed from cannot renew or release any more.
    assert await leases.release(Tenure("held", "a", 1, None, NOW + T.lease_ms)) is False


async def test_a_resent_take_over_that_applied_returns_the_tenure(stores: Stores) -> None:
    leases, admin = stores.leases, stores.admin
    await admin.put_started("s", "wss://x/")
    assert await leases.acquire("s", "a", NOW, T, epoch=5) is not None
    first = await leases.take_over(TakeOver("s", "a", 6, "b", NOW + 10, T, epoch=3))
    again = await leases.take_over(TakeOver("s", "a", 6, "b", NOW + 10, T, epoch=3))
    assert first is not None and again is not None and again.tenure == first.tenure
