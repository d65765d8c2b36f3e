"""Processors in real worker processes: the file output and a user's Python processor,
through a kill -9 and a SIGTERM, with an audit of what reached them."""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.conftest import FleetFactory
from tests.fleet.harness import Fleet, wait_until

pytestmark = pytest.mark.fleet
ROOT = Path(__file__).resolve().parents[2]


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def audit_at_least_once(fleet_records: dict[str, Any], found: dict[str, list[tuple[int, int]]],
                        ) -> dict[str, int]:
    """Every seq up to the checkpoint reached the output; within one fence in order and
    once; a seq seen twice only under two fences (a takeover)."""
    duplicated = 0
    for sid, record in fleet_records.items():
        pairs = found.get(sid, [])
        seqs = {seq for seq, _ in pairs}
        last = record.last_seq or 0
        missing = set(range(1, last + 1)) - seqs
        assert not missing, f"{sid}: missing {sorted(missing)[:10]}"
        by_fence: dict[int, list[int]] = defaultdict(list)
        for seq, fence in pairs:
            by_fence[fence].append(seq)
        for fence, run in by_fence.items():
            assert run == sorted(set(run)), f"{sid}: fence {fence} out of order or repeated"
        counts: dict[int, int] = defaultdict(int)
        for seq, _ in pairs:
            counts[seq] += 1
        duplicated += sum(c - 1 for c in counts.values() if c > 1)
    return {"duplicated_across_takeover": duplicated}


async def settle(fleet: Fleet, beyond: int = 5) -> None:
    await wait_until(fleet.all_owned, 30, "all streams owned")

    async def delivering() -> bool:
        return all((r.last_seq or 0) > beyond for r in (await fleet.records()).values())
    await wait_until(delivering, 30, f"every stream past seq {beyond}")


async def test_file_sink_through_kill_9_delivers_everything_at_least_once(
        make_fleet: FleetFactory, tmp_path: Path) -> None:
    out = tmp_path / "out"
    fleet = await make_fleet(streams=6, rate=20,
                             env={"STREAMLEASE_SINK": f"file://{out}"}).start(workers=2)
    await settle(fleet)
    owners = await fleet.owners()
    victim = max(fleet.workers, key=lambda n: sum(o == n for o in owners.values()))
    fleet.workers[victim].proc.popen.send_signal(signal.SIGKILL)
    fleet.workers[victim].proc.popen.wait(10)
    survivor = next(n for n in fleet.workers if n != victim)
    await wait_until(lambda: fleet.all_owned(by={survivor}), 30, "the survivor holds all")
    before = {s: r.last_seq or 0 for s, r in (await fleet.records()).items()}

    async def moved_on() -> bool:
        return all((r.last_seq or 0) > before[s] + 5 for s, r in (await fleet.records()).items())
    await wait_until(moved_on, 30, "every stream delivering again")
    fleet.workers[survivor].drain()
    records = await fleet.records()
    found = {sid: [(line["seq"], line["fence"]) for line in lines(out / f"{sid}.jsonl")]
             for sid in fleet.stream_ids}
    for sid in fleet.stream_ids:
        first = lines(out / f"{sid}.jsonl")[0]
        assert set(first) == {"stream_id", "seq", "fence", "data"}
        assert first["stream_id"] == sid and first["data"]["seq"] == first["seq"]
    audit_at_least_once(records, found)


async def test_a_python_processor_hears_start_process_and_stop_reasons(
        make_fleet: FleetFactory, tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    rec.mkdir()
    env = {"STREAMLEASE_SINK": "python:tests.fleet.recording_processor:make",
           "RECORDING_DIR": str(rec), "PYTHONPATH": str(ROOT)}
    fleet = await make_fleet(streams=4, rate=20, env=env).start(workers=2)
    await settle(fleet)

    def stops(sid: str) -> list[str]:
        return [line["reason"] for line in lines(rec / f"{sid}.jsonl") if line["call"] == "stop"]

    # A worker that self-fences on a loaded machine stops its streams as "lost"; if that
    # happens just as s001 is flipped, it is flipped again once served (up to three times).
    assert fleet.store is not None
    for _ in range(3):
        seen = len(stops("s001"))
        await fleet.store.set_state("s001", "STOPPED")

        async def ended(seen: int = seen) -> bool:
            return len(stops("s001")) > seen or not await fleet.all_owned(ids=["s001"])
        await wait_until(ended, 15, "s001's tenure ended")
        if stops("s001")[-1:] == ["stopped"]:
            break
        await fleet.store.set_state("s001", "STARTED")
        await wait_until(lambda: fleet.all_owned(ids=["s001"]), 15, "s001 held again")
    assert stops("s001")[-1] == "stopped", stops("s001")
    for worker in fleet.workers.values():
        worker.drain()
    records = await fleet.records()
    for sid in fleet.stream_ids:
        calls = lines(rec / f"{sid}.jsonl")
        assert calls[0]["call"] == "start" and calls[0]["item_ws_url"].endswith(f"/{sid}")
        processed = [c for c in calls if c["call"] == "process"]
        # Each batch's "prev" is the checkpoint it follows; seqs contiguous within a tenure.
        for fence in {c["fence"] for c in processed}:
            seqs = [c["seq"] for c in processed if c["fence"] == fence]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (sid, fence)
        assert max(c["seq"] for c in processed) == records[sid].last_seq
        if sid != "s001":
            assert stops(sid)[-1] == "shutdown", (sid, stops(sid))
