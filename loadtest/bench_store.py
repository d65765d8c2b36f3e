"""Operations per second of the lease store against the embedded DynamoDB (moto).

    python -m loadtest.bench_store [--runs 5] [--ops 300]

Acquire (a conditional update on a free item), renew (conditional on owner and fence)
and one sink transaction of 10 messages, each issued one at a time from one client; and
take-overs as a survivor makes them after a death (the conditional write from the dead
incarnation, then the sink's resume read), ``TAKEOVER_CONCURRENCY`` in flight. Median of
several runs. The embedded server handles one request at a time, so these are its
limits, not DynamoDB's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import uvloop

from loadtest.common import Tables, local_store
from streamlease.core.frames import Frame
from streamlease.core.lease import LeaseTimings
from streamlease.store import dynamodb
from streamlease.store.protocols import Stores, TakeOver
from streamlease.takeover import TAKEOVER_CONCURRENCY

T = LeaseTimings(20.0, 5.0, 1.0, 2.0)


async def one_run(ops: int) -> dict[str, float]:
    async with dynamodb.connect(*Tables.fresh("bench")) as stores:
        await stores.admin.create_tables()
        ids = [f"b{i}" for i in range(ops)]
        for sid in ids:
            await stores.admin.put_started(sid, "wss://bench/")
        now = int(time.time() * 1000)
        started = time.perf_counter()
        tenures = []
        for sid in ids:
            got = await stores.leases.acquire(sid, "bench", now, T)
            assert got is not None
            tenures.append(got.tenure)
        acquire = ops / (time.perf_counter() - started)
        started = time.perf_counter()
        for tenure in tenures:
            await stores.leases.renew(tenure, now + 1, T)
        renew = ops / (time.perf_counter() - started)
        tenure, prev = tenures[0], 0
        started = time.perf_counter()
        for _ in range(ops):
            seqs = range(prev + 1, prev + 11)
            batch = [Frame(s, f'{{"seq":{s},"v":"{"x" * 80}"}}') for s in seqs]
            await stores.sink.write_batch(tenure, prev, batch, now)
            prev = batch[-1].seq
        sink = ops / (time.perf_counter() - started)
        takeover = await take_overs(stores, ops, now)
    return {"acquire": acquire, "renew": renew, "sink_tx_10_msgs": sink, "takeover": takeover}


async def take_overs(stores: Stores, ops: int, now: int) -> float:
    """Take-overs a second of ``ops`` streams a dead member (epoch 1, fenced at 2) held."""
    dead = [f"d{i}" for i in range(ops)]
    for sid in dead:
        await stores.admin.put_started(sid, "wss://bench/")
        assert await stores.leases.acquire(sid, "dead", now, T, epoch=1) is not None
    gate = asyncio.Semaphore(TAKEOVER_CONCURRENCY)

    async def take(sid: str) -> None:
        async with gate:
            got = await stores.leases.take_over(TakeOver(sid, "dead", 2, "bench", now, T, epoch=3))
            assert got is not None
            await stores.sink.newest_event(sid)

    started = time.perf_counter()
    await asyncio.gather(*(take(sid) for sid in dead))
    return ops / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ops", type=int, default=300)
    args = parser.parse_args()
    with local_store():
        results = [uvloop.run(one_run(args.ops)) for _ in range(args.runs)]
    print(f"store ops/s against the embedded DynamoDB, {args.runs} runs x {args.ops} ops:")
    for name in results[0]:
        values = sorted(r[name] for r in results)
        print(f"  {name:<16} median {statistics.median(values):7.0f}/s  "
              f"(min {values[0]:.0f}, max {values[-1]:.0f})")


if __name__ == "__main__":
    main()
