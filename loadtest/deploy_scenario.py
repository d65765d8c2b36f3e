"""The ``deploy`` scenario: a rolling deploy as ECS runs one with ``minimumHealthyPercent=100``,
measured from the sink.

Every worker of the fleet is replaced, one at a time: a new worker starts, and once its
``/readyz`` answers (it has started and registered its member row) the old one gets SIGTERM
and is waited for; the next replacement starts once every stream is held again. Messages
flow the whole time, and the events table is read back at the end:

* **delivery time** of a message: the ``at_ms`` of the events item that holds it (the
  writer's wall clock when it sent the write; one host, one clock);
* **send time**: the reference upstream produces message ``n`` of every stream at
  ``epoch + n / rate`` (``streamlease.dev.upstream``), its frames carry no time of their own;
  ``epoch`` is estimated from ``/stats`` readings of the head (``Fleet.upstream_epoch``, a
  few ms wide). Its error is the same for every message, so it cancels out of the spike;
* per stream, the **longest gap** between consecutive deliveries during the deploy (from the
  first replacement's start to a few seconds after the last exit), beside the same figure
  over the steady window before it (the batch window's own share of a gap);
* per stream, the **latency spike**: the largest end-to-end latency of a message sent during
  the deploy minus the stream's median latency over the steady window;
* lost, duplicated, out of order (in write order) and stale fences, from the same items.

Sizes: 3 workers, 12 streams at 10 msg/s, ``STREAMLEASE_BATCH_MAX_SECONDS`` 0.1. The batch
window is the floor of any gap at the sink, so it must sit well under the 0.5 s target for a
gap to show the hand-off rather than the batching; at 0.1 s each stream writes about 10
transactions a second, and 12 streams keep the embedded DynamoDB (about 250 writes/s on 2
cores) under half load, so a queue in the store does not pass for a slow hand-off. The run
takes about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from loadtest.common import timing_env
from loadtest.fleet import Context, Fleet, WorkerProc, pct, rounded
from streamlease.dev.upstream import frame_for
from streamlease.store import codec

BATCH_S = 0.1
STEADY_S = 10.0  # the window before the deploy each stream's baseline comes from
SETTLE_S = 3.0  # the deploy window runs this long past the last exit (moves onto the new)
TAIL_S = 2.0  # then messages sent before its end land before the workers stop


class Delivered(NamedTuple):
    """One message as the events table holds it."""

    seq: int
    at_ms: int  # the write's wall time
    fence: int
    intact: bool  # its text is the upstream's frame for this seq


def audit(delivered: list[Delivered], last_seq: int) -> dict[str, int]:
    """One stream's sink, ``delivered`` in the table's order: seqs up to the checkpoint
    ``last_seq`` missing or altered, copies beyond the first, and in write order a seq not
    above the one before or a fence below the one before."""
    intact = {d.seq for d in delivered if d.intact}
    written = sorted(delivered, key=lambda d: d.at_ms)  # stable: same-write order kept
    return {"lost": sum(1 for s in range(1, last_seq + 1) if s not in intact),
            "duplicated": len(delivered) - len({d.seq for d in delivered}),
            "out_of_order": sum(1 for a, b in itertools.pairwise(written) if b.seq <= a.seq),
            "stale_accepted": sum(1 for a, b in itertools.pairwise(written)
                                  if b.fence < a.fence)}


def longest_gap_s(times_ms: Iterable[float], start_ms: float, end_ms: float) -> float:
    """The longest stretch of [start, end] without a delivery: from the last one at or before
    ``start`` (or ``start``), through those inside, to ``end``."""
    ordered = sorted(times_ms)
    before = [t for t in ordered if t <= start_ms]
    points = [before[-1] if before else start_ms,
              *(t for t in ordered if start_ms < t < end_ms), end_ms]
    return max(b - a for a, b in itertools.pairwise(points)) / 1000


def latency_spike_s(delivered: list[Delivered], sent_ms: Callable[[int], float],
                    steady: tuple[float, float], deploy: tuple[float, float]
                    ) -> tuple[float | None, float | None]:
    """(median latency of the messages sent in ``steady``, the largest latency of those sent
    in ``deploy`` minus that median), in seconds; a message's latency is its first
    delivery's time minus its send time."""
    first: dict[int, int] = {}
    for d in delivered:
        first[d.seq] = min(d.at_ms, first.get(d.seq, d.at_ms))

    def latencies(window: tuple[float, float]) -> list[float]:
        return [(at - sent_ms(seq)) / 1000 for seq, at in first.items()
                if window[0] <= sent_ms(seq) < window[1]]

    base, during = latencies(steady), latencies(deploy)
    if not base:
        return None, None
    median = statistics.median(base)
    return median, (max(during) - median if during else None)


def figures(per_stream: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The section's figures from each stream's (``max_gap_s``, ``steady_gap_s``,
    ``steady_p50_s``, ``spike_s``, and its audit)."""
    def over(key: str) -> list[float]:
        return [v[key] for v in per_stream.values() if v.get(key) is not None]

    gaps, spikes = over("max_gap_s"), over("spike_s")
    worst = max(per_stream, key=lambda sid: per_stream[sid]["max_gap_s"], default=None)
    out: dict[str, Any] = {
        "max_gap_p99_s": pct(gaps, 99), "max_gap_p50_s": pct(gaps, 50),
        "max_gap_max_s": rounded(max(gaps, default=None), 3),
        "worst_stream": worst,
        "steady_max_gap_p99_s": pct(over("steady_gap_s"), 99),
        "steady_latency_p50_s": pct(over("steady_p50_s"), 50),
        "latency_spike_p99_s": pct(spikes, 99),
        "latency_spike_max_s": rounded(max(spikes, default=None), 3)}
    for key in ("lost", "duplicated", "out_of_order", "stale_accepted"):
        out[key] = sum(v[key] for v in per_stream.values())
    return out


# -- the run ---------------------------------------------------------------------------------


def add_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--deploy-workers", type=int, default=3)
    g.add_argument("--deploy-streams", type=int, default=12)
    g.add_argument("--deploy-rate", type=float, default=10.0,
                   help="messages/s per stream in deploy (default 10)")


def _wall_ms() -> float:
    return time.time() * 1000


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read()
    except OSError:
        return 0, b""


async def _ready(worker: WorkerProc, timeout: float = 30.0) -> float | None:
    """Seconds until the worker's ``/readyz`` answers 200 (None: it never did)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout and worker.alive():
        status, _ = await asyncio.to_thread(_get, f"http://127.0.0.1:{worker.port}/readyz")
        if status == 200:
            return time.monotonic() - started
        await asyncio.sleep(0.05)  # polled, with a deadline
    return None


async def _read_sink(fleet: Fleet) -> dict[str, list[Delivered]]:
    assert fleet.store is not None
    out: dict[str, list[Delivered]] = {}
    for sid in fleet.ids:
        found = out[sid] = []
        async for item in fleet.store.event_items(sid):
            at, fence = int(item[codec.EV_AT]["N"]), int(item[codec.EV_FENCE]["N"])
            found += [Delivered(f.seq, at, fence, f.text == frame_for(sid, f.seq))
                      for f in codec.decode_event_item(item)]
    return out


async def run_deploy(ctx: Context) -> dict[str, Any]:
    """A rolling deploy of every worker (see the module doc)."""
    args = ctx.args
    workers, rate = args.deploy_workers, args.deploy_rate
    section: dict[str, Any] = {"workers": workers, "streams": args.deploy_streams,
                               "rate": rate, "batch_max_s": BATCH_S, "steady_s": STEADY_S}
    env = {**timing_env(ctx.profile), "STREAMLEASE_BATCH_MAX_SECONDS": str(BATCH_S)}
    async with ctx.fleet("deploy", streams=args.deploy_streams, rate=rate,
                         worker_env=env) as fleet:
        for _ in range(workers):
            fleet.start_worker()
        section["settled_s"] = rounded(await fleet.wait_until(
            lambda: fleet.all_held() and all(fleet.checkpoints().values()), 60.0))
        epoch = await fleet.upstream_epoch()
        if epoch is None:
            raise RuntimeError("the upstream's /stats never answered: no send times")
        steady_from = _wall_ms()
        await asyncio.sleep(STEADY_S)
        deploy_from, moves_from = _wall_ms(), fleet.now()
        section["load_1m"] = round(os.getloadavg()[0], 1)  # a shared machine's noise
        steps = []
        for old in list(fleet.workers):
            new = fleet.start_worker()
            ready = await _ready(new)
            if ready is None:  # ECS keeps the old task while the new one is not healthy
                section["error"] = f"{new.name} never answered /readyz"
                break
            stopped = time.monotonic()
            await fleet.sigterm(old, wait_s=30)
            exit_s = time.monotonic() - stopped
            held = await fleet.wait_until(fleet.all_held, 30.0)
            steps.append({"old": old, "new": new.name, "ready_s": rounded(ready),
                          "old_exit_s": rounded(exit_s), "all_held_s": rounded(held)})
        await asyncio.sleep(SETTLE_S)
        deploy_until = _wall_ms()
        section["deploy_s"] = round((deploy_until - deploy_from) / 1000, 1)
        section["moves"] = fleet.moves(moves_from)
        section["steps"] = steps
        await asyncio.sleep(TAIL_S)
        await fleet.stop_all()
        await fleet.read_table()
        section["worker_exits"] = fleet.exits
        checkpoints = fleet.checkpoints()
        sink = await _read_sink(fleet)
        await fleet.measure_handoffs()
        section["handoff"] = fleet.failover("sigterm")
    per_stream: dict[str, dict[str, Any]] = {}
    for sid, delivered in sink.items():
        times = [d.at_ms for d in delivered]
        steady_p50, spike = latency_spike_s(delivered, lambda n: epoch + n * 1000 / rate,
                                            (steady_from, deploy_from),
                                            (deploy_from, deploy_until))
        per_stream[sid] = {"max_gap_s": longest_gap_s(times, deploy_from, deploy_until),
                           "steady_gap_s": longest_gap_s(times, steady_from, deploy_from),
                           "steady_p50_s": steady_p50, "spike_s": spike,
                           **audit(delivered, checkpoints.get(sid, 0))}
    section.update(figures(per_stream))
    section["messages_in_sink"] = sum(len(v) for v in sink.values())
    return {"deploy": section}
