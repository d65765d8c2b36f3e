"""Items whose profile cannot serve them, in virtual time on the in-memory store: not
dialled, ``last_error`` says why, counted as bad_profile; every other stream is served."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from streamlease.app import build_settings
from streamlease.config import WorkerConfig
from streamlease.core.profiles import parse_profiles
from streamlease.core.upstream import Catalog
from streamlease.store import codec
from streamlease.upstream import Upstreams
from tests.test_reconciler import URL, Fleet, events

pytestmark = pytest.mark.virtual_time

PROFILES = parse_profiles(json.dumps({
    "chat": {"on_open": [{"send": '{"subscribe":"${item.channel}"}'}],
             "resume": {"mode": "none"}},
}), "json")


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streamlease")


def with_profiles(catalog: Catalog, **overrides: Any) -> Fleet:
    return Fleet(upstreams=Upstreams(catalog), **overrides)


async def put(fleet: Fleet, sid: str, **attributes: str) -> None:
    item = {codec.PK: codec.s(f"CONN#{sid}"), codec.DESIRED_STATE: codec.s("STARTED"),
            codec.WS_URL: codec.s(URL.format(sid)), codec.LEASE_EXPIRES: codec.n(0)}
    item.update({k: codec.s(v) for k, v in attributes.items()})
    await fleet.memory.put_item(item)


async def until(condition: Callable[[], bool], limit_s: float = 60) -> None:
    """Wait (virtual time) for ``condition``, failing after ``limit_s``."""
    async with asyncio.timeout(limit_s):
        while not condition():  # noqa: ASYNC110 - a poll with a deadline on outside state
            await asyncio.sleep(0.1)


def bad_profile_count(fleet: Fleet) -> float | None:
    return fleet.metrics.registry.get_sample_value("streamlease_bad_items_total",
                                                   {"reason": "bad_profile"})


BAD = [
    ({"profile": "nope"}, "profile 'nope' is not defined (known: chat, streamlease; "
                          "STREAMLEASE_PROFILES)"),
    ({"profile": "chat"}, "profile chat: its templates use ${item.channel} and the item has "
                          "no such attribute"),
]


def streams(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.__dict__["sl_fields"]["stream"] for r in events(caplog, name)]


def acquired(caplog: pytest.LogCaptureFixture, sid: str) -> int:
    return streams(caplog, "lease.acquired").count(sid)


@pytest.mark.parametrize(("attributes", "why"), BAD)
async def test_an_item_its_profile_cannot_serve_is_not_served(
        attributes: dict[str, str], why: str, caplog: pytest.LogCaptureFixture) -> None:
    fleet = with_profiles(Catalog(PROFILES), sweep_s=5.0)
    await put(fleet, "bad", **attributes)
    await put(fleet, "good")  # the default profile
    await put(fleet, "chat", profile="chat", channel="general")
    await asyncio.sleep(fleet.memory.index_lag.max_s)
    fleet.start()
    await until(lambda: {"good", "chat"} <= fleet.held())
    await until(lambda: (bad_profile_count(fleet) or 0) >= 1)
    record = await fleet.memory.get("bad")
    assert record is not None and record.last_error == why
    await asyncio.sleep(12)  # two sweeps more
    assert "bad:run" not in fleet.script.log, "its pump ran"
    assert {"good", "chat"} <= fleet.held()
    assert fleet.script.log.count("good:run") == fleet.script.log.count("chat:run") == 1
    for reason in ("bad_url", "bad_state"):
        assert fleet.metrics.registry.get_sample_value(
            "streamlease_bad_items_total", {"reason": reason}) == 0
    assert streams(caplog, "stream.unservable") == ["bad"]
    assert acquired(caplog, "good") == acquired(caplog, "chat") == 1
    await fleet.stop()


@pytest.mark.parametrize(("attributes", "why"), BAD[:1])
async def test_an_item_its_profile_cannot_serve_is_not_acquired_over_and_over(
        attributes: dict[str, str], why: str, caplog: pytest.LogCaptureFixture) -> None:
    fleet = with_profiles(Catalog(PROFILES), sweep_s=5.0)
    await put(fleet, "bad", **attributes)
    await asyncio.sleep(fleet.memory.index_lag.max_s)
    fleet.start()
    await asyncio.sleep(30)
    # Measured before a fix: 150 acquires and releases (conditional writes), 150 INFO log
    # lines of each, and streamlease_bad_items_total{reason="bad_profile"} 150.
    assert acquired(caplog, "bad") <= 3
    assert (bad_profile_count(fleet) or 0) <= 3
    await fleet.stop()


async def test_an_item_that_gains_the_attribute_is_served() -> None:
    fleet = with_profiles(Catalog(PROFILES), sweep_s=5.0)
    await put(fleet, "late", profile="chat")
    await asyncio.sleep(fleet.memory.index_lag.max_s)
    fleet.start()
    await until(lambda: bad_profile_count(fleet) == 1)
    await put(fleet, "late", profile="chat", channel="general")  # the operator's fix
    await until(lambda: "late" in fleet.held(), limit_s=120)
    await until(lambda: "late:run" in fleet.script.log)
    await fleet.stop()


async def test_the_pause_before_an_unservable_item_is_taken_again_follows_the_lease() -> None:
    """Three member leases: 15 s at the defaults, 6 s with a 2 s lease, so a fleet with
    short leases picks the operator's fix up on the same scale."""
    assert build_settings(WorkerConfig.from_env({})).unservable_retry_s == 15
    config = WorkerConfig.from_env({"STREAMLEASE_LEASE_SECONDS": "2",
                                    "STREAMLEASE_HEARTBEAT_SECONDS": "0.5",
                                    "STREAMLEASE_SKEW_MARGIN_SECONDS": "0.2"})
    retry = build_settings(config).unservable_retry_s
    assert retry == pytest.approx(6.0)
    fleet = with_profiles(Catalog(PROFILES), sweep_s=5.0, unservable_retry_s=retry)
    await put(fleet, "late", profile="chat")
    await asyncio.sleep(fleet.memory.index_lag.max_s)
    fleet.start()
    await until(lambda: bad_profile_count(fleet) == 1)
    found = fleet.clock.monotonic()
    await put(fleet, "late", profile="chat", channel="general")  # the operator's fix
    await until(lambda: "late" in fleet.held(), limit_s=120)
    # The pause, then the next reconcile cycle (1 s +20 %) and the index's lag.
    assert fleet.clock.monotonic() - found < retry + 2, fleet.clock.monotonic() - found
    await fleet.stop()


async def test_an_offered_stream_with_a_profile_is_taken_under_that_profile() -> None:
    """An offered stream is read in full (its ``profile`` included) and planned against
    the worker's own profiles, not only the built-in one."""
    from streamlease.core.notices import Notice, NoticeKind

    fleet = with_profiles(Catalog(PROFILES))
    fleet.start()
    await asyncio.sleep(2.0)
    await put(fleet, "c1", profile="chat", channel="news")
    fleet.reconciler.notice(Notice(1, "w1", "c1", NoticeKind.OFFER))
    await until(lambda: fleet.held() == {"c1"}, limit_s=1.0)
    assert not bad_profile_count(fleet)
    await fleet.stop()
