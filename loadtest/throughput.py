"""The ``throughput`` and ``tracing`` scenarios: throughput, CPU and memory of one worker, in
phases; and what tracing costs it.

* ``null_sink``: the worker's Pump into a sink that drops everything, in one process:
  the pump's own ceiling; ``bare_client``: the same streams read with plain ``websockets``.
* ``fenced_sink``: one real worker into DynamoDB through the fenced transactions (with the
  embedded server, the server is the limit).
* ``python_processor``: one real worker into a Python processor that does nothing, in large
  batches (a conditional ``UpdateItem`` checkpoint a batch): the worker without an
  output's own cost (``sinks.python.ratio_to_bare``).
* CPU per 1,000 messages where the store cannot be the limit (slow streams, a 5 s
  heartbeat, 2 s batches); resident memory per held idle stream (``measure_idle_memory``)
  and the TCP connections the worker keeps open.

Each phase runs alone, one after the other, against the same upstream process.

``tracing``: one worker replaying the same backlog into the no-op Python processor (the
``python_processor`` phase) with tracing off and on (default sampling, exporting to a
receiver on loopback, ``loadtest.otlp``), alternating off, on, on, off so a drift of the
machine's load cancels out: ``tracing.throughput_ratio`` = on / off (target >= 0.95). The
chaos run's linked hand-offs (``tracing.handoffs_linked``) are ``loadtest.audit``'s.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from loadtest.common import Server, death_signal, local_store
from loadtest.fleet import (
    PYTHON_PROCESSOR_ENV,
    Context,
    python_processor_env,
    rss_bytes,
    scrape_metrics,
    solo_worker,
    worker_phase,
)
from loadtest.otlp import Receiver
from streamlease.dev.procs import free_port

BACKLOG = 400_000
IDLE_STREAMS = 200


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


async def _child(mode: str, urls: list[str], seconds: float) -> float:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loadtest.reader", mode, str(seconds), *urls,
        stdout=asyncio.subprocess.PIPE, preexec_fn=death_signal())
    out, _ = await proc.communicate()
    return float(json.loads(out)["msgs_per_s"])


async def _idle_phase(env: dict[str, str], upstream: str, streams: int,
                      settle_s: float) -> dict[str, Any]:
    """One worker holding ``streams`` streams of an upstream that sends nothing, at the
    default lease, heartbeat and batch settings: resident memory once every stream is
    connected and has renewed a few times, and the worker's open TCP connections."""
    port = free_port()
    settings = {**env, "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1",
                "STREAMLEASE_METRICS_PORT": str(port),
                "STREAMLEASE_MAX_STREAMS": str(max(1, streams)),
                # Room for every stream's worst case at the default frame cap.
                "STREAMLEASE_BUFFER_BUDGET_BYTES": str(max(1, streams) * 4 * 2**20)}
    async with solo_worker(settings, upstream, streams, "idle") as (_, worker):
        deadline = time.monotonic() + 120
        while True:
            found = await asyncio.to_thread(scrape_metrics, port, 5.0)
            connected = -1.0 if found is None else \
                found.get("streamlease_upstream_connected_streams", 0.0)
            if connected >= streams:
                break
            if time.monotonic() > deadline or worker.returncode is not None:
                raise RuntimeError(f"idle phase: {connected:g} of {streams} connected")
            await asyncio.sleep(0.5)
        await asyncio.sleep(settle_s)
        samples = []
        for _ in range(5):
            samples.append(rss_bytes(worker.pid))
            await asyncio.sleep(1.0)
        peers = _tcp_peer_ports(worker.pid)
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


async def run_throughput(ctx: Context) -> dict[str, Any]:
    with local_store(ctx.args.dynamodb) as env:
        return await measure_throughput(env, ctx.args.quick)


async def measure_throughput(env: dict[str, str], quick: bool) -> dict[str, Any]:
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
        fenced = await worker_phase(env, backlog.url, streams, seconds)
        print("throughput: no-op Python processor (one worker) ...", flush=True)
        python = await worker_phase({**env, **python_processor_env(env)}, backlog.url,
                                    streams, seconds)
        print("cpu: 100 slow streams ...", flush=True)
        quiet = {"STREAMLEASE_LEASE_SECONDS": "20", "STREAMLEASE_HEARTBEAT_SECONDS": "5",
                 "STREAMLEASE_BATCH_MAX_SECONDS": "2"}
        busy = await worker_phase({**env, **quiet}, slow.url, 100, seconds)
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


# -- the tracing scenario: throughput with tracing on / off ---------------------------------

# Backlogged streams, seconds per phase, phase order.
COST_STREAMS = 10
COST_SECONDS = 10.0
COST_BACKLOG = 400_000
COST_ORDER = ("off", "on", "on", "off")


async def run_tracing(ctx: Context) -> dict[str, Any]:
    with local_store(ctx.args.dynamodb) as env:
        return await measure_tracing_cost(env, ctx.args.quick)


async def measure_tracing_cost(env: dict[str, str], quick: bool) -> dict[str, Any]:
    """One worker, the no-op Python processor, the same backlog: delivered msgs/s with
    tracing off and on (default sampling), in ``COST_ORDER``."""
    seconds = 4.0 if quick else COST_SECONDS
    # Without any OTEL_* variable: tracing off, whatever the caller set.
    base = {**{k: v for k, v in env.items() if not k.startswith("OTEL_")},
            **python_processor_env(env)}
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
                found = await worker_phase(phase_env, backlog.url, COST_STREAMS, seconds)
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


async def _main(streams: int) -> None:
    """``python -m loadtest.throughput [STREAMS]``: the idle-memory phase alone, on an
    embedded DynamoDB; prints its figures as JSON."""
    with local_store() as env:
        print(json.dumps(await measure_idle_memory(env, streams), indent=2))


if __name__ == "__main__":
    asyncio.run(_main(int(sys.argv[1]) if len(sys.argv) > 1 else IDLE_STREAMS))
