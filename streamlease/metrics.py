"""Every metric name lives here, behind domain verbs. Only this module imports
prometheus_client.

No label carries a stream id or worker id (cardinality): the scrape target says which
worker. Every labelled counter is exposed at 0 for each known label value from start-up,
so ``rate()`` and alerts work before the first event.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from streamlease import __version__
from streamlease.core.changes import ACTIONS as CHANGE_FEED_ACTIONS
from streamlease.core.jobs import RunOutcome
from streamlease.core.lease import LOST_REASONS, RELEASE_REASONS, StopReason
from streamlease.core.membership import MemberRecord
from streamlease.core.notices import NOTICE_KINDS
from streamlease.core.sinks import MONGODB_BAD_INPUT

RECONNECT_REASONS = ("connect_failed", "closed", "error", "url_changed", "too_big",
                     "setup_failed", "expect_timeout", "opening_failed")
BAD_ITEM_REASONS = ("bad_state", "bad_url", "bad_profile")
GAP_REASONS = ("takeover", "reconnect")
DYNAMODB_OPERATIONS = ("update_item", "transact_write_items", "query", "scan", "get_item",
                       "batch_get_item", "delete_item", "put_item", "describe_table",
                       "create_table", "update_table")
# Operations that read items (``streamlease_dynamodb_items_read_total``).
DYNAMODB_READ_OPERATIONS = ("query", "scan", "get_item", "batch_get_item")
DYNAMODB_OUTCOMES = ("ok", "condition_failed", "throttled", "unavailable", "timeout", "cancelled",
                     "error")

RENEW_OUTCOMES = ("renewed", "lost", "unknown", "throttled")
SINK_FAILURE_OUTCOMES = ("retried", "abandoned")
MEMBER_HEARTBEAT_OUTCOMES = ("renewed", "fenced", "unknown", "throttled")
MEMBER_STATUSES = ("ACTIVE", "DRAINING", "DEAD", "UNRESPONSIVE")
JOB_OUTCOMES = tuple(o.value for o in RunOutcome)
JOB_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)
FLEET_STATES = ("STARTED", "STOPPED", "invalid")
FLEET_LEASES = ("live", "expired", "none")
# Long-lived tasks whose crash is counted (each then ends in a defined state).
TASKS = ("reconcile", "stopped_query", "audit", "sweep", "supervisor", "heartbeat", "pump",
         "membership", "leader", "jobs", "takeover")
INDEX_HINT_OUTCOMES = ("stale_fence", "confirmed", "dismissed")
SINK_KINDS = ("dynamodb", "postgres", "mongodb", "kinesis", "sqs", "s3", "http", "file", "stdout",
              "python")
UNREPLICATED_OPERATIONS = ("acquire", "renew", "write")  # redis_leader.WAITED_OPERATIONS
CHANGE_FEED_ERROR_KINDS = ("trimmed", "expired_iterator", "throttled", "no_stream",
                           "other")  # store.dynamodb.changefeed.FAULT_KINDS

FAST_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TAKEOVER_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
HOLD_BUCKETS = (1, 10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400)
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """The worker's metrics in one registry (a fresh one per instance, so tests can
    make several)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        if registry is None:
            ProcessCollector(registry=r)  # process_cpu_seconds_total, resident memory, fds
            PlatformCollector(registry=r)  # python_info
        p = "streamlease_"
        self._leases_held = Gauge(p + "leases_held", "Leases this worker holds now", registry=r)
        self._acquired = Counter(p + "lease_acquired", "Leases acquired", registry=r)
        self._lost = Counter(p + "lease_lost", "Leases lost without a release, by reason",
                             ["reason"], registry=r)
        self._released = Counter(p + "lease_released", "Leases released, by reason",
                                 ["reason"], registry=r)
        self._heartbeat = Histogram(p + "heartbeat_seconds", "Duration of one lease renewal",
                                    buckets=FAST_BUCKETS, registry=r)
        self._reconcile = Histogram(p + "reconcile_seconds", "Duration of one reconcile cycle",
                                    buckets=FAST_BUCKETS, registry=r)
        self._orphans = Counter(p + "orphans_found", "Orphaned streams seen by the reconciler",
                                registry=r)
        self._delivered = Counter(p + "messages_delivered",
                                  "Messages durably written to the sink", registry=r)
        self._stale = Counter(p + "stale_writes_rejected",
                              "Sink batches refused because this holder's fence was stale",
                              registry=r)
        self._reconnects = Counter(p + "upstream_reconnects", "Upstream reconnects, by reason",
                                   ["reason"], registry=r)
        self._gaps = Counter(p + "sequence_gaps",
                             "Connections whose first seq was above the one asked for",
                             registry=r)
        self._malformed = Counter(p + "malformed_frames",
                                  "Upstream frames dropped as malformed", registry=r)
        self._duplicates = Counter(p + "duplicate_frames",
                                   "Upstream frames dropped as already delivered", registry=r)
        self._control_frames = Counter(p + "control_frames",
                                       "Upstream frames a profile marks as control frames "
                                       "(skipped: not messages)", registry=r)
        self._upstream_gaps = Counter(
            p + "upstream_gaps", "Gap records delivered: a feed that cannot replay may have "
            "lost messages here, by reason (takeover, reconnect)", ["reason"], registry=r)
        self._bad_items = Counter(p + "bad_items", "Stream items that cannot be served, by reason",
                                  ["reason"], registry=r)
        self._takeover = Histogram(
            p + "takeover_delay_seconds",
            "How long a stream went unowned before this worker took it (from the stored expiry)",
            buckets=TAKEOVER_BUCKETS, registry=r)
        self._ddb_requests = Counter(p + "dynamodb_requests", "DynamoDB calls",
                                     ["operation", "outcome"], registry=r)
        self._ddb_seconds = Histogram(p + "dynamodb_request_seconds", "DynamoDB call duration",
                                      ["operation"], buckets=FAST_BUCKETS, registry=r)
        self._ddb_items_read = Counter(p + "dynamodb_items_read",
                                       "Items DynamoDB returned to this worker's reads",
                                       ["operation"], registry=r)
        self._renewals = Counter(p + "renewals", "Lease renewals, by outcome", ["outcome"],
                                 registry=r)
        self._hold = Histogram(p + "lease_hold_seconds",
                               "How long a lease was held, observed when it ends",
                               buckets=HOLD_BUCKETS, registry=r)
        self._sink_batch = Histogram(p + "sink_batch_seconds",
                                     "Duration of one fenced sink write, retries included",
                                     buckets=FAST_BUCKETS, registry=r)
        self._sink_failures = Counter(p + "sink_write_failures",
                                      "Sink writes that failed without an answer (throttled, "
                                      "unavailable), by what followed", ["outcome"], registry=r)
        self._stalled = Gauge(p + "stalled_streams",
                              "Streams whose upstream sends frames none of which can be "
                              "delivered (duplicates, refused seq jumps, malformed)", registry=r)
        self._connected = Gauge(p + "upstream_connected_streams",
                                "Streams with an open upstream connection", registry=r)
        self._loop_lag = Gauge(p + "event_loop_lag_seconds",
                               "How late the event loop ran a timer, last sample", registry=r)
        self._streams = Gauge(
            p + "streams",
            "Streams in the table by desired_state and lease (the fleet view, from the sweep)",
            ["desired_state", "lease"], registry=r)
        self._max_streams = Gauge(p + "max_streams", "STREAMLEASE_MAX_STREAMS", registry=r)
        self._draining = Gauge(p + "draining", "1 while the worker shuts down", registry=r)
        self._admitting = Gauge(p + "admitting",
                                "1 while this worker acquires streams; 0 while its own "
                                "renewals fail or are slow (admission control)", registry=r)
        self._admitting.set(1)
        self._rewound = Counter(p + "checkpoint_rewound",
                                "Acquisitions that found the item's checkpoint or fence behind "
                                "the sink and resumed after the sink", registry=r)
        self._trace_invalid = Counter(
            p + "trace_context_invalid",
            "Acquisitions whose stream item carried a trace_parent that is not a W3C "
            "traceparent (not linked)", registry=r)
        self._members = Gauge(
            p + "members",
            "Fleet members as this worker last read them (or as the leader's bulletin counts "
            "them), by status (UNRESPONSIVE: observed dead, not yet fenced)", ["status"],
            registry=r)
        self._member_rows_read = Gauge(
            p + "member_rows_read",
            "Member rows this worker's last fleet read returned: 1 while it reads only the "
            "leader's row (its bulletin), every row while it leads or has no bulletin",
            registry=r)
        self._bulletin_unreadable = Counter(
            p + "bulletin_unreadable",
            "Reads of the leader's row whose bulletin could not be read (every member row "
            "was read instead)", registry=r)
        self._replica_failed = Counter(
            p + "bulletin_replica_failures",
            "Copies of the leader's bulletin into the member keys of a spread layout that "
            "failed (the next heartbeat's copy retries)", registry=r)
        self._member_keys = Gauge(
            p + "member_keys", "Partition keys the fleet's member rows spread over, as this "
            "worker last read the layout", registry=r)
        self._declared_dead = Counter(p + "members_declared_dead",
                                      "Members this worker fenced after observing them dead",
                                      registry=r)
        self._on_behalf = Counter(p + "releases_on_behalf",
                                  "Streams of dead members this worker released for them",
                                  registry=r)
        self._dead_taken = Counter(p + "dead_streams_taken",
                                   "Streams of dead members this worker took straight over "
                                   "(one conditional write each, no release between)",
                                   registry=r)
        self._member_fenced = Counter(p + "member_fenced",
                                      "Times this worker found its own epoch moved on",
                                      registry=r)
        self._duplicate_id = Counter(p + "member_duplicate_id",
                                     "Times this worker found its member row registered by "
                                     "another live process with the same worker id (it "
                                     "stops and exits)", registry=r)
        self._member_hb = Histogram(p + "member_heartbeat_seconds",
                                    "Duration of one member heartbeat", buckets=FAST_BUCKETS,
                                    registry=r)
        self._member_hbs = Counter(p + "member_heartbeats", "Member heartbeats, by outcome",
                                   ["outcome"], registry=r)
        self._rebalance_moves = Counter(p + "rebalance_moves",
                                        "Streams this worker handed over to even out the fleet",
                                        registry=r)
        # Unknown (NaN) until this worker first computes its share, so a balance alert
        # cannot fire on a worker that has not read the fleet yet.
        self._sink_limit = Gauge(p + "sink_in_flight_limit",
                                 "Sink transactions this worker lets be in flight at once "
                                 "(lowered while member heartbeats are slow)", registry=r)
        self._share = Gauge(p + "member_share",
                            "Streams this worker aims to hold: its fair share of the fleet's "
                            "STARTED streams (0 while draining)", registry=r)
        self._share.set(math.nan)
        self._is_leader = Gauge(p + "is_leader", "1 while this worker is the fleet leader",
                                registry=r)
        self._leader_changes = Counter(p + "leader_changes",
                                       "Times this worker became the fleet leader", registry=r)
        self._unreplicated = Counter(
            p + "leader_unreplicated", "Redis leader acquisitions, renewals and fenced writes "
            "not counted: fewer replicas acknowledged (WAIT) than required", ["operation"],
            registry=r)
        self._keeper_crashes = Counter(p + "leader_keeper_crashes",
                                       "Times the fleet leader lease's renewal task failed "
                                       "(leadership given up)", registry=r)
        self._job_runs = Counter(p + "job_runs", "Job runs by outcome", ["outcome"], registry=r)
        self._job_seconds = Histogram(p + "job_run_seconds", "Duration of one job run",
                                      buckets=JOB_BUCKETS, registry=r)
        self._job_delay = Histogram(p + "job_start_delay_seconds",
                                    "How late a job run started after its slot's time",
                                    buckets=FAST_BUCKETS, registry=r)
        self._job_skipped = Counter(p + "job_slots_skipped",
                                    "Slots that came due while no leader could run them",
                                    registry=r)
        self._jobs_unreadable = Gauge(p + "jobs_unreadable",
                                      "Job items the leader cannot run as stored (never run)",
                                      registry=r)
        self._feed_lag = Gauge(p + "change_feed_lag_seconds",
                               "How far behind the newest change-feed record read is",
                               registry=r)
        self._feed_records = Counter(p + "change_feed_records",
                                     "Change-feed records, by the action each called for",
                                     ["action"], registry=r)
        self._feed_errors = Counter(p + "change_feed_errors", "Change-feed faults, by kind",
                                    ["kind"], registry=r)
        self._feed_live = Gauge(p + "change_feed_live", "1 while this worker trusts the "
                                "leader's change feed (and rests the polls it replaces)",
                                registry=r)
        self._notices = Counter(p + "notices", "The leader's change-feed notices this worker "
                                "acted on, by kind", ["kind"], registry=r)
        self._unserved = Counter(p + "unserved_leases_released",
                                 "Leases naming this worker that it did not serve, released by "
                                 "its self-audit", registry=r)
        self._crashed = Counter(p + "task_crashed", "Long-lived tasks that failed unexpectedly, "
                                "by task", ["task"], registry=r)
        self._hints = Counter(p + "index_hints",
                              "Index records about a held stream, by what a consistent read "
                              "made of them", ["outcome"], registry=r)
        self._sink_batches = Counter(p + "sink_batches", "Batches delivered, by sink",
                                     ["sink"], registry=r)
        self._sink_messages = Counter(p + "sink_messages", "Messages delivered, by sink",
                                      ["sink"], registry=r)
        self._sink_kind_failures = Counter(p + "sink_failures",
                                           "Batch attempts that failed, by sink", ["sink"],
                                           registry=r)
        self._sink_seconds = Histogram(p + "sink_seconds",
                                       "One batch attempt through the sink, by sink",
                                       ["sink"], buckets=FAST_BUCKETS, registry=r)
        self._dead_lettered = Counter(p + "dead_lettered_messages",
                                      "Messages sent to the dead-letter sink, by sink",
                                      ["sink"], registry=r)
        self._mongodb_bad_input = Counter(
            p + "mongodb_bad_input", "Messages the mongodb sink could not store as they came, "
            "by kind: not_a_document (stored wrapped), too_large and unstorable (the batch is "
            "refused), foreign_duplicate (another writer's document left alone)", ["kind"],
            registry=r)
        self._build = Gauge(p + "build_info", "Build information", ["version"], registry=r)
        self._build.labels(__version__).set(1)

        for reason in LOST_REASONS:
            self._lost.labels(reason.value)
        for reason in RELEASE_REASONS:
            self._released.labels(reason.value)
        for name in RECONNECT_REASONS:
            self._reconnects.labels(name)
        for name in BAD_ITEM_REASONS:
            self._bad_items.labels(name)
        for name in GAP_REASONS:
            self._upstream_gaps.labels(name)
        for name in RENEW_OUTCOMES:
            self._renewals.labels(name)
        for name in TASKS:
            self._crashed.labels(name)
        for name in SINK_KINDS:
            for sink_metric in (self._sink_batches, self._sink_messages,
                                self._sink_kind_failures, self._dead_lettered):
                sink_metric.labels(name)
            self._sink_seconds.labels(name)
        for name in INDEX_HINT_OUTCOMES:
            self._hints.labels(name)
        for name in MONGODB_BAD_INPUT:
            self._mongodb_bad_input.labels(name)
        for name in SINK_FAILURE_OUTCOMES:
            self._sink_failures.labels(name)
        for name in JOB_OUTCOMES:
            self._job_runs.labels(name)
        for name in UNREPLICATED_OPERATIONS:
            self._unreplicated.labels(name)
        for name in CHANGE_FEED_ACTIONS:
            self._feed_records.labels(name)
        for name in CHANGE_FEED_ERROR_KINDS:
            self._feed_errors.labels(name)
        for name in NOTICE_KINDS:
            self._notices.labels(name)
        for name in MEMBER_HEARTBEAT_OUTCOMES:
            self._member_hbs.labels(name)
        for name in MEMBER_STATUSES:
            self._members.labels(name)
        for op in DYNAMODB_OPERATIONS:
            self._ddb_seconds.labels(op)
            for outcome in DYNAMODB_OUTCOMES:
                self._ddb_requests.labels(op, outcome)
        for op in DYNAMODB_READ_OPERATIONS:
            self._ddb_items_read.labels(op)
        # Hot path: cache the children touched per message.
        self._delivered_inc = self._delivered.inc

    # -- domain verbs -------------------------------------------------------------------

    def set_capacity(self, max_streams: int) -> None:
        self._max_streams.set(max_streams)

    def set_leases_held(self, count: int) -> None:
        self._leases_held.set(count)

    def lease_acquired(self, takeover_delay_s: float | None) -> None:
        self._acquired.inc()
        if takeover_delay_s is not None:
            self._takeover.observe(max(0.0, takeover_delay_s))

    def lease_lost(self, reason: StopReason) -> None:
        self._lost.labels(reason.value).inc()

    def lease_released(self, reason: StopReason) -> None:
        self._released.labels(reason.value).inc()

    def heartbeat(self, seconds: float, outcome: str) -> None:
        self._heartbeat.observe(seconds)
        self._renewals.labels(outcome).inc()

    def lease_ended(self, held_s: float) -> None:
        self._hold.observe(max(0.0, held_s))

    def sink_batch(self, seconds: float) -> None:
        self._sink_batch.observe(seconds)

    def sink_write_failed(self, outcome: str) -> None:
        """``retried`` (after a backoff) or ``abandoned`` (stopping: frames left unwritten)."""
        self._sink_failures.labels(outcome).inc()

    def stalled(self, delta: int) -> None:
        self._stalled.inc(delta)

    def upstream_connected(self, delta: int) -> None:
        self._connected.inc(delta)

    def loop_lag(self, seconds: float) -> None:
        self._loop_lag.set(max(0.0, seconds))

    def fleet_view(self, source: Callable[[], Mapping[tuple[str, str], int]]) -> None:
        """Publish every (desired_state, lease) cell, zero where absent, as ``source``
        counts at each scrape (a lease that lapses is counted expired without a write)."""
        def cell(state: str, lease: str) -> Callable[[], float]:
            return lambda: source().get((state, lease), 0)

        for state in FLEET_STATES:
            for lease in FLEET_LEASES:
                self._streams.labels(state, lease).set_function(cell(state, lease))

    def reconcile(self, seconds: float) -> None:
        self._reconcile.observe(seconds)

    def orphans_found(self, count: int) -> None:
        self._orphans.inc(count)

    def delivered(self, count: int) -> None:
        self._delivered_inc(count)

    def stale_write_rejected(self) -> None:
        self._stale.inc()

    def reconnect(self, reason: str) -> None:
        self._reconnects.labels(reason).inc()

    def gap(self) -> None:
        self._gaps.inc()

    def malformed(self) -> None:
        self._malformed.inc()

    def duplicate(self) -> None:
        self._duplicates.inc()

    def control_frame(self) -> None:
        self._control_frames.inc()

    def upstream_gap(self, reason: str) -> None:
        self._upstream_gaps.labels(reason).inc()

    def bad_item(self, reason: str) -> None:
        self._bad_items.labels(reason).inc()

    def sink_limit(self, limit: int) -> None:
        self._sink_limit.set(limit)

    def member_heartbeat(self, seconds: float, outcome: str) -> None:
        self._member_hb.observe(seconds)
        self._heartbeat.observe(seconds)
        self._member_hbs.labels(outcome).inc()

    def member_fenced(self) -> None:
        self._member_fenced.inc()

    def member_duplicate_id(self) -> None:
        self._duplicate_id.inc()

    def members(self, members: Iterable[MemberRecord], observed_dead: Iterable[str]) -> None:
        dead = set(observed_dead)
        counts = dict.fromkeys(MEMBER_STATUSES, 0)
        for member in members:
            status = "UNRESPONSIVE" if member.worker_id in dead else member.status.value
            counts[status] += 1
        for status, value in counts.items():
            self._members.labels(status).set(value)

    def member_counts(self, counts: dict[str, int]) -> None:
        """The members by status as the leader's bulletin counts them."""
        for status in MEMBER_STATUSES:
            self._members.labels(status).set(counts.get(status, 0))

    def member_rows_read(self, rows: int) -> None:
        self._member_rows_read.set(rows)

    def bulletin_unreadable(self) -> None:
        self._bulletin_unreadable.inc()

    def replica_failed(self) -> None:
        self._replica_failed.inc()

    def member_keys(self, shards: int) -> None:
        self._member_keys.set(shards)

    def member_declared_dead(self) -> None:
        self._declared_dead.inc()

    def released_on_behalf(self, count: int) -> None:
        self._on_behalf.inc(count)

    def dead_streams_taken(self, count: int) -> None:
        self._dead_taken.inc(count)

    def leader(self, leading: bool) -> None:
        if leading:
            self._leader_changes.inc()
        self._is_leader.set(1 if leading else 0)

    def leader_unreplicated(self, operation: str) -> None:
        self._unreplicated.labels(operation).inc()
    def leader_keeper_crashed(self) -> None:
        self._keeper_crashes.inc()

    def job_run(self, outcome: str, seconds: float) -> None:
        self._job_runs.labels(outcome).inc()
        if seconds > 0:
            self._job_seconds.observe(seconds)

    def job_started(self, delay_s: float) -> None:
        self._job_delay.observe(max(0.0, delay_s))

    def job_slots_skipped(self, count: int) -> None:
        self._job_skipped.inc(count)

    def unreadable_jobs(self, count: int) -> None:
        self._jobs_unreadable.set(count)

    def change_feed_lag(self, seconds: float) -> None:
        self._feed_lag.set(seconds)

    def change_feed_records(self, action: str, count: int = 1) -> None:
        self._feed_records.labels(action).inc(count)

    def change_feed_error(self, kind: str) -> None:
        self._feed_errors.labels(kind).inc()

    def change_feed_live(self, live: bool) -> None:
        self._feed_live.set(1 if live else 0)

    def notice(self, kind: str) -> None:
        self._notices.labels(kind).inc()

    def clear_fleet_view(self) -> None:
        """Only the leader publishes the fleet view; others expose none (not stale)."""
        self._streams.clear()

    def rebalance_moved(self, count: int) -> None:
        self._rebalance_moves.inc(count)

    def share(self, value: int) -> None:
        self._share.set(value)

    def admission(self, admitting: bool) -> None:
        self._admitting.set(1 if admitting else 0)

    def sink_attempt(self, sink: str, messages: int, seconds: float, ok: bool) -> None:
        self._sink_seconds.labels(sink).observe(seconds)
        if ok:
            self._sink_batches.labels(sink).inc()
            self._sink_messages.labels(sink).inc(messages)
        else:
            self._sink_kind_failures.labels(sink).inc()

    def dead_lettered(self, sink: str, messages: int) -> None:
        self._dead_lettered.labels(sink).inc(messages)

    def mongodb_bad_input(self, kind: str, count: int = 1) -> None:
        """Messages of one ``MONGODB_BAD_INPUT`` kind met by the mongodb sink."""
        self._mongodb_bad_input.labels(kind).inc(count)

    def unserved_released(self, count: int = 1) -> None:
        self._unserved.inc(count)

    def task_crashed(self, task: str) -> None:
        self._crashed.labels(task).inc()

    def index_hint(self, outcome: str) -> None:
        self._hints.labels(outcome).inc()

    def checkpoint_rewound(self) -> None:
        self._rewound.inc()

    def trace_context_invalid(self) -> None:
        self._trace_invalid.inc()

    def draining(self, on: bool) -> None:
        self._draining.set(1 if on else 0)

    def dynamodb_request(self, operation: str, outcome: str, seconds: float) -> None:
        self._ddb_requests.labels(operation, outcome).inc()
        self._ddb_seconds.labels(operation).observe(seconds)

    def dynamodb_items_read(self, operation: str, items: int) -> None:
        self._ddb_items_read.labels(operation).inc(items)

    def exposition(self) -> tuple[bytes, str]:
        """The /metrics body and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
