"""The benchmark's report has the keys other tools read, and a PNG timeline; its
scenarios' bookkeeping (moves, merging, failures) holds without running a fleet."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from loadtest import chaos
from loadtest.capacity import CapacityInputs, capacity_model, model_text, renewal_rate
from loadtest.chaos import _cost, _pct
from loadtest.fleet import Fleet, parse_metrics
from loadtest.report import markdown, targets, write_reports
from worker.core.model import StreamRecord

REQUIRED = ("lost", "duplicated", "out_of_order", "stale_accepted", "stale_rejected",
            "failover", "requests_per_stream_minute", "cost_per_1000_streams_month_usd",
            "cpu_seconds_per_1000_messages", "rss_bytes_per_stream", "msgs_per_s",
            "null_sink_ratio")
AUDIT = {"lost": 0, "duplicated": 0, "out_of_order": 0, "stale_accepted": 0,
         "fleet_caused_gaps": 0, "messages_in_sink": 500}
FAILOVER = {"p50": 0.4, "p99": 0.9, "max": 0.9, "samples": 10, "unrecovered": 0}


def sample_result() -> dict[str, Any]:
    profile = {"streams": 4, "rate": 10.0, "workers": 2, "lease": 2.0, "heartbeat": 0.5,
               "reconcile": 0.5, "skew": 0.3}
    per_min = {"heartbeat": 120.0, "acquire_release": 2.0, "query": 10.0, "sweep_scan": 0.5,
               "sink": 120.0}
    failover = {k: {"p50": 1.0, "p99": 2.0, "max": 2.5, "samples": 3, "unrecovered": 0}
                for k in ("kill9", "sigterm", "pause")}
    return {
        "profile": "small", "settings": profile, "dynamodb": "embedded",
        "started_at": "2026-01-01T00:00:00Z", "chaos_seconds": 60.0, "lost": 0,
        "duplicated": 0, "out_of_order": 0, "stale_accepted": 0, "stale_rejected": 2,
        "fleet_caused_gaps": 0, "upstream_gaps_counted": 0, "messages_in_sink": 1000,
        "msgs_per_s_during_chaos": 40.0, "failover": failover,
        "failover_targets_s": {"kill9": 3.1, "sigterm": 1.0},
        "requests_per_stream_minute": per_min, "dynamodb_requests_per_s": 50.0,
        "store_was_bottleneck": False,
        "cost_per_1000_streams_month_usd": _cost(per_min, profile, batch_s=0.5),
        "cost_at_defaults_usd": _cost(per_min, profile, batch_s=0.2),
        "msgs_per_s": {"null_sink": 50000, "fenced_sink": 10000, "bare_client": 52000},
        "null_sink_ratio": 0.96, "fenced_sink_ratio": 0.19,
        "cpu_seconds_per_1000_messages": 0.07, "cpu_seconds_per_1000_messages_saturated": 0.03,
        "rss_bytes_per_stream": 50000, "worker_rss_idle_bytes": 60 * 2**20,
        "cpu_phase_msgs_per_s": 1000.0,
        "faults": [{"kind": "kill9", "at": 5.0, "worker": "w1", "streams": 2, "recovered": 2}],
        "timeline": [(0.0, {}), (1.0, {"w1": 2, "w2": 2}), (6.0, {"w2": 4})],
    }


def model() -> dict[str, Any]:
    found = capacity_model(CapacityInputs(
        member_heartbeats_per_worker_s=0.2, renewals_per_stream_minute=0.1,
        renewals_source="setting", renewals_measured_per_stream_minute=0.0,
        acquisitions_per_stream_minute=0.0, releases_per_stream_minute=0.0,
        streams_per_worker=500))
    return {**found, "text": model_text(found)}


def scenario_sections() -> dict[str, Any]:
    """What skew, slow_store, balance and scale write, as a run before balancing exists
    would: the fleet never converges."""
    churn = {"leases_lost": {"member_deadline": 3}, "members_declared_dead": 0,
             "member_fenced": 0, "member_heartbeats": {"renewed": 100},
             "member_heartbeat_p99_s_bucket": "inf", "log_events": {"lease.lost": 3},
             "worker_exits": [], "untracked_leases": {"w2": 1}, "unheld_at_end_count": 1,
             "unheld_at_end": [{"stream": "s005", "owner": "w1", "fence": 2,
                                "lease_left_s": 1790.0}]}
    m = model()
    return {
        "scenarios": {name: {"ok": True, "seconds": 60.0, "started_at": "2026-01-01T00:00:00Z",
                             "keys": []}
                      for name in ("chaos", "skew", "slow_store", "balance", "scale")},
        "skew": {"offset": "-2s", "workers": 3, "streams": 24, "lease_s": 2.0,
                 "observed_s": 60.0, "skewed_worker": "w1", "measured_offset_s": -2.1,
                 "all_held_s": 1.2, "settled": True, "moves": 0, "moves_in_last_20_s": 0,
                 "skewed_worker_held_at_end": 8, "held_at_end": {"w1": 8, "w2": 8, "w3": 8},
                 "move_details": {"moves": 0}, "fence_bumps": 0, **AUDIT, **churn},
        "slow_store": {"latency_ms": 20.0, "latency_mode": "serial", "workers": 4,
                       "streams": 40, "rate": 20.0, "observed_s": 60.0, "all_held_s": 6.0,
                       "moves": 29, "moves_in_window": 25, "held_at_end_of_window": {"w1": 10},
                       "stalled_streams": ["s001", "s002"],
                       "sigterm": FAILOVER, **AUDIT, **churn},
        "balance": {"streams": 40, "workers_before": 2, "workers_after": 4, "share": 10,
                    "timeout_s": 60.0, "all_held_s": 1.5,
                    "before_scale_out": {"w1": 25, "w2": 15}, "converge_s": None,
                    "converged": False, "moves": 0,
                    "state_reached": {"w1": 25, "w2": 15, "w3": 0, "w4": 0},
                    "best_spread": 25, "moves_after": 0, "moves_after_from": "timeout",
                    "after_30_s": {"w1": 25, "w2": 15, "w3": 0, "w4": 0},
                    "after_rolling_restart": {"w5": 21, "w6": 19, "w7": 0, "w8": 0},
                    "after_rolling_restart_max": 21, "after_rolling_restart_target": 11,
                    "sigterm": FAILOVER, "timeline": [(0.0, {"w1": 25, "w2": 15}),
                                                      (5.0, {"w1": 25, "w2": 15, "w3": 0}),
                                                      (9.0, {"w1": 20, "w2": 20})],
                    "live_workers": [(0.0, 2), (4.0, 4), (8.0, 2)],
                    "events": [(4.0, "scale-out 2 -> 4"), (6.0, "rolling restart"),
                               (7.0, "sigterm w1")], **AUDIT, **churn},
        "scale": {"streams": 2000, "workers": 4, "rate": 1e-6,
                  "raised_settings": {"STREAMLEASE_MAX_STREAMS": "2000"}, "window_s": 60.0,
                  "failover_recovery": "upstream connected again (idle streams)",
                  "all_held_s": 40.0, "all_connected_s": 45.0, "window_measured_s": 60.0,
                  "held_streams_in_window": 2000.0, "requests_per_s_total": 40.0,
                  "requests_per_s_per_1000_streams": {"get_item": 16.7, "query": 1.6},
                  "rates": {"member_heartbeats_per_worker_s": 0.2},
                  "kill9": {**FAILOVER, "p99": 24.0, "victim": "w2", "streams": 500},
                  "timeline": [(0.0, {}), (30.0, {"w1": 500, "w2": 500})], **AUDIT, **churn},
        "capacity_model": m,
        "upkeep_writes_per_stream_minute_default":
            m["upkeep_writes_per_stream_minute_full_workers"],
        "streams_per_table_at_defaults": m["streams_per_table"],
    }


def test_reports_are_written_with_the_documented_keys(tmp_path: Path) -> None:
    paths = write_reports(sample_result(), tmp_path)
    doc = json.loads(Path(paths["json"]).read_text())
    assert all(k in doc for k in REQUIRED)
    assert set(doc["failover"]["kill9"]) >= {"p50", "p99", "max"}
    assert set(doc["msgs_per_s"]) == {"null_sink", "fenced_sink", "bare_client"}
    assert Path(paths["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 0 | 0 | 0 | 0 | 0 |" in Path(paths["md"]).read_text()
    assert len(list(tmp_path.glob("2*.json"))) == 1  # the timestamped copy


def test_the_new_scenarios_render_with_their_keys(tmp_path: Path) -> None:
    result = {**sample_result(), **scenario_sections()}
    result["failover"]["sigterm_slow_store"] = FAILOVER
    paths = write_reports(result, tmp_path)
    doc = json.loads(Path(paths["json"]).read_text())
    for key in ("skew.settled", "skew.moves", "slow_store.moves", "balance.converge_s",
                "balance.moves", "balance.moves_after", "balance.after_rolling_restart_max",
                "failover.sigterm.p99", "failover.sigterm_slow_store.p99", "failover.kill9.p99"):
        value: Any = doc
        for part in key.split("."):
            assert part in value, key
            value = value[part]
    assert doc["balance"]["converge_s"] is None  # never converged: null, not a crash
    assert doc["streams_per_table_at_defaults"] == 150_000
    md = Path(paths["md"]).read_text()
    for heading in ("## Targets", "## Clock skew", "## Slow store", "## Balance", "## Scale",
                    "## Capacity model"):
        assert heading in md, heading
    assert "**Not converged** within 60 s: state reached w1 25, w2 15, w3 0, w4 0" in md
    assert "| `balance.converge_s` | - | <= 5 s | - |" in md
    assert "| `slow_store.moves` | 29 | 0 | **no** |" in md
    assert "| `slow_store.stalled_streams` | 2 | 0 | **no** |" in md
    assert "streams that delivered nothing while observed: **2** (s001, s002)" in md
    assert "| `streams_per_table_at_defaults` | 150,000 | >= 100,000 | yes |" in md
    assert "(acquired but not served): w2 1" in md
    png = Path(paths["png"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_of_some_scenarios_renders_only_those(tmp_path: Path) -> None:
    sections = scenario_sections()
    result = {"profile": "small", "settings": sample_result()["settings"],
              "started_at": "2026-01-01T00:00:00Z",
              "scenarios": {"skew": sections["scenarios"]["skew"]}, "skew": sections["skew"]}
    md = markdown(result)
    assert "## Clock skew" in md and "## Chaos" not in md and "## Balance" not in md
    assert [row[1] for row in targets(result)] == ["skew.settled", "skew.moves",
                                                   "skew.stalled_streams"]
    assert Path(write_reports(result, tmp_path)["png"]).exists()


def test_percentiles_and_cost_arithmetic() -> None:
    assert _pct([], 50) is None
    assert _pct([3.0, 1.0, 2.0], 50) == 2.0 and _pct([3.0, 1.0, 2.0], 99) == 3.0
    profile = {"rate": 10.0}
    cheap = _cost({"heartbeat": 12, "acquire_release": 0, "query": 0, "sweep_scan": 0,
                   "sink": 0}, profile, batch_s=0.2)
    # 12 renewals x 3 WRU x 43.2 M stream-minutes x $0.625 per million.
    assert cheap["lease_overhead"] == round(12 * 3 * 43_200_000 * 0.625 / 1e6, 2)
    assert cheap["sink"] == 0
    split = _cost({"heartbeat": 0.22, "member_heartbeat": 0.12, "stream_renewal": 0.1,
                   "acquire_release": 0, "query": 0, "sweep_scan": 0, "sink": 0},
                  profile, batch_s=0.2)
    # A member heartbeat is 1 WRU (fleet table), a stream renewal 3 (table + index).
    assert split["lease_overhead"] == round((0.12 + 0.3) * 43_200_000 * 0.625 / 1e6, 2)


def test_capacity_model_arithmetic() -> None:
    m = model()
    # 0.1 renewals per stream-minute, 2 index writes each: N x 0.2 / 60 writes/s <= 500.
    assert m["streams_per_table"] == 150_000
    assert m["streams_per_table_with_hourly_deploys"] == 112_500
    # 12 member heartbeats a minute over 500 streams + 0.1 renewals; over 100 at defaults.
    assert m["upkeep_writes_per_stream_minute"] == pytest.approx(0.124)
    assert m["upkeep_writes_per_stream_minute_full_workers"] == pytest.approx(0.22)
    assert "150,000 streams" in m["text"]
    assert renewal_rate(0.0, 60, 600)[0] == pytest.approx(0.1)  # window too short
    assert renewal_rate(0.098, 700, 600) == (0.098, "measured over 700 s")


def _record(sid: str, owner: str | None, fence: int, live: bool) -> StreamRecord:
    expiry = time.time_ns() // 1_000_000 + (1_800_000 if live else -1)
    return StreamRecord(sid, "STARTED", "ws://x/", owner, expiry if live else 0, fence, 0)


class ScriptedStore:
    """What ``list_streams`` returns, one read after another."""

    def __init__(self, reads: list[list[StreamRecord]]) -> None:
        self.reads = reads

    async def list_streams(self) -> list[StreamRecord]:
        return self.reads.pop(0)


async def test_moves_count_new_tenures_after_each_first_owner() -> None:
    fleet = Fleet("unit", streams=2, rate=1.0, worker_env={})
    fleet.store = ScriptedStore([  # type: ignore[assignment]
        [_record("s001", "w1", 1, True), _record("s002", None, 0, False)],
        [_record("s001", "w1", 1, False), _record("s002", "w2", 1, True)],  # s001 released
        [_record("s001", "w2", 2, True), _record("s002", "w2", 1, True)],  # taken by w2
        [_record("s001", "w2", 4, True), _record("s002", "w2", 1, True)],  # lost, retaken
    ])
    for _ in range(4):
        await fleet.read_table()
    assert fleet.moves() == 2  # s002's first owner is not a move
    assert fleet.move_summary() == {"moves": 2, "to_another_worker": 1,
                                    "retaken_by_same_worker": 1, "streams_moved": 1}
    assert fleet.fence_bumps() == 3  # one tenure (fence 3) fell between two reads
    assert fleet.timeline[0][1] == {"w1": 1} and fleet.timeline[-1][1] == {"w2": 2}
    t_second = fleet.acquisitions[-1].at
    assert fleet.moves(since=t_second) == 1


def test_metrics_parsing_keeps_labels() -> None:
    text = ('# HELP x\nstreamlease_dynamodb_requests_total{operation="query",outcome="ok"} 3.0\n'
            "streamlease_leases_held 7.0\n")
    assert parse_metrics(text) == {
        'streamlease_dynamodb_requests_total{operation="query",outcome="ok"}': 3.0,
        "streamlease_leases_held": 7.0}


async def test_a_failing_scenario_is_reported_and_the_others_still_run(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async def broken(ctx: chaos.Context) -> dict[str, Any]:
        raise RuntimeError("worker exited")

    async def fine(ctx: chaos.Context) -> dict[str, Any]:
        return {"skew": {"settled": True, "moves": 0, "lost": 1},
                "failover": {"sigterm_slow_store": FAILOVER}}

    monkeypatch.setattr(chaos, "runners", lambda: {"balance": broken, "skew": fine})
    args = chaos.build_parser().parse_args(["--scenarios", "skew,balance"])
    ctx = chaos.Context(args, dict(chaos.PROFILES["small"]), tmp_path)
    previous = {"scenarios": {"scale": {"ok": True, "keys": ["scale", "failover.kill9"]},
                              "skew": {"ok": True, "keys": ["skew"]}},
                "scale": {"streams": 2000}, "failover": {"kill9": {"p99": 25.0}},
                "skew": {"settled": False}}
    result = await chaos.run_scenarios(ctx, args.scenarios, previous)
    assert result["scenarios"]["balance"]["ok"] is False
    assert "worker exited" in result["scenarios"]["balance"]["error"]
    assert result["skew"]["settled"] is True  # this run's, not the previous one
    assert result["failover"] == {"sigterm_slow_store": FAILOVER, "kill9": {"p99": 25.0}}
    assert result["scale"] == {"streams": 2000}
    assert result["scenarios"]["scale"]["from_previous_run"] is True
    assert chaos.correctness_failures(result) == {"skew.lost": 1}


def test_scenario_selection() -> None:
    assert chaos.parse_scenarios("all") == list(chaos.SCENARIOS)
    assert chaos.parse_scenarios("scale,chaos") == ["chaos", "scale"]
    with pytest.raises(Exception, match="unknown scenario"):
        chaos.parse_scenarios("chaos,nope")
