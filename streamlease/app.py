"""Composition root for ``streamlease run``: build everything, handle signals, drain in order.

Order on SIGTERM/SIGINT: stop acquiring; every supervisor stops reading, flushes,
checkpoints and releases; then the process exits 0. If that does not finish within
``STREAMLEASE_SHUTDOWN_SECONDS`` the worker exits 1 (leases it still holds expire on
their own). A second signal exits at once. A worker whose member row another live process
registered under the same worker id stops the same way and exits 2 (a configuration
error: worker ids must be unique).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import importlib
import json
import logging
import os
import signal
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import aioboto3

from streamlease import __version__
from streamlease import health as http
from streamlease.clock import SYSTEM_CLOCK, Clock
from streamlease.config import WorkerConfig, default_worker_id
from streamlease.context import Context
from streamlease.core.backends import LeaderBackendChoice, MongoTarget
from streamlease.core.handover import offer_wait_s
from streamlease.core.jobs import takeover_grace_ms
from streamlease.core.membership import HeartbeatOutcome, MemberTimings
from streamlease.core.stream import BATCH_MAX_BYTES, sink_retry_cap
from streamlease.core.upstream import Catalog
from streamlease.errors import ConfigError, StoreError, StoreThrottled, StoreUnavailable
from streamlease.feed import ChangeFeed, FeedSettings
from streamlease.health import HealthState
from streamlease.jobs import JobRunner, JobSettings
from streamlease.leader import LeaderBackend
from streamlease.leadership import Duty, Leadership, LeadershipSettings
from streamlease.logs import CONTEXT, event, setup
from streamlease.membership import SECOND_PASS_S, Hooks, Membership, MembershipSettings
from streamlease.metrics import Metrics
from streamlease.pacing import PacedSink, SinkGate
from streamlease.processing import ProcessingSettings, ProcessorSink
from streamlease.pump import PumpSettings
from streamlease.reconciler import Reconciler, ReconcilerSettings
from streamlease.secrets import SecretResolver
from streamlease.sinks import open_output
from streamlease.store import dynamodb
from streamlease.store.dynamodb.changefeed import (
    ChangeFeedReader,
    FeedSource,
    open_streams_client,
)
from streamlease.store.dynamodb.client import DynamoClient
from streamlease.store.feedcheckpoints import FeedCheckpointStore
from streamlease.store.protocols import AdminStore, JobStore, Sink, Stores
from streamlease.supervisor import SupervisorSettings
from streamlease.tracing import OnBehalfReleases, setup_tracing, shutdown_tracing
from streamlease.upstream import Upstreams, load_python_upstream


def resolve_worker_id(config: WorkerConfig) -> str:
    """STREAMLEASE_WORKER_ID, else the ECS task id, else hostname-pid."""
    if config.worker_id:
        return config.worker_id
    base = os.environ.get("ECS_CONTAINER_METADATA_URI_V4")
    if base:
        try:
            with urllib.request.urlopen(base.rstrip("/") + "/task", timeout=2) as resp:
                arn = json.load(resp).get("TaskARN", "")
            if arn:
                return str(arn).rsplit("/", 1)[-1]
        except (OSError, ValueError) as exc:
            event(logging.WARNING, "worker.ecs_metadata_failed",
                  "cannot read the ECS task id; using hostname-pid", error=str(exc))
    return default_worker_id()


def build_settings(config: WorkerConfig) -> ReconcilerSettings:
    timings = config.timings
    call_timeout = max(1.0, min(10.0, timings.lease_s / 2))
    # A sink write is not bounded by the lease: the fence, not a timeout, keeps a late
    # write safe, and waiting for its answer tells a stale holder that it was refused.
    pump = PumpSettings(
        batch_max_messages=config.batch_max_messages, batch_max_s=config.batch_max_s,
        # Batches grow to the message cap or the window. Cutting them at every filled
        # write unit (``BATCH_FILL_BYTES``) made a takeover's catch-up several transactions
        # a stream instead of one, which saturated the store just when streams moved, and
        # cost more for fast streams: the rule stays in the core, off.
        batch_fill_bytes=BATCH_MAX_BYTES,
        max_frame_bytes=config.max_frame_bytes, max_seq_jump=config.max_seq_jump,
        stall_s=config.stall_s, allowed_urls=config.allowed_urls, call_timeout_s=10.0,
        reconnect_cap_s=max(1.0, min(30.0, timings.lease_s)),
        stable_after_s=max(1.0, timings.lease_s / 4),
        sink_retry_cap_s=sink_retry_cap(timings.heartbeat_s),
    )
    supervisor = SupervisorSettings(
        timings=config.stream_timings, allowed_urls=config.allowed_urls, pump=pump,
        call_timeout_s=call_timeout, drain_timeout_s=max(1.0, config.shutdown_s / 2),
        check_s=config.stream_check_s,
        # The events table alone takes each batch and its checkpoint under the fence in
        # one transaction: its streams are handed live (streamlease.core.handover).
        handover_wait_s=offer_wait_s(member_timings(config).heartbeat_s)
        if config.sink.kind == "dynamodb" else None,
    )
    return ReconcilerSettings(
        reconcile_s=config.reconcile_s, sweep_s=config.sweep_s,
        max_streams=config.max_streams, acquire_per_cycle=config.acquire_per_cycle,
        supervisor=supervisor, stopped_check_s=timings.heartbeat_s,
        # Jittered +/-20 %: at most 1.92 leases apart, inside the two allowed.
        # The self-audit is a backstop for bugs, not failure detection: it keeps the
        # contract lease's scale (32 s at the defaults) when the member lease is shorter.
        min_hold_s=config.min_hold_s, audit_s=1.6 * config.lease_s,
        second_pass_s=min(SECOND_PASS_S, timings.lease_s),
        unservable_retry_s=3 * timings.lease_s,
    )


def member_timings(config: WorkerConfig) -> MemberTimings:
    t = config.timings
    return MemberTimings(t.lease_s, t.heartbeat_s, t.safety_margin_s)


@dataclasses.dataclass
class Runtime:
    """One worker process, built once by the composition root (``serve``): the roles that
    run, and what they share. Roles never reach for each other through globals; what one
    asks of another is wired here."""

    config: WorkerConfig
    ctx: Context
    stores: Stores
    membership: Membership
    reconciler: Reconciler
    leadership: Leadership


async def serve(config: WorkerConfig, owner: str, clock: Clock = SYSTEM_CLOCK) -> int:
    """Start the worker and serve until a signal; a signal while it is still starting
    (tables checked, outputs opened, member row written) stops it at once, holding
    nothing, with exit 0 — a deploy may stop a task at any moment."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    early: list[int] = []

    def while_starting(signum: int) -> None:
        early.append(signum)
        task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, while_starting, sig)
    try:
        return await _start(config, owner, clock)
    except asyncio.CancelledError:
        if not early:
            raise
        task.uncancel()
        event(logging.INFO, "worker.stopped", "a signal while starting: stopped, holding "
              "nothing", signal=signal.Signals(early[0]).name)
        return 0


async def _start(config: WorkerConfig, owner: str, clock: Clock) -> int:
    metrics = Metrics()
    metrics.set_capacity(config.max_streams)
    # Live while the member heartbeat and every stream's check-in are recent.
    health = HealthState(max(config.timings.lease_s, 3 * config.stream_check_s))
    if config.metrics_port:
        try:
            http.serve(config.metrics_address, config.metrics_port, health, metrics.exposition)
        except OSError as exc:
            print(f"streamlease: STREAMLEASE_METRICS_PORT: cannot listen on "
                  f"{config.metrics_port}: {exc}", file=sys.stderr)
            return 1
    settings = build_settings(config)
    async with dynamodb.connect(
        config.table, config.events_table, config.fleet_table,
        # One sink transaction in flight per stream at most; the control plane has its
        # own pool, so heartbeats, renewals and releases never queue behind sink batches.
        dynamodb.ConnectOptions(
            sink_connections=min(1000, config.max_streams + 10),
            control_connections=min(200, config.acquire_per_cycle + 40),
            observe=metrics.dynamodb_request, count_read=metrics.dynamodb_items_read,
            call_timeout_s=settings.supervisor.call_timeout_s,
            events_ttl_s=config.events_ttl_s),
    ) as stores:
        # Fail fast, with a clear line, if the tables are missing or access is denied; a
        # store that is only slow or throttling gets a few attempts first.
        for advice in await check_tables(stores.admin):
            event(logging.WARNING, "table.index_costly", advice)
        async with worker_sink(config, stores, metrics) as sink, \
                leader_backend(config, stores, metrics) as backend, \
                worker_upstreams(config) as upstreams, \
                feed_client(config, metrics, settings.supervisor.call_timeout_s) as streams:
            settings = dataclasses.replace(settings, supervisor=dataclasses.replace(
                settings.supervisor, upstreams=upstreams))
            ctx = Context(owner, clock, metrics, stores.leases, sink, health)
            runtime = build_runtime(config, ctx, stores, backend, settings, streams)
            await register(runtime.membership)
            health.renewed(MEMBER_HEALTH_KEY, clock.monotonic())
            # What start-up built (the AWS clients' service models, the processor, the
            # roles) lives as long as the worker: kept out of every later collection, so a
            # full collection walks only what the streams made since (docs/performance.md).
            gc.freeze()
            return await _serve(runtime)


def build_runtime(config: WorkerConfig, ctx: Context, stores: Stores, backend: LeaderBackend,
                  settings: ReconcilerSettings, streams: DynamoClient | None = None) -> Runtime:
    """Wire the roles. Membership and the reconciler ask things of each other (the
    reconciler plans with the member view; membership stops every stream when the member
    lapses), so membership's hooks reach the reconciler through the runtime once built.
    The roles write to ``ctx``'s sink through a gate that follows the member heartbeat."""
    wired: list[Runtime] = []
    owner, metrics, health = ctx.owner, ctx.metrics, ctx.health

    def reconciler() -> Reconciler | None:
        return wired[0].reconciler if wired else None

    def held() -> int:
        r = reconciler()
        return len(r.supervisors) if r else 0

    gate = SinkGate(config.max_streams, slow_s=member_timings(config).slow_heartbeat_s,
                    metrics=metrics)

    def member_beat(outcome: HeartbeatOutcome, seconds: float) -> None:
        gate.heartbeat(outcome, seconds)
        r = reconciler()
        if r is not None and outcome is not HeartbeatOutcome.FENCED:
            r.lease_health.record(outcome, seconds)

    def on_reconciler(act: Callable[[Reconciler], None]) -> Callable[[], None]:
        def call() -> None:
            r = reconciler()
            if r is not None:
                act(r)
        return call

    membership = Membership(
        # A fencer's releases on a dead member's behalf leave their span's context on the
        # item, so the stream's next holder links to it (streamlease.tracing).
        dataclasses.replace(ctx, leases=OnBehalfReleases(stores.leases)), stores.fleet,
        MembershipSettings(owner, config.max_streams, member_timings(config),
                           fleet_view=config.fleet_view,
                           members_per_key=config.members_per_key),
        Hooks(held=held,
              fenced=on_reconciler(lambda r: r.member_lost(True)),
              self_fenced=on_reconciler(lambda r: r.member_lost(False)),
              fleet_changed=on_reconciler(lambda r: r.poke()),
              proven=lambda at: health.renewed(MEMBER_HEALTH_KEY, at), beat=member_beat,
              leading=lambda: bool(wired) and wired[0].leadership.leading,
              leader=lambda: wired[0].leadership.leader_seen() if wired else None,
              leader_fence=lambda: wired[0].leadership.fence() if wired else 0,
              orphans=lambda: wired[0].reconciler.orphans_seen() if wired else 0,
              notice=lambda notice: wired[0].reconciler.notice(notice) if wired else None,
              offers=lambda offers: wired[0].reconciler.offered(offers) if wired else None,
              feed_resumed=on_reconciler(lambda r: r.feed_resumed())))
    ctx = dataclasses.replace(ctx, sink=PacedSink(ctx.sink, gate, metrics, config.sink.kind))
    recon = Reconciler(ctx, settings, membership)
    recon.sweep.feed_live = membership.feed_live
    t = config.timings
    duties: list[Duty] = [recon.sweep_duty, build_jobs(config, ctx, stores.jobs, membership).run]
    if streams is not None and stores.feed_checkpoints is not None:
        duties.append(build_feed(config, ctx, streams, stores.feed_checkpoints, recon,
                                 membership).duty)
    leadership = Leadership(ctx, backend,
                            LeadershipSettings(t.lease_s, t.heartbeat_s, t.safety_margin_s),
                            duties, eligible=lambda: membership.accepting,
                            urgent=membership.campaign_urgent)
    runtime = Runtime(config, ctx, stores, membership, recon, leadership)
    wired.append(runtime)
    return runtime


@contextlib.asynccontextmanager
async def worker_sink(config: WorkerConfig, stores: Stores,
                      metrics: Metrics) -> AsyncIterator[Sink]:
    """Where messages go (STREAMLEASE_SINK): the events table itself, or a processor per
    tenure (a built-in output or the user's), with its dead-letter destination."""
    if config.sink.kind == "dynamodb":
        yield stores.sink
        return
    async with contextlib.AsyncExitStack() as stack:
        factory = await stack.enter_async_context(open_output(config.sink))
        dead = None
        if config.dead_letter is not None:
            dead = await stack.enter_async_context(open_output(config.dead_letter))
        event(logging.INFO, "sink.opened", "messages go to a processor output",
              sink=config.sink.describe(),
              dead_letter=config.dead_letter.describe() if config.dead_letter else None,
              max_attempts=config.process_max_attempts)
        yield ProcessorSink(factory, stores.leases, metrics,
                            ProcessingSettings(config.sink.kind, config.process_max_attempts),
                            dead)


@contextlib.asynccontextmanager
async def worker_upstreams(config: WorkerConfig) -> AsyncIterator[Upstreams]:
    """How streams' upstreams are spoken to: the profiles (STREAMLEASE_PROFILES, with a
    secret resolver when any template names a secret), or the Python upstream
    (STREAMLEASE_UPSTREAM, imported here: ConfigError if it cannot be)."""
    catalog = Catalog(config.all_profiles, config.default_profile, python=config.upstream)
    if config.upstream is not None:
        yield Upstreams(catalog, python=load_python_upstream(config.upstream))
        return
    if not any(p.secret_refs for p in catalog.profiles.values()):
        yield Upstreams(catalog)
        return
    async with SecretResolver() as secrets:
        yield Upstreams(catalog, secrets)


@contextlib.asynccontextmanager
async def leader_backend(config: WorkerConfig, stores: Stores,
                         metrics: Metrics) -> AsyncIterator[LeaderBackend]:
    """The fleet table's leader backend, Redis or MongoDB (STREAMLEASE_LEADER_BACKEND)."""
    if config.leader_backend == "dynamodb":
        yield stores.leader
        return
    if isinstance(config.leader_backend, MongoTarget):
        require_mongodb()
        from streamlease.store.mongo_leader import mongo_backend
        async with mongo_backend(config.leader_backend) as mongo:
            yield mongo
        return
    require_redis()
    from streamlease.store.redis_leader import redis_backend
    async with redis_backend(config.leader_backend,
                             unreplicated=metrics.leader_unreplicated) as backend:
        yield backend


@contextlib.asynccontextmanager
async def feed_client(config: WorkerConfig, metrics: Metrics,
                      call_timeout_s: float) -> AsyncIterator[DynamoClient | None]:
    """The DynamoDB Streams client the change feed reads with (None: the feed is off)."""
    if config.change_feed != "on":
        yield None
        return
    async with open_streams_client(dynamodb.region(aioboto3.Session()),
                                   observe=metrics.dynamodb_request,
                                   call_timeout_s=call_timeout_s) as client:
        yield client


def build_feed(config: WorkerConfig, ctx: Context, streams: DynamoClient,
               checkpoints: FeedCheckpointStore, reconciler: Reconciler,
               membership: Membership) -> ChangeFeed:
    """The change feed, a leader duty: a reader under each leader term's fence."""
    source = FeedSource(streams, config.table, checkpoints, ctx.clock, metrics=ctx.metrics)
    return ChangeFeed(ctx, lambda fence: ChangeFeedReader(source, fence), membership,
                      reconciler.sweep, FeedSettings(publish_timeout_s=config.timings.heartbeat_s),
                      reconciler.stopping)


def build_jobs(config: WorkerConfig, ctx: Context, jobs: JobStore,
               membership: Membership) -> JobRunner:
    """The scheduled jobs, a leader duty."""
    t = config.timings
    # A slot due this long before a new leader took the lease still runs: a whole
    # takeover, also by a member other than the successor the bulletin names.
    late_ms = takeover_grace_ms(t.lease_s, t.heartbeat_s, membership.leader_still_s)
    # On SIGTERM a running job gets half the shutdown budget to finish, then a quarter
    # between SIGTERM and SIGKILL (at most STREAMLEASE_JOB_GRACE_SECONDS).
    return JobRunner(jobs, ctx.clock, ctx.metrics, JobSettings(
        owner=ctx.owner, grace_s=config.job_grace_s, late_ms=late_ms,
        refresh_s=t.heartbeat_s, shutdown_s=config.shutdown_s / 2,
        shutdown_grace_s=min(config.job_grace_s, config.shutdown_s / 4),
        env=dict(os.environ)))


async def _serve(runtime: Runtime) -> int:
    config, clock, metrics, health = runtime.config, runtime.ctx.clock, runtime.ctx.metrics, \
        runtime.ctx.health
    reconciler, membership, leadership = runtime.reconciler, runtime.membership, \
        runtime.leadership
    loop = asyncio.get_running_loop()
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:
            event(logging.WARNING, "worker.exit_now", "second signal: exiting at once",
                  signal=signal.Signals(signum).name)
            os._exit(1)
        event(logging.INFO, "worker.draining", "draining: releasing every lease",
              signal=signal.Signals(signum).name, leases=len(reconciler.supervisors))
        metrics.draining(True)
        health.draining = True
        membership.drain()  # peers see DRAINING at once: share 0, poll for releases
        leadership.stop()  # jobs wind down, then the lease is resigned
        # Releases are retried until shortly before the shutdown budget runs out.
        reconciler.stop(release_by=clock.monotonic() + config.shutdown_s * 0.9)

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    t = config.timings
    event(logging.INFO, "worker.started", "worker started", version=__version__,
          table=config.table, events_table=config.events_table,
          fleet_table=config.fleet_table, epoch=membership.epoch,
          leader_backend=config.leader_backend if isinstance(config.leader_backend, str)
          else config.leader_backend.url, lease_s=config.lease_s,
          member_lease_s=t.lease_s, member_heartbeat_s=t.heartbeat_s,
          skew_margin_s=t.skew_margin_s,
          safety_margin_s=t.safety_margin_s,
          self_fence_after_s=round(t.lease_s - t.safety_margin_s, 3),
          stream_lease_s=config.stream_lease_s, stream_renew_s=config.stream_renew_s,
          stream_check_s=config.stream_check_s,
          reconcile_s=config.reconcile_s, sweep_s=config.sweep_s,
          max_streams=config.max_streams, metrics_port=config.metrics_port,
          allowed_urls=[str(rule) for rule in config.allowed_urls])
    health.started = True
    return await _run_until_drained(reconciler, membership, leadership, config.shutdown_s,
                                    metrics, clock)


MEMBER_HEALTH_KEY = "(member heartbeat)"


async def _watch_loop_lag(metrics: Metrics, clock: Clock, period: float = 0.5) -> None:
    """Sample how late the loop wakes a timer: a busy or blocked loop shows here first."""
    while True:
        before = clock.monotonic()
        await clock.sleep(period)
        metrics.loop_lag(clock.monotonic() - before - period)


async def _run_until_drained(reconciler: Reconciler, membership: Membership,
                             leadership: Leadership, shutdown_s: float, metrics: Metrics,
                             clock: Clock) -> int:
    """Run until a signal; then give the drain ``shutdown_s`` seconds: every stream flushes
    and releases, the leader's jobs finish and it resigns, then the member row is removed."""
    async with asyncio.TaskGroup() as tg:
        lag_task = tg.create_task(_watch_loop_lag(metrics, clock))
        member_task = tg.create_task(membership.run())
        leader_task = tg.create_task(leadership.run())
        run_task = tg.create_task(reconciler.run())
        stop_task = tg.create_task(reconciler.stopping.wait())
        await asyncio.wait({run_task, stop_task, member_task},
                           return_when=asyncio.FIRST_COMPLETED)
        stop_task.cancel()
        lag_task.cancel()
        if membership.superseded is not None and not reconciler.stopping.is_set():
            await _stop_duplicate(reconciler, leadership, shutdown_s, run_task, leader_task,
                                  clock)
            return _duplicate_exit(membership)
        if not reconciler.stopping.is_set():
            event(logging.ERROR, "worker.failed", "the reconciler or membership stopped by itself")
            reconciler.stop()
            leadership.stop()
            membership.stop()
            leader_task.cancel()
            return 1
        try:
            async with asyncio.timeout(shutdown_s):
                await asyncio.shield(run_task)
                await asyncio.shield(leader_task)
        except TimeoutError:
            event(logging.ERROR, "worker.drain_timeout",
                  "STREAMLEASE_SHUTDOWN_SECONDS ran out; remaining leases will expire",
                  leases=len(reconciler.supervisors))
            run_task.cancel()
            leader_task.cancel()
            membership.stop()
            return 1
        if not reconciler.unreleased and membership.superseded is None:
            await membership.leave()
        membership.stop()
    if membership.superseded is not None:
        return _duplicate_exit(membership)
    if reconciler.unreleased:
        event(logging.ERROR, "worker.stopped", "exiting; some leases could not be released "
              "and will expire", unreleased=reconciler.unreleased)
        return 1
    event(logging.INFO, "worker.stopped", "every lease released or handed over; exiting")
    return 0


EXIT_DUPLICATE_ID = 2  # a configuration error: STREAMLEASE_WORKER_ID is not unique


async def _stop_duplicate(reconciler: Reconciler, leadership: Leadership, shutdown_s: float,
                          run_task: asyncio.Task[None], leader_task: asyncio.Task[None],
                          clock: Clock) -> None:
    """Another process registered under this worker id: stop taking streams, wind down what
    is left (its streams already stopped when the epoch moved; the other process's
    registration releases them), and resign leadership; the caller then exits with a clear
    message. The member row is the other process's now: it is not removed. The process
    stays up for the rest of ``shutdown_s`` first, holding nothing, so Prometheus scrapes
    ``streamlease_member_duplicate_id_total`` before it goes."""
    started = clock.monotonic()
    reconciler.stop(release_by=started + shutdown_s * 0.9)
    leadership.stop()
    try:
        async with asyncio.timeout(shutdown_s):
            await asyncio.shield(run_task)
            await asyncio.shield(leader_task)
    except TimeoutError:
        run_task.cancel()
        leader_task.cancel()
    await clock.sleep(started + shutdown_s - clock.monotonic())


def _duplicate_exit(membership: Membership) -> int:
    print(f"streamlease: STREAMLEASE_WORKER_ID: another live process registered as worker "
          f"{membership.me!r}; this one stopped (each process needs its own worker id)",
          file=sys.stderr)
    return EXIT_DUPLICATE_ID


REDIS_EXTRA_MISSING = ("STREAMLEASE_LEADER_BACKEND: a redis:// backend needs the redis package, "
                       "which is not installed (pip install 'streamlease[redis]')")


MONGODB_EXTRA_MISSING = ("{setting}: a mongodb:// {what} needs the pymongo package, which is "
                         "not installed (pip install 'streamlease[mongodb]')")


def _require(package: str, roots: tuple[str, ...], problem: str) -> None:
    """Import ``package`` (an extra); ConfigError (exit 2, ``problem`` on one line) when it
    is not installed. Nothing imports it unless what needs it is chosen."""
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in roots:
            raise
        raise ConfigError([problem]) from None


def require_mongodb(setting: str = "STREAMLEASE_LEADER_BACKEND") -> None:
    """``pymongo`` (the ``mongodb`` extra), for the MongoDB leader backend or sink."""
    what = "sink" if setting == "STREAMLEASE_SINK" else "backend"
    _require("pymongo", ("pymongo", "bson"),
             MONGODB_EXTRA_MISSING.format(setting=setting, what=what))


def require_backend(choice: LeaderBackendChoice) -> None:
    """The extra the chosen leader backend needs is installed; ConfigError if not."""
    if isinstance(choice, MongoTarget):
        require_mongodb()
    elif choice != "dynamodb":
        require_redis()


def require_redis() -> None:
    """The ``redis`` package (the ``redis`` extra), for the Redis leader backend."""
    _require("redis", ("redis",), REDIS_EXTRA_MISSING)


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (it is not on Windows), else None:
    asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run_worker() -> int:
    try:
        config = WorkerConfig.from_env()
        require_backend(config.leader_backend)
        if config.sink.kind == "mongodb":
            require_mongodb("STREAMLEASE_SINK")  # before any store is dialled
    except ConfigError as exc:
        print(f"streamlease: {exc}", file=sys.stderr)
        return 2
    setup(config.log_format, config.log_level)
    owner = resolve_worker_id(config)
    CONTEXT.worker = owner
    factory = loop_factory()
    if factory is None:
        event(logging.INFO, "worker.default_loop",
              "uvloop is not installed; running on asyncio's default event loop")
    setup_tracing(owner)  # the OTEL_* variables; without an endpoint, spans are no-ops
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(serve(config, owner))
    except ConfigError as exc:
        print(f"streamlease: {exc}", file=sys.stderr)
        return 2
    except StoreError as exc:
        print(f"streamlease: DynamoDB: {exc}", file=sys.stderr)
        return 1
    finally:
        shutdown_tracing()  # what is still queued goes out before the process exits


START_ATTEMPTS = 5  # start-up store calls on a slow or throttling store: 1+2+4+8 s apart
T = TypeVar("T")


async def check_tables(admin: AdminStore) -> list[str]:
    """``admin.check_tables()``, retried with backoff while the store is unavailable or
    throttling (a deploy onto a struggling table should wait, not crash-loop)."""
    return await retried_at_start(admin.check_tables, "worker.tables_unreachable",
                                  "cannot check the tables yet; trying again")


async def register(membership: Membership) -> None:
    """Join the fleet, retried with backoff while the store is unavailable or throttling,
    as the table check is. A retry registers the same incarnation again: an attempt
    whose answer was lost only moved the row's epoch on once more."""
    await retried_at_start(membership.register, "worker.register_retried",
                           "cannot join the fleet yet; trying again")


async def retried_at_start(call: Callable[[], Awaitable[T]], name: str, message: str) -> T:
    """``call()``, again after 1, 2, 4 and 8 s while it raises ``StoreUnavailable`` or
    ``StoreThrottled`` (each retry logged as ``name``); the last failure raised."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return await call()
        except (StoreUnavailable, StoreThrottled) as exc:
            if attempt == START_ATTEMPTS:
                raise
            event(logging.WARNING, name, message, attempt=attempt, error=str(exc))
            await asyncio.sleep(2 ** (attempt - 1))
    raise AssertionError("unreachable")
