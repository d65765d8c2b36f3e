"""Shared fixtures: the embedded DynamoDB as a real server process, fresh tables per test.

Index reads lag the table everywhere, as in production: the server runs with
``--index-lag-ms 50 --index-lag-jitter-ms 100`` (tests/fleet/harness.py), and every
``MemoryStore`` built in a test lags its indexes by the same 50-150 ms on its clock
(virtual time in virtual-time tests). A test that needs an instant index says why and
uses ``instant_dynamodb_endpoint`` / ``instant_dynamo``.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import uvloop

from streamlease.dev import local_aws_env
from streamlease.store import dynamodb, memory
from streamlease.store.memory import MemoryStore
from streamlease.store.protocols import Stores
from streamlease.store.versions import IndexLag
from tests.fleet.harness import INDEX_LAG_JITTER_MS, INDEX_LAG_MS, Fleet, dynamodb_server
from tests.mongoserver import MongoServer
from tests.store.lag import ManualClock
from tests.virtual import VirtualTimeLoop

# Every MemoryStore built without an explicit lag (most tests build their own), its jitter
# drawn from a seeded generator so that a virtual-time test replays exactly.
memory.DEFAULT_INDEX_LAG = IndexLag(INDEX_LAG_MS / 1000, INDEX_LAG_JITTER_MS / 1000)
memory.DEFAULT_SEED = 0
# The DynamoDB stores' pools: room for the contract tests' concurrent calls.
POOLS = dynamodb.ConnectOptions(sink_connections=100, control_connections=100)


def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Any]:
    """Every async test runs on uvloop, as the worker does; those marked virtual_time on
    a loop whose clock jumps to the next timer (tests/virtual.py)."""
    if item.get_closest_marker("virtual_time"):
        return {"virtual": VirtualTimeLoop}
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture(scope="session")
def dynamodb_endpoint() -> Iterator[str]:
    """``streamlease dev dynamodb`` on a free loopback port, for the whole session; its
    indexes lag 50-150 ms behind the table, as DynamoDB's do."""
    proc = dynamodb_server()
    try:
        url = proc.url()
        saved = {k: os.environ.get(k) for k in local_aws_env(url)}
        os.environ.update(local_aws_env(url))
        yield url
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def mongo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MongoServer]:
    """A MongoDB wire server (SecantusDB) on a free loopback port, for the whole session;
    each test uses a database of its own."""
    server = MongoServer(tmp_path_factory.mktemp("mongodb"))
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def instant_dynamodb_endpoint() -> Iterator[str]:
    """A second server whose indexes never lag, started on first use. Only for a test
    that states why it needs an instant index; it does not set the AWS variables (use
    ``instant_dynamo``, or connect with its URL)."""
    proc = dynamodb_server(name="dynamodb-instant", index_lag_ms=0, index_lag_jitter_ms=0)
    try:
        yield proc.url()
    finally:
        proc.stop()


@pytest.fixture
async def instant_dynamo(instant_dynamodb_endpoint: str, table_names: tuple[str, str, str],
                         monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Stores]:
    """The DynamoDB stores on fresh tables of the instant-index server."""
    for name, value in local_aws_env(instant_dynamodb_endpoint).items():
        monkeypatch.setenv(name, value)
    async with dynamodb.connect(*table_names, POOLS) as stores:
        await stores.admin.create_tables()
        yield stores


@pytest.fixture
def table_names() -> tuple[str, str, str]:
    suffix = uuid.uuid4().hex[:10]
    return f"streams-{suffix}", f"events-{suffix}", f"fleet-{suffix}"


@pytest.fixture
async def dynamo(dynamodb_endpoint: str,
                 table_names: tuple[str, str, str]) -> AsyncIterator[Stores]:
    """The DynamoDB stores on fresh tables of the embedded server."""
    async with dynamodb.connect(*table_names, POOLS) as stores:
        await stores.admin.create_tables()
        yield stores


@pytest.fixture(params=["dynamodb", "memory"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    """Each backend in turn: the store contract holds for both."""
    if request.param == "memory":
        # The server's lag, on a clock the test steps (tests/store/lag.py).
        store = MemoryStore(ManualClock(), index_lag_s=INDEX_LAG_MS / 1000,
                            index_lag_jitter_s=INDEX_LAG_JITTER_MS / 1000,
                            rng=random.Random(request.node.name))
        await store.create_tables()
        yield store.stores()
        return
    request.getfixturevalue("dynamodb_endpoint")
    names: tuple[str, str, str] = request.getfixturevalue("table_names")
    async with dynamodb.connect(*names, POOLS) as found:
        await found.admin.create_tables()
        yield found


@pytest.fixture
async def make_fleet(dynamodb_endpoint: str) -> AsyncIterator[Callable[..., Fleet]]:
    """Build fleets; every one is torn down (workers SIGCONT'ed and stopped) at the end."""
    fleets: list[Fleet] = []

    def factory(**kwargs: object) -> Fleet:
        fleet = Fleet(dynamodb_endpoint, **kwargs)  # type: ignore[arg-type]
        fleets.append(fleet)
        return fleet

    yield factory
    for fleet in fleets:
        await fleet.close()
