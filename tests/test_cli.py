"""The CLI run as a user runs it: a subprocess against the embedded DynamoDB."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import boto3
import pytest

from streamlease.core.membership import HeartbeatOutcome, MemberStatus
from streamlease.core.urls import parse_allowed_urls, url_problem
from streamlease.dial import DialOptions, dial
from streamlease.errors import DialError
from streamlease.store.protocols import FleetStore, Heartbeat, Stores
from tests.procs import ROOT


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "streamlease", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def tables(dynamodb_endpoint: str) -> Iterator[dict[str, str]]:
    suffix = uuid.uuid4().hex[:8]
    env = {"STREAMLEASE_TABLE": f"cli-s-{suffix}", "STREAMLEASE_EVENTS_TABLE": f"cli-e-{suffix}",
           "STREAMLEASE_FLEET_TABLE": f"cli-f-{suffix}"}
    result = cli("table", "create", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["created", env["STREAMLEASE_TABLE"],
                                     "created", env["STREAMLEASE_EVENTS_TABLE"],
                                     "created", env["STREAMLEASE_FLEET_TABLE"]]
    yield env


def test_table_create_twice_says_exists(tables: dict[str, str]) -> None:
    again = cli("table", "create", env=tables)
    assert again.returncode == 0 and again.stdout.count("exists") == 3


def test_table_create_says_how_to_enable_a_missing_stream(dynamodb_endpoint: str) -> None:
    """A streams table made before the change feed: `table create` succeeds and says how
    to turn the stream on (it does not change a table it did not create)."""
    import boto3

    from streamlease.store import schema

    suffix = uuid.uuid4().hex[:8]
    env = {"STREAMLEASE_TABLE": f"cli-s-{suffix}", "STREAMLEASE_EVENTS_TABLE": f"cli-e-{suffix}",
           "STREAMLEASE_FLEET_TABLE": f"cli-f-{suffix}"}
    boto3.client("dynamodb", endpoint_url=dynamodb_endpoint, region_name="us-east-1").create_table(
        **schema.streams_table(env["STREAMLEASE_TABLE"]))
    result = cli("table", "create", env=env)
    assert result.returncode == 0, result.stderr
    (note,) = [line for line in result.stdout.splitlines() if line.startswith("note")]
    assert "no DynamoDB stream" in note and "StreamViewType=NEW_AND_OLD_IMAGES" in note


def test_start_list_show_stop_release(tables: dict[str, str]) -> None:
    started = cli("ctl", "start", "a", "b", "--url", "wss://feeds.example.com/{id}?token=s3cret",
                  env=tables)
    assert started.returncode == 0, started.stderr
    assert "a: STARTED (created)" in started.stdout and "s3cret" not in started.stdout
    listed = cli("ctl", "list", "-o", "json", env=tables)
    rows = json.loads(listed.stdout)
    assert [(r["stream"], r["desired_state"], r["lease_expires_at_ms"]) for r in rows] == [
        ("a", "STARTED", 0), ("b", "STARTED", 0)]
    assert all("s3cret" not in (r["ws_url"] or "") for r in rows)
    table = cli("ctl", "list", env=tables)
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split()[:3] == ["STREAM", "STATE", "OWNER"]
    assert len(table.stdout.splitlines()) == 3
    stopped = cli("ctl", "stop", "b", env=tables)
    assert stopped.returncode == 0 and "b: STOPPED (was STARTED)" in stopped.stdout
    only_started = json.loads(cli("ctl", "list", "--state", "STARTED", "-o", "json",
                                  env=tables).stdout)
    assert [r["stream"] for r in only_started] == ["a"]
    shown = json.loads(cli("ctl", "show", "b", env=tables).stdout)
    assert shown["desired_state"] == "STOPPED" and shown["ws_url"] == (
        "wss://feeds.example.com/***?token=***")
    released = cli("ctl", "release", "a", env=tables)
    assert released.returncode == 0 and "fence 1" in released.stdout
    refused = cli("ctl", "release", "a", "--expect-fence", "0", env=tables)
    assert refused.returncode == 1 and "not released" in refused.stderr
    assert json.loads(cli("ctl", "show", "a", env=tables).stdout)["fence"] == 1


def test_start_with_a_profile_sets_it_and_without_keeps_it(tables: dict[str, str]) -> None:
    started = cli("ctl", "start", "a", "--url", "wss://x/{id}", "--profile", "gateway",
                  env=tables)
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "a: STARTED (created) url=wss://x/*** profile=gateway"
    assert json.loads(cli("ctl", "show", "a", env=tables).stdout)["profile"] == "gateway"
    again = cli("ctl", "start", "a", "--url", "wss://x/{id}", env=tables)
    assert "a: STARTED (unchanged)" in again.stdout
    assert json.loads(cli("ctl", "show", "a", env=tables).stdout)["profile"] == "gateway"
    moved = cli("ctl", "start", "a", "--url", "wss://x/{id}", "--profile", "live", env=tables)
    assert "a: STARTED (updated)" in moved.stdout
    rows = json.loads(cli("ctl", "list", "-o", "json", env=tables).stdout)
    assert [(r["stream"], r["profile"]) for r in rows] == [("a", "live")]
    plain = cli("ctl", "start", "b", "--url", "wss://x/{id}", env=tables)
    assert plain.stdout.strip() == "b: STARTED (created) url=wss://x/***"
    assert json.loads(cli("ctl", "show", "b", env=tables).stdout)["profile"] is None


def test_missing_stream_is_exit_1(tables: dict[str, str]) -> None:
    for args in (("show", "nope"), ("stop", "nope"), ("release", "nope"), ("export", "nope")):
        result = cli("ctl", *args, env=tables)
        assert result.returncode == 1, args
        assert "nope" in result.stderr


def test_export_of_a_stream_with_no_deliveries_is_empty(tables: dict[str, str]) -> None:
    cli("ctl", "start", "a", "--url", "wss://x/a", env=tables)
    result = cli("ctl", "export", "a", env=tables)
    assert result.returncode == 0 and result.stdout == ""


@pytest.mark.parametrize(("args", "fragment"), [
    (("ctl",), "required"),
    (("ctl", "start", "a"), "--url"),
    (("ctl", "start", "a", "--url", "http://x/"), "scheme"),
    (("ctl", "start", "a", "--url", "wss://x/", "--profile", "no spaces"), "profile name"),
    (("ctl", "start", "a", "--url", "wss://x/", "--profile", ""), "profile name"),
    (("ctl", "release", "a", "--expect-fence", "-3"), "expect-fence"),
    (("ctl", "list", "-o", "yaml"), "invalid choice"),
    (("frobnicate",), "invalid choice"),
    (("ctl", "show", ""), "stream id"),
    (("ctl", "members", "--observe", "0"), "--observe"),
    (("ctl", "members", "--observe", "nan"), "--observe"),
    (("ctl", "members", "-o", "yaml"), "'yaml'"),
])
def test_bad_usage_is_exit_2_with_one_line(args: tuple[str, ...], fragment: str) -> None:
    result = cli(*args)
    assert result.returncode == 2, result
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert fragment in result.stderr


def test_bad_table_name_is_a_configuration_error() -> None:
    result = cli("ctl", "list", env={"STREAMLEASE_TABLE": "no spaces allowed"})
    assert result.returncode == 2
    assert "STREAMLEASE_TABLE" in result.stderr and len(result.stderr.splitlines()) == 1


def test_unreachable_dynamodb_is_exit_1() -> None:
    result = cli("ctl", "list", env={"AWS_ENDPOINT_URL_DYNAMODB": "http://127.0.0.1:9",
                                     "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "x",
                                     "AWS_SECRET_ACCESS_KEY": "x"})
    assert result.returncode == 1 and "DynamoDB" in result.stderr


def test_no_region_is_a_configuration_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    result = subprocess.run([sys.executable, "-m", "streamlease", "ctl", "list"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "AWS_REGION" in result.stderr


def test_dev_dynamodb_rejects_bad_options() -> None:
    result = cli("dev", "dynamodb", "--host", "0.0.0.0")
    assert result.returncode == 2 and "loopback" in result.stderr


async def test_owners_and_guarded_release(tables: dict[str, str]) -> None:
    from streamlease.core.lease import LeaseTimings
    from streamlease.store import dynamodb

    assert cli("ctl", "start", "a", "b", "c", "--url", "wss://x/{id}", env=tables).returncode == 0
    timings = LeaseTimings(60, 5, 1, 2)
    async with dynamodb.connect(tables["STREAMLEASE_TABLE"], tables["STREAMLEASE_EVENTS_TABLE"],
                                tables["STREAMLEASE_FLEET_TABLE"]) as stores:
        import time
        now = int(time.time() * 1000)
        for sid, owner in (("a", "w1"), ("b", "w1"), ("c", "w2")):
            assert await stores.leases.acquire(sid, owner, now, timings) is not None
    owners = json.loads(cli("ctl", "owners", "-o", "json", env=tables).stdout)
    assert owners == {"owners": {"w1": ["a", "b"], "w2": ["c"]}, "unowned_started": []}
    table = cli("ctl", "owners", env=tables).stdout.splitlines()
    assert table[1].split() == ["w1", "2"] and table[2].split() == ["w2", "1"]
    wrong_owner = cli("ctl", "release", "a", "--expect-owner", "w2", env=tables)
    assert wrong_owner.returncode == 1
    assert "owner=w1" in wrong_owner.stderr and len(wrong_owner.stderr.splitlines()) == 1
    wrong_fence = cli("ctl", "release", "a", "--expect-owner", "w1", "--expect-fence", "7",
                      env=tables)
    assert wrong_fence.returncode == 1 and "fence=1" in wrong_fence.stderr
    ok = cli("ctl", "release", "a", "--expect-owner", "w1", "--expect-fence", "1", env=tables)
    assert ok.returncode == 0 and "fence 2" in ok.stdout
    after = json.loads(cli("ctl", "owners", "-o", "json", env=tables).stdout)
    assert after == {"owners": {"w1": ["b"], "w2": ["c"]}, "unowned_started": ["a"]}


MEMBER_KEYS = {"id": str, "epoch": int, "status": str, "streams": int, "share": int,
               "heartbeat_age_s": float, "alive": bool}


@contextlib.asynccontextmanager
async def heartbeating(fleet: FleetStore,
                       members: dict[str, tuple[int, MemberStatus, int, int]],
                       every_s: float = 0.05) -> AsyncIterator[None]:
    """Members (id -> epoch, status, streams held, capacity) that heartbeat like live
    workers."""
    async def beat() -> None:
        while True:
            for worker_id, (epoch, status, streams, capacity) in members.items():
                result = await fleet.heartbeat(Heartbeat(worker_id, epoch, status, streams,
                                                         capacity, 0, int(time.time() * 1000)))
                assert result.outcome is HeartbeatOutcome.RENEWED, result
            await asyncio.sleep(every_s)  # the members' own cadence, not a wait for an event

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_members_observes_liveness_and_shares(tables: dict[str, str]) -> None:
    # 5 STARTED streams, of which the members report holding 3: shares are of those 3
    # (the command reads member rows only, not the streams table).
    assert cli("ctl", "start", "a", "b", "c", "d", "e", "f", "--url", "wss://x/{id}",
               env=tables).returncode == 0
    assert cli("ctl", "stop", "d", env=tables).returncode == 0
    async with dynamodb_stores(tables) as stores:
        fleet = stores.fleet
        now = int(time.time() * 1000)
        big = await fleet.register("w-big", 10, now)
        small = await fleet.register("w-small", 1, now)
        drain = await fleet.register("w-drain", 10, now)
        await fleet.register("w-stale", 10, now)
        dead = await fleet.register("w-dead", 10, now)
        assert await fleet.fence(dead, "w-big", now) is not None
        live = {"w-big": (big.epoch, MemberStatus.ACTIVE, 2, 10),
                "w-small": (small.epoch, MemberStatus.ACTIVE, 1, 1),
                "w-drain": (drain.epoch, MemberStatus.DRAINING, 0, 10)}
        async with heartbeating(fleet, live):
            started = time.monotonic()
            as_json = await asyncio.to_thread(cli, "ctl", "members", "-o", "json",
                                              "--observe", "1.5", env=tables)
            watched = time.monotonic() - started
            fence = await stores.leader.acquire("fleet", "w-big", 20, None, now)
            as_table = await asyncio.to_thread(cli, "ctl", "members", "--observe", "1",
                                               env=tables)
    assert as_json.returncode == 0, as_json.stderr
    rows = json.loads(as_json.stdout)
    for row in rows:
        assert set(row) == set(MEMBER_KEYS), row
        assert all(type(row[k]) is kind for k, kind in MEMBER_KEYS.items()), row
    assert [(r["id"], r["status"], r["streams"], r["share"], r["alive"]) for r in rows] == [
        ("w-big", "ACTIVE", 2, 2, True),
        ("w-dead", "DEAD", 0, 0, False),
        ("w-drain", "DRAINING", 0, 0, True),
        ("w-small", "ACTIVE", 1, 1, True),
        ("w-stale", "ACTIVE", 0, 0, False),
    ]
    ages = {r["id"]: r["heartbeat_age_s"] for r in rows}
    assert ages["w-stale"] >= 1.4 and ages["w-dead"] >= 1.4  # watched the whole window
    assert ages["w-big"] < 1.0 and ages["w-small"] < 1.0
    assert {r["id"]: r["epoch"] for r in rows}["w-dead"] == dead.epoch + 1
    assert watched >= 1.5
    assert as_table.returncode == 0, as_table.stderr
    lines = as_table.stdout.splitlines()
    assert lines[0].split()[:5] == ["MEMBER", "EPOCH", "STATUS", "STREAMS", "SHARE"]
    assert [line.split()[0] for line in lines[1:6]] == [
        "w-big", "w-dead", "w-drain", "w-small", "w-stale"]
    assert [line.split()[7] for line in lines[1:6]] == [
        "alive", "dead", "alive", "alive", "silent"]
    assert lines[6].split() == ["(5", "members)", "3", "3", "31"]
    assert lines[7].startswith(
        f"3 alive, 1 silent, 1 dead; 3 streams held, as the member rows report them; "
        f"leader w-big (fence {fence});")


async def test_members_stops_watching_once_every_member_proved_alive(
        tables: dict[str, str]) -> None:
    async with dynamodb_stores(tables) as stores:
        member = await stores.fleet.register("w-1", 5, int(time.time() * 1000))
        async with heartbeating(stores.fleet, {"w-1": (member.epoch, MemberStatus.ACTIVE, 0, 5)}):
            started = time.monotonic()
            result = await asyncio.to_thread(cli, "ctl", "members", "-o", "json",
                                             "--observe", "120", env=tables)
            elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert [(r["id"], r["alive"], r["share"]) for r in json.loads(result.stdout)] == [
        ("w-1", True, 0)]
    assert elapsed < 60


async def test_members_reads_no_streams_table(tables: dict[str, str]) -> None:
    """``ctl members`` reads the fleet table only: pointed at a streams table that does
    not exist, it still reports the members (a read of it would fail: run `table create`)."""
    async with dynamodb_stores(tables) as stores:
        member = await stores.fleet.register("w-1", 10, int(time.time() * 1000))
        live = {"w-1": (member.epoch, MemberStatus.ACTIVE, 4, 10)}
        async with heartbeating(stores.fleet, live):
            env = dict(tables, STREAMLEASE_TABLE=f"missing-{uuid.uuid4().hex[:8]}")
            as_json = await asyncio.to_thread(cli, "ctl", "members", "-o", "json",
                                              "--observe", "1", env=env)
            as_table = await asyncio.to_thread(cli, "ctl", "members", "--observe", "1",
                                               env=env)
    assert as_json.returncode == 0, as_json.stderr
    assert [(r["id"], r["streams"], r["share"], r["alive"])
            for r in json.loads(as_json.stdout)] == [("w-1", 4, 4, True)]
    assert as_table.returncode == 0, as_table.stderr
    assert "4 streams held, as the member rows report them" in as_table.stdout


def test_members_of_an_empty_fleet(tables: dict[str, str]) -> None:
    result = cli("ctl", "members", "-o", "json", "--observe", "0.1", env=tables)
    assert result.returncode == 0 and json.loads(result.stdout) == []
    table = cli("ctl", "members", "--observe", "0.1", env=tables)
    assert table.returncode == 0 and "(0 members)" in table.stdout


def test_members_without_a_fleet_table_says_create_it(tables: dict[str, str]) -> None:
    env = dict(tables, STREAMLEASE_FLEET_TABLE=f"missing-{uuid.uuid4().hex[:8]}")
    result = cli("ctl", "members", "--observe", "0.1", env=env)
    assert result.returncode == 1, result
    assert "streamlease table create" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_members_default_window_follows_the_heartbeat_setting(tables: dict[str, str]) -> None:
    bad = cli("ctl", "members", env=dict(tables, STREAMLEASE_HEARTBEAT_SECONDS="soon"))
    assert bad.returncode == 2 and "STREAMLEASE_HEARTBEAT_SECONDS" in bad.stderr
    started = time.monotonic()
    ok = cli("ctl", "members", "-o", "json",
             env=dict(tables, STREAMLEASE_HEARTBEAT_SECONDS="0.2"))
    assert ok.returncode == 0 and json.loads(ok.stdout) == []
    assert time.monotonic() - started < 30


def dynamodb_stores(tables: dict[str, str]) -> contextlib.AbstractAsyncContextManager[Stores]:
    from streamlease.store import dynamodb as backend
    return backend.connect_admin(tables["STREAMLEASE_TABLE"], tables["STREAMLEASE_EVENTS_TABLE"],
                                 tables["STREAMLEASE_FLEET_TABLE"])


def dynamodb(endpoint: str) -> Any:
    return boto3.client("dynamodb", endpoint_url=endpoint, region_name=os.environ["AWS_REGION"])


def stored_url(endpoint: str, table: str, stream_id: str) -> str:
    item = dynamodb(endpoint).get_item(TableName=table, Key={"Pk": {"S": f"CONN#{stream_id}"}})
    return str(item["Item"]["ws_url"]["S"])


@pytest.mark.parametrize(("stream_id", "expected"), [
    ("a#b", "ws://127.0.0.1:9/s/a%23b?k=1"),
    ("c?d=e", "ws://127.0.0.1:9/s/c%3Fd%3De?k=1"),
    ("f/../g", "ws://127.0.0.1:9/s/f%2F..%2Fg?k=1"),
    ("h%2F", "ws://127.0.0.1:9/s/h%252F?k=1"),
    ("i@127.0.0.2", "ws://127.0.0.1:9/s/i%40127.0.0.2?k=1"),
    ("j k", "ws://127.0.0.1:9/s/j%20k?k=1"),
])
def test_start_escapes_the_id_into_the_url(tables: dict[str, str], dynamodb_endpoint: str,
                                           stream_id: str, expected: str) -> None:
    result = cli("ctl", "start", stream_id, "--url", "ws://127.0.0.1:9/s/{id}?k=1", env=tables)
    assert result.returncode == 0, result.stderr
    assert stored_url(dynamodb_endpoint, tables["STREAMLEASE_TABLE"], stream_id) == expected


@pytest.mark.parametrize(("url", "stream_id"), [
    ("ws://{id}@127.0.0.1:9/", "a"),  # the id would become user info
    ("ws://127.0.0.1:9/{id}#x", "a"),
    ("ws://u:s3cret@127.0.0.1:9/{id}", "a"),
    ("ws://127.0.0.1:{id}/", "9#x"),
    ("ws://{id}/", "127.0.0.1:9@127.0.0.2"),  # escaped, so not a host and user info
    ("ws://{id}/", "a b"),
])
def test_start_refuses_urls_that_are_not_plain_ws_urls(url: str, stream_id: str) -> None:
    result = cli("ctl", "start", stream_id, "--url", url)
    assert result.returncode == 2, result
    assert len(result.stderr.strip().splitlines()) == 1 and "--url" in result.stderr
    assert "s3cret" not in result.stderr


SECRET = "s3cret"
# URLs that carry a secret in every place a URL can.
SECRET_URLS = {
    "password": "ws://bob:{s}@127.0.0.1:{port}/v1",
    "username": "ws://{s}@127.0.0.1:{port}/v1",
    "fragment": "ws://127.0.0.1:{port}/v1#{s}",
    "query": "ws://127.0.0.1:{port}/v1?token={s}&from_seq=1",
    "path": "ws://127.0.0.1:{port}/v2/{s}",
}


async def test_url_secrets_reach_no_log_error_or_command_output(
        tables: dict[str, str], dynamodb_endpoint: str) -> None:
    """Each secret-carrying URL goes through dial (what the pump logs), url_problem (what a
    worker writes to last_error) and ctl start, list and show; no output holds the secret."""
    rules = parse_allowed_urls("ws://127.0.0.1")
    client = dynamodb(dynamodb_endpoint)
    outputs: list[str] = []
    for kind, template in SECRET_URLS.items():
        url = template.format(s=SECRET, port=9)  # nothing listens on 127.0.0.1:9
        with pytest.raises(DialError) as err:
            await dial(url, rules, DialOptions(open_timeout=5))
        dial_text = f"{err.value} {err.value.url}"
        problem = url_problem(url, rules)
        assert (problem is None) == (kind in ("query", "path")), (kind, problem)
        # A worker stores the refusal, or the dial error, as last_error.
        last_error = problem or str(err.value)
        client.put_item(TableName=tables["STREAMLEASE_TABLE"], Item={
            "Pk": {"S": f"CONN#{kind}"}, "desired_state": {"S": "STARTED"},
            "ws_url": {"S": url}, "lease_expires_at_ms": {"N": "0"},
            "last_error": {"S": last_error}, "last_error_at_ms": {"N": "1"}})
        started = cli("ctl", "start", f"{kind}-cli", "--url", url, env=tables)
        assert started.returncode == (0 if kind in ("query", "path") else 2), started
        shown = cli("ctl", "show", kind, env=tables)
        assert shown.returncode == 0, shown.stderr
        outputs += [dial_text, last_error, started.stdout, started.stderr, shown.stdout,
                    shown.stderr]
    for args in (("list",), ("list", "-o", "json")):
        listed = cli("ctl", *args, env=tables)
        assert listed.returncode == 0 and "password" in listed.stdout
        outputs += [listed.stdout, listed.stderr]
    for text in outputs:
        assert SECRET not in text, text
