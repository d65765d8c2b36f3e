"""The fleet scenarios beyond the chaos run: skew, a slow store, balance and scale.

Each returns the JSON section it measured and never raises for what the fleet does:
workers that exit, streams never held, a fleet that never converges are reported
(``null`` and the state reached), not turned into a crash. Definitions used throughout
(see ``loadtest.fleet``):

* a **move** is a new tenure of a stream after its first: a new fence seen held, by
  whichever worker. ``fence_bumps`` is the same count from the table's fences alone.
* **hand-off / failover time**: from the signal until the stream delivers again under
  another holder (its checkpoint passes the one at the signal), or for idle streams
  until the upstream sees it connected again.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loadtest.capacity import (
    capacity_model,
    inputs_from_scale,
    model_text,
    per_worker_read_growth,
)
from loadtest.fleet import Acquisition, Fault, Fleet, WorkerProc, faketime_library, pct
from streamlease.config import DEFAULTS, WorkerConfig
from streamlease.core.stream import stream_buffer_bytes

if TYPE_CHECKING:
    from loadtest.chaos import Context

ALL_HELD_TIMEOUT_S = 60.0
SETTLED_WINDOW_S = 20.0  # "settled": no move in this last part of an observation
MOVES_AFTER_S = 30.0


def _timing_env(ctx: Context) -> dict[str, str]:
    from loadtest.chaos import timing_env

    return timing_env(ctx.profile)


def _all_held(fleet: Fleet) -> bool:
    return fleet.held_total() >= fleet.streams


def _sum(fleet: Fleet, prefix: str, workers: list[WorkerProc] | None = None) -> float:
    return sum(v for w in (workers or fleet.everyone()) for k, v in w.metrics.items()
               if k.startswith(prefix))


def _by_label(fleet: Fleet, metric: str, label: str) -> dict[str, int]:
    """A labelled counter summed over every worker, non-zero values only."""
    out: dict[str, int] = {}
    prefix = f"{metric}{{{label}=\""
    for w in fleet.everyone():
        for k, v in w.metrics.items():
            if k.startswith(prefix) and v:
                value = k[len(prefix):].split('"', 1)[0]
                out[value] = out.get(value, 0) + int(v)
    return dict(sorted(out.items()))


def _histogram_quantile(fleet: Fleet, name: str, q: float) -> float | None:
    """Upper bound of the bucket holding quantile ``q`` of a histogram summed over every
    worker (``inf``: beyond the largest bucket). Bucket resolution, not exact."""
    buckets: dict[float, float] = {}
    prefix = f'{name}_bucket{{le="'
    for w in fleet.everyone():
        for k, v in w.metrics.items():
            if k.startswith(prefix):
                le = k[len(prefix):].split('"', 1)[0]
                bound = math.inf if le == "+Inf" else float(le)
                buckets[bound] = buckets.get(bound, 0.0) + v
    if not buckets or not buckets.get(math.inf):
        return None
    total = buckets[math.inf]
    for bound in sorted(buckets):
        if buckets[bound] >= q * total:
            return bound
    return math.inf


def _churn_figures(fleet: Fleet) -> dict[str, Any]:
    """What the workers themselves say about lost leases and fenced members."""
    return {
        "leases_lost": _by_label(fleet, "streamlease_lease_lost_total", "reason"),
        "leases_released_while_running": _by_label(fleet, "streamlease_lease_released_total",
                                                   "reason"),
        "members_declared_dead": int(_sum(fleet, "streamlease_members_declared_dead_total")),
        "member_fenced": int(_sum(fleet, "streamlease_member_fenced_total")),
        "member_heartbeats": _by_label(fleet, "streamlease_member_heartbeats_total", "outcome"),
        "member_heartbeat_p99_s_bucket": _json_float(
            _histogram_quantile(fleet, "streamlease_member_heartbeat_seconds", 0.99)),
        "log_events": fleet.log_events(),
        "worker_exits": fleet.exits,
    }


def _json_float(value: float | None) -> float | str | None:
    return "inf" if value == math.inf else value


async def _start_and_hold(fleet: Fleet, workers: int, timeout: float = ALL_HELD_TIMEOUT_S,
                          **kwargs: Any) -> float | None:
    for _ in range(workers):
        fleet.start_worker(**kwargs)
    return await fleet.wait_until(lambda: _all_held(fleet), timeout)


async def _finish(fleet: Fleet, section: dict[str, Any], only_delivered: bool = False) -> None:
    """Scrape, note what no live worker holds, stop every worker (SIGTERM), audit the
    sink into ``section``."""
    await fleet.read_table()
    fleet.scrape_all()
    section["untracked_leases"] = fleet.untracked()
    unheld = fleet.unheld()
    section["unheld_at_end_count"] = len(unheld)
    section["unheld_at_end"] = unheld[:20]
    section["faults"] = fleet.fault_list()
    section.update(_churn_figures(fleet))
    await fleet.stop_all()
    section.update(await fleet.audit(only_delivered=only_delivered))


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


# -- skew ---------------------------------------------------------------------------------


async def run_skew(ctx: Context) -> dict[str, Any]:
    """One worker's wall clock behind the others (libfaketime, ``FAKETIME=-2s``), small
    profile timings, a 2 s member lease. Settled: no move in the last 20 s.

    libfaketime 0.9.10 and Python 3.11 on glibc 2.36, as measured here (the worker is
    preloaded with libfaketime directly: the ``faketime`` wrapper forks, so a SIGTERM
    would stop the wrapper and orphan the worker):

    * By default libfaketime fakes CLOCK_MONOTONIC too, moving it to the faked wall
      clock (a constant offset: intervals stay right), but every timed lock wait
      (``threading.Event.wait(t)``, ``queue.get(timeout=t)``) then hangs: glibc's
      sem_clockwait is not intercepted and waits for the faked deadline on the real clock.
    * ``FAKETIME_DONT_FAKE_MONOTONIC=1`` leaves the monotonic clock alone, but its
      "monotonic fix" for pthread_cond_timedwait then makes the GIL's timed waits return
      at once: two busy threads ran 4.5x slower with 150x the context switches, and a
      worker (event loop plus its /metrics thread) stalled for seconds, self-fenced and
      was declared dead even with a +0s offset. ``FAKETIME_FORCE_MONOTONIC_FIX=0`` turns
      that off: the GIL, timed waits and the event loop's timers behave as without
      libfaketime.
    * What remains broken is a blocking ``time.sleep``, which fails with EINVAL
      (libfaketime rewrites its absolute monotonic deadline); the worker never calls it.

    So the skewed worker runs with both variables set: its wall clock alone is off
    (measured -2.000 s), which is what clock skew between machines is.
    """
    p = ctx.profile
    args = ctx.args
    if faketime_library() is None and args.skew_offset != "off":
        return {"skew": {"skipped": "libfaketime is not installed (Debian package faketime; "
                                    "`make loadtest` installs it)"},
                "error": "libfaketime is not installed"}
    section: dict[str, Any] = {"offset": args.skew_offset, "workers": p["workers"],
                               "streams": p["streams"], "lease_s": p["lease"],
                               "observed_s": args.skew_seconds}
    async with ctx.fleet("skew", streams=p["streams"], rate=p["rate"],
                         worker_env=_timing_env(ctx)) as fleet:
        # The skewed worker first, capped at its share (STREAMLEASE_MAX_STREAMS), then the
        # others: the question is whether they take over streams a live member holds.
        share = math.ceil(p["streams"] / p["workers"])
        offset = None if args.skew_offset == "off" else args.skew_offset  # "off": a control
        skewed = fleet.start_worker(skew=offset, extra={"STREAMLEASE_MAX_STREAMS": str(share)})
        section["skewed_worker"] = skewed.name
        section["skewed_worker_max_streams"] = share
        await fleet.wait_until(lambda: fleet.counts().get(skewed.name, 0) >= share, 30.0)
        section["skewed_worker_held_at_start"] = fleet.counts().get(skewed.name, 0)
        all_held = await _start_and_hold(fleet, p["workers"] - 1)
        section["all_held_s"] = _round(all_held)
        # Workers that start together balance first (deliberate hand-overs); the question
        # is what happens after, so the observation starts once the fleet is even and quiet.
        begun = fleet.now()

        def even_and_quiet() -> bool:
            counts = fleet.counts()
            recent = fleet.moves(fleet.now() - 3.0)
            return _all_held(fleet) and recent == 0 and \
                max(counts.values(), default=0) - min(counts.values(), default=0) <= 2
        settle = await fleet.wait_until(even_and_quiet, 60.0)
        section["balanced_before_observing_s"] = _round(settle)
        section["moves_while_balancing"] = fleet.moves(begun)
        section["held_at_start"] = fleet.counts()
        start = fleet.now()
        await fleet.read_table()
        checkpoints = fleet.checkpoints()
        offsets = []
        while fleet.now() - start < args.skew_seconds:
            await asyncio.sleep(min(5.0, args.skew_seconds - (fleet.now() - start)))
            offsets.append(await _member_clock_offset(fleet, skewed.name))
        end = fleet.now()
        await fleet.read_table()
        section["stalled_streams"] = fleet.stalled(checkpoints)
        known = [o for o in offsets if o is not None]
        # Its member row carries its own wall clock at its last heartbeat (at most one
        # heartbeat old): the largest reading is the closest to its true offset.
        section["measured_offset_s"] = round(max(known), 2) if known else None
        section["moves"] = fleet.moves(start, end)
        section["moves_in_last_20_s"] = fleet.moves(end - SETTLED_WINDOW_S, end)
        section["settled"] = section["moves_in_last_20_s"] == 0 and all_held is not None
        section.update(move_details=fleet.move_summary(), fence_bumps=fleet.fence_bumps())
        section["skewed_worker_held_at_end"] = fleet.counts().get(skewed.name)
        section["held_at_end"] = fleet.counts()
        await _finish(fleet, section)
        section["timeline"] = fleet.timeline_out(every=4)
    return {"skew": section}


async def _member_clock_offset(fleet: Fleet, worker: str) -> float | None:
    """The member row's ``heartbeat_at_ms`` (the worker's own clock) minus ours, in s."""
    if fleet.stores is None:
        return None
    try:
        members = await fleet.stores.fleet.members(timeout=5)
    except Exception:
        return None
    now_ms = time.time_ns() // 1_000_000
    for m in members:
        if m.worker_id == worker and m.heartbeat_at_ms:
            return (m.heartbeat_at_ms - now_ms) / 1000
    return None


# -- slow store ---------------------------------------------------------------------------


async def run_slow_store(ctx: Context) -> dict[str, Any]:
    """4 workers, 40 streams, every request to the embedded server held 20 ms, small
    profile timings, observed for 60 s; then every worker is restarted (a new one, then
    SIGTERM of an old one) and each hand-off timed."""
    p = ctx.profile
    args = ctx.args
    if args.dynamodb != "embedded":
        return {"slow_store": {"skipped": "needs the embedded server (--dynamodb embedded)"}}
    section: dict[str, Any] = {"latency_ms": args.slow_store_ms,
                               "latency_mode": args.slow_store_mode, "workers": 4,
                               "streams": 40, "observed_s": args.slow_store_seconds,
                               "rate": args.slow_store_rate if args.slow_store_rate is not None
                               else p["rate"]}
    async with ctx.fleet("slow_store", streams=40, rate=section["rate"],
                         worker_env=_timing_env(ctx),
                         latency_ms=args.slow_store_ms,
                         latency_mode=args.slow_store_mode) as fleet:
        all_held = await _start_and_hold(fleet, 4)
        section["all_held_s"] = _round(all_held)
        start = fleet.now()
        await fleet.read_table()
        checkpoints = fleet.checkpoints()
        await asyncio.sleep(args.slow_store_seconds)
        end = fleet.now()
        await fleet.read_table()
        # Held in the table is not served: an acquisition can apply while its worker
        # saw it time out. A stream whose checkpoint never moved was not delivering.
        section["stalled_streams"] = fleet.stalled(checkpoints)
        fleet.scrape_all()
        section["untracked_leases_in_window"] = fleet.untracked()
        section["moves"] = fleet.moves(0, end)
        section["moves_in_window"] = fleet.moves(start, end)
        section.update(move_details=fleet.move_summary(0, end), fence_bumps=fleet.fence_bumps())
        section["held_at_end_of_window"] = fleet.counts()
        fleet.scrape_all()
        section["dynamodb_request_p99_s_bucket"] = _json_float(
            _histogram_quantile(fleet, "streamlease_dynamodb_request_seconds", 0.99))
        await _rolling_restart(fleet, p)
        section["sigterm"] = fleet.failover("sigterm")
        await _finish(fleet, section)
        section["timeline"] = fleet.timeline_out(every=4)
    return {"slow_store": section, "failover": {"sigterm_slow_store": section["sigterm"]}}


async def _rolling_restart(fleet: Fleet, p: dict[str, Any]) -> None:
    """Every worker alive now, one at a time: start a new one, then SIGTERM the old."""
    for name in sorted(fleet.workers):
        fleet.start_worker()
        await asyncio.sleep(p["reconcile"] * 2)
        if name in fleet.workers:
            await fleet.sigterm(name, wait_s=30)
        await asyncio.sleep(p["gap"] / 2)


# -- balance ------------------------------------------------------------------------------


async def run_balance(ctx: Context) -> dict[str, Any]:
    """40 streams on 2 workers; 2 more join (a scale-out): how long until every worker
    holds its share (ceil(40/4) = 10) +/-1, the moves that took and in the 30 s after;
    then a rolling restart of every worker and the largest count one holds at its end."""
    p = ctx.profile
    args = ctx.args
    streams, share = 40, math.ceil(40 / 4)
    section: dict[str, Any] = {"streams": streams, "workers_before": 2, "workers_after": 4,
                               "share": share, "timeout_s": args.balance_timeout}
    # Placement, not throughput: at 1 msg/s a stream flushes about once a second, half
    # the sink load of the profile's rate (40 streams at 20 msg/s saturated the embedded
    # server on a shared 2-core machine: renewals timed out, members self-fenced).
    rate = args.balance_rate if args.balance_rate is not None else p["rate"]
    section["rate"] = rate
    async with ctx.fleet("balance", streams=streams, rate=rate,
                         worker_env=_timing_env(ctx)) as fleet:
        section["all_held_s"] = _round(await _start_and_hold(fleet, 2))
        await asyncio.sleep(2.0)
        section["before_scale_out"] = fleet.counts()
        scale_at = fleet.now()
        fleet.events_log.append((scale_at, "scale-out 2 -> 4"))
        fleet.start_worker()
        fleet.start_worker()

        def balanced() -> bool:
            counts = fleet.counts()
            return len(counts) == 4 and _all_held(fleet) and \
                all(share - 1 <= c <= share + 1 for c in counts.values())

        # Converged: inside the band with every stream held, and the last move of the
        # convergence (hand-overs already in flight included) followed by a quiet
        # MOVES_AFTER_S. A fleet that keeps moving never converges.
        in_band = await fleet.wait_until(balanced, args.balance_timeout)
        section["first_in_band_s"] = _round(in_band)
        await fleet.read_table()
        checkpoints = fleet.checkpoints()
        converge: float | None = None
        deadline = scale_at + args.balance_timeout + MOVES_AFTER_S
        while in_band is not None and fleet.now() < deadline:
            moved = [a.at for a in fleet.acquisitions if a.previous is not None
                     and a.at >= scale_at]
            last = max(moved, default=scale_at)
            if fleet.now() - last >= MOVES_AFTER_S and balanced():
                converge = last - scale_at
                break
            await asyncio.sleep(0.5)
        until = scale_at + (converge if converge is not None else args.balance_timeout)
        section["converge_s"] = _round(converge)
        section["converged"] = converge is not None
        section["moves_after_first_in_band"] = None if in_band is None else \
            fleet.moves(scale_at + in_band, until + 0.001)
        section["moves"] = fleet.moves(scale_at, until + 0.001)
        section["state_reached"] = fleet.counts()
        section["best_spread"] = _best_spread(fleet, scale_at, until, 4)
        if converge is None:
            await asyncio.sleep(MOVES_AFTER_S)
        await fleet.read_table()
        section["stalled_streams_after"] = fleet.stalled(checkpoints)
        section["moves_after"] = fleet.moves(until + 0.001, until + MOVES_AFTER_S)
        section["moves_after_from"] = "converged" if converge is not None else "timeout"
        section["after_30_s"] = fleet.counts()

        restart_at = fleet.now()
        fleet.events_log.append((restart_at, "rolling restart"))
        await _rolling_restart(fleet, p)
        await fleet.wait_until(lambda: _all_held(fleet), 10.0)
        await asyncio.sleep(2.0)
        counts = fleet.counts()
        section["after_rolling_restart"] = counts
        section["after_rolling_restart_max"] = max(counts.values(), default=None)
        section["after_rolling_restart_target"] = math.ceil(streams / max(1, len(counts))) + 1
        section["sigterm"] = fleet.failover("sigterm")
        section["moves_total"] = fleet.moves()
        section["fence_bumps"] = fleet.fence_bumps()
        await _finish(fleet, section)
        section["timeline"] = fleet.timeline_out(every=2)
        section["live_workers"] = [(round(t, 2), n) for t, n in fleet.live[::2]]
        section["events"] = [(round(t, 2), label) for t, label in fleet.events_log]
    return {"balance": section}


def _best_spread(fleet: Fleet, since: float, until: float, workers: int) -> int | None:
    """The smallest max - min over the samples in [since, until] with ``workers`` holders
    counted (a live worker holding none counts as 0)."""
    best = None
    for t, owned in fleet.timeline:
        if since <= t <= until:
            values = list(owned.values()) + [0] * max(0, workers - len(owned))
            spread = max(values) - min(values) if values else 0
            best = spread if best is None else min(best, spread)
    return best


# -- scale --------------------------------------------------------------------------------


async def run_scale(ctx: Context) -> dict[str, Any]:
    """2,000 idle streams on 4 workers at the default timings, on the embedded server.

    Only STREAMLEASE_MAX_STREAMS (every stream fits on the survivors of a kill) and
    STREAMLEASE_ACQUIRE_PER_CYCLE (so the first acquisition does not take minutes) are
    raised; no STREAMLEASE_*_SECONDS is set. The table is read every 15 s (a Scan of 2,000
    items occupies the serialised embedded server for about a second); who holds how many
    comes from each worker's leases_held gauge every second, and the upstream's /stats
    says which streams are connected. Failover of idle streams is timed until each is
    connected again: nothing is delivered to observe, and the killed worker's sockets
    closed with it, so a connection is a new holder's.
    """
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
        section["all_held_s"] = _round(held)
        all_connected = await fleet.wait_until(lambda: connected() >= n, 60.0)
        section["all_connected_s"] = _round(None if all_connected is None
                                            else fleet.now() - started)
        section["held_when_measured"] = fleet.held_total()
        section["connected_when_measured"] = connected()
        # A quiet window: the fleet even (each worker within share + 1) and no worker's
        # count changed for 10 s, as the gauges show (the table is read too rarely to
        # time moves by); start-up's balancing is not steady state.
        section["settled_s"] = _round(await fleet.wait_until(
            lambda: _even_and_still(fleet, workers, 10.0), 180.0))

        steady = await _steady_window(fleet, args.scale_window)
        section.update(steady)
        section.update(index_moves(steady["lease_writes_in_window"],
                                   steady["stream_minutes_in_window"],
                                   steady["window_measured_s"], _renew_interval_s()))

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
                                "all_back_s": _round(took),
                                "recovered_still_owned_by_victim": wrong}
            # The flat key the targets table reads (the section above keeps it too).
            section["kill9_p99"] = section["kill9"]["p99"]
        section["held_at_end"] = fleet.counts()
        section["upstream_rss_mb"] = _rss_mb(fleet.servers[-1].popen.pid)
        await _finish(fleet, section, only_delivered=True)
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
    if not _all_held(fleet) or len(counts) != workers or \
            any(abs(c - share) > 1 for c in counts.values()):
        return False
    recent = [owned for t, owned in fleet.timeline if t >= fleet.now() - still_s]
    return bool(fleet.timeline) and fleet.timeline[0][0] <= fleet.now() - still_s and \
        all(owned == recent[-1] for owned in recent)


async def _steady_window(fleet: Fleet, window_s: float) -> dict[str, Any]:
    """Counters of every live worker before and after ``window_s``: the store's
    requests/s by operation per 1,000 held streams, and the lease-upkeep rates."""
    fleet.scrape_all()
    before = {w.name: dict(w.metrics) for w in fleet.workers.values()}
    t0 = time.monotonic()
    held_samples: list[int] = []
    while time.monotonic() - t0 < window_s:
        await asyncio.sleep(min(1.0, window_s - (time.monotonic() - t0)))
        held_samples.append(fleet.held_total())
    fleet.scrape_all()
    elapsed = time.monotonic() - t0
    after = {w.name: dict(w.metrics) for w in fleet.workers.values()}
    names = [name for name in before if name in after]
    held = sum(held_samples) / len(held_samples) if held_samples else 0.0

    def delta(prefix: str) -> float:
        return sum(v - before[name].get(k, 0.0) for name in names
                   for k, v in after[name].items() if k.startswith(prefix))

    ops: dict[str, float] = {}
    for name in names:
        for k in after[name]:
            if k.startswith('streamlease_dynamodb_requests_total{operation="'):
                ops.setdefault(k.split('"', 2)[1], 0.0)
    per_op = {op: delta(f'streamlease_dynamodb_requests_total{{operation="{op}",')
              for op in sorted(ops)}
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
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
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


def _renew_interval_s() -> float:
    """The workers' stream renewal interval: the scale run leaves it at its default."""
    return WorkerConfig.from_env({}).stream_renew_s


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
    """Control-plane items read per worker-minute with 2 workers and with 8, each holding
    the same number of idle streams, at the default timings (nothing raised), each fleet on
    fresh tables, over a quiet window once it is even and has not moved for 10 s. The
    workers count the items their reads returned (``streamlease_dynamodb_items_read_total``;
    the sink only writes, so every read is the control plane's: the streams table and its
    indexes, the fleet table). ``per_worker_read_growth`` is the 8-worker figure over the
    2-worker one: 1.0 when a worker's reads do not grow with the fleet."""
    args = ctx.args
    per, window = args.scale_reads_streams, args.scale_reads_window
    runs: dict[str, Any] = {}
    for workers in READ_GROWTH_WORKERS:
        print(f"scale_reads: {workers} workers x {per} idle streams, {window:.0f} s window",
              flush=True)
        runs[str(workers)] = await _reads_per_worker(ctx, workers, per, window)
    low, high = (runs[str(w)].get("items_per_worker_minute") for w in READ_GROWTH_WORKERS)
    growth = round(high / low, 3) if low and high is not None else None
    return {"scale": {
        "per_worker_read_growth": growth,
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
    found = []
    for workers in READ_GROWTH_WORKERS:
        roles = runs[str(workers)].get("roles") or {}
        found.append((roles.get(role) or {}).get("items_per_worker_minute"))
    low, high = found
    return round(high / low, 3) if low and high is not None else None


async def _reads_per_worker(ctx: Context, workers: int, per: int,
                            window: float) -> dict[str, Any]:
    n = workers * per
    out: dict[str, Any] = {"workers": workers, "streams": n}
    async with ctx.fleet(f"scale_reads_{workers}", streams=n, rate=1e-6, worker_env={},
                         sample_s=1.0) as fleet:
        out["all_held_s"] = _round(await _start_and_hold(fleet, workers, timeout=180.0))
        share = math.ceil(n / workers)

        def even_and_quiet() -> bool:
            counts = fleet.counts()
            return _all_held(fleet) and len(counts) == workers and \
                all(abs(c - share) <= 1 for c in counts.values()) and \
                fleet.moves(fleet.now() - 10.0) == 0
        out["settled_s"] = _round(await fleet.wait_until(even_and_quiet, 180.0))
        fleet.scrape_all()
        before = {w.name: dict(w.metrics) for w in fleet.workers.values()}
        start = fleet.now()
        await asyncio.sleep(window)
        fleet.scrape_all()
        end = fleet.now()
        after = {w.name: dict(w.metrics) for w in fleet.workers.values()}
        names = [name for name in before if name in after]
        out.update(window_measured_s=round(end - start, 1), workers_measured=len(names),
                   moves_in_window=fleet.moves(start, end), held_at_end=fleet.counts())
        out.update(read_rates(before, after, names, end - start))
        out.update(read_rates_by_role(before, after, names, end - start))
        await _finish(fleet, out, only_delivered=True)
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

    def by_op(metric: str) -> dict[str, float]:
        prefix = f'{metric}{{operation="'
        found: dict[str, float] = {}
        for name in names:
            for key, value in after[name].items():
                if key.startswith(prefix):
                    op = key[len(prefix):].split('"', 1)[0]
                    found[op] = found.get(op, 0.0) + value - before[name].get(key, 0.0)
        return found

    items = by_op(ITEMS_READ)
    if not any(key.startswith(ITEMS_READ) for name in names for key in after[name]):
        return {"items_per_worker_minute": None,
                "items_not_counted": f"the workers expose no {ITEMS_READ}"}
    requests = {op: v for op, v in by_op("streamlease_dynamodb_requests_total").items()
                if op in ("query", "scan", "get_item", "batch_get_item")}
    return {
        "items_per_worker_minute": round(sum(items.values()) / worker_minutes, 2),
        "items_per_worker_minute_by_operation": {op: round(v / worker_minutes, 2)
                                                 for op, v in sorted(items.items()) if v},
        "read_requests_per_worker_minute": round(sum(requests.values()) / worker_minutes, 2),
        "read_requests_per_worker_minute_by_operation": {
            op: round(v / worker_minutes, 2) for op, v in sorted(requests.items()) if v},
    }


# -- kill -9 at the default settings ----------------------------------------------------------


async def run_kill9_defaults(ctx: Context) -> dict[str, Any]:
    """kill -9 of a worker holding 100 streams at the default settings (no
    STREAMLEASE_*_SECONDS, STREAMLEASE_MAX_STREAMS 100): 3 workers x 100 streams at a low
    message rate; each kill's victim is replaced at once by a new worker (the survivors are
    full at 100), as a container scheduler would. Each stream is timed from the signal
    until it delivers again under another holder (its checkpoint passes the one read just
    before the kill: this includes the default batch window), and, beside it, until the
    upstream sees it connected again."""
    args = ctx.args
    workers, per = args.kill9_defaults_workers, args.kill9_defaults_streams
    n = workers * per
    section: dict[str, Any] = {"workers": workers, "streams": n, "rate": args.kill9_defaults_rate,
                               "kills": args.kill9_defaults_kills, "settings": "defaults",
                               "recovery": "delivered again under another holder",
                               "replacement": "a new worker started right after each kill"}
    async with ctx.fleet("kill9_defaults", streams=n, rate=args.kill9_defaults_rate,
                         worker_env={}, sample_s=0.5, table_s=1.0,
                         watch_upstream=True) as fleet:
        section["all_held_s"] = _round(await _start_and_hold(fleet, workers, timeout=240.0))

        def full() -> bool:
            counts = fleet.counts()
            return _all_held(fleet) and len(counts) == workers and \
                max(counts.values(), default=0) >= per
        kills: list[dict[str, Any]] = []
        for _ in range(args.kill9_defaults_kills):
            await fleet.wait_until(full, 120.0)
            await asyncio.sleep(5.0)
            await fleet.read_table()
            victim = max(fleet.workers, key=lambda w: len(fleet.held_by(w)[0]), default=None)
            if victim is None:
                break
            fault = fleet.kill9(victim)
            # The same streams, timed until the upstream sees them connected again.
            fleet.faults.append(Fault("kill9_connected", fault.at, victim, fault.streams,
                                      fault.before, "connected"))
            fleet.start_worker()
            took = await fleet.wait_until(_all_recovered(fault), 180.0)
            times = sorted(fault.recovered.values())
            kills.append({"victim": victim, "streams": len(fault.streams),
                          "all_back_s": _round(took), "p50": pct(times, 50),
                          "p99": pct(times, 99)})
        section["kills_detail"] = kills
        section["kill9"] = fleet.failover("kill9")
        section["kill9_connected"] = fleet.failover("kill9_connected")
        section["takeover_delay_p99_s_bucket"] = _json_float(
            _histogram_quantile(fleet, "streamlease_takeover_delay_seconds", 0.99))
        await _finish(fleet, section)
        section["timeline"] = fleet.timeline_out(every=4)
    connected = section["kill9_connected"]
    return {"failover": {"kill9_defaults": {
                **section["kill9"], "recovery": "delivered",
                "connected_p50": connected["p50"], "connected_p99": connected["p99"]}},
            "kill9_defaults": section}


def _all_recovered(fault: Fault) -> Callable[[], bool]:
    return lambda: len(fault.recovered) >= len(fault.streams)


# -- scale-out during start-up ----------------------------------------------------------------

STARTUP_QUIET_S = 20.0  # converged: in the band, with no move, for this long


async def run_balance_startup(ctx: Context) -> dict[str, Any]:
    """40 streams, 2 workers started, and 2 more as soon as the first stream is held (the
    first two are still taking the rest): how long from the 2 new workers' start until
    every worker holds its share (10) +/-1 and stays there, the moves until then (new
    tenures after each stream's first, from the table), and the longest any stream was
    leased to no running worker after the new workers started (table reads every
    ``sample_s``: that is the resolution; a stream not yet taken counts as unowned too).
    The balance scenario's timings (the profile's: a 2 s lease at the small profile)."""
    p = ctx.profile
    args = ctx.args
    streams, workers = 40, 4
    share = math.ceil(streams / workers)
    rate = args.balance_rate if args.balance_rate is not None else p["rate"]
    section: dict[str, Any] = {"streams": streams, "workers_before": 2,
                               "workers_after": workers, "share": share, "lease_s": p["lease"],
                               "rate": rate, "timeout_s": args.balance_timeout,
                               "quiet_s": STARTUP_QUIET_S,
                               "moves_are": "new tenures after each stream's first (table reads)"}
    async with ctx.fleet("balance_startup", streams=streams, rate=rate,
                         worker_env=_timing_env(ctx)) as fleet:
        fleet.start_worker()
        fleet.start_worker()
        section["first_held_s"] = _round(await fleet.wait_until(
            lambda: fleet.held_total() >= 1, 60.0))
        scale_at = fleet.now()
        section["held_at_scale_out"] = fleet.counts()
        fleet.events_log.append((scale_at, "scale-out 2 -> 4 during start-up"))
        fleet.start_worker()
        fleet.start_worker()
        first = await fleet.wait_until(
            lambda: in_band(fleet.counts(), workers, share, streams), args.balance_timeout)
        deadline = scale_at + args.balance_timeout + STARTUP_QUIET_S
        while first is not None and fleet.now() < deadline:
            since = converged_at(fleet.timeline, scale_at, workers, share, streams)
            moved = [a.at for a in fleet.acquisitions if a.previous is not None]
            if since is not None and \
                    fleet.now() - max([since, *moved]) >= STARTUP_QUIET_S:
                break
            await asyncio.sleep(0.5)
        end = fleet.now()
        section.update(startup_balance(fleet.timeline, fleet.owned_history, fleet.ids,
                                       fleet.acquisitions, scale_at, end, workers, share,
                                       streams))
        section["fence_bumps"] = fleet.fence_bumps()
        section["state_reached"] = fleet.counts()
        await _finish(fleet, section)
        section["timeline"] = fleet.timeline_out()
        section["events"] = [(round(t, 2), label) for t, label in fleet.events_log]
    return {"balance": {"during_startup": section}}


def in_band(counts: dict[str, int], workers: int, share: int, streams: int) -> bool:
    """Every one of ``workers`` holds ``share`` +/-1 and every stream is held."""
    return len(counts) == workers and sum(counts.values()) >= streams and \
        all(share - 1 <= c <= share + 1 for c in counts.values())


def converged_at(timeline: list[tuple[float, dict[str, int]]], since: float, workers: int,
                 share: int, streams: int) -> float | None:
    """The first sample at or after ``since`` from which every later sample is in the band;
    None if the last one is not."""
    found: float | None = None
    for t, counts in timeline:
        if t < since:
            continue
        if in_band(counts, workers, share, streams):
            found = t if found is None else found
        else:
            found = None
    return found


@dataclass(frozen=True)
class Span:
    stream: str
    start: float
    end: float
    kind: str  # "first_owner": not owned before; "handover": owned, then not
    open: bool  # still unowned at the last read

    @property
    def seconds(self) -> float:
        return self.end - self.start


def unowned_spans(history: list[tuple[float, frozenset[str]]], ids: list[str], since: float,
                  until: float) -> list[Span]:
    """Each spell in [since, until] a stream was leased to no running worker, from table
    reads ``(t, streams owned)``: from the first read that saw it unowned (or ``since``)
    to the first that saw it owned again (or the last read, ``open``). Resolution: the
    read interval (a spell seen by one read lasts one interval)."""
    spans: list[Span] = []
    ever: set[str] = set()
    began: dict[str, tuple[float, str]] = {}
    last = since
    for t, owned in history:
        if t > until:
            break
        last = t
        for sid in ids:
            if sid in owned:
                spell = began.pop(sid, None)
                if spell is not None and t > since:
                    spans.append(Span(sid, max(spell[0], since), t, spell[1], False))
                ever.add(sid)
            elif sid not in began:
                began[sid] = (t, "handover" if sid in ever else "first_owner")
    spans += [Span(sid, max(start, since), last, kind, True)
              for sid, (start, kind) in began.items() if last > since]
    return sorted(spans, key=lambda s: (-s.seconds, s.stream))


def startup_balance(timeline: list[tuple[float, dict[str, int]]],
                    history: list[tuple[float, frozenset[str]]], ids: list[str],
                    acquisitions: list[Acquisition], scale_at: float, end: float,
                    workers: int, share: int, streams: int,
                    over_s: float = 2.0) -> dict[str, Any]:
    """The during-start-up figures from what the sampler saw: converge_s (from
    ``scale_at`` until the band holds for good; None if it did not by ``end``), moves
    until then (new tenures after each stream's first) and after, and unowned spells."""
    conv = converged_at(timeline, scale_at, workers, share, streams)
    until = conv if conv is not None else end

    def moves(lo: float, hi: float) -> int:
        return sum(1 for a in acquisitions if a.previous is not None and lo <= a.at < hi)
    spans = unowned_spans(history, ids, scale_at, end)
    worst = spans[0] if spans else None
    by_kind: dict[str, float] = {}
    for span in spans:
        by_kind[span.kind] = round(max(by_kind.get(span.kind, 0.0), span.seconds), 2)
    reads = [t for t, _ in history if scale_at <= t <= end]
    first = next((t for t, counts in timeline
                  if t >= scale_at and in_band(counts, workers, share, streams)), None)
    return {
        "first_in_band_s": None if first is None else round(first - scale_at, 2),
        "converge_s": None if conv is None else round(conv - scale_at, 2),
        "converged": conv is not None,
        "moves": moves(scale_at, until + 1e-6),
        "moves_after_converged": moves(until + 1e-6, end + 1e-6) if conv is not None else None,
        "moves_before_scale_out": moves(0.0, scale_at),
        "unowned_max_s": round(worst.seconds, 2) if worst else 0.0,
        "unowned_worst": None if worst is None else {
            "stream": worst.stream, "from": round(worst.start, 2), "to": round(worst.end, 2),
            "kind": worst.kind, "open": worst.open},
        "unowned_max_s_by_kind": by_kind,
        f"unowned_over_{over_s:g}_s": sum(1 for s in spans if s.seconds > over_s),
        "read_interval_s": round((reads[-1] - reads[0]) / (len(reads) - 1), 3)
        if len(reads) > 1 else None,
    }
