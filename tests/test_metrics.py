"""Metrics: the contract's names, labelled counters at 0 from start-up, no id labels."""

from __future__ import annotations

import math

from streamlease.core.lease import LOST_REASONS, RELEASE_REASONS
from streamlease.core.sinks import MONGODB_BAD_INPUT
from streamlease.metrics import (
    DYNAMODB_READ_OPERATIONS,
    JOB_OUTCOMES,
    MEMBER_HEARTBEAT_OUTCOMES,
    MEMBER_STATUSES,
    RECONNECT_REASONS,
    RENEW_OUTCOMES,
    Metrics,
)

CONTRACT = {
    "streamlease_leases_held": "gauge",
    "streamlease_lease_acquired": "counter",
    "streamlease_lease_lost": "counter",
    "streamlease_lease_released": "counter",
    "streamlease_heartbeat_seconds": "histogram",
    "streamlease_reconcile_seconds": "histogram",
    "streamlease_orphans_found": "counter",
    "streamlease_messages_delivered": "counter",
    "streamlease_stale_writes_rejected": "counter",
    "streamlease_upstream_reconnects": "counter",
    "streamlease_sequence_gaps": "counter",
    "streamlease_malformed_frames": "counter",
}


def samples(m: Metrics) -> dict[str, float]:
    out = {}
    for family in m.registry.collect():
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_contract_metrics_exist_with_their_types() -> None:
    families = {f.name: f.type for f in Metrics().registry.collect()}
    for name, kind in CONTRACT.items():
        assert families.get(name) == kind, name


def test_labelled_counters_start_at_zero_for_every_known_value() -> None:
    s = samples(Metrics())
    for reason in LOST_REASONS:
        assert s[f"streamlease_lease_lost_total{{reason={reason.value}}}"] == 0
    for reason in RELEASE_REASONS:
        assert s[f"streamlease_lease_released_total{{reason={reason.value}}}"] == 0
    for reason in RECONNECT_REASONS:
        assert s[f"streamlease_upstream_reconnects_total{{reason={reason}}}"] == 0
    for outcome in RENEW_OUTCOMES:
        assert s[f"streamlease_renewals_total{{outcome={outcome}}}"] == 0


def test_no_label_names_a_stream_or_a_worker() -> None:
    m = Metrics()
    m.fleet_view(lambda: {("STARTED", "live"): 3})
    for family in m.registry.collect():
        for sample in family.samples:
            assert not {"stream", "stream_id", "worker", "owner"} & set(sample.labels)


def test_fleet_view_sets_every_cell() -> None:
    m = Metrics()
    counts = {("STARTED", "live"): 3, ("STOPPED", "none"): 1}
    m.fleet_view(lambda: counts)
    s = samples(m)
    assert s["streamlease_streams{desired_state=STARTED,lease=live}"] == 3
    assert s["streamlease_streams{desired_state=STOPPED,lease=none}"] == 1
    assert s["streamlease_streams{desired_state=invalid,lease=expired}"] == 0
    counts = {}  # read at each scrape, not when published
    assert samples(m)["streamlease_streams{desired_state=STARTED,lease=live}"] == 0
    m.clear_fleet_view()
    assert not any(k.startswith("streamlease_streams{") for k in samples(m))


def test_membership_and_balance_metrics() -> None:
    families = {f.name: f.type for f in Metrics().registry.collect()}
    for name, kind in {
        "streamlease_members": "gauge", "streamlease_members_declared_dead": "counter",
        "streamlease_releases_on_behalf": "counter",
        "streamlease_member_heartbeat_seconds": "histogram",
        "streamlease_member_heartbeats": "counter", "streamlease_member_fenced": "counter",
        "streamlease_admitting": "gauge", "streamlease_checkpoint_rewound": "counter",
        "streamlease_rebalance_moves": "counter", "streamlease_member_share": "gauge",
    }.items():
        assert families.get(name) == kind, name
    m = Metrics()
    s = samples(m)
    assert s["streamlease_rebalance_moves_total{}"] == 0
    # Unknown until the worker computes it, so no balance alert fires before.
    assert math.isnan(s["streamlease_member_share{}"])
    for outcome in MEMBER_HEARTBEAT_OUTCOMES:
        assert s[f"streamlease_member_heartbeats_total{{outcome={outcome}}}"] == 0
    for status in MEMBER_STATUSES:
        assert s[f"streamlease_members{{status={status}}}"] == 0
    m.rebalance_moved(3)
    m.share(12)
    s = samples(m)
    assert s["streamlease_rebalance_moves_total{}"] == 3
    assert s["streamlease_member_share{}"] == 12


def test_leader_and_job_metrics() -> None:
    """The names the leader and job alerts and panels read, at 0 from start-up for every
    run outcome, so a first failed run on a fresh leader is an increase from 0."""
    families = {f.name: f.type for f in Metrics().registry.collect()}
    for name, kind in {
        "streamlease_is_leader": "gauge", "streamlease_leader_changes": "counter",
        "streamlease_job_runs": "counter", "streamlease_job_run_seconds": "histogram",
        "streamlease_job_start_delay_seconds": "histogram",
        "streamlease_job_slots_skipped": "counter", "streamlease_stalled_streams": "gauge",
    }.items():
        assert families.get(name) == kind, name
    assert set(JOB_OUTCOMES) == {"succeeded", "failed", "timed_out", "fenced", "abandoned"}
    m = Metrics()
    s = samples(m)
    assert s["streamlease_is_leader{}"] == 0
    assert s["streamlease_leader_changes_total{}"] == 0
    assert s["streamlease_job_slots_skipped_total{}"] == 0
    assert s["streamlease_stalled_streams{}"] == 0
    for outcome in JOB_OUTCOMES:
        assert s[f"streamlease_job_runs_total{{outcome={outcome}}}"] == 0

    m.leader(True)
    m.job_started(0.3)
    m.job_run("failed", 2.0)
    m.job_run("abandoned", 0.0)  # a vanished leader's run: counted, its duration unknown
    m.job_slots_skipped(3)
    m.stalled(1)
    s = samples(m)
    assert s["streamlease_is_leader{}"] == 1
    assert s["streamlease_job_runs_total{outcome=failed}"] == 1
    assert s["streamlease_job_runs_total{outcome=abandoned}"] == 1
    assert s["streamlease_job_run_seconds_count{}"] == 1
    assert s["streamlease_job_start_delay_seconds_bucket{le=0.5}"] == 1
    assert s["streamlease_job_slots_skipped_total{}"] == 3
    assert s["streamlease_stalled_streams{}"] == 1
    m.leader(False)
    m.leader(True)
    s = samples(m)
    assert s["streamlease_leader_changes_total{}"] == 2  # became leader twice
    assert s["streamlease_is_leader{}"] == 1
    m.leader(False)
    assert samples(m)["streamlease_is_leader{}"] == 0


def test_items_read_are_counted_per_operation_from_zero() -> None:
    m = Metrics()
    s = samples(m)
    for op in DYNAMODB_READ_OPERATIONS:
        assert s[f"streamlease_dynamodb_items_read_total{{operation={op}}}"] == 0
    m.dynamodb_items_read("query", 7)
    m.dynamodb_items_read("get_item", 1)
    s = samples(m)
    assert s["streamlease_dynamodb_items_read_total{operation=query}"] == 7
    assert s["streamlease_dynamodb_items_read_total{operation=get_item}"] == 1


def test_the_mongodb_sink_counts_bad_input_by_kind_from_zero() -> None:
    m = Metrics()
    s = samples(m)
    assert set(MONGODB_BAD_INPUT) == {"not_a_document", "too_large", "unstorable",
                                      "foreign_duplicate"}
    for kind in MONGODB_BAD_INPUT:
        assert s[f"streamlease_mongodb_bad_input_total{{kind={kind}}}"] == 0
    assert s["streamlease_sink_batches_total{sink=mongodb}"] == 0
    m.mongodb_bad_input("not_a_document", 3)
    m.mongodb_bad_input("foreign_duplicate")
    s = samples(m)
    assert s["streamlease_mongodb_bad_input_total{kind=not_a_document}"] == 3
    assert s["streamlease_mongodb_bad_input_total{kind=foreign_duplicate}"] == 1
    assert s["streamlease_mongodb_bad_input_total{kind=too_large}"] == 0
