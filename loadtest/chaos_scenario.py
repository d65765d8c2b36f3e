"""The ``chaos`` and ``index_lag`` scenarios: the profile's fleet through the chaos schedule.

The schedule (``chaos_schedule``), ``rounds`` times: kill -9 of a worker holding streams (a
new one replaces it), SIGSTOP of one past the lease then SIGCONT, upstream connection drops
and a rolling SIGTERM deploy, ``gap`` seconds apart. ``chaos`` runs it on the embedded server
as it is, with every worker exporting its spans (``--tracing on``): failover times, the sink
audit, requests and cost per stream-minute, linked hand-offs (``loadtest.audit``).
``index_lag`` runs it with the server's index reads ``INDEX_LAG_MS`` behind the table: the
longest a stream stayed leased to a live worker that did not serve it, the audit, kill -9
failover.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from loadtest.audit import chaos_figures, released_on_shutdown, wall_ns
from loadtest.capacity import PRICE_READ, PRICE_WRITE, Settings, scale_figures
from loadtest.common import dynamodb_args, timing_env
from loadtest.fleet import Context, Fleet, kill_and_pause, metric_sum, rolling_restart
from loadtest.otlp import Receiver
from streamlease.config import DEFAULTS

INDEX_LAG_MS = 1000.0  # the index_lag scenario: every index read a second behind


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
    """The chaos run's ``tracing`` figures (``loadtest.audit.chaos_figures``): its SIGTERM
    hand-offs (the streams each SIGTERM'd worker logged releasing on shutdown) and kill -9
    take-overs, as the received spans show them."""
    logs = {w.name: w.log for w in fleet.everyone()}
    now = fleet.now()
    sigterms = [(f.worker, released_on_shutdown(logs[f.worker]))
                for f in fleet.faults if f.kind == "sigterm" and f.worker in logs]
    kills = [(f.worker, wall_ns(f.at, now))
             for f in fleet.faults if f.kind == "kill9" and f.worker is not None]
    figures = chaos_figures(receiver.spans(), sigterms, kills, receiver.rejected)
    print(f"chaos: {figures['handoffs_linked_count']} of {figures['handoffs']} SIGTERM "
          f"hand-offs linked release to first flush; {figures['takeovers']} take-overs "
          f"traced; {figures['spans_received']} spans received", flush=True)
    return figures


async def run_index_lag(ctx: Context) -> dict[str, Any]:
    """The chaos schedule on a store whose index reads are ``INDEX_LAG_MS`` behind."""
    p = ctx.profile
    async with ctx.fleet("index_lag", streams=p["streams"], rate=p["rate"],
                         worker_env=timing_env(p),
                         store_args=dynamodb_args(index_lag_ms=INDEX_LAG_MS)) as fleet:
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
        **audit,  # the sink audit: lost, duplicated, ..., messages_in_sink
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


async def chaos_schedule(fleet: Fleet, p: dict[str, Any]) -> None:
    gap = p["gap"]
    for _ in range(p["rounds"]):
        await kill_and_pause(fleet, p, gap)

        await fleet.drop_connections(4)
        await asyncio.sleep(gap / 2)
        await rolling_restart(fleet, p)  # a rolling deploy
        await asyncio.sleep(gap)


def summarise_chaos(fleet: Fleet, p: dict[str, Any], audit: dict[str, int], elapsed: float,
                    delivered: int, workers: int,
                    after_restarts: dict[str, int]) -> dict[str, Any]:
    total = fleet.total
    failover = {kind: fleet.failover(kind) for kind in ("kill9", "sigterm", "pause")}
    stream_minutes = p["streams"] * elapsed / 60
    ops = {op: metric_sum(fleet.everyone(),
                          f'streamlease_dynamodb_requests_total{{operation="{op}",')
           for op in ("update_item", "query", "scan", "transact_write_items", "get_item")}
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
    usd = cost(per_min, p, batch_s=0.5)
    # The same at the worker's defaults: the sink at the default batching, and lease
    # upkeep as the capacity model counts it from the code (every request kind, 1,000
    # streams on 10 workers, a rolling deploy a day). The chaos run's own rate is a fault
    # every few seconds, not a day in production.
    flush_s = default_flush_s(p["rate"])
    sink_defaults = cost({"heartbeat": 0.0, "acquire_release": 0.0, "query": 0.0,
                           "sweep_scan": 0.0, "sink": 60 / flush_s}, p, batch_s=flush_s)
    upkeep = scale_figures(1000, Settings())["upkeep_usd_per_1000_streams_month"]
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
        "cost_per_1000_streams_month_usd": usd,
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


def cost(per_min: dict[str, float], profile: dict[str, Any], batch_s: float) -> dict[str, Any]:
    """Implied on-demand cost of 1,000 streams for a 30-day month, with its assumptions
    (the returned ``assumptions``). Without a ``member_heartbeat`` figure ``heartbeat`` is
    priced as renewals; a query reads up to 4 KB (0.5 RRU eventually consistent), a
    check-in is one consistent read, the sweep's scan about 0.5 RRU per 4 KB of table."""
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
    lease_usd = (wru["upkeep"] + wru["acquire_release"]) * minutes * PRICE_WRITE + \
        sum(rru.values()) * minutes * PRICE_READ
    sink_usd = wru["sink"] * minutes * PRICE_WRITE
    return {"total": round(lease_usd + sink_usd, 2), "lease_overhead": round(lease_usd, 2),
            "sink": round(sink_usd, 2),
            "assumptions": "us-east-1 on-demand $0.625/M WRU, $0.125/M RRU; stream renewal = "
                           "3 WRU (table + index delete/put), member heartbeat = 1 WRU; "
                           "transaction = 2x; "
                           f"{msg_bytes}-byte messages at {profile['rate']} msg/s per stream; "
                           "storage, PITR and data transfer not included"}
