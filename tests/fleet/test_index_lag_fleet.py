"""The fleet on a store whose index reads are a second behind the table (DynamoDB's global
secondary indexes are eventually consistent; a second is a bad day, not a rare one): every
stream is served after start-up, through a SIGTERM and a kill -9, and nothing is lost,
duplicated or accepted stale. Before index records were treated as hints, every first
acquisition was followed by a lease lost to the holder's own stale view of the index."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator, Iterator

import pytest

from streamlease.dev import local_aws_env
from tests.fleet.harness import Fleet, dynamodb_server, wait_until

pytestmark = pytest.mark.fleet

LAG_MS = 1000


@pytest.fixture(scope="module")
def lagged_dynamodb() -> Iterator[str]:
    proc = dynamodb_server(name="dynamodb-lagged", index_lag_ms=LAG_MS, index_lag_jitter_ms=0)
    try:
        yield proc.url()
    finally:
        proc.stop()


@pytest.fixture
async def lagged_fleet(lagged_dynamodb: str,
                       monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Fleet]:
    for key, value in local_aws_env(lagged_dynamodb).items():
        monkeypatch.setenv(key, value)  # the test's own reads go to the lagged server too
    fleet = Fleet(lagged_dynamodb, streams=18, rate=4)
    try:
        yield fleet
    finally:
        await fleet.close()


async def progressing(fleet: Fleet, seconds: float) -> list[str]:
    """Streams whose checkpoint did not move within ``seconds`` (every stream produces)."""
    before = {s: r.last_seq or 0 for s, r in (await fleet.records()).items()}

    async def stuck() -> list[str]:
        now = await fleet.records()
        return sorted(s for s in before if (now[s].last_seq or 0) <= before[s])

    async def all_moved() -> bool:
        return not await stuck()
    try:
        await wait_until(all_moved, seconds, "every checkpoint moving")
    except AssertionError:
        return await stuck()
    return []


def lost_to_conditions(fleet: Fleet) -> int:
    return sum(1 for w in fleet.workers.values() for e in w.log_events("lease.lost")
               if e.get("reason") == "condition_failed")


async def test_with_index_reads_a_second_behind_every_stream_is_served(
        lagged_fleet: Fleet) -> None:
    fleet = await lagged_fleet.start(workers=3)
    await wait_until(fleet.all_owned, 30, "all streams owned")
    # Well past the index lag: every stream still delivering, none lost to a stale read.
    await wait_until(lambda: _past(fleet, 8), 30, "every stream past seq 8")
    assert await progressing(fleet, 3 * LAG_MS / 1000) == []
    assert lost_to_conditions(fleet) == 0

    # A SIGTERM hand-over, then a kill -9: every stream served again.
    owners = await fleet.owners()
    leaving = sorted(fleet.workers)[0]
    fleet.workers[leaving].drain()
    rest = set(fleet.workers) - {leaving}
    await wait_until(lambda: fleet.all_owned(by=rest), 30, "the SIGTERMed worker's streams taken")
    assert await progressing(fleet, 3 * LAG_MS / 1000) == []

    owners = await fleet.owners()
    victim = max(rest, key=lambda n: sum(o == n for o in owners.values()))
    fleet.workers[victim].proc.popen.send_signal(signal.SIGKILL)
    fleet.workers[victim].proc.popen.wait(10)
    survivor = rest - {victim}
    await wait_until(lambda: fleet.all_owned(by=survivor), 30, "the killed worker's streams taken")
    assert await progressing(fleet, 3 * LAG_MS / 1000) == []
    assert lost_to_conditions(fleet) == 0
    delivered = await fleet.audit()
    assert all(n > 0 for n in delivered.values())


async def _past(fleet: Fleet, seq: int) -> bool:
    return all((r.last_seq or 0) > seq for r in (await fleet.records()).values())
