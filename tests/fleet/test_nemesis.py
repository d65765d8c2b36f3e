"""A short nemesis in the suite: a few random fault schedules (fixed seeds) against a real
fleet, each audited from the sink, the store and the job's record, so that a regression only
a combination of faults shows fails ``make test``. ``make nemesis`` runs hundreds."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path

import pytest

from loadtest.nemesis import (
    Outcome,
    Settings,
    _slots_run_twice,
    accumulate,
    figures,
    merge_results,
    run_schedule,
)
from loadtest.nemesis_plan import KINDS, Fault, Timing, draw

pytestmark = pytest.mark.fleet

# Twenty seconds of faults each, at three times the default density: every kind of the
# catalogue is drawn over these seeds (checked below), a handful per schedule.
CI_TIMING = Timing(member_lease_s=2.0, duration_s=20.0, faults_per_minute=24.0)
CI_SEEDS = (101, 102)


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
    assert set(section["faults_by_kind"]) == set(KINDS)
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
