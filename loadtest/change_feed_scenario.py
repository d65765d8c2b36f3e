"""The ``change_feed`` scenario: how soon the fleet acts on a change written to the streams
table, what it reads while nothing changes, and whether a change written while the leader
dies is lost; with the change feed on (``STREAMLEASE_CHANGE_FEED=on``) and off, a fleet
each at the worker's default timings.

The embedded DynamoDB lags its index reads (``INDEX_LAG_MS`` + up to
``INDEX_LAG_JITTER_MS``) and counts requests by table (``loadtest.request_count``); the
upstream has a backlog (a stream's first batch fills, and is delivered, as soon as it
connects) and a second upstream serves the same frames (a URL can move to it without
changing what it delivers). Then, in order:

1. **Changes** (``handwritten_p99``, ``stopped_p99``, ``url_change_p99``): an item written
   by hand (``Pk``, ``desired_state`` and ``ws_url`` only) until it delivers, a held stream
   flipped to STOPPED until released, a ``ws_url`` moved until the second upstream sees it
   connected; timed from the write, watched every ``POLL_S`` (``Watch``).
2. **Quiet window** (``reads_per_stream_minute``): once no tenure has begun for
   ``SETTLED_S``, the read requests the workers sent to the streams table and its indexes,
   counted at the server (the workers' own counter has no table label), per held
   stream-minute.
3. **Leader killed mid-feed** (``lost_changes``): hand-written items and STOPPED flips of
   the survivors' streams (a dead holder's STOPPED stream is released by no one, so it
   would say nothing of the feed), the leader killed halfway; a change never acted on is
   lost, but for a hand-written item waiting for room (``split_for_room``).

Phase 1's changes go to ``changes.json`` beside the worker logs, to line up with them
(``--worker-log-level DEBUG`` logs each hop of each change). The feed-on figures are the
section's own keys, the feed-off ones the same under ``change_feed.off``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aioboto3

from loadtest.common import Server, choose_names, dynamodb_args
from loadtest.fleet import (
    Context,
    Fleet,
    LeaderWatch,
    by_label,
    by_operation,
    pct,
    upstream_connections,
)
from loadtest.request_count import READ_OPERATIONS, WORKER_ACCESS_KEY, Key
from streamlease.config import DEFAULTS
from streamlease.core.model import StreamRecord
from streamlease.store import codec

MODES = ("on", "off")
DEFAULT_MAX_STREAMS = int(DEFAULTS["STREAMLEASE_MAX_STREAMS"])  # the workers run at defaults
FEED_VARIABLE = "STREAMLEASE_CHANGE_FEED"
WORKERS = 3
STREAMS = 240  # seeded (80 a worker, most of the default 100); hand-written items join them
RATE = 1.0  # messages/s per stream
BACKLOG = 400  # at connect a stream replays at least a full batch (200): delivered at once
INDEX_LAG_MS = 250.0
INDEX_LAG_JITTER_MS = 250.0
CHANGES = 20  # of each kind
SPREAD_S = 15.0
CHANGE_WAIT_S = 70.0  # the stream check (60 s) plus its jitter
POLL_S = 0.05
ALL_HELD_TIMEOUT_S = 90.0
SETTLED_S = 40.0  # no tenure begun for longer than the minimum hold (30 s at defaults)
SETTLE_TIMEOUT_S = 150.0
QUIET_S = 60.0
KILL_CHANGES = 20
KILL_SPAN_S = 10.0
RECOVERY_S = 90.0

HANDWRITTEN, STOPPED, URL = "handwritten", "stopped", "url_change"
KINDS = (HANDWRITTEN, STOPPED, URL)
WORKER_READS = ("get_item", "batch_get_item", "query", "scan")  # the workers' counter


@dataclass
class Change:
    """One write to the streams table and when the fleet was seen acting on it."""

    kind: str  # HANDWRITTEN | STOPPED | URL
    stream: str
    sent: float  # time.monotonic() when the write was sent
    acted_s: float | None = None  # seconds from ``sent`` until seen acted on
    connected_s: float | None = None  # HANDWRITTEN: until the upstream saw it connected
    sent_wall: float = field(default_factory=time.time)  # time.time() at ``sent``


@dataclass
class Watch:
    """Polls, every ``POLL_S``, what shows each pending change acted on: one consistent
    BatchGetItem of the pending items, and the upstreams' ``/stats``."""

    client: Any  # an aioboto3 DynamoDB client
    table: str
    upstream: str  # the stream's first upstream (ws:// base): hand-written items connect here
    moved_to: str  # the second upstream: URL changes connect here
    changes: list[Change] = field(default_factory=list)
    polls: int = 0
    errors: int = 0

    def pending(self, changes: Sequence[Change] | None = None) -> list[Change]:
        return [c for c in (self.changes if changes is None else changes) if c.acted_s is None]

    async def run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed read: poll again
                self.errors += 1
            await asyncio.sleep(max(0.0, POLL_S - (time.monotonic() - started)))

    async def poll(self) -> None:
        waiting = self.pending()
        hand = [c for c in self.changes if c.kind == HANDWRITTEN and c.connected_s is None]
        if not waiting and not hand:
            return
        in_table = sorted({c.stream for c in waiting if c.kind in (HANDWRITTEN, STOPPED)})
        items, first, second = await asyncio.gather(
            self.read_items(in_table),
            asyncio.to_thread(upstream_connections, self.upstream) if hand
            else _none(),
            asyncio.to_thread(upstream_connections, self.moved_to)
            if any(c.kind == URL for c in waiting) else _none())
        now = time.monotonic()
        self.polls += 1
        settle(waiting + hand, items, first, second, now)

    async def read_items(self, streams: list[str]) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for lo in range(0, len(streams), 100):
            keys = [codec.key(sid) for sid in streams[lo:lo + 100]]
            resp = await self.client.batch_get_item(RequestItems={self.table: {
                "Keys": keys, "ConsistentRead": True,
                "ProjectionExpression": "#pk, #seq, #exp",
                "ExpressionAttributeNames": {"#pk": codec.PK, "#seq": codec.LAST_SEQ,
                                             "#exp": codec.LEASE_EXPIRES}}})
            for item in resp.get("Responses", {}).get(self.table, []):
                sid = item[codec.PK]["S"].removeprefix("CONN#")
                found[sid] = {name: int(item[name]["N"]) for name in
                              (codec.LAST_SEQ, codec.LEASE_EXPIRES) if name in item}
        return found


async def _none() -> None:
    return None


def settle(changes: Sequence[Change], items: dict[str, dict[str, Any]],
           first: dict[str, int] | None, second: dict[str, int] | None, now: float) -> None:
    """Mark the changes ``items`` (stream -> ``last_seq``/``lease_expires_at_ms`` as read)
    and the upstreams' connections (``first``: where hand-written items point, ``second``:
    where URL changes point; None: not read) show acted on, at ``now``."""
    for c in changes:
        item = items.get(c.stream)
        if c.kind == HANDWRITTEN:
            if c.connected_s is None and first is not None and first.get(c.stream, 0) > 0:
                c.connected_s = now - c.sent
            if c.acted_s is None and item is not None and item.get(codec.LAST_SEQ, 0) > 0:
                c.acted_s = now - c.sent
                if c.connected_s is None:  # connected before it delivered, unseen
                    c.connected_s = c.acted_s
        elif c.kind == STOPPED:
            if c.acted_s is None and item is not None and \
                    item.get(codec.LEASE_EXPIRES) == 0:
                c.acted_s = now - c.sent
        elif c.acted_s is None and second is not None and second.get(c.stream, 0) > 0:
            c.acted_s = now - c.sent


def times(changes: Sequence[Change], kind: str, attr: str = "acted_s") -> dict[str, Any]:
    """p50/p99/max of one kind's times (seconds), how many were timed, and the streams of
    those never acted on. A change never acted on ranks above every timed one: a percentile
    that falls on one is None (longer than the wait), never the best of the rest."""
    mine = [c for c in changes if c.kind == kind]
    found = [v for c in mine if (v := getattr(c, attr)) is not None]
    unacted = sorted(c.stream for c in mine if getattr(c, attr) is None)
    ranked = found + [math.inf] * len(unacted)

    def rank(p: float) -> float | None:
        value = pct(ranked, p)
        return None if value is None or math.isinf(value) else value

    return {"p50": rank(50), "p99": rank(99),
            "max": round(max(found), 3) if found and not unacted else None,
            "samples": len(found), "unacted": unacted}


def stream_reads(before: collections.Counter[Key], after: collections.Counter[Key],
                 table: str, caller: str = WORKER_ACCESS_KEY) -> dict[str, int]:
    """Read requests ``caller`` sent to ``table`` and its indexes between two counts, by
    ``operation streams[/index]`` (``streams`` standing for the table's name)."""
    out: dict[str, int] = {}
    for key, count in after.items():
        who, op, where = key
        if who != caller or op not in READ_OPERATIONS:
            continue
        if where != table and not where.startswith(table + "/"):
            continue
        delta = count - before.get(key, 0)
        if delta:
            out[f"{op} streams{where[len(table):]}"] = delta
    return dict(sorted(out.items()))


def worker_reads(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
                 names: Sequence[str]) -> dict[str, int]:
    """Read requests the workers ``names`` counted themselves (every table), by operation."""
    found = by_operation(before, after, names)
    return {op: int(found[op]) for op in WORKER_READS if found.get(op)}


# -- one mode -----------------------------------------------------------------------------


@dataclass
class Run:
    """One mode's fleet, its second upstream, the watch and the changes written."""

    fleet: Fleet
    moved_to: str  # the second upstream's ws:// base
    watch: Watch
    serial: int = 0
    write_failures: list[str] = field(default_factory=list)

    def new_stream(self) -> str:
        self.serial += 1
        sid = f"h{self.serial:03d}"
        self.fleet.ids.append(sid)  # audited with the others
        return sid

    async def write(self, kind: str, sid: str) -> Change | None:
        store = self.fleet.store
        assert store is not None
        sent = time.monotonic()
        try:
            if kind == HANDWRITTEN:
                # As an operator writes one by hand: no lease fields at all.
                await store.put_item({**codec.key(sid),
                                      codec.DESIRED_STATE: {"S": "STARTED"},
                                      codec.WS_URL: {"S": self.url(self.fleet.upstream_url,
                                                                   sid)}})
            elif kind == STOPPED:
                await store.set_state(sid, "STOPPED")
            else:
                await store.put_started(sid, self.url(self.moved_to, sid))
        except Exception as exc:
            self.write_failures.append(f"{kind} {sid}: {type(exc).__name__}: {exc}")
            return None
        change = Change(kind, sid, sent, sent_wall=time.time() - (time.monotonic() - sent))
        self.watch.changes.append(change)
        return change

    def url(self, upstream: str, sid: str) -> str:
        return f"{upstream}/{self.fleet.feed}/{sid}"

    async def schedule(self, plan: Sequence[tuple[str, str]], span_s: float,
                       halfway: Callable[[], Awaitable[None]] | None = None) -> list[Change]:
        """Write ``plan``'s (kind, stream) evenly over ``span_s``; ``halfway`` runs before
        the middle write."""
        written: list[Change] = []
        every = span_s / max(1, len(plan) - 1)
        start = time.monotonic()
        for i, (kind, sid) in enumerate(plan):
            await asyncio.sleep(max(0.0, start + i * every - time.monotonic()))
            if halfway is not None and i == len(plan) // 2:
                await halfway()
            change = await self.write(kind, sid)
            if change is not None:
                written.append(change)
        return written

    async def wait_acted(self, changes: Sequence[Change], timeout: float,
                         tick: Callable[[], None] | None = None) -> float:
        """Until every change of ``changes`` is acted on, or ``timeout``; seconds waited."""
        started = time.monotonic()
        while self.watch.pending(changes) and time.monotonic() - started < timeout:
            if tick is not None:
                tick()
            await asyncio.sleep(0.25)
        return time.monotonic() - started

    def held_streams(self, workers: Sequence[str], exclude: set[str]) -> list[str]:
        """Streams ``workers`` held at the last table read (STARTED), but ``exclude``."""
        out = []
        for name in workers:
            out += [s for s in self.fleet.held_by(name)[0]
                    if s not in exclude and self.fleet.records[s].desired_state == "STARTED"]
        return sorted(out)


async def measure_mode(ctx: Context, mode: str) -> dict[str, Any]:
    """One mode's figures (see the module doc)."""
    args = ctx.args
    n = args.change_feed_changes
    section: dict[str, Any] = {
        "mode": mode, "feed_variable": f"{FEED_VARIABLE}={mode}", "settings": "defaults",
        "workers": WORKERS, "streams_seeded": STREAMS, "changes_per_kind": n, "rate": RATE,
        "index_lag_ms": args.change_feed_index_lag_ms,
        "index_lag_jitter_ms": INDEX_LAG_JITTER_MS, "poll_s": POLL_S,
    }
    moved = Server("upstream", "--port", "0", "--streams", "0", "--rate", repr(RATE),
                   "--initial-backlog", str(BACKLOG))
    try:
        async with ctx.fleet(f"change_feed_{mode}", streams=STREAMS, rate=RATE,
                             worker_env={FEED_VARIABLE: mode}, sample_s=0.5,
                             store_args=dynamodb_args(
                                 index_lag_ms=args.change_feed_index_lag_ms,
                                 index_lag_jitter_ms=INDEX_LAG_JITTER_MS),
                             upstream_args=("--initial-backlog", str(BACKLOG)),
                             watch_upstream=False, count_requests=True) as fleet, \
                aioboto3.Session().client("dynamodb", region_name=os.environ.get(  # its region
                    "AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")) as client:
            watch = Watch(client, fleet.table, fleet.upstream_url, moved.url)
            run = Run(fleet, moved.url, watch)
            watcher = asyncio.ensure_future(watch.run())
            try:
                await _phases(run, section, n, args.change_feed_quiet_s)
            finally:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            section["watch"] = {"polls": watch.polls, "failed_polls": watch.errors}
            section["write_failures"] = run.write_failures
            fleet.scrape_all()
            everyone = fleet.everyone()
            section["feed_records"] = by_label(everyone, "streamlease_change_feed_records_total",
                                               "action")
            section["feed_errors"] = by_label(everyone, "streamlease_change_feed_errors_total",
                                              "kind")
            section["feed_active"] = bool(section["feed_records"])
            section["log_events"] = fleet.log_events()
            section["worker_exits"] = fleet.exits
            await fleet.stop_all()
            section.update(await fleet.audit(only_delivered=True))
    finally:
        moved.stop()
    return section


async def _phases(run: Run, section: dict[str, Any], n: int, quiet_s: float) -> None:
    fleet = run.fleet
    for _ in range(WORKERS):
        fleet.start_worker()
    held = await fleet.wait_until(lambda: fleet.held_total() >= STREAMS, ALL_HELD_TIMEOUT_S)
    section["all_held_s"] = None if held is None else round(held, 2)
    print(f"change_feed {section['mode']}: {STREAMS} streams held after "
          f"{section['all_held_s']} s", flush=True)

    # 1. N of each kind, interleaved.
    await fleet.read_table()
    held_now = run.held_streams(sorted(fleet.workers), set())
    picked = fleet.rng.sample(held_now, k=min(2 * n, len(held_now)))
    stop, move = picked[:len(picked) // 2], picked[len(picked) // 2:]
    plan: list[tuple[str, str]] = []
    for i in range(n):
        plan.append((HANDWRITTEN, run.new_stream()))
        if i < len(stop):
            plan.append((STOPPED, stop[i]))
        if i < len(move):
            plan.append((URL, move[i]))
    begun = fleet.now()
    changes = await run.schedule(plan, SPREAD_S)
    waited = await run.wait_acted(changes, CHANGE_WAIT_S)
    # Each change, to line up with the worker logs (their ``ts`` is wall-clock time).
    (fleet.log_dir / "changes.json").write_text(json.dumps(
        [{"kind": c.kind, "stream": c.stream, "sent_at": c.sent_wall, "acted_s": c.acted_s,
          "connected_s": c.connected_s} for c in changes], indent=1))
    section["changes_s"] = round(fleet.now() - begun, 1)
    section["changes_waited_after_last_write_s"] = round(waited, 1)
    for kind in KINDS:
        section[kind] = times(changes, kind)
    section["handwritten_connected"] = times(changes, HANDWRITTEN, "connected_s")
    for kind in KINDS:
        section[f"{kind}_p99"] = section[kind]["p99"]
    print(f"change_feed {section['mode']}: hand-written p99 {section['handwritten_p99']} s, "
          f"STOPPED p99 {section['stopped_p99']} s, URL change p99 "
          f"{section['url_change_p99']} s", flush=True)

    # 2. The quiet window.
    section["quiet"] = await _quiet_window(run, quiet_s)
    section["reads_per_stream_minute"] = section["quiet"]["reads_per_stream_minute"]
    print(f"change_feed {section['mode']}: {section['reads_per_stream_minute']} streams-table "
          f"reads per held stream-minute", flush=True)

    # 3. The leader killed while changes are written.
    section["leader_kill"] = await _kill_leader(run)
    section["lost_changes"] = section["leader_kill"]["lost_changes"]
    print(f"change_feed {section['mode']}: {section['lost_changes']} changes lost across "
          f"the leader's kill", flush=True)


async def _quiet_window(run: Run, quiet_s: float) -> dict[str, Any]:
    fleet = run.fleet
    # No tenure begun for SETTLED_S, first ones included: a stream taken in the changes
    # phase starts a minimum hold, and the balance move it defers would land in the window.
    settled = await fleet.wait_until(
        lambda: fleet.tenures_begun(fleet.now() - SETTLED_S) == 0, SETTLE_TIMEOUT_S)
    out: dict[str, Any] = {"settled_after_s": None if settled is None else round(settled, 1),
                           "window_s": quiet_s}
    before_counts = fleet.request_counts()
    before = fleet.snapshot()
    start = fleet.now()
    mean_held = await fleet.mean_held(quiet_s)
    after_counts = fleet.request_counts()
    after = fleet.snapshot()
    end = fleet.now()
    names = [name for name in before if name in after]
    stream_minutes = mean_held * (end - start) / 60
    out.update(window_measured_s=round(end - start, 1), held_streams=round(mean_held, 1),
               stream_minutes=round(stream_minutes, 2),
               moves_in_window=fleet.moves(start, end))
    mine = worker_reads(before, after, names)
    out["worker_counted_reads_all_tables"] = mine
    out["reads_per_stream_minute_all_tables"] = \
        round(sum(mine.values()) / stream_minutes, 4) if stream_minutes else None
    if before_counts is None or after_counts is None:
        out["reads_per_stream_minute"] = None
        out["counted"] = "the server's request counts were not available: see " \
                         "reads_per_stream_minute_all_tables (every table)"
        return out
    reads = stream_reads(before_counts, after_counts, fleet.table)
    out["streams_table_reads"] = reads
    out["reads_per_stream_minute"] = \
        round(sum(reads.values()) / stream_minutes, 4) if stream_minutes else None
    out["counted"] = ("at the embedded server: the workers' GetItem, BatchGetItem, Query and "
                      "Scan requests to the streams table and its indexes (the workers' own "
                      "counter has no table label)")
    return out


async def _kill_leader(run: Run) -> dict[str, Any]:
    fleet = run.fleet
    out: dict[str, Any] = {"changes": KILL_CHANGES, "span_s": KILL_SPAN_S,
                           "recovery_bound_s": RECOVERY_S}
    found = await LeaderWatch(fleet).wait(timeout=30.0)
    if found is None:
        out.update(error="no worker said it leads within 30 s", lost_changes=None)
        return out
    leader = found[0]
    await fleet.read_table()
    survivors = [name for name in sorted(fleet.workers) if name != leader]
    # Any stream a survivor holds and serves (a URL change or a hand-written item of the
    # first phase included), but one with a change still pending.
    candidates = run.held_streams(survivors, {c.stream for c in run.watch.pending()})
    flips = fleet.rng.sample(candidates, k=min(KILL_CHANGES // 2, len(candidates)))
    plan: list[tuple[str, str]] = []
    for i in range(KILL_CHANGES):
        if i % 2 == 1 and flips:
            plan.append((STOPPED, flips.pop()))
        else:
            plan.append((HANDWRITTEN, run.new_stream()))
    killed: dict[str, float] = {}

    async def kill() -> None:
        fleet.kill9(leader)
        killed["at"] = fleet.now()

    changes = await run.schedule(plan, KILL_SPAN_S, halfway=kill)
    new_leader: dict[str, Any] = {}

    def note_leader() -> None:
        if new_leader or "at" not in killed:
            return
        for w in fleet.workers.values():
            if w.metrics.get("streamlease_is_leader") == 1:
                new_leader.update(worker=w.name, after_kill_s=round(fleet.now() - killed["at"],
                                                                    1))
    waited = await run.wait_acted(changes, RECOVERY_S, tick=note_leader)
    note_leader()
    lost, no_room = await _lost_or_waiting_for_room(run, run.watch.pending(changes))
    out.update(
        leader=leader, killed_at_s=round(killed.get("at", math.nan), 1),
        new_leader=new_leader or None, written=len(changes),
        by_kind={kind: sum(1 for c in changes if c.kind == kind) for kind in KINDS
                 if any(c.kind == kind for c in changes)},
        waited_after_last_write_s=round(waited, 1),
        acted={kind: times(changes, kind) for kind in (HANDWRITTEN, STOPPED)},
        lost_changes=len(lost), lost=[f"{c.kind} {c.stream}" for c in lost],
        waiting_for_room=[f"{c.kind} {c.stream}" for c in no_room])
    return out


async def _lost_or_waiting_for_room(run: Run, pending: list[Change]
                                    ) -> tuple[list[Change], list[Change]]:
    """``split_for_room`` on the table as it is now."""
    fleet = run.fleet
    await fleet.read_table()
    live = [w.name for w in fleet.workers.values() if w.alive()]
    return split_for_room(pending, fleet.records, live, time.time_ns() // 1_000_000,
                          DEFAULT_MAX_STREAMS)


def split_for_room(pending: list[Change], records: dict[str, StreamRecord],
                   live: Sequence[str], now_ms: int, max_streams: int
                   ) -> tuple[list[Change], list[Change]]:
    """Of the changes not acted on, those lost, and the hand-written items the feed did
    stamp (``lease_expires_at_ms`` 0: offered, in the orphan index) while every live worker
    holds its ``max_streams``: the survivors of the kill have no room for all the dead
    leader's streams at defaults (80 a worker, 100 at most), and a new item waits for room
    with the dead leader's own orphans. That is capacity, not a lost change."""
    held = collections.Counter(r.lease_owner for r in records.values()
                               if r.lease_owner and (r.lease_expires_at_ms or 0) > now_ms)
    full = bool(live) and all(held[name] >= max_streams for name in live)
    waiting = [c for c in pending if full and c.kind == HANDWRITTEN and c.stream in records
               and records[c.stream].lease_expires_at_ms == 0]
    return [c for c in pending if c not in waiting], waiting


# -- the scenario -------------------------------------------------------------------------

async def run_change_feed(ctx: Context) -> dict[str, Any]:
    """Every mode of ``--change-feed-modes`` (default: on, then off) on a fleet of its own;
    the on-mode section is ``change_feed``, the off-mode one ``change_feed.off``."""
    section: dict[str, Any] = {}
    errors = []
    for mode in ctx.args.change_feed_modes:
        print(f"change_feed: {FEED_VARIABLE}={mode}", flush=True)
        found = await measure_mode(ctx, mode)
        if mode == "on":
            section.update(found)
        else:
            section[mode] = found
        error = (found.get("leader_kill") or {}).get("error")
        if found.get("all_held_s") is None:
            error = f"not every stream was held within {ALL_HELD_TIMEOUT_S:g} s"
        if error:
            errors.append(f"{mode}: {error}")
    result: dict[str, Any] = {"change_feed": section}
    if errors:
        result["error"] = "; ".join(errors)
    return result


def parse_modes(text: str) -> list[str]:
    return choose_names(text, MODES, "change feed mode")


def add_arguments(g: argparse._ArgumentGroup) -> None:
    g.add_argument("--change-feed-modes", type=parse_modes,
                   default=list(MODES),
                   help="STREAMLEASE_CHANGE_FEED values the change_feed scenario runs, a "
                        "fleet each, comma-separated from on, off, or 'all' (the default: "
                        "on, then off)")
    g.add_argument("--change-feed-changes", type=int, default=CHANGES,
                   help="changes of each kind in change_feed (default "
                        f"{CHANGES})")
    g.add_argument("--change-feed-quiet-s", type=float, default=QUIET_S,
                   help="change_feed's quiet window (default "
                        f"{QUIET_S:g} s)")
    g.add_argument("--change-feed-index-lag-ms", type=float,
                   default=INDEX_LAG_MS,
                   help="change_feed: index reads this far behind the table, plus up to "
                        f"{INDEX_LAG_JITTER_MS:g} ms (default "
                        f"{INDEX_LAG_MS:g})")
