"""``STREAMLEASE_UPSTREAM=python:MODULE:ATTR`` in real worker processes: the user's object
builds the URL, reads each frame's sequence number and marks control frames, through a
kill -9 and a SIGTERM, with the sink audit."""

from __future__ import annotations

import signal

from streamlease.dev.upstream import frame_for
from tests.fleet.conftest import FleetFactory
from tests.fleet.harness import Fleet, wait_until

UPSTREAM = {"STREAMLEASE_UPSTREAM": "python:tests.fleet.python_upstream:make"}


async def delivered(fleet: Fleet) -> dict[str, list[int]]:
    assert fleet.store is not None
    return {sid: [f.seq async for f in fleet.store.read_events(sid)]
            for sid in fleet.stream_ids}


async def test_a_python_upstream_serves_every_stream_through_kill_and_sigterm(
        make_fleet: FleetFactory) -> None:
    fleet = make_fleet(streams=6, rate=20, env=UPSTREAM)
    await fleet.start(workers=3)
    await wait_until(fleet.all_owned, 30, "every stream owned")

    async def progressed(past: dict[str, int]) -> bool:
        now = await delivered(fleet)
        return all(len(now[sid]) > past.get(sid, 0) + 10 for sid in fleet.stream_ids)

    start = {sid: len(seqs) for sid, seqs in (await delivered(fleet)).items()}
    await wait_until(lambda: progressed(start), 30, "every stream delivering")
    owners = await fleet.owners()
    victim = next(w for w in ("w1", "w2", "w3") if w in owners.values())
    fleet.workers[victim].proc.signal(signal.SIGKILL)
    after_kill = {sid: len(seqs) for sid, seqs in (await delivered(fleet)).items()}
    await wait_until(lambda: progressed(after_kill), 45, "delivering again after kill -9")
    owners = await fleet.owners()
    leaving = next(w for w in ("w1", "w2", "w3") if w != victim and w in owners.values())
    fleet.workers[leaving].drain()
    after_term = {sid: len(seqs) for sid, seqs in (await delivered(fleet)).items()}
    await wait_until(lambda: progressed(after_term), 45, "delivering again after SIGTERM")

    assert fleet.store is not None
    for sid, seqs in (await delivered(fleet)).items():
        # Every seq the upstream sent, once and in order, except the ones the user's
        # object called control frames (multiples of 5): those never reach the sink.
        last = seqs[-1]
        assert seqs == [n for n in range(1, last + 1) if n % 5], sid
        frames = [f async for f in fleet.store.read_events(sid)]
        assert all(f.text == frame_for(sid, f.seq) for f in frames), sid
    total_controls = sum(w.metric("streamlease_control_frames_total")
                         for name, w in fleet.workers.items()
                         if name != victim and w.proc.popen.poll() is None)
    assert total_controls > 0
