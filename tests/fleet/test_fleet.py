"""Fleet behaviour with real processes: 3 workers, 20 streams, sub-second leases, the
embedded DynamoDB over HTTP, the reference upstream, real signals, and an audit of the
sink at the end of every scenario."""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import pathlib
import re
import signal
import threading
import time

import pytest

from loadtest.fleet import FAKETIME_ENV, faketime_library
from streamlease.errors import StoreError
from tests.fleet.conftest import FleetFactory
from tests.fleet.harness import FAST_ENV, Fleet, HoldingProxy, wait_until

pytestmark = pytest.mark.fleet

LEASE = float(FAST_ENV["STREAMLEASE_LEASE_SECONDS"])
RECONCILE = float(FAST_ENV["STREAMLEASE_RECONCILE_SECONDS"])
SKEW = float(FAST_ENV["STREAMLEASE_SKEW_MARGIN_SECONDS"])
HEARTBEAT = float(FAST_ENV["STREAMLEASE_HEARTBEAT_SECONDS"])
STREAM_LEASE = float(FAST_ENV["STREAMLEASE_STREAM_LEASE_SECONDS"])
STREAM_RENEW = float(FAST_ENV["STREAMLEASE_STREAM_RENEW_SECONDS"])


async def delivering(fleet: object, ids: list[str], beyond: dict[str, int]) -> bool:
    records = await fleet.records()  # type: ignore[attr-defined]
    return all((records[s].last_seq or 0) > beyond.get(s, 0) for s in ids)


async def test_every_stream_has_exactly_one_owner_and_kill_9_fails_over(
        make_fleet: FleetFactory) -> None:
    fleet = await make_fleet(streams=20).start(workers=3)
    await wait_until(fleet.all_owned, 30, "all 20 streams owned")
    await wait_until(lambda: delivering(fleet, fleet.stream_ids, {}), 30, "all delivering")

    async def one_owner_each() -> bool:
        held = sum(w.metric("streamlease_leases_held") for w in fleet.workers.values())
        return held == 20 and await fleet.all_owned()
    await wait_until(one_owner_each, 10, "leases_held summed over workers == 20")

    async def fleet_view_settled() -> bool:
        # One leader; it alone publishes the fleet view (others expose no such series).
        key = 'streamlease_streams{desired_state="STARTED",lease="live"}'
        leaders = [w for w in fleet.workers.values() if w.metric("streamlease_is_leader") == 1]
        return len(leaders) == 1 and leaders[0].metric(key) == 20 and all(
            key not in w.metrics() for w in fleet.workers.values() if w is not leaders[0])
    await wait_until(fleet_view_settled, 15, "one leader whose fleet view shows 20 live")
    # Workers started together spread the streams evenly, whoever came first.
    await wait_until(fleet.balanced, 20, "7/7/6 within one of the share")
    owners = await fleet.owners()

    victim = max(fleet.workers, key=lambda n: sum(o == n for o in owners.values()))
    before = {s: r.last_seq or 0 for s, r in (await fleet.records()).items()}
    survivors = set(fleet.workers) - {victim}
    acquired_before = {n: fleet.workers[n].metric("streamlease_lease_acquired_total")
                       for n in survivors}
    # Frozen first, so what it holds is read while it can no longer hand a stream over
    # (member rows lag a heartbeat, so a fleet balanced by the table's count may still
    # make one graceful move); it stops heartbeating here, so the clock starts here.
    fleet.workers[victim].proc.signal(signal.SIGSTOP)
    killed_at = time.monotonic()
    victim_streams = [s for s, o in (await fleet.owners()).items() if o == victim]
    assert victim_streams
    fleet.workers[victim].proc.kill()
    await wait_until(lambda: fleet.all_owned(by=survivors, ids=victim_streams), 30,
                     "the victim's streams taken over")
    taken = time.monotonic() - killed_at
    await wait_until(lambda: delivering(fleet, victim_streams, before), 30,
                     "the victim's streams delivering again")
    resumed = time.monotonic() - killed_at
    bound = LEASE + RECONCILE * 1.2 + SKEW
    print(f"kill -9 failover: {len(victim_streams)} streams taken over in {taken:.2f} s "
          f"(bound {bound:.2f} s), delivering again after {resumed:.2f} s")
    # The speed is the load test's figure (failover.kill9); what holds here is the path:
    # taken over before any of its stream leases (renewed at most a renew interval ago)
    # could have run out, so by the membership, not by stream-lease expiry.
    assert taken < STREAM_LEASE - STREAM_RENEW

    def total(name: str) -> float:
        return sum(fleet.workers[n].metric(name) for n in survivors)

    async def counted() -> bool:
        # The table shows a move a moment before the taker's counters do.
        moved = total("streamlease_lease_acquired_total") - sum(acquired_before.values())
        return (moved >= len(victim_streams)
                and total("streamlease_members_declared_dead_total") >= 1
                and total("streamlease_dead_streams_taken_total")
                + total("streamlease_releases_on_behalf_total") >= len(victim_streams))
    # Found dead by observation, fenced once, its streams taken straight over by the
    # survivors (what a survivor's lagging view left out, released on its behalf).
    await wait_until(counted, 10, "survivors' counters showing the takeover")
    assert total("streamlease_members_declared_dead_total") == 1
    assert total("streamlease_dead_streams_taken_total") >= 1
    await fleet.audit()


async def test_only_the_leader_reads_every_row_and_its_death_is_seen_by_the_others(
        make_fleet: FleetFactory) -> None:
    """The others read only the leader's row (its bulletin). Killed, the leader is seen
    dead by them as any member would be by it: fenced once, its streams served again, and
    a new leader's bulletin read by the rest."""
    fleet = await make_fleet(streams=12).start(workers=4)
    await wait_until(fleet.all_owned, 30, "all 12 streams owned")

    def leaders() -> list[str]:
        return [n for n, w in fleet.workers.items()
                if w.proc.popen.poll() is None and w.metric("streamlease_is_leader") == 1]

    async def one_leader(among: set[str]) -> bool:
        found = leaders()
        return len(found) == 1 and found[0] in among

    async def reading_the_bulletin(names: set[str]) -> bool:
        return all(fleet.workers[n].metric("streamlease_member_rows_read") == 1 for n in names)

    await wait_until(lambda: one_leader(set(fleet.workers)), 15, "one leader")
    [leader] = leaders()
    others = set(fleet.workers) - {leader}
    await wait_until(lambda: reading_the_bulletin(others), 15,
                     "every other worker reading the leader's row only")
    assert fleet.workers[leader].metric("streamlease_member_rows_read") == 4
    before = {s: r.last_seq or 0 for s, r in (await fleet.records()).items()}
    fleet.workers[leader].proc.signal(signal.SIGSTOP)
    victim_streams = [s for s, o in (await fleet.owners()).items() if o == leader]
    fleet.workers[leader].proc.kill()
    await wait_until(lambda: fleet.all_owned(by=others), 30, "the leader's streams taken over")
    await wait_until(lambda: delivering(fleet, victim_streams, before), 30,
                     "the leader's streams delivering again")
    await wait_until(lambda: one_leader(others), 15, "a new leader")
    [new_leader] = leaders()
    await wait_until(lambda: reading_the_bulletin(others - {new_leader}), 15,
                     "the rest reading the new leader's row only")
    assert sum(fleet.workers[n].metric("streamlease_members_declared_dead_total")
               for n in others) == 1
    await fleet.audit()


async def test_sigterm_hands_over_well_before_the_lease_would_expire(
        make_fleet: FleetFactory) -> None:
    # A long lease makes "well before expiry" visible: the hand-over must not wait for it.
    fleet = make_fleet(streams=12, env={"STREAMLEASE_LEASE_SECONDS": "8",
                                        "STREAMLEASE_HEARTBEAT_SECONDS": "1",
                                        "STREAMLEASE_SAFETY_MARGIN_SECONDS": "0.5",
                                        "STREAMLEASE_STREAM_LEASE_SECONDS": "30",
                                        "STREAMLEASE_STREAM_RENEW_SECONDS": "10"})
    await fleet.start(workers=3)
    await wait_until(fleet.all_owned, 30, "all streams owned")
    owners = await fleet.owners()
    victim = max(fleet.workers, key=lambda n: sum(o == n for o in owners.values()))
    victim_streams = [s for s, o in owners.items() if o == victim]
    assert victim_streams
    before = {s: r.last_seq or 0 for s, r in (await fleet.records()).items()}
    survivors = set(fleet.workers) - {victim}
    fleet.workers[victim].proc.signal(signal.SIGTERM)
    sent_at = time.monotonic()
    assert fleet.workers[victim].proc.wait(timeout=10) == 0

    async def handed_over() -> bool:
        return (await fleet.all_owned(by=survivors, ids=victim_streams)
                and await delivering(fleet, victim_streams, before))
    await wait_until(handed_over, 30, "SIGTERM'd worker's streams taken over")
    handover = time.monotonic() - sent_at
    print(f"SIGTERM hand-over: {len(victim_streams)} streams in {handover:.2f} s (lease 8 s)")
    assert handover < 8 / 2
    # Each stream went to a peer with room straight from the victim (make before break)
    # or, its offer not taken in time, was released.
    ended = fleet.workers[victim].log_events("lease.released") + \
        fleet.workers[victim].log_events("lease.handed_over")
    acquired = {n: sorted(str(r["stream"]) for r in w.log_events("lease.acquired"))
                for n, w in fleet.workers.items()}
    # What the victim held, by its own log (the table read before the signal may lag a
    # start-up acquisition or two).
    held = sorted(str(r["stream"]) for r in fleet.workers[victim].log_events("lease.acquired"))
    assert sorted(str(r["stream"]) for r in ended) == held, (
        f"victim {victim}; owners before SIGTERM {owners}; acquired per worker {acquired}; "
        f"victim's log {fleet.workers[victim].proc.err_lines[-30:]}")
    assert all(r["reason"] == "shutdown" for r in ended)
    assert not fleet.workers[victim].log_events("lease.lost")
    await fleet.audit()


async def pause_scenario(make_fleet: FleetFactory, batch_in_flight: bool) -> dict[str, float]:
    """Stop the holder past its lease, let another worker take over and write, resume it."""
    fleet = make_fleet(streams=3, rate=20)
    await fleet.start(workers=0)
    proxy = HoldingProxy(int(fleet.dynamodb.rsplit(":", 1)[1]))
    try:
        old = fleet.start_worker("old", endpoint=proxy.endpoint)
        await wait_until(lambda: fleet.all_owned(by={"old"}), 30, "old holds every stream")
        await wait_until(lambda: delivering(fleet, fleet.stream_ids, {}), 30, "delivering")
        new = fleet.start_worker("new")
        await wait_until(lambda: asyncio.sleep(0, bool(new.proc.err_lines)), 30, "new is up")
        if batch_in_flight:
            proxy.hold()
            await wait_until(lambda: asyncio.sleep(0, b"TransactWriteItems" in proxy.held_bytes()),
                             10, "a sink write in flight")
        old.proc.signal(signal.SIGSTOP)
        before = {s: r.last_seq or 0 for s, r in (await fleet.records()).items()}
        await wait_until(lambda: fleet.all_owned(by={"new"}), 30, "new took over")
        await wait_until(lambda: delivering(fleet, fleet.stream_ids, before), 30, "new writes")
        proxy.release()  # the old holder's write reaches DynamoDB only now
        old.proc.signal(signal.SIGCONT)

        async def old_stopped() -> bool:
            return old.metric("streamlease_leases_held") == 0
        await wait_until(old_stopped, 30, "old holder stopped its streams")
        records = await fleet.records()
        assert all(r.lease_owner == "new" for r in records.values())
        mid = {s: r.last_seq or 0 for s, r in records.items()}
        await wait_until(lambda: delivering(fleet, fleet.stream_ids, mid), 30, "still delivering")
        await fleet.audit()
        return old.metrics()
    finally:
        proxy.release()
        proxy.close()


async def test_paused_holder_self_fences_on_its_local_deadline(make_fleet: FleetFactory) -> None:
    metrics = await pause_scenario(make_fleet, batch_in_flight=False)
    # On waking, its own membership deadline has passed (it self-fences before any
    # write), or it finds its epoch moved on; either way nothing stale reaches the sink.
    stopped = metrics['streamlease_lease_lost_total{reason="member_deadline"}'] + \
        metrics['streamlease_lease_lost_total{reason="member_fenced"}']
    assert stopped >= 1, "with nothing in flight the holder stops itself before writing"
    assert metrics["streamlease_member_fenced_total"] == 1  # then it registers afresh


async def test_paused_holder_with_a_batch_in_flight_is_rejected_by_the_sink(
        make_fleet: FleetFactory) -> None:
    metrics = await pause_scenario(make_fleet, batch_in_flight=True)
    assert metrics["streamlease_stale_writes_rejected_total"] >= 1


async def test_stopped_stream_is_released_within_a_heartbeat_and_resumes(
        make_fleet: FleetFactory) -> None:
    fleet = make_fleet(streams=6)
    await fleet.start(workers=2)
    await wait_until(fleet.all_owned, 30, "all owned")
    assert fleet.store is not None
    await fleet.store.set_state("s001", "STOPPED")
    flipped = time.monotonic()

    async def released() -> bool:
        r = (await fleet.records())["s001"]
        return r.lease_expires_at_ms == 0
    took = await wait_until(released, 10, "s001 released")
    print(f"STOPPED -> released in {time.monotonic() - flipped:.2f} s")
    assert took <= HEARTBEAT + 2
    stopped_at = (await fleet.records())["s001"].last_seq or 0
    # Nobody picks a STOPPED stream up again.
    await asyncio.sleep(RECONCILE * 3)
    record = (await fleet.records())["s001"]
    assert record.lease_expires_at_ms == 0 and (record.last_seq or 0) == stopped_at
    await fleet.store.set_state("s001", "STARTED")
    await wait_until(lambda: delivering(fleet, ["s001"], {"s001": stopped_at}), 15, "resumed")
    await fleet.audit()


async def test_upstream_drops_reconnect_and_resume_without_a_gap(
        make_fleet: FleetFactory) -> None:
    fleet = make_fleet(streams=4, rate=30)
    await fleet.start(workers=2)
    await wait_until(fleet.all_owned, 30, "all owned")
    await wait_until(lambda: delivering(fleet, fleet.stream_ids, {}), 15, "delivering")
    total_dropped = 0

    async def all_connected() -> bool:
        streams = fleet.control("/stats")["streams"]
        assert isinstance(streams, dict)
        return all(streams[s]["connections"] >= 1 for s in fleet.stream_ids)
    for _ in range(3):
        await wait_until(all_connected, 15, "every stream connected upstream")
        dropped = fleet.control("/control/drop")["dropped"]
        assert dropped == len(fleet.stream_ids)
        total_dropped += dropped
        await wait_until(all_connected, 15, "every stream reconnected")
        after = {s: r.last_seq or 0 for s, r in (await fleet.records()).items()}
        await wait_until(lambda a=after: delivering(fleet, fleet.stream_ids, a), 15,
                         "delivering after the drop")
    reconnects = sum(
        w.metric('streamlease_upstream_reconnects_total{reason="closed"}')
        + w.metric('streamlease_upstream_reconnects_total{reason="error"}')
        for w in fleet.workers.values())
    assert reconnects >= total_dropped >= 3
    assert sum(w.metric("streamlease_sequence_gaps_total") for w in fleet.workers.values()) == 0
    await fleet.audit()


async def test_hostile_frames_are_counted_and_dropped(make_fleet: FleetFactory) -> None:
    fleet = make_fleet(streams=2, rate=20)
    await fleet.start(workers=1)
    await wait_until(fleet.all_owned, 30, "all owned")
    for kind in ("notjson", "noseq", "badseq", "binary", "array"):
        fleet.control(f"/control/malformed?stream=s001&count=2&kind={kind}")
    worker = fleet.workers["w1"]

    async def counted() -> bool:
        return worker.metric("streamlease_malformed_frames_total") >= 10
    await wait_until(counted, 15, "10 malformed frames counted")
    assert worker.log_events("pump.malformed_frame")
    mid = {s: r.last_seq or 0 for s, r in (await fleet.records()).items()}
    await wait_until(lambda: delivering(fleet, fleet.stream_ids, mid), 15, "still delivering")
    await fleet.audit()


async def test_hand_written_item_is_picked_up_and_bad_items_are_skipped(
        make_fleet: FleetFactory) -> None:
    fleet = make_fleet(streams=3)
    await fleet.start(workers=2)
    await wait_until(fleet.all_owned, 30, "all owned")
    assert fleet.store is not None
    admin = fleet.store
    hand = {"Pk": {"S": "CONN#hand"}, "desired_state": {"S": "STARTED"},
            "ws_url": {"S": fleet.stream_url("hand")}}
    bad_items = {
        "nourl": {"Pk": {"S": "CONN#nourl"}, "desired_state": {"S": "STARTED"}},
        "evil": {"Pk": {"S": "CONN#evil"}, "desired_state": {"S": "STARTED"},
                 "ws_url": {"S": "ws://user:hunter2@evil.example.com/x?token=s3cret"}},
        "weird": {"Pk": {"S": "CONN#weird"}, "desired_state": {"S": "RUNNING"},
                  "ws_url": {"S": fleet.stream_url("weird")}},
        "badseq": {"Pk": {"S": "CONN#badseq"}, "desired_state": {"S": "STARTED"},
                   "ws_url": {"S": fleet.stream_url("badseq")}, "last_seq": {"S": "seven"},
                   "lease_expires_at_ms": {"N": "0"}},
    }
    # A wrongly typed index key (desired_state, lease_expires_at_ms, lease_owner, fence)
    # cannot even be written: DynamoDB, and the embedded server, refuse it.
    with pytest.raises(StoreError, match="Type mismatch for Index Key fence"):
        await admin.put_item({"Pk": {"S": "CONN#badfence"}, "desired_state": {"S": "STARTED"},
                              "ws_url": {"S": fleet.stream_url("badfence")},
                              "fence": {"S": "seven"}})
    # Served, with a secret in its query string that must never reach a log line.
    secret = {"Pk": {"S": "CONN#tok"}, "desired_state": {"S": "STARTED"},
              "ws_url": {"S": fleet.stream_url("tok") + "?token=t0ps3cret&x=1"}}
    for item in (hand, secret, *bad_items.values()):
        await admin.put_item(item)
    written = time.monotonic()

    async def hand_delivering() -> bool:
        r = (await fleet.records())["hand"]
        return (r.last_seq or 0) > 0
    await wait_until(hand_delivering, 60, "the hand-written item started")
    print(f"hand-written item delivering after {time.monotonic() - written:.2f} s")

    async def errors_recorded() -> bool:
        records = await fleet.records()
        return all(records[s].last_error for s in bad_items)
    await wait_until(errors_recorded, 30, "last_error on every bad item")
    records = await fleet.records()
    assert "missing" in (records["nourl"].last_error or "")
    assert "user info" in (records["evil"].last_error or "")
    assert "RUNNING" in (records["weird"].last_error or "")
    assert "last_seq is not a whole number" in (records["badseq"].last_error or "")
    for sid in bad_items:
        assert records[sid].lease_owner is None and records[sid].last_seq is None
    assert sum(w.metric('streamlease_bad_items_total{reason="bad_url"}')
               + w.metric('streamlease_bad_items_total{reason="bad_state"}')
               for w in fleet.workers.values()) >= len(bad_items)
    await wait_until(lambda: delivering(fleet, ["tok"], {}), 30, "the stream with a token")
    for worker in fleet.workers.values():
        logs = "\n".join(worker.proc.err_lines)
        assert "hunter2" not in logs and "s3cret" not in logs and "t0ps3cret" not in logs
        for connected in worker.log_events("pump.connected"):
            if connected["stream"] == "tok":
                assert re.search(r"\?token=\*\*\*&x=\*\*\*&from_seq=\d+$", str(connected["url"]))
        # One JSON object a line, each naming the worker and the event; stream events
        # name the stream and fence.
        for line in worker.proc.err_lines:
            record = json.loads(line)
            assert record["worker"] == worker.name and record["event"]
            if record["event"].startswith(("lease.", "pump.")):
                assert "stream" in record and "fence" in record, record
    fleet.stream_ids.extend(["hand", "tok"])
    mid = {s: r.last_seq or 0 for s, r in records.items()}
    await wait_until(lambda: delivering(fleet, fleet.stream_ids, mid), 15, "all still delivering")
    await fleet.audit()


async def test_scale_out_spreads_the_streams_and_then_nothing_moves(
        make_fleet: FleetFactory) -> None:
    fleet = make_fleet(streams=20)
    await fleet.start(workers=2)
    await wait_until(lambda: settled(fleet), 30, "10/10 on two workers, settled")
    moved_before = sum(w.metric("streamlease_rebalance_moves_total")
                       for w in fleet.workers.values())
    disturbed = fleet.disturbances()
    fleet.start_worker("w3")
    fleet.start_worker("w4")
    took = await wait_until(fleet.balanced, 30, "5 each within one on four workers")
    print(f"2 -> 4 workers: within one of the share after {took:.2f} s")
    # Deadlines, not expectations: a loaded machine whose store stalls a member past its
    # deadline makes it self-fence and re-take streams, and the fleet settles again after.
    await wait_until(lambda: settled(fleet), 30, "settled on four workers")
    moved = sum(w.metric("streamlease_rebalance_moves_total")
                for w in fleet.workers.values()) - moved_before
    # 10 should move (fewer if a stream changed hands another way meanwhile); never many
    # more, unless a member stalled on this loaded machine and was fenced (membership
    # changed, and the fleet rebalanced after it). Members plan from the leader's
    # bulletin, which shows a hand-over a relay (the leader's read, then theirs) after the
    # rows did: one more move than that allowed for (13 of 12) was seen once in CI.
    if fleet.disturbances() == disturbed:
        assert moved <= 10 + 3
    else:
        print(f"{moved} rebalance moves; a member was fenced meanwhile")
    # In balance, it stays put: no move while membership and streams stay the same.
    disturbed = fleet.disturbances()
    assert await fleet.quiet_moves(5.0) == 0
    if fleet.disturbances() == disturbed:
        assert sum(w.metric("streamlease_rebalance_moves_total")
                   for w in fleet.workers.values()) - moved_before == moved
    await fleet.audit()


async def settled(fleet: Fleet) -> bool:
    """Balanced, and still so a second later with the same owners (hand-overs decided
    just before balance was reached have landed)."""
    if not await fleet.balanced():
        return False
    before = await fleet.owners()
    await asyncio.sleep(1.0)
    return await fleet.balanced() and await fleet.owners() == before


# REQUIRE_FAKETIME (`make test` where it can install the package): fail, not skip.
@pytest.mark.skipif(faketime_library() is None and not os.environ.get("REQUIRE_FAKETIME"),
                    reason="needs libfaketime (Debian package faketime; `make test` installs it "
                           "as root on Debian)")
async def test_a_worker_whose_clock_is_two_leases_behind_is_never_taken_over(
        make_fleet: FleetFactory) -> None:
    lib = faketime_library()
    assert lib is not None, "libfaketime is missing: `make test` installs Debian's faketime"
    # Liveness is observed on each peer's own clock, so a wall clock 2 s behind (twice
    # the 1 s lease) must not make a live member look dead, nor its streams expired.
    # libfaketime is preloaded into the worker itself: the `faketime` wrapper forks, and
    # stopping the wrapper would leave the worker running after the test.
    fleet = make_fleet(streams=12)
    await fleet.start(workers=2)
    late = fleet.start_worker("late", env={
        "LD_PRELOAD": lib, "FAKETIME": "-2s", **FAKETIME_ENV})
    first = late.proc.wait_for_line('{"ts"', timeout=30, stderr=True)
    stamped = json.loads(first)["ts"].replace("Z", "+00:00")
    behind = time.time() - datetime.datetime.fromisoformat(stamped).timestamp()
    assert behind >= 1.5, f"the late worker's clock is only {behind:.2f} s behind"
    await wait_until(lambda: settled(fleet), 30, "balanced with the late worker")
    counts = await fleet.counts()
    assert counts["late"] >= 3
    moves = await fleet.quiet_moves(8.0)
    assert moves == 0, "streams changed hands among live workers"
    dead = sum(w.metric("streamlease_members_declared_dead_total")
               for w in fleet.workers.values())
    assert dead == 0
    assert late.metric("streamlease_member_fenced_total") == 0
    await fleet.audit()


async def test_a_scrape_waits_for_a_worker_still_starting(make_fleet: FleetFactory,
                                                          tmp_path: pathlib.Path) -> None:
    """The harness itself: a worker that is not listening yet (still importing, on a
    loaded machine) is waited for, not reported as a refused scrape."""
    fleet = make_fleet(streams=2)
    await fleet.start(workers=1)
    gate = tmp_path / "go"
    # The worker's command runs only once the gate file exists.
    slow = fleet.start_worker("slow", wrap=[
        "sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.05; done; exec "$@"', str(gate)])
    opened = threading.Timer(1.0, gate.touch)
    opened.start()
    try:
        assert "streamlease_is_leader" in slow.metrics()
        # Answered only after the gate opened, yet no scrape was refused.
        assert slow.served and opened.finished.is_set()
    finally:
        opened.cancel()
    await wait_until(fleet.all_owned, 30, "all owned")
    await fleet.audit()
