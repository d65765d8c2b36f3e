"""The ``skew`` scenario: one worker's wall clock behind the others (moves as
``loadtest.fleet`` counts them)."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from loadtest.common import timing_env
from loadtest.fleet import Context, Fleet, faketime_library, rounded

SETTLED_WINDOW_S = 20.0  # "settled": no move in this last part of an observation


async def run_skew(ctx: Context) -> dict[str, Any]:
    """One worker's wall clock behind the others (libfaketime, ``FAKETIME=-2s``), small
    profile timings, a 2 s member lease. Settled: no move in the last 20 s.

    The worker is preloaded with libfaketime (the ``faketime`` wrapper forks: a SIGTERM
    would orphan the worker) with ``FAKETIME_ENV``, as measured with libfaketime 0.9.10,
    Python 3.11 and glibc 2.36: by default the monotonic clock is faked too and every
    timed lock wait hangs (glibc's sem_clockwait waits for the faked deadline on the real
    clock); ``FAKETIME_DONT_FAKE_MONOTONIC=1`` alone makes the GIL's timed waits return at
    once (a worker stalled for seconds and self-fenced even at +0s), which
    ``FAKETIME_FORCE_MONOTONIC_FIX=0`` turns off. A blocking ``time.sleep`` still fails
    with EINVAL; the worker never calls it. So only the wall clock is off (measured
    -2.000 s), which is what clock skew between machines is.
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
                         worker_env=timing_env(ctx.profile)) as fleet:
        # The skewed worker first, capped at its share (STREAMLEASE_MAX_STREAMS), then the
        # others: the question is whether they take over streams a live member holds.
        share = math.ceil(p["streams"] / p["workers"])
        offset = None if args.skew_offset == "off" else args.skew_offset  # "off": a control
        skewed = fleet.start_worker(skew=offset, extra={"STREAMLEASE_MAX_STREAMS": str(share)})
        section["skewed_worker"] = skewed.name
        section["skewed_worker_max_streams"] = share
        await fleet.wait_until(lambda: fleet.counts().get(skewed.name, 0) >= share, 30.0)
        section["skewed_worker_held_at_start"] = fleet.counts().get(skewed.name, 0)
        all_held = await fleet.start_and_hold(p["workers"] - 1)
        section["all_held_s"] = rounded(all_held)
        # Workers that start together balance first (deliberate hand-overs); the question
        # is what happens after, so the observation starts once the fleet is even and quiet.
        begun = fleet.now()

        def even_and_quiet() -> bool:
            counts = fleet.counts()
            recent = fleet.moves(fleet.now() - 3.0)
            return fleet.all_held() and recent == 0 and \
                max(counts.values(), default=0) - min(counts.values(), default=0) <= 2
        settle = await fleet.wait_until(even_and_quiet, 60.0)
        section["balanced_before_observing_s"] = rounded(settle)
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
        await fleet.finish(section)
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
