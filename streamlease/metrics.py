"""Every metric name lives here, behind domain verbs. Only this module imports
prometheus_client.

No label carries a stream id or worker id (cardinality): the scrape target says which
worker. Every labelled counter is exposed at 0 for each known label value from start-up,
so ``rate()`` and alerts work before the first event.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import product
from typing import Any, Generic, TypeVar, overload

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
from streamlease.core.handover import HANDOVER_OUTCOMES
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
         "membership", "leader", "jobs", "takeover", "handover")
INDEX_HINT_OUTCOMES = ("stale_fence", "confirmed", "dismissed")
SINK_KINDS = ("dynamodb", "postgres", "mongodb", "kinesis", "sqs", "s3", "http", "file", "stdout",
              "python")
UNREPLICATED_OPERATIONS = ("acquire", "renew", "write")  # redis_leader.WAITED_OPERATIONS
CHANGE_FEED_ERROR_KINDS = ("trimmed", "expired_iterator", "throttled", "no_stream",
                           "other")  # store.dynamodb.changefeed.FAULT_KINDS

FAST_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
TAKEOVER_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
HOLD_BUCKETS = (1, 10, 60, 300, 900, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400)
PREFIX = "streamlease_"


M = TypeVar("M", Counter, Gauge, Histogram)


class Family(Generic[M]):
    """One metric family, declared in ``MetricFamilies``: its kind, its name (after
    ``streamlease_``), help text and label names, a histogram's buckets, and the label
    values exposed at 0 from start-up (``known``: a value, or a tuple of values, for each
    child). Every ``Metrics`` builds its own copy in its registry; read on an instance, the
    attribute is that metric."""

    def __init__(self, kind: type[M], name: str, help_text: str, labels: Sequence[str] = (),
                 *, buckets: Sequence[float] | None = None,
                 known: Iterable[str | tuple[str, ...]] = ()) -> None:
        self.kind: type[M] = kind
        self.name, self.help_text = PREFIX + name, help_text
        self.labels, self.buckets, self.known = tuple(labels), buckets, tuple(known)

    @overload
    def __get__(self, obj: None, owner: type) -> Family[M]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> M: ...

    def __get__(self, obj: object | None, owner: type) -> Family[M] | M:
        if obj is None:
            return self
        raise AttributeError(f"{self.name}: not built (Metrics.__init__ builds every family)")

    def build(self, registry: CollectorRegistry) -> M:
        """This family in ``registry``, its known children at 0."""
        extra: dict[str, Any] = {} if self.buckets is None else {"buckets": self.buckets}
        metric: M = self.kind(self.name, self.help_text, self.labels, registry=registry,
                              **extra)
        for values in self.known:
            metric.labels(*((values,) if isinstance(values, str) else values))
        return metric


class MetricFamilies:
    """Every family this worker exposes, in exposition order: the table ``Metrics`` is
    built from (each into the instance attribute of its name)."""

    _leases_held = Family(Gauge, "leases_held", "Leases this worker holds now")
    _acquired = Family(Counter, "lease_acquired", "Leases acquired")
    _lost = Family(Counter, "lease_lost", "Leases lost without a release, by reason",
                   ("reason",), known=[r.value for r in LOST_REASONS])
    _released = Family(Counter, "lease_released", "Leases released, by reason",
                       ("reason",), known=[r.value for r in RELEASE_REASONS])
    _heartbeat = Family(Histogram, "heartbeat_seconds", "Duration of one lease renewal",
                        buckets=FAST_BUCKETS)
    _reconcile = Family(Histogram, "reconcile_seconds", "Duration of one reconcile cycle",
                        buckets=FAST_BUCKETS)
    _orphans = Family(Counter, "orphans_found", "Orphaned streams seen by the reconciler")
    _delivered = Family(Counter, "messages_delivered", "Messages durably written to the sink")
    _stale = Family(Counter, "stale_writes_rejected", "Sink batches refused because this "
                    "holder's fence was stale")
    _reconnects = Family(Counter, "upstream_reconnects", "Upstream reconnects, by reason",
                         ("reason",), known=RECONNECT_REASONS)
    _gaps = Family(Counter, "sequence_gaps", "Connections whose first seq was above the one "
                   "asked for")
    _malformed = Family(Counter, "malformed_frames", "Upstream frames dropped as malformed")
    _duplicates = Family(Counter, "duplicate_frames", "Upstream frames dropped as already "
                         "delivered")
    _control_frames = Family(Counter, "control_frames", "Upstream frames a profile marks as "
                             "control frames (skipped: not messages)")
    _upstream_gaps = Family(Counter, "upstream_gaps", "Gap records delivered: a feed that cannot "
                            "replay may have lost messages here, by reason (takeover, reconnect)",
                            ("reason",), known=GAP_REASONS)
    _bad_items = Family(Counter, "bad_items", "Stream items that cannot be served, by reason",
                        ("reason",), known=BAD_ITEM_REASONS)
    _takeover = Family(Histogram, "takeover_delay_seconds", "How long a stream went unowned "
                       "before this worker took it (from the stored expiry)",
                       buckets=TAKEOVER_BUCKETS)
    _ddb_requests = Family(Counter, "dynamodb_requests", "DynamoDB calls",
                           ("operation", "outcome"),
                           known=product(DYNAMODB_OPERATIONS, DYNAMODB_OUTCOMES))
    _ddb_seconds = Family(Histogram, "dynamodb_request_seconds", "DynamoDB call duration",
                          ("operation",), buckets=FAST_BUCKETS, known=DYNAMODB_OPERATIONS)
    _ddb_items_read = Family(Counter, "dynamodb_items_read", "Items DynamoDB returned to this "
                             "worker's reads", ("operation",), known=DYNAMODB_READ_OPERATIONS)
    _renewals = Family(Counter, "renewals", "Lease renewals, by outcome",
                       ("outcome",), known=RENEW_OUTCOMES)
    _hold = Family(Histogram, "lease_hold_seconds", "How long a lease was held, observed when it "
                   "ends", buckets=HOLD_BUCKETS)
    _sink_batch = Family(Histogram, "sink_batch_seconds", "Duration of one fenced sink write, "
                         "retries included", buckets=FAST_BUCKETS)
    _sink_failures = Family(Counter, "sink_write_failures", "Sink writes that failed without an "
                            "answer (throttled, unavailable), by what followed",
                            ("outcome",), known=SINK_FAILURE_OUTCOMES)
    _stalled = Family(Gauge, "stalled_streams", "Streams whose upstream sends frames none of "
                      "which can be delivered (duplicates, refused seq jumps, malformed)")
    _connected = Family(Gauge, "upstream_connected_streams", "Streams with an open upstream "
                        "connection")
    _loop_lag = Family(Gauge, "event_loop_lag_seconds", "How late the event loop ran a timer, "
                       "last sample")
    _streams = Family(Gauge, "streams", "Streams in the table by desired_state and lease (the "
                      "fleet view, from the sweep)", ("desired_state", "lease"))
    _max_streams = Family(Gauge, "max_streams", "STREAMLEASE_MAX_STREAMS")
    _draining = Family(Gauge, "draining", "1 while the worker shuts down")
    _admitting = Family(Gauge, "admitting", "1 while this worker acquires streams; 0 while its "
                        "own renewals fail or are slow (admission control)")
    _rewound = Family(Counter, "checkpoint_rewound", "Acquisitions that found the item's "
                      "checkpoint or fence behind the sink and resumed after the sink")
    _trace_invalid = Family(Counter, "trace_context_invalid", "Acquisitions whose stream item "
                            "carried a trace_parent that is not a W3C traceparent (not linked)")
    _members = Family(Gauge, "members", "Fleet members as this worker last read them (or as the "
                      "leader's bulletin counts them), by status (UNRESPONSIVE: observed dead, "
                      "not yet fenced)", ("status",), known=MEMBER_STATUSES)
    _member_rows_read = Family(Gauge, "member_rows_read", "Member rows this worker's last fleet "
                               "read returned: 1 while it reads only the leader's row (its "
                               "bulletin), every row while it leads or has no bulletin")
    _bulletin_unreadable = Family(Counter, "bulletin_unreadable", "Reads of the leader's row "
                                  "whose bulletin could not be read (every member row was read "
                                  "instead)")
    _replica_failed = Family(Counter, "bulletin_replica_failures", "Copies of the leader's "
                             "bulletin into the member keys of a spread layout that failed (the "
                             "next heartbeat's copy retries)")
    _member_keys = Family(Gauge, "member_keys", "Partition keys the fleet's member rows spread "
                          "over, as this worker last read the layout")
    _declared_dead = Family(Counter, "members_declared_dead", "Members this worker fenced after "
                            "observing them dead")
    _on_behalf = Family(Counter, "releases_on_behalf", "Streams of dead members this worker "
                        "released for them")
    _dead_taken = Family(Counter, "dead_streams_taken", "Streams of dead members this worker "
                         "took straight over (one conditional write each, no release between)")
    _member_fenced = Family(Counter, "member_fenced", "Times this worker found its own epoch "
                            "moved on")
    _duplicate_id = Family(Counter, "member_duplicate_id", "Times this worker found its member "
                           "row registered by another live process with the same worker id (it "
                           "stops and exits)")
    _member_hb = Family(Histogram, "member_heartbeat_seconds", "Duration of one member heartbeat",
                        buckets=FAST_BUCKETS)
    _member_hbs = Family(Counter, "member_heartbeats", "Member heartbeats, by outcome",
                         ("outcome",), known=MEMBER_HEARTBEAT_OUTCOMES)
    _rebalance_moves = Family(Counter, "rebalance_moves", "Streams this worker handed over to "
                              "even out the fleet")
    _handovers = Family(Counter, "handovers", "Live hand-overs (make before break): offers "
                        "this worker acted on as taker, and its own offers not taken, by "
                        "outcome", ["outcome"], known=HANDOVER_OUTCOMES)
    _sink_limit = Family(Gauge, "sink_in_flight_limit", "Sink transactions this worker lets be "
                         "in flight at once (lowered while member heartbeats are slow)")
    # Unknown (NaN) until this worker first computes its share, so a balance alert
    # cannot fire on a worker that has not read the fleet yet.
    _share = Family(Gauge, "member_share", "Streams this worker aims to hold: its fair share of "
                    "the fleet's STARTED streams (0 while draining)")
    _is_leader = Family(Gauge, "is_leader", "1 while this worker is the fleet leader")
    _leader_changes = Family(Counter, "leader_changes", "Times this worker became the fleet leader")
    _unreplicated = Family(Counter, "leader_unreplicated", "Redis leader acquisitions, renewals "
                           "and fenced writes not counted: fewer replicas acknowledged (WAIT) "
                           "than required", ("operation",), known=UNREPLICATED_OPERATIONS)
    _keeper_crashes = Family(Counter, "leader_keeper_crashes", "Times the fleet leader lease's "
                             "renewal task failed (leadership given up)")
    _job_runs = Family(Counter, "job_runs", "Job runs by outcome", ("outcome",), known=JOB_OUTCOMES)
    _job_seconds = Family(Histogram, "job_run_seconds", "Duration of one job run",
                          buckets=JOB_BUCKETS)
    _job_delay = Family(Histogram, "job_start_delay_seconds", "How late a job run started after "
                        "its slot's time", buckets=FAST_BUCKETS)
    _job_skipped = Family(Counter, "job_slots_skipped", "Slots that came due while no leader "
                          "could run them")
    _jobs_unreadable = Family(Gauge, "jobs_unreadable", "Job items the leader cannot run as "
                              "stored (never run)")
    _feed_lag = Family(Gauge, "change_feed_lag_seconds", "How far behind the newest change-feed "
                       "record read is")
    _feed_records = Family(Counter, "change_feed_records", "Change-feed records, by the action "
                           "each called for", ("action",), known=CHANGE_FEED_ACTIONS)
    _feed_errors = Family(Counter, "change_feed_errors", "Change-feed faults, by kind",
                          ("kind",), known=CHANGE_FEED_ERROR_KINDS)
    _feed_live = Family(Gauge, "change_feed_live", "1 while this worker trusts the leader's "
                        "change feed (and rests the polls it replaces)")
    _notices = Family(Counter, "notices", "The leader's change-feed notices this worker acted "
                      "on, by kind", ("kind",), known=NOTICE_KINDS)
    _unserved = Family(Counter, "unserved_leases_released", "Leases naming this worker that it "
                       "did not serve, released by its self-audit")
    _crashed = Family(Counter, "task_crashed", "Long-lived tasks that failed unexpectedly, by "
                      "task", ("task",), known=TASKS)
    _hints = Family(Counter, "index_hints", "Index records about a held stream, by what a "
                    "consistent read made of them", ("outcome",), known=INDEX_HINT_OUTCOMES)
    _sink_batches = Family(Counter, "sink_batches", "Batches delivered, by sink",
                           ("sink",), known=SINK_KINDS)
    _sink_messages = Family(Counter, "sink_messages", "Messages delivered, by sink",
                            ("sink",), known=SINK_KINDS)
    _sink_kind_failures = Family(Counter, "sink_failures", "Batch attempts that failed, by sink",
                                 ("sink",), known=SINK_KINDS)
    _sink_seconds = Family(Histogram, "sink_seconds", "One batch attempt through the sink, by "
                           "sink", ("sink",), buckets=FAST_BUCKETS, known=SINK_KINDS)
    _dead_lettered = Family(Counter, "dead_lettered_messages", "Messages sent to the dead-letter "
                            "sink, by sink", ("sink",), known=SINK_KINDS)
    _mongodb_bad_input = Family(Counter, "mongodb_bad_input", "Messages the mongodb sink could "
                                "not store as they came, by kind: not_a_document (stored "
                                "wrapped), too_large and unstorable (the batch is refused), "
                                "foreign_duplicate (another writer's document left alone)",
                                ("kind",), known=MONGODB_BAD_INPUT)
    _build = Family(Gauge, "build_info", "Build information", ("version",))


class Metrics(MetricFamilies):
    """The worker's metrics in one registry (a fresh one per instance, so tests can
    make several), behind domain verbs."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        if registry is None:
            ProcessCollector(registry=r)  # process_cpu_seconds_total, resident memory, fds
            PlatformCollector(registry=r)  # python_info
        for attr, family in vars(MetricFamilies).items():
            if isinstance(family, Family):
                setattr(self, attr, family.build(r))
        self._admitting.set(1)
        self._share.set(math.nan)
        self._build.labels(__version__).set(1)
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

    def handover(self, outcome: str) -> None:
        self._handovers.labels(outcome).inc()

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
