"""Throughput, CPU and memory phases of the benchmark (see loadtest/chaos.py).

* ``null_sink``: one process pumping backlogged streams with the worker's Pump into a sink
  that drops everything: the pump's own ceiling.
* ``bare_client``: one process reading the same streams with plain ``websockets``.
* ``fenced_sink``: one real worker delivering the same streams into DynamoDB through the
  fenced transactions (with the embedded server, the server is the limit).
* ``python_processor``: one real worker delivering the same streams to a Python processor
  that does nothing (``python:loadtest.processors:make``), in large batches: the worker
  without an output's own cost. Its checkpoint is one conditional ``UpdateItem`` a batch.
  Reported as ``sinks.python.ratio_to_bare`` (target >= 0.8).
* CPU seconds per 1,000 messages of one worker, in a run where the store cannot be the
  limit (slow streams, a 5 s heartbeat, 2 s batches).
* resident memory per held idle stream: one worker holding many streams whose upstream
  sends nothing, at the default heartbeat, against the same worker holding none; and the
  TCP connections it keeps open to DynamoDB and to the upstream.

Each phase runs alone, one after the other, against the same upstream process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import statistics
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loadtest.common import Server, death_signal
from streamlease.store.dynamodb import connect_admin

BACKLOG = 400_000
IDLE_STREAMS = 200
ROOT = Path(__file__).resolve().parent.parent
# The no-op processor's phase: the largest batches the worker allows, cut at most once a
# second, so the checkpoint writes (one a batch) stay far below the store's limit.
PYTHON_PROCESSOR_ENV = {"STREAMLEASE_SINK": "python:loadtest.processors:make",
                        "STREAMLEASE_BATCH_MAX_MESSAGES": "1000",
                        "STREAMLEASE_BATCH_MAX_SECONDS": "1"}


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _tcp_peer_ports(pid: int) -> dict[int, int]:
    """Established TCP connections of ``pid``, counted by remote port."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    peers: dict[int, int] = {}
    for table in ("tcp", "tcp6"):
        with open(f"/proc/{pid}/net/{table}") as f:
            next(f)
            for line in f:
                cols = line.split()
                if cols[3] == "01" and cols[9] in inodes:  # 01: ESTABLISHED
                    port = int(cols[2].rsplit(":", 1)[1], 16)
                    peers[port] = peers.get(port, 0) + 1
    return peers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


async def _child(mode: str, urls: list[str], seconds: float) -> float:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.reader", mode, str(seconds), *urls,
        stdout=asyncio.subprocess.PIPE, preexec_fn=death_signal())
    out, _ = await proc.communicate()
    return float(json.loads(out)["msgs_per_s"])


async def _worker_phase(env: dict[str, str], upstream: str, streams: int, seconds: float,
                        extra: dict[str, str], wait_for: int, feed: str = "streams",
                        profile: str | None = None) -> dict[str, float]:
    """Run one worker over ``streams`` fresh streams (the upstream's ``/<feed>/<id>``, items
    naming ``profile`` when given); delivered msgs/s, CPU, RSS."""
    suffix = uuid.uuid4().hex[:8]
    table, events = f"tp-s-{suffix}", f"tp-e-{suffix}"
    async with connect_admin(table, events, f"tp-f-{suffix}") as stores:
        store = stores.admin
        await store.create_tables()
        for i in range(streams):
            await store.put_started(f"t{i:04d}", f"{upstream}/{feed}/t{i:04d}", profile)
        worker_env = {**env, "STREAMLEASE_TABLE": table, "STREAMLEASE_EVENTS_TABLE": events,
                      "STREAMLEASE_FLEET_TABLE": f"tp-f-{suffix}",
                      "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1:",
                      "STREAMLEASE_METRICS_PORT": "0", "STREAMLEASE_WORKER_ID": "bench",
                      "STREAMLEASE_LOG_LEVEL": "WARNING",
                      "STREAMLEASE_ACQUIRE_PER_CYCLE": str(max(10, streams)), **extra}
        worker = await asyncio.create_subprocess_exec(sys.executable, "-m", "streamlease", "run",
                                                      env=worker_env, preexec_fn=death_signal())
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                records = await store.list_streams()
                if sum(1 for r in records if (r.last_seq or 0) > 0) >= wait_for:
                    break
                await asyncio.sleep(0.5)
            start = sum(r.last_seq or 0 for r in await store.list_streams())
            cpu0, t0 = _cpu_seconds(worker.pid), time.perf_counter()
            await asyncio.sleep(seconds)
            end = sum(r.last_seq or 0 for r in await store.list_streams())
            elapsed = time.perf_counter() - t0
            cpu = _cpu_seconds(worker.pid) - cpu0
            rss = _rss_bytes(worker.pid)
        finally:
            worker.terminate()
            await worker.wait()
    return {"msgs_per_s": (end - start) / elapsed, "cpu_s": cpu, "messages": end - start,
            "rss": rss, "elapsed": elapsed}


async def _idle_phase(env: dict[str, str], upstream: str, streams: int, settle_s: float,
                      command: list[str] | None = None) -> dict[str, Any]:
    """One worker holding ``streams`` streams of an upstream that sends nothing, at the
    default lease, heartbeat and batch settings: resident memory once every stream is
    connected and has renewed a few times, and the worker's open TCP connections."""
    suffix = uuid.uuid4().hex[:8]
    table, events = f"idle-s-{suffix}", f"idle-e-{suffix}"
    port = _free_port()
    async with connect_admin(table, events, f"idle-f-{suffix}") as stores:
        store = stores.admin
        await store.create_tables()
        for i in range(streams):
            await store.put_started(f"i{i:04d}", f"{upstream}/streams/i{i:04d}")
        worker_env = {**env, "STREAMLEASE_TABLE": table, "STREAMLEASE_EVENTS_TABLE": events,
                      "STREAMLEASE_FLEET_TABLE": f"idle-f-{suffix}",
                      "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1",
                      "STREAMLEASE_METRICS_PORT": str(port), "STREAMLEASE_WORKER_ID": "idle",
                      "STREAMLEASE_LOG_LEVEL": "WARNING",
                      "STREAMLEASE_MAX_STREAMS": str(max(1, streams)),
                      # Room for every stream's worst case at the default frame cap.
                      "STREAMLEASE_BUFFER_BUDGET_BYTES": str(max(1, streams) * 4 * 2**20),
                      "STREAMLEASE_ACQUIRE_PER_CYCLE": str(max(10, streams))}
        worker = await asyncio.create_subprocess_exec(
            *(command or [sys.executable, "-m", "streamlease", "run"]), env=worker_env,
            preexec_fn=death_signal())
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    connected = await asyncio.to_thread(
                        _scrape, port, "streamlease_upstream_connected_streams")
                except OSError:
                    connected = -1.0
                if connected >= streams:
                    break
                if time.monotonic() > deadline or worker.returncode is not None:
                    raise RuntimeError(f"idle phase: {connected:g} of {streams} connected")
                await asyncio.sleep(0.5)
            await asyncio.sleep(settle_s)
            samples = []
            for _ in range(5):
                samples.append(_rss_bytes(worker.pid))
                await asyncio.sleep(1.0)
            peers = _tcp_peer_ports(worker.pid)
        finally:
            with contextlib.suppress(ProcessLookupError):
                worker.terminate()
            await worker.wait()
    dynamodb_port = urlsplit(env.get("AWS_ENDPOINT_URL_DYNAMODB", "")).port
    upstream_port = urlsplit(upstream).port
    return {"rss": statistics.median(samples),
            "dynamodb_connections": peers.get(dynamodb_port or -1, 0),
            "upstream_connections": peers.get(upstream_port or -1, 0)}


async def measure_idle_memory(env: dict[str, str], streams: int = IDLE_STREAMS,
                              settle_s: float = 12.0) -> dict[str, Any]:
    """Resident memory per held idle stream: (RSS holding ``streams`` - RSS holding none)
    / ``streams``. The upstream produces one message every ~3 hours, i.e. nothing."""
    quiet = Server("upstream", "--port", "0", "--streams", "0", "--rate", "0.0001")
    try:
        none = await _idle_phase(env, quiet.url, 0, 2.0)
        held = await _idle_phase(env, quiet.url, streams, settle_s)
    finally:
        quiet.stop()
    return {
        "rss_bytes_per_stream": round((held["rss"] - none["rss"]) / streams),
        "worker_rss_idle_bytes": round(none["rss"]),
        "idle_streams": streams,
        "dynamodb_connections_idle_streams": held["dynamodb_connections"],
        "upstream_connections_idle_streams": held["upstream_connections"],
    }


async def measure_throughput(_chaos_upstream: str, env: dict[str, str],
                             quick: bool) -> dict[str, Any]:
    seconds = 5.0 if quick else 15.0
    streams = 10
    backlog = Server("upstream", "--port", "0", "--streams", "0", "--rate", "1",
                     "--initial-backlog", str(BACKLOG))
    slow = Server("upstream", "--port", "0", "--streams", "0", "--rate", "10")
    try:
        urls = [f"{backlog.url}/streams/b{i:03d}" for i in range(streams)]
        print("throughput: null sink ...", flush=True)
        null_sink = await _child("null", urls, seconds)
        print("throughput: bare client ...", flush=True)
        bare = await _child("bare", urls, seconds)
        if not null_sink or not bare:
            raise RuntimeError(f"a reading phase delivered nothing (null sink {null_sink:.0f}, "
                               f"bare client {bare:.0f} msg/s): see its output above")
        print("throughput: fenced sink (one worker) ...", flush=True)
        fenced = await _worker_phase(env, backlog.url, streams, seconds, {}, streams)
        print("throughput: no-op Python processor (one worker) ...", flush=True)
        path = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        python = await _worker_phase(env, backlog.url, streams, seconds,
                                     {**PYTHON_PROCESSOR_ENV, "PYTHONPATH": path}, streams)
        print("cpu: 100 slow streams ...", flush=True)
        quiet = {"STREAMLEASE_LEASE_SECONDS": "20", "STREAMLEASE_HEARTBEAT_SECONDS": "5",
                 "STREAMLEASE_BATCH_MAX_SECONDS": "2"}
        busy = await _worker_phase(env, slow.url, 100, seconds, quiet, 100)
        print(f"memory: a worker holding none, then {IDLE_STREAMS} idle streams ...",
              flush=True)
        memory = await measure_idle_memory(env)
    finally:
        backlog.stop()
        slow.stop()
    return {
        "msgs_per_s": {"null_sink": round(null_sink), "fenced_sink": round(fenced["msgs_per_s"]),
                       "bare_client": round(bare)},
        "null_sink_ratio": round(null_sink / bare, 3) if bare else None,
        "fenced_sink_ratio": round(fenced["msgs_per_s"] / bare, 3) if bare else None,
        "cpu_seconds_per_1000_messages": round(busy["cpu_s"] / busy["messages"] * 1000, 4)
        if busy["messages"] else None,
        "cpu_seconds_per_1000_messages_saturated":
            round(fenced["cpu_s"] / fenced["messages"] * 1000, 4) if fenced["messages"] else None,
        "cpu_phase_msgs_per_s": round(busy["msgs_per_s"], 1),
        **memory,
        "sinks": {"python": {
            "msgs_per_s_noop": round(python["msgs_per_s"]),
            "ratio_to_bare": round(python["msgs_per_s"] / bare, 3) if bare else None,
            "cpu_seconds_per_1000_messages_noop":
                round(python["cpu_s"] / python["messages"] * 1000, 4)
                if python["messages"] else None,
            "batch_max_messages": int(PYTHON_PROCESSOR_ENV["STREAMLEASE_BATCH_MAX_MESSAGES"]),
        }},
    }


async def _main(streams: int) -> None:
    """``python -m loadtest.throughput [STREAMS]``: the idle-memory phase alone, on an
    embedded DynamoDB; prints its figures as JSON."""
    from streamlease.dev import local_aws_env

    ddb = Server("dynamodb", "--port", "0")
    try:
        os.environ.update(local_aws_env(ddb.url))
        print(json.dumps(await measure_idle_memory(dict(os.environ), streams), indent=2))
    finally:
        ddb.stop()


if __name__ == "__main__":
    asyncio.run(_main(int(sys.argv[1]) if len(sys.argv) > 1 else IDLE_STREAMS))
