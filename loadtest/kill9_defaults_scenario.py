"""The ``kill9_defaults`` scenario: kill -9 of a worker holding 100 streams at the default
settings (failover times as ``loadtest.fleet`` measures them)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from loadtest.fleet import Context, Fault, histogram_quantile, pct, rounded


async def run_kill9_defaults(ctx: Context) -> dict[str, Any]:
    """3 workers x 100 streams at a low message rate, no STREAMLEASE_* setting; each kill's
    victim is replaced at once by a new worker (the survivors are full at 100), as a
    container scheduler would. Timed until each stream delivers again under another holder
    (the default batch window included), and until the upstream sees it connected again."""
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
        section["all_held_s"] = rounded(await fleet.start_and_hold(workers, timeout=240.0))

        def full() -> bool:
            counts = fleet.counts()
            return fleet.all_held() and len(counts) == workers and \
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
                          "all_back_s": rounded(took), "p50": pct(times, 50),
                          "p99": pct(times, 99)})
        section["kills_detail"] = kills
        section["kill9"] = fleet.failover("kill9")
        section["kill9_connected"] = fleet.failover("kill9_connected")
        section["takeover_delay_p99_s_bucket"] = histogram_quantile(
            fleet, "streamlease_takeover_delay_seconds", 0.99)
        await fleet.finish(section)
        section["timeline"] = fleet.timeline_out(every=4)
    connected = section["kill9_connected"]
    return {"failover": {"kill9_defaults": {
                **section["kill9"], "recovery": "delivered",
                "connected_p50": connected["p50"], "connected_p99": connected["p99"]}},
            "kill9_defaults": section}


def _all_recovered(fault: Fault) -> Callable[[], bool]:
    return lambda: len(fault.recovered) >= len(fault.streams)
