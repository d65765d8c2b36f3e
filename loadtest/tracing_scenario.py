"""Tracing in the load test: linked hand-offs in the chaos run, and what tracing costs.

**The chaos run** (``loadtest.chaos.run_chaos`` with ``--tracing on``, the default) exports
its workers' spans to an OTLP/HTTP receiver on loopback (``loadtest.otlp``). Afterwards,
per SIGTERM of the schedule (the rolling deploy), each stream the worker released on the way
out (its log's ``lease.released`` with reason ``shutdown``: counted from the logs, so a
hand-off whose spans never arrived counts too) is a hand-off. It is *linked* when the
trace shows it end to end: the old holder's ``streamlease.release`` span (reason
``shutdown``, released), an ``streamlease.acquire`` span on another worker whose link names
that release span, and a ``streamlease.first_flush`` for the stream in the acquisition's
trace on the same worker. ``tracing.handoffs_linked`` is the linked share (target 1.0).

Per kill -9 of the schedule, each survivor's ``streamlease.takeover`` span for the victim
(a root) with its child ``streamlease.acquire`` spans (``how=takeover``) is a take-over.

The slowest hand-off (release start to first flush end) and the slowest take-over (kill to
the last first flush in the take-over's trace) are kept in the JSON as span timelines
(``tracing.slowest_handoff``, ``tracing.slowest_takeover``), which the report draws
(``latest-trace.png``).

**The ``tracing`` scenario**: one worker replaying the same backlog into the no-op Python
processor (the throughput scenario's ``python_processor`` phase) with tracing off and on
(default sampling, exporting to the receiver), alternating off, on, on, off so a drift of
the machine's load cancels out: ``tracing.throughput_ratio`` = on / off (target >= 0.95).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.common import Server
from loadtest.otlp import Receiver, Span

# Spans of one stream shown in a take-over's picture at most (the slowest ones).
TAKEOVER_STREAMS_SHOWN = 6
UNLINKED_LISTED = 10
# The tracing scenario: backlogged streams, seconds per phase, phase order.
COST_STREAMS = 10
COST_SECONDS = 10.0
COST_BACKLOG = 400_000
COST_ORDER = ("off", "on", "on", "off")


def without_otel(env: dict[str, str]) -> dict[str, str]:
    """``env`` without any ``OTEL_*`` variable: tracing off, whatever the caller set."""
    return {k: v for k, v in env.items() if not k.startswith("OTEL_")}


def released_on_shutdown(log: Path) -> list[str]:
    """The streams a worker's log says it released on SIGTERM (``lease.released``,
    reason ``shutdown``), in order."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        if '"lease.released"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "lease.released" \
                and record.get("reason") == "shutdown" and record.get("stream"):
            out.append(str(record["stream"]))
    return out


@dataclass
class Handoff:
    """One SIGTERM hand-off of a stream, as the trace shows it."""

    stream: str
    old: str
    release: Span | None = None
    acquire: Span | None = None
    first_flush: Span | None = None

    @property
    def linked(self) -> bool:
        return self.first_flush is not None

    @property
    def why_not(self) -> str | None:
        if self.release is None:
            return "no release span (reason shutdown) from the old holder"
        if self.acquire is None:
            return "no acquisition on another worker linked to the release"
        if self.first_flush is None:
            return "no first flush in the acquisition's trace"
        return None

    @property
    def total_ns(self) -> int | None:
        if self.release is None or self.first_flush is None:
            return None
        return self.first_flush.end_ns - self.release.start_ns


def find_handoff(spans: list[Span], old: str, stream: str) -> Handoff:
    """The hand-off of ``stream`` released by ``old`` on SIGTERM, as far as ``spans`` show it."""
    found = Handoff(stream, old)
    releases = [s for s in spans if s.what == "release" and s.instance == old
                and s.attr("stream") == stream and s.attr("reason") == "shutdown"
                and s.attr("released") is True]
    if not releases:
        return found
    found.release = max(releases, key=lambda s: s.end_ns)  # the attempt that released it
    acquires = sorted((s for s in spans if s.what == "acquire" and s.instance != old
                       and s.attr("stream") == stream and s.attr("acquired") is True
                       and s.links_to(found.release)), key=lambda s: s.start_ns)
    if not acquires:
        return found
    found.acquire = acquires[0]
    flushes = sorted((s for s in spans if s.what == "first_flush"
                      and s.trace_id == found.acquire.trace_id
                      and s.instance == found.acquire.instance
                      and s.attr("stream") == stream), key=lambda s: s.start_ns)
    found.first_flush = flushes[0] if flushes else None
    return found


@dataclass
class Takeover:
    """A survivor's take-over of a dead member's streams: its root span and the trace."""

    span: Span
    acquired: list[Span]  # child acquisitions (how=takeover) that took their stream
    trace: list[Span]  # every span of the take-over's trace on the survivor
    killed_ns: int | None

    @property
    def end_ns(self) -> int:
        return max(s.end_ns for s in self.trace)

    @property
    def total_ns(self) -> int:
        return self.end_ns - (self.killed_ns if self.killed_ns is not None
                              else self.span.start_ns)


def find_takeovers(spans: list[Span], victim: str, killed_ns: int | None) -> list[Takeover]:
    """Every survivor's ``streamlease.takeover`` of ``victim`` with its trace."""
    out = []
    for root in spans:
        if root.what != "takeover" or root.attr("member") != victim:
            continue
        trace = [s for s in spans if s.trace_id == root.trace_id and s.instance == root.instance]
        acquired = [s for s in trace if s.what == "acquire" and s.parent_id == root.span_id
                    and s.attr("how") == "takeover" and s.attr("acquired") is True]
        out.append(Takeover(root, acquired, trace, killed_ns))
    return out


def _detail(span: Span) -> dict[str, Any]:
    return {k.removeprefix("streamlease."): v for k, v in span.attributes.items()
            if k.startswith("streamlease.") and k != "streamlease.stream"}


def timeline(spans: Iterable[Span], origin_ns: int,
             links: Iterable[tuple[Span, Span]] = ()) -> dict[str, Any]:
    """Spans as the report draws them: times in ms from ``origin_ns``, in start order;
    ``links``: (linked-to span, linking span) pairs, as indexes into the list."""
    ordered = sorted(spans, key=lambda s: (s.start_ns, s.end_ns))
    index = {s.span_id: i for i, s in enumerate(ordered)}
    rows = [{"name": s.what, "worker": s.instance, "stream": s.attr("stream"),
             "start_ms": round((s.start_ns - origin_ns) / 1e6, 2),
             "end_ms": round((s.end_ns - origin_ns) / 1e6, 2),
             "trace": s.trace_id[:8], "detail": _detail(s)} for s in ordered]
    pairs = [[index[a.span_id], index[b.span_id]] for a, b in links
             if a.span_id in index and b.span_id in index]
    return {"spans": rows, "links": pairs}


def handoff_timeline(h: Handoff, spans: list[Span]) -> dict[str, Any]:
    """A linked hand-off: the release, the cycle that saw it, and the acquisition's spans
    of this stream (acquire, resume read, dial, first flush) on the new holder."""
    assert h.release is not None and h.acquire is not None and h.first_flush is not None
    new = h.acquire.instance
    shown = [h.release]
    shown += [s for s in spans if s.trace_id == h.acquire.trace_id and s.instance == new
              and (s.attr("stream") == h.stream or s.span_id == h.acquire.parent_id)]
    out = timeline(shown, h.release.start_ns, [(h.release, h.acquire)])
    return {"kind": "sigterm", "stream": h.stream, "from": h.old, "to": new,
            "total_ms": round((h.first_flush.end_ns - h.release.start_ns) / 1e6, 2), **out}


def takeover_timeline(t: Takeover, victim: str) -> dict[str, Any]:
    """A take-over: its root span and, for the streams whose first flush came last (at most
    ``TAKEOVER_STREAMS_SHOWN``), their spans; the kill as a marker."""
    streams: dict[str, int] = {}
    for s in t.trace:
        sid = s.attr("stream")
        if sid is not None:
            streams[str(sid)] = max(streams.get(str(sid), 0), s.end_ns)
    slowest = sorted(streams, key=lambda sid: streams[sid], reverse=True)
    keep = set(slowest[:TAKEOVER_STREAMS_SHOWN])
    shown = [s for s in t.trace if s.attr("stream") is None or s.attr("stream") in keep]
    origin = min([s.start_ns for s in shown] + ([t.killed_ns] if t.killed_ns else []))
    out = timeline(shown, origin)
    return {"kind": "kill9", "member": victim, "by": t.span.instance,
            "streams": len(t.acquired), "streams_shown": len(keep),
            "killed_ms": round((t.killed_ns - origin) / 1e6, 2) if t.killed_ns else None,
            "total_ms": round(t.total_ns / 1e6, 2), **out}


def chaos_figures(spans: list[Span], sigterms: list[tuple[str, list[str]]],
                  kills: list[tuple[str, int | None]], rejected: int = 0) -> dict[str, Any]:
    """The ``tracing`` section of the chaos run. ``sigterms``: per SIGTERM of the schedule,
    the worker and the streams it logged releasing on shutdown; ``kills``: per kill -9, the
    victim and the wall time of the kill (epoch ns, None if unknown)."""
    handoffs = [find_handoff(spans, old, sid) for old, streams in sigterms for sid in streams]
    linked = [h for h in handoffs if h.linked]
    found = [(victim, t) for victim, at in kills for t in find_takeovers(spans, victim, at)]
    takeovers = [t for _, t in found]
    out: dict[str, Any] = {
        "handoffs_linked": round(len(linked) / len(handoffs), 4) if handoffs else None,
        "handoffs": len(handoffs),
        "handoffs_linked_count": len(linked),
        "unlinked": [{"stream": h.stream, "worker": h.old, "why": h.why_not}
                     for h in handoffs if not h.linked][:UNLINKED_LISTED],
        "takeovers": len(takeovers),
        "takeover_streams": sum(len(t.acquired) for t in takeovers),
        "spans_received": len(spans),
        "spans_by_name": _count(s.what for s in spans),
        "exports_rejected": rejected,
    }
    if linked:
        slow = max(linked, key=lambda h: h.total_ns or 0)
        out["slowest_handoff"] = handoff_timeline(slow, spans)
        out["handoff_ms"] = _percentiles([(h.total_ns or 0) / 1e6 for h in linked])
    with_streams = [(victim, t) for victim, t in found if t.acquired]
    if with_streams:
        victim, slow_t = max(with_streams, key=lambda pair: pair[1].total_ns)
        out["slowest_takeover"] = takeover_timeline(slow_t, victim)
    return out


def _count(names: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def _percentiles(values: list[float]) -> dict[str, float | None]:
    from loadtest.fleet import pct

    return {"p50": pct(values, 50), "p99": pct(values, 99),
            "max": round(max(values), 2) if values else None}


def wall_ns(monotonic_from_start: float, fleet_now: float) -> int:
    """The wall time (epoch ns) of a moment ``monotonic_from_start`` seconds into a fleet's
    run, read now when the run is ``fleet_now`` seconds in (the spans carry wall times)."""
    return time.time_ns() - int((fleet_now - monotonic_from_start) * 1e9)


# -- the tracing scenario: throughput with tracing on / off ---------------------------------


async def measure_tracing_cost(env: dict[str, str], quick: bool) -> dict[str, Any]:
    """One worker, the no-op Python processor, the same backlog: delivered msgs/s with
    tracing off and on (default sampling), in ``COST_ORDER``."""
    from loadtest.throughput import PYTHON_PROCESSOR_ENV, ROOT, _worker_phase

    seconds = 4.0 if quick else COST_SECONDS
    base = without_otel(env)
    path = os.pathsep.join(p for p in (str(ROOT), base.get("PYTHONPATH", "")) if p)
    extra = {**PYTHON_PROCESSOR_ENV, "PYTHONPATH": path}
    backlog = Server("upstream", "--port", "0", "--streams", "0", "--rate", "1",
                     "--initial-backlog", str(COST_BACKLOG))
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [0.0, 0.0], "on": [0.0, 0.0]}  # msgs, CPU s
    spans_per_run: list[int] = []
    load_before = os.getloadavg()[0]
    try:
        with Receiver() as receiver:
            for i, mode in enumerate(COST_ORDER):
                print(f"tracing: no-op processor, tracing {mode} ({i + 1}/{len(COST_ORDER)}) "
                      "...", flush=True)
                before = len(receiver.spans())
                # The SDK's default batch delay: what a deployment runs with.
                phase_env = {**base, **receiver.env(None)} if mode == "on" else base
                found = await _worker_phase(phase_env, backlog.url, COST_STREAMS, seconds,
                                            extra, COST_STREAMS)
                rates[mode].append(found["msgs_per_s"])
                cpu[mode][0] += found["messages"]
                cpu[mode][1] += found["cpu_s"]
                if mode == "on":
                    spans_per_run.append(len(receiver.spans()) - before)
            names = sorted({s.what for s in receiver.spans()})
    finally:
        backlog.stop()
    if not all(spans_per_run):
        raise RuntimeError(f"a run with tracing on exported no span ({spans_per_run}): the "
                           "ratio would compare tracing off with itself")
    mean = {m: sum(v) / len(v) for m, v in rates.items()}
    per_cpu = {m: msgs / s if s else 0.0 for m, (msgs, s) in cpu.items()}
    return {"tracing": {
        "throughput_ratio": round(mean["on"] / mean["off"], 3) if mean["off"] else None,
        "throughput": {
            "msgs_per_s": {m: round(v) for m, v in mean.items()},
            "runs": {m: [round(x) for x in v] for m, v in rates.items()},
            "order": list(COST_ORDER),
            "msgs_per_cpu_s": {m: round(v) for m, v in per_cpu.items()},
            "cpu_ratio": round(per_cpu["on"] / per_cpu["off"], 3) if per_cpu["off"] else None,
            "spans_per_run_on": spans_per_run, "span_names": names,
            "sampler": "parentbased_always_on (the default)",
            "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "streams": COST_STREAMS, "seconds": seconds,
            "sink": PYTHON_PROCESSOR_ENV["STREAMLEASE_SINK"],
        }}}
