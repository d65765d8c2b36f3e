"""Start-up table checks: a slow or throttling store is given a few attempts; a missing
table or index stops the worker at once (virtual time)."""

from __future__ import annotations

import asyncio

import pytest

from streamlease.app import START_ATTEMPTS, check_tables
from streamlease.errors import StoreThrottled, StoreUnavailable, TableMissing

pytestmark = pytest.mark.virtual_time


class Admin:
    def __init__(self, *outcomes: BaseException | list[str]) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[float] = []

    async def check_tables(self) -> list[str]:
        self.calls.append(asyncio.get_running_loop().time())
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


async def test_a_slow_store_is_tried_again_with_backoff() -> None:
    admin = Admin(StoreUnavailable("describe_table timed out"), StoreThrottled("slow down"),
                  ["advice"])
    assert await check_tables(admin) == ["advice"]  # type: ignore[arg-type]
    gaps = [b - a for a, b in zip(admin.calls, admin.calls[1:], strict=False)]
    assert gaps == pytest.approx([1.0, 2.0])


async def test_it_gives_up_after_a_bounded_number_of_attempts() -> None:
    admin = Admin(*[StoreUnavailable("down")] * START_ATTEMPTS)
    with pytest.raises(StoreUnavailable):
        await check_tables(admin)  # type: ignore[arg-type]
    assert len(admin.calls) == START_ATTEMPTS


async def test_a_missing_table_stops_at_once() -> None:
    admin = Admin(TableMissing("run `streamlease table create`"))
    with pytest.raises(TableMissing):
        await check_tables(admin)  # type: ignore[arg-type]
    assert len(admin.calls) == 1
