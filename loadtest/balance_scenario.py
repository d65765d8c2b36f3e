"""The ``balance`` and ``balance_startup`` scenarios: how a fleet spreads its streams when it
scales out, after start-up and during it (moves as ``loadtest.fleet`` counts them)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

from loadtest.common import timing_env
from loadtest.fleet import Acquisition, Context, Fleet, rolling_restart, rounded

MOVES_AFTER_S = 30.0
STARTUP_QUIET_S = 20.0  # converged: in the band, with no move, for this long


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
                         worker_env=timing_env(ctx.profile)) as fleet:
        section["all_held_s"] = rounded(await fleet.start_and_hold(2))
        await asyncio.sleep(2.0)
        section["before_scale_out"] = fleet.counts()
        scale_at = fleet.now()
        fleet.events_log.append((scale_at, "scale-out 2 -> 4"))
        fleet.start_worker()
        fleet.start_worker()

        def balanced() -> bool:
            counts = fleet.counts()
            return len(counts) == 4 and fleet.all_held() and \
                all(share - 1 <= c <= share + 1 for c in counts.values())

        # Converged: inside the band with every stream held, and the last move of the
        # convergence (hand-overs already in flight included) followed by a quiet
        # MOVES_AFTER_S. A fleet that keeps moving never converges.
        in_band = await fleet.wait_until(balanced, args.balance_timeout)
        section["first_in_band_s"] = rounded(in_band)
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
        section["converge_s"] = rounded(converge)
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
        await rolling_restart(fleet, p)
        await fleet.wait_until(fleet.all_held, 10.0)
        await asyncio.sleep(2.0)
        counts = fleet.counts()
        section["after_rolling_restart"] = counts
        section["after_rolling_restart_max"] = max(counts.values(), default=None)
        section["after_rolling_restart_target"] = math.ceil(streams / max(1, len(counts))) + 1
        section["moves_total"] = fleet.moves()
        section["fence_bumps"] = fleet.fence_bumps()
        await fleet.finish(section)
        section["sigterm"] = fleet.failover("sigterm")  # its hand-offs timed by the audit
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


# -- scale-out during start-up ----------------------------------------------------------------


async def run_balance_startup(ctx: Context) -> dict[str, Any]:
    """40 streams, 2 workers started, and 2 more as soon as the first stream is held (the
    first two are still taking the rest): ``startup_balance``'s figures from then on, at
    the balance scenario's timings."""
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
                         worker_env=timing_env(ctx.profile)) as fleet:
        fleet.start_worker()
        fleet.start_worker()
        section["first_held_s"] = rounded(await fleet.wait_until(
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
        await fleet.finish(section)
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
