"""The ``slow_store`` scenario: 4 workers, 40 streams, every request to the embedded server
held 20 ms, small profile timings, observed for 60 s; then every worker is restarted (a
new one, then SIGTERM of an old one). Moves and hand-off times as ``loadtest.fleet``
measures them."""

from __future__ import annotations

import asyncio
from typing import Any

from loadtest.common import dynamodb_args, timing_env
from loadtest.fleet import Context, histogram_quantile, rolling_restart, rounded


async def run_slow_store(ctx: Context) -> dict[str, Any]:
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
                         worker_env=timing_env(ctx.profile),
                         store_args=dynamodb_args(latency_ms=args.slow_store_ms,
                                                  latency_mode=args.slow_store_mode)) as fleet:
        all_held = await fleet.start_and_hold(4)
        section["all_held_s"] = rounded(all_held)
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
        section["dynamodb_request_p99_s_bucket"] = histogram_quantile(
            fleet, "streamlease_dynamodb_request_seconds", 0.99)
        await rolling_restart(fleet, p)
        await fleet.finish(section)
        section["sigterm"] = fleet.failover("sigterm")  # its hand-offs timed by the audit
        section["timeline"] = fleet.timeline_out(every=4)
    return {"slow_store": section, "failover": {"sigterm_slow_store": section["sigterm"]}}
