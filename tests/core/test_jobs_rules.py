"""Schedules, slots and which due slots a leader runs (pure), and how stored job items
are read: a hand-edited item that cannot run says why instead of vanishing."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from streamlease.core.jobs import (
    MAX_CATCH_UP,
    Job,
    UnreadableJob,
    due_slots,
    keep_tail,
    takeover_grace_ms,
)
from streamlease.core.membership import MemberTimings
from streamlease.core.schedule import (
    Schedule,
    checked,
    parse_cron,
    parse_every,
    slot_ms,
    slot_name,
)
from streamlease.store import fleetcodec

BASE = int(datetime(2026, 12, 1, tzinfo=UTC).timestamp() * 1000)
MIN = 60_000


def every(seconds: float, catch_up: bool = False, updated: int = 0) -> Job:
    return Job("j", Schedule(every_ms=int(seconds * 1000)), "true", catch_up=catch_up,
               updated_at_ms=updated)


# -- schedules -------------------------------------------------------------------------


def test_interval_slots_align_to_the_epoch_so_every_leader_names_them_alike() -> None:
    schedule = parse_every("30s")
    assert schedule.slots_between(BASE + 1, BASE + 95_000) == [BASE + 30_000, BASE + 60_000,
                                                              BASE + 90_000]
    assert schedule.next_slot(BASE + 29_999) == BASE + 30_000
    assert schedule.next_slot(BASE + 30_000) == BASE + 60_000


def test_cron_slots_are_its_instants_in_utc() -> None:
    schedule = parse_cron("*/5  *  * * *")  # extra spaces are fine
    assert schedule.cron == "*/5 * * * *"
    got = schedule.slots_between(BASE, BASE + 20 * MIN)
    assert got == [BASE + 5 * MIN, BASE + 10 * MIN, BASE + 15 * MIN, BASE + 20 * MIN]
    assert schedule.next_slot(BASE + 20 * MIN) == BASE + 25 * MIN
    assert parse_cron("15 2 * * *").next_slot(BASE) == BASE + (2 * 60 + 15) * MIN


@pytest.mark.parametrize("schedule", [parse_every("1s"), parse_cron("* * * * *")])
def test_a_long_gap_yields_only_the_latest_slots(schedule: Schedule) -> None:
    year_later = BASE + 366 * 86_400_000
    got = schedule.slots_between(BASE, year_later, limit=MAX_CATCH_UP)
    assert len(got) == MAX_CATCH_UP and got == sorted(got)
    assert got[-1] <= year_later and schedule.next_slot(got[-1]) > year_later


def test_slot_names_sort_in_time_and_round_trip() -> None:
    # Every slot is whole seconds (run records are sorted by name).
    slots = [BASE, BASE + 1000, BASE + 59_000, BASE + 86_400_000, BASE + 400 * 86_400_000]
    names = [slot_name(s) for s in slots]
    assert names[0] == "2026-12-01T00:00:00Z" and names[1] == "2026-12-01T00:00:01Z"
    assert sorted(names) == names
    assert [slot_ms(n) for n in names] == slots
    assert slot_ms(slot_name(BASE + 1)) == BASE + 1  # read back, should one have ms


@pytest.mark.parametrize("text", ["1500ms", "2.5s", "0.5", "999ms"])
def test_intervals_are_whole_seconds(text: str) -> None:
    with pytest.raises(ValueError):
        parse_every(text)
    assert parse_every("2000ms").every_ms == 2000 and parse_every("1.5m").every_ms == 90_000


@pytest.mark.parametrize(("cron", "every_ms", "named"), [
    ("61 * * * *", None, "does not parse"),
    ("* * * *", None, "five fields"),
    (None, 0, "between"),
    (None, 999, "between"),
    (None, 1500, "whole seconds"),
    (None, 367 * 86_400_000, "between"),
    (None, None, "exactly one"),
    ("* * * * *", 60_000, "exactly one"),
])
def test_a_stored_schedule_is_held_to_the_input_rules(cron: str | None, every_ms: int | None,
                                                      named: str) -> None:
    with pytest.raises(ValueError, match=named):
        checked(cron, every_ms)


# -- which slots run ---------------------------------------------------------------------


def test_a_slot_due_while_leading_runs_and_the_next_waits_for_its_time() -> None:
    job = every(10)
    run, skipped = due_slots(job, BASE + 10_500, BASE, leader_since_ms=BASE - 60_000,
                             grace_ms=2000)
    assert (run, skipped) == ([BASE + 10_000], [])
    assert due_slots(job, BASE + 9_999, BASE, BASE - 60_000, 2000) == ([], [])


def test_a_slot_due_in_the_hand_over_gap_runs_late_and_older_ones_are_skipped() -> None:
    job = every(1)
    leader_since = BASE + 10_000
    # The last run was at BASE; the new leader took over 10 s later with a 2 s grace.
    run, skipped = due_slots(job, leader_since + 300, BASE, leader_since, grace_ms=2000)
    assert run == [leader_since]  # the latest; 8 000 and 9 000 came due within the grace too
    assert skipped == [BASE + i * 1000 for i in range(1, 10)]


@pytest.mark.parametrize("timings", [
    MemberTimings(20, 5, 2),  # the defaults
    MemberTimings(1, 0.3, 0.1),
    MemberTimings(60, 2, 6),  # a long lease: observed every heartbeat/2
    MemberTimings(8, 2.5, 0.8),  # lease/8 = 1 s < heartbeat/2
], ids=["defaults", "short", "long-lease", "observe-by-lease"])
def test_a_slot_due_just_after_a_dead_leaders_last_renewal_still_runs(
        timings: MemberTimings) -> None:
    """The old leader renewed at ``last_renewal`` and died; the slot came due a moment later.
    The successor first receives that renewal up to one acquisition period (observation
    interval +10 % jitter) later, takes the lease once a read sent a full lease after that
    still shows it — up to one more period — and only then starts running jobs."""
    period = 1.1 * timings.observe_s
    slot = BASE + 5 * MIN  # a slot of the five-minutely job below
    last_renewal = slot - 1_000
    job = every(300)  # the slot before it ran under the old leader
    worst = timings.lease_s + 2 * period
    for took_s in (timings.lease_s, (timings.lease_s + worst) / 2, worst):
        leader_since = last_renewal + round(took_s * 1000)
        grace = takeover_grace_ms(timings.lease_s, timings.heartbeat_s)
        run, skipped = due_slots(job, leader_since + 50, slot - 5 * MIN, leader_since, grace)
        assert (run, skipped) == ([slot], []), took_s
    # The rule keeps 0.9 heartbeat over that worst case for the calls and clock skew.
    assert grace / 1000 >= worst + 0.9 * timings.heartbeat_s - 1e-9


@pytest.mark.parametrize("timings", [
    MemberTimings(5, 1.25, 0.5),  # the defaults
    MemberTimings(1, 0.25, 0.1),  # the fleet tests'
    MemberTimings(20, 5, 2),
], ids=["defaults", "short", "long"])
def test_a_slot_due_just_after_the_last_renewal_runs_when_the_successor_died_too(
        timings: MemberTimings) -> None:
    """The leader and its successor died together. The leader's row beat last up to a
    heartbeat after the lease's last renewal; another member, reading that row every
    interval (+10 %), finds its counter standing still ``still`` later, then campaigns at
    full pace: it receives the lease within a period and takes it a lease and a period
    after that. The slot due just after the last renewal still runs."""
    still = max(2 * timings.heartbeat_s, 2.5, 2 * timings.observe_s)  # leader_still_s
    period = 1.1 * timings.observe_s
    slot = BASE + 5 * MIN
    last_renewal = slot - 1_000
    worst = timings.heartbeat_s + period + still + timings.lease_s + 2 * period
    grace = takeover_grace_ms(timings.lease_s, timings.heartbeat_s, still)
    assert grace == math.ceil(1000 * (timings.lease_s + still + 3 * timings.heartbeat_s))
    assert grace > takeover_grace_ms(timings.lease_s, timings.heartbeat_s)
    leader_since = last_renewal + round(worst * 1000)
    assert due_slots(every(300), leader_since + 50, slot - 5 * MIN, leader_since,
                     grace) == ([slot], [])


def test_a_grace_of_one_lease_skipped_the_slot_a_takeover_missed() -> None:
    """What the runner used before (grace = one lease): the slot, due 1 s after the dead
    leader's last renewal, fell outside it once the takeover took longer than a lease + 1 s
    (it does: a lease plus up to two acquisition periods)."""
    timings = MemberTimings(20, 5, 2)
    slot = BASE + MIN  # a slot of the minutely job below
    last_renewal = slot - 1_000
    leader_since = last_renewal + round((timings.lease_s + 2.2 * timings.observe_s) * 1000)
    assert due_slots(every(60), leader_since + 50, slot - 60_000, leader_since,
                     grace_ms=20_000) == ([], [slot])
    assert due_slots(every(60), leader_since + 50, slot - 60_000, leader_since,
                     grace_ms=takeover_grace_ms(20, 5)) == ([slot], [])


def test_a_slot_due_before_the_takeover_window_is_still_skipped() -> None:
    """The window is a takeover, not a catch-up: a slot that came due longer before the
    new leader took over than a whole takeover (no leader anywhere) is skipped."""
    grace = takeover_grace_ms(20, 5)
    assert grace == 30_000
    slot = BASE + MIN
    leader_since = slot + grace + 1_000
    job = every(60)
    assert due_slots(job, leader_since + 50, slot - 60_000, leader_since, grace) == ([], [slot])


def test_slots_that_came_due_during_a_long_run_collapse_to_the_latest() -> None:
    job = every(2)
    # The run for BASE took 7 s; slots 2, 4 and 6 came due meanwhile, while leading.
    run, skipped = due_slots(job, BASE + 7_000, BASE, BASE - 60_000, 2000)
    assert run == [BASE + 6_000] and skipped == [BASE + 2_000, BASE + 4_000]


def test_catch_up_runs_every_missed_slot_oldest_first_at_most_a_hundred() -> None:
    job = every(60, catch_up=True)
    run, skipped = due_slots(job, BASE + 5 * MIN, BASE, BASE + 5 * MIN, 2000)
    assert run == [BASE + i * MIN for i in range(1, 6)] and skipped == []
    run, _ = due_slots(job, BASE + 500 * MIN, BASE, BASE + 500 * MIN, 2000)
    assert len(run) == MAX_CATCH_UP and run[-1] == BASE + 500 * MIN


def test_without_a_run_record_slots_count_from_the_later_of_lease_and_job_change() -> None:
    leader_since = BASE + 100_000
    fresh = every(1, updated=BASE + 99_500)
    run, skipped = due_slots(fresh, BASE + 100_000, None, leader_since, grace_ms=2000)
    assert run == [BASE + 100_000] and skipped == []
    old = every(1, updated=0)
    run, skipped = due_slots(old, BASE + 100_000, None, leader_since, grace_ms=2000)
    assert run == [BASE + 100_000] and skipped == [BASE + 98_000, BASE + 99_000]


def test_the_output_tail_keeps_the_last_bytes() -> None:
    tail = b""
    for chunk in (b"a" * 3000, b"b" * 3000, b"THE END"):
        tail = keep_tail(tail, chunk, limit=4096)
    assert len(tail) == 4096 and tail.endswith(b"THE END") and tail.startswith(b"a")


# -- stored items ------------------------------------------------------------------------


def job_item(**attrs: Any) -> dict[str, Any]:
    return {"Pk": {"S": "JOB"}, "Sk": {"S": "nightly"}, "command": {"S": "report"},
            "cron": {"S": "15 2 * * *"}, **attrs}


def test_a_good_item_round_trips() -> None:
    job = Job("nightly", parse_every("5m"), "report --day y", timeout_s=90.5, catch_up=True,
              updated_at_ms=BASE)
    assert fleetcodec.decode_job(fleetcodec.encode_job(job)) == job


@pytest.mark.parametrize(("item", "named"), [
    ({**job_item(), "command": {"S": "  "}}, "no command"),
    ({k: v for k, v in job_item().items() if k != "command"}, "no command"),
    (job_item(cron={"S": "61 * * * *"}), "bad schedule"),
    (job_item(cron={"N": "5"}), "bad schedule"),
    ({k: v for k, v in job_item().items() if k != "cron"}, "bad schedule"),
    (job_item(every_ms={"N": "60000"}), "bad schedule"),
    ({**{k: v for k, v in job_item().items() if k != "cron"}, "every_ms": {"N": "0"}},
     "bad schedule"),
    ({**{k: v for k, v in job_item().items() if k != "cron"}, "every_ms": {"N": "-5"}},
     "every_ms"),
    ({**{k: v for k, v in job_item().items() if k != "cron"}, "every_ms": {"S": "60000"}},
     "every_ms"),
    (job_item(timeout_s={"N": "-1"}), "timeout_s"),
    (job_item(timeout_s={"S": "soon"}), "timeout_s"),
    (job_item(timeout_s={"N": "1e9"}), "timeout_s"),
])
def test_a_hand_edited_item_that_cannot_run_says_why(item: dict[str, Any], named: str) -> None:
    decoded = fleetcodec.decode_job(item)
    assert isinstance(decoded, UnreadableJob), decoded
    assert decoded.name == "nightly" and named in decoded.problem


def test_items_that_are_not_jobs_are_not_reported_as_jobs() -> None:
    assert fleetcodec.decode_job({"Pk": {"S": "MEMBER"}, "Sk": {"S": "w1"}}) is None
    assert fleetcodec.decode_job({"Pk": {"S": "JOB"}}) is None
