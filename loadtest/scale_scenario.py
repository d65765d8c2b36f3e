"""The ``scale`` and ``scale_reads`` scenarios: the control plane at default timings, with
2,000 idle streams on 4 workers, and as the fleet grows from 2 workers to 8."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from loadtest.capacity import capacity_model, inputs_from_scale, model_text, per_worker_read_growth
from loadtest.fleet import Context, Fleet, by_operation, rounded, rss_bytes
from streamlease.config import DEFAULTS, WorkerConfig
from streamlease.core.stream import stream_buffer_bytes


async def run_scale(ctx: Context) -> dict[str, Any]:
    """2,000 idle streams on 4 workers, only STREAMLEASE_MAX_STREAMS (every stream fits on
    the survivors of a kill) and STREAMLEASE_ACQUIRE_PER_CYCLE (so the first acquisition
    does not take minutes) raised. The table is read every 15 s (a Scan of 2,000 items
    occupies the serialised embedded server for about a second); who holds how many comes
    from the workers' leases_held gauges. Idle streams deliver nothing, so failover is
    timed until each is connected again (the killed worker's sockets closed with it)."""
    args = ctx.args
    n, workers = args.scale_streams, args.scale_workers
    # The buffer budget must cover every held stream's worst case; these streams are idle,
    # so it is raised to fit rather than the streams spread thinner (the model wants few
    # workers holding many streams).
    per_stream = stream_buffer_bytes(int(DEFAULTS["STREAMLEASE_MAX_FRAME_BYTES"]))
    env = {"STREAMLEASE_MAX_STREAMS": str(n),
           "STREAMLEASE_ACQUIRE_PER_CYCLE": str(args.scale_acquire_per_cycle),
           "STREAMLEASE_BUFFER_BUDGET_BYTES": str(n * per_stream)}
    section: dict[str, Any] = {"streams": n, "workers": workers, "rate": args.scale_rate,
                               "raised_settings": env, "window_s": args.scale_window,
                               "failover_recovery": "upstream connected again (idle streams)"}
    async with ctx.fleet("scale", streams=n, rate=args.scale_rate, worker_env=env,
                         sample_s=1.0, table_s=15.0, watch_upstream=True) as fleet:
        started = fleet.now()
        for _ in range(workers):
            fleet.start_worker()

        def connected() -> int:
            return sum(1 for sid in fleet.ids if fleet.connections.get(sid, 0) > 0)

        held = await fleet.wait_until(lambda: fleet.held_total() >= n, 600.0)
        section["all_held_s"] = rounded(held)
        all_connected = await fleet.wait_until(lambda: connected() >= n, 60.0)
        section["all_connected_s"] = rounded(None if all_connected is None
                                            else fleet.now() - started)
        section["held_when_measured"] = fleet.held_total()
        section["connected_when_measured"] = connected()
        # A quiet window: the fleet even (each worker within share + 1) and no worker's
        # count changed for 10 s, as the gauges show (the table is read too rarely to
        # time moves by); start-up's balancing is not steady state.
        section["settled_s"] = rounded(await fleet.wait_until(
            lambda: _even_and_still(fleet, workers, 10.0), 180.0))

        steady = await _steady_window(fleet, args.scale_window)
        section.update(steady)
        section.update(index_moves(steady["lease_writes_in_window"],
                                   steady["stream_minutes_in_window"],
                                   steady["window_measured_s"],
                                   WorkerConfig.from_env({}).stream_renew_s))  # its default

        await fleet.read_table()
        victim = max(fleet.workers, key=lambda w: len(fleet.held_by(w)[0]), default=None)
        if victim is not None:
            fault = fleet.kill9(victim, recovery="connected")
            took = await fleet.wait_until(
                lambda f=fault: len(f.recovered) >= len(f.streams), 180.0)  # type: ignore[misc]
            await fleet.read_table()
            wrong = sum(1 for sid in fault.recovered
                        if fleet.records.get(sid) is not None
                        and fleet.records[sid].lease_owner == victim)
            section["kill9"] = {**fleet.failover("kill9"), "victim": victim,
                                "streams": len(fault.streams),
                                "all_back_s": rounded(took),
                                "recovered_still_owned_by_victim": wrong}
            # The flat key the targets table reads (the section above keeps it too).
            section["kill9_p99"] = section["kill9"]["p99"]
        section["held_at_end"] = fleet.counts()
        section["upstream_rss_mb"] = _rss_mb(fleet.servers[-1].popen.pid)
        await fleet.finish(section, only_delivered=True)
        section["timeline"] = fleet.timeline_out(every=2)
    # Counted from the code (loadtest/capacity.py), not measured: the run has one fleet size.
    section["per_worker_read_growth_modelled"] = per_worker_read_growth()
    model = capacity_model(inputs_from_scale(section))
    return {"scale": section, "capacity_model": {**model, "text": model_text(model)},
            # At default settings a worker holds at most 100 streams, so its heartbeats
            # are amortised over 100 at best (the scale run raises the cap: see the model).
            "upkeep_writes_per_stream_minute_default":
                model["upkeep_writes_per_stream_minute_full_workers"],
            # Every request kind, every partition-key value at or under half its limit.
            "streams_per_table_at_defaults": model["streams_per_table"]}


def _even_and_still(fleet: Fleet, workers: int, still_s: float) -> bool:
    """Every stream held, ``workers`` workers each within one of the fair share, and no
    worker's count changed in the last ``still_s`` seconds of samples."""
    counts = fleet.counts()
    share = math.ceil(fleet.streams / workers)
    if not fleet.all_held() or len(counts) != workers or \
            any(abs(c - share) > 1 for c in counts.values()):
        return False
    recent = [owned for t, owned in fleet.timeline if t >= fleet.now() - still_s]
    return bool(fleet.timeline) and fleet.timeline[0][0] <= fleet.now() - still_s and \
        all(owned == recent[-1] for owned in recent)


async def _steady_window(fleet: Fleet, window_s: float) -> dict[str, Any]:
    """Counters of every live worker before and after ``window_s``: the store's
    requests/s by operation per 1,000 held streams, and the lease-upkeep rates."""
    before = fleet.snapshot()
    t0 = fleet.now()
    held = await fleet.mean_held(window_s)
    after = fleet.snapshot()
    elapsed = fleet.now() - t0
    names = [name for name in before if name in after]

    def delta(prefix: str) -> float:
        return sum(v - before[name].get(k, 0.0) for name in names
                   for k, v in after[name].items() if k.startswith(prefix))

    per_op = dict(sorted(by_operation(before, after, names).items()))
    per_1000 = {op: round(v / elapsed / (held / 1000), 3) for op, v in per_op.items() if v} \
        if held else {}
    stream_minutes = held * elapsed / 60
    cpu = {name: round(after[name].get("process_cpu_seconds_total", 0.0)
                       - before[name].get("process_cpu_seconds_total", 0.0), 2)
           for name in names}
    writes = {name: delta(metric) for name, metric in LEASE_WRITES.items()}
    rates = {
        "member_heartbeats_per_worker_s": delta("streamlease_member_heartbeats_total")
        / elapsed / max(1, len(names)),
        "renewals_per_stream_minute": delta("streamlease_renewals_total") / stream_minutes
        if stream_minutes else 0.0,
        "acquisitions_per_stream_minute": delta("streamlease_lease_acquired_total")
        / stream_minutes if stream_minutes else 0.0,
        "releases_per_stream_minute": (delta("streamlease_lease_released_total")
                                       + delta("streamlease_releases_on_behalf_total"))
        / stream_minutes if stream_minutes else 0.0,
    }
    return {
        "held_streams_in_window": round(held, 1),
        "window_measured_s": round(elapsed, 1),
        # Every worker trusted the leader's change feed at the window's end (the model
        # then counts the feed and rests the polls it replaces).
        "change_feed": bool(names) and all(
            after[name].get("streamlease_change_feed_live", 0.0) == 1.0 for name in names),
        "requests_per_s_per_1000_streams": per_1000,
        "requests_per_s_total": round(sum(per_op.values()) / elapsed, 2),
        "rates": {k: round(v, 5) for k, v in rates.items()},
        "lease_writes_in_window": writes,
        "dead_streams_taken_in_window": delta("streamlease_dead_streams_taken_total"),
        "stream_minutes_in_window": round(stream_minutes, 2),
        "worker_cpu_s_in_window": cpu,
        "worker_rss_mb": {w.name: round(w.metrics.get("process_resident_memory_bytes", 0)
                                        / 2**20, 1) for w in fleet.workers.values()},
        "event_loop_lag_max_s": round(max((w.metrics.get("streamlease_event_loop_lag_seconds",
                                                         0.0) for w in fleet.workers.values()),
                                          default=0.0), 4),
    }


def _rss_mb(pid: int) -> float | None:
    try:
        return round(rss_bytes(pid) / 2**20, 1) or None
    except OSError:
        return None


# -- index-key moves (the scale run's quiet window) -----------------------------------------

# Lease writes that change ``lease_expires_at_ms``, the orphan index's range key: each
# moves the stream's index entry (a delete and a put). Take-overs of a dead member's
# streams are inside ``lease_acquired`` (the reconciler counts every tenure it starts);
# ``streamlease_dead_streams_taken_total`` is reported beside them, not added. A counter an
# older build does not have reads as 0.
LEASE_WRITES = {
    "renewals": 'streamlease_renewals_total{outcome="renewed"}',
    "acquisitions": "streamlease_lease_acquired_total",
    "releases": "streamlease_lease_released_total",
    "releases_on_behalf": "streamlease_releases_on_behalf_total",
    "unserved_released": "streamlease_unserved_leases_released_total",
}
INDEX_WRITES_PER_MOVE = 2


def index_moves(writes: dict[str, float], stream_minutes: float, window_s: float,
                renew_s: float | None) -> dict[str, Any]:
    """Index-key moves per held stream-minute (2 index writes per lease write that changes
    the expiry) in a quiet window: measured, and as the stream renewal setting implies
    when the window is shorter than one renewal interval (it then saw no renewal, so
    renewals come from ``60 / renew_s``, the other writes as measured).
    ``index_moves_per_stream_minute`` holds the implied figure in that case, else the
    measured one; ``index_moves_source`` says which."""
    if not stream_minutes:
        return {"index_moves_per_stream_minute": None, "index_moves_source": "no held streams"}
    per_min = {k: v / stream_minutes for k, v in writes.items()}
    measured = INDEX_WRITES_PER_MOVE * sum(per_min.values())
    out: dict[str, Any] = {
        "index_moves_measured_per_stream_minute": round(measured, 5),
        "lease_writes_per_stream_minute": {k: round(v, 5) for k, v in per_min.items()},
    }
    if renew_s is None or window_s >= 1.1 * renew_s:
        out["index_moves_per_stream_minute"] = round(measured, 5)
        out["index_moves_source"] = f"measured over {window_s:.0f} s"
        return out
    others = sum(v for k, v in per_min.items() if k != "renewals")
    implied = INDEX_WRITES_PER_MOVE * (60.0 / renew_s + others)
    out["index_moves_per_stream_minute"] = round(implied, 5)
    out["index_moves_source"] = (
        f"setting: renewals at 60 / STREAMLEASE_STREAM_RENEW_SECONDS ({renew_s:g} s), the "
        f"other lease writes as measured; the {window_s:.0f} s window is shorter than one "
        f"renewal interval (measured: {measured:.3f})")
    return out


# -- control-plane reads per worker as the fleet grows ----------------------------------------

READ_GROWTH_WORKERS = (2, 8)
ITEMS_READ = "streamlease_dynamodb_items_read_total"


async def run_scale_reads(ctx: Context) -> dict[str, Any]:
    """Control-plane items read per worker-minute with 2 workers and with 8 holding the
    same idle streams each, at the default timings, over a quiet window once the fleet is
    even and still for 10 s (``ITEMS_READ``: the sink only writes, so every read is the
    control plane's). ``per_worker_read_growth``, 8 over 2, is 1.0 when a worker's reads
    do not grow with the fleet."""
    args = ctx.args
    per, window = args.scale_reads_streams, args.scale_reads_window
    runs: dict[str, Any] = {}
    for workers in READ_GROWTH_WORKERS:
        print(f"scale_reads: {workers} workers x {per} idle streams, {window:.0f} s window",
              flush=True)
        runs[str(workers)] = await _reads_per_worker(ctx, workers, per, window)
    low, high = (runs[str(w)].get("items_per_worker_minute") for w in READ_GROWTH_WORKERS)
    return {"scale": {
        "per_worker_read_growth": _growth(low, high),
        "per_member_read_growth": _role_growth(runs, "members"),
        "leader_read_growth": _role_growth(runs, "leader"),
        "items_read_per_worker_minute_2_workers": low,
        "items_read_per_worker_minute_8_workers": high,
        "reads": {"streams_per_worker": per, "window_s": window, "rate": 1e-6,
                  "counted": "items returned to every worker read (Query/Scan ScannedCount, "
                             "GetItem found): streams table, its indexes and the fleet table; "
                             "the sink issues no reads",
                  "runs": runs},
    }}


def _role_growth(runs: dict[str, Any], role: str) -> float | None:
    """Items read per worker-minute of one role (``leader`` or ``members``), at 8
    workers over at 2."""
    low, high = (((runs[str(w)].get("roles") or {}).get(role) or {})
                 .get("items_per_worker_minute") for w in READ_GROWTH_WORKERS)
    return _growth(low, high)


def _growth(low: float | None, high: float | None) -> float | None:
    return round(high / low, 3) if low and high is not None else None


async def _reads_per_worker(ctx: Context, workers: int, per: int,
                            window: float) -> dict[str, Any]:
    n = workers * per
    out: dict[str, Any] = {"workers": workers, "streams": n}
    async with ctx.fleet(f"scale_reads_{workers}", streams=n, rate=1e-6, worker_env={},
                         sample_s=1.0) as fleet:
        out["all_held_s"] = rounded(await fleet.start_and_hold(workers, timeout=180.0))
        share = math.ceil(n / workers)

        def even_and_quiet() -> bool:
            counts = fleet.counts()
            return fleet.all_held() and len(counts) == workers and \
                all(abs(c - share) <= 1 for c in counts.values()) and \
                fleet.moves(fleet.now() - 10.0) == 0
        out["settled_s"] = rounded(await fleet.wait_until(even_and_quiet, 180.0))
        before = fleet.snapshot()
        start = fleet.now()
        await asyncio.sleep(window)
        after = fleet.snapshot()
        end = fleet.now()
        names = [name for name in before if name in after]
        out.update(window_measured_s=round(end - start, 1), workers_measured=len(names),
                   moves_in_window=fleet.moves(start, end), held_at_end=fleet.counts())
        out.update(read_rates(before, after, names, end - start))
        out.update(read_rates_by_role(before, after, names, end - start))
        await fleet.finish(out, only_delivered=True)
    return out


LEADING = "streamlease_is_leader"


def read_rates_by_role(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
                       names: list[str], elapsed_s: float) -> dict[str, Any]:
    """``read_rates`` for the worker that led the fleet through the window (it alone
    reads every member row) and for the other members, apart: the average over all
    workers grows with the fleet even when each role's reads do not, because the leader
    reads differently from a member and weighs 1/2 of a 2-worker fleet, 1/8 of an
    8-worker one."""
    leaders = [n for n in names if before[n].get(LEADING) == 1 and after[n].get(LEADING) == 1]
    if len(leaders) != 1:
        return {"roles": None, "roles_not_split": f"{len(leaders)} workers led the whole window"}
    members = [n for n in names if n not in leaders]
    return {"roles": {
        "leader": {"worker": leaders[0], **read_rates(before, after, leaders, elapsed_s)},
        "members": {"workers": len(members), **read_rates(before, after, members, elapsed_s)},
    }}


def read_rates(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
               names: list[str], elapsed_s: float) -> dict[str, Any]:
    """Items read and read requests per worker-minute between two scrapes of ``names``,
    by operation, and in total."""
    if not names or elapsed_s <= 0:
        return {"items_per_worker_minute": None}
    worker_minutes = len(names) * elapsed_s / 60
    items = by_operation(before, after, names, ITEMS_READ)
    if not any(key.startswith(ITEMS_READ) for name in names for key in after[name]):
        return {"items_per_worker_minute": None,
                "items_not_counted": f"the workers expose no {ITEMS_READ}"}
    requests = {op: v for op, v in by_operation(before, after, names).items()
                if op in ("query", "scan", "get_item", "batch_get_item")}
    return {
        "items_per_worker_minute": round(sum(items.values()) / worker_minutes, 2),
        "items_per_worker_minute_by_operation": {op: round(v / worker_minutes, 2)
                                                 for op, v in sorted(items.items()) if v},
        "read_requests_per_worker_minute": round(sum(requests.values()) / worker_minutes, 2),
        "read_requests_per_worker_minute_by_operation": {
            op: round(v / worker_minutes, 2) for op, v in sorted(requests.items()) if v},
    }
