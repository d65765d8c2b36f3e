"""One racing process: wait for a shared start time, try to acquire every stream at once,
print the ids it won as JSON. Used by the two-process race test."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import uvloop

from streamlease.core.lease import LeaseTimings
from streamlease.store import dynamodb

T = LeaseTimings(20.0, 5.0, 1.0, 2.0)


async def race(table: str, events: str, fleet: str, owner: str, start_at: float,
               ids: list[str]) -> None:
    async with dynamodb.connect(table, events, fleet,
                                dynamodb.ConnectOptions(control_connections=len(ids) + 5)
                                ) as stores:
        await stores.admin.get(ids[0])  # open a connection before the start line
        await asyncio.sleep(max(0.0, start_at - time.time()))
        now = int(time.time() * 1000)
        results = await asyncio.gather(*(stores.leases.acquire(i, owner, now, T) for i in ids))
    print(json.dumps([r.tenure.stream_id for r in results if r is not None]), flush=True)


if __name__ == "__main__":
    table, events, fleet, owner, start_at, *ids = sys.argv[1:]
    uvloop.run(race(table, events, fleet, owner, float(start_at), ids))
