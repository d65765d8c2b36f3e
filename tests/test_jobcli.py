"""``streamlease job ...`` as an operator (and a job) runs it, against the embedded DynamoDB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import aioboto3
import pytest

from streamlease.clock import SYSTEM_CLOCK
from streamlease.core.jobs import JobRun, RunOutcome
from streamlease.store import dynamodb
from tests.procs import ROOT


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamlease", *args], cwd=ROOT,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=60)


@pytest.fixture
def tables(dynamodb_endpoint: str) -> Iterator[dict[str, str]]:
    suffix = uuid.uuid4().hex[:8]
    env = {"STREAMLEASE_TABLE": f"jc-s-{suffix}", "STREAMLEASE_EVENTS_TABLE": f"jc-e-{suffix}",
           "STREAMLEASE_FLEET_TABLE": f"jc-f-{suffix}"}
    assert cli("table", "create", env=env).returncode == 0
    yield env


def test_put_list_runs_remove(tables: dict[str, str]) -> None:
    put = cli("job", "put", "nightly", "--cron", "0 2 * * *", "--command", "echo hi",
              "--timeout", "600", env=tables)
    assert put.returncode == 0, put.stderr
    assert put.stdout.startswith("nightly: created (cron 0 2 * * *); next slot ")
    assert put.stdout.strip().endswith("T02:00:00Z")
    again = cli("job", "put", "nightly", "--every", "5m", "--command", "echo again",
                "--catch-up", env=tables)
    assert again.returncode == 0 and "updated (every 5m)" in again.stdout
    listed = json.loads(cli("job", "list", "-o", "json", env=tables).stdout)
    assert len(listed) == 1
    job = listed[0]
    assert (job["name"], job["cron"], job["every_s"], job["command"], job["catch_up"],
            job["timeout_s"]) == ("nightly", None, 300, "echo again", True, None)
    table = cli("job", "list", env=tables).stdout.splitlines()
    assert table[0].split()[:2] == ["JOB", "SCHEDULE"] and table[1].startswith("nightly")
    runs = cli("job", "runs", "nightly", "-o", "json", env=tables)
    assert runs.returncode == 0 and json.loads(runs.stdout) == []
    assert cli("job", "remove", "nightly", env=tables).returncode == 0
    gone = cli("job", "remove", "nightly", env=tables)
    assert gone.returncode == 1 and "no job 'nightly'" in gone.stderr


async def test_runs_json_has_exactly_the_contracts_keys(tables: dict[str, str]) -> None:
    async with dynamodb.connect_admin(tables["STREAMLEASE_TABLE"],
                                      tables["STREAMLEASE_EVENTS_TABLE"],
                                      tables["STREAMLEASE_FLEET_TABLE"]) as stores:
        assert await stores.jobs.claim_run(JobRun("r", "2026-12-01T00:00:00Z", 42, "w1",
                                                  1_796_083_200_000))
        finished = JobRun("r", "2026-12-01T00:00:00Z", 42, "w1", 1_796_083_200_000,
                          1_796_083_201_500, RunOutcome.FAILED, 7, "boom\n")
        assert await stores.jobs.finish_run(finished)
        await stores.jobs.claim_run(JobRun("r", "2026-12-01T00:00:02Z", 43, "w2",
                                           1_796_083_202_000))
    rows = json.loads(cli("job", "runs", "r", "-o", "json", env=tables).stdout)
    assert [set(r) for r in rows] == [{"slot", "fence", "runner", "started_at", "finished_at",
                                       "outcome", "exit_code"}] * 2
    assert rows[0] == {"slot": "2026-12-01T00:00:02Z", "fence": 43, "runner": "w2",
                       "started_at": "2026-12-01T00:00:02.000Z", "finished_at": None,
                       "outcome": None, "exit_code": None}
    assert rows[1]["outcome"] == "failed" and rows[1]["exit_code"] == 7
    assert rows[1]["finished_at"] == "2026-12-01T00:00:01.500Z"
    shown = cli("job", "runs", "r", "--show-output", env=tables).stdout
    assert "| boom" in shown and "running" in shown


@pytest.mark.parametrize(("args", "named"), [
    (["job", "put", "x", "--cron", "61 * * * *", "--command", "true"], "--cron"),
    (["job", "put", "x", "--cron", "* * * *", "--command", "true"], "five fields"),
    (["job", "put", "x", "--every", "soon", "--command", "true"], "--every"),
    (["job", "put", "x", "--every", "0s", "--command", "true"], "between 1s"),
    (["job", "put", "x", "--command", "true"], "one of the arguments --cron --every"),
    (["job", "put", "x", "--cron", "* * * * *", "--every", "5m", "--command", "true"],
     "not allowed with"),
    (["job", "put", "a#b", "--every", "5m", "--command", "true"], "without '#'"),
    (["job", "put", "x", "--every", "5m", "--command", " "], "--command"),
    (["job", "runs", "x", "--last", "0"], "1-10000"),
])
def test_bad_input_exits_2_with_one_line(tables: dict[str, str], args: list[str],
                                         named: str) -> None:
    result = cli(*args, env=tables)
    assert result.returncode == 2, result
    assert len(result.stderr.strip().splitlines()) == 1 and named in result.stderr


def test_an_unknown_job_has_no_runs(tables: dict[str, str]) -> None:
    result = cli("job", "runs", "nope", env=tables)
    assert result.returncode == 1 and "no job 'nope'" in result.stderr


async def test_job_write_is_fenced_by_the_leader_lease(tables: dict[str, str]) -> None:
    side = tables["STREAMLEASE_TABLE"] + "-side"
    async with aioboto3.Session().client("dynamodb") as client:
        await client.create_table(
            TableName=side, BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "Pk", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "Pk", "KeyType": "HASH"}])
        async with dynamodb.connect_admin(tables["STREAMLEASE_TABLE"],
                                          tables["STREAMLEASE_EVENTS_TABLE"],
                                          tables["STREAMLEASE_FLEET_TABLE"]) as stores:
            fence = await stores.leader.acquire("fleet", "w1", 20, None, SYSTEM_CLOCK.wall_ms())
            assert fence is not None

            def write(key: str, with_fence: int) -> subprocess.CompletedProcess[str]:
                item = {"Pk": {"S": key}, "fence": {"N": str(with_fence)}}
                return cli("job", "write", "--table", side, "--item", json.dumps(item),
                           env={**tables, "STREAMLEASE_FENCE": str(with_fence)})
            ok = write("slot-1", fence)
            assert ok.returncode == 0, ok.stderr
            seen = await stores.leader.read("fleet")
            assert await stores.leader.acquire("fleet", "w2", 20, seen,
                                               SYSTEM_CLOCK.wall_ms()) == fence + 1
            stale = write("slot-2", fence)
            assert stale.returncode == 3
            assert len(stale.stderr.strip().splitlines()) == 1 and str(fence) in stale.stderr
            assert write("slot-2", fence + 1).returncode == 0
        items = (await client.scan(TableName=side))["Items"]
    assert sorted((i["Pk"]["S"], int(i["fence"]["N"])) for i in items) == [
        ("slot-1", fence), ("slot-2", fence + 1)]


@pytest.mark.parametrize(("env", "item", "named"), [
    ({}, '{"Pk": {"S": "a"}}', "STREAMLEASE_FENCE"),
    ({"STREAMLEASE_FENCE": "7"}, "not json", "not JSON"),
    ({"STREAMLEASE_FENCE": "7"}, '{"Pk": "a"}', "DynamoDB JSON"),
])
def test_job_write_refuses_bad_input(tables: dict[str, str], env: dict[str, str], item: str,
                                     named: str) -> None:
    clean = {k: v for k, v in tables.items()}
    result = subprocess.run(
        [sys.executable, "-m", "streamlease", "job", "write", "--table", "t", "--item", item],
        cwd=ROOT, env={**{k: v for k, v in os.environ.items() if k != "STREAMLEASE_FENCE"},
                       **clean, **env}, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and named in result.stderr


async def test_list_shows_a_hand_edited_job_that_cannot_run(tables: dict[str, str]) -> None:
    assert cli("job", "put", "good", "--every", "5m", "--command", "true",
               env=tables).returncode == 0
    async with aioboto3.Session().client("dynamodb") as client:
        await client.put_item(TableName=tables["STREAMLEASE_FLEET_TABLE"], Item={
            "Pk": {"S": "JOB"}, "Sk": {"S": "typo"}, "command": {"S": "true"},
            "cron": {"S": "61 * * * *"}})
    shown = cli("job", "list", env=tables)
    assert shown.returncode == 0, shown.stderr
    assert "UNREADABLE" in shown.stdout and "good" in shown.stdout
    assert "'typo' cannot run as stored" in shown.stderr and "does not parse" in shown.stderr
    listed = json.loads(cli("job", "list", "-o", "json", env=tables).stdout)
    assert [j["name"] for j in listed] == ["good", "typo"]
    assert "does not parse" in listed[1]["error"] and "error" not in listed[0]
    runs = cli("job", "runs", "typo", env=tables)
    assert runs.returncode == 0, runs.stderr  # it exists, it just never ran
