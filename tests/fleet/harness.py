"""A real fleet for tests: worker processes, the reference upstream, the embedded
DynamoDB over HTTP, signals, a holdable TCP proxy, metric scrapes and a sink audit."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from streamlease.core.model import StreamRecord
from streamlease.core.upstream import PROFILE_ATTRIBUTE
from streamlease.dev import local_aws_env
from streamlease.dev.procs import free_port
from streamlease.dev.upstream import frame_for
from streamlease.store import codec
from streamlease.store.dynamodb import connect_admin
from streamlease.store.protocols import AdminStore, Stores
from tests.procs import Proc, python

FAST_ENV = {
    "STREAMLEASE_LEASE_SECONDS": "1.0",
    "STREAMLEASE_HEARTBEAT_SECONDS": "0.25",
    "STREAMLEASE_SKEW_MARGIN_SECONDS": "0.2",
    "STREAMLEASE_SAFETY_MARGIN_SECONDS": "0.1",
    "STREAMLEASE_RECONCILE_SECONDS": "0.3",
    "STREAMLEASE_STREAM_LEASE_SECONDS": "6",
    "STREAMLEASE_STREAM_RENEW_SECONDS": "2",
    "STREAMLEASE_STREAM_CHECK_SECONDS": "0.5",
    "STREAMLEASE_MIN_HOLD_SECONDS": "1",
    "STREAMLEASE_SWEEP_SECONDS": "2",
    "STREAMLEASE_BATCH_MAX_SECONDS": "0.3",
    "STREAMLEASE_SHUTDOWN_SECONDS": "10",
    "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1:",
    "STREAMLEASE_LOG_FORMAT": "json",
}


# The embedded DynamoDB as the tests run it: index reads see the table as it was 50-150 ms
# ago (fixed part + jitter, drawn per read), as DynamoDB's global secondary indexes lag
# (typically well under a second). Longer than a test's own round trips, so a test that
# trusts an index read right after a write fails here as it would in production; a small
# fraction of the fleet timings above (lease 1 s, reconcile 0.3 s). The liveness paths are
# also tested a whole second behind (tests/fleet/test_index_lag_fleet.py, the load test's
# index_lag scenario); at 100-300 ms the scale-out test's balance converges too slowly
# for its deadlines (docs/development.md), so that lag is not the suite's default.
# STREAMLEASE_TEST_INDEX_LAG_MS / ..._JITTER_MS override it (0 and 0: no lag, to compare).
INDEX_LAG_MS = float(os.environ.get("STREAMLEASE_TEST_INDEX_LAG_MS", "50"))
INDEX_LAG_JITTER_MS = float(os.environ.get("STREAMLEASE_TEST_INDEX_LAG_JITTER_MS", "100"))


def dynamodb_server(*extra: str, name: str = "dynamodb", index_lag_ms: float = INDEX_LAG_MS,
                    index_lag_jitter_ms: float = INDEX_LAG_JITTER_MS) -> Proc:
    """``streamlease dev dynamodb`` on a free loopback port, its indexes lagging."""
    return Proc(python("-m", "streamlease", "dev", "dynamodb", "--port", "0",
                       "--index-lag-ms", repr(index_lag_ms),
                       "--index-lag-jitter-ms", repr(index_lag_jitter_ms), *extra), name=name)




async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float, what: str,
                     interval: float = 0.05) -> float:
    """Poll ``check`` until true; the seconds it took. Fails naming ``what``."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        if await check():
            return time.monotonic() - started
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(interval)


@dataclass
class Worker:
    name: str
    proc: Proc
    metrics_port: int
    served: bool = False  # it has answered a scrape

    START_S = 30.0  # a started worker listens for scrapes within this

    def metrics(self) -> dict[str, float]:
        """``name{label="v",...}`` -> value, from a real scrape of /metrics. A worker that
        has not yet answered one is waited for while it starts (importing, on a loaded
        machine, can take seconds, and its peers may meanwhile have taken every stream);
        a worker that has exited fails the scrape naming its exit code and its last log
        lines."""
        deadline = time.monotonic() + self.START_S
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                            timeout=5) as resp:
                    text = resp.read().decode()
                self.served = True
                break
            except OSError as exc:
                code = self.proc.popen.poll()
                if code is not None:
                    raise AssertionError(
                        f"worker {self.name} exited {code}; {self.tail()}") from exc
                refused = isinstance(getattr(exc, "reason", exc), ConnectionRefusedError)
                if refused and not self.served and time.monotonic() < deadline:
                    time.sleep(0.05)  # not listening yet
                    continue
                # Still running (or on its way out): its log lines say which.
                exc.add_note(f"worker {self.name} is running; {self.tail()}")
                raise
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
        return out

    def metric(self, key: str) -> float:
        return self.metrics().get(key, 0.0)

    def tail(self, lines: int = 25) -> str:
        return "its last log lines:\n" + "\n".join(self.proc.err_lines[-lines:])

    def drain(self, timeout: float = 30.0) -> None:
        """SIGTERM, then the worker must exit 0 (every lease released) within ``timeout``;
        a failure names the exit code and the worker's last log lines."""
        self.proc.popen.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)  # and the last log lines read
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker {self.name} still running {timeout} s after "
                                 f"SIGTERM; {self.tail()}") from None
        assert code == 0, f"worker {self.name} exited {code} on SIGTERM; {self.tail()}"

    def log_events(self, name: str) -> list[dict[str, object]]:
        found = []
        for line in self.proc.err_lines:
            if line.startswith("{"):
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("event") == name:
                    found.append(record)
        return found


@dataclass
class Fleet:
    dynamodb: str
    streams: int = 20
    rate: float = 10.0
    env: dict[str, str] = field(default_factory=dict)
    # The upstream path the streams are read from (a test feed's mode), the items' upstream
    # profile (None: no `profile` attribute) and extra `dev upstream` arguments (`--token`).
    mode: str = "streams"
    profile: str | None = None
    upstream_args: tuple[str, ...] = ()
    workers: dict[str, Worker] = field(default_factory=dict)
    upstream: Proc | None = None
    upstream_url: str = ""
    store: AdminStore | None = None
    stores: Stores | None = None
    _store_cm: object = None

    def __post_init__(self) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.table = f"fleet-s-{suffix}"
        self.events_table = f"fleet-e-{suffix}"
        self.fleet_table = f"fleet-f-{suffix}"
        self.stream_ids = [f"s{i:03d}" for i in range(1, self.streams + 1)]

    async def start(self, workers: int = 3) -> Fleet:
        self.upstream = Proc(python("-m", "streamlease", "dev", "upstream", "--port", "0",
                                    "--streams", str(self.streams), "--rate", str(self.rate),
                                    *self.upstream_args),
                             name="upstream")
        self.upstream_url = self.upstream.url()
        cm = connect_admin(self.table, self.events_table, self.fleet_table, connections=50)
        self._store_cm = cm
        self.stores = await cm.__aenter__()
        self.store = self.stores.admin
        await self.store.create_tables()
        for sid in self.stream_ids:
            if self.profile is None:
                await self.store.put_started(sid, self.stream_url(sid))
            else:  # `ctl start` sets no profile: the item as an operator writes it
                await self.store.put_item({
                    **codec.key(sid), codec.DESIRED_STATE: codec.s("STARTED"),
                    codec.WS_URL: codec.s(self.stream_url(sid)),
                    codec.LEASE_EXPIRES: codec.n(0), PROFILE_ATTRIBUTE: codec.s(self.profile)})
        for i in range(1, workers + 1):
            self.start_worker(f"w{i}")
        return self

    def stream_url(self, sid: str) -> str:
        return f"{self.upstream_url}/{self.mode}/{sid}"

    def start_worker(self, name: str, endpoint: str | None = None,
                     env: Mapping[str, str] | None = None,
                     wrap: list[str] | None = None) -> Worker:
        """A worker process (``wrap``: a command to run it under, e.g. faketime)."""
        port = free_port()
        full = {**local_aws_env(endpoint or self.dynamodb), **FAST_ENV, **self.env,
                "STREAMLEASE_TABLE": self.table, "STREAMLEASE_EVENTS_TABLE": self.events_table,
                "STREAMLEASE_FLEET_TABLE": self.fleet_table,
                "STREAMLEASE_WORKER_ID": name, "STREAMLEASE_METRICS_PORT": str(port),
                **(env or {})}
        args = [*(wrap or []), *python("-m", "streamlease", "run")]
        worker = Worker(name, Proc(args, env=full, name=name), port)
        self.workers[name] = worker
        return worker

    def control(self, path: str) -> dict[str, object]:
        base = self.upstream_url.replace("ws://", "http://")
        with urllib.request.urlopen(f"{base}{path}", timeout=5) as resp:
            result: dict[str, object] = json.loads(resp.read())
            return result

    async def records(self) -> dict[str, StreamRecord]:
        assert self.store is not None
        return {r.stream_id: r for r in await self.store.list_streams()}

    async def owners(self) -> dict[str, str | None]:
        now = int(time.time() * 1000)
        return {sid: (r.lease_owner if (r.lease_expires_at_ms or 0) > now else None)
                for sid, r in (await self.records()).items()}

    async def all_owned(self, by: set[str] | None = None, ids: list[str] | None = None) -> bool:
        owners = await self.owners()
        live = by if by is not None else {n for n, w in self.workers.items()
                                          if w.proc.popen.poll() is None}
        return all(owners.get(sid) in live for sid in (ids or self.stream_ids))

    async def counts(self) -> dict[str, int]:
        """Streams held (live lease) per running worker, zero for those holding none."""
        owners = await self.owners()
        live = [n for n, w in self.workers.items() if w.proc.popen.poll() is None]
        return {n: sum(1 for o in owners.values() if o == n) for n in live}

    async def watch_moves(self, seconds: float, interval: float = 0.1) -> int:
        """Ownership changes seen while polling for ``seconds`` (a stream changing hands,
        or freed and taken again, counts once each time)."""
        moves = 0
        last = await self.owners()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(interval)
            now = await self.owners()
            moves += sum(1 for s, o in now.items() if o != last.get(s) and o is not None)
            last = now
        return moves

    DISTURBANCES = ("member.self_fenced", "member.fenced", "member.dead")

    def disturbances(self) -> int:
        """Times a worker stopped its streams because it could not prove it was alive, or
        was found dead by a peer: a store that stalled on a loaded machine, a change of
        membership rather than a decision to move."""
        return sum(len(w.log_events(name)) for w in self.workers.values()
                   for name in self.DISTURBANCES)

    def notable(self, since: dict[str, int]) -> dict[str, dict[str, int]]:
        """Per worker, how often each event other than progress was logged after the
        ``since`` line counts (what to print when moves were seen)."""
        seen: dict[str, dict[str, int]] = {}
        for name, worker in self.workers.items():
            counts: dict[str, int] = {}
            for line in worker.proc.err_lines[since.get(name, 0):]:
                if not line.startswith("{"):
                    continue
                try:
                    event = str(json.loads(line).get("event"))
                except ValueError:
                    continue
                if not event.startswith("pump."):
                    counts[event] = counts.get(event, 0) + 1
            seen[name] = counts
        return seen

    async def quiet_moves(self, seconds: float, tries: int = 3) -> int:
        """``watch_moves`` over a window without disturbances: a window in which a worker
        self-fenced, was fenced or was found dead is watched again, up to ``tries``
        windows in all."""
        moves = 0
        for _ in range(tries):
            disturbed = self.disturbances()
            since = {n: len(w.proc.err_lines) for n, w in self.workers.items()}
            moves = await self.watch_moves(seconds)
            if moves:
                print(f"{moves} moves; logged meanwhile: {self.notable(since)}")
            if moves == 0 or self.disturbances() == disturbed:
                return moves
            print("a worker self-fenced or was fenced on a stalled store; watching again")
            await wait_until(self.balanced, 30, "balanced again after the stall")
        return moves

    async def balanced(self) -> bool:
        """Every running worker holds within one of ceil(streams / workers)."""
        counts = await self.counts()
        if not counts or sum(counts.values()) != len(self.stream_ids):
            return False
        share = -(-len(self.stream_ids) // len(counts))
        return all(abs(c - share) <= 1 for c in counts.values())

    async def audit(self) -> dict[str, int]:
        """Every stream's sink holds seq 1..last_seq exactly once, in order, byte-identical
        to what the upstream sent, and fences never go backwards along the sequence."""
        assert self.store is not None
        delivered: dict[str, int] = {}
        records = await self.records()
        for sid in self.stream_ids:
            # Workers may still be writing: the checkpoint read first is a floor, and the
            # events read after it must be exactly 1..n for some n at or above it.
            last = records[sid].last_seq or 0
            frames = [f async for f in self.store.read_events(sid)]
            seqs = [f.seq for f in frames]
            assert seqs == list(range(1, len(seqs) + 1)), (
                f"{sid}: not exactly 1..{len(seqs)}: "
                f"{[(a, b) for a, b in itertools.pairwise(seqs) if b != a + 1][:5]}")
            assert len(seqs) >= last, f"{sid}: checkpoint {last} but only {len(seqs)} stored"
            for f in frames:
                assert f.text == frame_for(sid, f.seq), f"{sid} seq {f.seq}: content differs"
            fences = await self.store.event_fences(sid)
            assert fences == sorted(fences), f"{sid}: an older fence wrote after a newer one"
            delivered[sid] = len(seqs)
        # What operators see: `ctl export` prints the same, one object a line, in order.
        sid = self.stream_ids[0]
        lines = await self.ctl("export", sid)
        n = len(lines)
        assert n >= delivered[sid] and lines == [frame_for(sid, i) for i in range(1, n + 1)]
        return delivered

    async def ctl(self, *args: str) -> list[str]:
        env = {**os.environ, **local_aws_env(self.dynamodb), "STREAMLEASE_TABLE": self.table,
               "STREAMLEASE_EVENTS_TABLE": self.events_table,
               "STREAMLEASE_FLEET_TABLE": self.fleet_table}
        proc = await asyncio.create_subprocess_exec(
            *python("-m", "streamlease", "ctl", *args), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        return out.decode().splitlines()

    async def close(self) -> None:
        for worker in self.workers.values():
            if worker.proc.popen.poll() is None:
                worker.proc.signal(signal.SIGCONT)
            worker.proc.stop(timeout=15)
        if self.upstream is not None:
            self.upstream.stop()
        if self.store is not None:
            await self._drop_tables()
        if self._store_cm is not None:
            await self._store_cm.__aexit__(None, None, None)  # type: ignore[attr-defined]

    async def _drop_tables(self) -> None:
        """The session's one DynamoDB server holds every fleet's tables: dropping them keeps
        its heap small (a heap of millions of items pauses the server for a full
        collection, long enough on a loaded machine to stall every member heartbeat)."""
        assert self.store is not None
        for table in (self.table, self.events_table, self.fleet_table):
            with contextlib.suppress(Exception):
                await self.store._call("delete_table", 10, TableName=table)


class HoldingProxy:
    """A TCP proxy that can hold what clients send (their requests stay in flight) while
    passing the server's answers through. Used to put a sink write "in flight" across a
    SIGSTOP."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._hold = threading.Event()
        self._lock = threading.Lock()
        self._pending: list[tuple[socket.socket, bytes]] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold(self) -> None:
        self._hold.set()

    def held_bytes(self) -> bytes:
        with self._lock:
            return b"".join(data for _, data in self._pending)

    def release(self) -> None:
        with self._lock:
            for upstream, data in self._pending:
                with contextlib.suppress(OSError):
                    upstream.sendall(data)
            self._pending.clear()
            self._hold.clear()

    def close(self) -> None:
        self._closed = True
        self.listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, holdable: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                with self._lock:
                    if holdable and self._hold.is_set():
                        self._pending.append((dst, data))
                        continue
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
