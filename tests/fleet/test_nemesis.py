"""A short nemesis in the suite: a few random fault schedules (fixed seeds) against a real
fleet, each audited from the sink, the store and the job's record, so that a regression only
a combination of faults shows fails ``make test``. ``make nemesis`` runs hundreds."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest

from loadtest.audit import json_files
from loadtest.nemesis import (
    Outcome,
    Settings,
    _slots_run_twice,
    accumulate,
    figures,
    merge_results,
    run_schedule,
)
from loadtest.nemesis_plan import (
    ALL_KINDS,
    EVENTS_TABLE_KINDS,
    KINDS,
    PROCESSOR_KINDS,
    Fault,
    Timing,
    decode,
    draw,
    encode,
    is_processor_schedule,
)
from loadtest.processors import RAISE_FLAG, Told, recording
from streamlease.processor import Context, Message

pytestmark = pytest.mark.fleet

# Twenty seconds of faults each, at three times the default density: every kind of the
# catalogue is drawn over these seeds (checked below), a handful per schedule.
CI_TIMING = Timing(member_lease_s=2.0, duration_s=20.0, faults_per_minute=24.0)
CI_SEEDS = (101, 102)
CI_PROCESSOR_SEED = 103  # a processor schedule: the fleet writes through a Python processor


@pytest.mark.parametrize("seed", CI_SEEDS)
async def test_a_random_schedule_leaves_no_violation(seed: int, tmp_path: Path) -> None:
    before = dict(os.environ)
    faults = draw(seed, CI_TIMING)
    settings = Settings(seed=seed, minutes=CI_TIMING.duration_s / 60, streams=8,
                        results=None, logs=tmp_path)
    outcome = await run_schedule(seed, faults, settings)
    assert not outcome.failed, (dict(outcome.violations), outcome.notes, outcome.replay())
    assert outcome.orphans == 0
    assert sum(outcome.injected.values()) >= len(faults) // 2, (outcome.injected,
                                                                outcome.skipped)
    assert outcome.recovery_s and max(outcome.recovery_s) <= settings.recovery_bound_s
    assert dict(os.environ) == before  # the suite's own store settings are as they were


async def test_a_processor_schedule_whose_processor_raises_leaves_no_violation(
        tmp_path: Path) -> None:
    before = dict(os.environ)
    faults = draw(CI_PROCESSOR_SEED, CI_TIMING, processor=True)
    assert is_processor_schedule(faults)
    settings = Settings(seed=CI_PROCESSOR_SEED, minutes=CI_TIMING.duration_s / 60, streams=8,
                        results=None, logs=tmp_path)
    outcome = await run_schedule(CI_PROCESSOR_SEED, faults, settings)
    assert not outcome.failed, (dict(outcome.violations), outcome.notes, outcome.replay())
    assert outcome.orphans == 0 and dict(os.environ) == before
    assert outcome.processor and outcome.replay().endswith(" ARGS=--processor")
    assert outcome.injected["processor_raises"] >= 1, (outcome.injected, outcome.skipped)
    records, unreadable, raised = processor_output(tmp_path)
    assert len(records) > 100 and unreadable == 0  # the audit read the processor's output
    assert raised and all("Told" in line for line in raised)


def processor_output(logs: Path) -> tuple[list[dict[str, object]], int, list[str]]:
    """A processor schedule's records, unreadable lines, and its workers' log lines of a
    failed batch."""
    (directory,) = logs.glob("*/*-recording")
    records, unreadable = json_files(directory)
    raised = [line for log in logs.glob("*/seed-*/w*.log")
              for line in log.read_text().splitlines() if '"processor.failed"' in line]
    return list(records), unreadable, raised


def test_a_processor_schedule_draws_processor_faults_and_spares_the_events_table() -> None:
    timing = Timing(member_lease_s=2.0, duration_s=60.0)
    for seed in range(1000, 1020):
        faults = draw(seed, timing, processor=True)
        kinds = [f.kind for f in faults]
        assert kinds.count("processor_raises") == 2, kinds
        assert not set(kinds) & set(EVENTS_TABLE_KINDS)
        assert all(f.hold >= 1.0 for f in faults if f.kind in PROCESSOR_KINDS)
        assert not is_processor_schedule(draw(seed, timing))
        assert decode(encode(faults)) == faults


async def test_the_recording_processor_raises_before_writing_while_told_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADTEST_RECORDING_DIR", str(tmp_path))
    processor = recording()
    ctx = Context(stream_id="s001", fence=3, owner="w1", item={}, resume_after=0,
                  checkpoint=0)
    (tmp_path / RAISE_FLAG).touch()
    with pytest.raises(Told):
        await processor.process([Message(1, {"seq": 1}, '{"seq":1}')], ctx)
    assert json_files(tmp_path) == ([], 0)
    (tmp_path / RAISE_FLAG).unlink()
    await processor.process([Message(1, {"seq": 1}, '{"seq":1}')], ctx)
    records, unreadable = json_files(tmp_path)
    assert [(r["seq"], r["fence"]) for r in records] == [(1, 3)] and unreadable == 0


def test_the_ci_seeds_draw_a_spread_of_kinds() -> None:
    drawn = {f.kind for seed in CI_SEEDS for f in draw(seed, CI_TIMING)}
    assert len(drawn) >= 8, drawn
    assert drawn <= set(KINDS)


def test_a_slot_appended_twice_is_found(tmp_path: Path) -> None:
    slots = tmp_path / "slots"
    slots.write_text("2026-12-05T00:00:00Z 7\n2026-12-05T00:00:02Z 7\n")
    assert _slots_run_twice(slots) == set()
    slots.write_text(slots.read_text() + "2026-12-05T00:00:02Z 8\n")
    assert _slots_run_twice(slots) == {"2026-12-05T00:00:02Z"}
    assert _slots_run_twice(tmp_path / "absent") == set()


def outcome(seed: int, violations: dict[str, int], recovery: list[float]) -> Outcome:
    done = Outcome(seed, [Fault(1.0, "kill9", target="any")])
    done.violations.update(violations)
    done.injected.update({"kill9": 1})
    done.recovery_s = recovery
    return done


def test_the_figures_count_failing_schedules_and_every_kind() -> None:
    settings = Settings(results=None)
    section = figures([outcome(1001, {}, [1.0, 2.0]),
                       outcome(1002, {"lost": 3}, [9.5])], settings)
    assert section["schedules"] == 2 and section["violations"] == 1
    assert section["violations_by_kind"] == {"lost": 3}
    assert set(section["faults_by_kind"]) == set(ALL_KINDS)
    assert section["fewest_faults_of_a_kind"] == 0  # no schedule raised in a processor
    assert section["faults_by_kind"]["kill9"] == 2
    assert section["recovery_max_s"] == 9.5 and section["seeds"] == [1]
    (failure,) = section["failures"]
    assert failure["replay"] == "make nemesis SEED=1002 SCHEDULE='kill9@1/any'"


def test_results_keep_every_other_key_and_a_run_replaces_or_adds(tmp_path: Path) -> None:
    path = tmp_path / "latest.json"
    path.write_text(json.dumps({"failover": {"kill9": {"p99": 2.5}}, "scenarios": {}}))
    settings = Settings(results=path)
    long_run = figures([outcome(1000 + i, {}, [1.0]) for i in range(4)], settings)
    merge_results(long_run, path)
    short = figures([outcome(2000, {"lost": 1}, [3.0])], settings)
    merge_results(short, path, add=True)
    written = json.loads(path.read_text())
    assert written["failover"] == {"kill9": {"p99": 2.5}}
    assert written["scenarios"]["nemesis"]["keys"] == ["nemesis"]
    nemesis = written["nemesis"]
    assert nemesis["schedules"] == 5 and nemesis["violations"] == 1
    assert nemesis["seeds"] == [1, 2] and nemesis["faults_by_kind"]["kill9"] == 5
    assert accumulate(long_run, short)["recovery_max_s"] == 3.0
    assert collections.Counter(nemesis["violations_by_kind"]) == {"lost": 1}
    merge_results(short, path)
    assert json.loads(path.read_text())["nemesis"]["schedules"] == 1
    assert "`nemesis.violations` | 1 | 0 | **no**" in (tmp_path / "latest.md").read_text()
