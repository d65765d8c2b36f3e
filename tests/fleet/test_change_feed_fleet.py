"""The change feed with real worker processes on the embedded DynamoDB (which serves the
streams table's DynamoDB stream): the fleet leader stamps hand-written items, and holders
hear of STOPPED flips and new URLs through its notices, while every poll that could have
found them is set minutes apart; a killed leader's successor resumes from the checkpoint."""

from __future__ import annotations

import pytest

from tests.fleet.conftest import FleetFactory
from tests.fleet.harness import Fleet, wait_until

pytestmark = pytest.mark.fleet

# Every poll the feed replaces is minutes apart: each stream's read and renewal (which
# reads the item too) and the sweep (ten times less often again while the feed is live).
SLOW_POLLS = {
    "STREAMLEASE_STREAM_LEASE_SECONDS": "600",
    "STREAMLEASE_STREAM_RENEW_SECONDS": "200",
    "STREAMLEASE_STREAM_CHECK_SECONDS": "200",
    "STREAMLEASE_SWEEP_SECONDS": "45",
    # No stream changes hands for balance meanwhile: its holder is the one told.
    "STREAMLEASE_MIN_HOLD_SECONDS": "600",
}


def total(fleet: Fleet, key: str) -> float:
    return sum(w.metric(key) for w in fleet.workers.values() if w.proc.popen.poll() is None)


def feed_opened(fleet: Fleet) -> list[dict[str, object]]:
    return [e for w in fleet.workers.values() for e in w.log_events("feed.opened")]


def leader(fleet: Fleet) -> str | None:
    live = [n for n, w in fleet.workers.items() if w.proc.popen.poll() is None
            and w.metric("streamlease_is_leader") == 1]
    return live[0] if len(live) == 1 else None


async def test_the_leader_s_feed_tells_the_fleet_what_changed(make_fleet: FleetFactory) -> None:
    fleet = make_fleet(streams=6, env=SLOW_POLLS)
    await fleet.start(workers=2)
    await wait_until(fleet.all_owned, 30, "all owned")

    async def trusted() -> bool:
        return bool(feed_opened(fleet)) and \
            total(fleet, "streamlease_change_feed_live") == len(fleet.workers)
    await wait_until(trusted, 30, "every worker trusting the leader's change feed")
    assert fleet.store is not None

    # A hand-written item: stamped by the feed (the sweep is minutes away).
    await fleet.store.put_item({"Pk": {"S": "CONN#hand"}, "desired_state": {"S": "STARTED"},
                                "ws_url": {"S": fleet.stream_url("hand")}})

    async def hand_delivering() -> bool:
        return ((await fleet.records())["hand"].last_seq or 0) > 0
    await wait_until(hand_delivering, 30, "the hand-written item delivering")
    assert total(fleet, 'streamlease_change_feed_records_total{action="stamp"}') >= 1

    # A new ws_url: the holder reconnects to it (its own read is minutes away).
    records = await fleet.records()
    holder = records["s002"].lease_owner
    assert holder is not None
    await fleet.store.put_started("s002", fleet.stream_url("s002") + "?v=2")

    async def reconnected() -> bool:
        # Its holder (or, had it just been handed over, whoever took it) dials the new URL.
        return any(e["stream"] == "s002" and "v=" in str(e["url"])
                   for w in fleet.workers.values() for e in w.log_events("pump.connected"))
    try:
        await wait_until(reconnected, 30, "s002 reconnected to its new URL")
    except AssertionError:
        for name, w in fleet.workers.items():
            print(name, "\n".join(line for line in w.proc.err_lines
                                  if "s002" in line or "feed" in line or "notice" in line))
        raise

    # STOPPED: released by its holder, told by a notice.
    await fleet.store.set_state("s001", "STOPPED")

    async def released() -> bool:
        return (await fleet.records())["s001"].lease_expires_at_ms == 0
    await wait_until(released, 30, "s001 released")
    assert total(fleet, 'streamlease_notices_total{kind="check"}') >= 2
    assert total(fleet, 'streamlease_change_feed_records_total{action="stopped"}') >= 1
    assert total(fleet, 'streamlease_change_feed_records_total{action="repointed"}') >= 1
    fleet.stream_ids = [s for s in fleet.stream_ids if s != "s001"] + ["hand"]
    await fleet.audit()


async def test_a_new_leader_resumes_the_feed_from_the_checkpoint(
        make_fleet: FleetFactory) -> None:
    fleet = make_fleet(streams=4, env=SLOW_POLLS)
    await fleet.start(workers=3)
    await wait_until(fleet.all_owned, 30, "all owned")
    await wait_until(lambda: _true(leader(fleet) is not None and bool(feed_opened(fleet))), 30,
                     "a leader reading the feed")
    first = leader(fleet)
    assert first is not None and fleet.store is not None
    # A change the first leader reads and checkpoints.
    await fleet.store.put_item({"Pk": {"S": "CONN#early"}, "desired_state": {"S": "STARTED"},
                                "ws_url": {"S": fleet.stream_url("early")}})

    async def early_delivering() -> bool:
        return ((await fleet.records())["early"].last_seq or 0) > 0
    await wait_until(early_delivering, 30, "the first hand-written item delivering")
    # Changes before and after the leader dies: each is found and served.
    for i in range(3):
        await fleet.store.put_item({"Pk": {"S": f"CONN#h{i}"}, "desired_state": {"S": "STARTED"},
                                    "ws_url": {"S": fleet.stream_url(f"h{i}")}})
    fleet.workers[first].proc.kill()
    for i in range(3, 6):
        await fleet.store.put_item({"Pk": {"S": f"CONN#h{i}"}, "desired_state": {"S": "STARTED"},
                                    "ws_url": {"S": fleet.stream_url(f"h{i}")}})
    hand = ["early"] + [f"h{i}" for i in range(6)]

    async def all_delivering() -> bool:
        records = await fleet.records()
        return all((records[s].last_seq or 0) > 0 for s in hand)
    await wait_until(all_delivering, 60, "every hand-written item delivering")

    async def succeeded() -> bool:
        now = leader(fleet)
        return now is not None and bool(fleet.workers[now].log_events("feed.opened"))
    await wait_until(succeeded, 30, "a successor reading the feed")
    successor = leader(fleet)
    assert successor is not None and successor != first
    opened = fleet.workers[successor].log_events("feed.opened")
    assert opened and int(str(opened[-1]["resumed"])) >= 1, opened
    fleet.stream_ids += hand
    await fleet.audit()


async def _true(value: bool) -> bool:
    return value
