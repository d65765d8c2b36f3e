from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from tests.fleet.harness import Fleet

FleetFactory = Callable[..., Fleet]


@pytest.fixture
async def make_fleet(dynamodb_endpoint: str) -> AsyncIterator[FleetFactory]:
    """Build fleets; every one is torn down (workers SIGCONT'ed and stopped) at the end."""
    fleets: list[Fleet] = []

    def factory(**kwargs: object) -> Fleet:
        fleet = Fleet(dynamodb_endpoint, **kwargs)  # type: ignore[arg-type]
        fleets.append(fleet)
        return fleet

    yield factory
    for fleet in fleets:
        await fleet.close()
