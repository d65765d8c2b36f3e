"""The ``upstreams`` scenario: upstream profiles through a chaos run, audited against the
feed's own numbering, and what a profile costs in throughput (docs/performance.md).

Per resume mode a fleet of its own (``UPSTREAM_RUN``) on one test feed, through
``loadtest.fleet.short_chaos_run`` with upstream drops; then each stream's events are read
back (``audit_feed``). A delivered message's number ``n`` is the upstream's
(``mode_seq``), and it must be byte-identical to ``mode_frame(feed, stream, n)``:

* ``lost``: numbers never delivered, from 1 to the last delivered for a feed that replays
  (the first connection asks for 1), between the first and the last delivered for one that
  cannot; plus copies that are not the feed's frame (``mismatched``);
* ``duplicated``, ``out_of_order``; ``stale_accepted``: events items whose fence decreases;
* for the feeds that cannot replay, a lost number lies *inside a recorded gap* when a gap
  record sits between the messages delivered before and after it (by position, whatever
  the record's fields say): ``loss_in_gaps`` is that fraction, ``lost_outside_gaps`` the
  rest (a correctness figure); ``gap_ranges_wrong``: records whose
  ``missing_from``-``missing_to`` is not exactly the numbers between its neighbours.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import traceback
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtest.common import PROFILES, Server, choose_names, local_store, timing_env
from loadtest.fleet import (
    PYTHON_PROCESSOR_ENV,
    ROOT,
    Context,
    Fleet,
    python_processor_env,
    run_each,
    short_chaos_run,
    worker_phase,
)
from streamlease.core.upstream import binary_payload, gap_body
from streamlease.dev.upstream import mode_frame, mode_seq


@dataclass(frozen=True)
class Feed:
    """One resume mode's test feed: the upstream's path, the profile, whether it replays."""

    path: str
    profile: str
    replays: bool
    description: str


MODES: dict[str, Feed] = {
    "query": Feed("subscribe", "subscribe", True,
                  "subscribe, replay by query parameter, heartbeats skipped"),
    "message": Feed("gateway", "gateway", True,
                    "identify with from_seq, seq at /d/s, keepalive"),
    "none": Feed("live", "live", False, "subscribe, no replay, seq at /u"),
    "none_count": Feed("binary", "binary", False,
                       "binary frames, no replay, numbered by the worker"),
}
PROFILES_FILE = ROOT / "examples" / "profiles.toml"
SAME_FEED_PROFILE = """
# Added by the load test: the built-in protocol spelled as a profile.
[same_feed]
seq = "/seq"
skip = { "/type" = ["heartbeat"] }
"""
TOKEN = "loadtest-feed-token"
# Per mode: a small fleet at the small profile's timings (``loadtest.common.timing_env``).
UPSTREAM_RUN: dict[str, Any] = {"streams": 12, "rate": 10.0, "workers": 3, "gap": 4.0,
                                "settle_timeout": 25.0, "drops": 3}
# profile_ratio: backlogged streams, seconds per phase, alternating rounds.
PROFILE_STREAMS = 10
PROFILE_SECONDS = 8.0
PROFILE_ROUNDS = 2
PROFILE_BACKLOG = 400_000


# -- the audit (pure) ------------------------------------------------------------------------


def upstream_number(feed: str, stream_id: str, text: str) -> tuple[int | None, bool, bool]:
    """What one delivered message is: (the feed's own number or None, whether it is
    byte-identical to the feed's frame of that number, whether it is a gap record)."""
    try:
        data = json.loads(text)
    except ValueError:
        return None, False, False
    if gap_body(data) is not None:
        return None, True, True
    frame: str | bytes = text
    if feed == "binary":
        payload = binary_payload(data)
        if payload is None:
            return None, False, False
        frame = payload
    n = mode_seq(feed, frame)
    if n is None or n < 1:
        return None, False, False
    return n, frame == mode_frame(feed, stream_id, n), False


def audit_feed(feed: str, stream_id: str, messages: Iterable[tuple[int, str]],
               replays: bool) -> dict[str, Any]:
    """One stream's delivered messages ``(seq, text)`` in seq order against the feed's own
    numbering (see the module doc)."""
    numbers: list[int] = []
    gaps: list[tuple[int, dict[str, Any]]] = []  # (data messages before it, record)
    mismatched = seq_differs = 0
    for seq, text in messages:
        n, intact, is_gap = upstream_number(feed, stream_id, text)
        if is_gap:
            gaps.append((len(numbers), gap_body(json.loads(text)) or {}))
            continue
        if n is None or not intact:
            mismatched += 1
            continue
        if replays and seq != n:
            seq_differs += 1  # a feed that numbers its messages keeps its numbers
        numbers.append(n)
    seen = set(numbers)
    lost_numbers: set[int] = set()
    if numbers:
        first = 1 if replays else min(numbers)
        lost_numbers = set(range(first, max(numbers) + 1)) - seen
    inside: set[int] = set()
    wrong_ranges = with_loss = 0
    for position, body in gaps:
        before = numbers[position - 1] if position > 0 else 0
        after = numbers[position] if position < len(numbers) else max(seen, default=0) + 1
        between = {n for n in lost_numbers if before < n < after}
        inside |= between
        with_loss += bool(between)
        if "missing_from" in body and (body.get("missing_from"), body.get("missing_to")) != \
                (before + 1, after - 1):
            wrong_ranges += 1
    return {
        "messages": len(numbers), "lost": len(lost_numbers) + mismatched,
        "mismatched": mismatched, "seq_differs": seq_differs,
        "duplicated": len(numbers) - len(seen),
        "out_of_order": sum(1 for a, b in itertools.pairwise(numbers) if b < a),
        "gap_records": len(gaps), "gaps_with_loss": with_loss, "gap_ranges_wrong": wrong_ranges,
        "lost_in_gaps": len(inside), "lost_outside_gaps": len(lost_numbers - inside) + mismatched,
    }


def combine(audits: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per-stream audits summed, and ``loss_in_gaps``: the fraction of lost numbers inside
    a recorded gap (None when nothing was lost)."""
    total: Counter[str] = Counter()
    for audit in audits:
        total.update(audit)
    out: dict[str, Any] = dict(total)
    lost = out.get("lost", 0)
    out["loss_in_gaps"] = round(out.get("lost_in_gaps", 0) / lost, 4) if lost else None
    return out


# -- the chaos runs --------------------------------------------------------------------------


def worker_env() -> dict[str, str]:
    return {**timing_env(PROFILES["small"]), "STREAMLEASE_PROFILES": str(PROFILES_FILE),
            "FEED_TOKEN": TOKEN}


async def read_back(fleet: Fleet, feed: Feed) -> dict[str, Any]:
    """Every stream's events against the feed's numbering, summed; fences monotonic."""
    assert fleet.store is not None
    audits, stale = [], 0
    for sid in fleet.ids:
        messages = [(frame.seq, frame.text) async for frame in fleet.store.read_events(sid)]
        audits.append(audit_feed(feed.path, sid, messages, feed.replays))
        fences = await fleet.store.event_fences(sid)
        stale += sum(1 for a, b in itertools.pairwise(fences) if b < a)
    return {**combine(audits), "stale_accepted": stale}


async def run_mode(ctx: Context, name: str) -> dict[str, Any]:
    p = PROFILES["small"]
    feed = MODES[name]
    run = UPSTREAM_RUN
    async with ctx.fleet(f"upstreams_{name}", streams=run["streams"], rate=run["rate"],
                         worker_env=worker_env(), feed=feed.path, profile=feed.profile,
                         upstream_args=("--token", TOKEN)) as fleet:
        figures = await short_chaos_run(
            fleet, run, p, f"upstreams: {name}: /{feed.path}/ with profile {feed.profile},",
            drop_feed=feed.path)
        found = await read_back(fleet, feed)
        total = fleet.total
        return {
            "feed": feed.path, "profile": feed.profile,
            "resume": "none" if not feed.replays else name, "replays": feed.replays,
            "what": feed.description,
            **found,
            "checkpointed": sum(fleet.checkpoints().values()),
            **figures,
            "upstream_gaps_counted": {
                r: int(total(f'streamlease_upstream_gaps_total{{reason="{r}"}}'))
                for r in ("takeover", "reconnect")},
            "malformed_frames": int(total("streamlease_malformed_frames_total")),
            "worker_exits": fleet.exits,
            "log_events": fleet.log_events(),
        }


# -- what a profile costs --------------------------------------------------------------------


async def profile_throughput(env: dict[str, str], quick: bool) -> dict[str, Any]:
    """Delivered msgs/s of one worker (``env``) over the same backlog: the built-in
    profile on ``/streams/``, ``gateway`` on ``/gateway/`` and ``subscribe`` on
    ``/subscribe/``, alternating over ``PROFILE_ROUNDS`` rounds; ``profile_ratio``: the
    ``gateway`` profile's over the built-in's."""
    seconds, rounds = (4.0, 1) if quick else (PROFILE_SECONDS, PROFILE_ROUNDS)
    backlog = Server("upstream", "--port", "0", "--streams", "0", "--rate", "1",
                     "--initial-backlog", str(PROFILE_BACKLOG), "--token", TOKEN)
    # The example profiles plus one for the built-in feed itself (seq at /seq, a skip rule
    # that never matches): the same frames both ways, so it prices the profile machinery
    # alone, apart from the size of another feed's frames.
    scratch = tempfile.TemporaryDirectory(prefix="streamlease-profiles-")
    profiles_file = Path(scratch.name) / "profiles.toml"
    profiles_file.write_text(PROFILES_FILE.read_text() + SAME_FEED_PROFILE)
    phase_env = {**env, **python_processor_env(env),
                 "STREAMLEASE_PROFILES": str(profiles_file), "FEED_TOKEN": TOKEN}
    phases = (("streams", "streams", None), ("gateway", "gateway", "gateway"),
              ("subscribe", "subscribe", "subscribe"), ("same_feed", "streams", "same_feed"))
    rates: dict[str, list[float]] = {key: [] for key, _, _ in phases}
    work: dict[str, list[float]] = {key: [0.0, 0.0] for key, _, _ in phases}  # msgs, CPU s
    load_before = os.getloadavg()[0]
    try:
        for i in range(rounds):
            for key, feed, profile in phases:
                print(f"upstreams: throughput, /{feed}/ with profile "
                      f"{profile or 'streamlease (built-in)'}, round {i + 1} ...", flush=True)
                found = await worker_phase(phase_env, backlog.url, PROFILE_STREAMS, seconds,
                                           feed=feed, profile=profile)
                rates[key].append(found["msgs_per_s"])
                work[key][0] += found["messages"]
                work[key][1] += found["cpu_s"]
    finally:
        backlog.stop()
        scratch.cleanup()
    mean = {feed: sum(v) / len(v) for feed, v in rates.items()}
    per_cpu = {feed: m / cpu if cpu else 0.0 for feed, (m, cpu) in work.items()}

    def ratio(of: dict[str, float], feed: str) -> float | None:
        return round(of[feed] / of["streams"], 3) if of["streams"] else None

    return {"profile_ratio": ratio(mean, "gateway"),
            "profile_ratio_subscribe": ratio(mean, "subscribe"),
            "profile_ratio_same_feed": ratio(mean, "same_feed"),
            "profile_throughput": {
                "msgs_per_s": {f: round(v) for f, v in mean.items()},
                "runs": {f: [round(x) for x in v] for f, v in rates.items()},
                # Messages per second of the worker's own CPU time: what a profile costs
                # the worker, less sensitive than msgs/s to other load on the machine.
                "msgs_per_cpu_s": {f: round(v) for f, v in per_cpu.items()},
                "cpu_ratio": ratio(per_cpu, "gateway"),
                "cpu_ratio_subscribe": ratio(per_cpu, "subscribe"),
                "cpu_ratio_same_feed": ratio(per_cpu, "same_feed"),
                "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "streams": PROFILE_STREAMS, "seconds": seconds, "rounds": rounds,
                "sink": PYTHON_PROCESSOR_ENV["STREAMLEASE_SINK"],
                "batch_max_messages": int(PYTHON_PROCESSOR_ENV["STREAMLEASE_BATCH_MAX_MESSAGES"]),
            }}


# -- the scenario ----------------------------------------------------------------------------


async def run_upstreams(ctx: Context) -> dict[str, Any]:
    names = list(getattr(ctx.args, "upstream_modes", None) or MODES)
    section, failed = await run_each(
        "upstreams", names, lambda name: run_mode(ctx, name),
        lambda name: {"feed": MODES[name].path, "profile": MODES[name].profile},
        ("messages", "lost", "duplicated", "out_of_order", "gap_records", "lost_in_gaps",
         "loss_in_gaps"))
    try:
        with local_store(ctx.args.dynamodb) as env:
            section.update(await profile_throughput(env, bool(getattr(ctx.args, "quick",
                                                                      False))))
        print(f"upstreams: profile_ratio {section['profile_ratio']} (gateway / built-in), "
              f"subscribe {section['profile_ratio_subscribe']}; msg/s "
              f"{section['profile_throughput']['msgs_per_s']}", flush=True)
    except Exception as exc:
        traceback.print_exc()
        failed.append("profile_ratio")
        section["profile_ratio_error"] = f"{type(exc).__name__}: {exc}"
    out: dict[str, Any] = {"upstreams": section}
    if failed:
        out["error"] = f"upstream run(s) failed: {', '.join(failed)}"
    return out


def parse_modes(text: str) -> list[str]:
    """``--upstream-modes``: comma-separated names, or ``all``."""
    return choose_names(text, list(MODES), "upstream mode")


def add_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--upstream-modes", type=parse_modes,
                   default=list(MODES),
                   help="resume modes of the upstreams scenario, comma-separated from "
                        f"{', '.join(MODES)}, or 'all' (the default)")
