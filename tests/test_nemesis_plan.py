"""The nemesis's schedules as data: drawn from a seed alone, written as one line and read
back, every kind drawn, and a failing schedule shrunk to the faults that matter."""

from __future__ import annotations

import collections
import re

import pytest

from loadtest import nemesis
from loadtest.nemesis import Outcome, Settings
from loadtest.nemesis_plan import (
    KINDS,
    PROCESSOR_KINDS,
    TARGETED,
    Fault,
    Timing,
    decode,
    draw,
    encode,
    is_processor_schedule,
    last_fault_ends,
    shrink,
)

TIMING = Timing(member_lease_s=2.0, duration_s=60.0)


def test_a_seed_is_its_schedule() -> None:
    assert draw(7, TIMING) == draw(7, TIMING)
    assert draw(7, TIMING) != draw(8, TIMING)
    faults = draw(7, TIMING)
    assert faults == sorted(faults) and len(faults) == 8
    assert all(1.0 <= f.at <= TIMING.duration_s - TIMING.member_lease_s for f in faults)


def test_pauses_outlast_the_member_lease_and_targeted_kinds_name_a_victim() -> None:
    faults = [f for seed in range(200) for f in draw(seed, TIMING)]
    for f in faults:
        if f.kind in ("pause", "leader_pause"):
            assert f.hold > TIMING.member_lease_s
        if f.kind in TARGETED or f.kind.startswith("leader_"):
            assert f.target in ("any", "leader"), f
        if f.kind == "clock_skew":
            assert abs(f.value) == 2.0


def test_two_hundred_schedules_draw_every_kind_at_least_twenty_times() -> None:
    counts = collections.Counter(f.kind for seed in range(200) for f in draw(seed, TIMING))
    assert set(counts) == set(KINDS)
    assert min(counts.values()) >= 20, counts.most_common()[-3:]


def test_a_schedule_is_one_line_that_reads_back_as_itself() -> None:
    for seed in range(50):
        faults = draw(seed, TIMING)
        text = encode(faults)
        assert "\n" not in text and " " not in text
        assert decode(text) == faults


def test_the_text_of_a_fault() -> None:
    assert Fault(12.5, "pause", 3.4, target="leader").text() == "pause@12.5+3.4/leader"
    assert Fault(14.0, "throttle", 5.0, 0.4).text() == "throttle@14+5=0.4"
    assert decode("kill9@20.1/any; clock_skew@3=-2") == [
        Fault(3.0, "clock_skew", value=-2.0), Fault(20.1, "kill9", target="any")]


@pytest.mark.parametrize(("text", "says"), [
    ("", "names no fault"),
    ("explode@1", "unknown fault kind"),
    ("kill9", "not a fault"),
    ("kill9@x", "not a fault"),
    ("kill9@1/w2", "target is any or leader"),
])
def test_a_bad_schedule_text_is_refused(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        decode(text)


def test_draw_refuses_kinds_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="unknown"):
        draw(1, TIMING, ["kill9", "meteor"])
    assert {f.kind for f in draw(1, TIMING, ["kill9"])} == {"kill9"}


async def test_shrinking_keeps_only_the_faults_the_failure_needs() -> None:
    faults = draw(3, Timing(2.0, 240.0))  # 32 faults
    culprits = {faults[5], faults[20]}
    runs = []

    async def fails(candidate: list[Fault]) -> bool:
        runs.append(candidate)
        return culprits <= set(candidate)

    shrunk = await shrink(faults, fails, budget=64)
    assert set(shrunk) == culprits
    assert len(runs) <= 64


async def test_shrinking_stops_at_its_budget_with_a_schedule_that_still_fails() -> None:
    faults = draw(4, Timing(2.0, 240.0))
    needed = set(faults[:4])
    runs = []

    async def fails(candidate: list[Fault]) -> bool:
        runs.append(candidate)
        return needed <= set(candidate)

    shrunk = await shrink(faults, fails, budget=3)
    assert len(runs) == 3
    assert needed <= set(shrunk) <= set(faults) and len(shrunk) < len(faults)


def test_the_last_fault_ends_when_its_hold_does() -> None:
    assert last_fault_ends([Fault(1, "kill9"), Fault(2, "pause", 5.0)]) == 7.0
    assert last_fault_ends([]) == 0.0


class PlantedFailure:
    """A stand-in for ``nemesis.run_schedule``: a run fails while ``culprit`` is in it, and
    is a processor schedule as the real one decides; every run is kept."""

    def __init__(self, culprit: Fault) -> None:
        self.culprit = culprit
        self.runs: list[Outcome] = []

    async def __call__(self, seed: int, candidate: list[Fault], settings: Settings) -> Outcome:
        outcome = Outcome(seed, candidate,
                          processor=settings.processor or is_processor_schedule(candidate))
        if self.culprit in candidate:
            outcome.violations["lost"] += 1
        self.runs.append(outcome)
        return outcome


async def shrunk_with(planted: PlantedFailure, faults: list[Fault], seed: int,
                      monkeypatch: pytest.MonkeyPatch) -> Outcome:
    monkeypatch.setattr(nemesis, "run_schedule", planted)
    failing = await planted(seed, faults, Settings())
    return await nemesis.shrunk(failing, Settings(shrink_budget=32))


async def test_the_runner_shrinks_a_failing_schedule_to_a_run_that_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    faults = draw(5, Timing(2.0, 120.0))
    planted = PlantedFailure(faults[3])
    smallest = await shrunk_with(planted, faults, 5000, monkeypatch)
    assert smallest.faults == [faults[3]] and smallest.failed
    assert smallest.replay() == f"make nemesis SEED=5000 SCHEDULE='{faults[3].text()}'"
    assert len(planted.runs) <= 33


async def test_a_processor_schedule_shrinks_to_a_processor_schedule(
        monkeypatch: pytest.MonkeyPatch) -> None:
    faults = draw(6, Timing(2.0, 60.0), processor=True)
    culprit = next(f for f in faults if f.kind not in PROCESSOR_KINDS)
    planted = PlantedFailure(culprit)
    smallest = await shrunk_with(planted, faults, 6000, monkeypatch)
    assert smallest.faults == [culprit] and all(run.processor for run in planted.runs)
    assert smallest.replay().endswith(" ARGS=--processor")


@pytest.mark.parametrize(("argv", "refused"), [
    (["--kinds", "kill9,nope"], "unknown ['nope']"),
    (["--kinds", ","], "--kinds: none"),
    (["--processor", "--kinds", "sink_outage"], "a processor schedule draws none"),
    (["--schedules", "0"], "--schedules 1-10000"),
    (["--schedule", "kill9@x"], "not a fault"),
])
def test_the_command_refuses_what_it_cannot_run(argv: list[str], refused: str) -> None:
    with pytest.raises(ValueError, match=re.escape(refused)):
        nemesis.settings_from(nemesis.build_parser().parse_args(argv))


def test_the_command_builds_processor_settings() -> None:
    settings = nemesis.settings_from(nemesis.build_parser().parse_args(
        ["--processor", "--kinds", "kill9,sink_outage", "--seed", "9"]))
    assert settings.processor and settings.seed == 9 and settings.kinds == ("kill9", "sink_outage")
