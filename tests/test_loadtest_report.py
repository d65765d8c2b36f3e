"""The benchmark's report has the keys other tools read, and a PNG timeline."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.chaos import _cost, _pct
from loadtest.report import write_reports

REQUIRED = ("lost", "duplicated", "out_of_order", "stale_accepted", "stale_rejected",
            "failover", "requests_per_stream_minute", "cost_per_1000_streams_month_usd",
            "cpu_seconds_per_1000_messages", "rss_bytes_per_stream", "msgs_per_s",
            "null_sink_ratio")


def sample_result() -> dict[str, object]:
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
        "failover_targets_s": {"kill9": 3.9, "sigterm": 1.6},
        "requests_per_stream_minute": per_min, "dynamodb_requests_per_s": 50.0,
        "renewals_per_heartbeat_interval": 1.0,
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


def test_reports_are_written_with_the_documented_keys(tmp_path: Path) -> None:
    paths = write_reports(sample_result(), tmp_path)
    doc = json.loads(Path(paths["json"]).read_text())
    assert all(k in doc for k in REQUIRED)
    assert set(doc["failover"]["kill9"]) >= {"p50", "p99", "max"}
    assert set(doc["msgs_per_s"]) == {"null_sink", "fenced_sink", "bare_client"}
    assert Path(paths["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| 0 | 0 | 0 | 0 | 0 |" in Path(paths["md"]).read_text()
    assert len(list(tmp_path.glob("2*.json"))) == 1  # the timestamped copy


def test_percentiles_and_cost_arithmetic() -> None:
    assert _pct([], 50) is None
    assert _pct([3.0, 1.0, 2.0], 50) == 2.0 and _pct([3.0, 1.0, 2.0], 99) == 3.0
    profile = {"rate": 10.0}
    cheap = _cost({"heartbeat": 12, "acquire_release": 0, "query": 0, "sweep_scan": 0,
                   "sink": 0}, profile, batch_s=0.2)
    # 12 renewals x 3 WRU x 43.2 M stream-minutes x $0.625 per million.
    assert cheap["lease_overhead"] == round(12 * 3 * 43_200_000 * 0.625 / 1e6, 2)
    assert cheap["sink"] == 0
