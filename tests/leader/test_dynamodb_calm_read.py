"""The DynamoDB leader backend asks for the read it is told to: a calm read (a candidate
that is not next in line, once a lease) without ``ConsistentRead``, for half the read
units; every other read consistent. On an embedded server whose base-table reads without
``ConsistentRead`` answer as of a second ago, only the calm read sees the lease as it
was."""

from __future__ import annotations

import random
import uuid

import pytest

from streamlease.dev import local_aws_env
from streamlease.dev.dynamodb import EmbeddedDynamoDB, ServerOptions
from streamlease.store import dynamodb

NOW = 1_800_000_000_000


class StepClock:
    """The server's monotonic clock, stepped by the test."""

    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


async def test_only_a_calm_read_sees_the_lease_as_it_was_a_moment_ago(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = StepClock()
    with EmbeddedDynamoDB(ServerOptions(stale_reads_s=1.0), clock=clock,
                          rng=random.Random(7)) as server:
        for name, value in local_aws_env(server.endpoint_url).items():
            monkeypatch.setenv(name, value)
        suffix = uuid.uuid4().hex[:8]
        async with dynamodb.connect_admin(f"s-{suffix}", f"e-{suffix}",
                                          f"f-{suffix}") as stores:
            await stores.admin.create_tables()
            leader = stores.leader
            first = await leader.acquire("lease", "a", 10, None, NOW)
            assert first is not None
            clock.now += 2.0  # a's lease is now older than the stale window
            assert await leader.resign("lease", "a", first) is True
            taken = await leader.acquire("lease", "b", 10, await leader.read("lease"), NOW)
            assert taken is not None and taken > first

            consistent = await leader.read("lease")
            calm = await leader.read("lease", consistent=False)
            assert consistent is not None and (consistent.owner, consistent.fence) == \
                ("b", taken)
            # As of a second ago: a held it. A campaign acting on this read writes only
            # under a condition on the lease as seen, which fails.
            assert calm is not None and (calm.owner, calm.fence) == ("a", first)
            assert await leader.acquire("lease", "c", 10, calm, NOW) is None

            clock.now += 1.001  # past the stale window: the calm read catches up
            calm = await leader.read("lease", consistent=False)
            assert calm is not None and (calm.owner, calm.fence) == ("b", taken)
