"""Shared fixtures: the embedded DynamoDB as a real server process, fresh tables per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import uvloop

from streamlease.dev import local_aws_env
from streamlease.store import dynamodb
from streamlease.store.memory import MemoryStore
from streamlease.store.protocols import Stores
from tests.fleet.harness import Fleet
from tests.procs import Proc, python
from tests.virtual import VirtualTimeLoop


def pytest_asyncio_loop_factories(config: Any, item: Any) -> dict[str, Any]:
    """Every async test runs on uvloop, as the worker does; those marked virtual_time on
    a loop whose clock jumps to the next timer (tests/virtual.py)."""
    if item.get_closest_marker("virtual_time"):
        return {"virtual": VirtualTimeLoop}
    return {"uvloop": uvloop.new_event_loop}


@pytest.fixture(scope="session")
def dynamodb_endpoint() -> Iterator[str]:
    """``streamlease dev dynamodb`` on a free loopback port, for the whole session."""
    proc = Proc(python("-m", "streamlease", "dev", "dynamodb", "--port", "0"), name="dynamodb")
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


@pytest.fixture
def table_names() -> tuple[str, str, str]:
    suffix = uuid.uuid4().hex[:10]
    return f"streams-{suffix}", f"events-{suffix}", f"fleet-{suffix}"


@pytest.fixture
async def dynamo(dynamodb_endpoint: str,
                 table_names: tuple[str, str, str]) -> AsyncIterator[Stores]:
    """The DynamoDB stores on fresh tables of the embedded server."""
    async with dynamodb.connect(*table_names, sink_connections=100,
                                control_connections=100) as stores:
        await stores.admin.create_tables()
        yield stores


@pytest.fixture(params=["dynamodb", "memory"])
async def stores(request: pytest.FixtureRequest) -> AsyncIterator[Stores]:
    """Each backend in turn: the store contract holds for both."""
    if request.param == "memory":
        memory = MemoryStore()
        await memory.create_tables()
        yield memory.stores()
        return
    request.getfixturevalue("dynamodb_endpoint")
    names: tuple[str, str, str] = request.getfixturevalue("table_names")
    async with dynamodb.connect(*names, sink_connections=100,
                                control_connections=100) as found:
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
