"""The benchmark's report has the keys other tools read, and a PNG timeline; its
scenarios' bookkeeping (moves, merging, failures) holds without running a fleet."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from loadtest import (
    audit,
    balance_scenario,
    chaos_scenario,
    otlp,
    runner,
    scale_scenario,
    throughput,
)
from loadtest.audit import Delivery, audit_deliveries, delivery, from_records, json_lines
from loadtest.capacity import (
    CapacityInputs,
    Settings,
    capacity_model,
    model_text,
    per_worker_read_growth,
    renewal_rate,
)
from loadtest.chaos_scenario import cost as _cost
from loadtest.common import PROFILES
from loadtest.fleet import Context, Fault, Fleet, parse_metrics
from loadtest.fleet import pct as _pct
from loadtest.jobs_scenario import Disturbance, SideItem, SideWatch, audit_jobs
from loadtest.report import markdown, targets, trace_panels, trace_png, write_reports
from loadtest.sinks_scenario import SINKS, parse_sinks
from loadtest.upstreams_scenario import MODES as UPSTREAM_MODES
from loadtest.upstreams_scenario import audit_feed, combine, parse_modes
from streamlease.core.jobs import JobRun, RunOutcome
from streamlease.core.model import StreamRecord
from streamlease.core.schedule import slot_name
from streamlease.dev.upstream import frame_for, mode_frame

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


# The STARTED key takes 1,000 write units a second; half of it goes at N streams when each
# stream's renewal (every 4,800 s: a third of the 4-hour stream lease) and a deploy a
# day's live hand-over (the take) each move its index entry (a delete and a put, 1 unit
# each): N x (2 / 4,800 + 2 / 86,400) = 500.
STARTED_AT_HALF = math.floor(500 / (2 / 4800 + 2 / 86_400))


def _member_reads(workers: int) -> float:
    """One MEMBER key's read units a second with the change feed live, if every member
    lived under it: the other workers read the leader's row (217 B + its bulletin, under
    4 KB: 1 unit) every second, the leader every row and the high-water item (217 B each)
    every 0.3125 s."""
    return (workers - 1) + 2 / 0.625 * math.ceil((workers + 1) * 217 / 4096)


# In one key those reads would pass half the key's 3,000 units at about 1,300 workers ...
MEMBER_READS_AT_HALF = 100 * max(w for w in range(1, 3000) if _member_reads(w) <= 1500)
# ... and the member rows' heartbeats (one 217 B row, 1 unit, every 1.25 s from each
# worker) with a deploy a day's hand-over offers and their clears (1 unit each, 2 per
# stream a day) half its 1,000 write units sooner: at 623 workers of 100 streams. Spread
# over keys of 200 members, neither comes near.
MEMBER_AT_HALF = 100 * max(w for w in range(1, 3000) if w / 1.25 + 200 * w / 86_400 <= 500)


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
                  "per_worker_read_growth_modelled": per_worker_read_growth(),
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
    assert doc["streams_per_table_at_defaults"] == STARTED_AT_HALF
    md = Path(paths["md"]).read_text()
    for heading in ("## Targets", "## Clock skew", "## Slow store", "## Balance", "## Scale",
                    "## Capacity model"):
        assert heading in md, heading
    assert "**Not converged** within 60 s: state reached w1 25, w2 15, w3 0, w4 0" in md
    assert "| `balance.converge_s` | - | <= 5 s | - |" in md
    assert "| `slow_store.moves` | 29 | 0 | **no** |" in md
    assert "| `slow_store.stalled_streams` | 2 | 0 | **no** |" in md
    assert "streams that delivered nothing while observed: **2** (s001, s002)" in md
    assert f"| `streams_per_table_at_defaults` | {STARTED_AT_HALF:,} | >= 1,000,000 | yes |" \
        in md
    assert "(acquired but not served): w2 1" in md
    assert "**modelled** from the code (`per_worker_read_growth_modelled`)" in md
    assert doc["scale"]["per_worker_read_growth_modelled"]["modelled"] is True
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
    # Every request kind, every key at or under half its limit: the orphan index's STARTED
    # key's writes first; the member rows spread over keys as the fleet grows.
    assert m["streams_per_table"] == STARTED_AT_HALF
    assert m["first_key_over_budget"] == "streams: desired_state index / STARTED / writes"
    # Kept in one key, the member rows' heartbeats would come first, then their reads.
    one_key = capacity_model(settings=Settings(members_per_key=10**9))
    assert one_key["streams_per_table"] == MEMBER_AT_HALF < MEMBER_READS_AT_HALF
    assert one_key["first_key_over_budget"] == "fleet table / MEMBER keys / writes"
    # 12 member heartbeats a minute over 500 streams + 0.1 renewals; over 100 at defaults.
    assert m["upkeep_writes_per_stream_minute"] == pytest.approx(0.124)
    assert m["upkeep_writes_per_stream_minute_full_workers"] == pytest.approx(0.22)
    assert f"**Streams per table at defaults: {STARTED_AT_HALF:,}**" in m["text"]
    assert "measured_vs_model" not in m  # no shape or requests measured: nothing to compare
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
    async def broken(ctx: Context) -> dict[str, Any]:
        raise RuntimeError("worker exited")

    async def fine(ctx: Context) -> dict[str, Any]:
        return {"skew": {"settled": True, "moves": 0, "lost": 1},
                "failover": {"sigterm_slow_store": FAILOVER}}

    monkeypatch.setattr(runner, "runners", lambda: {"balance": broken, "skew": fine})
    args = runner.build_parser().parse_args(["--scenarios", "skew,balance"])
    ctx = Context(args, dict(PROFILES["small"]), tmp_path)
    previous = {"scenarios": {"scale": {"ok": True, "keys": ["scale", "failover.kill9"]},
                              "skew": {"ok": True, "keys": ["skew"]}},
                "scale": {"streams": 2000}, "failover": {"kill9": {"p99": 25.0}},
                "skew": {"settled": False}}
    result = await runner.run_scenarios(ctx, args.scenarios, previous)
    assert result["scenarios"]["balance"]["ok"] is False
    assert "worker exited" in result["scenarios"]["balance"]["error"]
    assert result["skew"]["settled"] is True  # this run's, not the previous one
    assert result["failover"] == {"sigterm_slow_store": FAILOVER, "kill9": {"p99": 25.0}}
    assert result["scale"] == {"streams": 2000}
    assert result["scenarios"]["scale"]["from_previous_run"] is True
    assert audit.correctness_failures(result) == {"skew.lost": 1}


def test_scenario_selection() -> None:
    assert runner.parse_scenarios("all") == list(runner.LOADTEST)
    assert runner.parse_scenarios("scale,chaos") == ["chaos", "scale"]
    assert "jobs" in runner.parse_scenarios("default")
    assert "jobs" in runner.runners()
    with pytest.raises(Exception, match="unknown scenario"):
        runner.parse_scenarios("chaos,nope")


# -- the jobs scenario's audit and section --------------------------------------------------

T0 = 1_800_000_000_000  # a slot time (epoch ms), a multiple of 2 s


def _run(i: int, fence: int = 7, delay_ms: int = 20,
         outcome: RunOutcome | None = RunOutcome.SUCCEEDED) -> JobRun:
    slot = T0 + i * 2000
    return JobRun("job", slot_name(slot), fence, "w1", slot + delay_ms, slot + 900, outcome)


def _item(i: int, fence: int = 7) -> SideItem:
    return SideItem(slot_name(T0 + i * 2000), fence)


def test_a_clean_job_history_audits_to_zero() -> None:
    runs = [_run(i, delay_ms=10 * (i + 1)) for i in range(10)]
    found = audit_jobs(runs, [_item(i) for i in range(10)], [])
    assert found["double_runs"] == 0 and found["stale_accepted"] == 0
    assert found["skipped_slots"] == 0 and found["steady_slots"] == 10
    assert found["outcomes"] == {"succeeded": 10}
    assert found["start_delay_p99_s"] == 0.1 and found["start_delay_p50_s"] == 0.05
    assert found["start_delay_max_s"] == 0.1


def test_slots_run_twice_and_stale_writes_are_counted() -> None:
    runs = [_run(0), _run(1), _run(2, fence=8), _run(3, fence=8)]
    items = [
        _item(0), _item(0),  # slot 0 written twice (by the same fence: a run repeated)
        _item(1), _item(1, fence=8),  # slot 1 written twice, once by the next leader
        _item(2, fence=7),  # the old leader's write to a slot the new one claimed
        _item(3, fence=8),
        _item(5),  # a write for a slot nobody claimed
    ]
    found = audit_jobs(runs, items, [])
    assert found["slots_written_twice"] == [slot_name(T0), slot_name(T0 + 2000)]
    assert found["double_runs"] == 2
    assert found["stale_accepted"] == 3  # slot 1's fence-8 item, slot 2's, slot 5's
    assert found["items_without_run"] == [slot_name(T0 + 5 * 2000)]
    assert {"slot": slot_name(T0 + 4000), "fence": 7, "run_fence": 8} in found["stale_items"]


async def test_a_write_seen_after_a_newer_fence_is_stale_even_with_its_runs_fence() -> None:
    reads: list[tuple[int | None, list[SideItem]]] = [
        (None, [_item(0, fence=7)]),  # no lease read yet: nothing to judge by
        (7, [_item(0, fence=7), _item(1, fence=7)]),  # fence 7 current: a legitimate write
        (8, [_item(0, fence=7), _item(1, fence=7), _item(2, fence=7)]),  # read 8, then scan:
        # slot 2's item was not in the scan before, which began after fence 7 was read
        # only, so it may have been written before fence 8 existed: not flagged.
        (8, [_item(0, fence=7), _item(1, fence=7), _item(2, fence=7),
             SideItem(slot_name(T0 + 3 * 2000), 7, "late"),  # began after 8 was read
             _item(4, fence=8)]),
        (None, [_item(5, fence=7)]),  # the lease unreadable: the highest fence seen stands
    ]
    fences = iter([f for f, _ in reads])
    scans = iter([items for _, items in reads])

    async def fence() -> int | None:
        return next(fences)

    async def items() -> list[SideItem]:
        return next(scans)

    watch = SideWatch(fence, items)
    for _ in reads:
        await watch.step()
    assert watch.late == [SideItem(slot_name(T0 + 6000), 7, "late"), _item(5, fence=7)]
    runs = [_run(i, fence=7) for i in range(4)] + [_run(4, fence=8), _run(5, fence=7)]
    found = audit_jobs(runs, [_item(i, fence=7) for i in range(4)] + [_item(4, fence=8)]
                       + [_item(5, fence=7)], [], written_superseded=watch.late)
    assert found["stale_fence_mismatch"] == 0
    assert found["stale_written_after_superseded"] == 2 and found["stale_accepted"] == 2
    # Found both ways, an item counts once.
    both = audit_jobs([_run(0, fence=8)], [_item(0, fence=7)], [],
                      written_superseded=[_item(0, fence=7)])
    assert both["stale_accepted"] == 1


def test_two_run_records_for_one_slot_count_as_a_double_run() -> None:
    found = audit_jobs([_run(0), _run(0, fence=8)], [_item(0, fence=8)], [])
    assert found["slots_claimed_twice"] == [slot_name(T0)]
    assert found["double_runs"] == 1


def test_start_delays_leave_out_slots_near_a_fault_and_skips_are_listed() -> None:
    # Slots 0-9 and 14-19 run; 10-13 have no run (a fault from slot 10 to 11 and after).
    runs = [_run(i, delay_ms=5) for i in range(10)] + \
        [_run(i, delay_ms=3000 if i < 16 else 5) for i in range(14, 20)]
    pause = Disturbance("pause", T0 + 10 * 2000, T0 + 11 * 2000)
    stop = Disturbance("stop", T0 + 19 * 2000)
    found = audit_jobs(runs, [], [pause, stop], settle_ms=4000)
    # Excluded: slots 10-13 (the fault and 4 s after it) and 19 (stopping): the late
    # runs of slots 14 and 15 are outside the fault's settle time, so they count.
    assert found["steady_slots"] == 10 + 5
    assert found["start_delay_p99_s"] == 3.0
    assert found["start_delay_p50_s"] == 0.005
    assert found["skipped_slots"] == 4
    assert found["skipped"] == [slot_name(T0 + i * 2000) for i in range(10, 14)]
    assert found["skipped_in_steady_state"] == 0
    assert found["succeeded_without_item"] == [r.slot for r in runs]
    # A longer settle time (8 s) leaves out slots 14 and 15 as well.
    settled = audit_jobs(runs, [], [pause, stop], settle_ms=8000)
    assert settled["start_delay_p99_s"] == 0.005 and settled["steady_slots"] == 10 + 3


def test_outcomes_of_unfinished_and_fenced_runs_are_counted() -> None:
    runs = [_run(0), _run(1, outcome=RunOutcome.ABANDONED), _run(2, outcome=None),
            _run(3, outcome=RunOutcome.FENCED)]
    found = audit_jobs(runs, [_item(0), _item(1)], [])
    assert found["outcomes"] == {"abandoned": 1, "fenced": 1, "running": 1, "succeeded": 1}
    assert found["written_by_runs_not_succeeded"] == [slot_name(T0 + 2000)]
    assert found["stale_accepted"] == 0 and found["double_runs"] == 0


def jobs_section(**over: Any) -> dict[str, Any]:
    runs = [_run(i) for i in range(4)]
    section = {"workers": 3, "every_s": 2.0, "job_delay_s": 0.5, "lease_s": 2.0,
               "reconcile_s": 0.5, "steady_before_s": 30.0, "steady_after_s": 20.0,
               "settle_s": 4.0, "leader_failover_target_s": 3.0, "leader_failover_s": 2.6,
               **audit_jobs(runs, [_item(i) for i in range(4)], []),
               "pause": {"worker": "w2", "slot": runs[1].slot, "fence": 7, "paused_s": 9.5,
                         "new_leader": "w1", "new_leader_after_s": 2.4,
                         "slot_outcome": "abandoned", "slot_items": 0,
                         "job_exited_before_its_leader_resumed": True,
                         "runner_saw": {"outcome": "fenced", "exit_code": 3}},
               "kill9": {"worker": "w1", "new_leader": "w3", "failover_s": 2.6,
                         "slot": runs[3].slot, "slot_outcome": "abandoned", "slot_items": 1},
               "rolling_restart": {"sigterm_leader_handoffs": [
                   {"worker": "w3", "new_leader": "w5", "handoff_s": 0.8}]},
               "job_runs_by_metrics": {"succeeded": 4}, "leader_changes": 4,
               "two_leaders_seen_at_once": 0, "log_events": {}, "worker_exits": []}
    return {**section, **over}


def test_the_jobs_section_renders_with_its_targets(tmp_path: Path) -> None:
    result = {"profile": "small", "settings": sample_result()["settings"],
              "started_at": "2026-01-01T00:00:00Z",
              "scenarios": {"jobs": {"ok": True, "seconds": 120.0, "keys": ["jobs"]}},
              "jobs": jobs_section(start_delay_p99_s=1.25)}
    md = markdown(result)
    assert "## Singleton jobs" in md and "## Chaos" not in md
    assert [row[1] for row in targets(result)] == [
        "jobs.double_runs", "jobs.stale_accepted", "jobs.leader_failover_s",
        "jobs.start_delay_p99_s"]
    assert "| `jobs.double_runs` | 0 | 0 | yes |" in md
    assert "| `jobs.leader_failover_s` | 2.6 | <= lease + reconcile + 0.5 = 3.0 s | yes |" in md
    assert "| `jobs.start_delay_p99_s` | 1.25 | <= 1 s | **no** |" in md
    assert "its leader saw fenced, exit code 3); the slot is recorded **abandoned** with 0 " \
        "item(s) written" in md
    assert f"kill -9 of the leader w1 early in slot {_run(3).slot} (its job left running): w3 " \
        "led after 2.60 s; the slot is recorded abandoned with 1 item(s) written" in md
    assert "SIGTERM of the leader w3: w5 led after 0.80 s" in md
    doc = json.loads(Path(write_reports(result, tmp_path)["json"]).read_text())
    assert {"double_runs", "stale_accepted", "leader_failover_s",
            "start_delay_p99_s"} <= set(doc["jobs"])


def test_a_jobs_run_that_found_no_new_leader_still_renders() -> None:
    result = {"profile": "small", "settings": sample_result()["settings"],
              "scenarios": {"jobs": {"ok": False, "error": "no new leader"}},
              "jobs": jobs_section(leader_failover_s=None, pause={"error": "no leader to pause"},
                                   kill9={"worker": "w1", "new_leader": None,
                                          "failover_s": None})}
    md = markdown(result)
    assert "| `jobs.leader_failover_s` | - |" in md
    assert "- pause: **no leader to pause**" in md
    assert "no worker led after -" in md


def test_jobs_correctness_figures_fail_the_run() -> None:
    assert audit.correctness_failures({"jobs": jobs_section()}) == {}
    bad = {"jobs": jobs_section(double_runs=1, stale_accepted=2)}
    assert audit.correctness_failures(bad) == {"jobs.double_runs": 1, "jobs.stale_accepted": 2}


def test_the_dynamodb_sink_cost_section_renders_its_curve_and_targets() -> None:
    from loadtest.sink_cost import month_usd, transaction_wru

    assert transaction_wru(300, [900]) == 4  # checkpoint + one KB of events, doubled
    assert transaction_wru(300, [1025]) == 6
    assert round(month_usd(4.0), 2) == 6.48  # one message a write at 1 msg/s
    curve = {str(w): {"window_s": w, "streams": 4, "messages_per_transaction": m,
                      "wru_per_message": 4 / m, "cost_per_stream_month_1hz": month_usd(4 / m),
                      "latency_p50_s": w, "latency_p99_s": w, "latency_max_s": w}
             for w, m in ((0.2, 1.0), (4.5, 5.0))}
    result = {"scenarios": {"sinks": {"ok": True}},
              "sinks": {"dynamodb": {"cost_per_stream_month_1hz": 1.3, "added_latency_s": 4.5,
                                     "default_window_s": 4.5, "curve": curve,
                                     "rate_msgs_per_s": 1.0}}}
    text = markdown(result)
    assert "## Sink cost: dynamodb" in text and "| 4.5 s | 5 |" in text
    rows = {key: met for _, key, _, _, met in targets(result)}
    assert rows["sinks.dynamodb.cost_per_stream_month_1hz"] is True
    assert rows["sinks.dynamodb.added_latency_s"] is True


# -- the sinks scenario's audit, section and correctness rule -------------------------------


def _copies(sid: str, pairs: list[tuple[int, int]]) -> list[Delivery]:
    """Intact copies of ``(seq, fence)`` in destination order."""
    return [delivery(sid, seq, fence, frame_for(sid, seq)) for seq, fence in pairs]


def test_a_clean_destination_audits_to_zero() -> None:
    found = {"s001": _copies("s001", [(1, 1), (2, 1), (3, 1)]),
             "s002": _copies("s002", [(1, 2), (2, 2)])}
    audit = audit_deliveries({"s001": 3, "s002": 2}, found)
    assert audit == {"messages": 5, "lost": 0, "mismatched": 0, "duplicated": 0,
                     "dup_outside_takeover": 0, "dup_across_takeover": 0, "out_of_order": 0,
                     "fences_seen": 2, "checkpointed": 5}


def test_the_audit_tells_a_takeover_duplicate_from_one_within_a_tenure() -> None:
    # s001: fence 1 wrote 1-4 but checkpointed 3; fence 2 resent 4 (a takeover duplicate),
    # then repeated 5 under its own fence (a duplicate within one tenure) and went back.
    found = {"s001": _copies("s001", [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2), (5, 2),
                                      (5, 2), (6, 2), (5, 2)])}
    audit = audit_deliveries({"s001": 7}, found)
    assert audit["lost"] == 1  # seq 7: checkpointed, never arrived
    assert audit["lost_seqs"] == ["s001:7"]
    assert audit["duplicated"] == 3  # one extra 4, two extra 5s
    assert audit["dup_outside_takeover"] == 2  # the 5s, all under fence 2
    assert audit["dup_across_takeover"] == 1
    assert audit["out_of_order"] == 1  # 6 then 5 under fence 2
    assert audit["fences_seen"] == 2 and audit["messages"] == 9


def test_a_corrupted_copy_counts_as_lost_and_a_stream_never_written_loses_all() -> None:
    found = {"s001": [delivery("s001", 1, 1, frame_for("s001", 1)),
                      delivery("s001", 2, 1, frame_for("s002", 2)),  # another stream's data
                      delivery("s001", 3, 1, "not json")]}
    audit = audit_deliveries({"s001": 3, "s002": 4}, found)
    assert audit["mismatched"] == 2
    assert audit["lost"] == 2 + 2 + 4  # seqs 2 and 3 of s001 missing intact, plus the copies


def test_json_lines_skip_what_is_not_a_record() -> None:
    text = ('{"stream_id":"s001","seq":1,"fence":1,"data":{}}\n\n{"seq":2}\n'
            '{"stream_id":"s001","seq":2,"fe')  # a torn last line
    records, bad = json_lines(text)
    assert [r["seq"] for r in records] == [1] and bad == 2
    assert from_records(records)["s001"][0].seq == 1


def sinks_section() -> dict[str, Any]:
    clean = {"messages": 1200, "lost": 0, "duplicated": 0, "dup_outside_takeover": 0,
             "out_of_order": 0, "streams": 6, "rate": 10.0, "workers": 3}
    return {
        "dynamodb": {**clean, "guarantee": "exactly once", "exactly_once": True},
        "postgres": {"guarantee": "exactly once", "skipped": "PostgreSQL could not start"},
        "kinesis": {**clean, "guarantee": "at least once", "exactly_once": False,
                    "duplicated": 12, "dup_across_takeover": 12, "sink_failures": 1},
        "python": {**clean, "guarantee": "at least once", "exactly_once": False,
                   "ratio_to_bare": 0.91, "msgs_per_s_noop": 45000,
                   "batch_max_messages": 1000},
    }


def test_the_sinks_section_renders_with_its_targets(tmp_path: Path) -> None:
    result = {"profile": "small", "settings": sample_result()["settings"],
              "started_at": "2026-01-01T00:00:00Z",
              "scenarios": {"sinks": {"ok": True, "seconds": 300.0, "keys": []},
                            "throughput": {"ok": True, "seconds": 100.0, "keys": []}},
              "sinks": sinks_section()}
    md = markdown(result)
    assert "## Sinks" in md and "## Chaos" not in md
    assert "| dynamodb | exactly once | 1,200 | 0 | 0 | 0 | 0 |" in md
    assert "| kinesis | at least once | 1,200 | 0 | 12 | 0 | 0 |" in md
    assert "| postgres | exactly once | skipped: PostgreSQL could not start |" in md
    assert "45,000 msg/s, **0.91** of a bare websockets client" in md
    assert [row[1] for row in targets(result)] == [
        "sinks.dynamodb.cost_per_stream_month_1hz", "sinks.dynamodb.added_latency_s",
        "sinks.dynamodb.lost", "sinks.dynamodb.duplicated", "sinks.postgres.lost",
        "sinks.postgres.duplicated", "sinks.kinesis.lost",
        "sinks.kinesis.dup_outside_takeover", "sinks.python.lost",
        "sinks.python.dup_outside_takeover", "sinks.python.ratio_to_bare"]
    assert "| `sinks.postgres.lost` | skipped | 0 | - |" in md
    assert "| `sinks.kinesis.dup_outside_takeover` | 0 | 0 | yes |" in md
    assert "| `sinks.python.ratio_to_bare` | 0.91 | >= 0.8 | yes |" in md
    doc = json.loads(Path(write_reports(result, tmp_path)["json"]).read_text())
    assert doc["sinks"]["kinesis"]["dup_outside_takeover"] == 0


def test_sink_correctness_figures_fail_the_run() -> None:
    assert audit.correctness_failures({"sinks": sinks_section()}) == {}
    bad = sinks_section()
    bad["kinesis"]["lost"] = 2
    bad["kinesis"]["dup_outside_takeover"] = 1  # duplicated (12) alone is allowed
    bad["dynamodb"]["duplicated"] = 3  # not for an exactly-once sink
    bad["python"]["out_of_order"] = 4  # reported, not a failure
    assert audit.correctness_failures({"sinks": bad}) == {
        "sinks.kinesis.lost": 2, "sinks.kinesis.dup_outside_takeover": 1,
        "sinks.dynamodb.duplicated": 3}


async def test_sink_figures_of_two_scenarios_merge_under_one_section(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async def sinks(ctx: Context) -> dict[str, Any]:
        return {"sinks": {"python": {"lost": 0}, "file": {"lost": 1}}}

    monkeypatch.setattr(runner, "runners", lambda: {"sinks": sinks})
    args = runner.build_parser().parse_args(["--scenarios", "sinks"])
    ctx = Context(args, dict(PROFILES["small"]), tmp_path)
    previous = {"scenarios": {"throughput": {"ok": True, "keys": [
        "msgs_per_s", "sinks.python.ratio_to_bare"]},
        "sinks": {"ok": True, "keys": ["sinks.file.lost", "sinks.http.lost"]}},
        "msgs_per_s": {"bare_client": 1}, "sinks": {"python": {"ratio_to_bare": 0.9},
                                                    "http": {"lost": 5}}}
    result = await runner.run_scenarios(ctx, args.scenarios, previous)
    assert result["sinks"] == {"python": {"lost": 0, "ratio_to_bare": 0.9}, "file": {"lost": 1}}
    assert result["scenarios"]["sinks"]["keys"] == ["sinks.python.lost", "sinks.file.lost"]
    assert result["msgs_per_s"] == {"bare_client": 1}
    assert audit.correctness_failures(result) == {"sinks.file.lost": 1}


def test_sink_selection() -> None:
    assert "sinks" in runner.parse_scenarios("default") and "sinks" in runner.runners()
    assert runner.build_parser().parse_args([]).sinks == list(SINKS)
    assert parse_sinks("file,sqs_fifo,kinesis") == ["kinesis", "file", "sqs_fifo"]
    assert "sqs_fifo" in parse_sinks("all") and "sqs_fifo" not in parse_sinks("default")
    with pytest.raises(Exception, match="unknown sink"):
        parse_sinks("file,nope")


# -- the upstreams scenario's audit, section and correctness rule ---------------------------


def _gap(after: int, missing: tuple[int, int] | None = None) -> str:
    body: dict[str, Any] = {"reason": "takeover", "after_seq": after, "since_ms": None,
                            "until_ms": 1}
    if missing is not None:
        body["missing_from"], body["missing_to"] = missing
    return json.dumps({"streamlease_gap": body})


def _live(sid: str, seqs: list[int | tuple[int, int]]) -> list[tuple[int, str]]:
    """Delivered (seq, text) of the live feed: a number is its frame (at that seq), a pair
    ``(before, after)`` the gap record between those numbers."""
    out: list[tuple[int, str]] = []
    for item in seqs:
        if isinstance(item, tuple):
            before, after = item
            out.append((before + 1, _gap(before, (before + 1, after - 1))))
        else:
            out.append((item, str(mode_frame("live", sid, item))))
    return out


def test_a_replaying_feed_audits_against_its_own_numbering() -> None:
    sid = "s001"
    clean = [(n, str(mode_frame("gateway", sid, n))) for n in range(1, 6)]
    assert audit_feed("gateway", sid, clean, replays=True) == {
        "messages": 5, "lost": 0, "mismatched": 0, "seq_differs": 0, "duplicated": 0,
        "out_of_order": 0, "gap_records": 0, "gaps_with_loss": 0, "gap_ranges_wrong": 0,
        "lost_in_gaps": 0, "lost_outside_gaps": 0}
    # 2 missing, 4 twice, 3 after 4, 6 another stream's frame: a replaying feed loses
    # nothing, from 1 (the first connection asks for 1).
    bad = [(n, str(mode_frame("gateway", sid, n))) for n in (1, 4, 4, 3, 5)]
    bad.append((6, str(mode_frame("gateway", "s002", 6))))
    found = audit_feed("gateway", sid, bad, replays=True)
    assert found["lost"] == 2 and found["mismatched"] == 1  # 2 never came; 6 not intact
    assert found["duplicated"] == 1 and found["out_of_order"] == 1
    late = [(n, str(mode_frame("subscribe", sid, n))) for n in (3, 4)]
    assert audit_feed("subscribe", sid, late, replays=True)["lost"] == 2  # 1 and 2
    # A replayed message stored under another seq than the feed's number is flagged.
    moved = [(7, str(mode_frame("subscribe", sid, 1)))]
    assert audit_feed("subscribe", sid, moved, replays=True)["seq_differs"] == 1


def test_losses_of_a_feed_that_cannot_replay_are_placed_by_gap_records() -> None:
    sid = "s001"
    # 10-12, a gap record, 20-21 (13-19 lost inside it); then 24 with no record (22-23
    # lost outside any recorded gap).
    messages = _live(sid, [10, 11, 12, (12, 20), 20, 21, 24])
    found = combine([audit_feed("live", sid, messages, replays=False)])
    assert found["messages"] == 6 and found["gap_records"] == 1
    assert found["lost"] == 9 and found["lost_in_gaps"] == 7
    assert found["lost_outside_gaps"] == 2 and found["loss_in_gaps"] == round(7 / 9, 4)
    assert found["gaps_with_loss"] == 1 and found["gap_ranges_wrong"] == 0
    # Numbers before the first delivered are not losses (the feed is read from wherever
    # it is); a record whose missing range is not the numbers between its neighbours is.
    wrong = [(5, str(mode_frame("live", sid, 5))), (6, _gap(5, (6, 7))),
             (9, str(mode_frame("live", sid, 9)))]
    found = combine([audit_feed("live", sid, wrong, replays=False)])
    assert found["lost"] == 3 and found["loss_in_gaps"] == 1.0
    assert found["gap_ranges_wrong"] == 1
    assert combine([audit_feed("live", sid, _live(sid, [1, 2]), replays=False)])[
        "loss_in_gaps"] is None  # nothing lost: no share to report


def test_binary_frames_numbered_by_the_worker_are_audited_by_their_bytes() -> None:
    from streamlease.core.upstream import binary_text

    sid = "s001"

    def frame(n: int) -> str:
        raw = mode_frame("binary", sid, n)
        assert isinstance(raw, bytes)
        return binary_text(raw)

    # Worker seqs 1.. count frames and records; the feed's numbers are in the bytes.
    messages = [(1, frame(40)), (2, frame(41)), (3, _gap(2)), (4, frame(47)),
                (5, _gap(4)), (6, frame(48)), (7, frame(48))]
    found = audit_feed("binary", sid, messages, replays=False)
    assert found["messages"] == 5 and found["duplicated"] == 1
    assert found["lost"] == 5 and found["lost_in_gaps"] == 5  # 42-46, inside the first
    assert found["gap_records"] == 2 and found["gaps_with_loss"] == 1
    assert found["seq_differs"] == 0  # the worker's numbers are not the feed's, by design
    assert audit_feed("binary", sid, [(1, '{"streamlease_binary":"AAAA"}')],
                      replays=False)["mismatched"] == 1


def upstreams_section() -> dict[str, Any]:
    clean = {"messages": 3000, "lost": 0, "duplicated": 0, "out_of_order": 0,
             "mismatched": 0, "stale_accepted": 0, "gap_records": 0, "lost_in_gaps": 0,
             "lost_outside_gaps": 0, "loss_in_gaps": None, "streams": 12, "rate": 10.0,
             "workers": 3}
    lossy = {**clean, "messages": 2000, "lost": 450, "gap_records": 30, "lost_in_gaps": 450,
             "loss_in_gaps": 1.0, "upstream_gaps_counted": {"takeover": 27, "reconnect": 3}}
    return {
        "query": {**clean, "feed": "subscribe", "profile": "subscribe", "replays": True},
        "message": {**clean, "feed": "gateway", "profile": "gateway", "replays": True},
        "none": {**lossy, "feed": "live", "profile": "live", "replays": False},
        "none_count": {**lossy, "feed": "binary", "profile": "binary", "replays": False},
        "profile_ratio": 0.93, "profile_ratio_subscribe": 0.88,
        "profile_throughput": {"msgs_per_s": {"streams": 40000, "gateway": 37200,
                                              "subscribe": 35200},
                               "msgs_per_cpu_s": {"streams": 50000, "gateway": 45000,
                                                  "subscribe": 44000},
                               "cpu_ratio": 0.9, "cpu_ratio_subscribe": 0.88,
                               "streams": 10, "seconds": 8.0, "rounds": 2,
                               "batch_max_messages": 1000, "load_average": [1.0, 1.2]},
    }


def test_the_upstreams_section_renders_with_its_targets(tmp_path: Path) -> None:
    result = {"profile": "small", "settings": sample_result()["settings"],
              "started_at": "2026-01-01T00:00:00Z",
              "scenarios": {"upstreams": {"ok": True, "seconds": 200.0, "keys": ["upstreams"]}},
              "upstreams": upstreams_section()}
    md = markdown(result)
    assert "## Upstream profiles" in md and "## Sinks" not in md
    assert [row[1] for row in targets(result)] == [
        "upstreams.query.lost", "upstreams.query.duplicated", "upstreams.message.lost",
        "upstreams.message.duplicated", "upstreams.none.duplicated",
        "upstreams.none.loss_in_gaps", "upstreams.none_count.duplicated",
        "upstreams.none_count.loss_in_gaps", "upstreams.profile_ratio"]
    assert "| query | /subscribe/, subscribe | 3,000 | 0 | 0 | 0 | 0 | 0 | - |" in md
    assert "| none | /live/, live | 2,000 | 450 | 0 | 0 | 30 | 450 | 100.0 % |" in md
    assert "| `upstreams.none.loss_in_gaps` | 1 | 100 % (1.0) | yes |" in md
    assert "| `upstreams.profile_ratio` | 0.93 | >= 0.9 | yes |" in md
    assert "**0.93** of the built-in" in md
    assert "gap records counted, by reason takeover 27, reconnect 3" in md
    doc = json.loads(Path(write_reports(result, tmp_path)["json"]).read_text())
    for mode in ("query", "message"):
        assert {"lost", "duplicated"} <= set(doc["upstreams"][mode])
    for mode in ("none", "none_count"):
        assert {"duplicated", "loss_in_gaps", "lost", "gap_records"} <= set(
            doc["upstreams"][mode])
    assert doc["upstreams"]["profile_ratio"] == 0.93
    # A mode that failed shows as an error, its targets unmet rather than missing.
    broken = {**result, "upstreams": {**upstreams_section(),
                                      "message": {"feed": "gateway", "error": "boom"}}}
    assert "| `upstreams.message.lost` | error | 0 | - |" in markdown(broken)


def test_upstream_correctness_figures_fail_the_run() -> None:
    assert audit.correctness_failures({"upstreams": upstreams_section()}) == {}
    bad = upstreams_section()
    bad["query"]["lost"] = 2
    bad["message"]["duplicated"] = 1
    bad["none"]["lost_outside_gaps"] = 3  # lost alone (450) is expected without replay
    bad["none_count"]["stale_accepted"] = 1
    assert audit.correctness_failures({"upstreams": bad}) == {
        "upstreams.query.lost": 2, "upstreams.message.duplicated": 1,
        "upstreams.none.lost_outside_gaps": 3, "upstreams.none_count.stale_accepted": 1}


async def test_a_run_of_another_scenario_keeps_the_upstream_figures(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async def skew(ctx: Context) -> dict[str, Any]:
        return {"skew": {"settled": True}}

    monkeypatch.setattr(runner, "runners", lambda: {"skew": skew})
    args = runner.build_parser().parse_args(["--scenarios", "skew"])
    ctx = Context(args, dict(PROFILES["small"]), tmp_path)
    previous = {"scenarios": {"upstreams": {"ok": True, "keys": ["upstreams"]}},
                "upstreams": upstreams_section()}
    result = await runner.run_scenarios(ctx, args.scenarios, previous)
    assert result["upstreams"] == upstreams_section()
    assert result["scenarios"]["upstreams"]["from_previous_run"] is True


def test_upstream_selection() -> None:
    assert "upstreams" in runner.parse_scenarios("default") and "upstreams" in runner.runners()
    assert runner.parse_scenarios("upstreams") == ["upstreams"]
    assert runner.build_parser().parse_args([]).upstream_modes == list(UPSTREAM_MODES)
    assert parse_modes("none_count,query") == ["query", "none_count"]
    with pytest.raises(Exception, match="unknown upstream mode"):
        parse_modes("query,nope")


# -- the control plane's figures: read growth, index moves, kill -9 at defaults, balance ---


def test_converged_is_the_first_sample_from_which_the_band_holds_for_good() -> None:
    timeline = [
        (0.0, {"w1": 5, "w2": 0}),
        (1.0, {"w1": 20, "w2": 20, "w3": 0, "w4": 0}),  # scale-out at 1.0
        (2.0, {"w1": 11, "w2": 9, "w3": 10, "w4": 10}),  # in the band ...
        (3.0, {"w1": 12, "w2": 8, "w3": 10, "w4": 10}),  # ... out again
        (4.0, {"w1": 11, "w2": 9, "w3": 10, "w4": 10}),
        (5.0, {"w1": 10, "w2": 10, "w3": 10, "w4": 10}),
    ]
    assert balance_scenario.in_band({"w1": 11, "w2": 9, "w3": 10, "w4": 10}, 4, 10, 40)
    assert not balance_scenario.in_band({"w1": 11, "w2": 9, "w3": 10}, 4, 10, 40)  # a worker short
    assert not balance_scenario.in_band({"w1": 11, "w2": 9, "w3": 9, "w4": 10}, 4, 10, 40)  # unheld
    assert balance_scenario.converged_at(timeline, 1.0, 4, 10, 40) == 4.0
    assert balance_scenario.converged_at(timeline[:4], 1.0, 4, 10, 40) is None  # ends outside


def test_unowned_spells_from_table_reads() -> None:
    ids = ["a", "b", "c"]
    history = [
        (0.0, frozenset({"a"})),
        (1.0, frozenset({"a", "b"})),  # scale-out at 1.0; c not taken yet
        (1.5, frozenset({"b", "c"})),  # a handed over: unowned from 1.5
        (2.0, frozenset({"b", "c"})),
        (4.5, frozenset({"a", "c"})),  # a taken at 4.5; b now unowned
        (5.0, frozenset({"a", "c"})),
    ]
    spans = balance_scenario.unowned_spans(history, ids, since=1.0, until=5.0)
    assert [(s.stream, s.start, s.end, s.kind, s.open) for s in spans] == [
        ("a", 1.5, 4.5, "handover", False),
        ("b", 4.5, 5.0, "handover", True),
        ("c", 1.0, 1.5, "first_owner", False),  # clipped to the scale-out
    ]
    assert balance_scenario.unowned_spans(history, ids, since=5.0, until=5.0) == []


def test_startup_balance_figures() -> None:
    from loadtest.fleet import Acquisition

    ids = [f"s{i}" for i in range(4)]
    timeline = [(0.0, {"w1": 2, "w2": 0}), (1.0, {"w1": 4, "w2": 0, "w3": 0}),
                (2.0, {"w1": 3, "w2": 0, "w3": 0}), (3.0, {"w1": 2, "w2": 1, "w3": 1}),
                (4.0, {"w1": 2, "w2": 1, "w3": 1})]
    history = [(0.0, frozenset(ids[:2])), (1.0, frozenset(ids)),
               (2.0, frozenset(ids[:3])), (3.0, frozenset(ids)), (4.0, frozenset(ids))]
    acquisitions = [Acquisition(0.0, "s0", "w1", 1, None), Acquisition(0.0, "s1", "w1", 1, None),
                    Acquisition(1.0, "s2", "w1", 1, None), Acquisition(1.0, "s3", "w1", 1, None),
                    Acquisition(3.0, "s3", "w2", 2, "w1"), Acquisition(3.0, "s2", "w3", 2, "w1"),
                    Acquisition(4.0, "s1", "w3", 2, "w1")]  # a swap after converging
    found = balance_scenario.startup_balance(timeline, history, ids, acquisitions, scale_at=1.0,
                                      end=4.0, workers=3, share=2, streams=4)
    assert found["converge_s"] == 2.0 and found["converged"] is True
    assert found["first_in_band_s"] == 2.0
    assert found["moves"] == 2 and found["moves_after_converged"] == 1
    assert found["moves_before_scale_out"] == 0
    assert found["unowned_max_s"] == 1.0
    assert found["unowned_worst"] == {"stream": "s3", "from": 2.0, "to": 3.0,
                                      "kind": "handover", "open": False}
    assert found["unowned_over_2_s"] == 0 and found["read_interval_s"] == 1.0
    never = balance_scenario.startup_balance(timeline[:3], history[:3], ids, acquisitions[:4], 1.0,
                                      2.0, 3, 2, 4)
    assert never["converge_s"] is None and never["moves_after_converged"] is None


def test_index_moves_measured_or_implied_by_the_renew_setting() -> None:
    writes = {"renewals": 0.0, "acquisitions": 20.0, "releases": 0.0,
              "releases_on_behalf": 0.0, "unserved_released": 0.0}
    # 2,000 streams for 60 s: 2,000 stream-minutes; 20 acquisitions = 0.01 per stream-minute.
    short = scale_scenario.index_moves(writes, 2000.0, 60.0, 600.0)
    assert short["index_moves_measured_per_stream_minute"] == pytest.approx(0.02)
    assert short["index_moves_per_stream_minute"] == pytest.approx(2 * (0.1 + 0.01))
    assert short["index_moves_source"].startswith("setting")
    long = scale_scenario.index_moves({**writes, "renewals": 200.0}, 2000.0, 700.0, 600.0)
    assert long["index_moves_per_stream_minute"] == pytest.approx(2 * 0.11)
    assert long["index_moves_source"] == "measured over 700 s"
    # No renewal setting (renewals gone from the design): what was measured.
    assert scale_scenario.index_moves(writes, 2000.0, 60.0, None)[
        "index_moves_per_stream_minute"] == pytest.approx(0.02)
    assert scale_scenario.index_moves(writes, 0.0, 60.0, 600.0)[
        "index_moves_per_stream_minute"] is None


def test_items_read_per_worker_minute_from_two_scrapes() -> None:
    key = 'streamlease_dynamodb_items_read_total{operation="%s"}'
    req = 'streamlease_dynamodb_requests_total{operation="%s",outcome="ok"}'
    before = {"w1": {key % "query": 10.0, key % "get_item": 0.0, req % "query": 5.0},
              "w2": {key % "query": 0.0}}
    after = {"w1": {key % "query": 70.0, key % "get_item": 30.0, req % "query": 35.0,
                    req % "update_item": 99.0},
             "w2": {key % "query": 100.0}}
    found = scale_scenario.read_rates(before, after, ["w1", "w2"], 60.0)
    assert found["items_per_worker_minute"] == 95.0  # (60 + 30 + 100) over 2 worker-minutes
    assert found["items_per_worker_minute_by_operation"] == {"get_item": 15.0, "query": 80.0}
    assert found["read_requests_per_worker_minute"] == 15.0  # writes left out
    old_build = scale_scenario.read_rates({"w1": {}}, {"w1": {req % "query": 3.0}}, ["w1"], 60.0)
    assert old_build["items_per_worker_minute"] is None and "items_not_counted" in old_build


def test_items_read_by_the_leader_and_by_the_other_members_apart() -> None:
    """The leader (led through the whole window) and the other members, apart; a window
    in which leadership moved is not split."""
    key = 'streamlease_dynamodb_items_read_total{operation="%s"}'
    lead = "streamlease_is_leader"
    before = {"w1": {key % "query": 0.0, lead: 1.0}, "w2": {key % "get_item": 0.0, lead: 0.0},
              "w3": {key % "get_item": 0.0, lead: 0.0}}
    after = {"w1": {key % "query": 80.0, lead: 1.0}, "w2": {key % "get_item": 120.0, lead: 0.0},
             "w3": {key % "get_item": 60.0, lead: 0.0}}
    roles = scale_scenario.read_rates_by_role(before, after, ["w1", "w2", "w3"], 60.0)["roles"]
    assert roles["leader"]["worker"] == "w1"
    assert roles["leader"]["items_per_worker_minute"] == 80.0
    assert roles["members"]["workers"] == 2
    assert roles["members"]["items_per_worker_minute"] == 90.0
    moved = {**after, "w1": {**after["w1"], lead: 0.0}, "w2": {**after["w2"], lead: 1.0}}
    split = scale_scenario.read_rates_by_role(before, moved, ["w1", "w2", "w3"], 60.0)
    assert split["roles"] is None and "0 workers led" in split["roles_not_split"]


def issue20_sections() -> dict[str, Any]:
    sections = scenario_sections()
    sections["scenarios"].update({name: {"ok": True, "seconds": 60.0, "keys": []} for name in
                                  ("scale_reads", "kill9_defaults", "balance_startup")})
    sections["scale"].update({
        "per_worker_read_growth": 2.4, "items_read_per_worker_minute_2_workers": 100.0,
        "items_read_per_worker_minute_8_workers": 240.0,
        "reads": {"streams_per_worker": 25, "window_s": 60.0, "counted": "every read",
                  "runs": {"2": {"items_per_worker_minute": 100.0,
                                 "items_per_worker_minute_by_operation": {"query": 100.0},
                                 "read_requests_per_worker_minute": 30.0},
                           "8": {"items_per_worker_minute": 240.0}}},
        "index_moves_per_stream_minute": 0.2, "index_moves_source": "setting: ...",
        "lease_writes_per_stream_minute": {"renewals": 0.0}, "kill9_p99": 37.0})
    sections["balance"]["during_startup"] = {
        "streams": 40, "share": 10, "lease_s": 2.0, "first_held_s": 1.2,
        "held_at_scale_out": {"w1": 3, "w2": 0}, "converge_s": 15.0, "first_in_band_s": 12.0,
        "moves": 27, "moves_after_converged": 0, "unowned_max_s": 5.5,
        "unowned_worst": {"stream": "s007", "from": 3.0, "to": 8.5, "kind": "handover",
                          "open": False},
        "unowned_max_s_by_kind": {"handover": 5.5}, "unowned_over_2_s": 2,
        "read_interval_s": 0.4, **AUDIT}
    sections["kill9_defaults"] = {
        "workers": 3, "streams": 300, "rate": 0.5, "kills": 2, "all_held_s": 50.0,
        "replacement": "a new worker started right after each kill",
        "kills_detail": [{"streams": 100}, {"streams": 100}],
        "kill9": {**FAILOVER, "p99": 24.0}, "kill9_connected": {**FAILOVER, "p99": 21.0},
        **AUDIT}
    return sections


def test_issue_20_figures_render_with_their_targets(tmp_path: Path) -> None:
    result = {**sample_result(), **issue20_sections()}
    result["failover"]["kill9_defaults"] = {**FAILOVER, "p99": 24.0, "recovery": "delivered"}
    rows = {key: (value, target, met) for _, key, value, target, met in targets(result)}
    assert rows["scale.per_worker_read_growth"] == (2.4, "<= 1.2", False)
    assert rows["scale.index_moves_per_stream_minute"] == (0.2, "0", False)
    assert rows["scale.kill9_p99"] == (37.0, "<= member lease + 5 s = 10 s", False)
    # The report's copy of the worker's default member lease.
    from loadtest.report import DEFAULT_MEMBER_LEASE_S
    from streamlease.config import WorkerConfig
    assert WorkerConfig.from_env({}).timings.lease_s == DEFAULT_MEMBER_LEASE_S
    assert rows["failover.kill9_defaults.p99"] == (24.0, "<= 10 s", False)
    assert rows["balance.during_startup.converge_s"] == (15.0, "<= 10 s", False)
    assert rows["balance.during_startup.moves"] == (27, "<= 25", False)
    assert rows["balance.during_startup.unowned_max_s"] == (5.5, "<= 2 s", False)
    assert rows["balance.converge_s"][0] is None  # the existing keys stay
    md = Path(write_reports(result, tmp_path)["md"]).read_text()
    for text in ("### Control-plane reads per worker", "| 2 | 100 | query 100 | 30 |",
                 "### Scale-out during start-up", "moves until then: **27**",
                 "## kill -9 at the default settings", "| kill -9, connected again |",
                 "Index-key moves per held stream-minute: **0.2**",
                 "| `balance.during_startup.unowned_max_s` | 5.5 | <= 2 s | **no** |"):
        assert text in md, text


def test_one_step_alone_renders_without_the_rest_of_its_section() -> None:
    sections = issue20_sections()
    result = {"profile": "small", "settings": sample_result()["settings"],
              "scenarios": {"scale_reads": {"ok": True, "keys": []},
                            "balance_startup": {"ok": True, "keys": []}},
              "scale": {k: sections["scale"][k] for k in ("per_worker_read_growth", "reads")},
              "balance": {"during_startup": sections["balance"]["during_startup"]}}
    md = markdown(result)
    assert "### Control-plane reads per worker" in md and "### Scale-out during" in md
    assert [row[1] for row in targets(result)] == [
        "scale.per_worker_read_growth", "balance.during_startup.converge_s",
        "balance.during_startup.moves", "balance.during_startup.unowned_max_s"]


async def test_steps_of_a_shared_section_keep_each_others_figures(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async def reads(ctx: Context) -> dict[str, Any]:
        return {"scale": {"per_worker_read_growth": 1.1, "reads": {"runs": {}}}}

    async def scale(ctx: Context) -> dict[str, Any]:
        return {"scale": {"streams": 2000, "kill9_p99": 20.0}, "capacity_model": {"x": 1}}

    monkeypatch.setattr(runner, "runners", lambda: {"scale_reads": reads, "scale": scale})
    args = runner.build_parser().parse_args(["--scenarios", "scale_reads"])
    ctx = Context(args, dict(PROFILES["small"]), tmp_path)
    # An earlier run recorded the whole section (before it was shared).
    previous = {"scenarios": {"scale": {"ok": True, "keys": ["scale", "capacity_model"]}},
                "scale": {"streams": 2000, "kill9": {"p99": 37.0}}, "capacity_model": {"x": 0}}
    result = await runner.run_scenarios(ctx, args.scenarios, previous)
    assert result["scale"] == {"streams": 2000, "kill9": {"p99": 37.0},
                               "per_worker_read_growth": 1.1, "reads": {"runs": {}}}
    assert result["scenarios"]["scale_reads"]["keys"] == ["scale.per_worker_read_growth",
                                                          "scale.reads"]
    # And the other way round: the scale run over a result that holds the reads step's keys.
    args = runner.build_parser().parse_args(["--scenarios", "scale"])
    ctx = Context(args, dict(PROFILES["small"]), tmp_path)
    again = await runner.run_scenarios(ctx, args.scenarios, result)
    assert again["scale"] == {"streams": 2000, "kill9_p99": 20.0,
                              "per_worker_read_growth": 1.1, "reads": {"runs": {}}}
    assert again["capacity_model"] == {"x": 1}


def test_the_start_up_step_audits_like_a_section() -> None:
    result = {"balance": {"lost": 0, "during_startup": {"lost": 2, "duplicated": 0}},
              "kill9_defaults": {"stale_accepted": 1}}
    assert audit.correctness_failures(result) == {"balance.during_startup.lost": 2,
                                                  "kill9_defaults.stale_accepted": 1}
    assert {"kill9_defaults", "balance_startup", "scale_reads"} <= set(runner.runners())


# -- tracing: linked hand-offs, take-overs, the trace picture -------------------------------

T_NS = 1_800_000_000_000_000_000  # epoch ns: the spans' time origin


def _span(name: str, worker: str, trace: int, span: int, start_ms: float, end_ms: float,
          parent: int | None = None, links: tuple[tuple[int, int], ...] = (),
          **attrs: Any) -> otlp.Span:
    return otlp.Span(
        name=f"streamlease.{name}", trace_id=f"{trace:032x}", span_id=f"{span:016x}",
        parent_id=f"{parent:016x}" if parent is not None else None,
        start_ns=T_NS + int(start_ms * 1e6), end_ns=T_NS + int(end_ms * 1e6),
        attributes={f"streamlease.{k}": v for k, v in attrs.items()},
        links=tuple(otlp.Link(f"{t:032x}", f"{s:016x}", {"streamlease.link": "release"})
                    for t, s in links),
        instance=worker, service="streamlease")


def sample_spans() -> list[otlp.Span]:
    """w1 SIGTERM'd: s1 handed to w2 end to end; s2 acquired by w3 (linked) but with no
    first flush yet; s3 released with no span exported. w4 killed at -1,500 ms: w2 took
    s4 over, w3 took s5 and s6 (the slower take-over)."""
    return [
        _span("release", "w1", 1, 11, 0, 12, stream="s1", reason="shutdown", fence=3,
              released=True),
        _span("release", "w1", 1, 10, -40, -30, stream="s1", reason="shutdown", fence=3,
              released=False, attempt=1),  # an attempt that did not release it
        _span("reconcile", "w2", 2, 20, 150, 420, held=2, orphans=1),
        _span("acquire", "w2", 2, 21, 160, 300, parent=20, links=((1, 11),), stream="s1",
              how="released", acquired=True, fence=4),
        _span("resume_read", "w2", 2, 22, 250, 290, parent=21, stream="s1", fence=4),
        _span("dial", "w2", 2, 23, 310, 330, parent=21, stream="s1", fence=4),
        _span("first_flush", "w2", 2, 24, 640, 660, parent=23, stream="s1", fence=4,
              messages=6, first_seq=101, last_seq=106),
        _span("release", "w1", 3, 31, 1, 9, stream="s2", reason="shutdown", fence=8,
              released=True),
        _span("acquire", "w3", 4, 41, 200, 260, links=((3, 31),), stream="s2",
              how="released", acquired=True, fence=9),
        # An acquisition linked to s1's release but on the releasing worker: not a hand-off.
        _span("acquire", "w1", 9, 91, 100, 110, links=((1, 11),), stream="s1",
              how="released", acquired=True),
        _span("takeover", "w2", 5, 50, 0, 400, member="w4", epoch=2),
        _span("acquire", "w2", 5, 51, 10, 90, parent=50, stream="s4", how="takeover",
              previous_owner="w4", acquired=True, fence=5),
        _span("first_flush", "w2", 5, 52, 500, 510, parent=51, stream="s4", fence=5),
        _span("takeover", "w3", 6, 60, 20, 600, member="w4", epoch=2),
        _span("acquire", "w3", 6, 61, 30, 120, parent=60, stream="s5", how="takeover",
              previous_owner="w4", acquired=True, fence=2),
        _span("acquire", "w3", 6, 62, 40, 130, parent=60, stream="s6", how="takeover",
              previous_owner="w4", acquired=True, fence=7),
        _span("first_flush", "w3", 6, 63, 700, 720, parent=62, stream="s6", fence=7),
        _span("takeover", "w2", 7, 70, 0, 5, member="w9", epoch=1),  # another member's
    ]


def test_a_stream_handed_live_is_timed_from_the_take_to_the_first_flush() -> None:
    # w1 SIGTERM'd, s7 offered to w2: w2 dialled ahead (acquire 0-80 ms), took the lease
    # at 60-70 ms and flushed at 90-95 ms. No release span: the take starts the hand-off.
    spans = [
        _span("acquire", "w2", 8, 81, 0, 80, stream="s7", how="handed",
              previous_owner="w1", acquired=True, fence=5),
        _span("dial", "w2", 8, 82, 5, 40, parent=81, stream="s7", ahead=True),
        _span("take", "w2", 8, 83, 60, 70, parent=81, stream="s7", fence=4, holder="w1"),
        _span("first_flush", "w2", 8, 84, 90, 95, parent=81, stream="s7", fence=5),
        # Handed by another worker: not w1's hand-off.
        _span("acquire", "w3", 9, 91, 0, 80, stream="s8", how="handed",
              previous_owner="w4", acquired=True, fence=2),
        _span("take", "w3", 9, 92, 60, 70, parent=91, stream="s8", fence=1, holder="w4"),
    ]
    figures = audit.chaos_figures(spans, [("w1", ["s7", "s8"])], [])
    assert figures["handoffs"] == 2 and figures["handoffs_linked_count"] == 1
    h = figures["slowest_handoff"]
    assert (h["stream"], h["from"], h["to"], h["total_ms"]) == ("s7", "w1", "w2", 35.0)
    # Each span once, the take a child of the acquisition (no cross-worker link).
    assert [s["name"] for s in h["spans"]] == ["acquire", "dial", "take", "first_flush"]
    assert h["links"] == []
    assert figures["unlinked"] == [{
        "stream": "s8", "worker": "w1",
        "why": "no release span (reason shutdown) from the old holder, nor a take"}]


def test_sigterm_hand_offs_are_linked_only_from_release_through_first_flush() -> None:
    spans = sample_spans()
    figures = audit.chaos_figures(
        spans, [("w1", ["s1", "s2", "s3"])], [("w4", T_NS - 1_500_000_000)])
    assert figures["handoffs"] == 3 and figures["handoffs_linked_count"] == 1
    assert figures["handoffs_linked"] == round(1 / 3, 4)
    assert figures["unlinked"] == [
        {"stream": "s2", "worker": "w1", "why": "no first flush in the acquisition's trace"},
        {"stream": "s3", "worker": "w1",
         "why": "no release span (reason shutdown) from the old holder, nor a take"}]
    h = figures["slowest_handoff"]
    assert (h["stream"], h["from"], h["to"], h["total_ms"]) == ("s1", "w1", "w2", 660.0)
    # The release that released it, the cycle that saw it, and s1's spans on w2.
    assert [(s["worker"], s["name"]) for s in h["spans"]] == [
        ("w1", "release"), ("w2", "reconcile"), ("w2", "acquire"), ("w2", "resume_read"),
        ("w2", "dial"), ("w2", "first_flush")]
    assert h["links"] == [[0, 2]]
    assert h["spans"][0]["detail"] == {"reason": "shutdown", "fence": 3, "released": True}
    assert h["spans"][5]["start_ms"] == 640.0
    # Take-overs of w4 only; the slowest is w3's, timed from the kill to its last flush.
    assert figures["takeovers"] == 2 and figures["takeover_streams"] == 3
    t = figures["slowest_takeover"]
    assert (t["by"], t["member"], t["streams"], t["killed_ms"]) == ("w3", "w4", 2, 0.0)
    assert t["total_ms"] == 2220.0
    assert [s["name"] for s in t["spans"]] == ["takeover", "acquire", "acquire",
                                               "first_flush"]
    assert t["spans"][0]["start_ms"] == 1520.0
    assert figures["spans_by_name"]["acquire"] == 6


def test_a_hand_off_needs_a_link_to_the_release_that_released_it() -> None:
    spans = [s for s in sample_spans() if s.span_id != f"{21:016x}"]  # w2's acquisition
    h = audit.find_handoff(spans, "w1", "s1")
    assert not h.linked and h.why_not == "no acquisition on another worker linked to the release"
    # Linked to the failed attempt only: still not this hand-off's acquisition.
    relinked = [otlp.Span(**{**s.__dict__, "links": (otlp.Link(f"{1:032x}", f"{10:016x}"),)})
                if s.span_id == f"{21:016x}" else s for s in sample_spans()]
    assert not audit.find_handoff(relinked, "w1", "s1").linked
    assert audit.chaos_figures([], [], [])["handoffs_linked"] is None


def test_streams_released_on_shutdown_are_read_from_the_workers_log(tmp_path: Path) -> None:
    log = tmp_path / "w1.log"
    log.write_text("\n".join([
        json.dumps({"event": "lease.released", "reason": "shutdown", "stream": "s1"}),
        json.dumps({"event": "lease.released", "reason": "rebalance", "stream": "s2"}),
        '{"event": "lease.released", "reason": "shutdown", "stream"',  # cut short
        "not json at all",
        json.dumps({"event": "lease.acquired", "reason": "shutdown", "stream": "s4"}),
        json.dumps({"event": "lease.released", "reason": "shutdown", "stream": "s3"})]))
    assert audit.released_on_shutdown(log) == ["s1", "s3"]
    assert audit.released_on_shutdown(tmp_path / "missing.log") == []


def tracing_result() -> dict[str, Any]:
    figures = audit.chaos_figures(
        sample_spans(), [("w1", ["s1", "s2"])], [("w4", T_NS - 1_500_000_000)])
    figures.update({"throughput_ratio": 0.97, "throughput": {
        "msgs_per_s": {"off": 20000, "on": 19400}, "order": ["off", "on", "on", "off"],
        "cpu_ratio": 0.98, "spans_per_run_on": [31, 30], "streams": 10, "seconds": 10.0,
        "sampler": "parentbased_always_on (the default)"}})
    return {"profile": "small", "settings": sample_result()["settings"],
            "started_at": "2026-01-01T00:00:00Z",
            "scenarios": {"chaos": {"ok": True}, "tracing": {"ok": True}},
            "tracing": figures}


def test_the_tracing_section_renders_its_targets_and_the_trace_picture(tmp_path: Path) -> None:
    paths = write_reports(tracing_result(), tmp_path)
    assert paths["trace_png"] == str(tmp_path / "latest-trace.png")
    assert (tmp_path / "latest-trace.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = Path(paths["md"]).read_text()
    assert "| `tracing.handoffs_linked` | 0.5 | 100 % (1.0) | **no** |" in md
    assert "| `tracing.throughput_ratio` | 0.97 | >= 0.95 | yes |" in md
    assert "**1 of 2** SIGTERM hand-offs" in md
    assert "### Slowest SIGTERM hand-off: stream s1, w1 -> w2, 660 ms from release to " \
           "first flush" in md
    assert "| first_flush | w2 | s1 | 640 | 20 | fence 4, messages 6, first_seq 101, " \
           "last_seq 106 |" in md
    assert "### Slowest kill -9 take-over: w3 took 2 streams of w4, 2,220 ms from the kill" \
        in md
    assert "| kill -9 of w4 | - | - | 0 | - | - |" in md
    assert "- not linked: s2 from w1: no first flush in the acquisition's trace" in md
    assert "tracing off 20,000 msg/s, on (parentbased_always_on (the default)) 19,400 " \
           "msg/s: **0.97**" in md
    # The picture alone (a kill -9 only, no hand-off) renders too.
    only = tracing_result()
    del only["tracing"]["slowest_handoff"]
    assert [t["kind"] for t in trace_panels(only)] == ["kill9"]
    trace_png(only, tmp_path / "one.png")
    assert (tmp_path / "one.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_without_traces_writes_no_trace_picture(tmp_path: Path) -> None:
    paths = write_reports(sample_result(), tmp_path)
    assert "trace_png" not in paths and not (tmp_path / "latest-trace.png").exists()
    throughput_only = {**tracing_result(), "scenarios": {"tracing": {"ok": True}},
                       "tracing": {"throughput_ratio": 0.9}}
    assert trace_panels(throughput_only) == []
    assert [row[1:] for row in targets(throughput_only)] == [
        ("tracing.throughput_ratio", 0.9, ">= 0.95", False)]


async def test_tracing_figures_of_chaos_and_the_tracing_scenario_share_a_section(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    async def tracing(ctx: Context) -> dict[str, Any]:
        return {"tracing": {"throughput_ratio": 0.99, "throughput": {"order": ["off"]}}}

    monkeypatch.setattr(runner, "runners", lambda: {"tracing": tracing})
    args = runner.build_parser().parse_args(["--scenarios", "tracing"])
    assert args.tracing == "on" and "tracing" in runner.parse_scenarios("default")
    ctx = Context(args, dict(PROFILES["small"]), tmp_path)
    previous = {"scenarios": {"chaos": {"ok": True, "keys": [
        "lost", "tracing.handoffs_linked", "tracing.slowest_handoff"]},
        "tracing": {"ok": True, "keys": ["tracing.throughput_ratio"]}},
        "lost": 0, "tracing": {"handoffs_linked": 1.0, "slowest_handoff": {"spans": []},
                               "throughput_ratio": 0.5}}
    result = await runner.run_scenarios(ctx, args.scenarios, previous)
    assert result["tracing"] == {"handoffs_linked": 1.0, "slowest_handoff": {"spans": []},
                                 "throughput_ratio": 0.99, "throughput": {"order": ["off"]}}
    assert result["scenarios"]["tracing"]["keys"] == ["tracing.throughput_ratio",
                                                      "tracing.throughput"]
    assert result["scenarios"]["chaos"]["from_previous_run"] is True


def test_the_chaos_runs_hand_offs_are_those_its_sigterm_workers_logged(tmp_path: Path) -> None:
    fleet = Fleet("unit", streams=2, rate=1.0, worker_env={})
    log = tmp_path / "w1.log"
    log.write_text("\n".join(json.dumps({"event": "lease.released", "reason": "shutdown",
                                         "stream": sid}) for sid in ("s1", "s2")))
    fleet.retired = [SimpleNamespace(name="w1", log=log),  # type: ignore[list-item]
                     SimpleNamespace(name="w4", log=tmp_path / "w4.log")]
    fleet.faults = [Fault("sigterm", 5.0, "w1", ["s1", "s2", "s9"], {}),
                    Fault("kill9", 1.0, "w4", ["s4"], {}), Fault("pause", 2.0, "w2", [], {})]
    receiver = SimpleNamespace(spans=sample_spans, rejected=1)
    figures = chaos_scenario.chaos_tracing(fleet, receiver)  # type: ignore[arg-type]
    # From the log (s9, held at the fault by the table's last read, was not released).
    assert (figures["handoffs"], figures["handoffs_linked_count"]) == (2, 1)
    assert figures["takeovers"] == 2 and figures["exports_rejected"] == 1


async def test_the_tracing_scenario_alternates_off_and_on_and_needs_spans(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, str]] = []

    async def phase(env: dict[str, str], upstream: str, streams: int,
                    seconds: float) -> dict[str, float]:
        seen.append(env)
        endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        if endpoint is not None:  # a worker with tracing on exports a span
            provider = TracerProvider()
            provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
                endpoint=endpoint + otlp.PATH)))
            with provider.get_tracer("test").start_as_current_span("streamlease.acquire"):
                pass
            provider.shutdown()
        rate = 950.0 if endpoint else 1000.0
        return {"msgs_per_s": rate, "messages": rate * seconds, "cpu_s": seconds,
                "rss": 0.0, "elapsed": seconds}

    class NoServer:
        url = "ws://127.0.0.1:1"

        def __init__(self, *args: str) -> None:
            pass

        def stop(self) -> None:
            pass

    monkeypatch.setattr(throughput, "worker_phase", phase)
    monkeypatch.setattr(throughput, "Server", NoServer)
    env = {"OTEL_TRACES_SAMPLER": "always_off", "PATH": "/usr/bin"}
    found = (await throughput.measure_tracing_cost(env, quick=True))["tracing"]
    assert ["OTEL_EXPORTER_OTLP_ENDPOINT" in e for e in seen] == [False, True, True, False]
    assert not any(k.startswith("OTEL_") for e in (seen[0], seen[3]) for k in e)
    assert "OTEL_TRACES_SAMPLER" not in seen[1]  # the default sampler, not the caller's
    assert "OTEL_BSP_SCHEDULE_DELAY" not in seen[1]  # the SDK's default batch delay
    assert found["throughput_ratio"] == 0.95
    assert found["throughput"]["spans_per_run_on"] == [1, 1]
    assert found["throughput"]["runs"] == {"off": [1000, 1000], "on": [950, 950]}

    async def silent(env: dict[str, str], *args: Any) -> dict[str, float]:
        return {"msgs_per_s": 1.0, "messages": 1.0, "cpu_s": 1.0, "rss": 0.0, "elapsed": 1.0}

    monkeypatch.setattr(throughput, "worker_phase", silent)
    with pytest.raises(RuntimeError, match="exported no span"):
        await throughput.measure_tracing_cost(env, quick=True)
