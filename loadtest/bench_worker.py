"""Messages per second one worker pumps from the reference upstream into the fenced sink.

    python -m loadtest.bench_worker [--streams 10] [--backlog 20000] [--seconds 20]

Each stream starts with a backlog, so the upstream is never the limit at first; the
figure is messages durably delivered (checkpointed) per second over the window, next to
a bare ``websockets`` client reading the same upstream. The embedded DynamoDB serves one
request at a time (about 250 writes/s), so large batches matter: the report gives the
sink transactions per second too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid

import uvloop
from websockets.asyncio.client import connect

from loadtest.common import Server, use_local_dynamodb
from worker.store.dynamodb import DynamoStore


async def checkpointed(store: DynamoStore) -> int:
    return sum(r.last_seq or 0 for r in await store.list_streams())


async def bare_client(urls: list[str], seconds: float) -> float:
    count = 0

    async def read(url: str) -> None:
        nonlocal count
        async with connect(url + "?from_seq=1", compression=None, max_size=2**20,
                           close_timeout=0.1) as ws:
            async for _ in ws:
                count += 1

    async with asyncio.timeout(seconds + 5):
        tasks = [asyncio.ensure_future(read(u)) for u in urls]
        await asyncio.sleep(seconds)
        rate = count / seconds
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return rate


async def measure(args: argparse.Namespace, upstream: str) -> None:
    suffix = uuid.uuid4().hex[:8]
    table, events = f"bw-s-{suffix}", f"bw-e-{suffix}"
    ids = [f"s{i:03d}" for i in range(1, args.streams + 1)]
    async with DynamoStore.connect(table, events) as store:
        await store.create_tables()
        for sid in ids:
            await store.put_started(sid, f"{upstream}/streams/{sid}")
        env = {**os.environ, "STREAMLEASE_TABLE": table, "STREAMLEASE_EVENTS_TABLE": events,
               "STREAMLEASE_ALLOWED_URLS": "ws://127.0.0.1:", "STREAMLEASE_METRICS_PORT": "0",
               "STREAMLEASE_WORKER_ID": "bench", "STREAMLEASE_LOG_LEVEL": "WARNING",
               "STREAMLEASE_BATCH_MAX_MESSAGES": str(args.batch)}
        worker = subprocess.Popen(  # noqa: ASYNC220 - started once, not on a hot path
            [sys.executable, "-m", "worker", "run"], env=env)
        try:
            while await checkpointed(store) == 0:  # noqa: ASYNC110 - polls another process
                await asyncio.sleep(0.2)
            start_count, started = await checkpointed(store), time.perf_counter()
            cpu0 = _cpu_seconds(worker.pid)
            await asyncio.sleep(args.seconds)
            end_count, elapsed = await checkpointed(store), time.perf_counter() - started
            cpu = _cpu_seconds(worker.pid) - cpu0
        finally:
            worker.terminate()
            worker.wait(30)
    delivered = (end_count - start_count) / elapsed
    bare = await bare_client([f"{upstream}/streams/{sid}" for sid in ids], 5.0)
    print(f"one worker, {args.streams} streams, batches of up to {args.batch}:")
    print(f"  fenced sink: {delivered:8.0f} msgs/s delivered "
          f"(~{delivered / args.batch:.0f}+ transactions/s), worker CPU {cpu / elapsed:.0%}")
    print(f"  bare client: {bare:8.0f} msgs/s read from the same upstream")
    print(f"  ratio fenced/bare: {delivered / bare:.2f}")


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--backlog", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()
    dynamodb = Server("dynamodb", "--port", "0")
    upstream = Server("upstream", "--port", "0", "--streams", str(args.streams), "--rate", "1",
                      "--initial-backlog", str(args.backlog))
    try:
        use_local_dynamodb(dynamodb.url)
        uvloop.run(measure(args, upstream.url))
    finally:
        upstream.stop()
        dynamodb.stop()


if __name__ == "__main__":
    main()
