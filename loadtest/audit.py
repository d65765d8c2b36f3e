"""The load test's auditor: which figures are correctness figures, and what a run's traces
show of its hand-offs.

**Correctness** (``correctness_failures``): every scenario section's sink audit
(``CORRECTNESS``), job slots run twice and changes lost, and per sink and per upstream
resume mode what ``SINK_CORRECTNESS`` and ``upstream_correctness_keys`` name. A run with
any of them non-zero exits non-zero.

**A destination read back** (``audit_deliveries``): the copies a sink's destination holds
(``Delivery``, in its own order) against the stream items' ``last_seq`` checkpoints, as
the sinks scenario and the nemesis's processor schedules read them.

**Traces of the chaos run** (``chaos_figures``): linked SIGTERM hand-offs and kill -9
take-overs, as docs/performance.md ("Tracing") defines them. Hand-offs are counted from
the workers' logs, so one whose spans never arrived counts against the linked share.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from loadtest.common import log_records
from loadtest.fleet import pct
from loadtest.otlp import Span
from loadtest.registry import REPLAYING_MODES, UPSTREAM_MODES, get_path
from streamlease.core.sinks import EXACTLY_ONCE
from streamlease.dev.upstream import frame_for

CORRECTNESS = ("lost", "duplicated", "out_of_order", "stale_accepted", "fleet_caused_gaps")
# A scenario section's own correctness figures, beyond the sink audit's.
SECTION_CORRECTNESS = (*CORRECTNESS, "double_runs", "lost_changes")
# Sections one level down that carry an audit of their own.
NESTED_SECTIONS = ("balance.during_startup", "change_feed.off")
# Per sink (``sinks.<name>``): messages lost, duplicated within one tenure, stale writes
# accepted; ``duplicated`` too for the exactly-once sinks (the others may duplicate across
# a takeover).
SINK_CORRECTNESS = ("lost", "dup_outside_takeover", "stale_accepted")
# Spans of one stream shown in a take-over's picture at most (the slowest ones).
TAKEOVER_STREAMS_SHOWN = 6
UNLINKED_LISTED = 10


# -- a destination read back (pure) ---------------------------------------------------------


class Delivery(NamedTuple):
    """One copy of a message read back at a destination, in the destination's order."""

    seq: int
    fence: int
    intact: bool  # its data is the upstream's frame for this seq


def delivery(stream_id: str, seq: int, fence: int, data: Any) -> Delivery:
    """A copy read back; ``data`` as parsed JSON (a string is parsed first)."""
    try:
        value = json.loads(data) if isinstance(data, str | bytes) else data
    except ValueError:
        value = None
    return Delivery(seq, fence, value == json.loads(frame_for(stream_id, seq)))


LOST_SHOWN = 10  # lost seqs named in an audit (``lost_seqs``), the first of each stream


def audit_deliveries(checkpoints: dict[str, int],
                     found: dict[str, list[Delivery]]) -> dict[str, Any]:
    """Every seq up to each stream's checkpoint at the destination, intact; duplicates in
    all and within one fence; order within a fence (the figures as ``loadtest.sinks_scenario``
    defines them). A loss also names its first seqs (``lost_seqs``, ``stream:seq``) to
    look for in the workers' logs."""
    lost = mismatched = duplicated = within_fence = out_of_order = messages = tenures = 0
    named: list[str] = []
    for sid in sorted(set(checkpoints) | set(found)):
        copies = found.get(sid, [])
        messages += len(copies)
        mismatched += sum(1 for d in copies if not d.intact)
        intact = {d.seq for d in copies if d.intact}
        missing = [s for s in range(1, checkpoints.get(sid, 0) + 1) if s not in intact]
        lost += len(missing)
        named += [f"{sid}:{s}" for s in missing[:LOST_SHOWN - len(named)]]
        duplicated += sum(n - 1 for n in Counter(d.seq for d in copies).values())
        within_fence += sum(n - 1 for n in Counter((d.seq, d.fence) for d in copies).values())
        by_fence: dict[int, list[int]] = defaultdict(list)
        for d in copies:
            by_fence[d.fence].append(d.seq)
        tenures += len(by_fence)
        out_of_order += sum(1 for run in by_fence.values()
                            for a, b in itertools.pairwise(run) if b < a)
    return {"messages": messages, "lost": lost + mismatched, "mismatched": mismatched,
            "duplicated": duplicated, "dup_outside_takeover": within_fence,
            "dup_across_takeover": duplicated - within_fence, "out_of_order": out_of_order,
            "fences_seen": tenures, "checkpointed": sum(checkpoints.values()),
            **({"lost_seqs": named} if named else {})}


def from_records(records: Iterable[dict[str, Any]]) -> dict[str, list[Delivery]]:
    """``record_line`` objects (``stream_id``, ``seq``, ``fence``, ``data``), in order."""
    out: dict[str, list[Delivery]] = defaultdict(list)
    for r in records:
        sid = str(r["stream_id"])
        out[sid].append(delivery(sid, int(r["seq"]), int(r["fence"]), r["data"]))
    return dict(out)


def json_lines(text: str) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of a JSON-lines text and the count of lines that are not one."""
    records, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            bad += 1
            continue
        if isinstance(value, dict) and {"stream_id", "seq", "fence", "data"} <= set(value):
            records.append(value)
        else:
            bad += 1
    return records, bad


def json_files(directory: Path) -> tuple[list[dict[str, Any]], int]:
    """``json_lines`` over every ``*.jsonl`` file of ``directory``, in name order."""
    records: list[dict[str, Any]] = []
    bad = 0
    for path in sorted(directory.glob("*.jsonl")):
        found, unreadable = json_lines(path.read_text(errors="replace"))
        records += found
        bad += unreadable
    return records, bad


def sink_kind(name: str) -> str:
    """The sink kind of a scenario sink name (``sqs_fifo`` is an ``sqs`` sink)."""
    return name.split("_", 1)[0]


def exactly_once(name: str) -> bool:
    return sink_kind(name) in EXACTLY_ONCE


def upstream_correctness_keys(mode: str, section: dict[str, Any]) -> tuple[str, ...]:
    """Per resume mode: what must be 0 (``lost`` only where the feed replays;
    ``lost_outside_gaps`` where it cannot)."""
    keys = ("duplicated", "out_of_order", "stale_accepted", "mismatched")
    replays = section.get("replays", mode in REPLAYING_MODES)
    return (*keys, "lost") if replays else (*keys, "lost_outside_gaps")


def correctness_failures(result: dict[str, Any]) -> dict[str, int]:
    """Every non-zero correctness figure, top-level (chaos), in a scenario's section, of a
    sink (``sinks.<name>.<figure>``) or of an upstream mode (``upstreams.<mode>.<figure>``)."""
    bad = {k: result[k] for k in CORRECTNESS if result.get(k)}
    for path, section in [*result.items(), *((p, get_path(result, p)) for p in NESTED_SECTIONS)]:
        if isinstance(section, dict):
            bad.update({f"{path}.{k}": section[k] for k in SECTION_CORRECTNESS
                        if section.get(k)})
    sinks = result.get("sinks")
    for name, found in (sinks.items() if isinstance(sinks, dict) else ()):
        if not isinstance(found, dict):
            continue
        keys: tuple[str, ...] = SINK_CORRECTNESS
        if found.get("exactly_once", exactly_once(name)):
            keys = (*keys, "duplicated")
        bad.update({f"sinks.{name}.{k}": found[k] for k in keys if found.get(k)})
    upstreams = result.get("upstreams")
    for mode, found in (upstreams.items() if isinstance(upstreams, dict) else ()):
        if isinstance(found, dict) and mode in UPSTREAM_MODES:
            bad.update({f"upstreams.{mode}.{k}": found[k]
                        for k in upstream_correctness_keys(mode, found) if found.get(k)})
    return bad


# -- the chaos run's traces -------------------------------------------------------------------


def released_on_shutdown(log: Path) -> list[str]:
    """The streams a worker's log says it released or handed over on SIGTERM
    (``lease.released``, ``lease.handed_over``; reason ``shutdown``), in order."""
    ended = ("lease.released", "lease.handed_over")
    return [str(r["stream"]) for r in log_records(log, '"lease.')
            if r.get("event") in ended and r.get("reason") == "shutdown" and r.get("stream")]


@dataclass
class Handoff:
    """One SIGTERM hand-off of a stream, as the trace shows it. ``release``: the old
    holder's release, or for a stream handed live the taker's ``take`` (the write that
    moved the lease: the hand-off starts there)."""

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
            return "no release span (reason shutdown) from the old holder, nor a take"
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
        return _handed(spans, found)
    found.release = max(releases, key=lambda s: s.end_ns)  # the attempt that released it
    acquires = sorted((s for s in spans if s.what == "acquire" and s.instance != old
                       and s.attr("stream") == stream and s.attr("acquired") is True
                       and s.links_to(found.release)), key=lambda s: s.start_ns)
    if not acquires:
        return found
    found.acquire = acquires[0]
    return _first_flush(spans, found)


def _handed(spans: list[Span], found: Handoff) -> Handoff:
    """A stream handed live (make before break): the taker's acquisition (``how`` handed,
    from the old holder) and its ``take``."""
    acquires = sorted((s for s in spans if s.what == "acquire" and s.instance != found.old
                       and s.attr("stream") == found.stream and s.attr("how") == "handed"
                       and s.attr("previous_owner") == found.old
                       and s.attr("acquired") is True), key=lambda s: s.start_ns)
    if not acquires:
        return found
    takes = [s for s in spans if s.what == "take" and s.parent_id == acquires[0].span_id]
    if not takes:
        return found
    found.release, found.acquire = takes[0], acquires[0]
    return _first_flush(spans, found)


def _first_flush(spans: list[Span], found: Handoff) -> Handoff:
    assert found.acquire is not None
    stream = found.stream
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
    shown = {h.release.span_id: h.release}  # a live hand-off's take is in the trace itself
    for s in spans:
        if s.trace_id == h.acquire.trace_id and s.instance == new and \
                (s.attr("stream") == h.stream or s.span_id == h.acquire.parent_id):
            shown.setdefault(s.span_id, s)
    # A release is linked to from the acquisition on another worker; a take is its child.
    links = [(h.release, h.acquire)] if h.release.instance != new else []
    out = timeline(shown.values(), h.release.start_ns, links)
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
                  kills: Sequence[tuple[str, int | None]], rejected: int = 0) -> dict[str, Any]:
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
        "spans_by_name": dict(sorted(Counter(s.what for s in spans).items())),
        "exports_rejected": rejected,
    }
    if linked:
        slow = max(linked, key=lambda h: h.total_ns or 0)
        out["slowest_handoff"] = handoff_timeline(slow, spans)
        ms = [(h.total_ns or 0) / 1e6 for h in linked]
        out["handoff_ms"] = {"p50": pct(ms, 50), "p99": pct(ms, 99), "max": round(max(ms), 2)}
    with_streams = [(victim, t) for victim, t in found if t.acquired]
    if with_streams:
        victim, slow_t = max(with_streams, key=lambda pair: pair[1].total_ns)
        out["slowest_takeover"] = takeover_timeline(slow_t, victim)
    return out


def wall_ns(monotonic_from_start: float, fleet_now: float) -> int:
    """The wall time (epoch ns) of a moment ``monotonic_from_start`` seconds into a fleet's
    run, read now when the run is ``fleet_now`` seconds in (the spans carry wall times)."""
    return time.time_ns() - int((fleet_now - monotonic_from_start) * 1e9)
