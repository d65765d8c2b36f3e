"""What the default ``dynamodb`` sink costs a slow stream, measured: the ``sinks`` section.

One worker per batch window (``STREAMLEASE_BATCH_MAX_SECONDS``), each on tables of its own
in one embedded DynamoDB, serves a few streams of the reference upstream at 1 msg/s. The
upstream runs in this process, so when each ``seq`` was produced is known (``seq / rate``
seconds after it started: its one clock); each events item carries its write time
(``at_ms``). From the events items the run computes, for the steady state (each stream's
first item, the connection's replay, and its last, the flush at SIGTERM, left out):

* write units, by DynamoDB's size rules (``codec.item_size``): every batch is one
  transaction of the stream item's checkpoint and its events items, each item billed per
  started KB, doubled because transactions cost twice; so $ per stream-month at 1 msg/s;
* the added latency of each message: its batch's write time minus when it was produced.

The worker's own count of sink transactions (``streamlease_dynamodb_requests_total``) is
checked against the number of events items: one item a transaction at this rate.

``measure_sink_cost()`` returns the section as a dict; ``python -m loadtest.sink_cost``
prints it. About a minute and a half: the windows run side by side.
"""

from __future__ import annotations

import asyncio
import json
import math
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aioboto3

from loadtest.capacity import PRICE_WRITE, WRITE_UNIT
from loadtest.common import Tables, local_store, worker_child
from loadtest.fleet import WorkerProc, pct, rounded
from streamlease.config import DEFAULTS
from streamlease.dev.procs import free_port
from streamlease.dev.upstream import UpstreamOptions, UpstreamServer, frame_for
from streamlease.store import codec
from streamlease.store.dynamodb import connect_admin

MESSAGES_PER_MONTH_1HZ = 30 * 24 * 3600  # one stream at 1 msg/s for a 30-day month
WINDOWS = (0.2, 1.0, 2.0, 4.5)
DEFAULT_WINDOW = float(DEFAULTS["STREAMLEASE_BATCH_MAX_SECONDS"])
TARGET_USD = 1.50
TARGET_LATENCY_S = 5.0


def transaction_wru(stream_item_bytes: int, events_item_bytes: list[int]) -> int:
    """Write units of one sink transaction: each item per started KB, doubled."""
    units = math.ceil(stream_item_bytes / WRITE_UNIT)
    units += sum(math.ceil(b / WRITE_UNIT) for b in events_item_bytes)
    return 2 * units


def month_usd(wru_per_message: float, messages: int = MESSAGES_PER_MONTH_1HZ) -> float:
    return wru_per_message * messages * PRICE_WRITE


class _Run:
    """One window: its tables, its worker, its streams."""

    def __init__(self, window: float, streams: int, upstream_url: str) -> None:
        self.window = window
        self.tables = Tables.fresh("sc")
        self.ids = [f"w{str(window).replace('.', 'p')}-s{i}" for i in range(1, streams + 1)]
        self.upstream_url = upstream_url
        self.port = free_port()
        self.worker: WorkerProc | None = None

    async def prepare(self) -> None:
        async with connect_admin(*self.tables) as stores:
            await stores.admin.create_tables()
            for sid in self.ids:
                await stores.admin.put_started(sid, f"{self.upstream_url}/streams/{sid}")

    def start(self, env: dict[str, str], log: Path) -> None:
        worker_env = {
            **env, **self.tables.env(), "STREAMLEASE_WORKER_ID": f"cost-{self.window}",
            "STREAMLEASE_METRICS_PORT": str(self.port),
            "STREAMLEASE_METRICS_ADDRESS": "127.0.0.1",
            "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1:",
            "STREAMLEASE_LEASE_SECONDS": "6", "STREAMLEASE_HEARTBEAT_SECONDS": "1",
            "STREAMLEASE_RECONCILE_SECONDS": "0.5", "STREAMLEASE_SHUTDOWN_SECONDS": "10",
            "STREAMLEASE_BATCH_MAX_SECONDS": repr(self.window),
        }
        popen = worker_child(f"cost-{self.window}", [sys.executable, "-m", "streamlease", "run"],
                             worker_env, log).popen
        self.worker = WorkerProc(f"cost-{self.window}", popen, self.port, log)

    def metrics(self) -> dict[str, float]:
        return self.worker.metrics if self.worker is not None else {}

    async def delivering(self) -> bool:
        async with connect_admin(*self.tables) as stores:
            records = [await stores.admin.get(sid) for sid in self.ids]
        return all(r is not None and (r.last_seq or 0) > 0 for r in records)

    async def stop(self) -> None:
        if self.worker is not None:
            self.worker.scrape()
            self.worker.signal_stop(signal.SIGTERM)
            await self.worker.wait(30)

    async def items(self) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
        """Each stream's events items in seq order, and its streams item's size."""
        table, events, _ = self.tables
        out: dict[str, list[dict[str, Any]]] = {}
        sizes: dict[str, int] = {}
        async with aioboto3.Session().client("dynamodb") as client:
            for sid in self.ids:
                key = codec.key(sid)
                got: list[dict[str, Any]] = []
                async for page in client.get_paginator("query").paginate(
                        TableName=events, ConsistentRead=True,
                        KeyConditionExpression="Pk = :pk",
                        ExpressionAttributeValues={":pk": key[codec.PK]}):
                    got.extend(page["Items"])
                out[sid] = sorted(got, key=lambda i: int(i[codec.EV_SK]["N"]))
                item = (await client.get_item(TableName=table, Key=key,
                                              ConsistentRead=True)).get("Item", {})
                sizes[sid] = codec.item_size(item)
        return out, sizes


def _analyse(run: _Run, items: dict[str, list[dict[str, Any]]], stream_sizes: dict[str, int],
             produced_at: float, rate: float, since: float) -> dict[str, Any]:
    """Steady-state write units and latency of one window (see the module docstring):
    items whose first message was produced after ``since`` (wall time, once every stream
    had caught up with the upstream's backlog), each stream's last (the drain) left out."""
    wru = messages = transactions = 0
    latencies: list[float] = []
    for sid, stream_items in items.items():
        for item in stream_items[:-1]:
            frames = codec.decode_event_item(item)
            if produced_at + frames[0].seq / rate < since:
                continue
            at_s = int(item[codec.EV_AT]["N"]) / 1000
            wru += transaction_wru(stream_sizes[sid], [codec.item_size(item)])
            messages += len(frames)
            transactions += 1
            latencies.extend(max(0.0, at_s - (produced_at + f.seq / rate)) for f in frames)
    written = sum(len(v) for v in items.values())
    counted = run.metrics().get('streamlease_dynamodb_requests_total{operation='
                              '"transact_write_items",outcome="ok"}')
    per_message = wru / messages if messages else float("nan")
    return {
        "window_s": run.window,
        "streams": len(run.ids),
        "messages": messages,
        "transactions": transactions,
        "messages_per_transaction": round(messages / transactions, 2) if transactions else None,
        "wru_per_message": round(per_message, 3),
        "cost_per_stream_month_1hz": round(month_usd(per_message), 2),
        "latency_p50_s": rounded(pct(latencies, 50), 3),
        "latency_p99_s": rounded(pct(latencies, 99), 3),
        "latency_max_s": rounded(max(latencies, default=None), 3),
        "events_items_written": written,
        # All of them, counted by the worker before its drain (the drain writes one more
        # a stream): one events item a transaction at this rate.
        "worker_sink_transactions": None if counted is None else int(counted),
    }


async def measure_sink_cost(windows: tuple[float, ...] = WINDOWS, streams: int = 4,
                            seconds: float = 30.0, rate: float = 1.0,
                            log_dir: Path | None = None) -> dict[str, Any]:
    """The ``sinks.dynamodb`` section: cost and added latency per batch window at ``rate``
    msg/s per stream, on the embedded DynamoDB; the headline figures at the default window
    (``STREAMLEASE_BATCH_MAX_SECONDS``)."""
    if DEFAULT_WINDOW not in windows:
        windows = (*windows, DEFAULT_WINDOW)
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="sink-cost-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: list[_Run] = []
    started = time.monotonic()
    with local_store() as env:
        try:
            async with UpstreamServer(UpstreamOptions(streams=0, rate=rate)) as upstream:
                # The upstream's clock starts as it starts: seq N is produced N / rate later.
                produced_at = time.time()
                runs = [_Run(w, streams, upstream.base_url) for w in windows]
                for run in runs:  # one at a time: the embedded server serialises table creation
                    await run.prepare()
                for run in runs:
                    run.start(env, log_dir / f"worker-{run.window}.log")
                deadline = time.monotonic() + 30
                for run in runs:
                    while not await run.delivering():
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"window {run.window}: streams not delivering "
                                               f"after 30 s (logs in {log_dir})")
                        await asyncio.sleep(0.5)
                # The replay of what the upstream produced before the workers came is behind
                # them once every stream delivered and a window has passed.
                since = time.time() + max(windows)
                await asyncio.sleep(max(windows) + seconds)
                await asyncio.gather(*(run.stop() for run in runs))
                results = []
                for run in runs:
                    items, sizes = await run.items()
                    results.append(_analyse(run, items, sizes, produced_at, rate, since))
        finally:
            for run in runs:
                if run.worker is not None:
                    run.worker.signal_stop()
    default = next(r for r in results if r["window_s"] == DEFAULT_WINDOW)
    return {
        "cost_per_stream_month_1hz": default["cost_per_stream_month_1hz"],
        "added_latency_s": default["latency_p99_s"],
        "default_window_s": DEFAULT_WINDOW,
        "targets": {"cost_per_stream_month_1hz": TARGET_USD, "added_latency_s": TARGET_LATENCY_S},
        "curve": {str(r["window_s"]): r for r in sorted(results, key=lambda r: r["window_s"])},
        "rate_msgs_per_s": rate,
        "message_bytes": len(frame_for("w5p0-s1", 100_000)),
        "measured_s": seconds,
        "run_seconds": round(time.monotonic() - started, 1),
        "assumptions": "us-east-1 on-demand $0.625 per million WRU; a sink transaction "
                       "writes the stream item (checkpoint) and one events item per batch, "
                       "each billed per started KB by DynamoDB's size rules, doubled "
                       "(transactions); a 30-day month at 1 msg/s; storage, PITR, reads "
                       "and the lease upkeep not included",
    }


def main() -> None:
    result = asyncio.run(measure_sink_cost())
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
