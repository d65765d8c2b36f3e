"""The rolling-deploy scenario's figures, from delivered records alone: the sink audit, the
longest delivery gap, the latency spike and the upstream's clock (no network)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from loadtest.audit import correctness_failures
from loadtest.deploy_scenario import (
    Delivered,
    audit,
    figures,
    latency_spike_s,
    longest_gap_s,
)
from loadtest.fleet import handoff_s, upstream_epoch_ms
from loadtest.report import markdown, targets


def steady(seqs: range, period_ms: int = 100, latency_ms: int = 150,
           fence: int = 1) -> list[Delivered]:
    """Message n sent at n x period, written ``latency_ms`` later."""
    return [Delivered(n, n * period_ms + latency_ms, fence, True) for n in seqs]


CLEAN = {"lost": 0, "duplicated": 0, "out_of_order": 0, "stale_accepted": 0}


@pytest.mark.parametrize(("name", "delivered", "last_seq", "expected"), [
    ("every seq once, in order", steady(range(1, 11)), 10, CLEAN),
    ("a seq missing below the checkpoint", steady(range(1, 11))[:4] + steady(range(6, 11)),
     10, {**CLEAN, "lost": 1}),
    ("a seq past the delivered ones", steady(range(1, 11)), 12, {**CLEAN, "lost": 2}),
    ("an altered copy", [*steady(range(1, 5)), Delivered(5, 650, 1, False)], 5,
     {**CLEAN, "lost": 1}),
    ("a second copy written later", [*steady(range(1, 6)), Delivered(3, 900, 2, True)], 5,
     {**CLEAN, "duplicated": 1, "out_of_order": 1}),
    ("a lower seq written after a higher one",
     [Delivered(1, 100, 1, True), Delivered(2, 300, 1, True), Delivered(3, 200, 1, True)], 3,
     {**CLEAN, "out_of_order": 1}),
    ("a write under a lower fence after a higher one",
     [Delivered(1, 100, 2, True), Delivered(2, 200, 1, True)], 2,
     {**CLEAN, "stale_accepted": 1}),
])
def test_the_sink_audit(name: str, delivered: list[Delivered], last_seq: int,
                        expected: dict[str, int]) -> None:
    assert audit(delivered, last_seq) == expected, name


def test_an_injected_gap_is_the_longest() -> None:
    times = [t for t in range(0, 10_000, 100) if not 4_000 < t < 4_700]
    assert longest_gap_s(times, 1_000, 9_000) == pytest.approx(0.7)
    assert longest_gap_s(times, 5_000, 9_000) == pytest.approx(0.1)


def test_a_gap_across_the_window_edges_counts_from_the_last_delivery_before_it() -> None:
    times = [0, 100, 200, 1_500, 1_600]
    assert longest_gap_s(times, 1_000, 1_600) == pytest.approx(1.3)  # 200 -> 1500
    assert longest_gap_s([0, 100], 1_000, 1_400) == pytest.approx(1.3)  # 100 -> the end
    assert longest_gap_s([], 1_000, 1_400) == pytest.approx(0.4)


def test_the_spike_is_the_worst_latency_in_the_deploy_over_the_steady_median() -> None:
    delivered = steady(range(1, 201))
    delivered[150] = delivered[150]._replace(at_ms=delivered[150].at_ms + 600)
    delivered.append(Delivered(180, 180 * 100 + 2_000, 2, True))  # a later copy: not its time

    def sent(n: int) -> float:
        return n * 100.0

    median, spike = latency_spike_s(delivered, sent, (0, 10_000), (10_000, 20_100))
    assert median == pytest.approx(0.15)
    assert spike == pytest.approx(0.6)
    assert latency_spike_s(delivered, sent, (50_000, 60_000), (10_000, 20_000)) == (None, None)


def test_the_upstreams_epoch_from_head_readings() -> None:
    rng = random.Random(7)
    epoch, rate = 1_700_000_000_123.4, 10.0
    readings = []
    for _ in range(12):
        before = epoch + rng.uniform(1_000, 5_000)
        seen = before + rng.uniform(0, 3)
        readings.append((before, seen + rng.uniform(0, 3), int((seen - epoch) * rate / 1000)))
    found = upstream_epoch_ms(readings, rate)
    assert abs(found - epoch) < 100  # one message period at most
    assert abs(upstream_epoch_ms(readings[:1], rate) - epoch) < 100


def deploy_section(lost: int = 0) -> dict[str, Any]:
    per = {f"s{i}": {"max_gap_s": 0.2, "steady_gap_s": 0.1, "steady_p50_s": 0.15,
                     "spike_s": 0.1, **CLEAN} for i in range(10)}
    per["s3"].update(max_gap_s=0.9, spike_s=0.8, lost=lost)
    return {"workers": 3, "streams": 10, "rate": 10.0, **figures(per)}


def test_figures_over_streams() -> None:
    k = deploy_section()
    assert k["max_gap_p99_s"] == 0.9 and k["max_gap_p50_s"] == 0.2
    assert k["max_gap_max_s"] == 0.9 and k["worst_stream"] == "s3"
    assert k["latency_spike_p99_s"] == 0.8 and k["steady_latency_p50_s"] == 0.15
    assert deploy_section(lost=2)["lost"] == 2


def test_the_deploy_targets_render_and_a_loss_fails_the_run() -> None:
    result = {"settings": {}, "scenarios": {"deploy": {"ok": True}},
              "deploy": deploy_section()}
    rows = {key: (value, met) for _, key, value, _, met in targets(result)}
    assert rows["deploy.max_gap_p99_s"] == (0.9, False)
    assert rows["deploy.lost"] == (0, True)
    assert "## Rolling deploy" in markdown(result)
    assert correctness_failures(result) == {}
    result["deploy"] = deploy_section(lost=2)
    assert correctness_failures(result) == {"deploy.lost": 2}


@pytest.mark.parametrize(("taken", "written", "sent", "expected"), [
    (1_000, 1_080, 900, 0.08),     # the message waited for the take: timed from the take
    (1_000, 1_480, 1_400, 0.08),   # produced 0.4 s after the take: timed from its send
    (1_000, 1_480, None, 0.48),    # no send time known: from the take
    (1_000, 990, 900, 0.0),        # clocks a few ms apart never make it negative
])
def test_a_live_hand_off_is_timed_from_when_the_taker_could_write(
        taken: float, written: float, sent: float | None, expected: float) -> None:
    assert handoff_s(taken, written, sent) == expected
