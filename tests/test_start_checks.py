"""Start-up table checks and registration: a slow or throttling store is given a few
attempts; a missing table or index stops the worker at once (virtual time)."""

from __future__ import annotations

import asyncio

import pytest

from streamlease.app import START_ATTEMPTS, check_tables, register
from streamlease.errors import StoreError, StoreThrottled, StoreUnavailable, TableMissing

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


class Joining:
    """A membership whose registrations fail as listed, then succeed."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls: list[float] = []

    async def register(self) -> None:
        self.calls.append(asyncio.get_running_loop().time())
        if self.failures:
            raise self.failures.pop(0)


async def test_joining_a_throttling_fleet_table_is_tried_again_with_backoff() -> None:
    """Found by the nemesis (a worker started while the store throttled exited 1 instead
    of waiting): registration is retried as the table check is."""
    joining = Joining(StoreThrottled("ProvisionedThroughputExceededException"),
                      StoreUnavailable("update_item timed out"))
    await register(joining)  # type: ignore[arg-type]
    gaps = [b - a for a, b in zip(joining.calls, joining.calls[1:], strict=False)]
    assert gaps == pytest.approx([1.0, 2.0])


async def test_joining_gives_up_after_the_same_bounded_attempts_and_errors_stop_at_once(
        ) -> None:
    joining = Joining(*[StoreThrottled("slow down")] * START_ATTEMPTS)
    with pytest.raises(StoreThrottled):
        await register(joining)  # type: ignore[arg-type]
    assert len(joining.calls) == START_ATTEMPTS
    broken = Joining(StoreError("registering w1: its row kept changing"))
    with pytest.raises(StoreError, match="kept changing"):
        await register(broken)  # type: ignore[arg-type]
    assert len(broken.calls) == 1
