"""Alert rules (promtool) and the Grafana dashboard: every expression names only metrics
the worker registers, every alert has a runbook section, every panel has a unit."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamlease.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "terraform" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "streamlease.json"
METRIC = re.compile(r"\b((?:streamlease|process|python)_[a-z0-9_]+)\b")


def exposed_names() -> set[str]:
    """Every sample name a worker's /metrics shows (with _total, _bucket, ... suffixes)."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.update(sample.name for sample in family.samples)
        names.add(family.name)
    return names


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        # REQUIRE_PROMTOOL: set by `make test` where it can install the package.
        if os.environ.get("REQUIRE_PROMTOOL"):
            pytest.fail("promtool is missing: `make test` installs Debian's prometheus package")
        pytest.skip("needs promtool (Debian package prometheus; `make test` installs it as "
                    "root on Debian)")
    return path


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load((MONITORING / "alerts.yml").read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run([promtool(), "check", "rules", "alerts.yml"], cwd=MONITORING,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_fire_every_alert() -> None:
    result = subprocess.run([promtool(), "test", "rules", "alerts_test.yml"], cwd=MONITORING,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", (MONITORING / "alerts_test.yml").read_text()))
    assert {r["alert"] for r in rules()} <= tested


def test_every_alert_has_severity_summary_and_a_runbook_in_the_docs() -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    anchors = {re.sub(r"[^a-z0-9-]", "", h.strip().lower().replace(" ", "-"))
               for h in re.findall(r"^#+ (.+)$", runbooks, re.M)}
    expected = {"StreamleaseNoWorkers", "StreamleaseOrphanedStreams",
                "StreamleaseStoppedButHeld", "StreamleaseLeaseFlapping",
                "StreamleaseHeartbeatsFailing", "StreamleaseStaleWritesRejected",
                "StreamleaseSequenceGaps", "StreamleaseReconnectStorm",
                "StreamleaseDynamoDBThrottling", "StreamleaseCapacityNearlyFull",
                "StreamleaseNoDelivery", "StreamleaseMemberDeclaredDead",
                "StreamleaseDeadMemberNotFenced", "StreamleaseMemberHeartbeatsFailing",
                "StreamleaseMemberFenced", "StreamleaseReleasedNotReacquired",
                "StreamleaseAdmissionClosed", "StreamleaseFleetUnbalanced",
                "StreamleaseLeaderFlapping", "StreamleaseNoLeader", "StreamleaseSeveralLeaders",
                "StreamleaseJobFailed", "StreamleaseJobSlotSkipped",
                "StreamleaseJobRunInterrupted", "StreamleaseJobStartLate",
                "StreamleaseStreamStalled", "StreamleaseJobUnreadable",
                "StreamleaseDuplicateWorkerId", "StreamleaseTaskCrashed"}
    assert {r["alert"] for r in rules()} == expected
    for rule in rules():
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"]
        page, anchor = rule["annotations"]["runbook"].split("#", 1)
        assert page == "docs/runbooks.md", rule["alert"]
        assert anchor == rule["alert"].lower() and anchor in anchors, rule["alert"]


def test_alert_expressions_name_only_registered_metrics() -> None:
    names = exposed_names()
    for rule in rules():
        used = set(METRIC.findall(rule["expr"]))
        assert used and used <= names, (rule["alert"], used - names)


def panels() -> list[dict[str, Any]]:
    doc = json.loads(DASHBOARD.read_text())
    return [p for p in doc["panels"] if p["type"] != "row"]


def test_dashboard_queries_name_only_registered_metrics() -> None:
    names = exposed_names()
    exprs = [t["expr"] for p in panels() for t in p["targets"]]
    assert len(exprs) >= 25
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used <= names, used - names
    contract = {"streamlease_leases_held", "streamlease_lease_acquired_total",
                "streamlease_lease_lost_total", "streamlease_messages_delivered_total",
                "streamlease_stale_writes_rejected_total", "streamlease_dynamodb_requests_total"}
    assert contract <= used


def test_dashboard_shape() -> None:
    doc = json.loads(DASHBOARD.read_text())
    variables = doc["templating"]["list"]
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in variables)
    rows = [p["title"] for p in doc["panels"] if p["type"] == "row"]
    assert rows == ["Fleet", "Membership", "Leader and jobs", "Leases", "Streams", "DynamoDB",
                    "Process"]
    for p in panels():
        assert p["description"], p["title"]
        assert p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_shows_membership_and_balance() -> None:
    used = {m for p in panels() for t in p["targets"] for m in METRIC.findall(t["expr"])}
    assert {"streamlease_members", "streamlease_members_declared_dead_total",
            "streamlease_releases_on_behalf_total", "streamlease_member_heartbeat_seconds_bucket",
            "streamlease_member_heartbeats_total", "streamlease_member_fenced_total",
            "streamlease_member_share", "streamlease_rebalance_moves_total",
            "streamlease_admitting"} <= used


def test_dashboard_shows_the_leader_jobs_and_stalls() -> None:
    used = {m for p in panels() for t in p["targets"] for m in METRIC.findall(t["expr"])}
    assert {"streamlease_is_leader", "streamlease_leader_changes_total",
            "streamlease_job_runs_total", "streamlease_job_run_seconds_bucket",
            "streamlease_job_start_delay_seconds_bucket", "streamlease_job_slots_skipped_total",
            "streamlease_stalled_streams"} <= used
    # Who leads: the leader panels are per scrape target, not a fleet sum.
    leader = [t["expr"] for p in panels() for t in p["targets"]
              if "streamlease_is_leader" in t["expr"] and "by (instance)" in t["expr"]]
    assert leader, "no panel shows which worker leads"


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """promtool checks each panel query as a recording rule: a typo fails here, not in
    Grafana."""
    exprs = [t["expr"] for p in panels() for t in p["targets"]]
    doc = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(exprs)]}]}
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump(doc))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_provisioning_points_at_the_dashboard() -> None:
    providers = yaml.safe_load(
        (MONITORING / "grafana" / "provisioning" / "dashboards" / "streamlease.yml").read_text())
    assert providers["providers"][0]["type"] == "file"
    sources = yaml.safe_load(
        (MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert sources["datasources"][0]["type"] == "prometheus"
