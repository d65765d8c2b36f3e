"""Throughput, CPU and memory phases of the benchmark (see loadtest/chaos.py).

* ``null_sink``: one process pumping backlogged streams with the worker's Pump into a sink
  that drops everything: the pump's own ceiling.
* ``bare_client``: one process reading the same streams with plain ``websockets``.
* ``fenced_sink``: one real worker delivering the same streams into DynamoDB through the
  fenced transactions (with the embedded server, the server is the limit).
* CPU seconds per 1,000 messages and resident memory per held stream of one worker, in a
  run where the store cannot be the limit (slow streams, a 5 s heartbeat, 2 s batches).

Each phase runs alone, one after the other, against the same upstream process.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any

from loadtest.common import Server
from worker.store.dynamodb import connect_admin

BACKLOG = 400_000


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


async def _child(mode: str, urls: list[str], seconds: float) -> float:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.reader", mode, str(seconds), *urls,
        stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return float(json.loads(out)["msgs_per_s"])


async def _worker_phase(env: dict[str, str], upstream: str, streams: int, seconds: float,
                        extra: dict[str, str], wait_for: int) -> dict[str, float]:
    """Run one worker over ``streams`` fresh streams; delivered msgs/s, CPU, RSS."""
    suffix = uuid.uuid4().hex[:8]
    table, events = f"tp-s-{suffix}", f"tp-e-{suffix}"
    async with connect_admin(table, events, f"tp-f-{suffix}") as stores:
        store = stores.admin
        await store.create_tables()
        for i in range(streams):
            await store.put_started(f"t{i:04d}", f"{upstream}/streams/t{i:04d}")
        worker_env = {**env, "STREAMLEASE_TABLE": table, "STREAMLEASE_EVENTS_TABLE": events,
                      "STREAMLEASE_FLEET_TABLE": f"tp-f-{suffix}",
                      "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1:",
                      "STREAMLEASE_METRICS_PORT": "0", "STREAMLEASE_WORKER_ID": "bench",
                      "STREAMLEASE_LOG_LEVEL": "WARNING",
                      "STREAMLEASE_ACQUIRE_PER_CYCLE": str(max(10, streams)), **extra}
        worker = await asyncio.create_subprocess_exec(sys.executable, "-m", "worker", "run",
                                                      env=worker_env)
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
        print("throughput: fenced sink (one worker) ...", flush=True)
        fenced = await _worker_phase(env, backlog.url, streams, seconds, {}, streams)
        print("cpu and memory: idle worker, then 100 slow streams ...", flush=True)
        quiet = {"STREAMLEASE_LEASE_SECONDS": "20", "STREAMLEASE_HEARTBEAT_SECONDS": "5",
                 "STREAMLEASE_BATCH_MAX_SECONDS": "2"}
        idle = await _worker_phase(env, slow.url, 0, 3.0, quiet, 0)
        busy = await _worker_phase(env, slow.url, 100, seconds, quiet, 100)
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
        "rss_bytes_per_stream": round((busy["rss"] - idle["rss"]) / 100),
        "worker_rss_idle_bytes": idle["rss"],
        "cpu_phase_msgs_per_s": round(busy["msgs_per_s"], 1),
    }
