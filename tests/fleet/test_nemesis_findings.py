"""What the nemesis found, each as a test of its own with real processes on a store whose
faults the test sets (``streamlease dev dynamodb --faults``).

* A worker started while the store refused or throttled its registration exited 1 (seed
  102 of the suite's nemesis, ``scale_out`` started during ``throttle``): registration is
  now retried like the table check, and the worker joins once the store answers.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from streamlease.dev import local_aws_env
from tests.fleet.harness import Fleet, dynamodb_server, wait_until

pytestmark = pytest.mark.fleet


@pytest.fixture(scope="module")
def faulty_dynamodb() -> Iterator[str]:
    proc = dynamodb_server("--faults", name="dynamodb-faults")
    try:
        yield proc.url()
    finally:
        proc.stop()


def set_faults(endpoint: str, faults: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(f"{endpoint}/_faults", data=json.dumps(faults).encode(),
                                     method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
    return answer


@pytest.fixture
async def faulty_fleet(faulty_dynamodb: str,
                       monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Fleet]:
    for key, value in local_aws_env(faulty_dynamodb).items():
        monkeypatch.setenv(key, value)
    fleet = Fleet(faulty_dynamodb, streams=4, rate=4)
    try:
        yield fleet
    finally:
        set_faults(faulty_dynamodb, {})
        await fleet.close()


async def test_a_worker_started_while_the_fleet_table_refuses_writes_joins_once_it_answers(
        faulty_fleet: Fleet, faulty_dynamodb: str) -> None:
    fleet = await faulty_fleet.start(workers=0)
    # The tables answer reads (the start-up check passes); every write to the fleet table,
    # the member row's among them, is refused as a store in trouble refuses it (HTTP 500).
    set_faults(faulty_dynamodb, {"write_outage": [fleet.fleet_table]})
    worker = fleet.start_worker("w1")

    async def retried() -> bool:
        return bool(worker.log_events("worker.register_retried"))
    await wait_until(retried, 30, "a registration refused and tried again")
    assert worker.proc.popen.poll() is None, worker.tail()
    set_faults(faulty_dynamodb, {})
    await wait_until(fleet.all_owned, 30, "the worker joined and serving every stream")
    assert worker.proc.popen.poll() is None
    await fleet.audit()
