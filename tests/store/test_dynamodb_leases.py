"""``DynamoLeaseStore.check_many`` on DynamoDB: the BatchGetItem requests it sends and how it
reads their answers (a scripted client), and the embedded server serving them (over HTTP).
What it promises on both backends is in test_contract.py."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from streamlease.dev import local_aws_env
from streamlease.dev.dynamodb import EmbeddedDynamoDB, ServerOptions
from streamlease.errors import StoreError, StoreThrottled, StoreUnavailable, TableMissing
from streamlease.metrics import DYNAMODB_OUTCOMES, Metrics
from streamlease.store import dynamodb
from streamlease.store.dynamodb.client import DynamoClient
from streamlease.store.dynamodb.leases import (
    BATCH_GET_KEYS,
    UNPROCESSED_BACKOFF_CAP_S,
    UNPROCESSED_BACKOFF_S,
    DynamoLeaseStore,
)
from tests.store.lag import ManualClock

TABLE = "streams-t"
NOW = 1_700_000_000_000
URL = "wss://feeds.example.com/a"


def item(sid: str, **attrs: Any) -> dict[str, Any]:
    found = {"Pk": {"S": f"CONN#{sid}"}, "desired_state": {"S": "STARTED"},
             "ws_url": {"S": URL}, "lease_expires_at_ms": {"N": "0"}}
    found.update(attrs)
    return found


def client_error(code: str, status: int = 400) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code},
                        "ResponseMetadata": {"HTTPStatusCode": status}}, "BatchGetItem")


class SteppedClock(ManualClock):
    """A ``Clock`` whose sleeps only move its monotonic time, and are recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    def wall_ms(self) -> int:
        return NOW

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)


class ScriptedDynamo:
    """The raw client's ``batch_get_item`` and ``get_item``, answered from ``items``.
    ``leave(n, keys)`` names the asked keys the n-th BatchGetItem (from 1) leaves
    unprocessed; ``error`` is raised by every call instead."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = {i["Pk"]["S"]: i for i in items}
        self.requests: list[dict[str, Any]] = []
        self.leave: Callable[[int, list[str]], list[str]] = lambda n, keys: []
        self.error: BaseException | None = None
        self.answer: dict[str, Any] | None = None  # answered as it is, if set

    def asked(self, n: int) -> list[str]:
        (request,) = self.requests[n]["RequestItems"].values()
        return [key["Pk"]["S"] for key in request["Keys"]]

    async def batch_get_item(self, **kwargs: Any) -> dict[str, Any]:
        self.requests.append(kwargs)
        if self.error is not None:
            raise self.error
        if self.answer is not None:
            return self.answer
        ((table, request),) = kwargs["RequestItems"].items()
        keys = [key["Pk"]["S"] for key in request["Keys"]]
        left = self.leave(len(self.requests), keys)
        answer: dict[str, Any] = {
            "Responses": {table: [self.items[k] for k in keys
                                  if k in self.items and k not in left]},
            "UnprocessedKeys": {}}
        if left:
            answer["UnprocessedKeys"] = {table: {"Keys": [{"Pk": {"S": k}} for k in left],
                                                 "ConsistentRead": False}}
        return answer

    async def get_item(self, **kwargs: Any) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        found = self.items.get(kwargs["Key"]["Pk"]["S"])
        return {"Item": found} if found else {}


def store_on(raw: ScriptedDynamo, **client: Any) -> tuple[DynamoLeaseStore, SteppedClock]:
    clock = SteppedClock()
    return DynamoLeaseStore(DynamoClient(raw, **client), TABLE, clock,
                            random.Random(5)), clock


async def test_ids_go_out_100_keys_a_request_eventually_consistent_and_unprojected() -> None:
    sids = [f"s{i:03}" for i in range(150)]
    raw = ScriptedDynamo([item(sid) for sid in sids[::2]])  # every other one exists
    store, clock = store_on(raw)
    got = await store.check_many(sids + sids[:7])  # repeated ids are asked for once
    assert [len(raw.asked(n)) for n in range(len(raw.requests))] == [BATCH_GET_KEYS, 50]
    assert raw.asked(0) + raw.asked(1) == [f"CONN#{sid}" for sid in sids]
    for request in raw.requests:
        assert list(request) == ["RequestItems"] and list(request["RequestItems"]) == [TABLE]
        (body,) = request["RequestItems"].values()
        assert body["ConsistentRead"] is False
        assert "ProjectionExpression" not in body  # check reads the whole item too
    assert list(got) == sids
    assert [sid for sid, record in got.items() if record is not None] == sids[::2]
    assert all(got[sid] is not None and got[sid].ws_url == URL  # type: ignore[union-attr]
               for sid in sids[::2])
    assert clock.slept == []


async def test_unprocessed_keys_are_asked_for_again_after_a_short_jittered_wait() -> None:
    sids = [f"s{i:03}" for i in range(150)]
    raw = ScriptedDynamo([item(sid) for sid in sids])
    raw.leave = lambda n, keys: keys[-30:] if n == 1 else []  # throttled once, in part
    store, clock = store_on(raw)
    got = await store.check_many(sids)
    assert all(record is not None for record in got.values()) and list(got) == sids
    assert len(raw.requests) == 2
    # The 30 left over first, then the rest: the second request is full again.
    assert raw.asked(1) == raw.asked(0)[-30:] + [f"CONN#{sid}" for sid in sids[100:]]
    assert len(clock.slept) == 1
    assert UNPROCESSED_BACKOFF_S / 2 <= clock.slept[0] <= UNPROCESSED_BACKOFF_S


async def test_keys_left_unprocessed_until_the_deadline_raise_throttled() -> None:
    raw = ScriptedDynamo([item("a"), item("b")])
    raw.leave = lambda n, keys: [k for k in keys if k == "CONN#b"]  # never comes back
    store, clock = store_on(raw)
    with pytest.raises(StoreThrottled, match="1 of 2 keys still unprocessed"):
        await store.check_many(["a", "b"], timeout=3.0)
    assert len(raw.requests) == len(clock.slept) + 1 > 3
    assert sum(clock.slept) < 3.0  # never waits past the deadline
    assert max(clock.slept) <= UNPROCESSED_BACKOFF_CAP_S
    assert clock.slept[-1] > clock.slept[0]  # backs off


async def test_a_timeout_spent_before_the_next_request_is_a_timeout() -> None:
    raw = ScriptedDynamo([item(f"s{i}") for i in range(150)])
    store, clock = store_on(raw)
    original = raw.batch_get_item

    async def slow(**kwargs: Any) -> dict[str, Any]:
        clock.advance(2.0)  # the first request took the whole budget
        return await original(**kwargs)

    raw.batch_get_item = slow  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable, match="timed out with 50 of 150 keys unread"):
        await store.check_many([f"s{i}" for i in range(150)], timeout=1.5)
    assert len(raw.requests) == 1


@pytest.mark.parametrize(("code", "status", "error", "outcome"), [
    ("ProvisionedThroughputExceededException", 400, StoreThrottled, "throttled"),
    ("ThrottlingException", 400, StoreThrottled, "throttled"),
    ("RequestLimitExceeded", 400, StoreThrottled, "throttled"),
    ("InternalServerError", 500, StoreUnavailable, "unavailable"),
    ("ResourceNotFoundException", 400, TableMissing, "error"),
    ("AccessDeniedException", 400, StoreError, "error"),
    ("ValidationException", 400, StoreError, "error"),
])
async def test_errors_are_those_check_raises(code: str, status: int, error: type[StoreError],
                                             outcome: str) -> None:
    seen: list[tuple[str, str]] = []
    raw = ScriptedDynamo([item("a")])
    raw.error = client_error(code, status)
    store, _ = store_on(raw, observe=lambda op, result, s: seen.append((op, result)))
    with pytest.raises(StoreError) as batch:
        await store.check_many(["a", "b"])
    with pytest.raises(StoreError) as single:
        await store.check("a")
    assert type(batch.value) is type(single.value) is error
    assert seen == [("batch_get_item", outcome), ("get_item", outcome)]


async def test_an_answer_that_never_comes_is_a_timeout() -> None:
    raw = ScriptedDynamo([item("a")])
    never = asyncio.Event()

    async def hang(**kwargs: Any) -> dict[str, Any]:
        await never.wait()
        return {}

    raw.batch_get_item = hang  # type: ignore[method-assign]
    store, _ = store_on(raw)
    with pytest.raises(StoreUnavailable, match="timed out"):
        await store.check_many(["a"], timeout=0.05)


async def test_an_answer_without_responses_is_an_error_not_every_item_gone() -> None:
    raw = ScriptedDynamo([item("a")])
    store, _ = store_on(raw)
    for odd in ({}, {"Responses": None}, {"Responses": {TABLE: "x"}}):
        raw.answer = odd
        with pytest.raises(StoreError, match="batch_get_item"):
            await store.check_many(["a"])
    raw.answer = {"Responses": {}}  # no items of this table found: each one is gone
    assert await store.check_many(["a"]) == {"a": None}


async def test_items_that_do_not_decode_read_as_none_and_others_are_ignored() -> None:
    raw = ScriptedDynamo([item("odd", ws_url={"N": "7"}), item("")])
    store, _ = store_on(raw)
    raw.answer = {"Responses": {TABLE: [item("odd", ws_url={"N": "7"}), item(""),
                                        item("never-asked"), {"Pk": {"N": "1"}}, "junk"]}}
    got = await store.check_many(["odd", ""])
    assert got[""] is None
    assert got["odd"] is not None and got["odd"].bad_fields == ("ws_url is not a string",)
    assert list(got) == ["odd", ""]


async def test_every_request_is_metered_and_its_items_counted() -> None:
    seen: list[tuple[str, str]] = []
    counted: list[tuple[str, int]] = []
    raw = ScriptedDynamo([item(f"s{i}") for i in range(120)])
    raw.leave = lambda n, keys: keys[:5] if n == 1 else []
    store, _ = store_on(raw, observe=lambda op, result, s: seen.append((op, result)),
                        count_read=lambda op, n: counted.append((op, n)))
    await store.check_many([f"s{i}" for i in range(130)])
    assert seen == [("batch_get_item", "ok")] * 2
    assert counted == [("batch_get_item", 95), ("batch_get_item", 25)]


def test_batch_get_item_is_exposed_from_start_up() -> None:
    exposed = {(s.labels.get("operation"), s.labels.get("outcome"))
               for family in Metrics().registry.collect() for s in family.samples
               if s.name == "streamlease_dynamodb_requests_total"}
    assert {("batch_get_item", outcome) for outcome in DYNAMODB_OUTCOMES} <= exposed


# -- through the embedded server --------------------------------------------------------------


async def test_the_embedded_server_answers_two_requests_for_150_ids(
        dynamodb_endpoint: str, table_names: tuple[str, str, str]) -> None:
    seen: list[tuple[str, str]] = []
    counted: list[tuple[str, int]] = []
    async with dynamodb.connect(*table_names, dynamodb.ConnectOptions(
            observe=lambda op, result, s: seen.append((op, result)),
            count_read=lambda op, n: counted.append((op, n)))) as stores:
        await stores.admin.create_tables()
        sids = [f"s{i:03}" for i in range(150)]
        await asyncio.gather(*(stores.admin.put_started(sid, URL) for sid in sids[:140]))
        seen.clear()
        counted.clear()
        got = await stores.leases.check_many(sids)
    assert [sid for sid, r in got.items() if r is not None] == sids[:140]
    assert seen == [("batch_get_item", "ok")] * 2
    assert sorted(n for _, n in counted) == [40, 100]


async def test_on_a_server_with_stale_reads_check_many_may_see_the_previous_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The request really is eventually consistent: a server whose unasked-for-consistency
    reads lag a second shows ``check_many`` the item from before the acquire, while
    ``check`` (ConsistentRead) sees the lease."""
    from streamlease.core.lease import LeaseTimings

    now = [5000.0]
    timings = LeaseTimings(lease_s=20.0, heartbeat_s=5.0, skew_margin_s=1.0,
                           safety_margin_s=2.0)
    with EmbeddedDynamoDB(ServerOptions(stale_reads_s=1.0), clock=lambda: now[0],
                          rng=random.Random(7)) as server:
        for name, value in local_aws_env(server.endpoint_url).items():
            monkeypatch.setenv(name, value)
        suffix = uuid.uuid4().hex[:8]
        async with dynamodb.connect(f"s-{suffix}", f"e-{suffix}", f"f-{suffix}") as stores:
            await stores.admin.create_tables()
            await stores.admin.put_started("a", URL)
            now[0] += 2.0
            got = await stores.leases.acquire("a", "w1", NOW, timings)
            assert got is not None
            for _ in range(5):
                (stale,) = (await stores.leases.check_many(["a"])).values()
                assert stale is not None and stale.lease_owner is None  # before the acquire
            current = await stores.leases.check("a")
            assert current is not None and current.lease_owner == "w1"
            now[0] += 1.0001
            (caught_up,) = (await stores.leases.check_many(["a"])).values()
            assert caught_up == current
