"""The AWS outputs' test server keeps every record a burst of concurrent writers sends.

moto numbers a Kinesis record by reading the shard's highest sequence number and storing
under the next; served by several threads at once, two records can take one number and
one vanishes. The interpreter's switch interval is shortened so that a thread switch
lands inside that window often: served concurrently, a burst of this size loses records
in every run; served one request at a time (``tests/motoserver.py``), none.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import aioboto3
import pytest

REGION = "us-east-1"
WRITERS = 3  # clients, each with its own connection pool
PUTS = 200  # per writer, all in flight together


@pytest.fixture
def frequent_switches() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


async def _read_all(kinesis: Any, name: str) -> list[bytes]:
    shard = (await kinesis.list_shards(StreamName=name))["Shards"][0]["ShardId"]
    iterator = (await kinesis.get_shard_iterator(
        StreamName=name, ShardId=shard, ShardIteratorType="TRIM_HORIZON"))["ShardIterator"]
    found: list[bytes] = []
    while iterator:
        page = await kinesis.get_records(ShardIterator=iterator, Limit=10000)
        if not page["Records"]:
            break
        found += [r["Data"] for r in page["Records"]]
        iterator = page.get("NextShardIterator")
    return found


async def test_concurrent_put_records_all_land(aws_env: str, frequent_switches: None) -> None:
    name = f"race-{uuid.uuid4().hex[:10]}"
    session = aioboto3.Session()
    async with session.client("kinesis", region_name=REGION) as admin:
        await admin.create_stream(StreamName=name, ShardCount=1)

        async def writer(w: int) -> None:
            async with session.client("kinesis", region_name=REGION) as kinesis:
                await asyncio.gather(*(kinesis.put_records(
                    StreamName=name,
                    Records=[{"Data": f"{w}:{i}".encode(), "PartitionKey": "p"}])
                    for i in range(PUTS)))

        await asyncio.gather(*(writer(w) for w in range(WRITERS)))
        found = await _read_all(admin, name)
    sent = {f"{w}:{i}".encode() for w in range(WRITERS) for i in range(PUTS)}
    assert len(found) == len(sent)
    assert set(found) == sent
