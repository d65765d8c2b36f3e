"""A fleet whose member rows spread over several keys (``STREAMLEASE_MEMBERS_PER_KEY``),
with real processes on the embedded DynamoDB: the leader spreads them, every other worker
reads its own key's copy of the bulletin, and a worker whose row lives outside ``MEMBER``
is killed and taken over like any other."""

from __future__ import annotations

import signal
import time

import pytest

from streamlease.core import layout
from tests.fleet.conftest import FleetFactory
from tests.fleet.harness import wait_until

pytestmark = pytest.mark.fleet

KEYS = 4  # four workers at one member per key


async def test_rows_spread_over_keys_and_a_worker_outside_member_fails_over(
        make_fleet: FleetFactory) -> None:
    fleet = await make_fleet(streams=16, env={"STREAMLEASE_MEMBERS_PER_KEY": "1"}).start(
        workers=4)
    await wait_until(fleet.all_owned, 30, "all 16 streams owned")

    def leaders() -> list[str]:
        return [n for n, w in fleet.workers.items()
                if w.proc.popen.poll() is None and w.metric("streamlease_is_leader") == 1]

    async def spread_and_read_from_own_keys() -> bool:
        found = leaders()
        return len(found) == 1 and all(
            w.metric("streamlease_member_keys") == KEYS
            and (n in found or w.metric("streamlease_member_rows_read") == 1)
            for n, w in fleet.workers.items())
    await wait_until(spread_and_read_from_own_keys, 30,
                     f"the rows spread over {KEYS} keys, every other worker reading one row")
    # A worker that joins now is created under its own key, outside MEMBER.
    late = next(f"w{i}" for i in range(5, 100) if layout.shard_of(f"w{i}", KEYS) != 0)
    fleet.start_worker(late)
    assert fleet.stores is not None

    async def registered_outside_member() -> bool:
        rows, shards = await fleet.stores.fleet.roster()  # type: ignore[union-attr]
        return shards == KEYS and any(m.worker_id == late and m.shard != 0 for m in rows)
    await wait_until(registered_outside_member, 30, f"{late}'s row under MEMBER#n")

    async def late_holds_streams() -> bool:
        return any(o == late for o in (await fleet.owners()).values())
    await wait_until(late_holds_streams, 40, f"{late} given its share")
    await wait_until(lambda: _reads_one_row(fleet, late), 15, f"{late} reading its key's copy")

    before = {s: r.last_seq or 0 for s, r in (await fleet.records()).items()}
    fleet.workers[late].proc.signal(signal.SIGSTOP)
    killed_at = time.monotonic()
    victim_streams = [s for s, o in (await fleet.owners()).items() if o == late]
    assert victim_streams
    fleet.workers[late].proc.kill()
    survivors = set(fleet.workers) - {late}
    await wait_until(lambda: fleet.all_owned(by=survivors, ids=victim_streams), 30,
                     f"{late}'s streams taken over")

    async def delivering() -> bool:
        records = await fleet.records()
        return all((records[s].last_seq or 0) > before.get(s, 0) for s in victim_streams)
    await wait_until(delivering, 30, f"{late}'s streams delivering again")
    print(f"kill -9 of a worker under MEMBER#n: its {len(victim_streams)} stream(s) "
          f"delivering again after {time.monotonic() - killed_at:.2f} s")
    rows, _ = await fleet.stores.fleet.roster()
    (dead,) = [m for m in rows if m.worker_id == late]
    assert dead.status.value == "DEAD" and dead.shard != 0 and dead.fenced_by in survivors
    assert sum(fleet.workers[n].metric("streamlease_members_declared_dead_total")
               for n in survivors) == 1
    await fleet.audit()


async def _reads_one_row(fleet: object, name: str) -> bool:
    worker = fleet.workers[name]  # type: ignore[attr-defined]
    return bool(worker.metric("streamlease_member_rows_read") == 1)
