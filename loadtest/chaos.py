"""The load and chaos benchmark: failover, loss, cost and throughput, in one command.

    make loadtest                      # the small default profile, a few minutes
    make loadtest ARGS="--profile large"
    python -m loadtest.chaos --help

It starts a DynamoDB-compatible server (the embedded ``streamlease dev dynamodb``, or
the endpoint the standard AWS variables name with ``--dynamodb env``), the reference
upstream with S streams at R messages/s, and W worker processes; then runs a chaos
schedule — kill -9, a rolling SIGTERM deploy, SIGSTOP past the lease then SIGCONT, and
upstream connection drops — while sampling who owns what. At the end it audits the
sink and measures throughput and per-stream cost in separate phases. It writes
``loadtest/results/latest.{json,md,png}`` (plus timestamped copies) and exits non-zero
only if a correctness figure (lost, duplicated, out of order, stale writes accepted,
fleet-caused gaps) is not zero. It asserts no times: it reports them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.common import Server
from loadtest.report import write_reports
from loadtest.throughput import measure_throughput
from worker.dev import local_aws_env
from worker.dev.upstream import frame_for
from worker.store.dynamodb import DynamoAdmin, connect_admin

RESULTS = Path(__file__).resolve().parent / "results"

PROFILES: dict[str, dict[str, Any]] = {
    # Sized under the embedded DynamoDB's ~250 writes/s: 24 streams x (2 renewals + ~2
    # sink transactions) a second, plus queries, is about 110 requests/s.
    "small": {"streams": 24, "rate": 20.0, "workers": 3, "lease": 2.0, "heartbeat": 0.5,
              "reconcile": 0.5, "skew": 0.3, "settle": 8.0, "gap": 6.0, "rounds": 2},
    # For real DynamoDB (or a patient run on the embedded one).
    "large": {"streams": 200, "rate": 10.0, "workers": 6, "lease": 6.0, "heartbeat": 1.5,
              "reconcile": 1.5, "skew": 0.5, "settle": 20.0, "gap": 15.0, "rounds": 3},
}


@dataclass
class WorkerProc:
    name: str
    popen: subprocess.Popen[bytes]
    port: int
    metrics: dict[str, float] = field(default_factory=dict)  # last scrape
    paused: bool = False  # SIGSTOPped: its HTTP endpoint cannot answer

    def scrape(self) -> None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                        timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            return
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    continue
        self.metrics = out


@dataclass
class Fault:
    kind: str  # kill9 | sigterm | pause | drop
    at: float  # seconds since the run began
    worker: str | None
    streams: list[str]  # held by the victim at the fault
    before: dict[str, int]  # their last_seq at the fault
    recovered: dict[str, float] = field(default_factory=dict)  # stream -> seconds


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.profile = dict(PROFILES[args.profile])
        for key in ("streams", "rate", "workers"):
            if getattr(args, key) is not None:
                self.profile[key] = getattr(args, key)
        self.rng = random.Random(args.seed)
        suffix = uuid.uuid4().hex[:8]
        self.table, self.events = f"chaos-s-{suffix}", f"chaos-e-{suffix}"
        self.fleet = f"chaos-f-{suffix}"
        self.workers: dict[str, WorkerProc] = {}
        self.retired: list[WorkerProc] = []
        self.counter = 0
        self.t0 = time.monotonic()
        self.timeline: list[tuple[float, dict[str, int]]] = []
        self.faults: list[Fault] = []
        self.servers: list[Server] = []
        self.upstream_url = ""
        self.env: dict[str, str] = dict(os.environ)
        self.store: DynamoAdmin | None = None
        self.records: dict[str, Any] = {}
        self.store_limited = False

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- processes -------------------------------------------------------------------------

    def start_servers(self) -> None:
        if self.args.dynamodb == "embedded":
            ddb = Server("dynamodb", "--port", "0")
            self.servers.append(ddb)
            local = local_aws_env(ddb.url)
            self.env.update(local)
            os.environ.update(local)  # for this process's own store
        up = Server("upstream", "--port", "0", "--streams", str(self.profile["streams"]),
                    "--rate", str(self.profile["rate"]))
        self.servers.append(up)
        self.upstream_url = up.url

    def worker_env(self, name: str, port: int) -> dict[str, str]:
        p = self.profile
        return {**self.env, "STREAMLEASE_TABLE": self.table,
                "STREAMLEASE_EVENTS_TABLE": self.events, "STREAMLEASE_FLEET_TABLE": self.fleet,
                "STREAMLEASE_WORKER_ID": name,
                "STREAMLEASE_METRICS_PORT": str(port),
                "STREAMLEASE_LEASE_SECONDS": str(p["lease"]),
                "STREAMLEASE_HEARTBEAT_SECONDS": str(p["heartbeat"]),
                "STREAMLEASE_RECONCILE_SECONDS": str(p["reconcile"]),
                "STREAMLEASE_SKEW_MARGIN_SECONDS": str(p["skew"]),
                "STREAMLEASE_BATCH_MAX_SECONDS": "0.5",
                "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1:", "STREAMLEASE_LOG_LEVEL": "WARNING",
                "STREAMLEASE_SHUTDOWN_SECONDS": "10"}

    def start_worker(self) -> WorkerProc:
        self.counter += 1
        name = f"w{self.counter}"
        port = _free_port()
        popen = subprocess.Popen([sys.executable, "-m", "worker", "run"],
                                 env=self.worker_env(name, port), stderr=subprocess.DEVNULL)
        worker = WorkerProc(name, popen, port)
        self.workers[name] = worker
        return worker

    def retire(self, name: str) -> WorkerProc:
        worker = self.workers.pop(name)
        worker.scrape()
        self.retired.append(worker)
        return worker

    # -- observation -----------------------------------------------------------------------

    async def sample(self) -> None:
        """Every 0.25 s: owners and checkpoints, the timeline, and fault recovery."""
        assert self.store is not None
        while True:
            records = {r.stream_id: r for r in await self.store.list_streams()}
            now_ms = time.time_ns() // 1_000_000
            self.records = records
            owned: dict[str, int] = {}
            for r in records.values():
                if r.lease_owner and (r.lease_expires_at_ms or 0) > now_ms:
                    owned[r.lease_owner] = owned.get(r.lease_owner, 0) + 1
            t = self.now()
            self.timeline.append((t, owned))
            for fault in self.faults:
                for sid in fault.streams:
                    r = records.get(sid)
                    if sid in fault.recovered or r is None:
                        continue
                    if (r.last_seq or 0) > fault.before[sid] and r.lease_owner != fault.worker:
                        fault.recovered[sid] = t - fault.at
            # Scrape off the loop, and never a stopped worker: a blocked scrape would stall
            # the sampler and distort every time it measures.
            live = [w for w in self.workers.values() if not w.paused]
            await asyncio.gather(*(asyncio.to_thread(w.scrape) for w in live))
            await asyncio.sleep(0.25)

    def held_by(self, name: str) -> tuple[list[str], dict[str, int]]:
        now_ms = time.time_ns() // 1_000_000
        streams = [s for s, r in self.records.items()
                   if r.lease_owner == name and (r.lease_expires_at_ms or 0) > now_ms]
        return streams, {s: self.records[s].last_seq or 0 for s in streams}

    def fault(self, kind: str, worker: str | None) -> Fault:
        streams, before = self.held_by(worker) if worker else ([], {})
        f = Fault(kind, self.now(), worker, streams, before)
        self.faults.append(f)
        print(f"  {f.at:7.1f}s  {kind:<8} {worker or '-':<5} ({len(streams)} streams)",
              flush=True)
        return f

    # -- the schedule ----------------------------------------------------------------------

    async def chaos(self) -> None:
        p = self.profile
        gap = p["gap"]
        for _ in range(p["rounds"]):
            victim = self.rng.choice(sorted(self.workers))
            self.fault("kill9", victim)
            self.retire(victim).popen.kill()
            self.start_worker()
            await asyncio.sleep(gap)

            victim = self.rng.choice(sorted(self.workers))
            worker = self.workers[victim]
            self.fault("pause", victim)
            worker.paused = True
            worker.popen.send_signal(signal.SIGSTOP)
            await asyncio.sleep(p["lease"] + p["skew"] + p["reconcile"] * 2 + 1)
            worker.popen.send_signal(signal.SIGCONT)
            worker.paused = False
            await asyncio.sleep(gap)

            for sid in self.rng.sample(sorted(self.records), k=min(4, len(self.records))):
                self.fault("drop", None)
                _get(f"{self.upstream_url.replace('ws://', 'http://')}/control/drop"
                     f"?stream={sid}")
            await asyncio.sleep(gap / 2)

            # A rolling deploy: a new worker, then SIGTERM an old one, one at a time.
            for name in sorted(self.workers):
                self.start_worker()
                await asyncio.sleep(p["reconcile"] * 2)
                self.fault("sigterm", name)
                worker = self.retire(name)
                worker.popen.send_signal(signal.SIGTERM)
                await asyncio.to_thread(worker.popen.wait, 30)
                await asyncio.sleep(gap / 2)
            await asyncio.sleep(gap)

    async def main(self) -> dict[str, Any]:
        p = self.profile
        self.start_servers()
        async with connect_admin(self.table, self.events, self.fleet,
                                 connections=50) as stores:
            store = stores.admin
            self.store = store
            await store.create_tables()
            ids = [f"s{i:03d}" for i in range(1, p["streams"] + 1)]
            for sid in ids:
                await store.put_started(sid, f"{self.upstream_url}/streams/{sid}")
            for _ in range(p["workers"]):
                self.start_worker()
            print(f"profile {self.args.profile}: {p['streams']} streams x {p['rate']} msg/s, "
                  f"{p['workers']} workers, lease {p['lease']} s", flush=True)
            async with asyncio.TaskGroup() as tg:
                sampler = tg.create_task(self.sample())
                await asyncio.sleep(p["settle"])
                steady_from = self.now()
                delivered0 = sum(r.last_seq or 0 for r in self.records.values())
                await self.chaos()
                elapsed = self.now() - steady_from
                delivered = sum(r.last_seq or 0 for r in self.records.values()) - delivered0
                for w in self.workers.values():
                    w.scrape()
                sampler.cancel()
            for name in list(self.workers):
                worker = self.retire(name)
                worker.popen.send_signal(signal.SIGTERM)
                await asyncio.to_thread(worker.popen.wait, 30)
            audit = await self.audit(ids)
        throughput = await measure_throughput(self.upstream_url, self.env, self.args.quick)
        return self.summarise(audit, throughput, elapsed, delivered)

    async def audit(self, ids: list[str]) -> dict[str, int]:
        """Read the sink back: every seq once, in order, byte-identical; fences monotonic."""
        assert self.store is not None
        lost = duplicated = out_of_order = stale_accepted = gaps = mismatched = 0
        records = {r.stream_id: r for r in await self.store.list_streams()}
        for sid in ids:
            seqs: list[int] = []
            async for frame in self.store.read_events(sid):
                seqs.append(frame.seq)
                if frame.text != frame_for(sid, frame.seq):
                    mismatched += 1
            last = records[sid].last_seq or 0
            seen = set(seqs)
            duplicated += len(seqs) - len(seen)
            out_of_order += sum(1 for a, b in itertools.pairwise(seqs) if b <= a)
            missing = [s for s in range(1, last + 1) if s not in seen]
            lost += len(missing)
            gaps += sum(1 for a, b in zip(sorted(seen), sorted(seen)[1:], strict=False)
                        if b != a + 1)
            fences = await self.store.event_fences(sid)
            stale_accepted += sum(1 for a, b in itertools.pairwise(fences) if b < a)
        return {"lost": lost + mismatched, "duplicated": duplicated,
                "out_of_order": out_of_order, "stale_accepted": stale_accepted,
                "fleet_gaps": gaps, "messages_in_sink": sum(r.last_seq or 0
                                                            for r in records.values())}

    def summarise(self, audit: dict[str, int], throughput: dict[str, Any], elapsed: float,
                  delivered: int) -> dict[str, Any]:
        p = self.profile
        everyone = self.retired + list(self.workers.values())

        def total(key: str) -> float:
            return sum(w.metrics.get(key, 0.0) for w in everyone)

        failover: dict[str, dict[str, float | None]] = {}
        for kind in ("kill9", "sigterm", "pause"):
            times = [t for f in self.faults if f.kind == kind for t in f.recovered.values()]
            unrecovered = sum(len(f.streams) - len(f.recovered)
                              for f in self.faults if f.kind == kind)
            failover[kind] = {"p50": _pct(times, 50), "p99": _pct(times, 99),
                              "max": max(times) if times else None, "samples": len(times),
                              "unrecovered": unrecovered}
        stream_minutes = p["streams"] * elapsed / 60
        ops = {op: total(f'streamlease_dynamodb_requests_total{{operation="{op}",outcome="ok"}}')
               + total(f'streamlease_dynamodb_requests_total{{operation="{op}",'
                       f'outcome="condition_failed"}}')
               for op in ("update_item", "query", "scan", "transact_write_items")}
        renewals = sum(total(f'streamlease_renewals_total{{outcome="{o}"}}')
                       for o in ("renewed", "lost", "unknown", "throttled"))
        per_min = {
            "heartbeat": renewals / stream_minutes,
            "acquire_release": max(0.0, ops["update_item"] - renewals) / stream_minutes,
            "query": ops["query"] / stream_minutes,
            "sweep_scan": ops["scan"] / stream_minutes,
            "sink": ops["transact_write_items"] / stream_minutes,
        }
        cost = _cost(per_min, p, batch_s=0.5)
        # The same arithmetic at the worker's defaults: a renewal every 5 s, a flush every
        # 0.2 s, the orphan query every 5 s and the sweep every 30 s per worker (100 streams
        # a worker), acquisitions as measured.
        defaults = {"heartbeat": 12.0, "acquire_release": per_min["acquire_release"],
                    "query": 12.0 / 100, "sweep_scan": 2.0 / 100,
                    "sink": min(60 / 0.2, p["rate"] * 60)}
        cost_defaults = _cost(defaults, p, batch_s=0.2)
        ddb_rate = sum(ops.values()) / elapsed
        self.store_limited = self.args.dynamodb == "embedded" and ddb_rate > 200
        bound = {"kill9": p["lease"] + p["reconcile"] * 1.2 + p["skew"] + 1,
                 "sigterm": p["reconcile"] * 1.2 + 1}
        return {
            "profile": self.args.profile, "settings": p, "dynamodb": self.args.dynamodb,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "chaos_seconds": round(elapsed, 1),
            **{k: audit[k] for k in ("lost", "duplicated", "out_of_order", "stale_accepted")},
            "stale_rejected": int(total("streamlease_stale_writes_rejected_total")),
            "fleet_caused_gaps": audit["fleet_gaps"],
            "upstream_gaps_counted": int(total("streamlease_sequence_gaps_total")),
            "messages_in_sink": audit["messages_in_sink"],
            "msgs_per_s_during_chaos": round(delivered / elapsed, 1),
            "failover": failover,
            "failover_targets_s": bound,
            "requests_per_stream_minute": {k: round(v, 2) for k, v in per_min.items()},
            # 1.0 is one renew per held stream per heartbeat interval; above it, retries.
            "renewals_per_heartbeat_interval": round(per_min["heartbeat"] * p["heartbeat"] / 60,
                                                     3),
            "dynamodb_requests_per_s": round(ddb_rate, 1),
            "store_was_bottleneck": self.store_limited,
            "cost_per_1000_streams_month_usd": cost,
            "cost_at_defaults_usd": cost_defaults,
            **throughput,
            "faults": [{"kind": f.kind, "at": round(f.at, 2), "worker": f.worker,
                        "streams": len(f.streams), "recovered": len(f.recovered)}
                       for f in self.faults],
            "timeline": [(round(t, 2), owned) for t, owned in self.timeline],
        }

    def stop(self) -> None:
        for w in list(self.workers.values()) + self.retired:
            if w.popen.poll() is None:
                w.popen.send_signal(signal.SIGCONT)
                w.popen.kill()
                w.popen.wait(10)
        for server in reversed(self.servers):
            server.stop()


# Prices: DynamoDB on-demand, us-east-1, standard table class, from the November 2024 price
# list: $0.625 per million write request units, $0.125 per million read request units.
WRU_USD = 0.625 / 1e6
RRU_USD = 0.125 / 1e6


def _cost(per_min: dict[str, float], profile: dict[str, Any], batch_s: float) -> dict[str, Any]:
    """Implied on-demand cost of 1,000 streams for a 30-day month, with its assumptions.

    Write units per call: a renewal moves the index sort key (1 WRU on the table, 2 on the
    index: delete + put); acquire/release likewise; a sink transaction doubles its items'
    units (transactions cost 2x): the streams item (1, plus 1 on the index for last_seq)
    and one events item per ~1 KB of messages; a query reads up to 4 KB (0.5 RRU
    eventually consistent) and the sweep's scan about 0.5 RRU per 4 KB of table.
    """
    minutes = 30 * 24 * 60 * 1000  # stream-minutes per month for 1,000 streams
    msg_bytes = 60
    batch_msgs = max(1.0, profile["rate"] * batch_s)  # a flush every batch_s at this rate
    events_wru = math.ceil(batch_msgs * (msg_bytes + 8) / 1024)
    wru = {
        "heartbeat": per_min["heartbeat"] * 3,
        "acquire_release": per_min["acquire_release"] * 3,
        "sink": per_min["sink"] * 2 * (1 + 1 + events_wru),
    }
    rru = {"query": per_min["query"] * 0.5, "sweep_scan": per_min["sweep_scan"] * 0.5}
    lease_usd = (wru["heartbeat"] + wru["acquire_release"]) * minutes * WRU_USD + \
        sum(rru.values()) * minutes * RRU_USD
    sink_usd = wru["sink"] * minutes * WRU_USD
    return {"total": round(lease_usd + sink_usd, 2), "lease_overhead": round(lease_usd, 2),
            "sink": round(sink_usd, 2),
            "assumptions": "us-east-1 on-demand $0.625/M WRU, $0.125/M RRU; renew = 3 WRU "
                           "(table + index delete/put); transaction = 2x; "
                           f"{msg_bytes}-byte messages at {profile['rate']} msg/s per stream; "
                           "storage, PITR and data transfer not included"}


def _pct(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))
    return round(ordered[index], 3)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> None:
    try:
        urllib.request.urlopen(url, timeout=5).read()
    except OSError as exc:
        print(f"  control call failed: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make loadtest", description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="small")
    parser.add_argument("--streams", type=int, help="override the profile's stream count")
    parser.add_argument("--rate", type=float, help="messages/s per stream")
    parser.add_argument("--workers", type=int, help="worker processes")
    parser.add_argument("--dynamodb", choices=["embedded", "env"], default="embedded",
                        help="embedded server, or the endpoint/credentials the AWS variables name")
    parser.add_argument("--seed", type=int, default=None, help="chaos schedule seed")
    parser.add_argument("--quick", action="store_true",
                        help="shorter throughput phases (for smoke runs)")
    parser.add_argument("--out", default=str(RESULTS), help="where to write the reports")
    args = parser.parse_args(argv)
    run = Run(args)
    try:
        import uvloop
        result = uvloop.run(run.main())
    finally:
        run.stop()
    paths = write_reports(result, Path(args.out))
    bad = {k: result[k] for k in ("lost", "duplicated", "out_of_order", "stale_accepted",
                                  "fleet_caused_gaps") if result[k]}
    print(Path(paths["md"]).read_text())
    print("reports: " + ", ".join(str(v) for v in paths.values()))
    if bad:
        print(f"CORRECTNESS FAILURE: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

