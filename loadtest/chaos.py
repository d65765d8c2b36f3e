"""The load and chaos benchmark: failover, loss, cost, throughput, skew, a slow store,
balance, singleton jobs and scale, in one command.

    make loadtest                                   # the default scenarios, ~19 minutes
    make loadtest-all                               # every scenario, ~31 minutes
    make loadtest ARGS="--scenarios scale"          # one scenario into the last results
    make loadtest ARGS="--profile large"
    python -m loadtest.chaos --help

Each scenario starts its own DynamoDB-compatible server (the embedded
``streamlease dev dynamodb``, or the endpoint the standard AWS variables name with
``--dynamodb env``), the reference upstream and worker processes, on fresh tables, and
audits the sink at its end (every seq once, in order, byte-identical; fences monotonic):

* ``chaos``: the profile's fleet through kill -9, SIGSTOP past the lease then SIGCONT
  (each of a random worker holding streams), upstream connection drops and a rolling
  SIGTERM deploy, twice; failover times, cost per stream-minute.
* ``kill9_defaults``: 3 workers x 100 streams (0.5 msg/s) at the worker's default settings;
  twice, kill -9 of a worker holding 100, a new worker started at once (the survivors are
  full): time until each of its streams delivers again elsewhere, and until it is
  connected again (``failover.kill9_defaults``), ~4 minutes.
* ``index_lag``: the chaos schedule again with the embedded server's index reads a
  second behind the table (DynamoDB's indexes lag; here, a bad day): streams leased to a
  live worker that does not serve them (the longest such spell), the audit, kill -9
  failover.
* ``throughput``: one worker's throughput, CPU and memory, in phases of their own.
* ``tracing``: one worker's throughput into a no-op Python processor with tracing off and
  on (default sampling, spans exported to a receiver on loopback), alternating
  (``tracing.throughput_ratio``; ``loadtest.tracing_scenario``), about a minute. With
  ``--tracing on`` (the default) the chaos run's workers export their spans too: the share
  of SIGTERM hand-offs whose trace links release to first delivery
  (``tracing.handoffs_linked``), and the slowest hand-off and kill -9 take-over drawn as
  span timelines (``latest-trace.png``).
* ``skew``: one worker under ``faketime -f -2s`` (its wall clock 2 s behind), small
  profile timings, 60 s: does the fleet settle, and does anyone take over a live member?
* ``slow_store``: 4 workers, 40 streams, the embedded server slowed to 20 ms a request
  (serial: a saturated store), 60 s: ownership moves; then a rolling SIGTERM restart,
  timed as hand-offs.
* ``balance``: 40 streams (1 msg/s) on 2 workers, then 4: time until every worker
  holds its share +/-1, moves during and after; a rolling restart; the spread at its
  end.
* ``balance_startup``: 40 streams, 2 workers, and 2 more as soon as the first stream is
  held: time from their start until every worker holds its share +/-1 for good, the moves
  until then, the longest a stream was leased to no running worker
  (``balance.during_startup``), under a minute.
* ``jobs``: a singleton job every 2 s on 3 workers through a SIGSTOP of the leader past
  its lease, a kill -9 of the leader and a rolling restart: slots run twice, stale
  writes accepted, time to a new leader, start delay (``loadtest.jobs_scenario``).
* ``sinks``: every output (DynamoDB, PostgreSQL, Kinesis, SQS, S3, a webhook, files, a
  Python processor) through a short chaos run of its own (kill -9, SIGSTOP past the lease,
  SIGTERM), then its destination read back: lost, duplicated, duplicated within one tenure,
  out of order (``loadtest.sinks_scenario``).
* ``upstreams``: a stream feed per resume mode of the upstream profiles (``query``,
  ``message``, ``none``, and ``none_count``: binary frames the worker numbers) through a
  short chaos run of its own, audited against the feed's own numbering: lost, duplicated,
  and where the feed cannot replay, the share of lost messages inside a recorded gap; and
  one worker's throughput with a profile against the built-in protocol
  (``loadtest.upstreams_scenario``).
* ``change_feed``: 3 workers, 240 streams, default settings, index reads lagging,
  with the change feed on and then off (``STREAMLEASE_CHANGE_FEED``), a fleet each: seconds
  until a hand-written item delivers, a STOPPED flip is released and a ``ws_url`` change
  reconnects to the new URL; streams-table reads per held stream-minute in a quiet minute
  (counted at the embedded server); changes lost when the leader is killed while they are
  written (``change_feed.*``, ``change_feed.off.*``; ``loadtest.change_feed_scenario``),
  about 9 minutes for both modes.
* ``scale_reads``: 2 workers, then 8, each with 25 idle streams at default timings:
  control-plane items read per worker-minute over a quiet minute, and the ratio
  (``scale.per_worker_read_growth``), ~2.5 minutes.
* ``scale``: 2,000 idle streams on 4 workers at default timings: the store's requests
  by kind per 1,000 held streams, index-key moves per held stream-minute, time until all
  are held, kill -9 of one worker, and the capacity model.

It writes ``loadtest/results/latest.{json,md,png}`` and ``latest-trace.png`` (plus
timestamped copies) and exits non-zero if a correctness figure (lost, duplicated, out of
order, stale writes accepted, fleet-caused gaps, job slots run twice; per sink: lost,
duplicated for the exactly-once ones, duplicated within one tenure; per upstream mode: lost
where the feed replays, lost outside a recorded gap where it cannot, duplicated) of any
scenario is not zero, or a scenario could not run. It asserts no times: it reports them.
Worker logs stay in ``.run/loadtest/``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest import (
    capacity,
    change_feed_scenario,
    sinks_scenario,
    tracing_scenario,
    upstreams_scenario,
)
from loadtest.common import STOP, Server, choose_names, stop_children
from loadtest.fleet import CORRECTNESS, LOGS, Fleet, get, pct
from loadtest.otlp import Receiver
from loadtest.report import write_reports
from loadtest.throughput import measure_throughput
from streamlease.config import DEFAULTS
from streamlease.dev import local_aws_env

RESULTS = Path(__file__).resolve().parent / "results"

PROFILES: dict[str, dict[str, Any]] = {
    # Sized under the embedded DynamoDB's ~250 writes/s: 24 streams x ~2 sink
    # transactions a second, plus member heartbeats and queries.
    "small": {"streams": 24, "rate": 20.0, "workers": 3, "lease": 2.0, "heartbeat": 0.5,
              "reconcile": 0.5, "skew": 0.3, "settle": 8.0, "gap": 6.0, "rounds": 2},
    # For real DynamoDB (or a patient run on the embedded one).
    "large": {"streams": 200, "rate": 10.0, "workers": 6, "lease": 6.0, "heartbeat": 1.5,
              "reconcile": 1.5, "skew": 0.5, "settle": 20.0, "gap": 15.0, "rounds": 3},
}

SCENARIOS = ("chaos", "kill9_defaults", "index_lag", "throughput", "tracing", "skew",
             "slow_store", "balance", "balance_startup", "jobs", "sinks", "upstreams",
             "change_feed", "scale_reads", "scale")
# The default fits in 20 minutes on 2 cores (19 measured). The control plane at default
# timings — change_feed (~7 minutes), scale_reads (~3) and scale (~2, 2,000 connections) —
# runs with `make loadtest-all` (--scenarios all); a default run keeps their last figures.
DEFAULT_SCENARIOS = ("chaos", "kill9_defaults", "index_lag", "throughput", "tracing", "skew",
                     "slow_store", "balance", "balance_startup", "jobs", "sinks", "upstreams")
INDEX_LAG_MS = 1000.0  # the index_lag scenario: every index read a second behind
# Sections several scenarios write keys into, and how many levels down a scenario's own
# keys are: ``failover.kill9`` (chaos) next to ``failover.sigterm_slow_store``;
# ``sinks.python.lost`` (sinks) next to ``sinks.python.ratio_to_bare`` (throughput);
# ``scale.kill9`` (scale) next to ``scale.per_worker_read_growth`` (scale_reads);
# ``balance.converge_s`` (balance) next to ``balance.during_startup`` (balance_startup);
# ``tracing.handoffs_linked`` (chaos) next to ``tracing.throughput_ratio`` (tracing).
SHARED_SECTIONS = {"failover": 1, "sinks": 2, "scale": 1, "balance": 1, "tracing": 1}


@dataclass
class Context:
    args: argparse.Namespace
    profile: dict[str, Any]
    log_root: Path

    def fleet(self, scenario: str, **kwargs: Any) -> Fleet:
        kwargs.setdefault("dynamodb", self.args.dynamodb)
        kwargs.setdefault("seed", self.args.seed)
        kwargs.setdefault("log_level", getattr(self.args, "worker_log_level", "INFO"))
        return Fleet(scenario, log_root=self.log_root, **kwargs)


def timing_env(p: dict[str, Any]) -> dict[str, str]:
    """A profile's timings for the workers (the member lease, heartbeat, reconcile)."""
    return {"STREAMLEASE_LEASE_SECONDS": str(p["lease"]),
            "STREAMLEASE_HEARTBEAT_SECONDS": str(p["heartbeat"]),
            "STREAMLEASE_RECONCILE_SECONDS": str(p["reconcile"]),
            "STREAMLEASE_SKEW_MARGIN_SECONDS": str(p["skew"]),
            # Scaled with the lease like the rest (the default is 1.5 x its 20 s lease).
            "STREAMLEASE_MIN_HOLD_SECONDS": str(1.5 * p["lease"]),
            "STREAMLEASE_BATCH_MAX_SECONDS": "0.5",
            "STREAMLEASE_SHUTDOWN_SECONDS": "10"}


# -- the chaos scenario ----------------------------------------------------------------------


async def run_chaos(ctx: Context) -> dict[str, Any]:
    p = ctx.profile
    # Tracing on: every worker exports its spans here (a batch every 200 ms).
    receiver = Receiver() if getattr(ctx.args, "tracing", "off") == "on" else None
    env = {**timing_env(p), **(receiver.env() if receiver is not None else {})}
    try:
        async with ctx.fleet("chaos", streams=p["streams"], rate=p["rate"],
                             worker_env=env) as fleet:
            for _ in range(p["workers"]):
                fleet.start_worker()
            print(f"chaos: {p['streams']} streams x {p['rate']} msg/s, {p['workers']} "
                  f"workers, lease {p['lease']} s"
                  + (f", spans to {receiver.endpoint}" if receiver is not None else ""),
                  flush=True)
            await asyncio.sleep(p["settle"])
            steady_from = fleet.now()
            delivered0 = sum(r.last_seq or 0 for r in fleet.records.values())
            await chaos_schedule(fleet, p)
            elapsed = fleet.now() - steady_from
            delivered = sum(r.last_seq or 0 for r in fleet.records.values()) - delivered0
            after_restarts = fleet.counts()
            fleet.scrape_all()
            workers_alive = len(fleet.workers)
            await fleet.stop_all()  # every worker flushes its spans as it exits
            audit = await fleet.audit()
            result = summarise_chaos(fleet, p, audit, elapsed, delivered, workers_alive,
                                     after_restarts)
            if receiver is not None:
                result["tracing"] = chaos_tracing(fleet, receiver)
            return result
    finally:
        if receiver is not None:
            receiver.close()


def chaos_tracing(fleet: Fleet, receiver: Receiver) -> dict[str, Any]:
    """The chaos run's ``tracing`` figures (``loadtest.tracing_scenario``): its SIGTERM
    hand-offs (the streams each SIGTERM'd worker logged releasing on shutdown) and kill -9
    take-overs, as the received spans show them."""
    logs = {w.name: w.log for w in fleet.everyone()}
    now = fleet.now()
    sigterms = [(f.worker, tracing_scenario.released_on_shutdown(logs[f.worker]))
                for f in fleet.faults if f.kind == "sigterm" and f.worker in logs]
    kills = [(f.worker, tracing_scenario.wall_ns(f.at, now))
             for f in fleet.faults if f.kind == "kill9" and f.worker is not None]
    figures = tracing_scenario.chaos_figures(receiver.spans(), sigterms, kills,
                                             receiver.rejected)
    print(f"chaos: {figures['handoffs_linked_count']} of {figures['handoffs']} SIGTERM "
          f"hand-offs linked release to first flush; {figures['takeovers']} take-overs "
          f"traced; {figures['spans_received']} spans received", flush=True)
    return figures


async def run_index_lag(ctx: Context) -> dict[str, Any]:
    """The chaos schedule on a store whose index reads are ``INDEX_LAG_MS`` behind."""
    p = ctx.profile
    async with ctx.fleet("index_lag", streams=p["streams"], rate=p["rate"],
                         worker_env=timing_env(p), index_lag_ms=INDEX_LAG_MS) as fleet:
        for _ in range(p["workers"]):
            fleet.start_worker()
        print(f"index_lag: index reads {INDEX_LAG_MS:g} ms behind; {p['streams']} streams, "
              f"{p['workers']} workers, lease {p['lease']} s", flush=True)
        await asyncio.sleep(p["settle"])
        await chaos_schedule(fleet, p)
        fleet.scrape_all()
        await fleet.stop_all()
        audit = await fleet.audit()
    total = fleet.total
    kill9 = fleet.failover("kill9")
    return {"index_lag": {
        "index_lag_ms": INDEX_LAG_MS,
        **{k: audit[k] for k in ("lost", "duplicated", "out_of_order", "stale_accepted")},
        "fleet_caused_gaps": audit["fleet_caused_gaps"],
        "messages_in_sink": audit["messages_in_sink"],
        # The self-audit runs every 1.6 leases (+/-20 %): the bound on any path that
        # leaves a stream leased to a live worker that does not serve it.
        "unserved_max_s": round(fleet.unserved_max_s, 2),
        "unserved_target_s": round(1.92 * p["lease"], 2),
        "unserved_worst": fleet.unserved_worst,
        "kill9_p99": kill9["p99"],
        "kill9_target_s": round(p["lease"] + 1.2 * p["reconcile"] + 1.5, 2),
        "kill9": kill9,
        "sigterm": fleet.failover("sigterm"),
        "unserved_released": int(total("streamlease_unserved_leases_released_total")),
        "index_hints": {o: int(total(f'streamlease_index_hints_total{{outcome="{o}"}}'))
                        for o in ("stale_fence", "confirmed", "dismissed")},
        "lease_lost_condition_failed": int(total(
            'streamlease_lease_lost_total{reason="condition_failed"}')),
        "log_events": fleet.log_events(),
    }}


def _victim(fleet: Fleet) -> str | None:
    """A random worker that holds streams (a fault on an idle one times nothing); any
    worker if none does."""
    holders = sorted(name for name, held in fleet.counts().items() if held)
    choices = holders or sorted(fleet.workers)
    return fleet.rng.choice(choices) if choices else None


async def kill_and_pause(fleet: Fleet, p: dict[str, Any], gap: float) -> None:
    """kill -9 of a worker holding streams (a new one replaces it), then SIGSTOP of one past
    the lease and SIGCONT, ``gap`` seconds after each."""
    victim = _victim(fleet)
    if victim is not None:
        fleet.kill9(victim)
        fleet.start_worker()
        await asyncio.sleep(gap)
    victim = _victim(fleet)
    if victim is not None:
        worker = fleet.workers[victim]
        fleet.fault("pause", victim)
        worker.paused = True
        worker.popen.send_signal(signal.SIGSTOP)
        await asyncio.sleep(p["lease"] + p["skew"] + p["reconcile"] * 2 + 1)
        worker.popen.send_signal(signal.SIGCONT)
        worker.paused = False
        await asyncio.sleep(gap)


async def chaos_schedule(fleet: Fleet, p: dict[str, Any]) -> None:
    gap = p["gap"]
    for _ in range(p["rounds"]):
        await kill_and_pause(fleet, p, gap)

        for sid in fleet.rng.sample(sorted(fleet.records), k=min(4, len(fleet.records))):
            fleet.fault("drop", None)
            await asyncio.to_thread(
                get, f"{fleet.upstream_url.replace('ws://', 'http://')}/control/drop"
                     f"?stream={sid}")
        await asyncio.sleep(gap / 2)

        # A rolling deploy: a new worker, then SIGTERM an old one, one at a time.
        for name in sorted(fleet.workers):
            fleet.start_worker()
            await asyncio.sleep(p["reconcile"] * 2)
            if name in fleet.workers:
                await fleet.sigterm(name, wait_s=30)
            await asyncio.sleep(gap / 2)
        await asyncio.sleep(gap)


def summarise_chaos(fleet: Fleet, p: dict[str, Any], audit: dict[str, int], elapsed: float,
                    delivered: int, workers: int,
                    after_restarts: dict[str, int]) -> dict[str, Any]:
    total = fleet.total
    failover = {kind: fleet.failover(kind) for kind in ("kill9", "sigterm", "pause")}
    stream_minutes = p["streams"] * elapsed / 60
    ops = {op: _ops(fleet, op) for op in ("update_item", "query", "scan",
                                          "transact_write_items", "get_item")}
    renewals = sum(total(f'streamlease_renewals_total{{outcome="{o}"}}')
                   for o in ("renewed", "lost", "unknown", "throttled"))
    member_beats = sum(total(f'streamlease_member_heartbeats_total{{outcome="{o}"}}')
                       for o in ("renewed", "fenced", "unknown", "throttled"))
    per_min = {
        "heartbeat": (renewals + member_beats) / stream_minutes,
        "member_heartbeat": member_beats / stream_minutes,
        "stream_renewal": renewals / stream_minutes,
        "acquire_release": max(0.0, ops["update_item"] - renewals - member_beats)
        / stream_minutes,
        "query": ops["query"] / stream_minutes,
        "check": ops["get_item"] / stream_minutes,
        "sweep_scan": ops["scan"] / stream_minutes,
        "sink": ops["transact_write_items"] / stream_minutes,
    }
    cost = _cost(per_min, p, batch_s=0.5)
    # The same at the worker's defaults: the sink at the default batching, and lease
    # upkeep as the capacity model counts it from the code (every request kind, 1,000
    # streams on 10 workers, a rolling deploy a day). The chaos run's own rate is a fault
    # every few seconds, not a day in production.
    flush_s = default_flush_s(p["rate"])
    sink_defaults = _cost({"heartbeat": 0.0, "acquire_release": 0.0, "query": 0.0,
                           "sweep_scan": 0.0, "sink": 60 / flush_s}, p, batch_s=flush_s)
    upkeep = capacity.scale_figures(1000, capacity.Settings())["upkeep_usd_per_1000_streams_month"]
    cost_defaults = {**sink_defaults, "lease_overhead": upkeep,
                     "total": round(upkeep + sink_defaults["sink"], 2),
                     "assumptions": f"{sink_defaults['assumptions']}; lease upkeep from the "
                                    "capacity model (loadtest/capacity.py) at 1,000 streams"}
    ddb_rate = sum(ops.values()) / elapsed
    store_limited = fleet.dynamodb == "embedded" and ddb_rate > 200
    bound = {"kill9": p["lease"] + 1.2 * p["reconcile"] + 0.5, "sigterm": 1.0}
    worker_seconds = workers * elapsed
    return {
        "chaos_seconds": round(elapsed, 1),
        **{k: audit[k] for k in ("lost", "duplicated", "out_of_order", "stale_accepted")},
        "stale_rejected": int(total("streamlease_stale_writes_rejected_total")),
        "fleet_caused_gaps": audit["fleet_caused_gaps"],
        "upstream_gaps_counted": int(total("streamlease_sequence_gaps_total")),
        "messages_in_sink": audit["messages_in_sink"],
        "msgs_per_s_during_chaos": round(delivered / elapsed, 1),
        "failover": failover,
        "failover_targets_s": bound,
        "requests_per_stream_minute": {k: round(v, 3) for k, v in per_min.items()},
        # 1.0 is one member heartbeat per worker per heartbeat interval; above it, retries.
        "member_heartbeats_per_interval": round(member_beats * p["heartbeat"] / worker_seconds,
                                                3) if worker_seconds else None,
        "dynamodb_requests_per_s": round(ddb_rate, 1),
        "store_was_bottleneck": store_limited,
        "cost_per_1000_streams_month_usd": cost,
        "cost_at_defaults_usd": cost_defaults,
        "rolling_restart_max_held": max(after_restarts.values(), default=0),
        "chaos_worker_exits": fleet.exits,
        "chaos_log_events": fleet.log_events(),
        "faults": [{"kind": f.kind, "at": round(f.at, 2), "worker": f.worker,
                    "streams": len(f.streams), "recovered": len(f.recovered)}
                   for f in fleet.faults],
        "timeline": fleet.timeline_out(),
    }


def default_flush_s(rate: float) -> float:
    """Seconds between a stream's sink writes at the default batching: when the batch
    reaches the message cap, or at the latency bound, whichever comes first."""
    window = float(DEFAULTS["STREAMLEASE_BATCH_MAX_SECONDS"])
    return min(window, int(DEFAULTS["STREAMLEASE_BATCH_MAX_MESSAGES"]) / rate)


def _ops(fleet: Fleet, op: str) -> float:
    prefix = f'streamlease_dynamodb_requests_total{{operation="{op}",'
    return sum(v for w in fleet.everyone() for k, v in w.metrics.items()
               if k.startswith(prefix))


# Prices: DynamoDB on-demand, us-east-1, standard table class, from the November 2024 price
# list: $0.625 per million write request units, $0.125 per million read request units.
WRU_USD = 0.625 / 1e6
RRU_USD = 0.125 / 1e6


def _cost(per_min: dict[str, float], profile: dict[str, Any], batch_s: float) -> dict[str, Any]:
    """Implied on-demand cost of 1,000 streams for a 30-day month, with its assumptions.

    Write units per call: a stream renewal moves the index sort key (1 WRU on the table,
    2 on the index: delete + put), acquire/release likewise; a member heartbeat is 1 WRU
    on the fleet table (given per stream as ``member_heartbeat``; without that breakdown
    ``heartbeat`` is priced as renewals); a sink transaction doubles its items' units
    (transactions cost 2x): the streams item (``last_seq`` is not in the index) and one
    events item per ~1 KB of messages; a query reads up to 4 KB (0.5 RRU eventually
    consistent), a check-in is one consistent read (1 RRU), the sweep's scan about 0.5
    RRU per 4 KB of table.
    """
    minutes = 30 * 24 * 60 * 1000  # stream-minutes per month for 1,000 streams
    msg_bytes = 60
    batch_msgs = max(1.0, profile["rate"] * batch_s)  # a flush every batch_s at this rate
    events_wru = math.ceil(batch_msgs * (msg_bytes + 8) / 1024)
    if "stream_renewal" in per_min:
        upkeep = per_min["stream_renewal"] * 3 + per_min.get("member_heartbeat", 0.0)
    else:
        upkeep = per_min["heartbeat"] * 3
    wru = {
        "upkeep": upkeep,
        "acquire_release": per_min["acquire_release"] * 3,
        "sink": per_min["sink"] * 2 * (1 + events_wru),
    }
    rru = {"query": per_min["query"] * 0.5, "check": per_min.get("check", 0.0),
           "sweep_scan": per_min["sweep_scan"] * 0.5}
    lease_usd = (wru["upkeep"] + wru["acquire_release"]) * minutes * WRU_USD + \
        sum(rru.values()) * minutes * RRU_USD
    sink_usd = wru["sink"] * minutes * WRU_USD
    return {"total": round(lease_usd + sink_usd, 2), "lease_overhead": round(lease_usd, 2),
            "sink": round(sink_usd, 2),
            "assumptions": "us-east-1 on-demand $0.625/M WRU, $0.125/M RRU; stream renewal = "
                           "3 WRU (table + index delete/put), member heartbeat = 1 WRU; "
                           "transaction = 2x; "
                           f"{msg_bytes}-byte messages at {profile['rate']} msg/s per stream; "
                           "storage, PITR and data transfer not included"}


def _pct(values: list[float], p: float) -> float | None:
    return pct(values, p)


# -- the throughput scenario -----------------------------------------------------------------


@contextlib.contextmanager
def _store_env(ctx: Context) -> Iterator[dict[str, str]]:
    """The environment a scenario's workers get: this process's, pointed at a fresh
    embedded DynamoDB when the run uses one (stopped afterwards)."""
    env = dict(os.environ)
    ddb = None
    if ctx.args.dynamodb == "embedded":
        ddb = Server("dynamodb", "--port", "0")
        env.update(local_aws_env(ddb.url))
        os.environ.update(local_aws_env(ddb.url))
    try:
        yield env
    finally:
        if ddb is not None:
            ddb.stop()


async def run_throughput(ctx: Context) -> dict[str, Any]:
    with _store_env(ctx) as env:
        return await measure_throughput("", env, ctx.args.quick)


async def run_tracing(ctx: Context) -> dict[str, Any]:
    """Throughput with tracing on / off (``loadtest.tracing_scenario``)."""
    with _store_env(ctx) as env:
        return await tracing_scenario.measure_tracing_cost(env, ctx.args.quick)


# -- running scenarios -----------------------------------------------------------------------


def runners() -> dict[str, Callable[[Context], Awaitable[dict[str, Any]]]]:
    from loadtest import jobs_scenario, scenarios

    return {"chaos": run_chaos, "index_lag": run_index_lag, "throughput": run_throughput,
            "tracing": run_tracing,
            "skew": scenarios.run_skew,
            "slow_store": scenarios.run_slow_store, "balance": scenarios.run_balance,
            "balance_startup": scenarios.run_balance_startup,
            "kill9_defaults": scenarios.run_kill9_defaults,
            "jobs": jobs_scenario.run_jobs, "sinks": sinks_scenario.run_sinks,
            "upstreams": upstreams_scenario.run_upstreams,
            "change_feed": change_feed_scenario.run_change_feed,
            "scale_reads": scenarios.run_scale_reads, "scale": scenarios.run_scale}


def section_paths(part: dict[str, Any]) -> list[str]:
    """The keys a scenario wrote: top-level, or in shared sections down to their depth
    (``failover.kill9``, ``sinks.kinesis.lost``)."""

    def leaves(prefix: str, value: Any, depth: int) -> list[str]:
        if depth == 0 or not isinstance(value, dict):
            return [prefix]
        return [p for sub, v in value.items() for p in leaves(f"{prefix}.{sub}", v, depth - 1)]

    paths = []
    for key, value in part.items():
        if key in SHARED_SECTIONS and isinstance(value, dict):
            paths += leaves(key, value, SHARED_SECTIONS[key])
        else:
            paths.append(key)
    return paths


def put_path(result: dict[str, Any], path: str, value: Any) -> None:
    *heads, last = path.split(".")
    for head in heads:
        if not isinstance(result.get(head), dict):
            result[head] = {}
        result = result[head]
    result[last] = value


def get_path(result: dict[str, Any], path: str) -> Any:
    value: Any = result
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


async def run_scenarios(ctx: Context, names: list[str],
                        previous: dict[str, Any] | None) -> dict[str, Any]:
    args = ctx.args
    result: dict[str, Any] = {
        "profile": args.profile, "settings": ctx.profile, "dynamodb": args.dynamodb,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "scenarios": {},
        "logs": str(ctx.log_root),
    }
    table = runners()
    parts: list[tuple[list[str], dict[str, Any]]] = []
    for name in names:
        print(f"== scenario {name}", flush=True)
        started = time.monotonic()
        meta: dict[str, Any] = {"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                            time.gmtime())}
        try:
            part = await table[name](ctx)
            meta["ok"] = "error" not in part
            if "error" in part:
                meta["error"] = part.pop("error")
        except Exception as exc:
            traceback.print_exc()
            part = {}
            meta.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        meta["seconds"] = round(time.monotonic() - started, 1)
        meta["keys"] = section_paths(part)
        parts.append((meta["keys"], part))
        result["scenarios"][name] = meta
        print(f"== scenario {name}: {'ok' if meta['ok'] else meta['error']} "
              f"({meta['seconds']:.0f} s)", flush=True)
    # The kept figures first, this run's over them: a scenario of an earlier run may have
    # recorded a whole shared section (``scale``) that this run's scenarios write into.
    if previous:
        for name, meta in previous.get("scenarios", {}).items():
            if name in result["scenarios"] or not isinstance(meta, dict):
                continue
            for path in meta.get("keys", []):
                value = get_path(previous, path)
                if value is not None:
                    put_path(result, path, value)
            result["scenarios"][name] = {**meta, "from_previous_run": True}
    for keys, part in parts:
        for path in keys:
            put_path(result, path, get_path(part, path))
    return result


# A scenario section's own correctness figures, beyond the sink audit's.
SECTION_CORRECTNESS = (*CORRECTNESS, "double_runs", "lost_changes")
# Sections one level down that carry an audit of their own.
NESTED_SECTIONS = ("balance.during_startup", "change_feed.off")


# Per sink (``sinks.<name>``): messages lost, duplicated within one tenure, stale writes
# accepted; ``duplicated`` too for the exactly-once sinks (the others may duplicate across
# a takeover).
SINK_CORRECTNESS = ("lost", "dup_outside_takeover", "stale_accepted")


def correctness_failures(result: dict[str, Any]) -> dict[str, int]:
    """Every non-zero correctness figure, top-level (chaos), in a scenario's section, of a
    sink (``sinks.<name>.<figure>``) or of an upstream mode (``upstreams.<mode>.<figure>``)."""
    bad = {k: result[k] for k in CORRECTNESS if result.get(k)}
    for name, section in result.items():
        if isinstance(section, dict):
            bad.update({f"{name}.{k}": section[k] for k in SECTION_CORRECTNESS
                        if section.get(k)})
    for path in NESTED_SECTIONS:
        section = get_path(result, path)
        if isinstance(section, dict):
            bad.update({f"{path}.{k}": section[k] for k in SECTION_CORRECTNESS
                        if section.get(k)})
    sinks = result.get("sinks")
    for name, found in (sinks.items() if isinstance(sinks, dict) else ()):
        if not isinstance(found, dict):
            continue
        keys: tuple[str, ...] = SINK_CORRECTNESS
        if found.get("exactly_once", sinks_scenario.exactly_once(name)):
            keys = (*keys, "duplicated")
        bad.update({f"sinks.{name}.{k}": found[k] for k in keys if found.get(k)})
    bad.update(upstreams_scenario.correctness_failures(result.get("upstreams")))
    return bad


def parse_scenarios(text: str) -> list[str]:
    return choose_names(text, SCENARIOS, "scenario", default=DEFAULT_SCENARIOS)


def parse_feed_modes(text: str) -> list[str]:
    return choose_names(text, change_feed_scenario.MODES, "change feed mode")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="make loadtest", description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=parse_scenarios, default=list(DEFAULT_SCENARIOS),
                        help=f"comma-separated from {', '.join(SCENARIOS)}; 'default' "
                             f"({','.join(DEFAULT_SCENARIOS)}) or 'all'")
    parser.add_argument("--merge", action="store_true", default=True,
                        help="keep the other scenarios' figures from the last latest.json "
                             "(the default: the committed results always hold every key)")
    parser.add_argument("--fresh", dest="merge", action="store_false",
                        help="write only the figures of the scenarios this run ran")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="small")
    parser.add_argument("--streams", type=int, help="override the profile's stream count")
    parser.add_argument("--rate", type=float, help="messages/s per stream")
    parser.add_argument("--workers", type=int, help="worker processes")
    parser.add_argument("--dynamodb", choices=["embedded", "env"], default="embedded",
                        help="embedded server, or the endpoint/credentials the AWS variables name")
    parser.add_argument("--seed", type=int, default=None, help="chaos schedule seed")
    parser.add_argument("--tracing", choices=["on", "off"], default="on",
                        help="on (the default): the chaos run's workers export spans to a "
                             "receiver on loopback, for the tracing.* hand-off figures and "
                             "latest-trace.png")
    parser.add_argument("--quick", action="store_true",
                        help="shorter throughput phases (for smoke runs)")
    parser.add_argument("--out", default=str(RESULTS), help="where to write the reports")
    parser.add_argument("--worker-log-level", choices=["DEBUG", "INFO"], default="INFO",
                        help="the workers' STREAMLEASE_LOG_LEVEL (DEBUG adds each change "
                        "feed hop: feed.batch, feed.notice_posted, member.beat, "
                        "member.notice_heard, stream.checked_now)")
    g = parser.add_argument_group("scenario settings")
    g.add_argument("--skew-offset", default="-2s",
                   help="libfaketime offset of the skewed worker (default -2s; 'off': the "
                        "same run without libfaketime, a control)")
    g.add_argument("--skew-seconds", type=float, default=60.0)
    g.add_argument("--slow-store-ms", type=float, default=20.0,
                   help="embedded server latency per request in slow_store (default 20)")
    g.add_argument("--slow-store-mode", choices=["serial", "parallel"], default="parallel",
                   help="parallel (default): 20 ms added to every request, a slow store or "
                        "network; serial: the delay held inside the server's lock, a store "
                        "saturated at 1000/ms requests/s (see streamlease/dev/dynamodb.py)")
    g.add_argument("--slow-store-seconds", type=float, default=60.0)
    g.add_argument("--slow-store-rate", type=float, default=None,
                   help="messages/s per stream in slow_store (default: the profile's)")
    g.add_argument("--balance-rate", type=float, default=1.0,
                   help="messages/s per stream in balance (default 1: 40 streams at the "
                        "small profile's 20 saturated the embedded server on 2 cores)")
    g.add_argument("--balance-timeout", type=float, default=60.0,
                   help="give up waiting for convergence after this long (default 60)")
    g.add_argument("--sinks", type=sinks_scenario.parse_sinks,
                   default=list(sinks_scenario.SINKS),
                   help=f"sinks of the sinks scenario, comma-separated from "
                        f"{', '.join(sinks_scenario.SINKS + sinks_scenario.OPTIONAL_SINKS)}; "
                        "'default' (all but "
                        f"{', '.join(sinks_scenario.OPTIONAL_SINKS)}) or 'all'")
    g.add_argument("--upstream-modes", type=upstreams_scenario.parse_modes,
                   default=list(upstreams_scenario.MODES),
                   help="resume modes of the upstreams scenario, comma-separated from "
                        f"{', '.join(upstreams_scenario.MODES)}, or 'all' (the default)")
    g.add_argument("--kill9-defaults-workers", type=int, default=3)
    g.add_argument("--kill9-defaults-streams", type=int, default=100,
                   help="streams per worker in kill9_defaults (default 100, the default "
                        "STREAMLEASE_MAX_STREAMS)")
    g.add_argument("--kill9-defaults-rate", type=float, default=0.5,
                   help="messages/s per stream in kill9_defaults (default 0.5)")
    g.add_argument("--kill9-defaults-kills", type=int, default=2)
    g.add_argument("--change-feed-modes", type=parse_feed_modes,
                   default=list(change_feed_scenario.MODES),
                   help="STREAMLEASE_CHANGE_FEED values the change_feed scenario runs, a "
                        "fleet each, comma-separated from on, off, or 'all' (the default: "
                        "on, then off)")
    g.add_argument("--change-feed-changes", type=int, default=change_feed_scenario.CHANGES,
                   help="changes of each kind in change_feed (default "
                        f"{change_feed_scenario.CHANGES})")
    g.add_argument("--change-feed-quiet-s", type=float, default=change_feed_scenario.QUIET_S,
                   help="change_feed's quiet window (default "
                        f"{change_feed_scenario.QUIET_S:g} s)")
    g.add_argument("--change-feed-index-lag-ms", type=float,
                   default=change_feed_scenario.INDEX_LAG_MS,
                   help="change_feed: index reads this far behind the table, plus up to "
                        f"{change_feed_scenario.INDEX_LAG_JITTER_MS:g} ms (default "
                        f"{change_feed_scenario.INDEX_LAG_MS:g})")
    g.add_argument("--scale-reads-streams", type=int, default=25,
                   help="idle streams per worker in scale_reads (default 25)")
    g.add_argument("--scale-reads-window", type=float, default=60.0,
                   help="quiet window of each scale_reads fleet (default 60 s: one stream "
                        "check-in interval)")
    g.add_argument("--scale-streams", type=int, default=2000)
    g.add_argument("--scale-workers", type=int, default=4)
    g.add_argument("--scale-rate", type=float, default=1e-6,
                   help="messages/s per scale stream (default 1e-6: idle)")
    g.add_argument("--scale-window", type=float, default=60.0,
                   help="steady window for request rates (a window longer than "
                        "STREAMLEASE_STREAM_RENEW_SECONDS also sees stream renewals)")
    g.add_argument("--scale-acquire-per-cycle", type=int, default=100,
                   help="STREAMLEASE_ACQUIRE_PER_CYCLE for the scale run (default 100)")
    return parser


async def until_stopped(run: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """``run``, cancelled as soon as ``STOP`` is requested (SIGTERM, SIGINT, SIGHUP): the
    cancellation unwinds through every fleet's and server's cleanup."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def cancel() -> None:
        loop.call_soon_threadsafe(task.cancel)

    STOP.notify = cancel
    try:
        if STOP.requested:
            run.close()
            raise asyncio.CancelledError
        return await run
    finally:
        STOP.notify = None


def stopped_status() -> int:
    """The exit status of a run stopped by a signal: 128 + its number."""
    print(f"make loadtest: stopped by {STOP.reason}; every child stopped, no results written",
          file=sys.stderr, flush=True)
    return 128 + signal.Signals[STOP.reason or "SIGTERM"].value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Before any child exists: SIGTERM (a CI timeout), SIGINT (Ctrl-C) and SIGHUP (a closed
    # terminal) stop the run in order instead of killing this process alone.
    STOP.install()
    profile = dict(PROFILES[args.profile])
    for key in ("streams", "rate", "workers"):
        if getattr(args, key) is not None:
            profile[key] = getattr(args, key)
    out = Path(args.out)
    previous = None
    if args.merge and (out / "latest.json").exists():
        previous = json.loads((out / "latest.json").read_text())
    ctx = Context(args, profile, LOGS / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    import uvloop

    try:
        result = uvloop.run(until_stopped(run_scenarios(ctx, args.scenarios, previous)))
    except asyncio.CancelledError:
        if not STOP.requested:
            raise
        return stopped_status()
    finally:
        stop_children()  # whatever a scenario's own cleanup left running
    if STOP.requested:  # after the last scenario: its figures may be cut short
        return stopped_status()
    paths = write_reports(result, out)
    print(Path(paths["md"]).read_text())
    print("reports: " + ", ".join(str(v) for v in paths.values()))
    print(f"worker logs: {ctx.log_root}")
    status = 0
    bad = correctness_failures(result)
    if bad:
        print(f"CORRECTNESS FAILURE: {bad}", file=sys.stderr)
        status = 1
    failed = {n: m.get("error") for n, m in result["scenarios"].items() if not m.get("ok")}
    if failed:
        print(f"SCENARIOS THAT DID NOT RUN TO THE END: {failed}", file=sys.stderr)
        status = 1
    return status


if __name__ == "__main__":
    raise SystemExit(main())
