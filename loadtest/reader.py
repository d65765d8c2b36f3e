"""A reading process for the throughput phases: ``null`` runs the worker's Pump into a sink
that drops everything; ``bare`` reads with plain ``websockets``. Prints msgs/s as JSON."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import uvloop
from websockets.asyncio.client import connect

from streamlease.clock import SYSTEM_CLOCK
from streamlease.context import Context
from streamlease.core.frames import Frame
from streamlease.core.lease import Holding, LeaseTimings
from streamlease.core.model import Tenure
from streamlease.core.stream import RECEIVE_QUEUE
from streamlease.core.urls import parse_allowed_urls
from streamlease.health import HealthState
from streamlease.metrics import Metrics
from streamlease.pump import Pump, PumpSettings
from streamlease.store.memory import MemoryStore

LONG = LeaseTimings(lease_s=3600, heartbeat_s=60, skew_margin_s=1, safety_margin_s=2)


class NullSink:
    def __init__(self) -> None:
        self.count = 0

    async def write_batch(self, tenure: Tenure, prev_seq: int, frames: list[Frame],
                          now_wall_ms: int, timeout: float | None = None) -> Any:
        self.count += len(frames)

    async def settle(self, tenure: Tenure, timeout: float | None = None) -> None:
        return None


async def null(urls: list[str], seconds: float) -> float:
    sink = NullSink()
    # The pump uses the context's clock, metrics and sink; the lease store goes unused.
    ctx = Context("bench", SYSTEM_CLOCK, Metrics(), MemoryStore().stores().leases,
                  sink, HealthState(LONG.lease_s))
    pumps = []
    for i, url in enumerate(urls):
        tenure = Tenure(f"b{i}", "bench", 1, 0, 0)
        holding = Holding(tenure, url, SYSTEM_CLOCK.monotonic(), LONG)
        pumps.append(Pump(ctx, holding, PumpSettings(
            allowed_urls=parse_allowed_urls("ws://127.0.0.1:"))))
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(p.run()) for p in pumps]
        await asyncio.sleep(1.0)  # connections up
        start, t0 = sink.count, time.perf_counter()
        await asyncio.sleep(seconds)
        rate = (sink.count - start) / (time.perf_counter() - t0)
        for p in pumps:
            await p.abort()
        del tasks
    return rate


async def bare(urls: list[str], seconds: float) -> float:
    count = 0

    async def read(url: str) -> None:
        nonlocal count
        # The same connection settings as the pump, so the comparison is like for like.
        async with connect(url + "?from_seq=1", compression=None, max_size=262_144,
                           max_queue=RECEIVE_QUEUE, close_timeout=0.1, proxy=None) as ws:
            async for _ in ws:
                count += 1

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(read(u)) for u in urls]
        await asyncio.sleep(1.0)
        start, t0 = count, time.perf_counter()
        await asyncio.sleep(seconds)
        rate = (count - start) / (time.perf_counter() - t0)
        for task in tasks:
            task.cancel()
    return rate


if __name__ == "__main__":
    mode, secs, *targets = sys.argv[1:]
    fn = null if mode == "null" else bare
    print(json.dumps({"msgs_per_s": uvloop.run(fn(targets, float(secs)))}))
