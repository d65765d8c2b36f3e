"""A local fleet for the load scenarios: servers, worker processes, a sampler and an audit.

``Fleet`` starts what one scenario needs — the embedded DynamoDB (optionally slowed, see
``streamlease.dev.dynamodb``; optionally counting requests by table,
``loadtest.request_count``) or the endpoint the AWS variables name, the reference upstream,
fresh tables with S streams, and worker processes (optionally under ``faketime``) — and
watches them from the outside only: the streams table, each worker's ``/metrics``, the
upstream's ``/stats``. Scenarios drive it and turn what it saw into figures.

What the sampler records, every ``sample_s``:

* **who holds what**: a stream is held by ``lease_owner`` while its stored lease has not
  expired (on this machine's clock). The timeline keeps the count per worker.
* **acquisitions**: a stream seen held under a fence it was not held under before is a
  new tenure. The first is its first owner; every later one is a *move* (whoever the
  new holder is: a worker that lost and retook its own stream interrupted it too).
  ``fence_bumps`` (final fence minus the first fence seen held) counts the same from the
  table alone, so a tenure shorter than one sample cannot hide: equal figures mean none
  was missed (a release on a dead member's behalf also bumps the fence).
* **fault recovery**, per stream of the victim: "delivered" (its checkpoint passed the
  one at the fault, under another holder: the stream delivers again elsewhere) or
  "connected" (the upstream shows a connection again: for idle streams, where delivery
  cannot be observed; a killed worker's sockets close with it, so only a new holder can
  connect). A SIGTERM'd worker's stream handed live to a peer (make before break,
  ``streamlease.core.handover``) is delivered by its old holder until the take: its
  hand-off is timed from the take (the taker's ``handover.taken``), or from the send of the
  first message the taker wrote when the upstream produced it after the take, to the
  taker's first write (the events table's ``at_ms``), once the run is audited
  (``measure_handoffs``); the time from the signal stays in ``from_signal``.
* **exits**: a worker that exits while not being stopped is recorded, never fatal.
* **owned streams** (``owned_history``, when the timeline comes from the table): per read,
  the streams leased to a running worker, from which spells of no owner are measured.

Worker logs (JSON, INFO) go to ``.run/loadtest/<stamp>/<scenario>/``; ``log_events``
counts their warnings and errors by event name, the evidence behind a figure. Below the
fleet: what scenarios do to one, and one worker alone on fresh tables (``worker_phase``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import glob
import itertools
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest import request_count
from loadtest.common import (
    Server,
    Tables,
    death_signal,
    dynamodb_args,
    log_records,
    use_local_dynamodb,
    worker_child,
)
from loadtest.processors import RECORDING_DIR, RECORDING_SINK
from loadtest.report import worker_order
from streamlease.core.model import StreamRecord
from streamlease.dev.procs import free_port
from streamlease.dev.upstream import frame_for
from streamlease.store import codec
from streamlease.store.dynamodb import DynamoAdmin, connect_admin
from streamlease.store.protocols import AdminStore, Stores

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / ".run" / "loadtest"
REQUESTS = "streamlease_dynamodb_requests_total"  # a worker's store requests, by operation


@dataclass
class WorkerProc:
    name: str
    popen: subprocess.Popen[bytes]
    port: int
    log: Path
    skewed: str | None = None  # a faketime offset such as "-2s"
    metrics: dict[str, float] = field(default_factory=dict)  # last scrape
    paused: bool = False  # SIGSTOPped: its HTTP endpoint cannot answer

    def scrape(self) -> None:
        found = scrape_metrics(self.port)
        if found is not None:
            self.metrics = found

    def alive(self) -> bool:
        return self.popen.poll() is None

    def pause(self) -> None:
        """SIGSTOP: it holds its leases and answers nothing until ``resume``."""
        self.paused = True
        self.popen.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGCONT)
        self.paused = False

    def signal_stop(self, sig: int = signal.SIGKILL) -> None:
        """``sig`` (SIGKILL or SIGTERM), after a SIGCONT so a paused worker gets it too."""
        if self.alive():
            self.popen.send_signal(signal.SIGCONT)
            self.popen.send_signal(sig)

    async def wait(self, timeout: float) -> None:
        """Wait for the exit; SIGKILL after ``timeout``."""
        if not await asyncio.to_thread(_wait, self.popen, timeout):
            self.popen.kill()
            await asyncio.to_thread(_wait, self.popen, 10)


def scrape_metrics(port: int, timeout: float = 2.0) -> dict[str, float] | None:
    """A worker's ``/metrics`` on loopback ``port``, parsed; None if it did not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                    timeout=timeout) as resp:
            return parse_metrics(resp.read().decode())
    except OSError:
        return None


def parse_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                continue
    return out


@dataclass
class Fault:
    kind: str  # kill9 | sigterm | pause | drop
    at: float  # seconds since the fleet started
    worker: str | None
    streams: list[str]  # held by the victim at the fault
    before: dict[str, int]  # their last_seq at the fault
    recovery: str = "delivered"  # or "connected" (see the module doc)
    recovered: dict[str, float] = field(default_factory=dict)  # stream -> seconds
    released: dict[str, float] = field(default_factory=dict)  # stream -> seconds to expiry 0
    down: set[str] = field(default_factory=set)  # "connected": seen disconnected since
    fences: dict[str, int] = field(default_factory=dict)  # their fence at the fault


@dataclass
class Acquisition:
    at: float
    stream: str
    owner: str
    fence: int
    previous: str | None  # None: the stream's first owner


class Fleet:
    """One scenario's servers, tables and workers. ``async with Fleet(...) as fleet``."""

    def __init__(self, scenario: str, *, streams: int, rate: float,
                 worker_env: dict[str, str], dynamodb: str = "embedded",
                 store_args: list[str] | None = None, sample_s: float = 0.25,
                 table_s: float | None = None, watch_upstream: bool = False,
                 log_root: Path | None = None, seed: int | None = None,
                 stream_ids: list[str] | None = None, feed: str = "streams",
                 profile: str | None = None, upstream_args: tuple[str, ...] = (),
                 count_requests: bool = False, log_level: str = "INFO") -> None:
        # `streamlease dev dynamodb`'s arguments (``loadtest.common.dynamodb_args``).
        self.store_args = store_args or dynamodb_args()
        self.log_level = log_level  # the workers' STREAMLEASE_LOG_LEVEL
        # Each stream is the upstream's ``/<feed>/<id>`` (the test feeds of
        # streamlease.dev.upstream), its item naming ``profile`` when given.
        self.feed = feed
        self.profile = profile
        self.upstream_args = upstream_args
        # The embedded server counts requests by caller, operation and table
        # (``loadtest.request_count``); the workers sign with a key of their own.
        self.count_requests = count_requests and dynamodb == "embedded"
        self.dynamodb_url = ""
        self.streams = streams
        self.rate = rate
        self.base_worker_env = worker_env
        self.dynamodb = dynamodb
        self.sample_s = sample_s
        # Reading the whole table is one Scan: cheap for tens of streams, about a second
        # of the embedded server's (serialised) time for 2,000. With ``table_s`` above
        # ``sample_s`` the timeline comes from the workers' leases_held gauges instead.
        self.table_s = sample_s if table_s is None else table_s
        self.timeline_from_table = self.table_s <= sample_s
        self.watch_upstream = watch_upstream
        self.rng = random.Random(seed)
        width = max(3, len(str(streams)))
        self.ids = stream_ids or [f"s{i:0{width}d}" for i in range(1, streams + 1)]
        self.tables = Tables.fresh("lt")
        self.table, self.events = self.tables.streams, self.tables.events
        self.fleet_table = self.tables.fleet
        self.log_dir = (log_root or LOGS / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())) \
            / scenario
        self.workers: dict[str, WorkerProc] = {}
        self.retired: list[WorkerProc] = []
        self.exits: list[dict[str, Any]] = []  # workers that exited on their own
        self.counter = 0
        self.t0 = time.monotonic()
        self.timeline: list[tuple[float, dict[str, int]]] = []
        self.faults: list[Fault] = []
        # (fault, stream) -> seconds from the take (or the first message's send, if later) to
        # the taker's first write, for streams a SIGTERM'd worker handed live
        # (``measure_handoffs``; None: not measured yet)
        self._handed: dict[tuple[int, str], float] | None = None
        self.events_log: list[tuple[float, str]] = []  # (t, label) for charts
        self.acquisitions: list[Acquisition] = []
        self.servers: list[Server] = []
        self.upstream_url = ""
        self.env: dict[str, str] = dict(os.environ)
        self.store: DynamoAdmin | None = None
        self._table_lock = asyncio.Lock()
        self.stores: Stores | None = None
        self.records: dict[str, StreamRecord] = {}
        self.connections: dict[str, int] = {}  # upstream /stats, when watched
        self.samples = 0
        self.stopped_at: float | None = None
        self.live: list[tuple[float, int]] = []  # (t, live workers)
        # Per table read (when the timeline comes from the table): the streams leased to a
        # running worker, for unowned spans (``loadtest.balance_scenario.unowned_spans``).
        self.owned_history: list[tuple[float, frozenset[str]]] = []
        self._table_read_at = float("-inf")
        self._held: dict[str, tuple[str, int]] = {}  # stream -> (owner, fence) last seen held
        self._first_fence: dict[str, int] = {}
        # Leased to a live worker but not served: per stream, (last_seq, when it last
        # moved) and when its current tenure was first seen; the longest such spell.
        self._progress: dict[str, tuple[int, float]] = {}
        self._tenure_from: dict[str, float] = {}
        self.unserved_max_s = 0.0
        self.unserved_worst: dict[str, Any] = {}
        self._admin_cm: Any = None
        self._sampler: asyncio.Task[None] | None = None

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> Fleet:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _start(self) -> None:
        if self.dynamodb == "embedded":
            ddb = Server(*self.store_args, command=request_count.COMMAND) \
                if self.count_requests else Server(*self.store_args)
            self.servers.append(ddb)
            self.dynamodb_url = ddb.url
            self.env.update(use_local_dynamodb(ddb.url))  # and this process's own store
            if self.count_requests:
                self.env["AWS_ACCESS_KEY_ID"] = request_count.WORKER_ACCESS_KEY
        up = Server("upstream", "--port", "0", "--streams", "0", "--rate", repr(self.rate),
                    *self.upstream_args)
        self.servers.append(up)
        self.upstream_url = up.url
        self._admin_cm = connect_admin(self.table, self.events, self.fleet_table,
                                       connections=50)
        stores = await self._admin_cm.__aenter__()
        self.stores = stores
        self.store = stores.admin
        assert self.store is not None
        await self.store.create_tables()
        gate = asyncio.Semaphore(16)

        async def put(sid: str) -> None:
            assert self.store is not None
            async with gate:
                await self.store.put_started(sid, f"{self.upstream_url}/{self.feed}/{sid}",
                                             self.profile)

        await asyncio.gather(*(put(sid) for sid in self.ids))
        self.t0 = time.monotonic()
        self._sampler = asyncio.ensure_future(self._sample_loop())

    async def close(self) -> None:
        """Workers first, then the servers; the servers stop even if this is cut short (a
        cancellation: the load test was asked to stop)."""
        try:
            if self._sampler is not None:
                self._sampler.cancel()
                await asyncio.gather(self._sampler, return_exceptions=True)
                self._sampler = None
            for w in list(self.workers.values()) + self.retired:
                if w.alive():
                    w.signal_stop()
                    await asyncio.to_thread(_wait, w.popen, 10)
            if self._admin_cm is not None:
                admin, self._admin_cm = self._admin_cm, None
                await admin.__aexit__(None, None, None)
        finally:
            for w in list(self.workers.values()) + self.retired:
                if w.alive():
                    w.signal_stop()
                    _wait(w.popen, 10)
            servers, self.servers = self.servers, []
            for server in reversed(servers):
                server.stop()

    # -- workers ----------------------------------------------------------------------------

    def worker_env(self, name: str, port: int, extra: dict[str, str] | None) -> dict[str, str]:
        return {**self.env, **self.tables.env(),
                "STREAMLEASE_WORKER_ID": name, "STREAMLEASE_METRICS_PORT": str(port),
                "STREAMLEASE_METRICS_ADDRESS": "127.0.0.1",
                "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1:",
                "STREAMLEASE_LOG_LEVEL": self.log_level,
                **self.base_worker_env, **(extra or {})}

    def start_worker(self, *, skew: str | None = None,
                     extra: dict[str, str] | None = None) -> WorkerProc:
        """A new worker ``wN``; ``skew`` (e.g. ``-2s``) offsets its wall clock with
        libfaketime, its monotonic clock left alone (see ``loadtest.skew_scenario.run_skew``)."""
        self.counter += 1
        name = f"w{self.counter}"
        port = free_port()
        env = self.worker_env(name, port, extra)
        argv = [sys.executable, "-m", "streamlease", "run"]
        if skew is not None:
            # libfaketime preloaded into the worker itself, not the `faketime` wrapper,
            # which forks: a SIGTERM would stop the wrapper and orphan the worker.
            lib = faketime_library()
            if lib is None:
                raise RuntimeError("libfaketime not found (Debian package faketime)")
            preload = env.get("LD_PRELOAD")
            env.update(LD_PRELOAD=f"{lib} {preload}" if preload else lib, FAKETIME=skew,
                       **FAKETIME_ENV)
        log = self.log_dir / f"{name}.log"
        popen = worker_child(name, argv, env, log).popen
        worker = WorkerProc(name, popen, port, log, skew)
        self.workers[name] = worker
        self.events_log.append((self.now(), f"+{name}"))
        return worker

    def retire(self, name: str) -> WorkerProc:
        worker = self.workers.pop(name)
        worker.scrape()
        self.retired.append(worker)
        return worker

    def kill9(self, name: str, recovery: str = "delivered") -> Fault:
        fault = self.fault("kill9", name, recovery)
        self.retire(name).popen.kill()
        return fault

    async def sigterm(self, name: str, wait_s: float = 40.0,
                      recovery: str = "delivered") -> Fault:
        """SIGTERM and wait for the exit (its hand-off is timed from the signal). The
        table is read first: the streams timed are those the worker holds at the signal,
        not one a rebalance released since the last sample (a hand-off of its own, which
        would be timed from a signal it never saw)."""
        if self.store is not None:
            await self.read_table()
        fault = self.fault("sigterm", name, recovery)
        worker = self.retire(name)
        worker.popen.send_signal(signal.SIGTERM)
        if not await asyncio.to_thread(_wait, worker.popen, wait_s):
            print(f"  {name} did not exit {wait_s:.0f} s after SIGTERM; killing it",
                  flush=True)
            await worker.wait(0)
        return fault

    async def stop_all(self, wait_s: float = 40.0) -> None:
        """SIGTERM every worker at once and wait for them (the end of a scenario)."""
        self.stopped_at = self.now()
        workers = [self.retire(name) for name in list(self.workers)]
        for w in workers:
            w.signal_stop(signal.SIGTERM)
        for w in workers:
            await w.wait(wait_s)

    async def drop_connections(self, count: int, feed: str | None = None) -> None:
        """The upstream closes ``count`` random streams' connections (of ``feed``, a test
        feed of its own, when given)."""
        for sid in self.rng.sample(sorted(self.ids), k=min(count, len(self.ids))):
            self.fault("drop", None)
            mode = f"&mode={feed}" if feed else ""
            await asyncio.to_thread(
                get, f"{self.upstream_url.replace('ws://', 'http://')}/control/drop"
                     f"?stream={sid}{mode}")

    def fault(self, kind: str, worker: str | None, recovery: str = "delivered") -> Fault:
        streams, before = self.held_by(worker) if worker else ([], {})
        f = Fault(kind, self.now(), worker, streams, before, recovery=recovery,
                  fences={s: self.records[s].fence or 0 for s in streams})
        self.faults.append(f)
        self.events_log.append((f.at, f"{kind} {worker or ''}".strip()))
        print(f"  {f.at:7.1f}s  {kind:<8} {worker or '-':<5} ({len(streams)} streams)",
              flush=True)
        return f

    # -- observation ------------------------------------------------------------------------

    async def _sample_loop(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.sample()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a slow or failing read: note it, keep sampling
                print(f"  sampler: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            await asyncio.sleep(max(0.0, self.sample_s - (time.monotonic() - started)))

    async def sample(self) -> None:
        reads: list[Any] = []
        table_due = time.monotonic() - self._table_read_at >= self.table_s * 0.95
        if table_due:
            reads.append(self.read_table())
        if self.watch_upstream:
            reads.append(self._read_upstream())
        # Scrape off the loop, and never a stopped worker: a blocked scrape would stall
        # the sampler and distort every time it measures.
        live = [w for w in self.workers.values() if not w.paused and w.alive()]
        reads += [asyncio.to_thread(w.scrape) for w in live]
        await asyncio.gather(*reads)
        t = self.now()
        self.samples += 1
        if not self.timeline_from_table:
            owned = {w.name: int(w.metrics.get("streamlease_leases_held", 0)) for w in live}
            self.timeline.append((t, owned))
        self.live.append((t, len(self.workers)))
        for fault in self.faults:
            self._recovery(fault, self.records, t)
        self._note_exits(t)

    async def read_table(self) -> None:
        """Read every stream item: who holds what, new tenures, the timeline (one read at
        a time: the sampler's and a fault's, in the order they were read)."""
        async with self._table_lock:
            await self._read_table()

    async def _read_table(self) -> None:
        assert self.store is not None
        self._table_read_at = time.monotonic()
        records = {r.stream_id: r for r in await self.store.list_streams()}
        now_ms = time.time_ns() // 1_000_000
        t = self.now()
        self.records = records
        owned = dict.fromkeys(self.workers, 0)  # a live worker holding none shows as 0
        for sid, r in records.items():
            seq = r.last_seq or 0
            if self._progress.get(sid, (None,))[0] != seq:
                self._progress[sid] = (seq, t)
            if not (r.lease_owner and (r.lease_expires_at_ms or 0) > now_ms):
                continue
            owned[r.lease_owner] = owned.get(r.lease_owner, 0) + 1
            fence = r.fence or 0
            seen = self._held.get(sid)
            if seen is None or seen[1] != fence:
                self.acquisitions.append(Acquisition(t, sid, r.lease_owner, fence,
                                                     seen[0] if seen else None))
                self._first_fence.setdefault(sid, fence)
                self._held[sid] = (r.lease_owner, fence)
                self._tenure_from[sid] = t
            self._note_unserved(sid, r, t)
        if self.timeline_from_table:
            self.timeline.append((t, owned))
            self.owned_history.append((t, frozenset(
                sid for sid, r in records.items()
                if r.lease_owner in self.workers and (r.lease_expires_at_ms or 0) > now_ms)))

    def _note_unserved(self, sid: str, r: StreamRecord, t: float) -> None:
        """A stream leased to a live, running worker whose checkpoint has not moved since
        its tenure began or since it last moved: leased but (so far) unserved. Only
        meaningful while every stream produces messages (the chaos-style scenarios)."""
        holder = self.workers.get(r.lease_owner or "")
        if holder is None or holder.paused or not holder.alive():
            return
        since = max(self._progress[sid][1], self._tenure_from.get(sid, t))
        if t - since > self.unserved_max_s:
            self.unserved_max_s = t - since
            self.unserved_worst = {"stream": sid, "owner": r.lease_owner, "fence": r.fence,
                                   "since": round(since, 2), "at": round(t, 2)}

    async def _read_upstream(self) -> None:
        found = await asyncio.to_thread(upstream_connections, self.upstream_url)
        if found is not None:
            self.connections = found

    def _recovery(self, fault: Fault, records: dict[str, StreamRecord], t: float) -> None:
        for sid in fault.streams:
            r = records.get(sid)
            if r is None:
                continue
            if sid not in fault.released and r.lease_owner == fault.worker and \
                    r.lease_expires_at_ms == 0:
                fault.released[sid] = t - fault.at
            if sid in fault.recovered:
                continue
            if fault.recovery == "connected":
                # The victim's sockets closed with it: once the upstream has seen that, a
                # connection is a new holder's.
                if self.connections.get(sid, 0) == 0:
                    fault.down.add(sid)
                elif sid in fault.down:
                    fault.recovered[sid] = t - fault.at
            elif (r.last_seq or 0) > fault.before[sid] and r.lease_owner != fault.worker:
                fault.recovered[sid] = t - fault.at

    def _note_exits(self, t: float) -> None:
        for name, w in list(self.workers.items()):
            if w.popen.poll() is not None:
                print(f"  {t:7.1f}s  {name} exited on its own (exit {w.popen.returncode}); "
                      f"see {w.log}", flush=True)
                self.exits.append({"worker": name, "at": round(t, 2),
                                   "exit_code": w.popen.returncode, "log": str(w.log)})
                self.workers.pop(name)
                self.retired.append(w)
                self.events_log.append((t, f"exit {name}"))

    def held_by(self, name: str) -> tuple[list[str], dict[str, int]]:
        now_ms = time.time_ns() // 1_000_000
        streams = [s for s, r in self.records.items()
                   if r.lease_owner == name and (r.lease_expires_at_ms or 0) > now_ms]
        return streams, {s: self.records[s].last_seq or 0 for s in streams}

    def counts(self) -> dict[str, int]:
        """Streams held per live worker (0 for a live worker holding none), last sample
        (from the table, or from the workers' gauges when the table is read rarely)."""
        last = self.timeline[-1][1] if self.timeline else {}
        return {name: last.get(name, 0) for name in sorted(self.workers, key=worker_order)}

    def held_total(self) -> int:
        return sum(self.timeline[-1][1].values()) if self.timeline else 0

    def all_held(self) -> bool:
        return self.held_total() >= self.streams

    async def start_and_hold(self, workers: int, timeout: float = 60.0) -> float | None:
        """Start ``workers`` workers; seconds until every stream is held (None: timed out)."""
        for _ in range(workers):
            self.start_worker()
        return await self.wait_until(self.all_held, timeout)

    async def finish(self, section: dict[str, Any], only_delivered: bool = False) -> None:
        """Scrape, note what no live worker holds, stop every worker (SIGTERM), audit the
        sink into ``section``."""
        await self.read_table()
        self.scrape_all()
        section["untracked_leases"] = self.untracked()
        unheld = self.unheld()
        section["unheld_at_end_count"] = len(unheld)
        section["unheld_at_end"] = unheld[:20]
        section["faults"] = self.fault_list()
        section.update(churn_figures(self))
        await self.stop_all()
        section.update(await self.audit(only_delivered=only_delivered))

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> float | None:
        """Seconds until ``predicate`` (checked after every sample) held; None: timed out."""
        started = self.now()
        seen = self.samples
        while self.now() - started < timeout:
            if self.samples != seen:
                seen = self.samples
                if predicate():
                    return self.now() - started
            await asyncio.sleep(min(0.05, self.sample_s / 4))
        return None

    def tenures_begun(self, since: float = 0.0) -> int:
        """Tenures begun (first seen) at or after ``since``, each stream's first included."""
        return sum(1 for a in self.acquisitions if a.at >= since)

    def moves(self, since: float = 0.0, until: float = float("inf")) -> int:
        """Tenures after each stream's first, begun (first seen) in [since, until)."""
        return self.move_summary(since, until)["moves"]

    def move_summary(self, since: float = 0.0, until: float = float("inf")) -> dict[str, int]:
        moves = [a for a in self.acquisitions
                 if a.previous is not None and since <= a.at < until]
        return {"moves": len(moves),
                "to_another_worker": sum(1 for a in moves if a.owner != a.previous),
                "retaken_by_same_worker": sum(1 for a in moves if a.owner == a.previous),
                "streams_moved": len({a.stream for a in moves})}

    def checkpoints(self) -> dict[str, int]:
        """Each stream's ``last_seq`` as last read."""
        return {sid: r.last_seq or 0 for sid, r in self.records.items()}

    def stalled(self, before: dict[str, int]) -> list[str]:
        """Streams whose checkpoint has not moved since ``before``: not delivering,
        whatever the table says about who holds them."""
        now = self.checkpoints()
        return [sid for sid in self.ids if now.get(sid, 0) <= before.get(sid, 0)]

    def unheld(self) -> list[dict[str, Any]]:
        """Streams no live worker holds, as the last table read shows them: free ones
        (expiry in the past) and ones whose lease names a worker that is not running."""
        now_ms = time.time_ns() // 1_000_000
        live = set(self.workers)
        out = []
        for sid in self.ids:
            r = self.records.get(sid)
            if r is None or (r.lease_owner in live and (r.lease_expires_at_ms or 0) > now_ms):
                continue
            out.append({"stream": sid, "owner": r.lease_owner, "fence": r.fence,
                        "lease_left_s": round(((r.lease_expires_at_ms or 0) - now_ms) / 1000, 1)})
        return out

    def untracked(self) -> dict[str, int]:
        """Per live worker: streams the table says it holds beyond its own leases_held
        gauge (both as last read). A positive count is a lease the worker does not know
        it holds, e.g. an acquisition that applied although the worker saw it time out."""
        now_ms = time.time_ns() // 1_000_000
        table: dict[str, int] = {}
        for r in self.records.values():
            if r.lease_owner and (r.lease_expires_at_ms or 0) > now_ms:
                table[r.lease_owner] = table.get(r.lease_owner, 0) + 1
        out = {}
        for name, w in self.workers.items():
            gauge = w.metrics.get("streamlease_leases_held")
            if gauge is not None and table.get(name, 0) > gauge:
                out[name] = table.get(name, 0) - int(gauge)
        return out

    def fault_list(self) -> list[dict[str, Any]]:
        return [{"kind": f.kind, "at": round(f.at, 2), "worker": f.worker,
                 "streams": len(f.streams), "recovered": len(f.recovered),
                 "unrecovered": sorted(set(f.streams) - set(f.recovered))}
                for f in self.faults]

    def fence_bumps(self) -> int:
        """Final fence minus the first fence seen held, summed (see the module doc)."""
        return sum(max(0, (self.records[s].fence or 0) - f)
                   for s, f in self._first_fence.items() if s in self.records)

    # -- metrics ----------------------------------------------------------------------------

    def request_counts(self) -> collections.Counter[request_count.Key] | None:
        """The embedded server's requests so far by (caller, operation, table), when it
        counts them (``count_requests``); None otherwise or if it did not answer."""
        if not self.count_requests:
            return None
        try:
            return request_count.read_counts(self.dynamodb_url)
        except (OSError, ValueError) as exc:
            print(f"  request counts: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return None

    def everyone(self) -> list[WorkerProc]:
        return self.retired + list(self.workers.values())

    def total(self, key: str, workers: Iterable[WorkerProc] | None = None) -> float:
        return sum(w.metrics.get(key, 0.0) for w in (workers or self.everyone()))

    def scrape_all(self) -> None:
        for w in self.workers.values():
            if not w.paused and w.alive():
                w.scrape()

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Every live worker's metrics by its name, scraped now."""
        self.scrape_all()
        return {w.name: dict(w.metrics) for w in self.workers.values()}

    async def mean_held(self, seconds: float) -> float:
        """The streams held, read every second for ``seconds``: their mean."""
        start, held = self.now(), []
        while self.now() - start < seconds:
            await asyncio.sleep(min(1.0, seconds - (self.now() - start)))
            held.append(self.held_total())
        return sum(held) / len(held) if held else 0.0

    def log_events(self) -> dict[str, int]:
        """Warnings and errors in every worker's log, by event name."""
        counts: collections.Counter[str] = collections.Counter()
        for w in self.everyone():
            try:
                lines = w.log.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    if line.strip():
                        counts["(not json)"] += 1
                    continue
                if isinstance(rec, dict) and rec.get("level") in ("warning", "error", "critical"):
                    counts[str(rec.get("event"))] += 1
        return dict(sorted(counts.items()))

    def failover(self, kind: str) -> dict[str, Any]:
        faults = [f for f in self.faults if f.kind == kind]
        times = [t for f in faults for t in f.recovered.values()]
        out = {"p50": pct(times, 50), "p99": pct(times, 99),
               "max": round(max(times), 3) if times else None, "samples": len(times),
               "unrecovered": sum(len(f.streams) - len(f.recovered) for f in faults)}
        if kind != "sigterm" or self._handed is None:
            return out
        # Streams handed live: from the take to the taker's first write; the rest (released,
        # then acquired) from the signal, as measured.
        handed = [self._handed[(id(f), sid)] for f in faults for sid in f.recovered
                  if (id(f), sid) in self._handed]
        released = [t for f in faults for sid, t in f.recovered.items()
                    if (id(f), sid) not in self._handed]
        both = handed + released
        return {**out, "p50": pct(both, 50), "p99": pct(both, 99),
                "max": round(max(both), 3) if both else None,
                "handed": len(handed), "released": len(released),
                "handed_p99": pct(handed, 99), "released_p99": pct(released, 99),
                "from_signal": {"p50": out["p50"], "p99": out["p99"], "max": out["max"]}}

    async def upstream_epoch(self, readings: int = 12) -> float | None:
        """When the reference upstream's clock started (epoch ms): message ``n`` of every
        stream is produced at ``epoch + n / rate`` (``streamlease.dev.upstream``; its frames
        carry no time of their own). From ``readings`` ``/stats`` readings of the head,
        spread over a message period (``upstream_epoch_ms``); None if none answered."""
        url = self.upstream_url.replace("ws://", "http://") + "/stats"
        found = []
        for i in range(readings):
            before = time.time() * 1000
            head = await asyncio.to_thread(_stats_head, url)
            if head is not None:
                found.append((before, time.time() * 1000, head))
            await asyncio.sleep(0.013 * (i + 1))  # spread over the phases of a message period
        return upstream_epoch_ms(found, self.rate) if found else None

    async def measure_handoffs(self) -> None:
        """Time each SIGTERM'd worker's stream that a peer took live: to the first events
        item written under the taker's fence (its ``at_ms``) from the take (the taker's
        ``handover.taken``, its wall time) or, when the first message it wrote was produced
        after the take, from that message's send time (a taker cannot write a message
        before the upstream sends it: at 1 msg/s the next one may come most of a second
        after the take, and that wait is the feed's, not the hand-off's).
        ``failover("sigterm")`` reports them. Run once the sink is complete (after the final
        stop), while the upstream still answers."""
        assert self.store is not None
        takes: dict[tuple[str, int], int] = {}
        for w in self.everyone():
            for r in log_records(w.log, '"handover.taken"'):
                if r.get("event") == "handover.taken":
                    takes[(str(r["stream"]), int(r["fence"]))] = int(r["sent_ms"])
        epoch = await self.upstream_epoch() if takes and self.rate > 0 else None
        self._handed = {}
        for f in self.faults:
            if f.kind != "sigterm":
                continue
            for sid in f.streams:
                old = f.fences.get(sid, 0)
                first: dict[int, tuple[int, int]] = {}  # fence -> first write (at_ms, seq)
                async for item in self.store.event_items(sid):
                    fence, at = int(item[codec.EV_FENCE]["N"]), int(item[codec.EV_AT]["N"])
                    if fence > old and (fence not in first or at < first[fence][0]):
                        seqs = [frame.seq for frame in codec.decode_event_item(item)]
                        first[fence] = (at, min(seqs, default=0))
                if not first:
                    continue
                fence = min(first)
                taken = takes.get((sid, fence))
                if taken is None:
                    continue
                at, seq = first[fence]
                sent = None if epoch is None else epoch + seq * 1000 / self.rate
                self._handed[(id(f), sid)] = handoff_s(taken, at, sent)

    def timeline_out(self, every: int = 1) -> list[tuple[float, dict[str, int]]]:
        """The timeline up to the final stop (what follows is the audit: nothing runs)."""
        until = self.stopped_at if self.stopped_at is not None else float("inf")
        return [(round(t, 2), owned) for t, owned in self.timeline[::max(1, every)]
                if t <= until]

    # -- audit ------------------------------------------------------------------------------

    async def audit(self, only_delivered: bool = False) -> dict[str, int]:
        """Read the sink back: every seq once, in order, byte-identical; fences monotonic.
        ``only_delivered`` skips streams with no checkpoint (idle streams: nothing to read)."""
        assert self.store is not None
        lost = duplicated = out_of_order = stale_accepted = gaps = mismatched = 0
        records = {r.stream_id: r for r in await self.store.list_streams()}
        for sid in self.ids:
            last = records[sid].last_seq or 0 if sid in records else 0
            if only_delivered and not last:
                continue
            seqs: list[int] = []
            async for frame in self.store.read_events(sid):
                seqs.append(frame.seq)
                if frame.text != frame_for(sid, frame.seq):
                    mismatched += 1
            seen = set(seqs)
            duplicated += len(seqs) - len(seen)
            out_of_order += sum(1 for a, b in itertools.pairwise(seqs) if b <= a)
            lost += sum(1 for s in range(1, last + 1) if s not in seen)
            ordered = sorted(seen)
            gaps += sum(1 for a, b in itertools.pairwise(ordered) if b != a + 1)
            fences = await self.store.event_fences(sid)
            stale_accepted += sum(1 for a, b in itertools.pairwise(fences) if b < a)
        if any(f.kind == "sigterm" for f in self.faults):
            await self.measure_handoffs()
        return {"lost": lost + mismatched, "duplicated": duplicated,
                "out_of_order": out_of_order, "stale_accepted": stale_accepted,
                "fleet_caused_gaps": gaps,
                "messages_in_sink": sum(r.last_seq or 0 for r in records.values())}



def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, -(-p * len(ordered) // 100) - 1))
    return round(ordered[int(index)], 3)


# Only the wall clock is offset; see ``loadtest.skew_scenario.run_skew`` for what each does.
FAKETIME_ENV = {"FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_FORCE_MONOTONIC_FIX": "0"}


def faketime_library() -> str | None:
    """libfaketime's path (Debian's package faketime), or None."""
    for pattern in ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                    "/usr/local/lib/faketime/libfaketime.so.1"):
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def upstream_connections(upstream_url: str, timeout: float = 5.0) -> dict[str, int] | None:
    """Open connections per stream of the reference upstream at ``upstream_url`` (its
    ``ws://`` base), from its ``/stats``; None if it did not answer."""
    url = upstream_url.replace("ws://", "http://") + "/stats"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            stats = json.load(resp)
    except (OSError, ValueError):
        return None
    return {sid: int(s.get("connections", 0)) for sid, s in stats["streams"].items()}


def handoff_s(taken_ms: float, first_write_ms: float, sent_ms: float | None) -> float:
    """A live hand-off's time, in seconds: from the take, or from the send of the first
    message the taker wrote when that came later (None: not known), to that write."""
    ready = taken_ms if sent_ms is None else max(taken_ms, sent_ms)
    return round(max(0.0, first_write_ms - ready) / 1000, 3)


def upstream_epoch_ms(readings: Iterable[tuple[float, float, int]], rate: float) -> float:
    """When the upstream's clock started (epoch ms), from ``/stats`` readings (wall ms before
    the request, wall ms after, the head it answered): head ``h`` means ``h / rate`` seconds
    have passed and ``h + 1`` have not. The middle of what every reading allows."""
    step = 1000 / rate
    readings = list(readings)
    low = max(before - (head + 1) * step for before, _, head in readings)
    high = min(after - head * step for _, after, head in readings)
    return (low + high) / 2


def _stats_head(url: str) -> int | None:
    """The head a ``/stats`` answer names; None if it did not answer."""
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(json.loads(resp.read())["head"])
    except (OSError, ValueError, KeyError):
        return None


def get(url: str) -> None:
    try:
        urllib.request.urlopen(url, timeout=5).read()
    except OSError as exc:
        print(f"  control call failed: {exc}", file=sys.stderr)


def _wait(popen: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        popen.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


@dataclass
class Context:
    """A load-test run as a scenario sees it: its arguments, its profile's settings and
    where worker logs go; ``fleet`` builds a scenario's fleet with the run's options."""

    args: argparse.Namespace
    profile: dict[str, Any]
    log_root: Path

    def fleet(self, scenario: str, **kwargs: Any) -> Fleet:
        kwargs.setdefault("dynamodb", self.args.dynamodb)
        kwargs.setdefault("seed", self.args.seed)
        kwargs.setdefault("log_level", getattr(self.args, "worker_log_level", "INFO"))
        return Fleet(scenario, log_root=self.log_root, **kwargs)


# -- chaos steps ------------------------------------------------------------------------------


def victim(fleet: Fleet, exclude: str | None = None) -> str | None:
    """A random worker (but ``exclude``) that holds streams (a fault on an idle one times
    nothing); any such worker if none does."""
    holders = sorted(n for n, held in fleet.counts().items() if held and n != exclude)
    choices = holders or sorted(n for n in fleet.workers if n != exclude)
    return fleet.rng.choice(choices) if choices else None


async def kill_and_pause(fleet: Fleet, p: dict[str, Any], gap: float) -> None:
    """kill -9 of a worker holding streams (a new one replaces it), then SIGSTOP of one past
    the lease and SIGCONT, ``gap`` seconds after each."""
    name = victim(fleet)
    if name is not None:
        fleet.kill9(name)
        fleet.start_worker()
        await asyncio.sleep(gap)
    name = victim(fleet)
    if name is not None:
        fleet.fault("pause", name)
        fleet.workers[name].pause()
        await asyncio.sleep(p["lease"] + p["skew"] + p["reconcile"] * 2 + 1)
        fleet.workers[name].resume()
        await asyncio.sleep(gap)


async def rolling_restart(fleet: Fleet, p: dict[str, Any]) -> None:
    """Every worker alive now, one at a time: start a new one, then SIGTERM the old."""
    for name in sorted(fleet.workers):
        fleet.start_worker()
        await asyncio.sleep(p["reconcile"] * 2)
        if name in fleet.workers:
            await fleet.sigterm(name, wait_s=30)
        await asyncio.sleep(p["gap"] / 2)


async def short_chaos(fleet: Fleet, p: dict[str, Any], gap: float) -> None:
    """kill -9 (replaced), SIGSTOP past the lease then SIGCONT, a new worker and SIGTERM
    of an old one: each of a worker holding streams, ``gap`` seconds apart."""
    await kill_and_pause(fleet, p, gap)
    fleet.start_worker()
    await asyncio.sleep(p["reconcile"] * 2)
    name = victim(fleet, exclude=f"w{fleet.counter}")
    if name is not None:
        await fleet.sigterm(name, wait_s=30)
    await asyncio.sleep(gap)


async def short_chaos_run(fleet: Fleet, run: dict[str, Any], p: dict[str, Any],
                          label: str, drop_feed: str | None = None) -> dict[str, Any]:
    """``run["workers"]`` workers on the fleet's ``run["streams"]`` streams; once every
    stream delivers (or ``run["settle_timeout"]``), ``run["drops"]`` upstream drops of
    ``drop_feed`` if given, then ``short_chaos``; every worker stopped (SIGTERM). The
    run's figures, settled and chaos times first: the caller audits the sink after."""
    for _ in range(run["workers"]):
        fleet.start_worker()
    print(f"{label} {run['streams']} streams x {run['rate']:g} msg/s, {run['workers']} "
          "workers", flush=True)
    settled = await fleet.wait_until(
        lambda: fleet.held_total() == run["streams"]
        and all(v > 0 for v in fleet.checkpoints().values()), run["settle_timeout"])
    started = fleet.now()
    if drop_feed is not None:
        await fleet.drop_connections(run["drops"], drop_feed)
        await asyncio.sleep(run["gap"] / 2)
    await short_chaos(fleet, p, run["gap"])
    chaos_s = fleet.now() - started
    fleet.scrape_all()
    await fleet.stop_all()
    return {"settled_s": rounded(settled), "chaos_seconds": round(chaos_s, 1),
            "streams": run["streams"], "rate": run["rate"], "workers": run["workers"],
            "faults": fleet.fault_list(),
            "failover_p99_s": {k: fleet.failover(k)["p99"] for k in ("kill9", "pause",
                                                                       "sigterm")}}


async def run_each(label: str, names: Iterable[str],
                   run: Callable[[str], Awaitable[dict[str, Any]]],
                   failed_section: Callable[[str], dict[str, Any]],
                   summary: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
    """``run(name)`` for each of ``names`` (a sink, an upstream mode): its section, or
    ``failed_section(name)`` with the error that stopped it, and a line of its ``summary``
    figures each; and the names that failed."""
    sections: dict[str, Any] = {}
    failed: list[str] = []
    for name in names:
        try:
            sections[name] = await run(name)
        except Exception as exc:
            traceback.print_exc()
            failed.append(name)
            sections[name] = {**failed_section(name), "error": f"{type(exc).__name__}: {exc}"}
        s = sections[name]
        print(f"{label}: {name}: " + (s.get("skipped") or s.get("error") or ", ".join(
            f"{k} {s.get(k)}" for k in summary)), flush=True)
    return sections, failed


# -- figures from the workers' metrics --------------------------------------------------------


def metric_sum(workers: Iterable[WorkerProc], prefix: str) -> float:
    """Every series starting with ``prefix``, summed over ``workers``' last scrapes."""
    return sum(v for w in workers for k, v in w.metrics.items() if k.startswith(prefix))


def by_operation(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]],
                 names: Iterable[str], metric: str = REQUESTS) -> dict[str, float]:
    """How much ``metric`` grew between two ``Fleet.snapshot``s of the workers ``names``,
    summed by its ``operation`` label."""
    prefix = f'{metric}{{operation="'
    found: dict[str, float] = {}
    for name in names:
        for key, value in after[name].items():
            if key.startswith(prefix):
                op = key[len(prefix):].split('"', 1)[0]
                found[op] = found.get(op, 0.0) + value - before[name].get(key, 0.0)
    return found


def by_label(workers: Iterable[WorkerProc], metric: str, label: str) -> dict[str, int]:
    """A labelled counter summed over ``workers``' last scrapes, non-zero values only."""
    out: dict[str, int] = {}
    prefix = f"{metric}{{{label}=\""
    for w in workers:
        for k, v in w.metrics.items():
            if k.startswith(prefix) and v:
                value = k[len(prefix):].split('"', 1)[0]
                out[value] = out.get(value, 0) + int(v)
    return dict(sorted(out.items()))


def histogram_quantile(fleet: Fleet, name: str, q: float) -> float | str | None:
    """Upper bound of the bucket holding quantile ``q`` of a histogram summed over every
    worker (``"inf"``: beyond the largest bucket). Bucket resolution, not exact."""
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
    found = next(b for b in sorted(buckets) if buckets[b] >= q * total)
    return "inf" if found == math.inf else found


def churn_figures(fleet: Fleet) -> dict[str, Any]:
    """What the workers themselves say about lost leases and fenced members."""
    everyone = fleet.everyone()
    return {
        "leases_lost": by_label(everyone, "streamlease_lease_lost_total", "reason"),
        "leases_released_while_running": by_label(everyone,
                                                  "streamlease_lease_released_total", "reason"),
        "members_declared_dead": int(metric_sum(everyone,
                                                "streamlease_members_declared_dead_total")),
        "member_fenced": int(metric_sum(everyone, "streamlease_member_fenced_total")),
        "member_heartbeats": by_label(everyone, "streamlease_member_heartbeats_total",
                                      "outcome"),
        "member_heartbeat_p99_s_bucket": histogram_quantile(
            fleet, "streamlease_member_heartbeat_seconds", 0.99),
        "log_events": fleet.log_events(),
        "worker_exits": fleet.exits,
    }


def rounded(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def is_leader(port: int) -> bool | None:
    """What the worker's /metrics says now (None: it did not answer)."""
    found = scrape_metrics(port)
    return None if found is None else found.get("streamlease_is_leader") == 1


async def leaders_now(fleet: Fleet, exclude: Iterable[str] = ()) -> list[str]:
    """Every running, unpaused worker (but ``exclude``) whose /metrics says it leads."""
    skip = set(exclude)
    candidates = [w for name, w in fleet.workers.items()
                  if name not in skip and not w.paused and w.alive()]
    found = await asyncio.gather(*(asyncio.to_thread(is_leader, w.port) for w in candidates))
    return [w.name for w, yes in zip(candidates, found, strict=True) if yes]


@dataclass
class LeaderWatch:
    """Polls the workers' /metrics until one (not excluded) leads."""

    fleet: Fleet
    two_at_once: int = 0  # polls in which two workers said they lead

    async def wait(self, exclude: Iterable[str] = (), timeout: float = 30.0,
                   since: float | None = None) -> tuple[str, float] | None:
        """(leader, seconds since ``since`` — default: now — until its /metrics said so),
        or None after ``timeout``."""
        started = time.monotonic() if since is None else since
        exclude = set(exclude)
        while True:
            found = await leaders_now(self.fleet, exclude)
            if len(found) > 1:
                self.two_at_once += 1
            if found:
                return found[0], time.monotonic() - started
            if time.monotonic() - started > timeout:
                return None
            await asyncio.sleep(0.1)  # /metrics polled, with a deadline


# -- one worker alone -------------------------------------------------------------------------

# The no-op processor's phase: the largest batches the worker allows, cut at most once a
# second, so the checkpoint writes (one a batch) stay far below the store's limit.
PYTHON_PROCESSOR_ENV = {"STREAMLEASE_SINK": "python:loadtest.processors:make",
                        "STREAMLEASE_BATCH_MAX_MESSAGES": "1000",
                        "STREAMLEASE_BATCH_MAX_SECONDS": "1"}


def checkout_on_path(env: Mapping[str, str]) -> dict[str, str]:
    """``PYTHONPATH`` for a worker that loads a processor from this checkout (``env``'s
    own entries kept after it)."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", ""))
                                          if p)}


def python_processor_env(env: dict[str, str]) -> dict[str, str]:
    """``PYTHON_PROCESSOR_ENV``, with this checkout on the worker's ``PYTHONPATH``."""
    return {**PYTHON_PROCESSOR_ENV, **checkout_on_path(env)}


def recording_env(directory: Path) -> dict[str, str]:
    """A worker's settings to write through ``loadtest.processors:recording``
    (``RECORDING_SINK``) into ``directory``."""
    return {"STREAMLEASE_SINK": RECORDING_SINK, RECORDING_DIR: str(directory),
            **checkout_on_path(os.environ)}


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.asynccontextmanager
async def solo_worker(env: dict[str, str], upstream: str, streams: int, name: str,
                      feed: str = "streams", profile: str | None = None
                      ) -> AsyncIterator[tuple[AdminStore, asyncio.subprocess.Process]]:
    """One worker ``name`` (``env``: its settings) on ``streams`` fresh streams, the
    upstream's ``/<feed>/<id>`` (items naming ``profile`` when given): the store and the
    worker's process, stopped at the end."""
    tables = Tables.fresh(name)
    async with connect_admin(*tables) as stores:
        store = stores.admin
        await store.create_tables()
        for i in range(streams):
            await store.put_started(f"{name[0]}{i:04d}", f"{upstream}/{feed}/{name[0]}{i:04d}",
                                    profile)
        worker_env = {**env, **tables.env(),
                      "STREAMLEASE_WORKER_ID": name, "STREAMLEASE_LOG_LEVEL": "WARNING",
                      "STREAMLEASE_ACQUIRE_PER_CYCLE": str(max(10, streams))}
        worker = await asyncio.create_subprocess_exec(sys.executable, "-m", "streamlease", "run",
                                                      env=worker_env, preexec_fn=death_signal())
        try:
            yield store, worker
        finally:
            with contextlib.suppress(ProcessLookupError):
                worker.terminate()
            await worker.wait()


async def worker_phase(env: dict[str, str], upstream: str, streams: int, seconds: float,
                       feed: str = "streams", profile: str | None = None) -> dict[str, float]:
    """Run one worker (``env``: its settings) over ``streams`` fresh streams (the upstream's
    ``/<feed>/<id>``, items naming ``profile`` when given), measured once every stream
    delivers: delivered msgs/s, CPU, RSS."""
    local = {"STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1:", "STREAMLEASE_METRICS_PORT": "0"}
    async with solo_worker({**env, **local}, upstream, streams, "tp", feed,
                           profile) as (store, worker):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            records = await store.list_streams()
            if sum(1 for r in records if (r.last_seq or 0) > 0) >= streams:
                break
            await asyncio.sleep(0.5)
        start = sum(r.last_seq or 0 for r in await store.list_streams())
        cpu0, t0 = cpu_seconds(worker.pid), time.perf_counter()
        await asyncio.sleep(seconds)
        end = sum(r.last_seq or 0 for r in await store.list_streams())
        elapsed = time.perf_counter() - t0
        cpu = cpu_seconds(worker.pid) - cpu0
        rss = rss_bytes(worker.pid)
    return {"msgs_per_s": (end - start) / elapsed, "cpu_s": cpu, "messages": end - start,
            "rss": rss, "elapsed": elapsed}
