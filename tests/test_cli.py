"""The CLI run as a user runs it: a subprocess against the embedded DynamoDB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest

from tests.procs import ROOT


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "worker", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def tables(dynamodb_endpoint: str) -> Iterator[dict[str, str]]:
    suffix = uuid.uuid4().hex[:8]
    env = {"STREAMLEASE_TABLE": f"cli-s-{suffix}", "STREAMLEASE_EVENTS_TABLE": f"cli-e-{suffix}"}
    result = cli("table", "create", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["created", env["STREAMLEASE_TABLE"],
                                     "created", env["STREAMLEASE_EVENTS_TABLE"]]
    yield env


def test_table_create_twice_says_exists(tables: dict[str, str]) -> None:
    again = cli("table", "create", env=tables)
    assert again.returncode == 0 and again.stdout.count("exists") == 2


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
    assert shown["desired_state"] == "STOPPED" and shown["ws_url"].endswith("/b?token=***")
    released = cli("ctl", "release", "a", env=tables)
    assert released.returncode == 0 and "fence 1" in released.stdout
    refused = cli("ctl", "release", "a", "--expect-fence", "0", env=tables)
    assert refused.returncode == 1 and "not released" in refused.stderr
    assert json.loads(cli("ctl", "show", "a", env=tables).stdout)["fence"] == 1


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
    (("ctl", "release", "a", "--expect-fence", "-3"), "expect-fence"),
    (("ctl", "list", "-o", "yaml"), "invalid choice"),
    (("frobnicate",), "invalid choice"),
    (("ctl", "show", ""), "stream id"),
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
    result = subprocess.run([sys.executable, "-m", "worker", "ctl", "list"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "AWS_REGION" in result.stderr


def test_dev_dynamodb_rejects_bad_options() -> None:
    result = cli("dev", "dynamodb", "--host", "0.0.0.0")
    assert result.returncode == 2 and "loopback" in result.stderr


async def test_owners_and_guarded_release(tables: dict[str, str]) -> None:
    from worker.core.lease import LeaseTimings
    from worker.store import dynamodb

    assert cli("ctl", "start", "a", "b", "c", "--url", "wss://x/{id}", env=tables).returncode == 0
    timings = LeaseTimings(60, 5, 1, 2)
    async with dynamodb.connect(tables["STREAMLEASE_TABLE"],
                                tables["STREAMLEASE_EVENTS_TABLE"]) as stores:
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
